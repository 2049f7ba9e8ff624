"""Interleaved 1F1B, ZB-V and ZB-H1 in the simulator and the objective.

The published bubbles on balanced stages without communication (Narayanan et al. 2021 §2.2
for interleaving; Qi et al. 2024 §3 for ZB-H1; ZB-V reaching the start-up bound when
f = bA = bW), and, on random plans with model chunks, every bound below the simulated time.
"""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.cost import CostModel
from solver_planner.stages import Layer, LayerModel, MemoryOptions, MeshShape, Schedule, simulate_schedule
from solver_planner.stages.costs import StageConfig, StageCosts, cost_tables, mesh_shapes
from solver_planner.stages.objective import bounds, fits
from solver_planner.stages.partition import Partition, StagePlan
from solver_planner.stages.schedule import mesh_of, rounds
from solver_planner.stages.uniform import config_bound, work_bound

from conftest import ROOT
from test_stages_objective import random_layer, topology

REL = 1e-9


def balanced(S: int, B: int, v: int, kind: str, back: float = 2.0, weight: float = 1.0):
    """S stages of v one-layer chunks each, equal layers, no communication."""
    topo = topology(1, 4, "4 GB/s", "host")
    f = 4e11
    layers = [Layer("b", f, back * f, 2**28, 2**29, 2**24, 2**25, weight=weight * f) for _ in range(S * v)]
    model = LayerModel("uniform", layers, 4 * B, None)
    shape = MeshShape(1, 4 // S)
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), comm=False)
    s = Schedule(kind, virtual=v)
    mesh = tuple(mesh_of(s, S, k) for k in range(S * v))
    return Partition(costs, [StagePlan(k, k, StageConfig(1)) for k in range(S * v)], mesh), s


@pytest.mark.parametrize("S,B", [(2, 4), (2, 6), (4, 8), (4, 16)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_the_papers(S, B, v):
    """(S - 1)(f + b) / v with f, b a stage's whole time per micro-batch (B a multiple of S)."""
    plan, s = balanced(S, B, v, "interleaved-1f1b")
    f, b = v * plan.forward[0], v * plan.backward[0]
    run = simulate_schedule(plan, s)
    assert run.iteration_time == pytest.approx(B * (f + b) + (S - 1) * (f + b) / v, rel=1e-12)
    assert bounds(plan, s).value <= run.iteration_time * (1 + REL)


@pytest.mark.parametrize("S,B", [(2, 4), (2, 8), (4, 8), (4, 16)])
@pytest.mark.parametrize("back,weight", [(2.0, 1.0), (2.0, 0.5), (3.0, 1.0)])
def test_zb_h1_bubble_is_the_papers(S, B, back, weight):
    """(S - 1)(f + bA - bW) while bW <= f + bA, against 1F1B's (S - 1)(f + b)."""
    plan, s = balanced(S, B, 1, "zb-h1", back, weight)
    f, ba, bw = plan.forward[0], plan.backward_act[0], plan.backward_weight[0]
    run = simulate_schedule(plan, s)
    assert run.iteration_time == pytest.approx(B * (f + ba + bw) + (S - 1) * (f + ba - bw), rel=1e-12)
    assert bounds(plan, s).value == pytest.approx(run.iteration_time, rel=1e-12)
    one, s1 = balanced(S, B, 1, "1f1b", back, weight)
    assert simulate_schedule(one, s1).iteration_time == pytest.approx(B * (f + ba + bw) + (S - 1) * (f + ba + bw))
    # the activation memory of 1F1B's first stage on every stage (Qi et al. 2024 §3)
    assert run.in_flight == [min(S, B)] * S


@pytest.mark.parametrize("S,B", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_zb_v_reaches_the_start_up_bound_when_f_ba_bw_are_equal(S, B):
    """With f = bA = bW the only idle time is the last stage's wait for its first input,
    (S - 1) f: no schedule can do better, and the objective proves it."""
    plan, s = balanced(S, B, 2, "zb-v", back=2.0, weight=1.0)
    f = plan.forward[0]
    run = simulate_schedule(plan, s)
    assert run.iteration_time == pytest.approx(B * 2 * 3 * f + (S - 1) * f, rel=1e-12)
    assert bounds(plan, s).value == pytest.approx(run.iteration_time, rel=1e-12)


@st.composite
def chunked(draw):
    """A random model cut into v chunks per stage on a random mesh, under interleaved 1F1B
    or ZB-V, with communication, ties, skips, ZeRO and buckets."""
    hosts, gpus = draw(st.sampled_from([(2, 2), (2, 4), (1, 4), (4, 2)]))
    topo = topology(hosts, gpus, draw(st.sampled_from(["1 GB/s", "4 GB/s", "40 GB/s"])),
                    draw(st.sampled_from(["host", "device"])), efficiency=draw(st.booleans()))
    shapes = [s for s in mesh_shapes(topo.num_hosts, topo.devices_per_host) if 2 <= topo.num_devices // s.size <= 4]
    shape = draw(st.sampled_from(shapes))
    S = topo.num_devices // shape.size
    kind = draw(st.sampled_from(["interleaved-1f1b", "zb-v"]))
    v = 2 if kind == "zb-v" else draw(st.integers(2, 3))
    K = S * v
    n = draw(st.integers(K, K + 3))
    layers = []
    for i in range(n):
        layers.append(random_layer(draw, f"l{i}"))
    if draw(st.booleans()):
        layers[-1] = Layer(**{**layers[-1].__dict__, "tied_to": 0, "tied_params": layers[0].params + 2**20,
                              "tied_optimizer": layers[0].optimizer})
    if n >= 4 and draw(st.booleans()):
        layers[0] = Layer(**{**layers[0].__dict__, "skips": (draw(st.integers(2, n - 1)),)})
    opts = MemoryOptions(("none",), draw(st.sampled_from(["none", "zero-1", "zero-2", "zero-3", "distributed"])),
                         draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from([4 * 2**20, 64 * 2**20])),
                         buckets_first_stage_only=draw(st.booleans()))
    B = draw(st.sampled_from([b for b in (2, 4, 6, 8) if kind == "zb-v" or rounds(S, b) is not None]))
    model = LayerModel("random", layers, 8 * B, None, options=opts)
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)
    if not costs.configs:
        return None
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=K - 1, max_size=K - 1)))
    edges = [0] + cuts + [n]
    s = Schedule(kind, virtual=v)
    mesh = tuple(mesh_of(s, S, k) for k in range(K))
    configs = [draw(st.sampled_from(costs.configs)) for _ in range(S)]
    stages = [StagePlan(edges[k], edges[k + 1] - 1, configs[mesh[k]]) for k in range(K)]
    return Partition(costs, stages, mesh), s


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(chunked())
def test_every_bound_is_below_the_simulated_time_with_chunks(case):
    if case is None:
        return
    plan, s = case
    run = simulate_schedule(plan, s)
    b = bounds(plan, s)
    for value in (b.stage, b.cycle, b.port, b.phase):
        assert value <= run.iteration_time * (1 + REL), (s, b, run.iteration_time)
    # the uniform search's bound of a whole pair, before any plan is priced
    assert work_bound(plan.costs) <= run.iteration_time * (1 + REL)
    # and of every plan of one configuration (a uniform plan's), which it only tightens
    if len({st.config for st in plan.stages}) == 1:
        cb = config_bound(plan.costs, plan.stages[0].config)
        assert work_bound(plan.costs) <= cb * (1 + REL) and cb <= run.iteration_time * (1 + REL)
    assert not run.timeline.overlaps()
    assert len(run.peak_memory) == len(run.busy) == plan.costs.stages
    # every mesh holds its chunks' weights at least, and fits says what the memory says
    assert fits(plan, s) == all(m <= plan.costs.device_memory for m in run.peak_memory)
    assert all(math.isfinite(m) for m in run.peak_memory)


@pytest.mark.parametrize("kind", ["interleaved-1f1b", "zb-v"])
def test_the_uniform_search_is_the_best_of_every_uniform_plan(kind):
    """OPTIMAL over uniform plans: the best simulated of all of them, found by brute force."""
    from solver_planner.stages import StageSearch, plan_partition
    from solver_planner.stages.fastsim import pipeline_run
    from solver_planner.stages.objective import fits as fits_
    from solver_planner.stages.uniform import uniform_plans

    topo = topology(2, 4, "4 GB/s", "host")
    layers = [Layer("embed", 0.0, 0.0, 2**28, 2**29, 2**24, 2**24)]
    layers += [Layer("block", 3e11, 6e11, 2**28, 2**29, 2**24, 2**25, allreduces=2, weight=3e11) for _ in range(8)]
    layers += [Layer("logits", 1e11, 2e11, 2**27, 2**28, 0.0, 2**24)]
    model = LayerModel("toy", layers, 16, None)
    search = StageSearch(model, topo, schedule=kind)
    res = plan_partition(search)
    assert res.status.value == "OPTIMAL" and res.method == "uniform"
    best = math.inf
    for pair in search.pairs():
        for plan, s in uniform_plans(pair, [kind]):
            if fits_(plan, s):
                best = min(best, pipeline_run(plan, s)[0].iteration_time)
    assert res.objective == pytest.approx(best, rel=1e-12)
    assert res.solution.plan.virtual == 2 or kind == "interleaved-1f1b"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_mesh_memory_of_one_chunk_per_stage_is_the_stage_memory(data):
    """Two implementations of a stage's peak memory: the per-chunk live sum over the order
    (chunked plans) and the live count times one micro-batch (one chunk per stage)."""
    from test_stages_objective import instances

    from solver_planner.stages.pipeline import mesh_orders
    from solver_planner.stages.schedule import live_peak

    case = data.draw(instances())
    if case is None:
        return
    plan, schedules = case
    for s in schedules:
        orders = mesh_orders(plan, s)
        memory, live = plan.mesh_memory(orders)
        want_live = [live_peak([(op, m) for op, _, m in o]) for o in orders]
        assert live == want_live
        assert memory == pytest.approx(plan.memory(want_live), rel=1e-12)


def test_an_empty_chunk_space_says_its_rule_not_a_memory_shortfall():
    """8 stages cannot hold 2 chunks each of a 6-block model: the refusal names the rule."""
    from conftest import run_cli

    r = run_cli("stages", ROOT / "specs/clusters/local-2x4.yaml", ROOT / "specs/models/gpt-tiny.yaml", "-s",
                "interleaved-1f1b", "--config", "1,1,8,8")
    assert r.returncode == 1
    assert "at least 2 chunks per stage of at least one of the 6 blocks" in r.stderr and "GiB" not in r.stderr
    r = run_cli("stages", ROOT / "specs/clusters/local-2x4.yaml", ROOT / "specs/models/gpt-tiny.yaml", "-s",
                "zb-v", "--json")
    assert r.returncode == 0
    pipe = json.loads(r.stdout)["baselines"]["pipeline"]
    assert not pipe["possible"] and "2 x stages <= 6" in pipe["reason"] and "GiB" not in pipe["reason"]
