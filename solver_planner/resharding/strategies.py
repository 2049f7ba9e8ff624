"""Ways to carry out one unit task, each timed by the shared cost model (the resharding paper §3.1).

* ``send-recv``: the sender sends the whole slice to each receiver device, one after
  another (time grows with the number of receiver devices).
* ``local-allgather``: each receiver host gets one copy, split over its receiver devices,
  which then all-gather it over the fast intra-host links (time grows with the number
  of receiver hosts; what Alpa and Megatron-LM do).
* ``global-allgather``: the slice is split over every receiver device, which then run one
  ring all-gather across hosts.
* ``broadcast``: a pipelined chain from the sender through every receiver
  (:meth:`CostModel.pipelined_broadcast`): about one copy's time over the slowest link,
  whatever the number of receivers.  The default.

Each strategy also lists its transfers, so a plan can say how many bytes cross between
the meshes and between hosts.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from ..cost import CostModel
from ..topology import Resource

__all__ = ["Strategy", "UnitCost", "unit_cost"]


class Strategy(str, Enum):
    BROADCAST = "broadcast"
    SEND_RECV = "send-recv"
    LOCAL_ALLGATHER = "local-allgather"
    GLOBAL_ALLGATHER = "global-allgather"


@dataclass(frozen=True)
class UnitCost:
    """Time of one unit task under one strategy, the ports it holds, and its transfers."""

    strategy: str
    time: float
    resources: frozenset[Resource]
    transfers: tuple[tuple[int, int, float], ...]  # (src, dst, bytes)


# per cost model: (strategy, sender, receivers, bytes) -> its UnitCost.  A boundary's unit
# tasks are costed when its instance is built and again when its schedule is replayed; check
# does both for each of a plan's boundaries (on 100 000 GPUs the replays alone cost 25 000
# broadcast chains again).  A replay follows its build, so a few thousand entries serve;
# the cap keeps the memo to tens of MB (an entry holds its ports and hops, about 2 KB)
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MEMO_ENTRIES = 20_000


def unit_cost(cost: CostModel, strategy: Strategy | str, sender: int, receivers: Sequence[int],
              nbytes: float) -> UnitCost:
    """Cost of sending ``nbytes`` from ``sender`` to every device in ``receivers``."""
    strategy = Strategy(strategy)
    memo = _MEMO.setdefault(cost, {})
    key = (strategy, sender, tuple(receivers), nbytes)
    out = memo.get(key)
    if out is None:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        out = memo[key] = _unit_cost(cost, strategy, sender, receivers, nbytes)
    return out


def _unit_cost(cost: CostModel, strategy: Strategy, sender: int, receivers: Sequence[int],
               nbytes: float) -> UnitCost:
    receivers = sorted(r for r in set(receivers) if r != sender)
    if not receivers or nbytes <= 0:
        return UnitCost(strategy.value, 0.0, frozenset(), ())
    if strategy is Strategy.BROADCAST:
        b = cost.pipelined_broadcast(sender, receivers, nbytes)
        hops = tuple((a, c, float(nbytes)) for a, c in zip(b.chain, b.chain[1:]))
        return UnitCost(strategy.value, b.time, b.resources, hops)
    if strategy is Strategy.SEND_RECV:
        time = sum(cost.transfer_time(sender, r, nbytes) for r in receivers)
        return UnitCost(strategy.value, time, _ports(cost, [(sender, r) for r in receivers]),
                        tuple((sender, r, float(nbytes)) for r in receivers))
    topo = cost.topology
    if strategy is Strategy.LOCAL_ALLGATHER:
        by_host: dict[int, list[int]] = {}
        for r in receivers:
            by_host.setdefault(topo.host(r), []).append(r)
        groups = list(by_host.values())
        # Host by host (the resharding paper Fig. 3b): one copy per host, a 1/m part to each of its m devices.
        scatter = sum(cost.transfers_time([(sender, r) for r in g], nbytes / len(g)) for g in groups)
        gather = cost.collective("allgather", groups, nbytes)
        sends = [(sender, r, nbytes / len(g)) for g in groups for r in g]
    else:
        groups = [receivers]
        scatter = cost.transfers_time([(sender, r) for r in receivers], nbytes / len(receivers))
        gather = cost.collective("allgather", groups, nbytes)
        sends = [(sender, r, nbytes / len(receivers)) for r in receivers]
    ring = [(e.src, e.dst, nbytes * (len(g) - 1) / len(g)) for g in groups
            for e in cost.edges("allgather", g)]
    return UnitCost(strategy.value, scatter + gather.time,
                    _ports(cost, [(a, c) for a, c, _ in sends]) | gather.resources, tuple(sends + ring))


def _ports(cost: CostModel, pairs: Sequence[tuple[int, int]]) -> frozenset[Resource]:
    return frozenset(res for a, b in pairs for res in cost.route(a, b).resources)

