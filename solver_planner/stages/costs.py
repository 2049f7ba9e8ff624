"""What a pipeline stage costs: time per micro-batch and memory per device.

Plan space.  ``S`` stages of contiguous layers on equal sub-meshes that tile the cluster in
order: part of one host ``(1, 2^k)`` or whole hosts ``(n, M)`` (the mesh shapes of Alpa's
inter-op pass, seed 003; equal meshes per stage as seed 001 §6.2 and seed 004's D/T/P
grid).  Inside a stage, ``t`` consecutive devices of a host form a tensor-parallel group and
the ``d = size / t`` groups are data-parallel replicas, each taking ``1/d`` of a micro-batch.

Stage time per micro-batch, all from the shared cost model (``t_i`` of seed 003)::

    t_i = compute(F + B) / (d t) + tensor all-reduces + send forward + send gradients back

* compute: the layers' FLOPs for ``mb / d`` samples, split ``t`` ways, at peak rate;
* tensor parallelism (t > 1): each layer all-reduces its output ``allreduces`` times per
  pass (Megatron: two per block in forward, two in backward), all groups at once;
* transfers: every tensor leaving the stage for a later stage (and its gradient coming
  back) moves ``1/d`` per replica from each replica to the same position of the next mesh,
  concurrently; the link class is that of the stage's boundary (inside a host, or across
  hosts).  A skip connection to a farther stage is priced on that same boundary.

All terms are affine in bytes, so each is two numbers per (mesh, degree, link class) and a
whole ``(k, i)`` matrix of stage times costs a few numpy operations.

The data-parallel gradient reduction runs once per iteration, after a stage's last
backward; the first stage finishes last (seed 001 Fig. 2.5), so the plan's objective adds
the first stage's reduction (the best P² program when its replicas span hosts, the
reduction module's ranking; a flat all-reduce inside a host).

Memory per device: (parameters + gradients + optimizer state) / t, plus the activations
kept for backward of every micro-batch in flight: ``S - p`` for stage ``p`` under 1F1B
(seed 004 §5, Narayanan et al. 2021), ``2 (S - p) - 1`` under eager-1F1B (seed 002 §4),
all ``B`` under GPipe, never more than ``B``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..cost import CostModel
from ..placement.matrix import ParallelismMatrix
from ..reduction.dsl import format_program
from ..reduction.hierarchy import Lowering
from ..reduction.ranking import StepCoster
from ..reduction.synthesis import synthesize_traced
from ..topology import Topology
from .layers import LayerModel

__all__ = ["MeshShape", "SCHEDULES", "in_flight", "mesh_shapes", "StageCosts", "CostTables", "divisors"]

SCHEDULES = ("1f1b", "gpipe", "eager-1f1b")
_PROBE = 1e9  # bytes at which affine terms are sampled


def in_flight(schedule: str, stages: int, position: int, microbatches: int) -> int:
    """Micro-batches whose activations stage ``position`` (0 = first) holds at most."""
    if schedule == "gpipe":
        n = microbatches
    elif schedule == "eager-1f1b":
        n = 2 * (stages - position) - 1
    else:
        n = stages - position
    return max(1, min(n, microbatches))


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass(frozen=True, order=True)
class MeshShape:
    """A sub-mesh of ``hosts`` x ``devices_per_host``."""

    hosts: int
    devices_per_host: int

    @property
    def size(self) -> int:
        return self.hosts * self.devices_per_host

    def as_list(self) -> list[int]:
        return [self.hosts, self.devices_per_host]

    def __str__(self) -> str:
        return f"{self.hosts}x{self.devices_per_host}"


def mesh_shapes(num_hosts: int, devices_per_host: int) -> list[MeshShape]:
    """Alpa's shapes that tile the cluster: (1, 2^k) dividing a host, (n, M) with n | hosts."""
    out = []
    k = 1
    while k < devices_per_host:
        if devices_per_host % k == 0:
            out.append(MeshShape(1, k))
        k *= 2
    out += [MeshShape(n, devices_per_host) for n in divisors(num_hosts)]
    return out


RANK_HOSTS = 4         # hosts on which P² programs are ranked
KEEP_PROGRAMS = 3      # best programs then costed on the stage's real mesh
_SYNTH: dict = {}      # synthesis hierarchy -> programs (synthesis depends on nothing else)


def _split(costed) -> tuple[float, float]:
    """(seconds at 0 bytes, seconds per byte) of a program costed at ``_PROBE`` bytes:
    every step is latency + bytes / bandwidth."""
    lat = sum(c.latency_term for c in costed.costs)
    return lat, (costed.time - lat) / _PROBE


def _affine(f) -> tuple[float, float]:
    """(value at 0 bytes, seconds per byte) of a time that is affine in bytes."""
    a = f(0.0)
    return a, (f(_PROBE) - a) / _PROBE


@dataclass
class CostTables:
    """Per-(mesh, tensor degree) constants, independent of the micro-batch count."""

    topology: Topology
    cost: CostModel
    shape: MeshShape
    tensor: int
    synthesize: bool = True

    @property
    def data(self) -> int:
        return self.shape.size // self.tensor

    def stage_devices(self, p: int) -> list[int]:
        return list(range(p * self.shape.size, (p + 1) * self.shape.size))

    def tensor_groups(self, p: int) -> list[list[int]]:
        devs = self.stage_devices(p)
        return [devs[j:j + self.tensor] for j in range(0, len(devs), self.tensor)]

    def data_groups(self, p: int) -> list[list[int]]:
        return [list(g) for g in zip(*self.tensor_groups(p))]

    def boundary_crosses_hosts(self, b: int) -> bool:
        """Whether the boundary in front of stage ``b`` separates two hosts."""
        return (b * self.shape.size) % self.topology.devices_per_host == 0

    def lane_pairs(self, src_stage: int, dst_stage: int) -> list[tuple[int, int]]:
        """Replica j of one stage sends to the same position of the other."""
        offset = (dst_stage - src_stage) * self.shape.size
        return [(g[0], g[0] + offset) for g in self.tensor_groups(src_stage)]

    @cached_property
    def tensor_allreduce(self) -> tuple[float, float]:
        if self.tensor == 1:
            return 0.0, 0.0
        groups = self.tensor_groups(0)
        return _affine(lambda x: self.cost.collective_time("allreduce", groups, x))

    def transfer(self, crosses_hosts: bool) -> tuple[float, float]:
        """Affine time of one stage-to-stage transfer over a boundary of this class."""
        return self._transfers[crosses_hosts]

    @cached_property
    def _transfers(self) -> dict[bool, tuple[float, float]]:
        out = {}
        stages = self.topology.num_devices // self.shape.size
        for b in range(1, stages):
            cls = self.boundary_crosses_hosts(b)
            if cls not in out:
                pairs = self.lane_pairs(b - 1, b)
                out[cls] = _affine(lambda x, pairs=pairs: self.cost.transfers_time(pairs, x))
        out.setdefault(True, (0.0, 0.0))
        out.setdefault(False, (0.0, 0.0))
        return out

    @cached_property
    def gradient_programs(self) -> list[tuple[float, float, str]]:
        """(seconds at 0 bytes, seconds per byte, program) of each way to all-reduce gradients."""
        if self.data == 1:
            return [(0.0, 0.0, "none")]
        groups = self.data_groups(0)
        flat = _affine(lambda x: self.cost.collective_time("allreduce", groups, x))
        out = [(flat[0], flat[1], "AllReduce")]
        levels = [lv.count for lv in self.topology.levels]
        if self.synthesize and self.shape.hosts > 1 and len(levels) == 2 and self.topology.host_level == 0 \
                and self.data > self.shape.hosts:
            # Replicas span hosts and share hosts: a 2-level reduction, P²'s synthesis
            # applies.  Programs are ranked on at most RANK_HOSTS hosts (costing every
            # program on hundreds of hosts takes minutes) and the best few are costed on
            # the real mesh.
            small = min(self.shape.hosts, RANK_HOSTS)
            ranked = sorted(self._programs(small), key=lambda e: (e[0] + e[1] * _PROBE, e[2]))
            if small == self.shape.hosts:
                out += [(a, b, text) for a, b, text, _ in ranked[:KEEP_PROGRAMS]]
            else:
                coster = StepCoster(self.cost, self._lowering(self.shape.hosts), _PROBE)
                out += [_split(coster.program(prog.program)) + (text,) for _, _, text, prog in ranked[:KEEP_PROGRAMS]]
        return out

    def _lowering(self, hosts: int) -> Lowering:
        levels = [lv.count for lv in self.topology.levels]
        matrix = ParallelismMatrix.of([[hosts, levels[1] // self.tensor], [1, self.tensor]])
        return Lowering(matrix, [hosts, levels[1]], self.topology.level_names, [0])

    def _programs(self, hosts: int) -> list[tuple[float, float, str, object]]:
        lowering = self._lowering(hosts)
        key = (lowering.hierarchy,)
        if key not in _SYNTH:
            _SYNTH[key] = synthesize_traced(lowering.hierarchy)
        coster = StepCoster(self.cost, lowering, _PROBE)
        return [_split(coster.program(p.program, p.held)) + (format_program(p.program), p) for p in _SYNTH[key]]

    def gradient_time(self, nbytes: np.ndarray | float) -> np.ndarray:
        x = np.asarray(nbytes, dtype=float)
        return np.min([a + b * x for a, b, _ in self.gradient_programs], axis=0)

    def gradient_program(self, nbytes: float) -> str:
        return min(self.gradient_programs, key=lambda p: p[0] + p[1] * nbytes)[2]


@dataclass
class StageCosts:
    """Stage times and memory of every layer range for one mesh shape and micro-batch count.

    Matrices are indexed ``[k, i]`` for the stage of layers k..i (inf below the diagonal).
    ``comm=False`` zeroes every communication term (the zero-communication check).
    """

    model: LayerModel
    topology: Topology
    shape: MeshShape
    microbatches: int
    schedule: str = "1f1b"
    comm: bool = True
    tables: dict[int, CostTables] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stages = self.topology.num_devices // self.shape.size
        self.micro_size = self.model.global_batch // self.microbatches
        self.device_memory = self.topology.device.memory
        n = self.model.num_layers
        self.valid = np.triu(np.ones((n, n), dtype=bool))
        self._compute: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.degrees = [t for t in divisors(self.shape.devices_per_host)
                        if self.micro_size % (self.shape.size // t) == 0 and t in self.tables]

    # per tensor degree ---------------------------------------------------------------
    def samples(self, t: int) -> float:
        """Samples of a micro-batch each replica processes."""
        return self.micro_size / (self.shape.size // t)

    def compute(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward task times (compute + tensor all-reduces), ``[k, i]``."""
        if t not in self._compute:
            self._compute[t] = self._compute_times(t)
        return self._compute[t]

    def _compute_times(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.model.range_sums
        per_device = self.samples(t) / t / self.topology.device.flops
        fwd, bwd = s("forward") * per_device, s("backward") * per_device
        if self.comm and t > 1:
            a, b = self.tables[t].tensor_allreduce
            ar = a * s("allreduces") + b * s("allreduce_bytes") * self.samples(t)
            fwd, bwd = fwd + ar, bwd + ar
        return fwd, bwd

    def transfer_bytes(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each replica lane carries forward and backward, ``[k, i]``."""
        send, recv = self.model.boundary_bytes()
        return send * self.samples(t), recv * self.samples(t)

    def transfers(self, p: int, t: int) -> np.ndarray:
        """Send times of stage ``p``: activations to later stages, gradients to earlier ones."""
        if not self.comm:
            return np.zeros_like(self.valid, dtype=float)
        tab = self.tables[t]
        fwd, bwd = self.transfer_bytes(t)
        out = np.zeros_like(fwd)
        if p + 1 < self.stages:
            a, b = tab.transfer(tab.boundary_crosses_hosts(p + 1))
            out = out + np.where(fwd > 0, a + b * fwd, 0.0)
        if p > 0:
            a, b = tab.transfer(tab.boundary_crosses_hosts(p))
            out = out + np.where(bwd > 0, a + b * bwd, 0.0)
        return out

    def time(self, p: int, t: int) -> np.ndarray:
        fwd, bwd = self.compute(t)
        return np.where(self.valid, fwd + bwd + self.transfers(p, t), np.inf)

    def gradient(self, t: int) -> np.ndarray:
        """Once-per-iteration gradient reduction time of the stage, ``[k, i]``."""
        if not self.comm:
            return np.zeros_like(self.valid, dtype=float)
        return self.tables[t].gradient_time(self.model.range_sums("params") / t)

    def static_memory(self, t: int) -> np.ndarray:
        """Parameters, gradients and optimizer state per device, ``[k, i]``."""
        s = self.model.range_sums
        return (2 * s("params") + s("optimizer")) / t

    def activation_memory(self, t: int) -> np.ndarray:
        """Activations one micro-batch keeps for backward per device, ``[k, i]``."""
        s = self.model.range_sums
        return self.samples(t) * (s("saved") / t + s("saved_replicated"))

    def memory(self, p: int, t: int, live: int | None = None) -> np.ndarray:
        """Peak bytes per device of stage ``p`` holding layers k..i with ``live`` micro-batches
        in flight (default: what the schedule allows)."""
        n = in_flight(self.schedule, self.stages, p, self.microbatches) if live is None else live
        return np.where(self.valid, self.static_memory(t) + n * self.activation_memory(t), np.inf)


def cost_tables(topology: Topology, cost: CostModel, shape: MeshShape, synthesize: bool = True) -> dict[int, CostTables]:
    return {t: CostTables(topology, cost, shape, t, synthesize) for t in divisors(shape.devices_per_host)}
