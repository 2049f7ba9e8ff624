"""Synthesis hierarchies (P² §3.4), the device groups of DSL forms, and lowering.

The synthesis hierarchy of a placement and its reduction axes keeps only the factors of
the reduction axes, collapsed per hardware level (Table 1: ``[7 16 27]`` for axes 0 and 2
of ``[[1,2,3],[4,5,6],[7,8,9]]``), with a root of count 1 in front (Appendix B).  Its
positions are the devices of one reduction group.

Groups of an instruction (§3.3, Table 2), for slice ``e_i`` and positions with
coordinates ``(c_0 = root, c_1, ..., c_K)``:

* ``InsideGroup``: the positions of each instance of ``e_i`` (same ``c_0..c_i``);
* ``Parallel(e_j)``, ``j < i``: the first, second, ... position of every ``e_i`` instance
  inside one ``e_j`` instance (same ``c_0..c_j`` and ``c_{i+1}..c_K``, varying
  ``c_{j+1}..c_i``); Lemma B.2: groups of ``x_{j+1} ... x_i`` positions;
* ``Master(e_j)``: the same groups as ``Parallel(e_j)`` but only the first of each
  ``e_j`` instance (``c_{i+1}..c_K`` all 0): the masters of every ``e_i`` instance.

Group members are in position order, so the first member is the root of Reduce and
Broadcast (§3.2).  Lowering (§3.4) repeats the pattern over the non-reduction axes: every
group becomes one device group per combination of non-reduction coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod
from typing import Sequence

from ..placement.matrix import ParallelismMatrix

__all__ = ["Form", "SynthesisHierarchy", "Lowering"]


@dataclass(frozen=True)
class Form:
    """``InsideGroup``, ``Parallel(level)`` or ``Master(level)``."""

    kind: str  # 'InsideGroup', 'Parallel', 'Master'
    level: str | None = None

    def __str__(self) -> str:
        return self.kind if self.kind == "InsideGroup" else f"{self.kind}({self.level})"


INSIDE = Form("InsideGroup")


@dataclass(frozen=True)
class SynthesisHierarchy:
    """Named levels with counts, root first (count 1)."""

    names: tuple[str, ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, matrix: ParallelismMatrix, level_names: Sequence[str], reduction_axes: Sequence[int]) -> SynthesisHierarchy:
        """P² §3.4 (d), collapsed per hardware level, with a root."""
        counts = [prod(matrix.rows[i][j] for i in reduction_axes) for j in range(matrix.num_levels)]
        return cls(("root",) + tuple(level_names), (1,) + tuple(counts))

    @property
    def size(self) -> int:
        return prod(self.counts)

    def index(self, level: str) -> int:
        try:
            return self.names.index(level)
        except ValueError:
            raise ValueError(f"no level '{level}' in the synthesis hierarchy {self}") from None

    @cached_property
    def _strides(self) -> tuple[int, ...]:
        return tuple(prod(self.counts[i + 1:]) for i in range(len(self.counts)))

    def coords(self, p: int) -> tuple[int, ...]:
        return tuple((p // s) % c for s, c in zip(self._strides, self.counts))

    def groups(self, slice_level: str, form: Form) -> list[tuple[int, ...]]:
        """Position groups of ``(slice, form)``; raises ``ValueError`` for a form that is not an ancestor.

        Positions are mixed-radix numbers over the levels, so a group is an arithmetic
        progression: the positions before the varied levels fix its start, the ones after
        them its stride (built from ranges, not position by position: a hierarchy may have
        100 000 positions).
        """
        i = self.index(slice_level)
        if form.kind == "InsideGroup":
            lo = i + 1  # vary every level below the slice (same c_0..c_i)
        else:
            j = self.index(form.level)  # type: ignore[arg-type]
            if not j < i:
                raise ValueError(f"{form} needs a level above the slice '{slice_level}' (P² §3.3)")
            lo = j + 1  # vary c_{j+1}..c_i (same c_0..c_j and c_{i+1}..c_K)
        hi = len(self.counts) if form.kind == "InsideGroup" else i + 1
        outer, inner = prod(self.counts[:lo]), prod(self.counts[hi:])
        span = prod(self.counts[lo:hi]) * inner
        starts = range(1) if form.kind == "Master" else range(inner)  # Master: c_{i+1..K} all 0
        return [tuple(range(a * span + b, (a + 1) * span + b, inner)) for a in range(outer) for b in starts]

    def instructions(self) -> list[tuple[str, Form]]:
        """Every (slice, form) pair, outer slices first: InsideGroup, then Parallel, then Master."""
        out = []
        for i, name in enumerate(self.names):
            out.append((name, INSIDE))
            out += [(name, Form("Parallel", self.names[j])) for j in range(i)]
            out += [(name, Form("Master", self.names[j])) for j in range(i)]
        return out

    def __str__(self) -> str:
        return "[" + ", ".join(f"({n}, {c})" for n, c in zip(self.names, self.counts)) + "]"


class Lowering:
    """Maps positions of the synthesis hierarchy to devices, per non-reduction coordinate.

    A device id is a sum of one term per (axis, level) digit (:meth:`ParallelismMatrix.device_at`:
    mixed radix over the levels, each level's coordinate mixed radix over the axes), so the
    device of (key, position) is the key's offset plus the position's: two lists, built
    digit by digit, instead of a table over every device.
    """

    def __init__(self, matrix: ParallelismMatrix, level_counts: Sequence[int], level_names: Sequence[str],
                 reduction_axes: Sequence[int]):
        self.matrix = matrix
        self.level_counts = tuple(level_counts)
        self.reduction_axes = tuple(sorted(set(reduction_axes)))
        self.hierarchy = SynthesisHierarchy.of(matrix, level_names, self.reduction_axes)
        others = [i for i in range(matrix.num_axes) if i not in self.reduction_axes]
        self.num_devices = prod(level_counts)
        levels = range(matrix.num_levels)
        # weight[i][j]: what digit i of level j's coordinate adds to the device id
        weight = [[prod(matrix.rows[a][j] for a in range(i + 1, matrix.num_axes)) * prod(self.level_counts[j + 1:])
                   for j in levels] for i in range(matrix.num_axes)]
        # Positions in order: levels outermost first, each level's reduction digits with the
        # first axis most significant (SynthesisHierarchy.of collapses them that way).
        self._position = _offsets([(matrix.rows[i][j], weight[i][j]) for j in levels for i in self.reduction_axes])
        # Keys in sorted order: axis by axis, level by level, as the key tuples compare.
        digits = [(matrix.rows[i][j], weight[i][j]) for i in others for j in levels]
        self._key = _offsets(digits)
        self.keys = _tuples([radix for radix, _ in digits])
        self._key_index = {key: n for n, key in enumerate(self.keys)}

    def device(self, key: tuple[int, ...], position: int) -> int:
        return self._key[self._key_index[key]] + self._position[position]

    def lower(self, groups: Sequence[Sequence[int]]) -> list[list[int]]:
        """Device groups over the whole system, one per group and non-reduction coordinate."""
        pos = self._position
        return [[k + pos[p] for p in g] for k in self._key for g in groups]

    def reduction_groups(self) -> list[list[int]]:
        """The devices that reduce together (all positions, per non-reduction coordinate)."""
        return [[k + p for p in self._position] for k in self._key]

    def group_of(self) -> dict[int, tuple[int, ...]]:
        """Each device's reduction group: the columns it must end with (P² §3.5)."""
        return {d: tuple(group) for group in self.reduction_groups() for d in group}


def _offsets(digits: Sequence[tuple[int, int]]) -> list[int]:
    """Every sum of ``digit * weight`` over the (radix, weight) digits, first digit most significant."""
    out = [0]
    for radix, weight in digits:
        if radix > 1:
            out = [o + d * weight for o in out for d in range(radix)]
    return out


def _tuples(radices: Sequence[int]) -> list[tuple[int, ...]]:
    """Every digit tuple of the mixed radix, in lexicographic order."""
    out: list[tuple[int, ...]] = [()]
    for radix in radices:
        out = [t + (d,) for t in out for d in range(radix)]
    return out
