"""Where and in which precision a rank computes: its device, the matmul precision it runs, the
dtype of its weights' compute copies."""

from __future__ import annotations

import logging
import os

import torch

from meshplan.plan import Job
from meshplan.spec.training import Precision

log = logging.getLogger(__name__)


def pick_device(job: Job) -> torch.device:
    """CPU processes for the `cpu` cluster or without CUDA; else this rank's GPU."""
    if job.cluster.gpu.name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        log.warning("no CUDA device: running the %s plan on CPU processes", job.cluster.gpu.name)
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def compute_precision(precision: Precision, device: torch.device) -> Precision:
    """Matmul precision actually used: fp32 on CPU; on GPU the Job's, with fp8 run as bf16
    (this runtime has no fp8 matmuls; the log's MFU is then measured against the bf16 peak)."""
    if device.type != "cuda":
        return Precision.FP32
    if precision in (Precision.FP8, Precision.FP4):
        log.warning(f"{precision.value} matmuls are not implemented by the runtime: training in bf16")
        return Precision.BF16
    return precision


def mixed_precision_dtype(compute: Precision) -> torch.dtype | None:
    """dtype of the weights' compute copies (FSDP2 mixed precision, parallelize.apply_dp) and of
    autocast: bf16 (fp16) for a 16-bit plan, None for fp32 compute. The fp32 weights stay the
    optimizer's master copy, as the cost model's precision assumes (cost/precision.py)."""
    if compute == Precision.FP32:
        return None
    return torch.float16 if compute == Precision.FP16 else torch.bfloat16
