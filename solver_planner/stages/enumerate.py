"""Plans without a solver: seed 001's balanced greedy, and every plan (brute force, small cases)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from .partition import StagePlan
from .problem import PairProblem

__all__ = ["balanced_greedy", "all_plans", "count_plans"]


def balanced_greedy(pair: PairProblem) -> tuple[StagePlan, ...] | None:
    """Seed 001 Alg. 5: accumulate per-layer work, cut when it passes total / S (early enough
    that every later stage keeps a layer); then each stage takes the configuration with the
    least ``R`` term that fits (else the least memory)."""
    if not pair.possible:
        return None
    c, S, L = pair.costs, pair.S, pair.L
    per_layer = np.diag(c[max(pair.configs, key=lambda x: (x.tensor, x.recompute == "none"))].work)
    share = per_layer.sum() / S
    cuts, start, acc = [], 0, 0.0
    for v in range(L):
        acc += per_layer[v]
        left = S - len(cuts) - 1
        if left > 0 and (acc > share or L - (v + 1) == left) and v >= start:
            cuts.append((start, v))
            start, acc = v + 1, 0.0
    cuts.append((start, L - 1))
    out = []
    for p, (k, i) in enumerate(cuts):
        _, T2, INC = pair.stage_arrays(p)
        kb, ib = k - p, i - p
        fits = [j for j in range(len(pair.configs)) if math.isfinite(INC[j, kb, ib])]
        if fits:
            j = min(fits, key=lambda j: (T2[j, kb, ib], j))
        else:
            live = pair.live_min(p)
            j = min(range(len(pair.configs)), key=lambda j: (c.memory(pair.configs[j], live)[k, i], j))
        out.append(StagePlan(k, i, pair.configs[j]))
    return tuple(out)


def count_plans(pair: PairProblem) -> int:
    """Plans brute force would list: cuts times configurations per stage."""
    if not pair.possible:
        return 0
    return math.comb(pair.L - 1, pair.S - 1) * len(pair.configs) ** pair.S


def all_plans(pair: PairProblem):
    """Every plan of the pair that fits in memory (the family's fewest micro-batches in flight)."""
    if not pair.possible:
        return
    S, L = pair.S, pair.L
    arrays = [pair.stage_arrays(p)[2] for p in range(S)]
    for inner in itertools.combinations(range(1, L), S - 1):
        bounds = (0,) + inner + (L,)
        cuts = [(bounds[j], bounds[j + 1] - 1) for j in range(S)]
        options = [[j for j in range(len(pair.configs)) if math.isfinite(arrays[p][j, k - p, i - p])]
                   for p, (k, i) in enumerate(cuts)]
        for choice in itertools.product(*options):
            yield tuple(StagePlan(k, i, pair.configs[j]) for (k, i), j in zip(cuts, choice))
