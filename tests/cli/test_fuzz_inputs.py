"""Fuzz every file a command reads and the newer numeric flags: whatever the content, the answer
is exit code 0 or 2, never a traceback, and on 2 exactly one ``error:`` line (issue 19's rule,
held for the inputs added since: --seq-len-dist, --expert-load, cluster files with NVLink
domains, NICs and host memory, Job files with offload / vocab_parallel / keep_gathered / expert
placement, profiles, runs CSVs, checkpoints for --resume and replan, HF config.json).

Each case runs the console script's own function in-process (``meshplan.cli.main.main`` with
``sys.argv`` patched, stdout and stderr captured by typer's CliRunner isolation), so MeshplanError
and usage-error handling are those a user gets and a case costs a tenth of a second, not an
interpreter start. The launcher, the dry-run rank runner and the profiler are replaced by
tripwires: no case starts a process. The regression cases at the end are the inputs that raised
a traceback before the fixes of this module's commit.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
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
its failures), few enough that the module stays under ~30 s on 2 cores. MESHPLAN_FUZZ_EXAMPLES=500
searches deeper by hand."""


# ---- running the entry point ------------------------------------------------------------------
class HeavyWorkStarted(Exception):
    """A tripwire fired: the input was good enough to start a run or a measurement."""


@pytest.fixture(autouse=True)
def no_processes(monkeypatch, tmp_path):
    import meshplan.profile.run as profile_run
    import meshplan.runtime.dryrun_launch as dryrun_launch
    import meshplan.runtime.launch as launch

    def tripwire(*args, **kwargs):
        raise HeavyWorkStarted("the input reached a process launcher")

    monkeypatch.setattr(launch, "launch", tripwire)
    monkeypatch.setattr(dryrun_launch, "run_ranks", tripwire)
    monkeypatch.setattr(profile_run, "run_profile", tripwire)
    monkeypatch.chdir(tmp_path)  # whatever a command writes stays out of the repository


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


# ---- the inputs' good forms ---------------------------------------------------------------------
EC = ["estimate", "--seq-len", "1024", "--global-batch", "1024", "--json"]
"""estimate without a cluster: each case adds --gpu or --cluster."""
E = EC + ["--gpu", "a100-80gb"]
EM = EC + ["--model", "toy-moe", "--gpu", "a100-80gb", "--zero", "1", "--ep", "2"]
TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "256"}


def _cpu_job() -> Job:
    return Job(model=resolve_model("toy-llama", TINY), training=TrainingSpec(seq_len=16, global_batch=8,
               precision=Precision.FP32), cluster=resolve_cluster("cpu", gpus=2),
               plan=Plan(dims=ParallelDims(dp_replicate=2), micro_batch=4))


def _moe_job() -> dict:
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


def _dump_json(d) -> str:
    return json.dumps(d)  # inf and nan become Infinity / NaN, which meshplan must refuse


@pytest.fixture(scope="module")
def moe_job_dict() -> dict:
    return _moe_job()


def test_the_fixtures_are_good(tmp_path, moe_job_dict):
    """Each good form the properties mutate is accepted: a refusal below is the mutation's."""
    plan = write(tmp_path, "job.json", _dump_json(moe_job_dict))
    assert assert_clean(["explain", str(plan), "--json"])[0] == 0
    assert assert_clean(EM + ["--expert-load", str(write(tmp_path, "el.jsonl", _expert_log(HEADER, [ROW])))])[0] == 0
    assert assert_clean(_moe_on_cluster(write(tmp_path, "c.yaml", _example_cluster())))[0] == 0
    profile = str(FIXTURES / "profiles" / "cpu_profile_2cores.json")
    assert assert_clean(["profile", "--show", profile])[0] == 0
    assert assert_clean(_import_megatron(MEGATRON_ARGS))[0] == 0
    assert assert_clean(["estimate", "--model", "gpt2", "--cluster", "cpu", "--precision", "fp32", "--seq-len", "1024",
                         "--global-batch", "32", "--json", "--cluster-profile", profile])[0] == 0


# ---- Job (plan) files ---------------------------------------------------------------------------
@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(),
       command=st.sampled_from(["explain", "estimate", "export-megatron", "export-torchtitan", "export-deepspeed",
                                "plan-compare"]))
def test_fuzz_job_file(pick, value, delete, command, moe_job_dict, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("job"), "job.json", _dump_json(mutated(moe_job_dict, pick, value, delete=delete)))
    argv = {"explain": ["explain", str(path), "--json"], "estimate": ["estimate", "--plan", str(path), "--json"],
            "export-megatron": ["export", str(path), "--to", "megatron", "--json"],
            "export-torchtitan": ["export", str(path), "--to", "torchtitan", "--json"],
            "export-deepspeed": ["export", str(path), "--to", "deepspeed", "--json"],
            "plan-compare": ["plan", "--compare", str(path), "--top", "1", "--json"]}[command]
    assert_clean(argv)


# ---- --seq-len-dist: histogram CSV, one length per line, JSON lines -----------------------------
LENGTH_CELLS = st.one_of(ODD_TEXT, st.integers(min_value=1, max_value=5000).map(str))
SEQ_LEN_LINES = st.one_of(
    st.tuples(LENGTH_CELLS, LENGTH_CELLS).map(",".join),  # a histogram row
    LENGTH_CELLS,  # a sample
    st.builds(lambda v: json.dumps({"length": v}), ODD_JSON),  # a JSON-lines record
    st.sampled_from(['{"length": 5', "[1, 2]", '"text"', "length,count", "length", "1,2,3", ",", "{}"]),
)


@FUZZ
@given(header=st.sampled_from(["length,count\n", "length\n", "", "len,cnt\n", "\ufefflength,count\n"]),
       lines=st.lists(SEQ_LEN_LINES, max_size=5), newline=st.sampled_from(["\n", "\r\n"]),
       extra=st.sampled_from([[], ["--doc-balance", "balanced"], ["--cp", "2", "--cp-buckets"]]))
def test_fuzz_seq_len_dist(header, lines, newline, extra, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("sld"), "lengths.txt", header + newline.join(lines) + newline)
    assert_clean(E + ["--model", "gpt2", "--seq-len-dist", str(path)] + extra)


# ---- --expert-load: a routing log ----------------------------------------------------------------
HEADER = {"format": LOG_FORMAT, "version": LOG_VERSION, "num_experts": 4, "top_k": 2, "moe_layers": 4}
ROW = {"step": 1, "counts": [[10, 20, 30, 40], [5, 5, 5, 5], [1, 0, 0, 0], [9, 9, 9, 8]]}
"""A log of toy-moe (4 experts in each of its 4 layers)."""


def _expert_log(header, rows) -> str:
    return "\n".join(json.dumps(r) for r in [header, *rows]) + "\n"


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), in_header=st.booleans(),
       steps=st.integers(min_value=0, max_value=2), cut=st.integers(min_value=0, max_value=4))
def test_fuzz_expert_load_log(pick, value, delete, in_header, steps, cut, tmp_path_factory):
    header = mutated(HEADER, pick, value, delete=delete) if in_header else HEADER
    rows = [ROW] * steps if in_header else [mutated(ROW, pick, value, delete=delete)] * max(steps, 1)
    text = _expert_log(header, rows)
    path = write(tmp_path_factory.mktemp("el"), "load.jsonl", text[:len(text) - cut])
    assert_clean(EM + ["--expert-load", str(path), "--expert-placement", "balanced"])


# ---- cluster files (YAML or JSON) -----------------------------------------------------------------
def _example_cluster() -> str:
    return run_cli(["clusters", "--example"])[1]


@pytest.fixture(scope="module")
def example_cluster() -> dict:
    return yaml.safe_load(_example_cluster())


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), as_json=st.booleans(),
       extra=st.sampled_from([[], ["--nodes", "2"], ["--gpus-per-node", "4"]]))
def test_fuzz_cluster_file(pick, value, delete, as_json, extra, example_cluster, tmp_path_factory):
    d = mutated(example_cluster, pick, value, delete=delete)
    text = _dump_json(d) if as_json else yaml.safe_dump(d)
    path = write(tmp_path_factory.mktemp("cl"), "cluster.json" if as_json else "cluster.yaml", text)
    assert_clean(_moe_on_cluster(path) + extra)


def _moe_on_cluster(path: Path) -> list[str]:
    """toy-moe with expert parallelism and optimizer offload (the host fields) on a cluster file."""
    return EC + ["--model", "toy-moe", "--cluster", str(path), "--zero", "3", "--ep", "2", "--offload", "optimizer"]


@FUZZ
@given(system=st.sampled_from(["dgx-h100", "gb200-nvl72", "dgx-a100", "nope"]),
       field=st.sampled_from(["num_nodes", "gpus_per_node", "scale_up_domain_gpus", "nics_per_node",
                              "nic_bandwidth_bytes_per_s", "host_memory_gib_per_node", "clock_fraction",
                              "host_device_bandwidth_bytes_per_s", "gpu", "system"]),
       value=ODD_JSON)
def test_fuzz_cluster_short_form(system, field, value, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("cls"), "c.yaml", yaml.safe_dump({"system": system, field: value}))
    assert_clean(EC + ["--model", "gpt2", "--cluster", str(path)])


# ---- Hugging Face config.json -----------------------------------------------------------------------
HF_FAMILIES = ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b", "nemotron-3-nano", "qwen3-30b-a3b",
               "gpt2", "bert-large"]


@FUZZ
@given(family=st.sampled_from(HF_FAMILIES), pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans())
def test_fuzz_hf_config(family, pick, value, delete, tmp_path_factory):
    good = json.loads((FIXTURES / "hf" / family / "config.json").read_text())
    path = write(tmp_path_factory.mktemp("hf"), "config.json", _dump_json(mutated(good, pick, value, delete=delete)))
    assert_clean(E + ["--model", str(path)])


# ---- hardware profiles: profile --show and --cluster-profile ---------------------------------------
@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), show=st.booleans())
def test_fuzz_hardware_profile(pick, value, delete, show, tmp_path_factory):
    good = json.loads((FIXTURES / "profiles" / "cpu_profile_2cores.json").read_text())
    path = write(tmp_path_factory.mktemp("prof"), "p.json", _dump_json(mutated(good, pick, value, delete=delete)))
    estimate = ["estimate", "--model", "gpt2", "--cluster", "cpu", "--precision", "fp32", "--seq-len", "1024",
                "--global-batch", "32", "--json", "--cluster-profile", str(path)]  # the profile's own device
    assert_clean(["profile", "--show", str(path)] if show else estimate)


# ---- validate --runs: one published row with a cell replaced ----------------------------------------
def _first_row(csv_path: Path, want_moe: bool) -> tuple[list[str], dict[str, str]]:
    import csv

    with csv_path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        row = next(r for r in reader if bool(r.get("moe_num_experts")) == want_moe)
        return list(reader.fieldnames or []), row


@pytest.fixture(scope="module")
def runs_rows() -> list[tuple[list[str], dict[str, str]]]:
    data = Path("/work/shared/data")
    if not (data / "runs_megatron_bridge.csv").exists():
        pytest.skip("shared data not here")
    return [_first_row(data / "runs_calibration.csv", False), _first_row(data / "runs_megatron_bridge.csv", True)]


@FUZZ
@given(which=st.integers(min_value=0, max_value=1), pick=st.integers(min_value=0), cell=ODD_TEXT,
       extra=st.sampled_from([[], ["--holdout"], ["--target", "megatron"]]))
def test_fuzz_runs_csv_cells(which, pick, cell, extra, runs_rows, tmp_path_factory):
    import csv
    import io

    header, row = runs_rows[which]
    row = {**row, header[pick % len(header)]: cell}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerow(row)
    path = write(tmp_path_factory.mktemp("runs"), "runs.csv", buf.getvalue())
    assert_clean(["validate", "--runs", str(path), "--json"] + extra)


# ---- every file option: not a file, not text, empty, or missing ---------------------------------------
NOT_A_FILE = st.sampled_from(["missing", "dir", "empty", "binary", "blank", "dev-null"])
FILE_OPTIONS = {
    "--seq-len-dist": E + ["--model", "gpt2", "--seq-len-dist"],
    "--expert-load": EM + ["--expert-load"],
    "--cluster": EC + ["--model", "gpt2", "--cluster"],
    "--model": E + ["--model"],
    "--cluster-profile": E + ["--model", "gpt2", "--cluster-profile"],
    "estimate --plan": ["estimate", "--json", "--plan"],
    "explain": ["explain"],
    "export": ["export", "--to", "megatron"],
    "profile --show": ["profile", "--show"],
    "validate --runs": ["validate", "--runs"],
    "replan --checkpoint": ["replan", "--gpus", "4", "--checkpoint"],
    "import torchtitan": ["import", "--from", "torchtitan", "--gpu", "a100-80gb", "--gpus", "8"],
    "import megatron @file": ["import", "--from", "megatron", "--gpu", "a100-80gb", "--gpus", "8"],
    "train --plan": ["train", "--plan"],
    "train --data": ["train", "--plan", "{cpu}", "--data"],
    "train --init-from": ["train", "--plan", "{cpu}", "--init-from"],
    "train --resume": ["train", "--plan", "{cpu}", "--resume", "--checkpoint-dir"],
    "export-weights": ["export-weights", "--to", "hf"],
}


@FUZZ
@given(option=st.sampled_from(sorted(FILE_OPTIONS)), kind=NOT_A_FILE)
def test_fuzz_not_a_file(option, kind, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nf")
    cpu = tmp / "cpu.json"
    _cpu_job().save(cpu)
    target = {"missing": tmp / "missing.json", "dir": tmp, "empty": write(tmp, "e.json", ""),
              "binary": write(tmp, "b.json", b"\x89PNG\r\n\x1a\n\x00" + bytes(range(256))),
              "blank": write(tmp, "w.json", " \n\n"), "dev-null": Path("/dev/null")}[kind]
    argv = [a.replace("{cpu}", str(cpu)) for a in FILE_OPTIONS[option]]
    arg = f"@{target}" if option.endswith("@file") else str(target)
    argv = argv + [arg] + ([str(tmp / "out")] if option == "export-weights" else [])
    assert_clean(argv)


# ---- checkpoints: train --resume and replan over a foreign or damaged checkpoint ----------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from test_bad_inputs import _checkpoint  # the committed-checkpoint fixture of issue 19's table

    root = tmp_path_factory.mktemp("ckpt")
    _checkpoint(root, _cpu_job())
    return root


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(), replan=st.booleans())
def test_fuzz_checkpoint_meta(pick, value, delete, replan, checkpoint, tmp_path_factory):
    import shutil

    from meshplan import ckpt_meta

    root = tmp_path_factory.mktemp("ck") / "ckpt"
    shutil.copytree(checkpoint, root)
    meta = root / ckpt_meta.step_dirname(4) / ckpt_meta.META_FILENAME
    meta.write_text(_dump_json(mutated(json.loads(meta.read_text()), pick, value, delete=delete)))
    cpu = root.parent / "cpu.json"
    _cpu_job().save(cpu)
    assert_clean(["replan", "--checkpoint", str(root), "--gpus", "4", "--json"] if replan
                 else ["train", "--plan", str(cpu), "--checkpoint-dir", str(root), "--resume"])


def test_resume_of_a_foreign_checkpoint_is_one_line(checkpoint, tmp_path, moe_job_dict):
    """A checkpoint of another model is refused before anything starts."""
    plan = write(tmp_path, "moe.json", _dump_json(moe_job_dict))
    code, err = assert_clean(["train", "--plan", str(plan), "--checkpoint-dir", str(checkpoint), "--resume"])
    assert code == 2, err


# ---- numeric and text flags added since issue 19 ---------------------------------------------------
PLAN_FLAGS = ["--mlp-splits", "--head-splits", "--expert-replicas", "--expert-skew", "--moe-capacity-factor",
              "--vpp", "--dp-shard", "--keep-gathered", "--offload", "--stage-layers", "--recompute-layers",
              "--target", "--global-batch-tokens", "--cp"]
PLAN_TEXT = st.one_of(ODD_TEXT, st.sampled_from(["attention+mlp", "optimizer+params", "params", "activations",
                                                 "embedding+head", "6,6", "2x6", "megatron", "torchtitan",
                                                 "deepspeed", "+", "mlp+mlp"]))


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(PLAN_FLAGS), PLAN_TEXT), min_size=1, max_size=3),
       moe=st.booleans(), base=st.sampled_from([[], ["--zero", "3"], ["--pp", "2", "--vocab-parallel"]]))
def test_fuzz_plan_flags(flags, moe, base, tmp_path_factory):
    argv = (EM if moe else E + ["--model", "gpt2"]) + base
    for flag, value in flags:
        argv += [flag, value]
    assert_clean(argv)


TRAIN_FLAGS = ["--eval-fraction", "--min-lr-ratio", "--clip-grad", "--weight-decay", "--warmup-steps",
               "--collective-timeout-s", "--eval-every", "--checkpoint-every", "--checkpoint-keep", "--ranks"]


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(TRAIN_FLAGS), ODD_TEXT), min_size=1, max_size=3),
       dry_run=st.booleans())
def test_fuzz_train_flags_never_start_on_bad_input(flags, dry_run, tmp_path_factory):
    cpu = tmp_path_factory.mktemp("train") / "cpu.json"
    _cpu_job().save(cpu)
    argv = ["train", "--plan", str(cpu)] + (["--dry-run"] if dry_run else [])
    for flag, value in flags:
        argv += [flag, value]
    assert_clean(argv)


@FUZZ
@given(gpus=ODD_TEXT, memory=st.one_of(st.none(), ODD_TEXT), gpn=st.one_of(st.none(), ODD_TEXT))
def test_fuzz_replan_numbers(gpus, memory, gpn, checkpoint):
    argv = ["replan", "--checkpoint", str(checkpoint), "--gpus", gpus, "--json"]
    argv += ["--memory-gib", memory] if memory is not None else []
    argv += ["--gpus-per-node", gpn] if gpn is not None else []
    assert_clean(argv)


# ---- plans the runtime cannot run: refused on one line, before any process -------------------------
TP2 = {"dp_replicate": 1, "dp_shard": 1, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "etp": 0}
PP2 = {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "pp": 2, "cp": 1, "ep": 1, "etp": 0}


@pytest.mark.parametrize(("model", "plan", "expect"), [
    ({"vocab_size": 255}, {"dims": TP2}, "not divisible by tp=2"),  # the runtime's own rule (targets.py)
    ({}, {"dims": PP2, "micro_batch": 8}, "needs at least 2 micro-batches"),  # torch's Schedule1F1B
    ({}, {"dims": PP2, "stage_layers": [1, 2]}, "stage_layers sum to 3"),
    ({}, {"head_splits": 3}, "head_splits=3"),
    ({}, {"keep_gathered": ["mlp"]}, "keep_gathered needs zero 3"),
    ({}, {"expert_placement": "balanced"}, "need ep > 1"),
], ids=["vocab-tp", "1f1b-microbatches", "stage-layers", "head-splits", "keep-gathered", "expert-placement"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["train", "dry-run"])
def test_train_refusals_are_one_line(model, plan, expect, dry_run, tmp_path):
    d = _cpu_job().to_dict()
    d["model"].update(model)
    d["plan"].update(plan)
    path = write(tmp_path, "job.json", _dump_json(d))
    code, err = assert_clean(["train", "--plan", str(path)] + (["--dry-run"] if dry_run else []))
    assert code == 2 and expect in err, err


# ---- regressions: inputs that raised a traceback before this module's fixes --------------------------
def _job_with(d: dict, where: tuple, value) -> dict:
    d = json.loads(json.dumps(d))
    node = d
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return d


@pytest.mark.parametrize(("where", "value", "expect"), [
    (("model",), None, "'model' section must be an object, got None"),  # TypeError: not iterable
    (("training",), 0.5, "'training' section must be an object, got 0.5"),
    (("plan",), [1], "'plan' section must be an object, got [1]"),
    (("cluster",), "dgx-h100", "'cluster' section must be an object"),
    (("training", "expert_load", "counts", 0, 0, 0), 10**30, "token counts must be non-negative integers, got 1000000000000000000000000000000 (at most"),  # OverflowError
    (("model", "attention_sinks"), {}, "attention_sinks must be true or false, got {}"),  # unhashable in a cache
    (("model", "name"), [1], "name must be text, got [1]"),
], ids=["model-null", "training-number", "plan-list", "cluster-text", "expert-count-huge", "model-bool-dict",
        "model-name-list"])
def test_regression_job_file(where, value, expect, moe_job_dict, tmp_path):
    path = write(tmp_path, "job.json", _dump_json(_job_with(moe_job_dict, where, value)))
    code, err = assert_clean(["explain", str(path), "--json"])
    assert code == 2 and expect in err, err


def test_regression_expert_load_count_too_large(tmp_path):
    """A routing-log count past int64 (OverflowError in the step sums) names the line and value."""
    row = {"step": 1, "counts": [[10**30, 2, 3, 4], *ROW["counts"][1:]]}
    path = write(tmp_path, "load.jsonl", _expert_log(HEADER, [row]))
    code, err = assert_clean(EM + ["--expert-load", str(path)])
    assert code == 2 and "line 2: token counts must be non-negative integers, got 10" in err and "at most 2,147,483,647" in err, err


@pytest.mark.parametrize("show", [True, False], ids=["show", "cluster-profile"])
def test_regression_profile_zero_shape(show, tmp_path):
    """An attention sample of head_dim 0 divided by zero (ZeroDivisionError in `profile --show`)."""
    d = json.loads((FIXTURES / "profiles" / "cpu_profile_2cores.json").read_text())
    d["attention"][0]["head_dim"] = 0
    path = write(tmp_path, "p.json", _dump_json(d))
    code, err = assert_clean(["profile", "--show", str(path)] if show else
                             EC + ["--model", "gpt2", "--cluster", "cpu", "--precision", "fp32", "--cluster-profile", str(path)])
    assert code == 2 and "attention[0].head_dim must be a positive integer, got 0" in err, err


@pytest.mark.parametrize("size", ["1e400", "1e300", "1e-12"])
def test_regression_export_weights_shard_size(size, checkpoint, tmp_path):
    """--max-shard-gb inf raised OverflowError converting to bytes; 1e-12 GB rounded to 0 bytes."""
    code, err = assert_clean(["export-weights", str(checkpoint), str(tmp_path / "out"), "--max-shard-gb", size])
    assert code == 2 and "--max-shard-gb" in err, err


def test_regression_export_weights_damaged_checkpoint(checkpoint, tmp_path):
    """Shards that are not DCP files raised torch's UnpicklingError through the command."""
    pytest.importorskip("torch")
    code, err = assert_clean(["export-weights", str(checkpoint), str(tmp_path / "out")])
    assert code == 2 and "cannot read the checkpoint's tensors" in err, err


@pytest.mark.parametrize("memory", ["0", "-3"])
def test_regression_runs_csv_memory(memory, runs_rows, tmp_path):
    """A measured peak memory of 0 divided by zero in the memory error (ZeroDivisionError)."""
    import csv
    import io

    header, row = runs_rows[0]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerow({**row, "measured_peak_mem_gib": memory})
    code, err = assert_clean(["validate", "--runs", str(write(tmp_path, "runs.csv", buf.getvalue())), "--json"])
    assert code == 2 and "measured_peak_mem_gib" in err and "> 0 GiB" in err, err


def test_regression_validate_fit_json(runs_rows, tmp_path):
    """`validate --fit --json` raised TypeError: a fit's settings (a MappingProxyType) were not JSON."""
    import csv
    import io

    header, row = runs_rows[0]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    writer.writerow(row)
    argv = ["validate", "--runs", str(write(tmp_path, "runs.csv", buf.getvalue())), "--fit", "--json"]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert json.loads(out)["fit"], out


# ---- import: a Megatron-LM command line with one value replaced ------------------------------------
MEGATRON_ARGS = ["--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
                 "--global-batch-size", "32", "--vocab-size", "50257", "--micro-batch-size", "4",
                 "--tensor-model-parallel-size", "2", "--num-experts", "8", "--moe-router-topk", "2",
                 "--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"]


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_TEXT)
def test_fuzz_import_megatron(pick, value):
    args = list(MEGATRON_ARGS)
    args[1 + 2 * (pick % (len(args) // 2))] = value
    assert_clean(_import_megatron(args))


def _import_megatron(args: list[str]) -> list[str]:
    return ["import", "--from", "megatron", shlex.join(args + ["--use-distributed-optimizer"]), "--gpu", "a100-80gb",
            "--gpus", "8", "--json"]
