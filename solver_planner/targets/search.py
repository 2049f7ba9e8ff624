"""A framework target as a restriction of the stage search: uniform plans it can run.

``--target X`` searches the uniform plans of :mod:`solver_planner.stages.uniform` (one
configuration on every stage, equal blocks per model chunk, plus the splits the framework
adds) under the schedules the framework runs, keeping only those its own rules accept
(``allows`` of the target's module, on the :class:`.base.TargetConfig` of the plan).  The
prices are the planner's (what each framework does that it prices differently is listed in
the README's target tables); the search is exact over that space.
"""

from __future__ import annotations

import importlib

from ..errors import OptionError, unknown_choice
from ..spec.layers import FLOAT_DTYPES
from ..stages.partition import Partition
from ..stages.schedule import Schedule
from ..stages.uniform import block_range, equal_split
from .base import TARGETS, TargetConfig

__all__ = ["target_module", "restriction", "target_config", "FIRST_LAST"]

# frameworks that can give the first and the last stage fewer blocks (Megatron-LM's
# --decoder-first/last-pipeline-num-layers, torchtitan's split by module names): the search
# adds those splits to the equal one
FIRST_LAST = ("megatron", "torchtitan")


def target_module(target: str):
    """The module of a framework target (its ``RULES``, ``allows``, ``export``, ``parse``)."""
    if target not in TARGETS:       # an option's typo: every value --target takes
        raise OptionError(unknown_choice("target", target, TARGETS))
    if target == "native":          # this planner's own space has no framework module
        raise OptionError(unknown_choice("framework target", target, TARGETS[1:]))
    return importlib.import_module(f".{target}", __package__)


def model_refusal(model, target: str, options) -> str | None:
    """Why ``target`` runs no plan of ``model`` whatever its parallelism (its model, dtype or
    training options), or None: its rules asked about the model on one device, with the
    schedule, recomputation and sharding it runs (``options``: the layer model's under it)."""
    rules = target_module(target).RULES
    tr = model.training
    dims = _dims(model)
    pick = lambda wanted, allowed: wanted if wanted in allowed else sorted(allowed)[0]  # noqa: E731
    cfg = TargetConfig(target=target, **dims, tied_embeddings=bool(tr.tied_embeddings), global_batch=tr.global_batch,
                       micro_batch_size=tr.global_batch, dtype=tr.dtype, optimizer=tr.optimizer, data=1, tensor=1,
                       pipeline=1, schedule=pick("1f1b", rules.schedules), layers_per_chunk=(dims["layers"],),
                       recompute=pick("none", rules.recompute),
                       optimizer_sharding=pick("none", rules.optimizer_sharding),
                       gradient_accumulation=options.gradient_accumulation,
                       gradient_reduce_dtype=options.gradient_reduce_dtype or "")
    return target_module(target).allows(cfg)


def target_defaults(model) -> dict[str, list[str]]:
    """Per framework target, what it prices differently from the native plan where the
    spec says nothing (:func:`~solver_planner.stages.layers.layer_model` under the target
    against it natively): the gradients' reduction type, their accumulation and buckets.
    Empty for a spec without training or a transformer (no target plans a 'layers:' list)."""
    from ..errors import PlannerError
    from ..stages.layers import layer_model

    if model.transformer is None:
        return {}
    try:
        native = layer_model(model).options
    except PlannerError:
        return {}
    out: dict[str, list[str]] = {}
    for target in TARGETS[1:]:
        try:
            o = layer_model(model, target).options
        except PlannerError:
            continue
        if model_refusal(model, target, o) is not None:
            continue                # the target runs no plan of this model: nothing to price
        said = []
        if o.gradient_reduce_dtype != native.gradient_reduce_dtype:
            said.append(f"reduced in {o.gradient_reduce_dtype}")
        if o.gradient_accumulation != native.gradient_accumulation:
            said.append(f"accumulation {'fused' if o.gradient_accumulation == 'fused' else 'by an add'}")
        if (o.gradient_bucket, o.gradient_bucket_per_replica) != (native.gradient_bucket,
                                                                 native.gradient_bucket_per_replica):
            per = FLOAT_DTYPES[o.gradient_reduce_dtype or model.training.dtype]
            bucket = f"{o.gradient_bucket / per:,.0f}"
            if o.gradient_bucket_per_replica:
                bucket = f"max({bucket}, {o.gradient_bucket_per_replica / per:,.0f} x data size)"
            said.append(f"buckets of {bucket} parameters")
        if o.buckets_first_stage_only and not native.buckets_first_stage_only and native.gradient_overlap:
            said.append("only the first stage reduces during its backward")
        if said:
            out[target] = said
    return out


def _dims(model) -> dict:
    t = model.transformer
    if t is None:
        raise OptionError("a framework target needs a transformer model (a 'transformer:' section or a Hugging Face"
                          " config.json); a 'layers:' list has no shape a framework can be told")
    return dict(layers=t.layers, hidden=t.hidden, heads=t.heads, kv_heads=t.kv, ffn_hidden=t.ffn,
                sequence=t.sequence, vocab=t.vocab, activation=t.activation, bias=t.bias, fused_qkv=t.fused_qkv,
                position=t.position, norm=t.norm)


def target_config(plan: Partition, schedule: Schedule, model, target: str) -> TargetConfig:
    """The framework-neutral record of ``plan`` under ``schedule`` (:class:`.base.TargetConfig`)."""
    c = plan.costs
    opts = c.model.options
    tr = model.training
    cfg = plan.stages[0].config
    a, b = block_range(c.model.layers)
    counts = []
    for st in plan.stages:
        lo, hi = max(st.first, a), min(st.last, b)
        counts.append(max(0, hi - lo + 1))
    return TargetConfig(
        target=target, **_dims(model),
        tied_embeddings=bool(tr.tied_embeddings) if tr is not None else True,
        # the stage planner's micro-batch is the whole pipeline's, split over the data-parallel
        # replicas; a framework's micro-batch size is one replica's share
        global_batch=c.model.global_batch, micro_batch_size=int(c.micro_size) // (c.shape.size // cfg.tensor),
        dtype=c.model.dtype, optimizer=tr.optimizer if tr is not None else "adam",
        data=c.shape.size // cfg.tensor, tensor=cfg.tensor, pipeline=c.stages, virtual_stages=schedule.virtual,
        schedule=schedule.kind if schedule.kind != "eager-1f1b" else "1f1b", layers_per_chunk=tuple(counts),
        # the training options as the plan was priced with them (the layer model's: under the
        # Megatron-LM target the accumulation is fused unless the spec says otherwise)
        # (sequence parallelism and its overlap split what a tensor-parallel group replicates,
        # Korthikanti et al. 2022 §4.2.2: with one tensor device they do nothing, and the
        # frameworks run such plans without them: Megatron-LM turns the flag off at tensor 1)
        sequence_parallel=opts.sequence_parallel and cfg.tensor > 1, recompute=cfg.recompute,
        optimizer_sharding=opts.sharding,
        gradient_overlap=opts.gradient_overlap, gradient_accumulation=opts.gradient_accumulation,
        gradient_reduce_dtype=opts.gradient_reduce_dtype or "", tensor_overlap=opts.tensor_overlap and cfg.tensor > 1,
        # a bucket the spec sets (a framework's own grows with the replicas: layer_model)
        gradient_bucket=0 if opts.gradient_bucket_per_replica else
        round(opts.gradient_bucket / FLOAT_DTYPES[opts.gradient_reduce_dtype or c.model.dtype]))


def restriction(target: str, model, schedule: str | None) -> dict:
    """StageSearch keywords restricting it to ``target``: its schedules (or the one asked,
    if it runs it), uniform plans, its splits, its rules."""
    mod = target_module(target)
    rules = mod.RULES
    _dims(model)
    kinds = sorted(rules.schedules)
    if schedule is not None:
        if schedule not in kinds:
            raise OptionError(f"{target} does not run {schedule}; it runs: {', '.join(kinds)}")
        kinds = [schedule]

    def allows(plan: Partition, s: Schedule) -> str | None:
        return mod.allows(target_config(plan, s, model, target))

    def splits(layers, chunks: int) -> list[list[int]]:
        out = [x for x in [equal_split(layers, chunks)] if x]
        if target in FIRST_LAST:
            a, b = block_range(layers)
            for n in range(1, (b - a + 1) // chunks):
                x = equal_split(layers, chunks, first_last=n)
                if x and x not in out:
                    out.append(x)
        return out

    # A framework reduces gradients with its own collective over the data-parallel group (one
    # NCCL all-reduce, or reduce-scatter with a sharded optimizer); P²'s synthesized programs
    # are this planner's, so a target's plans are priced with the flat collective only.
    return dict(uniform=kinds, allows=allows, splits=splits, space=target, synthesize=False)
