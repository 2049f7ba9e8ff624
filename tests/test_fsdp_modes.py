"""How FSDP2 runs each ZeRO stage, counted on gloo processes, against the cost model's
:func:`~solver_planner.stages.memory.zero_run`: the parameter all-gathers and gradient
reduce-scatters of a step, and what a stage keeps between micro-batches.

Three runtimes: ours (``run``: :class:`~solver_planner.run.stage.ProgramStage` with the plan's
ZeRO stage), torch's ``PipelineStage`` as torchtitan leaves it (its pipeline > 1), and FSDP2
without pipelining (torchtitan with pipeline 1: one backward per micro-batch).  Each is one
stage of three layers on two data-parallel ranks, three micro-batches a step, under 1F1B: a
stage's FSDP2 flags do not depend on the other stages.  (With more than three model chunks a
rank torch's runtime also re-gathers inactive chunks, ``max_active_stages``, which the
torchtitan target refuses under sharding.)"""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from solver_planner.stages.memory import MemoryOptions, zero_run  # noqa: E402

K = 3          # micro-batches a step
LAYERS = 3
WIDTH = 16


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_states(module):
    """(sharded states of the parameters, types of their whole accumulated gradients)."""
    states, acc = set(), set()
    for m in module.modules():
        get = getattr(m, "_get_fsdp_state", None)
        group = get()._fsdp_param_group if get is not None else None
        for p in (group.fsdp_params if group is not None else ()):
            states.add(p.sharded_state.name)
            if p.unsharded_accumulated_grad is not None:
                acc.add(str(p.unsharded_accumulated_grad.dtype).replace("torch.", ""))
    return states, acc


def _case(rank, world, runtime, sharding, mixed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import Schedule1F1B

    from solver_planner.run.job import FSDP_MODES
    from solver_planner.run.stage import ProgramStage

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    after = FSDP_MODES[sharding].reshard_after_forward
    for layer in module:
        fully_shard(layer, mesh=mesh, reshard_after_forward=after, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=after, mp_policy=policy)
    counts = {"gathers": 0, "reductions": 0}
    gather, reduce = dist.all_gather_single, dist.reduce_scatter_single

    def counted_gather(*a, **k):
        counts["gathers"] += 1
        return gather(*a, **k)

    def counted_reduce(*a, **k):
        counts["reductions"] += 1
        return reduce(*a, **k)

    after_backward = []
    dist.all_gather_single, dist.reduce_scatter_single = counted_gather, counted_reduce
    try:
        x = torch.randn(2 * K, WIDTH)
        y = torch.randn(2 * K, WIDTH)
        for step in range(2):           # the second step is the one counted (the first builds buffers)
            counts.update(gathers=0, reductions=0)
            after_backward.clear()
            if runtime == "loop":
                # FSDP2 without pipelining: one forward and backward per micro-batch, flags as torch leaves them
                for mb in range(K):
                    out = module(x[2 * mb:2 * mb + 2].to(torch.bfloat16 if mixed else torch.float32))
                    ((out.float() - y[2 * mb:2 * mb + 2]) ** 2).sum().backward()
                    if mb < K - 1:
                        after_backward.append((*_fsdp_states(module), counts["reductions"]))
            else:
                lanes = [dist.new_group([r]) for r in range(world)]
                meta = torch.zeros(2, WIDTH, dtype=torch.bfloat16 if mixed else torch.float32)
                pipe = ProgramStage(module, 0, 1, torch.device("cpu"), input_args=meta, output_args=meta,
                                    group=lanes[rank])
                pipe.sharding = sharding if runtime == "ours" else "none"
                torch_backward = pipe.backward_maybe_with_nosync

                def logged(*a, last_backward=False, **k):
                    out = torch_backward(*a, last_backward=last_backward, **k)
                    if not last_backward:
                        after_backward.append((*_fsdp_states(module), counts["reductions"]))
                    return out

                pipe.backward_maybe_with_nosync = logged
                schedule = Schedule1F1B(pipe, K, loss_fn=lambda o, t: ((o.float() - t) ** 2).sum())
                schedule.step(x.to(meta.dtype), target=y)
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = gather, reduce
    return {"gathers": counts["gathers"] / LAYERS, "reductions": counts["reductions"] / LAYERS,
            "between": [(sorted(s), sorted(a), n) for s, a, n in after_backward]}


CASES = [("ours", s, False) for s in ("zero-1", "zero-2", "zero-3")] + \
        [("torch-pipelining", s, m) for s in ("zero-2", "zero-3") for m in (False, True)] + \
        [("loop", s, False) for s in ("zero-2", "zero-3")]


def _worker(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {case: _case(rank, world, *case) for case in CASES}
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def counted():
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(2, _port(), queue), nprocs=2, start_method="spawn")
    return queue.get()


def _model(runtime, sharding, mixed):
    """The cost model's view of the case: torchtitan's FSDP2 defaults for torch's runtimes,
    in a pipeline of two stages where torch's pipelining runs it, bf16 reduced in fp32 when mixed."""
    opts = MemoryOptions(sharding=sharding, fsdp2_defaults=runtime != "ours")
    return zero_run(opts, 2 if runtime == "torch-pipelining" else 1, K, 2.0 if mixed else 1.0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_collectives_of_a_step_are_the_cost_model_s(counted, case):
    z = _model(*case)
    got = counted[case]
    # all-gathers: the model's per micro-batch ones, and under ZeRO-1/2 the step's one (priced
    # with the step's reduction: an all-reduce's volume)
    step = 1 if case[1] != "zero-3" else 0
    assert got["gathers"] == pytest.approx(K * (z.forward_gathers + z.backward_gathers) + step)
    assert got["reductions"] == (K if z.reduce_each else 1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_what_a_stage_keeps_between_micro_batches_is_the_cost_model_s(counted, case):
    z = _model(*case)
    between = counted[case]["between"]
    assert len(between) == K - 1
    for i, (states, accumulated, reduced) in enumerate(between):
        # reduce-scatters so far (per layer): one per backward where each micro-batch is
        # reduced; none before the last backward where the step reduces once (torch's
        # pipelining reduces after it, so nothing can overlap it: the cost model's no-overlap)
        assert reduced == LAYERS * (i + 1 if z.reduce_each else 0)
        if not z.reduce_each and case[0] == "torch-pipelining":
            assert not z.overlap
        # ZeRO-3's memory holds only parameter shards between micro-batches; the others hold
        # whole parameters (ZeRO-1 the stage's, ZeRO-2 as its run keeps them)
        if z.memory == "zero-3":
            assert states == ["SHARDED"]
        elif not (case[0] == "loop"):
            assert states == ["UNSHARDED"]
        # gradients kept whole (no reduction yet) are in the reduction's type: fp32 when mixed
        if not z.reduce_each and case[2]:
            assert accumulated == ["float32"] and z.gradient_bytes == 2.0
        if z.reduce_each:
            assert accumulated == []


def _split_worker(rank, world, port, queue):
    """Two pipeline stages of one rank each, bf16 parameters reduced in fp32 (torchtitan's
    FSDP2 policy), torch's runtime with the weight gradients split off (zero-bubble's I and W
    actions) on the second stage: what each of its parameters holds after every action."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        meshes = [DeviceMesh("cpu", torch.tensor([r]), mesh_dim_names=("dp",)) for r in range(world)]
        torch.manual_seed(0)
        module = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in module:
            fully_shard(layer, mesh=meshes[rank], reshard_after_forward=False, mp_policy=policy)
        fully_shard(module, mesh=meshes[rank], reshard_after_forward=False, mp_policy=policy)
        meta = torch.zeros(2, WIDTH, dtype=torch.bfloat16)
        pipe = PipelineStage(module, rank, world, torch.device("cpu"), input_args=meta.clone().requires_grad_(rank > 0),
                             output_args=meta.clone().requires_grad_(True), group=dist.group.WORLD)
        torch_backward, log = pipe.backward_maybe_with_nosync, []

        def logged(kind, kwargs, last_backward=False):
            out = torch_backward(kind, kwargs, last_backward=last_backward)
            held = []                   # per layer: its parameters' (accumulated, .grad) types
            for layer in module:
                group = layer._get_fsdp_state()._fsdp_param_group
                pairs = {(None if p.unsharded_accumulated_grad is None else str(p.unsharded_accumulated_grad.dtype),
                          None if p._unsharded_param.grad is None else str(p._unsharded_param.grad.dtype))
                         for p in group.fsdp_params}
                held.append(sorted(pairs, key=str))
            log.append((kind, last_backward, held))
            return out

        pipe.backward_maybe_with_nosync = logged
        T = _ComputationType
        actions = {0: [_Action(0, T.FORWARD, m) for m in range(K)] + [_Action(0, T.FULL_BACKWARD, m) for m in range(K)],
                   1: [_Action(1, kind, m) for kind in (T.FORWARD, T.BACKWARD_INPUT, T.BACKWARD_WEIGHT)
                       for m in range(K)]}
        schedule = _PipelineScheduleRuntime([pipe], K, loss_fn=lambda o, t: ((o.float() - t) ** 2).sum())
        schedule._prepare_schedule_with_comms(actions)
        x, y = torch.randn(2 * K, WIDTH), torch.randn(2 * K, WIDTH)
        for _ in range(2):              # the second step is the one kept
            log.clear()
            schedule.step(x.to(torch.bfloat16)) if rank == 0 else schedule.step(target=y)
        if rank == 1:
            queue.put(log)
    finally:
        dist.destroy_process_group()


def test_a_split_backward_keeps_the_last_layer_s_bf16_gradient_beside_its_fp32_one():
    """Under a zero-bubble schedule (weight gradients split off), FSDP2 under torch's
    pipelining keeps each layer's whole gradient in the reduction's type (fp32), as the cost
    model counts it (``gradient_bytes`` 2.0 a bf16 parameter) -- except the stage's last layer:
    its post-backward hook has run in the input-gradient pass, so the bf16 weight gradient each
    W computes for it stays on the parameter beside the fp32 one (torch 2.13).  The cost model
    does not count those 2 bytes a parameter of one layer a stage (the README says so); this
    test pins the behaviour it leaves out."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_split_worker, args=(2, _port(), queue), nprocs=2, start_method="spawn")
    log = queue.get()
    kinds = [(kind, last) for kind, last, _ in log]
    assert kinds == [("input", False)] * K + [("weight", False)] * (K - 1) + [("weight", True)]
    weights = [held for kind, _, held in log if kind == "weight"]
    assert all(held == [[(None, None)]] * LAYERS for kind, _, held in log if kind == "input")
    # (fp32 accumulated, bf16 .grad) per layer, in module order
    assert weights[0] == [[("torch.float32", None)]] * (LAYERS - 1) + [[(None, "torch.bfloat16")]]
    for held in weights[1:]:
        assert held == [[("torch.float32", None)]] * (LAYERS - 1) + [[("torch.float32", "torch.bfloat16")]]
    z = zero_run(MemoryOptions(sharding="zero-2", fsdp2_defaults=True), 2, K, 2.0)
    assert z.gradient_bytes == 2.0 and z.memory == "zero-1"
