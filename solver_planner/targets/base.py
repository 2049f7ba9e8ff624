"""What a framework target needs to know of a plan: one flat, framework-neutral record.

A target (torchtitan, Megatron-LM, DeepSpeed) restricts the stage search to the plans that
framework runs, and writes the chosen plan in the framework's own configuration language.
The search fills a :class:`TargetConfig` from its best plan; each target module turns it
into that framework's configuration (``export``) and reads it back for ``check``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["TargetConfig", "TARGETS", "SCHEDULE_NAMES"]

# The targets ``--target`` accepts; ``native`` is the planner's own, unrestricted space.
TARGETS = ("native", "torchtitan", "megatron", "deepspeed")

# Our schedule names (solver_planner.stages.schedule): GPipe, 1F1B, interleaved 1F1B with
# ``virtual_stages`` model chunks per device, and the zero-bubble family (Qi et al. 2024).
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v")


@dataclass(frozen=True)
class TargetConfig:
    """One training configuration, in the terms the frameworks share.

    Model: a decoder-only transformer.  ``kv_heads`` < ``heads`` is grouped-query attention;
    ``activation`` is ``gelu`` (GPT: two MLP matrices of ``ffn_hidden``) or ``swiglu``
    (Llama: three).  Parallelism: ``data * tensor * pipeline * context`` devices;
    ``virtual_stages`` model chunks per pipeline rank (interleaved schedules; 2 for ZB-V);
    ``layers_per_chunk`` the transformer blocks of each model chunk in pipeline order
    (``pipeline * virtual_stages`` entries; the embedding sits with the first chunk, the
    logits with the last).  ``optimizer_sharding`` as in the model spec's training section:
    ``none``, ``zero-1``, ``zero-2``, ``zero-3`` or ``distributed`` (Megatron's distributed
    optimizer).  ``recompute``: ``none``, ``selective``, ``full`` or ``selective-op``.
    """

    target: str
    # model
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    sequence: int
    vocab: int
    tied_embeddings: bool
    activation: str                      # "gelu" | "swiglu"
    # training
    global_batch: int
    micro_batch_size: int                # samples per micro-batch on one data-parallel replica
    dtype: str                           # "bfloat16" | "float16" | "float32"
    optimizer: str                       # "adam" | "sgd"
    # parallelism
    data: int
    tensor: int
    pipeline: int
    context: int = 1
    virtual_stages: int = 1
    schedule: str = "1f1b"
    layers_per_chunk: tuple[int, ...] = ()
    sequence_parallel: bool = False
    recompute: str = "none"
    optimizer_sharding: str = "none"
    gradient_overlap: bool = True
    gradient_accumulation: str = "add"     # "add" | "fused" (training.gradient_accumulation)
    gradient_reduce_dtype: str = ""        # the data-parallel reduction's type ("": the training dtype)
    tensor_overlap: bool = False           # TP collectives beside their products (training.tensor_overlap)
    gradient_bucket: int = 0               # parameters per gradient bucket the spec sets (0: the framework's)
    # model, as far as a framework's recomputation reads it
    bias: bool | str = False               # linear biases: True, False or "qkv" (transformer.bias)
    fused_qkv: bool = True                 # one QKV product (transformer.fused_qkv)
    position: str = "rotary"               # "rotary" | "learned" (transformer.position)
    norm: str = "rmsnorm"                  # "rmsnorm" | "layernorm" (transformer.norm)

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline * self.context

    @property
    def microbatches(self) -> int:
        """Micro-batches each pipeline runs per iteration."""
        return self.global_batch // (self.data * self.micro_batch_size)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layers_per_chunk"] = list(self.layers_per_chunk)
        return d
