"""Pydantic plumbing shared by the cluster and model specs.

* :class:`SpecModel` forbids unknown keys and names the keys it expects instead.
* ``Bytes``, ``Bandwidth``, ``Duration``, ``Flops`` and ``FlopRate`` read readable units
  (see :mod:`solver_planner.units`) and publish the accepted pattern in the JSON Schema.
* :func:`validate` turns a pydantic ``ValidationError`` into a :class:`SpecError` whose
  issues carry file, line and key path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from .. import units
from ..errors import SpecError, SpecIssue, closest
from .source import Source, format_path

__all__ = ["NAME_PATTERN", "SpecModel", "Bytes", "Bandwidth", "Duration", "Flops", "FlopRate", "Integer", "Number",
           "validate", "MAX_DEVICES", "MAX_LEVELS", "MAX_AXES", "MAX_LIST", "MAX_LAYERS", "MAX_GLOBAL_BATCH",
           "MAX_MICROBATCHES",
           "MAX_TENSOR_BYTES", "MAX_ISSUES", "first_issues"]


# Names of levels, axes, interconnects and reductions: an identifier, dots and dashes allowed.
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"

# The largest sizes a spec may ask for (README, "Cluster specs" and "Model specs"): far
# above real clusters and models, and low enough that every command stays within seconds
# to minutes and within memory. A spec beyond them is refused when it is read, before any
# device set, layer list or array is built.
MAX_DEVICES = 100_000        # devices in a cluster, a mesh, or a parallelism axis
MAX_LEVELS = 16              # hierarchy levels; also parallelism axes
MAX_AXES = 16
MAX_LIST = 256               # interconnects, constraints, reductions, resharding tasks, ...
MAX_LAYERS = 10_000          # layers after 'repeat', or transformer blocks (stages: linear tables, coarse.py past 1 024)
MAX_GLOBAL_BATCH = 2**20     # samples per iteration (DistIR Table 2 goes to 262 144)
MAX_MICROBATCHES = 2**16     # micro-batches per iteration (stages simulates a few tasks per micro-batch)
MAX_TENSOR_BYTES = 2**50     # one resharded tensor (1 PiB): byte counts stay exact floats
MAX_ISSUES = 100             # problems reported from one file


def _not_bool(value: object) -> object:
    # YAML reads 'true' as a boolean, and Python's bool is an int: refuse it where a number is meant.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


Integer = Annotated[int, BeforeValidator(_not_bool)]
Number = Annotated[float, BeforeValidator(_not_bool)]


def _only_bool(value: object) -> object:
    # a switch is true or false (YAML's yes/no read as those too): 1 or "true" is a slip
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


Boolean = Annotated[bool, BeforeValidator(_only_bool)]


def _quantity(kind: str):
    def read(value: object) -> float:
        return units.parse(value, kind)

    schema = {
        "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": units.unit_pattern(kind)}],
        "description": units.describe(kind),
    }
    return Annotated[float, BeforeValidator(read), WithJsonSchema(schema)]


Bytes = _quantity("bytes")
Bandwidth = _quantity("bandwidth")
Duration = _quantity("time")
Flops = _quantity("flops")
FlopRate = _quantity("flop_rate")


class SpecModel(BaseModel):
    """Base of every spec section: frozen, and strict about the keys it accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = []
            for name, field in cls.model_fields.items():
                allowed.append(field.alias or name)
            for key in data:
                if key not in allowed:
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key '{key}'; expected one of: {allowed}",
                        {"key": str(key), "allowed": ", ".join(allowed)},
                    )
        return data


_TYPE_MESSAGES = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "string_type": "expected a text string",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "dict_type": "expected a mapping of keys to values",
    "model_type": "expected a mapping of keys to values",
    "model_attributes_type": "expected a mapping of keys to values",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "finite_number": "expected a finite number",
}

M = TypeVar("M", bound=BaseModel)


# the spellings other tools use for a value the specs spell otherwise (what users write
# first), each with what to say about it
_ALIASES = {"bf16": ("bfloat16", ""), "fp16": ("float16", ""), "half": ("float16", ""), "fp32": ("float32", ""),
            "float": ("float32", ""), "adamw": ("adam", " It covers AdamW: the same state and step cost.")}


def _meant(value: Any, ctx: dict) -> str:
    """`` (did you mean 'bfloat16'?)`` for a known alias or a close spelling of one of the
    choices ``ctx['expected']`` names; empty otherwise."""
    if not isinstance(value, str):
        return ""
    choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
    target, note = _ALIASES.get(value.strip().lower(), (None, ""))
    if target not in choices:
        close = closest(value, choices)
        target, note = (close[0], "") if close else (None, "")
    return f" (did you mean {target!r}?{note})" if target else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _clean_loc(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Keep the parts of a pydantic location that navigate the data (drop union tags)."""
    path: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            path.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path.append(part)
        elif isinstance(node, dict) and isinstance(part, str) and not any(c in part for c in "[]()"):
            path.append(part)  # a missing key: name it, the line is its parent's
            node = None
    return tuple(path)


def _message(err: dict[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "missing required key"
    if kind == "unknown_key":
        return err["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind in _TYPE_MESSAGES:
        return f"{_TYPE_MESSAGES[kind]}, got {_short(err.get('input'))}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        return f"expected a value {op} {bound}, got {_short(err.get('input'))}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_short(err.get('input'))}{_meant(err.get('input'), ctx)}"
    if kind == "too_long" and "max_length" in ctx:
        return f"expected at most {ctx['max_length']:,} entries, got {ctx.get('actual_length', 'more')}"
    if kind == "too_short" and "min_length" in ctx:
        n = ctx["min_length"]
        return f"expected at least {n:,} {'entry' if n == 1 else 'entries'}, got {ctx.get('actual_length', 'fewer')}"
    if kind in ("too_short", "too_long"):
        return err["msg"].replace("List should", "expected a list that should").rstrip(".")
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return (f"expected a name of ASCII letters, digits, '_', '.' and '-' that starts with a letter or '_',"
                f" got {_short(err.get('input'))}")
    return err["msg"]


def first_issues(issues: list[SpecIssue]) -> list[SpecIssue]:
    """The first :data:`MAX_ISSUES` problems in file order: a file with a hundred thousand
    bad entries is reported in bounded time."""
    return sorted(issues, key=lambda i: (i.line or 0, i.path))[:MAX_ISSUES]


def validate(model: type[M], data: Any, source: Source) -> M:
    """Validate ``data`` (from ``source``) as ``model``; raise :class:`SpecError` on any problem."""
    if data is None:
        raise SpecError(SpecIssue(source.file, 1, "", "the file is empty; expected a mapping of keys to values"))
    if not isinstance(data, dict):
        raise SpecError(SpecIssue(source.file, source.line(()), "",
                                  f"expected a mapping of keys to values at the top, got {type(data).__name__}"))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors(include_url=False)[:MAX_ISSUES]:
            loc = tuple(err["loc"])
            if err["type"] == "unknown_key":
                loc = loc + (err["ctx"]["key"],)
            path = _clean_loc(data, loc)
            issues.append(SpecIssue(source.file, source.line(path), format_path(path), _message(err)))
        raise SpecError(issues) from None
