"""One (mesh shape, micro-batch count) pair: its plans, and exact dynamic programs over them.

``R = max(R1, ..., R5)`` relaxes the objective of :mod:`.objective` so that contiguous stages
can be handled by dynamic programs, each exact for its own part:

* R1, the stage bound's fill and drain through the first stage: ``max_p (T2_p, A_p + T1_p)``
  with ``A`` growing along the stages (``INC1``);
* R2, the fill before a stage's own gradient tail: ``max_p (H_p + T2_p)``, ``H`` growing by
  ``INC2 = f + x(p->p+1)`` (a stage holding a tied copy also waits for its all-reduce,
  :meth:`PairProblem._tie_floor`);
* R3, the cycle and phase bounds of the 1F1B family, which need the round trip through the
  *later* stages: a backward program whose accumulator ``Y`` grows by ``INC3``; each stage's
  term also counts the fill before its first forward (R2's ``H``; without it, deep pipelines
  lost their late stages' cycle terms: GPT-3 175B on 4 096 GPUs stopped at a 4.8% gap, now
  0.6%), or the fill and the drain together in place of the stage's own tail: the
  objective's drain ``D_p`` runs back through the earlier stages' chain ops from whichever
  tail ends last (:meth:`PairProblem._drains`; on GPT-3 175B on 16 384 GPUs, 32 stages and
  24 micro-batches, R3 of the best plan rose from 2.26 s to 2.49 s and the gap fell from
  13.7% to 3.9%).  Besides the cycle and the phase, each term reads the windows of the
  neighbour cycle (:mod:`.neighbor`), each later stage of a window at the least any of its
  cells costs (the 1T model on 1 024 GPUs: gap 3.3% to 0.6%), or, counted, at the least
  the units it must hold cost: the stages after the window can hold only so many units
  under the limit the programs run at, so the window holds the rest
  (:meth:`PairProblem._window_sums`; the 1T model on 4 096 GPUs, 64 stages of two layers:
  gap 2.5% to 0.3%).  A whole plan's R counts them at the least limit on the grid that
  admits it, never above what the programs count.  The fill (and the drain)
  grow forwards and the round trip backwards, so the programs test
  each cell with the least fill reaching it and the least round trip after it (a necessary
  condition, :meth:`PairProblem._ymaxes`), and whole plans exactly;
* R4, the port bound's head, load and tail, per class of ports: a forward and a backward
  program per class (:meth:`PairProblem._port_loads`, :meth:`PairProblem._port_masks`).  The
  tail is the drain through the earlier stages, a sum over stages too (on random instances
  of 16 devices it proved OPTIMAL in 1.3 s what took 7.5 s: most plans the programs found
  had a port bound above the best time only by their tail);
* R5, the neighbour cycle (:mod:`.neighbor`: a slow link between two stages paces both)
  and the link bound (:mod:`.link`: a link whose transfers outlast the stages' ops, played
  out with the two stages), with the round trip through the next stage only, after R3's
  fill and drain (or, for the link bound's end at either stage's own tail, R2's fill): terms
  per pair of neighbouring stages, so its program keeps the cells reachable forwards and
  backwards through pairs that pass (:meth:`PairProblem._neighbor_masks`); only on pairs
  small enough (``NEIGHBOR_PAIRS``).  On random instances of at most 16 devices the
  neighbour cycle took a 29% gap to 18% and proved two more plans OPTIMAL, and the link
  bound took 53 of 60 instances within the goal to 56 (``benchmarks/small_gaps.py``).  The
  link term also counts the backlog the link leaves on the earlier stages (the objective's:
  each micro-batch's gradient reaches them late, with their remaining ops still to run):
  from the stages' own values where they are known (whole plans, and the prefix a program
  starts from), else on stage p - 1 at the least of its cells ending before p's first
  layer (:meth:`PairProblem._backlog_term`; small_gaps' seed 54 went from a 2.7% gap to
  OPTIMAL and seed 52 from 2.4% to 0.4%).

"Is there a plan with ``R <= tau``?" is, for R1 and R2, a forward program over (stage,
first layer) keeping the least accumulator (a smaller one never hurts a later stage; Alpa's
``F(s, k | t_max)`` recurrence with the accumulator in place of the stage-time sum),
and for R3 the same backwards.  Each is necessary, so when one says no, no plan has
``R <= tau``; the plan returned comes from R1's.  When that plan's ``R`` is above ``tau``
(the three passed through different cells), the cells on no completion of one of them are
filtered out and the programs asked again (``_consistent``; on ``mlp16`` this found a 2.4%
faster plan and cut the gap from 10.4% to 4.1% within the same budget).  Bisection on
``tau`` finds the bound.  A *subspace* fixes the first stages (a prefix) and excludes some
choices for the next one: the branch and bound of :mod:`.search` splits on these
(Lawler's k-best scheme).

Stages start on *units*: every layer, or past :data:`.coarse.EXACT` layers the first layers
of blocks (:mod:`.coarse`).  Each stage ``p`` of ``S`` may hold units ``p .. U - S + p`` only
(every stage keeps one), so every array is stored on that band of ``n = U - S + 1`` first and
last units (``(configs, n, n)`` squares, or for large pairs the cells one by one); the
programs run over the cells that fit in memory and whose own term is below the cutoff.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..units import format_count
from .costs import StageConfig, StageCosts
from .coarse import EXACT, UNITS, coarse_cuts, least_memory_floor
from . import ranges
from .ranges import Ranges, apply
from .objective import BACKLOG_STAGES, deferred_weights, family_split, phase_time
from .link import LINK_MICROBATCHES, backlog_counts, link_key, link_numbers, link_steps, link_time
from .link import paced as link_paced
from .neighbor import jumps_after_trip, neighbor_bound, neighbor_path, steady_warmup
from .partition import Partition, StagePlan
from .schedule import Schedule, live_count, warmup

__all__ = ["PairProblem", "Subspace", "cheap_bound"]

_CELL = ("F", "Bk", "BC", "XF", "XG", "G", "k")      # what R5's link term reads of a cell
_LINK_ARRAYS = 48     # R5's link term: pairs of cells played one by one up to this many (numbers)
_LINK_SLICE = 1 << 16  # and as arrays of at most this many

_SLACK = 1e-12
# the depths of the windows R3 reads (neighbor.py): every depth to 8, then about 1.5x apart
_DEPTHS = tuple(range(1, 9)) + tuple(int(8 * 1.5 ** k) for k in range(1, 20))
_COLUMN = {h: j for j, h in enumerate(_DEPTHS)}   # counted windows (_window_sums): one column
_TO_END = len(_DEPTHS)                            # per depth read, and one for the window to the end
_UIDS = itertools.count()          # names each list of cells (R5 remembers its pairs per list)
# R3's windows are counted at limits this far apart (_grid): each counting reads every stage's
# cells, and a search asks at many cutoffs (1% apart made GPT-3 on 100 000 GPUs 1.3x slower)
_WINDOW_STEP = 0.05


def _grid(limit: float) -> float:
    """The least ``(1 + _WINDOW_STEP)^k`` at or above ``limit``: the limits R3's windows are
    counted at, so that the searches' many cutoffs share a few countings."""
    if not 0 < limit < math.inf:
        return limit
    step = math.log1p(_WINDOW_STEP)
    out = math.exp(math.ceil(math.log(limit) / step) * step)
    return out if out >= limit else out * (1 + _WINDOW_STEP)


def cheap_bound(costs: StageCosts, split: bool = True) -> float:
    """A lower bound of every plan's ``R`` without building the arrays.

    With ``w_p`` a stage's work per micro-batch and ``rho = min (f + c) / w`` over layers and
    configurations, ``R >= max_p (rho (w_0 + ... + w_{p-1}) + B' w_p)`` with ``B' = B - 1 + rho``
    (``B`` without weight splitting); over all non-negative ``w`` summing to at least ``W`` (the
    least total work) that is least when every term is equal: ``rho W / (1 - (1 - rho/B')^S)``.
    """
    if not costs.configs:
        return math.inf
    times = [costs.layer_times(c) for c in costs.configs]
    work = np.min([f + a + w for f, a, w in times], axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = [np.where(f + a + w > 0, (f + (a if split else a + w)) / (f + a + w), 1.0) for f, a, w in times]
    rho = float(np.clip(np.min(ratios), 0.0, 1.0))
    W, B, S = float(work.sum()), costs.microbatches, costs.stages
    Bp = B - 1 + rho if split else B
    if rho <= 0 or S == 1:
        return Bp * W / S if S > 1 else B * W
    return rho * W / (1 - (1 - rho / Bp) ** S)


@functools.lru_cache(maxsize=4096)
def _least_counts(schedule: Schedule, stages: int, r: int, microbatches: int, either: bool) -> tuple:
    """:func:`.link.backlog_counts` of stage r, the fewer of the two orders by micro-batch when
    it may delay its weight parts or not (``either``), as floats."""
    counts = [backlog_counts(schedule, stages, r, microbatches, d) for d in ((False, True) if either else (False,))]
    return tuple(np.minimum.reduce([c[i] for c in counts]).astype(float) for i in range(3))


def _earlier(vals: list, p: int) -> tuple:
    """Stage p's earlier stages' values, nearest first, as far back as the backlog goes."""
    return tuple(vals[p - 1::-1][:BACKLOG_STAGES]) if p > 0 else ()


def _same(a: tuple | None, b: tuple | None) -> bool:
    return len(a or ()) == len(b or ()) and all(x is y for x, y in zip(a or (), b or ()))


@dataclass(frozen=True)
class Subspace:
    """The plans of a pair whose first stages are ``prefix`` and whose next stage is none of
    ``excluded``; ``bound`` is a proven lower bound of their ``R`` (hence simulated time)."""

    pair: PairProblem = field(compare=False)
    prefix: tuple[StagePlan, ...] = ()
    excluded: frozenset[StagePlan] = frozenset()
    bound: float = 0.0

    def children(self, plan: tuple[StagePlan, ...], bound: float) -> list[Subspace]:
        """Lawler: the subspace minus ``plan`` (which it contains) as disjoint subspaces."""
        j = len(self.prefix)
        out = []
        for level in range(j, len(plan)):
            excluded = (self.excluded | {plan[j]}) if level == j else frozenset({plan[level]})
            out.append(Subspace(self.pair, plan[:level], excluded, bound))
        return out


_NO_ARRAYS = (float, int, bool, str, type(None), np.float64, np.int64, np.bool_)


def _held(obj, seen: set) -> int:
    """Bytes of the arrays (and range tables' squares) ``obj`` holds, once each."""
    if type(obj) in _NO_ARRAYS:
        # most of what the caches hold are numbers (windows, paths): walking them one by one
        # was 7% of a small search under the profiler
        return 0
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, Ranges) or type(obj).__name__ == "_SparseMax":
        return sum(_held(v, seen) for v in vars(obj).values())     # its arrays, and the tables it reads
    if isinstance(obj, dict):
        return sum(_held(v, seen) for v in obj.values() if type(v) not in _NO_ARRAYS)
    if isinstance(obj, (list, tuple)):
        return sum(_held(v, seen) for v in obj if type(v) not in _NO_ARRAYS)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_held(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    return 0


class _Caches:
    """What every pair's arrays may hold together (CACHE_BYTES): past it, the pairs used
    longest ago drop theirs (rebuilt, to the same numbers, if the search comes back).
    Without it a search keeps every pair it ever explored: 1 024 layers on 1 024 GPUs
    passed 8 GiB."""

    CACHE_BYTES = 2 * 2**30

    def __init__(self):
        self.sizes: dict[int, tuple] = {}           # id(pair) -> (pair, bytes[, version]), oldest first

    def touch(self, pair: "PairProblem") -> None:
        entry = self.sizes.pop(id(pair), None)
        self.sizes[id(pair)] = entry if entry else (pair, 0)

    def update(self, pair: "PairProblem") -> None:
        # measured again only when the pair's caches changed (an entry added or replaced)
        version = tuple(sum(map(id, d.values())) + len(d) for d in (pair._stage, pair.costs._configs,
                                                                     pair.costs._transfers))
        entry = self.sizes.get(id(pair))
        if entry is not None and len(entry) == 3 and entry[2] == version:
            return
        seen: set = set()
        size = _held(pair._stage, seen) + _held(pair.costs._configs, seen) + _held(pair.costs._transfers, seen)
        self.sizes[id(pair)] = (pair, size, version)
        total = sum(v[1] for v in self.sizes.values())
        for key in list(self.sizes):
            if total <= self.CACHE_BYTES:
                break
            other, held = self.sizes[key][:2]
            if other is pair:
                continue
            other.drop_caches()
            del self.sizes[key]
            total -= held


CACHES = _Caches()


class PairProblem:
    """The plans of one :class:`StageCosts` under a family of schedules, for the solvers."""

    def __init__(self, costs: StageCosts, schedules: list[Schedule], last_tensor: int | None = None,
                 fit_lives: tuple[int, ...] | None = None):
        self.costs = costs
        self.schedules = schedules
        # the last stage's tensor degree when fixed (:meth:`variants`), else None
        self.last_tensor = last_tensor
        # the micro-batches per stage every cell must fit (a level of :meth:`variants`), else None
        self.fit_lives = fit_lives
        self._variants: list[PairProblem] | None = None
        self.S = costs.stages
        self.L = costs.model.num_layers
        self.B = costs.microbatches
        self.configs: list[StageConfig] = list(costs.configs)
        # where a stage may start: every layer, or on deeper models the first layers of
        # UNITS blocks of about equal work (coarse_cuts; at least one per stage); the bands
        # hold units, not layers
        units = max(UNITS, self.S)
        # (one stage holds every layer: nothing to cut, blocks or not)
        exact = self.L <= max(EXACT, self.S) or self.S == 1
        self.pos = np.arange(self.L + 1) if exact else coarse_cuts(costs, units)
        self.n = len(self.pos) - 1 - self.S + 1
        self.has_split, self.has_whole = family_split(schedules)
        # ZB-H1 defers weight parts past a stage's last chain op (objective.py): R1 moves
        # them out of the stage's term, and R3 (1F1B's cycle and phase) does not apply
        zb = [s for s in schedules if s.kind == "zb-h1"]
        self.deferred = deferred_weights(zb[0], self.S, self.B) if zb else None
        self.r3 = not zb
        self._stage: dict = {}
        self._paths: dict = {}        # p -> the neighbour paths' counts (_neighbor_paths)
        # skip connections: a stage may send more gradients than the cut's tensor (R5's link term)
        self._skips = any(j != i + 1 for i, j, _ in costs.model.edges())
        # R3's window minima (_window_minima): 2 S numbers, kept when the caches are dropped
        # (rebuilt, they would read every stage's cells again)
        self._minima: tuple[np.ndarray, np.ndarray] | None = None
        # (p, StagePlan) -> _value's terms (plans share stages); and ("link", p, ids) ->
        # R5's link term of two such cells (_link_cell), dropped with them
        self._values: dict = {}
        self._last_terms: tuple = ((), None, None)   # feasible() and minimize() ask for the same plan's
        self.fixed: list[tuple[int, int]] | None = None
        self.dp_runs = 0
        # per stage, the family's warm-up counts: R3 asks for them about a million times in
        # one search on 100 000 GPUs, and they depend on nothing but S, B and the family
        self._warmups = [sorted({warmup(s, self.S, p, self.B) for s in schedules}) for p in range(self.S)]

    def fix_layers(self, counts: tuple[int, ...]) -> None:
        """Only plans whose stage p holds ``counts[p]`` layers (an explicit layer split): the
        stages start at those layers only (one unit per stage)."""
        if len(counts) != self.S or sum(counts) != self.L or min(counts) < 1:
            raise ValueError(f"a split of {self.L} layers into {self.S} stages, got {counts}")
        self.fixed, first = [], 0
        for n in counts:
            self.fixed.append((first, first + n - 1))
            first += n
        self.pos = np.asarray([0] + list(np.cumsum(counts)))
        self.n = 1
        self._stage.clear()
        self._values.clear()
        self._last_terms = ((), None, None)
        self._minima = None           # over other cells now

    def variants(self) -> list[PairProblem]:
        """The pair's plans split into problems whose relaxation is tighter, by the last
        stage's tensor degree and by the level of the family's members they fit
        (:meth:`_levels`); empty when neither split applies.  Every plan that fits a member
        lies in a variant holding that member and its last stage's degree, whose R bounds
        it (the levels nest: a plan may lie in several).

        * A layer tied to the model's last layer (the token table and the logits) waits on
          its stage for the all-reduce of the copy's gradient with the last stage, whose bytes
          are the copy's over that stage's tensor degree.  Without the last stage's
          configuration, :meth:`_tie_floor` takes the least over every degree; with it
          fixed the wait is exact.  On random tied 16-GPU models whose embedding all-reduce
          crosses the hosts (benchmarks/small_gaps.py, seed 52), plans whose last stage has a
          smaller degree than the floor's had R 18% under their objective.
        * Under eager-1F1B, R took each term's least over every member, also over members
          that no plan through the cells the programs chose fits in memory.  On GPT-3 175B
          on 100 000 GPUs the gap went from 1.05% to 0.58%, with a faster plan."""
        if self._variants is None:
            self._variants = []
            if self.last_tensor is not None or self.fit_lives is not None or self.sparse or self.coarse:
                return self._variants
            degrees = sorted({cfg.tensor for cfg in self.configs})
            tied = (self.S > 1 and len(degrees) > 1 and bool(self.costs.comm)
                    and any(b == self.L - 1 and a < b for a, b in self.costs.model.ties()))
            levels = self._levels()
            if not tied and len(levels) < 2:
                return self._variants
            for members, lives in levels if len(levels) > 1 else [(self.schedules, None)]:
                for t in degrees if tied else [None]:
                    v = PairProblem(self.costs, members, last_tensor=t, fit_lives=lives)
                    if self.fixed is not None:
                        v.fix_layers(tuple(last - first + 1 for first, last in self.fixed))
                    self._variants.append(v)
        return self._variants

    def _levels(self) -> list[tuple[list[Schedule], tuple[int, ...]]]:
        """The family's members by the micro-batches they keep, when those form a chain (each
        member keeps at least as many on every stage as the one before: eager-1F1B's
        eagerness): per level, the members keeping at most its counts and the counts.  A plan
        fits a member only if every stage fits its counts, so a plan's members are those up
        to its deepest level; a level's problem keeps only the cells that fit its counts, and
        takes each term's least over its members only (the family's least otherwise mixes
        members: the cycle of one, the link of another that does not fit the plan).  Returns
        (members, the counts every cell must fit) per group of levels."""
        # the fewest each keeps (a stage that delays its weight parts keeps one more)
        lives = {s: tuple(live_count(s, self.S, p, self.B) for p in range(self.S)) for s in self.schedules}
        chain = sorted(set(lives.values()))
        if any(not all(u <= v for u, v in zip(x, y)) for x, y in zip(chain, chain[1:])):
            return []
        # a level whose cells all fit the next level's counts too holds no plan the next one
        # does not (with fewer members): left out
        tops = [low for low, high in zip(chain, chain[1:]) if self._loses_cells(low, high)] + chain[-1:]
        # at most two groups of levels, the shallower half and the deeper: a group keeps the
        # cells that fit its shallowest level and the members up to its deepest (every plan
        # still lies in a group holding its members).  Each variant builds its own tables and
        # subtree: on GPT-3 175B on 16 384 GPUs under eager-1F1B (5-6 levels) one variant per
        # level took the search from 34 s to 60 s for the same gap; two groups take 39 s,
        # and keep most of the gain (100 000 GPUs: gap 1.05% -> 0.58% where one per level
        # gave 0.38%; small_gaps.py seeds 0-59: the same plans and gaps, 34 s against 39 s)
        half = -(-len(tops) // 2)
        groups = [tops[:half], tops[half:]] if len(tops) > 2 else [[top] for top in tops]
        return [([s for s in self.schedules if all(u <= v for u, v in zip(lives[s], group[-1]))], group[0])
                for group in groups]

    def _loses_cells(self, low: tuple[int, ...], high: tuple[int, ...]) -> bool:
        """Whether some cell that fits keeping ``low[p]`` micro-batches on its stage does not
        fit keeping ``high[p]``."""
        return any((self.fits_mask(p, j, low[p]) & ~self.fits_mask(p, j, high[p])).any()
                   for p in range(self.S) if low[p] != high[p] for j in range(len(self.configs)))

    def drop_caches(self) -> None:
        """Forget every array built (see :class:`_Caches`); they are rebuilt on demand."""
        self._stage.clear()
        self._values.clear()
        self._last_terms = ((), None, None)
        self.costs._configs.clear()
        self.costs._transfers.clear()

    @property
    def possible(self) -> bool:
        return bool(self.configs) and self.S <= len(self.pos) - 1

    # a pair whose bands would hold more cells than this (stages x n^2 x configurations)
    # builds its cells one by one (_sparse_cells) instead of the (configs, n, n) squares
    DENSE_CELLS = 4_000_000

    @property
    def sparse(self) -> bool:
        return self.S * self.n * self.n * len(self.configs) > self.DENSE_CELLS

    @property
    def coarse(self) -> bool:
        """Stages start only at block boundaries (deep models, :func:`coarse_cuts`): the
        programs' bounds hold for those plans only."""
        return self.fixed is None and len(self.pos) - 1 < self.L

    def band(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage p's band: the first layers and the last layers its cells may have."""
        return self.pos[p:p + self.n], self.pos[p + 1:p + 1 + self.n] - 1

    def _square(self, table, p: int) -> np.ndarray:
        """``table[k, i]`` (a :class:`.ranges.Ranges` or a square) on stage p's band, ``(n, n)``."""
        if len(self.pos) == self.L + 1:
            return np.asarray(table[slice(p, p + self.n), slice(p, p + self.n)])
        ks, is_ = self.band(p)
        return np.asarray(table[ks[:, None], is_[None, :]])

    def band_index(self, p: int, first: int, last: int) -> tuple[int, int]:
        """The band indices of stage p's cell of layers first..last; (-1, -1) when the band
        has no such cell (a stage not starting or ending on a block boundary)."""
        if len(self.pos) == self.L + 1:          # every layer starts a unit: pos[u] = u
            return first - p, last - p
        u = int(np.searchsorted(self.pos, first))
        v = int(np.searchsorted(self.pos, last + 1)) - 1
        if u >= len(self.pos) or self.pos[u] != first or v + 1 >= len(self.pos) or self.pos[v + 1] != last + 1:
            return -1, -1
        return u - p, v - p

    def label(self) -> str:
        return f"{format_count(self.S, 'stage')} of {self.costs.shape}, B={self.B}"

    def plan(self, stages) -> Partition:
        return Partition(self.costs, list(stages))

    def live_min(self, p: int) -> int:
        """Fewest micro-batches stage p keeps under any schedule of the family (a level of
        :meth:`variants`: under its deepest member)."""
        if self.fit_lives is not None:
            return self.fit_lives[p]
        return min(live_count(s, self.S, p, self.B) if s.kind == "zb-h1" else
                   warmup(s, self.S, p, self.B) + (1 if s.split else 0) for s in self.schedules)

    def warmups(self, p: int) -> list[int]:
        return self._warmups[p]

    # -- arrays ------------------------------------------------------------------------------
    def _config_arrays(self, j: int) -> dict[str, np.ndarray]:
        key = ("config", j)
        if key not in self._stage:
            c, B = self.costs, self.B
            cc = c[self.configs[j]]
            chain = cc.backward_act if self.has_split else cc.backward
            gf = cc.tail_full if self.has_whole else np.inf
            gw = cc.tail_weight if self.has_split else np.inf
            work = cc.work
            G = apply(np.minimum, gf, gw)
            self._stage[key] = {
                "T2": B * work + G,
                "T1": B * work - (cc.backward - chain),
                "F": cc.forward, "C": chain, "B": cc.backward,
                "u0": apply(np.minimum, gf, cc.backward_weight + gw if self.has_split else np.inf),
                "G": G,
                "opt": cc.optimizer,
                "act": c.model.column("activations") * cc.samples,
            }
        return self._stage[key]

    def fits_mask(self, p: int, j: int, live: int | None = None) -> np.ndarray:
        """(n, n): stage p can hold layers k..i with configuration j (memory, keeping ``live``
        micro-batches, by default :meth:`live_min`; layers left over)."""
        c, S, n = self.costs, self.S, self.n
        live = self.live_min(p) if live is None else live
        ok = self._square(c.memory(self.configs[j], live), p) <= c.device_memory
        if p == 0:
            ok[1:, :] = False
        if p == S - 1:
            ok[:, :n - 1] = False
            if self.last_tensor is not None and self.configs[j].tensor != self.last_tensor:
                ok[:] = False
        return ok

    _KEYS = ("T1", "T2", "INC1", "INC2", "INC3", "K3", "Bk", "BC", "G", "F", "XF", "XG")

    def stage(self, p: int) -> dict[str, np.ndarray]:
        """Stage p's terms on its band, each (configs, n, n); ``T2`` and the increments are inf
        where the stage cannot hold layers k..i with that configuration (memory, or layers
        left over for the other stages).  See :mod:`.objective` for R1 (``T1``, ``T2``,
        ``INC1``); R2 adds ``INC2 = f + x(p->p+1)`` (the fill); R3 (the cycle) uses
        ``K3 = f + x(p->p+1)``, ``INC3 = f + c + x(p->p-1) + x(p->p+1)``, ``Bk = b``, ``BC = b - c``
        and the gradient tail ``G`` (the drain after the stage's last op is at least that);
        with ``F = f`` and ``XF = x(p->p+1)`` also the phase bound; R5 (the neighbour cycle)
        also reads ``XG = x(p->p-1)``."""
        if p in self._stage:
            return self._stage[p]
        n = self.n
        ks, is_ = self.band(p)
        out = {key: [] for key in self._KEYS}
        for j in range(len(self.configs)):
            ok = self.fits_mask(p, j)
            if not ok.any():                    # never priced: no gradient programs needed
                for key in self._KEYS:
                    out[key].append(np.full((n, n), np.inf))
                continue
            arr = self._config_arrays(j)
            values = self._cell_values(p, j, lambda key: self._square(arr[key], p), ks[:, None], is_[None, :])
            for key in self._KEYS:
                out[key].append(np.where(ok, values[key], np.inf))
        self._stage[p] = {key: np.stack(v) for key, v in out.items()}
        return self._stage[p]

    def _cell_values(self, p: int, j: int, table, K: np.ndarray, I: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`stage`'s terms of stage p's cells of layers ``K``..``I`` (broadcast index
        arrays) with configuration j; ``table(key)``: that configuration's table on them."""
        c, S = self.costs, self.S
        cfg = self.configs[j]
        t = cfg.tensor
        acts = self._config_arrays(j)["act"]
        shape = np.broadcast_shapes(np.shape(K), np.shape(I))
        if p + 1 < S:
            a, b = c.transfer(t, p, p + 1)
            xf = a + b * acts[I]                                        # over the last layer i
        else:
            xf = np.zeros(np.shape(I))
        if p > 0:
            a, b = c.transfer(t, p, p - 1)
            xg = a + b * acts[K - 1]                                    # over the first layer k (edge k-1 -> k)
        else:
            xg = np.zeros(np.shape(K))
        f, ch, bk = table("F"), table("C"), table("B")
        inc1 = f + ch + xf + xg
        tie = self._tie_floor(p, t, K, I, table("opt"))
        if p == 0:
            inc1 = inc1 + table("u0") + tie
            t1 = np.zeros(shape)
        else:
            t1 = table("T1") + xg
            if self.deferred is not None:
                t1 = t1 - (self.deferred[p] - 1) * (bk - ch)
        return {"T1": t1, "T2": table("T2") + tie, "INC1": inc1, "INC2": f + xf,
                "INC3": f + ch + xf + xg, "K3": f + xf, "Bk": bk, "BC": bk - ch, "G": table("G") + tie,
                "F": f, "XF": np.broadcast_to(xf, shape), "XG": np.broadcast_to(xg, shape)}

    # R4 is built only when the pair's transfers and reductions hold at most this many ports
    # in all (on 100 000 GPUs a stage's transfer alone holds thousands, and ports seldom set
    # the time of such plans); without it R4 is 0, which is still a lower bound
    PORT_LIMIT = 20_000
    PORT_BYTES = 64 * 2**20      # and when its load arrays would take at most this much (per pair)

    def _port_loads(self) -> list[tuple[dict[int, np.ndarray], float]]:
        """R4, the port bound (objective.py) of the tasks a port serves one at a time, relaxed
        like R1: per class of ports (held by the same task types), each stage's load on its
        band, ``(configs, n, n)``: ``B`` transfers of the tensor that crosses each of its cuts
        (the last layer's output forward, over ``i``; the gradient of the previous layer's
        output back, over ``k``) and its gradient reduction, where they hold such a port;
        with an upper bound of the class's load over every plan.  A port's load is a sum
        over stages, so dynamic programs handle it exactly, class by class.  Without it the
        relaxation missed the term that sets most small plans' time: on random instances of
        16 devices a host NIC carrying activations and gradients gave an objective 3-5 times
        above R (and FEASIBLE gaps of 25-57%)."""
        if "ports" in self._stage:
            return self._stage["ports"]
        c, S, n, B = self.costs, self.S, self.n, self.B
        out: list = []
        self._stage["ports"] = out
        if not c.comm or S == 1 or self.sparse:
            return out
        types: list[tuple[int, int, str]] = []
        users: dict = {}
        held = 0
        for p in range(S):
            for j, cfg in enumerate(self.configs):
                t = cfg.tensor
                lists = []
                if p + 1 < S:
                    lists.append(("act", c.transfer_resources(t, p, p + 1)))
                if p > 0:
                    lists.append(("grad", c.transfer_resources(t, p, p - 1)))
                if c.shape.size // t > 1:
                    lists.append(("red", c.reduction_resources(t, p)))
                for kind, res in lists:
                    held += len(res)
                    if held > self.PORT_LIMIT:
                        return out
                    ty = len(types)
                    types.append((p, j, kind))
                    for r in res:
                        users.setdefault(r, set()).add(ty)
        loads: dict = {}

        def load(ty: int) -> np.ndarray:
            if ty not in loads:
                p, j, kind = types[ty]
                cfg = self.configs[j]
                ks, is_ = self.band(p)
                if kind == "red":
                    cc = c[cfg]
                    if cc.overlap:
                        cs = np.concatenate([[0.0], np.cumsum(cc.layer_reduction)])
                        arr = cs[None, is_ + 1] - cs[ks, None]
                        if cc.first_only:           # stages after the first: one bucket, whole
                            arr = np.where((ks == 0)[:, None], arr, self._square(cc.reduction_all, p))
                    else:
                        arr = self._square(cc.reduction_all, p)
                else:
                    acts = self._config_arrays(j)["act"]
                    q = p + 1 if kind == "act" else p - 1
                    a, b = c.transfer(cfg.tensor, p, q)
                    if kind == "act":
                        arr = np.broadcast_to(B * (a + b * acts[is_])[None, :], (n, n))
                    else:
                        arr = np.broadcast_to(B * (a + b * acts[ks - 1])[:, None], (n, n))
                loads[ty] = np.triu(np.asarray(arr, dtype=float))
            return loads[ty]

        # the port bound's head: no task of stage p0 or later starts before stage p0's first
        # forward has run, after every earlier layer's forward (each at least its least time
        # over the configurations).  Not on a port a tied copy's all-reduce may hold: the
        # objective starts it at 0 (and it leaves no tail); nor with skip connections: a skip
        # from an earlier stage may hold the port from that stage's forward on.
        tied = self._tie_ports()
        skips = len(c.model.edges()) != self.L - 1
        least = np.min([c.layer_times(cfg)[0] for cfg in self.configs], axis=0)
        before = np.concatenate([[0.0], np.cumsum(least)])
        free: dict = {}               # a class of ports of which one no tied all-reduce nor skip holds
        for r, u in users.items():
            g = tuple(sorted(u))
            free[g] = free.get(g, False) or (tied is not None and r not in tied and not skips)
        groups = sorted({tuple(sorted(u)) for u in users.values()})
        # the port bound's tail: after the last transfer a port serves, the last micro-batch's
        # drain is still to come (objective.py).  A transfer from stage p back to p - 1 leaves
        # its receiver's chain op and drain ``c + D`` of stage p - 1 behind it, one from p on
        # to p + 1 those of stage p + 1 (and more): the drain through stages 0..d, d the least
        # of those depths over the class.  Not where a task with no tail may hold the class's
        # ports: a gradient reduction, a tied copy's all-reduce, a skip connection's transfer
        # (its gradient drains from an earlier stage than the sender's neighbour).
        # (on pairs of at most SMALL_STAGES stages: a tail spans the stages before the class,
        # and on deep pairs that made the masks' work grow with the stage count)
        def depth(group) -> int:
            if S > self.SMALL_STAGES or not free[group] or any(types[ty][2] == "red" for ty in group):
                return -1
            return min(types[ty][0] + (1 if types[ty][2] == "act" else -1) for ty in group)

        # (the drain's squares are shared by the classes, one per stage)
        arrays_held = (sum(len({types[ty][0] for ty in g}) for g in groups)
                       + max((depth(g) + 1 for g in groups), default=0))
        if arrays_held * len(self.configs) * n * n * 8 > self.PORT_BYTES:
            return out
        drains: dict[int, np.ndarray] = {}

        def drain(q: int) -> np.ndarray:
            if q not in drains:
                drains[q] = np.stack([self._drain_square(q, j) for j in range(len(self.configs))])
            return drains[q]

        for group in groups:
            # only the stages the class's tasks belong to (one to three), and those its tail
            # drains through: the others add 0
            arrays: dict[int, np.ndarray] = {}
            for ty in group:
                p, j, _ = types[ty]
                if p not in arrays:
                    arrays[p] = np.zeros((len(self.configs), n, n))
                arrays[p][j] += load(ty)
            p0 = min(arrays)
            for q in range(depth(group) + 1):
                if q in arrays:
                    arrays[q] += drain(q)
                else:
                    arrays[q] = drain(q)            # shared: never written to
            if free[group]:
                ks0 = self.band(p0)[0]
                for j in range(len(self.configs)):
                    head = before[ks0, None] + self._square(self._config_arrays(j)["F"], p0)
                    arrays[p0][j] += np.triu(head)
            top = sum(float(a.max()) for a in arrays.values())
            out.append((arrays, top))
        # a class at most another on every stage's every cell bounds nothing the other does not
        # (both its terms and its masks follow from the other's): dropped, on pairs of few
        # classes (the comparisons grow as their square)
        if len(out) <= self.PRUNED_CLASSES and S <= self.SMALL_STAGES:
            out.sort(key=lambda x: -x[1])
            kept: list = []
            for arrays, top in out:
                if not any(all(p in big and bool((a <= big[p]).all()) for p, a in arrays.items()) for big, _ in kept):
                    kept.append((arrays, top))
            out[:] = kept
        return out

    PRUNED_CLASSES = 128
    SMALL_STAGES = 16          # R4's tails and class pruning: on pairs of at most this many stages

    TIE_PLACEMENTS = 256       # placements of tied layers _tie_ports lists at most

    def _tie_ports(self) -> set | None:
        """Every port a tied copy's all-reduce may hold, over the stages that may hold the
        two layers and every tensor degree of the copy (None: more placements than
        ``TIE_PLACEMENTS``, any port may be)."""
        c, S, L = self.costs, self.S, self.L
        out: set = set()
        if not c.comm:
            return out
        degrees = sorted({cfg.tensor for cfg in self.configs})
        count = 0
        for a, b in c.model.ties():
            # stage p may hold layer x when p <= x and the S - 1 - p later stages fit in the layers after x
            for sa in range(max(0, a - (L - S)), min(a, S - 1) + 1):
                for sb in range(max(sa + 1, b - (L - S)), min(b, S - 1) + 1):
                    count += len(degrees)
                    if count > self.TIE_PLACEMENTS:
                        return None
                    for tb in degrees:
                        out.update(c.tie_between(b, sa, sb, tb)[1])
        return out

    def _drain_square(self, q: int, j: int) -> np.ndarray:
        """(n, n): stage q's part of the drain through it (objective.py's ``D``, for R4's
        tails): its chain op, and the gradient back to stage q - 1 (on the first stage its own
        gradient tail and tied all-reduce), each at the least any schedule of the family gives."""
        arr = self._config_arrays(j)
        sq = self._square(arr["C"], q)
        if q == 0:
            ks, is_ = self.band(0)
            sq = sq + self._square(arr["u0"], q) + self._tie_floor(0, self.configs[j].tensor, ks[:, None], is_[None, :],
                                                                 self._square(arr["opt"], q))
        else:
            a, b = self.costs.transfer(self.configs[j].tensor, q, q - 1)
            sq = sq + (a + b * arr["act"][self.band(q)[0] - 1])[:, None]
        return np.triu(sq)

    def _port_masks(self, tau, prefix, cells, masks) -> list | None:
        """``masks`` with every cell removed that lies on no completion whose load on some
        port class (R4) stays at most tau: the least load reaching its first layer, its own,
        and the least load after its last layer, summed (each class alone, so it is a
        necessary condition).  None: some class has no completion at most tau."""
        classes = [a for a, top in self._port_loads() if top > tau]
        if not classes:
            return masks
        L = self.L
        start = prefix[-1].last + 1 if prefix else 0
        j0 = len(prefix)
        out = list(masks)
        fixed = [(p, self._cell(p, st)) for p, st in enumerate(prefix)]
        # a few classes at once, one row each (rows of every cell of every stage: on deep
        # pairs of thousands of cells per stage, all classes at once took gigabytes)
        for lo in range(0, len(classes), self.MASK_ROWS):
            if not self._port_rows(tau, classes[lo:lo + self.MASK_ROWS], start, j0, fixed, cells, out):
                return None
        return out

    MASK_ROWS = 8

    def _port_rows(self, tau, classes, start, j0, fixed, cells, out) -> bool:
        """:meth:`_port_masks` for some classes at once: ``out`` (the masks, per remaining
        stage) gains every cell on no completion with each class's load at most tau (a cell
        one class rules out goes for all: those plans are gone); False when some class has no
        such completion."""
        L, K = self.L, len(classes)
        own = [np.stack([arrays[j0 + q][c["j"], c["bk"], c["bi"]] if j0 + q in arrays else np.zeros(len(c["k"]))
                         for arrays in classes]) for q, c in enumerate(cells)]
        acc = np.full((K, L + 1), np.inf)
        acc[:, start] = [sum(float(arrays[p][cell]) for p, cell in fixed if p in arrays) for arrays in classes]
        before = []
        for q, c in enumerate(cells):
            before.append(acc)
            val = acc[:, c["k"]] + own[q]
            acc = np.full((K, L + 1), np.inf)
            if val.shape[1]:
                acc[:, c["ends"] + 1] = np.minimum.reduceat(val, c["starts"], axis=1)
        if not (acc[:, L] <= tau).all():
            return False
        after = np.full((K, L + 1), np.inf)
        after[:, L] = 0.0
        for q in range(len(cells) - 1, -1, -1):
            c = cells[q]
            rest = own[q] + after[:, c["i"] + 1]
            bad = (before[q][:, c["k"]] + rest > tau).any(axis=0)
            out[q] = bad if out[q] is None else (out[q] | bad)
            val = np.where(out[q], np.inf, rest)[:, c["by_k"]]
            after = np.full((K, L + 1), np.inf)
            if val.shape[1]:
                after[:, c["firsts"]] = np.minimum.reduceat(val, c["starts_k"], axis=1)
        return True

    # R5 is used when its program's cell pairs are at most this many (S n (n configs)^2):
    # small pairs, where a slow link between two stages sets the time and nothing else sees it
    NEIGHBOR_PAIRS = 2_000_000

    def _neighbor_on(self) -> bool:
        if "neighbor_on" not in self._stage:
            pairs = self.S * self.n * (self.n * len(self.configs)) ** 2
            self._stage["neighbor_on"] = bool(self.costs.comm and self.S > 1 and pairs <= self.NEIGHBOR_PAIRS
                                              and not self.sparse)
        return self._stage["neighbor_on"]

    def _neighbor_paths(self, p: int) -> list:
        """The counts of stage p's neighbour paths (neighbor.py), one per member of the family
        and without those another member's counts all undercut (the bound grows with each
        count, so the least over the family is the least over these); empty when some member
        has none (the family's least would then be no bound)."""
        # kept apart from the arrays _Caches may drop: a few numbers per stage, and costly to
        # find again (a path reads the schedule's whole op order; on a 1 024-layer model under
        # eager-1F1B, recomputing them after every drop took 45% of `plan`)
        if p not in self._paths:
            paths = {neighbor_path(s, self.S, p, self.B) for s in self.schedules}
            if None in paths:
                self._paths[p] = []
            else:
                self._paths[p] = sorted(x for x in paths if not any(
                    y != x and all(u <= v for u, v in zip(y, x)) for y in paths))
        return self._paths[p]

    def _r5_has(self, p: int) -> bool:
        """Whether R5 has a term for stages p and p + 1: a neighbour path for every member of
        the family, or the link bound (link.py), which every schedule without chunks has."""
        return bool(self._neighbor_paths(p)) or self._links_on()

    def _links_on(self) -> bool:
        return self.B <= LINK_MICROBATCHES and all(s.virtual == 1 for s in self.schedules)

    def _neighbor_term(self, p: int, a, b, links: bool = True, earlier: tuple | None = None) -> tuple:
        """R5's terms of stage p (cell values ``a``) before stage p + 1 (``b``), element-wise on
        arrays: ``(after the drain, after the fill)``, to which the callers add what comes
        before the stage: the objective's fill and drain together less the stage's own tail
        (``E - G``, :meth:`_r3_fills`), and R2's fill ``H``.

        * after the drain: the least over the family of the neighbour cycle bound
          (neighbor.py) with the round trip through stage p + 1 only, and the least over the
          family of the link bound (:meth:`_link_term`) ending at stage p's last chain op,
          whichever is larger; both end with the stage's drain ``D_p``, here its own tail
          ``G`` (each least is at most the objective's least over the members);
        * after the fill: the link bound ending at either stage's last op (its deferred
          weight parts included) and its own tail, and the backlog it leaves on the earlier
          stages (``earlier``: their values, nearest first, when known; else stage p - 1 at the
          least of its cells; :meth:`_backlog_term`; -inf where there is none)."""
        f, c = a["F"], a["Bk"] - a["BC"]
        there = a["XF"] + b["F"] + (b["Bk"] - b["BC"]) + b["XG"]
        jump = f + c + there
        drained = -np.inf
        paths = self._neighbor_paths(p)
        for k, path in enumerate(paths):
            v = neighbor_bound(path, 0.0, f, c, jump, there, a["G"])
            drained = v if k == 0 else np.minimum(drained, v)
        filled = -np.inf
        if links and self._links_on():
            if np.ndim(a["F"]) == 0 and np.ndim(b["F"]) == 0:
                mine, theirs = self._link_cell(p, a, b, earlier)
            else:
                mine, theirs = self._link_term(p, a, b, earlier)
            drained = np.maximum(drained, mine)
            filled = theirs
        return drained, filled

    def _link_cell(self, p: int, a: dict, b: dict, earlier: tuple | None = None) -> tuple[float, float]:
        """:meth:`_link_term` of one cell of each stage, in Python numbers and remembered (the
        programs ask for a prefix's pairs at every run: numpy on single values took 70% of a
        search)."""
        key = ("link", p, id(a), id(b)) + tuple(map(id, earlier or ()))
        hit = self._values.get(key)
        if hit is not None and hit[0] is a and hit[1] is b and _same(hit[2], earlier):
            return hit[3]
        arrays = self._link_term(p, {k: np.asarray([v]) for k, v in a.items() if k in _CELL},
                                 {k: np.asarray([v]) for k, v in b.items() if k in _CELL}, earlier)
        out = (float(arrays[0][0]), float(arrays[1][0]))
        self._values[key] = (a, b, earlier, out)
        return out

    def _link_term(self, p: int, a, b, earlier: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The least over the family of the link bound (link.py) of stages p and p + 1 without
        the fill, on cells ``a`` and ``b``, in two parts: (the end of p's last chain op and its
        drain, here its tail ``G``; the end of either stage's last op, with its own tail).  The
        round trip after
        stage p + 1 is taken as 0 and the transfers carry the cut's tensor only; -inf where
        the link cannot pace the two (:func:`.link.paced`).  A stage delays its weight parts
        when its gradient transfers outlast them (:func:`.pipeline.weight_delays`); with skip
        connections a stage may send more than the cut's tensor, so where the cut's alone
        does not decide, both orders are played and the lesser kept."""
        keys = [k for k in _CELL if k in a and k in b]
        n = max(np.size(a["F"]), np.size(b["F"]))      # a cell, or arrays of them (one may be a cell)
        A = {k: np.broadcast_to(np.asarray(a[k], dtype=float), (n,)) for k in keys}
        Bq = {k: np.broadcast_to(np.asarray(b[k], dtype=float), (n,)) for k in keys}
        # the backlog on the earlier stages: their own values where known (a plan's or a
        # prefix's), as far back as the objective follows it; else stage p - 1's least cells
        known = tuple(earlier[:min(p, BACKLOG_STAGES)]) if earlier and p > 0 else None
        floor = None if known else (self._backlog_floor(p, A["k"]) if "k" in A else None)
        backlog = known is not None or floor is not None
        xa, xg = A["XF"], Bq["XG"]
        out_p, out_q = np.full(n, np.inf), np.full(n, np.inf)
        played: dict = {}             # link_key -> the two parts on every paced cell
        kinds: dict = {}              # (splits, delays weights) -> durations, paced cells, orders
        for s in self.schedules:
            split = s.split
            kind = (split, split and s.weight_delay and s.kind != "zb-h1")
            if kind not in kinds:
                cp, wp = (A["Bk"] - A["BC"], A["BC"]) if split else (A["Bk"], np.zeros(n))
                cq, wq = (Bq["Bk"] - Bq["BC"], Bq["BC"]) if split else (Bq["Bk"], np.zeros(n))
                paced = link_paced(xa, xg, A["F"], cq)
                if kind[1]:
                    allow_p = self._delays(A["XG"], A["BC"]) if p > 0 else (np.ones(n, dtype=bool),
                                                                            np.zeros(n, dtype=bool))
                    allow_q = self._delays(xg, Bq["BC"])
                    variants = [(dp_, dq_, allow_p[dp_] & allow_q[dq_] & paced)
                                for dp_, dq_ in itertools.product((False, True), repeat=2)]
                else:
                    variants = [(False, False, paced)]
                kinds[kind] = cp, wp, cq, wq, paced, variants
            cp, wp, cq, wq, paced, variants = kinds[kind]
            if not paced.any():
                return np.full(n, -np.inf), np.full(n, -np.inf)
            best_p, best_q = np.full(n, np.inf), np.full(n, np.inf)
            for dp_, dq_, on in variants:
                if not on.any():
                    continue
                # members that agree on the two orders share them, played on every paced cell
                key = link_key(s, self.S, p, self.B, dp_, dq_)
                if key not in played:
                    vp, vq = np.full(n, np.inf), np.full(n, np.inf)
                    args = (A["F"][paced], cp[paced], wp[paced], Bq["F"][paced], cq[paced], wq[paced], xa[paced],
                            xg[paced])
                    ends = None
                    if len(args[0]) <= _LINK_ARRAYS:
                        # a few cells: numpy's cost per call outweighs its arrays
                        run = link_numbers(s, self.S, p, self.B, dp_, dq_, uses=len(args[0]), ends=backlog)
                        runs = [run(*x, 0.0) for x in zip(*(v.tolist() for v in args))]
                        chain_p, end_p, end_q = (np.array([r[i] for r in runs], dtype=float) for i in (0, 2, 3))
                        if backlog:
                            ends = np.array([r[4] for r in runs], dtype=float).reshape(len(runs), self.B)
                    else:
                        # in slices, so that a step's arrays stay small whatever the cells
                        steps = link_steps(s, self.S, p, self.B, dp_, dq_)
                        parts = [link_time(steps, self.B, *(x[i:i + _LINK_SLICE] for x in args), 0.0, mx=np.maximum,
                                           ends=backlog)
                                 for i in range(0, len(args[0]), _LINK_SLICE)]
                        chain_p, end_p, end_q = (np.concatenate([x[i] for x in parts]) for i in (0, 2, 3))
                        if backlog:
                            ends = np.concatenate([np.stack(x[4], axis=1) for x in parts])
                    # after p's last chain op comes its drain (at least its tail); after each
                    # stage's last op (the deferred weight parts included), its own tail
                    vp[paced] = chain_p + A["G"][paced]
                    vq[paced] = np.maximum(end_p + A["G"][paced], end_q + Bq["G"][paced])
                    played[key] = vp, vq, ends
                vp, vq, ends = played[key]
                if ends is not None:
                    # the backlog reads stage p - 1's order too, which link_key does not hold:
                    # per member, on the ends the members share
                    vq = vq.copy()
                    vq[paced] = np.maximum(vq[paced], self._known_backlog(s, p, split, known, ends, A["XG"][paced])
                                           if known else self._backlog_term(s, p, split, floor, paced, ends,
                                                                            A["XG"][paced]))
                best_p[on] = np.minimum(best_p[on], vp[on])
                best_q[on] = np.minimum(best_q[on], vq[on])
            out_p = np.minimum(out_p, np.where(np.isfinite(best_p), best_p, -np.inf))
            out_q = np.minimum(out_q, np.where(np.isfinite(best_q), best_q, -np.inf))
        return out_p, out_q

    def _backlog_floor(self, p: int, firsts: np.ndarray) -> dict | None:
        """For R5's link term of stages p and p + 1 on cells of stage p starting at ``firsts``:
        the least forward, chain op (whole or split), weight part and tail of any cell of
        stage p - 1 that fits and ends just before (each least on its own: the backlog grows
        with each), and where there is one; None for the first stage.  (The objective follows
        the backlog along the channels between neighbouring stages, which every plan has:
        each layer feeds the next, :meth:`.layers.LayerModel.edges`.)"""
        if p == 0:
            return None
        key = ("backlog floor", p)
        per = self._stage.get(key)
        if per is None:
            st = self.stage(p - 1)
            ok = np.isfinite(st["INC1"])

            def least(x):
                return np.where(ok, x, np.inf).min(axis=(0, 1))

            with np.errstate(invalid="ignore"):           # inf - inf off the cells that fit
                chain = np.where(ok, st["Bk"] - st["BC"], np.inf)
            per = self._stage[key] = {
                "last": self.band(p - 1)[1], "F": least(st["F"]), "whole": least(st["Bk"]),
                "chain": least(chain), "weight": least(st["BC"]),
                "G": least(st["G"])}
        last = per["last"]
        at = np.minimum(np.searchsorted(last, firsts - 1), len(last) - 1)
        there = (last[at] == firsts - 1) & np.isfinite(per["F"][at])
        return {"there": there, **{k: per[k][at] for k in ("F", "whole", "chain", "weight", "G")}}

    def _backlog_term(self, s: Schedule, p: int, split: bool, floor: dict, paced: np.ndarray, ends: np.ndarray,
                      xg: np.ndarray) -> np.ndarray:
        """The objective's backlog (:func:`.objective._backlog`) on stage p - 1, on the paced
        cells: micro-batch m's chain op on stage p ends at ``ends[:, m]`` (the link played
        out), its gradient reaches stage p - 1 after ``xg``, which then still has every op
        from its chain op of m to its last (counted from its order, the fewer of the two when
        it may delay its weight parts) and its tail, each at the least of its cells (``floor``,
        :meth:`_backlog_floor`); -inf on cells where it has none."""
        nf, nc, nw = _least_counts(s, self.S, p - 1, self.B, s.weight_delay)
        f, g, there = floor["F"][paced], floor["G"][paced], floor["there"][paced]
        c = floor["chain"][paced] if split else floor["whole"][paced]
        w = floor["weight"][paced] if split else np.zeros(len(f))
        with np.errstate(invalid="ignore"):
            work = ends + xg[:, None] + nf * f[:, None] + nc * c[:, None] + nw * w[:, None]
            term = work.max(axis=1) + g
        return np.where(there & np.isfinite(term), term, -np.inf)

    def _known_backlog(self, s: Schedule, p: int, split: bool, known: tuple, ends: np.ndarray,
                       xg: np.ndarray) -> np.ndarray:
        """The objective's backlog on the earlier stages whose values are ``known`` (stage
        p - 1 first): stage r still has, from m's gradient on, every op from its chain op of m
        to its last and its drain (its tail, or back through the known stages before it, as
        the objective's D), m's gradient reaching it through the chain ops and transfers of
        the stages in between.  Per stage a row over the micro-batches, remembered per member
        and prefix; the cells add only the link's ends."""
        key = ("backlog", s, p, split) + tuple(map(id, known))
        hit = self._values.get(key)
        if hit is None or not _same(hit[0], known):
            chains = [v["Bk"] - v["BC"] if split else v["Bk"] for v in known]
            drains = [0.0] * len(known)
            for back in range(len(known) - 1, -1, -1):
                drains[back] = known[back]["G"]
                if back + 1 < len(known):
                    drains[back] = max(drains[back], known[back]["XG"] + chains[back + 1] + drains[back + 1])
            rows, offset = [], 0.0
            for back, v in enumerate(known):
                nf, nc, nw = _least_counts(s, self.S, p - 1 - back, self.B, s.weight_delay)
                rows.append(offset + nf * v["F"] + nc * chains[back] + (nw * v["BC"] if split else 0.0)
                            + drains[back])
                offset += chains[back] + v["XG"]
            hit = self._values[key] = (known, np.array(rows))
        rows = hit[1]
        return (ends[:, None, :] + rows[None, :, :]).max(axis=(1, 2)) + xg

    def _delays(self, sends, weight) -> tuple[np.ndarray, np.ndarray]:
        """(may not delay, may delay) per cell: a stage delays its weight parts when its
        gradient transfers outlast them (:func:`.pipeline.weight_delays`).  The cut's own
        transfer is the stage's whole send without skip connections, at least it with them;
        within a relative 1e-9 of the weight part either may happen (the cells and the plan
        price the same transfer in a different order of operations)."""
        above = sends > weight * (1 + 1e-9)
        below = sends < weight * (1 - 1e-9)
        return ~above, (np.ones(len(above), dtype=bool) if self._skips else ~below)

    def _neighbor_masks(self, tau, prefix, vals, cells, masks, fills, drains) -> list | None:
        """``masks`` with every cell removed that lies on no completion whose R5 terms all stay
        at most tau (forward and backward reachability over pairs of neighbouring cells),
        each with the least fill reaching its cell (``fills``: R2's program's accumulators,
        as for R3 in :meth:`_ymaxes`) and the least fill and drain together (``drains``:
        :meth:`_drains`); None: there is no such completion."""
        j0 = len(prefix)
        fill = [0.0]
        for v in vals:
            fill.append(fill[-1] + v["INC2"])
        off = self._r3_fills(vals)
        for p in range(j0 - 1):
            if self._r5_has(p):
                drained, filled = self._neighbor_term(p, vals[p], vals[p + 1], earlier=_earlier(vals, p))
                if off[p] + drained > tau or fill[p] + filled > tau:
                    return None
        keep = [np.ones(len(c["k"]), dtype=bool) if m is None else ~m for m, c in zip(masks, cells)]
        keep[0] &= cells[0]["k"] == (prefix[-1].last + 1 if prefix else 0)
        if j0 and self._r5_has(j0 - 1):
            # the prefix's last stage before each first cell: remembered per list of cells
            memo = cells[0].setdefault("after_prefix", {})
            earlier = _earlier(vals, j0 - 1)
            key = (j0, id(vals[-1])) + tuple(map(id, earlier))
            hit = memo.get(key)
            if hit is None or hit[0] is not vals[-1] or not _same(hit[1], earlier):
                if len(memo) >= 256:          # an array per prefix: kept few
                    memo.clear()
                hit = memo[key] = (vals[-1], earlier, self._neighbor_term(j0 - 1, vals[-1], cells[0], earlier=earlier))
            drained, filled = hit[2]
            keep[0] &= (off[j0 - 1] + drained <= tau) & (fill[j0 - 1] + filled <= tau)
        budgets = []        # per cell: tau less its least fill and drain, and less its least fill
        with np.errstate(invalid="ignore"):         # tau = inf: inf - inf where unreached
            for q, (acc, c) in enumerate(zip(fills, cells)):
                hk = acc[c["k"]]
                ek = np.maximum(hk, drains[q][c["k"]] + c["XG"] - c["G"])
                budgets.append((np.where(np.isfinite(ek), tau - ek, -np.inf),
                                np.where(np.isfinite(hk), tau - hk, -np.inf)))
        # forward: cells reached through passing pairs; then backward: cells with a passing
        # completion (the last stage's cells end the plan)
        reach = [keep[0]]
        for q in range(1, len(cells)):
            reach.append(keep[q] & self._neighbor_step(j0 + q - 1, cells[q - 1], reach[q - 1], cells[q],
                                                       budgets[q - 1], True))
        good = reach[-1]
        out = list(masks)
        out[-1] = ~good
        for q in range(len(cells) - 2, -1, -1):
            good = reach[q] & self._neighbor_step(j0 + q, cells[q], good, cells[q + 1], budgets[q], False)
            out[q] = ~good
            if not good.any():
                return None
        if not out[-1].size or out[-1].all():
            return None
        return out

    def _neighbor_pairs(self, p: int, ca: dict, cb: dict) -> tuple:
        """The pairs of a cell of ``ca`` (stage p) and a cell of ``cb`` (stage p + 1) that
        follows it, as index arrays, and R5's two terms of stage p on each (:meth:`_neighbor_term`;
        -inf when stage p has none).  Remembered in ``ca`` for ``cb``: they do not depend on tau."""
        memo = ca.setdefault("neighbor", {})
        if cb["uid"] in memo:
            return memo[cb["uid"]]
        ia_parts, ib_parts = [], []
        bk = cb["k"][cb["by_k"]]
        for start, layer in zip(ca["starts"], ca["ends"] + 1):
            lo, hi = np.searchsorted(bk, layer), np.searchsorted(bk, layer, side="right")
            if lo == hi:
                continue
            stop = np.searchsorted(ca["i"], layer - 1, side="right")
            ia = np.arange(start, stop)
            ib = cb["by_k"][lo:hi]
            ia_parts.append(np.repeat(ia, len(ib)))
            ib_parts.append(np.tile(ib, len(ia)))
        ia = np.concatenate(ia_parts) if ia_parts else np.zeros(0, dtype=int)
        ib = np.concatenate(ib_parts) if ib_parts else np.zeros(0, dtype=int)
        drained = np.full(len(ia), -np.inf)
        if self._r5_has(p) and len(ia):
            a = {key: ca[key][ia] for key in _CELL}
            b = {key: cb[key][ib] for key in _CELL}
            drained = np.array(np.broadcast_to(np.asarray(self._neighbor_term(p, a, b, links=False)[0], dtype=float),
                                               (len(ia),)))
        # the link terms are played only for the pairs a step asks about (:meth:`_neighbor_step`)
        played = np.zeros(len(ia), dtype=bool) if self._links_on() else np.ones(len(ia), dtype=bool)
        memo[cb["uid"]] = (ia, ib, drained, np.full(len(ia), -np.inf), played)
        return memo[cb["uid"]]

    def _neighbor_step(self, p: int, ca: dict, ok_a: np.ndarray, cb: dict, budget: tuple,
                       forward: bool) -> np.ndarray:
        """Forward: which cells of ``cb`` (stage p + 1) follow some cell of ``ca`` kept by
        ``ok_a`` with R5's terms of stage p at most the cell's ``budget`` (tau less its least
        fill and drain, tau less its least fill).  Backward: which cells of ``ca`` precede
        some cell of ``cb`` kept by ``ok_a``.

        The link bound is played on the pairs still in question only (kept by ``ok_a``, and
        within the budget by the neighbour cycle alone), once each: on a 16-GPU instance
        where no link decides anything, playing every pair took a quarter of the search."""
        ia, ib, drained, filled, played = self._neighbor_pairs(p, ca, cb)
        alive = (ok_a[ia] if forward else ok_a[ib]) & (drained <= budget[0][ia])
        todo = alive & ~played
        if todo.any():
            ja, jb = ia[todo], ib[todo]
            mine, theirs = self._link_term(p, {key: ca[key][ja] for key in _CELL}, {key: cb[key][jb] for key in _CELL})
            drained[todo] = np.maximum(drained[todo], mine)
            filled[todo] = theirs
            played |= todo
        ok = alive & (drained <= budget[0][ia]) & (filled <= budget[1][ia])
        if forward:
            out = np.zeros(len(cb["k"]), dtype=bool)
            out[ib[ok]] = True
        else:
            out = np.zeros(len(ca["k"]), dtype=bool)
            out[ia[ok]] = True
        return out

    def _tie_floor(self, p: int, t: int, k: np.ndarray, i: np.ndarray, opt) -> np.ndarray | float:
        """On stage p's cells of layers k..i (broadcast index arrays): the least all-reduce of
        a tied layer such a stage waits for (tensor degree ``t``), and what the other stage's
        optimizer step adds after it to the cell's own step ``opt`` (its time on those cells).
        Both stages of a tie wait, after their own reductions, for the all-reduce of the
        copy's gradient, and both optimizer steps wait for it (objective.py's ``u``: the drain
        of the stage and cycle bounds).  The other stage holds the other layer of the tie, so
        its step takes at least that layer's alone, in the configuration where it is least
        (a step's time grows with the layers it updates):

        * a stage holding the copy b without the layer a it shares: a's stage is one of
          0..min(p - 1, a) (every stage holds a layer), so the least over them is a lower
          bound.  Without it the relaxation missed the largest term of plans whose tied
          embedding crosses the network (46-71% gaps on small tied models);
        * a stage holding a without b: b's stage is one of max(p + 1, S - L + b)..min(S - 1, b)
          (b = L - 1: the last stage), with any configuration's tensor degree.  Counted in
          R1 through the first stage's drain, it took the embedding's wait into the
          relaxation: on a 16-GPU model whose tied all-reduce crosses 3 hosts the loosest
          pair's R rose from 0.31 to 0.37 s and the gap fell from 34% to 21%
          (benchmarks/small_gaps.py, seed 11)."""
        ties = self.costs.model.ties()
        if not ties or not self.costs.comm:
            return 0.0
        S, L = self.S, self.L
        out = np.zeros(np.broadcast_shapes(np.shape(k), np.shape(i)))
        degrees = sorted({cfg.tensor for cfg in self.configs})
        # each all-reduce is priced only where the band has such cells (a collective over a
        # stage's devices costs time: on 100 000 GPUs, 1 536 of them)
        for a, b in ties:
            holds_copy = (a < k) & (k <= b) & (b <= i)
            if p > 0 and holds_copy.any():
                least = min(self.costs.tie_between(b, sa, p, t)[0] for sa in range(min(p - 1, a) + 1))
                after = np.maximum(0.0, self._least_step(a) - opt)
                out = np.maximum(out, np.where(holds_copy, least + after, 0.0))
            holds_original = (k <= a) & (a <= i) & (i < b)
            copies = range(max(p + 1, S - L + b), min(S - 1, b) + 1)
            if len(copies) and holds_original.any():
                # the copy's stage is the last one when b is the last layer: with its degree
                # fixed (variants), so are the all-reduce's bytes and the degree of its step
                last = self.last_tensor if copies[0] == S - 1 else None
                least = min(self.costs.tie_between(b, p, sb, tb)[0] for sb in copies
                            for tb in (degrees if sb < S - 1 or last is None else [last]))
                after = np.maximum(0.0, self._least_step(b, last) - opt)
                out = np.maximum(out, np.where(holds_original, least + after, 0.0))
        return out

    def _least_step(self, layer: int, tensor: int | None = None) -> float:
        """The least optimizer step of a stage holding ``layer``: that layer's alone (with the
        tied copy's bytes it holds there), in the configuration where it is least (of tensor
        degree ``tensor`` when given)."""
        key = ("least step", layer, tensor)
        if key not in self._stage:
            self._stage[key] = min(float(self._config_arrays(j)["opt"][layer, layer]) for j, cfg in enumerate(self.configs)
                                   if tensor in (None, cfg.tensor))
        return self._stage[key]

    def stage_arrays(self, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T1, T2, INC1) of stage p (the arrays of R1 and of CP-SAT; not for large pairs)."""
        st = self.stage(p)
        return st["T1"], st["T2"], st["INC1"]

    def _cells(self, p: int, limit: float) -> dict:
        """Stage p's cells that fit and whose ``T2`` is at most ``limit``, sorted by last layer
        (a cached list with a somewhat larger limit is as good: the DPs mask the rest)."""
        key = ("cells", p)
        hit = self._stage.get(key)
        if hit is not None and hit["limit"] >= limit and (hit["limit"] <= 1.5 * limit or hit["limit"] == limit):
            self._set_windows(p, hit, limit)
            return hit
        if self.sparse:
            j, k, i, values = self._sparse_cells(p, limit)
        else:
            st = self.stage(p)
            j, k, i = np.nonzero(np.isfinite(st["INC1"]) & (st["T2"] <= limit))
            values = {key: st[key][j, k, i] for key in self._KEYS}
        order = np.lexsort((j, k, i))
        j, k, i = j[order], k[order], i[order]
        firsts, lasts = self.band(p)
        cells = {key: values[key][order] for key in self._KEYS}
        cells.update({"limit": limit, "j": j, "k": firsts[k], "i": lasts[i], "bk": k, "bi": i, "uid": next(_UIDS)})
        cells["starts"] = np.flatnonzero(np.r_[True, i[1:] != i[:-1]]) if len(i) else np.zeros(0, dtype=int)
        cells["ends"] = lasts[i][cells["starts"]] if len(i) else np.zeros(0, dtype=int)
        by_k = np.argsort(k, kind="stable")
        cells["by_k"] = by_k
        ks = k[by_k]
        cells["starts_k"] = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]]) if len(k) else np.zeros(0, dtype=int)
        cells["firsts"] = firsts[ks][cells["starts_k"]] if len(k) else np.zeros(0, dtype=int)
        # the cycle bound's (j + 1, C0) for each warm-up count W of the family (objective.py)
        cells["cycle"] = [(W, (self.B - 1) // W + 1, ((self.B - 1) // W) * (cells["Bk"] - cells["BC"])
                           + (self.B - ((self.B - 1) // W) * W) * cells["Bk"] - cells["BC"] + cells["G"])
                          for W in self.warmups(p)]
        self._set_windows(p, cells, limit)
        self._stage[key] = cells
        return cells

    def _set_windows(self, p: int, cells: dict, limit: float) -> None:
        """R3's window terms of stage p's ``cells`` (``cells["window"]``) on the plans whose
        stages all have ``T2`` at most ``limit`` rounded up to the grid (:meth:`_window_sums`:
        the fewer units a later stage can hold, the larger the windows; cells kept for a
        larger limit get them at the lower one, and keep those of the last few limits)."""
        if cells.get("window_asked") == limit:
            return
        cells["window_asked"] = limit
        limit = _grid(limit)
        kept = cells.setdefault("windows", {})
        if limit not in kept:
            sums = self._window_sums(p, limit)
            if sums is not None:
                sums = sums[:, cells["bi"]]
            while len(kept) >= 3:
                del kept[next(iter(kept))]
            kept[limit] = {W: self._window_value(p, W, cells, sums) for W in self.warmups(p)}
        cells["window"] = kept[limit]
        cells["window_limit"] = limit

    def _cell(self, p: int, st: StagePlan) -> tuple[int, int, int]:
        return (self.configs.index(st.config),) + self.band_index(p, st.first, st.last)

    def _value(self, p: int, st: StagePlan) -> dict[str, float] | None:
        key = (p, st)
        if key in self._values:
            return self._values[key]
        out = None
        if st.config in self.configs:
            j, k, i = self._cell(p, st)
            if 0 <= k < self.n and 0 <= i < self.n and self.sparse:
                if k <= i and self._fits(p, j, st.first, st.last):
                    arr = self._config_arrays(j)
                    K, I = np.asarray([st.first]), np.asarray([st.last])
                    values = self._cell_values(p, j, lambda name: np.asarray(arr[name][K, I]), K, I)
                    out = {name: float(values[name][0]) for name in self._KEYS}
            elif 0 <= k < self.n and 0 <= i < self.n:
                arrs = self.stage(p)
                v = {name: float(arrs[name][j, k, i]) for name in self._KEYS}
                out = v if math.isfinite(v["INC1"]) else None
        if out is not None:
            out["k"] = float(st.first)        # R5's backlog reads the earlier stage's last layer
        self._values[key] = out
        return out

    def _fits(self, p: int, j: int, first, last) -> np.ndarray:
        """Can stage p hold layers first..last (arrays) with configuration j (:meth:`fits_mask`'s
        rule, on cells)?"""
        c = self.costs
        ok = np.asarray(c.memory(self.configs[j], self.live_min(p))[np.asarray(first), np.asarray(last)]) <= c.device_memory
        if p == 0:
            ok = ok & (np.asarray(first) == 0)
        if p == self.S - 1:
            ok = ok & (np.asarray(last) == self.L - 1)
        return ok

    def _sparse_cells(self, p: int, limit: float):
        """:meth:`_cells`' cells built cell by cell, without the band's squares (large pairs,
        :attr:`sparse`): for each first layer, the stage grows while it fits and its work
        for every micro-batch, part of ``T2``, stays at most ``limit`` (both only grow).
        Returns band indices (j, k, i) and the terms of :meth:`stage` on them."""
        n, B = self.n, self.B
        firsts, lasts = self.band(p)
        parts = []
        for j, cfg in enumerate(self.configs):
            arr = self._config_arrays(j)
            work = self.costs[cfg].work
            mem = self.costs.memory(cfg, self.live_min(p))
            bk = np.zeros(1, dtype=int) if p == 0 else np.arange(n)

            def grows(bi):
                ok = np.asarray(mem[firsts[bk], lasts[bi]]) <= self.costs.device_memory
                if math.isfinite(limit):
                    ok &= B * np.asarray(work[firsts[bk], lasts[bi]]) <= limit
                return ok

            lo, hi = bk - 1, np.full(len(bk), n)       # lo: grows (or empty), hi: does not
            while True:
                open_ = hi - lo > 1
                if not open_.any():
                    break
                mid = np.where(open_, (lo + hi) // 2, bk)
                ok = grows(mid) | ~open_
                lo = np.where(open_ & ok, mid, lo)
                hi = np.where(open_ & ~ok, mid, hi)
            if p == self.S - 1:
                keep = lo == n - 1
                ks, is_ = bk[keep], np.full(int(keep.sum()), n - 1)
            else:
                counts = np.maximum(lo - bk + 1, 0)
                ks = np.repeat(bk, counts)
                starts = np.repeat(np.cumsum(counts) - counts, counts)
                is_ = ks + (np.arange(len(ks)) - starts)
            if not len(ks):
                continue
            K, I = firsts[ks], lasts[is_]
            values = self._cell_values(p, j, lambda name: np.asarray(arr[name][K, I]), K, I)
            keep = values["T2"] <= limit
            parts.append((np.full(int(keep.sum()), j), ks[keep], is_[keep],
                          {key: np.asarray(values[key])[keep] for key in self._KEYS}))
        if not parts:
            empty = np.zeros(0, dtype=int)
            return empty, empty, empty, {key: np.zeros(0) for key in self._KEYS}
        return (np.concatenate([x[0] for x in parts]), np.concatenate([x[1] for x in parts]),
                np.concatenate([x[2] for x in parts]),
                {key: np.concatenate([x[3][key] for x in parts]) for key in self._KEYS})

    def _cycle_term(self, p: int, v: dict[str, float], y: float, sums: np.ndarray | None = None) -> float:
        """R3's term of stage p with round trip ``x(p->p+1) + y``: over the family's warm-up
        counts, the least of max(cycle, phase) (objective.py, without fill and drain).
        ``sums``: the windows' later stages as :meth:`_window_value` takes them."""
        if not self.r3:
            return -math.inf
        best = math.inf
        b = v["Bk"]
        for W in self.warmups(p):
            j = (self.B - 1) // W
            c0 = j * (v["Bk"] - v["BC"]) + (self.B - j * W) * v["Bk"] - v["BC"] + v["G"]
            cycle = (j + 1) * (v["K3"] + y) + c0
            R = v["XF"] + y
            phase = phase_time(v["F"], b, b - v["BC"], R, W, self.B) + v["G"]
            window = self._window_value(p, W, v, sums)
            if window is not None:
                phase = max(phase, float(window) + R + max(R, (W - 1) * (b - v["BC"])))
            best = min(best, max(cycle, phase))
        return best

    def _window_minima(self) -> tuple[np.ndarray, np.ndarray]:
        """Per stage, the least ``f + c + x(p->p-1) + x(p->p+1)`` over the cells that fit (a
        stage inside a window), and the least without ``x(p->p+1)`` (a window's last stage)."""
        if self._minima is None and self.sparse:
            self._minima = self._sparse_window_minima()
        if self._minima is None:
            inner, last = np.full(self.S, np.inf), np.full(self.S, np.inf)
            for i in range(self.S):
                st = self.stage(i)
                ok = np.isfinite(st["INC1"])
                if ok.any():
                    base = st["F"][ok] + (st["Bk"][ok] - st["BC"][ok]) + st["XG"][ok]
                    inner[i], last[i] = (base + st["XF"][ok]).min(), base.min()
            self._minima = (inner, last)
        return self._minima

    def _sparse_window_minima(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_window_minima` of a large pair, lower: per configuration, the least
        ``f + c`` of one unit of the band (a stage holds at least one, and both grow with
        the layers) plus the least transfers in and out over the band's first and last
        layers (memory not asked: a lower bound all the same)."""
        inner, last = np.full(self.S, np.inf), np.full(self.S, np.inf)
        c, n = self.costs, self.n
        # every unit once (stage p's band is units p .. p + n - 1), then each band's least:
        # the bands overlap, and read per stage a unit was read up to S times
        k, i = self.pos[:-1], self.pos[1:] - 1
        for j, cfg in enumerate(self.configs):
            arr = self._config_arrays(j)
            fc_all = np.asarray(arr["F"][k, i]) + np.asarray(arr["C"][k, i])
            acts = arr["act"]
            before, after = acts[k - 1], acts[i]      # what enters a band's first unit, leaves its last
            for p in range(self.S):
                fc = float(fc_all[p:p + n].min())
                xg = 0.0
                if p > 0:
                    # a + b x grows with x (b >= 0): its least is at the least x
                    a, b = c.transfer(cfg.tensor, p, p - 1)
                    xg = float(a + b * before[p:p + n].min())
                xf = 0.0
                if p + 1 < self.S:
                    a, b = c.transfer(cfg.tensor, p, p + 1)
                    xf = float(a + b * after[p:p + n].min())
                inner[p] = min(inner[p], fc + xg + xf)
                last[p] = min(last[p], fc + xg)
        return inner, last

    def _windows(self, p: int) -> dict[int, list | None]:
        """Per warm-up count W of stage p (R3's members): for each member of the family with
        that count, its windows from stage p (neighbor.py) as ``(j, r, M, h)``: jumps after the
        first round trip, forward steps left, the least ``J`` less stage p's own
        ``f + c + x(p->p+1)`` (the later stages' parts at their stage's least, so ``J`` is a
        lower bound whatever cells the plan takes), and the depth.  None: a member has no
        window."""
        key = ("windows", p)
        if key not in self._stage:
            inner, last = self._window_minima()
            cum = np.concatenate([[0.0], np.cumsum(inner)])
            depths = sorted({h for h in _DEPTHS if p + h < self.S} | {self.S - 1 - p} - {0})
            out: dict[int, list | None] = {}
            for s in self.schedules:
                mine = []
                W = steady_warmup(s, self.S, p, self.B)
                for h in depths if W is not None else ():
                    V = steady_warmup(s, self.S, p + h, self.B)
                    if V is None or W - V + 1 < 1:
                        break                   # no window reaches past this stage
                    j, r = jumps_after_trip(W, V, self.B)
                    with np.errstate(invalid="ignore"):     # a stage without cells: inf - inf
                        M = cum[p + h] - cum[p + 1] + last[p + h]
                    if j > 0 and np.isfinite(M):
                        mine.append((j, r, float(M), h))
                # a member without windows leaves its warm-up count without any (the least
                # over the members would be no bound)
                W0 = warmup(s, self.S, p, self.B)
                group = out.setdefault(W0, [])
                out[W0] = group + [mine] if mine and group is not None else None
            self._stage[key] = out
        return self._stage[key]

    def _unit_costs(self, limit: float) -> tuple[list, list, np.ndarray]:
        """Per stage q and count ``u`` of units (index ``u``, 1 to ``cap_q``): the least
        ``f + c + x(q->q-1) + x(q->q+1)`` (inside a window) and the least without
        ``x(q->q+1)`` (a window's last stage) over q's cells of ``u`` units that may lie on
        a plan whose R1 and R2 are at most ``limit`` (they fit, and pass R1's and R2's
        programs and completion below); and ``cap_q``, the most units such a cell holds (0:
        none)."""
        key = ("unit costs", limit)
        if key in self._stage:
            return self._stage[key]
        n = self.n
        span = np.arange(n)[None, :] - np.arange(n)[:, None] + 1      # units of cell (k, i)

        inner, last, caps = [], [], np.zeros(self.S, dtype=int)
        U = len(self.pos) - 1
        oks = [np.isfinite(self.stage(q)["INC1"]) & (self.stage(q)["T2"] <= limit) for q in range(self.S)]
        # R1's and R2's forward programs (the least accumulators reaching each first unit: a
        # late stage holds many units only after the earlier ones held the rest), completion
        # (the later stages can hold the units after a cell), then the forward programs
        # again; each removes only cells on no plan with R1 and R2 at most the limit
        for rounds in range(2):
            A, H = np.full(U + 1, np.inf), np.full(U + 1, np.inf)
            A[0] = H[0] = 0.0
            for q in range(self.S):
                st, ok = self.stage(q), oks[q]
                a, h = A[q:q + n][None, :, None], H[q:q + n][None, :, None]
                with np.errstate(invalid="ignore"):        # inf - inf where nothing reaches
                    ok &= h + st["T2"] <= limit
                    if q > 0:
                        ok &= a + st["T1"] <= limit
                A, H = np.full(U + 1, np.inf), np.full(U + 1, np.inf)
                if ok.any():
                    A[q + 1:q + 1 + n] = np.where(ok, a + st["INC1"], np.inf).min(axis=(0, 1))
                    H[q + 1:q + 1 + n] = np.where(ok, h + st["INC2"], np.inf).min(axis=(0, 1))
            if rounds:
                break               # the caps come from the second forward pass
            done = np.zeros(U + 1, dtype=bool)
            done[U] = True
            for q in range(self.S - 1, -1, -1):
                ok = oks[q]
                ok &= done[q + 1:q + 1 + n][None, None, :]
                done = np.zeros(U + 1, dtype=bool)
                done[q:q + n] = ok.any(axis=(0, 2))
        # cell (k, k + u - 1) of the band as row k, column u - 1 (past the band: left out)
        rows = np.arange(n)[:, None]
        ends = rows + np.arange(n)[None, :]
        inside = ends < n
        ends = np.minimum(ends, n - 1)
        for q in range(self.S):
            st, ok = self.stage(q), oks[q]
            cap = int(np.where(ok, span[None], 0).max()) if ok.any() else 0
            with np.errstate(invalid="ignore"):            # inf - inf where nothing fits
                base = np.where(ok, st["F"] + (st["Bk"] - st["BC"]) + st["XG"], np.inf)
            xf = np.where(ok, st["XF"], 0.0)
            by_span = np.where(inside, base[:, rows, ends], np.inf)         # (configs, k, u - 1)
            with_xf = by_span + xf[:, rows, ends]
            inner.append(np.concatenate([[np.inf], with_xf.min(axis=(0, 1))[:cap]]))
            last.append(np.concatenate([[np.inf], by_span.min(axis=(0, 1))[:cap]]))
            caps[q] = cap
        out = (inner, last, caps)
        self._keep(key, out)
        return out

    def _keep(self, key: tuple, value) -> None:
        """Cache a counting of R3's windows at one limit, the oldest of its kind dropped past
        eight limits (the programs count at their cutoff, whole plans at their R1 and R2)."""
        same = [k for k in self._stage if isinstance(k, tuple) and k[:1] == key[:1] and k != key]
        for old in same[:max(0, len(same) - 7)]:
            del self._stage[old]
        self._stage[key] = value

    def _counted(self, stages, limit: float) -> list[np.ndarray | None]:
        """Per stage of ``stages`` (a plan, or a subspace's prefix), :meth:`_window_value`'s
        ``sums`` for its cell: :meth:`_window_sums` at ``limit`` (None where not counted)."""
        out: list[np.ndarray | None] = [None] * len(stages)
        every = self._every_window_sums(limit)
        if every is None:
            return out
        for p, st in enumerate(stages[:self.S - 1]):
            out[p] = every[p, :, self.band_index(p, st.first, st.last)[1]]
        return out

    def _window_sums(self, p: int, limit: float) -> np.ndarray | None:
        """Per depth ``h`` of stage p's windows (row ``_COLUMN[h]``, or ``_TO_END`` for the
        window to the last stage), per band index of the cell's last unit: a lower bound of
        the later stages' part of the window's ``J`` on every plan through such a cell whose
        R1 and R2 are at most ``limit`` (every plan with ``R <= limit``).

        Counting: the stages after the cell hold exactly the units after it; those after
        the window hold at most ``cap_q`` each (:meth:`_unit_costs`), so the window's ``h``
        stages hold at least the rest, ``m``; the least sum of their costs over unit counts
        ``u_q <= cap_q`` adding up to ``m`` or more is a min-plus convolution.  The least
        cell of each stage (``_window_minima``) is one unit each; where every stage's cap
        is about the average, this is about the plan's own (the 1T model on 4 096 GPUs, 64
        stages of two layers: full recomputation early, selective late).  None on large
        pairs (their cells are not built as squares)."""
        every = self._every_window_sums(limit) if p < self.S - 1 else None
        return None if every is None else every[p]

    def _every_window_sums(self, limit: float) -> np.ndarray | None:
        """:meth:`_all_window_sums` at ``limit``, kept (None where windows are not counted)."""
        if not math.isfinite(limit) or not self._counts():
            return None
        key = ("window sums", limit)
        if key not in self._stage:
            self._keep(key, self._all_window_sums(limit))
        return self._stage[key]

    def _counts(self) -> bool:
        """Are R3's windows counted (:meth:`_window_sums`): R3 on, transfers priced, cells
        built as squares, and some stage reading a window?"""
        if "counts" not in self._stage:
            self._stage["counts"] = (self.r3 and bool(self.costs.comm) and not self.sparse
                                     and any(members for p in range(self.S - 1) for members in self._windows(p).values()))
        return self._stage["counts"]

    def _all_window_sums(self, limit: float) -> np.ndarray:
        """:meth:`_window_sums` of every stage at once, ``[p, column of h, bi]``: one min-plus
        program over (first stage of the window, units held) per last stage ``e``.

        Units are counted beyond one per stage (the excess): a window of stages ``p + 1 ..
        e`` after a cell ending at band index ``bi`` must hold ``need(e) - bi`` more than one
        each, ``need(e) = U - 1 - e - (caps of the stages after e)``, the same for every
        ``p``; so the programs run over excesses up to the largest need only, the larger
        ones merged (a stage's costs beyond that need are their least)."""
        inner, last, caps = self._unit_costs(limit)
        S, n, U = self.S, self.n, len(self.pos) - 1
        after = np.concatenate([np.cumsum(caps[::-1])[::-1][1:], [0]])     # after[e]: caps of stages > e
        need = U - 1 - np.arange(S) - after
        E = int(max(0, need.max()))

        def excess(cost):
            """Costs by excess 0 .. E (the last: any excess from E on)."""
            x = np.asarray(cost[1:], dtype=float)
            if len(x) > E + 1:
                x = np.concatenate([x[:E], [x[E:].min()]])
            return x

        def conv(G, cost):
            out = np.full(G.shape, np.inf)
            for x, c in enumerate(cost):
                if np.isfinite(c):
                    np.minimum(out[:, x:], G[:, :E + 1 - x] + c, out=out[:, x:])
                    if x:                                     # excesses past E stay at E
                        np.minimum(out[:, E], G[:, E + 1 - x:].min(axis=1) + c, out=out[:, E])
            return out

        # only the depths windows read are kept (memory: S x 28 x n, not S x S x n)
        out = np.full((S, _TO_END + 1, n), np.inf)
        G = np.full((S, E + 1), np.inf)         # row p: the window's stages p + 1 .. e so far
        G[:, 0] = 0.0
        bi = np.arange(n)
        column = np.full(S + 1, -1)
        column[[h for h in _DEPTHS if h <= S]] = [_COLUMN[h] for h in _DEPTHS if h <= S]
        for e in range(1, S):
            r = np.arange(e)
            cols = np.full(e, _TO_END) if e == S - 1 else column[e - r]
            keep = cols >= 0
            if keep.any():
                least = np.minimum.accumulate(conv(G[:e], excess(last[e]))[:, ::-1], axis=1)[:, ::-1]   # at least x
                out[r[keep], cols[keep]] = least[keep][:, np.clip(need[e] - bi, 0, E)]
            G[:e] = conv(G[:e], excess(inner[e]))
        return out

    def _window_value(self, p: int, W: int, v: dict, sums: np.ndarray | None = None):
        """R3's window term of stage p's cells ``v`` (arrays, or one cell's values) for the
        members with ``W`` warm-up forwards, without the fill and the two round trips
        (``R + max(R, (W - 1) c)``, which the caller adds): ``2 f + 2 c + G`` and the largest
        ``j J + r (f + c)`` over the windows, the least over the members; None without one.
        ``sums``: per depth (rows as :meth:`_window_sums`), a larger lower bound of the later
        stages' part of ``J`` for these cells."""
        members = self._windows(p).get(W)
        if not members or not self.costs.comm:
            return None
        f, ch = v["F"], v["Bk"] - v["BC"]
        if np.ndim(f) == 0:
            return self._window_number(p, members, float(f), float(ch), float(v["XF"]), float(v["G"]), sums)
        w = f + ch
        head = w + v["XF"]
        out = None
        for windows in members:
            best = None
            for j, r, M, h in windows:
                if sums is not None:
                    M = np.maximum(M, sums[_TO_END if p + h == self.S - 1 else _COLUMN[h]])
                x = j * (head + M) + r * w
                best = x if best is None else np.maximum(best, x)
            out = best if out is None else np.minimum(out, best)
        return 2 * w + v["G"] + out

    def _window_number(self, p: int, members: list, f: float, ch: float, xf: float, g: float,
                       sums: np.ndarray | None) -> float:
        """:meth:`_window_value` of one cell, in Python numbers (the whole plans' and the
        prefixes' R3 ask for one cell at a time: numpy on single values made small eager-1F1B
        searches 13% slower, ``farm-bench`` on small_gaps' seeds 50, 52 and 54).  A test
        checks it against the array loop cell by cell."""
        w = f + ch
        head = w + xf
        rows = None if sums is None else sums.tolist()
        out = math.inf
        for windows in members:
            best = -math.inf
            for j, r, M, h in windows:
                if rows is not None:
                    M = max(M, rows[_TO_END if p + h == self.S - 1 else _COLUMN[h]])
                x = j * (head + M) + r * w
                if x > best:
                    best = x
            if best < out:
                out = best
        return 2 * w + g + out

    def _ymax(self, c: dict, tau: float) -> np.ndarray:
        """Per cell, the largest incoming round trip y with a cycle and a phase term at most
        tau under some warm-up count of the family (R3's test of a cell).  Every warm-up
        count at once, as ``(counts, cells)`` arrays: one count at a time, numpy's cost per
        call was most of it (GPT-3 175B on 16 384 GPUs under eager-1F1B, 5-7 counts per
        stage: 350 000 calls, a fifth of the search); element for element the same
        arithmetic as one count at a time (tests/test_stages_windows.py holds that loop)."""
        if not self.r3:
            return np.full(len(c["k"]), np.inf)
        if not c["cycle"]:
            return np.full(len(c["k"]), -np.inf)
        stack = c.get("cycle_stack")
        if stack is None:
            Ws = np.array([W for W, _, _ in c["cycle"]])[:, None]
            stack = c["cycle_stack"] = (Ws, np.array([jp1 for _, jp1, _ in c["cycle"]], dtype=float)[:, None],
                                        np.stack([c0 for _, _, c0 in c["cycle"]]), (Ws - 1) * (c["Bk"] - c["BC"]))
        Ws, jp1, c0, K = stack
        with np.errstate(invalid="ignore"):     # both branches are computed; np.where keeps one
            lim = np.minimum((tau - c0) / jp1 - c["K3"], self._phase_ymaxes(c, Ws, tau))
            held = c.get("window_stack")
            if held is None or held[0] is not c["window"]:
                # the windows of the limit the cells were last asked at (_set_windows): stacked
                # once per such dict, which the cache holds (so its id is not reused)
                windows = [c["window"][W] for W, _, _ in c["cycle"]]
                some = any(w is not None for w in windows)
                held = c["window_stack"] = (
                    c["window"], some,
                    np.stack([np.full(len(c["k"]), np.nan) if w is None else w for w in windows]) if some else None,
                    np.array([w is not None for w in windows])[:, None])
            _, some, win, has = held
            if some:
                # R + max(R, K) <= T: R <= min(T - K, T / 2)
                T = np.where(np.isfinite(win), tau - win, -np.inf)
                lim = np.where(has, np.minimum(lim, np.minimum(T - K, T / 2) - c["XF"]), lim)
        return lim.max(axis=0)

    def _phase_ymaxes(self, c: dict, Ws: np.ndarray, tau: float) -> np.ndarray:
        """Per cell and warm-up count in ``Ws`` (a column), the largest incoming round trip y
        whose phase term (:func:`.objective.phase_time`) stays at most tau; what does not
        depend on tau is kept with the cells."""
        k = c.get("phase_stack")
        if k is None:
            f, b, bc, G = c["F"], c["Bk"], c["BC"], c["G"]
            ch = b - bc
            B = self.B
            r1, r2 = Ws * f - f, (Ws - 1) * b        # where max(f + R, W f) and max(R, (W-1) b) bend
            lo, hi = np.minimum(r1, r2), np.maximum(r1, r2)
            g0 = Ws * f + (Ws - 1) * b
            k = c["phase_stack"] = ((B - Ws) * (f + ch) + np.maximum(0, B - Ws - 1) * bc + ch, lo, hi, g0,
                                    g0 + (hi - lo), B * f + (B - 1) * b + ch, (B - 1) * b, B * f, ch, B > Ws)
        head, lo, hi, g0, ghi, fill, tail, fwd, ch, many_w = k
        f, G = c["F"], c["G"]
        T = tau - G - head
        many = np.where(T < g0, -np.inf, np.where(T <= ghi, lo + (T - g0), hi + (T - ghi) / 2))
        T = tau - G
        few = np.where(fill <= T, np.minimum(T - f - tail - ch, T - fwd - ch), -np.inf)
        return np.where(many_w, many, few) - c["XF"]

    def terms(self, stages, limit: float | None = None) -> tuple[float, float, float, float, float]:
        """(R1, R2, R3, R4, R5) of a whole plan; ``limit``: R3's windows counted at that limit
        (if above the plan's R1 and R2), as the programs asked at it count them."""
        stages = tuple(stages)
        last, base, r3s = self._last_terms
        if last != stages:
            base = self._base_terms(stages)
            r3s = {}
            self._last_terms = (stages, base, r3s)
        r1, r2, r4, r5 = base[:4]
        if not math.isfinite(r1):
            return math.inf, math.inf, math.inf, math.inf, math.inf
        at = _grid(max(r1, r2, limit or 0.0)) if self._counts() else None
        if at not in r3s:
            r3s[at] = self._r3(stages, base[4], at)
        return r1, r2, r3s[at], r4, r5

    def _base_terms(self, stages: tuple) -> tuple:
        """(R1, R2, R4, R5, the cells' values) of a whole plan (R3: :meth:`_r3`)."""
        vals = [self._value(p, st) for p, st in enumerate(stages)]
        if len(stages) != self.S or any(v is None for v in vals) or stages[-1].last != self.L - 1:
            return math.inf, math.inf, math.inf, math.inf, None
        A = H = 0.0
        r1 = r2 = 0.0
        fill = []
        for p, v in enumerate(vals):
            r1 = max(r1, v["T2"], A + v["T1"] if p > 0 else -math.inf)
            r2 = max(r2, H + v["T2"])
            fill.append(H)
            A += v["INC1"]
            H += v["INC2"]
        r3_fill = self._r3_fills(vals)
        r4 = 0.0
        for arrays, _ in self._port_loads():
            r4 = max(r4, sum(float(arrays[p][self._cell(p, st)]) for p, st in enumerate(stages) if p in arrays))
        r5 = 0.0
        if self._neighbor_on():
            for p in range(self.S - 1):
                if self._r5_has(p):
                    drained, filled = self._neighbor_term(p, vals[p], vals[p + 1], earlier=_earlier(vals, p))
                    r5 = max(r5, r3_fill[p] + float(drained), fill[p] + float(filled))
        return r1, r2, r4, r5, vals

    def _r3(self, stages: tuple, vals: list, limit: float | None) -> float:
        """R3 of a whole plan, its windows counted at ``limit`` (None: not counted).  The
        least limit on the grid that admits the plan (its R1 and R2) gives its R: a plan
        with R <= tau passes the programs' tests at tau, whose counts (at a limit at least
        tau) are never larger."""
        sums = self._counted(stages, limit) if limit is not None else [None] * len(stages)
        r3, y = 0.0, 0.0
        r3_fill = self._r3_fills(vals)
        for p in range(self.S - 1, -1, -1):
            r3 = max(r3, r3_fill[p] + self._cycle_term(p, vals[p], y, sums[p]))
            y += vals[p]["INC3"]
        return r3

    def relaxation(self, stages) -> float:
        """R = max(R1, ..., R5) of a whole plan, from the same arrays as the dynamic programs."""
        return max(self.terms(tuple(stages)))

    def prefix_state(self, prefix: tuple[StagePlan, ...]) -> tuple[float, float, int]:
        """(R1's accumulator after the prefix, largest R1 term of the prefix, next first layer)."""
        A, M, start = 0.0, 0.0, 0
        for p, st in enumerate(prefix):
            v = self._value(p, st)
            if v is None or st.first != start:
                return math.inf, math.inf, start
            M = max(M, v["T2"], A + v["T1"] if p > 0 else -math.inf)
            A += v["INC1"]
            start = st.last + 1
        return A, M, start

    # -- the dynamic programs ---------------------------------------------------------------
    def feasible(self, tau: float, sub: Subspace | None = None, limit: float = math.inf) -> tuple[StagePlan, ...] | None:
        """A plan of the subspace with R1 <= tau, or None when no plan has R <= tau (one of the
        relaxations has none).  ``limit >= tau``: cells whose own term reaches it are
        left out beforehand."""
        self.dp_runs += 1
        CACHES.touch(self)
        try:
            return self._feasible(tau, sub, limit)
        finally:
            CACHES.update(self)

    def _feasible(self, tau: float, sub: Subspace | None, limit: float) -> tuple[StagePlan, ...] | None:
        tau = tau * (1 + _SLACK)          # sums in another order: never refuse a plan at exactly tau
        prefix = sub.prefix if sub else ()
        excluded = sub.excluded if sub else frozenset()
        vals = [self._value(p, st) for p, st in enumerate(prefix)]
        if any(v is None for v in vals):
            return None
        request = limit if tau <= limit else tau
        cells = [self._cells(p, request) for p in range(len(prefix), self.S)]
        masks = [self._excluded_mask(c, excluded) if q == 0 and excluded else None for q, c in enumerate(cells)]
        masks = self._port_masks(tau, prefix, cells, masks)
        if masks is None:
            return None
        if self._neighbor_on():
            fills = self._forward(tau, prefix, vals, cells, masks, "INC2")
            if fills is not None:
                drains = self._drains(tau, prefix, vals, cells, masks, fills)
                masks = self._neighbor_masks(tau, prefix, vals, cells, masks, fills, drains)
            else:
                masks = None
            if masks is None:
                return None
        ymax: list = []
        plan = self._programs(tau, prefix, vals, cells, masks, ymax)
        # (R with the windows counted as the programs count them: counted at the plan's own
        # R1 and R2 they may be larger, which the filter cannot mend)
        if (plan is not None and self.relaxation(plan) > tau
                and max(self.terms(plan, request)) > tau):
            # the three programs passed through different cells: filter the cells that lie
            # on no completion of one of them, and ask again (None is then still a proof)
            masks = self._consistent(tau, prefix, vals, cells, masks, ymax[0])
            plan = None if masks is None else self._programs(tau, prefix, vals, cells, masks)
        return plan

    def _programs(self, tau, prefix, vals, cells, masks, ymax: list | None = None) -> tuple[StagePlan, ...] | None:
        """R1's plan if R1, R2 and R3 each have one at most tau on the cells not masked
        (``ymax``: receives R3's per-cell limits when there is one, for :meth:`_consistent`)."""
        plan = self._forward(tau, prefix, vals, cells, masks, "INC1")
        fills = None if plan is None else self._forward(tau, prefix, vals, cells, masks, "INC2")
        if fills is None:
            return None
        drains = self._drains(tau, prefix, vals, cells, masks, fills) if self.r3 else None
        limits = self._ymaxes(tau, cells, fills, drains)
        if not self._backward(tau, prefix, vals, cells, masks, limits):
            return None
        if ymax is not None:
            ymax.append(limits)
        return plan

    def _ymaxes(self, tau, cells, fills, drains=None) -> list[np.ndarray]:
        """Per remaining stage and cell, the largest round trip after it with which its R3
        term, fill included, can be at most tau.  ``fills``: R2's program's accumulators
        (:meth:`_forward`), the least fill ``H`` reaching each first layer through cells
        passing R2's test: a lower bound of the fill of every plan through a cell with
        ``R <= tau`` (-inf where none reaches).  ``drains``: :meth:`_drains`, the least ``Q``
        (fill and drain back through the earlier stages before a stage), with which
        ``Q + x(p->p-1)`` replaces the fill and the tail ``G``."""
        out = []
        for q, (c, acc) in enumerate(zip(cells, fills)):
            off = acc[c["k"]]
            if drains is not None:
                off = np.maximum(off, drains[q][c["k"]] + c["XG"] - c["G"])
            with np.errstate(invalid="ignore"):         # tau = inf: inf - inf where unreached
                budget = np.where(np.isfinite(off), tau - off, -np.inf)
            out.append(self._ymax(c, budget))
        return out

    # passes of _consistent's filter (each removes cells; a fixpoint is not needed for
    # soundness): on mlp16 2, 3 or 6 rounds gave the same plans and bounds as 1, 10-15% slower
    ROUNDS = 1

    def _consistent(self, tau, prefix, vals, cells, masks, ymax) -> list[np.ndarray] | None:
        """``masks`` (True: left out) with every cell removed that lies on no completion
        with R1 <= tau, or on none with R2 <= tau, or on none whose R3 terms are <= tau
        (``ymax``: R3's per-cell limits on these ``masks``, from :meth:`_programs`).

        Each of the three programs alone keeps a cell when *some* completion through it
        passes its own test; a cell that fails one of them is on no plan with ``R <= tau``,
        so removing it keeps every such plan (the filter is sound) while the programs that
        follow, run on fewer cells, stop accepting ``tau`` for plans that pass each test
        through different cells.  Per program: the least accumulator reaching a cell's first
        layer (forward), the largest one its completion admits (backward); R3's the other
        way round.  None: some stage has no cell left."""
        L = self.L
        start = prefix[-1].last + 1 if prefix else 0
        A0 = {"INC1": 0.0, "INC2": 0.0}
        for v in vals:
            A0["INC1"] += v["INC1"]
            A0["INC2"] += v["INC2"]
        bad = [(m.copy() if m is not None else np.zeros(len(c["k"]), dtype=bool)) | ~(c["T2"] <= tau)
               for m, c in zip(masks, cells)]
        for _ in range(self.ROUNDS):
            before = sum(int(b.sum()) for b in bad)
            keep = [~b for b in bad]
            for inc, term in (("INC1", "T1"), ("INC2", "T2")):
                fwd = []
                acc = np.full(L + 1, np.inf)
                acc[start] = A0[inc]
                for q, c in enumerate(cells):
                    fwd.append(acc)
                    Ak = acc[c["k"]]
                    val = np.where(keep[q] & (Ak + c[term] <= tau), Ak + c[inc], np.inf)
                    acc = np.full(L + 1, np.inf)
                    if len(val):
                        acc[c["ends"] + 1] = np.minimum.reduceat(val, c["starts"])
                M = np.full(L + 1, -np.inf)
                M[L] = np.inf
                for q in range(len(cells) - 1, -1, -1):
                    c = cells[q]
                    Mi = M[c["i"] + 1]
                    Ak = fwd[q][c["k"]]
                    keep[q] &= (Ak + c[term] <= tau) & (Ak + c[inc] <= Mi)
                    adm = np.where(keep[q], np.minimum(tau - c[term], Mi - c[inc]), -np.inf)
                    M = np.full(L + 1, -np.inf)
                    if len(adm):
                        M[c["firsts"]] = np.maximum.reduceat(adm[c["by_k"]], c["starts_k"])
            # R3: the least round trip Y from the end (backward), the largest one the
            # stages before admit (forward; the prefix's own terms are checked by _backward)
            after = [None] * len(cells)
            Y = np.full(L + 1, np.inf)
            Y[L] = 0.0
            for q in range(len(cells) - 1, -1, -1):
                c = cells[q]
                after[q] = Y
                y = Y[c["i"] + 1]
                val = np.where(keep[q] & (y <= ymax[q]), y + c["INC3"], np.inf)[c["by_k"]]
                Y = np.full(L + 1, np.inf)
                if len(val):
                    Y[c["firsts"]] = np.minimum.reduceat(val, c["starts_k"])
            Z = np.full(L + 1, -np.inf)
            Z[start] = np.inf
            for q, c in enumerate(cells):
                adm = np.minimum(ymax[q], Z[c["k"]] - c["INC3"])
                keep[q] &= after[q][c["i"] + 1] <= adm
                adm = np.where(keep[q], adm, -np.inf)
                Z = np.full(L + 1, -np.inf)
                if len(adm):
                    Z[c["ends"] + 1] = np.maximum.reduceat(adm, c["starts"])
            bad = [~k for k in keep]
            if any(not k.any() for k in keep):
                return None
            if sum(int(b.sum()) for b in bad) == before:
                break
        return bad

    def _excluded_mask(self, cells: dict, excluded) -> np.ndarray:
        bad = np.zeros(len(cells["k"]), dtype=bool)
        for st in excluded:
            if st.config in self.configs:
                j = self.configs.index(st.config)
                bad |= (cells["j"] == j) & (cells["k"] == st.first) & (cells["i"] == st.last)
        return bad

    def _forward(self, tau, prefix, vals, cells, masks, inc: str) -> tuple[StagePlan, ...] | None:
        """R1 (``INC1``) or R2 (``INC2``) at most tau; the plan for R1, for R2 the least
        accumulator reaching each layer before each remaining stage; None when there is none."""
        L = self.L
        A = M = 0.0
        for p, v in enumerate(vals):
            if inc == "INC1":
                M = max(M, v["T2"], A + v["T1"] if p > 0 else -math.inf)
            else:
                M = max(M, A + v["T2"])
            A += v[inc]
        if not M <= tau:
            return None
        start = prefix[-1].last + 1 if prefix else 0
        acc = np.full(L + 1, np.inf)
        acc[start] = A
        history = []
        for q, c in enumerate(cells):
            Ak = acc[c["k"]]
            if inc == "INC1":
                ok = (Ak + c["T1"] <= tau) & (c["T2"] <= tau)
            else:
                ok = Ak + c["T2"] <= tau
            if masks[q] is not None:
                ok &= ~masks[q]
            val = np.where(ok, Ak + c[inc], np.inf)
            history.append((c, acc, val))
            acc = np.full(L + 1, np.inf)
            if len(val):
                acc[c["ends"] + 1] = np.minimum.reduceat(val, c["starts"])
            if not np.isfinite(acc).any():
                return None
        if not math.isfinite(acc[L]):
            return None
        if inc != "INC1":
            return [prev for _, prev, _ in history]
        stages = []
        last, target = L - 1, acc[L]
        for c, prev, val in reversed(history):
            pick = np.flatnonzero((c["i"] == last) & (val == target))[0]
            stages.append(StagePlan(int(c["k"][pick]), last, self.configs[int(c["j"][pick])]))
            last = int(c["k"][pick]) - 1
            target = prev[last + 1]
        return tuple(prefix) + tuple(reversed(stages))

    def _backward(self, tau, prefix, vals, cells, masks, ymax) -> bool:
        """Is there a completion with every cycle term (R3, each with the least fill reaching
        its cell: ``ymax``, :meth:`_ymaxes`) and ``T2`` at most tau?"""
        L, j0 = self.L, len(prefix)
        start = prefix[-1].last + 1 if prefix else 0
        Y = np.full(L + 1, np.inf)
        Y[L] = 0.0
        for q in range(len(cells) - 1, -1, -1):
            c = cells[q]
            y = Y[c["i"] + 1]
            ok = (y <= ymax[q]) & (c["T2"] <= tau)
            if masks[q] is not None:
                ok &= ~masks[q]
            val = np.where(ok, y + c["INC3"], np.inf)[c["by_k"]]
            Y = np.full(L + 1, np.inf)
            if len(val):
                Y[c["firsts"]] = np.minimum.reduceat(val, c["starts_k"])
            if not np.isfinite(Y).any():
                return False
        # the prefix stages' cycle terms, with the completion's least round trip
        acc = Y[start]
        if not math.isfinite(acc):
            return False
        fill = self._r3_fills(vals)
        # the windows as the cells' are counted (at a limit at least tau); a plan's own R counts
        # them at its R1 and R2, never above
        sums = self._counted(prefix, min((c["window_limit"] for c in cells), default=math.inf))
        for p in range(j0 - 1, -1, -1):
            if fill[p] + self._cycle_term(p, vals[p], acc, sums[p]) > tau:
                return False
            acc += vals[p]["INC3"]
        return True

    @staticmethod
    def _r3_fills(vals, after: bool = False):
        """Per stage of ``vals`` (a plan's first stages), what R3 adds to its cycle term:
        ``E - G`` with ``E = max(H + G, Q + x(p->p-1))`` the objective's fill and drain
        ``H_p + D_p`` (``D_p = max(u_p, x(p->p-1) + c_{p-1} + D_{p-1})``: the drain runs back
        from whichever earlier stage's tail ends last), the stage's own tail ``G`` standing
        for ``u_p``, and ``Q`` (:meth:`_drains`) the part before the stage.  ``after``: also
        ``Q`` after the last of them."""
        out, H, Q = [], 0.0, -math.inf
        for p, v in enumerate(vals):
            E = max(H + v["G"], Q + v["XG"])
            out.append(E - v["G"])
            Q = v["INC1"] if p == 0 else E + v["F"] + v["XF"] + (v["Bk"] - v["BC"])
            H += v["INC2"]
        return (out, Q) if after else out

    def _drains(self, tau, prefix, vals, cells, masks, fills) -> list[np.ndarray]:
        """Per remaining stage, the least ``Q`` (:meth:`_r3_fills`) reaching each first layer,
        through the cells passing R2's test: ``Q_{p+1} = max(H_p + G_p, Q_p + x(p->p-1)) + f_p
        + x(p->p+1) + c_p`` with ``H`` at its least (``fills``), so a lower bound of ``Q`` on
        every plan through a cell with ``R <= tau`` (it grows with both).  With only the
        first stage's tail this is R1's accumulator; every later stage's tail may start the
        drain too (GPT-3 175B on 16 384 GPUs: a stage's gradient reduction outlasts the first
        stage's)."""
        start = prefix[-1].last + 1 if prefix else 0
        acc = np.full(self.L + 1, np.inf)
        acc[start] = self._r3_fills(vals, after=True)[1]
        out = []
        for q, c in enumerate(cells):
            out.append(acc)
            hk = fills[q][c["k"]]
            ok = hk + c["T2"] <= tau
            if masks[q] is not None:
                ok &= ~masks[q]
            if len(prefix) + q == 0:
                val = c["INC1"]
            else:
                val = np.maximum(hk + c["G"], acc[c["k"]] + c["XG"]) + c["F"] + c["XF"] + (c["Bk"] - c["BC"])
            val = np.where(ok, val, np.inf)
            acc = np.full(self.L + 1, np.inf)
            if len(val):
                acc[c["ends"] + 1] = np.minimum.reduceat(val, c["starts"])
        return out

    def minimize(self, sub: Subspace, cutoff: float = math.inf, tol: float = 1e-3,
                 exact: float = 1e-9) -> tuple[float, tuple[StagePlan, ...] | None]:
        """(lower bound of R over the subspace, a plan of it) by bisection on ``tau``.

        With a finite ``cutoff`` one run first asks for a plan with ``R`` below it (else the
        subspace is pruned: its bound is returned and no plan); then bisection narrows the
        bound and improves the plan while it can (the three relaxations are checked apart,
        so a ``tau`` they all pass need not hold a plan with ``R <= tau``)."""
        lo = sub.bound
        if math.isfinite(cutoff):
            probe = cutoff * (1 - exact)
            if lo >= probe:
                return lo, None
            plan = self.feasible(probe, sub, limit=cutoff)
            if plan is None:
                return max(lo, probe), None
        elif self.sparse and (start := self._start_plan(sub)) is not None:
            # a large pair's cells are built up to a limit: any plan of the subspace bounds
            # the least R, and every plan below it has only cells below it
            probe = self.relaxation(start) * (1 + exact)
            plan = self.feasible(probe, sub, limit=probe) or start
        else:
            plan = self.feasible(math.inf, sub)
            if plan is None:
                return math.inf, None
        # R with R3's windows counted at the cutoff, as the programs count them (counted at
        # each plan's own R1 and R2 they may be above what the programs can prove)
        value = (lambda st: max(self.terms(st, cutoff))) if math.isfinite(cutoff) else self.relaxation
        up = value(plan)
        for _ in range(24):
            if up - lo <= tol * up:
                break
            tau = (lo + up) / 2
            cand = self.feasible(tau, sub, limit=min(cutoff, up))
            if cand is None:
                lo = tau
                continue
            r = value(cand)
            if r >= up:
                break
            plan, up = cand, r
        return lo, plan

    def _start_plan(self, sub: Subspace) -> tuple[StagePlan, ...] | None:
        """A plan of the whole pair that fits (the balanced greedy of Wang's thesis), when ``sub`` is
        the whole pair; else None."""
        if sub.prefix or sub.excluded:
            return None
        from .enumerate import balanced_greedy      # here: enumerate imports this module

        plan = balanced_greedy(self)
        if plan is None or not math.isfinite(self.relaxation(plan)):
            return None
        return plan

    # -- memory -----------------------------------------------------------------------------
    def least_memory(self) -> tuple[float, tuple[StagePlan, ...] | None]:
        """The plan whose fullest device is least full (exact min-max over contiguous stages),
        and that peak, with the family's fewest micro-batches in flight."""
        if "least_memory" in self._stage:
            return self._stage["least_memory"]
        self._stage["least_memory"] = self._least_memory()
        return self._stage["least_memory"]

    def _least_memory(self) -> tuple[float, tuple[StagePlan, ...] | None]:
        if not self.possible:
            return math.inf, None
        if self.sparse or self.coarse:
            # a lower bound over every split (coarse.py), without a plan: exact min-max over
            # the band's squares is too large here
            return least_memory_floor(self), None
        c, S, L, n = self.costs, self.S, self.L, self.n
        # every config's parts, as whole [k, i] squares read once for all S stages where
        # they are built as squares (a stage differs only in its band and its live count);
        # on deeper models each band is read off the range tables
        raw = list(zip(*(c.memory_parts(cfg) for cfg in self.configs)))
        parts = [np.stack([np.asarray(x) for x in col]) for col in raw] if L <= ranges.DENSE else None
        whole = len(self.pos) == L + 1

        def peaks(p: int, rows=None) -> np.ndarray:
            """``c.memory(cfg, live_min(p))`` of every config on stage p's band (only the
            band rows ``rows`` when given), as ``(configs, rows, n)``."""
            ks, is_ = self.band(p)
            first = ks if rows is None else ks[rows]
            if whole and rows is None:
                cut = (slice(None), slice(p, p + n), slice(p, p + n))
            else:
                cut = (slice(None), first[:, None], is_[None, :])
            if parts is not None:
                static, activation, transient = (x[cut] for x in parts)
            else:
                static, activation, transient = (np.stack([np.asarray(x[cut[1:]]) for x in col]) for col in raw)
            mem = static + self.live_min(p) * activation + transient     # memory()'s order
            mem = np.where(first[:, None] <= is_[None, :], mem, np.inf)
            if p == 0:
                mem[:, first > ks[0], :] = np.inf       # the first stage starts at layer 0
            if p == S - 1:
                mem[:, :, :n - 1] = np.inf              # the last one ends at the last layer
            return mem

        V = np.full(L + 1, np.inf)          # V[k]: least peak of stages p.. starting at layer k
        V[L] = 0.0
        rests = []
        for p in range(S - 1, -1, -1):
            ks, is_ = self.band(p)
            mem = peaks(p)
            rest = V[is_ + 1]
            rests.append(rest)
            # min over configs of max(peak, rest) is max(least peak, rest): one pass per stage
            least = mem.min(axis=0)
            val = np.where(np.isfinite(least), np.maximum(least, rest[None, :]), np.inf)
            V = np.full(L + 1, np.inf)
            V[ks] = val.min(axis=1)
        if not math.isfinite(V[0]):
            return math.inf, None
        stages, u = [], 0                   # u: the band index of the stage's first unit
        for p, rest in enumerate(reversed(rests)):
            # the first (config, last layer) reaching the least peak, configs first (as the
            # argmin over the stacked table would pick)
            mem = peaks(p, np.array([u]))[:, 0, :]
            val = np.where(np.isfinite(mem), np.maximum(mem, rest[None, :]), np.inf)
            j, i = divmod(int(val.argmin()), n)
            ks, is_ = self.band(p)
            stages.append(StagePlan(int(ks[u]), int(is_[i]), self.configs[j]))
            u = i                               # stage p + 1's band starts one unit later
        return float(V[0]), tuple(stages)
