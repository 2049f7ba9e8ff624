"""Stage partitioning and pipeline schedules: solvers agree, simulation matches the objective."""

import json

import numpy as np
import pytest

from solver_planner.errors import InfeasibleError, SpecError
from solver_planner.spec import load_model_spec
from solver_planner.spec.cluster import load_cluster_spec
from solver_planner.spec.layers import TransformerSpec
from solver_planner.stages import (Layer, LayerModel, MeshShape, StageSearch,
                                   balanced_greedy, brute_force, in_flight, plan_partition, simulate_pipeline,
                                   simulate_schedule, stage_order, transformer_layers)
from solver_planner.stages.report import plan_stages
from solver_planner.topology import Topology, load_topology

from conftest import CLUSTERS, SPECS, run_cli

SMALL_CLUSTER = """
name: small-2x2
levels: [{name: host, count: 2}, {name: gpu, count: 2}]
device: {name: toy, flops: 100 TFLOP/s, memory: MEMORY}
interconnects:
  - {name: nvlink, level: gpu, bandwidth: 50 GB/s, latency: 2us}
  - {name: eth, level: host, bandwidth: 2 GB/s, latency: 20us, sharing: host}
"""


def small_cluster(tmp_path, memory="16 GiB") -> Topology:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_CLUSTER.replace("MEMORY", memory))
    return Topology(load_cluster_spec(path))


def random_layers(rng, n) -> list[Layer]:
    out = []
    for i in range(n):
        f = float(rng.uniform(0.5, 3.0)) * 1e11
        act = float(rng.uniform(1, 40)) * 2**20
        out.append(Layer(f"l{i}", f, 2 * f, float(rng.uniform(0.1, 2)) * 2**30, 0.0, act, 2 * act,
                         allreduces=int(rng.integers(0, 3))))
    return out


# -- layer model ---------------------------------------------------------------------------
def test_transformer_helper_counts_gpt3_175b_parameters():
    layers = transformer_layers(TransformerSpec(layers=96, hidden=12288, heads=96, sequence=2048, vocab=51200),
                                "bfloat16")
    params = sum(x.params for x in layers) / 2          # bytes at 2 per parameter
    assert params == pytest.approx(175e9, rel=0.01)
    # forward + backward per token of the blocks = 6 x block parameters (Kaplan et al. 2020)
    block = layers[1]
    per_token = (block.forward + block.backward) / 2048
    assert per_token == pytest.approx(6 * block.params / 2, rel=0.12)


def test_boundary_bytes_count_skip_connections():
    acts = [1.0, 2.0, 4.0, 8.0, 16.0]
    layers = [Layer(f"l{i}", 1, 2, 0, 0, a, a, skips=(4,) if i == 0 else ()) for i, a in enumerate(acts)]
    m = LayerModel("u", layers, 8, None)
    send, recv = m.boundary_bytes()
    assert send[0, 1] == 2.0 + 1.0           # layer 1's output and layer 0's skip to layer 4
    assert send[2, 3] == 8.0                 # stage 2..3 sends layer 3's output only
    assert recv[2, 4] == 2.0 + 1.0           # stage 2..4 receives layer 1's output and the skip
    assert send[0, 4] == 0 and recv[0, 4] == 0


@pytest.mark.parametrize("text, message", [
    ("name: m\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "training"),
    ("name: m\ntraining: {global_batch: 8}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB, skip_to: [b]}]\n",
     "no layer named 'b'"),
    ("name: m\ntraining: {global_batch: 8, microbatches: 3}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n",
     "do not divide"),
    ("name: m\ntraining: {global_batch: 8}\ntransformer: {layers: 2, hidden: 8, heads: 2, sequence: 4, vocab: 10}\n"
     "layers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "not both"),
])
def test_bad_layer_specs_are_refused_with_the_key(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_model_spec(path)
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", path)
    assert res.returncode == 2 and message in res.stderr


# -- solvers agree ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_dp_cpsat_and_brute_force_agree_on_small_instances(tmp_path, seed, schedule):
    rng = np.random.default_rng(seed)
    topo = small_cluster(tmp_path, "6 GiB")
    model = LayerModel("r", random_layers(rng, 5), 8, None)
    search = StageSearch(model, topo, schedule)
    results = {m: plan_partition(search, m) for m in ("dp", "cpsat", "brute-force")}
    objs = {m: r.objective for m, r in results.items()}
    assert objs["dp"] == pytest.approx(objs["brute-force"], rel=1e-9), objs
    assert objs["cpsat"] == pytest.approx(objs["brute-force"], rel=1e-6), objs
    for r in results.values():
        assert r.status.value == "OPTIMAL" and r.gap == 0
        assert r.solution.feasible
    greedy = plan_partition(search, "greedy")
    assert greedy.objective >= objs["brute-force"] * (1 - 1e-9)
    assert greedy.bound <= objs["brute-force"] * (1 + 1e-9)


def test_exact_partition_beats_every_enumerated_partition_per_pair(tmp_path):
    topo = small_cluster(tmp_path)
    model = LayerModel("r", random_layers(np.random.default_rng(7), 6), 4, None)
    for prob in StageSearch(model, topo).problems():
        best, _ = prob.solve_dp()
        brute = brute_force(prob)
        assert (best is None) == (brute is None)
        if best is not None:
            assert best.objective == pytest.approx(brute.objective, rel=1e-9)
            assert prob.lower_bound() <= best.objective * (1 + 1e-12)


# -- simulation ------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager-1f1b"])
@pytest.mark.parametrize("S, B", [(1, 1), (3, 2), (4, 4), (4, 9)])
def test_stage_orders_run_every_microbatch_once_and_respect_in_flight(schedule, S, B):
    for p in range(S):
        order = stage_order(schedule, S, p, B, eagerness=S)
        assert sorted(order) == sorted([("F", m) for m in range(B)] + [("B", m) for m in range(B)])
        live = peak = 0
        for op, m in order:
            if op == "B":
                assert order.index(("F", m)) < order.index(("B", m))
            live += 1 if op == "F" else -1
            peak = max(peak, live)
        assert peak == in_flight(schedule, S, p, B)


def balanced_model(n=8, batch=16):
    f = 4e11
    return LayerModel("uniform", [Layer("b", f, 2 * f, 2**28, 2**29, 2**24, 2**25) for _ in range(n)], batch, None)


@pytest.mark.parametrize("shape", [MeshShape(1, 2), MeshShape(1, 1), MeshShape(2, 2)])
def test_zero_communication_1f1b_simulation_equals_the_objective(tmp_path, shape):
    topo = small_cluster(tmp_path)
    search = StageSearch(balanced_model(), topo, "1f1b", comm=False)
    res = plan_partition(search, "dp", shapes=[shape])
    part = res.solution
    assert len({round(t, 15) for t in part.times}) == 1     # 8 equal layers on 1, 2 or 4 stages: balanced
    run, _ = simulate_pipeline(part, search.cost, "1f1b")
    assert run.iteration_time == pytest.approx(res.objective, rel=1e-12)
    S, B = part.costs.stages, part.costs.microbatches
    assert run.iteration_time == pytest.approx((S + B - 1) * part.times[0], rel=1e-12)


def test_zero_communication_simulation_never_exceeds_the_objective(tmp_path):
    """Alpa's formula is an upper bound of 1F1B when backward/forward ratios are equal."""
    topo = small_cluster(tmp_path)
    for seed in range(6):
        model = LayerModel("r", random_layers(np.random.default_rng(seed), 6), 8, None)
        search = StageSearch(model, topo, "1f1b", comm=False)
        for prob in search.problems():
            plan = balanced_greedy(prob)
            if plan is None or not plan.feasible:
                continue
            run = simulate_schedule(plan, search.cost, "1f1b")
            assert run.iteration_time <= plan.objective * (1 + 1e-12)


def test_simulated_pipeline_respects_dependencies_and_never_overlaps_a_stage():
    topo = load_topology(CLUSTERS / "aws-p3.8xlarge-2.yaml")
    rep = plan_stages(topo, load_model_spec(SPECS / "models" / "u-transformer.yaml"), "eager-1f1b", "dp", stages=2)
    tl = rep.run.timeline
    assert not tl.overlaps()
    when = {r.name: r for r in tl.records}
    B = rep.partition.costs.microbatches
    for m in range(B):
        assert when[f"F0 mb{m}"].end <= when[f"act 0->1 mb{m}"].start + 1e-12
        assert when[f"act 0->1 mb{m}"].end <= when[f"F1 mb{m}"].start + 1e-12
        assert when[f"B1 mb{m}"].end <= when[f"grad 1->0 mb{m}"].start + 1e-12
        assert when[f"grad 1->0 mb{m}"].end <= when[f"B0 mb{m}"].start + 1e-12


@pytest.mark.parametrize("model, cluster, stages", [
    ("u-transformer.yaml", "aws-p3.8xlarge-2.yaml", 2),
    ("gpt3-2.6b.yaml", "aws-p3.8xlarge-2.yaml", 2),
    ("gpt3-2.6b.yaml", "aws-p3.8xlarge-2.yaml", 4),
])
def test_eager_1f1b_is_never_slower_than_1f1b_and_hides_communication(model, cluster, stages):
    topo = load_topology(CLUSTERS / cluster)
    spec = load_model_spec(SPECS / "models" / model)
    rep = plan_stages(topo, spec, "eager-1f1b", "dp", stages=stages)
    full = simulate_schedule(rep.partition, StageSearch(rep.partition.costs.model, topo).cost, "eager-1f1b",
                             eagerness=stages - 1)
    assert rep.run.iteration_time <= rep.baseline.iteration_time
    assert rep.run.iteration_time <= full.iteration_time
    if model.startswith("u-"):
        assert rep.as_dict()["hidden_communication"] > 0.05 * rep.baseline.iteration_time


# -- memory ----------------------------------------------------------------------------------
def test_memory_limit_is_respected_and_infeasible_reports_the_shortfall(tmp_path):
    topo = small_cluster(tmp_path, "2 GiB")
    model = balanced_model()
    with pytest.raises(InfeasibleError, match=r"GiB short"):
        plan_partition(StageSearch(model, topo), "dp")
    roomy = small_cluster(tmp_path, "6 GiB")
    res = plan_partition(StageSearch(model, roomy), "dp")
    assert all(m <= roomy.device.memory for m in res.solution.memory)
    run, _ = simulate_pipeline(res.solution, StageSearch(model, roomy).cost)
    assert all(m <= roomy.device.memory for m in run.peak_memory)


def test_cli_infeasible_exits_1_with_the_shortfall(tmp_path):
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-175b.yaml")
    assert res.returncode == 1
    assert "short" in res.stderr


# -- gradient reduction ----------------------------------------------------------------------
def test_gradient_reduction_uses_the_best_p2_program_across_hosts():
    topo = load_topology(CLUSTERS / "p2-a100-4x16.yaml")
    tab = StageSearch(balanced_model(4, 64), topo).tables(MeshShape(4, 16))[1]
    flat = tab.gradient_programs[0]
    nbytes = 2**30
    assert flat[2] == "AllReduce"
    assert tab.gradient_time(nbytes) < flat[0] + flat[1] * nbytes    # hierarchical programs win across NICs
    assert tab.gradient_program(nbytes) != "AllReduce"


# -- command line ----------------------------------------------------------------------------
def test_cli_json_shape_and_determinism():
    args = ("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml", "--json")
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    for d in (da, db):
        d.pop("solve_time")
    assert da == db
    assert {"stages", "microbatches", "iteration_time", "status", "method", "bubble_ratio"} <= set(da)
    n_layers = 32 + 2
    cover = []
    for st in da["stages"]:
        assert st["data"] * st["tensor"] == st["mesh"][0] * st["mesh"][1]
        assert st["memory"] <= da["device_memory"]
        cover += list(range(st["layers"][0], st["layers"][1] + 1))
    assert cover == list(range(n_layers))
    assert da["iteration_time"] <= da["objective"] * (1 + 1e-9)


def test_cli_trace_and_forced_stage_count(tmp_path):
    out = tmp_path / "t.json"
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "u-transformer.yaml",
                  "--schedule", "eager-1f1b", "--stages", "2", "--trace", out, "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert len(data["stages"]) == 2 and data["hidden_communication"] >= 0
    events = json.loads(out.read_text())["traceEvents"]
    assert any("act 0->1" in e.get("name", "") for e in events)
    bad = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "u-transformer.yaml",
                  "--stages", "3")
    assert bad.returncode == 1 and "not possible" in bad.stderr
