"""Uniform plans: one configuration on every stage, layers split by a rule, any schedule.

What interleaved 1F1B and ZB-V plan over (model chunks, :mod:`.schedule`), and what a
framework target runs (:mod:`solver_planner.targets`): Megatron-LM, torchtitan and DeepSpeed
give every pipeline stage the same tensor degree, recomputation and micro-batch, and cut the
transformer blocks into equal parts.  The space is small (mesh shapes x micro-batch counts x
configurations x chunk counts x splits), so it is searched exactly: every plan gets the
objective's proven lower bound (:mod:`.objective`), plans are simulated by increasing bound,
and the search stops when the next bound reaches the ``top``-th best simulated time.  The
result is OPTIMAL over this space; it says nothing of plans outside it (the native search's
per-stage configurations and uneven splits), which the command line says in its output.

The split rule: when the model is a transformer (an ``embed`` layer first and a ``logits``
layer last), the blocks between are shared out equally over the chunks, the embedding going
with the first chunk and the logits with the last; otherwise all layers are.  A target may
add its own splits (Megatron's fewer blocks on the first and last stage).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np

from .objective import bounds, fits, peak_memory
from .partition import Partition, StagePlan
from .costs import StageCosts
from .problem import PairProblem
from .schedule import Schedule, mesh_of, virtual_options, family

__all__ = ["block_range", "equal_split", "uniform_plans", "search_uniform", "why_none", "work_bound", "has_plans"]


def block_range(layers) -> tuple[int, int]:
    """(first, last) index of the layers a split shares out: a transformer's blocks, or all."""
    n = len(layers)
    if n >= 3 and layers[0].name == "embed" and layers[-1].name == "logits":
        return 1, n - 2
    return 0, n - 1


def equal_split(layers, chunks: int, first_last: int | None = None) -> list[int] | None:
    """Layers per chunk with the blocks shared out equally (None when they do not divide);
    ``first_last``: the first and the last chunk hold that many blocks, the others equally."""
    a, b = block_range(layers)
    blocks = b - a + 1
    if first_last is None:
        if blocks % chunks:
            return None
        counts = [blocks // chunks] * chunks
    else:
        mid = blocks - 2 * first_last
        if chunks < 3 or first_last < 1 or mid <= 0 or mid % (chunks - 2):
            return None
        counts = [first_last] + [mid // (chunks - 2)] * (chunks - 2) + [first_last]
    counts[0] += a
    counts[-1] += len(layers) - 1 - b
    return counts


def _schedules(kind: str, S: int, blocks: int, B: int) -> list[Schedule]:
    if kind in ("interleaved-1f1b", "zb-v"):
        return [Schedule(kind, virtual=v) for v in virtual_options(kind, S, blocks, B)]
    return family(kind, S)


def has_plans(layers, S: int, B: int, kinds: list[str],
              splits: Callable[[list, int], list[list[int]]] | None = None) -> bool:
    """Whether the uniform space has a plan of ``S`` stages and ``B`` micro-batches at all:
    some schedule of ``kinds`` with a layer split (what :func:`uniform_plans` loops over,
    before configurations; a framework's ``allows`` may still refuse them)."""
    a, b = block_range(layers)
    for kind in kinds:
        for s in _schedules(kind, S, b - a + 1, B):
            K = S * s.virtual
            if splits(layers, K) if splits else equal_split(layers, K):
                return True
    return False


def uniform_plans(pair: PairProblem, kinds: list[str],
                  splits: Callable[[list, int], list[list[int]]] | None = None,
                  allows: Callable[[Partition, Schedule], str | None] | None = None,
                  refused: dict[str, int] | None = None, configs: list | None = None):
    """Every uniform plan of ``pair`` under the schedules ``kinds`` stand for: (plan, schedule).
    ``allows`` returns why a plan is not run (None: it is); ``refused`` counts the reasons;
    ``configs``: only plans of these configurations (default: every one of the pair)."""
    c = pair.costs
    layers = c.model.layers
    a, b = block_range(layers)
    S, B = c.stages, c.microbatches
    for kind in kinds:
        for s in _schedules(kind, S, b - a + 1, B):
            K = S * s.virtual
            cuts = splits(layers, K) if splits else [x for x in [equal_split(layers, K)] if x]
            mesh = tuple(mesh_of(s, S, k) for k in range(K))
            for counts in cuts:
                edges = [0]
                for n in counts:
                    edges.append(edges[-1] + n)
                for cfg in c.configs if configs is None else configs:
                    plan = Partition(c, [StagePlan(edges[k], edges[k + 1] - 1, cfg) for k in range(K)], mesh)
                    why = allows(plan, s) if allows is not None else None
                    if why is None:
                        yield plan, s
                    elif refused is not None:
                        refused[why] = refused.get(why, 0) + 1


def why_none(pairs: list[PairProblem], kinds: list[str]) -> str:
    """Why the uniform space of ``pairs`` holds no plan at all (the rules of the schedules
    that define it), for the refusal the search prints instead of a memory shortfall."""
    layers = pairs[0].costs.model.layers
    a, b = block_range(layers)
    blocks = b - a + 1
    stages = sorted({p.costs.stages for p in pairs})
    counts = ", ".join(map(str, stages))
    rules = []
    for kind in kinds:
        if kind == "zb-v":
            rules.append(f"ZB-V cuts the {blocks} blocks into 2 chunks per stage of at least one block each"
                         f" (2 x stages <= {blocks}; stage counts here: {counts})")
        elif kind == "interleaved-1f1b":
            rules.append(f"interleaved 1F1B needs at least 2 stages, at least 2 chunks per stage of at least one"
                         f" of the {blocks} blocks, and micro-batches in whole rounds of the stages (stage counts"
                         f" here: {counts})")
        else:
            rules.append(f"{kind} shares the {blocks} blocks out equally over the stages (stage counts here:"
                         f" {counts})")
    return "; ".join(rules)


def work_bound(c: StageCosts) -> float:
    """A lower bound of the simulated iteration of every plan on ``c``'s pair, under any
    schedule, from the layer times alone (no plan, no gradient programs): every micro-batch
    passes every layer forward and backward on some stage, so the ``S`` stages' exec
    resources hold at least ``B W`` seconds, ``W`` the least work of one micro-batch over the
    configurations; the busiest holds at least ``B W / S``."""
    if not c.configs:
        return math.inf
    work = np.min([f + a + w for f, a, w in (c.layer_times(cfg) for cfg in c.configs)], axis=0)
    return c.microbatches * float(work.sum()) / c.stages


def config_bound(c: StageCosts, cfg) -> float:
    """:func:`work_bound` of the plans whose every stage runs ``cfg`` (a uniform plan's one
    configuration): ``B W / S`` with ``W`` that configuration's work of one micro-batch."""
    f, a, w = c.layer_times(cfg)
    return c.microbatches * float((f + a + w).sum()) / c.stages


def search_uniform(pairs: list[PairProblem], kinds: list[str], board, evaluate_one, progress=None,
                   splits=None, allows=None, refused: dict[str, int] | None = None,
                   least: dict | None = None) -> tuple[int, int, bool]:
    """Simulate the uniform plans of ``pairs`` by increasing lower bound until the next bound
    reaches ``board``'s cutoff (:class:`.search._Board`); ``evaluate_one(plan, schedule,
    bounds)`` simulates one and adds it.  ``least`` receives the plan that does not fit with
    the least peak memory (``peak``, ``plan``, ``schedule``): a schedule's own shortfall.
    Returns (plans priced, plans simulated, none fits)."""
    # pairs enter the heap with a bound of all their plans (work_bound), and are priced plan
    # by plan only when that bound comes to the top: pairs that cannot reach the board
    # build no gradient-program tables and bound no plans
    # pairs enter the heap with a bound of all their plans (work_bound); when it comes to the
    # top, a pair is split into its configurations, each with the same bound of its own plans
    # (config_bound), and a configuration's plans are priced only when that comes to the top:
    # pairs and configurations that cannot reach the board bound no plans and build no
    # gradient-program tables.  Entries: (bound, order, pair, configuration, plan, schedule, bounds).
    heap: list = [(work_bound(pair.costs), -1, i, None, None, None, None) for i, pair in enumerate(pairs)]
    heapq.heapify(heap)
    n = 0
    sims = 0
    empty = True
    while heap:
        value, k, i, cfg, plan, s, bd = heapq.heappop(heap)
        if value >= board.threshold() * (1 - 1e-9):
            break
        if value >= board.cutoff(pairs[i]) * (1 - 1e-9):
            continue
        if cfg is None:
            for j, c in enumerate(pairs[i].costs.configs):
                heapq.heappush(heap, (max(config_bound(pairs[i].costs, c), value), -1, i, (j, c), None, None, None))
            continue
        if plan is None:
            pair = pairs[i]
            if progress:
                progress(f"{pair.label()}: pricing uniform plans")
            for plan, s in uniform_plans(pair, kinds, splits, allows, refused, configs=[cfg[1]]):
                # priced without the port bound (the costly part): still a lower bound; the
                # port bound is added when the plan reaches the top of the heap (lazily re-keyed)
                bd = bounds(plan, s, enough=0.0)
                heapq.heappush(heap, (max(bd.value, value), n, i, cfg, plan, s, bd))
                n += 1
            continue
        if bd.partial:
            bd = bounds(plan, s)
            if bd.value > value:
                heapq.heappush(heap, (bd.value, k, i, cfg, plan, s, bd))
                continue
        if not fits(plan, s):
            if least is not None and empty:
                peak = peak_memory(plan, s)
                if peak < least.get("peak", math.inf):
                    least.update(peak=peak, plan=plan, schedule=s)
            continue
        empty = False
        evaluate_one(plan, s, bd)
        sims += 1
    return n, sims, empty
