"""The cluster as the planners see it: devices with coordinates, groups, routes, resources.

Devices are numbered in mixed radix over the levels, outermost first, so device ``d`` of a
``[node: 2, gpu: 16]`` cluster has coordinates ``(d // 16, d % 16)`` and the devices of one
node are contiguous.  A transfer between two devices uses the interconnect of the
outermost level at which their coordinates differ (P² §2) and holds one *resource*
per crossed port and direction: the sender's ``tx`` side and the receiver's ``rx`` side,
since links are full duplex (the resharding paper §3).  Resources are what transfers share: all 16
GPUs of a node behind one NIC cross the same ``nic[n].tx``.  On a ``ring`` interconnect a
transfer holds each directed ring segment it crosses, the shortest way round, so groups
whose paths overlap share those segments.

>>> from solver_planner.topology import load_topology
>>> topo = load_topology("specs/clusters/p2-a100-2x16.yaml")
>>> topo.coords(17)
(1, 1)
>>> topo.interconnect_between(0, 17).name
'nic'
>>> [str(r) for r in topo.route(0, 17).resources]
['nic[0].tx', 'nic[1].rx']
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .spec.cluster import ClusterSpec, ComputeSpec, load_cluster_spec, parse_sharing

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Level", "Device", "Interconnect", "Resource", "Route", "Topology", "load_topology"]


@dataclass(frozen=True)
class Level:
    name: str
    count: int


@dataclass(frozen=True)
class Device:
    name: str
    flops: float
    memory: float
    memory_bandwidth: float | None = None
    compute: ComputeSpec | None = None     # the efficiency model's parameters (solver_planner.compute)
    dtype_flops: tuple[tuple[str, float], ...] = ()   # peak FLOP/s per dtype where it differs
    preset: str | None = None                         # the preset the spec named (solver_planner/data/devices.yaml)
    reserved: float = 0.0                             # memory plans leave free (spec: device.memory_reserved)

    @property
    def budget(self) -> float:
        """The bytes a plan's tensors may take: the memory less what is reserved for the rest."""
        return self.memory - self.reserved

    def peak(self, dtype: str | None = None) -> float:
        """Peak FLOP/s for ``dtype`` (the spec's ``dtype_flops``, else ``flops``)."""
        return dict(self.dtype_flops).get(dtype, self.flops) if dtype else self.flops


@dataclass(frozen=True)
class Interconnect:
    """A link technology with its bandwidth per direction and how its ports are shared."""

    name: str
    level: str | None
    bandwidth: float
    latency: float
    sharing: str  # 'device', 'level' or 'devices'
    sharing_arg: str | int | None  # level name for 'level', K for 'devices'
    shape: str
    via: tuple[str, ...]
    efficiency: tuple[tuple[str, float], ...] = ()   # (collective, fraction of the bandwidth it reaches)

    def efficiency_of(self, collective: str) -> float:
        return dict(self.efficiency).get(collective, 1.0)

    def describe_sharing(self) -> str:
        if self.sharing == "device":
            return "one per device"
        if self.sharing == "level":
            return f"one per {self.sharing_arg}"
        return f"one per {self.sharing_arg} devices"


class Resource(NamedTuple):
    """One direction of one port of an interconnect, or one directed segment of a ring
    interconnect: what concurrent transfers share.

    A named tuple, not a dataclass: the same fields, order, hash values and repr (it also
    equals a plain tuple of its fields, which nothing compares it with), but hashed and
    compared in C.  On 100 000 GPUs ``check`` sorts and names about 1.3 million ports the
    cost tables hand out; a frozen dataclass builds a tuple on every hash and two on every
    comparison."""

    interconnect: str
    instance: int
    direction: str  # 'tx' or 'rx'; on a ring 'cw' or 'ccw' (the segment leaving device ``instance``)

    def __str__(self) -> str:
        return f"{self.interconnect}[{self.instance}].{self.direction}"


@dataclass(frozen=True)
class Route:
    """What a transfer from ``src`` to ``dst`` crosses, and its unshared speed."""

    src: int
    dst: int
    interconnect: str
    resources: tuple[Resource, ...]
    bandwidths: tuple[float, ...]  # per resource
    latency: float

    @property
    def bandwidth(self) -> float:
        return min(self.bandwidths)


class Topology:
    """Devices, their coordinates and groups, and the interconnects between them."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.name = spec.name
        self.levels = tuple(Level(lv.name, lv.count) for lv in spec.levels)
        self.level_names = tuple(lv.name for lv in self.levels)
        self.device = Device(spec.device.name, spec.device.flops, spec.device.memory, spec.device.memory_bandwidth,
                             spec.device.compute, tuple(sorted(spec.device.dtype_flops.items())), spec.device.preset,
                             spec.device.memory_reserved)
        self.collective_overlap = spec.collective_overlap
        self.num_devices = prod(lv.count for lv in self.levels)
        self.interconnects: dict[str, Interconnect] = {}
        for ic in spec.interconnects:
            kind, arg = parse_sharing(ic.sharing, list(self.level_names))
            self.interconnects[ic.name] = Interconnect(
                ic.name, ic.level, ic.bandwidth, ic.latency, kind, arg, ic.shape, tuple(ic.via),
                tuple(sorted(ic.efficiency.items())))
        self._serving = {ic.level: ic for ic in self.interconnects.values() if ic.level is not None}
        # Devices below one instance of level i: the product of the counts of deeper levels.
        self._stride = tuple(prod(lv.count for lv in self.levels[i + 1:]) for i in range(len(self.levels)))
        if spec.host_level is not None:
            self.host_level = self.level_index(spec.host_level)
        else:
            self.host_level = max(0, len(self.levels) - 2)

    @classmethod
    def from_file(cls, path: str | Path) -> Topology:
        return cls(load_cluster_spec(path))

    # -- coordinates ---------------------------------------------------------------------
    def level_index(self, level: str | int) -> int:
        if isinstance(level, int):
            if not 0 <= level < len(self.levels):
                raise ValueError(f"level index {level} out of range 0..{len(self.levels) - 1}")
            return level
        try:
            return self.level_names.index(level)
        except ValueError:
            raise ValueError(f"no level named '{level}'; the levels are {', '.join(self.level_names)}") from None

    def _check_device(self, d: int) -> None:
        if not 0 <= d < self.num_devices:
            raise ValueError(f"device {d} out of range 0..{self.num_devices - 1}")

    def coords(self, d: int) -> tuple[int, ...]:
        """Coordinates of device ``d`` on every level, outermost first."""
        self._check_device(d)
        return tuple((d // self._stride[i]) % lv.count for i, lv in enumerate(self.levels))

    def device_at(self, coords: tuple[int, ...] | list[int]) -> int:
        if len(coords) != len(self.levels) or any(not 0 <= c < lv.count for c, lv in zip(coords, self.levels)):
            raise ValueError(f"coordinates {tuple(coords)} do not fit levels {self.level_names}")
        return sum(c * s for c, s in zip(coords, self._stride))

    def instance(self, d: int, level: str | int) -> int:
        """Global index of the instance of ``level`` that contains device ``d``."""
        self._check_device(d)
        return d // self._stride[self.level_index(level)]

    def host(self, d: int) -> int:
        """Index of the host (instance of :attr:`host_level`) holding device ``d``."""
        # :meth:`instance` without looking the level up: a boundary's broadcast chains ask
        # this millions of times on a large cluster
        if not 0 <= d < self.num_devices:
            self._check_device(d)
        return d // self._stride[self.host_level]

    @property
    def num_hosts(self) -> int:
        return self.num_devices // self._stride[self.host_level]

    @property
    def devices_per_host(self) -> int:
        return self._stride[self.host_level]

    def host_devices(self, h: int) -> list[int]:
        n = self._stride[self.host_level]
        return list(range(h * n, (h + 1) * n))

    def divergence_level(self, a: int, b: int) -> int | None:
        """Index of the outermost level at which ``a`` and ``b`` differ (None if ``a == b``)."""
        ca, cb = self.coords(a), self.coords(b)
        for i, (x, y) in enumerate(zip(ca, cb)):
            if x != y:
                return i
        return None

    # -- groups --------------------------------------------------------------------------
    def groups_within(self, level: str | int) -> list[list[int]]:
        """Devices of each instance of ``level`` (P² Table 2, ``InsideGroup``)."""
        n = self._stride[self.level_index(level)]
        return [list(range(start, start + n)) for start in range(0, self.num_devices, n)]

    def groups_across(self, level: str | int) -> list[list[int]]:
        """Devices that differ only in their ``level`` coordinate: one group per position elsewhere."""
        i = self.level_index(level)
        groups: dict[tuple[int, ...], list[int]] = {}
        for d in range(self.num_devices):
            c = self.coords(d)
            groups.setdefault(c[:i] + c[i + 1:], []).append(d)
        return list(groups.values())

    # -- routes --------------------------------------------------------------------------
    def interconnect_between(self, a: int, b: int) -> Interconnect:
        level = self.divergence_level(a, b)
        if level is None:
            raise ValueError(f"device {a} does not transfer to itself over an interconnect")
        return self._serving[self.level_names[level]]

    def port(self, d: int, ic: Interconnect) -> int:
        """Which instance of ``ic``'s ports device ``d`` uses."""
        if ic.sharing == "device":
            return d
        if ic.sharing == "level":
            return self.instance(d, str(ic.sharing_arg))
        return d // int(ic.sharing_arg)  # type: ignore[arg-type]

    def route(self, a: int, b: int) -> Route:
        """The resources and speed of a transfer from ``a`` to ``b``."""
        ic = self.interconnect_between(a, b)
        crossed = [ic] + [self.interconnects[v] for v in ic.via]
        resources: list[Resource] = []
        bandwidths: list[float] = []
        for link in crossed:
            if link is ic and ic.shape == "ring" and ic.level is not None:
                # the segments of the ring between them, the shortest way round: groups
                # whose paths overlap share those segments (and only those)
                segments = self._ring_segments(a, b, ic)
                resources += segments
                bandwidths += [link.bandwidth] * len(segments)
                continue
            resources += [Resource(link.name, self.port(a, link), "tx"), Resource(link.name, self.port(b, link), "rx")]
            bandwidths += [link.bandwidth, link.bandwidth]
        latency = ic.latency * self._hops(a, b, ic) + sum(self.interconnects[v].latency for v in ic.via)
        return Route(a, b, ic.name, tuple(resources), tuple(bandwidths), latency)

    def _ring_segments(self, a: int, b: int, ic: Interconnect) -> list[Resource]:
        """Directed segments from ``a`` to ``b`` on ``ic``'s ring (clockwise on a tie): the
        segment leaving device ``x`` clockwise is ``(ic, x, 'cw')``, anticlockwise ``(ic, x, 'ccw')``."""
        i = self.level_index(str(ic.level))
        n = self.levels[i].count
        stride = self._stride[i]
        pos_a, pos_b = self.coords(a)[i], self.coords(b)[i]
        forward = (pos_b - pos_a) % n
        step, direction, hops = (1, "cw", forward) if forward <= n - forward else (-1, "ccw", n - forward)
        base = a - pos_a * stride
        return [Resource(ic.name, base + ((pos_a + step * h) % n) * stride, direction) for h in range(hops)]

    def _hops(self, a: int, b: int, ic: Interconnect) -> int:
        """Hops on a ring interconnect (shortest way round); 1 through a switch."""
        if ic.shape != "ring" or ic.level is None:
            return 1
        i = self.level_index(ic.level)
        n = self.levels[i].count
        delta = abs(self.coords(a)[i] - self.coords(b)[i])
        return min(delta, n - delta)

    # -- inspection ----------------------------------------------------------------------
    @cached_property
    def graph(self) -> "nx.Graph":
        """Devices, ports and switches as a networkx graph (for inspection and plots).

        Nodes carry ``kind`` ('device', 'port', 'switch'); a path between two devices on
        different hosts passes their NIC ports.
        """
        import networkx as nx  # only for inspection and plots: loading it takes 0.1 s

        g = nx.Graph(name=self.name)
        for d in range(self.num_devices):
            g.add_node(("device", d), kind="device", coords=self.coords(d))
        for ic in self.interconnects.values():
            if ic.level is None:
                continue
            li = self.level_index(ic.level)
            for d in range(self.num_devices):
                # The device reaches this interconnect's port through its 'via' ports.
                chain = [("device", d)] + [("port", v, self.port(d, self.interconnects[v])) for v in ic.via]
                own = ("port", ic.name, self.port(d, ic)) if ic.sharing != "device" else None
                if own is not None:
                    chain.append(own)
                for u, v in zip(chain, chain[1:]):
                    g.add_edge(u, v, interconnect=v[1] if v[0] == "port" else ic.name)
                for node in chain[1:]:
                    g.nodes[node].update(kind="port", interconnect=node[1])
                end = chain[-1]
                domain = self.instance(d, li - 1) if li > 0 else 0
                if ic.shape == "switch":
                    sw = ("switch", ic.name, domain)
                    g.add_node(sw, kind="switch", interconnect=ic.name)
                    g.add_edge(end, sw, interconnect=ic.name, bandwidth=ic.bandwidth)
                else:
                    # Ring: link to the next instance of the level within the same domain.
                    c = list(self.coords(d))
                    c[li] = (c[li] + 1) % self.levels[li].count
                    nxt = self.device_at(c)
                    nchain_end = ("port", ic.name, self.port(nxt, ic)) if ic.sharing != "device" else ("device", nxt)
                    if nchain_end != end:
                        g.add_edge(end, nchain_end, interconnect=ic.name, bandwidth=ic.bandwidth)
        return g

    def _device_summary(self) -> dict:
        dev = self.device
        out = {"name": dev.name, "flops": dev.flops, "memory": dev.memory, "memory_reserved": dev.reserved,
               "memory_bandwidth": dev.memory_bandwidth,
               "dtype_flops": dict(dev.dtype_flops),
               "compute": dev.compute.model_dump() if dev.compute is not None else None}
        if dev.preset is not None:
            out["preset"] = dev.preset
            out["preset_filled"] = self.spec.preset_filled
        return out

    def summary(self) -> dict:
        """A JSON-ready description (used by ``solver-planner show``)."""
        return {
            "name": self.name,
            "levels": [{"name": lv.name, "count": lv.count} for lv in self.levels],
            "devices": self.num_devices,
            "host_level": self.level_names[self.host_level],
            "hosts": self.num_hosts,
            "device": self._device_summary(),
            "interconnects": [
                {
                    "name": ic.name,
                    "level": ic.level,
                    "bandwidth": ic.bandwidth,
                    "latency": ic.latency,
                    "shape": ic.shape,
                    "sharing": ic.describe_sharing(),
                    "ports": len({self.port(d, ic) for d in range(self.num_devices)}),
                    "devices_per_port": self.num_devices // len({self.port(d, ic) for d in range(self.num_devices)}),
                    "via": list(ic.via),
                    # each collective's share of the bandwidth it reaches (1 where not given)
                    "efficiency": dict(ic.efficiency),
                }
                for ic in self.interconnects.values()
            ],
            "collective_overlap": self.collective_overlap,
        }


def load_topology(path: str | Path) -> Topology:
    """Read a cluster spec file and build its :class:`Topology`."""
    return Topology.from_file(path)
