"""Which chunks every position of a large hierarchy holds, one shared shape per translation.

:mod:`.layout` gives each device its held chunks as runs; on a hierarchy of 100 000
positions a program can leave each of them 12 500 runs (a scatter across nodes, one inside,
a gather across: every GPU holds every eighth chunk).  But positions mostly hold *the same
set shifted*: after a ReduceScatter member ``p`` keeps block ``p``.  So a state is two
arrays over positions, a shape id and an offset, and each distinct shape (runs starting at
chunk 0) is stored once.  The effects are :mod:`.layout`'s (``_effect``), applied to every
group of a step at once with numpy; groups whose members hold the same shapes at the same
relative offsets are worked out once.  Exact: nothing is sampled or assumed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..cost import Collective
from ..errors import PlannerError
from .layout import Runs, merge, size

__all__ = ["Shapes", "HeldState", "split", "initial", "apply", "signatures", "shape_kinds", "group_array"]


class Shapes:
    """Held sets up to translation: id -> runs starting at chunk 0; id 0 holds nothing."""

    def __init__(self):
        self.runs: list[Runs] = [()]
        self.sizes: list[int] = [0]
        self._ids: dict[Runs, int] = {(): 0}
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._bounds: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def of(self, runs: Runs) -> tuple[int, int]:
        """(shape id, offset) of a held set."""
        if not runs:
            return 0, 0
        base = runs[0][0]
        norm = tuple((a - base, b - base) for a, b in runs) if base else tuple(runs)
        sid = self._ids.get(norm)
        if sid is None:
            sid = self._ids[norm] = len(self.runs)
            self.runs.append(norm)
            self.sizes.append(size(norm))
            self._arrays = None
        return sid, base

    def of_bounds(self, starts: np.ndarray, ends: np.ndarray) -> tuple[int, int]:
        """:meth:`of` for runs given as two ascending arrays."""
        return self.of(tuple(zip(starts.tolist(), ends.tolist())))

    def at(self, sid: int, offset: int) -> Runs:
        return tuple((a + offset, b + offset) for a, b in self.runs[sid]) if offset else self.runs[sid]

    def bounds(self, sid: int) -> tuple[np.ndarray, np.ndarray]:
        """The runs of a shape as (starts, ends) arrays."""
        hit = self._bounds.get(sid)
        if hit is None:
            runs = np.array(self.runs[sid], dtype=np.int64).reshape(-1, 2)
            hit = self._bounds[sid] = (runs[:, 0], runs[:, 1])
        return hit

    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (np.array(self.sizes, dtype=np.int64), np.array([len(r) for r in self.runs], dtype=np.int64))
        return self._arrays

    def size_of(self, sids: np.ndarray) -> np.ndarray:
        return self._tables()[0][sids]

    def runs_of(self, sids: np.ndarray) -> np.ndarray:
        """How many runs each shape has."""
        return self._tables()[1][sids]


class HeldState:
    """Per position: which shape it holds (``shape``) and where (``offset``)."""

    __slots__ = ("shape", "offset")

    def __init__(self, shape: np.ndarray, offset: np.ndarray):
        self.shape, self.offset = shape, offset

    def runs(self, shapes: Shapes, p: int) -> Runs:
        return shapes.at(int(self.shape[p]), int(self.offset[p]))


def initial(shapes: Shapes, positions: int, k: int) -> HeldState:
    """Every position holds all ``k`` chunks (P² §3.5)."""
    sid, _ = shapes.of(((0, k),))
    return HeldState(np.full(positions, sid, dtype=np.int64), np.zeros(positions, dtype=np.int64))


def split(runs: Runs, parts: int) -> list[Runs]:
    """The packed buffer of ``runs`` cut into ``parts`` equal blocks (ReduceScatter), in one sweep."""
    per = size(runs) // parts
    out: list[Runs] = []
    piece: list[tuple[int, int]] = []
    need = per
    for a, b in runs:
        while a < b:
            n = min(need, b - a)
            piece.append((a, a + n))
            a += n
            need -= n
            if need == 0:
                out.append(tuple(piece))
                piece, need = [], per
    while len(out) < parts:   # per == 0: every block empty
        out.append(())
    return out


def _pieces(shapes: Shapes, sid: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """(shape id, offset) of every block :func:`split` cuts shape ``sid`` into.  A single
    run cuts into translates of one block: no block is listed."""
    runs = shapes.runs[sid]
    if len(runs) == 1:
        per = runs[0][1] // parts
        block, _ = shapes.of(((0, per),))
        return np.full(parts, block, dtype=np.int64), np.arange(parts, dtype=np.int64) * per
    ids, offsets = zip(*(shapes.of(piece) for piece in split(runs, parts)))
    return np.array(ids, dtype=np.int64), np.array(offsets, dtype=np.int64)


def _union(shapes: Shapes, sids: np.ndarray, offsets: np.ndarray) -> tuple[int, int]:
    """(shape id, offset) of the union of disjoint held sets (an AllGather's result)."""
    starts, ends = [], []
    for sid in np.unique(sids).tolist():
        if sid == 0:
            continue
        at = offsets[sids == sid]
        a, b = shapes.bounds(sid)
        starts.append((at[:, None] + a[None, :]).reshape(-1))
        ends.append((at[:, None] + b[None, :]).reshape(-1))
    if not starts:
        return 0, 0
    a, b = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(b)
    fresh = np.r_[True, a[1:] > reach[:-1]]       # a run that does not touch the ones before
    last = np.r_[np.flatnonzero(fresh)[1:] - 1, len(a) - 1]
    return shapes.of_bounds(a[fresh], reach[last])


def signatures(state: HeldState, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups whose members hold the same shapes at the same offsets from the group's lowest
    held chunk are alike: (one group of each kind, every group's kind, every group's base
    offset).  Members holding nothing count as holding nothing, wherever their offset."""
    shape = state.shape[groups]
    empty = shape == 0
    base = np.where(empty, np.iinfo(np.int64).max, state.offset[groups]).min(axis=1)
    base = np.where(empty.all(axis=1), 0, base)
    rel = np.where(empty, 0, state.offset[groups] - base[:, None])
    first, kind = _row_kinds(np.concatenate([shape, rel], axis=1))
    return first, kind, base


def shape_kinds(state: HeldState, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups whose members hold the same shapes, wherever: (one group of each kind, every
    group's kind).  What a reduction or a broadcast copies depends on nothing else."""
    return _row_kinds(state.shape[groups])


# Odd multipliers for hashing rows (any fixed odd constants: the hash only proposes kinds,
# which are then compared element by element).
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _row_kinds(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of one row of each kind, kind of every row) for equal rows: a hash proposes,
    an exact comparison disposes (``np.unique(axis=0)`` sorts whole rows, ten times slower)."""
    with np.errstate(over="ignore"):
        coef = (np.arange(1, rows.shape[1] + 1, dtype=np.uint64) * _MIX) | np.uint64(1)
        h = (rows.astype(np.uint64) * coef).sum(axis=1) if rows.shape[1] else np.zeros(len(rows), np.uint64)
    _, first, kind = np.unique(h, return_index=True, return_inverse=True)
    kind = kind.reshape(-1)
    if not (rows == rows[first][kind]).all():   # two different rows hashed alike
        _, first, kind = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        kind = kind.reshape(-1)
    return first, kind


def apply(shapes: Shapes, state: HeldState, kind: Collective, groups: np.ndarray) -> HeldState:
    """The state after every group (a row of ``groups``, members as written) runs ``kind``."""
    if groups.shape[1] < 2 or kind is Collective.ALLREDUCE:
        return state
    shape, offset = state.shape.copy(), state.offset.copy()
    if kind is Collective.BROADCAST:
        shape[groups] = state.shape[groups[:, :1]]
        offset[groups] = state.offset[groups[:, :1]]
        return HeldState(shape, offset)
    held = shapes.size_of(state.shape[groups])
    if (held != held[:, :1]).any():
        raise PlannerError(f"a synthesized {kind.value} hands buffers of different sizes (layout rule 5)")
    if kind is Collective.REDUCE:
        shape[groups[:, 1:]] = 0
        offset[groups[:, 1:]] = 0
        return HeldState(shape, offset)
    g = groups.shape[1]
    if kind is Collective.REDUCESCATTER:
        if (held[:, 0] % g).any():
            raise PlannerError(f"a synthesized reduce-scatter over {g} devices does not divide (layout rule 5)")
        # Member p keeps block p of its own buffer: one split per shape held.
        member = state.shape[groups]
        kinds, inverse = np.unique(member, return_inverse=True)
        inverse = inverse.reshape(member.shape)
        piece = np.empty((len(kinds), g), dtype=np.int64)
        delta = np.empty((len(kinds), g), dtype=np.int64)
        for n, sid in enumerate(kinds.tolist()):
            piece[n], delta[n] = _pieces(shapes, sid, g)
        cols = np.broadcast_to(np.arange(g), groups.shape)
        shape[groups] = piece[inverse, cols]
        offset[groups] = np.where(piece[inverse, cols] == 0, 0, state.offset[groups] + delta[inverse, cols])
        return HeldState(shape, offset)
    # AllGather: every member gets the union (disjoint in a valid program; merged here).
    first, kind_of, base = signatures(state, groups)
    union_shape = np.empty(len(first), dtype=np.int64)
    union_base = np.empty(len(first), dtype=np.int64)
    for n, gi in enumerate(first.tolist()):
        row = groups[gi]
        union_shape[n], union_base[n] = _union(shapes, state.shape[row], state.offset[row] - base[gi])
    sid = union_shape[kind_of]
    shape[groups] = sid[:, None]
    offset[groups] = np.where(sid == 0, 0, base + union_base[kind_of])[:, None]
    return HeldState(shape, offset)


def copied_chunks(shapes: Shapes, state: HeldState, kind: Collective, row: Sequence[int]) -> int:
    """The most chunks one member of the group ``row`` copies locally:
    ``max(c.chunks for c in layout.copies(call).values())`` of its call, worked out on
    shapes (whether each is one run, its size, where it sits) instead of run lists."""
    members = np.asarray(row, dtype=np.int64)
    if (np.diff(members) <= 0).any():
        raise PlannerError("hierarchy groups are ascending; this one is not")   # layout.copies' in_order
    sid = state.shape[members]
    if not sid.any():
        return 0                         # nobody holds anything: no call
    nruns = shapes.runs_of(sid)
    held = shapes.size_of(sid)
    one_run = nruns <= 1
    if kind is Collective.BROADCAST:
        return 0 if one_run[0] else int(held[0])
    if kind in (Collective.ALLREDUCE, Collective.REDUCE):
        keeps = np.full(len(members), 2, dtype=np.int64)
        if kind is Collective.REDUCE:
            keeps[1:] = 1
        return int(np.where(one_run, 0, held * keeps).max())
    if kind is Collective.REDUCESCATTER:
        # member p keeps block p of its own buffer (as written: the group is ascending)
        g = len(members)
        piece = np.empty(g, dtype=np.int64)
        for i in np.unique(sid).tolist():
            mine = sid == i
            piece[mine] = _pieces(shapes, i, g)[0][mine]
        return int((held * ~one_run + shapes.size_of(piece) * (shapes.runs_of(piece) > 1)).max())
    start = state.offset[members]
    flat = bool((nruns == 1).all() and (start[:-1] + held[:-1] == start[1:]).all())
    total = int(held.sum())
    return int((held * ~one_run + total * (not flat)).max())


def group_array(groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Groups of one instruction (all of one size) as a 2-D array."""
    return np.array(groups, dtype=np.int64).reshape(len(groups), -1)
