"""THE cost model: how long transfers and collectives take on a :class:`Topology`.

Every solver costs its answers here and every answer is replayed by the simulator with
these same numbers, so this module is the single definition of "time" in the project.

Formulas
--------
Alpha-beta model (Hockney; Thakur, Rabenseifner & Gropp 2005): a message of ``S`` bytes
over a route of latency ``a`` and bandwidth ``B`` takes ``a + S / B``.

Link sharing: every edge of an algorithm (a directed device-to-device transfer) crosses
resources, the ``tx`` side of the sender's port and the ``rx`` side of the receiver's on
each interconnect it uses (:meth:`Topology.route`).  When several edges run at once, a
resource of bandwidth ``B`` crossed by edges of total weight ``L`` gives each ``B / L``;
a group's *bus bandwidth* is its worst resource, ``min B_r / L_r``.  So 16 cross-node
pairs behind one NIC get 1/16 of it each (P² §4, the resharding paper §3 "host NIC is the
bottleneck").  Concurrent groups of one step share resources in the same way.

Collectives on a group of ``n`` devices with ``S`` bytes (NCCL's convention: the full
buffer, i.e. the AllReduce buffer, the ReduceScatter input, the AllGather output)::

    time = latency_term + factor(n) * S / busbw

with NCCL's bus-bandwidth factors (nccl-tests, doc/PERFORMANCE.md): AllReduce 2(n-1)/n,
ReduceScatter and AllGather (n-1)/n, Broadcast and Reduce 1.  A group of one device
takes no time.

* ``ring``: devices in ring order (by device id, so each host is contiguous); AllReduce
  takes 2(n-1) steps, ReduceScatter/AllGather n-1; Broadcast and Reduce are a pipelined
  chain from/to the root (the first device of the group, as P² §3.2 fixes).
  Latency term: steps x the slowest edge's latency.  A group with ``m > 1`` devices on
  each of several hosts runs ``m`` rings of ``1/m`` of the data (NCCL's channels), each
  leaving every host through a different device (:meth:`CostModel._rings`): with a NIC
  per device the group gets all of them, with one NIC per host nothing changes.
* Levels: an edge belongs to the level of the interconnect its route is for (``via``
  links included).  With ``y_l = factor(n) * S / share_l`` the time each level needs at its
  own bottleneck share, the bandwidth term is ``max_l y_l + (1 - o) * (sum_l y_l - max_l
  y_l)``: ``o = collective_overlap`` of the cluster spec; 1 (the default) is a perfectly
  pipelined ring where only the slowest level costs time (the bus bandwidth above), 0 a
  hierarchical collective that runs level by level and pays the intra-node part as well as
  the NIC's.  Set in the spec: the published logs fit within 0.3-16% at 1, and do not
  vary group shapes enough to identify it.
* Efficiency: an interconnect's ``efficiency`` for a collective (``sendrecv`` for
  point-to-point transfers, ``broadcast`` for pipelined broadcasts) multiplies its
  bandwidth for that collective (NCCL reaches a fraction of the nominal link speed, and a
  different one per collective); default 1.
* Rings: on a ``ring`` interconnect an edge holds every ring segment it crosses
  (:meth:`Topology.route`), so groups whose paths overlap share segments.
* ``tree``: NCCL's tree: a chain inside the innermost level and two complementary binary
  trees over the instances of outer levels (Sanders, Speck & Träff 2009), each tree
  carrying half the data (edge weight 1/2).  Latency term: the longest root-to-leaf
  latency, twice for AllReduce (reduce up, broadcast down).  NCCL has no tree
  ReduceScatter/AllGather; those fall back to the ring.

Pipelined broadcast (the resharding paper §3.1): the sender and the receivers form a chain (the
sender's own host first, each host contiguous); the data is cut into ``k`` chunks and
every device forwards a chunk as soon as it has it.  With per-chunk hop times
``t_h = a_h + (S/k) / B_h``::

    time = sum_h t_h + (k - 1) * max_h t_h

which tends to ``S / min_h B_h``, one copy across the slowest link, as ``k`` grows; ``k``
is chosen to minimise the time unless given.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

from .compute import ComputeModel
from .topology import Resource, Route, Topology

__all__ = ["Collective", "Algorithm", "CollectiveCost", "BroadcastCost", "CostModel", "bus_factor"]

# Chunks of a pipelined broadcast are never smaller than this (NCCL's chunks are of the
# order of 128 KiB-1 MiB); it bounds k when links have no latency.
MIN_CHUNK_BYTES = 64 * 1024


class Collective(str, Enum):
    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"
    REDUCE = "reduce"
    BROADCAST = "broadcast"

    @classmethod
    def parse(cls, name: str | Collective) -> Collective:
        if isinstance(name, Collective):
            return name
        key = name.lower().replace("_", "").replace("-", "")
        for c in cls:
            if c.value == key:
                return c
        from .errors import unknown_choice

        raise ValueError(unknown_choice("collective", name, [c.value for c in cls]))


class Algorithm(str, Enum):
    RING = "ring"
    TREE = "tree"


def bus_factor(kind: Collective | str, n: int) -> float:
    """NCCL's bus-bandwidth factor: algorithm bandwidth x factor = bus bandwidth."""
    kind = Collective.parse(kind)
    if n <= 1:
        return 0.0
    if kind is Collective.ALLREDUCE:
        return 2 * (n - 1) / n
    if kind in (Collective.REDUCESCATTER, Collective.ALLGATHER):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Edge:
    """A directed transfer inside an algorithm, carrying ``weight`` of the algorithm's data."""

    src: int
    dst: int
    weight: float = 1.0


@dataclass(frozen=True)
class CollectiveCost:
    """Time of one collective run by one or several concurrent groups, with its parts."""

    collective: str
    algorithm: str
    nbytes: float
    groups: int
    group_size: int
    time: float  # of the slowest group
    latency_term: float
    bandwidth_term: float
    bus_bandwidth: float  # of the slowest group (inf when no data moves)
    bottleneck: str | None  # the resource that bounds the bus bandwidth
    group_times: tuple[float, ...]
    resources: frozenset[Resource]

    @classmethod
    def of_groups(cls, kind: "Collective", algorithm: "Algorithm", groups, sizes, worst: int | None, times,
                  latency, bandwidth, bus_bandwidth, bottleneck: str | None, resources) -> "CollectiveCost":
        """The cost of concurrent ``groups`` from each group's terms (sequences indexed like
        ``groups``): the slowest group, ``worst`` (the first of them; None when there is no
        group), gives the time and its parts; ``bottleneck`` names its bounding resource."""
        some = worst is not None
        return cls(collective=kind.value, algorithm=algorithm.value, nbytes=max(sizes, default=0.0),
                   groups=len(groups), group_size=max((len(g) for g in groups), default=0),
                   time=float(times[worst]) if some else 0.0,
                   latency_term=float(latency[worst]) if some else 0.0,
                   bandwidth_term=float(bandwidth[worst]) if some else 0.0,
                   bus_bandwidth=float(bus_bandwidth[worst]) if some else math.inf,
                   bottleneck=bottleneck if some else None,
                   group_times=tuple(float(t) for t in times), resources=resources)


@dataclass(frozen=True)
class BroadcastCost:
    """Time of a pipelined chain broadcast from one sender (the resharding paper §3.1)."""

    time: float
    chunks: int
    chain: tuple[int, ...]
    hop_bandwidths: tuple[float, ...]
    hop_latencies: tuple[float, ...]
    resources: frozenset[Resource]

    @property
    def bottleneck_bandwidth(self) -> float:
        return min(self.hop_bandwidths) if self.hop_bandwidths else math.inf


class CostModel:
    """Closed-form times on a topology; see the module docstring for every formula."""

    def __init__(self, topology: Topology, compute: str = "efficiency", dtype: str | None = None):
        self.topology = topology
        self.compute = ComputeModel.of(topology.device, compute, dtype)
        self._routes: dict[tuple[int, int], Route] = {}

    def route(self, a: int, b: int) -> Route:
        key = (a, b)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self.topology.route(a, b)
        return r

    # -- shared machinery ----------------------------------------------------------------
    def _loads(self, edges: Iterable[Edge]) -> dict[Resource, float]:
        load: dict[Resource, float] = defaultdict(float)
        for e in edges:
            for res in self.route(e.src, e.dst).resources:
                load[res] += e.weight
        return load

    def _efficiency(self, interconnect: str, kind: str | None) -> float:
        if kind is None:
            return 1.0
        return self.topology.interconnects[interconnect].efficiency_of(kind)

    def _bottleneck(self, edges: Sequence[Edge], load: dict[Resource, float], kind: str | None = None
                    ) -> tuple[float, Resource | None]:
        """Smallest shared bandwidth ``min e_r B_r / L_r`` over the resources the edges cross
        (``e_r`` the efficiency of ``kind`` on the resource's interconnect)."""
        worst, where = math.inf, None
        for level in self._levels(edges, load, kind).values():
            if level[0] < worst or (level[0] == worst and where is not None and level[1] < where):
                worst, where = level
        return worst, where

    def _levels(self, edges: Sequence[Edge], load: dict[Resource, float], kind: str | None = None
                ) -> dict[str, tuple[float, Resource]]:
        """Per level (the interconnect an edge's route is for, its ``via`` links included): the
        smallest shared bandwidth of that level's edges and where it is."""
        out: dict[str, tuple[float, Resource]] = {}
        for e in edges:
            route = self.route(e.src, e.dst)
            for res, bw in zip(route.resources, route.bandwidths):
                share = bw * self._efficiency(res.interconnect, kind) / load[res]
                best = out.get(route.interconnect)
                if best is None or share < best[0] or (share == best[0] and res < best[1]):
                    out[route.interconnect] = (share, res)
        return out

    def _bandwidth_term(self, edges: Sequence[Edge], load: dict[Resource, float], kind: str, volume: float
                        ) -> tuple[float, float, Resource | None]:
        """(seconds, bus bandwidth, bottleneck) of moving ``volume`` bus bytes over ``edges``.

        Each level (intra-node links, the NIC, ...) needs ``volume / share_level``.  A perfectly
        pipelined ring overlaps the levels, and only the slowest costs time (P²'s
        model); a hierarchical collective runs them one after another.  The cluster's
        ``collective_overlap`` (``o``) says where between the two a collective sits::

            time = max_l y_l + (1 - o) * (sum_l y_l - max_l y_l)
        """
        levels = self._levels(edges, load, kind)
        if not levels:
            return 0.0, math.inf, None
        parts = {name: volume / share for name, (share, _) in levels.items()}
        slowest = max(parts, key=lambda n: (parts[n], n))
        overlap = self.topology.collective_overlap
        seconds = parts[slowest] + (1.0 - overlap) * (sum(parts.values()) - parts[slowest])
        share, where = min(levels.values(), key=lambda x: (x[0], x[1]))
        return seconds, share, where

    def compute_time(self, flops: float, nbytes: float = 0.0, kernels: float = 1.0) -> float:
        """Seconds for ``flops`` on one device in ``kernels`` kernels moving ``nbytes`` through
        its memory (:mod:`solver_planner.compute`)."""
        return float(self.compute.time(flops, nbytes, kernels))

    def copy_time(self, nbytes: float) -> float:
        """A local copy of ``nbytes`` (read once, written once) at the device's memory bandwidth;
        0 when the cluster spec gives none."""
        bw = self.topology.device.memory_bandwidth
        return 2 * nbytes / bw if bw and nbytes > 0 else 0.0

    # -- point to point ------------------------------------------------------------------
    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """``latency + S / bandwidth`` of one transfer alone; 0 to itself."""
        return self.transfers_time([(src, dst)], nbytes)

    def transfers_time(self, pairs: Sequence[tuple[int, int]], nbytes: float) -> float:
        """Time until the last of several concurrent transfers of ``nbytes`` each completes."""
        return self.flows_time([(a, b, 1.0) for a, b in pairs], nbytes)

    def flows_time(self, flows: Sequence[tuple[int, int, float]], nbytes: float) -> float:
        """Time until the last of concurrent transfers ``(src, dst, weight)`` completes, each
        moving ``weight * nbytes``: a transfer ends when every port on its route has moved all
        the bytes crossing it (``latency + nbytes * load / bandwidth``)."""
        edges = [Edge(a, b, w) for a, b, w in flows if a != b and w > 0]
        if not edges:
            return 0.0
        load = self._loads(edges)
        times = []
        for e in edges:
            bw, _ = self._bottleneck([e], load, "sendrecv")
            times.append(self.route(e.src, e.dst).latency + nbytes / bw)
        return max(times)

    # -- collectives ---------------------------------------------------------------------
    def edges(self, kind: Collective | str, group: Sequence[int], algorithm: Algorithm | str = "ring") -> list[Edge]:
        """The directed transfers of ``kind`` on ``group`` under ``algorithm``."""
        kind, algorithm = Collective.parse(kind), Algorithm(algorithm)
        if len(group) <= 1:
            return []
        if algorithm is Algorithm.TREE and kind in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE):
            down = self._tree_edges(list(group))
            if kind is Collective.BROADCAST:
                return down
            up = [Edge(e.dst, e.src, e.weight) for e in down]
            return up if kind is Collective.REDUCE else up + down
        order = sorted(group)
        if kind in (Collective.BROADCAST, Collective.REDUCE):
            root = order.index(group[0])
            chain = order[root:] + order[:root]
            down = [Edge(a, b) for a, b in zip(chain, chain[1:])]
            return down if kind is Collective.BROADCAST else [Edge(e.dst, e.src) for e in down]
        return [e for ring in self._rings(order) for e in ring]

    def _rings(self, order: list[int]) -> list[list[Edge]]:
        """The rings of a ring collective, each carrying an equal share of the data.

        Inside one host, or with unequal members per host: one ring in device order.  A
        group of ``m`` devices on each of several hosts runs ``m`` rings (NCCL's channels):
        ring ``j`` enters each host at its ``j``-th member and leaves from the one before,
        so each ring crosses hosts through a different device, and through that device's
        NIC when NICs are per device (what lets NCCL use every NIC of a node: "rails").
        Where the hosts' devices share one NIC the loads add up to the single ring's.
        """
        topo = self.topology
        hosts: dict[int, list[int]] = defaultdict(list)
        for d in order:
            hosts[topo.host(d)].append(d)
        m = len(order) // len(hosts)
        if len(hosts) == 1 or m == 1 or any(len(v) != m for v in hosts.values()):
            return [[Edge(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]]
        rings = []
        for j in range(m):
            path = [d for h in sorted(hosts) for d in hosts[h][j:] + hosts[h][:j]]
            rings.append([Edge(path[i], path[(i + 1) % len(path)], 1.0 / m) for i in range(len(path))])
        return rings

    def _tree_edges(self, group: list[int]) -> list[Edge]:
        """Parent->child edges of NCCL's two trees rooted at ``group[0]``, each carrying half the data."""
        return [Edge(a, b, 0.5) for mirrored in (False, True) for a, b in self._tree(list(group), mirrored)]

    def _tree(self, group: list[int], mirrored: bool) -> list[tuple[int, int]]:
        """One tree: a chain inside the innermost level, a binary heap over the instances above.

        The second tree lists the non-root instances in reverse, so that the inner nodes of
        one tree are mostly leaves of the other (Sanders et al. 2009).
        """
        topo = self.topology
        root = group[0]
        members = sorted(group)
        if len(members) <= 1:
            return []
        coords = {d: topo.coords(d) for d in members}
        level = next(i for i in range(len(topo.levels)) if len({coords[d][i] for d in members}) > 1)
        parts: dict[int, list[int]] = defaultdict(list)
        for d in members:
            parts[coords[d][level]].append(d)
        keys = sorted(parts)
        start = keys.index(coords[root][level])
        keys = keys[start:] + keys[:start]
        if mirrored:
            keys = keys[:1] + keys[1:][::-1]
        leaders = [root if root in parts[k] else parts[k][0] for k in keys]
        if level == len(topo.levels) - 1:
            return list(zip(leaders, leaders[1:]))  # innermost level: a chain, as NCCL inside a node
        edges = [(leaders[(i - 1) // 2], leaders[i]) for i in range(1, len(leaders))]
        for key, leader in zip(keys, leaders):
            edges += self._tree([leader] + [d for d in parts[key] if d != leader], mirrored)
        return edges

    def _latency(self, kind: Collective, group: Sequence[int], algorithm: Algorithm, edges: list[Edge]) -> float:
        n = len(group)
        if n <= 1:
            return 0.0
        if algorithm is Algorithm.TREE and kind in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE):
            depth = max(self._depth(group[0], self._tree(list(group), m)) for m in (False, True))
            return depth * (2 if kind is Collective.ALLREDUCE else 1)
        alpha = max(self.route(e.src, e.dst).latency for e in edges)
        steps = 2 * (n - 1) if kind is Collective.ALLREDUCE else n - 1
        return steps * alpha

    def _depth(self, root: int, tree: list[tuple[int, int]]) -> float:
        """Largest summed latency from ``root`` to a leaf of ``tree``."""
        children: dict[int, list[int]] = defaultdict(list)
        for a, b in tree:
            children[a].append(b)
        best, stack = 0.0, [(root, 0.0)]
        while stack:
            u, t = stack.pop()
            best = max(best, t)
            stack += [(v, t + self.route(u, v).latency) for v in children[u]]
        return best

    def collective(
        self,
        kind: Collective | str,
        groups: Sequence[Sequence[int]],
        nbytes: float | Sequence[float],
        algorithm: Algorithm | str = "ring",
    ) -> CollectiveCost:
        """Cost of ``kind`` run at once by every group in ``groups`` (disjoint device sets).

        ``nbytes`` is the buffer size, one for all groups or one per group (groups share
        links whatever they carry; each group's time uses its own size).

        >>> from solver_planner.topology import load_topology
        >>> cm = CostModel(load_topology("specs/clusters/p2-a100-2x16.yaml"))
        >>> c = cm.collective("allreduce", [[0, 16]], 8e9)
        >>> round(c.time, 6)   # 2 * 10us + 2 * (1/2) * 8 GB / 8 GB/s
        1.00002
        """
        kind, algorithm = Collective.parse(kind), Algorithm(algorithm)
        sizes = [float(nbytes)] * len(groups) if isinstance(nbytes, (int, float)) else [float(b) for b in nbytes]
        if len(sizes) != len(groups):
            raise ValueError(f"{len(sizes)} byte counts for {len(groups)} groups")
        sizes = [b for g, b in zip(groups, sizes) if len(g) > 0]
        groups = [list(g) for g in groups if len(g) > 0]
        seen: set[int] = set()
        for g in groups:
            for d in g:
                if d in seen:
                    raise ValueError(f"device {d} is in two concurrent groups; groups of one step must be disjoint")
                seen.add(d)
        from . import collective_arrays as arrays
        if len(seen) >= arrays.ARRAY_THRESHOLD and arrays.covers(self.topology, kind, algorithm):
            # the same formula over arrays (to the last bit), for steps over many devices
            return arrays.collective_arrays(self, kind, algorithm, groups, sizes)
        per_group = [self.edges(kind, g, algorithm) for g in groups]
        load = self._loads(e for edges in per_group for e in edges)
        times, lat_terms, bw_terms, busbws, where = [], [], [], [], []
        for g, edges, size in zip(groups, per_group, sizes):
            bw_term, busbw, res = self._bandwidth_term(edges, load, kind.value, bus_factor(kind, len(g)) * size) \
                if edges else (0.0, math.inf, None)
            lat = self._latency(kind, g, algorithm, edges)
            times.append(lat + bw_term)
            lat_terms.append(lat)
            bw_terms.append(bw_term)
            busbws.append(busbw)
            where.append(res)
        worst = max(range(len(times)), key=lambda i: (times[i], -i)) if times else None   # the first slowest
        bottleneck = str(where[worst]) if worst is not None and where[worst] is not None else None
        return CollectiveCost.of_groups(kind, algorithm, groups, sizes, worst, times, lat_terms, bw_terms, busbws,
                                        bottleneck, frozenset(load))

    def collective_time(self, kind: Collective | str, groups: Sequence[Sequence[int]], nbytes: float | Sequence[float],
                        algorithm: Algorithm | str = "ring") -> float:
        return self.collective(kind, groups, nbytes, algorithm).time

    # -- pipelined broadcast (the resharding paper §3.1) ---------------------------------------------
    def broadcast_chain(self, src: int, dsts: Sequence[int]) -> list[int]:
        """Sender first, then its own host's receivers, then each other host's, in device order."""
        topo = self.topology
        home = topo.host(src)
        rest = sorted({d for d in dsts if d != src}, key=lambda d: (topo.host(d) != home, d))
        return [src] + rest

    def pipelined_broadcast(self, src: int, dsts: Sequence[int], nbytes: float, chunks: int | None = None) -> BroadcastCost:
        """Time of broadcasting ``nbytes`` from ``src`` to ``dsts`` as a pipelined chain."""
        chain = self.broadcast_chain(src, dsts)
        edges = [Edge(a, b) for a, b in zip(chain, chain[1:])]
        if not edges or nbytes <= 0:
            return BroadcastCost(0.0, 1, tuple(chain), (), (), frozenset())
        load = self._loads(edges)
        bws = tuple(self._bottleneck([e], load, "broadcast")[0] for e in edges)
        lats = tuple(self.route(e.src, e.dst).latency for e in edges)
        if chunks is None:
            chunks = self._best_chunks(nbytes, bws, lats)
        elif chunks < 1:
            raise ValueError("chunks must be at least 1")
        return BroadcastCost(self._chain_time(nbytes, chunks, bws, lats), chunks, tuple(chain), bws, lats, frozenset(load))

    @staticmethod
    def _chain_time(nbytes: float, k: int, bws: Sequence[float], lats: Sequence[float]) -> float:
        hop = [a + nbytes / k / b for a, b in zip(lats, bws)]
        return sum(hop) + (k - 1) * max(hop)

    def _best_chunks(self, nbytes: float, bws: Sequence[float], lats: Sequence[float]) -> int:
        k_max = max(1, int(nbytes // MIN_CHUNK_BYTES))
        # With the slowest hop m fixed, T(k) = const + X / k + k * a_m, so k* = sqrt(X / a_m).
        m = min(range(len(bws)), key=lambda h: (bws[h], -lats[h]))
        x = nbytes * (sum(1 / b for b in bws) - 1 / bws[m])
        k_star = math.sqrt(x / lats[m]) if lats[m] > 0 else k_max
        candidates = {1, k_max, max(1, min(k_max, math.floor(k_star))), max(1, min(k_max, math.ceil(k_star)))}
        return min(candidates, key=lambda k: (self._chain_time(nbytes, k, bws, lats), k))
