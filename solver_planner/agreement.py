"""How well predictions rank what was measured: Spearman's rank correlation and pairwise
order agreement (DistIR §5.3 reports the first; the second says what fraction of pairs a
planner choosing between two configurations would get right)."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["ranks", "spearman", "pairwise_agreement"]


def ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on tie-averaged ranks); None under 3 pairs or
    when one side is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def pairwise_agreement(predicted: Sequence[float], measured: Sequence[float], tolerance: float = 0.0
                       ) -> float | None:
    """Fraction of pairs the prediction orders as the measurement does, over the pairs the
    measurement tells apart (relative difference above ``tolerance``); a predicted tie
    counts as half.  None when no pair is told apart."""
    if len(predicted) != len(measured):
        raise ValueError("predicted and measured differ in length")
    agree = total = 0.0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            a, b = measured[i], measured[j]
            if abs(a - b) <= tolerance * max(abs(a), abs(b)):
                continue
            total += 1
            p, q = predicted[i], predicted[j]
            if p == q:
                agree += 0.5
            elif (p < q) == (a < b):
                agree += 1
    return agree / total if total else None
