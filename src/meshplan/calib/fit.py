"""Fit a few calibration factors per (GPU generation, stack) against measured runs (no scipy).

Coordinate descent over small grids with perturbed restarts (calib/fit_search.py): each sweep
sets one factor to the best value of its grid with the others fixed, until a sweep improves
nothing; restarts move a few factors of the best point and descend again. Time factors minimise the mean absolute log error of the
throughput metric (least absolute deviations: robust to the odd noisy row); memory factors
minimise the mean absolute relative error of peak memory. Only rows of the (generation, stack)
are used and nothing is specific to a row. Every time factor stays inside a physical range and
pays a weak prior for leaving its cited start (calib/priors.py), so a factor no row pays for stays
where the literature put it. ``calib/holdout.py`` refits without a model family,
a GPU generation or a source and scores the held-out rows: how well the fit transfers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from meshplan.calib.fit_search import Objective, descend, grid_position, prior_penalty  # noqa: F401
# the rows predicted under a calibration and the losses over them live in calib/fit_loss.py; the
# names callers take from fit (MEMORY_SETTINGS, own_split, prepare, predict_all, row_calibration,
# memory_loss) are imported here for them
from meshplan.calib.fit_loss import (MEMORY_SETTINGS, ROW_SETTINGS, _objective, median_abs,  # noqa: F401
                                     memory_loss, own_split, predict_all, prepare, row_calibration)
from meshplan.calib.priors import bounded_grid, grid_with_start
from meshplan.calib.validate import Run
from meshplan.errors import MeshplanError
from meshplan.cost.attention_kernels import kernel_fields
from meshplan.cost.calibration import (Calibration, calibration_for, gpu_generation, record_key,
                                       stack_records)

TIME_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "matmul_efficiency": tuple(np.round(np.arange(0.40, 0.951, 0.025), 3)),
    "matmul_half_dim": (16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0),
    # the fused attention kernel of the generation and stack (FlashAttention-2/3, cuDNN): 30-90%
    # of peak forward+backward (Dao 2023 Sec. 4.1; Shah et al. 2024 Fig. 5)
    "attention_efficiency": (0.3, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9),
    # NCCL bus bandwidth over the link rate, inside the ranges of calib/priors.py (nccl-tests:
    # ~80% on NVLink rings, 90-95% over InfiniBand)
    "inter_node_comm_efficiency": (0.6, 0.7, 0.8, 0.9, 0.95),
    "intra_node_comm_efficiency": (0.6, 0.7, 0.75, 0.8, 0.9),
    "dp_overlap": (0.0, 0.25, 0.5, 0.75, 0.9, 1.0),
    "layer_overhead_s": (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3),
    "unaligned_matmul_factor": (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0),
    "comm_half_message_bytes": (0.0, 16e6, 32e6, 64e6, 128e6, 256e6),
    "tp_overlap": (0.0, 0.25, 0.5, 0.7, 0.85, 1.0),
    "ep_overlap": (0.0, 0.25, 0.5, 0.75, 1.0),
    "microbatch_overhead_s": (0.0, 1e-3, 2e-3, 4e-3, 8e-3, 16e-3),
    # low-precision GEMMs over bf16 at the same shape (cost/precision.py) and the host sync of a
    # dropless all-to-all dispatch per MoE layer (cost/moe.py): the per-op mechanisms' constants
    "fp8_matmul_factor": (0.6, 0.7, 0.8, 0.85, 0.9, 1.0),
    "fp4_matmul_factor": (0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0),
    "moe_alltoall_sync_s": (0.0, 0.5e-3, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3),
    "moe_grouped_gemm_half_dim": (64.0, 128.0, 256.0, 512.0, 1024.0),
    "moe_expert_gemm_s": (0.0, 5e-6, 10e-6, 20e-6, 30e-6, 50e-6),
    # the Mamba-2 SSD kernels (Triton, fp32 chunk states): a few % to a third of peak
    "mamba_scan_efficiency": (0.02, 0.05, 0.1, 0.2, 0.35),
})
"""Factors fitted on throughput, with their grids. Groups with few rows fit only the first; a
field a row's framework fixes (its ``settings``) is not fitted. Every grid is cut to its field's
physical range (calib/priors.py ``FIELD_PRIORS``, each with its source) before the fit."""
PER_TOKEN_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    # the memory-bound passes per layer (norms, activation, residual, casts with amax, MoE permute)
    # over the one-fused-pass-per-op bytes at the achievable HBM rate (cost/layer.py)
    "elementwise_time_factor": (1.0, 1.25, 1.5, 2.0, 2.5, 3.0),
})
"""A per-token device cost the shipped fit does not move (bench/bench_overhead_per_token.py fits it
with ``layer_overhead_s`` and ``matmul_efficiency``): with ``layer_overhead_on_host`` it takes the
place of the per-layer device overhead and reaches the top of its range on Blackwell, and the
Megatron-Bridge p90 gets worse (docs/accuracy.md, session 10 round 2), so it stays out of
``TIME_GRID``."""
SPECIFIC_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    # the experts' grouped GEMMs over a single GEMM's efficiency (cost/moe.py): MoE rows only
    "moe_grouped_gemm_efficiency": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
})
"""Fields added to ``TIME_GRID`` by a fit with ``specific_first``."""
SPECIFIC_FIELDS = ("moe_grouped_gemm_efficiency", "moe_grouped_gemm_half_dim", "moe_expert_gemm_s",
                   "moe_alltoall_sync_s", "ep_overlap", "mamba_scan_efficiency", "fp8_matmul_factor",
                   "fp4_matmul_factor")
"""Fields of a mechanism only some rows have (MoE layers, Mamba layers, a low precision), swept
before the constants every row shares: a cost that only MoE rows pay is then taken up by a MoE
constant first, not by the GEMM efficiency that a dense row also sees (coordinate descent keeps
what the first field swept along a direction the rows cannot tell apart;
bench/bench_holdout_drift.py). Opt-in (``specific_first``): on the Megatron-Bridge rows it took
Llama held out from 32% to 8% and the plain fit to 5.2% median, but its p90 to 24% (22% allowed)
and the held-out NeMo Megatron runs from 5% to 9% median (Mixtral's few large experts paid the
grouped-GEMM efficiency the fine-grained MoE rows set; Llama 2/3 fp8 on H100 +16..+25%):
docs/accuracy.md, session 7."""
MEMORY_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "framework_overhead_gib": tuple(np.round(np.arange(0.0, 12.01, 0.5), 2)),
    "allocator_fragmentation": (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2),
    "loss_transient_bytes_per_element": (0.0, 2.0, 4.0, 6.0, 8.0),
    "grad_bytes_per_param_bf16": (4.0, 4.5, 5.0, 5.5, 6.0),
})
MIN_ROWS_FOR_ALL = 10
FIT_ROUNDS = 4
"""Coordinate-descent sweeps at most per descent (each stops at the first sweep that improves
nothing): the shipped fit and the held-out refits (calib/holdout.py) take the same, so a held-out
score measures the fit that is shipped. Two were too few: on the Hopper Megatron-Bridge rows the
third sweep still took the loss from 0.1137 to 0.1109 (session 8)."""
MEMORY_ROUNDS = 2
"""Sweeps of the memory fit (no restarts): its loss is the mean relative error, and sweeping it to
convergence on the calibration rows traded the median for the mean (framework_overhead_gib
7.5 -> 7.0 GiB: median 2.6% -> 3.2%, p90 10.0% -> 8.9%; session 8), so it keeps the two sweeps
it was shipped with."""
PRIOR_WEIGHT = 0.002
"""Loss added per fitted time field for moving it across its whole physical range away from where
the fit starts (the literature default or the stack's mechanism, each with its source:
``fit_start``), on the field's scale (calib/priors.py): a Laplace prior (MAP estimation, Bishop
2006 Sec. 3.3; the lasso's L1 penalty, Tibshirani 1996). Weak: the loss is a mean absolute log
error of ~0.05-0.1, so a field moves when the rows gain more than 0.002 x the share of its range
it crosses (0.2% of mean log error for a whole range), which every field with rows that see it
does; a field no row pays for stays at its cited start instead of drifting to a grid edge for a
gain of float noise. Session 7 tried 0.01 and 0.003 on grid distance with every generation
starting at ``matmul_efficiency`` 0.70 and no restarts: 7.0% / 6.6% median against 5.6%
without (docs/accuracy.md); session 9's value, with bounded grids and the restarted descent, is
in docs/accuracy.md "Bounds and priors"."""


def calibration_key(run: Run) -> str:
    """The (generation, stack) record a run is fitted into and estimated with."""
    return record_key(gpu_generation(run.cluster.gpu), run.stack)


def fit_start(stack: str, settings: Mapping[str, Any], *, generation: str) -> Calibration:
    """Where a fit of ``stack`` on ``generation`` starts: the literature defaults, the attention
    efficiency (and curve) of the kernel the rows run on this generation (the kernel table,
    cost/attention_kernels.py, as ``calibration_for`` applies it), the stack's mechanisms and the
    rows' settings; not the fitted records, so that a refit is reproducible. The record keeps only
    what moved from here, so a value the fit left at the table's is the table's when estimated."""
    stack_values = stack_records()[stack].values
    kernel = settings.get("attention_kernel", stack_values.get("attention_kernel", Calibration().attention_kernel))
    return Calibration().replace_fields(**{**kernel_fields(generation, kernel), **stack_values, **settings})


def run_start(run: Run, settings: Mapping[str, Any] | None = None) -> Calibration:
    """Where a fit of ``run``'s (generation, stack) with ``settings`` (default: the run's) starts."""
    return fit_start(run.stack, run.settings if settings is None else settings,
                     generation=key_generation(calibration_key(run)))


def key_generation(key: str) -> str:
    """The generation of a 'generation/stack' record key."""
    return key.split("/")[0]


@dataclass(frozen=True)
class FitResult:
    key: str
    """'generation/stack'."""
    values: dict[str, float]
    throughput_rows: int
    memory_rows: int
    throughput_error_before: float
    throughput_error_after: float
    memory_error_before: float
    memory_error_after: float
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The software settings the fit started from (its rows' frameworks', and those given)."""


FIT_RESTARTS = 4
"""Perturbed restarts after the first descent (calib/fit_search.py: iterated local search). On the
Hopper Megatron-Bridge rows the first restart's first sweep already went from the descent's loss
0.1109 to 0.0963 (session 8): coordinate descent from the literature start stops at a one-field
optimum."""


def fit_rows(rows: list[Run], key: str, stack: str, settings: Mapping[str, Any], rounds: int = FIT_ROUNDS,
             time_grid: Mapping | None = None, memory_grid: Mapping | None = None,
             prior_weight: float = PRIOR_WEIGHT, specific_first: bool = False,
             restarts: int = FIT_RESTARTS, warm: Mapping[str, float] | None = None) -> FitResult:
    """Fit the factors of one (generation, stack) ``key`` on ``rows``; ``settings`` describe the
    runs' software and are not fitted. Time factors pay ``prior_weight`` for leaving their start
    and stay inside their physical ranges (calib/priors.py). ``warm``: fitted values the time
    descent begins from (a held-out refit starts from the full fit's), the prior still pulling
    toward the start."""
    t_rows = [r for r in rows if r.metric and r.measured]
    m_rows = [r for r in rows if r.measured_memory_gib or r.oom]
    start = fit_start(stack, settings, generation=key_generation(key))
    tg = {k: bounded_grid(k, grid_with_start(v, getattr(start, k)))
          for k, v in (TIME_GRID if time_grid is None else time_grid).items() if k not in settings}
    if len(t_rows) < MIN_ROWS_FOR_ALL:
        tg = dict(list(tg.items())[:1])
    elif specific_first:
        tg = {**{k: bounded_grid(k, grid_with_start(v, getattr(start, k))) for k, v in SPECIFIC_GRID.items()
                 if k not in settings}, **tg}
        tg = {**{k: v for k, v in tg.items() if k in SPECIFIC_FIELDS},
              **{k: v for k, v in tg.items() if k not in SPECIFIC_FIELDS}}
    t_prep, m_prep = prepare(t_rows), prepare(m_rows)
    # a warm value outside a field's range (a record fitted before the ranges) starts at its edge
    begin = start.replace_fields(**{k: min(max(v, min(tg[k])), max(tg[k])) for k, v in (warm or {}).items()
                                    if k in tg}) if warm else start
    calib = (descend(_objective(t_prep, 0), begin, tg, rounds, prior_weight, restarts, prior_center=start)
             if t_rows else start)
    mg = dict(MEMORY_GRID if memory_grid is None else memory_grid)
    calib = descend(_objective(m_prep, 1), calib, mg, MEMORY_ROUNDS) if m_rows else calib
    fitted = [*(tg if t_rows else ()), *(mg if m_rows else ())]
    return FitResult(
        # only what moved from the start: a field left at its default or its stack's value is
        # not a fitted constant (and calibration_for gives it that value anyway)
        key=key, values={k: getattr(calib, k) for k in fitted if getattr(calib, k) != getattr(start, k)},
        throughput_rows=len(t_rows), memory_rows=sum(1 for r in m_rows if r.measured_memory_gib),
        throughput_error_before=median_abs(t_prep, start, 0), throughput_error_after=median_abs(t_prep, calib, 0),
        memory_error_before=median_abs(m_prep, start, 1), memory_error_after=median_abs(m_prep, calib, 1),
        settings=MappingProxyType(dict(settings)),
    )


def shared_settings(rows, given: Mapping[str, Any]) -> dict[str, Any]:
    """The software settings a fit of ``rows`` starts from: those given, over the one set the
    rows' frameworks share; rows whose frameworks differ cannot be fitted together, unless only in
    ``ROW_SETTINGS`` (each row keeps its own: ``predict_all``)."""
    kinds = {tuple(sorted((k, v) for k, v in {**r.settings, **given}.items() if k not in ROW_SETTINGS))
             for r in rows}
    if len(kinds) > 1:
        differ = sorted({k for kind in kinds for k, v in kind if any(dict(o).get(k) != v for o in kinds)})
        raise MeshplanError(f"--fit: the rows' frameworks differ in {', '.join(differ)}; fit one "
                            "framework's rows at a time (or give --fused-attention/--dropout where "
                            "only those differ)")
    return dict(kinds.pop()) if kinds else dict(given)


def fit_all(runs: list[Run], given: Mapping[str, Any], rounds: int = FIT_ROUNDS,
            memory_grid: Mapping | None = None, prior_weight: float = PRIOR_WEIGHT,
            specific_first: bool = False, restarts: int = FIT_RESTARTS, workers: int = 1,
            warm: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, FitResult]:
    """One fit per (generation, stack) present in ``runs``, each from the settings its rows'
    frameworks share (``shared_settings``) under those ``given``; ``workers`` fits at a time in
    forked processes (calib/forked.py; the fits are independent, the result the same);
    ``warm``: per key, values its time descent begins from (``fit_rows``)."""
    from meshplan.calib.forked import map_forked

    def one(key: str) -> FitResult:
        rows = [r for r in runs if calibration_key(r) == key]
        res = fit_rows(rows, key, rows[0].stack, shared_settings(rows, given), rounds,
                       memory_grid=memory_grid, prior_weight=prior_weight, specific_first=specific_first,
                       restarts=restarts, warm=(warm or {}).get(key))
        return replace(res, settings=dict(res.settings))  # plain data through the worker's pipe

    results = map_forked(one, sorted({calibration_key(r) for r in runs}), workers)
    return {r.key: replace(r, settings=MappingProxyType(dict(r.settings))) for r in results}


def fitted_calibration(run: Run, fits: Mapping[str, FitResult]) -> Calibration:
    """The calibration of ``run`` under ``fits``: its (generation, stack) fit, else the shipped one."""
    res = fits.get(calibration_key(run))
    if res is None:
        return calibration_for(run.cluster.gpu, run.stack)
    return fit_start(run.stack, res.settings, generation=key_generation(res.key)).replace_fields(**res.values, source=f"fitted just now ({res.key})")


def source_group(run: Run) -> str:
    """Coarse source: the citation's first word (Narayanan2021, Korthikanti2022, BLOOM, ...)."""
    return (run.source.split() or ["?"])[0]
