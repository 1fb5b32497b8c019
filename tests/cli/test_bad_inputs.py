"""Bad input across every command, through the real entry point: exit code 2, exactly one line on
stderr that names the problem, never a traceback, and nothing heavy started (issue 12, item 12).

The table runs in-process (``meshplan.cli.main.main`` with ``sys.argv`` patched: the console
script's own function, its MeshplanError and usage-error handling included); a few cases go
through a real ``python -m meshplan`` subprocess to prove the same for the console script path.
``train`` and ``profile`` must refuse before they start any process: the launcher and the profiler
are replaced by a tripwire that fails the case if they are reached.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan import ckpt_meta
from meshplan.ckpt_meta import CheckpointFile, CheckpointMeta
from meshplan.cli.main import main
from meshplan.plan import Job, ParallelDims, Plan
from meshplan.spec.cluster import resolve_cluster, system_preset
from meshplan.spec.presets import model_preset, resolve_model
from meshplan.spec.training import Precision, TrainingSpec

SRC = Path(__file__).resolve().parents[2] / "src"

COMMANDS = {"estimate", "explain", "export", "import", "models", "clusters", "plan", "profile",
            "replan", "report", "train", "validate"}
"""The 12 commands `meshplan --help` lists; the table must cover each."""


# ---- running the entry point in-process -------------------------------------------------------
@dataclass(frozen=True)
class Result:
    code: int | str
    stdout: str
    stderr: str


class HeavyWorkStarted(Exception):
    """Raised by the tripwires: a bad input reached the launcher or the profiler."""


@pytest.fixture
def no_heavy_work(monkeypatch):
    import meshplan.profile.run as profile_run
    import meshplan.runtime.launch as launch

    def tripwire(*args, **kwargs):
        raise HeavyWorkStarted("bad input reached the process launcher")

    monkeypatch.setattr(launch, "launch", tripwire)
    monkeypatch.setattr(profile_run, "run_profile", tripwire)


def invoke(args: list[str]) -> Result:
    """``meshplan ARGS`` through main(); an exception escaping main() is recorded as a traceback."""
    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = ["meshplan", *args]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code: int | str = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 - what the user would see as a traceback
                traceback.print_exc(file=err)
                code = "exception"
    finally:
        sys.argv = old_argv
    return Result(code, out.getvalue(), err.getvalue())


def assert_one_line_error(r: Result, expect: str, args: list[str]) -> None:
    shown = f"meshplan {shlex.join(args)}\nexit {r.code}\nstderr:\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stdout + r.stderr, shown
    assert r.code == 2, shown
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert expect.lower() in lines[0].lower(), f"expected {expect!r} in the message\n{shown}"


# ---- fixtures: every kind of bad file --------------------------------------------------------
TINY = {"num_layers": "2", "hidden_size": "32", "num_heads": "4", "ffn_hidden_size": "64", "vocab_size": "256"}


def _cpu_job() -> Job:
    model = resolve_model("toy-llama", TINY)
    return Job(model=model, training=TrainingSpec(seq_len=16, global_batch=8, precision=Precision.FP32),
               cluster=resolve_cluster("cpu", gpus=2), plan=Plan(dims=ParallelDims(dp_replicate=2), micro_batch=4))


def _gpu_job() -> Job:
    return Job(model=model_preset("gpt2"), training=TrainingSpec(seq_len=1024, global_batch=32),
               cluster=system_preset("dgx-a100"), plan=Plan(dims=ParallelDims(dp_replicate=8)))


def _checkpoint(root: Path, job: Job) -> None:
    """A committed checkpoint as ckpt_meta reads it (shard contents are dummies)."""
    d = root / ckpt_meta.step_dirname(4)
    d.mkdir(parents=True)
    world = job.plan.dims.world_size
    names = [ckpt_meta.DCP_INDEX_FILENAME] + [f"__{r}_0.distcp" for r in range(world)] \
        + [ckpt_meta.rng_filename(r) for r in range(world)]
    for n in names:
        (d / n).write_bytes(b"x" * 64)
    files = tuple(CheckpointFile(name=n, size_bytes=64) for n in names)
    meta = CheckpointMeta(step=4, data_position=32, data_seed=0, world_size=world, job=job, files=files)
    (d / ckpt_meta.META_FILENAME).write_text(json.dumps(meta.to_dict()))


def _csv_with(cell: str, value: str) -> str:
    header = ("id,source,model,num_layers,hidden_size,num_heads,num_kv_heads,ffn_hidden_size,vocab_size,"
              "seq_len,gpu,num_gpus,gpus_per_node,global_batch_size,micro_batch_size,tp,pp,precision,"
              "measured_tflops_per_gpu,flops_basis")
    row = dict(id="1", source="test", model="gpt", num_layers="24", hidden_size="2304", num_heads="24",
               num_kv_heads="", ffn_hidden_size="", vocab_size="51200", seq_len="2048", gpu="a100-80gb",
               num_gpus="32", gpus_per_node="8", global_batch_size="512", micro_batch_size="16", tp="1",
               pp="1", precision="fp16", measured_tflops_per_gpu="137", flops_basis="hardware")
    row[cell] = value
    cols = header.split(",")
    from meshplan.calib.validate import REQUIRED_COLUMNS

    cols += [c for c in REQUIRED_COLUMNS if c not in cols]
    return ",".join(cols) + "\n" + ",".join(row.get(c, "") for c in cols) + "\n"


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("bad")
    binary = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
    (f / "dir").mkdir()
    (f / "dir.json").mkdir()
    (f / "dir.yaml").mkdir()
    for name in ("bin.json", "bin.yaml", "bin.csv", "bin.toml", "bin.txt"):
        (f / name).write_bytes(binary)
    (f / "latin1.json").write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    (f / "latin1.csv").write_bytes("id,source\n1,caf\xe9\n".encode("latin-1"))
    (f / "empty.json").write_text("")
    (f / "empty.txt").write_text("")
    (f / "blank.txt").write_text("  \n\n")
    (f / "short.txt").write_text("too short")
    (f / "file").write_text("a plain file\n")
    (f / "list.json").write_text("[1, 2, 3]\n")
    _cpu_job().save(f / "cpu.json")
    _gpu_job().save(f / "gpu.json")
    good = json.loads((f / "gpu.json").read_text())

    def variant(name: str, edit) -> None:
        d = json.loads(json.dumps(good))
        edit(d)
        (f / name).write_text(json.dumps(d))

    variant("nan_seq.json", lambda d: d["training"].__setitem__("seq_len", float("nan")))
    variant("inf_mem.json", lambda d: d["cluster"]["gpu"].__setitem__("memory_gib", float("inf")))
    variant("huge_seq.json", lambda d: d["training"].__setitem__("seq_len", 10**20))
    variant("huge_batch.json", lambda d: d["training"].__setitem__("global_batch", 10**30))
    variant("zero_layers.json", lambda d: d["model"].__setitem__("num_layers", 0))
    variant("neg_bw.json", lambda d: d["cluster"].__setitem__("inter_node_bandwidth_bytes_per_s", -1.0))
    variant("str_tp.json", lambda d: d["plan"]["dims"].__setitem__("tp", "eight"))
    variant("float_layers.json", lambda d: d["model"].__setitem__("num_layers", 12.5))
    variant("big_float.json", lambda d: d["cluster"]["gpu"].__setitem__("peak_bf16_flops", 1e400))
    (f / "big_float.json").write_text((f / "big_float.json").read_text().replace("Infinity", "1e400"))
    (f / "cluster_nan.yaml").write_text("system: dgx-h100\ninter_node_bandwidth_bytes_per_s: .nan\n")
    (f / "cluster_inf.yaml").write_text("system: dgx-h100\nintra_node_latency_s: .inf\n")
    (f / "cluster_neginf.yaml").write_text("system: dgx-h100\nintra_node_bandwidth_bytes_per_s: -.inf\n")
    (f / "cluster_text.yaml").write_text("system: dgx-h100\nintra_node_latency_s: fast\n")
    (f / "cluster_list.yaml").write_text("- a\n- b\n")
    (f / "cluster_huge.yaml").write_text("system: dgx-h100\nnum_nodes: 99999999999999999999\n")
    (f / "cluster_gpu_nan.yaml").write_text(
        "name: odd\ngpus_per_node: 8\nintra_node_bandwidth_bytes_per_s: 4.5e+11\nintra_node_latency_s: 1.0e-6\n"
        "inter_node_bandwidth_bytes_per_s: 5.0e+10\ninter_node_latency_s: 5.0e-6\n"
        "gpu: {name: odd, peak_fp16_flops: .nan, peak_bf16_flops: 1.0e+15, peak_fp8_flops: 0, "
        "peak_fp32_flops: 6.0e+13, memory_gib: 80, hbm_bandwidth_bytes_per_s: 3.0e+12}\n")
    (f / "cluster_bad.yaml").write_text("system: [unclosed\n")
    hf = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 256}
    (f / "hf_inf.json").write_text(json.dumps({**hf, "hidden_size": 1}).replace('"hidden_size": 1', '"hidden_size": 1e999'))
    (f / "hf_nan.json").write_text(json.dumps({**hf, "num_hidden_layers": float("nan")}))
    (f / "hf_huge.json").write_text(json.dumps({**hf, "vocab_size": 10**25}))
    (f / "hf_str.json").write_text(json.dumps({**hf, "hidden_size": "big"}))
    for cell, value in (("measured_tflops_per_gpu", "nan"), ("hidden_size", "inf"), ("num_layers", "many"),
                        ("seq_len", "99999999999999999999"), ("measured_tflops_per_gpu", "-inf"),
                        ("num_gpus", "1e400")):
        (f / f"runs_{cell}_{value}.csv").write_text(_csv_with(cell, value))
    (f / "runs_header_only.csv").write_text("a,b\n")
    (f / "ckpt").mkdir()
    _checkpoint(f / "ckpt", _cpu_job())
    (f / "ckpt_empty").mkdir()
    (f / "bad.toml").write_text("[training\nsteps = 1\n")
    return f


# ---- the table -------------------------------------------------------------------------------
E = "estimate --model gpt2 --gpu a100-80gb --seq-len 1024 --global-batch 32"
P = "plan --model gpt2 --gpu a100-80gb --seq-len 1024 --global-batch 32"
T = "train --plan {F}/cpu.json"
R = "report --out {F}/r.html --plan {F}/gpu.json"
RM = "report --out {F}/r.html --model gpt2 --gpu a100-80gb --seq-len 1024 --global-batch 32"
MEG = "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --global-batch-size 32 --vocab-size 50257"
IM = "import --from megatron --gpu a100-80gb --gpus 8"
X = "export {F}/gpu.json --to megatron"

CASES_FILE = Path(__file__).with_name("bad_inputs.txt")
"""The table: one bad input a line (see its header)."""


def _cases() -> list[tuple[str, str]]:
    out = []
    for line in CASES_FILE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        args, expect = line.rsplit(" :: ", 1)
        for key, value in (("{E}", E), ("{P}", P), ("{T}", T), ("{RM}", RM), ("{R}", R), ("{IM}", IM),
                           ("{X}", X), ("{MEG}", MEG)):
            args = args.replace(key, value)
        out.append((args, expect))
    return out


ALL_CASES = _cases()


def test_the_table_is_large_and_covers_every_command():
    assert len(ALL_CASES) >= 150
    firsts = {shlex.split(a)[0] for a, _ in ALL_CASES}
    assert COMMANDS <= firsts, COMMANDS - firsts
    assert len({a for a, _ in ALL_CASES}) == len(ALL_CASES), "duplicate cases"


@pytest.mark.timeout(60)  # a bad value must be refused at once, never searched or run
@pytest.mark.parametrize(("args", "expect"), ALL_CASES, ids=[a[:90] for a, _ in ALL_CASES])
def test_bad_input_is_one_line_and_exit_2(args, expect, fx, no_heavy_work, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a command that wrongly succeeded writes nothing into the repo
    argv = shlex.split(args.replace("{F}", str(fx)))
    assert_one_line_error(invoke(argv), expect.replace("{F}", str(fx)), argv)


def test_good_input_still_runs(fx, no_heavy_work, monkeypatch, tmp_path):
    """The checks refuse only what is wrong: the same commands with good values succeed."""
    monkeypatch.chdir(tmp_path)
    for args in (f"{E} --tp 2 --json", f"{E} --pp 2 --schedule gpipe --json", f"{E} --cp 2 --cp-method all-to-all --json", f"{P} --memory-gib 60 --json", f"estimate --plan {fx}/gpu.json --json",
                 f"{X} --best --memory-gib 60 --json", f"{P} --nodes 1 --gpus 8 --json"):
        r = invoke(shlex.split(args.replace("{F}", str(fx))))
        assert r.code == 0, (args, r.stderr[-2000:])
        json.loads(r.stdout)


# ---- the console script path: a few of the same cases through a real process ----------------
SUBPROCESS_CASES = [
    ("explain {F}/dir", "is a directory"),
    (E + " --seq-len 99999999999999999999", "too large"),
    (P + " --memory-gib 100000", "more than the"),
    (T + " --lr nan", "finite"),
    (E + " --seq-len abc", "--seq-len"),
]


@pytest.mark.parametrize(("args", "expect"), SUBPROCESS_CASES, ids=[a[:60] for a, _ in SUBPROCESS_CASES])
def test_console_script_path(args, expect, fx, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    argv = shlex.split(args.replace("{F}", str(fx)))
    p = subprocess.run([sys.executable, "-m", "meshplan", *argv], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert_one_line_error(Result(p.returncode, p.stdout, p.stderr), expect, argv)


def test_console_script_is_main():
    """The installed ``meshplan`` script calls the main() the table runs."""
    import tomllib

    scripts = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["meshplan"] == "meshplan.cli.main:main"


# ---- fuzz: numeric flags take anything and answer 0 or 2, never a traceback -----------------
NUMBERS = st.one_of(
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.integers(min_value=-3, max_value=70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "-0", "0x10", "1_000", "", " ", "abc", "8.0",
                     "99999999999999999999", "-99999999999999999999"]),
)
ESTIMATE_FLAGS = ["--seq-len", "--global-batch", "--tp", "--pp", "--cp", "--ep", "--dp", "--dp-shard", "--zero",
                  "--micro-batch", "--vpp", "--nodes", "--gpus-per-node"]


def _check_fuzzed(r: Result, argv: list[str]) -> None:
    shown = f"meshplan {shlex.join(argv)}\nexit {r.code}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stdout + r.stderr, shown
    assert r.code in (0, 2), shown
    if r.code == 2:
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), shown


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.tuples(st.sampled_from(ESTIMATE_FLAGS), NUMBERS), min_size=1, max_size=3))
def test_fuzz_estimate_numeric_flags(flags):
    argv = ["estimate", "--model", "gpt2", "--gpu", "a100-80gb", "--json"]
    if not any(f == "--global-batch" for f, _ in flags):
        argv += ["--global-batch", "32"]
    for flag, value in flags:
        argv += [flag, value]
    _check_fuzzed(invoke(argv), argv)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(memory=NUMBERS, top=NUMBERS)
def test_fuzz_plan_memory_and_top(memory, top):
    argv = ["plan", "--model", "gpt2", "--gpu", "a100-80gb", "--seq-len", "1024", "--global-batch", "32",
            "--json", "--memory-gib", memory, "--top", top]
    _check_fuzzed(invoke(argv), argv)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lr=NUMBERS, steps=NUMBERS, seed=NUMBERS)
def test_fuzz_train_numbers_never_start_a_run_on_bad_input(lr, steps, seed, fx, no_heavy_work):
    argv = ["train", "--plan", str(fx / "cpu.json"), "--lr", lr, "--steps", steps, "--seed", seed]
    r = invoke(argv)
    if r.code == "exception" and "HeavyWorkStarted" in r.stderr:
        return  # every value was good: training would start (the tripwire stops it here)
    _check_fuzzed(r, argv)


# ---- fuzz: plan files with any bytes, or one field of a good plan replaced by anything ------
def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(d, list) and d:
        for i, v in enumerate(d):
            yield from _leaves(v, path + (i,))
    else:
        yield path


ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                       st.lists(st.integers(), max_size=3), st.just({}), st.just(1e308 * 10))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_fuzz_plan_file_bytes(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("bytes") / "plan.json"
    path.write_bytes(data)
    argv = ["explain", str(path)]
    r = invoke(argv)
    _check_fuzzed(r, argv)
    assert r.code == 2, "random bytes are not a plan"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(min_value=0), value=ODD_VALUES)
def test_fuzz_plan_file_fields(pick, value, fx, tmp_path_factory):
    good = json.loads((fx / "gpu.json").read_text())
    leaves = list(_leaves(good))
    where = leaves[pick % len(leaves)]
    node = good
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path_factory.mktemp("fields") / "plan.json"
    path.write_text(json.dumps(good))
    argv = ["explain", str(path), "--json"]
    _check_fuzzed(invoke(argv), argv)
