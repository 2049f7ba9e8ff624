"""The stage search's fast simulator against the engine (stages/fastsim.py).

``fastsim.iteration`` must give exactly what ``simulate_schedule`` and the engine give:
iteration time, busy time per stage and task count, bit for bit, on random unbalanced plans
(skips, ties, recomputation, ZeRO, buckets, overlap, every schedule family, slow networks
where transfers and buckets compete for ports, and both compute models).
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.cost import CostModel
from solver_planner.stages import Layer, LayerModel, MemoryOptions, Schedule, family, simulate_schedule
from solver_planner.stages.costs import StageCosts, cost_tables, mesh_shapes
from solver_planner.stages.fastsim import iteration, pipeline_run
from solver_planner.stages.partition import Partition, StagePlan

from test_stages_chunks import chunked
from test_stages_objective import instances, topology


def same(plan: Partition, sch: Schedule) -> None:
    run = simulate_schedule(plan, sch)
    it = iteration(plan, sch)
    assert (it.time, it.busy, it.tasks) == (run.iteration_time, run.busy, len(run.timeline)), (plan, sch, it.engine)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(max_layers=7))
def test_fast_simulation_equals_the_engine(case):
    if case is None:
        return
    plan, schedules = case
    for sch in schedules:
        same(plan, sch)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(max_layers=6, comm=False))
def test_fast_simulation_equals_the_engine_without_communication(case):
    if case is None:
        return
    plan, schedules = case
    for sch in schedules:
        same(plan, sch)


@st.composite
def contended(draw):
    """Many micro-batches on slow shared NICs: transfers and buckets queue for ports."""
    hosts, gpus = draw(st.sampled_from([(4, 1), (4, 2), (8, 1), (2, 2)]))
    topo = topology(hosts, gpus, draw(st.sampled_from(["0.5 GB/s", "2 GB/s"])), draw(st.sampled_from(["host", "device"])),
                    efficiency=draw(st.booleans()))
    n = draw(st.integers(hosts, hosts + 4))
    layers = []
    for i in range(n):
        f = draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])) * 1e11         # equal times make ties at one instant
        act = draw(st.sampled_from([8.0, 32.0, 64.0])) * 2**20
        skips = (draw(st.integers(i + 2, n - 1)),) if i + 2 < n and draw(st.booleans()) else ()
        layers.append(Layer(f"l{i}", f, 2 * f, draw(st.sampled_from([0.0, 0.1, 0.5])) * 2**30, 0.0, act, act, 0.0,
                            skips=skips, weight=f))
    seen, fixed = set(), []
    for x in layers:
        keep = tuple(j for j in x.skips if j not in seen)
        seen |= set(keep)
        fixed.append(Layer(**{**x.__dict__, "skips": keep}))
    opts = MemoryOptions(("none",), "none", False, draw(st.booleans()), 16 * 2**20)
    batch = 16
    model = LayerModel("contended", fixed, batch, None, options=opts)
    shapes = [s for s in mesh_shapes(topo.num_hosts, topo.devices_per_host) if 1 < topo.num_devices // s.size <= n]
    if not shapes:
        return None
    shape = draw(st.sampled_from(shapes))
    B = draw(st.sampled_from([4, 8, 16]))
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape))
    if not costs.configs:
        return None
    S = costs.stages
    plans = []
    for _ in range(draw(st.integers(1, 3))):         # several plans of one pair, as a search simulates them
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1)))
        edges = [0] + cuts + [n]
        plans.append(Partition(costs, [StagePlan(edges[j], edges[j + 1] - 1, draw(st.sampled_from(costs.configs)))
                                       for j in range(S)]))
    return plans, family(draw(st.sampled_from(["1f1b", "gpipe", "eager-1f1b", "zb-h1"])), S)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(contended())
def test_fast_simulation_equals_the_engine_under_contention(case):
    if case is None:
        return
    plans, schedules = case
    for plan in plans:
        for sch in schedules:
            same(plan, sch)


def test_the_lazy_timeline_is_the_engines():
    topo = topology(2, 2, "1 GB/s", "host")
    layers = [Layer(f"l{i}", 1e11, 2e11, 2**28, 0.0, 2**24, 2**24, 0.0, weight=1e11) for i in range(4)]
    model = LayerModel("m", layers, 8, None, options=MemoryOptions())
    shape = mesh_shapes(2, 2)[0]
    costs = StageCosts(model, topo, shape, 4, cost_tables(topo, CostModel(topo), shape))
    S = costs.stages
    plan = Partition(costs, [StagePlan(p, p, costs.configs[0]) for p in range(S)])
    run, tasks = pipeline_run(plan, Schedule("1f1b"))
    ref = simulate_schedule(plan, Schedule("1f1b"))
    assert len(run.timeline) == tasks == len(ref.timeline)
    assert run.timeline.makespan == ref.iteration_time == run.iteration_time
    assert [(r.name, r.start, r.end) for r in run.timeline.records] == [(r.name, r.start, r.end) for r in
                                                                        ref.timeline.records]
    assert run.peak_memory == ref.peak_memory and run.in_flight == ref.in_flight and run.busy == ref.busy
    assert not math.isnan(run.bubble_ratio)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "eager-1f1b"])
def test_every_plan_a_search_simulates_equals_the_engine(monkeypatch, tmp_path, schedule):
    """GPT-3-shaped blocks on 4 DGX A100 nodes, as benchmarks/stages.py runs them: every plan
    the search simulates (many plans of one pair, so the memoised orders are reused)."""
    import yaml

    from solver_planner.spec import load_cluster_spec
    from solver_planner.spec.layers import TransformerSpec
    from solver_planner.stages import StageSearch, plan_partition, transformer_layers
    from solver_planner.stages import search as search_module
    from solver_planner.topology import Topology

    from conftest import CLUSTERS

    data = yaml.safe_load((CLUSTERS / "dgx-a100-128x8.yaml").read_text())
    data["levels"][0]["count"] = 4
    path = tmp_path / "c.yaml"           # read as a spec file: its device preset is applied
    path.write_text(yaml.safe_dump(data))
    topo = Topology(load_cluster_spec(path))
    spec = TransformerSpec(layers=16, hidden=12288, heads=96, sequence=2048, vocab=51200)
    model = LayerModel("gpt-18", transformer_layers(spec), 1536, None)
    checked = []
    fast = search_module.pipeline_run

    def checking(plan, sch):
        run, tasks = fast(plan, sch)
        ref = simulate_schedule(plan, sch)
        assert (run.iteration_time, run.busy, tasks) == (ref.iteration_time, ref.busy, len(ref.timeline)), (plan, sch)
        checked.append(plan)
        return run, tasks

    monkeypatch.setattr(search_module, "pipeline_run", checking)
    res = plan_partition(StageSearch(model, topo, schedule=schedule), "dp", top=4, simulations=100_000)
    assert len(checked) >= 8 and res.solutions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(chunked())
def test_fast_simulation_equals_the_engine_with_model_chunks(case):
    """Interleaved 1F1B and ZB-V: a mesh's chain holds several chunks' ops, chunks of one
    mesh share its reduction ports, and ZB-V's turn is a transfer that holds no port."""
    if case is None:
        return
    plan, sch = case
    same(plan, sch)
    run, tasks = pipeline_run(plan, sch)
    ref = simulate_schedule(plan, sch)
    assert (run.peak_memory, run.in_flight, tasks) == (ref.peak_memory, ref.in_flight, len(ref.timeline))
