"""Before / after the attention backward fit, on the same runs: the code of a checkout before it
predicts each round's profile stripped to what its profiler measured (causal SDPA forward at
S=256 H=32 and S=512 H=64, no backward), against the measured runs of a bench made after it.

    python bench/bench_seqlen.py --repeats 2 --keep-profiles P --json > rows.json   # this code
    git archive <base commit> src bench | tar -x -C BASE
    cd BASE && PYTHONPATH=BASE/src python <this repo>/bench/attention_before_after.py seqlen rows.json P

(``predict`` for bench_predict_cpu.py's rows.) Writes rows_before_after.json beside rows.json.
"""
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console

con = Console(highlight=False, width=160)
sys.path.insert(0, "bench")
kind, rows_path, prof_dir = sys.argv[1:4]
rows = json.load(open(rows_path))
tmp = Path(tempfile.mkdtemp())
profs = []
for p in sorted(Path(prof_dir).glob("profile-*.json")):
    d = json.loads(p.read_text())
    d["attention"] = [{k: v for k, v in a.items() if k != "backward_s"} for a in d["attention"]
                      if (a["seq_len"], a["head_dim"]) in ((256, 32), (512, 64))]
    out = tmp / p.name
    out.write_text(json.dumps(d))
    profs.append(str(out))
from meshplan.calib.predict import predict
res = []
if kind == "seqlen":
    import bench_seqlen as bs
    from meshplan.spec.seqlen import DocBalance
    dists = bs.distributions()
    for r in rows:
        d = dists.get(r["distribution"])
        job = bs.make_job(d, DocBalance(r["balance"]) if d else DocBalance.STREAM)
        preds = [predict(job, pr, "cpu").step_time_s for pr in profs]
        meas = [m for _, m in r["rounds"]]
        pred, m = statistics.median(preds), statistics.median(meas)
        res.append(dict(case=f"{r['distribution']} {r['balance']}", before_pred=pred, after_pred=r["predicted_step_time_s"],
                        measured=m, before_err=pred / m - 1, after_err=r["step_time_error"]))
else:
    import bench_predict_cpu as bp
    cases = {c.name: c for c in bp.cases()}
    for r in rows:
        if "runs_step_time_s" not in r:
            continue
        job = bp.make_job(cases[r["case"]].plan)
        preds = [predict(job, pr, "cpu").step_time_s for pr in profs]
        errs = [p / m - 1 for p, m in zip(preds, r["runs_step_time_s"])]
        res.append(dict(case=r["case"], before_pred=statistics.median(preds), after_pred=r["predicted_step_time_s"],
                        measured=r["measured_step_time_s"], before_err=statistics.median(errs), after_err=r["step_time_error"]))
for x in res:
    con.print(f"{x['case']:22s} meas {x['measured']:7.3f}  before {x['before_pred']:7.3f} ({x['before_err']:+.1%})  after {x['after_pred']:7.3f} ({x['after_err']:+.1%})")
b = sorted(abs(x["before_err"]) for x in res); a = sorted(abs(x["after_err"]) for x in res)
con.print(f"median |err| before {statistics.median(b):.1%} max {b[-1]:.1%}; after {statistics.median(a):.1%} max {a[-1]:.1%}")
json.dump(res, open(rows_path.replace(".json", "_before_after.json"), "w"), indent=1)
