"""Every command README.md and docs/*.md show in a fenced code block runs as shown.

A command is a line of a fenced block (``\\`` continuations joined) that starts with ``meshplan``,
``python -m meshplan``, ``python bench/...`` or ``python3 -m venv`` (the set-up lines), after
``VAR=value`` prefixes. Each document's commands run in order, in a fresh directory of their own (a command
reads what an earlier one of the same page writes, as a reader following the page would), through
the real entry point: ``python -m meshplan`` with ``PYTHONPATH`` at this checkout's ``src``.

What is not run is listed below with the reason (``NOT_RUN``); files a page takes for granted are
made first (``GIVEN``); a command exits 0 unless ``EXIT_CODES`` names the refusal the page shows.
A table entry that no longer matches a command of its page fails the test, and so does a
command with a placeholder (``...``, ``<...>``, ``[...]``, ``a|b``) that no table names.

Cost: about 60 s of CPU (49 s user + 9 s sys measured 2026-11-24 for the whole file; each command
pays its interpreter start, about 1 s); wall time grows with the machine's load."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
CPU_PROFILE = REPO / "tests/fixtures/profiles/cpu_profile_2cores.json"
"""What `meshplan profile --quick` wrote on a 2-core CPU: the profile the pages' not-run profile
commands would write."""
COMMAND_TIMEOUT_S = 120
"""A cheap command takes seconds; two minutes is a hang, not a slow machine."""

_FENCE = re.compile(r"^\s*(```|~~~)")
_ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
_STARTS = re.compile(r"^(?:meshplan(?:\s|$)|python3? -m (?:meshplan(?:\s|$)|venv )|python3? bench/)")
_PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|\[[^\]]*\]|\S\|\S")


@dataclass(frozen=True)
class DocCommand:
    """One command as a page shows it (comment and continuations folded)."""

    page: str
    line: int
    text: str

    @property
    def bare(self) -> str:
        """The command without its ``VAR=value`` prefixes (the tables' keys start there)."""
        return _ENV_PREFIX.sub("", self.text)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a ``#`` after a blank, outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def page_commands(page: str) -> list[DocCommand]:
    """The commands of one page's fenced blocks, in page order."""
    commands: list[DocCommand] = []
    in_block = False
    pending: tuple[int, str] | None = None
    for number, raw in enumerate((REPO / page).read_text().splitlines(), start=1):
        if _FENCE.match(raw):
            in_block, pending = not in_block, None
            continue
        if not in_block:
            continue
        line = _strip_comment(raw.strip())
        if pending is not None:
            start, text = pending
            text = f"{text} {line.removesuffix(chr(92)).strip()}"
        elif _STARTS.match(_ENV_PREFIX.sub("", line)):
            start, text = number, line.removesuffix(chr(92)).strip()
        else:
            continue
        pending = (start, text) if line.endswith(chr(92)) else None
        if pending is None:
            commands.append(DocCommand(page, start, text))
    return commands


# --- what is not run, and why ------------------------------------------------------------------
SETUP = "installs packages into a fresh venv: checked by hand against .ci/run, which CI runs"
TRAINS = "trains: starts one gloo process per rank (tests/runtime/ covers train)"
SIMULATES = "--simulate runs every chosen rank's real step on fake tensors: minutes per rank"
PROFILES = "profiles the hardware: a minute (--quick) to many minutes (tests/runtime/ covers profile)"
BENCH = "a benchmark: minutes to hours by design, its figures are in the page"
GPU = "needs a GPU's profile (h100.json is written by `meshplan profile` on an H100)"
SYNOPSIS = "a synopsis of the syntax (alternatives in | and [ ]), not a command"
REFIT = "refits the calibration: minutes (tests/cli/test_validate_cli.py and test_write_calibration_cli.py cover it)"

NOT_RUN: dict[tuple[str, str], str] = {
    # (page, start of the command as shown): reason
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install -e . &&"): SETUP,
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install torch"): SETUP,
    ("README.md", "meshplan train --plan tiny.json --steps 30"): TRAINS,
    ("README.md", "meshplan train --plan plan.json --dry-run --simulate"): SIMULATES,
    ("README.md", "meshplan profile --quick"): PROFILES,
    ("README.md", "meshplan train --plan tiny.json --steps 20"): TRAINS,
    ("README.md", "python bench/bench_predict_cpu.py"): BENCH,
    ("README.md", "meshplan train --plan four.json"): TRAINS,
    ("README.md", "meshplan train --plan two.json"): TRAINS,
    ("README.md", "meshplan train --plan my.json"): TRAINS,
    ("README.md", "meshplan export-weights ckpt out-hf"):
        "reads the weights the train command above writes (tests/runtime/test_hf_*.py cover it)",
    ("docs/accuracy.md", "meshplan profile --out profile.json"): PROFILES,
    ("docs/accuracy.md", "meshplan profile --quick"): PROFILES,
    ("docs/accuracy.md", "python bench/bench_predict_cpu.py"): BENCH,
    ("docs/accuracy.md", "meshplan profile --out h100.json"): GPU,
    ("docs/accuracy.md", ("meshplan estimate --model llama3-8b --gpu h100-sxm --gpus 8 --tp 2 --seq-len 8192 "
                          "--global-batch 64 --cluster-profile h100.json")): GPU,
    ("docs/accuracy.md", "meshplan train --plan job.json --steps 20"): GPU,
    ("docs/checkpointing.md", "meshplan train --plan plan.json --steps 1000"): TRAINS,
    ("docs/checkpointing.md", "meshplan train --plan plan4.json"): TRAINS,
    ("docs/cost-model.md", "meshplan validate --fit"): REFIT,
    ("docs/cost-model.md", "meshplan validate --runs megatron-bridge --holdout"):
        "leave-one-family/generation-out refits: many minutes",
    ("docs/cost-model.md", "meshplan validate --runs megatron-bridge --fit"): REFIT,
    ("docs/data-aware.md", "python bench/bench_seqlen.py"): BENCH,
    ("docs/dryrun.md", "python -m meshplan train --plan targets/llama3-70b_1024.json --dry-run --simulate"): SIMULATES,
    ("docs/interop.md", 'meshplan import --from megatron "ARGS..."'): SYNOPSIS,
    ("docs/interop.md", "meshplan import --from torchtitan job.toml|job.sh"): SYNOPSIS,
    ("docs/interop.md", "meshplan import --from megatron-bridge run.overrides"): SYNOPSIS,
    ("docs/interop.md", "meshplan export plan.json --to megatron|"): SYNOPSIS,
    ("docs/runtime.md", "python -m meshplan train --plan plan.json --steps 30"): TRAINS,
}


SAME_AS: dict[tuple[str, str], str] = {
    # (page, start of the command as shown): the page that shows the same command (whitespace aside)
    # and runs it, on the same inputs; not run twice
    ("docs/search.md", "meshplan plan --model llama3-70b --cluster dgx-h100 --nodes 128"): "README.md",
    ("docs/search.md", "meshplan explain plan.json"): "README.md",
    ("docs/cost-model.md", "meshplan validate --runs megatron-bridge"): "README.md",
}


# --- files a page takes for granted ------------------------------------------------------------
def _meshplan(*args: str) -> Callable[[Path], None]:
    """A file made by a meshplan command run in the page's directory."""
    def make(cwd: Path) -> None:
        out = _run([sys.executable, "-m", "meshplan", *args], cwd)
        assert out.returncode == 0, f"making a page's file: meshplan {' '.join(args)}\n{out.stderr}"
    return make


def _copy(source: Path, name: str) -> Callable[[Path], None]:
    return lambda cwd: shutil.copyfile(source, cwd / name)


def _write(name: str, text: str) -> Callable[[Path], None]:
    def make(cwd: Path) -> None:
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(text)
    return make


def _checkpoint(cwd: Path) -> None:
    """A committed checkpoint's metadata (what replan reads; no tensors), from the fuzz harness."""
    from _fuzz_harness import make_checkpoint
    make_checkpoint(cwd / "ckpt")


_TOY_JOB = ("plan", "--model", "toy-llama", "--cluster", "cpu", "--gpus", "4", "--seq-len", "64",
            "--global-batch", "8", "--precision", "fp32")
_GPT3_MEGATRON = ("torchrun --nnodes 192 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
                  "--pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 4 --num-layers 96 "
                  "--hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 "
                  "--micro-batch-size 1 --global-batch-size 1536 --checkpoint-activations --fp16")
_HF_LLAMA = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512})

GIVEN: dict[str, tuple[tuple[str, Callable[[Path], None]], ...]] = {
    # page: (file, how it is made), made in the page's directory before its first command
    "README.md": (
        ("profile.json", _copy(CPU_PROFILE, "profile.json")),  # `meshplan profile` (not run) writes it
        ("ckpt", _checkpoint),  # the train commands that write it are not run
        ("my-llama/config.json", _write("my-llama/config.json", _HF_LLAMA)),
    ),
    "docs/accuracy.md": (("profile.json", _copy(CPU_PROFILE, "profile.json")),),
    "docs/checkpointing.md": (("ckpt", _checkpoint),),
    "docs/cost-model.md": (
        ("job.json", _meshplan(*_TOY_JOB, "--out", "job.json")),
        ("runs.csv", _copy(REPO / "src/meshplan/data/runs_calibration.csv", "runs.csv")),
    ),
    "docs/data-aware.md": (("lengths.csv", _write("lengths.csv", "length,count\n256,3000\n1024,800\n8192,40\n")),),
    "docs/dryrun.md": (),  # bench/dryrun_targets.py writes targets/ (cheap: no search, no torch)
    "docs/interop.md": (
        ("mine.json", _meshplan("import", "--from", "megatron", _GPT3_MEGATRON, "--model", "gpt3-175b",
                                 "--gpu", "a100-80gb", "--out", "mine.json")),  # the README's GPT-3 import
    ),
}

EXIT_CODES: dict[tuple[str, str], int] = {
    # (page, start of the command as shown): the exit code the page documents
}


def _run(argv: list[str], cwd: Path, stdout_path: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "200"}
    if stdout_path is None:
        return subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    with stdout_path.open("w") as fh:
        return subprocess.run(argv, check=False, cwd=cwd, env=env, stdout=fh, stderr=subprocess.PIPE, text=True,
                              timeout=COMMAND_TIMEOUT_S)


def _argv(text: str, cwd: Path) -> tuple[list[str], Path | None]:
    """The command as this interpreter runs it, and the file its stdout is redirected to."""
    words = shlex.split(_ENV_PREFIX.sub("", text))
    stdout_path = None
    if len(words) >= 2 and words[-2] == ">":
        stdout_path, words = cwd / words[-1], words[:-2]
    if words[0] == "meshplan":
        words = ["-m", "meshplan", *words[1:]]
    elif words[0] in ("python", "python3"):
        words = words[1:]
        if words[0].startswith("bench/"):
            words[0] = str(REPO / words[0])
    return [sys.executable, *words], stdout_path


def _skipped(command: DocCommand) -> bool:
    return _entry(NOT_RUN, command) is not None or _entry(SAME_AS, command) is not None


def _entry(table: dict[tuple[str, str], object], command: DocCommand) -> tuple[str, str] | None:
    return next((key for key in table if key[0] == command.page and command.bare.startswith(key[1])), None)


def test_every_page_has_commands_found():
    """The extractor sees the pages' commands (a change of fence or prompt style would hide them all)."""
    counts = {page: len(page_commands(page)) for page in PAGES}
    assert counts["README.md"] >= 30 and sum(counts.values()) >= 70, counts


def test_every_table_entry_names_a_shown_command():
    """No stale entry: each names a command still on its page."""
    shown = [c for page in PAGES for c in page_commands(page)]
    for table in (NOT_RUN, EXIT_CODES, SAME_AS):
        for page, start in table:
            assert any(c.page == page and c.bare.startswith(start) for c in shown), f"{page}: no command {start!r}"
    for (page, start), other in SAME_AS.items():
        here = next(c for c in shown if c.page == page and c.bare.startswith(start))
        assert any(_words(c.text) == _words(here.text) for c in page_commands(other)), f"{here}: not on {other}"


def _words(text: str) -> list[str]:
    return text.split()


def test_every_placeholder_is_accounted_for():
    for page in PAGES:
        for command in page_commands(page):
            if _entry(NOT_RUN, command) is None:
                unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", command.text)  # a quoted layout string may hold | [ ]
                assert not _PLACEHOLDER.search(unquoted), f"placeholder in {command}"


@pytest.mark.parametrize("page", [p for p in PAGES if not all(_skipped(c) for c in page_commands(p))])
def test_page_commands_run_as_shown(page, tmp_path):
    for _, make in GIVEN.get(page, ()):
        make(tmp_path)
    failures = []
    for command in page_commands(page):
        if _skipped(command):
            continue
        argv, stdout_path = _argv(command.text, tmp_path)
        out = _run(argv, tmp_path, stdout_path)
        key = _entry(EXIT_CODES, command)
        want = EXIT_CODES[key] if key else 0
        if out.returncode != want:
            tail = "\n".join((out.stderr or out.stdout or "").strip().splitlines()[-3:])
            failures.append(f"{command}\n  exit {out.returncode}, the page says {want}:\n  {tail}")
    assert not failures, "\n".join(failures)
