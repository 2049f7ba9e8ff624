"""A numeric reference executor: real sums, gathers and copies on numpy buffers.

It is the independent check of the boolean semantics.  Every device starts with its own
random integer vector, cut into ``k`` chunks; each lowered step does what the collective
does to the buffers handed to it, positionally, knowing nothing of pre-conditions:

* AllReduce: the members' held buffers (their chunks, in order) are summed element-wise;
  every member keeps the sum in its own chunk slots;
* ReduceScatter: the same sum, cut into equal parts; member ``n`` keeps part ``n`` in the
  slots of its ``n``-th share of its chunks;
* AllGather: the members' buffers are concatenated; everyone holds the union of slots;
* Reduce: the root keeps the sum; the others hold nothing afterwards;
* Broadcast: everyone holds the root's slots and data.

At the end every device must hold all ``k`` chunks, each the exact sum over its reduction
group.  Integers keep the sums exact.
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


def execute(num_devices: int, k: int, steps: Sequence[tuple[Collective, Sequence[Sequence[int]]]],
            reduction_groups: Sequence[Sequence[int]], chunk_len: int = 3, seed: int = 0) -> Execution:
    """Run ``steps`` on random data and compare every device with the sum over its group."""
    rng = np.random.default_rng(seed)
    data = rng.integers(-1000, 1000, size=(num_devices, k, chunk_len), dtype=np.int64)
    buf = data.copy()
    slots: list[list[int]] = [list(range(k)) for _ in range(num_devices)]
    for n, (kind, groups) in enumerate(steps):
        for g in groups:
            if len(g) < 2:
                continue
            held = [buf[d, slots[d]] for d in g]
            if kind in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE):
                if len({h.shape for h in held}) != 1:
                    return Execution(False, f"step {n + 1}: buffers of different sizes on group {list(g)}", n)
                total = np.sum(held, axis=0)
                if kind is Collective.ALLREDUCE:
                    for d in g:
                        buf[d, slots[d]] = total
                elif kind is Collective.REDUCE:
                    buf[g[0], slots[g[0]]] = total
                    for d in g[1:]:
                        slots[d] = []
                else:
                    if len(slots[g[0]]) % len(g):
                        return Execution(False, f"step {n + 1}: {len(slots[g[0]])} chunks do not split over"
                                                f" {len(g)} devices", n)
                    per = len(slots[g[0]]) // len(g)
                    for i, d in enumerate(g):
                        mine = slots[d][i * per:(i + 1) * per]
                        buf[d, mine] = total[i * per:(i + 1) * per]
                        slots[d] = mine
            elif kind is Collective.ALLGATHER:
                gathered_slots = [s for d in g for s in slots[d]]
                gathered = np.concatenate(held) if gathered_slots else np.zeros((0, chunk_len), np.int64)
                for d in g:
                    buf[d, gathered_slots] = gathered
                    slots[d] = list(gathered_slots)
            else:  # Broadcast
                root = g[0]
                for d in g[1:]:
                    buf[d, slots[root]] = buf[root, slots[root]]
                    slots[d] = list(slots[root])
    for group in reduction_groups:
        expected = data[list(group)].sum(axis=0)
        for d in group:
            if sorted(slots[d]) != list(range(k)):
                missing = sorted(set(range(k)) - set(slots[d]))
                return Execution(False, f"device {d} ends without chunk(s) {missing[:5]}", device=d)
            wrong = np.argwhere(buf[d] != expected)
            if len(wrong):
                chunk, elem = wrong[0]
                return Execution(False, f"device {d}, chunk {chunk}, element {elem}: {buf[d, chunk, elem]} instead of"
                                        f" the group sum {expected[chunk, elem]}", device=d)
    return Execution(True, "every device holds the exact sum over its reduction group")
