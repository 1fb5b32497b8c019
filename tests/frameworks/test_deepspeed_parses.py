"""DeepSpeed's own config class reads every DeepSpeed export as the plan says.

``deepspeed.runtime.config.DeepSpeedConfig`` is what ``deepspeed.initialize`` builds from the JSON:
it checks train_batch_size = micro-batch x accumulation x data-parallel size against the
data-parallel size its ``mpu`` reports, so the test hands it one (DeepSpeed's model-parallel-unit
interface) with the plan's dp. Without DeepSpeed, the keys are checked against the names vendored
from DeepSpeed 0.19.8 (tests/fixtures/frameworks/deepspeed-0.19.8.txt).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planner"))
import export_cases as cases  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.export import export_job  # noqa: E402
from meshplan.export.common import search_options_for  # noqa: E402
from meshplan.plan import Job, Recompute  # noqa: E402
from meshplan.search.planner import search  # noqa: E402
from meshplan.spec.cluster import cluster_for_gpu  # noqa: E402
from meshplan.spec.presets import model_preset  # noqa: E402
from meshplan.spec.training import Precision, TrainingSpec  # noqa: E402
from _framework_pins import pinned  # noqa: E402

DEEPSPEED_VERSION = pinned("deepspeed")  # pyproject's frameworks extra (tests/_framework_pins.py)
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
VENDORED = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / f"deepspeed-{DEEPSPEED_VERSION}.txt"


def frontier_jobs() -> list[Job]:
    """Every point of the DeepSpeed-expressible frontier of two searches (8 and 16 GPUs)."""
    out = []
    for model, gpus, batch in (("llama3-8b", 8, 32), ("llama2-13b", 16, 64)):
        cluster = cluster_for_gpu("h100-sxm", num_nodes=gpus // 8, gpus_per_node=8)
        training = TrainingSpec(seq_len=4096, global_batch=batch)
        res = search(model_preset(model), cluster, training, options=search_options_for("deepspeed"))
        out += [Job(model=model_preset(model), training=training, cluster=cluster, plan=p.plan)
                for p in res.frontier]
    return out


def _exports() -> list[tuple[Job, str]]:
    jobs = [cases.llama8b_zero2()] + frontier_jobs()
    out = []
    for job in jobs:
        try:
            out.append((job, export_job(job, "deepspeed").text))
        except MeshplanError:
            continue
    return out


EXPORTS = _exports()


def test_golden_is_the_export():
    assert EXPORTS[0][1] == (GOLDEN / "llama8b_zero2.deepspeed.json").read_text()
    assert len(EXPORTS) >= 5  # the frontier checks are not vacuous


@dataclass(frozen=True)
class DataParallelUnit:
    """DeepSpeed's ``mpu`` interface, as far as its config reads it."""

    dp: int

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module")
def deepspeed_config():
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed: the vendored-name test covers it")
    import importlib

    import deepspeed.comm as dist
    import torch.distributed

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the attribute is shadowed by torch

    # DeepSpeedConfig asks deepspeed.comm for the rank before it asks the mpu for the dp size, so
    # a one-process gloo group is set up (and torn down: later tests start their own). Its CPU
    # backend would JIT-compile a shared-memory all-reduce kernel the config never uses: skipped.
    build_shm_op, env = ds_torch.build_shm_op, dict(os.environ)
    ds_torch.build_shm_op = lambda: None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    from deepspeed.runtime.config import DeepSpeedConfig

    yield DeepSpeedConfig
    torch.distributed.destroy_process_group()
    ds_torch.build_shm_op = build_shm_op
    os.environ.clear()
    os.environ.update(env)


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_deepspeed_reads_the_plan(i, deepspeed_config):
    job, text = EXPORTS[i]
    plan, t = job.full_plan, job.training
    d = plan.dims
    c = deepspeed_config(json.loads(text), mpu=DataParallelUnit(d.dp))
    assert c.train_batch_size == t.global_batch
    assert c.train_micro_batch_size_per_gpu == plan.micro_batch
    assert c.gradient_accumulation_steps == plan.num_microbatches(t)
    assert c.zero_optimization_stage == (plan.zero if d.dp_shard > 1 else 0)
    assert c.bfloat16_config.enabled == (t.precision == Precision.BF16)
    assert c.float16_config.enabled == (t.precision == Precision.FP16)
    assert c.tensor_parallel_config.autotp_size == (d.tp if d.tp > 1 else 0)
    assert not (d.dp_shard > 1 and d.dp_replicate > 1)  # hybrid sharding (MiCS) is refused
    if plan.recompute == Recompute.FULL:
        assert c.activation_checkpointing_config.number_checkpoints == sum(plan.recompute_layers)


def vendored_keys() -> set[str]:
    return {ln.strip() for ln in VENDORED.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def _dotted(cfg: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in cfg.items():
        out += _dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


@pytest.mark.parametrize("i", range(len(EXPORTS)))
def test_keys_are_deepspeed_names(i):
    """Runs without DeepSpeed: every key written is one DeepSpeed 0.19.8 reads."""
    for key in _dotted(json.loads(EXPORTS[i][1])):
        assert key in vendored_keys(), key


def test_vendored_keys_match_installed(deepspeed_config):
    """Each vendored key is a field of the installed DeepSpeed's config models."""
    import importlib.metadata

    from deepspeed.runtime import constants
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert importlib.metadata.version("deepspeed") == DEEPSPEED_VERSION
    top = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}
    sections = {"zero_optimization": set(DeepSpeedZeroConfig.model_fields),
                "activation_checkpointing": set(ACT_CHKPT_DEFAULT),
                "tensor_parallel": set(TPTrainingConfig.model_fields),
                "bf16": {"enabled"}, "fp16": {"enabled"}}
    for key in vendored_keys():
        head, _, field = key.partition(".")
        assert (field in sections[head]) if field else head in top, key
