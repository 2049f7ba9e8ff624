"""Ports as classes: the resources that exactly the same tasks hold are busy and free
together, so the objective's port bound (:mod:`.objective`) and the fast simulator
(:mod:`.fastsim`) work per class instead of per port, with far fewer sums and checks.

The cost tables hand out one port list per route, so plans of one search that meet the same
lists in the same order have the same classes: they are remembered per cost table by the
lists' identity (at 100 000 GPUs a transfer holds thousands of ports, and finding the classes
again took a third of every simulation)."""

from __future__ import annotations

import weakref

from ..simulate.engine import resource_classes

__all__ = ["port_classes"]

# per StageCosts: {ids of the lists: (the lists, their classes)}; the lists are kept, so
# their ids cannot be reused while an entry lives
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MEMO_ENTRIES = 4096      # a brute-force search simulates up to 20 000 different plans


def port_classes(costs, lists: list) -> tuple[list[tuple[int, ...]], list[bool], list[tuple[int, ...]]]:
    """For port lists (one per kind of task): each list's classes, whether it shares a class
    with another list (one that does not never waits: its own tasks are a chain), and each
    class as the lists holding it."""
    memo = _MEMO.setdefault(costs, {})
    key = tuple(id(x) if len(x) else 0 for x in lists)
    hit = memo.get(key)
    if hit is not None and all(a is b or not (len(a) or len(b)) for a, b in zip(hit[0], lists)):
        return hit[1]
    classes, count = resource_classes([tuple(dict.fromkeys(ports)) for ports in lists])
    holders: list[list[int]] = [[] for _ in range(count)]
    for k, cs in enumerate(classes):
        for c in cs:
            holders[c].append(k)
    shared = [any(len(holders[c]) > 1 for c in cs) for cs in classes]
    out = (classes, shared, [tuple(h) for h in holders])
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = (list(lists), out)
    return out
