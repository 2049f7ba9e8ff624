"""Stage partitioning: the layer model, memory options, schedules, and the command line."""

import json

import numpy as np
import pytest

from solver_planner.spec.layers import HOST_OVERHEAD

from solver_planner.errors import SpecError
from solver_planner.spec import load_model_spec
from solver_planner.spec.cluster import load_cluster_spec
from solver_planner.spec.layers import TransformerSpec
from solver_planner.stages import Layer, LayerModel, MeshShape, MemoryOptions, Schedule, family, stage_order
from solver_planner.stages.costs import StageConfig, StageCosts, cost_tables
from solver_planner.stages.layers import layer_model, transformer_layers
from solver_planner.stages.memory import saved_per_sample, static_bytes
from solver_planner.stages.schedule import live_count, live_peak, warmup
from solver_planner.cost import CostModel
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
    # the weight gradients are the forward's matrix products (24 s h^2), not the attention scores
    assert block.weight_flops == pytest.approx(24 * 2048 * 12288**2)
    assert layers[-1].tied_to == 0 and layers[-1].tied_params == 51200 * 12288 * 2


def test_untied_logits_hold_their_own_table():
    spec = TransformerSpec(layers=2, hidden=64, heads=4, sequence=16, vocab=100)
    tied, untied = transformer_layers(spec, tied=True), transformer_layers(spec, tied=False)
    assert tied[-1].params == 0 and untied[-1].params == 100 * 64 * 2 and untied[-1].tied_to is None


def test_edges_list_every_tensor_once_with_skips():
    acts = [1.0, 2.0, 4.0, 8.0, 16.0]
    layers = [Layer(f"l{i}", 1, 2, 0, 0, a, a, skips=(4,) if i == 0 else ()) for i, a in enumerate(acts)]
    m = LayerModel("u", layers, 8, None)
    assert sorted(m.edges()) == [(0, 1, 1.0), (0, 4, 1.0), (1, 2, 2.0), (2, 3, 4.0), (3, 4, 8.0)]


@pytest.mark.parametrize("text, message", [
    ("name: m\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "training"),
    ("name: m\ntraining: {global_batch: 8}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB, skip_to: [b]}]\n",
     "no layer named 'b'"),
    ("name: m\ntraining: {global_batch: 8, microbatches: 3}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n",
     "do not divide"),
    ("name: m\ntraining: {global_batch: 8}\ntransformer: {layers: 2, hidden: 8, heads: 2, sequence: 4, vocab: 10}\n"
     "layers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "not both"),
    ("name: m\ntraining: {global_batch: 8, recompute: sometimes}\n"
     "layers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "training.recompute"),
    ("name: m\ntraining: {global_batch: 8, optimizer_sharding: zero-4}\n"
     "layers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n", "optimizer_sharding"),
    ("name: m\ntraining: {global_batch: 8}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB},"
     " {name: b, flops: 1 GFLOP, activations: 1 MiB, tied_to: c}]\n", "no layer named 'c'"),
    ("name: m\ntraining: {global_batch: 8}\nlayers: [{name: a, flops: 1 GFLOP, activations: 1 MiB, tied_to: b},"
     " {name: b, flops: 1 GFLOP, activations: 1 MiB}]\n", "does not come before"),
    ("name: m\ntraining: {global_batch: 8}\nlayers: [{name: a, flops: 1 GFLOP, weight_flops: 3 GFLOP,"
     " activations: 1 MiB}]\n", "exceeds the backward"),
])
def test_bad_layer_specs_are_refused_with_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message) as err:
        load_model_spec(path)
    assert str(err.value).startswith(f"{path}:")


def test_cli_bad_training_option_is_one_line_exit_2(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntraining:\n  global_batch: 8\n  recompute: maybe\n"
                    "layers: [{name: a, flops: 1 GFLOP, activations: 1 MiB}]\n")
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", path)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and f"{path}:4: training.recompute" in res.stderr


def test_generic_layers_read_every_new_field(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntraining: {global_batch: 8, recompute: auto, optimizer_sharding: zero-2,"
                    " sequence_parallel: true, gradient_bucket: 4 MiB}\n"
                    "layers:\n  - {name: a, flops: 1 GFLOP, params: 1 MiB, activations: 1 MiB, checkpoint: 2 MiB,"
                    " selective_saved: 3 MiB, selective_flops: 4 GFLOP, weight_flops: 0.5 GFLOP}\n"
                    "  - {name: b, flops: 1 GFLOP, activations: 1 MiB, tied_to: a}\n")
    m = layer_model(load_model_spec(path))
    a, b = m.layers
    assert (a.checkpoint, a.selective_saved, a.selective_flops, a.weight_flops) == (2 * 2**20, 3 * 2**20, 4e9, 5e8)
    assert b.tied_to == 0 and b.tied_params == 2**20
    assert m.options == MemoryOptions(("none", "selective", "full"), "zero-2", True, True, 4 * 2**20, HOST_OVERHEAD, True)


# -- memory formulas (ZeRO §5.1, Korthikanti et al. 2022) ------------------------------------
def test_zero_stages_divide_what_the_paper_says():
    P, O, t, d = np.array([8.0]), np.array([48.0]), 2, 4        # 2 bytes/param, Adam: K = 12
    assert static_bytes(P, O, t, d, "none")[0] == (8 + 8 + 48) / 2
    assert static_bytes(P, O, t, d, "zero-1")[0] == static_bytes(P, O, t, d, "distributed")[0] == 16 / 2 + 48 / 8
    assert static_bytes(P, O, t, d, "zero-2")[0] == 8 / 2 + 56 / 8
    assert static_bytes(P, O, t, d, "zero-3")[0] == 64 / 8


def test_transformer_activation_memory_matches_korthikanti_table_2():
    s, h, a, t = 2048, 12288, 96, 8
    spec = TransformerSpec(layers=1, hidden=h, heads=a, sequence=s, vocab=100)
    block = transformer_layers(spec, attention="materialized")[1]
    # bytes per sequence: none sh(10 + 24/t + 5as/ht); SP sh/t (34 + 5as/h); selective sh(10 + 24/t);
    # selective + SP 34sh/t; full 2sh (its input), 2sh/t with SP
    assert saved_per_sample([block], "none", t, False)[0] == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert saved_per_sample([block], "none", t, True)[0] == pytest.approx(s * h / t * (34 + 5 * a * s / h))
    assert saved_per_sample([block], "selective", t, False)[0] == pytest.approx(s * h * (10 + 24 / t))
    assert saved_per_sample([block], "selective", t, True)[0] == pytest.approx(34 * s * h / t)
    assert saved_per_sample([block], "full", t, False)[0] == pytest.approx(2 * s * h)
    assert saved_per_sample([block], "full", t, True)[0] == pytest.approx(2 * s * h / t)
    # flash attention keeps no scores, only each row's fp32 log-sum-exp (4 a s bytes, split by
    # the heads): the rest of the table stands
    flash = transformer_layers(spec, attention="flash")[1]
    assert saved_per_sample([flash], "none", t, False)[0] == pytest.approx(s * h * (10 + 24 / t) + 4 * a * s / t)
    assert saved_per_sample([flash], "none", t, True)[0] == pytest.approx(34 * s * h / t + 4 * a * s / t)
    for mode in ("selective", "full"):
        for sp in (False, True):
            assert saved_per_sample([flash], mode, t, sp)[0] == saved_per_sample([block], mode, t, sp)[0]


def _costs(topo, model, shape=MeshShape(1, 2), B=2):
    return StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape))


def test_recomputation_trades_memory_for_backward_time(tmp_path):
    topo = small_cluster(tmp_path)
    spec = TransformerSpec(layers=4, hidden=1024, heads=16, sequence=512, vocab=1000)
    opts = MemoryOptions(("none", "selective", "full"))
    model = LayerModel("t", transformer_layers(spec), 8, None, options=opts)
    c = _costs(topo, model)
    none, sel, full = (c[StageConfig(1, r)] for r in ("none", "selective", "full"))
    k, i = 1, 4
    assert full.activation[k, i] < sel.activation[k, i] < none.activation[k, i]
    assert none.backward_act[k, i] < sel.backward_act[k, i] < full.backward_act[k, i]
    # full recomputation runs the forward again: exactly its compute
    assert full.backward_act[k, i] - none.backward_act[k, i] == pytest.approx(none.forward[k, i], rel=1e-12)
    assert full.transient[k, i] > 0 == none.transient[k, i]
    assert [cfg.recompute for cfg in c.configs] == ["none", "selective", "full"] * 2


def test_tied_copy_costs_memory_only_on_a_stage_without_the_shared_layer(tmp_path):
    topo = small_cluster(tmp_path)
    spec = TransformerSpec(layers=2, hidden=256, heads=4, sequence=64, vocab=5000)
    c = _costs(topo, LayerModel("t", transformer_layers(spec), 8, None))
    static = c.memory_parts(StageConfig(1))[0]
    own = c.model.layers[3].params   # 0: the tied logits
    assert static[0, 3] == pytest.approx(static[0, 2] + 2 * own)           # embedding on the same stage
    copy = 2 * c.model.layers[3].tied_params + c.model.layers[3].tied_optimizer
    assert static[3, 3] == pytest.approx(copy)


# -- schedules -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "eager-1f1b"])
@pytest.mark.parametrize("S, B", [(1, 1), (3, 2), (4, 4), (4, 9)])
def test_every_order_runs_each_microbatch_once_in_order(kind, S, B):
    for sch in family(kind, S):
        for p in range(S):
            for delay in (False, True):
                order = stage_order(sch, S, p, B, delay)
                ops = ("F", "BA", "BW") if sch.split else ("F", "B")
                assert sorted(order) == sorted((op, m) for op in ops for m in range(B))
                for op in ops[1:]:
                    backs = [m for o, m in order if o == op]
                    assert backs == sorted(backs)            # backwards in micro-batch order
                for m in range(B):
                    assert order.index(("F", m)) < order.index((ops[1], m))
                    if sch.split:
                        assert order.index(("BA", m)) < order.index(("BW", m))
                W = warmup(sch, S, p, B)
                assert [o for o, _ in order[:W]] == ["F"] * W and order[W][0] != "F"
                assert live_peak(order) == live_count(sch, S, p, B, delay) in (W, W + 1)


def test_eager_family_contains_1f1b_and_weight_delaying():
    fam = family("eager-1f1b", 8)
    assert Schedule("eager-1f1b", 0, False) in fam and Schedule("eager-1f1b", 7, True) in fam
    assert {s.eagerness for s in fam} == {0, 1, 2, 4, 7}
    assert stage_order(Schedule("eager-1f1b", 0), 4, 1, 6) == stage_order(Schedule("1f1b"), 4, 1, 6)


# -- command line --------------------------------------------------------------------------
def test_cli_json_shape_and_determinism():
    args = ("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml", "--json")
    a = run_cli(*args)
    b = run_cli(*args, env={"PYTHONHASHSEED": "123"})
    assert a.returncode == 0, a.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    for d in (da, db):
        d.pop("solve_time")
        d["search"].pop("objective_proven_after", None)
    assert da == db
    assert {"stages", "config", "iteration_time", "objective", "bound", "gap", "status", "method", "schedule",
            "bubble_ratio", "top", "bounds", "objective_exact", "memory"} <= set(da)
    cover = []
    for st in da["stages"]:
        assert st["data"] * st["tensor"] == st["mesh"][0] * st["mesh"][1]
        assert st["memory"] <= da["device_memory"]
        cover += list(range(st["layers"][0], st["layers"][1] + 1))
    assert cover == list(range(32 + 2))
    assert da["objective"] <= da["iteration_time"] * (1 + 1e-9)
    assert da["bound"] <= da["iteration_time"] * (1 + 1e-9)
    assert da["gap"] == pytest.approx((da["iteration_time"] - da["bound"]) / da["iteration_time"], abs=1e-12)


@pytest.mark.slow
def test_cli_trace_of_a_forced_stage_count(tmp_path):
    out = tmp_path / "t.json"
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "u-transformer.yaml",
                  "--stages", "2", "--trace", out, "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert len(data["stages"]) == 2
    events = json.loads(out.read_text())["traceEvents"]
    assert any("act 0->1" in e.get("name", "") for e in events)
    assert any(e.get("cat") == "gradient-reduction" for e in events)


def test_cli_infeasible_exits_1_with_the_smallest_shortfall():
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-175b.yaml")
    assert res.returncode == 1
    assert "GiB short" in res.stderr and "needs" in res.stderr


@pytest.mark.parametrize("config, split, stages, message", [
    ("2,2,x,4", None, None, "d,t,p,k"), ("2,2,3,4", None, None, "devices"), ("1,8,1,4", None, None, "inside a host"),
    (None, (4, 4), None, "layers"), ("1,2,4,3", None, None, "do not divide"), (None, (5, 4), 3, "split"),
])
def test_malformed_config_split_and_stages_are_option_errors(config, split, stages, message):
    from solver_planner.stages.report import parse_config, plan_stages
    from solver_planner.errors import OptionError
    topo = load_topology(CLUSTERS / "aws-p3.8xlarge-2.yaml")
    spec = load_model_spec(SPECS / "models" / "u-transformer.yaml")
    with pytest.raises(OptionError, match=message):
        plan_stages(topo, spec, config=parse_config(config) if config else None, layer_counts=split, stages=stages)


def test_cli_option_error_exits_2_on_one_line():
    res = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "u-transformer.yaml",
                  "--config", "2,2,x,4")
    assert res.returncode == 2 and "d,t,p,k" in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.parametrize("args, code, message", [
    (["-s", "zigzag"], 2, "unknown schedule"), (["-m", "magic"], 2, "unknown method"),
    (["--split", "0,2"], 2, "--split expects"), (["--split", "x"], 2, "--split expects"),
    (["--method", "cp-sat", "-t", "0.001", "--budget", "1", "--stages", "2"], (0, 3), ""),
])
def test_option_errors_and_unknown_map_to_their_exit_codes_in_the_shared_handler(args, code, message):
    from typer.testing import CliRunner

    from solver_planner.cli import app
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "aws-p3.8xlarge-2.yaml"),
                                   str(SPECS / "models" / "gpt3-2.6b.yaml"), "--no-baselines", *args])
    assert res.exit_code in (code if isinstance(code, tuple) else (code,)), res.output
    assert message in res.output and "Traceback" not in res.output
    if res.exit_code == 3:
        assert "unknown:" in res.output


def test_unknown_under_json_carries_its_status_and_bound():
    """An undecided search (the dynamic program with one subspace) reports status UNKNOWN
    and the lower bound it proved, beside the error object; its advice fits the method."""
    from typer.testing import CliRunner

    from solver_planner.cli import app
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"),
                                                   str(SPECS / "models" / "gpt3-39b.yaml"), "--no-baselines",
                                                   "--method", "dp", "--budget", "1", "--sim-budget", "1", "--json"])
    assert res.exit_code == 3, res.output
    data = json.loads(res.stdout)
    assert data["status"] == "UNKNOWN" and data["error"]["code"] == 3
    assert "--method dp" not in data["error"]["message"] and "--budget" in data["error"]["message"]
    # the bound is a lower bound: the search run to the end finds nothing faster than it
    full = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"),
                                                    str(SPECS / "models" / "gpt3-39b.yaml"), "--no-baselines",
                                                    "--method", "dp", "--json"])
    assert 0 < data["bound"] <= json.loads(full.stdout)["iteration_time"] * (1 + 1e-9)


@pytest.mark.parametrize("config,reason", [
    ("3,1,2,8", "a micro-batch of 128 samples (8 micro-batches) does not split over d = 3 replicas of a 1x3 mesh"),
    ("6,1,1,8", "does not split over d = 6 replicas of a 1x6 mesh"),
    ("3,1,1,1", "a micro-batch of 1024 samples (1 micro-batch) does not split over d = 3 replicas"),
])
def test_an_impossible_config_is_refused_with_its_real_reason(tmp_path, config, reason):
    """Was: '--config 3,1,2,k' on a 6-GPU host refused as 'stage counts of its mesh shapes: 2',
    though 2 stages is what it asked; the micro-batch not splitting over d=3 is why."""
    cluster = tmp_path / "host6.yaml"
    cluster.write_text("name: host6\nlevels:\n  - {name: node, count: 1}\n  - {name: gpu, count: 6}\n"
                       "device: {preset: A100-SXM4-80GB}\ninterconnects:\n"
                       "  - {name: nvswitch, level: gpu, bandwidth: 300 GB/s, latency: 2us, sharing: device}\n")
    res = run_cli("stages", cluster, SPECS / "models" / "gpt3-2.6b.yaml", "--config", config, "--no-baselines")
    assert res.returncode == 1 and reason in res.stderr, res.stderr     # no plan is possible: exit 1
    assert "stage counts" not in res.stderr
    # a count that does split is planned
    ok = run_cli("stages", cluster, SPECS / "models" / "gpt3-2.6b.yaml", "--config", "2,1,3,64", "--no-baselines")
    assert ok.returncode in (0, 1), ok.stderr
