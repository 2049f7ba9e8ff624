"""DeepSpeed target: the plans DeepSpeed runs, written as its JSON configuration.

Keys from the DeepSpeed configuration JSON documentation (deepspeed.ai/docs/config-json) and
DeepSpeed 0.19.8's ``deepspeed/runtime/config.py`` (``DeepSpeedConfig``), ``runtime/pipe``
and ``runtime/tensor_parallel/config.py``.

What the JSON cannot say and the user's code must match: the model itself, and with a
pipeline the ``PipelineModule(num_stages=pipeline, partition_method=...)`` that cuts it (the
engine reads only ``pipe_partitioned``, ``grad_partitioned`` and
``activation_checkpoint_interval`` of the ``pipeline`` section; ``stages`` is written as the
record of the plan's degree).  Equal transformer blocks per stage is what
``partition_method="type:<block class name>"`` produces, so that is the only split allowed.
"""

from __future__ import annotations

import json

from .base import TargetConfig
from .rules import TargetRules, chunk_layers, refusal

__all__ = ["RULES", "allows", "export", "parse", "config_dict"]

_STAGE = {"none": 0, "zero-1": 1, "zero-2": 2, "zero-3": 3}

RULES = TargetRules(
    target="deepspeed",
    # PipelineEngine runs TrainSchedule, a 1F1B (PipeDream-Flush) schedule; DeepSpeed has no
    # interleaved or zero-bubble training schedule.
    schedules=frozenset({"1f1b"}),
    virtual_stages=False,
    # DeepSpeed-Ulysses (sequence_parallel_size) splits sequences with all-to-all over heads;
    # it is not the context parallelism TargetConfig.context describes, so it is not exported.
    context_parallel=False,
    sequence_parallel=False,
    # Full recompute of every block with a pipeline: pipeline.activation_checkpoint_interval
    # = 1.  Without a pipeline, recompute is the model's own code (deepspeed.checkpointing),
    # and DeepSpeed has no selective recompute.
    recompute=frozenset({"none", "full"}),
    optimizer_sharding=frozenset(_STAGE),
    dtypes=frozenset({"bfloat16", "float16", "float32"}),
    activations=frozenset({"gelu", "swiglu"}),
    optimizers=frozenset({"adam", "sgd"}),
    layer_split="equal transformer blocks per pipeline stage (PipelineModule partition)",
    microbatch_rule=("train_batch_size = train_micro_batch_size_per_gpu x "
                     "gradient_accumulation_steps x data; with a pipeline the accumulation "
                     "steps are its micro-batches"),
    source="DeepSpeed 0.19.8 runtime/config.py, runtime/pipe/engine.py; AutoTP training tutorial",
)


def allows(cfg: TargetConfig) -> str | None:
    """None if DeepSpeed runs ``cfg``, else the reason in one line."""
    why = refusal(RULES, cfg)
    if why:
        return why
    if cfg.gradient_accumulation == "fused" and cfg.microbatches > 1:
        # the plan priced no pass for it; DeepSpeed runs one
        return ("DeepSpeed adds each micro-batch's weight gradients through its gradient hooks; fused accumulation"
                " (training.gradient_accumulation: fused) is Megatron-LM's")
    stage = _STAGE[cfg.optimizer_sharding]
    if cfg.pipeline > 1 and stage > 1:
        # runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        return f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not {stage}"
    if cfg.recompute == "full" and cfg.pipeline == 1:
        return ("without a pipeline DeepSpeed recomputes only where the model calls "
                "deepspeed.checkpointing; the config cannot ask for it")
    if cfg.tensor > 1:
        # The AutoTP training tutorial: tensor parallelism with data parallelism and ZeRO
        # stage 0, 1 or 2, applied by deepspeed.initialize to a Hugging Face-style model
        # (not to a PipelineModule).
        if cfg.pipeline > 1:
            return "DeepSpeed AutoTP tensor parallelism is not combined with its pipeline engine"
        if stage > 2:
            return "DeepSpeed AutoTP training runs with ZeRO stage 0, 1 or 2, not 3"
        for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads),
                        ("ffn_hidden", cfg.ffn_hidden)):
            if n % cfg.tensor:
                return f"{name} {n} not divisible by tensor {cfg.tensor}"
    split, _ = chunk_layers(cfg)
    if len(set(split)) != 1:
        return (f"DeepSpeed's PipelineModule partitions transformer blocks equally; "
                f"layers_per_chunk {list(split)} is uneven")
    return None


def config_dict(cfg: TargetConfig) -> dict:
    """The DeepSpeed configuration of ``cfg`` as a dict (what ``export`` writes as JSON)."""
    why = allows(cfg)
    if why:
        raise ValueError(f"DeepSpeed cannot run this configuration: {why}")
    stage = _STAGE[cfg.optimizer_sharding]
    d: dict = {
        "train_batch_size": cfg.global_batch,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.microbatches,
        # DeepSpeed builds torch.optim.<type> for names it has no own optimizer for.
        "optimizer": {"type": {"adam": "Adam", "sgd": "SGD"}[cfg.optimizer], "params": {}},
        "zero_optimization": {"stage": stage},
    }
    if stage > 0:
        d["zero_optimization"]["overlap_comm"] = cfg.gradient_overlap
        if cfg.optimizer == "sgd":
            # runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS has no SGD; the engine
            # asks for this switch before it partitions an untested optimizer.
            d["zero_allow_untested_optimizer"] = True
    if cfg.dtype == "bfloat16":
        d["bf16"] = {"enabled": True}
    elif cfg.dtype == "float16":
        d["fp16"] = {"enabled": True}
    if cfg.tensor > 1:
        d["tensor_parallel"] = {"autotp_size": cfg.tensor}
    if cfg.pipeline > 1:
        d["pipeline"] = {
            "stages": cfg.pipeline,
            "activation_checkpoint_interval": 1 if cfg.recompute == "full" else 0,
        }
    return d


def export(cfg: TargetConfig) -> str:
    """The DeepSpeed JSON configuration (``deepspeed.initialize(config=...)``)."""
    return json.dumps(config_dict(cfg), indent=2) + "\n"


def parse(text: str) -> dict:
    """The configuration dict of an exported file; refuses keys this target does not write."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError("a DeepSpeed configuration is a JSON object")
    known = {"train_batch_size", "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps", "optimizer", "zero_optimization",
             "zero_allow_untested_optimizer", "bf16", "fp16", "tensor_parallel", "pipeline"}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"keys this target does not write: {sorted(unknown)}")
    return d
