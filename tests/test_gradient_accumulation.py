"""training.gradient_accumulation: each micro-batch's weight gradients added into the buffer
(``add``, the default: an element-wise pass of 2 G + G' bytes for every micro-batch after the
first: the buffer read and written, the new gradients read) or fused into the weight-gradient product (``fused``: nothing more)."""

import dataclasses

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner import api
from solver_planner.cost import CostModel
from solver_planner.errors import SpecError
from solver_planner.spec.model import load_model_spec
from solver_planner.stages import Layer, LayerModel, MeshShape
from solver_planner.stages.costs import StageCosts, StageConfig, cost_tables
from solver_planner.stages.memory import MemoryOptions
from solver_planner.targets import megatron as mg_target

from conftest import ROOT
from test_stages_objective import topology
from test_targets_export import MEGATRON_CASES

SHARDINGS = ("none", "zero-1", "zero-2", "zero-3")


def _costs(accumulation: str, sharding: str, B: int, hosts=2, gpus=2, efficiency=True, **options):
    topo = topology(hosts, gpus, "25 GB/s", "host", efficiency=efficiency)
    layers = [Layer(f"l{i}", 1e10, 2e10, p, 0.0, 2**20, 2**20, 0.0, allreduces=1)
              for i, p in enumerate([2**28, 2**30, 0.0, 2**29])]
    opts = MemoryOptions(sharding=sharding, gradient_accumulation=accumulation, **options)
    model = LayerModel("m", layers, 16, None, options=opts)
    shape = MeshShape(1, gpus)
    return StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True), topo


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SHARDINGS), st.sampled_from([1, 2, 4, 16]), st.sampled_from([1, 2]))
def test_add_is_one_pass_of_three_gradient_buffers_per_micro_batch_after_the_first(sharding, B, tensor):
    fused, _ = _costs("fused", sharding, B)
    added, _ = _costs("add", sharding, B)
    c = StageConfig(tensor)
    f_fwd, f_act, f_w = fused.layer_times(c)
    a_fwd, a_act, a_w = added.layer_times(c)
    # only the weight-gradient work grows (eager-1F1B's delayed part carries it)
    assert np.array_equal(f_fwd, a_fwd) and np.array_equal(f_act, a_act)
    comp = added.tables[tensor].cost.compute
    # one memory pass per layer over its tensor shard's gradients, (B - 1) of B micro-batches;
    # ZeRO-2 and ZeRO-3 add each micro-batch's reduced shard (1/d of it), the others keep
    # whole gradients until the step's one reduction; the layers' parameters written out,
    # not read back from the model
    params = [2**28, 2**30, 0.0, 2**29]
    d = 2 // tensor if sharding in ("zero-2", "zero-3") else 1
    want = [float(comp.time(0.0, 3.0 * p / tensor / d, 1.0)) * (B - 1) / B if p > 0 else 0.0 for p in params]
    assert np.allclose(a_w - f_w, want, rtol=1e-12, atol=0.0)
    if B > 1:
        assert (a_w - f_w)[1] > 0 and (a_w - f_w)[2] == 0.0      # the layer without parameters adds nothing


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_a_float32_buffer_of_bf16_gradients_moves_ten_bytes_a_parameter(sharding):
    """torchtitan's FSDP2 keeps float32 gradients of a bf16 model (gradient_bytes 2, reduced in
    float32): the buffer is read and written in float32 (8 bytes a parameter) and the new
    gradient read once, in bf16 (2 bytes), or in float32 where it arrives reduce-scattered
    (ZeRO-2/3: 4 bytes of a 1/d shard)."""
    B, tensor = 8, 1
    fused, _ = _costs("fused", sharding, B, gradient_bytes=2.0, gradient_reduce_dtype="float32")
    added, _ = _costs("add", sharding, B, gradient_bytes=2.0, gradient_reduce_dtype="float32")
    c = StageConfig(tensor)
    comp = added.tables[tensor].cost.compute
    each = sharding in ("zero-2", "zero-3")
    d = 2 if each else 1
    per_param = 2 * 4 + (4 if each else 2)               # bytes a bf16 parameter
    params = [2**28, 2**30, 0.0, 2**29]                  # bytes of bf16 parameters: elements x 2
    want = [float(comp.time(0.0, per_param * p / 2 / d, 1.0)) * (B - 1) / B if p > 0 else 0.0 for p in params]
    assert np.allclose(added.layer_times(c)[2] - fused.layer_times(c)[2], want, rtol=1e-12, atol=0.0)


def _spec(tmp_path, accumulation, batch=64, micro=None):
    d = {"name": "acc", "layers": [{"name": "l", "repeat": 4, "flops": "20 GFLOP", "params": "512 MiB",
                                    "activations": "1 MiB"}],
         "training": {"global_batch": batch, "dtype": "float16", "optimizer": "sgd", "host_overhead": 0,
                      "gradient_accumulation": accumulation}}
    if micro:
        d["training"]["microbatches"] = micro
    p = tmp_path / f"acc-{accumulation}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.parametrize("K", [1, 2, 8])
def test_one_stage_runs_k_minus_one_passes_more_in_the_simulation(tmp_path, K):
    """Differential against the simulator: with one stage of one device the iteration is K
    micro-batches back to back, so ``add`` costs exactly (K - 1) passes over each layer's
    gradients, at the device's memory bandwidth plus one kernel's overhead."""
    cluster = ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"
    times = {}
    for acc in ("fused", "add"):
        rep = api.stages(cluster, _spec(tmp_path, acc), config=f"1,1,1,{K}", schedule="1f1b", devices=1)
        times[acc] = rep.run.iteration_time
    from solver_planner.spec import load_cluster_spec
    from solver_planner.topology import Topology
    comp = CostModel(Topology(load_cluster_spec(cluster))).compute
    one = float(comp.time(0.0, 3.0 * 512 * 2**20, 1.0))
    assert times["add"] - times["fused"] == pytest.approx(4 * (K - 1) * one, rel=1e-9, abs=1e-12)


def test_the_default_is_add_and_a_bad_value_is_refused(tmp_path):
    assert load_model_spec(ROOT / "specs" / "models" / "gpt3-39b.yaml").training.gradient_accumulation == "add"
    bad = _spec(tmp_path, "sum")
    with pytest.raises(SpecError, match="gradient_accumulation"):
        load_model_spec(bad)


def test_distir_mlp_specs_describe_distir_s_programs():
    for m in ("mlp-1b", "mlp-17b", "mlp-103b"):
        tr = load_model_spec(ROOT / "specs" / "models" / f"{m}.yaml").training
        assert (tr.gradient_overlap, tr.gradient_accumulation) == (False, "add"), m


def test_the_megatron_export_turns_fusion_off_only_for_add_with_several_micro_batches():
    cfg = dataclasses.replace(MEGATRON_CASES["gpt3-1f1b"], gradient_accumulation="fused")
    assert cfg.microbatches > 1
    assert "--no-gradient-accumulation-fusion" not in mg_target.parse(mg_target.export(cfg))
    added = dataclasses.replace(cfg, gradient_accumulation="add")
    assert mg_target.parse(mg_target.export(added))["--no-gradient-accumulation-fusion"] is True
    one = dataclasses.replace(added, global_batch=cfg.data * cfg.micro_batch_size)
    assert one.microbatches == 1
    assert "--no-gradient-accumulation-fusion" not in mg_target.parse(mg_target.export(one))


def test_show_says_how_gradients_are_reduced_and_accumulated():
    from typer.testing import CliRunner
    from solver_planner.cli import app

    out = CliRunner().invoke(app, ["show", str(ROOT / "specs" / "models" / "mlp-1b.yaml")])
    assert out.exit_code == 0, out.output
    assert "reduced after the backward in float16, accumulated by an add per micro-batch" in out.output
    out = CliRunner().invoke(app, ["show", str(ROOT / "specs" / "models" / "gpt3-39b.yaml")])
    assert "reduced during the backward in" in out.output and "accumulated by an add per micro-batch" in out.output


def test_show_says_what_each_target_prices_where_the_spec_is_silent(tmp_path):
    """show's rows under the gradients row are what layer_model prices under each target
    (its --json too): a spec that says how to accumulate, reduce and bucket has none."""
    import json

    from typer.testing import CliRunner
    from solver_planner.cli import app

    silent = tmp_path / "silent.yaml"
    silent.write_text("name: g\ntransformer: {layers: 4, hidden: 256, heads: 8, sequence: 128, vocab: 1000}\n"
                      "training: {global_batch: 16}\n")
    out = CliRunner().invoke(app, ["show", str(silent), "--json"])
    said = json.loads(out.output)["target_defaults"]
    assert said["megatron"] == ["reduced in float32", "accumulation fused",
                                "buckets of max(40,000,000, 1,000,000 x data size) parameters",
                                "only the first stage reduces during its backward"]
    # torchtitan builds only its registry's Llama models: no row for a GELU GPT it refuses
    assert "torchtitan" not in said and "deepspeed" not in said
    out = CliRunner().invoke(app, ["show", str(ROOT / "examples" / "hf" / "llama-3-8b.json"), "--json"])
    assert json.loads(out.output)["target_defaults"]["torchtitan"] == ["reduced in float32"]
    told = tmp_path / "told.yaml"
    told.write_text(silent.read_text().replace("global_batch: 16", "global_batch: 16, gradient_accumulation: add,"
                                               " gradient_reduce_dtype: bfloat16, gradient_bucket: 25 MiB"))
    out = CliRunner().invoke(app, ["show", str(told), "--json"])
    # the bucket is whole parameters under Megatron (--ddp-bucket-size): 25 MiB of bf16 is
    # already whole, so nothing differs but the stage-first-only rule
    assert json.loads(out.output)["target_defaults"] == {
        "megatron": ["only the first stage reduces during its backward"]}
    plain = CliRunner().invoke(app, ["show", str(told)])
    assert "under --target megatron" in plain.output and "under --target torchtitan" not in plain.output
    # a 'layers:' list is planned by no target: nothing said for them
    layers = tmp_path / "layers.yaml"
    layers.write_text("name: l\nlayers:\n  - {name: a, flops: 1 GFLOP, params: 128 MiB, activations: 16 KiB}\n"
                      "training: {global_batch: 8}\n")
    out = CliRunner().invoke(app, ["show", str(layers), "--json"])
    assert json.loads(out.output)["target_defaults"] == {}


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed"])
def test_frameworks_that_add_refuse_a_fused_plan(target):
    from test_targets_export import DEEPSPEED_CASES, TORCHTITAN_CASES
    from solver_planner.targets.search import target_module

    cases = {"torchtitan": TORCHTITAN_CASES, "deepspeed": DEEPSPEED_CASES}[target]
    mod = target_module(target)
    for cfg in cases.values():
        if mod.allows(cfg) is not None or cfg.microbatches == 1:
            continue
        assert "fused accumulation" in mod.allows(dataclasses.replace(cfg, gradient_accumulation="fused"))
        break
    else:
        pytest.fail(f"no {target} case with several micro-batches")


def test_the_plan_breakdown_counts_the_addition_as_compute(tmp_path):
    """One device: nothing is tensor-parallel, so the addition must land in compute."""
    from solver_planner.plan import breakdown

    cluster = ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"
    parts = {}
    for acc in ("fused", "add"):
        plan = api.plan(cluster, _spec(tmp_path, acc), schedule="1f1b", config="1,1,1,8", devices=1)
        parts[acc] = breakdown(plan)
        assert parts[acc]["tensor_parallel"] == 0.0, parts[acc]
    assert parts["add"]["compute"] > parts["fused"]["compute"]


def test_the_megatron_target_plans_megatron_s_fusion_unless_the_spec_says_add(tmp_path):
    """Megatron-LM fuses the addition into the product by default: a spec silent on it is
    planned fused under --target megatron and exported with fusion on; a spec that says add
    is planned with the pass and exported with --no-gradient-accumulation-fusion; native
    planning of the silent spec adds."""
    import json

    from typer.testing import CliRunner
    from solver_planner.cli import app

    cluster = str(ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml")
    d = yaml.safe_load((ROOT / "specs" / "models" / "gpt3-2.6b.yaml").read_text())
    d["training"].pop("gradient_accumulation", None)
    silent = tmp_path / "silent.yaml"
    silent.write_text(yaml.safe_dump(d))
    d["training"]["gradient_accumulation"] = "add"
    said = tmp_path / "said.yaml"
    said.write_text(yaml.safe_dump(d))
    fixed = ["-s", "1f1b", "--config", "8,8,1,16"]

    def time(path, *extra):
        res = CliRunner().invoke(app, ["stages", cluster, str(path), *fixed, "--json", "--no-baselines", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["iteration_time"]

    fused, added = time(silent, "--target", "megatron"), time(said, "--target", "megatron")
    assert added > fused
    # native: the default, add (Megatron-LM's own plan also counts its fp32 main gradients)
    assert time(silent) == pytest.approx(time(said), rel=1e-12)
    for path, flag in ((silent, False), (said, True)):
        out = tmp_path / f"{path.stem}.sh"
        res = CliRunner().invoke(app, ["plan", cluster, str(path), *fixed, "--target", "megatron",
                                       "-o", str(tmp_path / f"{path.stem}-plan.yaml"), "--export", str(out)])
        assert res.exit_code == 0, res.output
        assert ("--no-gradient-accumulation-fusion" in out.read_text()) is flag
        res = CliRunner().invoke(app, ["check", cluster, str(path), str(tmp_path / f"{path.stem}-plan.yaml")])
        assert res.exit_code == 0, res.output
    # check derives the times again from the spec it is given: the plan priced with the pass
    # is refused against the spec planned without it, and the reverse
    for spec, plan in ((silent, "said-plan.yaml"), (said, "silent-plan.yaml")):
        res = CliRunner().invoke(app, ["check", cluster, str(spec), str(tmp_path / plan)])
        assert res.exit_code == 1, res.output
