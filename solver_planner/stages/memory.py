"""Memory the way large models are trained: recomputation, sharded optimizers, sequence parallelism.

Per device of a stage with tensor degree ``t`` and data degree ``d``, for its layers:

* **Static bytes** (Rajbhandari et al. 2020, "ZeRO", §5.1 and Fig. 1: ``(2 + 2 + K) Psi``
  for parameters, gradients and ``K`` bytes of optimizer state per parameter), each first
  split ``t`` ways by tensor parallelism::

      none                 (P + G + O) / t
      zero-1, distributed  (P + G) / t + O / (t d)        (P_os; Megatron's distributed optimizer)
      zero-2               P / t + (G + O) / (t d)        (P_os+g)
      zero-3               (P + G + O) / (t d)            (P_os+g+p), plus one layer's gathered P / t

  with ``G = P`` (gradients in the training dtype), or ``G = gradient_bytes x P`` where the
  framework keeps its gradient buffer in another type: Megatron-Core's DDP allocates it in
  the reduction's type (fp32 for bf16 training by default), and its mixed-precision
  optimizers keep fp32 main gradients as optimizer state when that buffer is 16-bit
  (``main_gradient_bytes``; Megatron-Core's distributed-optimizer guide: ``4 + 16/d`` bytes
  per parameter for 16-bit gradients, ``6 + 12/d`` for bf16 parameters with fp32 ones).
* **Activations kept for backward**, per sample (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models"): ``saved / t + replicated`` (§4.1:
  tensor parallelism leaves ``10 s h`` of a block's ``34 s h + 5 a s^2`` replicated; under
  FlashAttention ``34 s h + 4 a s``, :func:`~.layers.transformer_layers`);
  sequence parallelism splits the replicated part too (§4.2.2); selective recomputation
  keeps ``selective_saved / t + replicated`` and recomputes ``selective_flops`` in backward
  (§5: the attention core); full recomputation keeps only each layer's checkpoint (its
  input, ``s h`` elements; split by ``t`` under sequence parallelism) and re-runs the whole
  forward, its tensor-parallel all-reduces included, before the backward; while a layer's
  backward runs its full activations are live again (one layer at a time).  ``selective-op``
  is torchtitan's per-operator selective checkpointing (``SelectiveAC``): each block keeps
  its input and the outputs of the attention kernel and of every other matrix product, and
  re-runs the rest (:func:`~.layers.transformer_layers`).
* **Communication**: sequence parallelism replaces each all-reduce by a reduce-scatter and
  an all-gather of the same ring volume (§4.2.2), so its time is unchanged; ZeRO-1/2 and
  the distributed optimizer reduce-scatter gradients and all-gather parameters, the volume
  of one all-reduce (ZeRO §7.2.1: ``2 Psi``); ZeRO-3 also all-gathers each layer's
  parameters before its forward and its backward, for every micro-batch (§7.2.2: ``3 Psi``
  per step, here per micro-batch since gradient accumulation re-gathers), and
  reduce-scatters gradients (half an all-reduce).

Across the micro-batches of a step (:func:`zero_run`): ZeRO-2 and ZeRO-3 keep only their
gradient shard, so every micro-batch's gradients are reduce-scattered into it (DeepSpeed, and
FSDP2 without pipelining: ``B`` reduce-scatters a step; our ``run`` does the same); ZeRO-1 and
the distributed optimizer accumulate whole gradients and reduce once.  torch's pipelining
alone turns FSDP2's gradient sync and post-backward resharding off for a stage's backwards
(``PipelineStage.backward_maybe_with_nosync`` turns both off for every backward, and
``perform_reduce_grad`` reduces after the last; torchtitan with pipeline > 1): FSDP2 then
accumulates whole gradients in the reduction's type (``to_accumulated_grad_if_needed``) and
keeps the parameters gathered from a layer's backward to its next forward, which is ZeRO-1's
memory with ``G`` in the reduction's type, one reduce-scatter a step that overlaps no backward,
and ``B + 1`` gathers a step under ZeRO-3 (a backward's after a forward, a forward's after a
forward: priced as one per forward and one more a step).  With more than three model chunks a
rank, torch's runtime also reshards and re-gathers inactive chunks, which the torchtitan target
refuses.  A differential test counts these collectives on gloo processes
(``tests/test_fsdp_modes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.layers import OPTIMIZER_SHARDING, RECOMPUTE

__all__ = ["RECOMPUTE_MODES", "AUTO_MODES", "SHARDINGS", "MemoryOptions", "ZeroRun", "zero_run", "saved_per_sample", "static_split", "stage_memory", "transient_per_sample",
           "recompute_flops", "static_bytes", "gathered_bytes"]

RECOMPUTE_MODES = tuple(m for m in RECOMPUTE if m != "auto")
# "auto": the search picks among these (Megatron-LM's menu); a framework target picks among
# the modes it runs instead (torchtitan: none, selective-op, full; stages.layers.layer_model)
AUTO_MODES = ("none", "selective", "full")
SHARDINGS = OPTIMIZER_SHARDING


@dataclass(frozen=True)
class MemoryOptions:
    """The ``training:`` options that change memory and time; ``recompute`` lists the modes
    a stage may use (``auto`` in the spec: all three, chosen per stage by the search)."""

    recompute: tuple[str, ...] = ("none",)
    sharding: str = "none"
    sequence_parallel: bool = False
    gradient_overlap: bool = True
    gradient_bucket: float = 25 * 2**20
    host_overhead: float = 0.0          # seconds per iteration on the host (the spec's default: TrainingSpec)
    gradient_clipping: bool = False     # the optimizer step reads the gradients once more for their norm
    gradient_accumulation: str = "add"  # each micro-batch's weight gradients added into the buffer, or "fused"
    gradient_reduce_dtype: str | None = None   # the dtype of the data-parallel reduction (None: the training dtype)
    gradient_bytes: float = 1.0         # bytes of a kept gradient per byte of its parameter (module docstring)
    main_gradient_bytes: float = 0.0    # optimizer-state bytes per parameter byte for fp32 main gradients
    # ZeRO-2/3 run by FSDP2 as torch leaves it (torchtitan): pipelines accumulate whole
    # gradients, and ZeRO-2 re-gathers after every backward (zero_run)
    fsdp2_defaults: bool = False
    tensor_overlap: bool = False        # tensor-parallel collectives overlap their products (stages/costs.py)
    gradient_bucket_per_replica: float = 0.0   # a bucket is at least this x the data-parallel replicas
    # only the stage holding the first layer cuts its gradients into buckets; every other stage
    # reduces them as one bucket after its last backward (Megatron-Core's DDP)
    buckets_first_stage_only: bool = False

    def __post_init__(self) -> None:
        bad = [m for m in self.recompute if m not in RECOMPUTE_MODES]
        if bad or not self.recompute:
            raise ValueError(f"recompute modes {self.recompute!r}; expected some of {RECOMPUTE_MODES}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"optimizer sharding {self.sharding!r}; expected one of {SHARDINGS}")

    @classmethod
    def of(cls, training) -> MemoryOptions:
        """From a :class:`~solver_planner.spec.layers.TrainingSpec`."""
        modes = AUTO_MODES if training.recompute == "auto" else (training.recompute,)
        return cls(modes, training.optimizer_sharding, training.sequence_parallel, training.gradient_overlap,
                   training.gradient_bucket, training.host_overhead, training.gradient_clipping,
                   training.gradient_accumulation, training.gradient_reduce_dtype,
                   tensor_overlap=training.tensor_overlap)


@dataclass(frozen=True)
class ZeroRun:
    """How a ZeRO stage runs the micro-batches of one step (module docstring)."""

    memory: str                 # the sharding whose static bytes hold (zero-1 when gradients stay whole)
    gradient_bytes: float       # bytes of a kept gradient per byte of its parameter
    forward_gathers: float      # parameter all-gathers of each layer per micro-batch, in forward
    backward_gathers: float     # and in backward
    reduce_each: bool           # every micro-batch's gradients reduce-scattered (else once a step)
    overlap: bool = True        # the step's reduction may start during the last backward


def zero_run(options: MemoryOptions, stages: int, microbatches: int, reduce_scale: float = 1.0) -> ZeroRun:
    """:class:`ZeroRun` of ``options.sharding`` in a pipeline of ``stages`` with
    ``microbatches`` a step; ``reduce_scale``: bytes of the reduction's type per byte of the
    training type (FSDP2 accumulates whole gradients in it)."""
    sharding, K = options.sharding, microbatches
    # torch's PipelineStage runs every backward of FSDP2 (and of its replicate) without sync
    # or post-backward resharding and reduces in perform_reduce_grad, after the stage's last
    # backward: nothing of the reduction overlaps it
    pipelined = options.fsdp2_defaults and stages > 1
    if sharding not in ("zero-2", "zero-3"):
        return ZeroRun(sharding, options.gradient_bytes, 0.0, 0.0, False, not pipelined)
    if pipelined:
        gathers = (1.0, 1.0 / K) if sharding == "zero-3" else (0.0, 0.0)
        return ZeroRun("zero-1", reduce_scale, *gathers, False, False)
    if sharding == "zero-3":
        return ZeroRun(sharding, options.gradient_bytes, 1.0, 1.0, True)
    # ZeRO-2 keeps its parameters whole through the step (one gather, with the reduction);
    # FSDP2's default reshards them after every backward, so each later forward re-gathers
    again = (K - 1) / K if options.fsdp2_defaults else 0.0
    return ZeroRun(sharding, options.gradient_bytes, again, 0.0, True)


def _column(layers, key: str) -> np.ndarray:
    return np.asarray([getattr(x, key) for x in layers], dtype=float)


def saved_per_sample(layers, mode: str, t: int, sequence_parallel: bool) -> np.ndarray:
    """Bytes per sample each device keeps for backward, per layer."""
    repl = 1.0 / t if sequence_parallel else 1.0
    if mode == "full":
        return np.asarray([(x.activations if x.checkpoint is None else x.checkpoint) for x in layers]) * repl
    if mode == "selective":
        split = np.asarray([x.saved if x.selective_saved is None else x.selective_saved for x in layers])
    elif mode == "selective-op":
        split = np.asarray([x.saved if x.op_saved is None else x.op_saved for x in layers])
        replicated = np.asarray([x.saved_replicated if x.op_saved_replicated is None else x.op_saved_replicated
                                 for x in layers])
        out = split / t + replicated * repl + _column(layers, "op_saved_whole")
        return out + _column(layers, "op_saved_sequence") / t if sequence_parallel else out
    else:
        split = _column(layers, "saved")
    return split / t + _column(layers, "saved_replicated") * repl


def transient_per_sample(layers, mode: str, t: int, sequence_parallel: bool) -> np.ndarray:
    """Bytes per sample live on top of the kept activations while a layer's backward runs:
    under full recomputation, that layer's recomputed activations; under selective-op, what
    the recomputation re-creates of them (all it does not keep: the layer is checkpointed as a
    whole, and its backward reads every activation again)."""
    if mode == "full":
        return saved_per_sample(layers, "none", t, sequence_parallel)
    if mode == "selective-op":
        none = saved_per_sample(layers, "none", t, sequence_parallel)
        return np.maximum(none - saved_per_sample(layers, mode, t, sequence_parallel), 0.0)
    return np.zeros(len(layers))


def recompute_flops(layers, mode: str) -> np.ndarray:
    """Forward FLOPs per sample each layer runs again before its backward."""
    if mode == "full":
        return _column(layers, "forward")
    if mode == "selective":
        return _column(layers, "selective_flops")
    if mode == "selective-op":
        return _column(layers, "op_flops")
    return np.zeros(len(layers))


def static_bytes(params: np.ndarray, optimizer: np.ndarray, t: int, d: int, sharding: str,
                 grad: float = 1.0) -> np.ndarray:
    """Parameters + gradients + optimizer state per device (ZeRO §5.1; see the module
    docstring), gradients ``grad`` bytes per byte of parameter."""
    G = params if grad == 1.0 else grad * params
    if sharding in ("zero-1", "distributed"):
        return (params + G) / t + optimizer / (t * d)
    if sharding == "zero-2":
        return params / t + (G + optimizer) / (t * d)
    if sharding == "zero-3":
        return (params + G + optimizer) / (t * d)
    return (params + G + optimizer) / t


def static_split(params: np.ndarray, optimizer: np.ndarray, t: int, d: int, sharding: str, grad: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`static_bytes` as (weights, gradients, optimizer state) per device: what ZeRO
    shards at each stage (§5.1: P_os, P_os+g, P_os+g+p); the three add up to it."""
    P, O = np.asarray(params, dtype=float), np.asarray(optimizer, dtype=float)
    G = grad * P
    if sharding in ("zero-1", "distributed"):
        return P / t, G / t, O / (t * d)
    if sharding == "zero-2":
        return P / t, G / (t * d), O / (t * d)
    if sharding == "zero-3":
        return P / (t * d), G / (t * d), O / (t * d)
    return P / t, G / t, O / t


def least_static_per_device(model, devices: int) -> float:
    """A floor on the fullest device of any plan of ``model`` (a :class:`.layers.LayerModel`)
    on ``devices`` devices: its weights and optimizer state (fp32 main gradients included),
    each byte held once somewhere, spread evenly.  Gradients, activations and tied copies
    only add to it."""
    P = model.column("params")
    O = model.column("optimizer") + model.options.main_gradient_bytes * P
    return float(P.sum() + O.sum()) / devices


def stage_memory(partition, peak_memory) -> list[dict[str, float]]:
    """Each pipeline stage's peak bytes per device (``peak_memory``, the simulated pipeline's)
    split into ``weights``, ``gradients``, ``optimizer`` (the layers and tied copies of its
    model chunks, as ZeRO shards them) and ``activations`` (the rest: the micro-batches in
    flight and one layer's transient recomputation or gathered parameters)."""
    costs = partition.costs
    out = [{"weights": 0.0, "gradients": 0.0, "optimizer": 0.0} for _ in range(costs.stages)]
    for st, m in zip(partition.stages, partition.mesh):
        w, g, o = costs.of(m).static_split(st.config)
        for key, x in (("weights", w), ("gradients", g), ("optimizer", o)):
            out[m][key] += float(x[st.first, st.last])
    for m, parts in enumerate(out):
        parts["activations"] = max(0.0, float(peak_memory[m]) - sum(parts.values()))
    return out


def optimizer_traffic(params: np.ndarray, optimizer: np.ndarray, t: int, d: int, sharding: str,
                      clipping: bool = False, grad: float = 1.0) -> np.ndarray:
    """Bytes per device the optimizer step moves through memory: it reads and writes the
    parameters and optimizer state it updates and reads their gradients, ``2 (P + O) + G``
    with ``G = P`` (:mod:`solver_planner.compute`); gradient clipping (Megatron-LM clips at
    norm 1 by default) first reads the gradients for their norm, ``+ G``; with a sharded
    optimizer each replica updates its 1/d.  ``G = grad x P`` (module docstring)."""
    share = t * d if sharding != "none" else t
    return ((2 + (2 if clipping else 1) * grad) * params + 2 * optimizer) / share


def gathered_bytes(params: np.ndarray, t: int, d: int, sharding: str) -> np.ndarray:
    """Per layer, bytes ZeRO-3 gathers for the layer's forward or backward (0 otherwise)."""
    if sharding != "zero-3" or d == 1:
        return np.zeros_like(params)
    return params / t


# What a device needs beside a plan's tensors, which this module does not count: the CUDA
# context (287 MB with lazy module loading, 667 MB without, as PyTorch measured when it made
# lazy loading its default: pytorch/pytorch#86509), cuBLAS workspaces, NCCL's per-channel
# buffers (NCCL_BUFFSIZE, 4 MiB each) and the caching allocator's fragmentation.  A plan that
# leaves less than this free is warned about unless the spec sets `device.memory_reserved`
# (then plans leave that much free, and the user has said how much the rest takes).
HEADROOM = 2**30


def memory_warnings(device, peak_memory) -> list[str]:
    """What a user should know before running a plan whose stages peak at ``peak_memory``
    bytes a device: a warning when the largest leaves less than :data:`HEADROOM` of the
    device's memory free and the spec reserves none (``device``: a
    :class:`~solver_planner.topology.Device`)."""
    peak = max(peak_memory)
    free = device.memory - peak
    if free >= HEADROOM or device.reserved > 0:
        return []
    return [f"the plan's peak, {peak / 2**30:.2f} GiB a device, leaves {free / 2**30:.2f} GiB of its"
            f" {device.memory / 2**30:.2f} GiB for what the memory model does not count (the CUDA context, about"
            " 0.3 GiB, NCCL's buffers, the allocator's fragmentation); a real run may not fit. Set"
            " device.memory_reserved in the cluster spec to plan with room"]
