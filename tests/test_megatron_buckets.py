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
