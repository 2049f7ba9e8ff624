"""Parameter and FLOP counts of a model spec: what ``solver-planner show`` prints.

For ``transformer:`` specs the counts are exact integers from the shape (the layer model,
:func:`solver_planner.stages.layers.transformer_layers`, takes its per-layer numbers from
:func:`transformer_counts`).  Per block, with hidden size ``h``, ``a`` heads of ``d = h / a``
dimensions, ``g`` key/value heads and MLP width ``f``:

* attention weights ``h (a d) + 2 h (g d) + (a d) h``: the query and output projections are
  ``h x h`` and the key and value projections ``h x g d`` (grouped-query attention,
  Ainslie et al. 2023; ``g = a`` is multi-head attention, giving GPT's ``4 h^2``);
* MLP weights ``2 h f`` (GELU) or ``3 h f`` (SwiGLU's gate, up and down matrices; Shazeer
  2020, Llama: Touvron et al. 2023); GPT's ``f = 4 h`` gives ``8 h^2``;
* biases (``bias: true``): the query, key and value projections ``h + 2 g d``, the output
  projection ``h``, the MLP's first matrices ``f`` (GELU) or ``2 f`` (SwiGLU) and its last
  ``h``; ``bias: qkv`` only the first term (Qwen2); GPT: ``9 h``;
* two norms per block and one after the last block: LayerNorm ``2 h`` each (scale and
  bias), RMSNorm ``h`` (scale only). GPT's block total is ``12 h^2 + 13 h`` (Narayanan et
  al. 2021 §5.1 count ``12 h^2`` and leave the small terms out).

The embedding holds the token table ``V h`` and a learned position table (``positions x
h``; none with rotary positions, Su et al. 2021).  The logits table ``V h`` is counted once
when tied to the token table.  The layer model leaves the final norm out (``h`` or ``2 h``
parameters, below a millionth of any model here); :attr:`TransformerCounts.parameters`
includes it, so it matches published totals (GPT-2 XL 1 557 611 200, Llama-3-8B
8 030 261 248).

Forward FLOPs per sample of ``s`` tokens count 2 FLOPs per multiply-add of the matrix
products: ``2 s`` times the block's weights, plus the attention core ``4 s^2 a d = 4 s^2 h``
(scores and context; grouped-query attention shares keys and values but every query head
still computes its scores), plus the logits ``2 s h V``.  Biases, norms, activations,
softmax and rotary embeddings are left out (a fraction of a percent), as in Narayanan et
al. 2021 §5.1, whose ``24 s h^2 + 4 s^2 h`` per GPT block this reproduces.

For ``layers:`` specs the counts are the sums of the per-layer figures: parameters are the
parameter bytes over the training dtype's bytes (a layer ``tied_to`` another shares its
parameters, so they are counted once).
"""

from __future__ import annotations

from dataclasses import dataclass

from .layers import FLOAT_DTYPES, TransformerSpec

__all__ = ["TransformerCounts", "transformer_counts", "model_counts"]


@dataclass(frozen=True)
class TransformerCounts:
    """Exact parameter counts and forward FLOPs per sample of a :class:`TransformerSpec`."""

    layers: int
    embedding: int          # token table + learned position table
    block: int              # parameters of one block (weights, biases, norms)
    block_weights: int      # the weights of its matrix multiplies: 2 FLOPs per weight per token
    final_norm: int
    logits: int             # the logits table when not tied, else 0
    tied: bool
    block_flops: float      # forward, per sample
    logits_flops: float

    @property
    def parameters(self) -> int:
        """Unique parameters (a tied logits table once)."""
        return self.embedding + self.layers * self.block + self.final_norm + self.logits

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs per sample (the embedding lookup costs none)."""
        return self.layers * self.block_flops + self.logits_flops


def transformer_counts(t: TransformerSpec, tied: bool = True) -> TransformerCounts:
    """Parameters and forward FLOPs of ``t`` (see the module docstring for the rules)."""
    s, h, a, g, f, v = t.sequence, t.hidden, t.heads, t.kv, t.ffn, t.vocab
    # d = h / a for a valid spec; the products below use a d = h and g d = g h / a so that a
    # spec refused for h % a only later (TransformerSpec.shape_issues) still gets numbers.
    kv_width = g * h // a
    attention = 2 * h * h + 2 * h * kv_width
    mlp = (3 if t.activation == "swiglu" else 2) * h * f
    weights = attention + mlp
    qkv_bias = h + 2 * kv_width
    if t.bias is True:
        biases = qkv_bias + h + (2 * f if t.activation == "swiglu" else f) + h
    elif t.bias == "qkv":
        biases = qkv_bias
    else:
        biases = 0
    norm = 2 * h if t.norm == "layernorm" else h
    block = weights + biases + 2 * norm
    embedding = v * h + t.position_rows * h
    block_flops = 2.0 * s * weights + 4.0 * s * s * h
    return TransformerCounts(layers=t.layers, embedding=embedding, block=block, block_weights=weights,
                             final_norm=norm, logits=0 if tied else v * h, tied=tied, block_flops=block_flops,
                             logits_flops=2.0 * s * h * v)


def model_counts(spec) -> dict:
    """What ``show`` prints about a model spec (a :class:`~solver_planner.spec.model.ModelSpec`):
    ``parameters`` (unique) and ``flops_per_sample`` (forward), the shape, and the training
    settings.  Raises :class:`SpecError` when the spec has no layer model."""
    training = spec.training
    out: dict = {"name": spec.name, "file": spec.source.file}
    if spec.hf_config is not None:
        out["hf_config"] = spec.hf_config
    if spec.transformer is not None:
        t = spec.transformer
        tied = training is None or training.tied_embeddings
        c = transformer_counts(t, tied)
        out.update({
            "kind": "transformer", "parameters": c.parameters, "flops_per_sample": c.flops_per_sample,
            "layers": t.layers, "hidden": t.hidden, "heads": t.heads, "kv_heads": t.kv, "ffn_hidden": t.ffn,
            "vocab": t.vocab, "sequence": t.sequence, "tied_embeddings": tied, "activation": t.activation,
            "position": t.position, "norm": t.norm, "bias": t.bias, "fused_qkv": t.fused_qkv,
            "parameters_per_block": c.block, "embedding_parameters": c.embedding,
            "flops_per_token": c.flops_per_sample / t.sequence,
        })
    elif spec.layers:
        size = FLOAT_DTYPES[training.dtype] if training is not None else 2
        # a layer tied_to another holds a copy of its weights: counted once, with the original
        params = sum(layer.params * layer.repeat for layer in spec.layers if layer.tied_to is None) / size
        out.update({
            "kind": "layers", "parameters": int(round(params)),
            "flops_per_sample": float(sum(layer.flops * layer.repeat for layer in spec.layers)),
            "layers": sum(layer.repeat for layer in spec.layers), "dtype_bytes": size,
        })
    else:
        raise spec.source.error((), "no layer model to count: give 'layers', 'transformer' or 'hf_config'")
    if training is not None:
        out["training"] = training.model_dump()
    return out
