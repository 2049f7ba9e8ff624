"""``--emit``: lowered plans as a small Python module a user can read and run.

The module holds the plans as literals (one call per line, commented with its step) and
the source of :mod:`solver_planner.distributed.interpreter`, so it runs without
solver_planner: ``torchrun --nproc-per-node WORLD plan.py``.  Nothing in it depends on
the time or the machine: the same plans give the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .plan import DistributedPlan

# Read as text, not imported: emitting needs no torch.
INTERPRETER = Path(__file__).with_name("interpreter.py")

__all__ = ["module_text"]


def module_text(plans: Sequence[DistributedPlan], command: str = "") -> str:
    if not plans:
        raise ValueError("nothing to emit")
    world = plans[0].world
    if any(p.world != world for p in plans):
        sizes = ", ".join(str(n) for n in sorted({p.world for p in plans}))
        raise ValueError(f"one module runs under one torchrun, but these plans need {sizes} ranks; emit them apart")
    head = [f'"""{len(plans)} plan{"s" * (len(plans) > 1)} lowered to torch.distributed by solver-planner.',
            "", f"Run: torchrun --nproc-per-node {world} <this file>", ]
    if command:
        head.append(f"Made by: {command}")
    head += ["", "Every call is [step, op, group, root, send, recv]: the torch.distributed function, the index",
             "of its process group in 'groups', the root's global rank (reduce's dst, broadcast's src),",
             "the part of this rank's buffer handed in and where the result goes (chunk indices in the",
             "'chunks' layout, a box of (lo, hi) per dimension in the 'tiles' layout).", '"""', ""]
    body = ["PLANS = ["]
    for plan in plans:
        body += _plan_literal(plan)
    body.append("]")
    source = INTERPRETER.read_text(encoding="utf-8")
    source = source[source.index('"""', 3) + 3:].lstrip("\n")  # drop the interpreter's own docstring
    tail = ["", "", 'if __name__ == "__main__":', "    main_torchrun(PLANS)", ""]
    return "\n".join(head + body) + "\n\n" + source.rstrip("\n") + "\n" + "\n".join(tail)


def _plan_literal(plan: DistributedPlan) -> list[str]:
    d = plan.as_dict()
    out = ["    {", f"        'title': {d['title']!r},"]
    for key in ("layout", "dtype", "world", "barriers", "groups", "steps", "data"):
        out.append(f"        {key!r}: {d[key]!r},")
    out.append("        'calls': [")
    for rank, calls in enumerate(d["calls"]):
        out.append(f"            [  # rank {rank} (device {plan.devices[rank]})")
        for call in calls:
            out.append(f"                {call!r},  # step {call[0] + 1}: {plan.steps[call[0]].label}")
        out.append("            ],")
    out += ["        ],", "    },"]
    return out
