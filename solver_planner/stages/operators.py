"""Per-operator costs: a transformer layer as the kernels it really runs.

A :class:`~solver_planner.stages.layers.Layer` may list its :class:`Operator` s; the stage
costs (:mod:`.costs`) then time each pass of the layer as the sum of its operators' times
at their real sizes (the micro-batch per replica ``b``, the tensor degree ``t``, sequence
parallelism) instead of one pass of the layer's FLOPs.  Per operator and micro-batch, per
device (:mod:`solver_planner.compute` gives the three kinds of kernel time)::

    FLOPs  F = b * flops / t
    bytes  M = weights / t + b * (split / t + whole + replicated * (1 / t if sequence parallel else 1))

* ``gemm``: a matrix multiply, ``k o + max((F + x_half) / (peak e_max), M / bw)`` (the
  efficiency of a kernel of ``F`` FLOPs, or its memory traffic).  Backward runs two products
  of the same FLOPs and bytes: the input gradient (reads the weights and the output
  gradient) and the weight gradient (reads the input and the output gradient, writes the
  weight gradient), Narayanan et al. 2021 §5.1; a product of two activations (attention
  scores and context when attention is not fused) has no weight gradient: both of its
  backward products go to the input-gradient part.
* ``attention``: fused (flash) attention, ``F`` at ``attention_efficiency`` or ``M``,
  whichever is longer.  Its backward recomputes the scores from the saved statistics: 2.5x
  the forward's FLOPs (five products for two; Dao 2023, FlashAttention-2 §3.1) and twice its
  bytes (reads q, k, v, o and the output gradient, writes three gradients).
* ``memory``: a memory-bound pass (norms, softmax, dropout, residual adds, activation
  functions, the cross-entropy), ``M / (bw e_mem)``; its backward reads the input and the
  output gradient and writes the input gradient: 1.5x the forward's bytes (``backward``
  when the operator says otherwise).

Every operator is one kernel launch per pass.  Recomputation re-runs the forward of exactly
the operators it recomputes before the backward: all of them under ``full``, those of the
attention core (``core``) under ``selective`` (Korthikanti et al. 2022 §5), and under
``selective-op`` (torchtitan's ``SelectiveAC``) the share ``rerun`` of each operator's
forward that it does not keep: the element-wise passes, and every second matrix product of
a block counted in forward order (a fused operator holding two products, one kept and one
re-run, has ``rerun`` of one half).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Operator", "OPERATOR_KINDS", "operator_times", "layer_pass_times", "overlapped_collectives"]

OPERATOR_KINDS = ("gemm", "attention", "memory")
FLASH_BACKWARD_FLOPS = 2.5      # FlashAttention-2 §3.1: backward 5 products, forward 2
FLASH_BACKWARD_BYTES = 2.0
MEMORY_BACKWARD_BYTES = 1.5     # reads input and output gradient, writes the input gradient


@dataclass(frozen=True)
class Operator:
    """One kernel of a layer's forward pass (see the module docstring for the units)."""

    name: str
    kind: str                     # 'gemm', 'attention' or 'memory'
    flops: float = 0.0            # FLOPs per sample the kernel runs, split over the tensor degree
    weights: float = 0.0          # weight bytes it reads per micro-batch, split over the tensor degree
    split: float = 0.0            # activation bytes per sample it reads and writes, split over t
    replicated: float = 0.0       # ... on every tensor-parallel device, split under sequence parallelism
    whole: float = 0.0            # ... on every tensor-parallel device always (a GEMM's gathered input)
    core: bool = False            # in the attention core: selective recomputation re-runs it
    rerun: float = 0.0            # share of its forward selective-op re-runs (module docstring)
    backward: float = MEMORY_BACKWARD_BYTES   # memory: backward bytes over forward bytes

    def __post_init__(self) -> None:
        if self.kind not in OPERATOR_KINDS:
            raise ValueError(f"operator kind {self.kind!r}; expected one of {OPERATOR_KINDS}")

    def per_device(self, samples: float, t: int, sequence_parallel: bool) -> tuple[float, float]:
        """(FLOPs, bytes) of its forward on one device for ``samples`` samples per replica."""
        repl = self.replicated / t if sequence_parallel else self.replicated
        return samples * self.flops / t, self.weights / t + samples * (self.split / t + self.whole + repl)


def operator_times(ops, comp, samples: float, t: int, sequence_parallel: bool = False) -> dict[str, np.ndarray]:
    """Per operator, seconds per micro-batch of its forward (``F``), its input-gradient part
    (``BA``, recomputation excluded) and its weight-gradient part (``BW``)."""
    fwd, act, weight = [], [], []
    for op in ops:
        f, m = op.per_device(samples, t, sequence_parallel)
        if op.kind == "gemm":
            one = float(comp.time(f, m, 1.0))
            fwd.append(one)
            if op.weights > 0:
                act.append(one)
                weight.append(one)
            else:                                  # two products of activations, no weights
                act.append(float(comp.time(2 * f, 2 * m, 2.0)))
                weight.append(0.0)
        elif op.kind == "attention":
            fwd.append(float(comp.attention_time(f, m, 1.0)))
            act.append(float(comp.attention_time(FLASH_BACKWARD_FLOPS * f, FLASH_BACKWARD_BYTES * m, 1.0)))
            weight.append(0.0)
        else:
            fwd.append(float(comp.memory_time(m, 1.0)))
            act.append(float(comp.memory_time(op.backward * m, 1.0)))
            weight.append(0.0)
    return {"F": np.asarray(fwd), "BA": np.asarray(act), "BW": np.asarray(weight)}


def overlapped_collectives(ops, comp, samples: float, t: int, each: float, count: int) -> tuple[float, float, float]:
    """Seconds a layer's tensor-parallel collectives stay exposed per micro-batch when each
    runs beside a matrix product (``training.tensor_overlap``): (forward all-gathers, forward
    reduce-scatters, backward), for ``count`` collectives of ``each`` seconds per pass.

    Under sequence parallelism a block's forward all-gathers before its column-parallel
    products and reduce-scatters after its row-parallel ones (Korthikanti et al. 2022
    §4.2.2), so the ``j``-th collective meets the ``j``-th product with weights in forward
    order (QKV, projection, MLP in, MLP out); in backward the same collective meets that
    product's input- and weight-gradient products.  Megatron-LM's ``--tp-comm-overlap``
    (Transformer Engine) cuts each pair into ``t`` chunks, the collective's chunk ``i + 1``
    moving while the product runs on chunk ``i``: a two-stage pipeline of ``t`` equal chunks,
    ``max(c, g) + min(c, g) / t``, of which ``max(0, c - g) + min(c, g) / t`` is past the
    product.  A collective without a product to meet (the embedding's) stays whole."""
    times = operator_times(ops, comp, samples, t, True)
    prods = [i for i, op in enumerate(ops) if op.kind == "gemm" and op.weights > 0]
    out = [0.0, 0.0, 0.0]
    for j in range(count):
        if j < len(prods):
            k = prods[j]
            fwd, bwd = float(times["F"][k]), float(times["BA"][k] + times["BW"][k])
        else:
            fwd = bwd = 0.0
        out[j % 2] += max(0.0, each - fwd) + min(each, fwd) / t
        out[2] += max(0.0, each - bwd) + min(each, bwd) / t
    return out[0], out[1], out[2]


def _recomputed(ops, mode: str) -> np.ndarray:
    """How much of each operator's forward ``mode`` runs again before the backward."""
    if mode == "full":
        return np.ones(len(ops))
    if mode == "selective":
        return np.asarray([float(op.core) for op in ops])
    if mode == "selective-op":
        return np.asarray([op.rerun for op in ops], dtype=float)
    return np.zeros(len(ops))


def layer_pass_times(model, comp, t: int, samples: float, recompute: str,
                     sequence_parallel: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer of ``model`` (a :class:`~.layers.LayerModel`), seconds of compute per
    micro-batch of ``samples`` samples per replica at tensor degree ``t``: forward,
    activation gradients with the recomputed forward, weight gradients.

    Layers with operators are priced operator by operator (module docstring); the others
    as one pass of their FLOPs (:mod:`solver_planner.compute`): ``kernels`` kernels moving
    the weights and the activations in and out, ``W / t + b a (1 + 1 / t)``; the recomputed
    forward runs its share of the forward's kernels and traffic again.  Under the peak
    model every layer is its FLOPs at the peak rate.
    """
    from .memory import recompute_flops

    per_device = samples / t                                  # FLOPs per sample -> per device
    fwd_f = model.column("forward") * per_device
    weight_f = model.column("weight_flops") * per_device
    again = recompute_flops(model.layers, recompute)
    act_f = (model.column("backward") - model.column("weight_flops") + again) * per_device
    if comp.is_peak:
        return comp.time(fwd_f), comp.time(act_f), comp.time(weight_f)
    k = model.column("kernels")
    forward = model.column("forward")
    moved = np.where(forward > 0, model.column("params") / t, 0.0) + samples * model.column("activations") * (1 + 1 / t)
    share = np.divide(again, forward, out=np.zeros_like(again), where=forward > 0)
    k_again = np.ceil(k * share)
    out_f = np.asarray(comp.time(fwd_f, moved, k), dtype=float)
    out_a = np.asarray(comp.time(act_f, moved * (1 + share), k + k_again), dtype=float)
    out_w = np.asarray(comp.time(weight_f, moved, k), dtype=float)
    priced: dict[int, tuple[float, float, float]] = {}
    for i, layer in enumerate(model.layers):
        if not layer.ops:
            continue
        key = id(layer)                  # repeated blocks are one object: price it once
        if key not in priced:
            times = operator_times(layer.ops, comp, samples, t, sequence_parallel)
            again = _recomputed(layer.ops, recompute)
            whole = np.isin(again, (0.0, 1.0)).all()      # the same sum as ever for whole operators
            rerun = float(times["F"][again == 1.0].sum() if whole else (times["F"] * again).sum())
            priced[key] = (float(times["F"].sum()), float(times["BA"].sum()) + rerun, float(times["BW"].sum()))
        out_f[i], out_a[i], out_w[i] = priced[key]
    return out_f, out_a, out_w
