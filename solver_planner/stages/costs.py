"""What a pipeline stage costs: task times per micro-batch, gradient reduction, memory per device.

Plan space.  ``S`` stages of contiguous layers on equal sub-meshes that tile the cluster in
order: part of one host ``(1, 2^k)`` or whole hosts ``(n, M)`` (the mesh shapes of Alpa's
inter-op pass; equal meshes per stage as Wang's thesis §6.2 and DistIR's D/T/P
grid).  Each stage picks a :class:`StageConfig`: ``t`` consecutive devices of a host form a
tensor-parallel group, the ``d = size / t`` groups are data-parallel replicas, each taking
``1/d`` of a micro-batch; and a recomputation mode when the spec allows several.

Per micro-batch, from the shared cost model, for layers k..i (``[k, i]`` matrices):

* forward ``F`` and backward ``BA + BW`` compute of ``mb / d`` samples split ``t`` ways,
  timed by the compute model (:mod:`solver_planner.compute`: kernel efficiency, launch
  overhead and memory traffic, or FLOPs at peak); ``BW`` is the weight-gradient part (the
  resharding paper's §4 delays it), ``BA`` the rest plus the recomputed forward;
* with ``gradient_accumulation: add``, in ``BW``: adding the micro-batch's weight gradients
  into the gradient buffer, one element-wise pass reading and writing the buffer and reading
  the new gradients, ``2 G + G'`` bytes (``G`` the buffer: ``P / t`` in its type, or the
  shard ``P / (t d)`` under ZeRO-2/3, which reduce every micro-batch; ``G'`` the same
  elements in the training type, or the reduction's for a reduced shard) for each of the ``B - 1``
  micro-batches after the first, spread as ``(B - 1) / B`` of it over every micro-batch
  (DistIR's pipelines add them with an Add op, PyTorch autograd into ``.grad``; ``fused``,
  Megatron-LM's fusion into the product, adds none);
* the optimizer step, after the stage's gradient reduction (in its tail ``g``);
* tensor parallelism (t > 1): each layer all-reduces its output ``allreduces`` times per
  pass (Megatron: two per block in forward, two in backward), all groups at once; in ``F``
  and ``BA`` (they sit between the layer's products);
* ZeRO-3: each layer's parameters all-gathered over the data group before its forward and
  before its backward; ZeRO-2/3: every micro-batch but the last reduce-scatters its gradients,
  in ``BW`` (:func:`.memory.zero_run`, which also says how torch's pipelining changes both);
  a tied copy is gathered and reduce-scattered with the layer that holds it.

Transfers between stages are not stage times: a tensor from stage ``p`` to stage ``q`` (the
next one, or a farther one for a skip connection) moves from replica ``j`` of ``p`` to the
same position of ``q``, all lanes at once, on the links between those devices
(:meth:`StageCosts.transfer`, affine in bytes, cached per route signature).

Gradient reduction (Wang's thesis ch. 5, what DDP's buckets do): each layer's gradients are cut
into buckets of at most ``gradient_bucket`` bytes (25 MiB, DDP's default), reduced over the
stage's data-parallel replicas as soon as the last micro-batch's backward has produced
them, buckets one after another (each bucket with the best P² program for its size when
replicas span hosts, :mod:`..reduction.ranking`; a flat all-reduce inside a host).  A sharded
optimizer runs no P² program: ZeRO-1/2 and Megatron-LM's distributed optimizer reduce-scatter
each bucket over the whole data group and all-gather the updated parameters (ZeRO §5.1-5.2,
NCCL's flat collectives as FSDP2, DeepSpeed and Megatron-LM issue them, and as ``run`` runs
them through FSDP2), the gather in the training type; ZeRO-3 only reduce-scatters (its
gathers are the forward's and backward's); the distributed optimizer with overlapped
gradients gathers ahead of the next forward instead (:meth:`StageCosts._gathers_ahead`).  With backward
pieces ``c_j`` and reductions ``s_j`` in backward order, the stage ends ``G = max_j (c_1 +
... + c_j + s_j + ... + s_n)`` after its last backward starts (a two-machine flow shop in a
fixed order); ``g = G - sum c`` is the tail the reduction adds (the tail factor of Wang's thesis
``gamma`` times the synchronisation cost).  Without overlap (``gradient_overlap: false``)
one reduction of all the stage's gradients follows the last backward.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..cost import CostModel
from ..spec.layers import FLOAT_DTYPES
from ..placement.matrix import ParallelismMatrix
from ..reduction.dsl import format_program
from ..reduction.hierarchy import Lowering
from ..reduction.ranking import StepCoster
from ..reduction.synthesis import synthesize_traced
from ..topology import Topology
from .layers import LayerModel
from . import ranges
from .ranges import Const, Copies, CopyBytes, FirstRow, Maxes, Ranges, Rows, Sums, Tail, apply
from .memory import (gathered_bytes, optimizer_traffic, saved_per_sample, static_bytes, static_split,
                     transient_per_sample, zero_run)
from .operators import layer_pass_times, overlapped_collectives

__all__ = ["MeshShape", "StageConfig", "mesh_shapes", "host_parts", "divisors", "CostTables", "ConfigCosts", "StageCosts", "port_names",
           "cost_tables"]

_PROBE = 1e9  # bytes at which affine terms are sampled


@functools.lru_cache(maxsize=32)
def _upper(n: int) -> np.ndarray:
    """The ``(n, n)`` mask of the diagonal and above (read-only: shared by every call)."""
    mask = np.triu(np.ones((n, n), dtype=bool))
    mask.flags.writeable = False
    return mask


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


@dataclass(frozen=True, order=True)
class StageConfig:
    """What a stage chooses besides its layers: tensor degree and recomputation mode."""

    tensor: int
    recompute: str = "none"

    def __str__(self) -> str:
        return f"t{self.tensor}" + ("" if self.recompute == "none" else f"/{self.recompute}")


def host_parts(devices_per_host: int) -> list[MeshShape]:
    """Alpa's shapes inside one host: (1, 2^k) dividing it, smaller than it."""
    out = []
    k = 1
    while k < devices_per_host:
        if devices_per_host % k == 0:
            out.append(MeshShape(1, k))
        k *= 2
    return out


def mesh_shapes(num_hosts: int, devices_per_host: int) -> list[MeshShape]:
    """Alpa's shapes that tile the cluster: (1, 2^k) dividing a host, (n, M) with n | hosts."""
    return host_parts(devices_per_host) + [MeshShape(n, devices_per_host) for n in divisors(num_hosts)]


# optimizer shardings whose step reduce-scatters gradients and all-gathers parameters over the
# whole data group, and that program in P²'s DSL (a valid all-reduce, which check proves)
SHARDED_STEP = ("zero-1", "zero-2", "distributed")
SHARDED_STEP_PROGRAM = "ReduceScatter(root, InsideGroup); AllGather(root, InsideGroup)"
RANK_HOSTS = 4         # hosts on which P² programs are ranked
KEEP_PROGRAMS = 3      # best programs then costed on the stage's real mesh
_SYNTH: dict = {}      # synthesis hierarchy -> programs (synthesis depends on nothing else)
# topology -> {(hosts, devices per host, tensor): the programs costed on that small mesh}:
# every mesh shape ranked on the same RANK_HOSTS hosts shares one ranking.  Keyed on the
# topology, not the cost model: a program's collectives and copies are priced from the
# topology alone (the compute model and its dtype do not enter), and `check` builds a cost
# model per run over the same topology (ranking was 40% of checking a small plan).
_RANKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    memo: dict = field(default_factory=dict, repr=False)     # per-mesh values every pair shares

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

    def _data_collective(self, kind: str) -> tuple[float, float]:
        if self.data == 1:
            return 0.0, 0.0
        groups = self.data_groups(0)
        return _affine(lambda x: self.cost.collective_time(kind, groups, x))

    @cached_property
    def data_allgather(self) -> tuple[float, float]:
        return self._data_collective("allgather")

    @cached_property
    def data_reducescatter(self) -> tuple[float, float]:
        return self._data_collective("reducescatter")

    @cached_property
    def gradient_programs(self) -> list[tuple[float, float, str]]:
        """(seconds at 0 bytes, seconds per byte, program) of each way to all-reduce gradients."""
        if self.data == 1:
            return [(0.0, 0.0, "none")]
        flat = self._data_collective("allreduce")
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
        memo = _RANKED.setdefault(self.cost.topology, {})
        key = (hosts, self.topology.levels[1].count, self.tensor)
        if key not in memo:
            memo[key] = self._cost_programs(hosts)
        return memo[key]

    def _cost_programs(self, hosts: int) -> list[tuple[float, float, str, object]]:
        lowering = self._lowering(hosts)
        key = (lowering.hierarchy,)
        if key not in _SYNTH:
            _SYNTH[key] = synthesize_traced(lowering.hierarchy)
        coster = StepCoster(self.cost, lowering, _PROBE)
        return [_split(coster.program(p.program, p.held)) + (format_program(p.program), p) for p in _SYNTH[key]]

    def gradient_time(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Least time over the programs to all-reduce ``nbytes`` (0 for no bytes)."""
        x = np.asarray(nbytes, dtype=float)
        best = np.min([a + b * x for a, b, _ in self.gradient_programs], axis=0)
        return np.where(x > 0, best, 0.0)

    def gradient_program(self, nbytes: float) -> str:
        return min(self.gradient_programs, key=lambda p: p[0] + p[1] * nbytes)[2]


def cost_tables(topology: Topology, cost: CostModel, shape: MeshShape, synthesize: bool = True) -> dict[int, CostTables]:
    return {t: CostTables(topology, cost, shape, t, synthesize) for t in divisors(shape.devices_per_host)}


# The share of a layer's tensor-parallel communication its recomputation runs again: full
# re-runs the forward, all-reduces included; selective-op (torchtitan's SelectiveAC) keeps
# the outputs of reduce-scatters only (its save list), so it re-runs every all-reduce, and
# under sequence parallelism the all-gathers, half of that volume (Korthikanti et al. 2022
# §4.2.2: an all-reduce is a reduce-scatter and an all-gather).
_AGAIN = {("full", False): 2.0, ("full", True): 2.0, ("selective-op", False): 2.0, ("selective-op", True): 1.5}


def _affine_of(ab: tuple[float, float], x: np.ndarray | float) -> np.ndarray:
    return ab[0] + ab[1] * np.asarray(x, dtype=float)


def _flow_shop_tail(pieces: np.ndarray, reductions: np.ndarray) -> Ranges:
    """``g[k, i]``: how long the reductions of layers k..i outlast their backward pieces
    (:class:`.ranges.Tail`)."""
    return Tail(pieces, reductions)


def _where(cond: Ranges, a, b) -> Ranges:
    return apply(lambda c, x, y: np.where(c > 0, x, y), cond, a, b)


@dataclass
class ConfigCosts:
    """``[k, i]`` tables (:class:`.ranges.Ranges`, linear in the layers) of one
    :class:`StageConfig` on one (mesh, micro-batch count)."""

    config: StageConfig
    data: int
    samples: float                  # samples of a micro-batch per replica
    forward: Ranges                 # F
    backward_act: Ranges            # BA (activation gradients, recomputation, backward all-reduces)
    backward_weight: Ranges         # BW (weight gradients)
    static: Ranges                  # bytes per device, tied copies included
    activation: Ranges              # bytes per device one micro-batch keeps for backward
    transient: Ranges               # bytes per device live during one layer's backward
    tail_full: Ranges               # g of the reductions behind a whole backward
    tail_weight: Ranges             # g of the reductions behind BW alone (weight delaying)
    # per-layer pieces for the simulator (backward order is reversed by the caller)
    layer_backward: np.ndarray
    layer_weight: np.ndarray
    layer_reduction: np.ndarray     # bucket time of each layer
    layer_reduction_copy: np.ndarray  # the same when the layer holds a tied copy
    layer_backward_copy: np.ndarray   # layer_backward and layer_weight when it holds one (its
    layer_weight_copy: np.ndarray     # ZeRO collectives move the copy too)
    reduction_all: Ranges           # [k, i]: the whole stage's buckets after its backward (no overlap)
    buckets: tuple = ()             # per layer: (full buckets, time of one, time of the last)
    buckets_copy: tuple = ()
    bucket_time: object = None      # bytes -> time of one bucket
    grad_bytes: Ranges | None = None   # [k, i]: gradient bytes per device, tied copies included
    bucket_cap: float = 25 * 2**20
    optimizer: Ranges | None = None   # [k, i]: the optimizer step, after the reductions (in the tails)
    # per layer: what a copy it holds adds to F, BA and BW (ZeRO's gathers and reduce-scatters
    # of the copy).  Not in forward/backward_act/backward_weight, which a range cannot know:
    # a chunk holding the copy needs none when the shared layer's chunk is on its mesh (ZB-V);
    # the plan adds them where its ties are split over meshes (Partition.copies), and the
    # search's bounds, without them, stay below.
    copy_collectives: tuple = ()
    # [k, i]: when the first micro-batch's forward of a stage of layers k..i may start (its
    # first parameter gather done) and how much longer it takes waiting for the next ones
    # (Megatron-LM's --overlap-param-gather; StageCosts._gathers_ahead); None: no such gathers
    gather_ready: Ranges | None = None
    gather_wait: Ranges | None = None
    # the reduction may start during the last backward (gradient_overlap; not under torch's
    # pipelining of FSDP2, which reduces after it: .memory.zero_run)
    overlap: bool = True
    # ... on the stage holding the first layer only (MemoryOptions.buckets_first_stage_only)
    first_only: bool = False

    def overlaps(self, first: int) -> bool:
        """Whether a stage whose first layer is ``first`` reduces its buckets during its last
        backward (else all its gradients after it)."""
        return self.overlap and (first == 0 or not self.first_only)

    def stage_buckets(self, first: int, last: int) -> list[float]:
        """Times of the buckets of a whole stage's gradients (no overlap)."""
        x = float(self.grad_bytes[first, last])
        if x <= 0 or self.reduction_all[first, last] == 0:
            return []
        n, full, last_t = bucket_split(x, self.bucket_cap, self.bucket_time)
        times = [float(full)] * int(n) + [float(last_t)]
        return [t for t in times if t > 0]

    def layer_buckets(self, layer: int, copy: bool = False) -> list[float]:
        """Times of layer ``layer``'s gradient buckets, in order (empty when nothing is reduced)."""
        if self.layer_reduction[layer] == 0 and not copy:
            return []
        n, full, last = self.buckets_copy if copy else self.buckets
        times = [float(full[layer])] * int(n[layer]) + [float(last[layer])]
        return [x for x in times if x > 0]

    @cached_property
    def backward(self) -> Ranges:
        return self.backward_act + self.backward_weight

    @cached_property
    def work(self) -> Ranges:
        return self.forward + self.backward_act + self.backward_weight


class StageCosts:
    """Every :class:`ConfigCosts` of one mesh shape and micro-batch count.

    ``comm=False`` zeroes every communication term (the what-if of ``--no-comm``).
    """

    def __init__(self, model: LayerModel, topology: Topology, shape: MeshShape, microbatches: int,
                 tables: dict[int, CostTables], comm: bool = True):
        self.model = model
        self.topology = topology
        self.shape = shape
        self.microbatches = microbatches
        self.tables = tables
        self.comm = comm
        self.stages = topology.num_devices // shape.size
        # bytes of the gradient reduction's type per byte of the training type
        self.reduce_scale = (FLOAT_DTYPES[model.options.gradient_reduce_dtype or model.dtype]
                             / FLOAT_DTYPES[model.dtype])
        # how ZeRO-2/3 run this pipeline's micro-batches: memory, gathers, reductions (.memory)
        self.zero = zero_run(model.options, self.stages, microbatches, self.reduce_scale)
        self.micro_size = model.global_batch // microbatches
        self.device_memory = topology.device.budget      # what the spec reserves is never planned into
        self.configs = [StageConfig(t, r) for t in divisors(shape.devices_per_host) if t in tables
                        and self.micro_size % (shape.size // t) == 0 and model.tensor_refusal(t) is None
                        for r in model.options.recompute]
        self._configs: dict[StageConfig, ConfigCosts] = {}
        self._transfers: dict[tuple, tuple] = {}      # transfer prices, and per-config layer and kernel times

    @property
    def key(self) -> tuple:
        return (self.shape,)

    def of(self, mesh: int) -> "StageCosts":
        """The tables of mesh ``mesh``: every mesh has this shape (:class:`.meshes.MeshCosts`
        answers per mesh for unequal ones)."""
        return self

    def first_device(self, mesh: int) -> int:
        return mesh * self.shape.size

    def mesh_size(self, mesh: int) -> int:
        return self.shape.size

    def pipe_time(self, t_src: int, src: int, t_dst: int, dst: int, per_sample: float) -> float:
        """One micro-batch's tensor of ``per_sample`` bytes per sample from mesh ``src`` to ``dst``."""
        return self.transfer_time(t_src, src, dst, per_sample * self.samples(t_src))

    def pipe_ports(self, t_src: int, src: int, t_dst: int, dst: int) -> tuple[str, ...]:
        return self.transfer_resources(t_src, src, dst)

    @property
    def compute(self):
        """The compute model every table of this mesh uses (:mod:`solver_planner.compute`)."""
        return next(iter(self.tables.values())).cost.compute

    @property
    def gathers_ahead(self) -> bool:
        """Megatron-LM's distributed optimizer with overlapped gradients: each bucket is
        reduce-scattered, and the updated parameters are gathered ahead of the next forward
        (--overlap-param-gather, :meth:`_gathers_ahead`)."""
        opts = self.model.options
        return opts.sharding == "distributed" and opts.gradient_overlap and self.zero.overlap

    def bucket_program(self, t: int, nbytes: float) -> str:
        """The program one gradient bucket of ``nbytes`` is reduced with (as ``_costs`` prices it)."""
        sharding = self.model.options.sharding
        if sharding == "zero-3" or self.gathers_ahead:
            # ZeRO-3 keeps only its shard of the gradients; the distributed optimizer with
            # overlap gathers the updated parameters ahead of the next forward (_gathers_ahead)
            return "ReduceScatter"
        if sharding in SHARDED_STEP:
            return SHARDED_STEP_PROGRAM
        return self.tables[t].gradient_program(nbytes)

    def samples(self, t: int) -> float:
        return self.micro_size / (self.shape.size // t)

    def __getitem__(self, config: StageConfig) -> ConfigCosts:
        if config not in self._configs:
            self._configs[config] = self._costs(config)
        return self._configs[config]

    # -- per configuration ------------------------------------------------------------------
    def layer_times(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per layer: forward, backward without weight gradients, weight gradients (seconds per
        micro-batch, tensor-parallel and ZeRO-3 collectives included)."""
        key = ("layers", c)
        if key in self._transfers:
            return self._transfers[key]
        m, opts, t = self.model, self.model.options, c.tensor
        tab = self.tables[t]
        smp = self.samples(t)
        fwd, act_grad, weight = self.compute_times(c)
        if self.comm and t > 1:
            a, b = tab.tensor_allreduce
            ar = m.column("allreduces") * (a + b * m.column("activations") * smp)
            again = _AGAIN.get((c.recompute, opts.sequence_parallel), 1.0)
            if opts.tensor_overlap:
                fwd, act_grad = self._overlapped(c, ar, again, fwd, act_grad)
            else:
                fwd = fwd + ar
                act_grad = act_grad + ar * again
        z = self.zero
        ag, rs = self.zero_collectives(c)
        fwd = fwd + z.forward_gathers * ag
        act_grad = act_grad + z.backward_gathers * ag
        weight = weight + rs
        self._transfers[key] = (fwd, act_grad, weight)
        return self._transfers[key]

    def _overlapped(self, c: StageConfig, ar: np.ndarray, again: float, fwd: np.ndarray,
                    act_grad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward and activation-gradient times with each layer's tensor-parallel
        collectives beside its products (``tensor_overlap``, :func:`.operators.overlapped_collectives`):
        an all-reduce is a reduce-scatter and an all-gather under sequence parallelism, each
        half its time.  Full recomputation (``again`` 2.0) runs the forward again, its
        collectives beside its products as in the forward; selective-op (1.5) re-runs only the
        all-gathers, whose products it keeps, so they have nothing to hide behind and count
        whole.  A layer without operators hides nothing."""
        m, t = self.model, c.tensor
        comp = self.tables[t].cost.compute
        fwd, act_grad = fwd.copy(), act_grad.copy()
        exposed: dict[tuple[int, float], tuple[float, float, float]] = {}
        for i, layer in enumerate(m.layers):
            if ar[i] <= 0:
                continue
            count = 2 * int(layer.allreduces)
            key = (id(layer), float(ar[i]))          # repeated blocks are one object: price it once
            if key not in exposed:
                exposed[key] = (overlapped_collectives(layer.ops, comp, self.samples(t), t, ar[i] / count, count)
                                if layer.ops else (ar[i] / 2, ar[i] / 2, ar[i]))
            gathers, scatters, backward = exposed[key]
            fwd[i] += gathers + scatters
            act_grad[i] += backward
            if again > 1.5:                     # full: the forward again, beside its products
                act_grad[i] += gathers + scatters
            elif again > 1.0:                   # selective-op: the gathers again, whole (docstring)
                act_grad[i] += ar[i] / 2
        return fwd, act_grad

    def zero_collectives(self, c: StageConfig, copies: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, seconds per micro-batch of ZeRO's collectives over the data group: one
        all-gather of its parameters (ZeRO-3; :attr:`.memory.ZeroRun.forward_gathers` and
        ``backward_gathers`` say how many a pass), and the reduce-scatters of its gradients
        (ZeRO-2/3: every micro-batch but the last, as each layer's backward produces them;
        priced whole in the weight gradients, like the gathers, as if not overlapped,
        (K - 1) / K of a reduction per micro-batch; the last one is the stage's tail,
        :meth:`_costs`).  With ``copies``, of the layer together with the tied copy it holds on
        a stage without the layer it shares: one parameter of the module, so one collective."""
        m, t = self.model, c.tensor
        tab = self.tables[t]
        d = self.shape.size // t
        z, K = self.zero, self.microbatches
        params = m.column("params") + (m.column("tied_params") if copies else 0.0)
        gathered = gathered_bytes(params, t, d, "zero-3")
        ag = np.zeros(m.num_layers)
        if self.comm and gathered.any() and (z.forward_gathers or z.backward_gathers):
            ag = np.where(gathered > 0, _affine_of(tab.data_allgather, gathered), 0.0)
        rs = np.zeros(m.num_layers)
        if self.comm and d > 1 and z.reduce_each and K > 1:
            grads, copy = self.gradient_columns(t)
            grads = grads + (copy if copies else 0.0)
            rs = np.where(grads > 0, _affine_of(tab.data_reducescatter, grads), 0.0) * (K - 1) / K
        return ag, rs

    def _copy_collectives(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per layer, what the tied copy it holds adds to its forward, activation-gradient and
        weight-gradient times per micro-batch on a stage without the layer it shares (ZeRO's
        gathers and reduce-scatters of the copy), or None when nothing."""
        if not self.model.ties():
            return None
        z = self.zero
        ag0, rs0 = self.zero_collectives(c)
        ag1, rs1 = self.zero_collectives(c, copies=True)
        if not ((ag1 - ag0).any() or (rs1 - rs0).any()):
            return None
        return z.forward_gathers * (ag1 - ag0), z.backward_gathers * (ag1 - ag0), rs1 - rs0

    def compute_times(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per layer, seconds of kernels per micro-batch: forward, activation gradients (with
        the recomputed forward), weight gradients with the gradient addition
        (:func:`.operators.layer_pass_times`: operator by operator where a layer lists its
        operators, :mod:`solver_planner.compute`; :meth:`accumulation_times`)."""
        # kept: every simulation of a plan reads each stage's (one per chunk, each check twice)
        key = ("kernels", c)
        if key not in self._transfers:
            comp = self.tables[c.tensor].cost.compute
            fwd, act_grad, weight = layer_pass_times(self.model, comp, c.tensor, self.samples(c.tensor), c.recompute,
                                                     self.model.options.sequence_parallel)
            out = (fwd, act_grad, weight + self.accumulation_times(c))
            for a in out:
                a.flags.writeable = False       # shared by every caller
            self._transfers[key] = out
        return self._transfers[key]

    def gradient_columns(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, the bytes a device reduces of its gradients and of its tied copies',
        in the reduction's own type (FSDP2 under torchtitan casts bf16 gradients to fp32
        before its reduce-scatter)."""
        m = self.model
        return m.column("params") / t * self.reduce_scale, m.column("tied_params") / t * self.reduce_scale

    def accumulation_times(self, c: StageConfig) -> np.ndarray:
        """Per layer, seconds per micro-batch of adding its weight gradients into the
        gradient buffer (``gradient_accumulation: add``).  The buffer holds the layer's whole
        tensor shard, ``P / t``, where gradients are reduced once a step (ZeRO-1, the
        distributed optimizer, and FSDP2 under torch's pipelining, in the reduction's type);
        ZeRO-2 and ZeRO-3 add each micro-batch's reduced shard, ``P / (t d)`` (:mod:`.memory`)."""
        m, opts, t = self.model, self.model.options, c.tensor
        comp = self.tables[t].cost.compute
        K = self.microbatches
        if comp.is_peak or K == 1 or opts.gradient_accumulation != "add":
            return np.zeros(m.num_layers)
        z = self.zero
        elements = m.column("params") / t / (self.shape.size // t if z.reduce_each else 1)
        # the buffer is read and written in its own type; the micro-batch's gradient is read once,
        # in the training type, or in the reduction's where it arrives reduce-scattered (ZeRO-2/3):
        # 10 bytes a bf16 parameter into a float32 buffer, 6 into a bf16 one
        incoming = self.reduce_scale if z.reduce_each else 1.0
        traffic = elements * (2.0 * z.gradient_bytes + incoming)
        per_pass = comp.time(0.0, traffic, (elements > 0).astype(float))
        return per_pass * (K - 1) / K

    def optimizer_time(self, c: StageConfig) -> np.ndarray:
        """``[k, i]``: seconds of the optimizer step of a stage of layers k..i, gradient
        clipping's norm included, then the host's per-iteration work (``host_overhead``:
        data loading, logging), which every stage waits for, so the iteration once (0 under
        the peak model, which prices FLOPs only)."""
        m, opts, t = self.model, self.model.options, c.tensor
        z = self.zero
        comp = self.tables[t].cost.compute
        if comp.is_peak:
            return Const(m.num_layers, 0.0)
        d = self.shape.size // t
        clip = opts.gradient_clipping
        per_layer = optimizer_traffic(*self._param_columns(), t, d, z.memory, clip, z.gradient_bytes)
        traffic = Sums(per_layer)
        if m.ties():
            traffic = traffic + self._copy_bytes(
                optimizer_traffic(*self._param_columns(True), t, d, z.memory, clip, z.gradient_bytes))
        kernels = Sums((m.column("params") + m.column("tied_params") > 0).astype(float))
        host = opts.host_overhead
        return apply(lambda x, k: comp.time(0.0, x, k) + host, traffic, kernels)

    def _costs(self, c: StageConfig) -> ConfigCosts:
        m, opts, t = self.model, self.model.options, c.tensor
        tab = self.tables[t]
        d = self.shape.size // t
        fwd, act_grad, weight = self.layer_times(c)
        # gradient buckets: each layer's gradients (per tensor shard) cut into buckets of at
        # most gradient_bucket bytes, reduced one after another, in the reduction's own type
        grads, copy = self.gradient_columns(t)
        reduces = self.comm and d > 1
        # Megatron-LM's distributed optimizer with overlapped gradients gathers the updated
        # parameters as the next forward reaches them (--overlap-param-gather, which the
        # megatron export writes with --overlap-grad-reduce), not in the step's tail
        gather_ahead = reduces and self.gathers_ahead

        def gather_time(x):
            x = np.asarray(x, dtype=float)
            return np.where(x > 0, _affine_of(tab.data_allgather, x / self.reduce_scale), 0.0)

        def bucket_time(x):
            x = np.asarray(x, dtype=float)
            if not reduces:
                return np.zeros_like(x)
            if opts.sharding == "zero-3" or gather_ahead:
                return np.where(x > 0, _affine_of(tab.data_reducescatter, x), 0.0)
            if opts.sharding in SHARDED_STEP:
                # the runtimes' flat reduce-scatter, then the gather of the updated parameters
                # in the training type (module docstring)
                return np.where(x > 0, _affine_of(tab.data_reducescatter, x), 0.0) + gather_time(x)
            return tab.gradient_time(x)

        # the spec's bucket, or a framework's that grows with the replicas (Megatron-Core's DDP:
        # max(40M, 1M x d) parameters; stages/layers.py layer_model)
        cap = max(opts.gradient_bucket, d * opts.gradient_bucket_per_replica)

        def chunked(x):
            """(full buckets, time of one, time of the last) and the total time of x bytes."""
            x = np.asarray(x, dtype=float)
            n, full_t, last_t = bucket_split(x, cap, bucket_time)
            return (n, full_t, last_t), np.where(x > 0, n * full_t + last_t, 0.0)

        chunks, red = chunked(grads)
        chunks_copy, red_copy = chunked(grads + copy)
        grad_bytes = Sums(grads) + self._copy_bytes(copy)
        red_all = apply(lambda x: chunked(x)[1], grad_bytes)
        backward = act_grad + weight
        # a layer's pieces when it holds a tied copy on a stage without the layer it shares
        extra = self._copy_collectives(c)
        backward_copy, weight_copy = (backward, weight) if extra is None else \
            (backward + extra[1] + extra[2], weight + extra[2])
        overlap = opts.gradient_overlap and self.zero.overlap
        if overlap:
            tail_full = _flow_shop_tail(backward, red)
            tail_weight = _flow_shop_tail(weight, red)
            if m.ties():
                copies = Copies(m.num_layers, m.ties())
                tail_full = _where(copies, _flow_shop_tail(backward_copy, red_copy), tail_full)
                tail_weight = _where(copies, _flow_shop_tail(weight_copy, red_copy), tail_weight)
            if opts.buckets_first_stage_only:
                # the other stages reduce after their last backward; still in buckets of the
                # cap here, not as Megatron-Core's one: the simulators give a link to one task
                # at a time, and one bucket of a whole chunk would hold it from the pipeline's
                # transfers (the other chunks' on an interleaved mesh) where NCCL shares it
                first = FirstRow(m.num_layers)
                tail_full, tail_weight = _where(first, tail_full, red_all), _where(first, tail_weight, red_all)
        else:
            tail_full = tail_weight = red_all
        # the optimizer step follows the stage's last reduction (and a tied copy's all-reduce)
        opt = self.optimizer_time(c)
        ready, wait = self._gathers_ahead(fwd, grads, cap, gather_time) if gather_ahead else (None, None)
        tail_full, tail_weight = tail_full + opt, tail_weight + opt
        static, activation, transient = self.memory_parts(c)
        return ConfigCosts(
            config=c, data=d, samples=self.samples(t),
            forward=Sums(fwd), backward_act=Sums(act_grad), backward_weight=Sums(weight),
            static=static, activation=activation, transient=transient,
            tail_full=tail_full, tail_weight=tail_weight,
            layer_backward=backward, layer_weight=weight, layer_reduction=red, layer_reduction_copy=red_copy,
            layer_backward_copy=backward_copy, layer_weight_copy=weight_copy,
            copy_collectives=extra or (), gather_ready=ready, gather_wait=wait,
            reduction_all=red_all, buckets=chunks, buckets_copy=chunks_copy, bucket_time=bucket_time,
            grad_bytes=grad_bytes, bucket_cap=cap, optimizer=opt, overlap=overlap,
            first_only=overlap and opts.buckets_first_stage_only,
        )

    def _gathers_ahead(self, fwd, grads, cap, gather_time) -> tuple[Ranges, Ranges]:
        """``[k, i]``: when the first micro-batch's forward of a stage of layers k..i may
        start, and how much longer it takes, for the parameter all-gathers of Megatron-LM's
        ``--overlap-param-gather``.

        Megatron-Core starts a stage's first bucket's gather after the step, and each next one
        in the forward pre-hook of the bucket before it, once that bucket's gather is done
        (``finish_param_sync``): one gather ahead of the forward.  Per layer, gathers ``s_j``
        and forwards ``f_j``: the forward may start at ``s_k`` after the iteration starts, and
        the forward of layer ``j + 1`` starts ``max(f_j, s_{j+1})`` after that of ``j``, so the
        first micro-batch's forward takes ``sum_{j>k} max(0, s_j - f_{j-1})`` longer.  Under
        Megatron-Core's bucketing (``buckets_first_stage_only``) every stage but the one
        holding the first layer is one bucket: it may start once the whole stage is gathered,
        and waits for nothing after.  The simulators apply both to the first forward
        (:attr:`.partition.Partition.gather_ready`, ``gather_wait``); tied copies' gathers are
        not counted."""

        def gathered(x):
            n, full_t, last_t = bucket_split(np.asarray(x, dtype=float), cap, gather_time)
            return np.where(np.asarray(x) > 0, n * full_t + last_t, 0.0)

        s = gathered(grads)
        f = np.asarray(fwd, dtype=float)
        ahead = np.concatenate([[0.0], np.maximum(0.0, s[1:] - f[:-1])])     # u_j, j >= 1
        n = self.model.num_layers
        ready, wait = Rows(s), Sums(ahead) - Rows(ahead)
        if self.model.options.buckets_first_stage_only:
            first = FirstRow(n)
            ready, wait = _where(first, ready, Sums(s)), _where(first, wait, Const(n, 0.0))
        return ready, wait

    def _copy_bytes(self, per_layer: np.ndarray) -> Ranges:
        """``[k, i]``: the tied copies a stage of layers k..i holds (layers sharing one outside it)."""
        return CopyBytes(per_layer, self.model.ties())

    def memory_parts(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[k, i]`` bytes per device: static (parameters, gradients, optimizer state, tied
        copies), kept activations of one micro-batch, transient (one layer's recomputation or
        gathered parameters); :mod:`.memory` gives the formulas."""
        key = ("memory", c)
        if key in self._transfers:
            return self._transfers[key]
        m, opts, t = self.model, self.model.options, c.tensor
        z = self.zero
        d = self.shape.size // t
        smp = self.samples(t)
        # the static bytes depend on the tensor degree alone: one table (and one dense
        # square, when asked) for every recomputation mode
        static = self._transfers.get(("static", t))
        if static is None:
            static = Sums(static_bytes(*self._param_columns(), t, d, z.memory, z.gradient_bytes))
            if self.model.ties():
                copy = static_bytes(*self._param_columns(True), t, d, z.memory, z.gradient_bytes)
                static = static + self._copy_bytes(copy)
            self._transfers["static", t] = static
        gathered, recomputed = self.transient_parts(c)
        transient = Maxes(gathered) + Maxes(recomputed)
        activation = smp * Sums(saved_per_sample(m.layers, c.recompute, t, opts.sequence_parallel))
        self._transfers[key] = (static, activation, transient)
        return self._transfers[key]

    def transient_parts(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, bytes per device live during its backward: the parameters ZeRO-3
        gathers, and one micro-batch's recomputation (a stage's transient is the largest of
        each over its layers, :mod:`.memory`)."""
        m, opts, t = self.model, self.model.options, c.tensor
        z = self.zero
        d = self.shape.size // t
        return (gathered_bytes(m.column("params"), t, d, z.memory),
                self.samples(t) * transient_per_sample(m.layers, c.recompute, t, opts.sequence_parallel))

    def memory_floor(self, c: StageConfig, live: int) -> tuple[Ranges, Ranges, Ranges]:
        """:meth:`memory`'s parts without tied copies: (static, ``live`` micro-batches'
        activations, transient), each growing with the layers a stage holds (a copy's bytes
        leave a stage that also takes the layer it shares), so a lower bound for
        :func:`.coarse.fine_bound`."""
        m, opts, t = self.model, self.model.options, c.tensor
        z = self.zero
        d = self.shape.size // t
        static = Sums(static_bytes(*self._param_columns(), t, d, z.memory, z.gradient_bytes))
        _, activation, transient = self.memory_parts(c)
        return static, live * activation, transient

    def _param_columns(self, tied: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per layer (or per tied copy): parameter bytes, and optimizer-state bytes with the
        fp32 main gradients a framework keeps there (:mod:`.memory`)."""
        m = self.model
        P, O = (m.column("tied_params"), m.column("tied_optimizer")) if tied else (m.column("params"),
                                                                                 m.column("optimizer"))
        main = m.options.main_gradient_bytes
        return P, (O + main * P if main else O)

    def static_split(self, c: StageConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``memory_parts``' static bytes ``[k, i]`` as (weights, gradients, optimizer state),
        tied copies included (:func:`.memory.static_split`)."""
        m, opts, t = self.model, self.model.options, c.tensor
        z = self.zero
        d = self.shape.size // t
        own = static_split(*self._param_columns(), t, d, z.memory, z.gradient_bytes)
        out = [Sums(x) for x in own]
        if self.model.ties():
            copy = static_split(*self._param_columns(True), t, d, z.memory, z.gradient_bytes)
            out = [a + self._copy_bytes(b) for a, b in zip(out, copy)]
        return out[0], out[1], out[2]

    def memory(self, config: StageConfig, live: int) -> Ranges | np.ndarray:
        """Peak bytes per device of a stage holding ``live`` micro-batches' activations (inf
        below the diagonal)."""
        static, activation, transient = self.memory_parts(config)
        if np.ndim(live) or static.n <= ranges.DENSE:
            # a square from the parts' squares (as cheap as reading them), or live counts per
            # cell (Alpa's rule)
            out = np.asarray(static) + live * np.asarray(activation) + np.asarray(transient)
            return np.where(_upper(out.shape[0]), out, np.inf)
        return (static + live * activation + transient).with_below(np.inf)

    # -- transfers ------------------------------------------------------------------------
    def transfer(self, t_src: int, src: int, dst: int) -> tuple[float, float]:
        """Affine time (seconds at 0 bytes, per byte) of one tensor from stage ``src`` (tensor
        degree ``t_src``) to stage ``dst``: all replica lanes at once on their real links."""
        if not self.comm or src == dst:
            return 0.0, 0.0
        tab = self.tables[t_src]
        memo = tab.memo
        hit = memo.get(("transfer", src, dst))
        if hit is not None:
            return hit
        lanes = tab.lane_pairs(src, dst)
        topo = self.topology
        # the time depends only on which levels each lane crosses (equal meshes, identical hosts)
        key = ("route", tuple(topo.divergence_level(a, b) for a, b in lanes))
        if key not in memo:
            memo[key] = _affine(lambda x: tab.cost.transfers_time(lanes, x))
        memo["transfer", src, dst] = memo[key]
        return memo[key]

    def transfer_time(self, t_src: int, src: int, dst: int, nbytes: float) -> float:
        a, b = self.transfer(t_src, src, dst)
        return a + b * nbytes

    def transfer_resources(self, t_src: int, src: int, dst: int) -> tuple[str, ...]:
        """The ports a transfer from stage ``src`` to stage ``dst`` holds."""
        tab = self.tables[t_src]
        key = ("ports", src, dst)
        if key not in tab.memo:
            tab.memo[key] = port_names({r for a, b in tab.lane_pairs(src, dst) for r in tab.cost.route(a, b).resources})
        return tab.memo[key]

    def reduction_resources(self, t: int, p: int) -> tuple[str, ...]:
        """The ports stage ``p``'s gradient reduction holds (its data-parallel groups)."""
        tab = self.tables[t]
        key = ("reduction", p)
        if key not in tab.memo:
            res = tab.cost.collective("allreduce", tab.data_groups(p), 1.0).resources if tab.data > 1 else ()
            tab.memo[key] = port_names(res)
        return tab.memo[key]

    def tie_sync(self, plan, a: int, b: int) -> tuple[float, tuple[str, ...]]:
        """(time, ports) of all-reducing the gradient of layer ``b``'s copy of layer ``a``'s
        parameters between the two stages (Megatron's embedding group: device j of one stage
        with device j of the other)."""
        own = plan.owner
        sa, sb = plan.mesh[own[a]], plan.mesh[own[b]]      # the meshes of the two chunks
        return self.tie_between(b, sa, sb, plan.stages[own[b]].tensor)

    def tie_between(self, b: int, sa: int, sb: int, tb: int) -> tuple[float, tuple[str, ...]]:
        """:meth:`tie_sync` of layer ``b``'s copy held on mesh ``sb`` (tensor degree ``tb``),
        its original on mesh ``sa``."""
        nbytes = self.model.layers[b].tied_params / tb if self.comm else 0.0
        # in the mesh shape's tables: every micro-batch count of the shape shares it
        memo = self.tables[tb].memo
        key = ("tie", sa, sb, nbytes, self.comm)
        if key not in memo:
            size = self.shape.size
            groups = [[sa * size + j, sb * size + j] for j in range(size)]
            c = self.tables[tb].cost.collective("allreduce", groups, nbytes)
            memo[key] = (c.time if self.comm else 0.0, port_names(c.resources))
        return memo[key]


_PORT_NAMES: dict = {}


def port_names(resources) -> tuple[str, ...]:
    """Ports as their names, in the ports' order: the simulator only compares them, and a
    string keeps its hash (a :class:`Resource` hashes its three fields on every lookup).  A tuple: the cost tables hand out one per route or
    reduction, and the simulator takes a tuple it has seen as it is (on 100 000 GPUs a
    stage's gradient buckets and transfers hold thousands of ports each)."""
    out = []
    for r in sorted(resources):         # a Resource is a tuple: compared in C
        name = _PORT_NAMES.get(r)
        if name is None:
            name = _PORT_NAMES[r] = str(r)
        out.append(name)
    return tuple(out)


def bucket_split(x, cap: float, bucket_time):
    """``x`` gradient bytes in buckets of at most ``cap`` (DDP's): how many full buckets
    precede the last one, the time of a full one and of the last (element-wise on arrays)."""
    x = np.asarray(x, dtype=float)
    full = np.maximum(np.ceil(x / cap) - 1, 0)
    return full, bucket_time(np.full_like(x, cap)), bucket_time(x - full * cap)
