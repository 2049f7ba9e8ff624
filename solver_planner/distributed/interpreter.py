"""Runs a lowered plan (:meth:`DistributedPlan.as_dict`) on one rank with torch.distributed.

This module imports nothing from solver_planner: ``--emit`` copies its source into the
module it writes, so the package's workers and a user's ``torchrun`` run the same code.

Data is made so that every check is exact and every misplaced element is caught: values
are small integers (exact in every float type) hashed from the element's index, so no
two neighbouring elements, chunks or ranks agree by accident.

* chunks: rank ``r`` starts with ``pattern(r + 1, i) - 1000`` at flat index ``i``; it must
  end with the sum of that over the ranks of its reduction group;
* tiles: element ``i`` (row-major index in the whole tensor) is ``pattern(0, i)``; a
  source rank starts with its tile; a destination rank starts with every element off by
  one, so an element no broadcast wrote is wrong.
"""

import os
import time

import torch
import torch.distributed as dist

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "float8": torch.float8_e4m3fn, "int64": torch.int64,
          "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
          "bool": torch.bool}
# The largest value + 1 every dtype holds exactly (bfloat16: 8 significant bits).
MODULUS = {"bool": 2, "int8": 127, "float8": 16}

# torch 2.13 renamed the two tensor collectives; the old names still work but warn.
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def pattern(seed, index, modulus):
    """Deterministic values in ``0..modulus-1`` for int64 ``index`` (a multiplicative hash)."""
    return (index * 2654435761 + seed * 2246822519) % 4294967311 % modulus


def make_groups(plan):
    """Every group, created once, in the same order on every rank (torch requires both)."""
    return [dist.new_group(list(g)) for g in plan["groups"]]


def _tile_indices(shape, box):
    """Row-major indices in the whole tensor of the elements of ``box``."""
    index = torch.zeros([hi - lo for lo, hi in box], dtype=torch.int64)
    stride = 1
    for dim in range(len(shape) - 1, -1, -1):
        lo, hi = box[dim]
        view = [1] * len(shape)
        view[dim] = hi - lo
        index = index + torch.arange(lo, hi, dtype=torch.int64).reshape(view) * stride
        stride *= shape[dim]
    return index


def expected(plan, rank):
    """What ``rank`` must hold at the end (int64), or None when it must hold nothing."""
    data = plan["data"]
    if plan["layout"] == "chunks":
        flat = torch.arange(data["chunks"] * data["chunk_elems"], dtype=torch.int64)
        total = sum(pattern(r + 1, flat, 2001) - 1000 for r in data["sum_over"][rank])
        return total.reshape(data["chunks"], data["chunk_elems"])
    box = data["dst"][rank]
    if box is None:
        return None
    return pattern(0, _tile_indices(data["shape"], box), MODULUS.get(plan["dtype"], 251))


def initial(plan, rank, device):
    """The buffer ``rank`` starts with (see the module docstring)."""
    data, dtype = plan["data"], DTYPES[plan["dtype"]]
    if plan["layout"] == "chunks":
        flat = torch.arange(data["chunks"] * data["chunk_elems"], dtype=torch.int64)
        own = pattern(rank + 1, flat, 2001) - 1000
        return own.reshape(data["chunks"], data["chunk_elems"]).to(dtype).to(device)
    modulus = MODULUS.get(plan["dtype"], 251)
    if data["src"][rank] is not None:
        return pattern(0, _tile_indices(data["shape"], data["src"][rank]), modulus).to(dtype).to(device)
    want = expected(plan, rank)
    if want is None:
        return torch.zeros(0, dtype=dtype, device=device)
    return ((want + 1) % modulus).to(dtype).to(device)


def _shape(plan, buf, region):
    if plan["layout"] == "chunks":
        return (len(region), buf.shape[1])
    return tuple(hi - lo for lo, hi in region)


def _take(plan, buf, region):
    if plan["layout"] == "chunks":
        return buf.index_select(0, torch.tensor(region, dtype=torch.int64, device=buf.device))
    return buf[tuple(slice(lo, hi) for lo, hi in region)].contiguous()


def _put(plan, buf, region, tensor):
    if plan["layout"] == "chunks":
        buf.index_copy_(0, torch.tensor(region, dtype=torch.int64, device=buf.device), tensor)
    else:
        buf[tuple(slice(lo, hi) for lo, hi in region)] = tensor


def do_call(plan, rank, buf, groups, call):
    """One call: ``[step, op, group, root, send, recv]`` (see DistributedPlan)."""
    _, op, g, root, send, recv = call
    group = groups[g]
    if op == "broadcast":
        if rank == root:
            tensor = _take(plan, buf, send)
        else:
            tensor = torch.empty(_shape(plan, buf, recv), dtype=buf.dtype, device=buf.device)
        dist.broadcast(tensor, src=root, group=group)
    elif op == "all_reduce":
        tensor = _take(plan, buf, send)
        dist.all_reduce(tensor, group=group)
    elif op == "reduce":
        tensor = _take(plan, buf, send)
        dist.reduce(tensor, dst=root, group=group)
    elif op == "reduce_scatter_tensor":
        tensor = torch.empty(_shape(plan, buf, recv), dtype=buf.dtype, device=buf.device)
        REDUCE_SCATTER(tensor, _take(plan, buf, send), group=group)
    elif op == "all_gather_into_tensor":
        tensor = torch.empty(_shape(plan, buf, recv), dtype=buf.dtype, device=buf.device)
        ALL_GATHER(tensor, _take(plan, buf, send), group=group)
    else:
        raise ValueError(f"unknown op {op!r}")
    if recv is not None:
        _put(plan, buf, recv, tensor)


def run(plan, rank, buf, groups):
    """Issue this rank's calls; return ``[step, start, end]`` per timed unit (perf_counter).

    With ``barriers`` every rank meets at a barrier before each step and times the step;
    otherwise each call is timed on its own and calls of different groups overlap freely.
    """
    sync = torch.cuda.synchronize if buf.is_cuda else (lambda: None)
    calls = plan["calls"][rank]
    records = []
    if plan["barriers"]:
        by_step = {}
        for call in calls:
            by_step.setdefault(call[0], []).append(call)
        for step in range(len(plan["steps"])):
            dist.barrier()
            start = time.perf_counter()
            for call in by_step.get(step, ()):
                do_call(plan, rank, buf, groups, call)
            sync()
            records.append([step, start, time.perf_counter()])
    else:
        for call in calls:
            start = time.perf_counter()
            do_call(plan, rank, buf, groups, call)
            sync()
            records.append([call[0], start, time.perf_counter()])
    return records


def check(plan, rank, buf, want=None):
    """None when ``rank`` holds exactly what it must; else ``[index, got, want]`` of the first wrong element.

    ``want`` is :func:`expected` if already computed.
    """
    want = expected(plan, rank) if want is None else want
    if want is None:
        return None
    got = buf.to("cpu").to(torch.int64)
    wrong = (got != want).nonzero()
    if len(wrong) == 0:
        return None
    index = [int(i) for i in wrong[0]]
    return [index, int(got[tuple(index)]), int(want[tuple(index)])]


def main_torchrun(plans):
    """Entry point of an emitted module under ``torchrun --nproc-per-node WORLD``: run every
    plan once, print each rank's verdict, exit 1 if any element is wrong."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if any(plan["world"] != world for plan in plans):
        raise SystemExit(f"these plans need {plans[0]['world']} ranks, not {world}")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    failed = False
    for plan in plans:
        groups = make_groups(plan)
        buf = initial(plan, rank, device)
        dist.barrier()
        records = run(plan, rank, buf, groups)
        bad = check(plan, rank, buf)
        took = max((r[2] for r in records), default=0.0) - min((r[1] for r in records), default=0.0)
        if bad is None:
            print(f"{plan['title']}: rank {rank}: ok ({took * 1e3:.3f} ms)")
        else:
            failed = True
            print(f"{plan['title']}: rank {rank}: element {bad[0]} is {bad[1]}, expected {bad[2]}")
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)
