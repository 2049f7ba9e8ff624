"""The improvement phase: large-neighbourhood search with CP-SAT over tail windows.

The makespan is decided by the tasks that end last.  A window is the ``k`` tasks that
start last in the current schedule; everything before it stays where it is, so each
resource is free from a known time (``release``), and CP-SAT re-solves the window (sender
choices and start times) from the current schedule as a hint.  An improvement is kept
(then left-shifted); a window that cannot improve is doubled.  A window is skipped
without calling CP-SAT when the fixed part already forbids improving (each resource's
release time plus the work the window must put on it reaches the current makespan).

Deterministic: CP-SAT runs on one worker with a limit on its deterministic time, and the
search stops after a total deterministic budget, so the answer does not depend on the
machine's load (wall time is only CP-SAT's safety net).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cpsat import solve_cpsat
from .schedule import Instance, Schedule

__all__ = ["LnsResult", "improve_tail"]

FIRST_WINDOW = 64      # tasks in the first window
MAX_WINDOW = 2048      # the largest window CP-SAT is given
STEP_LIMIT = 0.1       # deterministic time per CP-SAT call


@dataclass
class LnsResult:
    schedule: Schedule
    calls: int
    deterministic_time: float


def improve_tail(inst: Instance, schedule: Schedule, target: int, budget: float = 2.0, seed: int = 0) -> LnsResult:
    """Improve ``schedule`` until it reaches ``target`` (a lower bound), the windows reach
    :data:`MAX_WINDOW` tasks without improving, or ``budget`` deterministic time is spent."""
    n = len(inst)
    best = schedule
    k = FIRST_WINDOW
    spent, calls = 0.0, 0
    while best.makespan > target and spent < budget:
        order = best.order()
        cut = best.start[order[max(0, n - k)]]
        window = [i for i in range(n) if best.start[i] >= cut]
        inside = set(window)
        release = [0] * len(inst.resources)
        for i in range(n):
            if i not in inside:
                for r in inst.candidates[i][best.choice[i]].resources:
                    release[r] = max(release[r], best.end[i])
        fixed_end = max((best.end[i] for i in range(n) if i not in inside), default=0)
        floor = max(target, fixed_end)
        sub = Instance([inst.candidates[i] for i in window], inst.resources)
        must = [0] * len(inst.resources)
        for j in range(len(sub)):
            for r in sub.mandatory(j):
                must[r] += sub.min_duration(j)
        window_bound = max([floor] + [release[r] + must[r] for r in range(len(must)) if must[r]])
        improved = False
        if window_bound < best.makespan:
            hint = Schedule(tuple(best.choice[i] for i in window), tuple(best.start[i] for i in window),
                            tuple(best.end[i] for i in window))
            out = solve_cpsat(sub, hint, window_bound, min(STEP_LIMIT, budget - spent), 1, seed, release)
            calls += 1
            spent += out.deterministic_time
            if out.schedule is not None and max(out.schedule.makespan, fixed_end) < best.makespan:
                choice, start = list(best.choice), list(best.start)
                for j, i in enumerate(window):
                    choice[i], start[i] = out.schedule.choice[j], out.schedule.start[j]
                end = [start[i] + inst.candidates[i][choice[i]].duration for i in range(n)]
                merged = inst.left_shift(Schedule(tuple(choice), tuple(start), tuple(end)))
                if merged.makespan < best.makespan:
                    best, improved = merged, True
        if not improved:
            if k >= min(n, MAX_WINDOW):
                break
            k *= 2
    return LnsResult(best, calls, spent)
