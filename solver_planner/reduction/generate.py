"""Random explicit reduction programs, valid and invalid, for differential testing.

A program is built from a hierarchical recipe of the kind people write by hand (flat
all-reduce; reduce-scatter inside blocks, all-reduce across them, all-gather back;
reduce to a root, all-reduce among roots, broadcast back; recursive halving and doubling)
over random reduction groups, random blocks and *unsorted* group orders, and is then
mutated with some probability (a member moved, a group reordered, a collective swapped,
a step dropped or repeated, blocks paired at the wrong position).  About half of the
programs come out valid.  Deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..cost import Collective

__all__ = ["RandomProgram", "random_program"]

Step = tuple[Collective, list[list[int]]]


@dataclass
class RandomProgram:
    num_devices: int
    chunks: int  # k: the reduction group size
    reduction_groups: list[list[int]]
    steps: list[Step]
    recipe: str


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def _reduction_groups(rng: random.Random, n: int) -> list[list[int]]:
    sizes = [d for d in _divisors(n) if d >= 2] + [n]
    size = rng.choice(sizes)
    devices = list(range(n))
    how = rng.choice(["contiguous", "strided", "shuffled"])
    if how == "shuffled":
        rng.shuffle(devices)
        groups = [sorted(devices[i:i + size]) for i in range(0, n, size)]
    elif how == "strided":
        stride = n // size
        groups = [list(range(i, n, stride)) for i in range(stride)]
    else:
        groups = [list(range(i, i + size)) for i in range(0, n, size)]
    return groups


def _blocks(rng: random.Random, members: list[int], b: int) -> list[list[int]]:
    """``members`` cut into blocks of ``b``, in a random arrangement, each in a random order."""
    order = list(members)
    if rng.random() < 0.6:
        rng.shuffle(order)
    blocks = [order[i:i + b] for i in range(0, len(order), b)]
    for blk in blocks:
        if rng.random() < 0.5:
            rng.shuffle(blk)
    return blocks


def _hierarchical(rng: random.Random, groups: list[list[int]]) -> tuple[str, list[Step]]:
    size = len(groups[0])
    ds = _divisors(size)
    recipe = rng.choice(["allreduce", "two-allreduce", "rs-ar-ag", "reduce-ar-bcast", "rs-rs-ar-ag-ag", "halving"]
                        if ds else ["allreduce"])
    AR, RS, AG, RED, BC = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.REDUCE,
                           Collective.BROADCAST)
    if recipe == "allreduce":
        return recipe, [(AR, [rng.sample(g, len(g)) for g in groups])]
    if recipe == "halving":
        # Recursive halving then doubling (Rabenseifner) over a power-of-two group, pairs by bit.
        if size & (size - 1):
            return "allreduce", [(AR, [list(g) for g in groups])]
        bits = size.bit_length() - 1
        perms = [rng.sample(g, size) for g in groups]
        steps: list[Step] = []
        for bit in reversed(range(bits)):
            steps.append((RS, [[p[i], p[i ^ (1 << bit)]] for p in perms for i in range(size) if not i >> bit & 1]))
        for bit in range(bits):
            steps.append((AG, [[p[i], p[i ^ (1 << bit)]] for p in perms for i in range(size) if not i >> bit & 1]))
        return recipe, steps
    b = rng.choice(ds)
    blocks = [_blocks(rng, g, b) for g in groups]
    inside = [blk for bl in blocks for blk in bl]
    # Across: the p-th written member of every block of one reduction group.
    across = [[blk[p] for blk in bl] for bl in blocks for p in range(b)]
    if recipe == "two-allreduce":
        return recipe, [(AR, inside), (AR, across)]
    if recipe == "rs-ar-ag":
        return recipe, [(RS, inside), (AR, across), (AG, [rng.sample(blk, len(blk)) for blk in inside])]
    if recipe == "reduce-ar-bcast":
        roots = [[blk[0] for blk in bl] for bl in blocks]
        return recipe, [(RED, inside), (AR, roots), (BC, inside)]
    # Two levels of scatter: inside blocks, then across blocks in sub-blocks.
    outer = [blk for blk in across]
    ds2 = _divisors(len(outer[0])) if len(outer[0]) > 2 else []
    if not ds2:
        return "rs-ar-ag", [(RS, inside), (AR, across), (AG, inside)]
    c = rng.choice(ds2)
    sub = [o[i:i + c] for o in outer for i in range(0, len(o), c)]
    cross = [[o[i + j] for i in range(0, len(o), c)] for o in outer for j in range(c)]
    return recipe, [(RS, inside), (RS, sub), (AR, cross), (AG, sub), (AG, inside)]


def _mutate(rng: random.Random, steps: list[Step], n: int) -> tuple[str, list[Step]]:
    steps = [(k, [list(g) for g in gs]) for k, gs in steps]
    what = rng.choice(["reorder", "move", "collective", "drop", "repeat", "shift", "broadcast"])
    s = rng.randrange(len(steps))
    kind, groups = steps[s]
    if what == "reorder":
        g = rng.choice(groups)
        rng.shuffle(g)
    elif what == "move" and len(groups) > 1:
        a, b = rng.sample(range(len(groups)), 2)
        if groups[a] and groups[b]:
            i, j = rng.randrange(len(groups[a])), rng.randrange(len(groups[b]))
            groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
    elif what == "collective":
        steps[s] = (rng.choice([c for c in Collective if c is not kind]), groups)
    elif what == "drop" and len(steps) > 1:
        del steps[s]
    elif what == "repeat":
        steps.insert(s, (kind, [list(g) for g in groups]))
    elif what == "shift" and len(groups) > 1:
        # Pair block members at the wrong position: rotate one group's members.
        g = rng.choice(groups)
        g.append(g.pop(0))
    else:
        # A broadcast from a random device of a random subset.
        members = rng.sample(range(n), rng.randint(2, max(2, n // 2)))
        steps.insert(rng.randrange(len(steps) + 1), (Collective.BROADCAST, [members]))
    return what, steps


SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def random_program(rng: random.Random, min_devices: int = 4, max_devices: int = 64,
                   mutate: float = 0.5, num_devices: int | None = None) -> RandomProgram:
    """A random program on ``min_devices..max_devices`` devices, or exactly ``num_devices``
    (``mutate``: the chance of each further edit, at most three)."""
    n = num_devices or rng.choice([d for d in SIZES if min_devices <= d <= max_devices])
    groups = _reduction_groups(rng, n)
    recipe, steps = _hierarchical(rng, groups)
    edits = 0
    while rng.random() < mutate and edits < 3:
        what, steps = _mutate(rng, steps, n)
        recipe += f"+{what}"
        edits += 1
    return RandomProgram(n, len(groups[0]), groups, steps, recipe)
