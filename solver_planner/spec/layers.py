"""Model spec sections for stage partitioning: ``layers`` (or ``transformer``) and ``training``.

Every per-layer quantity is *per sample* (one sequence, one image), so it scales with the
micro-batch size::

    layers:
      - {name: embed, flops: 0.2 GFLOP, params: 100 MiB, activations: 24 MiB}
      - {name: block, repeat: 96, flops: 7.4 TFLOP, params: 3.5 GiB, activations: 48 MiB}
    training: {global_batch: 1536, microbatches: auto, dtype: bfloat16, optimizer: adam,
               recompute: selective, optimizer_sharding: distributed, sequence_parallel: true}

or, for a GPT-style decoder, the generator of :func:`solver_planner.stages.layers.transformer_layers`::

    transformer: {layers: 96, hidden: 12288, heads: 96, sequence: 2048, vocab: 51200}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import (MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_MICROBATCHES, NAME_PATTERN, Boolean, Bytes, Duration, Flops,
                   Integer, SpecModel)

__all__ = ["LayerSpec", "TransformerSpec", "TrainingSpec", "FLOAT_DTYPES", "OPTIMIZERS", "RECOMPUTE",
           "OPTIMIZER_SHARDING", "ATTENTION", "HOST_OVERHEAD"]

FLOAT_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
OPTIMIZERS = ("adam", "sgd")
RECOMPUTE = ("none", "selective", "full", "selective-op", "auto")
OPTIMIZER_SHARDING = ("none", "zero-1", "zero-2", "zero-3", "distributed")
ATTENTION = ("flash", "materialized")
# Per iteration on the host, besides the GPU work: handing over the prefetched batch (and
# broadcasting it over the tensor group), the loss reduction and logging, the Python of the
# training loop that the GPU does not hide.  A few milliseconds in PyTorch training loops;
# 5 ms is our assumption (DistIR's Table 2 times steps without a data loader: its specs say 0).
HOST_OVERHEAD = 0.005


class LayerSpec(SpecModel):
    """One layer (or ``repeat`` identical consecutive layers); quantities per sample."""

    name: str = Field(pattern=NAME_PATTERN)
    repeat: Integer = Field(default=1, ge=1, le=MAX_LAYERS, description="identical consecutive copies of this layer")
    flops: Flops = Field(ge=0, description="forward FLOPs per sample")
    backward_flops: Flops | None = Field(default=None, ge=0, description="backward FLOPs per sample (default 2 x flops)")
    params: Bytes = Field(default=0.0, ge=0, description="parameter bytes in the training dtype")
    optimizer_state: Bytes | None = Field(
        default=None, ge=0, description="optimizer bytes (default from training.optimizer and dtype)")
    activations: Bytes = Field(ge=0, description="output activation bytes per sample, sent to the next layer")
    saved: Bytes | None = Field(
        default=None, ge=0, description="bytes per sample kept for backward, split by the tensor degree "
        "(default: the output activations)")
    saved_replicated: Bytes = Field(
        default=0.0, ge=0, description="bytes per sample kept for backward on every tensor-parallel device")
    allreduces: Integer = Field(
        default=2, ge=0, le=64, description="all-reduces of the output activation per pass when tensor-parallel "
        "(2 for a Megatron transformer block)")
    skip_to: list[str] = Field(
        default_factory=list, max_length=MAX_LAYERS, description="later layers that also read this layer's output (long skip "
        "connections, e.g. a U-Net); names of layers that are not repeated")
    weight_flops: Flops | None = Field(
        default=None, ge=0, description="part of backward_flops that computes weight gradients (default half "
        "of it); backward weight delaying (the resharding paper §4) runs it later")
    checkpoint: Bytes | None = Field(
        default=None, ge=0, description="bytes per sample kept under full recomputation (default: activations)")
    selective_saved: Bytes | None = Field(
        default=None, ge=0, description="bytes per sample kept for backward, split by the tensor degree, under "
        "selective recomputation (default: saved, i.e. nothing is recomputed)")
    selective_flops: Flops = Field(
        default=0.0, ge=0, description="forward FLOPs per sample recomputed in backward under selective "
        "recomputation")
    kernels: Integer | None = Field(
        default=None, ge=0, le=4096, description="matrix-multiply kernels of the forward pass (default 1 when "
        "flops > 0): each pays the kernel overhead and the efficiency of its size (cluster device.compute)")
    tied_to: str | None = Field(
        default=None, description="an earlier layer whose parameters this one shares (tied embeddings): a "
        "stage holding this layer without that one keeps a copy and all-reduces its gradient with it")

    @property
    def backward(self) -> float:
        """Backward FLOPs per sample: ``backward_flops``, or twice the forward's (one product
        for the input gradient and one for the weight gradient per matrix multiply)."""
        return 2 * self.flops if self.backward_flops is None else self.backward_flops


class TransformerSpec(SpecModel):
    """A decoder-only transformer: embedding, ``layers`` blocks, and the logits layer.

    The first five keys describe GPT-2/3 (Radford et al. 2019, Brown et al. 2020); the
    optional ones, whose defaults are GPT's, describe the later variants: grouped-query
    attention (``kv_heads``, Ainslie et al. 2023, "GQA"), a gated MLP (``activation:
    swiglu``, Shazeer 2020, "GLU Variants Improve Transformer", as in Llama, Touvron et al.
    2023), rotary positions (``position: rotary``, Su et al. 2021, "RoFormer"), RMSNorm
    (Zhang and Sennrich 2019) and linear layers without biases.
    """

    layers: Integer = Field(ge=1, le=MAX_LAYERS, description="transformer blocks")
    hidden: Integer = Field(ge=1, le=2**17, description="hidden size h")
    heads: Integer = Field(ge=1, le=2**14, description="attention (query) heads a; h must be a multiple of a")
    sequence: Integer = Field(ge=1, le=2**20, description="sequence length s")
    vocab: Integer = Field(ge=1, le=2**22, description="vocabulary size V")
    kv_heads: Integer | None = Field(
        default=None, ge=1, le=2**14, description="key/value heads of grouped-query attention (Ainslie et al. 2023);"
        " a must be a multiple of it (default: heads, i.e. multi-head attention)")
    ffn_hidden: Integer | None = Field(
        default=None, ge=1, le=2**20, description="inner width of the MLP (default 4 h)")
    activation: Literal["gelu", "swiglu"] = Field(
        default="gelu", description="gelu: two MLP matrices h x ffn; swiglu: a gated MLP of three (gate, up, down;"
        " Shazeer 2020, as in Llama)")
    position: Literal["learned", "rotary"] = Field(
        default="learned", description="learned: a position table in the embedding (GPT); rotary: no parameters"
        " (RoFormer, Su et al. 2021)")
    positions: Integer | None = Field(
        default=None, ge=1, le=2**20, description="rows of a learned position table (default: sequence)")
    norm: Literal["layernorm", "rmsnorm"] = Field(
        default="layernorm", description="layernorm: a scale and a bias per norm; rmsnorm: a scale only (Zhang and"
        " Sennrich 2019)")
    bias: Boolean | Literal["qkv"] = Field(
        default=True, description="biases of the linear layers: true (GPT), false (Llama), or qkv (only the query,"
        " key and value projections, Qwen2)")
    fused_qkv: Boolean = Field(
        default=True, description="the query, key and value projections run as one matrix product (Megatron-LM, "
        "torchtitan 0.3.0); false: as three (torchtitan before 0.3), which recompute: selective-op counts one by one")

    @property
    def kv(self) -> int:
        """Key/value heads (``heads`` unless grouped-query attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def ffn(self) -> int:
        """The MLP's inner width."""
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (0 with rotary positions)."""
        if self.position == "rotary":
            return 0
        return self.sequence if self.positions is None else self.positions

    def shape_issues(self) -> list[tuple[str, str]]:
        """(key, what is wrong) for shapes the per-operator model cannot split into heads."""
        out = []
        if self.hidden % self.heads:
            out.append(("heads", f"hidden {self.hidden} is not a multiple of heads {self.heads}; each head has"
                        " hidden / heads dimensions"))
        if self.heads % self.kv:
            out.append(("kv_heads", f"heads {self.heads} is not a multiple of kv_heads {self.kv}; grouped-query"
                        " attention shares each key/value head among heads / kv_heads query heads"))
        if self.positions is not None:
            if self.position == "rotary":
                out.append(("positions", "rotary positions have no table; give positions only with position:"
                            " learned"))
            elif self.positions < self.sequence:
                out.append(("positions", f"a position table of {self.positions} rows cannot embed {self.sequence}"
                            " tokens"))
        return out


class TrainingSpec(SpecModel):
    """How one iteration runs: the global batch, its split into micro-batches, dtype, optimizer."""

    global_batch: Integer = Field(ge=1, le=MAX_GLOBAL_BATCH, description="samples per iteration")
    microbatches: Integer | Literal["auto"] = Field(
        default="auto", description="micro-batches per iteration, or 'auto' to search the divisors of global_batch "
        f"(at most {MAX_MICROBATCHES})")
    dtype: Literal[tuple(FLOAT_DTYPES)] = Field(default="bfloat16", description="parameter and activation type")  # type: ignore[valid-type]
    optimizer: Literal[OPTIMIZERS] = Field(default="adam", description="adam or sgd (plain, no momentum)")  # type: ignore[valid-type]
    recompute: Literal[RECOMPUTE] = Field(  # type: ignore[valid-type]
        default="none", description="activation recomputation: none, selective (attention core, Korthikanti et "
        "al. 2022), full (each layer's input only), selective-op (torchtitan's per-operator selective "
        "checkpointing: every second matrix product and the element-wise operators; transformer models), or "
        "auto (each stage chooses among none, selective and full; under --target torchtitan among none, "
        "selective-op and full; under --target deepspeed between none and full)")
    optimizer_sharding: Literal[OPTIMIZER_SHARDING] = Field(  # type: ignore[valid-type]
        default="none", description="ZeRO stage over each stage's data-parallel replicas (Rajbhandari et al. "
        "2020): zero-1 optimizer state, zero-2 and gradients, zero-3 and parameters; distributed = Megatron's "
        "distributed optimizer (zero-1's memory)")
    sequence_parallel: Boolean = Field(
        default=False, description="split the activations tensor parallelism leaves replicated (Korthikanti et "
        "al. 2022 section 4.2.2)")
    tensor_overlap: Boolean = Field(
        default=False, description="overlap each tensor-parallel all-gather and reduce-scatter with the matrix"
        " product it feeds or drains (Megatron-LM's --tp-comm-overlap, Transformer Engine's userbuffers; needs"
        " sequence_parallel); false: they run between the products")
    tied_embeddings: Boolean = Field(
        default=True, description="transformer: the logits layer reuses the token embedding; on another stage it "
        "keeps a copy whose gradient is all-reduced with the first stage's")
    gradient_overlap: Boolean = Field(
        default=True, description="reduce each layer's gradients while backward goes on (DDP buckets); false: "
        "after the stage's last backward")
    attention: Literal[ATTENTION] = Field(  # type: ignore[valid-type]
        default="flash", description="transformer: how attention runs: flash (one fused kernel, Dao et al. 2022;"
        " causal, so about half the score FLOPs run) or materialized (the scores written to memory, softmax and"
        " dropout over them, two batched products: Megatron-LM before FlashAttention)")
    gradient_clipping: Boolean = Field(
        default=True, description="clip gradients by their global norm (Megatron-LM's default, clip 1.0): the"
        " optimizer step first reads every gradient for the norm")
    gradient_accumulation: Literal["add", "fused"] = Field(
        default="add", description="with several micro-batches, how each micro-batch's weight gradients join"
        " the iteration's: add (an element-wise pass over the gradient buffer per micro-batch, as PyTorch"
        " autograd, DDP, FSDP, torchtitan, DeepSpeed, DistIR and Megatron-LM without fusion do) or fused (no"
        " pass of their own: Megatron-LM's gradient accumulation fusion, where the weight-gradient product"
        " accumulates in place)")
    gradient_reduce_dtype: Literal[tuple(FLOAT_DTYPES)] | None = Field(  # type: ignore[valid-type]
        default=None, description="the type gradients are reduced in across data-parallel replicas (default: the "
        "training dtype; for bfloat16 models under --target torchtitan or megatron float32, as those frameworks "
        "reduce by default)")
    host_overhead: Duration = Field(
        default=HOST_OVERHEAD, ge=0, le=3600, description="seconds per iteration on the host besides the GPU work"
        " (data loading, logging); default 5 ms")
    gradient_bucket: Bytes = Field(
        default=25 * 2**20, ge=1, description="largest gradient bucket reduced at once (PyTorch DDP's default "
        "bucket_cap_mb, 25 MiB); a layer's gradients are cut into buckets of this size")

    @field_validator("gradient_bucket")
    @classmethod
    def _whole_bytes(cls, value: float) -> float:
        # a bucket holds whole bytes (a 400.5 B bucket was priced and certified)
        if value != int(value):
            raise ValueError(f"a bucket holds whole bytes, got {value:g} B")
        return value
