"""Part of a cluster: its first N devices, as a cluster of their own.

A plan that leaves devices idle (spares, failed nodes, a batch that does not split over
every GPU) runs on the cluster's first devices in rank order.  Those form a cluster of the
same levels only when they are a *prefix cut*: every level outside some level i holds one
instance, level i holds ``q`` of its instances, and every level inside i is whole; the
first ``q x (devices below one instance of level i)`` devices are then exactly that
cluster, with the same device numbers, interconnects and NIC domains.
"""

from __future__ import annotations

from math import prod

from .errors import OptionError
from .topology import Topology

__all__ = ["device_counts", "first_devices", "representable"]


def _strides(counts: list[int]) -> list[int]:
    return [prod(counts[i + 1:]) for i in range(len(counts))]


def representable(topology: Topology, n: int) -> bool:
    """Whether the first ``n`` devices form a cluster of the same levels (a prefix cut)."""
    counts = [lv.count for lv in topology.levels]
    for count, stride in zip(counts, _strides(counts)):
        if n % stride == 0 and 1 <= n // stride <= count:
            return True
    return False


def device_counts(topology: Topology, cap: int | None = None) -> list[int]:
    """Every device count a prefix cut gives, at most ``cap``, largest first."""
    counts = [lv.count for lv in topology.levels]
    cap = topology.num_devices if cap is None else cap
    out = {q * stride for count, stride in zip(counts, _strides(counts)) for q in range(1, count + 1)
           if q * stride <= cap}
    return sorted(out, reverse=True)


def first_devices(topology: Topology, n: int) -> Topology:
    """The cluster of ``topology``'s first ``n`` devices (``topology`` itself when n is all)."""
    if n == topology.num_devices:
        return topology
    counts = [lv.count for lv in topology.levels]
    for i, (count, stride) in enumerate(zip(counts, _strides(counts))):
        if n % stride == 0 and 1 <= n // stride <= count:
            levels = [lv.model_copy(update={"count": 1 if j < i else n // stride if j == i else lv.count})
                      for j, lv in enumerate(topology.spec.levels)]
            return Topology(topology.spec.model_copy(update={"levels": levels}))
    sizes = ", ".join(f"{c:,}" for c in device_counts(topology)[:6])
    raise OptionError(f"the first {n:,} devices of '{topology.name}' are not a whole part of its hierarchy"
                      f" ({' x '.join(f'{lv.count} {lv.name}' for lv in topology.levels)}); the largest that are:"
                      f" {sizes}, ...")
