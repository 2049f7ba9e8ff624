"""The scheduling algorithms of the resharding paper §3.2 other than the solver model.

* :func:`naive`: every task from its lowest-indexed host, in one fixed global order.
* :func:`load_balance`: Eq. 4 solved greedily, largest task first to the least-loaded
  sender host; tasks run in that order.
* :func:`randomized_greedy`: rounds; each picks, over several random task orders, the
  largest set of tasks that share no resource, and appends it to the order (seeded; a
  fast variant that scans interchangeable tasks once per round).
* :func:`alpa_greedy`: the same algorithm as the resharding paper §3.2 states it (and Alpa runs it):
  every iteration tries ``rounds`` random orders of all remaining tasks and keeps the
  largest set; each task goes to its least-loaded free sender host.
* :func:`dfs`: depth-first branch and bound over sender choices and task orders, pruned
  by a lower bound, under a time budget.
* :func:`brute_force`: every order and sender choice; for tests on tiny instances.

Each returns a :class:`Schedule` built by list scheduling, so it is left-shifted.
"""

from __future__ import annotations

import bisect
import itertools
import random
import time

from .schedule import Instance, Schedule

# The DFS recurses once per task; beyond this many it returns its incumbent untouched.
DFS_MAX_TASKS = 800

__all__ = ["naive", "load_balance", "randomized_greedy", "alpa_greedy", "dfs", "brute_force", "DfsResult"]


def naive(inst: Instance) -> Schedule:
    """The resharding paper §3.2 "Naive algorithm": lowest-indexed sender host, tasks in index order."""
    return inst.list_schedule(range(len(inst)), [0] * len(inst))


def load_balance(inst: Instance) -> Schedule:
    """The resharding paper Eq. 4: sort by duration, descending; each to the currently lightest host."""
    order = sorted(range(len(inst)), key=lambda i: (-inst.min_duration(i), i))
    load: dict[int, int] = {}
    choice = [0] * len(inst)
    for i in order:
        cands = inst.candidates[i]
        k = min(range(len(cands)), key=lambda k: (load.get(cands[k].host, 0) + cands[k].duration, cands[k].host))
        choice[i] = k
        load[cands[k].host] = load.get(cands[k].host, 0) + cands[k].duration
    return inst.list_schedule(order, choice)


def randomized_greedy(inst: Instance, seed: int = 0, restarts: int = 8) -> Schedule:
    """The resharding paper §3.2 "Greedy Search with Randomization".

    Each round tries ``restarts`` random orders of the remaining tasks, takes each task whose
    resources (with some candidate sender, lightest host first) are still free, and keeps
    the set covering the most resources.  Interchangeable tasks (the resharding paper: "many unit
    communication tasks are identical") are scanned once per class, so a round costs the
    number of classes, not of tasks; a restart that leaves no resource idle ends the round.
    """
    rng = random.Random(seed)
    classes: dict[tuple, list[int]] = {}
    for i in range(len(inst)):
        classes.setdefault(inst.signature(i), []).append(i)
    pending = [list(reversed(members)) for members in classes.values()]  # pop() gives the lowest index
    live = [c for c in range(len(pending)) if pending[c]]
    everything = len(inst.resources)
    load: dict[int, int] = {}
    order: list[int] = []
    choice = [0] * len(inst)
    while live:
        best: tuple[tuple[int, int], list[tuple[int, int, int]]] | None = None
        for _ in range(restarts):
            used: set[int] = set()
            chosen: list[tuple[int, int, int]] = []
            for c in rng.sample(live, len(live)):
                i = pending[c][-1]
                cands = inst.candidates[i]
                for k in sorted(range(len(cands)), key=lambda k: (load.get(cands[k].host, 0), cands[k].host)):
                    if used.isdisjoint(cands[k].resources):
                        used.update(cands[k].resources)
                        chosen.append((i, k, c))
                        break
                if len(used) == everything:
                    break
            score = (len(used), sum(inst.candidates[i][k].duration for i, k, _ in chosen))
            if best is None or score > best[0]:
                best = (score, chosen)
            if len(used) == everything:
                break
        assert best is not None
        for i, k, c in sorted(best[1]):
            order.append(i)
            choice[i] = k
            pending[c].pop()
            cand = inst.candidates[i][k]
            load[cand.host] = load.get(cand.host, 0) + cand.duration
        live = [c for c in live if pending[c]]
    return inst.list_schedule(order, choice)


def alpa_greedy(inst: Instance, seed: int = 0, rounds: int = 100) -> Schedule:
    """The resharding paper §3.2 "Greedy Search with Randomization", as written.

    Iterations: each draws ``rounds`` random orders of the remaining tasks; in each order
    it takes every task that shares no resource with those taken before it, sent from its
    least-loaded candidate host whose resources are still free (ties: lowest host); the
    iteration keeps the largest set ("the maximum number of devices": resources held, then
    tasks, then the evener sender loads, as Alpa breaks ties) and appends it to the order.
    Loads are the work each host already sends.  The order is list-scheduled.

    Scanning a random order only matters at the tasks that can still be taken, so each
    order is drawn lazily: the next task taken is uniform over the not-yet-scanned tasks
    that still fit.  Interchangeable tasks (equal :meth:`Instance.signature`) behave alike,
    so the draw is over their classes, weighted by how many of each are left; which member
    of a class is named first does not change the schedule's makespan.  Seeded: the same
    ``seed`` gives the same schedule.
    """
    rng = random.Random(seed)
    classes: dict[tuple, list[int]] = {}
    for i in range(len(inst)):
        classes.setdefault(inst.signature(i), []).append(i)
    members = [list(reversed(m)) for m in classes.values()]  # pop() gives the lowest index
    cands = [inst.candidates[m[-1]] for m in members]
    # Candidate k of class c: its host, duration and resources as a bit mask.
    masks = [[sum(1 << r for r in c.resources) for c in cs] for cs in cands]
    hosts = [[c.host for c in cs] for cs in cands]
    durations = [[c.duration for c in cs] for cs in cands]
    everything = (1 << len(inst.resources)) - 1
    # A candidate holding nothing always fits: then a full resource set does not end an order.
    saturates = all(m for per_class in masks for m in per_class)
    load: dict[int, int] = {}
    order: list[int] = []
    choice = [0] * len(inst)
    left = [len(m) for m in members]

    def one_order() -> tuple[tuple[int, int, int], list[tuple[int, int]]]:
        used = 0
        taken_of = [0] * len(members)
        fits = [c for c in range(len(members)) if left[c]]
        picked: list[tuple[int, int]] = []
        held = 0
        while fits:
            c = fits[_draw(rng, [left[f] - taken_of[f] for f in fits])]
            k = min((k for k, m in enumerate(masks[c]) if not m & used),
                    key=lambda k: (load.get(hosts[c][k], 0), hosts[c][k]))
            used |= masks[c][k]
            held += bin(masks[c][k]).count("1")
            taken_of[c] += 1
            picked.append((c, k))
            if saturates and used == everything:
                break
            fits = [f for f in fits if left[f] > taken_of[f] and not all(m & used for m in masks[f])]
        after = dict(load)
        for c, k in picked:
            after[hosts[c][k]] = after.get(hosts[c][k], 0) + durations[c][k]
        values = list(after.values())
        spread = len(values) * sum(v * v for v in values) - sum(values) ** 2  # n^2 * variance, exact
        return (held, len(picked), -spread), picked

    while any(left):
        best_score, best = one_order()
        for _ in range(rounds - 1):
            score, picked = one_order()
            if score > best_score:
                best_score, best = score, picked
        for c, k in best:
            i = members[c].pop()
            left[c] -= 1
            order.append(i)
            choice[i] = k
            load[hosts[c][k]] = load.get(hosts[c][k], 0) + durations[c][k]
    return inst.list_schedule(order, choice)


def _draw(rng: random.Random, weights: list[int]) -> int:
    """An index drawn with probability proportional to ``weights`` (positive integers)."""
    cumulative = list(itertools.accumulate(weights))
    return bisect.bisect_right(cumulative, rng.randrange(cumulative[-1]))


class DfsResult:
    """The best schedule found and whether the search space was exhausted."""

    def __init__(self, schedule: Schedule, complete: bool, nodes: int):
        self.schedule, self.complete, self.nodes = schedule, complete, nodes


# Nodes the DFS explores per second of budget: about what this machine does (2-core), so that
# --time-limit keeps its rough meaning while the stop is deterministic.
DFS_NODES_PER_SECOND = 20_000


def dfs(inst: Instance, incumbent: Schedule | None = None, time_budget: float = 1.0,
        bound: int = 0, node_limit: int | None = None) -> DfsResult:
    """The resharding paper §3.2 "DFS with pruning": branch on the next task to start and its sender.

    ``time_budget`` is turned into a node budget (:data:`DFS_NODES_PER_SECOND` nodes per
    second, or ``node_limit`` when smaller) so that the answer does not depend on machine
    load; the wall clock (ten times the budget plus 10 s) is only a safety net, after which
    the result is reported incomplete like any budget stop.

    Only *active* schedules are generated (a task is branched on only if it can start
    before the earliest time any remaining task could finish: Giffler and Thompson), and of
    several interchangeable tasks only the first is tried.  A branch is cut when its lower
    bound (the latest a resource is busy plus the work every remaining task must still put
    on it) reaches the best makespan found.  Stops at ``bound`` or after ``time_budget``.
    """
    n = len(inst)
    best = incumbent or load_balance(inst)
    best_span = best.makespan
    budget = max(1, int(time_budget * DFS_NODES_PER_SECOND))
    node_limit = budget if node_limit is None else min(node_limit, budget)
    deadline = time.perf_counter() + 10 * time_budget + 10
    sig_of = {}
    classes = [sig_of.setdefault(inst.signature(i), len(sig_of)) for i in range(n)]
    must = [sorted(inst.mandatory(i)) for i in range(n)]
    need = [0] * len(inst.resources)
    for i in range(n):
        for r in must[i]:
            need[r] += inst.min_duration(i)
    # One resource per sender host that all its candidates hold, if every host has one.
    common = inst.host_common(range(n))
    anchors = [min(rs) for _, rs in sorted(common.items())] if common and all(common.values()) else []
    work = sum(inst.min_duration(i) for i in range(n))
    free = [0] * len(inst.resources)
    start = [0] * n
    choice = [0] * n
    done = [False] * n
    nodes = 0
    complete = True

    def branches() -> list[tuple[int, int, int]]:
        first_of_class: dict[int, int] = {}
        for i in range(n):
            if not done[i] and classes[i] not in first_of_class:
                first_of_class[classes[i]] = i
        options = []
        for i in first_of_class.values():
            for k, c in enumerate(inst.candidates[i]):
                options.append((max((free[r] for r in c.resources), default=0), i, k))
        horizon = min(s + inst.candidates[i][k].duration for s, i, k in options)
        keep = [o for o in options if o[0] < horizon or inst.candidates[o[1]][o[2]].duration == 0]
        return sorted(keep, key=lambda o: (o[0], -inst.candidates[o[1]][o[2]].duration, o[1], o[2]))

    def search(depth: int, span: int) -> None:
        nonlocal best, best_span, nodes, complete, work
        nodes += 1
        if nodes > node_limit or (nodes % 256 == 0 and time.perf_counter() > deadline):
            complete = False
            return
        if depth == n:
            if span < best_span:
                best_span = span
                best = Schedule(tuple(choice), tuple(start),
                                tuple(start[i] + inst.candidates[i][choice[i]].duration for i in range(n)))
            return
        for s, i, k in branches():
            c = inst.candidates[i][k]
            e = s + c.duration
            saved = [free[r] for r in c.resources]
            for r in c.resources:
                free[r] = e
            for r in must[i]:
                need[r] -= inst.min_duration(i)
            done[i], start[i], choice[i] = True, s, k
            work -= inst.min_duration(i)
            lb = max(span, e, max((free[r] + need[r] for r in range(len(free))), default=0))
            if anchors:  # the remaining work shared by the senders, after each is free (Eq. 4)
                lb = max(lb, -(-(sum(free[r] for r in anchors) + work) // len(anchors)))
            if lb < best_span:
                search(depth + 1, max(span, e))
            work += inst.min_duration(i)
            done[i] = False
            for r in must[i]:
                need[r] += inst.min_duration(i)
            for r, v in zip(c.resources, saved):
                free[r] = v
            if best_span <= bound or not complete:
                return

    if n > DFS_MAX_TASKS:  # the resharding paper §3.2: the DFS does not scale; keep the incumbent
        return DfsResult(best, best_span <= bound, 0)
    if best_span > bound and n:
        search(0, 0)
    return DfsResult(best, complete, nodes)


def brute_force(inst: Instance) -> Schedule:
    """The optimum by trying every task order and sender choice (tiny instances only)."""
    n = len(inst)
    if n > 7:
        raise ValueError(f"brute force over {n} tasks is too large; it is for tests on up to 7")
    best: Schedule | None = None
    for choice in itertools.product(*(range(len(c)) for c in inst.candidates)):
        for order in itertools.permutations(range(n)):
            s = inst.list_schedule(order, choice)
            if best is None or s.makespan < best.makespan:
                best = s
    assert best is not None
    return best
