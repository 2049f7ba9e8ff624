"""Plan a cross-mesh resharding: unit tasks -> candidates -> schedule -> checked plan.

:func:`plan_resharding` is the entry point.  Whatever the method, the plan it returns has
been checked twice: the schedule is feasible (no two tasks overlap on a resource; each
sender holds its slice) and the simulator, replaying it with durations recomputed by the
cost model, ends when the plan says it ends (:func:`check`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..cost import CostModel
from ..errors import OptionError, PlannerError, unknown_choice
from ..simulate import Simulation, Timeline
from ..solve import SolveResult, Status, Stopwatch
from ..topology import Resource
from ..choices import RESHARD_METHODS
from . import heuristics
from .bounds import assignment_bound
from .cpsat import solve_cpsat
from .dispatch import assign_senders, dispatch
from .improve import improve_tail
from .schedule import TIME_UNIT, Candidate, Instance, Schedule, to_units
from .strategies import Strategy, UnitCost, unit_cost
from .tasks import ReshardingProblem, UnitTask

__all__ = ["METHODS", "AUTO_EXACT_TASKS", "ReshardingPlan", "Scheduled", "build_instance", "schedule_instance",
           "plan_resharding", "replay", "check", "baselines", "report"]

METHODS = RESHARD_METHODS
# Up to this many unit tasks, method="auto" runs the CP-SAT model; above, dispatching and LNS.
AUTO_EXACT_TASKS = 256
# Nodes of DFS that improve CP-SAT's starting schedule.
HINT_DFS_NODES = 2000
# Deterministic time (CP-SAT's work measure, about seconds) of auto's improvement phase
# and of its assignment bound, on large instances.
AUTO_LNS_BUDGET = 2.0
AUTO_BOUND_LIMIT = 0.5
# Random orders per iteration of the "alpa-greedy" method (Alpa's default).
ALPA_GREEDY_ROUNDS = 100


@dataclass
class ReshardingPlan:
    """A schedule of unit tasks: for each, its sender, its receivers, and when it runs."""

    problem: ReshardingProblem
    strategy: str
    tasks: list[UnitTask]
    instance: Instance
    schedule: Schedule
    costs: list[list[UnitCost]] = field(repr=False)

    @property
    def makespan(self) -> float:
        return self.schedule.makespan * TIME_UNIT

    def sender(self, i: int) -> Candidate:
        return self.instance.candidates[i][self.schedule.choice[i]]

    def unit_cost(self, i: int) -> UnitCost:
        return self.costs[i][self.schedule.choice[i]]

    def bytes_moved(self, topology) -> dict[str, int]:
        """Bytes leaving the source mesh, and bytes crossing between hosts (the resharding paper §2.2:
        the former is at least the tensor's size)."""
        src = set(self.problem.src.mesh.flat)
        cross_mesh = network = 0.0
        for i in range(len(self.tasks)):
            for a, b, n in self.unit_cost(i).transfers:
                cross_mesh += n if a in src and b not in src else 0
                network += n if topology.host(a) != topology.host(b) else 0
        return {"tensor": self.problem.nbytes, "cross_mesh": round(cross_mesh), "between_hosts": round(network)}

    def rows(self, topology) -> list[dict[str, Any]]:
        """One entry per unit task, by start time."""
        out = []
        for i in self.schedule.order():
            t, c = self.tasks[i], self.sender(i)
            out.append({"task": i, "slice": self.problem.describe_slice(t.slice), "bytes": t.nbytes,
                        "sender_host": c.host, "sender_device": c.device,
                        "receiver_hosts": sorted({topology.host(r) for r in t.receivers}),
                        "receivers": list(t.receivers),
                        "start": self.schedule.start[i] * TIME_UNIT, "end": self.schedule.end[i] * TIME_UNIT})
        return out


def build_instance(problem: ReshardingProblem, cost: CostModel, strategy: Strategy | str = "broadcast"
                   ) -> tuple[list[UnitTask], Instance, list[list[UnitCost]]]:
    """Unit tasks and, per task, its candidate senders, timed by the cost model under
    ``strategy``: one per host holding its slice (its lowest device there), as the resharding
    paper §3.2 balances hosts, and more on a host whose devices send through ports of their
    own (a NIC per GPU, or NVLink to receivers on the same host): there every holding device
    whose transfer holds other ports is a candidate too."""
    topo = cost.topology
    tasks = problem.unit_tasks()
    resource_ids: dict[Resource, int] = {}
    memo: dict[tuple, UnitCost] = {}
    candidates, costs = [], []
    for t in tasks:
        cands, task_costs = [], []
        for d in sorted(t.holders, key=lambda d: (topo.host(d), d)):
            key = (d, t.receivers, t.nbytes)
            uc = memo.get(key)
            if uc is None:
                uc = memo[key] = unit_cost(cost, strategy, d, t.receivers, t.nbytes)
            # ports numbered in a fixed order (a frozenset's order follows the hash seed, and
            # the numbers name the rows of reshard --plot)
            ids = tuple(sorted(resource_ids.setdefault(r, len(resource_ids)) for r in sorted(uc.resources)))
            cands.append(Candidate(topo.host(d), d, to_units(uc.time), ids))
            task_costs.append(uc)
        candidates.append(cands)
        costs.append(task_costs)
    candidates, costs = _interchangeable(candidates, costs)
    resources = sorted(resource_ids, key=resource_ids.__getitem__)
    return tasks, Instance(candidates, resources), costs


def _interchangeable(candidates: list[list[Candidate]], costs: list[list[UnitCost]]
                     ) -> tuple[list[list[Candidate]], list[list[UnitCost]]]:
    """Each task's candidates without those that an earlier one of the same host and duration
    can stand in for: where the ports that tell them apart are held by no other task's
    candidate (none, for devices sharing their host's NIC; a GPU's own NIC, on a host only
    this task's slice leaves), any schedule
    sending from the later one sends from the earlier one instead, at the same times and
    with no new overlap, so the optimum and every bound stay those of all the candidates.
    On GPT-3's boundaries over 64x8 meshes each slice leaves its own host: one candidate
    per task, as before, where all eight GPUs would multiply the work 8-fold."""
    users: dict[int, int] = {}
    for cands in candidates:
        for r in {r for c in cands for r in c.resources}:
            users[r] = users.get(r, 0) + 1
    out_c, out_u = [], []
    for cands, ucs in zip(candidates, costs):
        kept: list[int] = []
        for k, c in enumerate(cands):
            mine = set(c.resources)
            if not any(cands[j].host == c.host and cands[j].duration == c.duration
                       and all(users[r] == 1 for r in mine ^ set(cands[j].resources)) for j in kept):
                kept.append(k)
        out_c.append([cands[k] for k in kept])
        out_u.append([ucs[k] for k in kept])
    return out_c, out_u


def _best(*schedules: Schedule) -> Schedule:
    return min(schedules, key=lambda s: s.makespan)


@dataclass
class Scheduled:
    """What :func:`schedule_instance` found: a schedule, a lower bound, how it was found."""

    schedule: Schedule
    bound: int
    method: str
    info: dict[str, Any]

    @property
    def optimal(self) -> bool:
        return self.schedule.makespan <= self.bound


def schedule_instance(inst: Instance, method: str = "auto", time_limit: float = 10.0, seed: int = 0,
                      workers: int = 1) -> Scheduled:
    """Schedule ``inst`` with ``method`` (see :data:`METHODS`); the bound is always valid.

    ``auto`` runs, by size:

    * up to :data:`AUTO_EXACT_TASKS` unit tasks: the CP-SAT model (``cp-sat``), warm-started
      from the best of load balancing, the greedy, dispatching and a short DFS; optimal
      unless ``time_limit`` ends it first, and then the naive schedule and the 100-round
      ``alpa-greedy`` are run too, so that it is never worse than any fallback;
    * above: balanced senders then priority dispatching (``dispatch``); unless that meets
      the lower bound, also the greedy, load balancing and the naive schedule, the best
      kept, and while it is above the lower bound, the improvement phase
      (CP-SAT on tail windows, :func:`improve.improve_tail`, at most
      :data:`AUTO_LNS_BUDGET` deterministic time) and, if it is still above, the stronger
      assignment bound (:func:`bounds.assignment_bound`).

    Every method reports the combinatorial lower bound (raised by CP-SAT's proof where it
    runs, and by the assignment bound where a gap is left), so a gap is always given.
    Deterministic: the same inputs and ``seed`` give the same schedule (one CP-SAT worker).
    """
    if method not in METHODS:
        raise OptionError(unknown_choice("method", method, METHODS))
    bound = inst.lower_bound()
    info: dict[str, Any] = {}
    used = method
    if method == "auto":
        used = "cp-sat" if len(inst) <= AUTO_EXACT_TASKS else "dispatch"
    proven = False
    if used == "naive":
        sched = heuristics.naive(inst)
    elif used == "load-balance":
        sched = heuristics.load_balance(inst)
    elif used == "greedy":
        sched = heuristics.randomized_greedy(inst, seed)
    elif used == "alpa-greedy":
        sched = heuristics.alpa_greedy(inst, seed, ALPA_GREEDY_ROUNDS)
    elif used == "dispatch":
        sched = dispatch(inst, assign_senders(inst))
        if method == "auto" and sched.makespan > bound:  # the best fallback, then the improvement phase
            sched = _best(sched, heuristics.randomized_greedy(inst, seed), heuristics.load_balance(inst),
                          heuristics.naive(inst))
            if sched.makespan > bound:
                lns = improve_tail(inst, sched, bound, min(time_limit, AUTO_LNS_BUDGET), seed)
                info["lns_calls"] = lns.calls
                info["lns_deterministic_time"] = round(lns.deterministic_time, 3)
                if lns.schedule.makespan < sched.makespan:
                    sched, used = lns.schedule, "dispatch+lns"
    else:
        start = _best(heuristics.load_balance(inst), heuristics.randomized_greedy(inst, seed),
                      dispatch(inst, assign_senders(inst)))
        if used == "dfs":
            res = heuristics.dfs(inst, start, time_limit, bound)
            sched, proven = res.schedule, res.complete
            info["dfs_nodes"] = res.nodes
        else:
            # Warm start: the best heuristic, improved by a short deterministic DFS.
            # A DFS node costs about the number of candidates: the same work on every size.
            nodes = max(20, HINT_DFS_NODES * 64 // max(64, sum(map(len, inst.candidates))))
            start = heuristics.dfs(inst, start, time_limit, bound, node_limit=nodes).schedule
            if start.makespan <= bound:  # the warm start meets the lower bound: nothing to search
                sched, proven = start, True
                info["cp_sat_status"] = "NOT RUN (warm start meets the lower bound)"
            else:
                out = solve_cpsat(inst, start, bound, time_limit, workers, seed)
                info["cp_sat_status"] = out.status
                sched = start if out.schedule is None else _best(inst.left_shift(out.schedule), start)
                bound = max(bound, out.bound)
                proven = out.optimal
                if not proven and len(inst) <= AUTO_EXACT_TASKS:  # never worse than a fallback
                    sched = _best(sched, heuristics.alpa_greedy(inst, seed, ALPA_GREEDY_ROUNDS),
                                  heuristics.naive(inst))
    if proven:
        bound = max(bound, sched.makespan)
    elif method == "auto" and sched.makespan > bound:
        bound = max(bound, assignment_bound(inst, min(time_limit, AUTO_BOUND_LIMIT)))
    problems = inst.violations(sched)
    if problems:
        raise PlannerError(f"{used} produced an infeasible schedule: {problems[0]}")
    return Scheduled(sched, bound, used, info)


def plan_resharding(problem: ReshardingProblem, cost: CostModel, method: str = "auto",
                    strategy: Strategy | str = "broadcast", time_limit: float = 10.0, seed: int = 0,
                    workers: int = 1, progress: Callable[[str], None] | None = None) -> SolveResult[ReshardingPlan]:
    """Choose senders and start times for every unit task (the resharding paper §3.2) with ``method``.

    ``time_limit`` bounds CP-SAT and the DFS; ``seed`` drives the randomized greedy and
    CP-SAT; the same inputs always give the same plan (with one CP-SAT worker).
    """
    say = progress or (lambda _msg: None)
    with Stopwatch() as sw:
        say(f"{problem.name}: costing unit tasks")
        tasks, inst, costs = build_instance(problem, cost, strategy)
        say(f"{problem.name}: scheduling {len(tasks)} unit tasks ({method})")
        found = schedule_instance(inst, method, time_limit, seed, workers)
    plan = ReshardingPlan(problem, Strategy(strategy).value, tasks, inst, found.schedule, costs)
    status = Status.OPTIMAL if found.optimal else Status.FEASIBLE
    return SolveResult(status, found.method, plan, plan.makespan, found.bound * TIME_UNIT, sw.seconds, [plan],
                       {"tasks": len(tasks), **found.info})


def replay(plan: ReshardingPlan, cost: CostModel, sim: Simulation | None = None, release: float = 0.0
           ) -> Timeline | None:
    """Run the plan in the simulator: each unit task is one task whose duration the cost
    model computes afresh, holding the ports it crosses, after the tasks before it on each
    of them (the per-resource order is the plan's; start times are the simulator's).

    With ``sim`` the tasks are added to it (none starting before ``release``) and nothing
    runs; otherwise a fresh simulation runs and its timeline is returned.
    """
    own = sim is None
    sim = Simulation() if sim is None else sim
    last: dict[Resource, int] = {}
    for i in plan.schedule.order():
        t, c = plan.tasks[i], plan.sender(i)
        uc = unit_cost(cost, plan.strategy, c.device, t.receivers, t.nbytes)
        deps = sorted({last[r] for r in uc.resources if r in last})
        sid = sim.add(f"{plan.problem.name} {plan.problem.describe_slice(t.slice)}", uc.time,
                      sorted(uc.resources), deps, release=release, devices=(c.device,) + t.receivers, stream="comm",
                      category=plan.strategy, args={"task": i, "bytes": t.nbytes, "sender_host": c.host})
        for r in uc.resources:
            last[r] = sid
    return sim.run() if own else None


def check(plan: ReshardingPlan, cost: CostModel) -> Timeline:
    """Replay ``plan`` and fail loudly unless the simulated makespan is the plan's (within
    the rounding of each task to ``TIME_UNIT``) and no resource is used twice at once."""
    timeline = replay(plan, cost)
    assert timeline is not None
    overlaps = timeline.overlaps()
    if overlaps:
        res, a, b = overlaps[0]
        raise PlannerError(f"replay: {a.name} and {b.name} overlap on {res}")
    tolerance = TIME_UNIT * (len(plan.tasks) + 1)
    if abs(timeline.makespan - plan.makespan) > tolerance:
        raise PlannerError(f"replay ends at {timeline.makespan:.9f} s but the plan says {plan.makespan:.9f} s")
    return timeline


def baselines(problem: ReshardingProblem, cost: CostModel) -> dict[str, float]:
    """Makespans of the resharding paper's baselines: the naive schedule of broadcasts, and plain
    send/recv and Alpa's local all-gather, each load-balanced as in the resharding paper §5.1.2."""
    out = {"naive": plan_resharding(problem, cost, "naive").objective}
    for name, strategy in (("send_recv", Strategy.SEND_RECV), ("local_allgather", Strategy.LOCAL_ALLGATHER)):
        out[name] = plan_resharding(problem, cost, "load-balance", strategy).objective
    return out


def report(result: SolveResult[ReshardingPlan], cost: CostModel, compare: bool = True) -> dict[str, Any]:
    """Everything a user asks of a plan, JSON-ready: the schedule, makespan, lower bound,
    status, bytes moved and, with ``compare``, the baselines and the speedup over them."""
    plan = result.solution
    assert plan is not None
    prob = plan.problem
    out: dict[str, Any] = {
        "name": prob.name, "tasks": len(plan.tasks), "makespan": result.objective, "lower_bound": result.bound,
        "gap": result.gap, "status": result.status.value, "method": result.method, "strategy": plan.strategy,
        "solve_time": result.wall_time,
        "tensor": {"shape": list(prob.shape), "dtype": prob.dtype, "bytes": prob.nbytes},
    }
    for side, layout in (("src", prob.src), ("dst", prob.dst)):
        out[side] = {"hosts": list(layout.mesh.hosts), "mesh": list(layout.mesh.shape),
                     "devices": list(layout.mesh.flat), "spec": list(layout.spec.entries)}
    out["padding"] = prob.padding_notes()
    out["bytes"] = plan.bytes_moved(cost.topology)
    if compare:
        base = baselines(prob, cost)
        out["baselines"] = base
        out["speedup"] = {k: v / plan.makespan if plan.makespan > 0 else None for k, v in base.items()}
    out["schedule"] = plan.rows(cost.topology)
    out.update({k: v for k, v in result.info.items() if k != "tasks"})
    return out
