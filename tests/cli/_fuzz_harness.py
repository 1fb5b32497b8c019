"""The harness of the fuzz files (tests/cli/test_fuzz_*.py, one per kind of input): whatever a
file or a flag holds, the answer is exit code 0 or 2, never a traceback, and on 2 exactly one
``error:`` line (issue 19's rule, held for the inputs added since: --seq-len-dist, --expert-load,
cluster files with NVLink domains, NICs and host memory, Job files with offload / vocab_parallel /
keep_gathered / expert placement, profiles, runs CSVs, checkpoints for --resume and replan, HF
config.json).

Each case runs the console script's own function in-process (``meshplan.cli.main.main`` with
``sys.argv`` patched, stdout and stderr captured by typer's CliRunner isolation), so MeshplanError
and usage-error handling are those a user gets and a case costs a tenth of a second, not an
interpreter start. The launcher, the dry-run rank runner and the profiler are replaced by
tripwires (``install_tripwires``; the ``no_processes`` fixture of tests/cli/conftest.py, which
every fuzz file uses): no case starts a process. The good forms each file mutates, and the odd
values, are here; each file checks its own good forms are accepted, so that a refusal in its
properties is the mutation's.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import sys
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from meshplan.cli.main import main
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.expert_load import LOG_FORMAT, LOG_VERSION
from meshplan.spec.presets import resolve_model
from meshplan.spec.training import Precision, TrainingSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FUZZ = settings(max_examples=int(os.environ.get("MESHPLAN_FUZZ_EXAMPLES", "15")), deadline=None,
                suppress_health_check=list(HealthCheck))
"""Examples per property: enough to reach every field of a file over a few CI runs (hypothesis keeps
its failures), few enough that each file stays at a few seconds on 2 cores. MESHPLAN_FUZZ_EXAMPLES=500
searches deeper by hand."""


# ---- running the entry point ------------------------------------------------------------------
class HeavyWorkStarted(Exception):
    """A tripwire fired: the input was good enough to start a run or a measurement."""


def install_tripwires(monkeypatch) -> None:
    """Every way a command starts a process raises HeavyWorkStarted instead."""
    import meshplan.profile.run as profile_run
    import meshplan.runtime.dryrun_launch as dryrun_launch
    import meshplan.runtime.launch as launch

    def tripwire(*args, **kwargs):
        raise HeavyWorkStarted("the input reached a process launcher")

    monkeypatch.setattr(launch, "launch", tripwire)
    monkeypatch.setattr(dryrun_launch, "run_ranks", tripwire)
    monkeypatch.setattr(profile_run, "run_profile", tripwire)


def run_cli(argv: list[str]) -> tuple[int | str, str, str]:
    """(exit code or "exception", stdout, stderr) of ``meshplan ARGV``."""
    old_argv, sys.argv = sys.argv, ["meshplan", *argv]
    try:
        with CliRunner().isolation() as streams:
            out, err = streams[0], streams[1]
            try:
                main()
                code: int | str = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except HeavyWorkStarted:
                code = 0  # every value was good: the run would start
            except Exception:  # noqa: BLE001 - what the user would see as a traceback
                sys.stderr.write(traceback.format_exc())
                code = "exception"
            sys.stdout.flush()
            sys.stderr.flush()
            return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
    finally:
        sys.argv = old_argv


def assert_clean(argv: list[str]) -> tuple[int | str, str]:
    """The rule: exit 0 or 2, no traceback, and a refusal is exactly one ``error:`` line."""
    code, out, err = run_cli(argv)
    shown = f"meshplan {shlex.join(argv)}\nexit {code}\nstderr:\n{err[-3000:]}"
    assert "Traceback" not in out + err, shown
    assert code in (0, 2), shown
    if code == 2:  # a warning logged before the refusal may stand above it
        lines = err.splitlines()
        assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], shown
    return code, err


# ---- odd values --------------------------------------------------------------------------------
ODD_JSON = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 3, 7, 2**31, 10**30, -(10**30), 0.5, -0.5, 1e308]),
    st.integers(min_value=-(10**25), max_value=10**25), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6), st.lists(st.integers(min_value=-5, max_value=5), max_size=3), st.just({}),
    st.just(float("inf")), st.just(float("nan")),
)
"""What a field of a JSON or YAML file may hold instead of its value (inf and nan are written as
JSON's Infinity / NaN and YAML's .inf / .nan)."""

ODD_TEXT = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "1", "nan", "inf", "-inf", "1e400", "1.5", "abc", "0x10", "1_000",
                     "99999999999999999999", "-0", "\x00", "\u00e9", "3", "8", "true"]),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
"""What a command-line value or a CSV cell may hold."""


def _paths(d, path=()):
    """Every place in a nested dict/list a value sits (lists: their first three items)."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield path + (k,)
            yield from _paths(v, path + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d[:3]):
            yield path + (i,)
            yield from _paths(v, path + (i,))


def mutated(good, pick: int, value, *, delete: bool = False):
    """``good`` with the ``pick``-th place (modulo their count) set to ``value`` or deleted; an
    unknown key added when ``pick`` lands past the end."""
    d = json.loads(json.dumps(good))
    places = list(_paths(d))
    if pick % (len(places) + 1) == len(places):
        d["not_a_field"] = value
        return d
    where = places[pick % (len(places) + 1)]
    node = d
    for key in where[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[where[-1]]
    else:
        node[where[-1]] = value
    return d


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    return p


def dump_json(d) -> str:
    return json.dumps(d)  # inf and nan become Infinity / NaN, which meshplan must refuse


# ---- the inputs' good forms ---------------------------------------------------------------------
EC = ["estimate", "--seq-len", "1024", "--global-batch", "1024", "--json"]
"""estimate without a cluster: each case adds --gpu or --cluster."""
E = EC + ["--gpu", "a100-80gb"]
EM = EC + ["--model", "toy-moe", "--gpu", "a100-80gb", "--zero", "1", "--ep", "2"]
TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "256"}
PROFILE = FIXTURES / "profiles" / "cpu_profile_2cores.json"


def cpu_job() -> Job:
    return Job(model=resolve_model("toy-llama", TINY), training=TrainingSpec(seq_len=16, global_batch=8,
               precision=Precision.FP32), cluster=resolve_cluster("cpu", gpus=2),
               plan=Plan(dims=ParallelDims(dp_replicate=2), micro_batch=4))


def moe_job() -> dict:
    """A Job with every newer plan and training field set: pp with vocab_parallel, balanced expert
    placement with a replica, optimizer offload, OSDP keep_gathered, head splits, a document-length
    histogram and a routing log."""
    job = Job(model=resolve_model("mixtral-8x7b", {}),
              training=TrainingSpec(seq_len=4096, global_batch=256),
              cluster=resolve_cluster("dgx-h100", nodes=8), plan=Plan(dims=ParallelDims(dp_replicate=4, dp_shard=8,
                                                                                          pp=2, ep=8), zero=3))
    d = job.to_dict()
    d["plan"].update(micro_batch=2, recompute="full", offload=["optimizer"], vocab_parallel=True,
                     keep_gathered=["attention"], head_splits=8, expert_placement="balanced", expert_replicas=1)
    d["training"].update(seq_len_dist={"lengths": [128, 2048], "counts": [40, 6], "source": "dist.csv"},
                         expert_load={"counts": [[[100, 50, 30, 20, 10, 5, 3, 2]] * 32], "source": "x.jsonl"})
    return d


# --expert-load: a routing log
HEADER = {"format": LOG_FORMAT, "version": LOG_VERSION, "num_experts": 4, "top_k": 2, "moe_layers": 4}
ROW = {"step": 1, "counts": [[10, 20, 30, 40], [5, 5, 5, 5], [1, 0, 0, 0], [9, 9, 9, 8]]}
"""A log of toy-moe (4 experts in each of its 4 layers)."""


def expert_log(header, rows) -> str:
    return "\n".join(json.dumps(r) for r in [header, *rows]) + "\n"


# cluster files (YAML or JSON)
def example_cluster_text() -> str:
    return run_cli(["clusters", "--example"])[1]


def example_cluster() -> dict:
    return yaml.safe_load(example_cluster_text())


def moe_on_cluster(path: Path) -> list[str]:
    """toy-moe with expert parallelism and optimizer offload (the host fields) on a cluster file."""
    return EC + ["--model", "toy-moe", "--cluster", str(path), "--zero", "3", "--ep", "2", "--offload", "optimizer"]


def estimate_with_profile(path: Path | str) -> list[str]:
    """estimate on the profile's own device (the 2-core CPU of the fixture)."""
    return ["estimate", "--model", "gpt2", "--cluster", "cpu", "--precision", "fp32", "--seq-len", "1024",
            "--global-batch", "32", "--json", "--cluster-profile", str(path)]


# import: a Megatron-LM command line
MEGATRON_ARGS = ["--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
                 "--global-batch-size", "32", "--vocab-size", "50257", "--micro-batch-size", "4",
                 "--tensor-model-parallel-size", "2", "--num-experts", "8", "--moe-router-topk", "2",
                 "--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]


def import_megatron(args: list[str]) -> list[str]:
    return ["import", "--from", "megatron", shlex.join(args + ["--use-distributed-optimizer"]), "--gpu", "a100-80gb",
            "--gpus", "8", "--json"]


# checkpoints: train --resume, replan and export-weights read them
def make_checkpoint(root: Path) -> Path:
    """A committed checkpoint of ``cpu_job()`` under ``root``."""
    from test_bad_inputs import _checkpoint  # the committed-checkpoint fixture of issue 19's table

    _checkpoint(root, cpu_job())
    return root


# validate --runs: published rows
def _first_row(csv_path: Path, want_moe: bool) -> tuple[list[str], dict[str, str]]:
    with csv_path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        row = next(r for r in reader if bool(r.get("moe_num_experts")) == want_moe)
        return list(reader.fieldnames or []), row


def published_rows() -> list[tuple[list[str], dict[str, str]]]:
    """The first dense row of the calibration runs and the first MoE row of the bridge runs (the
    test is skipped without the shared data)."""
    data = Path("/work/shared/data")
    if not (data / "runs_megatron_bridge.csv").exists():
        pytest.skip("shared data not here")
    return [_first_row(data / "runs_calibration.csv", False), _first_row(data / "runs_megatron_bridge.csv", True)]


def runs_csv_text(header: list[str], row: dict[str, str]) -> str:
    """A runs CSV of one row."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerow(row)
    return buf.getvalue()
