""":meth:`CostModel.collective` over arrays: the same formula, for steps over many devices.

The cost model (:mod:`solver_planner.cost`) builds every edge of a step as an object, every
route as an object, and sums loads in dictionaries: 1.4 s for one all-reduce over 8 192
devices, minutes for a reduction program on 100 000.  Here the edges of a step are rows of
arrays, routes are read off the divergence level of the two device ids, and every
resource is an integer whose order is :class:`~solver_planner.topology.Resource`'s.  The
edges, and each resource's contributions, come in the order the cost model adds them, so
the floating-point sums and therefore the times are the same to the last bit;
``tests/test_collective_arrays.py`` compares both on random clusters and groups.

Covered: switch interconnects (any port sharing, ``via`` links), the ring algorithm and
its channels, and the pipelined chains of Broadcast and Reduce.  A ring-shaped
interconnect or NCCL's tree leaves :func:`covers` false and the cost model does the work.
"""

from __future__ import annotations

import math
from collections.abc import Set
from typing import Iterator, Sequence

import numpy as np

from .topology import Resource, Topology

__all__ = ["covers", "collective_arrays", "ARRAY_THRESHOLD"]

# Steps moving at least this many devices go through the arrays (smaller ones cost less
# than building them).
ARRAY_THRESHOLD = 512

_RING, _CHAIN = "ring", "chain"


def covers(topology: Topology, kind, algorithm) -> bool:
    """Whether :func:`collective_arrays` implements this case (else the cost model does)."""
    from .cost import Algorithm, Collective

    if any(ic.shape != "switch" for ic in topology.interconnects.values()):
        return False
    return algorithm is Algorithm.RING or kind in (Collective.REDUCESCATTER, Collective.ALLGATHER)


class _Resources(Set):
    """The resources of a step, as the cost model's frozenset, made only when asked for
    (a step over 100 000 devices crosses hundreds of thousands of ports)."""

    def __init__(self, ids: np.ndarray, decode):
        self._ids, self._decode, self._set = ids, decode, None

    def _materialize(self) -> frozenset:
        if self._set is None:
            self._set = frozenset(self._decode(int(i)) for i in self._ids.tolist())
        return self._set

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[Resource]:
        return iter(self._materialize())

    def __contains__(self, item) -> bool:
        return item in self._materialize()

    def __hash__(self) -> int:
        return hash(self._materialize())


class _Codec:
    """Resources as integers ordered like :class:`Resource` (interconnect name, instance, direction)."""

    def __init__(self, topology: Topology):
        self.names = sorted(topology.interconnects)
        self.rank = {n: i for i, n in enumerate(self.names)}
        self.span = topology.num_devices  # instances are device ids at most

    def encode(self, name: str, instance: np.ndarray, tx: bool) -> np.ndarray:
        return (self.rank[name] * self.span + instance) * 2 + (1 if tx else 0)   # 'rx' < 'tx'

    def decode(self, rid: int) -> Resource:
        rest, tx = divmod(rid, 2)
        name, instance = divmod(rest, self.span)
        return Resource(self.names[name], instance, "tx" if tx else "rx")


def _port(topology: Topology, ic, devices: np.ndarray, strides: list[int]) -> np.ndarray:
    """:meth:`Topology.port` of every device."""
    if ic.sharing == "device":
        return devices
    if ic.sharing == "level":
        return devices // strides[topology.level_index(str(ic.sharing_arg))]
    return devices // int(ic.sharing_arg)


def _edges(kind, order: np.ndarray, written_first: np.ndarray, hosts: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, weight, local index) of the edges of equal-size groups, rows of ``order``
    (each group sorted), as :meth:`CostModel.edges` lists them for each group."""
    from .cost import Collective

    g, n = order.shape
    if kind in (Collective.BROADCAST, Collective.REDUCE):
        # a chain from the root (the group's first member as written) round the sorted order
        root = np.argmax(order == written_first[:, None], axis=1)
        chain = np.take_along_axis(order, (np.arange(n)[None, :] + root[:, None]) % n, axis=1)
        src, dst = chain[:, :-1], chain[:, 1:]
        if kind is Collective.REDUCE:
            src, dst = dst, src
        return src, dst, np.ones(src.shape), np.broadcast_to(np.arange(n - 1), src.shape)
    # Rings: one in device order, or m rings (NCCL's channels) when every host holds m
    # members, ring j entering each host at its j-th member (CostModel._rings).
    change = hosts[:, 1:] != hosts[:, :-1]
    distinct = 1 + change.sum(axis=1)
    m = n // distinct
    regular = (n % distinct == 0) & (m > 1) & (distinct > 1)
    if regular.any():
        cols = np.arange(1, n)[None, :]
        regular &= ((cols % m[:, None] == 0) == change).all(axis=1)
    out = []
    single = ~regular
    if single.any():
        rows = order[single]
        w = np.ones(rows.shape)
        out.append((np.flatnonzero(single), rows, np.roll(rows, -1, axis=1), w))
    for mm in np.unique(m[regular]).tolist():
        sel = np.flatnonzero(regular & (m == mm))
        blocks = order[sel].reshape(len(sel), n // mm, mm)
        rings = [np.roll(blocks, -j, axis=2).reshape(len(sel), n) for j in range(mm)]
        paths = np.concatenate(rings, axis=1)                       # ring after ring
        nxt = np.concatenate([np.roll(r, -1, axis=1) for r in rings], axis=1)
        out.append((sel, paths, nxt, np.full(paths.shape, 1.0 / mm)))
    width = max(p.shape[1] for _, p, _, _ in out)
    src = np.zeros((g, width), dtype=np.int64)
    dst = np.zeros((g, width), dtype=np.int64)
    weight = np.zeros((g, width))
    for sel, s, d, w in out:
        src[sel, :s.shape[1]], dst[sel, :s.shape[1]], weight[sel, :s.shape[1]] = s, d, w
    return src, dst, weight, np.broadcast_to(np.arange(width), src.shape)


def collective_arrays(model, kind, algorithm, groups: list[list[int]], sizes: list[float]):
    """:meth:`CostModel.collective` for groups already checked disjoint and non-empty."""
    from .cost import Collective, CollectiveCost

    topo = model.topology
    counts = [lv.count for lv in topo.levels]
    strides = [math.prod(counts[j + 1:]) for j in range(len(counts))]
    codec = _Codec(topo)
    serving = {ic.level: ic for ic in topo.interconnects.values() if ic.level is not None}

    # -- edges, group by group in the cost model's order -----------------------------------
    parts = []   # (group indices, src, dst, weight, local index): rows of equal-size groups
    by_size: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_size.setdefault(len(g), []).append(i)
    for n, members in by_size.items():
        if n < 2:
            continue
        written = np.array([groups[i] for i in members], dtype=np.int64)
        order = np.sort(written, axis=1)
        src, dst, w, local = _edges(kind, order, written[:, 0], order // strides[topo.host_level])
        keep = w > 0                      # rows padded to the widest edge list
        gidx = np.broadcast_to(np.array(members)[:, None], src.shape)
        parts.append((gidx[keep], src[keep], dst[keep], w[keep], local[keep]))
    if parts:
        gidx, src, dst, weight, local = (np.concatenate(x) for x in zip(*parts))
        first = np.lexsort((local, gidx))
        gidx, src, dst, weight = gidx[first], src[first], dst[first], weight[first]
    else:
        gidx = src = dst = np.zeros(0, dtype=np.int64)
        weight = np.zeros(0)

    # -- routes: the interconnect of the outermost level where the ids differ ----------------
    level = len(counts) - sum((src // s != dst // s).astype(np.int64) for s in strides)
    level_ics = []
    for j, name in enumerate(topo.level_names):
        ic = serving.get(name)
        if ic is None and (level == j).any():
            raise KeyError(name)      # as Topology.route does
        level_ics.append(ic)
    # incidences, edge by edge in route order: (edge, resource, bandwidth x efficiency)
    inc_edge, inc_res, inc_bw, inc_slot = [], [], [], []
    latency = np.zeros(len(src))
    for j, ic in enumerate(level_ics):
        sel = np.flatnonzero(level == j)
        if ic is None or not len(sel):
            continue
        latency[sel] = ic.latency * 1 + sum(topo.interconnects[v].latency for v in ic.via)
        for slot, link in enumerate([ic] + [topo.interconnects[v] for v in ic.via]):
            share_bw = link.bandwidth * model._efficiency(link.name, kind.value)
            for side, ends in enumerate((src, dst)):
                inc_edge.append(sel)
                inc_res.append(codec.encode(link.name, _port(topo, link, ends[sel], strides), tx=side == 0))
                inc_bw.append(np.full(len(sel), share_bw))
                inc_slot.append(np.full(len(sel), 2 * slot + side))
    if inc_edge:
        e, r, bw, slot = (np.concatenate(x) for x in (inc_edge, inc_res, inc_bw, inc_slot))
        by_edge = np.lexsort((slot, e))
        e, r, bw = e[by_edge], r[by_edge], bw[by_edge]
    else:
        e = r = np.zeros(0, dtype=np.int64)
        bw = np.zeros(0)
    used, rid = np.unique(r, return_inverse=True)
    load = np.bincount(rid.reshape(-1), weights=weight[e], minlength=len(used))
    share = bw / load[rid.reshape(-1)]

    # -- per group and level: the smallest share, ties to the smallest resource -------------
    nic = len(codec.names)
    ic_of_level = np.array([codec.rank[ic.name] if ic is not None else 0 for ic in level_ics], dtype=np.int64)
    edge_ic = ic_of_level[level] if len(level) else np.zeros(0, dtype=np.int64)
    pair = gidx[e] * nic + edge_ic[e]
    best = np.lexsort((r, share, pair))
    head = best[np.r_[True, pair[best][1:] != pair[best][:-1]]] if len(best) else best
    first_edge = np.full(len(groups) * nic, len(src), dtype=np.int64)
    np.minimum.at(first_edge, gidx * nic + edge_ic, np.arange(len(src)))
    alpha = np.zeros(len(groups))
    np.maximum.at(alpha, gidx, latency)

    # -- per group: time = latency + the slowest level's volume / share (CostModel._bandwidth_term)
    n = np.array([len(g) for g in groups], dtype=np.int64)
    factor = np.where(n <= 1, 0.0, (2 * (n - 1) if kind is Collective.ALLREDUCE else n - 1) / np.maximum(n, 1)) \
        if kind in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER) else (n > 1) * 1.0
    volume = factor * np.array(sizes, dtype=float)                        # bus_factor(kind, n) * size
    hg, hic = pair[head] // nic, pair[head] % nic
    hshare, hres = share[head], r[head]
    part = volume[hg] / hshare
    seconds = np.zeros(len(groups))
    np.maximum.at(seconds, hg, part)
    overlap = topo.collective_overlap
    if overlap != 1.0:
        # levels add up in the order the cost model meets them: the sum, not only the max
        order = np.lexsort((first_edge[pair[head]], hg))
        by_group: dict[int, list[float]] = {}
        for i in order.tolist():
            by_group.setdefault(int(hg[i]), []).append(float(part[i]))
        for i, parts_ in by_group.items():
            slowest = float(seconds[i])
            seconds[i] = slowest + (1.0 - overlap) * (sum(parts_) - slowest)
    low = np.lexsort((hres, hshare, hg))
    low = low[np.r_[True, hg[low][1:] != hg[low][:-1]]] if len(low) else low
    busbw = np.full(len(groups), math.inf)
    where = np.full(len(groups), -1, dtype=np.int64)
    busbw[hg[low]], where[hg[low]] = hshare[low], hres[low]
    steps = np.where(n <= 1, 0, 2 * (n - 1) if kind is Collective.ALLREDUCE else n - 1)
    moving = np.zeros(len(groups), dtype=bool)
    moving[hg] = True
    lat = np.where(moving, steps * alpha, 0.0)
    seconds = np.where(moving, seconds, 0.0)
    times = lat + seconds
    worst = int(np.argmax(times)) if len(times) else None   # the first of the slowest
    bottleneck = str(codec.decode(int(where[worst]))) if worst is not None and where[worst] >= 0 else None
    return CollectiveCost.of_groups(kind, algorithm, groups, sizes, worst, times.tolist(), lat, seconds, busbw,
                                    bottleneck, _Resources(used, codec.decode))
