"""What a framework can run, written as data: the search-space restriction of one target.

Each target module (:mod:`.megatron`, :mod:`.torchtitan`, :mod:`.deepspeed`) holds one
:class:`TargetRules` named ``RULES`` and an ``allows(cfg)`` that applies it.  The rules that
are plain set membership (schedules, recompute granularities, optimizer sharding, ...) are
checked once here by :func:`refusal`; the rules that need arithmetic on layer splits or
batch sizes stay in the framework's module, next to the source they come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import SCHEDULE_NAMES, TargetConfig

__all__ = ["TargetRules", "refusal", "tensor_splits", "chunk_layers", "chunk_order"]


@dataclass(frozen=True)
class TargetRules:
    """The configurations one framework runs, in :class:`TargetConfig`'s terms.

    ``schedules`` uses our schedule names (:data:`SCHEDULE_NAMES`); ``layer_split`` and
    ``microbatch_rule`` say in one line what the module's ``allows`` checks beyond the sets,
    so the search and the README can show them.
    """

    target: str
    schedules: frozenset[str]
    virtual_stages: bool            # more than one model chunk per pipeline rank
    context_parallel: bool
    sequence_parallel: bool         # Megatron-style sequence parallelism inside the TP group
    recompute: frozenset[str]       # "none" | "selective" | "full" | "selective-op"
    optimizer_sharding: frozenset[str]
    dtypes: frozenset[str]
    activations: frozenset[str]
    optimizers: frozenset[str]
    layer_split: str
    microbatch_rule: str
    source: str                     # where the rules were read (framework version / file)
    # (training dtype, reduction dtype) pairs the framework runs (its export sets the choice);
    # empty: only the training dtype itself, which the export does not change
    gradient_reduce: frozenset[tuple[str, str]] = frozenset()
    # (training dtype, reduction dtype) where the framework's default is not the training
    # dtype: a plan of such a model is priced that way unless the spec says otherwise
    reduce_default: frozenset[tuple[str, str]] = frozenset()
    # the gradient buffer is kept in the reduction's type, and a 16-bit one beside fp32 main
    # gradients in the optimizer state (Megatron-Core's DDP and mixed-precision optimizers;
    # stages/memory.py): False keeps gradients in the training type
    buffer_in_reduce_type: bool = False
    # ZeRO-2/3 are FSDP2 as torch runs it: under torch's pipelining, gradients accumulate whole
    # until the last backward and parameters stay gathered after a backward; without it,
    # parameters are resharded after every backward (stages/memory.py zero_run)
    fsdp2_defaults: bool = False
    # tensor-parallel collectives overlapped with their products (training.tensor_overlap)
    tensor_overlap: bool = False
    # the framework's gradient bucket, in parameters: (at least, per data-parallel replica);
    # empty: PyTorch DDP's 25 MiB (training.gradient_bucket's default)
    bucket_parameters: tuple[float, float] = ()
    # only the stage holding the first layer buckets its gradients (the others: one bucket)
    buckets_first_stage_only: bool = False

    def __post_init__(self):
        unknown = self.schedules - set(SCHEDULE_NAMES)
        if unknown:
            raise ValueError(f"{self.target}: unknown schedule names {sorted(unknown)}")
        if not self.reduce_default <= self.gradient_reduce:
            raise ValueError(f"{self.target}: a default reduction type it does not run")


def chunk_order(cfg: TargetConfig) -> list[tuple[int, int]]:
    """(pipeline rank, chunk on that rank) of each model chunk, in pipeline (model) order.

    Looped schedules (interleaved 1F1B, zero-bubble H1) give chunk ``c`` to rank
    ``c % pipeline`` (Narayanan et al. 2021); ZB-V folds the model into a V, rank ``r``
    holding chunks ``r`` and ``2·pipeline-1-r`` (Qi et al. 2024).
    """
    p, v = cfg.pipeline, cfg.virtual_stages
    if cfg.schedule == "zb-v":
        return [(c, 0) if c < p else (2 * p - 1 - c, 1) for c in range(p * v)]
    return [(c % p, c // p) for c in range(p * v)]


def chunk_layers(cfg: TargetConfig) -> tuple[tuple[int, ...] | None, str | None]:
    """The transformer blocks of each model chunk, or the reason there is no valid split.

    An empty ``layers_per_chunk`` means the equal split, which exists only when the layers
    divide among ``pipeline * virtual_stages`` chunks.
    """
    n = cfg.pipeline * cfg.virtual_stages
    if not cfg.layers_per_chunk:
        if cfg.layers % n:
            return None, (f"layers_per_chunk not given and {cfg.layers} layers do not divide "
                          f"into {n} equal chunks")
        return (cfg.layers // n,) * n, None
    split = tuple(cfg.layers_per_chunk)
    if len(split) != n:
        return None, (f"layers_per_chunk has {len(split)} entries, pipeline*virtual_stages "
                      f"= {n}")
    if any(k < 0 for k in split) or sum(split) != cfg.layers:
        return None, f"layers_per_chunk {list(split)} does not sum to {cfg.layers} layers"
    return split, None


def refusal(rules: TargetRules, cfg: TargetConfig) -> str | None:
    """The first rule of ``rules`` that ``cfg`` breaks, as a one-line reason; else None."""
    t = rules.target
    positive = {"data": cfg.data, "tensor": cfg.tensor, "pipeline": cfg.pipeline,
                "context": cfg.context, "virtual_stages": cfg.virtual_stages,
                "micro_batch_size": cfg.micro_batch_size, "global_batch": cfg.global_batch}
    for name, value in positive.items():
        if value < 1:
            return f"{name} must be at least 1, got {value}"
    if cfg.schedule not in rules.schedules:
        return f"{t} has no {cfg.schedule} schedule (it runs {', '.join(sorted(rules.schedules))})"
    # Which schedules take model chunks: GPipe/1F1B run one chunk per rank; the interleaved
    # schedule needs several; ZB-V exactly two (Qi et al. 2024, the V shape).
    if cfg.schedule in ("gpipe", "1f1b") and cfg.virtual_stages != 1:
        return f"{cfg.schedule} runs one model chunk per pipeline rank, got {cfg.virtual_stages}"
    if cfg.schedule == "interleaved-1f1b" and cfg.virtual_stages < 2:
        return "interleaved-1f1b needs at least 2 model chunks per pipeline rank"
    if cfg.schedule == "zb-v" and cfg.virtual_stages != 2:
        return f"zb-v runs exactly 2 model chunks per pipeline rank, got {cfg.virtual_stages}"
    if cfg.virtual_stages > 1 and not rules.virtual_stages:
        return f"{t} has no virtual pipeline stages (model chunks per rank)"
    if cfg.virtual_stages > 1 and cfg.pipeline < 2:
        return "virtual stages need a pipeline of at least 2 ranks"
    if cfg.context > 1 and not rules.context_parallel:
        return f"{t} has no context parallelism (context={cfg.context})"
    if cfg.sequence_parallel and not rules.sequence_parallel:
        return f"{t} has no sequence parallelism"
    if cfg.sequence_parallel and cfg.tensor < 2:
        # Sequence parallelism splits the activations the tensor-parallel group replicates
        # (Korthikanti et al. 2022); without a TP group there is nothing to split.
        return "sequence parallelism needs tensor > 1"
    if cfg.tensor_overlap and not rules.tensor_overlap:
        return f"{t} does not overlap tensor-parallel collectives with products here (training.tensor_overlap)"
    if cfg.tensor_overlap and not cfg.sequence_parallel:
        # Megatron-LM's arguments.py asserts sequence parallelism under --tp-comm-overlap
        return "tensor_overlap needs sequence parallelism"
    if cfg.recompute not in rules.recompute:
        hint = ("; its selective checkpointing is per operator: recompute: selective-op"
                if cfg.recompute == "selective" and "selective-op" in rules.recompute else "")
        return f"{t} has no {cfg.recompute} recompute (it has {', '.join(sorted(rules.recompute))}){hint}"
    why = reduce_refusal(rules, cfg.dtype, cfg.gradient_reduce_dtype or cfg.dtype)
    if cfg.data > 1 and why:
        return f"{why}; the plan reduces them in {cfg.gradient_reduce_dtype or cfg.dtype}"
    if cfg.optimizer_sharding not in rules.optimizer_sharding:
        return (f"{t} has no optimizer sharding {cfg.optimizer_sharding!r} (it has "
                f"{', '.join(sorted(rules.optimizer_sharding))})")
    if cfg.dtype not in rules.dtypes:
        return f"{t} does not train in {cfg.dtype} (it trains in {', '.join(sorted(rules.dtypes))})"
    if cfg.activation not in rules.activations:
        return f"{t} has no {cfg.activation} models here (it has {', '.join(sorted(rules.activations))})"
    if cfg.optimizer not in rules.optimizers:
        return f"{t} has no {cfg.optimizer} optimizer here (it has {', '.join(sorted(rules.optimizers))})"
    if cfg.heads % cfg.kv_heads or cfg.kv_heads > cfg.heads:
        return f"kv_heads {cfg.kv_heads} must divide heads {cfg.heads}"
    if cfg.global_batch % (cfg.data * cfg.micro_batch_size):
        return (f"global_batch {cfg.global_batch} is not a multiple of micro_batch_size "
                f"{cfg.micro_batch_size} x data {cfg.data}")
    _, why = chunk_layers(cfg)
    return why


def reduce_refusal(rules: TargetRules, dtype: str, reduce: str) -> str | None:
    """Why the framework cannot reduce ``dtype`` gradients in ``reduce`` (None: it can)."""
    runs = sorted(r for d, r in rules.gradient_reduce if d == dtype) or [dtype]
    if reduce in runs:
        return None
    how = " or ".join(runs) + (" (the training dtype; its export cannot change that)" if not rules.gradient_reduce
                               else "")
    return f"{rules.target} reduces {dtype} gradients in {how}"


def tensor_splits(cfg: TargetConfig) -> str | None:
    """What tensor, context and sequence parallelism cut must divide (Megatron-Core and
    torchtitan alike): heads, query groups and the MLP over the tensor degree; each sequence
    into ``2 x context`` chunks (the load-balanced context split); the context-local sequence
    over the tensor group under sequence parallelism."""
    for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn_hidden", cfg.ffn_hidden)):
        if n % cfg.tensor:
            return f"{name} {n} not divisible by tensor {cfg.tensor}"
    if cfg.context > 1 and cfg.sequence % (2 * cfg.context):
        return f"context parallelism needs sequence % (2 x context) == 0, got {cfg.sequence}"
    if cfg.sequence_parallel and (cfg.sequence // cfg.context) % cfg.tensor:
        return (f"sequence parallelism splits the local sequence {cfg.sequence // cfg.context} "
                f"over tensor {cfg.tensor}")
    return None
