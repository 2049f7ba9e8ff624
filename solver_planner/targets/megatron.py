"""Megatron-LM (Megatron-Core) as a target: the plans its training loop runs.

From Megatron-LM's documented arguments (Narayanan et al. 2021 for the schedules):
one tensor degree (``--tensor-model-parallel-size``), one pipeline degree
(``--pipeline-model-parallel-size``) and the data degree they leave, for every stage; the
transformer blocks split equally over the pipeline stages, or over the model chunks of the
interleaved schedule (``--num-layers-per-virtual-pipeline-stage``), with
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` for fewer
blocks on the first and last stage; 1F1B, and interleaved 1F1B whose micro-batch count is a
multiple of the pipeline degree; recomputation none, selective or full
(``--recompute-granularity``); the distributed optimizer (``--use-distributed-optimizer``)
or none; attention heads and query groups divisible by the tensor degree.
"""

from __future__ import annotations

from .base import TargetConfig
from .rules import Rules

__all__ = ["RULES", "allows"]

RULES = Rules(schedules=("1f1b", "interleaved-1f1b"), recompute=("none", "selective", "full"),
              sharding=("none", "distributed"), first_last_layers=True)


def allows(cfg: TargetConfig) -> str | None:
    """None when Megatron-LM runs ``cfg``, else why not (one line)."""
    if cfg.schedule not in RULES.schedules:
        return f"Megatron-LM runs {', '.join(RULES.schedules)}, not {cfg.schedule}"
    if cfg.recompute not in RULES.recompute:
        return f"recomputation {cfg.recompute} is not one of Megatron-LM's granularities"
    if cfg.optimizer_sharding not in RULES.sharding:
        return (f"optimizer sharding {cfg.optimizer_sharding}: Megatron-LM shards the optimizer with its distributed"
                " optimizer ('distributed') or not at all")
    if cfg.heads % cfg.tensor or cfg.kv_heads % cfg.tensor:
        return f"{cfg.heads} heads ({cfg.kv_heads} query groups) do not divide over tensor degree {cfg.tensor}"
    if cfg.global_batch % (cfg.micro_batch_size * cfg.data):
        return "the global batch is not a multiple of micro-batch size x data degree"
    if cfg.schedule == "interleaved-1f1b":
        if cfg.pipeline < 2:
            return "the interleaved schedule needs a pipeline"
        if cfg.microbatches % cfg.pipeline:
            return f"interleaved: {cfg.microbatches} micro-batches are not a multiple of the pipeline degree"
    counts = list(cfg.layers_per_chunk)
    if len(counts) > 2 and len(set(counts[1:-1])) > 1:
        return "Megatron-LM gives every stage but the first and the last the same number of blocks"
    if cfg.virtual_stages > 1 and len(set(counts)) > 1:
        return "with virtual stages every model chunk holds the same number of blocks"
    if len(counts) >= 2 and counts[0] != counts[-1] and counts[0] > counts[1]:
        return "the first and last stage may hold fewer blocks, not more"
    return None
