"""Every configuration comparable (--top, --config, --split, baselines) and the training options
in the plan space (recomputation, optimizer sharding, sequence parallelism, overlap, weight
delaying)."""

import json

import pytest

from solver_planner.errors import InfeasibleError
from solver_planner.spec import load_model_spec
from solver_planner.stages import Layer, LayerModel, MemoryOptions, Schedule, StageSearch, plan_partition
from solver_planner.stages import simulate_schedule
from solver_planner.stages.costs import MeshShape, StageConfig, StageCosts
from solver_planner.stages.objective import bounds
from solver_planner.stages.partition import Partition, StagePlan
from solver_planner.stages.report import Config, plan_stages
from solver_planner.topology import load_topology

from conftest import CLUSTERS, SPECS, run_cli
from test_stages_objective import topology

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
GPT = SPECS / "models" / "gpt3-2.6b.yaml"
UNET = SPECS / "models" / "u-transformer.yaml"


def test_top_lists_distinct_configurations_with_their_layers_and_memory():
    data = json.loads(json.dumps(plan_stages(load_topology(P3), load_model_spec(GPT), top=4).as_dict()))
    top = data["top"]
    assert 1 < len(top) <= 4
    assert [r["iteration_time"] for r in top] == sorted(r["iteration_time"] for r in top)
    assert top[0]["iteration_time"] == data["iteration_time"]
    keys = [(tuple(r["mesh"]), r["config"]["microbatches"]) for r in top]
    assert len(set(keys)) == len(keys)
    for r in top:
        c = r["config"]
        assert set(c) == {"data", "tensor", "pipeline", "microbatches"}
        assert len(r["stages"]) == c["pipeline"]
        assert r["objective"] <= r["iteration_time"] * (1 + 1e-9)
        assert r["memory"] <= data["device_memory"]


def test_config_evaluates_one_configuration_and_a_fixed_split():
    topo, spec = load_topology(P3), load_model_spec(GPT)
    best = plan_stages(topo, spec)
    cfg = Config(1, 2, 4, 1024)
    one = plan_stages(topo, spec, config=cfg)
    d = one.as_dict()
    assert d["config"] == {"data": 1, "tensor": 2, "pipeline": 4, "microbatches": 1024}
    assert d["requested_config"] == "1,2,4,1024"
    assert one.best.time >= best.best.time * (1 - 1e-9)        # a corner of the space is no faster
    split = tuple(st.last - st.first + 1 for st in one.best.plan.stages)
    fixed = plan_stages(topo, spec, config=cfg, layer_counts=split)
    assert tuple(st.last - st.first + 1 for st in fixed.best.plan.stages) == split
    assert fixed.best.time == pytest.approx(one.best.time, rel=1e-12)
    assert fixed.result.status.value == "OPTIMAL"
    other = split[:-2] + (split[-2] + 1, split[-1] - 1)
    try:
        moved = plan_stages(topo, spec, config=cfg, layer_counts=other)
    except InfeasibleError:
        return
    assert tuple(st.last - st.first + 1 for st in moved.best.plan.stages) == other
    assert moved.best.time >= one.best.time * (1 - 1e-9)


def test_cli_config_json_answers_is_pure_tensor_better():
    """On one host, pure tensor parallelism is a configuration like any other."""
    res = run_cli("stages", CLUSTERS / "local-2x4.yaml", UNET, "--config", "1,4,2,8", "--json")
    assert res.returncode in (0, 1), res.stderr
    if res.returncode == 0:
        data = json.loads(res.stdout)
        assert data["config"]["tensor"] == 4 and data["config"]["pipeline"] == 2
        assert data["requested_config"] == "1,4,2,8"


def test_baselines_are_listed_next_to_the_best_plan():
    topo, spec = load_topology(P3), load_model_spec(GPT)
    rep = plan_stages(topo, spec, baselines=True)
    base = rep.as_dict()["baselines"]
    assert set(base) == {"data", "tensor", "pipeline"}
    assert not base["tensor"]["possible"] and "inside a host" in base["tensor"]["reason"]
    for name in ("data", "pipeline"):
        b = base[name]
        if b["possible"]:
            assert b["iteration_time"] >= rep.best.time * (1 - 1e-9)      # the best plan is at least as fast
            assert b["best_speedup"] == pytest.approx(b["iteration_time"] / rep.best.time)
        else:
            assert b["reason"]
    if base["data"]["possible"]:
        assert base["data"]["config"]["pipeline"] == 1 and base["data"]["config"]["tensor"] == 1


# -- memory options in the plan space ----------------------------------------------------------
def _model(options: MemoryOptions, n=6, params=1.5 * 2**30, saved=6 * 2**30) -> LayerModel:
    layers = [Layer(f"l{i}", 2e11, 4e11, params, 2 * params, 2**22, saved, checkpoint=2**22) for i in range(n)]
    return LayerModel("big", layers, 8, None, options=options)


def test_recompute_auto_makes_a_plan_fit_and_chooses_per_stage():
    topo = topology(2, 2, "4 GB/s", "host", "16 GiB")
    with pytest.raises(InfeasibleError, match="short"):
        plan_partition(StageSearch(_model(MemoryOptions(("none",))), topo), "dp")
    res = plan_partition(StageSearch(_model(MemoryOptions(("none", "selective", "full"))), topo), "dp")
    modes = {st.config.recompute for st in res.solution.plan.stages}
    assert "full" in modes
    assert max(res.solution.run.peak_memory) <= topo.device.memory
    assert res.status.value == "OPTIMAL"


def test_optimizer_sharding_shrinks_static_memory_by_the_data_degree():
    topo = topology(2, 2, "4 GB/s", "host")
    shape = MeshShape(1, 2)
    by = {}
    for sharding in ("none", "zero-1", "zero-2", "zero-3"):
        s = StageSearch(_model(MemoryOptions(sharding=sharding)), topo)
        costs = StageCosts(s.model, topo, shape, 2, s.tables(shape))
        by[sharding] = costs.memory_parts(StageConfig(1))[0][0, 2]
    P = 3 * 1.5 * 2**30
    assert by["none"] == pytest.approx(4 * P)
    assert by["zero-1"] == pytest.approx(2 * P + 2 * P / 2)
    assert by["zero-2"] == pytest.approx(P + 3 * P / 2)
    assert by["zero-3"] == pytest.approx(4 * P / 2)


def test_zero3_gathers_parameters_every_micro_batch_and_costs_time():
    topo = topology(2, 2, "4 GB/s", "host")
    shape = MeshShape(2, 2)
    times = {}
    for sharding in ("none", "zero-3"):
        s = StageSearch(_model(MemoryOptions(sharding=sharding)), topo)
        costs = StageCosts(s.model, topo, shape, 2, s.tables(shape))
        times[sharding] = costs[StageConfig(1)].forward[0, 5]
    assert times["zero-3"] > times["none"]


def test_sequence_parallelism_splits_the_replicated_activations():
    topo = topology(1, 4, "4 GB/s", "host")
    layers = [Layer("l", 1e11, 2e11, 2**20, 0, 2**20, 8 * 2**20, 4 * 2**20)]
    acts = {}
    for sp in (False, True):
        m = LayerModel("m", layers * 2, 8, None, options=MemoryOptions(sequence_parallel=sp))
        s = StageSearch(m, topo)
        costs = StageCosts(m, topo, MeshShape(1, 4), 2, s.tables(MeshShape(1, 4)))
        acts[sp] = costs.memory_parts(StageConfig(4))[1][0, 1]
    # a micro-batch of 4 samples on one replica, two layers: saved / t + replicated (/ t with SP)
    assert acts[False] == pytest.approx(4 * 2 * (8 / 4 + 4) * 2**20)
    assert acts[True] == pytest.approx(4 * 2 * (8 / 4 + 4 / 4) * 2**20)


def test_eager_extra_micro_batches_must_fit_too():
    """Eager-1F1B keeps more micro-batches in flight; with memory for 1F1B only it must not
    pick a larger eagerness."""
    topo = topology(1, 4, "1 GB/s", "host", "7 GiB")
    layers = [Layer(f"l{i}", 2e11, 4e11, 2**28, 0, 64 * 2**20, 1.2 * 2**30) for i in range(4)]
    res = plan_partition(StageSearch(LayerModel("m", layers, 8, None), topo, "eager-1f1b"), "dp")
    cand = res.solution
    assert max(cand.run.peak_memory) <= topo.device.memory
    for sch in cand.tried:
        run = simulate_schedule(cand.plan, sch)
        assert max(run.peak_memory) <= topo.device.memory


# -- overlap of gradient reduction, weight delaying ---------------------------------------
def test_bucketed_reduction_overlapping_backward_is_never_slower():
    topo = topology(2, 2, "1 GB/s", "host")
    runs = {}
    for overlap in (True, False):
        m = _model(MemoryOptions(gradient_overlap=overlap), n=4, params=2**28, saved=2**24)
        s = StageSearch(m, topo)
        shape = MeshShape(2, 2)
        costs = StageCosts(m, topo, shape, 2, s.tables(shape))
        plan = Partition(costs, [StagePlan(0, 3, StageConfig(1))])
        run = simulate_schedule(plan, Schedule("1f1b"))
        runs[overlap] = run.iteration_time
        assert bounds(plan, Schedule("1f1b")).value == pytest.approx(run.iteration_time, rel=1e-9)
        reductions = [r for r in run.timeline.records if r.category == "gradient-reduction"]
        last_backward = max(r.end for r in run.timeline.records if r.category == "backward")
        assert any(r.start < last_backward for r in reductions) == overlap
    assert runs[True] < runs[False]


def test_weight_delaying_hides_gradient_transfers_on_a_slow_link():
    rep = plan_stages(load_topology(P3), load_model_spec(GPT), "eager-1f1b", baselines=True)
    d = rep.as_dict()
    assert d["weight_delay"] and d["iteration_time"] < d["best_1f1b"]["iteration_time"]
    assert any("weight delay" in s for s in d["schedules_tried"])


def test_the_gradient_program_named_is_the_one_priced():
    """Under ZeRO-3 a bucket is reduce-scattered (each replica keeps its shard), and its time
    is the reduce-scatter's; under ZeRO-1/2 and the distributed optimizer the flat
    reduce-scatter then the gather of the parameters (in the training type) that FSDP2,
    DeepSpeed and Megatron-LM run (the distributed optimizer with overlapped gradients gathers
    ahead of the next forward instead: test_gathers_ahead_of_the_next_forward); otherwise the
    bucket's best all-reduce program, which on this two-host mesh is a P² program faster than
    the flat pair (so a sharded bucket priced with it would fail here)."""
    from solver_planner.stages.costs import SHARDED_STEP_PROGRAM

    topo = topology(2, 2, "4 GB/s", "host")
    shape = MeshShape(2, 2)
    bucket = 4 * 2**20
    seen = {}
    for sharding in ("none", "zero-1", "zero-2", "distributed", "distributed-ahead", "zero-3"):
        for reduce in (None, "float32"):
            opts = MemoryOptions(sharding=sharding.removesuffix("-ahead"), gradient_bucket=bucket,
                                 gradient_reduce_dtype=reduce, gradient_overlap=sharding == "distributed-ahead")
            model = _model(opts)
            model.dtype = "float16"
            s = StageSearch(model, topo)
            costs = StageCosts(s.model, topo, shape, 2, s.tables(shape))
            tab = s.tables(shape)[1]
            name = costs.bucket_program(1, bucket)
            scale = 2.0 if reduce else 1.0
            if sharding in ("zero-3", "distributed-ahead"):
                a, b = tab.data_reducescatter
                assert name == "ReduceScatter"
                want = a + b * bucket
            elif sharding == "none":
                a, b, name_priced = min(tab.gradient_programs, key=lambda g: g[0] + g[1] * bucket)
                assert name == name_priced
                want = a + b * bucket
            else:
                assert name == SHARDED_STEP_PROGRAM
                (a, b), (c, e) = tab.data_reducescatter, tab.data_allgather
                want = a + b * bucket + c + e * bucket / scale
            got = float(costs[StageConfig(1)].bucket_time(bucket))
            assert got == pytest.approx(want, rel=1e-9)
            seen[sharding, reduce] = got
    assert seen["none", None] < 0.9 * seen["zero-1", None]        # the P² program beats the flat pair here
    assert seen["zero-2", "float32"] < 2 * seen["zero-2", None]   # the gather stays in float16


def test_gathers_ahead_of_the_next_forward():
    """Megatron-LM's distributed optimizer with overlapped gradients (--overlap-param-gather):
    each bucket's gather starts when the forward reaches the bucket before it (one ahead), so
    a stage's first forward starts after its first gather and layer j + 1's forward max(f_j,
    s_{j+1}) after layer j's (replayed here by hand); the step is untouched, and without
    overlap the gather is in the tail as before.  Both simulators hold that forward back and
    lengthen it."""
    from solver_planner.stages.fastsim import iteration

    topo = topology(2, 2, "4 GB/s", "host")
    shape = MeshShape(2, 2)
    cfg = StageConfig(1)
    got = {}
    for overlap in (True, False):
        opts = MemoryOptions(sharding="distributed", gradient_bucket=2**40, gradient_overlap=overlap)
        s = StageSearch(_model(opts), topo)
        costs = StageCosts(s.model, topo, shape, 2, s.tables(shape))
        got[overlap] = costs, costs[cfg]
    costs, cc = got[True]
    assert got[False][1].gather_wait is None and got[False][1].gather_ready is None
    tab = costs.tables[1]
    fwd = costs.layer_times(cfg)[0]
    grads = costs.gradient_columns(1)[0]
    c, e = tab.data_allgather
    gathers = c + e * grads / costs.reduce_scale
    n = len(fwd)
    for k in range(n):
        for i in range(k, n):
            # layer j + 1's forward starts max(f_j, s_{j+1}) after layer j's, the first at s_k
            start = gathers[k]
            for j in range(k, i):
                start += max(fwd[j], gathers[j + 1])
            assert cc.gather_ready[k, i] == pytest.approx(gathers[k], rel=1e-12), (k, i)
            assert cc.gather_ready[k, i] + fwd[k:i + 1].sum() + cc.gather_wait[k, i] == \
                pytest.approx(start + fwd[i], rel=1e-9), (k, i)
            assert cc.optimizer[k, i] == pytest.approx(got[False][1].optimizer[k, i], rel=1e-12)
    assert cc.gather_wait[0, n - 1] > 0
    # the simulators wait for them in the first forward, and agree: one stage on the 2x2 mesh,
    # two on 1x2 meshes
    plans = [Partition(costs, [StagePlan(0, n - 1, cfg)])]
    two = MeshShape(1, 2)
    for overlap in (True, False):
        s = StageSearch(_model(MemoryOptions(sharding="distributed", gradient_bucket=2**40,
                                             gradient_overlap=overlap)), topo)
        plans.append(Partition(StageCosts(s.model, topo, two, 2, s.tables(two)), [StagePlan(0, 2, cfg),
                                                                                 StagePlan(3, n - 1, cfg)]))
    waits = []
    for plan in plans:
        waits.append(plan.gather_wait)
        run = simulate_schedule(plan, Schedule("1f1b"))
        assert iteration(plan, Schedule("1f1b")).time == pytest.approx(run.iteration_time, rel=1e-12)
        assert bounds(plan, Schedule("1f1b")).value <= run.iteration_time * (1 + 1e-9)
    assert waits[0][0] == pytest.approx(float(cc.gather_wait[0, n - 1]))
    assert waits[1][0] > 0 and waits[2] == [0.0, 0.0]
    t_on = simulate_schedule(plans[1], Schedule("1f1b"))
    (first_forward,) = [r for r in t_on.timeline.records if r.name == "F0 mb0"]
    assert first_forward.start == pytest.approx(plans[1].gather_ready[0]) and plans[1].gather_ready[0] > 0
    assert first_forward.end - first_forward.start == pytest.approx(plans[1].forward[0] + waits[1][0])
