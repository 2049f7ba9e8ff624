"""The semantics of collectives (P² §3.2, Fig. 8) over boolean device states.

A device state is a ``k x m`` boolean matrix: row ``r`` is chunk ``r`` of the data, column
``c`` says whether device ``c`` contributed to it.  Initially device ``d`` has 1 in its own
column of every row; finally every device must have, in every row, exactly the columns of
its reduction group (§3.5).  Each collective is a Hoare triple ``{G1} C {G2}`` whose
pre-condition rules out programs that can never reach the final state:

* R-AllReduce: all members hold the same chunks (``s_i.rows = s_j.rows``) and, chunk by
  chunk, their contributions are disjoint; every member gets the sum.
* R-ReduceScatter: the same pre-condition; the non-empty rows of the sum are split evenly
  over the members in order (the count must divide).
* R-AllGather: members hold disjoint sets of chunks of equal size; all get the union.
* R-Reduce: as AllReduce, but only the first member (the root) gets the sum; the others
  end up empty.
* R-Broadcast: every member's state is below the root's and at least one strictly
  (information increase); all get the root's state.  A group in which nobody holds any
  chunk is a no-op, as it is for the reductions (it moves nothing and issues no call).

States are stored bit-packed, one Python integer per device (bit ``r * m + c``), which makes
a whole-row or whole-matrix test one integer operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Collective

__all__ = ["Semantics", "State", "Violation", "RULES"]

RULES = {
    Collective.ALLREDUCE: "R-AllReduce",
    Collective.REDUCESCATTER: "R-ReduceScatter",
    Collective.ALLGATHER: "R-AllGather",
    Collective.REDUCE: "R-Reduce",
    Collective.BROADCAST: "R-Broadcast",
}


@dataclass(frozen=True)
class State:
    """Bit-packed device states and, per device, the bit mask of its non-empty rows."""

    bits: tuple[int, ...]
    rows: tuple[int, ...]


@dataclass(frozen=True)
class Violation:
    """Why a step is rejected: the step, the group, the device(s), the chunk and the rule."""

    step: int | None
    rule: str
    group: tuple[int, ...]
    device: int
    chunk: int | None
    message: str
    other: int | None = None

    def __str__(self) -> str:
        where = "final state" if self.rule == "post-condition" else f"step {self.step + 1 if self.step is not None else '?'}"
        chunk = f", chunk {self.chunk}" if self.chunk is not None else ""
        return f"{where}: {self.rule} on group {list(self.group)}: device {self.device}{chunk}: {self.message}"


class Semantics:
    """Fig. 8 over ``k`` chunks and ``m`` contributing devices.

    ``column[d]`` says which column device ``d`` contributes (by default its own index);
    ``goal[d]`` is the set of columns device ``d`` must end with (its reduction group).
    ``strict_broadcast`` takes R-Broadcast verbatim: a group where nobody holds anything
    violates its information increase (the paper's space, for ``--size-metric paper``).
    """

    def __init__(self, k: int, m: int, strict_broadcast: bool = False):
        self.k, self.m = k, m
        self.strict_broadcast = strict_broadcast
        self.full_row = (1 << m) - 1
        self.row_mask = [self.full_row << (r * m) for r in range(k)]
        self._repeat = sum(1 << (r * m) for r in range(k))      # a 1 in the first column of every row
        self._rows_cache: dict[int, int] = {}

    # -- states ------------------------------------------------------------------------
    def column_bits(self, columns: Sequence[int]) -> int:
        """One row with the given columns set."""
        v = 0
        for c in columns:
            v |= 1 << c
        return v

    def every_row(self, row: int) -> int:
        """The same row pattern in every chunk: ``row`` times a 1 every ``m`` bits (one
        multiplication; ``row`` has at most ``m`` bits, so the copies never carry)."""
        if not 0 <= row <= self.full_row:
            raise ValueError(f"row {row:#x} has more than {self.m} columns")
        return row * self._repeat

    def initial(self, columns: Sequence[int]) -> State:
        """Device ``d`` holds its own contribution (column ``columns[d]``) in every chunk."""
        all_rows = (1 << self.k) - 1
        return State(tuple(self.every_row(1 << c) for c in columns), tuple(all_rows for _ in columns))

    def chunk(self, bits: int, r: int) -> int:
        return (bits >> (r * self.m)) & self.full_row

    def rows_of(self, bits: int) -> int:
        mask = 0
        for r in range(self.k):
            if bits & self.row_mask[r]:
                mask |= 1 << r
        return mask

    def _mask_of_rows(self, rows: int) -> int:
        v = self._rows_cache.get(rows)
        if v is None:
            v = 0
            r, x = 0, rows
            while x:
                if x & 1:
                    v |= self.row_mask[r]
                x >>= 1
                r += 1
            self._rows_cache[rows] = v
        return v

    def columns(self, row: int) -> list[int]:
        return [c for c in range(self.m) if row >> c & 1]

    # -- one collective on one group ------------------------------------------------------
    def apply(self, state: State, kind: Collective, groups: Sequence[Sequence[int]], step: int | None = None
              ) -> State | Violation:
        """The state after every group runs ``kind`` at once, or the first violated pre-condition."""
        bits, rows = list(state.bits), list(state.rows)
        for group in groups:
            if len(group) < 2:
                if kind is Collective.BROADCAST and len(group) == 1:
                    return Violation(step, RULES[kind], tuple(group), group[0], None,
                                     "a broadcast to nobody adds no information")
                continue
            err = self._group(bits, rows, kind, group, step)
            if err is not None:
                return err
        return State(tuple(bits), tuple(rows))

    def _group(self, bits: list[int], rows: list[int], kind: Collective, g: Sequence[int], step) -> Violation | None:
        rule, group = RULES[kind], tuple(g)
        if kind in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE):
            first = g[0]
            acc = 0
            for d in g:
                if rows[d] != rows[first]:
                    diff = rows[d] ^ rows[first]
                    r = (diff & -diff).bit_length() - 1
                    has, lacks = (first, d) if rows[first] >> r & 1 else (d, first)
                    return Violation(step, rule, group, lacks, r,
                                     f"holds no chunk {r} but device {has} does: the members hold different chunks,"
                                     " so data that should not be reduced together would be", other=has)
                overlap = acc & bits[d]
                if overlap:
                    bit = (overlap & -overlap).bit_length() - 1
                    r, c = divmod(bit, self.m)
                    other = next(e for e in g if e != d and bits[e] >> bit & 1)
                    return Violation(step, rule, group, d, r,
                                     f"holds device {c}'s contribution, and so does device {other} in the same group:"
                                     " that data would be reduced twice", other=other)
                acc |= bits[d]
            if kind is Collective.ALLREDUCE:
                for d in g:
                    bits[d] = acc
            elif kind is Collective.REDUCE:
                bits[first] = acc
                for d in g[1:]:
                    bits[d], rows[d] = 0, 0
            else:
                held = [r for r in range(self.k) if rows[first] >> r & 1]
                if len(held) % len(g):
                    return Violation(step, rule, group, first, None,
                                     f"cannot scatter {len(held)} chunks evenly over {len(g)} devices")
                per = len(held) // len(g)
                for n, d in enumerate(g):
                    mine = 0
                    for r in held[n * per:(n + 1) * per]:
                        mine |= 1 << r
                    rows[d] = mine
                    bits[d] = acc & self._mask_of_rows(mine)
            return None
        if kind is Collective.ALLGATHER:
            size = bin(rows[g[0]]).count("1")
            seen_rows = 0
            for d in g:
                if bin(rows[d]).count("1") != size:
                    return Violation(step, rule, group, d, None,
                                     f"holds {bin(rows[d]).count('1')} chunks but device {g[0]} holds {size}:"
                                     " all-gather needs equal shares", other=g[0])
                shared = seen_rows & rows[d]
                if shared:
                    r = (shared & -shared).bit_length() - 1
                    other = next(e for e in g if e != d and rows[e] >> r & 1)
                    return Violation(step, rule, group, d, r,
                                     f"and device {other} both hold chunk {r}: all-gather needs disjoint chunks",
                                     other=other)
                seen_rows |= rows[d]
            acc = 0
            for d in g:
                acc |= bits[d]
            for d in g:
                bits[d], rows[d] = acc, seen_rows
            return None
        # Broadcast from the first member.  A group where nobody holds anything moves nothing,
        # as a reduction over empty members does (it issues no call): a no-op, not a violation.
        root = g[0]
        if not self.strict_broadcast and not any(rows[d] for d in g):
            return None
        increase = False
        for d in g[1:]:
            extra = bits[d] & ~bits[root]
            if extra:
                bit = (extra & -extra).bit_length() - 1
                r, c = divmod(bit, self.m)
                return Violation(step, rule, group, d, r,
                                 f"holds device {c}'s contribution that the root {root} lacks: it would be lost",
                                 other=root)
            if bits[d] != bits[root]:
                increase = True
        if not increase:
            return Violation(step, rule, group, root, None,
                             "every member already holds what the root holds: the broadcast adds no information")
        for d in g[1:]:
            bits[d], rows[d] = bits[root], rows[root]
        return None

    # -- programs ---------------------------------------------------------------------------
    def goal_bits(self, goal_columns: Sequence[Sequence[int]]) -> tuple[int, ...]:
        return tuple(self.every_row(self.column_bits(cols)) for cols in goal_columns)

    def check_final(self, state: State, goal: Sequence[int]) -> Violation | None:
        """The post-condition: every device holds ``goal[d]`` (bit-packed) exactly."""
        for d, (have, want) in enumerate(zip(state.bits, goal)):
            if have != want:
                r = next(r for r in range(self.k) if self.chunk(have, r) != self.chunk(want, r))
                got, need = self.columns(self.chunk(have, r)), self.columns(self.chunk(want, r))
                return Violation(None, "post-condition", (d,), d, r,
                                 f"holds contributions {got} instead of the reduction group's {need}")
        return None

    def run(self, initial: State, steps: Sequence[tuple[Collective, Sequence[Sequence[int]]]],
            goal: Sequence[int]) -> tuple[State, Violation | None]:
        """Apply every step; stop at the first violation; then check the post-condition."""
        state = initial
        for n, (kind, groups) in enumerate(steps):
            nxt = self.apply(state, kind, groups, n)
            if isinstance(nxt, Violation):
                return state, nxt
            state = nxt
        return state, self.check_final(state, goal)
