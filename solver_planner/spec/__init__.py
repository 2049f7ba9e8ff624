"""YAML specs -> validated, typed objects whose errors carry file, line and key path."""

from .cluster import ClusterSpec, DeviceSpec, InterconnectSpec, LevelSpec, load_cluster_spec
from .model import (AxisSpec, MeshSpec, ModelSpec, ParallelismSpec, ReductionSpec, ReshardingSpec, check_fits,
                    check_meshes, load_model_spec)
from .layers import LayerSpec, TrainingSpec, TransformerSpec
from .schema import deciding_key, spec_kind, json_schema
from .source import Source, format_path, load_yaml

__all__ = [
    "ClusterSpec", "DeviceSpec", "InterconnectSpec", "LevelSpec", "load_cluster_spec",
    "AxisSpec", "MeshSpec", "ModelSpec", "ParallelismSpec", "ReductionSpec", "ReshardingSpec", "check_fits",
    "check_meshes", "load_model_spec", "LayerSpec", "TrainingSpec", "TransformerSpec",
    "spec_kind", "deciding_key", "json_schema", "Source", "format_path", "load_yaml",
]
