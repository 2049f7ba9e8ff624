"""Lower bounds on the makespan of the resharding paper §3.2's problem (Eq. 1-3).

:meth:`Instance.lower_bound` is the combinatorial bound (the longest task, the work each
resource must carry whatever the senders, and the resharding paper Eq. 4 over every set of sender
hosts).  :func:`assignment_bound` is stronger when tasks have several candidate senders:
the least possible load of the busiest resource over every sender assignment (Eq. 4
generalised from the senders' NICs to every resource a candidate holds: forwarding hosts
in a broadcast chain, receivers, shared links).  Any schedule's assignment puts that
much work on some resource, and a resource runs one task at a time (Eq. 3), so the
makespan is at least this.  It is an integer program over classes of interchangeable
tasks (how many of each class each candidate sends), solved by CP-SAT; the bound CP-SAT
proves is valid even when it stops before the optimum.
"""

from __future__ import annotations

from .schedule import Instance

__all__ = ["assignment_bound", "best_bound"]


def assignment_bound(inst: Instance, time_limit: float = 1.0) -> int:
    """The least busiest-resource load over sender assignments (a true lower bound; CP-SAT
    with one worker and a deterministic ``time_limit``)."""
    if all(len(c) == 1 for c in inst.candidates):  # nothing to choose: the resource loads
        load = [0] * len(inst.resources)
        for cands in inst.candidates:
            for r in cands[0].resources:
                load[r] += cands[0].duration
        return max(load, default=0)
    from ortools.sat.python import cp_model

    classes: dict[tuple, int] = {}
    for i in range(len(inst)):
        sig = inst.signature(i)
        classes[sig] = classes.get(sig, 0) + 1
    m = cp_model.CpModel()
    total = sum(max(c.duration for c in cands) for cands in inst.candidates)
    peak = m.new_int_var(0, total, "peak")
    terms: dict[int, list] = {}
    for j, (sig, count) in enumerate(classes.items()):
        sends = [m.new_int_var(0, count, f"n{j}_{k}") for k in range(len(sig))]
        m.add(sum(sends) == count)
        for (_host, duration, resources), var in zip(sig, sends):
            for r in resources:
                terms.setdefault(r, []).append(duration * var)
    for r in sorted(terms):
        m.add(sum(terms[r]) <= peak)
    m.minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.max_time_in_seconds = 10 * time_limit + 10  # safety net only
    code = solver.solve(m)
    if code == cp_model.OPTIMAL:
        return int(solver.objective_value)
    if code == cp_model.FEASIBLE:
        return int(-(-solver.best_objective_bound // 1))
    return 0


def best_bound(inst: Instance, time_limit: float = 1.0) -> int:
    """The larger of the combinatorial bound and :func:`assignment_bound`."""
    return max(inst.lower_bound(), assignment_bound(inst, time_limit))
