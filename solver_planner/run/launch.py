"""Start a plan's world as local processes, train, compare with one process: :func:`run_plan`.

One process per device of the plan, forked from a fork server that imported torch once
(fork itself is unsafe once torch has threads); ranks join through a file store, so nothing
listens on a port.  The launcher watches every process: the first
rank that raises, or exits without a word (killed), ends the run -- the others are stopped
at once, so no process outlives the launcher, and the error names the rank, its step and
what it was doing (a table every rank writes its progress into, in shared memory).
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import OptionError, PlannerError
from .job import RunJob
from .worker import ACTION_CODES

__all__ = ["RunResult", "run_plan", "run_plans", "process_limit", "MEMORY_PER_PROCESS"]

MEMORY_PER_PROCESS = 0.5 * 2**30    # bytes: a process with torch and gloo imported, before the model
# the pipeline runtime that executes action lists, and PipelineStage's static shapes, as run
# uses them (private parts of torch.distributed.pipelining): the version it is tested with
TORCH_MINIMUM = (2, 13)


@dataclass
class RunResult:
    job: RunJob
    backend: str
    losses: list[float]
    reference_losses: list[float] | None
    max_parameter_difference: float | None
    worst_parameter: str | None
    step_times: list[float]                  # per step: the slowest rank's
    ranks: list[dict[str, Any]] = field(repr=False, default_factory=list)

    def buckets(self, rank: int) -> dict[str, int] | None:
        """The last step's gradient buckets of ``rank``: how many its program reduced, and how
        many of them it started while the stage's last backward ran (None: no bucketed program)."""
        steps = next((r.get("overlapped") for r in self.ranks if r.get("rank") == rank), None)
        if not steps:
            return None
        during, total = steps[-1]
        return {"reduced": total, "started_during_backward": during}

    @property
    def measured_step_time(self) -> float:
        """Median step time, the first step (warm-up: allocation, first collectives) left out."""
        rest = self.step_times[1:] or self.step_times
        return statistics.median(rest)

    def as_dict(self) -> dict[str, Any]:
        ref = self.reference_losses
        return {
            "backend": self.backend, "world": self.job.world, "schedule": self.job.schedule_name,
            "microbatches": self.job.microbatches, "microbatch_size": self.job.microbatch_size,
            "steps": [{"step": i + 1, "loss": loss, "reference_loss": None if ref is None else ref[i],
                       "time": self.step_times[i]} for i, loss in enumerate(self.losses)],
            "max_parameter_difference": self.max_parameter_difference, "worst_parameter": self.worst_parameter,
            "measured_step_time": self.measured_step_time,
            "predicted_iteration_time": self.job.predicted_iteration_time,
            "stages": [{"stage": s.index, "layers": [s.first, s.last], "ranks": s.grid, "recompute": s.recompute,
                        "gradient_program": s.program_text, "gradient_buckets": self.buckets(s.ranks[0])}
                       for s in self.job.stages],
            "notes": list(self.job.notes),
        }


def process_limit() -> int:
    """How many ``run`` processes this machine can host: its available memory over what one
    process takes (:data:`MEMORY_PER_PROCESS`)."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = 8 * 2**30
    return max(1, int(available // MEMORY_PER_PROCESS))


def _check_torch():
    from ..distributed.launch import require_torch

    torch = require_torch()
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < TORCH_MINIMUM:
        from ..errors import MissingDependencyError

        raise MissingDependencyError(f"run executes plans with torch.distributed.pipelining's runtime, which needs"
                                     f" torch >= {'.'.join(map(str, TORCH_MINIMUM))}; this is {torch.__version__}")
    return torch


def run_plan(job: RunJob, backend: str = "gloo", timeout: float = 30.0, compare: bool = True,
             on_step: Callable[[int], None] | None = None, fail: tuple | None = None,
             limit: int | None = None) -> RunResult:
    """Train ``job`` on ``job.world`` local processes; with ``compare``, against one process.

    ``timeout``: seconds any collective may wait (a dead or stuck peer ends the run after at
    most this); ``on_step(step)`` after each finished step; ``fail``: see the worker's
    failure injection (tests).  Raises :class:`OptionError` before starting when the machine
    cannot host the world, :class:`PlannerError` when a rank fails."""
    return run_plans([job], backend, timeout, compare, (lambda _n, s: on_step(s)) if on_step else None, fail,
                     limit)[0]


def run_plans(jobs: list[RunJob], backend: str = "gloo", timeout: float = 30.0, compare: bool = True,
              on_step: Callable[[int, int], None] | None = None, fail: tuple | None = None,
              limit: int | None = None) -> list[RunResult]:
    """:func:`run_plan` for jobs of one world size, one after the other in the same processes
    (they start, and import torch, once); ``on_step(job, step)``."""
    torch = _check_torch()
    from ..distributed.launch import choose_backend

    world = jobs[0].world
    if any(j.world != world for j in jobs):
        raise OptionError("jobs run together must have the same number of ranks")
    limit = process_limit() if limit is None else limit
    if world > limit:
        raise OptionError(f"the plan has {world} ranks; this machine can host {limit} run processes (about"
                          f" {MEMORY_PER_PROCESS / 2**30:.1f} GiB each): plan for a smaller cluster spec")
    backend = choose_backend(backend, world)
    from ..distributed.launch import forkserver_context
    from .model import reference
    from .worker import worker

    ref_losses: list[list[float] | None] = []
    with tempfile.TemporaryDirectory(prefix="solver-planner-run-") as tmp:
        paths: list[str | None] = []
        for n, job in enumerate(jobs):
            if not compare:
                ref_losses.append(None)
                paths.append(None)
                continue
            losses, params = reference(job.shape, job.steps, job.microbatches, job.microbatch_size, job.optimizer,
                                       job.seed)
            ref_losses.append(losses)
            paths.append(os.path.join(tmp, f"reference-{n}.pt"))
            torch.save(params, paths[-1])
        ctx = forkserver_context()
        table = ctx.Array("q", [-1] * (3 * world), lock=False)
        results = ctx.Queue()
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, world, jobs, backend, store, paths, table, timeout, fail,
                                                  results), daemon=True, name=f"rank {r}")
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            got = _collect(procs, results, table, jobs[0], on_step)
        finally:
            _stop(procs)
    out = []
    for n, job in enumerate(jobs):
        ranks = [got[r][n] for r in range(world)]
        losses = next(r["losses"] for r in ranks if r["losses"])
        step_times = [max(r["times"][i] for r in ranks) for i in range(job.steps)]
        worst = max(ranks, key=lambda r: r.get("worst", 0.0)) if compare else None
        out.append(RunResult(job, backend, losses, ref_losses[n], worst["worst"] if worst else None,
                             worst["worst_parameter"] if worst else None, step_times, ranks))
    return out


def _where(table, rank: int) -> str:
    step, code, mb = table[3 * rank], table[3 * rank + 1], table[3 * rank + 2]
    if code < 0:
        return "before joining the job"
    what = ACTION_CODES[code] + (f" of micro-batch {mb}" if mb >= 0 else "")
    return f"at step {step + 1}, in {what}" if step >= 0 else f"in {what}"


_PEER_LOSS = ("Connection reset", "Connection closed", "timed out", "Timed out", "Broken pipe", "DistBackendError",
              "DistNetworkError")


def _collect(procs, results, table, job: RunJob, on_step) -> dict[int, dict]:
    got: dict[int, dict] = {}
    while len(got) < len(procs):
        try:
            kind, rank, value = results.get(timeout=0.2)
        except queue_mod.Empty:
            if any(p.exitcode is not None and r not in got for r, p in enumerate(procs)):
                time.sleep(1.0)     # a message the rank put before exiting may still be on its way
                _fail(procs, results, table, job, got, [])
            continue
        if kind == "error":
            _fail(procs, results, table, job, got, [(rank, value)])
        elif kind == "step":
            if on_step is not None:
                on_step(*value)
        else:
            got[rank] = value
    return got


def _fail(procs, results, table, job: RunJob, got, errors) -> None:
    """Raise the run's first cause: when a rank fails, its peers fail too a moment later (a
    closed connection, a timed-out collective), so the errors of the next second are read and
    the cause is the rank that failed on its own, else a rank killed outright."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            kind, rank, value = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue_mod.Empty:
            break
        if kind == "error":
            errors.append((rank, value))
        elif kind == "done":
            got[rank] = value
    reported = {r for r, _ in errors}
    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reported and r not in got]
    own = [(r, text) for r, text in errors if not any(m in text for m in _PEER_LOSS)]
    others = f"(the other {len(procs) - 1} ranks were stopped)"
    if own:
        raise PlannerError(own[0][1].rstrip() + "\n" + others)
    if silent:
        r = silent[0]
        code = procs[r].exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        raise PlannerError(f"rank {r} (stage {job.stage_of(r).index}) {how} {_where(table, r)}; {others}")
    if errors:
        raise PlannerError(errors[0][1].rstrip() + "\n" + others)
    r = next(r for r, p in enumerate(procs) if p.exitcode is not None and r not in got)
    raise PlannerError(f"rank {r} (stage {job.stage_of(r).index}) ended without a result {_where(table, r)}; {others}")


def _stop(procs) -> None:
    """No process outlives the run: wait briefly for ranks that finished, stop the rest."""
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
