"""Programs written as explicit steps over device ids, as a user describes a hand-written
hierarchical all-reduce::

    steps:
      - {op: ReduceScatter, groups: [[0, 1], [2, 3]]}
      - {op: AllReduce, groups: [[0, 2], [1, 3]]}
      - {op: AllGather, groups: [[0, 1], [2, 3]]}

The first device of a group is the root of Reduce and Broadcast (P² §3.2), and the
order of a ReduceScatter group says who keeps which block (:mod:`.layout`).  Op names are
read like the DSL's: any case, ``_`` and ``-`` ignored.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from ..cost import Collective
from ..errors import SpecError
from ..spec.base import Integer, SpecModel, validate
from ..spec.source import load_yaml

__all__ = ["ExplicitStepSpec", "ExplicitProgramSpec", "load_explicit_program"]


class ExplicitStepSpec(SpecModel):
    op: str = Field(description="AllReduce, ReduceScatter, AllGather, Reduce or Broadcast (any case; '_' and '-'"
                                " ignored, so all_reduce and allreduce are accepted)")
    # Integer: a device id is never a boolean (YAML's true is not device 1)
    groups: list[list[Integer]] = Field(min_length=1, description="disjoint device groups running the op at once")


class ExplicitProgramSpec(SpecModel):
    name: str = ""
    steps: list[ExplicitStepSpec] = Field(min_length=1)


def load_explicit_program(path: str | Path, num_devices: int, text: str | None = None
                          ) -> list[tuple[Collective, list[list[int]]]]:
    """Read explicit steps; refuse unknown ops, devices out of range and overlapping groups."""
    data, source = load_yaml(path, text)
    spec = validate(ExplicitProgramSpec, data, source)
    steps, issues = [], []
    for s, step in enumerate(spec.steps):
        try:
            kind = Collective.parse(step.op)
        except ValueError as exc:
            issues.append(source.issue(("steps", s, "op"), str(exc)))
            continue
        seen: set[int] = set()
        for g, group in enumerate(step.groups):
            if not group:
                issues.append(source.issue(("steps", s, "groups", g), "an empty group"))
            mine: set[int] = set()
            for d in group:
                if not 0 <= d < num_devices:
                    issues.append(source.issue(("steps", s, "groups", g),
                                               f"device {d} is not one of the cluster's 0..{num_devices - 1}"))
                elif d in mine:
                    issues.append(source.issue(("steps", s, "groups", g), f"device {d} is listed twice in this group"))
                elif d in seen:
                    issues.append(source.issue(("steps", s, "groups", g),
                                               f"device {d} is in two groups of one step; groups must be disjoint"))
                seen.add(d)
                mine.add(d)
        steps.append((kind, [list(g) for g in step.groups]))
    if issues:
        raise SpecError(issues)
    return steps
