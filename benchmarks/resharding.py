"""Cross-mesh resharding schedules: every method's makespan, lower bound and solve time.

Cases: the shipped seed 002 §5.1.2 models, and generated ones on 8, 16 and 64
p3.8xlarge-like hosts (half the hosts send, half receive).  Goals (issue 4): the solver
proves optimality on every case with up to 64 unit tasks in under 1 s; 10 000 unit tasks
within 5% of the lower bound in under 10 s.

    python benchmarks/resharding.py            # everything (a few minutes)
    python benchmarks/resharding.py --quick    # shipped cases and 8 hosts only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner.cost import CostModel  # noqa: E402
from solver_planner.resharding import METHODS, ReshardingProblem, plan_resharding, problems_from_model  # noqa: E402
from solver_planner.spec import load_model_spec  # noqa: E402
from solver_planner.spec.cluster import ClusterSpec  # noqa: E402
from solver_planner.topology import Topology, load_topology  # noqa: E402

CLUSTERS = ROOT / "specs" / "clusters"
SHIPPED = [("reshard-2x4-to-2x4", "aws-p3.8xlarge-4"), ("reshard-2x4-to-3x4", "aws-p3.8xlarge-5"),
           ("reshard-1x4-to-2x4", "aws-p3.8xlarge-3"), ("reshard-2x3-to-3x2", "aws-p3.8xlarge-5")]
GENERATED_SPECS = [("S01,R,R", "R,S01,R"), ("R,S1,R", "S01,R,R"), ("S0,R,R", "R,S0,S1")]
EXACT_MAX_TASKS = 2048  # CP-SAT and DFS rows only up to this size


def scaled_p3(hosts: int) -> Topology:
    data = yaml.safe_load((CLUSTERS / "aws-p3.8xlarge-5.yaml").read_text())
    data["name"] = f"p3.8xlarge-x{hosts}"
    data["levels"][0]["count"] = hosts
    return Topology(ClusterSpec.model_validate(data))


def cases(quick: bool):
    for model, cluster in SHIPPED:
        topo = load_topology(CLUSTERS / f"{cluster}.yaml")
        for p in problems_from_model(load_model_spec(ROOT / "specs" / "models" / f"{model}.yaml"), topo):
            yield f"{model}:{p.name}", topo, p
    for hosts in (8,) if quick else (8, 16, 64):
        topo = scaled_p3(hosts)
        half = list(range(hosts // 2))
        for src, dst in GENERATED_SPECS:
            p = ReshardingProblem.build(f"{src}->{dst}", (4096, 4096, 512), "float16", topo, (half, 4, src),
                                        ([h + hosts // 2 for h in half], 4, dst))
            yield f"{hosts} hosts [{src}]->[{dst}]", topo, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shipped cases and 8 hosts only")
    ap.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT / DFS budget per case")
    args = ap.parse_args()
    print(f"{'case':<44} {'tasks':>6} {'method':<12} {'makespan':>10} {'bound':>10} {'gap':>7} {'status':<9}"
          f" {'time':>7}")
    small, large = [], []
    for label, topo, problem in cases(args.quick):
        cost = CostModel(topo)
        n = len(problem.unit_tasks())
        for method in METHODS:
            if method in ("cp-sat", "dfs") and n > EXACT_MAX_TASKS:
                continue
            t0 = time.perf_counter()
            r = plan_resharding(problem, cost, method, time_limit=args.time_limit)
            wall = time.perf_counter() - t0
            print(f"{label:<44} {n:>6} {r.method if method != 'auto' else 'auto/' + r.method:<12}"
                  f" {r.objective:>9.4f}s {r.bound:>9.4f}s {r.gap:>7.2%} {r.status.value:<9} {wall:>6.2f}s")
            if method == "cp-sat" and n <= 64:
                small.append((label, r.proven_optimal, wall))
            if method == "auto" and n >= 10_000:
                large.append((label, r.gap, wall))
    print()
    if small:
        proven = sum(ok for _, ok, _ in small)
        print(f"<= 64 unit tasks, CP-SAT: {proven}/{len(small)} proven optimal; solve time median"
              f" {statistics.median(w for *_, w in small):.3f}s, max {max(w for *_, w in small):.3f}s (goal: all, < 1 s)")
    for label, g, wall in large:
        print(f">= 10 000 unit tasks, auto: {label}: gap {g:.2%} in {wall:.2f}s (goal: <= 5% in < 10 s)")


if __name__ == "__main__":
    main()
