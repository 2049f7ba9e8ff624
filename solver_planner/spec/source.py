"""Safe YAML loading that remembers where every key came from.

A spec error must name the file, the line and the key path (DESIGN.md, "Bad input"), so
the loader keeps PyYAML's node tree beside the plain data and answers "which line holds
``interconnects[1].bandwidth``?".  Only PyYAML's ``SafeLoader`` is used: object tags such
as ``!!python/object`` are refused, and so are duplicate keys, which PyYAML would
otherwise resolve silently by keeping the last one.

Reading is bounded in time and memory whatever the file holds: at most
:data:`MAX_FILE_BYTES` bytes, nesting at most :data:`MAX_DEPTH` deep, and at most
:data:`MAX_NODES` values once every alias is expanded (a "billion laughs" file of nested
anchors is refused at the alias that crosses the limit, before anything walks the
expanded tree).  A NUL byte, another control character or invalid UTF-8 is named by line
and column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError, SpecIssue

__all__ = ["Source", "load_yaml", "load_json", "format_path", "check_duplicates"]


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


# Reading limits (README, "Cluster specs"): far above any real spec (the largest shipped
# one is 2 KB, 200 values, 6 deep), low enough that a hostile file costs seconds, not
# minutes (PyYAML's pure-Python reader, needed to count aliases, reads about 200 KB/s).
MAX_FILE_BYTES = 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts what the data will expand to.

    PyYAML shares an aliased node rather than copying it, so composing is linear in the
    file; but every later walk of the data (pydantic included) visits an aliased subtree
    once per alias.  ``_expanded`` counts values as such a walk would see them: a node's
    expanded size is stored when it ends, and an alias adds the size of its anchor.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._open: set[str] = set()

    def _count(self, n: int, mark: yaml.Mark) -> None:
        self._expanded += n
        if self._expanded > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document expands to more than {MAX_NODES:,} values once its aliases are"
                f" expanded (an alias bomb?); at most {MAX_NODES:,} are read", mark)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} refers to a value that contains it (a cycle)", event.start_mark)
            node = super().compose_node(parent, index)  # the anchored node, shared
            self._count(self._sizes[id(node)], event.start_mark)
            return node
        event = self.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"values nested more than {MAX_DEPTH} deep; at most {MAX_DEPTH} levels are read",
                event.start_mark)
        self._count(1, event.start_mark)
        before = self._expanded - 1
        anchor = event.anchor
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
        self._sizes[id(node)] = self._expanded - before
        self._depth -= 1
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
            # e.g. a timestamp with month 13, or an integer of more than 4300 digits
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value {_snippet(node)}: {exc}", node.start_mark) from None


def _compose_fast(text: str) -> yaml.Node | None:
    """The node tree composed by libyaml, when the text needs none of the counting above.

    PyYAML's pure-Python reader takes seconds for a file of explicit steps over thousands
    of devices; libyaml's takes milliseconds.  It is used only when its events (read
    without recursion) show no alias, no tag, at most :data:`MAX_DEPTH` nesting and at
    most :data:`MAX_NODES` values: then nothing expands, and composing, which recurses
    once per level, stays shallow.  Otherwise, or on any YAML error (so that messages keep
    one wording), None: the bounded reader reads the text.
    """
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, yaml.AliasEvent) or (isinstance(event, yaml.NodeEvent) and (
                    event.anchor is not None or getattr(event, "tag", None) not in (None, "!"))):
                return None
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    return None
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_NODES:
                    return None
        return yaml.compose(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return None


def _snippet(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        text = node.value
        return repr(text if len(text) <= 40 else text[:37] + "...")
    return f"({node.id})"


def _key_identity(key: yaml.Node) -> Any:
    """What a key is once loaded (``1`` and ``0x1`` are one key, as in the data), or its text
    when it is not a scalar PyYAML builds alone (the constructor then says what is wrong)."""
    if isinstance(key, yaml.ScalarNode):
        try:
            value = _KEYS.construct_object(key)
            hash(value)
            return value
        except Exception:       # noqa: BLE001 -- left to the constructor's own error
            return key.value
    return str(key)


_KEYS = yaml.constructor.SafeConstructor()


def check_duplicates(root: yaml.Node, file: str) -> None:
    """Refuse a mapping that gives a key twice (twice once loaded: ``1`` and ``0x1`` too).
    Iterative, and each node is checked once however many aliases reach it (the check does
    not depend on the path)."""
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
                ident = _key_identity(key)
                if ident in seen and name != "<<":
                    raise SpecError(SpecIssue(file, key.start_mark.line + 1, format_path(path + (name,)),
                                              f"duplicate key '{name}' (first given on line {seen[ident]})"))
                seen[ident] = key.start_mark.line + 1
            # Depth first in file order, so a shared node is reported where it is first written.
            stack.extend((value, path + (k.value if isinstance(k, yaml.ScalarNode) else str(k),))
                         for k, value in reversed(node.value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path + (i,)) for i, item in reversed(list(enumerate(node.value))))


# What YAML refuses to read (PyYAML's Reader.NON_PRINTABLE): NUL and other control characters.
_NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE


def _line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _decode(file: str, raw: bytes) -> str:
    """UTF-8 text of ``raw``; invalid UTF-8 is refused at the line and column of its first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        column = len(raw[line_start:exc.start].decode("utf-8", errors="replace")) + 1
        raise SpecError(SpecIssue(file, line, "", f"column {column}: byte 0x{raw[exc.start]:02x} is not valid UTF-8;"
                                  " save the file as UTF-8")) from None


def _check_characters(file: str, text: str) -> None:
    match = _NON_PRINTABLE.search(text)
    if match is not None:
        line, column = _line_col(text, match.start())
        code = ord(match.group())
        what = "a NUL byte" if code == 0 else f"the control character U+{code:04X}"
        raise SpecError(SpecIssue(file, line, "", f"column {column}: {what} is not allowed in YAML"))


def _read(path: str | Path, text: str | None) -> tuple[str, str]:
    """(file name, text) of ``path`` within the reading limits, or ``text`` reported as ``path``."""
    file = str(path)
    if text is None:
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            raise SpecError(SpecIssue(file, None, "", "no such file")) from None
        except IsADirectoryError:
            raise SpecError(SpecIssue(file, None, "", "is a folder, not a spec file")) from None
        except OSError as exc:
            raise SpecError(SpecIssue(file, None, "", f"cannot read the file: {exc.strerror or exc}")) from None
        if len(raw) > MAX_FILE_BYTES:
            raise SpecError(SpecIssue(file, None, "", f"the file is larger than {MAX_FILE_BYTES // 2**20} MiB;"
                                      " a spec is a few KB"))
        text = _decode(file, raw)
    elif len(text) > MAX_FILE_BYTES:
        raise SpecError(SpecIssue(file, None, "", f"the text is longer than {MAX_FILE_BYTES // 2**20} MiB"))
    return file, text


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json(path: str | Path, text: str | None = None) -> tuple[Any, Source]:
    """Parse a JSON file (a Hugging Face ``config.json``) with the same limits as
    :func:`load_yaml`; return the data and a :class:`Source` that locates keys by line.

    The values come from :mod:`json` (YAML 1.1 would read ``1e-05`` as text); the lines
    come from PyYAML's node tree of the same text (JSON is YAML's flow style), when PyYAML
    can read it, else errors name the file without a line.  Duplicate keys, ``NaN`` and
    ``Infinity`` are refused.
    """
    import json

    file, text = _read(path, text)
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(SpecIssue(file, exc.lineno, "", f"JSON error: column {exc.colno}: {exc.msg}")) from None
    except ValueError as exc:      # a duplicate key or NaN, from the hooks above
        raise SpecError(SpecIssue(file, None, "", f"JSON error: {exc}")) from None
    except RecursionError:
        raise SpecError(SpecIssue(file, None, "", "JSON error: values nested too deep")) from None
    root = None
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        root = None                # no line numbers, the data is still right
    finally:
        loader.dispose()
    return data, Source(file, root)


def load_yaml(path: str | Path, text: str | None = None) -> tuple[Any, Source]:
    """Parse ``path`` (or ``text``, reported as ``path``) safely; return the data and its :class:`Source`.

    Raises :class:`SpecError` for unreadable files, YAML syntax errors, object tags,
    duplicate keys and files beyond the reading limits, each with the file and line.  A
    file whose name ends in ``.json`` is read by :func:`load_json`.
    """
    if str(path).lower().endswith(".json"):
        return load_json(path, text)
    file, text = _read(path, text)
    _check_characters(file, text)
    loader = _BoundedLoader(text)
    try:
        root = _compose_fast(text)
        if root is None:
            root = loader.get_single_node()
        data = None
        if root is not None:
            check_duplicates(root, file)
            data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = (exc.problem or "invalid YAML").strip()
        if isinstance(exc, yaml.constructor.ConstructorError) and "cannot read the value" not in what:
            what = f"{what} (only plain YAML is accepted: no object tags)"
        raise SpecError(SpecIssue(file, line, "", f"YAML error: {what}")) from None
    except yaml.YAMLError as exc:
        raise SpecError(SpecIssue(file, None, "", f"YAML error: {' '.join(str(exc).split())}")) from None
    finally:
        loader.dispose()
    return data, Source(file, root)
