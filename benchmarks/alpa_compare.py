"""Our stage search on unequal sub-meshes beside Alpa's stage DP, on the same cost tables.

For each instance (cluster, model, micro-batch count ``B``, schedule 1F1B):

* ``alpa``: Alpa's ``training_dp`` (the port in ``benchmarks/alpa_dp.py``, Alpa OSDI'22 §5.2)
  minimises its objective ``sum of stage costs + (B - 1) * max`` over Alpa's submesh shapes;
  its plan is then placed (:func:`solver_planner.stages.meshes.pack`) and simulated by our
  simulator, the time every plan here is judged by;
* ``ours``: ``stages --meshes unequal`` restricted to that ``B`` (the equal-mesh branch and
  bound, then the unequal dynamic programs of ``solver_planner/stages/unequal.py``), its
  simulated time and the lower bound it proves over every plan with that ``B``.

Columns: simulated seconds of each plan, ``ours/alpa`` (at most 1 means ours is as fast or
faster), our gap to our bound, wall seconds of each search and their ratio (Alpa's DP time
excludes building its inputs from our tables; ours includes building its own tables), and the
seconds of the unequal part of ours alone (its programs and simulations, after the equal search).
With ``--literal``, Alpa's loop is also timed as Alpa's source runs it (every ``t_max`` candidate
from the least, ``skip_infeasible_prefix=False``; the port's default skips, by bisection, the
candidates whose DP has no solution: the same plan from far fewer DPs, 10 against 1 186 on GPT-3
6.7B with 64 micro-batches on four p3.8xlarge hosts), and
our speed-up over it is printed; the two runs are checked to return the same plan.

    python benchmarks/alpa_compare.py            # every instance (a few minutes on 2 cores)
    python benchmarks/alpa_compare.py --quick    # the 8-GPU clusters only
    python benchmarks/alpa_compare.py --literal  # also Alpa's loop as its source runs it (slow)

Printed, never asserted.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alpa_dp import alpa_inputs  # noqa: E402
from unequal import INSTANCES, QUICK, load_model, microbatch_counts  # noqa: E402
from solver_planner.errors import PlannerError  # noqa: E402
from solver_planner.stages.costs import MeshShape, StageCosts  # noqa: E402
from solver_planner.stages.meshes import MeshCosts, pack  # noqa: E402
from solver_planner.stages.partition import Partition, StagePlan  # noqa: E402
from solver_planner.stages.pipeline import simulate_schedule  # noqa: E402
from solver_planner.stages.schedule import Schedule  # noqa: E402
from solver_planner.stages.search import StageSearch, plan_partition  # noqa: E402
from solver_planner.stages.unequal import search_unequal  # noqa: E402
from solver_planner.topology import load_topology  # noqa: E402


def alpa_plan_time(topo, model, inputs, solution, search) -> float:
    """Our simulated 1F1B time of Alpa's plan."""
    shapes = [MeshShape(*inputs.submesh_choices[m]) for _, m, _ in solution]
    parts = [StageCosts(model, topo, s, inputs.microbatches, search.tables(s)) for s in shapes]
    plan = Partition(MeshCosts(parts, pack(shapes, topo)),
                     [StagePlan(a, b - 1, inputs.configs[c]) for (a, b), _, c in solution])
    return simulate_schedule(plan, Schedule("1f1b")).iteration_time


def row(cells, widths):
    return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 8-GPU clusters only")
    ap.add_argument("--literal", action="store_true",
                    help="also time Alpa's loop over every t_max candidate, as Alpa's source runs it")
    args = ap.parse_args(argv)
    head = ["cluster", "model", "B", "alpa s", "ours s", "ours/alpa", "our gap", "alpa dp s", "ours s", "speed-up",
            "unequal s"] + (["literal s", "speed-up"] if args.literal else []) + ["our meshes"]
    widths = [16, 9, 4, 9, 9, 9, 7, 9, 7, 8, 9] + ([9, 8] if args.literal else []) + [0]
    print(row(head, widths))
    ratios, speed, part, gaps, literal, rows = [], [], [], [], [], 0
    for cluster, name in INSTANCES:
        if args.quick and cluster not in QUICK:
            continue
        topo = load_topology(ROOT / "specs" / "clusters" / f"{cluster}.yaml")
        model = load_model(name)
        for B in microbatch_counts(model):
            search = StageSearch(model, topo, "1f1b", microbatches=[B])
            inputs = alpa_inputs(topo, model, B, search=search)
            stats: dict = {}
            _, solution = inputs.solve(stats=stats)
            lit: dict = {}
            if args.literal:
                _, same = inputs.solve(stats=lit, skip_infeasible_prefix=False)
                if same != solution:
                    raise SystemExit(f"{cluster} {name} B={B}: Alpa's literal loop returned another plan")
            t0 = time.perf_counter()
            try:
                equal = plan_partition(search)
            except PlannerError:
                equal = None
            # as stages --meshes unequal does: the equal search's bound covers its pairs
            covered = [(p.costs.shape, p.B, p.S) for p in search.pairs()]
            t1 = time.perf_counter()
            ours = search_unequal(search, equal, None, covered, equal.bound if equal is not None else math.inf)
            ours_s, unequal_s = time.perf_counter() - t0, time.perf_counter() - t1
            if solution is None and ours is None:
                continue
            alpa_t = alpa_plan_time(topo, model, inputs, solution, search) if solution else math.inf
            ours_t = ours.objective if ours else math.inf
            gap = (ours.objective - ours.bound) / ours.objective if ours else math.nan
            rows += 1
            ratio = ours_t / alpa_t if math.isfinite(alpa_t) else 0.0
            ratios.append(ratio)
            speed.append(stats["seconds"] / ours_s)
            part.append(stats["seconds"] / unequal_s)
            gaps.append(gap)
            extra = []
            if args.literal:
                literal.append(lit["seconds"] / ours_s)
                extra = [f"{lit['seconds']:.2f}", f"{lit['seconds'] / ours_s:.1f}x"]
            meshes = ours.solution.plan.meshes if ours else "-"
            print(row([cluster, name, B, f"{alpa_t:.4f}" if solution else "no plan", f"{ours_t:.4f}",
                       f"{ratio:.4f}" if solution else "-", f"{100 * gap:.2f}%", f"{stats['seconds']:.2f}",
                       f"{ours_s:.2f}", f"{stats['seconds'] / ours_s:.1f}x", f"{unequal_s:.2f}"] + extra + [meshes], widths),
                  flush=True)
    worse = [r for r in ratios if r > 1 + 1e-9]
    print(f"\n{rows} instances: ours as fast or faster on {rows - len(worse)}"
          + (f" (slower on {len(worse)}, by up to {100 * (max(worse) - 1):.2f}%)" if worse else "")
          + f"; ours/alpa median {statistics.median(ratios):.4f}, best {min(ratios):.4f};"
          f" our gap median {100 * statistics.median(gaps):.2f}%, worst {100 * max(gaps):.2f}%;"
          f" speed-up over training_dp median {statistics.median(speed):.1f}x, least {min(speed):.1f}x"
          f" (of the unequal part alone: median {statistics.median(part):.1f}x, least {min(part):.1f}x)"
          + (f"; over Alpa's literal loop median {statistics.median(literal):.1f}x, least {min(literal):.1f}x,"
             f" most {max(literal):.1f}x, at least 100x on {sum(x >= 100 for x in literal)} of {len(literal)}"
             if literal else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
