"""The cost model's error on the published runs, per class of job, as a data record that the
robust recommendation reads (src/meshplan/data/model_error.json; issue 15 item 3).

    PYTHONPATH=src python bench/model_error.py

It runs what `meshplan validate --runs calibration` and `--runs megatron-bridge` run, and stores
per class (dense/MoE x precision x GPU family, with the coarser classes as fallbacks):

* throughput |error| median / p90, the signed median (a bias shared by every plan of a class,
  which cannot reorder them) and the spread around it (median |error - median|: the part of the
  error that can make one plan look faster than another);
* memory |error| median / p90 (rows that report memory);
* per plan feature (context parallel, expert parallel, ZeRO-3, ...), the rows that use it:
  a feature no published run validates is one the model is least sure of;
* the error of the model's ratio between two measured layouts of one job, per knob they differ in
  (calib/pairwise.py; `meshplan validate` prints the same per set): the band the recommendation
  holds two plans of one job to.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from meshplan.calib.pairwise import pairs, summarize
from meshplan.calib.validate import evaluate, load_runs
from meshplan.cost.calibration import gpu_family
from meshplan.data.published import PUBLISHED_RUNS, runs_csv
from meshplan.search.robust import FEATURES, class_keys

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "meshplan" / "data" / "model_error.json"


def _stats(err: list[float], mem: list[float]) -> dict:
    e = np.asarray(err, dtype=float)
    m = np.abs(np.asarray(mem, dtype=float))
    out: dict = {"rows": int(e.size), "memory_rows": int(m.size)}
    if e.size:
        med = float(np.median(e))
        out.update(throughput_abs_median=float(np.median(np.abs(e))), throughput_abs_p90=float(np.percentile(np.abs(e), 90)),
                   throughput_signed_median=med, throughput_spread=float(np.median(np.abs(e - med))))
    if m.size:
        out.update(memory_abs_median=float(np.median(m)), memory_abs_p90=float(np.percentile(m, 90)))
    return out


def main() -> None:
    groups: dict[str, tuple[list[float], list[float]]] = {}
    features = {name: 0 for name, _ in FEATURES}
    total = 0
    found = []
    for name in PUBLISHED_RUNS:
        runs, skipped = load_runs(runs_csv(name))
        report = evaluate(runs, skipped)
        found += pairs(runs, report.rows)
        for run, row in zip(runs, report.rows):
            total += 1
            for fname, uses in FEATURES:
                features[fname] += bool(uses(run.plan))
            for key in class_keys(run.model.is_moe, run.training.precision.value, gpu_family(run.cluster.gpu)):
                err, mem = groups.setdefault(key, ([], []))
                if row.error is not None:
                    err.append(row.error)
                if row.memory_error is not None:
                    mem.append(row.memory_error)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    source = (f"bench/model_error.py: meshplan validate --runs {' and --runs '.join(PUBLISHED_RUNS)} "
              f"at commit {commit}, {datetime.date.today().isoformat()}")
    record = {
        "source": source,
        "rows": total,
        "classes": {k: _stats(*v) for k, v in sorted(groups.items())},
        "feature_rows": features,
        "pairwise": {"source": (f"meshplan validate --runs {' and --runs '.join(PUBLISHED_RUNS)}, 'pairwise' "
                               f"(calib/pairwise.py; bench/model_error.py at commit {commit})"), **summarize(found)},
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}: {total} rows, {len(groups)} classes")


if __name__ == "__main__":
    main()
    sys.exit(0)
