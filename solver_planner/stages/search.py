"""The stage planner: a branch and bound over every mesh shape, micro-batch count, partition
and stage configuration, whose leaves are simulated.

What is minimised is the simulated iteration time (:mod:`.pipeline`).  Every plan has a
closed-form lower bound, the objective ``O`` (:mod:`.objective`), and a weaker one that
dynamic programs over contiguous stages handle exactly, the relaxation ``R <= O``
(:mod:`.problem`).  Two heaps: *subspaces* (a pair, a fixed prefix of stages, choices
excluded for the next stage) keyed by a proven lower bound of ``R`` over them, and priced
plans keyed by their ``O``.  The least key of both is a lower bound of every plan not
simulated yet.  In a loop:

1. drop what cannot beat its pair's cutoff (the best simulated time; with ``top > 1``, its
   pair's own best or the top-th best, whichever is less);
2. if the least key is a priced plan (or every ``DIVE`` subspaces, for an early
   incumbent), simulate it under each schedule of the family that fits and whose ``O`` can
   still win;
3. otherwise solve the least subspace: ``dp`` asks the dynamic programs for a plan with
   ``R`` below the cutoff (none: pruned) and bisects toward the subspace's least ``R``;
   ``cp-sat`` minimises ``R1`` and ``R2`` with CP-SAT; the plan is priced and the subspace
   minus it is pushed back as Lawler's disjoint subspaces, with the bound found.

When both heaps empty, every plan has been simulated or proven slower: the best is
OPTIMAL (to a relative ``1e-9``).  Budgets (subspaces solved, simulated tasks; both
deterministic) stop it earlier: OPTIMAL still when nothing left can beat the best, else
FEASIBLE with the gap to the least key left.  ``greedy`` simulates the balanced plan of Wang's thesis
of each pair (bound: :func:`.problem.cheap_bound`); ``brute-force`` prices every plan and
simulates them by increasing ``O`` (refused beyond ``BRUTE_FORCE_LIMIT`` before starting).
No plan at all: INFEASIBLE when the least-memory plan of every pair (an exact min-max
dynamic program) does not fit, with its shortfall; otherwise UNKNOWN.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..choices import DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS, DEFAULT_TOP_GAP, RISE, STAGE_METHODS, STALL
from ..cost import CostModel
from ..memory import active_bound, stages_estimate
from ..memory import check as check_memory
from ..errors import InfeasibleError, OptionError, PlannerError, RefusedError, UnknownError, unknown_choice
from ..solve import SolveResult, Status, Stopwatch
from ..topology import Topology
from ..units import format_bytes, format_count
from ..spec.base import MAX_MICROBATCHES
from .coarse import EXACT, fine_bound
from .costs import CostTables, MeshShape, StageCosts, cost_tables, divisors, mesh_shapes
from .cpsat import minimize_cpsat, model_size
from .enumerate import all_plans, balanced_greedy, count_plans
from .layers import LayerModel
from .objective import Bounds, bounds, fits
from .partition import Partition
from .fastsim import pipeline_run
from .pipeline import PipelineRun
from .problem import PairProblem, Subspace, cheap_bound
from .schedule import SCHEDULES, VIRTUAL, Schedule, family
from .uniform import search_uniform, why_none

__all__ = ["METHODS", "TOLERANCE", "StageSearch", "Candidate", "plan_partition", "evaluate", "BRUTE_FORCE_LIMIT",
           "CPSAT_MAX_CELLS", "DEFAULT_BUDGET", "DEFAULT_SIMULATIONS", "DEFAULT_TOP_GAP"]

METHODS = STAGE_METHODS
TOLERANCE = 1e-9               # relative: OPTIMAL means no plan is faster by more than this
BRUTE_FORCE_LIMIT = 20_000     # plans brute force may price (each is simulated)
CPSAT_MAX_CELLS = 200_000      # Booleans of one pair's CP-SAT model


@dataclass
class Candidate:
    """A simulated plan: the fastest schedule of the family that fits, its bounds, and the
    simulated time of every schedule tried."""

    plan: Partition
    run: PipelineRun
    bounds: Bounds
    family_bound: float               # least O over the family's schedules that fit (<= bounds.value)
    relaxation: float
    tried: dict[Schedule, float] = field(default_factory=dict)
    # the least time a plan of the same mesh shape and micro-batch count can have (None:
    # not known, a heuristic method); equal to ``time`` when the entry is proven its pair's best
    pair_bound: float | None = None

    @property
    def time(self) -> float:
        return self.run.iteration_time

    @property
    def schedule(self) -> Schedule:
        return self.run.schedule


@dataclass
class StageSearch:
    """Inputs shared by every (shape, B) pair, and optional restrictions of the plan space."""

    model: LayerModel
    topology: Topology
    schedule: str = "1f1b"
    comm: bool = True
    synthesize: bool = True
    shapes: list[MeshShape] | None = None
    stages: int | None = None
    microbatches: list[int] | None = None
    tensor: int | None = None                 # every stage with this tensor degree
    layer_counts: tuple[int, ...] | None = None   # layers per stage, fixed
    compute: str = "efficiency"               # the compute model (solver_planner.compute)
    # uniform plans only (stages/uniform.py): the schedules searched, a filter of what a
    # framework runs, its extra layer splits, a label for messages; forced for chunked schedules
    uniform: list[str] | None = None
    allows: Callable | None = None
    splits: Callable | None = None
    space: str = "native"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise OptionError(unknown_choice("schedule", self.schedule, SCHEDULES))
        if self.uniform is None and self.schedule in VIRTUAL:
            self.uniform = [self.schedule]
        self.cost = CostModel(self.topology, self.compute, self.model.dtype)
        self._tables: dict[MeshShape, dict[int, CostTables]] = {}

    def tables(self, shape: MeshShape) -> dict[int, CostTables]:
        if shape not in self._tables:
            self._tables[shape] = cost_tables(self.topology, self.cost, shape, self.synthesize)
        return self._tables[shape]

    def microbatch_options(self) -> list[int]:
        if self.microbatches is not None:
            return list(self.microbatches)
        if self.model.microbatches is not None:
            return [self.model.microbatches]
        # every divisor up to the spec limit: more micro-batches than that would only
        # lengthen the simulation (one sample per replica is reached long before)
        return [k for k in divisors(self.model.global_batch) if k <= MAX_MICROBATCHES]

    def all_shapes(self) -> list[MeshShape]:
        return self.shapes or mesh_shapes(self.topology.num_hosts, self.topology.devices_per_host)

    def pairs(self) -> list[PairProblem]:
        out = []
        why: dict[str, str] = {}          # why (shape, micro-batch count) pairs were left out
        self._why = why
        L = self.model.num_layers
        for shape in self.all_shapes():
            S = self.topology.num_devices // shape.size
            if S > L:
                why.setdefault("layers", f"{S} stages of {shape} meshes need at least {S} layers")
                continue
            if self.stages is not None and S != self.stages:
                continue
            if self.layer_counts is not None and len(self.layer_counts) != S:
                continue
            for B in self.microbatch_options():
                if self.model.global_batch % B:
                    continue
                costs = StageCosts(self.model, self.topology, shape, B, self.tables(shape), self.comm)
                if self.tensor is not None:
                    costs.configs = [c for c in costs.configs if c.tensor == self.tensor]
                if not costs.configs:
                    tensors = [t for t in divisors(shape.devices_per_host) if self.tensor in (None, t)]
                    refused = [self.model.tensor_refusal(t) for t in tensors]
                    if refused and all(refused):
                        # no tensor degree of the mesh splits the model's heads (or MLP)
                        why.setdefault(f"tensor {shape}", f"a {shape} mesh: {'; '.join(dict.fromkeys(refused))}")
                        continue
                    degrees = sorted({shape.size // t for t, r in zip(tensors, refused) if r is None})
                    others = "; ".join(dict.fromkeys(r for r in refused if r))
                    why.setdefault(f"split {shape} {B}", f"a micro-batch of {costs.micro_size} samples"
                                   f" ({format_count(B, 'micro-batch')}) does not split over d ="
                                   f" {'/'.join(map(str, degrees))}"
                                   f" replicas of a {shape} mesh" + (f" (other degrees: {others})" if others else ""))
                # chunked schedules are searched by stages/uniform.py; 1F1B stands in for the
                # least-memory message when nothing fits
                pair = PairProblem(costs, family(self.schedule if self.schedule not in VIRTUAL else "1f1b", S))
                if self.layer_counts is not None:
                    pair.fix_layers(self.layer_counts)
                if pair.possible:
                    out.append(pair)
        return out

    def impossible_message(self) -> str:
        """Why no (mesh, micro-batch count) pair is left: the reasons :meth:`pairs` met."""
        sizes = sorted({self.topology.num_devices // s.size for s in self.all_shapes()})
        what = f"{self.stages} stages" if self.stages is not None else "no plan"
        reasons = list(getattr(self, "_why", {}).values())
        shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
        return (f"{what}: not possible on '{self.topology.name}' with {self.model.num_layers} layers and a global"
                f" batch of {self.model.global_batch}" + (f": {shown}" if reasons else
                                                         f"; stage counts of its mesh shapes: {', '.join(map(str, sizes))}"))


def evaluate(plan: Partition, members: list[tuple[Bounds, Schedule]], relax: float, cutoff: float = math.inf,
             work: list[int] | None = None) -> Candidate | None:
    """Simulate the schedules of the family (``members``: :func:`_price`'s list) whose objective
    can beat ``cutoff``; the fastest, or None if none can.  ``relax``: the plan's relaxation
    R (:meth:`PairProblem.relaxation`).  ``work[0]`` counts the simulated tasks."""
    work = work if work is not None else [0]
    if not members:
        return None
    best: Candidate | None = None
    tried: dict[Schedule, float] = {}
    for bd, s in members:
        limit = min(cutoff, best.time if best else math.inf)
        if bd.value >= limit * (1 - TOLERANCE):
            continue
        if bd.partial:                            # priced only against a level (_price)
            bd = bounds(plan, s)
            if bd.value >= limit * (1 - TOLERANCE):
                continue
        run, tasks = pipeline_run(plan, s)        # exactly simulate_schedule's (fastsim.py)
        if bd.value > run.iteration_time * (1 + 1e-9):
            # the objective is proven to be a lower bound: a violation is a bug, said loudly
            raise PlannerError(f"objective {bd.value!r} above the simulated {run.iteration_time!r} for {plan}"
                               f" under {s}: please report")
        tried[s] = run.iteration_time
        work[0] += tasks
        if best is None or run.iteration_time < best.time:
            best = Candidate(plan, run, bd, members[0][0].value, relax)
    if best is not None:
        best.tried = tried
    return best


def _pair_key(pair: PairProblem) -> tuple:
    return pair.costs.shape, pair.B


def _cand_key(cand: Candidate) -> tuple:
    return cand.plan.costs.shape, cand.plan.costs.microbatches


class _Board:
    """The fastest simulated plan of each pair and the ``top`` fastest overall."""

    def __init__(self, top: int, gap: float = 0.0, tasks: float = math.inf, subspaces: float = math.inf):
        self.top = top
        self.gap = gap
        # what a pair may use unless it holds the fastest plan: simulated tasks, subspaces
        self.share = (tasks, subspaces)
        self.spent: dict[tuple, list[int]] = {}
        self.entries: dict[tuple, Candidate] = {}
        # per pair: the least lower bound of its plans left unexplored only because they
        # could improve the pair's listed entry by less than ``gap`` (or a CP-SAT time-out)
        self.loose: dict[tuple, float] = {}

    def add(self, cand: Candidate) -> None:
        key = _cand_key(cand)
        old = self.entries.get(key)
        if old is None or (cand.time, cand.plan.stages) < (old.time, old.plan.stages):
            self.entries[key] = cand

    def has(self, pair: PairProblem) -> bool:
        return _pair_key(pair) in self.entries

    def ranked(self) -> list[Candidate]:
        return sorted(self.entries.values(), key=lambda c: (c.time, c.plan.costs.shape, c.plan.costs.microbatches,
                                                            c.plan.stages))

    def threshold(self) -> float:
        r = self.ranked()
        return r[self.top - 1].time if len(r) >= self.top else math.inf

    def cutoff(self, pair: PairProblem) -> float:
        """A plan of ``pair`` matters only if it beats this (its pair's entry or the top-th)."""
        own = self.entries.get(_pair_key(pair))
        return min(own.time if own else math.inf, self.threshold())

    def level(self, pair: PairProblem) -> float:
        """Plans of ``pair`` with a lower bound at or above this are not explored.

        Exactly :meth:`cutoff` (less the tolerance), except for a pair that does not hold
        the fastest plan and either is listed (its plans are explored only if they could
        improve its entry by more than ``gap``) or has used its share of the budgets
        (only plans that could beat the fastest are).  The fastest plan stays exact; what was not
        explored is kept as the pair's lower bound (:meth:`unexplored`)."""
        loose = self._loose(pair)
        return self.cutoff(pair) * (1 - TOLERANCE) if loose is None else loose

    def search_cutoff(self, pair: PairProblem) -> float:
        """The cutoff a subspace of ``pair`` is solved with: a plan below it matters."""
        loose = self._loose(pair)
        return self.cutoff(pair) if loose is None else loose / (1 - TOLERANCE)

    def _loose(self, pair: PairProblem) -> float | None:
        k = _pair_key(pair)
        own = self.entries.get(k)
        used = self.spent.get(k, (0, 0))
        if used[0] >= self.share[0] or used[1] >= self.share[1]:
            wanted = -math.inf          # out of its budget: only what could beat the fastest plan
        elif self.gap > 0 and own is not None and own.time <= self.threshold():
            wanted = own.time * (1 - self.gap)
        else:
            return None
        if not self.entries:
            return None
        exact = self.cutoff(pair) * (1 - TOLERANCE)
        best = min(c.time for c in self.entries.values())
        level = max(wanted, best * (1 - TOLERANCE))
        return level if level < exact else None

    def spend(self, pair: PairProblem, tasks: int = 0, subspaces: int = 0) -> None:
        used = self.spent.setdefault(_pair_key(pair), [0, 0])
        used[0] += tasks
        used[1] += subspaces

    def drop(self, pair: PairProblem, key: float) -> None:
        """``key`` (a lower bound of plans of ``pair``) is dropped at :meth:`level`: keep it
        if the exact cutoff would have explored it."""
        if key < self.cutoff(pair) * (1 - TOLERANCE):
            self.leave(pair, key)

    def leave(self, pair: PairProblem, key: float) -> None:
        k = _pair_key(pair)
        self.loose[k] = min(self.loose.get(k, math.inf), key)

    def unexplored(self, cand: Candidate) -> float:
        """The least time of the plans of ``cand``'s pair not simulated: a lower bound."""
        return self.loose.get(_cand_key(cand), math.inf)


def plan_partition(search: StageSearch, method: str = "auto", time_limit: float = 10.0, seed: int = 0,
                   top: int = 1, budget: int = DEFAULT_BUDGET, simulations: int = DEFAULT_SIMULATIONS,
                   incumbents: list[Candidate] | None = None,
                   progress: Callable[[str], None] | None = None,
                   top_gap: float = DEFAULT_TOP_GAP, gap: float = DEFAULT_GAP) -> SolveResult[Candidate]:
    """The fastest simulated plan over all pairs (and the ``top`` fastest, one per pair).

    ``gap`` (relative): once the fastest plan is proven within it and the bound of what is
    left has stopped rising (``STALL`` subspaces without a rise of ``RISE``), the search
    stops (FEASIBLE with its gap; 0: only OPTIMAL or the budgets stop it).

    The fastest plan is exact (OPTIMAL when proved).  Each other listed plan is its pair's
    best within ``top_gap`` (relative): proving near-identical plans of every listed pair
    apart is most of the work of a list, and what it would change is below what the
    simulator can promise.  Every listed plan carries ``pair_bound``, the lower bound that
    proves its gap; ``top_gap=0`` lists every pair's best exactly."""
    if not 0 <= top_gap < 1:
        raise OptionError(f"the gap allowed in a --top list must be in [0, 1), got {top_gap!r}")
    if not 0 <= gap < 1:
        raise OptionError(f"the gap the stage search may stop at must be in [0, 1), got {gap!r}")
    if method not in METHODS:
        raise OptionError(unknown_choice("method", method, METHODS))
    with Stopwatch() as sw:
        pairs = search.pairs()
        if not pairs:
            raise InfeasibleError(search.impossible_message())
        bound = active_bound()
        if bound is not None:       # under a command's memory bound: refuse before building tables
            check_memory(stages_estimate(search.model.num_layers, [(len(p.configs), p.S) for p in pairs]),
                         "this stage search", bound)
        chosen = "dp" if method == "auto" else method
        _guard(chosen, pairs)
        # A pair that does not hold the fastest plan closes its gap with a top-th of one
        # plan's simulation budget and of the subspace budget: the fastest plan, which must
        # be proved, keeps the rest.  Measured on GPT-3 175B / 1 024 GPUs, --top 10: with a
        # whole plan's budget per pair, 94 of 102 simulations improved one listed entry by
        # 0.24% (10 s); with these shares the list is the same within that (1.5 s).
        board = _Board(max(1, top), top_gap, tasks=simulations // max(1, top),
                       subspaces=max(1, budget // max(1, top)))
        for cand in incumbents or []:
            if any(p.costs.shape == cand.plan.costs.shape and p.B == cand.plan.costs.microbatches for p in pairs):
                board.add(cand)
        info = {"pairs": len(pairs), "solver": chosen, "method_requested": method, "stop_gap": gap}
        if search.uniform is not None:
            chosen = info["solver"] = "uniform"
            bound, proven, empty = _uniform(search, pairs, board, progress, info)
        elif chosen == "brute-force":
            bound, proven, empty = _brute_force(pairs, board, progress, info)
        elif chosen == "greedy":
            bound, proven, empty = _greedy(pairs, board, progress, info)
        else:
            # the simulation budget is per listed plan
            bound, proven, empty = _branch_and_bound(pairs, board, chosen, time_limit, seed, budget,
                                                     simulations * max(1, top), progress, info, gap)
    ranked = board.ranked()
    if not ranked:
        if empty:
            raise _shortfall(search, pairs)
        if chosen == "greedy":
            # greedy tries one balanced plan per pair and has no budget to raise
            raise UnknownError("no plan found: none of the balanced plans greedy tries (one per mesh shape and"
                               " micro-batch count) fits in memory, and none was proven impossible; use --method"
                               " dp, which searches every split", bound=bound)
        if "coarse" in info:
            # the likelier reason: no block-aligned plan fits, and the others were not searched
            raise UnknownError(f"no plan found: past {EXACT:,} layers stages start on block boundaries only (Alpa's"
                               " operator clustering) and none of those plans was found to fit; plans cutting"
                               " inside blocks were not searched: give the layers per stage with --split",
                               bound=bound)
        advice = ("raise --time-limit / --budget / --sim-budget or use --method dp" if chosen == "cp-sat"
                  else "raise --budget / --sim-budget")
        raise UnknownError(f"no plan found within the limits ({_limits(chosen, time_limit, budget)}) and none was"
                           f" proven impossible; {advice}", bound=bound)
    best = ranked[0]
    bound = min(bound, best.time)
    # OPTIMAL: no plan left unsimulated can beat the best (the list of ``top`` may be unproven)
    status = Status.OPTIMAL if bound >= best.time * (1 - TOLERANCE) else Status.FEASIBLE
    listed = ranked[:max(1, top)]
    if chosen != "greedy":
        # copies: an incumbent may be listed by the search it came from too
        listed = [dataclasses.replace(c, pair_bound=min(c.time, board.unexplored(c))) for c in listed]
        best = listed[0]
        worst = max((c.time - c.pair_bound) / c.time for c in listed)
        keys = {_cand_key(c) for c in listed}
        # no plan of a pair not listed is faster than this, nor than the last listed plan
        # (what was dropped exactly could not beat it): which pairs are listed is proven
        # when this is not below the last one (or infinite, when fewer are listed)
        others = min((v for k, v in board.loose.items() if k not in keys), default=math.inf)
        full = len(ranked) >= max(1, top)
        info["listed_gap"] = worst      # the largest pair_gap of the list (not --top-gap, the one allowed)
        # reported as what it bounds on its own: with a full list, the plans dropped exactly
        # are only known not to beat the last listed plan
        info["unlisted_bound"] = min(others, listed[-1].time) if full else others
        info["top_proven"] = (proven and worst <= TOLERANCE
                              and (others == math.inf or (full and others >= listed[-1].time * (1 - TOLERANCE))))
    else:
        info["top_proven"] = False
    return SolveResult(status, chosen, best, best.time, bound, sw.seconds, solutions=listed, info=info)


def _limits(method: str, time_limit: float, budget: int) -> str:
    if method == "cp-sat":
        return f"CP-SAT deterministic time {time_limit:g} per subspace, {budget} subspaces"
    return f"{budget} subspaces"


def _guard(method: str, pairs: list[PairProblem]) -> None:
    """Refuse, before starting, what the method cannot finish."""
    if method in ("cp-sat", "brute-force") and any(p.coarse for p in pairs):
        raise RefusedError(f"--method {method} searches every cut, and {pairs[0].L:,} layers are more than"
                           f" {EXACT:,}: use --method dp (stages then start on block boundaries)")
    if method == "brute-force":
        total = sum(count_plans(p) for p in pairs)
        if total > BRUTE_FORCE_LIMIT:
            raise RefusedError(f"brute force would price {total:,} plans (limit {BRUTE_FORCE_LIMIT:,}); use --method"
                               f" dp (exact) or narrow the search with --stages / --config")
    if method == "cp-sat":
        worst = max(pairs, key=lambda p: p.S * len(p.configs) * p.n * p.n)
        if worst.sparse:
            raise RefusedError(f"the CP-SAT model of {worst.label()} would have more than"
                               f" {PairProblem.DENSE_CELLS:,} cells; use --method dp (exact)")
        cells = model_size(worst)
        if cells > CPSAT_MAX_CELLS:
            raise RefusedError(f"the CP-SAT model would have {cells:,} Booleans for {worst.label()} (limit"
                               f" {CPSAT_MAX_CELLS:,}); use --method dp (exact) or narrow the search with --stages")


def _report(progress, text: str) -> None:
    if progress is not None:
        progress(text)


def _price(plan: Partition, schedules: list[Schedule], enough: float = math.inf) -> list[tuple[Bounds, Schedule]]:
    """The bounds of every schedule of the family that fits, least first (``enough``: see
    :func:`~solver_planner.stages.objective.bounds`; only for plans dropped at it)."""
    memo: dict = {}                   # what the schedules share (objective.bounds)
    return sorted(((bounds(plan, s, enough, memo), s) for s in schedules if fits(plan, s, memo)),
                  key=lambda m: (m[0].value, m[1]))


DIVE = 16   # subspaces solved between simulations of the most promising priced plan
SPLIT_AFTER = 16   # subspaces of a pair solved before its plans are split by PairProblem.variants


def _branch_and_bound(pairs: list[PairProblem], board: _Board, method: str, time_limit: float, seed: int,
                      budget: int, simulations: int, progress, info: dict, gap: float = 0.0
                      ) -> tuple[float, bool, bool]:
    """Subspaces (keyed by a bound of R) and priced plans (keyed by O) in two heaps.

    The least key of both is a lower bound of every plan not simulated yet.  A priced plan
    is simulated when its key is the least one, or every ``DIVE`` subspaces when it can still
    beat the best (a good incumbent early prunes more).  Returns (least bound left, proven,
    every pair proven empty)."""
    subs: list[tuple[float, int, Subspace]] = []
    plans: list[tuple[float, int, tuple]] = []
    counter = itertools.count()
    for pair in pairs:
        lb = cheap_bound(pair.costs)
        heapq.heappush(subs, (lb, next(counter), Subspace(pair, bound=lb)))
    open_bound = math.inf          # subspaces a method could not settle (CP-SAT time-outs)
    solved = sims = since = 0
    least_o = math.inf             # the least objective of the plans priced so far
    tasks = [0]
    found = False
    last_floor, stalled = None, 0    # the bound of what is left when it last rose, once out of tasks
    last = time.monotonic()
    started = time.perf_counter()
    tries: dict[int, int] = {}      # id(pair) -> its subspaces solved
    peak, calm = -math.inf, 0       # the bound of what is left at its last rise, subspaces since
    floor_coarse = None             # the least bound of the cuts coarse pairs do not search
    split: dict[int, PairProblem] = {}      # the variants pairs were split into, by id

    def simulate(item, cutoff: float) -> None:
        nonlocal sims, since
        pair, plan, priced, relax = item
        before = tasks[0]
        # schedules at or above the pair's level are not simulated (nor fully priced)
        cutoff = min(cutoff, board.search_cutoff(pair))
        cand = evaluate(plan, priced, relax, cutoff, tasks)
        board.spend(pair, tasks[0] - before)
        since = 0
        if cand is not None:
            sims += len(cand.tried)
            board.add(cand)
        # schedules of the family left out at the pair's level (not because this plan's
        # own best beat them) are plans not explored: keep their bound (helper-11's review:
        # the level rises when the pair leaves the list, and nothing else would cover them)
        tried = cand.tried if cand is not None else {}
        for bd, s in priced:
            if s not in tried and bd.value >= cutoff * (1 - TOLERANCE):
                board.drop(pair, bd.value)

    while subs or plans:
        # drop what cannot beat its pair's cutoff
        while subs and subs[0][0] >= board.level(subs[0][2].pair):
            key, _, sub = heapq.heappop(subs)
            board.drop(sub.pair, key)
        while plans and plans[0][0] >= board.level(plans[0][2][0]):
            key, _, item = heapq.heappop(plans)
            board.drop(item[0], key)
        if "objective_proven_after" not in info and least_o < math.inf and (not subs or subs[0][0] >= least_o):
            # every plan not priced yet has R (<= O) at least the least O priced (or cannot
            # beat the best simulated time, which is above it): the least objective is proven
            info["objective_proven_after"] = time.perf_counter() - started
            info["least_objective"] = least_o
        if not subs and not plans:
            break
        out_of_tasks = tasks[0] >= simulations
        if out_of_tasks:
            # nothing found from here on is simulated, but solving subspaces still raises the
            # bound of what is left (the 1T model on 1 024 GPUs: a 29.7% gap became 3.3%):
            # go on while it rises, and stop after STALL subspaces that raised it by less than RISE
            floor = min(subs[0][0] if subs else math.inf, plans[0][0] if plans else math.inf)
            if last_floor is None or floor > last_floor + RISE * abs(last_floor):
                last_floor, stalled = floor, 0
            if not subs or subs[0][0] >= (plans[0][0] if plans else math.inf) or stalled >= STALL:
                break
            stalled += 1
        plan_first = not out_of_tasks and plans and (not subs or plans[0][0] <= subs[0][0] or since >= DIVE)
        if plan_first:
            key, _, item = heapq.heappop(plans)
            simulate(item, board.cutoff(item[0]))
            continue
        if not subs:
            break
        if solved >= budget:
            break
        if gap > 0 and board.entries:
            # a plateau of subspaces at one bound (plans the programs price alike) is left once
            # the fastest plan is proven within ``gap``: on GPT-3 175B on 100 000 GPUs under
            # eager-1F1B the gap is 0.58% after 65 subspaces, and the 2 000 of the budget end
            # there too (56 s against 5.3 s)
            now = min(subs[0][0], plans[0][0] if plans else math.inf, min(board.loose.values(), default=math.inf))
            if now > peak + RISE * abs(peak) or peak == -math.inf:
                peak, calm = now, 0
            elif calm >= STALL:
                if floor_coarse is None:
                    floor_coarse = min((fine_bound(p, math.inf) for p in pairs if p.coarse), default=math.inf)
                best = board.ranked()[0].time
                if best - min(now, floor_coarse) <= gap * best:
                    info.update(stopped_at_gap=gap, stall=STALL, rise=RISE)
                    break
        key, _, sub = heapq.heappop(subs)
        pair = sub.pair
        if method == "dp" and tries.get(id(pair), 0) >= SPLIT_AFTER and pair.variants():
            # a pair the search keeps coming back to: each of its subspaces becomes the same
            # subspace of every variant (tighter R; their tables are built only for pairs
            # where the search spends more than a few subspaces)
            for v in pair.variants():
                split[id(v)] = v
                heapq.heappush(subs, (key, next(counter), Subspace(v, sub.prefix, sub.excluded, sub.bound)))
            continue
        tries[id(pair)] = tries.get(id(pair), 0) + 1
        calm += 1
        # a plan matters below the pair's level (the exact cutoff but for listed pairs'
        # gap and shares); what is cut between the two is kept as the pair's bound
        cutoff = board.search_cutoff(pair)
        solved += 1
        since += 1
        board.spend(pair, subspaces=1)
        if progress is not None and time.monotonic() - last > 0.1:
            last = time.monotonic()
            best = board.ranked()
            _report(progress, f"{pair.label()}: subspace {solved}, bound {key:.4g} s"
                              f"{', best %.4g s' % best[0].time if best else ''}, {sims} simulated")
        if (not sub.prefix and not sub.excluded and not pair.sparse and not pair.coarse
                and pair.least_memory()[0] > pair.costs.device_memory):
            continue                    # no plan of the pair fits: proven without pricing any
        if method == "dp":
            lo, stages = pair.minimize(sub, cutoff)
            settled = True
        else:
            status, lo, stages = minimize_cpsat(pair, sub, cutoff, time_limit, seed)
            settled = status in (Status.OPTIMAL, Status.INFEASIBLE)
            if not settled and stages is None:
                open_bound = min(open_bound, lo)
                board.leave(pair, lo)
                continue
        if stages is None:
            board.drop(pair, lo)        # no plan below the level: lo bounds them all
            continue
        found = True
        plan = pair.plan(stages)
        # a schedule whose bound reaches the level is not simulated unless the level rises
        # (a pair pushed out of the list is exact again; evaluate() then prices it in full)
        priced = _price(plan, pair.schedules, board.level(pair))
        if priced:
            least_o = min(least_o, priced[0][0].value)
            item = (pair, plan, priced, pair.relaxation(stages))
            if len(board.entries) < board.top and not board.has(pair) and tasks[0] < simulations:
                # until ``top`` pairs have a simulated plan, a pair's first plan is simulated
                # at once: the times found give every subspace a finite cutoff
                simulate(item, cutoff)
            else:
                heapq.heappush(plans, (priced[0][0].value, next(counter), item))
        child_bound = lo if settled else sub.bound
        for child in sub.children(stages, child_bound):
            heapq.heappush(subs, (child.bound, next(counter), child))
    if not board.entries:
        # out of budget before any simulation: simulate the best priced plan left, if any
        while plans and not board.entries:
            simulate(heapq.heappop(plans)[2], math.inf)
    for key, _, sub in subs:
        board.leave(sub.pair, key)
    for key, _, item in plans:
        board.leave(item[0], key)
    unsearched = _coarse_bounds(pairs, board, info)
    # every plan not simulated is now under some pair's bound (what was left for the list's
    # gap is above the fastest plan, but a bound all the same)
    left = min(board.loose.values(), default=math.inf)
    info.update({"subspaces": solved, "simulations": sims, "simulated_tasks": tasks[0],
                 "dp_runs": sum(p.dp_runs for p in pairs + list(split.values())),
                 "budget_exhausted": bool(subs or plans) and "stopped_at_gap" not in info})
    proven = not subs and not plans and open_bound == math.inf and not unsearched
    empty = not found and proven
    return left, proven, empty


def _coarse_bounds(pairs: list[PairProblem], board: _Board, info: dict) -> bool:
    """Pairs whose stages start on block boundaries only (deep models, :mod:`.coarse`): their
    plans cutting inside blocks were not searched, so each such pair keeps the bound of
    every cut (:func:`.coarse.fine_bound`) where it is below what the pair must beat.
    True when some pair keeps one."""
    coarse = [p for p in pairs if p.coarse]
    if not coarse:
        return False
    kept = False
    least = math.inf
    for pair in coarse:
        top = board.cutoff(pair)
        # not capped at top: the same bound whatever the board holds (check reruns the
        # search with the plan's own time as an incumbent)
        bound = fine_bound(pair, math.inf)
        least = min(least, bound)
        if bound < top * (1 - TOLERANCE):
            board.leave(pair, bound)
            kept = True
    info["coarse"] = {"pairs": len(coarse), "layers": coarse[0].L,
                      "blocks": sorted({len(p.pos) - 1 for p in coarse}), "bound": least}
    return kept


def _brute_force(pairs: list[PairProblem], board: _Board, progress, info: dict) -> tuple[float, bool, bool]:
    priced = sims = 0
    empty = True
    for n, pair in enumerate(pairs):
        _report(progress, f"{pair.label()}: pair {n + 1}/{len(pairs)}")
        plans = []
        for stages in all_plans(pair):
            plan = pair.plan(stages)
            members = _price(plan, pair.schedules)
            plans.append((members[0][0].value if members else math.inf, stages, plan, members))
        priced += len(plans)
        empty &= not plans
        for value, stages, plan, members in sorted(plans, key=lambda e: (e[0], e[1])):
            cutoff = board.cutoff(pair)
            if value >= cutoff * (1 - TOLERANCE):
                break
            cand = evaluate(plan, members, pair.relaxation(stages), cutoff)
            if cand is not None:
                sims += len(cand.tried)
                board.add(cand)
    info.update({"plans_priced": priced, "simulations": sims})
    return math.inf, True, empty


def _uniform(search: StageSearch, pairs: list[PairProblem], board: _Board, progress, info: dict
             ) -> tuple[float, bool, bool]:
    """Every uniform plan, by increasing bound, to the cutoff (:mod:`.uniform`): exact."""
    def one(plan: Partition, s: Schedule, bd: Bounds) -> None:
        run, tasks = pipeline_run(plan, s)
        if bd.value > run.iteration_time * (1 + 1e-9):
            raise PlannerError(f"objective {bd.value!r} above the simulated {run.iteration_time!r} for {plan}"
                               f" under {s}: please report")
        board.add(Candidate(plan, run, bd, bd.value, bd.value, {s: run.iteration_time}))

    refused: dict[str, int] = {}
    least: dict = {}
    priced, sims, empty = search_uniform(pairs, search.uniform, board, one, progress,
                                         splits=search.splits, allows=search.allows, refused=refused, least=least)
    if not priced and refused:
        # every plan of the space breaks a rule of the framework: say which, most common first
        # (each plan counted under the first rule it breaks, so fixing one reason may show
        # another: all are named, most common first)
        why = sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))
        total = sum(refused.values())
        if len(why) == 1:
            raise InfeasibleError(f"{search.space} runs none of the {total} uniform plans: {why[0][0]}")
        raise InfeasibleError(f"{search.space} runs none of the {total} uniform plans; the first rule each breaks: "
                              + "; ".join(f"{reason} ({n} plans)" for reason, n in why))
    if not priced:
        raise InfeasibleError(f"no plan of the {search.space} space on these meshes: {why_none(pairs, search.uniform)}")
    if empty and not board.ranked() and least:
        # the schedule's own plans need more than the 1F1B plan _shortfall would name
        # (chunked schedules keep more activations)
        plan = least["plan"]
        raise _memory_shortfall(search.topology.device, least["peak"], f"{format_count(plan.costs.stages, 'stage')} on"
                                f" {plan.costs.shape} meshes, {format_count(plan.costs.microbatches, 'micro-batch')},"
                                f" {least['schedule']}")
    info.update({"plans_priced": priced, "simulations": sims, "space": search.space})
    return math.inf, True, empty


def _greedy(pairs: list[PairProblem], board: _Board, progress, info: dict) -> tuple[float, bool, bool]:
    sims = 0
    for n, pair in enumerate(pairs):
        _report(progress, f"{pair.label()}: pair {n + 1}/{len(pairs)}")
        stages = balanced_greedy(pair)
        if stages is None:
            continue
        plan = pair.plan(stages)
        cand = evaluate(plan, _price(plan, pair.schedules), pair.relaxation(stages))   # None if nothing fits
        if cand is not None:
            sims += len(cand.tried)
            board.add(cand)
    info.update({"simulations": sims})
    bound = min(cheap_bound(p.costs) for p in pairs)
    empty = all(p.least_memory()[0] > p.costs.device_memory for p in pairs)
    return bound, False, empty


def _shortfall(search: StageSearch, pairs: list[PairProblem]) -> InfeasibleError:
    """No plan fits: the least memory any plan needs, over every pair (exact, or a lower bound
    where a pair is large: :func:`.coarse.least_memory_floor`)."""
    best, where = math.inf, None
    for pair in pairs:
        peak, stages = pair.least_memory()
        if peak < best:
            best, where = peak, (pair, stages)
    device = search.topology.device
    if where is None:
        return InfeasibleError(f"no stage plan fits in {_memory_text(device)} per device")
    pair, _ = where
    # a large or coarse pair's least is a lower bound over every split (coarse.py), not a plan's
    return _memory_shortfall(device, best, f"{format_count(pair.S, 'stage')} on {pair.costs.shape} meshes,"
                                           f" {format_count(pair.B, 'micro-batch')}",
                             at_least=pair.sparse or pair.coarse)


def _gib(n: float) -> str:
    """A memory size in GiB to two places, or in the unit that shows it below 0.01 GiB
    (a spec's ``memory: 80`` is 80 bytes, which "0.00 GiB" hid)."""
    return f"{n / 2**30:.2f} GiB" if n >= 0.01 * 2**30 else format_bytes(n)


def _memory_text(device) -> str:
    """The memory plans may fill, with the reserve spelled out when the spec sets one."""
    if not device.reserved:
        return _gib(device.memory)
    return f"{_gib(device.budget)} ({_gib(device.memory)} less device.memory_reserved {_gib(device.reserved)})"


def _memory_shortfall(device, peak: float, what: str, at_least: bool = False) -> InfeasibleError:
    """The refusal when no plan fits: the least any plan needs (``what``: which plan) and
    how far that is over what the device's memory leaves plans (:attr:`Device.budget`)."""
    short = f"needs{' at least' if at_least else ''} {_gib(peak)} per device, {_gib(peak - device.budget)} short"
    return InfeasibleError(f"no stage plan fits in device memory ({_memory_text(device)}): the plan needing least"
                           f" ({what}) {short}", shortfall=short)
