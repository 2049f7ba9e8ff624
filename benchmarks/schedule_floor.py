"""How far a lower bound of a plan can go: the best schedule of its task graph.

The stage search proves a plan slower than the best one found by a lower bound of its
simulated time (the objective, ``solver_planner/stages/objective.py``), and simulates the
plans whose bound is below.  Any bound that holds for *every* schedule of the plan's task
graph (each stage's ops in the schedule's order, each channel's micro-batches in order, a
port serving one task at a time) is at most the best such schedule.  The simulator is not
that schedule: it is a greedy list scheduler, where a transfer that is ready takes a free
port at once, as a runtime issuing its sends in program order does.  Where transfers
dominate, that order can leave the greedy time well above the best schedule's.  A plan whose
best schedule beats the best simulated time of the instance cannot be ruled out by any such
bound: it must be simulated.

For each instance of ``benchmarks/small_gaps.py`` given (default: those whose default
search does not close within 2 s), this script

* proves the optimum ``T*`` (the best simulated time) with large budgets;
* collects the (plan, schedule) pairs the *default* search simulates, and samples some of
  those slower than ``T*``;
* gives for each: the objective (our bound), a one-port bound with per-task heads and tails
  (Jackson's preemptive one-machine schedule on each port, heads and tails the longest paths
  through the task graph without ports: a classic relaxation, Carlier 1982), the best
  schedule of the task graph (CP-SAT, durations rounded down so that its bound stays a lower
  bound), and the greedy simulated time.

Columns of the summary, per instance: ``T*``; pairs simulated by the default search and how
many were sampled; of those, the share with a schedule faster than ``T*`` (no bound valid
for every schedule can rule them out); medians, over the pairs whose best schedule CP-SAT
proves, of greedy / best schedule, objective / best schedule and one-port / best schedule.

    python benchmarks/schedule_floor.py                      # seeds 16, 38, 40, 52, 54 (a few minutes)
    python benchmarks/schedule_floor.py --seeds 38 --sample 40

Printed, never asserted; ``tests/test_schedule_floor.py`` checks the bounds it prints are
bounds (one-port <= best schedule <= greedy, on random plans).
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from small_gaps import instance  # noqa: E402
from solver_planner.stages import search as stage_search  # noqa: E402
from solver_planner.stages.pipeline import simulate_schedule  # noqa: E402
from solver_planner.stages.report import plan_stages  # noqa: E402

UNCLOSED = [16, 38, 40, 52]
SCALE = 1e7            # CP-SAT's time unit: 0.1 microsecond


def heads_tails(tasks) -> tuple[list[float], list[float]]:
    """Per task: its earliest start and the least time from its end to the iteration's end,
    both along dependencies only (ports ignored; a task's dependencies have smaller ids)."""
    n = len(tasks)
    head = [0.0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, t in enumerate(tasks):
        h = t.release
        for d in t.deps:
            h = max(h, head[d] + tasks[d].duration)
            succ[d].append(i)
        head[i] = h
    tail = [0.0] * n
    for i in range(n - 1, -1, -1):
        tail[i] = max((tasks[j].duration + tail[j] for j in succ[i]), default=0.0)
    return head, tail


def jackson(items: list[tuple[float, float, float]]) -> float:
    """The least ``max(end + tail)`` of (head, duration, tail) jobs on one machine with
    preemption: the longest-tail job among those released runs, pre-empted by a release
    (exact for the preemptive problem, hence a lower bound without preemption)."""
    items = sorted(items)
    ready: list[list[float]] = []
    t, best, i, n = 0.0, 0.0, 0, len(items)
    while i < n or ready:
        if not ready:
            t = max(t, items[i][0])
        while i < n and items[i][0] <= t:
            heapq.heappush(ready, [-items[i][2], items[i][1]])
            i += 1
        neg_tail, left = heapq.heappop(ready)
        run = min(left, (items[i][0] if i < n else float("inf")) - t)
        t += run
        if run < left:
            heapq.heappush(ready, [neg_tail, left - run])
        else:
            best = max(best, t - neg_tail)
    return best


def one_port_bound(tasks) -> float:
    """max(longest path, each resource's :func:`jackson` over the tasks holding it)."""
    head, tail = heads_tails(tasks)
    best = max((head[i] + t.duration + tail[i] for i, t in enumerate(tasks)), default=0.0)
    on: dict = {}
    for i, t in enumerate(tasks):
        for r in t.resources:
            on.setdefault(r, []).append((head[i], t.duration, tail[i]))
    for items in on.values():
        best = max(best, jackson(items))
    return best


def best_schedule(timeline, limit: float = 10.0) -> tuple[float, float, str]:
    """(best makespan found, proven lower bound, CP-SAT status) over every schedule of the
    task graph of ``timeline`` (a simulation's): starts after dependencies and release, tasks
    sharing a resource never overlap.  Durations and releases are rounded down to ``1 /
    SCALE`` s, so the bound is a lower bound of the real durations' best schedule; the
    simulated schedule, rounded down the same way, is a solution to start from, so the
    makespan found is at most the simulated one."""
    from ortools.sat.python import cp_model

    tasks = timeline._tasks
    m = cp_model.CpModel()
    H = int(timeline.makespan * SCALE) + len(tasks) + 1
    starts, ends, on = [], [], {}
    for i, t in enumerate(tasks):
        d = int(t.duration * SCALE)
        s = m.NewIntVar(int(t.release * SCALE), H, f"s{i}")
        e = m.NewIntVar(0, H, f"e{i}")
        iv = m.NewIntervalVar(s, d, e, f"i{i}")
        for dep in t.deps:
            m.Add(s >= ends[dep])
        m.AddHint(s, int(timeline[i].start * SCALE))
        starts.append(s)
        ends.append(e)
        if d > 0:
            for r in t.resources:
                on.setdefault(r, []).append(iv)
    for ivs in on.values():
        m.AddNoOverlap(ivs)
    makespan = m.NewIntVar(0, H, "makespan")
    m.AddMaxEquality(makespan, ends)
    m.Minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return float("inf"), solver.BestObjectiveBound() / SCALE, solver.StatusName(status)
    return solver.ObjectiveValue() / SCALE, solver.BestObjectiveBound() / SCALE, solver.StatusName(status)


def simulated_pairs(topo, spec, schedule: str, **kwargs) -> tuple[list[tuple], object]:
    """(bound, greedy time, plan, schedule) of every pair the search simulates, and its result."""
    seen: list[tuple] = []
    original = stage_search.evaluate

    def watch(plan, members, relax, cutoff=float("inf"), work=None):
        cand = original(plan, members, relax, cutoff, work)
        if cand is not None:
            bound = {s: bd.value for bd, s in members}
            seen.extend((bound[s], t, plan, s) for s, t in cand.tried.items())
        return cand

    stage_search.evaluate = watch
    try:
        result = plan_stages(topo, spec, schedule, **kwargs).result
    finally:
        stage_search.evaluate = original
    return seen, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default=",".join(map(str, UNCLOSED)), help="comma-separated small_gaps.py seeds")
    ap.add_argument("--sample", type=int, default=20, help="pairs sampled per instance (default 20)")
    ap.add_argument("--limit", type=float, default=10.0, help="CP-SAT seconds per pair (default 10)")
    args = ap.parse_args()
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            topo, spec, schedule, what = instance(seed, Path(tmp))
            best = plan_stages(topo, spec, schedule, budget=10**6, simulations=10**10).result
            optimum = best.objective
            pairs, _ = simulated_pairs(topo, spec, schedule)
            slower = [p for p in pairs if p[1] > optimum * (1 + 1e-9)]
            sample = rng.sample(slower, min(args.sample, len(slower)))
            print(f"seed {seed}: {what}; T* = {optimum:.4f} s ({best.status.value}); default search simulated"
                  f" {len(pairs)} pairs, {len(slower)} slower than T*", flush=True)
            print(f"  {'objective':>9} {'one-port':>9} {'best sched':>10} {'(bound)':>9} {'greedy':>9}  schedule")
            out = []
            for bound, greedy, plan, s in sorted(sample, key=lambda p: p[1]):
                timeline = simulate_schedule(plan, s).timeline
                tasks = timeline._tasks
                port = one_port_bound(tasks)
                value, floor, status = best_schedule(timeline, args.limit)
                # the schedule found ran rounded-down durations: at most a unit longer per task
                beats = value + len(tasks) / SCALE < optimum * (1 - 1e-9)
                out.append((bound, port, value, floor, greedy, status == "OPTIMAL", beats))
                print(f"  {bound:9.4f} {port:9.4f} {value:10.4f} {floor:9.4f} {greedy:9.4f}  {s}"
                      f"{'' if status == 'OPTIMAL' else ' ' + status}", flush=True)
            rows.append((seed, optimum, len(pairs), out))
    print(f"\n{'seed':>4} {'T* (s)':>8} {'simulated':>9} {'sampled':>7} {'best < T*':>9} {'greedy/best':>11}"
          f" {'objective/best':>14} {'one-port/best':>13}")
    for seed, optimum, n, out in rows:
        if not out:
            print(f"{seed:>4} {optimum:8.4f} {n:>9} {0:>7}")
            continue
        below = sum(x[6] for x in out)
        exact = [x for x in out if x[5]]          # ratios only where the best schedule is proven
        med = [statistics.median(x[k] / x[2] for x in exact) if exact else float("nan") for k in (4, 0, 1)]
        print(f"{seed:>4} {optimum:8.4f} {n:>9} {len(out):>7} {below / len(out):>9.0%} {med[0]:>11.3f}"
              f" {med[1]:>14.3f} {med[2]:>13.3f}{'' if len(exact) == len(out) else f'  ({len(exact)} proven)'}")


if __name__ == "__main__":
    main()
