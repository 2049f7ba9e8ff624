"""The CP-SAT model of the resharding paper §3.2, Eq. 1-3.

One start variable per task; per candidate sender a presence literal and an optional
interval of that candidate's duration (exactly one present: Eq. 2); per resource a
no-overlap over the intervals that hold it (Eq. 3); the makespan is at least every
present interval's end (Eq. 1).  Interchangeable tasks start in index order (symmetry
breaking), the makespan is at least the combinatorial lower bound, and the search is
warm-started from the best heuristic schedule.

:func:`solve_cpsat` also solves a *window* of a larger schedule (the improvement phase's
large-neighbourhood search): the tasks of the window, with each resource free only from
its ``release`` time (when the fixed tasks before the window leave it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .schedule import Instance, Schedule

__all__ = ["CpSatOutcome", "solve_cpsat"]


@dataclass
class CpSatOutcome:
    schedule: Schedule | None
    bound: int
    optimal: bool
    status: str
    deterministic_time: float = 0.0  # CP-SAT's own work measure, spent on this call


def solve_cpsat(inst: Instance, hint: Schedule, lower_bound: int, time_limit: float = 10.0,
                workers: int = 1, seed: int = 0, release: Sequence[int] | None = None) -> CpSatOutcome:
    """Minimise the makespan; ``hint`` is a feasible schedule, which also caps the horizon.

    ``time_limit`` is CP-SAT's deterministic time, so one worker gives the same answer on
    every run.  With ``release`` (per resource), no task holds resource ``r`` before
    ``release[r]``; ``hint`` must respect it.
    """
    from ortools.sat.python import cp_model  # imported here: OR-Tools takes 0.25 s to load

    m = cp_model.CpModel()
    horizon = hint.makespan
    free_at = list(release) if release is not None else [0] * len(inst.resources)
    makespan = m.new_int_var(min(lower_bound, horizon), horizon, "makespan")
    starts, present = [], []
    by_resource: dict[int, list] = {}
    for i, cands in enumerate(inst.candidates):
        latest = horizon - min(c.duration for c in cands)
        earliest = min(max((free_at[r] for r in c.resources), default=0) for c in cands)
        s = m.new_int_var(min(earliest, max(0, latest)), max(0, latest), f"s{i}")
        lits = []
        for k, c in enumerate(cands):
            ready = max((free_at[r] for r in c.resources), default=0)
            if len(cands) == 1:
                iv = m.new_fixed_size_interval_var(s, c.duration, f"t{i}")
                m.add(makespan >= s + c.duration)
                if ready:
                    m.add(s >= ready)
            else:
                lit = m.new_bool_var(f"x{i}_{k}")
                iv = m.new_optional_fixed_size_interval_var(s, c.duration, lit, f"t{i}_{k}")
                m.add(makespan >= s + c.duration).only_enforce_if(lit)
                if ready:
                    m.add(s >= ready).only_enforce_if(lit)
                lits.append(lit)
            for r in c.resources:
                by_resource.setdefault(r, []).append(iv)
        if len(cands) > 1:
            m.add_exactly_one(lits)
        starts.append(s)
        present.append(lits)
    for r in sorted(by_resource):
        if len(by_resource[r]) > 1:
            m.add_no_overlap(by_resource[r])
    # Eq. 4 as a redundant linear constraint: the work a resource is given fits in the
    # makespan.  It is implied by the no-overlap, but it lets the LP see load balance.
    load: dict[int, list] = {}
    for i, cands in enumerate(inst.candidates):
        for k, c in enumerate(cands):
            for r in c.resources:
                load.setdefault(r, []).append((c.duration, present[i][k] if present[i] else None))
    for r in sorted(load):
        fixed = free_at[r] + sum(d for d, lit in load[r] if lit is None)
        terms = [d * lit for d, lit in load[r] if lit is not None]
        if terms:
            m.add(fixed + sum(terms) <= makespan)
    last_of: dict[tuple, int] = {}
    for i in range(len(inst)):
        sig = inst.signature(i)
        if sig in last_of:
            m.add(starts[last_of[sig]] <= starts[i])
        last_of[sig] = i
    # The hint must respect the symmetry breaking: give interchangeable tasks its start
    # times in index order (a relabelling of the same schedule).
    hint_start, hint_choice = _relabel(inst, hint)
    for i in range(len(inst)):
        m.add_hint(starts[i], hint_start[i])
        if len(present[i]) > 1:
            for k, lit in enumerate(present[i]):
                m.add_hint(lit, k == hint_choice[i])
    m.add_hint(makespan, horizon)
    m.minimize(makespan)

    solver = cp_model.CpSolver()
    # Deterministic time (CP-SAT's own work measure, about seconds) makes one worker give
    # the same answer on every run; wall time is only a safety net, wide enough that a
    # loaded machine (2 cores shared with other work) does not reach it first.
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.max_time_in_seconds = 10 * time_limit + 10
    solver.parameters.num_workers = workers
    # Quick restarts over several heuristics: on one worker this proves the partition-like
    # cases (tasks whose lengths must split evenly over the senders) in a fraction of a
    # second where the default search stalls near the bound.
    solver.parameters.search_branching = cp_model.PORTFOLIO_WITH_QUICK_RESTART_SEARCH
    solver.parameters.random_seed = seed
    code = solver.solve(m)
    name = solver.status_name(code)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatOutcome(None, lower_bound, False, name, solver.deterministic_time)
    choice = tuple(next(k for k, lit in enumerate(present[i]) if solver.boolean_value(lit)) if len(present[i]) > 1
                   else 0 for i in range(len(inst)))
    start = tuple(solver.value(s) for s in starts)
    end = tuple(start[i] + inst.candidates[i][choice[i]].duration for i in range(len(inst)))
    bound = max(lower_bound, int(round(solver.best_objective_bound)))
    return CpSatOutcome(Schedule(choice, start, end), bound, code == cp_model.OPTIMAL, name, solver.deterministic_time)


def _relabel(inst: Instance, hint: Schedule) -> tuple[list[int], list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i in range(len(inst)):
        groups.setdefault(inst.signature(i), []).append(i)
    start, choice = list(hint.start), list(hint.choice)
    for members in groups.values():
        slots = sorted((hint.start[i], hint.choice[i]) for i in members)
        for i, (s, k) in zip(members, slots):
            start[i], choice[i] = s, k
    return start, choice
