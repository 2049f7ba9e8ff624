"""Partitioning layers into stages for one mesh shape and micro-batch count.

Objective (Alpa's inter-op pass, seed 003)::

    T = sum_i t_i + (B - 1) max_j t_j + (first stage's gradient reduction)

with ``t_i`` the stage times of :mod:`.costs`.  Each stage also picks its tensor degree
``t`` (its data degree is ``size / t``); a stage must fit in device memory.

* :class:`PartitionProblem.solve_dp`: exact.  For a threshold ``tmax`` a dynamic program
  over (stage, first layer) gives the least ``sum t_i`` with every ``t_i <= tmax`` (seed
  003's ``F(s, k | tmax)``; equal meshes make the device count implicit).  Thresholds are
  the distinct stage times, scanned upward from the smallest feasible one, stopping once
  ``(B - 1) tmax + min sum`` cannot beat the best plan (Alpa's early pruning).
* :func:`balanced_greedy`: seed 001 Alg. 5, cut where the running cost passes total / S.
* :func:`brute_force`: every cut and degree, for tests.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .costs import StageCosts, in_flight

__all__ = ["StagePlan", "Partition", "PartitionProblem", "balanced_greedy", "brute_force"]


@dataclass(frozen=True)
class StagePlan:
    """Layers ``first..last`` (inclusive) with tensor degree ``tensor``."""

    first: int
    last: int
    tensor: int


@dataclass
class Partition:
    """A full plan for one (mesh shape, micro-batches), costed by :meth:`PartitionProblem.evaluate`."""

    costs: StageCosts
    stages: list[StagePlan]
    times: list[float]
    memory: list[float]
    gradient: list[float]
    objective: float

    @property
    def feasible(self) -> bool:
        return all(m <= self.costs.device_memory for m in self.memory)

    @property
    def shortfall(self) -> float:
        return max(0.0, max(self.memory) - self.costs.device_memory)

    @property
    def max_time(self) -> float:
        return max(self.times)


class PartitionProblem:
    """All stage costs of one :class:`StageCosts`, stacked for the solvers."""

    def __init__(self, costs: StageCosts):
        self.costs = costs
        self.S = costs.stages
        self.L = costs.model.num_layers
        self.degrees = list(costs.degrees)

    @property
    def possible(self) -> bool:
        return bool(self.degrees) and self.S <= self.L

    @cached_property
    def _stacked(self) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Per stage p: TIME[t, k, i], COST (time + the first stage's gradient), OK (fits)."""
        time, ok = self._base
        first = time[0].copy()
        for j, t in enumerate(self.degrees):
            first[j, 0, :] += self.costs.gradient(t)[0, :]
        return time, [first] + time[1:], ok

    @cached_property
    def _base(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per stage p: TIME[t, k, i] (shared between stages with the same boundaries) and
        OK (fits in memory, leaves a layer for every other stage)."""
        c = self.costs
        S, L = self.S, self.L
        caps = []
        for t in self.degrees:
            act, static = c.activation_memory(t), c.static_memory(t)
            with np.errstate(divide="ignore", invalid="ignore"):
                # micro-batches in flight a device can hold: memory(p) fits iff in_flight(p) <= cap
                caps.append(np.where(act > 0, (c.device_memory - static) / act,
                                     np.where(static <= c.device_memory, np.inf, -1.0)))
        cap = np.stack(caps)
        cache: dict[tuple, np.ndarray] = {}
        time, ok = [], []
        for p in range(S):
            key = tuple((c.tables[t].boundary_crosses_hosts(p) if p > 0 else None,
                         c.tables[t].boundary_crosses_hosts(p + 1) if p + 1 < S else None) for t in self.degrees)
            if key not in cache:
                cache[key] = np.stack([c.time(p, t) for t in self.degrees])
            time.append(cache[key])
            fits = cap >= in_flight(c.schedule, S, p, c.microbatches)
            # stage p starts at layer >= p and leaves one layer for each later stage
            fits[:, :p, :] = False
            fits[:, :, L - (S - p) + 1:] = False
            if p == 0:
                fits[:, 1:, :] = False
            if p == S - 1:
                fits[:, :, :L - 1] = False
            ok.append(fits & np.isfinite(time[p]))
        return time, ok

    # -- costing a given plan ------------------------------------------------------------
    def evaluate(self, stages: list[StagePlan]) -> Partition:
        c = self.costs
        if len(stages) != self.S or stages[0].first != 0 or stages[-1].last != self.L - 1 or any(
                a.last + 1 != b.first for a, b in zip(stages, stages[1:])) or any(s.first > s.last for s in stages):
            raise ValueError(f"not a partition of {self.L} layers into {self.S} stages: {stages}")
        times, memory, grads = [], [], []
        for p, st in enumerate(stages):
            if st.tensor not in self.degrees:
                raise ValueError(f"tensor degree {st.tensor} is not possible on {c.shape}")
            times.append(float(c.time(p, st.tensor)[st.first, st.last]))
            memory.append(float(c.memory(p, st.tensor)[st.first, st.last]))
            grads.append(float(c.gradient(st.tensor)[st.first, st.last]))
        objective = sum(times) + (c.microbatches - 1) * max(times) + grads[0]
        return Partition(c, list(stages), times, memory, grads, objective)

    # -- exact dynamic program -----------------------------------------------------------
    def _dp(self, tmax: float, gradient: bool = True) -> tuple[float, list[StagePlan] | None]:
        if gradient:
            time, cost, ok = self._stacked
        else:
            time, ok = self._base
            cost = time
        S, L = self.S, self.L
        nxt = np.full(L + 1, np.inf)
        nxt[L] = 0.0
        picks = []
        for p in range(S - 1, -1, -1):
            c = np.where(ok[p] & (time[p] <= tmax), cost[p], np.inf)
            tbest = c.argmin(axis=0)
            c = np.take_along_axis(c, tbest[None], axis=0)[0]
            tot = c + nxt[None, 1:]
            arg = tot.argmin(axis=1)
            cur = np.append(tot[np.arange(L), arg], np.inf)
            picks.append((arg, tbest))
            nxt = cur
        if not math.isfinite(nxt[0]):
            return math.inf, None
        stages, k = [], 0
        for arg, tbest in reversed(picks):
            i = int(arg[k])
            stages.append(StagePlan(k, i, self.degrees[int(tbest[k, i])]))
            k = i + 1
        return float(nxt[0]), stages

    def thresholds(self) -> np.ndarray:
        time, ok = self._base
        return np.unique(np.concatenate([tp[op] for tp, op in zip(time, ok)]))

    def solve_dp(self, incumbent: float = math.inf) -> tuple[Partition | None, int]:
        """Exact optimum (or None if nothing fits or nothing beats ``incumbent``); DP runs used."""
        if not self.possible:
            return None, 0
        B = self.costs.microbatches
        g_inf, plan = self._dp(math.inf)
        runs = 1
        if plan is None:
            return None, runs
        best = self.evaluate(plan)
        if B == 1:
            return best, runs
        vals = self.thresholds()
        lo, hi = 0, len(vals) - 1          # smallest threshold with a feasible partition
        while lo < hi:
            mid = (lo + hi) // 2
            runs += 1
            if math.isfinite(self._dp(vals[mid])[0]):
                hi = mid
            else:
                lo = mid + 1
        for v in vals[lo:]:
            if (B - 1) * v + g_inf >= min(best.objective, incumbent):
                break
            _, plan = self._dp(v)
            runs += 1
            cand = self.evaluate(plan)
            if cand.objective < best.objective:
                best = cand
        return best, runs

    def lower_bound(self) -> float:
        """No plan beats ``G + (B - 1) G / S`` with ``G`` the least sum of stage times."""
        if not self.possible:
            return math.inf
        g, _ = self._dp(math.inf, gradient=False)      # gradients only add: still a bound
        return g + (self.costs.microbatches - 1) * g / self.S if math.isfinite(g) else math.inf

    # -- degrees for given cuts ----------------------------------------------------------
    def best_degrees(self, cuts: list[tuple[int, int]]) -> list[StagePlan]:
        """Per stage, the fastest tensor degree that fits (else the one using least memory)."""
        time, cost, ok = self._stacked
        out = []
        for p, (k, i) in enumerate(cuts):
            fits = [j for j in range(len(self.degrees)) if ok[p][j, k, i]]
            if fits:
                j = min(fits, key=lambda j: (cost[p][j, k, i], j))
            else:
                j = min(range(len(self.degrees)), key=lambda j: (self.costs.memory(p, self.degrees[j])[k, i], j))
            out.append(StagePlan(k, i, self.degrees[j]))
        return out


def balanced_greedy(problem: PartitionProblem) -> Partition | None:
    """Seed 001 Alg. 5: accumulate per-layer cost, cut when it passes total / S.

    The per-layer cost is its compute time at the largest degree; a stage is also cut
    early so that every later stage keeps at least one layer.
    """
    if not problem.possible:
        return None
    fwd, bwd = problem.costs.compute(max(problem.degrees))
    per_layer = np.diag(fwd + bwd)
    S, L = problem.S, problem.L
    share = per_layer.sum() / S
    cuts, start, acc = [], 0, 0.0
    for v in range(L):
        acc += per_layer[v]
        left_stages = S - len(cuts) - 1
        must_cut = L - (v + 1) == left_stages
        if left_stages > 0 and (acc > share or must_cut) and v >= start:
            cuts.append((start, v))
            start, acc = v + 1, 0.0
    cuts.append((start, L - 1))
    return problem.evaluate(problem.best_degrees(cuts))


def brute_force(problem: PartitionProblem) -> Partition | None:
    """Every composition of the layers into S stages and every degree per stage (tests only)."""
    if not problem.possible:
        return None
    best = None
    S, L = problem.S, problem.L
    for inner in itertools.combinations(range(1, L), S - 1):
        bounds = (0,) + inner + (L,)
        cuts = [(bounds[j], bounds[j + 1] - 1) for j in range(S)]
        for degs in itertools.product(problem.degrees, repeat=S):
            cand = problem.evaluate([StagePlan(k, i, t) for (k, i), t in zip(cuts, degs)])
            if cand.feasible and (best is None or cand.objective < best.objective - 1e-15):
                best = cand
    return best
