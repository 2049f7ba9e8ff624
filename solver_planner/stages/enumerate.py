"""Plans without a solver: the balanced greedy of Wang's thesis, and every plan (brute force, small cases)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from .partition import StagePlan
from .problem import PairProblem

__all__ = ["balanced_greedy", "all_plans", "count_plans"]


def balanced_greedy(pair: PairProblem) -> tuple[StagePlan, ...] | None:
    """Wang's thesis, Alg. 5: accumulate per-layer work, cut when it passes total / S (early enough
    that every later stage keeps a layer); then each stage takes the configuration with the
    least ``R`` term that fits (else the least memory)."""
    if not pair.possible:
        return None
    c, S = pair.costs, pair.S
    cc = c[max(pair.configs, key=lambda x: (x.tensor, x.recompute == "none"))]
    layers = np.arange(pair.L)
    pos = pair.pos                      # where stages may start (every layer, or block boundaries)
    per_layer = np.asarray(cc.work[layers, layers])
    per_unit = np.add.reduceat(per_layer, pos[:-1])
    U = len(per_unit)
    share = per_unit.sum() / S
    cuts, start, acc = [], 0, 0.0
    for v in range(U):
        acc += per_unit[v]
        left = S - len(cuts) - 1
        if left > 0 and (acc > share or U - (v + 1) == left) and v >= start:
            cuts.append((int(pos[start]), int(pos[v + 1]) - 1))
            start, acc = v + 1, 0.0
    cuts.append((int(pos[start]), pair.L - 1))
    out = []
    for p, (k, i) in enumerate(cuts):
        values = {j: pair._value(p, StagePlan(k, i, cfg)) for j, cfg in enumerate(pair.configs)}
        fits = [j for j, v in values.items() if v is not None]
        if fits:
            j = min(fits, key=lambda j: (values[j]["T2"], j))
        else:
            live = pair.live_min(p)
            j = min(range(len(pair.configs)), key=lambda j: (c.memory(pair.configs[j], live)[k, i], j))
        out.append(StagePlan(k, i, pair.configs[j]))
    return tuple(out)


def count_plans(pair: PairProblem) -> int:
    """Plans brute force would list: cuts times configurations per stage."""
    if not pair.possible:
        return 0
    return math.comb(len(pair.pos) - 2, pair.S - 1) * len(pair.configs) ** pair.S


def all_plans(pair: PairProblem):
    """Every plan of the pair that fits in memory (the family's fewest micro-batches in flight)."""
    if not pair.possible:
        return
    S, pos = pair.S, pair.pos
    for inner in itertools.combinations(range(1, len(pos) - 1), S - 1):
        bounds = (0,) + inner + (len(pos) - 1,)
        cuts = [(int(pos[bounds[j]]), int(pos[bounds[j + 1]]) - 1) for j in range(S)]
        options = [[j for j, cfg in enumerate(pair.configs) if pair._value(p, StagePlan(k, i, cfg)) is not None]
                   for p, (k, i) in enumerate(cuts)]
        for choice in itertools.product(*options):
            yield tuple(StagePlan(k, i, pair.configs[j]) for (k, i), j in zip(cuts, choice))
