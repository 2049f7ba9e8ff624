"""All parallelism matrices by recursive factorisation (the fallback of the solver model).

Row by row, each axis size is factored into one divisor per level, each dividing what is
left of that level's count; the last row takes exactly what is left.  Matrices come out in
lexicographic order of their rows, so the answer is deterministic.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from .matrix import ParallelismMatrix, PlacementRule

__all__ = ["enumerate_matrices", "ordered_factorizations"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ordered_factorizations(n: int, limits: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Tuples ``f`` with ``prod(f) == n`` and ``f[j]`` dividing ``limits[j]``."""
    if not limits:
        if n == 1:
            yield ()
        return
    for d in _divisors(limits[0]):
        if n % d == 0:
            for rest in ordered_factorizations(n // d, limits[1:]):
                yield (d,) + rest


class _Enough(Exception):
    """``limit`` matrices found: the caller refuses the rest (a memory bound)."""


def enumerate_matrices(axis_sizes: Sequence[int], level_counts: Sequence[int],
                       rules: Sequence[PlacementRule] = (), limit: int | None = None) -> list[ParallelismMatrix]:
    """Every matrix whose rows multiply to ``axis_sizes`` and columns to ``level_counts``
    (the first ``limit`` of them in that order, when given: 16 axes of 2 on 16 levels of 2
    have 16! matrices, which no caller can hold)."""
    out: list[ParallelismMatrix] = []
    pinned: dict[tuple[int, int], int] = {}
    for rule in rules:
        for i, j, v in rule.fixed_entries():
            if pinned.setdefault((i, j), v) != v:
                return []  # two rules pin one entry to different values

    def rec(i: int, left: list[int], rows: list[tuple[int, ...]]) -> None:
        if i == len(axis_sizes) - 1:
            row = tuple(left)
            size = 1
            for v in row:
                size *= v
            if size == axis_sizes[i] and all(pinned.get((i, j), v) == v for j, v in enumerate(row)):
                out.append(ParallelismMatrix(tuple(rows + [row])))
                if limit is not None and len(out) >= limit:
                    raise _Enough
            return
        limits = [pinned[(i, j)] if (i, j) in pinned and left[j] % pinned[(i, j)] == 0 else
                  (0 if (i, j) in pinned else left[j]) for j in range(len(left))]
        if 0 in limits:
            return
        for row in ordered_factorizations(axis_sizes[i], limits):
            if all(pinned.get((i, j), v) == v for j, v in enumerate(row)):
                rec(i + 1, [l // v for l, v in zip(left, row)], rows + [row])

    if axis_sizes and level_counts:
        try:
            rec(0, list(level_counts), [])
        except _Enough:
            pass
    return out
