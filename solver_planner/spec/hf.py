"""Hugging Face ``config.json`` files as model specs.

A model is given wherever a model spec goes (``validate``, ``stages``, ``plan``, ``show``,
...) in one of two ways:

* a bare ``config.json`` (any file whose name ends in ``.json``, or a mapping with a
  ``model_type`` key): the shape comes from the config and the training settings are the
  defaults below;
* a YAML model spec that names the config, relative to the YAML file, and gives the
  training settings (and optionally ``sequence``, parallelism axes, ...)::

      name: llama-3-8b            # optional: the config's name by default
      hf_config: llama-3-8b.json
      sequence: 8192              # optional: see "Sequence length"
      training: {global_batch: 512, recompute: selective}

  ``hf_config`` replaces ``transformer`` / ``layers``; ``training.tied_embeddings`` follows
  the config's ``tie_word_embeddings`` (giving the other value is an error).

The JSON is parsed here, with the standard library, rather than through transformers'
``AutoConfig``: the planner needs eight numbers and a few flags, transformers is a large
optional dependency (seconds to import, and a version of it per model family), and
``AutoConfig`` would fill missing keys with its class defaults (a Llama-7B's shape) where a
spec error naming the missing key is what a user needs.  The file is read from disk only,
never downloaded.

Supported ``model_type`` values and how they map onto
:class:`~solver_planner.spec.layers.TransformerSpec`:

* ``llama``, ``mistral``, ``qwen2``: ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``num_key_value_heads`` (grouped-query attention; default: the
  heads), ``intermediate_size`` (SwiGLU MLP), ``vocab_size``, ``max_position_embeddings``;
  rotary positions, RMSNorm; no biases (Llama's ``attention_bias`` and ``mlp_bias``, both
  true, give biases everywhere), except Qwen2's query, key and value biases; untied unless
  ``tie_word_embeddings``;
* ``gpt2``: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions`` (or ``n_ctx``),
  ``vocab_size``, ``n_inner`` (default 4 h); learned positions, LayerNorm, GELU, biases,
  tied unless ``tie_word_embeddings: false``;
* ``gpt_neox``: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``; rotary positions
  (``rotary_pct`` changes no count), LayerNorm, GELU, biases; the parallel attention and
  MLP of GPT-NeoX (Black et al. 2022) change no count either; untied unless
  ``tie_word_embeddings``.

Mixture-of-experts configs (``mixtral``, or any config with ``num_local_experts`` /
``num_experts`` above 1) are refused: experts are not modelled yet.  An explicit
``head_dim`` other than ``hidden_size / num_attention_heads`` is refused too (the
per-operator model splits the hidden size into the heads).

Sequence length: ``sequence`` from the YAML, else ``min(max_position_embeddings, 4096)``
(:data:`DEFAULT_MAX_SEQUENCE`): a model's longest context (128k for some) is rarely the
sequence it is pre-trained at, and a quadratic attention core at 128k tokens would price a
different job.

Default training settings of a bare config (:func:`default_training`): bfloat16, Adam,
``recompute: auto`` (each stage chooses), ``microbatches: auto``, and a global batch of
about 4M tokens, ``max(1, 2**22 // sequence)`` sequences (the batch of Llama 2, Touvron et
al. 2023 §2.2: 1024 sequences of 4096), at most the spec limit of 2**20 sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import SpecError, SpecIssue
from .base import MAX_GLOBAL_BATCH, _message, first_issues
from .layers import TrainingSpec, TransformerSpec
from .source import Source, load_yaml

__all__ = ["HFConfig", "SUPPORTED_TYPES", "DEFAULT_MAX_SEQUENCE", "TOKENS_PER_BATCH", "read_hf_config",
           "default_sequence", "default_training", "is_hf_config"]

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")
DEFAULT_MAX_SEQUENCE = 4096
TOKENS_PER_BATCH = 2**22
_EXPERT_TYPES = ("mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3", "dbrx", "jamba", "olmoe", "phimoe")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")

# TransformerSpec field -> the config key it comes from, per family.
_LLAMA_KEYS = {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size", "vocab": "vocab_size",
               "positions": "max_position_embeddings"}
_KEYS = {
    "llama": _LLAMA_KEYS, "mistral": _LLAMA_KEYS, "qwen2": _LLAMA_KEYS,
    "gpt2": {"hidden": "n_embd", "layers": "n_layer", "heads": "n_head", "ffn_hidden": "n_inner",
             "vocab": "vocab_size", "positions": "n_positions"},
    "gpt_neox": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                 "ffn_hidden": "intermediate_size", "vocab": "vocab_size", "positions": "max_position_embeddings"},
}
# Config keys that may be left out or null: the transformers classes default them to the
# attention heads (multi-head attention) and to 4 x n_embd.
_OPTIONAL = {"num_key_value_heads", "n_inner"}
_TIED_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "gpt2": True, "gpt_neox": False}


@dataclass(frozen=True)
class HFConfig:
    """What the planner takes from a ``config.json``: the shape (TransformerSpec fields
    without ``sequence``), the longest context, and whether the logits are tied."""

    name: str
    model_type: str
    shape: dict[str, Any]
    max_positions: int
    tied: bool
    source: Source

    def transformer(self, sequence: int) -> TransformerSpec:
        """The :class:`TransformerSpec` at ``sequence`` tokens; errors name the config's keys."""
        data = dict(self.shape, sequence=sequence)
        if self.shape["position"] == "rotary":
            data.pop("positions")      # rotary: no table; the context length is not a parameter count
        keys = _KEYS[self.model_type]
        try:
            spec = TransformerSpec.model_validate(data)
        except ValidationError as exc:
            issues = []
            for err in exc.errors(include_url=False):
                field = str(err["loc"][0]) if err["loc"] else ""
                key = keys.get(field, field)
                issues.append(self.source.issue((key,), _message(err)))
            raise SpecError(first_issues(issues)) from None
        problems = spec.shape_issues()
        if problems:
            raise SpecError(first_issues([self.source.issue((keys.get(field, field),), what)
                                          for field, what in problems]))
        return spec


def is_hf_config(path: str | Path, data: Any) -> bool:
    """A file ending in ``.json``, or a mapping with ``model_type``, is a Hugging Face config."""
    return str(path).lower().endswith(".json") or (isinstance(data, dict) and "model_type" in data)


def default_sequence(max_positions: int) -> int:
    """The training sequence when the spec gives none (see the module docstring)."""
    return min(max_positions, DEFAULT_MAX_SEQUENCE)


def default_training(sequence: int, tied: bool) -> TrainingSpec:
    """Training settings of a bare ``config.json`` (see the module docstring)."""
    # a tiny sequence would ask for more sequences than a spec accepts: the limit caps it
    return TrainingSpec(global_batch=min(MAX_GLOBAL_BATCH, max(1, TOKENS_PER_BATCH // sequence)), recompute="auto",
                        tied_embeddings=tied)


def _name(path: Path, data: dict) -> str:
    given = data.get("_name_or_path")
    if isinstance(given, str) and given.strip() and len(given) <= 200:
        return given.strip()
    # "Meta-Llama-3-8B/config.json" is named by its folder
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def _integer(source: Source, data: dict, key: str, optional: bool) -> int | None:
    if key not in data or data[key] is None:
        if optional:
            return None
        raise source.error((key,), "missing required key (the planner does not guess a model's shape)")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise source.error((key,), f"expected an integer, got {value!r:.60}")
    if value < 1:
        raise source.error((key,), f"expected an integer >= 1, got {value}")
    return value


def _flag(source: Source, data: dict, key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise source.error((key,), f"expected true or false, got {value!r:.60}")
    return value


def _refuse_experts(source: Source, data: dict, model_type: Any) -> None:
    for key in _EXPERT_KEYS:
        value = data.get(key)
        if value is not None and value not in (0, 1):
            raise source.error((key,), f"a mixture-of-experts model ({key}: {value!r:.20}); experts are not modelled"
                               " yet: only dense decoders (" + ", ".join(SUPPORTED_TYPES) + ") can be planned")
    if model_type in _EXPERT_TYPES:
        raise source.error(("model_type",), f"'{model_type}' is a mixture-of-experts model; experts are not modelled"
                           " yet: only dense decoders (" + ", ".join(SUPPORTED_TYPES) + ") can be planned")


def _bias(source: Source, data: dict, model_type: str) -> bool | str:
    if model_type == "qwen2":
        return "qkv"                # Qwen2Attention: q, k, v projections with biases, o without
    if model_type == "mistral":
        return False
    if model_type == "gpt2":
        return True
    if model_type == "gpt_neox":
        if not _flag(source, data, "attention_bias", True):
            raise source.error(("attention_bias",), "attention without biases but an MLP with them is not modelled:"
                               " biases are on every linear layer, none, or the query, key and value only")
        return True
    attention = _flag(source, data, "attention_bias", False)
    mlp = _flag(source, data, "mlp_bias", False)
    if attention != mlp:
        key = "attention_bias" if attention else "mlp_bias"
        raise source.error((key,), "biases on the attention but not the MLP (or the reverse) are not modelled:"
                           " biases are on every linear layer, none, or the query, key and value only")
    return attention


def read_hf_config(path: str | Path, text: str | None = None) -> HFConfig:
    """Read a Hugging Face ``config.json`` (never from the network); :class:`SpecError`
    naming the file, line and key on anything the planner cannot model."""
    path = Path(path)
    data, source = load_yaml(path, text)      # a .json name is read as JSON
    if not isinstance(data, dict):
        raise SpecError(SpecIssue(source.file, source.line(()), "", "expected a Hugging Face config: a JSON object"
                                  f" of keys to values, got {type(data).__name__}"))
    model_type = data.get("model_type")
    _refuse_experts(source, data, model_type)
    if model_type is None:
        raise source.error(("model_type",), "missing required key: the Hugging Face model type, one of: "
                           + ", ".join(SUPPORTED_TYPES))
    if model_type not in SUPPORTED_TYPES:
        raise source.error(("model_type",), f"unsupported model_type {model_type!r:.60}; supported: "
                           + ", ".join(SUPPORTED_TYPES))
    keys = _KEYS[model_type]
    shape: dict[str, Any] = {}
    if model_type == "gpt2" and "n_positions" not in data and "n_ctx" in data:
        keys = dict(keys, positions="n_ctx")      # older GPT-2 configs name the context n_ctx
    for field, key in keys.items():
        value = _integer(source, data, key, key in _OPTIONAL)
        if value is not None:
            shape[field] = value
    if model_type in ("llama", "mistral", "qwen2"):
        head_dim = data.get("head_dim")
        if head_dim is not None and head_dim != shape["hidden"] // shape["heads"]:
            raise source.error(("head_dim",), f"head_dim {head_dim!r:.20} is not hidden_size / num_attention_heads"
                               f" = {shape['hidden'] // shape['heads']}; the planner splits the hidden size into"
                               " the heads")
        shape.update(activation="swiglu", position="rotary", norm="rmsnorm")
    elif model_type == "gpt2":
        shape.update(activation="gelu", position="learned", norm="layernorm")
    else:
        shape.update(activation="gelu", position="rotary", norm="layernorm")
    shape["bias"] = _bias(source, data, model_type)
    tied = _flag(source, data, "tie_word_embeddings", _TIED_DEFAULT[model_type])
    return HFConfig(_name(path, data), model_type, shape, shape["positions"], tied, source)
