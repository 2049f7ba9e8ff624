"""YAML text back into plain data, fast, exactly as PyYAML's safe loader reads it.

A plan file of 100 000 GPUs holds about three million values.  libyaml parses it in about
2 s, but PyYAML then builds a node per value and resolves and constructs each in Python:
about 47 s of ``check``'s time went there.  Here libyaml's events are turned into data
directly, and each distinct scalar (the same few ranks, times and names recur thousands of
times) is resolved and constructed once, by PyYAML's own resolver and safe constructor, so
every value is what ``yaml.load(text, Loader=CSafeLoader)`` gives.

What a file written by hand might hold and this path does not build itself (explicit tags,
merge keys, aliases, several documents, unhashable keys) goes to PyYAML's loader instead:
the same result, or the same error, only slower.  An anchor no alias refers to changes
nothing and is read here.

``strict=True`` (plan files: a certificate says each thing once) refuses, with the line, a
mapping that repeats a key (PyYAML keeps the last value silently), any alias, any merge key
(``<<``: PyYAML drops a merged value a key already has, silently too) and values nested
deeper than ``MAX_DEPTH`` (libyaml's composer recurses in C and crashes the process on
tens of thousands of levels).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (AliasEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent)
from yaml.resolver import Resolver

from ..errors import SpecError
# strict: nesting refused beyond the spec reader's limit (a plan file nests about 8 deep),
# repeated keys found as the spec reader finds them
from ..spec.source import MAX_DEPTH, check_duplicates

__all__ = ["load", "Refused", "MAX_DEPTH"]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RESOLVER = Resolver()
_CONSTRUCTOR = SafeConstructor()
_STR = Resolver.DEFAULT_SCALAR_TAG
# tags the safe constructor builds from a plain scalar without looking at anything else
_PLAIN_TAGS = {"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
               "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp", _STR}


class _Slow(Exception):
    """The text holds something only PyYAML's own loader builds (or refuses) right."""


class Refused(ValueError):
    """``strict``: the text repeats a key, holds an alias or a merge key, or nests too deep
    (``line``: 1-based)."""

    def __init__(self, line: int, reason: str):
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason


_MERGE = "tag:yaml.org,2002:merge"


def _scalar(value: str, implicit: tuple[bool, bool], cache: dict, strict: bool, line: int) -> Any:
    key = (value, implicit)
    if key in cache:
        return cache[key]
    tag = _RESOLVER.resolve(yaml.ScalarNode, value, implicit)
    if tag == _MERGE and strict:
        raise Refused(line, "a merge key (<<): a plan file spells every value out")
    if tag not in _PLAIN_TAGS:              # '<<' (merge), '=' (value): PyYAML's own rules
        raise _Slow
    try:
        out = _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, value))
    except Exception:                       # (2001-02-30, 5 000 digits): PyYAML's error, in its order
        raise _Slow from None
    cache[key] = out
    return out


def _fast(text: str, strict: bool) -> Any:
    cache: dict = {}
    stack: list = []            # open collections: a list, or a _Map
    lines: list[int] = []       # the line each open collection starts on
    doc: Any = None
    documents = 0

    def put(value: Any, line: int) -> None:
        nonlocal doc
        if not stack:
            doc = value
            return
        top = stack[-1]
        if type(top) is list:
            top.append(value)
        elif top.key is _NO_KEY:
            try:
                hash(value)
            except TypeError:
                raise _Slow from None
            if strict and value in top.data:
                raise Refused(line, f"the key {value!r} appears twice in one mapping")
            top.key = value
        else:
            top.data[top.key] = value       # a repeated key: the last one wins, as in PyYAML
            top.key = _NO_KEY

    for event in yaml.parse(text, Loader=_LOADER):
        cls = type(event)
        if cls is ScalarEvent:
            if event.tag is not None and event.tag != "!":
                raise _Slow
            line = event.start_mark.line + 1
            put(_scalar(event.value, event.implicit, cache, strict, line), line)
        elif cls is SequenceStartEvent or cls is MappingStartEvent:
            if event.tag is not None and event.tag != "!":
                raise _Slow
            stack.append([] if cls is SequenceStartEvent else _Map())
            lines.append(event.start_mark.line + 1)
            if strict and len(stack) > MAX_DEPTH:
                raise Refused(lines[-1], f"values nested more than {MAX_DEPTH} deep")
        elif cls is SequenceEndEvent:
            put(stack.pop(), lines.pop())
        elif cls is MappingEndEvent:
            put(stack.pop().data, lines.pop())
        elif cls is DocumentStartEvent:
            documents += 1
            if documents > 1:
                raise _Slow
        elif cls is AliasEvent:
            if strict:
                raise Refused(event.start_mark.line + 1, f"an alias (*{event.anchor}): a plan file spells every"
                                                         " value out")
            raise _Slow
    return doc


_NO_KEY = object()


class _Map:
    """A mapping being read: its data and the key waiting for its value."""

    __slots__ = ("data", "key")

    def __init__(self) -> None:
        self.data: dict = {}
        self.key: Any = _NO_KEY


def load(text: str, strict: bool = False) -> Any:
    """``yaml.load(text, Loader=CSafeLoader)``, faster on large plain files; ``strict``:
    :class:`Refused` on a repeated key or an alias (module docstring)."""
    try:
        return _fast(text, strict)
    except _Slow:
        pass
    if strict:
        # before libyaml composes anything (it recurses in C): depth, aliases and merge keys
        # from the events; then repeated keys as the spec reader finds them
        depth = 0
        for event in yaml.parse(text, Loader=_LOADER):
            line = event.start_mark.line + 1
            if isinstance(event, AliasEvent):
                raise Refused(line, f"an alias (*{event.anchor}): a plan file spells every value out")
            if isinstance(event, ScalarEvent) and event.tag in (None, "!") and \
                    _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit) == _MERGE:
                raise Refused(line, "a merge key (<<): a plan file spells every value out")
            if isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise Refused(line, f"values nested more than {MAX_DEPTH} deep")
            elif isinstance(event, (SequenceEndEvent, MappingEndEvent)):
                depth -= 1
        root = yaml.compose(text, Loader=_LOADER)
        if root is not None:
            try:
                check_duplicates(root, "")
            except SpecError as exc:
                (issue,) = exc.issues
                raise Refused(issue.line, issue.message) from None
    return yaml.load(text, Loader=_LOADER)
