"""Device meshes, sharding specs and the tiles they cut a tensor into.

The resharding paper §2.2 (after GSPMD and Alpa): a mesh is a 2-D view of devices, rows are hosts and
columns devices inside a host.  A sharding spec gives every tensor dimension ``R``
(replicated) or ``S`` with the mesh dimensions it is split along: ``S0`` (rows), ``S1``
(columns) or ``S01`` (both, row-major: tile ``i * columns + j`` on device ``(i, j)``).

A dimension of size ``n`` split into ``p`` tiles uses tiles of ``ceil(n / p)`` elements; the
last tile is padded (and if ``p > n`` the last ones hold only padding).  Alpa requires even
splits; the resharding paper §5.1.1 handles uneven ones this way.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from math import prod
from typing import Sequence

from ..topology import Topology

__all__ = ["Box", "DeviceMesh", "ShardingSpec", "DimTiling", "Layout", "format_box", "box_size"]

# A region of a tensor: one half-open interval (lo, hi) per dimension.
Box = tuple[tuple[int, int], ...]

SPEC_ENTRIES = ("R", "S0", "S1", "S01")


def box_size(box: Box) -> int:
    """Number of elements in ``box`` (0 if any interval is empty)."""
    return prod(max(0, hi - lo) for lo, hi in box)


def format_box(box: Box, shape: Sequence[int]) -> str:
    """``[0:512, :, 256:512]``: ``:`` where the box spans the whole dimension.

    >>> format_box(((0, 512), (0, 1024), (256, 512)), (1024, 1024, 512))
    '[0:512, :, 256:512]'
    """
    parts = [":" if (lo, hi) == (0, n) else f"{lo}:{hi}" for (lo, hi), n in zip(box, shape)]
    return "[" + ", ".join(parts) + "]"


@dataclass(frozen=True)
class DeviceMesh:
    """``devices[i][j]``: the cluster device at mesh row ``i`` (a host), column ``j``."""

    hosts: tuple[int, ...]
    devices: tuple[tuple[int, ...], ...]

    @classmethod
    def on(cls, topology: Topology, hosts: Sequence[int], devices_per_host: int, first_device: int = 0) -> DeviceMesh:
        per_host = topology.num_devices // topology.num_hosts
        if any(not 0 <= h < topology.num_hosts for h in hosts):
            raise ValueError(f"hosts {list(hosts)} are not all in 0..{topology.num_hosts - 1}")
        if first_device < 0 or first_device + devices_per_host > per_host:
            raise ValueError(f"devices {first_device}..{first_device + devices_per_host - 1} do not fit a host of {per_host}")
        rows = tuple(tuple(topology.host_devices(h)[first_device:first_device + devices_per_host]) for h in hosts)
        return cls(tuple(hosts), rows)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.devices), len(self.devices[0])

    @property
    def flat(self) -> tuple[int, ...]:
        return tuple(d for row in self.devices for d in row)

    def __str__(self) -> str:
        rows, cols = self.shape
        return f"{rows}x{cols} on host{'s' * (rows > 1)} {','.join(map(str, self.hosts))}"


@dataclass(frozen=True)
class ShardingSpec:
    """One entry per tensor dimension: ``R``, ``S0``, ``S1`` or ``S01``."""

    entries: tuple[str, ...]

    def __post_init__(self) -> None:
        bad = [e for e in self.entries if e not in SPEC_ENTRIES]
        if bad:
            raise ValueError(f"sharding spec entries must be one of {', '.join(SPEC_ENTRIES)}; got {bad[0]!r}")
        axes = [a for e in self.entries for a in e[1:]]
        if len(axes) != len(set(axes)):
            raise ValueError(f"sharding spec {self}: a mesh axis shards two dimensions")

    @classmethod
    def parse(cls, entries: Sequence[str] | str) -> ShardingSpec:
        """``"S0,R,R"`` or ``["S0", "R", "R"]``."""
        if isinstance(entries, str):
            entries = [e.strip() for e in entries.strip("[]()").split(",")]
        return cls(tuple(entries))

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        return "[" + ",".join(self.entries) + "]"

    def parts(self, dim: int, mesh_shape: tuple[int, int]) -> int:
        """How many tiles dimension ``dim`` is cut into on a mesh of ``mesh_shape``."""
        return prod(mesh_shape[int(a)] for a in self.entries[dim][1:])

    def tile_index(self, dim: int, row: int, col: int, mesh_shape: tuple[int, int]) -> int:
        """Which tile of dimension ``dim`` mesh device ``(row, col)`` holds (0 when replicated)."""
        entry = self.entries[dim]
        if entry == "S0":
            return row
        if entry == "S1":
            return col
        if entry == "S01":
            return row * mesh_shape[1] + col
        return 0


@dataclass(frozen=True)
class DimTiling:
    """Dimension of ``size`` elements cut into ``parts`` tiles of ``tile`` (last one padded)."""

    size: int
    parts: int

    @property
    def tile(self) -> int:
        return -(-self.size // self.parts)

    @property
    def padding(self) -> int:
        """Padding elements the tiles add beyond ``size``."""
        return self.parts * self.tile - self.size

    def interval(self, k: int) -> tuple[int, int]:
        lo = min(self.size, k * self.tile)
        return lo, min(self.size, lo + self.tile)


@dataclass(frozen=True)
class Layout:
    """A tensor of ``shape`` laid out on ``mesh`` under ``spec``: who holds which box."""

    shape: tuple[int, ...]
    mesh: DeviceMesh
    spec: ShardingSpec

    def __post_init__(self) -> None:
        if len(self.spec) != len(self.shape):
            raise ValueError(f"sharding spec {self.spec} has {len(self.spec)} entries for a tensor of rank {len(self.shape)}")

    @functools.cached_property
    def tilings(self) -> tuple[DimTiling, ...]:
        # computed once per layout: :meth:`holders` reads it for each device of the mesh
        return tuple(DimTiling(n, self.spec.parts(d, self.mesh.shape)) for d, n in enumerate(self.shape))

    def box_of(self, row: int, col: int) -> Box:
        """The region mesh device ``(row, col)`` holds (the resharding paper §2.2 "data slice")."""
        shape = self.mesh.shape
        return tuple(t.interval(self.spec.tile_index(d, row, col, shape)) for d, t in enumerate(self.tilings))

    def holders(self) -> dict[Box, list[int]]:
        """Each distinct box (tile) and the devices holding a replica of it, in device order."""
        out: dict[Box, list[int]] = {}
        for i, row in enumerate(self.mesh.devices):
            for j, dev in enumerate(row):
                out.setdefault(self.box_of(i, j), []).append(dev)
        return out

    def padding_notes(self) -> list[str]:
        """One sentence per dimension whose tiles need padding (empty when all divide evenly)."""
        notes = []
        for d, t in enumerate(self.tilings):
            if t.padding:
                notes.append(f"dimension {d} ({t.size}) in {t.parts} tiles of {t.tile}: the last tile"
                             f"{'s' if t.padding > t.tile else ''} padded by {t.padding} element{'s' * (t.padding > 1)}")
        return notes
