"""Gradient buckets under --target megatron: Megatron-Core's own, max(40M, 1M x d) parameters
in the reduction's type, unless the spec sets gradient_bucket (then exported as
--ddp-bucket-size); PyTorch DDP's 25 MiB everywhere else."""

from __future__ import annotations

import pytest

from solver_planner.spec import load_cluster_spec
from solver_planner.spec.layers import TrainingSpec, TransformerSpec
from solver_planner.spec.model import ModelSpec
from solver_planner.stages import StageSearch
from solver_planner.stages.costs import MeshShape, StageConfig, StageCosts
from solver_planner.stages.layers import layer_model
from solver_planner.targets import megatron
from solver_planner.targets.search import target_config
from solver_planner.topology import Topology

from conftest import CLUSTERS


def _spec(**training) -> ModelSpec:
    t = TransformerSpec(layers=4, hidden=1024, heads=16, sequence=1024, vocab=32768)
    return ModelSpec(name="gpt", transformer=t, training=TrainingSpec(global_batch=512, microbatches=8, **training))


def _topology(nodes: int) -> Topology:
    spec = load_cluster_spec(CLUSTERS / "dgx-h100-4x8.yaml")
    levels = [lv.model_copy(update={"count": nodes}) if i == 0 else lv for i, lv in enumerate(spec.levels)]
    return Topology(spec.model_copy(update={"levels": levels}))


def _cap(spec: ModelSpec, target: str, nodes: int, t: int = 1) -> float:
    topo = _topology(nodes)
    s = StageSearch(layer_model(spec, target), topo)
    shape = MeshShape(nodes, 8)
    costs = StageCosts(s.model, topo, shape, 8, s.tables(shape))
    return costs[StageConfig(t)].bucket_cap


@pytest.mark.parametrize("nodes,t", [(1, 1), (8, 1), (8, 2), (16, 1)])
def test_megatron_buckets_grow_with_the_replicas(nodes, t):
    d = nodes * 8 // t
    # bf16 gradients are reduced in fp32 under Megatron-LM: 4 bytes a parameter
    assert _cap(_spec(), "megatron", nodes, t) == pytest.approx(4 * max(40e6, 1e6 * d))
    assert _cap(_spec(gradient_reduce_dtype="bfloat16"), "megatron", nodes, t) == pytest.approx(2 * max(40e6, 1e6 * d))
    assert _cap(_spec(), "native", nodes, t) == 25 * 2**20
    assert _cap(_spec(gradient_bucket=64 * 2**20), "megatron", nodes, t) == 64 * 2**20


def test_a_bucket_the_spec_sets_is_exported_and_megatrons_own_is_not():
    from solver_planner.stages.report import Config, plan_stages

    topo = _topology(2)
    for spec, flag in ((_spec(), None), (_spec(gradient_bucket=64 * 2**20), 64 * 2**20 // 4)):
        rep = plan_stages(topo, spec, config=Config(16, 1, 1, 8), schedule="1f1b", target="megatron")
        cfg = target_config(rep.best.plan, rep.best.schedule, spec, "megatron")
        flags = megatron.parse(megatron.export(cfg))
        assert flags.get("--ddp-bucket-size") == flag


def test_later_stages_reduce_one_bucket_after_their_backward():
    """Megatron-Core buckets only the stage holding the first layer ("Turn off bucketing if we
    are on a pipeline stage that is not the first", and for model chunks after the first):
    every other stage's tail is its whole reduction, both simulators agree on every plan, and
    the objective stays under the simulated time."""
    from solver_planner.stages import Schedule, simulate_schedule
    from solver_planner.stages.fastsim import iteration
    from solver_planner.stages.objective import bounds
    from solver_planner.stages.uniform import uniform_plans

    spec = _spec(gradient_reduce_dtype="bfloat16", optimizer_sharding="distributed")
    topo = _topology(2)
    native = layer_model(spec)
    model = layer_model(spec, "megatron")
    assert model.options.buckets_first_stage_only and not native.options.buckets_first_stage_only
    search = StageSearch(model, topo, "1f1b")
    checked = 0
    for pair in search.pairs():
        for plan, sch in uniform_plans(pair, ["1f1b", "interleaved-1f1b"]):
            if len(plan.stages) < 2 or plan.table(0).data < 2:
                continue
            for p, st in enumerate(plan.stages):
                cc = plan.table(p)
                assert cc.overlaps(st.first) == (st.first == 0)
                if st.first > 0:
                    assert plan.tail_full[p] == pytest.approx(float(cc.reduction_all[st.first, st.last]
                                                                     + cc.optimizer[st.first, st.last]))
            run = simulate_schedule(plan, sch)
            it = iteration(plan, sch)
            assert it.time == pytest.approx(run.iteration_time, rel=1e-12)
            assert bounds(plan, sch).value <= run.iteration_time * (1 + 1e-9)
            checked += 1
    assert checked >= 4


def test_a_bucket_the_spec_sets_is_whole_parameters_under_megatron():
    """Megatron-LM counts --ddp-bucket-size in parameters: the plan is priced with the rounded
    bucket it exports (fp32 reduction: 4 bytes a parameter)."""
    from solver_planner.stages.report import Config, plan_stages

    odd = 2**20 + 3                                            # 262 144.75 parameters of fp32
    assert _cap(_spec(gradient_bucket=odd), "megatron", 1) == 4 * 262145
    assert _cap(_spec(gradient_bucket=odd), "native", 1) == odd
    rep = plan_stages(_topology(2), _spec(gradient_bucket=odd), config=Config(16, 1, 1, 8), schedule="1f1b",
                      target="megatron")
    cfg = target_config(rep.best.plan, rep.best.schedule, _spec(gradient_bucket=odd), "megatron")
    assert megatron.parse(megatron.export(cfg))["--ddp-bucket-size"] == 262145


def test_buckets_too_small_to_simulate_are_refused_up_front():
    from solver_planner.errors import SpecError
    from solver_planner.stages.layers import MAX_BUCKETS

    spec = _spec(gradient_bucket=64)                           # 168 MB of bf16 gradients
    with pytest.raises(SpecError, match=rf"training\.gradient_bucket: 64 B buckets cut .* at most {MAX_BUCKETS:,}"):
        layer_model(spec)
    layer_model(_spec(gradient_bucket=2**20))                  # in 1 MiB buckets: fine


def test_megatrons_later_stages_gather_whole_while_the_pipeline_fills():
    """Under Megatron-Core's bucketing a stage after the first is one bucket: its first
    forward waits until the whole stage is gathered, and for nothing after (the same bucket
    size for both, so each layer's gather is the same)."""
    spec = _spec(gradient_reduce_dtype="bfloat16", optimizer_sharding="distributed", gradient_bucket=2**30)
    topo = _topology(2)
    s = StageSearch(layer_model(spec, "megatron"), topo)
    shape = MeshShape(1, 8)
    costs = StageCosts(s.model, topo, shape, 8, s.tables(shape))
    cc = costs[StageConfig(1)]
    n = costs.model.num_layers
    native = StageSearch(layer_model(spec), topo)
    nc = StageCosts(native.model, topo, shape, 8, native.tables(shape))[StageConfig(1)]
    for k in range(1, n):
        for i in range(k, n):
            assert cc.gather_wait[k, i] == 0.0
            assert cc.gather_ready[k, i] == pytest.approx(sum(float(nc.gather_ready[j, j]) for j in range(k, i + 1)),
                                                          rel=1e-9)
    assert cc.gather_ready[0, n - 1] == pytest.approx(float(nc.gather_ready[0, n - 1]))
    assert cc.gather_wait[0, n - 1] == pytest.approx(float(nc.gather_wait[0, n - 1]))


def test_a_bucket_is_at_least_one_byte(tmp_path):
    """The range the message gives for sizes (0, or 1 B to 1 EiB) is the bucket's too, less 0."""
    from solver_planner.errors import SpecError
    from solver_planner.spec import load_model_spec

    path = tmp_path / "m.yaml"
    for value, said in (("0", "expected a value >= 1"), ("0.5 B", "expected 0 or 1 B to 1 EiB"),
                        ("400.5 B", "a bucket holds whole bytes, got 400.5 B")):
        path.write_text("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, sequence: 128, vocab: 1000}\n"
                        f"training: {{global_batch: 8, gradient_bucket: {value}}}\n")
        with pytest.raises(SpecError, match=rf"m\.yaml:3.*gradient_bucket: .*{said}"):
            load_model_spec(path)
    path.write_text("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, sequence: 128, vocab: 1000}\n"
                    "training: {global_batch: 8, gradient_bucket: 1 B}\n")
    assert load_model_spec(path).training.gradient_bucket == 1


def test_the_breakdown_names_the_parameter_gathers(tmp_path):
    """A plan with the distributed optimizer's gathers ahead of the forward: its critical path
    counts them as parameter_gather (the first gather's hold as well as the wait inside the
    first forward), not as tensor parallelism (t = 1) or idle time; the parts still add up."""
    from solver_planner import api
    from solver_planner.plan.compose import breakdown

    model = tmp_path / "tiny.yaml"
    model.write_text("name: tiny\ntransformer: {layers: 6, hidden: 512, heads: 8, sequence: 64, vocab: 4096}\n"
                     "training: {global_batch: 16, dtype: float32, optimizer_sharding: distributed}\n")
    plan = api.plan(CLUSTERS / "local-2x4.yaml", model, config="4,1,2,4", schedule="1f1b")
    assert plan.partition.gather_ready[0] > 0
    bd = breakdown(plan)
    assert bd["parameter_gather"] >= plan.partition.gather_ready[0] * (1 - 1e-9)
    assert bd["tensor_parallel"] == 0.0 and bd["idle"] == pytest.approx(0.0, abs=1e-12)
    assert sum(bd.values()) == pytest.approx(plan.iteration_time, rel=1e-9)


def test_the_most_buckets_accepted_are_planned_end_to_end():
    """The bucket guard's limit is a promise: a model cut into just under MAX_BUCKETS buckets
    (all on one stage) is planned and simulated, and one byte less per bucket is refused."""
    import math

    from solver_planner import api
    from solver_planner.errors import SpecError
    from solver_planner.stages.layers import MAX_BUCKETS

    t = TransformerSpec(layers=2, hidden=256, heads=4, sequence=64, vocab=1024)
    probe = ModelSpec(name="m", transformer=t, training=TrainingSpec(global_batch=8, dtype="float32"))
    total = sum(x.params for x in layer_model(probe).layers)
    bucket = math.ceil(total / MAX_BUCKETS)
    spec = ModelSpec(name="m", transformer=t, training=TrainingSpec(global_batch=8, dtype="float32",
                                                                    gradient_bucket=bucket))
    assert total / bucket > 0.9 * MAX_BUCKETS
    rep = api.stages(CLUSTERS / "local-2x4.yaml", spec, config="8,1,1,1")
    assert rep.run.iteration_time > 0 and rep.as_dict()["stages"][0]["gradient_reduction"] > 0
    with pytest.raises(SpecError, match="at most") as refused:
        layer_model(spec.model_copy(update={"training": spec.training.model_copy(update={"gradient_bucket": bucket - 1})}))
    # the least bucket the message names is the one accepted (it said the refused one, rounded)
    assert f"buckets of at least {bucket:,} B" in str(refused.value)
    # a larger model: the least bucket is said in whole bytes, which the spec then takes
    big = spec.model_copy(update={"training": spec.training.model_copy(update={"gradient_bucket": 128})})
    big = big.model_copy(update={"transformer": t.model_copy(update={"hidden": 2048, "heads": 16})})
    with pytest.raises(SpecError) as refused:
        layer_model(big)
    least = int(str(refused.value).split("buckets of at least ")[1].split(" B")[0].replace(",", ""))
    assert least * MAX_BUCKETS >= sum(x.params for x in layer_model(probe.model_copy(
        update={"transformer": big.transformer})).layers) > (least - 1) * MAX_BUCKETS
    layer_model(big.model_copy(update={"training": big.training.model_copy(update={"gradient_bucket": least})}))
