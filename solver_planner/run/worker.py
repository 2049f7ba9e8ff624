"""What every rank of ``run`` does (SPMD), from a :class:`~solver_planner.run.job.RunJob`.

1. Every stage's ``DeviceMesh`` (rows data replicas, columns tensor positions), in stage
   order, on every rank: torch creates a mesh's groups collectively, so a rank that built
   only its own stage's mesh would pair its groups with other ranks' different groups.
2. Every other process group, in one fixed order on every rank: the pipeline lanes (the
   k-th rank of every stage), the gradient programs' groups, one group per (boundary,
   direction, member set) -- sharing a group between the two directions can deadlock, since
   activations and gradients of different micro-batches are in flight at once -- and the
   tied-embedding pairs.
3. Its stage (:mod:`solver_planner.run.stage`), its optimizer, torch's schedule
   (``ScheduleGPipe``, ``Schedule1F1B``, or the pipeline runtime fed the plan's action list).
4. Every step: the schedule; the plan's gradient program over the stage's data groups, per
   bucket as the stage's last backward produces them (``gradient_overlap``, :mod:`.buckets`)
   or once after it; the tied embedding's gradient summed between its two owners; the optimizer.
5. At the end: every parameter compared with the single-process reference.
"""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from typing import Any

from .job import RunJob

__all__ = ["worker", "ACTION_CODES"]

ACTION_CODES = ("starting", "step start", "forward", "backward", "weight gradient", "gradient program",
                "optimizer", "done")


class Progress:
    """Where this rank is, in a table shared with the launcher (step, action, micro-batch),
    so that a rank killed outright, or stuck in a collective, can still be named."""

    def __init__(self, table, rank: int):
        self.table, self.rank = table, rank
        self.step = -1
        self.action = "starting"

    def mark(self, action: str, microbatch: int = -1) -> None:
        self.action = action if microbatch < 0 else f"{action} of micro-batch {microbatch}"
        base = self.rank * 3
        self.table[base], self.table[base + 1], self.table[base + 2] = self.step, ACTION_CODES.index(action), microbatch


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the launcher dies, so nothing is left behind."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def worker(rank: int, world: int, jobs: list[RunJob], backend: str, store: str, references: list[str | None],
           table, timeout: float, fail: tuple | None, results) -> None:
    """One process of the run: every job in turn (each with its own groups), in one torch job
    so that processes start once.  Puts ``("done", rank, results by job)`` or ``("error",
    rank, text)`` on ``results``, and ``("step", rank, (job, step))`` as the last stage
    finishes each step."""
    _die_with_parent()
    progress = Progress(table, rank)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)   # one core per process: the ranks share this machine's cores
        # what torchrun would set, for code that reads it (the job itself joins through `store`)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                          GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        try:
            out = [_train(rank, n, job, backend, ref, progress, timeout, fail, results)
                   for n, (job, ref) in enumerate(zip(jobs, references))]
        finally:
            dist.destroy_process_group()
        results.put(("done", rank, out))
    except BaseException as e:  # noqa: BLE001 - the launcher reports it and stops the others
        where = f"step {progress.step + 1}" if progress.step >= 0 else "setup"
        results.put(("error", rank, f"rank {rank} failed at {where}, in {progress.action}: {type(e).__name__}: {e}\n"
                                    + traceback.format_exc()))


def _groups(job: RunJob, rank: int, backend: str, timeout: float):
    """Steps 1 and 2 of the module docstring: (meshes, lane, program groups, boundary groups, tied pairs)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    tmo = timedelta(seconds=timeout)
    # a group's timeout defaults to 30 minutes, not the world's: every group gets ours, so a
    # dead peer ends the run instead of hanging it
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = tmo
        override = ((backend, opts), (backend, opts))
    else:
        override = None
    device = "cuda" if backend == "nccl" else "cpu"
    meshes = [DeviceMesh(device, torch.tensor(s.grid), mesh_dim_names=("dp", "tp"), backend_override=override)
              for s in job.stages]

    def group(members):
        return dist.new_group(sorted(members), timeout=tmo)

    me = job.stage_of(rank)
    widest = max(len(s.ranks) for s in job.stages)
    lane = None
    for k in range(widest):
        members = [s.ranks[k % len(s.ranks)] for s in job.stages]
        # torch's pipeline group: stage p must be its rank p, true since stages hold ascending ranks
        g = group(members)
        if lane is None and members[me.index] == rank:
            lane = g
    programs = {}
    for s in job.stages:
        if s.program is not None:
            programs[s.index] = [group(g) for g in s.program["groups"]]
    boundary = {}
    for key in sorted(job.boundaries, key=lambda k: (job.boundaries[k].stage, job.boundaries[k].kind)):
        for members in job.boundaries[key].groups:
            boundary[(key, tuple(members))] = group(members)
    tied = []
    if job.shape.kind == "gpt" and job.shape.tied and len(job.stages) > 1:
        a, b = job.stages[0], job.stages[-1]
        for k in range(max(len(a.ranks), len(b.ranks))):
            pair = [a.ranks[k % len(a.ranks)], b.ranks[k % len(b.ranks)]]
            g = group(pair)
            if rank in pair:
                tied.append(g)
    return meshes, lane, programs, boundary, tied


def _tie(job: RunJob, stage, module, tied) -> None:
    """The tied token table: after the data-parallel program each owner holds its whole
    contribution; one all-reduce per (first-stage, last-stage) pair gives both the sum
    (Megatron-LM's embedding group)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    if not tied:
        return
    layer = module.layers[str(0 if stage.first == 0 else job.shape.layers - 1)]
    layer = getattr(layer, "_checkpoint_wrapped_module", layer)
    weight = layer.tokens.weight if stage.first == 0 else layer.weight
    grad = weight.grad.full_tensor() if isinstance(weight.grad, DTensor) else weight.grad
    total = grad
    for g in tied:  # a rank of the smaller stage sits in several pairs: the same sum each time
        total = grad.clone()
        dist.all_reduce(total, group=g)
    if isinstance(weight.grad, DTensor):
        weight.grad = DTensor.from_local(total, weight.grad.device_mesh, [Replicate()]).redistribute(
            weight.grad.device_mesh, weight.grad.placements)
    else:
        weight.grad.copy_(total)


def _train(rank: int, index: int, job: RunJob, backend: str, reference_path: str | None, progress: Progress,
           timeout: float, fail, results) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime
    from torch.distributed.tensor import DTensor

    from .buckets import OverlappedReduction, reduce_after_backward
    from .model import batch, loss_sum, make_optimizer
    from .stage import BroadcastStage, ProgramStage, stage_module

    meshes, lane, programs, boundary_groups, tied = _groups(job, rank, backend, timeout)
    stage = job.stage_of(rank)
    p, S = stage.index, len(job.stages)
    mesh = meshes[p]
    shape = job.shape
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    sharding = job.sharding if stage.data > 1 else "none"      # one replica: nothing to shard
    module = stage_module(shape, stage.first, stage.last, mesh, stage.tensor, stage.recompute,
                          sharding, job.sequence_parallel, job.seed)
    module.to(device)
    optimizer = make_optimizer(job.optimizer, module.parameters())
    first, last = p == 0, p == S - 1
    per = job.microbatch_size // stage.data            # this replica's samples of each micro-batch
    if shape.kind == "gpt":
        x_meta = (torch.zeros(per, shape.sequence, dtype=torch.long, device=device) if first else
                  torch.zeros(per, shape.sequence, shape.hidden, device=device, requires_grad=True))
        y_meta = torch.zeros(per, shape.sequence, shape.vocab if last else shape.hidden, device=device,
                             requires_grad=True)
    else:
        # static shapes: a float meta must say it needs gradients, or torch derives none for it
        x_meta = torch.zeros(per, shape.widths[stage.first - 1] if stage.first else shape.widths[0], device=device,
                             requires_grad=not first)
        y_meta = torch.zeros(per, shape.widths[stage.last], device=device, requires_grad=True)
    calls = {}
    for which, key in (("act_in", f"act {p - 1}"), ("grad_out", f"grad {p - 1}"),
                       ("act_out", f"act {p}"), ("grad_in", f"grad {p}")):
        if key in job.boundaries:
            calls[which] = (key, job.boundaries[key].calls.get(rank, []))
    if job.lanes:
        # every boundary of the plan sends rank k's whole tile to rank k of the next stage:
        # torch's own point-to-point pipeline lanes run exactly that schedule
        pipe = ProgramStage(module, p, S, device, input_args=x_meta, output_args=y_meta, group=lane)
    else:
        pipe = BroadcastStage(module, p, S, device, input_args=x_meta, output_args=y_meta, group=lane,
                              calls=calls, groups=boundary_groups)

    reduces = stage.program is not None and not (job.sharded and stage.data > 1)  # else FSDP2 reduce-scatters
    if reduces and job.overlap:
        pipe.reducer = OverlappedReduction(module, stage.program, programs.get(p, []), rank, job.bucket_elements)
    overlapped = []

    def after_backward():
        progress.mark("gradient program")
        if pipe.reducer is not None:      # its buckets are reduced by now (ProgramStage.perform_reduce_grad)
            overlapped.append([pipe.reducer.buckets_during_backward, pipe.reducer.buckets])
        elif reduces:
            reduce_after_backward(stage.program, module, programs.get(p, []), rank)
        _tie(job, stage, module, tied)

    pipe.after_backward = after_backward
    pipe.sharding = sharding

    def loss_fn(out, target):
        return loss_sum(shape, out, target, job.microbatch_size)

    if job.schedule == "gpipe":
        schedule = ScheduleGPipe(pipe, job.microbatches, loss_fn=loss_fn)
    elif job.schedule == "1f1b":
        schedule = Schedule1F1B(pipe, job.microbatches, loss_fn=loss_fn)
    else:
        kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD,
                 "I": _ComputationType.BACKWARD_INPUT, "W": _ComputationType.BACKWARD_WEIGHT}
        schedule = _PipelineScheduleRuntime([pipe], job.microbatches, loss_fn=loss_fn)
        schedule._prepare_schedule_with_comms({q: [_Action(q, kinds[op], m) for op, m in order]
                                               for q, order in job.orders.items()})
    _trace(pipe, progress, rank, fail)
    dp_index = next(i for i, row in enumerate(stage.grid) if rank in row)
    rows = slice(dp_index * per, (dp_index + 1) * per)
    losses, times, comm = [], [], []
    for step in range(job.steps):
        progress.step = step
        progress.mark("step start")
        x, y = batch(shape, step, job.global_batch, job.seed)
        x = x.view(job.microbatches, job.microbatch_size, *x.shape[1:])[:, rows].reshape(-1, *x.shape[1:])
        y = y.view(job.microbatches, job.microbatch_size, *y.shape[1:])[:, rows].reshape(-1, *y.shape[1:])
        dist.barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        micro = []
        inputs = (x.to(device),) if first else ()
        targets = {"target": y.to(device), "losses": micro} if last else {}
        schedule.step(*inputs, return_outputs=False, **targets)
        if isinstance(pipe, BroadcastStage):
            pipe.wait_sends()
            comm.append(pipe.comm_time)
            pipe.comm_time = 0.0
        progress.mark("optimizer")
        optimizer.step()
        times.append(time.perf_counter() - t0)
        if last:
            mean = sum(float(m.detach()) for m in micro) / job.microbatches
            loss = torch.tensor(mean, dtype=torch.float64, device=device)
            dist.all_reduce(loss, group=mesh.get_group("dp"))
            losses.append(float(loss))
            if rank == stage.ranks[0]:
                results.put(("step", rank, (index, step)))
    progress.mark("done")
    out: dict[str, Any] = {"rank": rank, "stage": p, "times": times, "comm": comm, "losses": losses,
                           "overlapped": overlapped}
    if reference_path is not None:
        reference = torch.load(reference_path)
        worst, name = 0.0, None
        for n, prm in module.named_parameters():
            full = prm.full_tensor() if isinstance(prm, DTensor) else prm
            want = reference[_global_name(n, shape)]
            err = _relative(full.detach().cpu(), want)
            if err >= worst:
                worst, name = err, _global_name(n, shape)
        out.update(worst=worst, worst_parameter=name)
    return out


def _trace(pipe, progress: Progress, rank: int, fail) -> None:
    """Mark the progress table around each computation; ``fail`` = (rank, step, micro-batch,
    how) injects a failure in that forward (tests only: a raise, or the process killed)."""
    for meth, action in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
                         ("backward_weight_one_chunk", "weight gradient")):
        orig = getattr(pipe, meth)

        def traced(mb, *a, _orig=orig, _action=action, **k):
            progress.mark(_action, mb)
            if fail and fail[0] == rank and (progress.step, mb) == tuple(fail[1:3]) and _action == "forward":
                if fail[3] == "kill":
                    os.kill(os.getpid(), 9)
                raise RuntimeError("injected failure")
            return _orig(mb, *a, **k)

        setattr(pipe, meth, traced)


def _global_name(name: str, shape) -> str:
    """A stage parameter's name in the single-process model: wrappers' prefixes dropped, the
    last stage's copy of the tied token table named as the table."""
    name = name.replace("_checkpoint_wrapped_module.", "")
    if shape.kind == "gpt" and shape.tied and name == f"layers.{shape.layers - 1}.weight":
        return "layers.0.tokens.weight"
    return name


def _relative(a, b, floor: float = 1e-6) -> float:
    """||a - b|| / (||b|| + floor): relative, except for tensors that are about zero."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + floor))
