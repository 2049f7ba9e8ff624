"""Safe YAML loading that remembers where every key came from.

A spec error must name the file, the line and the key path (DESIGN.md, "Bad input"), so
the loader keeps PyYAML's node tree beside the plain data and answers "which line holds
``interconnects[1].bandwidth``?".  Only PyYAML's ``SafeLoader`` is used: object tags such
as ``!!python/object`` are refused, and so are duplicate keys, which PyYAML would
otherwise resolve silently by keeping the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError, SpecIssue

__all__ = ["Source", "load_yaml", "format_path"]


def format_path(path: tuple[Any, ...] | list[Any]) -> str:
    """``("interconnects", 1, "bandwidth")`` -> ``"interconnects[1].bandwidth"``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


@dataclass(frozen=True)
class Source:
    """The file a spec came from and its YAML node tree, for locating keys by path."""

    file: str
    root: yaml.Node | None

    def line(self, path: tuple[Any, ...] | list[Any]) -> int | None:
        """1-based line of the deepest node along ``path`` (the parent when a key is missing)."""
        node = self.root
        if node is None:
            return None
        line = node.start_mark.line + 1
        for part in path:
            found = _child(node, part)
            if found is None:
                break
            key, node = found
            # A key's own line, not where its (possibly block) value starts.
            line = (key or node).start_mark.line + 1
        return line

    def issue(self, path: tuple[Any, ...] | list[Any], message: str) -> SpecIssue:
        return SpecIssue(self.file, self.line(path), format_path(path), message)

    def error(self, path: tuple[Any, ...] | list[Any], message: str) -> SpecError:
        """A :class:`SpecError` located at ``path`` in this file."""
        return SpecError(self.issue(path, message))


def _child(node: yaml.Node, part: Any) -> tuple[yaml.Node | None, yaml.Node] | None:
    """(key node or None, value node) of ``part`` under ``node``."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return None, node.value[part]
    return None


def _check_duplicates(node: yaml.Node, file: str, path: tuple[Any, ...] = ()) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if name in seen:
                raise SpecError(SpecIssue(file, key.start_mark.line + 1, format_path(path + (name,)),
                                          f"duplicate key '{name}' (first given on line {seen[name]})"))
            seen[name] = key.start_mark.line + 1
            _check_duplicates(value, file, path + (name,))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, file, path + (i,))


def load_yaml(path: str | Path, text: str | None = None) -> tuple[Any, Source]:
    """Parse ``path`` (or ``text``, reported as ``path``) safely; return the data and its :class:`Source`.

    Raises :class:`SpecError` for unreadable files, YAML syntax errors, object tags and
    duplicate keys, each with the file and line.
    """
    file = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecError(SpecIssue(file, None, "", "no such file")) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(SpecIssue(file, None, "", f"cannot read the file: {exc}")) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_duplicates(root, file)
        data = yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - SafeLoader: no object tags
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = (exc.problem or "invalid YAML").strip()
        if isinstance(exc, yaml.constructor.ConstructorError):
            what = f"{what} (only plain YAML is accepted: no object tags)"
        raise SpecError(SpecIssue(file, line, "", f"YAML error: {what}")) from None
    except yaml.YAMLError as exc:
        raise SpecError(SpecIssue(file, None, "", f"YAML error: {exc}")) from None
    return data, Source(file, root)
