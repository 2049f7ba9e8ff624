"""Where every chunk lives, and what each call of a reduction program hands the library.

This module writes down *the one meaning* of a reduction program.  Every checker
implements it: the rules (:mod:`.verify`), the z3 proof (:mod:`.proof`), the numpy executor
(:mod:`.execute`) and the torch.distributed lowering (:mod:`solver_planner.distributed.lower`).

1. **Buffers.**  Every device's buffer is the reduction's data cut into ``k`` equal chunks,
   chunk ``c`` at offset ``c`` (P² §3.2: row ``c`` of a device state is chunk ``c``;
   ``k`` is the reduction group size, so every hierarchical scatter divides).  A device
   *holds* the chunks whose values the program still uses; initially all of them.
2. **Calls.**  A group's call hands the library each member's held chunks *packed in
   ascending chunk order*; what comes back is written at each chunk's own offset.
3. **Group order.**  A group is ordered as written.  Its first member is the root of
   Reduce and Broadcast (§3.2); the member at position ``p`` of a ReduceScatter keeps the
   ``p``-th block of the packed buffer (the ``scatter`` of R-ReduceScatter).
4. **Effects on values** (what the library computes):

   * AllReduce: the packed buffers are summed slot by slot; every member writes the sum
     back at its own held chunks.
   * ReduceScatter: the same sum; member ``p`` keeps block ``p`` and holds only those chunks.
   * Reduce: the root writes the sum back; the other members hold nothing afterwards.
   * AllGather: every member holds the union, each chunk with the value of its holder.
   * Broadcast: every member holds exactly the root's chunks, with the root's values.
   * A group of one device does nothing; so does a group in which nobody holds anything.
5. **Well-formed calls** (what the library can run at all): the members of an AllReduce,
   ReduceScatter, Reduce or AllGather hand buffers of one size; a ReduceScatter's buffer
   splits evenly; an AllGather's members hold disjoint chunks (otherwise one offset would
   receive two values, and which one wins is not defined).
6. **Valid**: every call is well-formed and, whatever the data, every device ends holding
   all ``k`` chunks, each the exact sum of its reduction group's data for that chunk.

P²'s Fig. 8 rules are a *sufficient* condition for 6: their pre-conditions (same
chunks on every member, disjoint contributions, information increase) make every step
produce clean partial sums (see :mod:`.verify`).

On torch.distributed a group's ranks are ordered ascending whatever order the program
writes (``new_group`` sorts them), and a tensor collective reads and writes one
contiguous buffer.  So a call whose packed buffer is not one contiguous run of chunks in
that order needs a local copy before (*pack*) or after (*unpack*) it; :func:`copies`
says which, the lowering performs them and the cost model charges them.

This module only follows *which* chunks each device holds (a determined, data-free
computation); the checkers add the values.  Chunk sets are stored as runs, so a program
on thousands of devices with thousands of chunks stays small.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Sequence

from ..cost import Collective
from .semantics import Violation

__all__ = ["Runs", "Call", "Trace", "Atoms", "trace", "copies", "buffers", "contiguous", "Copies", "call_of",
           "runs_of_mask", "size", "take", "merge", "chunks_of", "WELL_FORMED"]

Runs = tuple[tuple[int, int], ...]  # disjoint half-open chunk ranges, ascending
Steps = Sequence[tuple[Collective, Sequence[Sequence[int]]]]

WELL_FORMED = "well-formed call"
REDUCING = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE)


def size(runs: Runs) -> int:
    """How many chunks ``runs`` holds."""
    return sum(b - a for a, b in runs)


def chunks_of(runs: Runs) -> list[int]:
    return [c for a, b in runs for c in range(a, b)]


def take(runs: Runs, p: int, q: int) -> Runs:
    """The chunks at positions ``p..q-1`` of the packed (ascending) buffer."""
    out, pos = [], 0
    for a, b in runs:
        n = b - a
        lo, hi = max(p, pos), min(q, pos + n)
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += n
        if pos >= q:
            break
    return tuple(out)


def merge(parts: Sequence[Runs]) -> Runs:
    """The union of disjoint run lists, adjacent runs joined."""
    out: list[list[int]] = []
    for a, b in sorted(r for runs in parts for r in runs):
        if out and out[-1][1] >= a:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _first_outside(x: Runs, y: Runs) -> int | None:
    """The smallest chunk of ``x`` that ``y`` lacks, or None."""
    j = 0
    for a, b in x:
        c = a
        while c < b:
            while j < len(y) and y[j][1] <= c:
                j += 1
            if j == len(y) or y[j][0] > c:
                return c
            c = y[j][1]
    return None


def first_difference(x: Runs, y: Runs) -> int:
    """The smallest chunk held by exactly one of two different run lists."""
    found = [c for c in (_first_outside(x, y), _first_outside(y, x)) if c is not None]
    return min(found)


@dataclass(frozen=True)
class Call:
    """One group's call in one step: the chunks each member holds before and after it."""

    step: int
    kind: Collective
    group: tuple[int, ...]  # as written: group[0] is the root
    before: tuple[Runs, ...]
    after: tuple[Runs, ...]

    @property
    def aligned(self) -> bool:
        """Every member hands the same chunks (so slot ``i`` is chunk ``i`` of one set everywhere)."""
        return all(r == self.before[0] for r in self.before)

    @property
    def empty(self) -> bool:
        return not any(self.before)


@dataclass
class Trace:
    """Every call of a program, the chunks held at the end, and the first ill-formed call."""

    num_devices: int
    k: int
    calls: list[list[Call]]  # per step, its groups of two or more devices
    final: list[Runs]
    problem: Violation | None  # the first call the library cannot run; the trace stops there


def trace(num_devices: int, k: int, steps: Steps) -> Trace:
    """Follow which chunks every device holds through ``steps`` (device groups, as written)."""
    full: Runs = ((0, k),)
    held: list[Runs] = [full] * num_devices
    calls: list[list[Call]] = []
    for s, (kind, groups) in enumerate(steps):
        kind = Collective.parse(kind)
        out: list[Call] = []
        for g in groups:
            g = tuple(g)
            if len(g) < 2:
                continue
            before = tuple(held[d] for d in g)
            after, problem = _effect(kind, g, before, s)
            if problem is not None:
                calls.append(out)
                return Trace(num_devices, k, calls, held, problem)
            for d, r in zip(g, after):
                held[d] = r
            out.append(Call(s, kind, g, before, after))
        calls.append(out)
    return Trace(num_devices, k, calls, held, None)


def _effect(kind: Collective, g: tuple[int, ...], before: tuple[Runs, ...], s: int
            ) -> tuple[tuple[Runs, ...], Violation | None]:
    sizes = [size(r) for r in before]
    if kind is Collective.BROADCAST:
        return tuple(before[0] for _ in g), None
    for d, n, r in zip(g[1:], sizes[1:], before[1:]):
        if n != sizes[0]:
            return before, Violation(s, WELL_FORMED, g, d, None,
                                     f"holds {n} chunks but device {g[0]} holds {sizes[0]}: the members would hand"
                                     f" the library buffers of different sizes", other=g[0])
    if kind is Collective.ALLGATHER:
        # Overlaps among all members at once: sort every run, compare each with the
        # furthest end seen so far (the smallest shared chunk is found first).
        spans = sorted((a, b, i) for i, runs in enumerate(before) for a, b in runs)
        reach, who = -1, -1
        clash = None
        for a, b, i in spans:
            if a < reach and i != who and (clash is None or a < clash[0]):
                clash = (a, i, who)
            if b > reach:
                reach, who = b, i
        if clash is not None:
            c, i, j = clash
            i, j = max(i, j), min(i, j)
            return before, Violation(s, WELL_FORMED, g, g[i], c,
                                     f"and device {g[j]} both hold chunk {c}: the gathered buffer would hold"
                                     " it twice, and which copy lands at its offset is not defined", other=g[j])
        union = merge(before)
        return tuple(union for _ in g), None
    if kind is Collective.ALLREDUCE:
        return before, None
    if kind is Collective.REDUCE:
        return (before[0],) + tuple(() for _ in g[1:]), None
    n = sizes[0]
    if n % len(g):
        return before, Violation(s, WELL_FORMED, g, g[0], None,
                                 f"cannot scatter {n} chunks evenly over {len(g)} devices")
    per = n // len(g)
    return tuple(take(r, p * per, (p + 1) * per) for p, r in enumerate(before)), None


# -- atoms: the coarsest chunk ranges the program never tells apart ----------------------------

class Atoms:
    """A partition of ``0..k-1`` into ranges that every checker can treat as one chunk.

    Every run boundary of every held set is an atom boundary, so a held set is a union of
    atoms and two members that hand the same chunk at one position hand the same atom over
    that atom's whole length.  With ``misaligned=True`` the partition is refined until the
    positions where members hand *different* chunks also fall on atom boundaries of every
    member (the z3 proof gives each (device, atom) one data variable and needs that).
    """

    def __init__(self, tr: Trace, misaligned: bool = False):
        bounds = {0, tr.k}
        for step in tr.calls:
            for call in step:
                for runs in call.before + call.after:
                    for a, b in runs:
                        bounds.add(a)
                        bounds.add(b)
        for runs in tr.final:
            for a, b in runs:
                bounds.add(a)
                bounds.add(b)
        self.starts = sorted(bounds)[:-1]
        self.k = tr.k
        if misaligned:
            mixed = [c for step in tr.calls for c in step if c.kind in REDUCING and not c.aligned]
            while mixed:
                new = set()
                for call in mixed:
                    for pos in self._cuts(call):
                        for runs in call.before:
                            c = _chunk_at(runs, pos)
                            if c is not None and c not in bounds:
                                new.add(c)
                if not new:
                    break
                bounds |= new
                self.starts = sorted(bounds)[:-1]

    def __len__(self) -> int:
        return len(self.starts)

    def index(self, chunk: int) -> int:
        return bisect_right(self.starts, chunk) - 1

    def end(self, i: int) -> int:
        return self.starts[i + 1] if i + 1 < len(self.starts) else self.k

    def of(self, runs: Runs) -> list[int]:
        """The atoms of a held set, ascending."""
        out: list[int] = []
        for a, b in runs:
            out.extend(range(self.index(a), self.index(b - 1) + 1))
        return out

    def _cuts(self, call: Call) -> list[int]:
        """Positions of the packed buffer where some member starts a new atom."""
        cuts = set()
        for runs in call.before:
            pos = 0
            for a, b in runs:
                for i in range(self.index(a), self.index(b - 1) + 1):
                    cuts.add(pos + max(self.starts[i], a) - a)
                pos += b - a
        return sorted(cuts)

    def segments(self, call: Call) -> list[tuple[int, tuple[int, ...], bool]]:
        """Per stretch of the packed buffer: where it starts, each member's atom there, and
        whether every member hands the same chunk there.

        For an aligned call these are simply the held atoms.  Otherwise a stretch lies in one
        atom of every member (with ``misaligned=True``), or at least decides for every member's
        atom whether it is handed together with the same atom everywhere: the positions where
        members start to hand different chunks are run boundaries, hence atom boundaries.
        """
        if call.aligned:
            out, pos = [], 0
            for a in self.of(call.before[0]):
                out.append((pos, (a,) * len(call.group), True))
                pos += self.end(a) - self.starts[a]
            return out
        out = []
        for pos in self._cuts(call):
            chunks = [_chunk_at(runs, pos) for runs in call.before]
            out.append((pos, tuple(self.index(c) for c in chunks), len(set(chunks)) == 1))
        return out


def _chunk_at(runs: Runs, pos: int) -> int | None:
    """The chunk at position ``pos`` of the packed buffer."""
    for a, b in runs:
        if pos < b - a:
            return a + pos
        pos -= b - a
    return None


# -- local copies on a library that orders ranks ascending -------------------------------------

@dataclass(frozen=True)
class Copies:
    """Whether one member of a call needs a local copy before (pack) or after (unpack) it."""

    pack: bool  # what it sends is not one ascending contiguous run in the library's order
    unpack: bool  # what it receives is not
    chunks: int  # chunks copied: what it sends if packed, plus what it receives if unpacked


def _one_run(runs: Runs) -> bool:
    return len(runs) <= 1


def copies(call: Call, measure: Callable[[Runs], int] = size) -> dict[int, Copies]:
    """Per member, whether ``call`` needs a local copy on a library that orders ranks ascending.

    Decided on runs, without listing chunks, so it is cheap on large programs; the lowering
    checks it against the chunk lists of :func:`buffers`.  Empty for a call that moves
    nothing (nobody holds a chunk): it issues no call at all.  ``measure`` counts the
    chunks of a held set (:mod:`.symmetry` counts a representative hierarchy's sets in the
    real hierarchy's chunks).
    """
    if call.empty:
        return {}
    g, kind, before = call.group, call.kind, dict(zip(call.group, call.before))
    if kind is Collective.BROADCAST:
        flat, n = _one_run(before[g[0]]), measure(before[g[0]])
        return {d: Copies(not flat and d == g[0], not flat and d != g[0], 0 if flat else n) for d in g}
    if kind in (Collective.ALLREDUCE, Collective.REDUCE):
        out = {}
        for d in g:
            flat, n = _one_run(before[d]), measure(before[d])
            keeps = kind is Collective.ALLREDUCE or d == g[0]
            out[d] = Copies(not flat, not flat and keeps, 0 if flat else n * (2 if keeps else 1))
        return out
    if kind is Collective.REDUCESCATTER:
        # The library hands its p-th part to the p-th rank in ascending order: in place only
        # when the written order is ascending too.
        in_order = list(g) == sorted(g)
        out = {}
        for d, after in zip(g, call.after):
            pack, unpack = not (_one_run(before[d]) and in_order), not _one_run(after)
            out[d] = Copies(pack, unpack, measure(before[d]) * pack + measure(after) * unpack)
        return out
    ordered = [before[d] for d in sorted(g)]
    flat = all(len(r) == 1 for r in ordered) and all(a[0][1] == b[0][0] for a, b in zip(ordered, ordered[1:]))
    total = measure(call.after[0])
    return {d: Copies(not _one_run(before[d]), not flat,
                      measure(before[d]) * (not _one_run(before[d])) + total * (not flat)) for d in g}


def call_of(kind: Collective, group: Sequence[int], before: Sequence[Runs], step: int = 0) -> Call:
    """The call ``kind`` makes on ``group`` whose members hold ``before`` (raises ValueError if ill-formed)."""
    g, held = tuple(group), tuple(before)
    after, problem = _effect(Collective.parse(kind), g, held, step)
    if problem is not None:
        raise ValueError(str(problem))
    return Call(step, Collective.parse(kind), g, held, after)


def runs_of_mask(mask: int) -> Runs:
    """Chunk ids set in a bit mask (bit ``c`` = chunk ``c``), as runs."""
    out, c = [], 0
    while mask:
        low = (mask & -mask).bit_length() - 1
        mask >>= low
        c += low
        ones = (~mask & (mask + 1)).bit_length() - 1
        out.append((c, c + ones))
        mask >>= ones
        c += ones
    return tuple(out)


def buffers(call: Call) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per member, the chunks it sends and receives, in the order the library reads and writes
    them when it orders the group's ranks ascending (torch.distributed does).  Empty for a
    call that moves nothing."""
    if call.empty:
        return {}
    g, kind = call.group, call.kind
    mine = {d: tuple(chunks_of(r)) for d, r in zip(g, call.before)}
    members = sorted(g)
    if kind is Collective.BROADCAST:
        rows = mine[g[0]]
        return {d: (rows, ()) if d == g[0] else ((), rows) for d in g}
    if kind in (Collective.ALLREDUCE, Collective.REDUCE):
        return {d: (mine[d], mine[d] if kind is Collective.ALLREDUCE or d == g[0] else ()) for d in g}
    if kind is Collective.REDUCESCATTER:
        per = len(mine[g[0]]) // len(g)
        pos = {d: p for p, d in enumerate(g)}
        return {d: (tuple(c for m in members for c in mine[d][pos[m] * per:(pos[m] + 1) * per]),
                    mine[d][pos[d] * per:(pos[d] + 1) * per]) for d in g}
    gathered = tuple(c for m in members for c in mine[m])
    return {d: (mine[d], gathered) for d in g}


def contiguous(chunks: Sequence[int]) -> bool:
    """One ascending run of consecutive chunks (a view of the buffer, no copy needed)."""
    return all(b == a + 1 for a, b in zip(chunks, chunks[1:]))
