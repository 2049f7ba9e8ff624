"""A numeric reference executor: real sums on numpy buffers, the way the library computes them.

It is the independent check of :mod:`.verify` and :mod:`.proof`, written from the meaning
in :mod:`.layout` and nothing else (it imports none of the checkers).  Every device
starts with its own random integers, ``k`` chunks of ``chunk_len`` elements, chunk ``c``
at row ``c``, and a list of the chunks it holds.  A call hands the library each member's
held rows in ascending order, so members are added *position by position*, whatever
chunks sit there; results go back to each member's own rows:

* AllReduce: the members' packed rows are summed; each member writes the sum to its rows;
* ReduceScatter: the same sum, cut into ``len(group)`` blocks; the member at position
  ``p`` of the group as written keeps block ``p`` in its own rows of that block;
* Reduce: the first member writes the sum to its rows; the others hold nothing;
* AllGather: every member copies every other member's held rows to the same rows;
* Broadcast: every member holds exactly the first member's rows, with its values.

A call the library cannot run (members handing buffers of different sizes, a scatter
that does not divide, an all-gather of overlapping chunks) ends the run as ill-formed.
At the end every device must hold all ``k`` rows, each the exact sum over its reduction
group.  Integers keep the sums exact; with several random elements per chunk a wrong
combination that happens to give the right numbers is practically impossible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..cost import Collective

__all__ = ["Execution", "execute"]


@dataclass
class Execution:
    ok: bool
    message: str
    step: int | None = None
    device: int | None = None
    ill_formed: bool = False


def execute(num_devices: int, k: int, steps: Sequence[tuple[Collective, Sequence[Sequence[int]]]],
            reduction_groups: Sequence[Sequence[int]], chunk_len: int = 4, seed: int = 0) -> Execution:
    """Run ``steps`` on random data and compare every device with the sum over its group."""
    rng = np.random.default_rng(seed)
    data = rng.integers(-10**6, 10**6, size=(num_devices, k, chunk_len), dtype=np.int64)
    buf = data.copy()
    held: list[list[int]] = [list(range(k)) for _ in range(num_devices)]

    def refuse(n: int, g, why: str) -> Execution:
        return Execution(False, f"step {n + 1}: group {list(g)}: {why}", n, ill_formed=True)

    for n, (kind, groups) in enumerate(steps):
        kind = Collective.parse(kind)
        for g in groups:
            if len(g) < 2:
                continue
            rows = [sorted(held[d]) for d in g]
            if kind is Collective.BROADCAST:
                for d in g[1:]:
                    buf[d, rows[0]] = buf[g[0], rows[0]]
                    held[d] = list(rows[0])
                continue
            if len({len(r) for r in rows}) != 1:
                return refuse(n, g, "buffers of different sizes")
            if kind is Collective.ALLGATHER:
                if len({c for r in rows for c in r}) != sum(len(r) for r in rows):
                    return refuse(n, g, "an all-gather of overlapping chunks")
                for d in g:
                    for m, r in zip(g, rows):
                        if m != d:
                            buf[d, r] = buf[m, r]
                    held[d] = sorted(c for r in rows for c in r)
                continue
            total = np.sum([buf[d, r] for d, r in zip(g, rows)], axis=0)
            if kind is Collective.ALLREDUCE:
                for d, r in zip(g, rows):
                    buf[d, r] = total
            elif kind is Collective.REDUCE:
                buf[g[0], rows[0]] = total
                for d in g[1:]:
                    held[d] = []
            else:
                if len(rows[0]) % len(g):
                    return refuse(n, g, f"{len(rows[0])} chunks do not split over {len(g)} devices")
                per = len(rows[0]) // len(g)
                for p, (d, r) in enumerate(zip(g, rows)):
                    mine = r[p * per:(p + 1) * per]
                    buf[d, mine] = total[p * per:(p + 1) * per]
                    held[d] = mine
    for group in reduction_groups:
        expected = data[list(group)].sum(axis=0)
        for d in group:
            if sorted(held[d]) != list(range(k)):
                missing = sorted(set(range(k)) - set(held[d]))
                return Execution(False, f"device {d} ends without chunk(s) {missing[:5]}", device=d)
            wrong = np.argwhere(buf[d] != expected)
            if len(wrong):
                chunk, elem = wrong[0]
                return Execution(False, f"device {d}, chunk {chunk}, element {elem}: {buf[d, chunk, elem]} instead of"
                                        f" the group sum {expected[chunk, elem]}", device=d)
    return Execution(True, "every device holds the exact sum over its reduction group")
