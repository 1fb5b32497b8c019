"""Print how many plans per second estimate_batch evaluates (vectorised NumPy cost model).

    PYTHONPATH=src python bench/cost_batch_speed.py [N]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from meshplan.cost import PlanArrays, estimate, estimate_batch
from meshplan.spec.cluster import system_preset
from meshplan.spec.presets import model_preset
from meshplan.spec.training import TrainingSpec


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rng = np.random.default_rng(0)
    model = model_preset("llama3-70b")
    cluster = system_preset("dgx-h100", 64)
    training = TrainingSpec(seq_len=8192, global_batch=1024)
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8], n)
    cp = rng.choice([1, 2], n)
    dp = 512 // (tp * pp * cp)
    zero = rng.choice([0, 1, 3], n)
    arrays = PlanArrays(
        dp_replicate=np.where(zero > 0, 1, dp), dp_shard=np.where(zero > 0, dp, 1), tp=tp, pp=pp,
        cp=cp, ep=np.ones(n), zero=zero, sp=tp > 1, schedule=np.ones(n), vpp=np.ones(n),
        micro_batch=rng.choice([1, 2], n), recompute=rng.choice([0, 1, 2], n), cp_method=np.zeros(n))
    estimate_batch(model, cluster, training, arrays.take(slice(0, 10)))  # warm up
    t0 = time.perf_counter()
    out = estimate_batch(model, cluster, training, arrays)
    dt = time.perf_counter() - t0
    print(f"estimate_batch: {n:,} plans in {dt:.2f} s = {n / dt:,.0f} plans/s "
          f"(best step {out.step_time_s.min():.2f} s, {np.mean(out.fits):.0%} fit)")
    plans = [arrays.plan(i) for i in range(200)]
    t0 = time.perf_counter()
    for p in plans:
        try:
            estimate(model, cluster, training, p)
        except Exception:  # noqa: BLE001 - some random plans are invalid for the batch
            pass
    dt = time.perf_counter() - t0
    print(f"estimate (one Plan at a time, all ranks): {len(plans) / dt:,.0f} plans/s")


if __name__ == "__main__":
    main()
