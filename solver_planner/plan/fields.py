"""Reading a plan file's fields by path, and comparing a recorded document with a derived one.

``check`` re-derives a whole plan document from the specs and the plan's choices, then
compares it with the file leaf by leaf (:func:`differences`): every field is either equal
to what the specs give, or a failure that names its path (``launch.ranks[3].tensor_group``);
a field the format does not have is refused as unknown.  Values are shown as YAML shows
them, never as Python reprs.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterator

__all__ = ["path_text", "show", "kind_of", "FieldError", "field", "differences", "RELATIVE"]

RELATIVE = 1e-6      # recorded and re-derived numbers agree to this (YAML keeps ~17 digits)

Path = tuple  # of str keys and int indices


def path_text(path: Path) -> str:
    """``("launch", "ranks", 3, "tensor_group")`` -> ``launch.ranks[3].tensor_group``."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "(the file)"


def show(value: Any, limit: int = 80) -> str:
    """A value as the plan file writes it (JSON/YAML flow style), shortened past ``limit``."""
    if isinstance(value, float):
        text = "inf" if value == math.inf else "-inf" if value == -math.inf else "nan" if value != value \
            else f"{value:.9g}"
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def kind_of(value: Any) -> str:
    """What a value is, in YAML's words."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {show(value)}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {show(value)}"
    if isinstance(value, str):
        return f"the string {show(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class FieldError(ValueError):
    """A field that is missing or of the wrong kind: ``path`` and what was expected."""

    def __init__(self, path: Path, message: str):
        super().__init__(f"{path_text(path)}: {message}")
        self.path = path
        self.message = message


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
          dict: "a mapping"}


def field(doc: Any, path: Path, kind: type) -> Any:
    """The value at ``path`` of ``doc``, of type ``kind`` (an int where a number is asked is
    read as a float; a boolean is never a number), or :class:`FieldError`."""
    node = doc
    for n, key in enumerate(path):
        here = path[:n]
        if isinstance(key, int):
            if not isinstance(node, list):
                raise FieldError(here, f"expected a list, got {kind_of(node)}")
            if not 0 <= key < len(node):
                raise FieldError(path[:n + 1], f"missing (the list has {len(node)} entries)")
        else:
            if not isinstance(node, dict):
                raise FieldError(here, f"expected a mapping, got {kind_of(node)}")
            if key not in node:
                raise FieldError(path[:n + 1], "missing")
        node = node[key]
    if kind is float and isinstance(node, int) and not isinstance(node, bool):
        node = float(node)
    if not isinstance(node, kind) or (isinstance(node, bool) and kind is not bool):
        raise FieldError(path, f"expected {_NAMES.get(kind, kind.__name__)}, got {kind_of(node)}")
    return node


def _same_number(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=RELATIVE, abs_tol=1e-12)


def differences(got: Any, want: Any, path: Path = ()) -> Iterator[tuple[Path, str]]:
    """Every place where the recorded ``got`` is not the derived ``want``: ``(path, message)``.

    Exact for integers, strings, booleans and null (by type too: ``1.0`` is not the
    integer 1, ``"2"`` is not 2); numbers within :data:`RELATIVE`; mappings key by key
    (a key ``want`` lacks is an unknown field); lists entry by entry.
    """
    if isinstance(want, dict):
        if not isinstance(got, dict):
            yield path, f"expected a mapping, got {kind_of(got)}"
            return
        for key in want:
            if key not in got:
                yield path + (key,), "missing"
            else:
                yield from differences(got[key], want[key], path + (key,))
        for key in got:
            if key not in want:
                yield path + (key,), f"unknown field (this version's plan file has no {show(key)} here)"
        return
    if isinstance(want, list):
        if not isinstance(got, list):
            yield path, f"expected a list, got {kind_of(got)}"
            return
        if len(got) != len(want):
            yield path, f"has {len(got)} entries; derived from the specs: {len(want)} ({show(want)})"
            return
        for i, (a, b) in enumerate(zip(got, want)):
            yield from differences(a, b, path + (i,))
        return
    if isinstance(want, float) and not isinstance(want, bool):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            yield path, f"expected a number, got {kind_of(got)}"
        elif got != got or not _same_number(float(got), want):
            yield path, f"recorded {show(float(got))}, derived {show(want)}"
        return
    if type(got) is not type(want):
        yield path, f"expected {kind_of(want)}, got {kind_of(got)}"
    elif got != want:
        if isinstance(got, str) and (len(got) > 80 or len(want) > 80 or "\n" in got + want):
            yield path, _text_difference(got, want)
        else:
            yield path, f"recorded {show(got)}, derived {show(want)}"


def _text_difference(got: str, want: str) -> str:
    """Where two long texts (an export, a command) first differ: the line, and on one line
    the place, so that a message cut at 80 characters still shows the change."""
    a, b = got.split("\n"), want.split("\n")
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    x = a[i] if i < len(a) else None
    y = b[i] if i < len(b) else None
    where = f"line {i + 1}: " if len(a) > 1 or len(b) > 1 else ""
    if x is None or y is None:
        return (f"{where}recorded {'nothing (the text ends)' if x is None else show(x)},"
                f" derived {'nothing (the text ends)' if y is None else show(y)}")
    k = next((j for j, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
    start = max(0, k - 30)

    def cut(t: str) -> str:
        piece = json.dumps(t[start:start + 70], ensure_ascii=False)[1:-1]
        return ("..." if start else "") + piece + ("..." if len(t) > start + 70 else "")

    return f'{where}recorded "{cut(x)}", derived "{cut(y)}"' + (f" (from character {k + 1})" if start else "")
