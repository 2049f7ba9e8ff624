"""JSON Schemas of the specs (for editors), and telling a cluster spec from a model spec."""

from __future__ import annotations

from typing import Any

from .cluster import ClusterSpec
from .model import ModelSpec

__all__ = ["json_schema", "spec_kind", "deciding_key", "SCHEMAS"]

SCHEMAS = {"cluster": ClusterSpec, "model": ModelSpec}

# Keys only a cluster spec has; a file with any of them is read as a cluster.
_CLUSTER_KEYS = ("levels", "device", "interconnects")
# Keys only a model spec has.
_MODEL_KEYS = ("parallelism", "reductions", "resharding", "layers", "transformer", "training", "hf_config", "sequence",
               "model_type")   # model_type: a Hugging Face config.json


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the ``cluster`` or ``model`` spec."""
    schema = SCHEMAS[kind].model_json_schema()
    device = schema.get("$defs", {}).get("DeviceSpec")
    if device is not None:
        # a preset fills in the keys a device otherwise needs (spec/presets.py)
        from .presets import preset_names
        device["anyOf"] = [{"required": ["preset"]}, {"required": device.pop("required", [])}]
        device["properties"]["preset"] = {"anyOf": [{"enum": preset_names()}, {"type": "null"}], "default": None,
                                          "description": device["properties"]["preset"].get("description", "")}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"solver_planner {kind} spec"
    return schema


def spec_kind(data: Any) -> str:
    """``'cluster'`` or ``'model'``, judged by the top-level keys."""
    if isinstance(data, dict) and set(_CLUSTER_KEYS) & set(data):
        return "cluster"
    return "model"


def deciding_key(data: Any) -> tuple[str, str] | None:
    """(kind, the first top-level key that says so), or None when no key does: how a file
    given in the wrong place is named (its line comes from the key)."""
    if not isinstance(data, dict):
        return None
    kind = spec_kind(data)
    keys = _CLUSTER_KEYS if kind == "cluster" else _MODEL_KEYS
    key = next((k for k in data if k in keys), None)
    return (kind, key) if key is not None else None
