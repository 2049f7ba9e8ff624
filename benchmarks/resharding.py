"""Cross-mesh resharding schedules at scale: `auto` against Alpa's randomized greedy.

Cases: the resharding paper's §5.1.2 models as shipped, and generated ones on 8, 16 and 64
p3.8xlarge-like hosts (4 V100 per host, 10 Gbps) with 64 to 16 384 unit tasks: specs over
several hosts, S01 layouts, uneven shapes and meshes of unequal sizes.  Per case: `auto`'s
makespan, lower bound, gap and wall time (building the unit tasks included), and the
randomized greedy of the resharding paper §3.2 with 100 random orders per iteration (`alpa-greedy`,
Alpa's setting) for comparison.

Goals (issue 18), printed, never asserted: every case within 0.1% of the lower bound (or
proved optimal) in under 2 s, and never worse than the randomized greedy.  The greedy
runs on cases of up to 2 048 unit tasks and wherever `auto` leaves a gap; elsewhere
`auto` reached the lower bound, so no schedule (the greedy's included) is shorter, and
the greedy (pure Python, minutes there) is skipped.

    python benchmarks/resharding.py            # everything (several minutes: the greedy)
    python benchmarks/resharding.py --quick    # shipped cases and 8 hosts only
    python benchmarks/resharding.py --methods  # also every other method up to 2048 tasks
"""

from __future__ import annotations

import argparse
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
SHIPPED = [("models/reshard-2x4-to-2x4", "clusters/aws-p3.8xlarge-4"),
           ("models/reshard-2x4-to-3x4", "clusters/aws-p3.8xlarge-5"),
           ("models/reshard-1x4-to-2x4", "clusters/aws-p3.8xlarge-3"),
           ("models/reshard-2x3-to-3x2", "clusters/aws-p3.8xlarge-5"),
           ("resharding/reshard-16-hosts", "resharding/aws-p3.8xlarge-16")]
R = lambda a, b: list(range(a, b))  # noqa: E731
# (hosts, dtype, shape, source hosts, source spec, destination hosts, destination spec)
GENERATED = [
    (8, "float16", (1024, 1024, 512), R(0, 4), "S0,R,R", R(4, 8), "R,S01,R"),
    (8, "float16", (1024, 1024, 512), R(0, 4), "S01,R,R", R(4, 8), "R,S01,R"),
    (8, "float16", (1000, 1000, 500), R(0, 3), "R,S01,R", R(3, 8), "S0,R,S1"),
    (8, "float32", (1000, 1024, 512), R(0, 4), "R,S1,R", R(4, 8), "S01,R,R"),
    (8, "float16", (4096, 4096, 512), R(0, 4), "S0,R,R", R(4, 8), "R,S0,S1"),
    (16, "int32", (1024, 1024, 512), R(0, 8), "R,S01,R", R(8, 16), "S01,R,R"),  # issue 18's case
    (16, "float16", (1024, 1000, 512), R(0, 6), "S01,R,R", R(6, 16), "R,S01,R"),
    (16, "float16", (1024, 1024, 512), R(0, 8), "S0,R,S1", R(8, 16), "R,S01,R"),
    (16, "float16", (999, 1024, 512), R(0, 8), "R,R,S1", R(8, 16), "S01,R,R"),
    (16, "float16", (4096, 4096, 512), R(0, 8), "R,S1,R", R(8, 16), "S01,R,R"),
    (64, "float32", (1024, 1024, 512), R(0, 32), "S0,R,R", R(32, 64), "R,S0,R"),
    (64, "float16", (1024, 1000, 500), R(0, 20), "S0,S1,R", R(20, 64), "R,S0,R"),
    (64, "float16", (1000, 1024, 512), R(0, 16), "R,R,S1", R(16, 64), "S0,R,R"),
    (64, "float16", (4096, 4096, 512), R(0, 32), "S0,R,R", R(32, 64), "R,S0,S1"),
    (64, "float16", (4096, 4096, 512), R(0, 32), "S0,R,R", R(32, 64), "R,S01,R"),
    (64, "float16", (4096, 4096, 512), R(0, 32), "R,S1,R", R(32, 64), "S0,R,S1"),
    (64, "float16", (4000, 4096, 500), R(0, 24), "R,S01,R", R(24, 64), "S0,R,S1"),
    (64, "float16", (4096, 4096, 512), R(0, 32), "S01,R,R", R(32, 64), "R,S01,R"),
]
GREEDY_ROUNDS = 100
GREEDY_MAX_TASKS = 2048  # above, the greedy runs only where auto is not proved optimal


def scaled_p3(hosts: int) -> Topology:
    data = yaml.safe_load((CLUSTERS / "aws-p3.8xlarge-5.yaml").read_text())
    data["name"] = f"p3.8xlarge-x{hosts}"
    data["levels"][0]["count"] = hosts
    return Topology(ClusterSpec.model_validate(data))


def cases(quick: bool):
    for model, cluster in SHIPPED:
        topo = load_topology(ROOT / "specs" / f"{cluster}.yaml")
        for p in problems_from_model(load_model_spec(ROOT / "specs" / f"{model}.yaml"), topo):
            yield f"{Path(model).name}:{p.name}", topo, p
    for hosts, dtype, shape, src_hosts, src, dst_hosts, dst in GENERATED:
        if quick and hosts > 8:
            continue
        topo = scaled_p3(hosts)
        p = ReshardingProblem.build(f"{src}->{dst}", shape, dtype, topo, (src_hosts, 4, src), (dst_hosts, 4, dst))
        label = f"{hosts}h {len(src_hosts)}->{len(dst_hosts)} [{src}]->[{dst}] {'x'.join(map(str, shape))}"
        yield label, topo, p


def timed(problem, cost, method, **kw):
    t0 = time.perf_counter()
    r = plan_resharding(problem, cost, method, **kw)
    return r, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shipped cases and 8 hosts only")
    ap.add_argument("--methods", action="store_true", help="also every other method (up to 2048 unit tasks)")
    ap.add_argument("--no-greedy", action="store_true", help="skip the 100-round randomized greedy")
    args = ap.parse_args()
    ms = lambda s: f"{s * 1e3:.2f}ms"  # noqa: E731
    print(f"{'case':<58} {'tasks':>6} {'method':<13} {'makespan':>10} {'bound':>10} {'gap':>7} {'time':>7}"
          f" {'greedy-100':>10} {'time':>7}  goals")
    rows = []
    for label, topo, problem in cases(args.quick):
        cost = CostModel(topo)
        r, wall = timed(problem, cost, "auto")
        n = r.info["tasks"]
        g = gwall = None
        if not args.no_greedy and (n <= GREEDY_MAX_TASKS or not r.proven_optimal):
            g, gwall = timed(problem, cost, "alpa-greedy")
        within = r.gap <= 1e-3 or r.proven_optimal
        fast = wall < 2.0
        not_worse = g is None or r.objective <= g.objective + 1e-12
        rows.append((within, fast, not_worse))
        marks = ("bound " if within else "GAP ") + ("<2s " if fast else "SLOW ") + \
            ("" if args.no_greedy else "<=greedy" if not_worse else "WORSE")
        print(f"{label:<58} {n:>6} {r.method:<13} {ms(r.objective):>10} {ms(r.bound):>10} {r.gap:>7.3%}"
              f" {wall:>6.2f}s {ms(g.objective) if g else 'skipped':>10} {f'{gwall:.2f}s' if g else '-':>7}  {marks}")
        if args.methods and n <= 2048:
            for method in METHODS:
                if method in ("auto", "alpa-greedy"):
                    continue
                o, w = timed(problem, cost, method, time_limit=2.0)
                print(f"{'':<58} {'':>6} {o.method:<13} {ms(o.objective):>10} {ms(o.bound):>10} {o.gap:>7.3%}"
                      f" {w:>6.2f}s")
    print()
    print(f"{len(rows)} cases: {sum(w for w, _, _ in rows)} within 0.1% of the bound or proved optimal,"
          f" {sum(f for _, f, _ in rows)} under 2 s"
          + ("" if args.no_greedy else f", {sum(g for _, _, g in rows)} never worse than the randomized greedy"
                                       f" ({GREEDY_ROUNDS} rounds)"))


if __name__ == "__main__":
    main()
