"""Parallelism matrices (P² §3.1) and the device assignment they imply.

A parallelism matrix ``x`` has one row per parallelism axis (in spec order) and one column
per hierarchy level (outermost first).  Entry ``x[i][j]`` is how many instances of level
``j`` axis ``i`` is split across; column products equal the level counts (Eq. 1) and row
products equal the axis sizes (Eq. 2).

Device assignment (P² §2.1, Fig. 2): the coordinate ``c_j`` of a device on level
``j`` is cut into one digit per axis, in mixed radix ``(x[0][j], ..., x[m][j])`` with axis 0
most significant (the order of Table 1's column-based hierarchy); the axis-``i``
coordinate is the mixed-radix number of its digits over the levels, outermost most
significant.  For Fig. 2b, ``[[1,2,2,1],[1,1,1,4]]`` on rack 1 / server 2 / CPU 2 / GPU 4,
a device's data index is ``2*server + cpu`` and its shard is its GPU index: every CPU
holds one replica, every GPU one shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

__all__ = ["ParallelismMatrix", "PlacementRule"]


@dataclass(frozen=True)
class PlacementRule:
    """A constraint on matrices: ``kind`` is 'inside' (x[axis][j] = 1 for every j <= level),
    'not_split_over' (x[axis][level] = 1) or 'fix' (x[axis][level] = factor)."""

    axis: int
    kind: str
    level: int
    factor: int = 1

    def allows(self, rows: Sequence[Sequence[int]]) -> bool:
        if self.kind == "inside":
            return all(rows[self.axis][j] == 1 for j in range(self.level + 1))
        if self.kind == "not_split_over":
            return rows[self.axis][self.level] == 1
        return rows[self.axis][self.level] == self.factor

    def fixed_entries(self) -> list[tuple[int, int, int]]:
        """(axis, level, value) entries this rule pins."""
        if self.kind == "inside":
            return [(self.axis, j, 1) for j in range(self.level + 1)]
        if self.kind == "not_split_over":
            return [(self.axis, self.level, 1)]
        return [(self.axis, self.level, self.factor)]


@dataclass(frozen=True)
class ParallelismMatrix:
    """``rows[i][j]``: the factor of axis ``i`` on level ``j``.

    >>> m = ParallelismMatrix(((1, 2, 2, 1), (1, 1, 1, 4)))
    >>> m.axis_coords((1, 2, 2, 4), m.device_at((1, 2, 2, 4), (3, 1)))
    (3, 1)
    >>> str(m)
    '[[1,2,2,1],[1,1,1,4]]'
    """

    rows: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]]) -> ParallelismMatrix:
        # whole numbers only: int(True) is 1 and int(2.5) is 2, neither what was written
        def whole(v) -> bool:
            if isinstance(v, bool) or str(getattr(v, "dtype", "")) == "bool":        # numpy's too
                return False
            try:
                return int(v) == v
            except (OverflowError, ValueError, TypeError):        # inf, nan, text
                return False

        if any(not whole(v) for row in rows for v in row):
            raise ValueError(f"a matrix holds positive integers, got {[list(r) for r in rows]!r:.80}")
        return cls(tuple(tuple(int(v) for v in row) for row in rows))

    @classmethod
    def parse(cls, text: str) -> ParallelismMatrix:
        """``'[[1,2],[2,8]]'`` or ``'1,2;2,8'`` -> matrix."""
        import json

        text = text.strip()
        try:
            rows = json.loads(text) if text.startswith("[") else [[int(v) for v in r.split(",")] for r in text.split(";")]
            return cls.of(rows)
        except (ValueError, TypeError):
            raise ValueError(f"cannot read a matrix from {text!r}; write it as [[1,2],[2,8]] or 1,2;2,8") from None

    @property
    def num_axes(self) -> int:
        return len(self.rows)

    @property
    def num_levels(self) -> int:
        return len(self.rows[0]) if self.rows else 0

    def column(self, j: int) -> tuple[int, ...]:
        return tuple(row[j] for row in self.rows)

    def check(self, axis_sizes: Sequence[int], level_counts: Sequence[int]) -> None:
        """Raise ``ValueError`` unless rows multiply to the axes and columns to the levels."""
        if self.num_axes != len(axis_sizes) or any(len(r) != len(level_counts) for r in self.rows):
            raise ValueError(f"matrix {self} is not {len(axis_sizes)} axes x {len(level_counts)} levels")
        for i, (row, size) in enumerate(zip(self.rows, axis_sizes)):
            if any(isinstance(v, bool) or v < 1 for v in row):
                # (two negative entries multiply to the size and read as a contradiction)
                raise ValueError(f"matrix {self}: row {i} has {row}; every entry is a positive integer")
            if prod(row) != size:
                raise ValueError(f"matrix {self}: row {i} multiplies to {prod(row)}, not the axis size {size}")
        for j, count in enumerate(level_counts):
            if prod(self.column(j)) != count:
                raise ValueError(f"matrix {self}: column {j} multiplies to {prod(self.column(j))}, not the level count {count}")

    def digits(self, level_counts: Sequence[int], device: int) -> list[list[int]]:
        """``digits[i][j]``: the digit of axis ``i`` inside level ``j``'s coordinate."""
        coords = []
        for count in reversed(level_counts):
            coords.append(device % count)
            device //= count
        coords.reverse()
        out = [[0] * len(level_counts) for _ in self.rows]
        for j, c in enumerate(coords):
            for i in reversed(range(self.num_axes)):  # axis 0 most significant
                out[i][j] = c % self.rows[i][j]
                c //= self.rows[i][j]
        return out

    def axis_coords(self, level_counts: Sequence[int], device: int) -> tuple[int, ...]:
        """The coordinate of ``device`` on every axis (which replica, which shard, ...)."""
        digits = self.digits(level_counts, device)
        out = []
        for i, row in enumerate(self.rows):
            v = 0
            for j, radix in enumerate(row):
                v = v * radix + digits[i][j]
            out.append(v)
        return tuple(out)

    def device_at(self, level_counts: Sequence[int], axis_coords: Sequence[int]) -> int:
        """The device holding the given coordinate of every axis."""
        digits = [[0] * len(level_counts) for _ in self.rows]
        for i, row in enumerate(self.rows):
            v = axis_coords[i]
            for j in reversed(range(len(row))):
                digits[i][j] = v % row[j]
                v //= row[j]
        device = 0
        for j, count in enumerate(level_counts):
            c = 0
            for i in range(self.num_axes):
                c = c * self.rows[i][j] + digits[i][j]
            device = device * count + c
        return device

    def assignment(self, level_counts: Sequence[int]) -> list[tuple[int, ...]]:
        """Axis coordinates of every device, by device id."""
        return [self.axis_coords(level_counts, d) for d in range(prod(level_counts))]

    def reduction_groups(self, level_counts: Sequence[int], axes: Sequence[int]) -> list[list[int]]:
        """Devices that agree on every axis outside ``axes``: each group reduces together."""
        groups: dict[tuple[int, ...], list[int]] = {}
        keep = [i for i in range(self.num_axes) if i not in set(axes)]
        for d, coords in enumerate(self.assignment(level_counts)):
            groups.setdefault(tuple(coords[i] for i in keep), []).append(d)
        return list(groups.values())

    def as_lists(self) -> list[list[int]]:
        return [list(r) for r in self.rows]

    def __str__(self) -> str:
        return "[" + ",".join("[" + ",".join(str(v) for v in r) + "]" for r in self.rows) + "]"
