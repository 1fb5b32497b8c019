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
    from meshplan.cost.validate import REQUIRED_COLUMNS

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

CASES = """
# --- explain: files
explain {F}/dir :: is a directory
explain {F}/dir.json :: is a directory
explain {F}/bin.json :: binary file
explain {F}/latin1.json :: not UTF-8
explain {F}/empty.json :: not valid JSON
explain {F}/list.json :: {F}/list.json
explain {F}/missing.json :: no such plan file
explain {F}/nan_seq.json :: NaN
explain {F}/inf_mem.json :: Infinity
explain {F}/huge_seq.json :: too large
explain {F}/huge_batch.json :: too large
explain {F}/zero_layers.json :: num_layers
explain {F}/neg_bw.json :: inter_node_bandwidth
explain {F}/str_tp.json :: tp
explain {F}/float_layers.json :: num_layers
explain {F}/big_float.json :: finite
explain {F}/gpu.json {F}/gpu.json :: unexpected extra argument
explain :: missing argument
explain {F}/gpu.json --bogus :: no such option
# --- estimate: files
estimate --plan {F}/dir :: is a directory
estimate --plan {F}/bin.json :: binary file
estimate --plan {F}/empty.json :: not valid JSON
estimate --plan {F}/missing.json :: no such plan file
estimate --plan {F}/nan_seq.json :: NaN
estimate --plan {F}/huge_seq.json :: too large
estimate --model {F}/dir --gpu a100-80gb --global-batch 8 :: config.json
estimate --model {F}/bin.json --gpu a100-80gb --global-batch 8 :: binary file
estimate --model {F}/latin1.json --gpu a100-80gb --global-batch 8 :: not UTF-8
estimate --model {F}/empty.json --gpu a100-80gb --global-batch 8 :: not valid JSON
estimate --model {F}/hf_inf.json --gpu a100-80gb --global-batch 8 :: infinity
estimate --model {F}/hf_nan.json --gpu a100-80gb --global-batch 8 :: NaN
estimate --model {F}/hf_huge.json --gpu a100-80gb --global-batch 8 :: too large
estimate --model {F}/hf_str.json --gpu a100-80gb --global-batch 8 :: big
estimate --model {F}/list.json --gpu a100-80gb --global-batch 8 :: JSON object
estimate --model '' --gpu a100-80gb --global-batch 8 :: model name is empty
estimate --model nope --gpu a100-80gb --global-batch 8 :: unknown model
estimate --model gpt2 --cluster {F}/dir --global-batch 8 :: is a directory
estimate --model gpt2 --cluster {F}/dir.yaml --global-batch 8 :: is a directory
estimate --model gpt2 --cluster {F}/bin.yaml --global-batch 8 :: binary file
estimate --model gpt2 --cluster {F}/bin.json --global-batch 8 :: binary file
estimate --model gpt2 --cluster {F}/empty.json --global-batch 8 :: cannot parse
estimate --model gpt2 --cluster {F}/cluster_nan.yaml --global-batch 8 :: finite
estimate --model gpt2 --cluster {F}/cluster_inf.yaml --global-batch 8 :: finite
estimate --model gpt2 --cluster {F}/cluster_neginf.yaml --global-batch 8 :: finite
estimate --model gpt2 --cluster {F}/cluster_text.yaml --global-batch 8 :: must be a number
estimate --model gpt2 --cluster {F}/cluster_list.yaml --global-batch 8 :: mapping
estimate --model gpt2 --cluster {F}/cluster_huge.yaml --global-batch 8 :: too large
estimate --model gpt2 --cluster {F}/cluster_gpu_nan.yaml --global-batch 8 :: peak_fp16_flops
estimate --model gpt2 --cluster {F}/cluster_bad.yaml --global-batch 8 :: cannot parse
estimate --model gpt2 --cluster {F}/missing.yaml --global-batch 8 :: no such cluster file
estimate --model gpt2 --cluster '' --global-batch 8 :: cluster name is empty
estimate --model gpt2 --cluster nope --global-batch 8 :: unknown cluster
{E} --cluster-profile {F}/dir :: is a directory
{E} --cluster-profile {F}/bin.json :: binary file
{E} --cluster-profile {F}/empty.json :: not valid JSON
{E} --cluster-profile {F}/gpu.json :: not a meshplan hardware profile
{E} --cluster-profile {F}/missing.json :: no such profile file
# --- estimate: numbers
{E} --seq-len 99999999999999999999 :: too large
{E} --seq-len 0 :: seq_len
{E} --seq-len -5 :: seq_len
{E} --seq-len nan :: --seq-len
{E} --seq-len inf :: --seq-len
{E} --seq-len 1.5 :: --seq-len
estimate --model gpt2 --gpu a100-80gb --global-batch 99999999999999999999 :: too large
estimate --model gpt2 --gpu a100-80gb --global-batch 0 :: global_batch
estimate --model gpt2 --gpu a100-80gb --global-batch -32 :: global_batch
estimate --model gpt2 --gpu a100-80gb --global-batch-tokens nan :: --global-batch-tokens
estimate --model gpt2 --gpu a100-80gb --global-batch-tokens -1024 :: global_batch_tokens
estimate --model gpt2 --gpu a100-80gb --global-batch-tokens 1000 --seq-len 1024 :: whole number
estimate --model gpt2 --gpu a100-80gb --global-batch 8 --global-batch-tokens 8192 :: exactly one
{E} --tp 99999999999999999999 :: divisible
{E} --tp 0 :: --tp
{E} --tp -2 :: --tp
{E} --tp 3 :: divisible
{E} --tp inf :: --tp
{E} --pp 0 :: --pp
{E} --cp 0 :: --cp
{E} --ep 3 :: ep=3
{E} --dp 3 :: GPU count
{E} --dp 99999999999999999999 :: too large
{E} --dp-shard 3 --zero 1 :: not divisible
{E} --dp-shard 2 :: zero
{E} --zero 7 :: zero
{E} --zero -1 :: zero
{E} --micro-batch 0 :: --micro-batch
{E} --micro-batch 99999999999 :: too large
{E} --vpp 0 :: --vpp
{E} --vpp 99999999999999999999 :: too large
{E} --nodes 0 :: num_nodes
{E} --nodes -1 :: num_nodes
{E} --nodes 99999999999999999999 :: too large
{E} --nodes nan :: --nodes
{E} --gpus-per-node 0 :: gpus_per_node
{E} --gpus-per-node 99999999999999999999 :: too large
{E} --precision fp64 :: --precision
{E} --optimizer lion :: --optimizer
{E} --recompute most :: --recompute
{E} --schedule zb :: --schedule
{E} --cp-method x :: --cp-method
{E} --schedule gpipe :: --schedule has no effect without --pp > 1
{E} --cp-method all-to-all :: --cp-method has no effect without --cp > 1
{E} --override num_layers=nan :: num_layers
{E} --override num_layers=0 :: num_layers
{E} --override num_layers=99999999999999999999 :: too large
{E} --override hidden_size=inf :: hidden_size
{E} --override hidden_size=-4 :: hidden_size
{E} --override nope=1 :: unknown model field
{E} --override garbage :: key=value
{E} --memory-gib 10 :: no such option
{E} --bogus :: no such option
# --- estimate: conflicting flags
estimate --plan {F}/gpu.json --model gpt2 :: drop --model
estimate --plan {F}/gpu.json --cluster dgx-h100 :: drop --cluster
estimate --plan {F}/gpu.json --gpu h100-sxm :: drop --gpu
estimate --plan {F}/gpu.json --nodes 2 :: drop --nodes
estimate --plan {F}/gpu.json --seq-len 4096 :: drop --seq-len
estimate --plan {F}/gpu.json --global-batch 64 :: drop --global-batch
estimate --plan {F}/gpu.json --precision fp16 :: drop --precision
estimate --plan {F}/gpu.json --tp 4 :: drop --tp
estimate --plan {F}/gpu.json --tp 1 :: drop --tp
estimate --plan {F}/gpu.json --zero 0 :: drop --zero
estimate --plan {F}/gpu.json --no-sp :: drop --sp
estimate --plan {F}/gpu.json --override num_layers=2 :: drop --override
estimate --plan {F}/gpu.json -s 128 --pp 2 :: drop --seq-len, --pp
estimate --model gpt2 --gpu a100-80gb --cluster dgx-a100 --global-batch 8 :: not both
estimate --gpu a100-80gb --global-batch 8 :: --model
estimate --model gpt2 --global-batch 8 :: name a cluster
estimate --model gpt2 --gpu nope --global-batch 8 :: unknown GPU
# --- plan
plan --compare {F}/dir :: is a directory
plan --compare {F}/bin.json :: binary file
plan --compare {F}/empty.json :: not valid JSON
plan --compare {F}/nan_seq.json :: NaN
plan --compare {F}/missing.json :: no such plan file
{P} --memory-gib nan :: finite
{P} --memory-gib inf :: finite
{P} --memory-gib -inf :: finite
{P} --memory-gib 0 :: > 0
{P} --memory-gib -1 :: > 0
{P} --memory-gib 100000 :: more than the
{P} --memory-gib 80.5 :: more than the
{P} --memory-gib abc :: --memory-gib
{P} --gpus 6-100 :: doubling counts 6, 12, 24, 48, 96
{P} --gpus 12,16 :: 12 GPUs
{P} --gpus 0 :: positive
{P} --gpus -8 :: --gpus
{P} --gpus abc :: --gpus
{P} --gpus 8,abc :: --gpus
{P} --gpus 16-8 :: --gpus
{P} --gpus , :: positive
{P} --gpus 99999999999999999999 :: too large
{P} --gpus 8-99999999999999999999 :: too large
{P} --nodes 1 --gpus 16 :: disagrees
{P} --nodes 2 --gpus 8-32 :: not both
{P} --top -1 :: --top
{P} --pick -1 :: --pick
{P} --pick 99999999999999999999 --out {F}/o.json :: frontier has
{P} --pick 3 :: give --out
{P} --out {F}/dir :: is a directory
{P} --out {F}/file/x.json :: not a folder
{P} --out {F}/missing/x.json :: does not exist
{P} --plot {F}/dir :: is a directory
{P} --plot {F}/missing/x.png :: does not exist
{P} --cluster-profile {F}/bin.json :: binary file
plan --model gpt2 --gpu a100-80gb --seq-len 99999999999999999999 --global-batch 32 :: too large
plan --model gpt2 --gpu a100-80gb --seq-len 1024 --global-batch 99999999999999999999 :: too large
plan --model gpt2 --gpu a100-80gb --seq-len 0 --global-batch 32 :: seq_len
plan --model gpt2 --gpu a100-80gb --seq-len 1024 :: exactly one
plan --model gpt2 --seq-len 1024 --global-batch 32 :: name a cluster
plan --gpu a100-80gb --seq-len 1024 --global-batch 32 :: --model
# --- export
export {F}/dir --to megatron :: is a directory
export {F}/bin.json --to megatron :: binary file
export {F}/empty.json --to torchtitan :: not valid JSON
export {F}/nan_seq.json --to deepspeed :: NaN
export {F}/missing.json --to megatron :: no such plan file
export {F}/gpu.json --to nope :: --to
export {F}/gpu.json :: --to
{X} --out {F}/dir :: is a directory
{X} --out {F}/file/x.txt :: not a folder
{X} --out {F}/missing/x.txt :: does not exist
{X} --memory-gib 10 :: give --best
{X} --best --memory-gib nan :: finite
{X} --best --memory-gib -3 :: > 0
{X} --best --memory-gib 0 :: > 0
{X} --best --memory-gib inf :: finite
{X} --best --memory-gib 100000 :: more than the
# --- report
report --plan {F}/dir --out {F}/r.html :: is a directory
report --plan {F}/bin.json --out {F}/r.html :: binary file
report --plan {F}/empty.json --out {F}/r.html :: not valid JSON
report --plan {F}/missing.json --out {F}/r.html :: no such plan file
report --plan {F}/gpu.json --out {F}/dir :: is a directory
report --plan {F}/gpu.json --out {F}/file/r.html :: not a folder
report --plan {F}/gpu.json --out {F}/missing/r.html :: does not exist
report --plan {F}/gpu.json :: --out
{R} --memory-gib nan :: finite
{R} --memory-gib 100000 :: more than the
{R} --memory-gib -1 :: > 0
{R} --model gpt2 :: drop --model
{R} --precision fp16 :: drop --precision
{R} --gpus-per-node 4 :: drop --gpus-per-node
{RM} --seq-len 99999999999999999999 :: too large
{RM} --memory-gib inf :: finite
report --out {F}/r.html --model gpt2 :: give --plan
# --- train (nothing may start)
train --plan {F}/dir :: is a directory
train --plan {F}/bin.json :: binary file
train --plan {F}/empty.json :: not valid JSON
train --plan {F}/nan_seq.json :: NaN
train --plan {F}/missing.json :: no such plan file
train :: --plan
{T} --data {F}/dir :: is a directory
{T} --data {F}/bin.txt :: binary file
{T} --data {F}/empty.txt :: is empty
{T} --data {F}/blank.txt :: is empty
{T} --data {F}/short.txt :: shorter than one sequence
{T} --data {F}/missing.txt :: no such data file
{T} --lr nan :: finite
{T} --lr inf :: finite
{T} --lr -inf :: finite
{T} --lr 0 :: > 0
{T} --lr -1 :: > 0
{T} --lr abc :: --lr
{T} --steps 0 :: --steps
{T} --steps 99999999999999999999 :: too large
{T} --seed -1 :: --seed
{T} --seed 99999999999999999999 :: too large
{T} --log {F}/dir :: is a directory
{T} --log {F}/file/log.jsonl :: not a folder
{T} --log {F}/missing/log.jsonl :: does not exist
{T} --checkpoint-every 2 :: --checkpoint-dir
{T} --resume :: --checkpoint-dir
{T} --checkpoint-dir {F}/file :: not a directory
{T} --checkpoint-dir {F}/ckpt_empty --checkpoint-every 99999999999999999999 :: too large
{T} --checkpoint-dir {F}/ckpt_empty --checkpoint-keep 0 :: --checkpoint-keep
{T} --override num_layers=0 :: num_layers
{T} --cluster-profile {F}/bin.json :: binary file
{T} --cluster-profile {F}/missing.json :: no such profile file
# --- validate
validate --runs {F}/dir :: is a directory
validate --runs {F}/bin.csv :: binary file
validate --runs {F}/latin1.csv :: not UTF-8
validate --runs {F}/empty.txt :: missing column
validate --runs {F}/runs_header_only.csv :: missing column
validate --runs {F}/missing.csv :: no such runs file
validate --runs {F}/runs_measured_tflops_per_gpu_nan.csv :: not finite
validate --runs {F}/runs_measured_tflops_per_gpu_-inf.csv :: not finite
validate --runs {F}/runs_hidden_size_inf.csv :: hidden_size
validate --runs {F}/runs_num_layers_many.csv :: num_layers
validate --runs {F}/runs_seq_len_99999999999999999999.csv :: too large
validate --runs {F}/runs_num_gpus_1e400.csv :: num_gpus
validate --runs {F}/runs_header_only.csv --leave-one-source-out :: --fit
validate :: --runs
# --- replan
replan --checkpoint {F}/dir --gpus 2 :: not a meshplan checkpoint
replan --checkpoint {F}/file --gpus 2 :: not a directory
replan --checkpoint {F}/bin.json --gpus 2 :: not a directory
replan --checkpoint {F}/missing --gpus 2 :: no such checkpoint
replan --checkpoint {F}/ckpt --gpus 0 :: --gpus
replan --checkpoint {F}/ckpt --gpus -2 :: --gpus
replan --checkpoint {F}/ckpt --gpus 99999999999999999999 :: too large
replan --checkpoint {F}/ckpt --gpus 2 --memory-gib nan :: finite
replan --checkpoint {F}/ckpt --gpus 2 --memory-gib inf :: finite
replan --checkpoint {F}/ckpt --gpus 2 --memory-gib 0 :: > 0
replan --checkpoint {F}/ckpt --gpus 2 --memory-gib 1000000 :: more than the
replan --checkpoint {F}/ckpt --gpus 2 --out {F}/dir :: is a directory
replan --checkpoint {F}/ckpt --gpus 2 --out {F}/missing/x.json :: does not exist
replan --checkpoint {F}/ckpt :: --gpus
# --- import
{IM} @{F}/dir :: is a directory
{IM} @{F}/bin.txt :: binary file
{IM} @{F}/empty.txt :: is empty
{IM} @{F}/missing.txt :: cannot read the Megatron arguments
import --from torchtitan {F}/dir --gpu a100-80gb --gpus 8 :: is a directory
import --from torchtitan {F}/bin.toml --gpu a100-80gb --gpus 8 :: binary file
import --from torchtitan {F}/bad.toml --gpu a100-80gb --gpus 8 :: not valid TOML
import --from torchtitan {F}/missing.toml --gpu a100-80gb --gpus 8 :: no such torchtitan config
import --from nope x :: --from
{IM} '{MEG}' --model llama3-70b :: contradict --model llama3-70b
{IM} '{MEG} --fp16 --bf16' :: both --fp16 and --bf16
{IM} '{MEG} --seq-length 99999999999999999999' :: too large
{IM} '{MEG} --num-layers nan' :: --num-layers
{IM} '{MEG} --micro-batch-size 0' :: --micro-batch-size
{IM} '{MEG} --tensor-model-parallel-size 3' :: divisible
{IM} '{MEG} "unclosed' :: closing quotation
{IM} '--num-layers 12' :: part of the model shape
import --from megatron '{MEG}' --gpu a100-80gb --gpus 0 :: GPU count
import --from megatron '{MEG}' --gpu a100-80gb --gpus 99999999999999999999 :: too large
import --from megatron '{MEG}' --gpu a100-80gb --nodes 1 --gpus 16 :: disagrees
import --from megatron '{MEG}' --gpus 8 :: name the cluster
# --- profile (nothing may start)
profile --show {F}/dir :: is a directory
profile --show {F}/bin.json :: binary file
profile --show {F}/empty.json :: not valid JSON
profile --show {F}/gpu.json :: not a meshplan hardware profile
profile --show {F}/missing.json :: no such profile file
profile --show {F}/gpu.json --quick :: drop --quick
profile --show {F}/gpu.json --out {F}/p.json --procs 2 :: drop --out, --procs
profile --procs 0 :: --procs
profile --procs -1 :: --procs
profile --procs 99999999999999999999 :: too large
profile --procs abc :: --procs
profile --device tpu :: --device
profile --out {F}/dir :: is a directory
profile --out {F}/file/p.json :: not a folder
profile --out {F}/missing/p.json :: does not exist
# --- models, clusters, the root
models --bogus :: no such option
models extra :: unexpected extra argument
clusters --bogus :: no such option
clusters extra :: unexpected extra argument
--bogus :: no such option
nocommand :: no such command
"""


def _cases() -> list[tuple[str, str]]:
    out = []
    for line in CASES.strip().splitlines():
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
