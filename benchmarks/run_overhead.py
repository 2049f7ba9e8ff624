"""What ``run`` costs over a hand-written ``torch.distributed.pipelining`` script.

For plans of gpt-tiny on ``local-2x4`` (8 gloo processes), the same stages, layers, tensor
parallelism, micro-batches and schedule are trained twice, each in its own launch of 8
processes: by ``run`` (the plan's broadcast boundaries and lowered gradient program), and by
a script written the way torch's pipelining tutorial does it -- ``PipelineStage`` with its
point-to-point boundaries along the lanes, ``ScheduleGPipe`` / ``Schedule1F1B``, one
``all_reduce`` of the flattened gradients over the stage's data group, one of the tied
embedding's gradient between its owners.  Only plans whose
stages all have the same (d, t) are compared: the hand-written script cannot express the
others.  Printed: each side's step time (median over the steps after the first of the
slowest rank) and run's ratio to the script.  Goal: at most 1.10.

    python benchmarks/run_overhead.py             # about 6 minutes on 2 cores
    python benchmarks/run_overhead.py --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

PLANS = [("4,1,2,4", "gpipe"), ("4,1,2,4", "1f1b"), ("2,1,4,8", "1f1b"), ("2,2,2,4", "1f1b")]


def hand_written(rank: int, world: int, job, steps: int, store: str, results) -> None:
    """The tutorial way: P2P lanes, torch's schedule, one all-reduce of the gradients."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from solver_planner.run.model import batch, loss_sum, make_optimizer
    from solver_planner.run.stage import local_gradients, stage_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    meshes = [DeviceMesh("cpu", torch.tensor(s.grid), mesh_dim_names=("dp", "tp")) for s in job.stages]
    stage = job.stage_of(rank)
    p, S, shape = stage.index, len(job.stages), job.shape
    lane = None
    for k in range(len(stage.ranks)):
        g = dist.new_group([s.ranks[k] for s in job.stages])
        if stage.ranks[k] == rank:
            lane = g
    module = stage_module(shape, stage.first, stage.last, meshes[p], stage.tensor, "none", "none", False, job.seed)
    opt = make_optimizer(job.optimizer, module.parameters())
    per = job.microbatch_size // stage.data
    first, last = p == 0, p == S - 1
    x_meta = (torch.zeros(per, shape.sequence, dtype=torch.long) if first
              else torch.zeros(per, shape.sequence, shape.hidden, requires_grad=True))
    y_meta = torch.zeros(per, shape.sequence, shape.vocab if last else shape.hidden, requires_grad=True)
    pipe = PipelineStage(module, p, S, torch.device("cpu"), input_args=x_meta, output_args=y_meta, group=lane)

    def loss_fn(out, target):
        return loss_sum(shape, out, target, job.microbatch_size)

    cls = ScheduleGPipe if job.schedule == "gpipe" else Schedule1F1B
    schedule = cls(pipe, job.microbatches, loss_fn=loss_fn)
    dp = meshes[p].get_group("dp")
    tied = None   # the tied token table's gradient summed between its two owners, as run does
    if shape.kind == "gpt" and shape.tied and S > 1:
        for k in range(len(stage.ranks)):
            pair = [job.stages[0].ranks[k], job.stages[-1].ranks[k]]
            g = dist.new_group(pair)
            if rank in pair:
                tied = g
    row = next(i for i, r in enumerate(stage.grid) if rank in r)
    times = []
    for step in range(steps):
        x, y = batch(shape, step, job.global_batch, job.seed)
        x = x.view(job.microbatches, job.microbatch_size, -1)[:, row * per:(row + 1) * per].reshape(-1, x.shape[1])
        y = y.view(job.microbatches, job.microbatch_size, -1)[:, row * per:(row + 1) * per].reshape(-1, y.shape[1])
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        inputs = (x,) if first else ()
        targets = {"target": y, "losses": []} if last else {}
        schedule.step(*inputs, **targets)
        grads = local_gradients(module)
        if stage.data > 1 and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp)
            i = 0
            for g in grads:
                g.copy_(flat[i:i + g.numel()].view_as(g))
                i += g.numel()
        if tied is not None:
            layer = module.layers[str(0 if first else shape.layers - 1)]
            weight = layer.tokens.weight if first else layer.weight
            dist.all_reduce(weight.grad, group=tied)
        opt.step()
        times.append(time.perf_counter() - t0)
    results.put((rank, times, None))
    dist.destroy_process_group()


def _hand_written_times(job, steps: int) -> list[float]:
    from solver_planner.distributed.launch import run_workers

    with tempfile.TemporaryDirectory() as tmp:
        per_rank = run_workers(hand_written, job.world, (job, steps, str(Path(tmp) / "store")), timeout=600)
    return [max(r[i] for r in per_rank) for i in range(steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of both sides; each keeps its best")
    args = ap.parse_args()

    from solver_planner.run.launch import run_plans

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import plan_jobs  # benchmarks/run.py

    jobs = plan_jobs(PLANS, args.steps)
    labels = [f"{config} {schedule}" for config, schedule in PLANS]
    # the two sides alternate, and each keeps its best round: a machine shared with other work
    # slows whichever side runs while it is busy
    ours = [float("inf")] * len(jobs)
    theirs = [float("inf")] * len(jobs)
    for _ in range(args.rounds):
        for n, r in enumerate(run_plans(jobs, compare=False)):
            ours[n] = min(ours[n], statistics.median(r.step_times[1:]))
        for n, job in enumerate(jobs):
            theirs[n] = min(theirs[n], statistics.median(_hand_written_times(job, args.steps)[1:]))
    print(f"{'plan (d,t,p,k schedule)':26} {'run':>9} {'hand-written':>13} {'ratio':>6}")
    for label, a, b in zip(labels, ours, theirs):
        print(f"{label:26} {a * 1e3:7.1f}ms {b * 1e3:11.1f}ms {a / b:6.2f}")
    print(f"median ratio {statistics.median(a / b for a, b in zip(ours, theirs)):.2f} over {len(jobs)} plans")


if __name__ == "__main__":
    main()
