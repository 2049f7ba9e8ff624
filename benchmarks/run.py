"""Measured beside predicted: plans of one small GPT, trained with ``solver-planner run``.

Plans ``specs/models/gpt-tiny.yaml`` on ``specs/clusters/local-2x4.yaml`` (written by
``solver-planner calibrate`` on this machine: 8 gloo processes) at several fixed
configurations (``--config d,t,p,k`` and a schedule), trains each for a few steps on 8 local
processes (one launch for all of them), and prints per plan the measured step time (median
of the steps after the first, the slowest rank's), the predicted iteration time, their
ratio, and at the end the median ratio and the Spearman rank correlation of measured and
predicted times.

    python benchmarks/run.py              # 7 plans, about 2 minutes on 2 cores
    python benchmarks/run.py --steps 6 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "specs/clusters/local-2x4.yaml"
MODEL = ROOT / "specs/models/gpt-tiny.yaml"

# (d, t, p, k), schedule
PLANS = [("8,1,1,1", "1f1b"), ("4,2,1,2", "1f1b"), ("4,1,2,4", "gpipe"), ("4,1,2,4", "1f1b"),
         ("2,2,2,4", "eager-1f1b"), ("1,4,2,4", "1f1b"), ("2,1,4,8", "eager-1f1b")]


def plan_jobs(plans, steps: int) -> list:
    """Each (d,t,p,k, schedule) planned for gpt-tiny on local-2x4 by the command line, checked,
    and made the job ``run`` trains."""
    from solver_planner.cli.common import model_of, topology_of
    from solver_planner.plan.check import check_plan
    from solver_planner.plan.planfile import read_plan
    from solver_planner.run.job import run_job

    topo, spec = topology_of(CLUSTER), model_of(MODEL)
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (config, schedule) in enumerate(plans):
            out = Path(tmp) / f"plan{n}.yaml"
            subprocess.run([sys.executable, "-m", "solver_planner", "plan", str(CLUSTER), str(MODEL), "--config",
                            config, "--schedule", schedule, "-o", str(out)], check=True, capture_output=True)
            jobs.append(run_job(check_plan(topo, spec, read_plan(out)).plan, spec, steps=steps))
    return jobs


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from solver_planner.run.launch import run_plans

    jobs = plan_jobs(PLANS, args.steps)
    labels = [f"{config} {job.schedule_name}" for (config, _), job in zip(PLANS, jobs)]
    results = run_plans(jobs, compare=False)
    rows = [{"plan": label, "measured": r.measured_step_time, "predicted": r.job.predicted_iteration_time,
             "ratio": r.measured_step_time / r.job.predicted_iteration_time} for label, r in zip(labels, results)]
    summary = {"median_ratio": statistics.median(r["ratio"] for r in rows),
               "spearman": spearman([r["measured"] for r in rows], [r["predicted"] for r in rows])}
    if args.json:
        print(json.dumps({"rows": rows, **summary}, indent=2))
        return
    print(f"{'plan (d,t,p,k schedule)':44} {'measured':>10} {'predicted':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['plan']:44} {r['measured'] * 1e3:8.1f}ms {r['predicted'] * 1e3:8.1f}ms {r['ratio']:7.2f}")
    print(f"median measured/predicted {summary['median_ratio']:.2f}; Spearman {summary['spearman']:.2f}"
          f" over {len(rows)} plans")


if __name__ == "__main__":
    main()
