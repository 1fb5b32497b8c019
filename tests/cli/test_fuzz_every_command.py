"""Fuzz every command of the CLI at once: each of its options (read from the typer app itself, so a
command or option added later is fuzzed too) given odd, huge and zero values or malformed files,
base values replaced or dropped. The rule (harness: _fuzz_harness.py): exit 0 or 2, one ``error:``
line on 2, never a traceback, and no process started by an input that should have been refused.

The other fuzz files go deep on one kind of input each; this one goes wide. Heavy work that good
input rightly starts (validate's fit and hold-out, which take minutes) is left out by flag
(``HEAVY_FLAGS``); the launcher, the dry-run simulator and the profiler are tripwires."""

from __future__ import annotations

import json
import os
import shlex

import pytest
import typer.main
from _fuzz_harness import (
    E, MEGATRON_ARGS, ODD_TEXT, PROFILE, assert_clean, cpu_job, runs_csv_text, write,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.cli.main import _register, app

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

EVERY = settings(max_examples=int(os.environ.get("MESHPLAN_FUZZ_EVERY_EXAMPLES", "120")), deadline=None,
                 suppress_health_check=list(HealthCheck))
"""Cases per run: about 0.2 s each on the loaded 2-core host, so the file stays under a minute;
MESHPLAN_FUZZ_EVERY_EXAMPLES=2000 searches deeper by hand."""
HEAVY_FLAGS = {"--fit", "--holdout", "--leave-one-source-out", "--write-calibration"}
"""validate's flags that start minutes of fitting on good input (test_fuzz_runs_csv.py covers them)."""
SIZES = ["0", "-1", "1", "3", "1000000", "1000000000", "2147483648", "10" * 15, "1e9", "0.0"]
"""Zero, negative and huge sizes, as a user would type them."""
TOKENS = ["gpt2", "toy-llama", "deepseek-v3", "cpu", "h100-sxm", "megatron", "torchtitan", "bf16", "fp8", "all",
          "first,last", "1-8", "8-2048", "2,4", "num_layers=100000000", "hidden_size=0", "--json", "-"]
"""Plausible words in the wrong place."""


def _commands() -> dict[str, list]:
    _register()
    group = typer.main.get_command(app)
    return {name: [p for p in cmd.params if p.param_type_name == "option"] for name, cmd in group.commands.items()}


COMMANDS = _commands()


@pytest.fixture(scope="module")
def files(tmp_path_factory, runs_rows) -> dict:
    """Good inputs the base command lines read, and malformed ones to put anywhere a value goes."""
    d = tmp_path_factory.mktemp("every")
    job = cpu_job()
    good_job = write(d, "job.json", job.to_json())
    text = job.to_json()
    header, row = runs_rows[0]
    bad = {
        "empty": write(d, "empty.json", ""),
        "binary": write(d, "binary.bin", bytes(range(256)) * 4),
        "null": write(d, "null.json", "null"),
        "list": write(d, "list.json", "[1, 2]"),
        "object": write(d, "object.json", "{}"),
        "truncated": write(d, "truncated.json", text[: len(text) // 2]),
        "wrong-types": write(d, "types.json", json.dumps({"model": 1, "training": [], "plan": "x", "cluster": None})),
        "huge-job": write(d, "huge.json", json.dumps(_huge(json.loads(text)))),
        "zero-job": write(d, "zero.json", json.dumps(_huge(json.loads(text), value=0))),
        "csv-header-only": write(d, "header.csv", ",".join(header) + "\n"),
        "csv-garbage": write(d, "garbage.csv", 'a,"b\n1,2,3,4\n\x00\n'),
        "yaml-garbage": write(d, "garbage.yaml", "a: [b: : c\n  - ]]\n"),
        "directory": d,
        "missing": d / "no" / "such.json",
    }
    return {"job": good_job, "runs": write(d, "runs.csv", runs_csv_text(header, row)), "dir": d, "bad": bad}


def _huge(job: dict, value: int = 10**9) -> dict:
    """Every integer size of the model and training set to ``value``."""
    for section in ("model", "training"):
        for key, v in job[section].items():
            if isinstance(v, int) and not isinstance(v, bool):
                job[section][key] = value
    return job


def _base(command: str, f: dict) -> list[str]:
    """A good, cheap command line of each command (answers in well under a second)."""
    job = str(f["job"])
    out = str(f["dir"] / "out")
    return {
        "estimate": E + ["--model", "gpt2"],
        "explain": ["explain", job, "--json"],
        "export": ["export", job, "--to", "megatron", "--json"],
        "export-weights": ["export-weights", str(f["dir"] / "ckpt"), out, "--json"],
        "import": ["import", "--from", "megatron", shlex.join(MEGATRON_ARGS + ["--use-distributed-optimizer"]),
                   "--gpu", "a100-80gb", "--gpus", "8", "--json"],
        "models": ["models", "--json"],
        "clusters": ["clusters", "--json"],
        "plan": ["plan", "--model", "toy-llama", "--cluster", "cpu", "--gpus", "2", "--seq-len", "64",
                 "--global-batch", "8", "--precision", "fp32", "--json"],
        "profile": ["profile", "--show", str(PROFILE), "--json"],
        "replan": ["replan", "--checkpoint", str(f["dir"] / "ckpt"), "--gpus", "2", "--cluster", "cpu", "--json"],
        "report": ["report", "--plan", job, "--out", str(f["dir"] / "r.html"), "--json"],
        "train": ["train", "--plan", job, "--dry-run", "--json"],
        "validate": ["validate", "--runs", str(f["runs"]), "--json"],
    }[command]


def _values(f: dict):
    return st.one_of(ODD_TEXT, st.sampled_from(SIZES + TOKENS),
                     st.sampled_from(sorted(f["bad"])).map(lambda k: str(f["bad"][k])))


@st.composite
def _case(draw, f: dict) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    argv = list(_base(command, f))
    options = [o for o in COMMANDS[command] if o.opts[0] not in HEAVY_FLAGS]
    values = _values(f)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        how = draw(st.sampled_from(["add", "replace", "drop"]))
        if how == "add" and options:
            opt = draw(st.sampled_from(options))
            argv += [opt.opts[0]] if opt.is_flag else [opt.opts[0], draw(values)]
        elif how == "replace" and len(argv) > 1:
            argv[draw(st.integers(min_value=1, max_value=len(argv) - 1))] = draw(values)
        elif how == "drop" and len(argv) > 1:
            del argv[draw(st.integers(min_value=1, max_value=len(argv) - 1))]
    if any(a in HEAVY_FLAGS for a in argv):  # a replaced value may have spelled one
        argv = [a for a in argv if a not in HEAVY_FLAGS]
    return argv


@EVERY
@given(data=st.data())
def test_fuzz_every_command(data, files):
    argv = data.draw(_case(files))
    assert_clean(argv)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_base_command_line_is_good(command, files):
    """The good forms the property mutates are accepted (else a refusal there would be theirs)."""
    if command in ("export-weights", "replan"):
        pytest.skip("reads a checkpoint; the base points at none (test_fuzz_checkpoints.py has them)")
    code, err = assert_clean(_base(command, files))
    assert code == 0, err
