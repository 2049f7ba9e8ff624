"""Measured vs predicted: reduction programs and broadcast schedules on local gloo processes.

Calibrates this machine first (8 processes as 2 "hosts" of 4, like
``solver-planner calibrate --world 8 --levels host=2,proc=4``), then runs every
synthesized program of the reductions of specs/models/local-2x4.yaml on two placements,
and its resharding schedules, and prints per program the cost model's prediction on the
calibrated cluster next to the measured median, and the Spearman rank correlation
between the two: does the cost model order programs as the machine does?

    python benchmarks/execute.py                   # calibrate, then everything (a few minutes)
    python benchmarks/execute.py --cluster specs/clusters/local-2x4.yaml --top 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner import units  # noqa: E402
from solver_planner.distributed.calibrate import calibrate, cluster_yaml  # noqa: E402
from solver_planner.distributed.jobs import resharding_plans, synthesized_runs  # noqa: E402
from solver_planner.distributed.launch import execute_plans  # noqa: E402
from solver_planner.placement import ParallelismMatrix  # noqa: E402
from solver_planner.spec import load_model_spec  # noqa: E402
from solver_planner.topology import load_topology  # noqa: E402

MODEL = ROOT / "specs" / "models" / "local-2x4.yaml"
PLACEMENTS = ("[[2,1],[1,4]]", "[[1,2],[2,2]]")


def spearman(x, y) -> float:
    """Rank correlation, ties given their average rank."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def table(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}")
    width = min(100, max(len(r[0]) for r in rows))
    print(f"{'plan':<{width}}  {'predicted':>10}  {'measured':>10}  {'ratio':>6}")
    for name, pred, meas in rows:
        print(f"{name[:width]:<{width}}  {units.format_time(pred):>10}  {units.format_time(meas):>10}"
              f"  {meas / pred if pred else float('nan'):>6.2f}")
    pred, meas = [r[1] for r in rows], [r[2] for r in rows]
    print(f"{len(rows)} plans; median measured/predicted {statistics.median(m / p for _, p, m in rows):.2f};"
          f" Spearman rank correlation {spearman(pred, meas):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", type=Path, help="a calibrated 8-process spec to use instead of calibrating now")
    ap.add_argument("--bytes", default="4MiB", help="bytes reduced per process (default 4MiB)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per plan (median)")
    ap.add_argument("--top", type=int, help="only the N fastest predicted programs per case")
    args = ap.parse_args()
    if args.cluster is None:
        print("calibrating 8 gloo processes (host=2, proc=4) ...", flush=True)
        cal = calibrate(8, "gloo", "host=2,proc=4", repeat=10)
        tmp = Path(tempfile.mkdtemp()) / "local-2x4.yaml"
        tmp.write_text(cluster_yaml(cal, "local-2x4"))
        best = cal.best
        print(f"fitted: latency {units.format_time(best.latency)}, bandwidth {units.format_bandwidth(best.bandwidth)},"
              f" ports {best.sharing}, rms relative error {best.error:.2f}")
        args.cluster = tmp
    topo = load_topology(args.cluster)
    spec = load_model_spec(MODEL)
    nbytes = units.parse_bytes(args.bytes)
    all_rows = []
    for matrix in PLACEMENTS:
        for reduction in spec.reductions:
            runs = synthesized_runs(topo, spec, ParallelismMatrix.parse(matrix), reduction, nbytes, top=args.top)
            executions = execute_plans([r.plan for r in runs], "gloo", repeat=args.repeat)
            bad = [e.plan.title for e in executions if not e.ok]
            if bad:
                raise SystemExit(f"wrong results: {bad}")
            rows = [(e.plan.title, e.plan.predicted, e.total) for e in executions]
            all_rows += rows
            if len(rows) > 1:
                table(f"placement {matrix}, reduction '{reduction.name}' ({args.bytes} per process)", rows)
    plans = resharding_plans(topo, spec)
    rows = []
    for world in sorted({p.world for p in plans}):
        for e in execute_plans([p for p in plans if p.world == world], "gloo", repeat=args.repeat):
            if not e.ok:
                raise SystemExit(f"wrong results: {e.plan.title}")
            rows.append((e.plan.title, e.plan.predicted, e.total))
    table("resharding (broadcast schedules)", rows)
    table("every reduction program together", all_rows)


if __name__ == "__main__":
    main()
