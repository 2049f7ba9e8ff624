"""A cross-mesh resharding task and its unit communication tasks (the resharding paper §2.2).

Every destination tile must be assembled from the source tiles it intersects.  Each
non-empty intersection of a source tile and a destination tile is one *unit task*: a
unique data slice, the source devices holding a replica of it, and the destination
devices that need it.  Source tiles partition the tensor and so do destination tiles,
so the slices partition it too: the bytes sent across at least equal the tensor's size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from math import prod
from typing import Sequence

from ..spec.base import MAX_TENSOR_BYTES
from ..spec.model import DTYPE_BYTES, ModelSpec, ReshardingSpec, check_meshes
from ..topology import Topology
from .mesh import Box, DeviceMesh, Layout, ShardingSpec, box_size, format_box

__all__ = ["UnitTask", "ReshardingProblem", "problems_from_model", "resize"]


@dataclass(frozen=True)
class UnitTask:
    """Send ``slice`` (``nbytes``) from one of ``holders`` to every device in ``receivers``."""

    index: int
    slice: Box
    nbytes: int
    holders: tuple[int, ...]
    receivers: tuple[int, ...]


@dataclass(frozen=True)
class ReshardingProblem:
    """A tensor of ``shape`` and ``dtype`` moving from layout ``src`` to layout ``dst``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    src: Layout
    dst: Layout

    def __post_init__(self) -> None:
        shared = set(self.src.mesh.flat) & set(self.dst.mesh.flat)
        if shared:
            raise ValueError(f"source and destination meshes share devices {sorted(shared)}; cross-mesh resharding needs"
                             " disjoint meshes")

    @classmethod
    def build(cls, name: str, shape: Sequence[int], dtype: str, topology: Topology,
              src: tuple[Sequence[int], int, Sequence[str] | str], dst: tuple[Sequence[int], int, Sequence[str] | str],
              first_device: tuple[int, int] = (0, 0)) -> ReshardingProblem:
        """From plain values: ``src`` and ``dst`` are ``(hosts, devices_per_host, spec)``."""
        layouts = []
        for (hosts, per_host, spec), first in zip((src, dst), first_device):
            layouts.append(Layout(tuple(shape), DeviceMesh.on(topology, hosts, per_host, first), ShardingSpec.parse(spec)))
        return cls(name, tuple(shape), dtype, layouts[0], layouts[1])

    @classmethod
    def from_spec(cls, spec: ReshardingSpec, topology: Topology) -> ReshardingProblem:
        """From a model spec's ``resharding`` entry (already checked against the cluster)."""
        return cls.build(spec.name, spec.shape, spec.dtype, topology,
                         (spec.src.hosts, spec.src.devices_per_host, spec.src.spec),
                         (spec.dst.hosts, spec.dst.devices_per_host, spec.dst.spec),
                         (spec.src.first_device, spec.dst.first_device))

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.itemsize

    def unit_tasks(self) -> list[UnitTask]:
        """Every non-empty (source tile) ∩ (destination tile), ordered by slice."""
        found = []
        src_tiles = self.src.holders()
        tilings = self.src.tilings
        for dst_box, receivers in self.dst.holders().items():
            # source tiles are a grid (one tiling per dimension): the ones a destination box
            # meets are, per dimension, the tile indices its interval covers -- not every
            # source tile (at 100 000 GPUs a boundary has ~200 tiles a side: 40 000 tests)
            ranges = []
            for (lo, hi), t in zip(dst_box, tilings):
                if hi <= lo or t.tile == 0:
                    ranges = None
                    break
                ranges.append(range(lo // t.tile, min(t.parts, -(-hi // t.tile))))
            if ranges is None:
                continue
            for ks in product(*ranges):
                src_box = tuple(t.interval(k) for k, t in zip(ks, tilings))
                holders = src_tiles.get(src_box)
                if holders is None:
                    continue
                part = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(src_box, dst_box))
                n = box_size(part)
                if n:
                    found.append((part, n * self.itemsize, tuple(holders), tuple(receivers)))
        found.sort()
        return [UnitTask(i, *t) for i, t in enumerate(found)]

    def describe_slice(self, box: Box) -> str:
        return format_box(box, self.shape)

    def padding_notes(self) -> list[str]:
        """Which side pads which dimension (the resharding paper §5.1.1); empty when every split is even."""
        return [f"{side}: {note}" for side, layout in (("src", self.src), ("dst", self.dst))
                for note in layout.padding_notes()]


def problems_from_model(model: ModelSpec, topology: Topology, name: str | None = None) -> list[ReshardingProblem]:
    """The model's ``resharding`` entries (or the one called ``name``) on ``topology``.

    Raises :class:`SpecError` (located in the model file) when there is none, when no
    entry has that name, or when a mesh does not fit the cluster.
    """
    if not model.resharding:
        raise model.source.error(("resharding",), "the model spec asks for no resharding; add a 'resharding:' list")
    per_host = topology.num_devices // topology.num_hosts
    check_meshes(model, topology.num_hosts, per_host, topology.name)
    chosen = [r for r in model.resharding if name is None or r.name == name]
    if not chosen:
        names = ", ".join(r.name for r in model.resharding)
        raise model.source.error(("resharding",), f"no resharding named {name!r}; the model has: {names}")
    return [ReshardingProblem.from_spec(r, topology) for r in chosen]


def resize(problem: ReshardingProblem, shape: Sequence[int]) -> ReshardingProblem:
    """The same meshes and sharding specs on a tensor of another ``shape`` (same rank)."""
    shape = tuple(int(n) for n in shape)
    if len(shape) != len(problem.shape) or any(n < 1 for n in shape):
        raise ValueError(f"expected {len(problem.shape)} positive sizes, got {list(shape)}")
    size = prod(shape) * DTYPE_BYTES[problem.dtype]
    if size > MAX_TENSOR_BYTES:
        # the spec's own limit (byte counts stay exact floats; beyond it numpy's integers overflow)
        raise ValueError(f"a {problem.dtype} tensor of {list(shape)} is {size:.3g} bytes; at most 2**50 (1 PiB) are"
                         " handled, as in a model spec")
    return replace(problem, shape=shape, src=replace(problem.src, shape=shape), dst=replace(problem.dst, shape=shape))
