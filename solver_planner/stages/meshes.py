"""Stages on sub-meshes of unequal shapes (Alpa's inter-operator space, Alpa §5.2).

Each stage takes one of Alpa's shapes -- part of one host ``(1, 2^k)`` or whole hosts ``(n, M)``
-- and the shapes' sizes sum to at most the cluster.  :class:`Layout` says where each mesh
sits; :class:`MeshCosts` answers what :class:`~.costs.StageCosts` answers for a plan on equal
meshes (task times, memory, transfers, reductions, tied all-reduces), stage by stage, so a
:class:`~.partition.Partition` on unequal meshes is priced, bounded and simulated by the same
code as one on equal meshes.

Transfers between meshes of unequal data degrees: a micro-batch's samples are split evenly
over each mesh's data-parallel replicas, in order.  Replica ``i`` of the sending mesh sends to
replica ``j`` of the receiving one the samples both hold (from the first device of its tensor
group to the first device of ``j``'s), all of them at once on their real routes
(:meth:`solver_planner.cost.CostModel.flows_time`).  With equal data degrees this is the lane
rule of equal meshes: on meshes of one shape, replica ``j`` sends to the same position of the
other mesh.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from math import gcd

from ..topology import Topology
from .costs import MeshShape, StageCosts, _affine, port_names

__all__ = ["Layout", "MeshCosts", "pack"]

# cost model -> {(what, meshes...): value}: every layout that puts a mesh at the same place shares it
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Layout:
    """Per stage: its mesh shape and its first device (meshes are runs of consecutive devices)."""

    shapes: tuple[MeshShape, ...]
    offsets: tuple[int, ...]

    def devices(self, p: int) -> range:
        return range(self.offsets[p], self.offsets[p] + self.shapes[p].size)

    @property
    def used(self) -> int:
        return sum(s.size for s in self.shapes)

    @property
    def equal(self) -> bool:
        return len(set(self.shapes)) <= 1

    def __str__(self) -> str:
        return " ".join(str(s) for s in self.shapes)


def pack(shapes, topology: Topology) -> Layout | None:
    """Where each mesh goes: meshes of whole hosts first, in stage order, from host 0; then
    the meshes inside a host, largest first (stage order on ties), one after another.  Their
    sizes are powers of two dividing the host, so none crosses a host boundary (a buddy
    allocation).  With equal shapes, stage ``p`` starts at ``p * size``, as on equal meshes.
    None when the sizes exceed the cluster."""
    shapes = tuple(shapes)
    M = topology.devices_per_host
    if sum(s.size for s in shapes) > topology.num_devices:
        return None
    offsets = [0] * len(shapes)
    at = 0
    whole = [p for p, s in enumerate(shapes) if s.devices_per_host == M]
    part = sorted((p for p, s in enumerate(shapes) if s.devices_per_host != M), key=lambda p: (-shapes[p].size, p))
    for p in whole + part:
        s = shapes[p]
        if s.devices_per_host != M and (M % s.size or (at % M) + s.size > M):
            raise ValueError(f"mesh {s} does not fit inside a host of {M} devices")
        offsets[p] = at
        at += s.size
    return Layout(shapes, tuple(offsets))


def _overlaps(n_src: int, n_dst: int) -> list[tuple[int, int, float]]:
    """(source replica, destination replica, share of the micro-batch) for samples split
    evenly over ``n_src`` and ``n_dst`` replicas: the intervals [i/n_src, (i+1)/n_src) and
    [j/n_dst, (j+1)/n_dst) that meet, in units of 1/lcm."""
    g = gcd(n_src, n_dst)
    lcm = n_src // g * n_dst
    a, b = lcm // n_src, lcm // n_dst          # units per source / destination replica
    out = []
    for i in range(n_src):
        lo, hi = i * a, (i + 1) * a
        for j in range(lo // b, (hi - 1) // b + 1):
            share = min(hi, (j + 1) * b) - max(lo, j * b)
            out.append((i, j, share / lcm))
    return out


class MeshCosts:
    """:class:`~.costs.StageCosts`' answers for a plan whose stage ``p`` runs on
    ``layout.shapes[p]`` at ``layout.offsets[p]``: ``parts[p]`` holds that shape's tables (the
    same micro-batch count for all)."""

    def __init__(self, parts: list[StageCosts] | tuple[StageCosts, ...], layout: Layout):
        parts = tuple(parts)
        if len(parts) != len(layout.shapes) or any(c.shape != s for c, s in zip(parts, layout.shapes)):
            raise ValueError("one cost table per stage, of its mesh shape")
        if len({(c.microbatches, c.comm, id(c.model)) for c in parts}) != 1:
            raise ValueError("every stage's tables must share the model, micro-batch count and comm switch")
        first = parts[0]
        self.parts = parts
        self.layout = layout
        self.model = first.model
        self.topology = first.topology
        self.microbatches = first.microbatches
        self.comm = first.comm
        self.micro_size = first.micro_size
        self.device_memory = first.device_memory
        self.stages = len(parts)
        self._cost = next(iter(first.tables.values())).cost
        self._memo = _MEMO.setdefault(self._cost, {})

    @property
    def key(self) -> tuple:
        return ("meshes", self.layout.shapes, self.layout.offsets)

    @property
    def compute(self):
        return self.parts[0].compute

    def of(self, mesh: int) -> StageCosts:
        return self.parts[mesh]

    def first_device(self, mesh: int) -> int:
        return self.layout.offsets[mesh]

    def mesh_size(self, mesh: int) -> int:
        return self.layout.shapes[mesh].size

    def _where(self, mesh: int) -> tuple:
        return self.layout.offsets[mesh], self.layout.shapes[mesh]

    def _replicas(self, mesh: int, t: int) -> list[int]:
        """The first device of each tensor-parallel group (a data-parallel replica) of ``mesh``."""
        devs = self.layout.devices(mesh)
        return [devs[j] for j in range(0, len(devs), t)]

    def _flows(self, t_src: int, src: int, t_dst: int, dst: int) -> list[tuple[int, int, float]]:
        a, b = self._replicas(src, t_src), self._replicas(dst, t_dst)
        if self.layout.shapes[src] == self.layout.shapes[dst]:
            # equal shapes: replica j to the same position of the other mesh (the lanes of
            # equal meshes)
            shift = self.layout.offsets[dst] - self.layout.offsets[src]
            return [(x, x + shift, 1.0 / len(a)) for x in a]
        return [(a[i], b[j], w) for i, j, w in _overlaps(len(a), len(b))]

    def pipe(self, t_src: int, src: int, t_dst: int, dst: int) -> tuple[float, float]:
        """Affine time (seconds at 0 bytes, per byte of a whole micro-batch's tensor) of moving
        one tensor from mesh ``src`` (tensor degree ``t_src``) to mesh ``dst``."""
        if not self.comm or src == dst:
            return 0.0, 0.0
        key = ("pipe", self._where(src), t_src, self._where(dst), t_dst)
        if key not in self._memo:
            flows = self._flows(t_src, src, t_dst, dst)
            self._memo[key] = _affine(lambda x: self._cost.flows_time(flows, x))
        return self._memo[key]

    def lanes(self, t_src: int, src: int, dst: int) -> tuple[float, float]:
        """Affine time (seconds at 0 bytes, per byte of one replica's share) of moving one
        tensor between meshes of one shape: :meth:`.costs.StageCosts.transfer` on these lanes."""
        if not self.comm or src == dst:
            return 0.0, 0.0
        key = ("lanes", self._where(src), t_src, self._where(dst))
        if key not in self._memo:
            pairs = [(a, b) for a, b, _ in self._flows(t_src, src, t_src, dst)]
            self._memo[key] = _affine(lambda x: self._cost.transfers_time(pairs, x))
        return self._memo[key]

    def pipe_time(self, t_src: int, src: int, t_dst: int, dst: int, per_sample: float) -> float:
        if self.layout.shapes[src] == self.layout.shapes[dst]:
            # StageCosts' arithmetic to the last bit: priced per micro-batch, the time differs
            # by an ulp, and at a tie the simulator's greedy order flips on that ulp
            a, b = self.lanes(t_src, src, dst)
            return a + b * (per_sample * self.parts[src].samples(t_src))
        a, b = self.pipe(t_src, src, t_dst, dst)
        return a + b * per_sample * self.micro_size

    def pipe_ports(self, t_src: int, src: int, t_dst: int, dst: int) -> tuple[str, ...]:
        key = ("pipe ports", self._where(src), t_src, self._where(dst), t_dst)
        if key not in self._memo:
            self._memo[key] = port_names({r for a, b, _ in self._flows(t_src, src, t_dst, dst)
                                          for r in self._cost.route(a, b).resources})
        return self._memo[key]

    def reduction_resources(self, t: int, mesh: int) -> tuple[str, ...]:
        """The ports mesh ``mesh``'s gradient reduction holds (its data-parallel groups)."""
        key = ("reduction", self._where(mesh), t)
        if key not in self._memo:
            devs = list(self.layout.devices(mesh))
            groups = [list(g) for g in zip(*[devs[j:j + t] for j in range(0, len(devs), t)])]
            res = self._cost.collective("allreduce", groups, 1.0).resources if len(groups[0]) > 1 else ()
            self._memo[key] = port_names(res)
        return self._memo[key]

    def tie_sync(self, plan, a: int, b: int) -> tuple[float, tuple[str, ...]]:
        own = plan.owner
        sa, sb = plan.mesh[own[a]], plan.mesh[own[b]]
        return self.tie_between(b, sa, sb, plan.stages[own[b]].tensor)

    def tie_between(self, b: int, sa: int, sb: int, tb: int) -> tuple[float, tuple[str, ...]]:
        """All-reduce of layer ``b``'s tied copy (on mesh ``sb``, tensor degree ``tb``) with its
        original (on mesh ``sa``): device j of one mesh with device j of the other, for j below
        the smaller mesh's size (on equal meshes, Megatron's embedding group)."""
        nbytes = self.model.layers[b].tied_params / tb if self.comm else 0.0
        key = ("tie", self._where(sa), self._where(sb), nbytes, self.comm)
        if key not in self._memo:
            da, db = self.layout.devices(sa), self.layout.devices(sb)
            groups = [[da[j], db[j]] for j in range(min(len(da), len(db)))]
            c = self._cost.collective("allreduce", groups, nbytes)
            self._memo[key] = (c.time if self.comm else 0.0, port_names(c.resources))
        return self._memo[key]
