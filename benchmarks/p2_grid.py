"""The experiment grid of P² §4, timed: placements, programs, and the time to
enumerate, synthesize, cost and check them all.

Cases per hierarchy (A100 [2,16], [4,16]; V100 [2,8], [4,8], the shipped specs): one axis;
every ordered pair of axes (sizes >= 2) with the reduction on axis 0 and on axis 1; every
ordered triple reducing axes 0 and 2.  For each case: all placements (matrices), every
valid program of size <= 5 for each (synthesis is shared between placements with the
same synthesis hierarchy), every program costed with the cost model, and every program
replayed in the simulator: "check" replays each placement's best program, as
``solver-planner place`` does, and "replay all" every program (each step costed afresh).  The paper took 1.1 s to synthesize and 2.9 s to
simulate its largest case; the goal here is under 0.2 s for a whole case on one core.

Then the scale cases: a 3-level hierarchy 8 x 4 x 8 (256 devices) with 3 axes at program
size limit 6, and z3 verification of a program on a 1024-device system.

Run: ``python benchmarks/p2_grid.py`` (``--quick`` for the 2-node hierarchies only).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from solver_planner.cost import CostModel
from solver_planner.placement import ParallelismMatrix, enumerate_matrices
from solver_planner.reduction import Lowering, parse_program
from solver_planner.reduction.ranking import StepCoster, replay
from solver_planner.reduction.synthesis import synthesize_traced
from solver_planner.reduction.proof import verify_z3
from solver_planner.reduction.verify import system_steps
from solver_planner.spec import load_cluster_spec
from solver_planner.topology import Topology

SPECS = Path(__file__).resolve().parent.parent / "specs" / "clusters"
S = 2**30


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)] if n >= 2 else []
    return [(d,) + rest for d in range(2, n + 1) if n % d == 0 for rest in factorizations(n // d, parts - 1)]


def cases(n: int):
    yield (n,), (0,)
    for pair in factorizations(n, 2):
        yield pair, (0,)
        yield pair, (1,)
    for triple in factorizations(n, 3):
        yield triple, (0, 2)


def run_case(topo: Topology, cost: CostModel, axes, reduce_axes, max_size=5, check_all=True):
    """Times of one case: enumerate, synthesize, cost, check the best of each placement, and
    (with ``check_all``) replay every program."""
    counts = [lv.count for lv in topo.levels]
    t0 = time.perf_counter()
    matrices = enumerate_matrices(axes, counts)
    t1 = time.perf_counter()
    lowerings = [Lowering(m, counts, topo.level_names, reduce_axes) for m in matrices]
    programs = {}
    for low in lowerings:
        if low.hierarchy not in programs:
            programs[low.hierarchy] = synthesize_traced(low.hierarchy, max_size)
    t2 = time.perf_counter()
    costed = []
    for low in lowerings:
        coster = StepCoster(cost, low, S)
        costed.append([coster.program(p.program, p.held) for p in programs[low.hierarchy]])
    t3 = time.perf_counter()
    for per_placement in costed:  # what `place` checks: each placement's best program
        if per_placement:
            replay(cost, min(per_placement, key=lambda c: c.time))
    t4 = time.perf_counter()
    if check_all:
        for per_placement in costed:
            for c in per_placement:
                replay(cost, c)
    t5 = time.perf_counter()
    n_programs = sum(len(programs[low.hierarchy]) for low in lowerings)
    return len(matrices), n_programs, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4


def grid(names):
    print(f"{'hierarchy':<14}{'axes':<14}{'reduce':<8}{'placements':>11}{'programs':>10}"
          f"{'enum s':>9}{'synth s':>9}{'cost s':>9}{'check s':>9}{'total s':>9}{'replay all s':>14}")
    totals, replays = [], []
    for name in names:
        topo = Topology(load_cluster_spec(SPECS / f"{name}.yaml"))
        cost = CostModel(topo)
        for axes, red in cases(topo.num_devices):
            n_m, n_p, te, ts, tc, tk, ta = run_case(topo, cost, axes, red)
            total = te + ts + tc + tk
            totals.append(total)
            replays.append(ta)
            print(f"{name:<14}{str(list(axes)):<14}{str(list(red)):<8}{n_m:>11}{n_p:>10}"
                  f"{te:>9.4f}{ts:>9.4f}{tc:>9.4f}{tk:>9.4f}{total:>9.4f}{ta:>14.4f}", flush=True)
    print(f"\n{len(totals)} cases: enumerate + synthesize + cost + check, median {statistics.median(totals):.4f} s,"
          f" max {max(totals):.4f} s per case (goal: under 0.2 s each); replaying every program as well:"
          f" median {statistics.median(replays):.4f} s, max {max(replays):.4f} s more")


def scale():
    print("\nscale")
    spec_text = """name: three-level
levels: [{name: node, count: 8}, {name: cpu, count: 4}, {name: gpu, count: 8}]
device: {name: X, flops: 100 TFLOP/s, memory: 16 GiB}
interconnects:
  - {name: nvlink, level: gpu, bandwidth: 135 GB/s, latency: 2us}
  - {name: pcie, level: cpu, bandwidth: 32 GB/s, latency: 2us, sharing: cpu}
  - {name: nic, level: node, bandwidth: 8 GB/s, latency: 10us, sharing: node}
"""
    topo = Topology(load_cluster_spec("three-level.yaml", spec_text))
    cost = CostModel(topo)
    for axes, red in (((8, 4, 8), (0, 2)), ((4, 8, 8), (0, 2)), ((16, 4, 4), (0, 2))):
        n_m, n_p, te, ts, tc, tk, _ = run_case(topo, cost, axes, red, max_size=6, check_all=False)
        print(f"8x4x8 (256 devices), axes {list(axes)}, reduce {list(red)}, size <= 6: {n_m} placements, "
              f"{n_p} programs; enumerate {te:.3f} s, synthesize {ts:.3f} s, cost {tc:.3f} s,"
              f" check (best per placement) {tk:.3f} s", flush=True)
    for m, red, prog in (
        ([[8, 1], [16, 8]], [0], "AllReduce(root, InsideGroup)"),
        ([[1, 8], [128, 1]], [0], "ReduceScatter(gpu, InsideGroup); AllGather(gpu, InsideGroup)"),
        ([[2, 8], [64, 1]], [0], "ReduceScatter(gpu, InsideGroup); AllReduce(gpu, Parallel(root)); "
                                 "AllGather(gpu, InsideGroup)"),
    ):
        low = Lowering(ParallelismMatrix.of(m), (128, 8), ("node", "gpu"), red)
        steps = system_steps(low, parse_program(prog))
        t0 = time.perf_counter()
        verdict = verify_z3(low, steps)
        dt = time.perf_counter() - t0
        print(f"z3 verify on 1024 devices, matrix {m}, {low.hierarchy.size}-device reduction groups, {prog}:"
              f" {verdict.status} in {dt:.3f} s ({verdict.detail})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 2-node hierarchies, no scale cases")
    args = parser.parse_args()
    names = ["p2-a100-2x16", "p2-v100-2x8"] if args.quick else ["p2-a100-2x16", "p2-a100-4x16", "p2-v100-2x8",
                                                                 "p2-v100-4x8"]
    grid(names)
    if not args.quick:
        scale()


if __name__ == "__main__":
    main()
