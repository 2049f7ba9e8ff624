"""The reduction DSL of P² §3.3: a program is a list of (slice, form, collective).

Text syntax, one instruction per line or separated by ``;``::

    ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); AllGather(node, InsideGroup)

``Collective(slice, form)`` with the collectives AllReduce, ReduceScatter, AllGather,
Reduce and Broadcast (any case, ``_``/``-`` ignored), a slice naming a level of the
synthesis hierarchy (``root`` or a hardware level), and a form ``InsideGroup``,
``Parallel(level)`` or ``Master(level)`` whose level is above the slice.  ``#`` starts a
comment.  Printing gives back the canonical text, which parses to the same program.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..cost import Collective
from .hierarchy import Form

__all__ = ["Instruction", "Program", "parse_program", "format_program", "COLLECTIVE_NAMES"]

COLLECTIVE_NAMES = {
    Collective.ALLREDUCE: "AllReduce",
    Collective.REDUCESCATTER: "ReduceScatter",
    Collective.ALLGATHER: "AllGather",
    Collective.REDUCE: "Reduce",
    Collective.BROADCAST: "Broadcast",
}


@dataclass(frozen=True)
class Instruction:
    """One reduction step: ``collective`` on the groups ``(slice, form)`` derives."""

    slice: str
    form: Form
    collective: Collective

    def __str__(self) -> str:
        return f"{COLLECTIVE_NAMES[self.collective]}({self.slice}, {self.form})"


Program = tuple[Instruction, ...]

_INSTR = re.compile(
    r"^\s*(?P<coll>[A-Za-z_\-]+)\s*\(\s*(?P<slice>[A-Za-z_][\w.\-]*)\s*,\s*"
    r"(?P<form>InsideGroup|(?P<kind>Parallel|Master)\s*\(\s*(?P<level>[A-Za-z_][\w.\-]*)\s*\))\s*\)\s*$",
    re.IGNORECASE,
)


def parse_program(text: str) -> Program:
    """Parse DSL text; raise ``ValueError`` naming the instruction that does not read."""
    out = []
    lines = [part for line in text.splitlines() for part in line.split("#", 1)[0].split(";")]
    for n, part in enumerate(p for p in lines if p.strip()):
        m = _INSTR.match(part)
        if m is None:
            raise ValueError(f"instruction {n + 1} {part.strip()!r} does not read as Collective(slice, form),"
                             " e.g. AllReduce(node, Parallel(root))")
        try:
            coll = Collective.parse(m.group("coll"))
        except ValueError as exc:
            raise ValueError(f"instruction {n + 1}: {exc}") from None
        if m.group("kind"):
            form = Form(m.group("kind").capitalize(), m.group("level"))
        else:
            form = Form("InsideGroup")
        out.append(Instruction(m.group("slice"), form, coll))
    if not out:
        raise ValueError("the program has no instruction")
    return tuple(out)


def format_program(program: Program, sep: str = "; ") -> str:
    return sep.join(str(i) for i in program)
