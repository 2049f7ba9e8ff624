"""Tasks whose durations and resources come from the shared cost model.

These helpers are how every planner replays its answer: a collective step, a transfer, a
pipelined broadcast or a compute step becomes one simulator task that lasts exactly the
cost model's time and holds exactly the resources (ports, compute streams) it crosses.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..cost import CostModel
from ..topology import Resource
from .engine import Simulation

__all__ = ["add_collective", "add_transfer", "add_broadcast", "add_compute", "compute_resource"]


def compute_resource(device: int) -> Resource:
    """The compute stream of ``device`` (one kernel at a time)."""
    return Resource("compute", device, "exec")


def add_collective(sim: Simulation, cost: CostModel, kind: str, groups: Sequence[Sequence[int]],
                   nbytes: float | Sequence[float],
                   algorithm: str = "ring", deps: Iterable[int] = (), name: str | None = None, **kw) -> int:
    """One step in which every group runs ``kind`` at once (a P² reduction step)."""
    c = cost.collective(kind, groups, nbytes, algorithm)
    devices = sorted(d for g in groups for d in g)
    return sim.add(name or f"{c.collective} {len(c.group_times)}x{c.group_size}", c.time, sorted(c.resources), deps,
                   devices=devices, stream=kw.pop("stream", "comm"), category=kw.pop("category", c.collective),
                   args={"bytes": c.nbytes, "algorithm": c.algorithm, "bus_bandwidth": c.bus_bandwidth,
                         "bottleneck": c.bottleneck}, **kw)


def add_transfer(sim: Simulation, cost: CostModel, src: int, dst: int, nbytes: float,
                 deps: Iterable[int] = (), name: str | None = None, **kw) -> int:
    """A point-to-point send from ``src`` to ``dst``."""
    route = cost.route(src, dst)
    return sim.add(name or f"send {src}->{dst}", cost.transfer_time(src, dst, nbytes), list(route.resources), deps,
                   devices=(src, dst), stream=kw.pop("stream", "comm"), category=kw.pop("category", "p2p"),
                   args={"bytes": nbytes, "interconnect": route.interconnect}, **kw)


def add_broadcast(sim: Simulation, cost: CostModel, src: int, dsts: Sequence[int], nbytes: float,
                  deps: Iterable[int] = (), name: str | None = None, chunks: int | None = None, **kw) -> int:
    """A pipelined chain broadcast from ``src`` (the resharding paper §3.1)."""
    b = cost.pipelined_broadcast(src, dsts, nbytes, chunks)
    return sim.add(name or f"broadcast {src}->{len(b.chain) - 1}", b.time, sorted(b.resources), deps,
                   devices=b.chain, stream=kw.pop("stream", "comm"), category=kw.pop("category", "broadcast"),
                   args={"bytes": nbytes, "chunks": b.chunks}, **kw)


def add_compute(sim: Simulation, cost: CostModel, device: int, flops: float,
                deps: Iterable[int] = (), name: str | None = None, **kw) -> int:
    """``flops`` of work on ``device`` at its peak rate."""
    return sim.add(name or f"compute {device}", cost.compute_time(flops), [compute_resource(device)], deps,
                   devices=(device,), stream=kw.pop("stream", "compute"), category=kw.pop("category", "compute"),
                   args={"flops": flops}, **kw)
