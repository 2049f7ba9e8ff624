"""Start N local processes, run lowered plans on them, collect timings and checks.

One launch runs a list of plans, so that N processes start (and import torch) once for
all of them.  Every process joins one torch.distributed job (gloo on CPU; nccl when
there is a GPU per rank), creates the union of the plans' groups once, then for every
plan runs ``warmup + repeat`` times: fresh inputs, a barrier, the calls, the check.
Clocks are comparable because all ranks are on this machine (``time.perf_counter`` is
the system's monotonic clock), so a step's measured time is the span from its first
rank starting to its last rank finishing.
"""

from __future__ import annotations

import os
import queue as queue_mod
import statistics
import tempfile
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Sequence

from ..errors import MissingDependencyError, OptionError, PlannerError
from .plan import DistributedPlan

__all__ = ["require_torch", "choose_backend", "join_job", "Failure", "Execution", "execute_plans", "run_workers",
           "forkserver_context",
           "INSTALL_HINT"]

INSTALL_HINT = "pip install 'solver-planner[torch]' (or: pip install torch==2.13.0)"


def require_torch():
    """The torch module, or :class:`MissingDependencyError` saying how to install it."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise MissingDependencyError(f"this command runs torch.distributed, which is not installed; {INSTALL_HINT}"
                                     ) from None
    if not dist.is_available():
        raise MissingDependencyError("this torch build has no torch.distributed; " + INSTALL_HINT)
    return torch


def choose_backend(backend: str, world: int) -> str:
    """``auto``: nccl when every rank can have a GPU of its own, else gloo."""
    torch = require_torch()
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend == "gloo" and not dist.is_gloo_available():
        raise MissingDependencyError("this torch build has no gloo backend")
    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.device_count() >= world):
        raise OptionError(f"--backend nccl needs {world} GPUs; this machine has {torch.cuda.device_count()}: use gloo")
    if backend not in ("gloo", "nccl"):
        raise OptionError(f"unknown backend {backend!r}; expected auto, gloo or nccl")
    return backend


@dataclass(frozen=True)
class Failure:
    """The first wrong element a rank found: where, which step last wrote it, the values."""

    rank: int
    step: int | None  # 0-based; None when no call wrote the element
    index: tuple[int, ...]
    got: int
    want: int
    repetition: int

    def describe(self, plan: DistributedPlan) -> str:
        what = "chunk {}, element {}".format(*self.index) if plan.layout == "chunks" else f"element {list(self.index)}"
        step = ("no step wrote it" if self.step is None
                else f"last written by step {self.step + 1} ({plan.steps[self.step].label})")
        return f"rank {self.rank} (device {plan.devices[self.rank]}): {what} is {self.got}, expected {self.want}; {step}"


@dataclass
class Execution:
    """Measured and predicted times of one plan, and the result of every rank's check."""

    plan: DistributedPlan
    backend: str
    repeat: int
    step_times: list[float]  # measured, median over repetitions
    step_starts: list[float]  # measured, relative to the first call, median
    total: float  # measured makespan, median
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"title": plan.title, "world": plan.world, "backend": self.backend, "repeat": self.repeat,
                "ok": self.ok, "measured": self.total, "predicted": plan.predicted,
                "steps": [{"step": n + 1, "label": s.label, "ranks": list(s.ranks), "bytes": s.nbytes,
                           "predicted": s.predicted, "predicted_start": s.start,
                           "measured": self.step_times[n], "measured_start": self.step_starts[n]}
                          for n, s in enumerate(plan.steps)],
                "failures": [{"rank": f.rank, "device": plan.devices[f.rank],
                              "step": None if f.step is None else f.step + 1, "index": list(f.index), "got": f.got,
                              "expected": f.want, "message": f.describe(plan)} for f in self.failures]}


def join_job(rank: int, world: int, backend: str, store: str, timeout: float) -> str:
    """Join the local job through the file ``store``; the device this rank's tensors live on."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)  # nccl's barrier and collectives use the current device
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))
    return f"cuda:{rank}" if backend == "nccl" else "cpu"


def _worker(rank: int, world: int, backend: str, store: str, plans: list[dict], repeat: int, warmup: int,
            timeout: float, results) -> None:
    """One process: join the job, run every plan, put ``(rank, per-plan results)`` on ``results``."""
    try:
        import torch.distributed as dist

        from . import interpreter as it

        device = join_job(rank, world, backend, store, timeout)
        made: dict[tuple, Any] = {}
        for plan in plans:  # the union of the plans' groups, in the same order on every rank
            for g in plan["groups"]:
                if tuple(g) not in made:
                    made[tuple(g)] = dist.new_group(list(g))
        out = []
        data: dict[str, tuple] = {}  # plans of one placement share their inputs and expected sums
        for plan in plans:
            groups = [made[tuple(g)] for g in plan["groups"]]
            key = repr((plan["layout"], plan["dtype"], plan["data"]))
            if key not in data:
                data[key] = (it.initial(plan, rank, device), it.expected(plan, rank))
            start, want = data[key]
            reps, first_bad = [], None
            for rep in range(warmup + repeat):
                buf = start.clone()
                dist.barrier()
                records = it.run(plan, rank, buf, groups)
                bad = it.check(plan, rank, buf, want)
                if bad is not None and first_bad is None:
                    first_bad = bad + [rep]
                if rep >= warmup:
                    reps.append(records)
            out.append({"records": reps, "bad": first_bad})
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which stops the others
        results.put((rank, None, traceback.format_exc()))


def forkserver_context():
    """Processes forked from a fork server that imported torch once: fork itself is unsafe once
    torch has threads, and spawn makes every rank import torch again (seconds each)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "solver_planner.distributed.interpreter",
                                "solver_planner.run.stage", "solver_planner.run.worker"])
    return ctx


def run_workers(target: Callable, world: int, args: Sequence, timeout: float) -> list[Any]:
    """Start ``world`` processes of ``target(rank, world, *args, results)``; their results by rank.

    A rank that raises (or a job that outlives ``timeout``) stops every process and raises
    :class:`PlannerError` with the rank's traceback.
    """
    ctx = forkserver_context()
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, world, *args, results), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < world:
            try:
                rank, value, error = results.get(timeout=timeout)
            except queue_mod.Empty:
                raise PlannerError(f"the {world} processes did not finish within {timeout:.0f} s") from None
            if error is not None:
                raise PlannerError(f"rank {rank} failed:\n{error.rstrip()}")
            got[rank] = value
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
    return [got[r] for r in range(world)]


def execute_plans(plans: Sequence[DistributedPlan], backend: str = "auto", repeat: int = 3, warmup: int = 1,
                  timeout: float = 300.0) -> list[Execution]:
    """Run every plan on one set of ``plans[0].world`` local processes; check and time each."""
    if not plans:
        return []
    world = plans[0].world
    if any(p.world != world for p in plans):
        raise PlannerError("plans run together must have the same number of ranks")
    if repeat < 1 or warmup < 0:
        raise PlannerError("repeat must be at least 1 and warmup at least 0")
    backend = choose_backend(backend, world)
    with tempfile.TemporaryDirectory(prefix="solver-planner-") as tmp:
        store = os.path.join(tmp, "store")
        per_rank = run_workers(_worker, world, (backend, store, [p.as_dict() for p in plans], repeat, warmup,
                                                timeout), timeout)
    return [_summarize(plan, backend, repeat, [per_rank[r][n] for r in range(world)]) for n, plan in enumerate(plans)]


def _summarize(plan: DistributedPlan, backend: str, repeat: int, ranks: list[dict]) -> Execution:
    steps = len(plan.steps)
    times: list[list[float]] = [[] for _ in range(steps)]
    starts: list[list[float]] = [[] for _ in range(steps)]
    totals = []
    for rep in range(repeat):
        first = [float("inf")] * steps
        last = [float("-inf")] * steps
        for rank in ranks:
            for step, start, end in rank["records"][rep]:
                first[step] = min(first[step], start)
                last[step] = max(last[step], end)
        origin = min((f for f in first if f != float("inf")), default=0.0)
        totals.append(max((e for e in last if e != float("-inf")), default=origin) - origin)
        for s in range(steps):
            ran = first[s] != float("inf")
            times[s].append(last[s] - first[s] if ran else 0.0)
            starts[s].append(first[s] - origin if ran else 0.0)
    failures = []
    for rank, result in enumerate(ranks):
        if result["bad"] is not None:
            index, got, want, rep = result["bad"]
            failures.append(Failure(rank, plan.last_writer(rank, tuple(index)), tuple(index), got, want, rep))
    return Execution(plan, backend, repeat, [statistics.median(t) for t in times],
                     [statistics.median(s) for s in starts], statistics.median(totals), failures)
