"""Does torch's pipelining keep every micro-batch's last-stage output for the step? The dry run says.

``PYTHONPATH=src python bench/dryrun_kept_outputs.py [--microbatches 16] [--seq-len 1024]``

Runs the last pipeline rank of a small pp=2 job (llama3.2-1b cut to 4 layers, one sequence a
micro-batch, vocabulary 128,256) through meshplan's own runtime on fake tensors
(``runtime.dryrun.simulate_rank``, torch's MemTracker, two steps as ``meshplan train --dry-run
--simulate``), twice: as the runtime steps
(``schedule.step(..., return_outputs=False)``) and with the schedule's ``step`` forced to
``return_outputs=True``, which is what torch's pipelining did for every caller before the switch
existed (torchtitan of 2024-12 at torch 1963fc8). Prints the tracked peaks, the largest origins, and
the cost model's last-rank tensors (``report.dryrun.model_tensor_bytes``) with
``Calibration.pp_kept_output_bytes_per_element`` 0 and 2 (bf16 outputs).

Measured 2026-11-25 (torch 2.13 CPU, 16 micro-batches): the peak 8.37 GiB -> 13.62 GiB with the outputs
kept, of which 3.91 GiB the kept bf16 logits (FSDPTransformer.output mm) and 3.91 GiB their
``torch.cat`` at the step's end; the model 8.46 GiB (kept 0) and 14.43 GiB (kept 2).
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import replace

GIB = 2 ** 30


def _job(microbatches: int, seq_len: int):
    from meshplan.plan import ParallelDims, Plan
    from meshplan.plan.job import Job
    from meshplan.spec.cluster import resolve_cluster
    from meshplan.spec.presets import model_preset
    from meshplan.spec.training import TrainingSpec

    model = model_preset("llama3.2-1b").with_overrides({"num_layers": 4})
    return Job(model=model, training=TrainingSpec(seq_len=seq_len, global_batch=microbatches),
               cluster=resolve_cluster(gpu="h100-sxm", gpus=2), plan=Plan(dims=ParallelDims(pp=2), micro_batch=1))


def _force_return_outputs(value: bool):
    """Patch torch's schedules so that ``step`` runs with ``return_outputs=value``; returns an undo."""
    from torch.distributed.pipelining import schedules

    originals = {}
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        original = cls.step
        originals[cls] = original

        @functools.wraps(original)
        def step(self, *args, _original=original, **kwargs):
            kwargs["return_outputs"] = value
            return _original(self, *args, **kwargs)

        cls.step = step

    def undo():
        for cls, original in originals.items():
            cls.step = original

    return undo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    args = ap.parse_args()

    from meshplan.cli.dryrun_cmd import DRY_RUN_STEPS
    from meshplan.cost import calibration_for
    from meshplan.report.dryrun import compare
    from meshplan.runtime.dryrun import simulate_rank

    job = _job(args.microbatches, args.seq_len)
    last = job.plan.dims.world_size - 1
    calib = calibration_for(job.cluster.gpu)
    for keep in (False, True):
        undo = _force_return_outputs(keep)
        try:
            res = simulate_rank(job, last, steps=DRY_RUN_STEPS).to_dict()  # as `train --dry-run --simulate`
        finally:
            undo()
        print(f"return_outputs={keep}: tracked peak {res['peak_bytes'] / GIB:.3f} GiB at {res['peak_at']}")
        for o in res["peak_origins"][:4]:
            print(f"    {o['category']:10s} {o['module']:28s} {o['op']:32s} {o['dtype']:9s} {o['bytes'] / GIB:.3f} GiB")
        for kept in (0.0, 2.0):
            cmp = compare(job, [res], replace(calib, pp_kept_output_bytes_per_element=kept))[0]
            print(f"    model, pp_kept_output_bytes_per_element={kept:g}: {cmp.model_memory['tensor_bytes'] / GIB:.3f} GiB")


if __name__ == "__main__":
    main()
