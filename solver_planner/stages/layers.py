"""The layer model: per-layer work and memory, per sample, in execution order.

Defaults, each a standard rule of thumb:

* backward FLOPs = 2 x forward (one product for the input gradient, one for the weight
  gradient; Kaplan et al. 2020 §2.1, Narayanan et al. 2021 §5.1);
* gradients take as many bytes as the parameters;
* optimizer state per parameter: Adam keeps two fp32 moments and, when training in 16
  bits, an fp32 master copy (the resharding paper Table 1: 216M parameters, 432M optimizer-state
  parameters, 2.95 GB of weights and optimizer = 2 + 4 + 8 bytes per parameter); plain
  SGD keeps only the master copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InfeasibleError, PlannerError
from ..spec.counts import transformer_counts
from ..spec.layers import FLOAT_DTYPES, LayerSpec, TrainingSpec, TransformerSpec
from ..spec.model import SELECTIVE_OP_NEEDS, ModelSpec, tensor_overlap_refusal
from .memory import RECOMPUTE_MODES, MemoryOptions, recompute_flops, saved_per_sample
from .operators import Operator

__all__ = ["Layer", "LayerModel", "transformer_layers", "transformer_operators", "layer_model",
           "optimizer_bytes_per_param"]


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> float:
    """Optimizer-state bytes per parameter (see the module docstring)."""
    master = 4.0 if FLOAT_DTYPES[dtype] < 4 else 0.0
    moments = 8.0 if optimizer == "adam" else 0.0
    return master + moments


@dataclass(frozen=True)
class Layer:
    """One layer, quantities per sample; ``skips`` are indices of later layers reading its output.

    ``weight`` is the part of ``backward`` that computes weight gradients (default half of
    it: one of backward's two products per matrix multiply); ``checkpoint`` the bytes kept
    under full recomputation (default: the output); ``selective_saved`` / ``selective_flops``
    what selective recomputation keeps (split by the tensor degree) and recomputes;
    ``op_saved`` / ``op_saved_replicated`` / ``op_flops`` the same under ``selective-op``
    (torchtitan's per-operator checkpointing; default: what no recomputation keeps), with
    ``op_saved_whole`` kept whole on every tensor device and ``op_saved_sequence`` kept only
    under sequence parallelism, split over the tensor degree;
    ``tied_to`` an earlier layer whose ``tied_params`` / ``tied_optimizer`` bytes this one
    shares (a copy when the two sit on different stages); ``kernels`` the matrix-multiply
    kernels of its forward pass (each backward part runs as many).
    """

    name: str
    forward: float
    backward: float
    params: float
    optimizer: float
    activations: float
    saved: float
    saved_replicated: float = 0.0
    allreduces: int = 2
    skips: tuple[int, ...] = ()
    weight: float | None = None
    checkpoint: float | None = None
    selective_saved: float | None = None
    selective_flops: float = 0.0
    op_saved: float | None = None
    op_saved_replicated: float | None = None
    op_saved_whole: float = 0.0
    op_saved_sequence: float = 0.0
    op_flops: float = 0.0
    tied_to: int | None = None
    tied_params: float = 0.0
    tied_optimizer: float = 0.0
    kernels: float = 1.0            # matrix-multiply kernels of the forward pass (solver_planner.compute)
    ops: tuple = ()                 # its operators (.operators.Operator): priced one by one when given

    @property
    def weight_flops(self) -> float:
        return self.backward / 2 if self.weight is None else self.weight


# Bytes a fp32 cross-entropy over the logits moves per element: the cast to fp32 (read e,
# write 4), the max, the exponentials, the sum and the normalisation (4 + 8 + 4 + 8), as
# Megatron-LM's vocab-parallel cross-entropy runs it; backward writes softmax minus the
# one-hot and casts it back (4 + 4 + 4 + e).
_CE_FORWARD = 28.0
_CE_BACKWARD = 12.0


def transformer_operators(spec: TransformerSpec, dtype: str = "bfloat16", attention: str = "flash"
                          ) -> dict[str, tuple[Operator, ...]]:
    """The kernels of the embedding, a block and the logits layer, per sample (Megatron-LM's
    layout, Shoeybi et al. 2019 §3: column-parallel QKV and first MLP matrix, row-parallel
    projection and second MLP matrix; norms, dropout and residual adds on every tensor device).

    With ``s`` tokens, hidden ``h``, ``a`` heads of ``d = h / a``, ``g`` key/value heads, MLP
    width ``f`` (``f_in = 2 f`` for SwiGLU's fused gate and up), vocabulary ``V``, ``e`` bytes
    per element:

    * GEMMs: QKV ``2 s h (h + 2 g d)`` FLOPs, projection ``2 s h^2``, MLP ``2 s h f_in`` and
      ``2 s f h``, each reading its weights, its input (whole on every tensor device) and
      writing its output (split), or the reverse for the row-parallel ones; the logits
      ``2 s h V``.  Their FLOPs add up to :func:`~solver_planner.spec.counts.transformer_counts`'
      ``2 s`` x the block's weights.
    * attention: ``flash``: one fused kernel of ``2 s^2 h`` FLOPs (causal: half of the
      ``4 s^2 h`` of scores and context run) reading q, k, v and writing the output;
      ``materialized``: the scores product (``2 s^2 h``, writes ``a s^2`` scores), the fused
      scale-mask-softmax (reads and writes them), dropout (reads them, writes them and a
      one-byte mask) and the context product (``2 s^2 h``, reads them and v): the ``4 s^2 h``
      of Narayanan et al. 2021 §5.1.  Either is the attention core selective recomputation
      re-runs.
    * memory-bound passes: two norms (read and write ``s h``), two fused bias-dropout-adds
      (read the output and the residual, write the sum and a one-byte mask), the activation
      (GELU reads and writes ``s f``; SwiGLU reads ``2 s f``, writes ``s f``), rotary
      positions (read and write q and k); the embedding lookup (read and write ``s h``), the
      position table's add and dropout; the final norm and the fp32 cross-entropy over ``s V``
      logits (``_CE_FORWARD`` bytes per element forward, ``_CE_BACKWARD`` backward).  Left
      out: the embedding table's dense gradient and the biases (fused into their neighbours).
    """
    s, h, a, f, v = spec.sequence, spec.hidden, spec.heads, spec.ffn, spec.vocab
    e = float(FLOAT_DTYPES[dtype])
    kv_width = spec.kv * h // a
    qkv_out = h + 2 * kv_width
    f_in = 2 * f if spec.activation == "swiglu" else f
    sh = float(s * h)
    rerun = _op_reruns(spec)
    norm = Operator("norm", "memory", replicated=2 * sh * e, rerun=1.0)
    bda = Operator("bias-dropout-add", "memory", replicated=3 * sh * e + sh, rerun=1.0)
    block = [norm, Operator("qkv", "gemm", flops=2.0 * s * h * qkv_out, weights=float(h * qkv_out) * e,
                            whole=sh * e, split=float(s * qkv_out) * e, rerun=rerun["qkv"])]
    if spec.position == "rotary":
        block.append(Operator("rotary", "memory", split=2.0 * s * (h + kv_width) * e, rerun=1.0))
    if attention == "flash":
        block.append(Operator("flash-attention", "attention", flops=2.0 * s * s * h,
                              split=float(s * (qkv_out + h)) * e, core=True))
    else:
        # the two batched products are compute-intensive operators selective-op keeps (not
        # matrix products with weights, so not counted in its every-second rule)
        scores = float(a) * s * s
        block += [Operator("scores", "gemm", flops=2.0 * s * s * h, split=float(s * (h + kv_width)) * e + scores * e,
                           core=True),
                  Operator("softmax", "memory", split=2 * scores * e, core=True, rerun=1.0),
                  Operator("attention-dropout", "memory", split=scores * (2 * e + 1), core=True, rerun=1.0),
                  Operator("context", "gemm", flops=2.0 * s * s * h, split=scores * e + float(s * (kv_width + h)) * e,
                           core=True)]
    act = 3.0 if spec.activation == "swiglu" else 2.0
    block += [Operator("projection", "gemm", flops=2.0 * s * h * h, weights=float(h * h) * e, split=sh * e,
                       whole=sh * e, rerun=rerun["projection"]),
              bda, norm,
              Operator("mlp-in", "gemm", flops=2.0 * s * h * f_in, weights=float(h * f_in) * e, whole=sh * e,
                       split=float(s * f_in) * e, rerun=rerun["mlp-in"]),
              Operator(spec.activation, "memory", split=act * s * f * e, rerun=1.0),
              Operator("mlp-out", "gemm", flops=2.0 * s * f * h, weights=float(f * h) * e, split=float(s * f) * e,
                       whole=sh * e, rerun=rerun["mlp-out"]),
              bda]
    embed = [Operator("embedding", "memory", whole=2 * sh * e)]
    if spec.position_rows:
        embed.append(Operator("positions-dropout", "memory", whole=3 * sh * e + sh))
    logits = (norm,
              Operator("logits", "gemm", flops=2.0 * s * h * v, weights=float(v * h) * e, whole=sh * e,
                       split=float(s * v) * e),
              Operator("cross-entropy", "memory", split=float(s * v) * (e + _CE_FORWARD),
                       backward=(_CE_BACKWARD + e) / (_CE_FORWARD + e)))
    return {"embed": tuple(embed), "block": tuple(block), "logits": logits}


def _op_products(spec: TransformerSpec) -> list[tuple[str, list[int], bool]]:
    """A block's matrix products with weights in forward order, as torchtitan's Llama runs
    them: per operator of :func:`transformer_operators`, the output width of each product it
    holds and whether it has a bias (QKV as one product when ``fused_qkv``, as torchtitan 0.3.0
    does, else the query, key and value ones; the output projection; SwiGLU's ``w1`` and
    ``w3``; ``w2``).  Products in one operator read the same input, so their FLOPs are in
    proportion to these widths."""
    kv_width = spec.kv * spec.hidden // spec.heads
    qkv = [spec.hidden + 2 * kv_width] if spec.fused_qkv else [spec.hidden, kv_width, kv_width]
    mlp_in = [spec.ffn, spec.ffn] if spec.activation == "swiglu" else [spec.ffn]
    biased = spec.bias is True
    return [("qkv", qkv, biased or spec.bias == "qkv"), ("projection", [spec.hidden], biased),
            ("mlp-in", mlp_in, biased), ("mlp-out", [spec.hidden], biased)]


def _op_rule(spec: TransformerSpec):
    """Each product of :func:`_op_products` as (operator, output width, re-run), by
    torchtitan's ``SelectiveAC`` rule: it counts a block's ``mm`` (and ``linear``) calls in
    forward order and re-runs every second one (``meta[mm_count_key] % 2 == 0``), keeping the
    others; a product with a bias runs as ``addmm``, which its save list keeps and which is
    not counted."""
    n = 0
    for name, widths, bias in _op_products(spec):
        for width in widths:
            if bias:
                yield name, width, False
                continue
            n += 1
            yield name, width, n % 2 == 0


def _op_reruns(spec: TransformerSpec) -> dict[str, float]:
    """Per matrix-product operator, the share of its forward selective-op re-runs
    (:func:`_op_rule`)."""
    again: dict[str, float] = {}
    total: dict[str, float] = {}
    for name, width, rerun in _op_rule(spec):
        total[name] = total.get(name, 0.0) + width
        again[name] = again.get(name, 0.0) + (width if rerun else 0.0)
    return {name: again[name] / total[name] for name in total}


def _op_keeps(spec: TransformerSpec, e: float, attention: str) -> tuple[float, float, float, float, float]:
    """Bytes per sample a block keeps under selective-op and the FLOPs it re-runs: (split over
    the tensor degree; replicated, split only under sequence parallelism; whole on every tensor
    device; kept only under sequence parallelism, split over the tensor degree; FLOPs).

    ``SelectiveAC`` keeps the block's input (the checkpoint), the attention kernel's outputs
    (FlashAttention: the output and the fp32 log-sum-exp of each row; materialized: the
    scores and the context, its two batched products), the outputs of the products it does
    not re-run (:func:`_op_rule`) and of the reduce-scatters (its save list), and re-runs the
    rest, the element-wise passes included.  A row-parallel product's output is the partial
    sum over the whole sequence on every tensor device (whole); under sequence parallelism
    its reduce-scatter's output, a ``1/t`` share of the sequence, is kept too."""
    s, h, a = spec.sequence, spec.hidden, spec.heads
    inputs = {"qkv": h, "projection": h, "mlp-in": h, "mlp-out": spec.ffn}
    row_parallel = {"projection", "mlp-out"}
    split = (s * h * e + 4.0 * a * s) if attention == "flash" else (float(a) * s * s + s * h) * e
    replicated = float(s * h * e)                              # the block's input
    whole = 0.0
    sequence = len(row_parallel) * float(s * h * e)           # the reduce-scatters' outputs
    again = 0.0
    for name, width, rerun in _op_rule(spec):
        if rerun:
            again += 2.0 * s * inputs[name] * width
        elif name in row_parallel:
            whole += float(s * width) * e
        else:
            split += float(s * width) * e
    return split, replicated, whole, sequence, again


def transformer_layers(spec: TransformerSpec, dtype: str = "bfloat16", optimizer: str = "adam",
                       tied: bool = True, attention: str = "flash") -> list[Layer]:
    """Embedding, ``spec.layers`` decoder blocks and the logits layer of a GPT-style model.

    Per sample of ``s`` tokens, hidden size ``h``, ``a`` heads, vocabulary ``V``, ``e``
    bytes per element:

    * block parameters ``12 h^2 + 13 h`` and forward FLOPs ``24 s h^2 + 4 s^2 h``
      (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
      Clusters", §5.1: 72 B s l h^2 (1 + s/6h) FLOPs per iteration for l layers, of which a
      third is the forward pass); the weight gradients are ``24 s h^2`` of the backward
      (one product per weight matrix; the attention-score products have no weights).
      Grouped-query attention, a SwiGLU MLP, rotary positions, RMSNorm and biases change
      these as :mod:`solver_planner.spec.counts` says (``2 s`` x the block's weights + ``4 s^2
      h``), which reproduces the GPT figures for the default shape;
    * activations kept for backward ``s h (34 + 5 a s / h)`` bytes at 16 bits with
      ``attention="materialized"``, of which ``10 s h`` stay on every tensor-parallel device
      and the rest is split (Korthikanti et al. 2022, "Reducing Activation Recomputation in
      Large Transformer Models", §4.1); with ``attention="flash"`` the ``5 a s^2`` of scores
      are not kept, only each row's fp32 log-sum-exp, ``34 s h + 4 a s`` (Dao et al. 2022);
      selective recomputation keeps ``34 s h`` and recomputes the attention core, ``4 s^2 h``
      FLOPs (§5); full recomputation keeps the layer input, ``s h`` elements (§5).  Of the
      split ``24 s h``, ``8 s h`` are the attention's query, key, value and projection
      inputs and ``16 s h`` the GELU's input and output at width ``4 h``; for other shapes
      (an approximation that follows Korthikanti's accounting term by term) the key and
      value terms scale by ``kv_heads / heads`` (``2 s h (2 + 2 g / a)``), the GELU's by
      ``f / 4 h`` (``4 s f``), and a SwiGLU MLP keeps its gate and up outputs and their
      product (``6 s f``).  Dropout masks are kept for every shape, as Korthikanti count
      them (models trained without dropout keep less: the estimate errs on the high side);
    * the embedding holds ``V h + s h`` parameters (token and position tables; no position
      table with rotary positions, ``positions`` rows when given); the
      logits layer costs ``2 s h V`` FLOPs and, when ``tied`` (GPT-3), shares the token
      table: a logits layer on another stage keeps a copy (Narayanan et al. 2021 §2.1,
      Megatron's embedding group), else it has a ``V h`` table of its own; the final norm
      (``h`` or ``2 h`` parameters) is left out;
    * a block runs six matrix-multiply kernels per pass (QKV, scores, context, projection and
      the two MLP products; Megatron fuses the query, key and value projections into one,
      and SwiGLU's gate and up matrices into one), the logits layer one;
    * each layer lists its operators (:func:`transformer_operators`), which the compute
      model prices one by one (:mod:`.operators`); ``attention`` says how attention runs.
    """
    s, h, a, v = spec.sequence, spec.hidden, spec.heads, spec.vocab
    e = FLOAT_DTYPES[dtype]
    opt = optimizer_bytes_per_param(optimizer, dtype)
    scale = e / 2.0                      # Korthikanti's byte counts assume 16-bit activations
    out = float(s * h * e)
    counts = transformer_counts(spec, tied)
    block_params = float(counts.block)   # 12 h^2 + 13 h for GPT
    block_fwd = counts.block_flops       # 24 s h^2 + 4 s^2 h for GPT
    weight = 2.0 * s * counts.block_weights
    # The split activations: 8 s h attention + 16 s h MLP for GPT (see the docstring).
    kv_ratio = spec.kv / a
    attention_saved = 2.0 * s * h * (2.0 + 2.0 * kv_ratio)
    mlp_saved = (6.0 if spec.activation == "swiglu" else 4.0) * s * spec.ffn
    split = attention_saved + mlp_saved
    embed = float(counts.embedding)      # V h + s h for GPT
    ops = transformer_operators(spec, dtype, attention)
    layers = [Layer("embed", 0.0, 0.0, embed * e, embed * opt, out, out, 0.0, 1, kernels=0.0, ops=ops["embed"])]
    # the attention core's own keep: materialized, Korthikanti's 5 a s^2 (the softmax output,
    # its dropout mask and output); flash keeps no scores, only each row's softmax statistic
    # (the log-sum-exp, fp32: 4 a s bytes; Dao et al. 2022, FlashAttention §3.1, backward from
    # the output and these statistics)
    core = 4.0 * a * s if attention == "flash" else 5.0 * a * s * s * scale
    op_split, op_replicated, op_whole, op_sequence, op_flops = _op_keeps(spec, e, attention)
    block = Layer("block", block_fwd, 2 * block_fwd, block_params * e, block_params * opt, out,
                  split * scale + core, 10.0 * s * h * scale, 2,
                  weight=weight, checkpoint=out, selective_saved=split * scale,
                  selective_flops=4.0 * s * s * h, op_saved=op_split, op_saved_replicated=op_replicated,
                  op_saved_whole=op_whole, op_saved_sequence=op_sequence,
                  op_flops=op_flops, kernels=6.0, ops=ops["block"])
    layers += [block] * spec.layers
    logits = counts.logits_flops
    table = float(v * h)
    if tied:
        layers.append(Layer("logits", logits, 2 * logits, 0.0, 0.0, 0.0, float(s * v * e), 0.0, 1,
                            checkpoint=out, tied_to=0, tied_params=table * e, tied_optimizer=table * opt,
                            ops=ops["logits"]))
    else:
        layers.append(Layer("logits", logits, 2 * logits, table * e, table * opt, 0.0, float(s * v * e), 0.0, 1,
                            checkpoint=out, ops=ops["logits"]))
    return layers


def _from_specs(specs: list[LayerSpec], training: TrainingSpec) -> list[Layer]:
    opt = optimizer_bytes_per_param(training.optimizer, training.dtype) / FLOAT_DTYPES[training.dtype]
    index: dict[str, int] = {}
    n = 0
    for spec in specs:
        index.setdefault(spec.name, n)
        n += spec.repeat
    layers: list[Layer] = []
    by_name: dict[str, Layer] = {}
    for spec in specs:
        layer = Layer(
            name=spec.name,
            forward=spec.flops,
            backward=spec.backward,
            params=spec.params,
            optimizer=spec.params * opt if spec.optimizer_state is None else spec.optimizer_state,
            activations=spec.activations,
            saved=spec.activations if spec.saved is None else spec.saved,
            saved_replicated=spec.saved_replicated,
            allreduces=spec.allreduces,
            skips=tuple(index[t] for t in spec.skip_to),
            weight=spec.weight_flops,
            checkpoint=spec.checkpoint,
            selective_saved=spec.selective_saved,
            selective_flops=spec.selective_flops,
            kernels=float(spec.kernels if spec.kernels is not None else (1 if spec.flops > 0 else 0)),
        )
        if spec.tied_to is not None:
            src = by_name[spec.tied_to]
            layer = replace(layer, tied_to=index[spec.tied_to], tied_params=src.params, tied_optimizer=src.optimizer)
        by_name.setdefault(spec.name, layer)
        layers += [layer] * spec.repeat
    return layers


@dataclass
class LayerModel:
    """The layers of a model with the training options; range sums make a stage's totals O(1)."""

    name: str
    layers: list[Layer]
    global_batch: int
    microbatches: int | None          # None: search
    dtype: str = "bfloat16"
    options: MemoryOptions = field(default_factory=MemoryOptions)
    # what a tensor degree must divide, as (name, count): a transformer's heads, key/value
    # heads and MLP width, which tensor parallelism splits (Megatron-LM §3); none for layers
    # given one by one
    tensor_splits: tuple[tuple[str, int], ...] = ()
    _cache: dict = field(init=False, repr=False, default_factory=dict)

    def tensor_refusal(self, t: int) -> str | None:
        """Why tensor degree ``t`` cannot split this model's layers (None: it can)."""
        for name, n in self.tensor_splits:
            if n % t:
                return f"{name} {n} not divisible by tensor {t}"
        return None

    def __post_init__(self) -> None:
        if not self.layers:
            raise PlannerError(f"model '{self.name}' has no layers")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def column(self, key: str) -> np.ndarray:
        """Per-layer values of a :class:`Layer` attribute (``weight_flops`` included)."""
        ck = ("column", key)
        if ck not in self._cache:
            self._cache[ck] = np.asarray([getattr(x, key) for x in self.layers], dtype=float)
        return self._cache[ck]

    def edges(self) -> list[tuple[int, int, float]]:
        """Every tensor that leaves a layer for a later one: (producer, consumer, bytes per sample)."""
        out = [(i, i + 1, x.activations) for i, x in enumerate(self.layers[:-1])]
        out += [(i, j, x.activations) for i, x in enumerate(self.layers) for j in x.skips if j != i + 1]
        return out

    def ties(self) -> tuple[tuple[int, int], ...]:
        """(shared layer, layer sharing it) pairs (kept: the stage tables ask on every read,
        and a 10 000-layer model's walk over its layers took a tenth of its search)."""
        if "ties" not in self._cache:
            self._cache["ties"] = tuple((x.tied_to, b) for b, x in enumerate(self.layers) if x.tied_to is not None)
        return self._cache["ties"]


MAX_BUCKETS = 1_000_000    # gradient buckets of the whole model: each is a task the simulators run


def _check_buckets(model: ModelSpec, layers: list[Layer], options: MemoryOptions) -> None:
    """Refuse a gradient bucket so small that the model's gradients on one device (the most
    a stage can hold) make more than :data:`MAX_BUCKETS` buckets: each is a simulated task,
    and a few million of them take minutes or the memory bound (a 39B model in 6-byte
    buckets ran out of it after 39 s)."""
    from ..units import format_bytes

    scale = FLOAT_DTYPES[options.gradient_reduce_dtype or model.training.dtype] / FLOAT_DTYPES[model.training.dtype]
    total = scale * sum(x.params for x in layers)
    if total / options.gradient_bucket > MAX_BUCKETS:
        # the least bucket accepted, in whole bytes as a bucket is given (308.4 B read "308 B",
        # which is refused, and "5.19 KiB" is not whole bytes)
        least = math.ceil(total / MAX_BUCKETS)
        raise model.source.error(("training", "gradient_bucket"),
                                 f"{format_bytes(options.gradient_bucket)} buckets cut the model's"
                                 f" {format_bytes(total)} of gradients into {total / options.gradient_bucket:,.0f};"
                                 f" at most {MAX_BUCKETS:,} are handled (buckets of at least {least:,} B"
                                 + (f", about {format_bytes(least)})" if least >= 1024 else ")"))


def layer_model(model: ModelSpec, target: str = "native") -> LayerModel:
    """The layer model of a model spec; a clear error when it has none.  Under
    ``target="megatron"`` a spec that does not say how gradients accumulate gets Megatron-LM's
    own way, its gradient accumulation fusion (``fused``), instead of the default ``add``."""
    if model.training is None or (not model.layers and model.transformer is None):
        raise model.source.error((), "stage partitioning needs 'layers' (or 'transformer') and 'training' sections")
    t = model.training
    if model.transformer is not None:
        layers = transformer_layers(model.transformer, t.dtype, t.optimizer, t.tied_embeddings, t.attention)
    else:
        layers = _from_specs(model.layers, t)
    if t.recompute == "selective-op" and model.transformer is None:
        # specs loaded from files are refused when loaded (spec/model.py); built in code, here
        raise model.source.error(("training", "recompute"), SELECTIVE_OP_NEEDS)
    why = tensor_overlap_refusal(model)
    if why:
        raise model.source.error(("training", "tensor_overlap"), why)
    micro = None if t.microbatches == "auto" else int(t.microbatches)
    options = MemoryOptions.of(t)
    if target == "megatron" and "gradient_accumulation" not in t.model_fields_set:
        options = replace(options, gradient_accumulation="fused")
    if target != "native":
        from ..targets.rules import reduce_refusal
        from ..targets.search import target_module

        rules = target_module(target).RULES
        why = t.gradient_reduce_dtype and reduce_refusal(rules, t.dtype, t.gradient_reduce_dtype)
        if why:
            # said before the search: otherwise only plans without data parallelism qualify,
            # silently slower than what the user asked for
            where = model.source.error(("training", "gradient_reduce_dtype"),
                                       f"{why}; the spec asks for {t.gradient_reduce_dtype}")
            raise InfeasibleError(f"{target} runs no plan of this spec with data parallelism: {where}")
        if t.gradient_reduce_dtype is None:
            # the framework's own default type (bf16 gradients: fp32 under torchtitan's FSDP2
            # and Megatron-LM; targets/*.py RULES.reduce_default)
            options = replace(options, gradient_reduce_dtype=dict(rules.reduce_default).get(t.dtype))
        if rules.buffer_in_reduce_type:
            # gradients kept in the reduction's type, and fp32 main gradients beside a 16-bit
            # buffer under mixed precision (stages/memory.py)
            kept = FLOAT_DTYPES[options.gradient_reduce_dtype or t.dtype]
            train = FLOAT_DTYPES[t.dtype]
            options = replace(options, gradient_bytes=kept / train,
                              main_gradient_bytes=4.0 / train if kept < 4 and train < 4 else 0.0)
        if rules.fsdp2_defaults:
            options = replace(options, fsdp2_defaults=True)
        if rules.bucket_parameters:
            per = FLOAT_DTYPES[options.gradient_reduce_dtype or t.dtype]
            if "gradient_bucket" not in t.model_fields_set:
                # the framework's own buckets (Megatron-Core's DDP), in the reduction's type
                least, per_replica = rules.bucket_parameters
                options = replace(options, gradient_bucket=least * per, gradient_bucket_per_replica=per_replica * per)
            else:
                # the framework counts a bucket in whole parameters (--ddp-bucket-size): priced
                # as it will run, the export writes the same number
                options = replace(options, gradient_bucket=max(1, round(t.gradient_bucket / per)) * per)
        if rules.buckets_first_stage_only:
            options = replace(options, buckets_first_stage_only=True)
        if t.recompute == "auto":
            # a framework searches the granularities it runs: torchtitan's selective
            # checkpointing is per operator, not the attention core
            runs = rules.recompute - ({"selective-op"} if model.transformer is None else set())
            options = replace(options, recompute=tuple(m for m in RECOMPUTE_MODES if m in runs))
    if t.recompute == "auto" and not _selective_differs(layers):
        # selective recomputation keeps and re-runs what no layer of this model has: it is
        # "none" in every time and byte, so searching it too only doubles the plans per stage
        options = replace(options, recompute=tuple(m for m in options.recompute if m != "selective"))
    _check_buckets(model, layers, options)
    splits = () if model.transformer is None else (
        ("heads", model.transformer.heads), ("kv_heads", model.transformer.kv), ("ffn_hidden", model.transformer.ffn))
    return LayerModel(model.name, layers, t.global_batch, micro, t.dtype, options, splits)


def _selective_differs(layers: list[Layer]) -> bool:
    """Whether selective recomputation keeps or re-runs anything no recomputation does, by
    the rules that price it: the bytes kept and the FLOPs re-run (:mod:`.memory`), and the
    attention-core operators re-run when operators are priced one by one (:mod:`.operators`)."""
    return (not np.array_equal(saved_per_sample(layers, "selective", 1, False), saved_per_sample(layers, "none", 1, False))
            or bool(np.any(recompute_flops(layers, "selective") != recompute_flops(layers, "none")))
            or any(op.core for x in layers for op in x.ops))
