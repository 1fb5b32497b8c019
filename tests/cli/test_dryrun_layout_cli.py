"""``meshplan train --dry-run`` at full scale: what each rank would build (mesh groups, stages,
parameters held, memory next to the cost model), answered at once, without torch and without
building the model; ``--simulate`` (the fake-tensor steps) is refused up front where it could not
finish. Through the real entry point (harness: _fuzz_harness.py; no case starts a process)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fuzz_harness import FUZZ, ODD_JSON, assert_clean, dump_json, mutated, run_cli, write
from hypothesis import given
from hypothesis import strategies as st

from meshplan.plan import Job, ParallelDims, Plan, Schedule
from meshplan.spec.cluster import resolve_cluster
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec

pytestmark = pytest.mark.usefixtures("no_processes")  # no case starts a process (conftest.py)

TIME_LIMIT_S = 5.0
"""What a full-scale layout may take on the loaded 2-core host (each answers in about 0.5 s alone)."""


def _job(model: str, gpus: int, seq: int, batch: int, plan: Plan) -> Job:
    job = Job(model=model_preset(model), training=TrainingSpec(seq_len=seq, global_batch=batch),
              cluster=resolve_cluster("dgx-h100", gpus=gpus), plan=plan)
    job.plan.validate_for(job.model, job.training, gpus)
    return job


FULL_SCALE = {
    # Llama 3 paper (Dubey et al. 2024, Table 4), 8k context: tp8 pp16 dp128
    "llama3.1-405b_16384": lambda: _job("llama3.1-405b", 16384, 8192, 2048, Plan(
        dims=ParallelDims(tp=8, pp=16, dp_shard=128), zero=1, sp=True)),
    # DeepSeek-V3 report (arXiv 2412.19437) Sec. 3.1: pp16, ep64, ZeRO-1 data parallel on 2048 GPUs
    "deepseek-v3_2048": lambda: _job("deepseek-v3", 2048, 4096, 15360, Plan(
        dims=ParallelDims(pp=16, dp_shard=128, ep=64), zero=1)),
    # Narayanan et al. 2021 (Megatron-LM at scale), Table 1: GPT-3 175B, tp8 pp12 (dp32 here: 3072 GPUs)
    "gpt3-175b_3072": lambda: _job("gpt3-175b", 3072, 2048, 1536, Plan(
        dims=ParallelDims(tp=8, pp=12, dp_shard=32), zero=1, sp=True)),
    "llama3-70b_1024": lambda: _job("llama3-70b", 1024, 8192, 256, Plan(
        dims=ParallelDims(tp=8, pp=4, dp_shard=32), zero=1, sp=True, schedule=Schedule.INTERLEAVED_1F1B, vpp=5)),
    "mixtral-8x22b_256": lambda: _job("mixtral-8x22b", 256, 4096, 256, Plan(
        dims=ParallelDims(pp=4, dp_shard=64, ep=8), zero=3)),
}


def _layout(tmp_path: Path, job: Job, *extra: str) -> dict:
    path = tmp_path / "job.json"
    job.save(path)
    t0 = time.perf_counter()
    code, out, err = run_cli(["train", "--plan", str(path), "--dry-run", "--json", *extra])
    took = time.perf_counter() - t0
    assert code == 0, err[-2000:]
    assert took < TIME_LIMIT_S, f"{took:.1f} s"
    return json.loads(out)


@pytest.mark.parametrize("name", sorted(FULL_SCALE))
def test_full_scale_layout_at_once_and_as_the_cost_model_counts(name, tmp_path):
    """First and last rank; the parameters the layout puts on each rank (the runtime's stage cut,
    split by tp, ep and ZeRO-3) are the cost model's weights of that pipeline stage."""
    job = FULL_SCALE[name]()
    out = _layout(tmp_path, job)
    world = job.plan.dims.world_size
    assert out["world_size"] == world and [r["rank"] for r in out["ranks"]] == [0, world - 1]
    first, last = out["ranks"]
    assert first["coords"]["pp"] == 0 and last["coords"]["pp"] == job.plan.dims.pp - 1
    assert first["stages"][0]["embedding"] and last["stages"][-1]["head"]
    layers = sum(s["num_layers"] for r in (first, last) for s in r["stages"])
    assert 0 < layers <= job.model.num_layers
    for r in out["ranks"]:
        assert r["layout_weight_bytes"] == pytest.approx(r["cost_model_memory"]["weight_shard_bytes"], rel=1e-9)
        assert r["cost_model_memory"]["weight_shard_bytes"] == r["cost_model_memory"]["parameters_bytes"]
        assert r["cost_model_memory"]["total_bytes"] > r["cost_model_memory"]["parameters_bytes"] > 0


def test_405b_groups_and_stages_by_hand(tmp_path):
    """torch.arange(16384).view(pp16, dpr1, dp_shard128, cp1, tp8): rank 16383 is the last of every
    axis; 126 layers over 16 stages: 14 of 8 then 2 of 7 (even_split), the last holding 119-125."""
    out = _layout(tmp_path, FULL_SCALE["llama3.1-405b_16384"](), "--ranks", "0,9,16383")
    r0, r9, last = out["ranks"]
    groups = {g["axis"]: g for g in last["groups"]}
    assert groups["tp"]["ranks"] == "16376-16383" and groups["tp"]["index"] == 7
    assert (groups["pp"]["first_rank"], groups["pp"]["stride"]) == (1023, 1024)
    assert (groups["dp_shard"]["first_rank"], groups["dp_shard"]["stride"]) == (15367, 8)
    assert r9["coords"] == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "cp": 0, "tp": 1}
    assert [(s["stage"], s["layers"]) for s in r0["stages"]] == [(0, "0-7")]
    assert [(s["stage"], s["layers"]) for s in last["stages"]] == [(15, "119-125")]


def test_llama3_8b_parameters_held_by_hand(tmp_path):
    """Llama-3-8B, tp2 pp2: stage 0 is the embedding (128256 x 4096) and 16 layers of q, o (4096^2),
    k, v (4096 x 1024), three 4096 x 14336 MLP matrices and two norms; tp halves it."""
    job = _job("llama3-8b", 4, 4096, 8, Plan(dims=ParallelDims(tp=2, pp=2), sp=True))
    (r0,) = _layout(tmp_path, job, "--ranks", "0")["ranks"]
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert r0["stages"][0]["params"] == 128256 * 4096 + 16 * layer
    assert r0["held_params"] == (128256 * 4096 + 16 * layer) / 2


def test_interleaved_stages_of_a_rank(tmp_path):
    """pp4 x vpp5 over 80 layers: pipeline rank 3 holds virtual stages 3, 7, .., 19 (looped)."""
    out = _layout(tmp_path, FULL_SCALE["llama3-70b_1024"]())
    last = out["ranks"][1]
    assert [s["stage"] for s in last["stages"]] == [3, 7, 11, 15, 19]
    assert [s["layers"] for s in last["stages"]] == ["12-15", "28-31", "44-47", "60-63", "76-79"]


def test_a_plan_the_runtime_refuses_shows_its_layout_and_why(tmp_path):
    """DeepSeek-V3's MTP module is planner-only in meshplan's runtime: the layout is printed with
    the refusal; --simulate is refused on one line."""
    job = FULL_SCALE["deepseek-v3_2048"]()
    out = _layout(tmp_path, job)
    assert "multi-token prediction" in out["runtime_refuses"]
    assert out["ranks"][1]["stages"][-1]["mtp_modules"] == 1
    code, err = assert_clean(["train", "--plan", str(tmp_path / "job.json"), "--dry-run", "--simulate"])
    assert code == 2 and "multi-token prediction" in err


def test_a_hundred_million_layers(tmp_path):
    """The layout answers at once (closed-form per run of layer kinds); --simulate, which builds
    every layer's module, is refused before any process starts."""
    job = FULL_SCALE["llama3.1-405b_16384"]()
    job = Job(model=job.model.with_overrides({"num_layers": 10**8}), training=job.training,
              cluster=job.cluster, plan=job.plan)
    out = _layout(tmp_path, job)
    assert out["ranks"][1]["stages"][0]["layers"] == f"{10**8 - 6250000}-{10**8 - 1}"
    code, err = assert_clean(["train", "--plan", str(tmp_path / "job.json"), "--dry-run", "--simulate"])
    assert code == 2 and "this runtime builds every layer's module on every rank" in err
    assert "at most 1,024" in out["runtime_refuses"]


@pytest.mark.parametrize("extra, says", [
    (["--ranks", "all"], "ranks is more than the 4,096 a layout lists"),
    (["--ranks", "all", "--simulate"], "16,384 ranks is more than 16"),
    (["--ranks", "16384"], "outside the plan's world of 16384 ranks"),
])
def test_what_a_dry_run_refuses(extra, says, tmp_path):
    path = tmp_path / "job.json"
    FULL_SCALE["llama3.1-405b_16384"]().save(path)
    code, err = assert_clean(["train", "--plan", str(path), "--dry-run", *extra])
    assert code == 2 and says in err


def test_simulate_needs_dry_run(tmp_path):
    path = tmp_path / "job.json"
    FULL_SCALE["llama3.1-405b_16384"]().save(path)
    code, err = assert_clean(["train", "--plan", str(path), "--simulate"])
    assert code == 2 and "--simulate runs the steps of a --dry-run" in err


def test_table_output_names_groups_and_fit(tmp_path):
    path = tmp_path / "job.json"
    FULL_SCALE["llama3.1-405b_16384"]().save(path)
    code, out, _ = run_cli(["train", "--plan", str(path), "--dry-run"])
    assert code == 0
    assert "16376-16383" in out and "GiB per GPU to fit" in out and "119-125+H" in out


def test_the_layout_imports_no_torch(tmp_path):
    """The whole 16,384-rank layout in a fresh interpreter, torch never imported."""
    path = tmp_path / "job.json"
    FULL_SCALE["llama3.1-405b_16384"]().save(path)
    script = ("import sys\nfrom meshplan.cli.main import main\nsys.argv = ['meshplan', 'train', '--plan', "
              f"{str(path)!r}, '--dry-run', '--json']\ntry:\n    main()\nexcept SystemExit as e:\n"
              "    assert not e.code, e.code\nassert 'torch' not in sys.modules, 'torch imported'\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["world_size"] == 16384


@FUZZ
@given(pick=st.integers(min_value=0), value=ODD_JSON, delete=st.booleans(),
       ranks=st.sampled_from(["first,last", "all", "0,3", "last"]))
def test_fuzz_the_layout_of_a_mutated_job(pick, value, delete, ranks, moe_job_dict, tmp_path_factory):
    """Every field of a Job with every newer plan field set (pp, vocab_parallel, ep, offload, OSDP,
    expert placement, a routing log), replaced by an odd value or deleted: the layout answers or
    refuses on one line."""
    path = write(tmp_path_factory.mktemp("job"), "job.json", dump_json(mutated(moe_job_dict, pick, value,
                                                                               delete=delete)))
    assert_clean(["train", "--plan", str(path), "--dry-run", "--ranks", ranks, "--json"])


def test_the_mutated_jobs_good_form_lays_out(moe_job_dict, tmp_path):
    path = write(tmp_path, "job.json", dump_json(moe_job_dict))
    code, err = assert_clean(["train", "--plan", str(path), "--dry-run", "--json"])
    assert code == 0, err
