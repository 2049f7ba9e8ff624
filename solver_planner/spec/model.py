"""The model (workload) spec: parallelism axes and requested reductions.

Example (seed 000 §2: data parallelism of size 4 and 16 parameter shards)::

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

from pydantic import Field, PrivateAttr

from ..errors import SpecError
from .base import NAME_PATTERN, Bytes, SpecModel, validate
from .source import Source, load_yaml

__all__ = ["AxisSpec", "PlacementRuleSpec", "ParallelismSpec", "ReductionSpec", "ModelSpec", "load_model_spec", "check_fits"]

class AxisSpec(SpecModel):
    """One parallelism axis (seed 000 §3.1: the rows of a parallelism matrix)."""

    name: str = Field(pattern=NAME_PATTERN)
    size: int = Field(ge=1)


class PlacementRuleSpec(SpecModel):
    """A user constraint on parallelism matrices: give ``axis`` and exactly one of
    ``inside`` (the axis never spans two instances of that level: factor 1 there and on
    every level outside it), ``not_split_over`` (factor 1 on that level), or
    ``level`` with ``factor`` (fix that entry of the matrix)."""

    axis: str
    inside: str | None = None
    not_split_over: str | None = None
    level: str | None = None
    factor: int | None = Field(default=None, ge=1)


class ParallelismSpec(SpecModel):
    axes: list[AxisSpec] = Field(min_length=1, description="ordered axes; their sizes multiply to the device count")
    constraints: list[PlacementRuleSpec] = Field(default_factory=list, description="rules every placement obeys")


class ReductionSpec(SpecModel):
    """A reduction the user asks for: sum over the named axes, ``bytes`` held by each device."""

    name: str = Field(pattern=NAME_PATTERN)
    axes: list[str] = Field(min_length=1, description="the reduction axes")
    bytes: Bytes = Field(gt=0, description="size of the buffer each device reduces")
    weight: float = Field(default=1.0, gt=0, description="how often it runs per iteration (ranking weight)")


class ModelSpec(SpecModel):
    """A whole model spec file."""

    name: str
    description: str = ""
    parallelism: ParallelismSpec | None = None
    reductions: list[ReductionSpec] = Field(default_factory=list)

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
    if issues:
        raise SpecError(issues)


def load_model_spec(path: str | Path, text: str | None = None) -> ModelSpec:
    """Read and check a model spec; raise :class:`SpecError` with file:line:key on any problem."""
    data, source = load_yaml(path, text)
    spec = validate(ModelSpec, data, source)
    spec._source = source
    _check(spec, source)
    return spec


def check_fits(model: ModelSpec, num_devices: int, cluster_name: str) -> None:
    """Refuse parallelism axes whose sizes do not multiply to the cluster's device count.

    Seed 000 §3.1: a parallelism matrix exists only when the axis sizes and the level counts
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
