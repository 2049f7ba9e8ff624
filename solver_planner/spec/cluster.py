"""The cluster spec: hierarchy levels, the device, and the interconnects.

A cluster is a hierarchy of named levels, outermost first (P² §2: "each level has a
name and a cardinality"), for example ``node: 4`` then ``gpu: 16``.  A transfer between two
devices uses the interconnect of the outermost level at which their coordinates differ.
An interconnect's bandwidth is per direction (the resharding paper §3: links are full duplex); it is
shared as one port per device, one per instance of a level (one NIC per node shared by
its GPUs, P² §4), or one per ``k`` consecutive devices (a PCIe switch under a CPU).
``via`` names further interconnects a transfer also crosses on each end (the V100 nodes
of P² Fig. 9b reach their NIC through PCIe).

Example::

    name: two-a100-nodes
    levels:
      - {name: node, count: 2}
      - {name: gpu, count: 16}
    device: {name: A100, flops: 312 TFLOP/s, memory: 40 GiB}
    interconnects:
      - {name: nvswitch, level: gpu, bandwidth: 270 GB/s, latency: 2us}
      - {name: nic, level: node, bandwidth: 8 GB/s, latency: 10us, sharing: node}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator

from ..errors import SpecError
from ..units import format_bytes
from .base import (MAX_DEVICES, MAX_LEVELS, MAX_LIST, NAME_PATTERN, Bandwidth, Bytes, Duration, FlopRate, Flops,
                   Integer, Number, SpecModel, first_issues, validate)
from .presets import apply_preset
from .source import Source, load_yaml

__all__ = ["LevelSpec", "ComputeSpec", "COLLECTIVE_KEYS", "DeviceSpec", "InterconnectSpec", "ClusterSpec", "load_cluster_spec", "parse_sharing"]

class LevelSpec(SpecModel):
    """One level of the hardware hierarchy and how many instances each parent holds."""

    name: str = Field(pattern=NAME_PATTERN, description="level name, e.g. 'node' or 'gpu'")
    count: Integer = Field(ge=1, le=MAX_DEVICES,
                           description="instances of this level inside one instance of the level above")


class ComputeSpec(SpecModel):
    """How fast the device runs a layer's kernels (DistIR §4: per-op costs fitted by
    regression on micro-benchmarks; :mod:`solver_planner.compute` gives the formulas)."""

    matmul_efficiency: Number = Field(
        gt=0, le=1, description="fraction of the peak FLOP/s that large matrix multiplies reach")
    half_efficiency_flops: Flops = Field(
        default=0.0, ge=0, description="FLOPs per kernel at which a matrix multiply reaches half of "
        "matmul_efficiency (efficiency x / (x + this) rises with size and saturates)")
    kernel_overhead: Duration = Field(
        default=0.0, ge=0, le=1.0, description="fixed time per kernel launch (per layer pass and micro-batch)")
    memory_efficiency: Number = Field(
        default=1.0, gt=0, le=1, description="fraction of memory_bandwidth a streaming kernel reaches (a STREAM"
        " copy or triad); prices memory-bound passes (norms, activations, the optimizer step)")
    attention_efficiency: Number | None = Field(
        default=None, gt=0, le=1, description="fraction of the peak fused (flash) attention reaches, forward and"
        " backward (default: matmul_efficiency)")


COLLECTIVE_KEYS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv")


class DeviceSpec(SpecModel):
    """The accelerator every leaf of the hierarchy is."""

    preset: str | None = Field(
        default=None, description="a device preset (solver_planner/data/devices.yaml, e.g. 'A100-SXM4-80GB'): its"
        " datasheet peaks, memory, memory bandwidth and compute block; keys written here override it")
    name: str = Field(description="device model, e.g. 'A100-SXM4-40GB'")
    flops: FlopRate = Field(gt=0, description="peak FLOP/s used for compute times")
    memory: Bytes = Field(gt=0, description="device memory")
    memory_reserved: Bytes = Field(
        default=0.0, ge=0, description="bytes of 'memory' plans leave free for what the memory model does not"
        " count: the CUDA context and library workspaces, NCCL's buffers, the caching allocator's fragmentation"
        " (plans fit their tensors into memory - memory_reserved)")
    memory_bandwidth: Bandwidth | None = Field(
        default=None, gt=0,
        description="device memory bandwidth; prices local copies (a collective's buffer packed or unpacked)."
        " Omitted: such copies are shown but cost nothing",
    )
    compute: ComputeSpec | None = Field(
        default=None, description="the compute efficiency model (matrix-multiply efficiency, kernel overhead); "
        "omitted: compute runs at the peak rate")
    dtype_flops: dict[Literal["float32", "bfloat16", "float16"], FlopRate] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="peak FLOP/s per training dtype where it differs from 'flops' "
        "(a V100 runs float32 at 15.7 TFLOP/s, float16 on tensor cores at 125)")


class InterconnectSpec(SpecModel):
    """A link technology and the transfers it carries."""

    name: str = Field(pattern=NAME_PATTERN)
    level: str | None = Field(
        default=None,
        description="the level whose transfers it carries: devices whose coordinates first differ at this "
        "level talk over it. Omit for an interconnect only crossed 'via' another.",
    )
    bandwidth: Bandwidth = Field(gt=0, description="bandwidth per direction (links are full duplex)")
    latency: Duration = Field(default=0.0, description="one-way latency of a message")
    sharing: str = Field(
        default="device",
        description="'device' (one port per device), a level name (one per instance of that level, "
        "e.g. 'node' for one NIC per node), or 'K devices' (one per K consecutive devices)",
    )
    shape: Literal["switch", "ring"] = Field(
        default="switch", description="'switch': any pair in one hop; 'ring': devices linked in a ring"
    )
    via: list[str] = Field(default_factory=list, max_length=MAX_LIST, description="interconnects also crossed at each end")
    efficiency: dict[Literal[COLLECTIVE_KEYS], Number] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="per collective (allreduce, allgather, reducescatter, broadcast, reduce, "
        "sendrecv), the fraction of the bandwidth it reaches on this interconnect (default 1)")
    description: str = ""

    @field_validator("efficiency")
    @classmethod
    def _fractions(cls, value: dict) -> dict:
        for key, x in value.items():
            if not 0 < x <= 1:
                raise ValueError(f"efficiency of {key} must be in (0, 1], got {x:g}")
        return value


class ClusterSpec(SpecModel):
    """A whole cluster spec file."""

    name: str
    description: str = ""
    levels: list[LevelSpec] = Field(min_length=1, max_length=MAX_LEVELS, description="hierarchy levels, outermost first")
    device: DeviceSpec
    interconnects: list[InterconnectSpec] = Field(min_length=1, max_length=MAX_LIST)
    host_level: str | None = Field(
        default=None,
        description="the level whose instances are hosts (one NIC domain each); "
        "default: the level just above the innermost one",
    )
    collective_overlap: Number = Field(
        default=1.0, ge=0, le=1, description="how much of a collective's traffic on its non-bottleneck "
        "interconnects overlaps the bottleneck's: 1 = only the slowest interconnect costs time (a perfectly "
        "pipelined ring), 0 = each interconnect's part adds up (a hierarchical collective run level by level)")

    _source: Source = PrivateAttr(default=Source("<memory>", None))
    _preset_filled: list = PrivateAttr(default_factory=list)

    @property
    def preset_filled(self) -> list[str]:
        """The device keys ``device.preset`` filled in (the spec wrote the others)."""
        return list(self._preset_filled)

    @property
    def source(self) -> Source:
        return self._source

    @property
    def num_devices(self) -> int:
        n = 1
        for level in self.levels:
            n *= level.count
        return n


def parse_sharing(text: str, level_names: list[str]) -> tuple[str, int | str | None]:
    """``'device'`` -> ('device', None); ``'node'`` -> ('level', 'node'); ``'4 devices'`` -> ('devices', 4)."""
    if text == "device":
        return ("device", None)
    if text in level_names:
        return ("level", text)
    match = re.fullmatch(r"\s*([0-9]{1,9})\s+devices?\s*", text)
    if match and int(match.group(1)) >= 1:
        return ("devices", int(match.group(1)))
    raise ValueError(f"expected 'device', a level name ({', '.join(level_names)}) or 'K devices', got {text!r}")


def _check(spec: ClusterSpec, source: Source) -> None:
    if spec.num_devices > MAX_DEVICES:
        sizes = " x ".join(str(level.count) for level in spec.levels)
        raise source.error(("levels",), f"{sizes} = {spec.num_devices:,} devices; at most {MAX_DEVICES:,} are"
                           " handled (README, 'Cluster specs')")
    issues = []
    names = [level.name for level in spec.levels]
    for i, level in enumerate(spec.levels):
        if level.name in names[:i]:
            issues.append(source.issue(("levels", i, "name"), f"level '{level.name}' is named twice"))
        if level.name == "device":
            issues.append(source.issue(("levels", i, "name"), "'device' is reserved for sharing: device; rename the level"))
    if spec.device.memory_reserved >= spec.device.memory:
        issues.append(source.issue(("device", "memory_reserved"), f"{format_bytes(spec.device.memory_reserved)} reserved"
                                   f" of {format_bytes(spec.device.memory)} leaves plans no memory"))
    if spec.host_level is not None and spec.host_level not in names:
        issues.append(source.issue(("host_level",), f"no level named '{spec.host_level}'; expected one of: {', '.join(names)}"))
    links = {ic.name: ic for ic in spec.interconnects}
    seen: set[str] = set()
    for i, ic in enumerate(spec.interconnects):
        if ic.name in seen:
            issues.append(source.issue(("interconnects", i, "name"), f"interconnect '{ic.name}' is named twice"))
        seen.add(ic.name)
        if ic.level is not None and ic.level not in names:
            issues.append(source.issue(("interconnects", i, "level"),
                                       f"no level named '{ic.level}'; expected one of: {', '.join(names)}"))
        try:
            kind, arg = parse_sharing(ic.sharing, names)
            if kind == "devices" and spec.num_devices % int(arg) != 0:  # type: ignore[arg-type]
                issues.append(source.issue(("interconnects", i, "sharing"),
                                           f"{arg} devices does not divide the {spec.num_devices} devices"))
        except ValueError as exc:
            issues.append(source.issue(("interconnects", i, "sharing"), str(exc)))
        for j, other in enumerate(ic.via):
            if other not in links:
                issues.append(source.issue(("interconnects", i, "via", j), f"no interconnect named '{other}'"))
            elif other == ic.name:
                issues.append(source.issue(("interconnects", i, "via", j), "an interconnect cannot go via itself"))
            elif links[other].via:
                issues.append(source.issue(("interconnects", i, "via", j),
                                           f"'{other}' has a 'via' of its own; list every crossed interconnect here instead"))
    for depth, level in enumerate(spec.levels):
        serving = [i for i, ic in enumerate(spec.interconnects) if ic.level == level.name]
        if len(serving) > 1:
            issues.append(source.issue(("interconnects", serving[1], "level"),
                                       f"level '{level.name}' is already served by '{spec.interconnects[serving[0]].name}';"
                                       " give each level one interconnect (use 'via' for links crossed on the way)"))
        unknown_levels = any(ic.level is not None and ic.level not in names for ic in spec.interconnects)
        if not serving and level.count > 1 and not unknown_levels:
            issues.append(source.issue(("levels", depth),
                                       f"level '{level.name}' has {level.count} instances but no interconnect serves it;"
                                       f" add one with 'level: {level.name}'"))
    if issues:
        raise SpecError(first_issues(issues))


def load_cluster_spec(path: str | Path, text: str | None = None) -> ClusterSpec:
    """Read and check a cluster spec; raise :class:`SpecError` with file:line:key on any problem."""
    data, source = load_yaml(path, text)
    filled = apply_preset(data, source)
    spec = validate(ClusterSpec, data, source)
    spec._source = source
    spec._preset_filled = filled
    _check(spec, source)
    return spec
