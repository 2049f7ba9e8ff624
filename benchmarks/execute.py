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


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner import units  # noqa: E402
from solver_planner.agreement import pairwise_agreement, spearman  # noqa: E402
from solver_planner.distributed.calibrate import calibrate, cluster_yaml  # noqa: E402
from solver_planner.distributed.jobs import resharding_plans, synthesized_runs  # noqa: E402
from solver_planner.distributed.launch import execute_plans  # noqa: E402
from solver_planner.placement import ParallelismMatrix  # noqa: E402
from solver_planner.spec import load_model_spec  # noqa: E402
from solver_planner.topology import load_topology  # noqa: E402

MODEL = ROOT / "specs" / "models" / "local-2x4.yaml"
PLACEMENTS = ("[[2,1],[1,4]]", "[[1,2],[2,2]]")


def table(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}")
    width = min(100, max(len(r[0]) for r in rows))
    print(f"{'plan':<{width}}  {'predicted':>10}  {'measured':>10}  {'ratio':>6}")
    for name, pred, meas in rows:
        print(f"{name[:width]:<{width}}  {units.format_time(pred):>10}  {units.format_time(meas):>10}"
              f"  {meas / pred if pred else float('nan'):>6.2f}")
    pred, meas = [r[1] for r in rows], [r[2] for r in rows]
    rho, pairs = spearman(pred, meas), pairwise_agreement(pred, meas, 0.05)
    print(f"{len(rows)} plans; median measured/predicted {statistics.median(m / p for _, p, m in rows):.2f};"
          f" Spearman rank correlation {'n/a' if rho is None else f'{rho:.2f}'}; pairs ordered as measured"
          f" {'n/a' if pairs is None else f'{pairs:.0%}'}")


def calibrated_cluster(say=print) -> Path:
    """Calibrate 8 gloo processes as 2 hosts of 4 now; the spec's path."""
    say("calibrating 8 gloo processes (host=2, proc=4) ...")
    cal = calibrate(8, "gloo", "host=2,proc=4", repeat=10)
    tmp = Path(tempfile.mkdtemp()) / "local-2x4.yaml"
    tmp.write_text(cluster_yaml(cal, "local-2x4"))
    best = cal.best
    say(f"fitted: latency {units.format_time(best.latency)}, bandwidth {units.format_bandwidth(best.bandwidth)},"
        f" ports {best.sharing}, rms relative error {best.error:.2f}")
    return tmp


def measure(cluster: Path, nbytes: int, repeat: int = 5, top: int | None = None
            ) -> tuple[dict[str, list[tuple[str, float, float]]], list[tuple[str, float, float]]]:
    """Run every synthesized program of the model's reductions on each placement, and its
    resharding schedules: ({case: [(plan, predicted, measured)]}, resharding rows)."""
    topo = load_topology(cluster)
    spec = load_model_spec(MODEL)
    cases = {}
    for matrix in PLACEMENTS:
        for reduction in spec.reductions:
            runs = synthesized_runs(topo, spec, ParallelismMatrix.parse(matrix), reduction, nbytes, top=top)
            executions = execute_plans([r.plan for r in runs], "gloo", repeat=repeat)
            bad = [e.plan.title for e in executions if not e.ok]
            if bad:
                raise SystemExit(f"wrong results: {bad}")
            cases[f"placement {matrix}, reduction '{reduction.name}'"] = [
                (e.plan.title, e.plan.predicted, e.total) for e in executions]
    plans = resharding_plans(topo, spec)
    rows = []
    for world in sorted({p.world for p in plans}):
        for e in execute_plans([p for p in plans if p.world == world], "gloo", repeat=repeat):
            if not e.ok:
                raise SystemExit(f"wrong results: {e.plan.title}")
            rows.append((e.plan.title, e.plan.predicted, e.total))
    return cases, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", type=Path, help="a calibrated 8-process spec to use instead of calibrating now")
    ap.add_argument("--bytes", default="4MiB", help="bytes reduced per process (default 4MiB)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per plan (median)")
    ap.add_argument("--top", type=int, help="only the N fastest predicted programs per case")
    args = ap.parse_args()
    cluster = args.cluster or calibrated_cluster(lambda text: print(text, flush=True))
    cases, reshard_rows = measure(cluster, units.parse_bytes(args.bytes), args.repeat, args.top)
    all_rows = []
    for name, rows in cases.items():
        all_rows += rows
        if len(rows) > 1:
            table(f"{name} ({args.bytes} per process)", rows)
    table("resharding (broadcast schedules)", reshard_rows)
    table("every reduction program together", all_rows)


if __name__ == "__main__":
    main()
