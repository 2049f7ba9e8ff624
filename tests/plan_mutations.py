"""Edits of a plan file, one leaf or one structure at a time, for the tests that require
``check`` to refuse every edit that changes what the file says (issue: a plan file is a
certificate), and the documented edits that change nothing it claims."""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Iterator

from solver_planner.plan.fields import path_text

# Edits that cannot change what a plan file claims, each with the reason (the README's
# `check` section says the same):
# - solve_times: wall-clock measurements of the machine that planned; no check can re-derive them.
# - search.options.time_limit and .seed: the search and the boundary solver are run again with
#   the recorded values; a value under which they give the same answers is as true as the one
#   planned with (the certificate is the answers, which are compared).
# - the order of `boundaries` and of a boundary's `schedule` rows: keyed by channel and task.
# - a respelled gradient program (spaces, case): the same program.
UNCHECKED = ("solve_times",)
FREE_OPTIONS = (("search", "options", "time_limit"), ("search", "options", "seed"))
# - search.options.candidates above the number of (mesh, micro-batch) pairs the search can list:
#   the search lists all it has either way.


def leaves(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, path + (i,))
    else:
        yield path


def containers(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(doc, (dict, list)):
        yield path
        for k, v in (doc.items() if isinstance(doc, dict) else enumerate(doc)):
            yield from containers(v, path + (k,))


def at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def changed(value: Any) -> Any:
    """A value of the same kind that means something else."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return 1.0 if value == 0 or math.isinf(value) else value * 2
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 1
    raise TypeError(value)


def exempt(path: tuple) -> bool:
    return path[:1] in [(k,) for k in UNCHECKED] or path in FREE_OPTIONS


def leaf_edits(doc: dict) -> Iterator[tuple[tuple, str, dict]]:
    """(path, description, edited copy) for every leaf that is not exempt."""
    for path in leaves(doc):
        if exempt(path):
            continue
        new = copy.deepcopy(doc)
        parent = at(new, path[:-1])
        parent[path[-1]] = changed(parent[path[-1]])
        yield path, f"{path_text(path)} = {parent[path[-1]]!r}", new


def structure_edits(doc: dict) -> Iterator[tuple[tuple, str, dict]]:
    """Deleted keys, unknown keys, deleted, duplicated and swapped list entries (where order
    is meaning)."""
    for path in containers(doc):
        node = at(doc, path)
        if exempt(path) or (path and exempt(path + ("",))):
            continue
        if isinstance(node, dict):
            for key in node:
                if exempt(path + (key,)):
                    continue
                new = copy.deepcopy(doc)
                del at(new, path)[key]
                yield path + (key,), f"{path_text(path + (key,))} deleted", new
            new = copy.deepcopy(doc)
            at(new, path)["extra"] = 1
            yield path + ("extra",), f"{path_text(path + ('extra',))}: unknown key added", new
        elif node:
            new = copy.deepcopy(doc)
            del at(new, path)[-1]
            yield path, f"{path_text(path)}: last entry deleted", new
            new = copy.deepcopy(doc)
            at(new, path).append(copy.deepcopy(node[0]))
            yield path, f"{path_text(path)}: first entry repeated at the end", new
            unordered = path in (("boundaries",),) or (len(path) == 3 and path[0] == "boundaries"
                                                        and path[2] == "schedule")
            if len(node) > 1 and node[0] != node[-1] and not unordered:
                new = copy.deepcopy(doc)
                lst = at(new, path)
                lst[0], lst[-1] = lst[-1], lst[0]
                yield path, f"{path_text(path)}: first and last entries swapped", new


def names(report, path: tuple) -> bool:
    """Whether a failure of ``report`` names the edited field: its path, or an enclosing one
    down to the edited entry of a top-level list (``stages[1]`` for ``stages[1].tensor``),
    appears in a failing finding's path or message."""
    first_index = next((n for n, k in enumerate(path) if isinstance(k, int)), None)
    # down to the entry of the first list, or to the list itself when it is a list of values
    shortest = 1 if first_index is None or first_index == len(path) - 1 else first_index + 1
    wanted = [path_text(path[:n]) for n in range(len(path), shortest - 1, -1)]
    text = " ".join(f"{f.path} {f.message}" for f in report.failures)
    return any(re.search(re.escape(w) + r"(?![0-9])", text) for w in wanted)
