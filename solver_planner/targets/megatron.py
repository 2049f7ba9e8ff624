"""Megatron-LM target: the plans ``pretrain_gpt.py`` runs, written as its command-line flags.

Flag names and rules are read from Megatron-LM's ``megatron/training/arguments.py`` (main,
2026-08), whose parser builds part of its flags from Megatron-Core dataclasses
(``ArgumentGroupFactory(TransformerConfig)`` and ``(TrainingConfig)``: field ``foo_bar``
becomes ``--foo-bar``), and from Megatron-Core 0.16.1 (``TransformerConfig.__post_init__``,
``pipeline_parallel/schedules.py``).

The export is a bash snippet that defines an array, so that it can carry comments::

    source megatron.args.sh
    torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" --data-path ... --tokenizer-type ...

Not in the plan and so not exported: data, tokenizer (Megatron takes the vocabulary size from
it and pads it to a multiple of ``--make-vocab-size-divisible-by`` x tensor), learning rate,
position embedding, normalization and bias flags (Megatron's defaults are GPT-2's: learned
absolute positions, LayerNorm, biases; a Llama run adds ``--position-embedding-type rope
--normalization RMSNorm --disable-bias-linear``).
"""

from __future__ import annotations

import shlex

from .base import TargetConfig
from .rules import TargetRules, chunk_layers, chunk_order, refusal, tensor_splits

__all__ = ["RULES", "FLAG_SCHEMA", "allows", "export", "parse", "pipeline_layout"]

RULES = TargetRules(
    target="megatron",
    # Megatron-Core's forward_backward functions: no pipelining, 1F1B
    # (forward_backward_pipelining_without_interleaving) and interleaved 1F1B
    # (..._with_interleaving).  Neither Megatron-LM's arguments.py nor Megatron-Core 0.16.1 has
    # a GPipe or zero-bubble (ZB-H1 / ZB-V) schedule.
    schedules=frozenset({"1f1b", "interleaved-1f1b"}),
    virtual_stages=True,
    context_parallel=True,
    sequence_parallel=True,
    # --tp-comm-overlap (Transformer Engine's userbuffers; arguments.py requires
    # --sequence-parallel with it)
    tensor_overlap=True,
    # distributed_data_parallel.py: bucket_size = max(40000000, 1000000 * dp size) parameters
    # (megatron-core 0.16.1, as in core_r0.8.0)
    bucket_parameters=(40e6, 1e6),
    # ... and "Turn off bucketing if we are on a pipeline stage that is not the first", and for
    # model chunks after the first (disable_bucketing): one bucket, reduced after the backward
    buckets_first_stage_only=True,
    recompute=frozenset({"none", "selective", "full"}),
    # --use-distributed-optimizer shards optimizer state over data-parallel ranks.
    optimizer_sharding=frozenset({"none", "distributed"}),
    dtypes=frozenset({"bfloat16", "float16", "float32"}),
    activations=frozenset({"gelu", "swiglu"}),
    optimizers=frozenset({"adam", "sgd"}),
    layer_split=("any split: equal blocks by default, uneven first/last stage with "
                 "--decoder-first/last-pipeline-num-layers, anything else with "
                 "--pipeline-model-parallel-layout"),
    microbatch_rule=("global batch % (micro batch x data) == 0; interleaved: micro-batches "
                     "a multiple of pipeline (microbatch_group_size_per_vp_stage = pipeline)"),
    # arguments.py: bf16 reduces in fp32 (accumulate_allreduce_grads_in_fp32 is set for it)
    # unless --grad-reduce-in-bf16; fp16 reduces in fp16 unless --accumulate-allreduce-grads-in-fp32
    gradient_reduce=frozenset({("bfloat16", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"),
                               ("float16", "float32"), ("float32", "float32")}),
    reduce_default=frozenset({("bfloat16", "float32")}),
    # distributed_data_parallel.py allocates the grad buffer in fp32 when grad_reduce_in_fp32,
    # else in the parameters' type; the mixed-precision optimizers then keep fp32 main grads
    # (the distributed-optimizer guide: 4 + 16/d bytes a parameter for 16-bit gradients,
    # 6 + 12/d for bf16 parameters with fp32 gradients)
    buffer_in_reduce_type=True,
    source="Megatron-LM megatron/training/arguments.py (main); megatron-core 0.16.1",
)

# Every flag export may write, its value kind and where the parser defines it.  Kept by hand
# because Megatron-LM's argparse (megatron/training/arguments.py) is in no PyPI package: the
# megatron-core wheel ships only megatron/core, and megatron-bridge has its own recipe
# configs instead of this parser.  "int"/"str" take one value, "flag" none.
_ARGS = "arguments.py add_argument"
_TC = "TransformerConfig field via ArgumentGroupFactory"
_TRAIN = "megatron.training TrainingConfig field via ArgumentGroupFactory"
FLAG_SCHEMA: dict[str, tuple[str, str]] = {
    "--num-layers": ("int", _TC),
    "--hidden-size": ("int", _TC),
    "--ffn-hidden-size": ("int", _TC),
    "--num-attention-heads": ("int", _TC),
    "--group-query-attention": ("flag", _ARGS),
    "--num-query-groups": ("int", _TC),
    "--swiglu": ("flag", _ARGS),
    "--seq-length": ("int", _ARGS),
    "--max-position-embeddings": ("int", _ARGS),
    "--untie-embeddings-and-output-weights": ("flag", _ARGS),
    "--bf16": ("flag", _TC),
    "--fp16": ("flag", _TC),
    "--optimizer": ("str", _ARGS),
    "--micro-batch-size": ("int", _TRAIN),
    "--global-batch-size": ("int", _TRAIN),
    "--tensor-model-parallel-size": ("int", _TC),
    "--pipeline-model-parallel-size": ("int", _TC),
    "--context-parallel-size": ("int", _TC),
    "--sequence-parallel": ("flag", _TC),
    "--tp-comm-overlap": ("flag", _TC),
    "--num-virtual-stages-per-pipeline-rank": ("int", _ARGS),
    "--decoder-first-pipeline-num-layers": ("int", _ARGS),
    "--decoder-last-pipeline-num-layers": ("int", _ARGS),
    "--pipeline-model-parallel-layout": ("str", _ARGS),
    "--recompute-granularity": ("str", _TC),
    "--recompute-method": ("str", _TC),
    "--recompute-num-layers": ("int", _TC),
    "--use-distributed-optimizer": ("flag", _ARGS),
    "--overlap-grad-reduce": ("flag", _ARGS),
    "--overlap-param-gather": ("flag", _ARGS),
    "--ddp-bucket-size": ("int", _ARGS),
    # arguments.py: store_false into gradient_accumulation_fusion (on by default)
    "--no-gradient-accumulation-fusion": ("flag", _ARGS),
    "--grad-reduce-in-bf16": ("flag", _ARGS),
    # arguments.py: store_false into add_bias_linear; store_true into add_qkv_bias
    "--disable-bias-linear": ("flag", _ARGS),
    "--add-qkv-bias": ("flag", _ARGS),
    "--position-embedding-type": ("str", _ARGS),
    "--normalization": ("str", _TC),
    "--accumulate-allreduce-grads-in-fp32": ("flag", _ARGS),
}

_ARRAY = "MEGATRON_ARGS"


def _rank_layers(cfg: TargetConfig, split: tuple[int, ...]) -> list[list[int]]:
    """Blocks of each model chunk, grouped by pipeline rank (chunks in local order)."""
    ranks: list[list[int]] = [[0] * cfg.virtual_stages for _ in range(cfg.pipeline)]
    for (rank, local), k in zip(chunk_order(cfg), split):
        ranks[rank][local] = k
    return ranks


def _first_last(cfg: TargetConfig, split: tuple[int, ...]) -> tuple[int | None, int | None] | None:
    """``(first, last)`` for --decoder-first/last-pipeline-num-layers if they express split.

    Megatron-Core (TransformerConfig, "Uneven PP") gives the first and the last pipeline rank
    their own layer count (divisible by the virtual stages, spread equally over its chunks)
    and the middle ranks equal shares; None means the split needs a layout.  (None, None):
    the equal split, no flag at all.
    """
    ranks = _rank_layers(cfg, split)
    if any(len(set(r)) != 1 for r in ranks):
        return None
    per_rank = [sum(r) for r in ranks]
    if len(set(per_rank)) == 1:
        return None, None
    middle = set(per_rank[1:-1])
    if len(middle) > 1 or 0 in middle:
        # Middle ranks share the remaining layers equally and must have some
        # (TransformerConfig: "Mismatch: ... middle layers ... middle PP stages").
        return None
    m = middle.pop() if middle else None
    first = per_rank[0] if per_rank[0] != m else None
    last = per_rank[-1] if per_rank[-1] != m else None
    if first == 0 or last == 0:
        return None  # num_layers_in_first/last_pipeline_stage must be larger than 0
    return first, last


def pipeline_layout(cfg: TargetConfig, split: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` for ``split``: chunks in pipeline order split by
    ``|``, ``E`` the embedding (with the first chunk), ``t`` a transformer block, ``L`` the
    loss (with the last chunk) — the format of Megatron-Core's PipelineParallelLayerLayout,
    whose stage ``i`` is virtual chunk ``i // pipeline`` of rank ``i % pipeline``."""
    parts = []
    for c, k in enumerate(split):
        s = ("E" if c == 0 else "") + (f"t*{k}" if k > 1 else "t" * k)
        if c == len(split) - 1:
            s += "L"
        parts.append(s)
    return "|".join(parts)


def allows(cfg: TargetConfig) -> str | None:
    """None if Megatron-LM runs ``cfg``, else the reason in one line."""
    why = refusal(RULES, cfg)
    if why:
        return why
    if cfg.hidden % cfg.heads:
        return f"hidden {cfg.hidden} is not a multiple of heads {cfg.heads}"
    # TransformerConfig.__post_init__ and the context-parallel docs: what TP, CP and SP cut
    why = tensor_splits(cfg)
    if why:
        return why
    if cfg.virtual_stages > 1:
        # schedules.py, forward_backward_pipelining_with_interleaving, with the default
        # microbatch_group_size_per_vp_stage = pipeline: M >= pipeline and M % pipeline == 0.
        m = cfg.microbatches
        if m < cfg.pipeline or m % cfg.pipeline:
            return (f"interleaved 1F1B needs the {m} micro-batches to be a multiple of "
                    f"pipeline {cfg.pipeline}")
    return None


def _flags(cfg: TargetConfig) -> list[tuple[str, str | None, str]]:
    """(flag, value or None, comment) in export order."""
    out: list[tuple[str, str | None, str]] = []

    def add(flag, value=None, why=""):
        out.append((flag, None if value is None else str(value), why))

    add("--num-layers", cfg.layers, "model")
    add("--hidden-size", cfg.hidden)
    add("--ffn-hidden-size", cfg.ffn_hidden)
    add("--num-attention-heads", cfg.heads)
    if cfg.kv_heads != cfg.heads:
        add("--group-query-attention")
        add("--num-query-groups", cfg.kv_heads)
    if cfg.activation == "swiglu":
        add("--swiglu")  # GELU is Megatron's default activation
    if cfg.bias is not True:
        # linear layers have biases by default (add_bias_linear); Qwen2-style QKV biases only
        add("--disable-bias-linear")
        if cfg.bias == "qkv":
            add("--add-qkv-bias")
    # learned absolute positions and LayerNorm are Megatron-LM's defaults
    if cfg.position == "rotary":
        add("--position-embedding-type", "rope")
    if cfg.norm == "rmsnorm":
        add("--normalization", "RMSNorm")
    add("--seq-length", cfg.sequence)
    add("--max-position-embeddings", cfg.sequence)
    if not cfg.tied_embeddings:
        add("--untie-embeddings-and-output-weights")
    if cfg.dtype == "bfloat16":
        add("--bf16", why="precision")
    elif cfg.dtype == "float16":
        add("--fp16", why="precision")
    add("--optimizer", cfg.optimizer)
    add("--micro-batch-size", cfg.micro_batch_size, "batch")
    add("--global-batch-size", cfg.global_batch)
    add("--tensor-model-parallel-size", cfg.tensor, "parallelism")
    add("--pipeline-model-parallel-size", cfg.pipeline)
    add("--context-parallel-size", cfg.context)
    if cfg.sequence_parallel:
        add("--sequence-parallel")
    if cfg.tensor_overlap:
        add("--tp-comm-overlap", why="tensor-parallel collectives overlapped with their products as planned")
    split, _ = chunk_layers(cfg)
    fl = _first_last(cfg, split)
    if fl is None:
        # Only one of --num-virtual-stages-per-pipeline-rank / --pipeline-model-parallel-layout
        # may be set (validate_args); the layout implies the virtual stages.
        add("--pipeline-model-parallel-layout", shlex.quote(pipeline_layout(cfg, split)),
            "layer split")
    else:
        if cfg.virtual_stages > 1:
            add("--num-virtual-stages-per-pipeline-rank", cfg.virtual_stages, "layer split")
        first, last = fl
        if first is not None:
            add("--decoder-first-pipeline-num-layers", first,
                "" if cfg.virtual_stages > 1 else "layer split")
        if last is not None:
            add("--decoder-last-pipeline-num-layers", last,
                "" if cfg.virtual_stages > 1 or first is not None else "layer split")
    if cfg.recompute == "selective":
        add("--recompute-granularity", "selective", "recompute")
    elif cfg.recompute == "full":
        # Full recompute of every block: uniform method, one block per checkpoint.
        add("--recompute-granularity", "full", "recompute")
        add("--recompute-method", "uniform")
        add("--recompute-num-layers", 1)
    if cfg.optimizer_sharding == "distributed":
        add("--use-distributed-optimizer", why="optimizer sharding")
    if cfg.gradient_accumulation == "add" and cfg.microbatches > 1:
        # the plan priced an element-wise add of each micro-batch's weight gradients (the
        # spec's gradient_accumulation: add); Megatron-LM fuses it into the product by default
        add("--no-gradient-accumulation-fusion", why="gradient accumulation as planned (training.gradient_accumulation: add)")
    reduce = cfg.gradient_reduce_dtype or cfg.dtype
    if cfg.data > 1 and cfg.dtype == "bfloat16" and reduce == "bfloat16":
        add("--grad-reduce-in-bf16", why="gradients reduced in bf16 as planned (Megatron-LM's default for bf16: fp32)")
    if cfg.data > 1 and cfg.dtype == "float16" and reduce == "float32":
        add("--accumulate-allreduce-grads-in-fp32", why="gradients reduced in fp32 as planned")
    if cfg.gradient_overlap and cfg.data > 1:
        add("--overlap-grad-reduce", why="overlap gradient reduction with backward")
        if cfg.gradient_bucket:
            add("--ddp-bucket-size", cfg.gradient_bucket, "gradient buckets as planned (training.gradient_bucket)")
        if cfg.optimizer_sharding == "distributed":
            # arguments.py: --overlap-param-gather only with the distributed optimizer.
            add("--overlap-param-gather")
    return out


def export(cfg: TargetConfig) -> str:
    """The bash snippet defining ``MEGATRON_ARGS`` for ``pretrain_gpt.py``."""
    why = allows(cfg)
    if why:
        raise ValueError(f"Megatron-LM cannot run this configuration: {why}")
    lines = [
        "# Megatron-LM pretrain_gpt.py arguments written by solver-planner (target megatron).",
        "# Use: source this file; torchrun ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" "
        "--data-path ... --tokenizer-type ...",
        f"# devices: {cfg.devices} = data {cfg.data} x tensor {cfg.tensor} x pipeline "
        f"{cfg.pipeline} x context {cfg.context}; schedule {cfg.schedule}; "
        f"{cfg.microbatches} micro-batches per iteration",
        f"# vocabulary {cfg.vocab} comes from the tokenizer (Megatron pads it to a multiple "
        f"of 128 x tensor by default)",
    ]
    if cfg.position == "rotary":
        # the spec has no rotary base (no time depends on it): said, not guessed
        lines.append("# rotary positions: add your model's --rotary-base (Megatron-LM's default is 10000;"
                     " Llama-3's is 500000) and any rope scaling")
    lines += [
        f"{_ARRAY}=(",
    ]
    for flag, value, why in _flags(cfg):
        if why:
            lines.append(f"  # {why}")
        lines.append(f"  {flag}" + ("" if value is None else f" {value}"))
    lines.append(")")
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict:
    """The flags of an exported snippet: ``{flag: value}`` (True for value-less flags).

    Refuses text that is not one ``MEGATRON_ARGS=( ... )`` array of schema flags.
    """
    body: list[str] = []
    state = "before"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if state == "before":
            if line != f"{_ARRAY}=(":
                raise ValueError(f"expected '{_ARRAY}=(', got {line!r}")
            state = "in"
        elif state == "in":
            if line == ")":
                state = "after"
            else:
                body.append(line)
        else:
            raise ValueError(f"text after the closing ')': {line!r}")
    if state != "after":
        raise ValueError(f"no complete {_ARRAY}=( ... ) array")
    tokens = shlex.split(" ".join(body))
    out: dict = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        if flag not in FLAG_SCHEMA:
            raise ValueError(f"{flag!r} is not a Megatron-LM flag this target writes")
        if flag in out:
            raise ValueError(f"{flag} given twice")
        kind = FLAG_SCHEMA[flag][0]
        if kind == "flag":
            out[flag] = True
            i += 1
            continue
        if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
            raise ValueError(f"{flag} needs a value")
        value = tokens[i + 1]
        out[flag] = int(value) if kind == "int" else value
        i += 2
    return out
