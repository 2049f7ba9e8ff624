"""training.gradient_reduce_dtype: the type gradients cross the data-parallel replicas in.
torchtitan's FSDP2 always reduces bf16 gradients in float32, and Megatron-LM does unless told
--grad-reduce-in-bf16, so --target torchtitan and --target megatron plans of bf16 models are
priced that way unless the spec says otherwise; a target refuses a type it cannot run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import CLUSTERS, llama_training
from solver_planner.cli import app
from solver_planner.cost import CostModel
from solver_planner.spec import load_cluster_spec
from solver_planner.spec.layers import TrainingSpec, TransformerSpec
from solver_planner.spec.model import ModelSpec
from solver_planner.stages.costs import StageConfig, StageCosts, cost_tables
from solver_planner.stages.layers import layer_model
from solver_planner.stages.meshes import MeshShape
from solver_planner.targets import deepspeed, megatron, torchtitan
from solver_planner.targets.base import TargetConfig
from solver_planner.topology import Topology

LLAMA = TransformerSpec(layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=32000, sequence=1024,
                        activation="swiglu", position="rotary", norm="rmsnorm", bias=False)


def _spec(**training) -> ModelSpec:
    return ModelSpec(name="m", transformer=LLAMA,
                     training=TrainingSpec(global_batch=64, optimizer_sharding="zero-3", **training))


def _costs(lm):
    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    shape = MeshShape(8, 8)          # one stage: 64-way data parallelism over the hosts
    return StageCosts(lm, topo, shape, 4, cost_tables(topo, CostModel(topo), shape))[StageConfig(1, "none")]


def test_a_float32_reduction_moves_twice_the_bytes_and_takes_longer():
    bf16, fp32 = _costs(layer_model(_spec())), _costs(layer_model(_spec(gradient_reduce_dtype="float32")))
    n = len(bf16.layer_reduction) - 1
    assert float(fp32.grad_bytes[0, n]) == pytest.approx(2 * float(bf16.grad_bytes[0, n]))
    assert np.all(fp32.layer_reduction >= bf16.layer_reduction) and fp32.reduction_all[0, n] > bf16.reduction_all[0, n]
    # the bytes kept are the training dtype's: memory does not change
    assert fp32.static[0, n] == bf16.static[0, n] and fp32.activation[0, n] == bf16.activation[0, n]
    # the same type as training is the default
    same = _costs(layer_model(_spec(gradient_reduce_dtype="bfloat16")))
    assert same.reduction_all[0, n] == bf16.reduction_all[0, n]


def test_framework_plans_of_bf16_models_reduce_in_float32_unless_the_spec_says():
    assert layer_model(_spec()).options.gradient_reduce_dtype is None
    assert layer_model(_spec(), "deepspeed").options.gradient_reduce_dtype is None
    for target in ("megatron", "torchtitan"):
        assert layer_model(_spec(), target).options.gradient_reduce_dtype == "float32"
        if target == "megatron":           # --grad-reduce-in-bf16 (torchtitan refuses it: below)
            assert layer_model(_spec(gradient_reduce_dtype="bfloat16"), target).options.gradient_reduce_dtype \
                == "bfloat16"
        # fp16 (Megatron-LM reduces fp16 gradients in fp16) and fp32 models: the training dtype
        assert layer_model(_spec(dtype="float16"), target).options.gradient_reduce_dtype is None


def test_targets_refuse_a_type_their_framework_does_not_reduce_in():
    base = TargetConfig(target="megatron", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                        sequence=8192, vocab=128256, tied_embeddings=False, activation="swiglu", global_batch=64,
                        micro_batch_size=1, dtype="bfloat16", optimizer="adam", data=8, tensor=1, pipeline=8,
                        layers_per_chunk=(4,) * 8)
    # Megatron-LM runs bf16 gradients reduced in fp32 (its default) or bf16 (--grad-reduce-in-bf16)
    for reduce in ("", "float32"):
        assert megatron.allows(dataclasses.replace(base, gradient_reduce_dtype=reduce)) is None
    assert megatron.allows(dataclasses.replace(base, gradient_reduce_dtype="float16")) == \
        "megatron reduces bfloat16 gradients in bfloat16 or float32; the plan reduces them in float16"
    assert megatron.allows(dataclasses.replace(base, dtype="float16", gradient_reduce_dtype="float32")) is None
    assert deepspeed.allows(dataclasses.replace(base, target="deepspeed", gradient_reduce_dtype="float32")) == (
        "deepspeed reduces bfloat16 gradients in bfloat16 (the training dtype; its export cannot change that);"
        " the plan reduces them in float32")
    tt = dataclasses.replace(base, target="torchtitan", optimizer_sharding="zero-3")
    assert torchtitan.allows(tt) == "torchtitan reduces bfloat16 gradients in float32; the plan reduces them in bfloat16"
    assert torchtitan.allows(dataclasses.replace(tt, gradient_reduce_dtype="float32")) is None
    # one replica reduces nothing
    assert torchtitan.allows(dataclasses.replace(tt, data=1, pipeline=8, global_batch=8)) is None


def test_a_spec_asking_for_a_type_its_target_cannot_reduce_in_is_refused_up_front(tmp_path):
    """Only plans without data parallelism would qualify: the search used to return one of
    those, silently slower; now the command says why, at the spec's line, and exits 1."""
    import json

    spec = llama_training(tmp_path, optimizer_sharding="zero-3", recompute="selective-op")
    spec.write_text(spec.read_text().replace("dtype: bfloat16,", "dtype: bfloat16,\n           gradient_reduce_dtype: bfloat16,"))
    cluster = str(CLUSTERS / "dgx-a100-8x8.yaml")
    res = CliRunner().invoke(app, ["stages", cluster, str(spec), "--target", "torchtitan", "--json"])
    assert res.exit_code == 1, res.output
    message = json.loads(res.stdout)["error"]["message"]
    line = next(i for i, x in enumerate(spec.read_text().splitlines(), 1) if "gradient_reduce_dtype" in x)
    assert f"{spec}:{line}: training.gradient_reduce_dtype: torchtitan reduces bfloat16 gradients in float32;" \
           " the spec asks for bfloat16" in message
    # the framework's own type, or native planning, plans as before
    assert CliRunner().invoke(app, ["stages", cluster, str(spec), "--json", "--no-baselines"]).exit_code == 0


def test_plan_target_torchtitan_records_the_float32_reduction_and_check_reads_it(tmp_path):
    import yaml

    model = llama_training(tmp_path, recompute="full", optimizer_sharding="zero-3")
    cluster = str(CLUSTERS / "dgx-a100-8x8.yaml")
    plan = tmp_path / "p.yaml"
    assert CliRunner().invoke(app, ["plan", cluster, str(model), "--target", "torchtitan", "-o", str(plan)]).exit_code == 0
    doc = yaml.safe_load(plan.read_text())
    assert doc["target"]["config"]["gradient_reduce_dtype"] == "float32"
    assert CliRunner().invoke(app, ["check", cluster, str(model), str(plan)]).exit_code == 0
    edited = tmp_path / "edited.yaml"
    edited.write_text(plan.read_text().replace("gradient_reduce_dtype: float32", "gradient_reduce_dtype: bfloat16"))
    res = CliRunner().invoke(app, ["check", cluster, str(model), str(edited)])
    assert res.exit_code == 1 and "gradient_reduce_dtype" in res.output


def test_the_megatron_export_sets_the_reduction_type_the_plan_priced():
    base = TargetConfig(target="megatron", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                        sequence=8192, vocab=128256, tied_embeddings=False, activation="swiglu", global_batch=64,
                        micro_batch_size=1, dtype="bfloat16", optimizer="adam", data=8, tensor=1, pipeline=8,
                        layers_per_chunk=(4,) * 8)
    flags = lambda cfg: megatron.parse(megatron.export(cfg))                       # noqa: E731
    assert "--grad-reduce-in-bf16" not in flags(dataclasses.replace(base, gradient_reduce_dtype="float32"))
    assert flags(base)["--grad-reduce-in-bf16"] is True
    fp16 = dataclasses.replace(base, dtype="float16")
    assert "--accumulate-allreduce-grads-in-fp32" not in flags(fp16)
    assert flags(dataclasses.replace(fp16, gradient_reduce_dtype="float32"))["--accumulate-allreduce-grads-in-fp32"]


# Megatron-Core's distributed-optimizer guide: bytes a parameter, without and with the
# distributed optimizer over d replicas, Adam, by (parameter type, gradient type)
MEGATRON_BYTES = {("float16", "float16"): (20, lambda d: 4 + 16 / d),
                  ("bfloat16", "bfloat16"): (20, lambda d: 4 + 16 / d),
                  ("bfloat16", "float32"): (18, lambda d: 6 + 12 / d),
                  ("float16", "float32"): (18, lambda d: 6 + 12 / d),
                  ("float32", "float32"): (16, lambda d: 8 + 8 / d)}


@pytest.mark.parametrize("dtype,reduce", sorted(MEGATRON_BYTES))
@pytest.mark.parametrize("sharding", ["none", "distributed"])
def test_megatron_keeps_gradients_as_its_guide_counts_them(dtype, reduce, sharding):
    """Megatron-Core's DDP allocates its gradient buffer in the reduction's type, and its
    mixed-precision optimizers keep fp32 main gradients beside a 16-bit one: the static bytes
    of a --target megatron plan are the guide's, per parameter.  Natively and under
    torchtitan, gradients stay in the training type (ZeRO's 2 + 2 + 12)."""
    from solver_planner.spec.layers import FLOAT_DTYPES

    spec = ModelSpec(name="m", transformer=LLAMA,
                     training=TrainingSpec(global_batch=64, dtype=dtype, optimizer_sharding=sharding,
                                           gradient_reduce_dtype=reduce))
    lm = layer_model(spec, "megatron")
    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    shape = MeshShape(1, 8)                  # one host: 8 replicas
    costs = StageCosts(lm, topo, shape, 4, cost_tables(topo, CostModel(topo), shape))
    n = lm.num_layers - 1
    params = sum(x.params for x in lm.layers) / FLOAT_DTYPES[dtype]
    per_param = float(costs[StageConfig(1, "none")].static[0, n]) / params
    plain, distributed = MEGATRON_BYTES[dtype, reduce]
    assert per_param == pytest.approx(plain if sharding == "none" else distributed(8), rel=1e-9)
    if dtype == "bfloat16":
        native = StageCosts(layer_model(spec), topo, shape, 4, cost_tables(topo, CostModel(topo), shape))
        kept = float(native[StageConfig(1, "none")].static[0, n]) / params
        assert kept == pytest.approx(16 if sharding == "none" else 4 + 12 / 8, rel=1e-9)


MIXED = ("name: m\ntransformer: {layers: 6, hidden: 64, heads: 4, sequence: 16, vocab: 256}\n"
         "training: {global_batch: 16, dtype: DTYPE,\n           gradient_reduce_dtype: REDUCE}\n")


@pytest.mark.parametrize("dtype, reduce, lost", [
    ("bfloat16", "float16", "range: values above 65504 overflow"),
    ("float16", "bfloat16", "precision: 3 mantissa bits fewer"),
])
def test_reducing_in_the_other_16_bit_type_is_warned_about(tmp_path, dtype, reduce, lost):
    """Natively (no --target refuses it) a bfloat16 model reducing in float16, or the other
    way round, was planned without a word; each command that reads the spec now warns, at
    the key's line, and still plans."""
    import json

    from conftest import run_cli

    spec = tmp_path / "m.yaml"
    spec.write_text(MIXED.replace("DTYPE", dtype).replace("REDUCE", reduce))
    cluster = CLUSTERS / "aws-p3.8xlarge-2.yaml"
    where = f"{spec}:4: training.gradient_reduce_dtype: {dtype} gradients reduced in {reduce} lose {lost}"
    for args in (["validate", cluster, spec], ["stages", cluster, spec, "--no-baselines"], ["plan", cluster, spec]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count(where) == 1, (args, r.stderr)
    r = run_cli("validate", cluster, spec, "--json")
    assert r.returncode == 0 and any(w.startswith(where) for w in json.loads(r.stdout)["files"][1]["warnings"])
    for same in (dtype, "float32"):                       # its own type, or wider: nothing to say
        spec.write_text(MIXED.replace("DTYPE", dtype).replace("REDUCE", same))
        r = run_cli("validate", cluster, spec)
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
