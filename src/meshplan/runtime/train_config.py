"""``TrainConfig``: the settings of one training run that the Job does not hold (steps, learning
rate, data, logging, checkpoints, evaluation)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.runtime.lifecycle import DEFAULT_COLLECTIVE_TIMEOUT_S

WEIGHT_DECAY = 0.0
"""No weight decay by default: short runs and parity tests stay easy to reason about."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 10
    lr: float = 1e-3
    seed: int = 0
    data: str | None = None
    """Local text file (byte tokens); None means synthetic tokens."""
    log_path: str | None = None
    """JSON lines: one object per step, then a summary object (written by rank 0)."""
    state_out: str | None = None
    """Save the full final weights (canonical name -> tensor) here (rank 0), for tests."""
    progress: bool = True
    checkpoint_dir: str | None = None
    """Write sharded checkpoints under this directory (meshplan.runtime.checkpoint)."""
    checkpoint_every: int = 0
    """Save every this many steps, and after the last step; 0 never saves."""
    checkpoint_keep: int | None = None
    """Complete checkpoints to keep (None keeps all)."""
    resume: bool = False
    """Continue from the latest complete checkpoint in ``checkpoint_dir`` (when it has one);
    ``steps`` stays the total, so a run resumed at step 40 of 100 runs steps 41..100."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """How long a collective waits for a peer before it fails (init_process_group's timeout)."""
    init_from: str | None = None
    """Local Hugging Face model directory whose weights replace the random init (runtime/hf_weights.py)."""
    tokenizer: str | None = None
    """Local tokenizer directory: ``data`` is then jsonl / parquet / text / a datasets directory,
    tokenised and packed (runtime/datasets.py) instead of byte tokens."""
    eval_every: int = 0
    """Held-out loss every this many steps (and after the last); 0 never evaluates."""
    eval_fraction: float = 0.0
    """Share of the packed sequences held out for the eval loss (with ``tokenizer``)."""
    eval_batches: int = 4
    """Held-out global batches averaged per evaluation (fewer if the split is smaller)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup steps (runtime/schedule.py)."""
    cosine: bool = False
    """Cosine decay from the peak to ``min_lr_ratio * lr`` at the last step, after warmup."""
    min_lr_ratio: float = 0.0
    clip_grad: float = 0.0
    """Clip the global gradient norm to this; 0 does not clip."""
    weight_decay: float = WEIGHT_DECAY
    """AdamW decay of matrices and embeddings (biases and norm gains are never decayed)."""
    expert_load_log: str | None = None
    """MoE routing log (rank 0): per step, per MoE layer, the tokens each expert received
    (runtime/routing_log.py), what ``meshplan estimate --expert-load`` reads."""
