"""A lowered plan: for every rank, the ordered torch.distributed calls it makes.

The plan is plain data (no torch): process groups to create once with ``new_group``
(every rank creates every group, in this order, as torch requires), and per rank a list
of :class:`Call` s, each naming the torch.distributed function, the group, the root rank
of ``reduce``/``broadcast``, which part of the rank's local buffer goes in (``send``) and
where the result goes (``recv``).

Two buffer layouts:

* ``chunks`` (reduction programs): a rank's buffer is ``k`` equal chunks, the rows of
  the semantics' state matrix (P² §3.2); a region is a tuple of chunk indices,
  read and written in that order.
* ``tiles`` (resharding): a source rank holds its tile of the tensor, a destination rank
  the tile it must end with (the resharding paper §2.2); a region is a box ``((lo, hi), ...)`` in the
  rank's local coordinates.

:meth:`DistributedPlan.as_dict` is what the interpreter runs, in the package's workers
and in a module written by ``--emit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec.model import DTYPE_BYTES
from ..units import format_rows

__all__ = ["Call", "PlanStep", "DistributedPlan", "format_rows"]

@dataclass(frozen=True)
class Call:
    """One torch.distributed call made by one rank."""

    step: int
    op: str
    group: int  # index into DistributedPlan.groups
    root: int | None  # global rank: reduce's dst, broadcast's src
    send: tuple | None  # region of the local buffer handed to the call (None: receives only)
    recv: tuple | None  # region the result is written to (None: keeps nothing)

    def as_list(self) -> list:
        return [self.step, self.op, self.group, self.root,
                None if self.send is None else [list(x) if isinstance(x, tuple) else x for x in self.send],
                None if self.recv is None else [list(x) if isinstance(x, tuple) else x for x in self.recv]]


@dataclass(frozen=True)
class PlanStep:
    """A step of the plan with what the cost model predicts for it.

    For reduction programs steps run one after another (``start`` is the sum of the
    earlier predictions); for resharding a step is one unit task and ``start`` its
    scheduled start.
    """

    label: str
    ranks: tuple[int, ...]
    nbytes: float
    predicted: float
    start: float = 0.0
    copies: tuple[int, ...] = ()  # ranks that copy locally around the call (packing / unpacking)

    @property
    def end(self) -> float:
        return self.start + self.predicted


@dataclass(frozen=True)
class DistributedPlan:
    title: str
    kind: str  # 'reduction' or 'reshard'
    layout: str  # 'chunks' or 'tiles'
    dtype: str
    devices: tuple[int, ...]  # rank -> cluster device
    groups: tuple[tuple[int, ...], ...]  # sorted ranks
    steps: tuple[PlanStep, ...]
    calls: tuple[tuple[Call, ...], ...]  # per rank, in issue order
    data: dict[str, Any] = field(repr=False)
    barriers: bool  # a barrier before every step, so that steps are timed apart

    @property
    def world(self) -> int:
        return len(self.devices)

    @property
    def predicted(self) -> float:
        return max((s.end for s in self.steps), default=0.0)

    def buffer_bytes(self) -> int:
        """Bytes of every rank's buffer together (what an execution allocates, about twice)."""
        item = DTYPE_BYTES[self.dtype]
        if self.layout == "chunks":
            return self.world * self.data["chunks"] * self.data["chunk_elems"] * item
        total = 0
        for box in self.data["src"] + self.data["dst"]:
            if box is not None:
                n = 1
                for lo, hi in box:
                    n *= hi - lo
                total += n
        return total * item

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: what :mod:`solver_planner.distributed.interpreter` runs."""
        return {"title": self.title, "layout": self.layout, "dtype": self.dtype, "world": self.world,
                "barriers": self.barriers, "groups": [list(g) for g in self.groups],
                "steps": [s.label for s in self.steps],
                "calls": [[c.as_list() for c in rank] for rank in self.calls], "data": self.data}

    def last_writer(self, rank: int, index: tuple[int, ...]) -> int | None:
        """The step whose call last wrote element ``index`` of ``rank``'s buffer (None: none did)."""
        for call in reversed(self.calls[rank]):
            if call.recv is None:
                continue
            if self.layout == "chunks" and index[0] in call.recv:
                return call.step
            if self.layout == "tiles" and all(lo <= i < hi for i, (lo, hi) in zip(index, call.recv)):
                return call.step
        return None

    def describe_call(self, call: Call) -> str:
        group = f"g{call.group}"
        what = "chunks" if self.layout == "chunks" else "tile"
        parts = []
        if call.send is not None:
            parts.append(f"in={self._region(call.send)}")
        if call.recv is not None:
            parts.append(f"out={self._region(call.recv)}")
        root = f", {'dst' if call.op == 'reduce' else 'src'}={call.root}" if call.root is not None else ""
        return f"{call.op}({what} {' '.join(parts) or '-'}, group={group}{root})"

    def _region(self, region: tuple) -> str:
        if self.layout == "chunks":
            return format_rows(region)
        return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in region) + "]"

    def format(self) -> str:
        """The plan as a reader wants it: groups, then every step's calls rank by rank."""
        lines = [f"# {self.title}",
                 f"# {self.world} ranks; rank -> device {list(self.devices)}; {self.layout} layout, {self.dtype}"]
        if self.layout == "chunks":
            lines.append(f"# buffer per rank: {self.data['chunks']} chunks x {self.data['chunk_elems']} elements")
        for n, g in enumerate(self.groups):
            lines.append(f"g{n} = new_group({list(g)})")
        by_step: dict[int, list[tuple[int, Call]]] = {}
        for rank, calls in enumerate(self.calls):
            for c in calls:
                by_step.setdefault(c.step, []).append((rank, c))
        for s, step in enumerate(self.steps):
            copies = f"; local copies on ranks {format_rows(step.copies)}" if step.copies else ""
            lines.append(f"step {s + 1}: {step.label}  (predicted {step.predicted * 1e3:.3f} ms{copies})")
            for rank, c in sorted(by_step.get(s, []), key=lambda rc: rc[0]):
                lines.append(f"  rank {rank}: {self.describe_call(c)}")
        return "\n".join(lines)
