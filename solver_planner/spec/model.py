"""The model (workload) spec: parallelism axes and requested reductions.

Example (P² §2: data parallelism of size 4 and 16 parameter shards)::

    name: example
    parallelism:
      axes:                 # ordered; the product of sizes equals the number of devices
        - {name: data, size: 4}
        - {name: model, size: 16}
    reductions:
      - {name: grads, axes: [data], bytes: 8 GiB}   # bytes held by each device
"""

from __future__ import annotations

from pathlib import Path

from typing import Literal

from pydantic import Field, PrivateAttr

from ..errors import SpecError
from .base import (MAX_AXES, MAX_DEVICES, MAX_LAYERS, MAX_LIST, MAX_MICROBATCHES, MAX_TENSOR_BYTES, NAME_PATTERN, Bytes, Integer,
                   Number, SpecModel, first_issues, validate)
from .layers import LayerSpec, TrainingSpec, TransformerSpec
from .source import Source, load_yaml

__all__ = ["AxisSpec", "PlacementRuleSpec", "ParallelismSpec", "ReductionSpec", "MeshSpec", "ReshardingSpec",
           "ModelSpec", "load_model_spec", "check_fits", "check_meshes", "DTYPE_BYTES"]

# Bytes per element of the dtypes a resharding tensor may have.
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8": 1,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}

class AxisSpec(SpecModel):
    """One parallelism axis (P² §3.1: the rows of a parallelism matrix)."""

    name: str = Field(pattern=NAME_PATTERN)
    size: Integer = Field(ge=1, le=MAX_DEVICES)


class PlacementRuleSpec(SpecModel):
    """A user constraint on parallelism matrices: give ``axis`` and exactly one of
    ``inside`` (the axis never spans two instances of that level: factor 1 there and on
    every level outside it), ``not_split_over`` (factor 1 on that level), or
    ``level`` with ``factor`` (fix that entry of the matrix)."""

    axis: str
    inside: str | None = None
    not_split_over: str | None = None
    level: str | None = None
    factor: Integer | None = Field(default=None, ge=1, le=MAX_DEVICES)


class ParallelismSpec(SpecModel):
    axes: list[AxisSpec] = Field(min_length=1, max_length=MAX_AXES,
                                 description="ordered axes; their sizes multiply to the device count")
    constraints: list[PlacementRuleSpec] = Field(default_factory=list, max_length=MAX_LIST,
                                                 description="rules every placement obeys")


class ReductionSpec(SpecModel):
    """A reduction the user asks for: sum over the named axes, ``bytes`` held by each device."""

    name: str = Field(pattern=NAME_PATTERN)
    axes: list[str] = Field(min_length=1, max_length=MAX_AXES, description="the reduction axes")
    bytes: Bytes = Field(gt=0, description="size of the buffer each device reduces")
    weight: Number = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False,
                           description="how often it runs per iteration (ranking weight)")


class MeshSpec(SpecModel):
    """A device mesh (the resharding paper §2.2): ``devices_per_host`` devices, starting at local index
    ``first_device``, on each of ``hosts``; mesh dimension 0 runs over hosts, 1 over devices.
    ``spec`` gives each tensor dimension's sharding (GSPMD/Alpa notation)."""

    hosts: list[Integer] = Field(min_length=1, max_length=MAX_DEVICES, description="cluster host indices, one per mesh row")
    devices_per_host: Integer = Field(ge=1, le=MAX_DEVICES, description="mesh columns")
    first_device: Integer = Field(default=0, ge=0, le=MAX_DEVICES,
                                  description="local index of the first device used on each host")
    spec: list[Literal["R", "S0", "S1", "S01"]] = Field(
        min_length=1, max_length=MAX_AXES, description="per tensor dimension: R (replicated), S0/S1 (sharded along mesh dim 0/1), S01 (both)")


class ReshardingSpec(SpecModel):
    """One cross-mesh resharding task: a tensor moves from ``src`` to ``dst`` (the resharding paper §2.2)."""

    name: str = Field(pattern=NAME_PATTERN)
    shape: list[Integer] = Field(min_length=1, max_length=MAX_AXES, description="tensor shape")
    dtype: Literal[tuple(DTYPE_BYTES)] = Field(default="float32", description="element type")  # type: ignore[valid-type]
    src: MeshSpec
    dst: MeshSpec


class ModelSpec(SpecModel):
    """A whole model spec file."""

    name: str
    description: str = ""
    parallelism: ParallelismSpec | None = None
    reductions: list[ReductionSpec] = Field(default_factory=list, max_length=MAX_LIST)
    resharding: list[ReshardingSpec] = Field(default_factory=list, max_length=MAX_LIST)
    layers: list[LayerSpec] = Field(default_factory=list, max_length=MAX_LAYERS,
                                    description="the layer model, in execution order")
    transformer: TransformerSpec | None = Field(default=None, description="a GPT-style decoder instead of 'layers'")
    hf_config: str | None = Field(
        default=None, description="a Hugging Face config.json (relative to this file) instead of 'transformer' or"
        " 'layers'; model types llama, mistral, qwen2, gpt2, gpt_neox")
    sequence: Integer | None = Field(
        default=None, ge=1, le=2**20, description="with hf_config: the training sequence length (default:"
        " min(max_position_embeddings, 4096))")
    training: TrainingSpec | None = None

    _source: Source = PrivateAttr(default=Source("<memory>", None))

    @property
    def source(self) -> Source:
        return self._source

    @property
    def axis_names(self) -> list[str]:
        return [a.name for a in self.parallelism.axes] if self.parallelism else []

    @property
    def axis_sizes(self) -> list[int]:
        return [a.size for a in self.parallelism.axes] if self.parallelism else []


def _check(spec: ModelSpec, source: Source) -> None:
    issues = []
    names = spec.axis_names
    if _product(spec.axis_sizes) > MAX_DEVICES:
        issues.append(source.issue(("parallelism", "axes"), f"axis sizes multiply to {_product(spec.axis_sizes):,}"
                                   f" devices; at most {MAX_DEVICES:,} are handled (README, 'Cluster specs')"))
    for i, name in enumerate(names):
        if name in names[:i]:
            issues.append(source.issue(("parallelism", "axes", i, "name"), f"axis '{name}' is named twice"))
    for c, rule in enumerate(spec.parallelism.constraints if spec.parallelism else []):
        at = ("parallelism", "constraints", c)
        if rule.axis not in names:
            issues.append(source.issue(at + ("axis",), f"no axis named '{rule.axis}'; expected one of: {', '.join(names)}"))
        kinds = [k for k, v in (("inside", rule.inside), ("not_split_over", rule.not_split_over),
                                ("level", rule.level)) if v is not None]
        if len(kinds) != 1:
            issues.append(source.issue(at, "give exactly one of 'inside', 'not_split_over', or 'level' with 'factor'"))
        elif (rule.level is None) != (rule.factor is None):
            issues.append(source.issue(at, "'level' and 'factor' go together"))
    seen: set[str] = set()
    for r, red in enumerate(spec.reductions):
        if red.name in seen:
            issues.append(source.issue(("reductions", r, "name"), f"reduction '{red.name}' is named twice"))
        seen.add(red.name)
        if spec.parallelism is None:
            issues.append(source.issue(("reductions", r, "axes"), "reductions need 'parallelism.axes' to name axes"))
            continue
        for a, axis in enumerate(red.axes):
            if axis not in names:
                issues.append(source.issue(("reductions", r, "axes", a),
                                           f"no axis named '{axis}'; expected one of: {', '.join(names)}"))
            elif axis in red.axes[:a]:
                issues.append(source.issue(("reductions", r, "axes", a), f"axis '{axis}' is listed twice"))
    issues += _resharding_issues(spec, source)
    issues += _layer_issues(spec, source)
    if issues:
        raise SpecError(first_issues(issues))


SELECTIVE_OP_NEEDS = ("selective-op (torchtitan's per-operator checkpointing) counts a transformer block's matrix"
                      " products; it needs a 'transformer:' model, a 'layers:' list names none (use none,"
                      " selective or full)")


def tensor_overlap_refusal(spec: ModelSpec) -> str | None:
    """Why ``training.tensor_overlap`` cannot hold for ``spec`` (None: it can)."""
    t = spec.training
    if t is None or not t.tensor_overlap:
        return None
    if not t.sequence_parallel:
        # Megatron-LM's arguments.py: "Tensor parallel communication/GEMM overlap can happen only
        # when sequence parallelism is enabled" (the overlapped collectives are its gather and scatter)
        return ("tensor_overlap overlaps sequence parallelism's all-gathers and reduce-scatters with the matrix"
                " products; it needs 'sequence_parallel: true'")
    if spec.transformer is None:
        return ("tensor_overlap pairs each collective with a transformer block's matrix products; a 'layers:'"
                " list names none (use a 'transformer:' model, or tensor_overlap: false)")
    return None


def _layer_issues(spec: ModelSpec, source: Source) -> list:
    issues = []
    if spec.layers and spec.transformer is not None:
        issues.append(source.issue(("transformer",), "give either 'layers' or 'transformer', not both"))
    if (spec.layers or spec.transformer is not None) and spec.training is None:
        issues.append(source.issue((), "a layer model needs a 'training' section (global_batch, ...)"))
    if spec.transformer is not None:
        for key, what in spec.transformer.shape_issues():
            issues.append(source.issue(("transformer", key), what))
    why = tensor_overlap_refusal(spec)
    if why:
        issues.append(source.issue(("training", "tensor_overlap"), why))
    if spec.layers and spec.training is not None and spec.training.recompute == "selective-op":
        issues.append(source.issue(("training", "recompute"), SELECTIVE_OP_NEEDS))
    total = sum(layer.repeat for layer in spec.layers)
    if total > MAX_LAYERS:
        issues.append(source.issue(("layers",), f"{total:,} layers after 'repeat'; at most {MAX_LAYERS:,} are handled"
                                   " (README, 'Model specs')"))
    counts: dict[str, int] = {}
    for layer in spec.layers:
        counts[layer.name] = counts.get(layer.name, 0) + layer.repeat
    order = {}
    for i, layer in enumerate(spec.layers):
        order.setdefault(layer.name, i)
    for i, layer in enumerate(spec.layers):
        for j, target in enumerate(layer.skip_to):
            at = ("layers", i, "skip_to", j)
            if target not in counts:
                issues.append(source.issue(at, f"no layer named '{target}'"))
            elif counts[target] != 1:
                issues.append(source.issue(at, f"layer '{target}' appears {counts[target]} times; skips need a unique name"))
            elif order[target] <= i:
                issues.append(source.issue(at, f"layer '{target}' does not come after '{layer.name}'"))
        if layer.skip_to and layer.repeat > 1:
            issues.append(source.issue(("layers", i, "repeat"), "a layer with skip_to cannot be repeated"))
        if layer.tied_to is not None:
            at = ("layers", i, "tied_to")
            if layer.tied_to not in counts:
                issues.append(source.issue(at, f"no layer named '{layer.tied_to}'"))
            elif counts[layer.tied_to] != 1 or layer.repeat > 1:
                issues.append(source.issue(at, "tied layers must both appear once (no repeat)"))
            elif order[layer.tied_to] >= i:
                issues.append(source.issue(at, f"layer '{layer.tied_to}' does not come before '{layer.name}'"))
        backward = layer.backward
        if layer.weight_flops is not None and layer.weight_flops > backward:
            issues.append(source.issue(("layers", i, "weight_flops"), f"the weight-gradient part"
                                       f" ({layer.weight_flops:g} FLOP) exceeds the backward ({backward:g} FLOP)"))
    training = spec.training
    if training is not None and isinstance(training.microbatches, int):
        if training.microbatches < 1 or training.global_batch % training.microbatches:
            issues.append(source.issue(("training", "microbatches"),
                                       f"{training.microbatches} micro-batches do not divide the global batch"
                                       f" of {training.global_batch}"))
        elif training.microbatches > MAX_MICROBATCHES:
            issues.append(source.issue(("training", "microbatches"),
                                       f"{training.microbatches} micro-batches exceed the limit of {MAX_MICROBATCHES}"))
    return issues


def _product(numbers) -> int:
    n = 1
    for x in numbers:
        n *= x
    return n


def _overlap(src: MeshSpec, dst: MeshSpec) -> tuple[int, tuple[int, int] | None]:
    """How many devices two meshes share, and the first one, without listing their devices
    (a mesh is its hosts times a contiguous range of local indices)."""
    hosts = sorted(set(src.hosts) & set(dst.hosts))
    first = max(src.first_device, dst.first_device)
    last = min(src.first_device + src.devices_per_host, dst.first_device + dst.devices_per_host)
    if not hosts or first >= last:
        return 0, None
    return len(hosts) * (last - first), (hosts[0], first)


def _resharding_issues(spec: ModelSpec, source: Source) -> list:
    issues = []
    seen: set[str] = set()
    for r, task in enumerate(spec.resharding):
        at = ("resharding", r)
        if task.name in seen:
            issues.append(source.issue(at + ("name",), f"resharding '{task.name}' is named twice"))
        seen.add(task.name)
        for i, n in enumerate(task.shape):
            if n < 1:
                issues.append(source.issue(at + ("shape", i), f"expected a dimension >= 1, got {n}"))
        size = _product(task.shape) * DTYPE_BYTES[task.dtype]
        if all(n >= 1 for n in task.shape) and size > MAX_TENSOR_BYTES:
            issues.append(source.issue(at + ("shape",), f"a tensor of {_big(size)} bytes; at most 2**50 (1 PiB) are"
                                       " handled (README, 'Model specs')"))
        for side in ("src", "dst"):
            mesh = getattr(task, side)
            if len(mesh.spec) != len(task.shape):
                issues.append(source.issue(at + (side, "spec"), f"the spec has {len(mesh.spec)} entries but the tensor"
                                           f" has rank {len(task.shape)}; give one entry per dimension"))
            used: dict[str, int] = {}
            for d, entry in enumerate(mesh.spec):
                for axis in entry[1:]:  # "S01" shards over mesh axes 0 and 1
                    if axis in used:
                        issues.append(source.issue(at + (side, "spec", d), f"mesh axis {axis} is used twice (by"
                                                   f" dimensions {used[axis]} and {d}); each mesh axis shards at most"
                                                   " one dimension"))
                    used[axis] = d
            if len(mesh.hosts) * mesh.devices_per_host > MAX_DEVICES:
                issues.append(source.issue(at + (side, "devices_per_host"), f"a mesh of {len(mesh.hosts)} x"
                                           f" {mesh.devices_per_host} devices; at most {MAX_DEVICES:,} are handled"))
            for i, h in enumerate(mesh.hosts):
                if h < 0:
                    issues.append(source.issue(at + (side, "hosts", i), f"expected a host index >= 0, got {h}"))
                elif h >= MAX_DEVICES:
                    issues.append(source.issue(at + (side, "hosts", i), f"expected a host index below {MAX_DEVICES:,},"
                                               f" got {_big(h)}"))
            first = {}
            for i, h in enumerate(mesh.hosts):
                if h in first:
                    issues.append(source.issue(at + (side, "hosts", i), f"host {h} is listed twice"))
                first.setdefault(h, i)
        count, shared = _overlap(task.src, task.dst)
        if shared is not None:
            h, j = shared
            issues.append(source.issue(at + ("dst",), f"the source and destination meshes overlap ({count} devices,"
                                       f" e.g. host {h} device {j}); cross-mesh resharding moves data between disjoint meshes"))
    return issues


def _big(n: int) -> str:
    text = str(n)
    return text if len(text) <= 24 else f"about 10**{len(text) - 1}"


def check_meshes(model: ModelSpec, num_hosts: int, devices_per_host: int, cluster_name: str) -> None:
    """Refuse meshes that do not fit in the cluster: hosts beyond its count or devices
    beyond a host's."""
    issues = []
    for r, task in enumerate(model.resharding):
        for side in ("src", "dst"):
            mesh = getattr(task, side)
            for i, h in enumerate(mesh.hosts):
                if h >= num_hosts:
                    issues.append(model.source.issue(("resharding", r, side, "hosts", i),
                                                     f"host {h} does not exist: cluster '{cluster_name}' has"
                                                     f" {num_hosts} hosts (0-{num_hosts - 1})"))
            last = mesh.first_device + mesh.devices_per_host
            if last > devices_per_host:
                issues.append(model.source.issue(("resharding", r, side, "devices_per_host"),
                                                 f"devices {mesh.first_device}-{last - 1} per host do not fit: cluster"
                                                 f" '{cluster_name}' has {devices_per_host} devices per host"))
    if issues:
        raise SpecError(first_issues(issues))


def load_model_spec(path: str | Path, text: str | None = None) -> ModelSpec:
    """Read and check a model spec; raise :class:`SpecError` with file:line:key on any problem.

    A Hugging Face ``config.json`` (a ``.json`` file, or one with ``model_type``) is read
    as a transformer with default training settings, and a YAML spec's ``hf_config`` names
    one (see :mod:`solver_planner.spec.hf`)."""
    from .hf import default_sequence, default_training, is_hf_config, read_hf_config

    data, source = load_yaml(path, text)
    if is_hf_config(path, data):
        hf = read_hf_config(path, text)
        sequence = default_sequence(hf.max_positions)
        spec = ModelSpec(name=hf.name, transformer=hf.transformer(sequence),
                         training=default_training(sequence, hf.tied), hf_config=str(path))
        spec._source = hf.source
        return spec
    checked = data
    if isinstance(data, dict) and "hf_config" in data and "name" not in data:
        checked = {**data, "name": ""}       # named after the config below
    spec = validate(ModelSpec, checked, source)
    if spec.hf_config is not None:
        spec = _with_hf_config(spec, data, source, Path(path))
    elif spec.sequence is not None:
        raise source.error(("sequence",), "'sequence' goes with 'hf_config'; a transformer spec gives"
                           " transformer.sequence")
    spec._source = source
    _check(spec, source)
    return spec


def _with_hf_config(spec: ModelSpec, data: dict, source: Source, path: Path) -> ModelSpec:
    """``spec`` with the transformer of the config its ``hf_config`` names, at its ``sequence``."""
    from .hf import default_sequence, default_training, read_hf_config

    if spec.transformer is not None or spec.layers:
        raise source.error(("hf_config",), "give one of 'hf_config', 'transformer' or 'layers'")
    config = Path(spec.hf_config).expanduser()
    if not config.is_absolute():
        config = path.parent / config        # relative to the YAML file, wherever the command runs
    if not config.is_file():
        raise source.error(("hf_config",), f"no such file: {config}")
    hf = read_hf_config(config)
    sequence = spec.sequence if spec.sequence is not None else default_sequence(hf.max_positions)
    if hf.shape["position"] == "learned" and sequence > hf.max_positions:
        raise source.error(("sequence",), f"{sequence} tokens, but {config} has a learned position table of"
                           f" {hf.max_positions} rows")
    transformer = hf.transformer(sequence)
    if spec.training is None:
        training = default_training(sequence, hf.tied)
    else:
        given = data.get("training")
        if isinstance(given, dict) and "tied_embeddings" in given and spec.training.tied_embeddings != hf.tied:
            raise source.error(("training", "tied_embeddings"), f"{config} says tie_word_embeddings:"
                               f" {str(hf.tied).lower()}; leave tied_embeddings out, it follows the config")
        training = spec.training.model_copy(update={"tied_embeddings": hf.tied})
    update = {"transformer": transformer, "training": training}
    if "name" not in data:
        update["name"] = hf.name
    return spec.model_copy(update=update)


def check_fits(model: ModelSpec, num_devices: int, cluster_name: str) -> None:
    """Refuse parallelism axes whose sizes do not multiply to the cluster's device count.

    P² §3.1: a parallelism matrix exists only when the axis sizes and the level counts
    have the same product.
    """
    if model.parallelism is None:
        return
    product = 1
    for size in model.axis_sizes:
        product *= size
    if product != num_devices:
        sizes = " x ".join(str(s) for s in model.axis_sizes)
        raise model.source.error(("parallelism", "axes"),
                                 f"axis sizes {sizes} = {product} devices, but cluster '{cluster_name}'"
                                 f" has {num_devices}; the product must equal the device count")
