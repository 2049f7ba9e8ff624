"""torchtitan target: the plans torchtitan 0.3.0 runs, written as its command-line overrides.

torchtitan 0.3.0 reads no TOML job file: ``torchtitan/config/manager.py`` (``ConfigManager``)
takes ``--module M --config F`` (F a function of ``torchtitan.models.M.config_registry`` that
returns a ``Trainer.Config``) and then tyro overrides ``--section.key value``; activation
checkpointing is a tyro subcommand (``activation-checkpoint:none|selective|full``); its
``selective`` is per-operator checkpointing (``SelectiveAC``: every second matrix product and
the element-wise operators re-run), our ``selective-op``, not the attention core that our
(Megatron-LM's) ``selective`` re-runs.
The export is those arguments, one per line, for ``torchrun ... -m torchtitan.train
$(cat torchtitan.args)``; ``parse`` reads them back.

Model dimensions cannot be overridden: ``Trainer.Config.model_spec`` is annotated
``tyro.conf.Suppress`` ("always set programmatically by the model registry"), so only the
registry's models exist.  A plan whose model is not one of them is refused, naming the nearest
registry model, rather than exported with the wrong model.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .base import TargetConfig
from .rules import TargetRules, chunk_layers, refusal, tensor_splits

__all__ = ["RULES", "FLAVORS", "SCHEDULES", "Flavor", "allows", "export", "parse", "argv",
           "flavor_for", "model_parts"]


@dataclass(frozen=True)
class Flavor:
    """One ``torchtitan.models.llama3.config_registry`` function and the model it builds."""

    config: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    tied_embeddings: bool
    max_sequence: int          # RoPE cache length (ComplexRoPE max_seq_len)
    note: str = ""


# Read from torchtitan 0.3.0 torchtitan/models/llama3/__init__.py (model_registry flavors "8B",
# "70B", "405B") and config_registry.py; tests compare this table with the installed package.
# The registry has 1B/3B flavors too, but no config_registry function for them.
FLAVORS: tuple[Flavor, ...] = (
    Flavor("llama3_8b", 32, 4096, 32, 8, 14336, 128256, False, 131072),
    Flavor("llama3_70b", 80, 8192, 64, 8, 28672, 128256, False, 131072),
    Flavor("llama3_405b", 126, 16384, 128, 8, 53248, 128256, False, 131072,
           note="its registry config adds float8 linears (needs torchao) and torch.compile "
                "with async TP"),
)

# Our schedule names -> torch.distributed.pipelining.schedules.get_schedule_class names.
# ZB-H1 is torch's ScheduleInterleavedZeroBubble ("implementing the ZB1P schedule" of Qi et
# al.), a multi-stage schedule; ZB-V is ScheduleZBVZeroBubble (two chunks per rank, V order).
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "zb-h1": "InterleavedZeroBubble",
    "zb-v": "ZBVZeroBubble",
}

RULES = TargetRules(
    target="torchtitan",
    schedules=frozenset(SCHEDULES),
    virtual_stages=True,
    context_parallel=True,
    sequence_parallel=True,
    # distributed/activation_checkpoint.py: the subcommands none, full and selective
    # (SelectiveAC, per operator: our selective-op); no attention-core granularity
    recompute=frozenset({"none", "selective-op", "full"}),
    # FSDP2 fully_shard over data_parallel_shard_degree: reshard after forward = ZeRO-3;
    # no reshard after forward keeps parameters unsharded through backward, the ZeRO-2
    # memory (torch fully_shard docs, reshard_after_forward).  "none" replicates
    # (data_parallel_replicate_degree).  HSDP (both degrees > 1) has no TargetConfig field.
    optimizer_sharding=frozenset({"none", "zero-2", "zero-3"}),
    # TrainingConfig.mixed_precision_param is bfloat16 | float32 (no float16).
    dtypes=frozenset({"bfloat16", "float32"}),
    activations=frozenset({"swiglu"}),
    optimizers=frozenset({"adam"}),      # the registry configs use default_adamw
    layer_split=("any split, written as parallelism.module_fqns_per_model_part (also: "
                 "pipeline_parallel_layers_per_stage and first/last_stage_less_layers)"),
    microbatch_rule=("local_batch_size % pipeline_parallel_microbatch_size == 0; global batch "
                     "% (local batch x data) == 0"),
    # config/configs.py: mixed_precision_reduce: Literal["float32"] = "float32", FSDP2's reduce_dtype
    gradient_reduce=frozenset({("bfloat16", "float32"), ("float32", "float32")}),
    reduce_default=frozenset({("bfloat16", "float32")}),
    # torchtitan leaves FSDP2's backward flags as torch's PipelineStage sets them (trainer.py
    # runs each micro-batch's backward with gradient sync on; pipelining turns it off)
    fsdp2_defaults=True,
    # FSDP2's mixed precision (always on, data-parallel replicas included) keeps the gradients
    # of its fp32 parameters in fp32: a bf16 model's are 4 bytes a parameter, whole or sharded
    buffer_in_reduce_type=True,
    source="torchtitan 0.3.0 torchtitan/config/{manager,configs}.py, trainer.py, "
           "distributed/pipeline_parallel.py",
)

# model chunks per rank torch's pipeline runtime keeps unsharded under FSDP2 (schedules.py
# _PipelineScheduleRuntime._add_unshard_reshard: max_active_stages)
_ACTIVE_CHUNKS = 3

# our recompute modes -> torchtitan's activation-checkpoint subcommands
AC_SUBCOMMANDS = {"none": "none", "selective-op": "selective", "full": "full"}

_DIMS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "tied_embeddings")


def flavor_for(cfg: TargetConfig) -> tuple[Flavor | None, str]:
    """The registry model ``cfg`` is, or None and the nearest one with how it differs."""
    def diffs(f: Flavor) -> list[str]:
        return [f"{d} {getattr(cfg, d)} vs {getattr(f, d)}" for d in _DIMS
                if getattr(cfg, d) != getattr(f, d)]

    ranked = sorted(FLAVORS, key=lambda f: (len(diffs(f)), abs(f.hidden - cfg.hidden)))
    best = ranked[0]
    if not diffs(best):
        return best, ""
    return None, f"nearest {best.config} differs in {', '.join(diffs(best))}"


def model_parts(cfg: TargetConfig) -> list[list[str]]:
    """``module_fqns_per_model_part``: the module names of each model chunk, pipeline order.

    Names as torchtitan's Llama3Model has them (``tok_embeddings``, ``layers.i``, ``norm``,
    ``lm_head``; see ``_generate_llm_fqn_per_model_part``).
    """
    split, why = chunk_layers(cfg)
    if why:
        raise ValueError(why)
    parts, first = [], 0
    for c, k in enumerate(split):
        part = ["tok_embeddings"] if c == 0 else []
        part += [f"layers.{i}" for i in range(first, first + k)]
        first += k
        if c == len(split) - 1:
            part += ["norm", "lm_head"]
        parts.append(part)
    return parts


def allows(cfg: TargetConfig) -> str | None:
    """None if torchtitan 0.3.0 runs ``cfg``, else the reason in one line."""
    if cfg.activation != "swiglu":
        return (f"torchtitan builds only its registry models (Llama-3, SwiGLU); a "
                f"{cfg.activation} model cannot be expressed")
    why = refusal(RULES, cfg)
    if why:
        return why
    if cfg.gradient_accumulation == "fused" and cfg.microbatches > 1:
        # the plan priced no pass for it; torchtitan runs one
        return ("torchtitan adds each micro-batch's weight gradients through autograd; fused accumulation"
                " (training.gradient_accumulation: fused) is Megatron-LM's")
    # every way the model differs from what torchtitan builds, in one message: a user who
    # fixes the spec from it should not meet the next difference on the next run
    flavor, how = flavor_for(cfg)
    model = []
    if flavor is None:
        model.append("torchtitan 0.3.0 takes model dimensions only from its config registry "
                     f"(model_spec is not a command-line option); {how}")
    if cfg.bias is not False:
        model.append("torchtitan's Llama has no linear biases; the plan's model has them (transformer.bias)")
    if (cfg.position, cfg.norm) != ("rotary", "rmsnorm"):
        model.append(f"torchtitan's Llama has rotary positions and RMSNorm; the plan's model has {cfg.position}"
                     f" positions and {cfg.norm} (transformer.position, transformer.norm)")
    if model:
        return "; ".join(model)
    if cfg.recompute == "selective-op":
        # SelectiveAC counts mm/linear calls: how many products a block runs decides which it re-runs
        if not cfg.fused_qkv:
            return ("torchtitan 0.3.0's Llama runs query, key and value as one product (fuse_qkv), which"
                    " selective-op counts once; the plan priced three (transformer.fused_qkv: false)")
        if flavor.config == "llama3_405b":
            return ("llama3_405b's registry config runs Float8 linears (_scaled_mm), which SelectiveAC keeps"
                    " without counting: selective-op would be priced wrong; use none or full")
    if cfg.sequence > flavor.max_sequence:
        return f"sequence {cfg.sequence} exceeds the RoPE cache of {flavor.max_sequence}"
    if cfg.optimizer_sharding != "none" and cfg.data > 1 and cfg.pipeline > 1 and cfg.virtual_stages > _ACTIVE_CHUNKS:
        # torch's pipeline runtime (schedules.py _add_unshard_reshard, max_active_stages=3)
        # keeps at most three model chunks of a rank gathered and reshards and re-gathers the
        # others around every action: hundreds of all-gathers a step the plan cannot price
        return (f"with FSDP2 and more than {_ACTIVE_CHUNKS} model chunks per pipeline rank torch's runtime"
                f" re-gathers the inactive chunks' parameters around every action ({cfg.virtual_stages} chunks"
                " here); use at most 3 chunks per rank, or no optimizer sharding")
    if cfg.schedule == "zb-h1" and cfg.virtual_stages < 2:
        # _get_pipeline_metadata: multi-stage schedules need >= 2 stages per rank.
        return ("torchtitan's zb-h1 is torch's InterleavedZeroBubble, a multi-stage schedule: "
                "it needs at least 2 model chunks per pipeline rank")
    return tensor_splits(cfg)


def _args(cfg: TargetConfig, flavor: Flavor) -> list[tuple[str, ...]]:
    """The arguments, grouped one option (with its values) per tuple."""
    out: list[tuple[str, ...]] = [("--module", "llama3"), ("--config", flavor.config)]
    add = lambda *a: out.append(tuple(str(x) for x in a))  # noqa: E731
    add("--training.seq_len", cfg.sequence)
    if cfg.pipeline > 1:
        # The pipeline runs all micro-batches of a data-parallel rank in one step
        # (_build_pipeline_schedule: n_microbatches = local_batch_size // microbatch size).
        add("--training.local_batch_size", cfg.microbatches * cfg.micro_batch_size)
        add("--parallelism.pipeline_parallel_microbatch_size", cfg.micro_batch_size)
    else:
        # Without a pipeline, micro-batches are gradient-accumulation steps
        # (trainer.py: global_batch_size // (local_batch_size * dp degree)).
        add("--training.local_batch_size", cfg.micro_batch_size)
    add("--training.global_batch_size", cfg.global_batch)
    add("--training.mixed_precision_param", cfg.dtype)
    if cfg.optimizer_sharding == "none":
        add("--parallelism.data_parallel_replicate_degree", cfg.data)
        add("--parallelism.data_parallel_shard_degree", 1)
    else:
        add("--parallelism.data_parallel_replicate_degree", 1)
        add("--parallelism.data_parallel_shard_degree", cfg.data)
        add("--parallelism.fsdp_reshard_after_forward",
            "always" if cfg.optimizer_sharding == "zero-3" else "never")
    add("--parallelism.tensor_parallel_degree", cfg.tensor)
    if cfg.tensor > 1:
        add("--parallelism.enable_sequence_parallel" if cfg.sequence_parallel
            else "--parallelism.no_enable_sequence_parallel")
    add("--parallelism.context_parallel_degree", cfg.context)
    add("--parallelism.pipeline_parallel_degree", cfg.pipeline)
    if cfg.pipeline > 1:
        add("--parallelism.pipeline_parallel_schedule", SCHEDULES[cfg.schedule])
        out.append(("--parallelism.module_fqns_per_model_part",
                    *(",".join(part) for part in model_parts(cfg))))
        # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline
        # parallelism yet. Set --training.disable_cuda_graphs."
        add("--training.disable_cuda_graphs")
    # tyro subcommand, last: its options would otherwise bind to the subparser.
    add(f"activation-checkpoint:{AC_SUBCOMMANDS[cfg.recompute]}")
    return out


def export(cfg: TargetConfig) -> str:
    """The torchtitan arguments, one option per line (``$(cat file)`` splits them)."""
    why = allows(cfg)
    if why:
        raise ValueError(f"torchtitan cannot run this configuration: {why}")
    flavor, _ = flavor_for(cfg)
    return "\n".join(" ".join(shlex.quote(a) for a in opt) for opt in _args(cfg, flavor)) + "\n"


def argv(text: str) -> list[str]:
    """The argument list of an exported file, as ``ConfigManager().parse_args`` takes it."""
    return shlex.split(text)


def parse(text: str) -> dict:
    """``{option: value}`` of an exported file: ints as int, value-less flags True, the
    model-part list as a list of lists, the activation-checkpoint subcommand under
    ``"activation-checkpoint"``."""
    out: dict = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        words = shlex.split(line)
        key, values = words[0], words[1:]
        if key.startswith("activation-checkpoint:") and not values:
            name, value = "activation-checkpoint", key.split(":", 1)[1]
        elif not key.startswith("--"):
            raise ValueError(f"not a torchtitan option: {line!r}")
        elif key == "--parallelism.module_fqns_per_model_part":
            name, value = key, [v.split(",") for v in values]
        elif not values:
            name, value = key, True
        elif len(values) == 1:
            name = key
            value = int(values[0]) if values[0].lstrip("-").isdigit() else values[0]
        else:
            raise ValueError(f"{key} takes one value, got {values}")
        if name in out:
            raise ValueError(f"{name} given twice")
        out[name] = value
    return out
