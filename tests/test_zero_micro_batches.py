"""ZeRO stages across the micro-batches of a step, as the stage costs price them
(:func:`solver_planner.stages.memory.zero_run`; ``tests/test_fsdp_modes.py`` counts the same
collectives in torch): ZeRO-2/3 reduce-scatter every micro-batch, and torchtitan's FSDP2 under
torch's pipelining keeps whole gradients in the reduction's type."""

import numpy as np
import pytest

from solver_planner.cost import CostModel
from solver_planner.stages import Layer, LayerModel, MeshShape
from solver_planner.stages.costs import StageConfig, StageCosts, _affine_of, cost_tables
from solver_planner.stages.memory import static_bytes

from test_stages_objective import topology

PARAMS = [2**28, 2**30, 0.0, 2**29]


def _costs(sharding, B, gpus=2, hosts=2, fsdp2=False, reduce=None, efficiency=True):
    """Stages of ``gpus`` devices on ``hosts x gpus`` (two stages unless ``hosts`` is 1)."""
    from solver_planner.stages.memory import MemoryOptions

    topo = topology(hosts, gpus, "25 GB/s", "host", efficiency=efficiency)
    layers = [Layer(f"l{i}", 1e10, 2e10, p, 6.0 * p, 2**20, 2**20, 0.0, allreduces=1) for i, p in enumerate(PARAMS)]
    opts = MemoryOptions(sharding=sharding, gradient_accumulation="fused", fsdp2_defaults=fsdp2,
                         gradient_reduce_dtype=reduce)
    model = LayerModel("m", layers, 16, None, dtype="bfloat16", options=opts)
    shape = MeshShape(1, gpus)
    return StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)


@pytest.mark.parametrize("sharding", ["zero-2", "zero-3"])
@pytest.mark.parametrize("B", [1, 2, 8])
def test_zero_2_and_3_reduce_scatter_every_micro_batch(sharding, B):
    c = StageConfig(1)
    once, each = _costs("zero-1", B), _costs(sharding, B)
    _, _, w_once = once.layer_times(c)
    _, _, w_each = each.layer_times(c)
    tab = each.tables[1]
    # the B - 1 reductions before the last, (B - 1) / B of one in each micro-batch's weight work
    grads = np.asarray(PARAMS)
    rs = np.where(grads > 0, _affine_of(tab.data_reducescatter, grads), 0.0)
    assert np.allclose(w_each - w_once, rs * (B - 1) / B, rtol=1e-12, atol=0.0)
    if B > 1:
        assert (w_each - w_once)[1] > 0 and (w_each - w_once)[2] == 0.0


def test_no_reduction_where_there_is_one_replica():
    c = StageConfig(2)                  # t = 2 on 2 devices: d = 1
    _, _, w1 = _costs("zero-1", 8).layer_times(c)
    _, _, w3 = _costs("zero-3", 8).layer_times(c)
    assert np.array_equal(w1, w3)


@pytest.mark.parametrize("sharding", ["zero-2", "zero-3"])
def test_torchtitan_pipelines_keep_whole_gradients_in_the_reduction_s_type(sharding):
    c = StageConfig(1)
    d = 2
    P = np.asarray(PARAMS)
    O = 6.0 * P
    pipelined = _costs(sharding, 4, fsdp2=True, reduce="float32")
    static = pipelined.memory_parts(c)[0]
    # ZeRO-1's bytes with float32 gradients: (P + 2P)/t + O/(t d), whatever ZeRO stage was asked
    want = static_bytes(P, O, 1, d, "zero-1", grad=2.0)
    assert static[0, 3] == pytest.approx(want.sum(), rel=1e-12)
    assert pipelined.memory_parts(c)[2][0, 3] == 0.0          # nothing gathered on top: already whole
    # one stage (torchtitan with pipeline 1): ZeRO's own bytes, and its reductions every micro-batch
    alone = _costs(sharding, 4, hosts=1, fsdp2=True, reduce="float32")
    assert alone.memory_parts(c)[0][0, 3] == pytest.approx(static_bytes(P, O, 1, d, sharding).sum(), rel=1e-12)
    # pipelined: one reduction a step, so no more weight work than ZeRO-1's
    _, _, w = pipelined.layer_times(c)
    _, _, w1 = _costs("zero-1", 4, fsdp2=True, reduce="float32").layer_times(c)
    assert np.array_equal(w, w1)


def test_torchtitan_pipelined_zero_3_gathers_once_a_micro_batch_and_once_more_a_step():
    c = StageConfig(1)
    B = 4
    f3, a3, _ = _costs("zero-3", B, fsdp2=True, reduce="float32").layer_times(c)
    f1, a1, _ = _costs("zero-1", B, fsdp2=True, reduce="float32").layer_times(c)
    native_f, native_a, _ = _costs("zero-3", B).layer_times(c)
    gather = f3 - f1
    assert gather[1] > 0 and np.allclose(native_f - f1, gather)          # forward: one gather each
    assert np.allclose(a3 - a1, gather / B) and np.allclose(native_a - a1, gather)   # backward: B+1 in all


def test_zero_2_under_fsdp2_without_pipelining_regathers_every_forward():
    c = StageConfig(1)
    B = 4
    f2, _, _ = _costs("zero-2", B, hosts=1, fsdp2=True).layer_times(c)
    f1, _, _ = _costs("zero-1", B, hosts=1, fsdp2=True).layer_times(c)
    f3, _, _ = _costs("zero-3", B, hosts=1).layer_times(c)
    assert np.allclose(f2 - f1, (f3 - f1) * (B - 1) / B)
    native2, _, _ = _costs("zero-2", B, hosts=1).layer_times(c)
    assert np.array_equal(native2, f1)


def test_torchtitan_keeps_gradients_in_float32_whatever_the_sharding(tmp_path):
    """FSDP2's mixed precision is always on under torchtitan (replicas included): the fp32
    parameters' gradients are fp32, 4 bytes for a bf16 parameter, whole or as a shard: none
    ``(2 + 4 + 12)/t``, ZeRO-2 ``2/t + (4 + 12)/(t d)``; natively the training type's 2."""
    import yaml

    from solver_planner.spec.model import load_model_spec
    from solver_planner.stages.layers import layer_model

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({
        "name": "m", "transformer": {"layers": 2, "hidden": 256, "heads": 4, "sequence": 64, "vocab": 512},
        "training": {"global_batch": 8, "dtype": "bfloat16", "optimizer": "adam", "optimizer_sharding": "zero-2"}}))
    spec = load_model_spec(path)
    assert layer_model(spec, target="torchtitan").options.gradient_bytes == 2.0
    assert layer_model(spec).options.gradient_bytes == 1.0
    P, O = np.array([2.0]), np.array([12.0])      # bytes a parameter: bf16, Adam's fp32 master and moments
    assert static_bytes(P, O, 1, 4, "none", grad=2.0)[0] == 18.0
    assert static_bytes(P, O, 1, 4, "zero-2", grad=2.0)[0] == 2.0 + 16.0 / 4


@pytest.mark.parametrize("hosts, fsdp2, overlaps", [(2, True, False), (1, True, True), (2, False, True)])
def test_torch_s_pipelining_reduces_after_the_stage_s_last_backward(hosts, fsdp2, overlaps):
    """PipelineStage reduces FSDP2's gradients in perform_reduce_grad, after the last
    backward: no bucket overlaps it, so the tail is the whole reduction after it."""
    for sharding in ("none", "zero-2"):
        cc = _costs(sharding, 4, hosts=hosts, fsdp2=fsdp2, reduce="float32")[StageConfig(1)]
        assert cc.overlap == overlaps
        if not overlaps:
            assert cc.tail_full[0, 3] == pytest.approx(cc.reduction_all[0, 3] + cc.optimizer[0, 3], rel=1e-12)


@pytest.mark.parametrize("sharding", ["zero-2", "zero-3"])
def test_a_tied_copy_is_gathered_and_reduce_scattered_with_its_layer(sharding):
    """The last layer holds a copy of the first's parameters (GPT's logits): on a stage
    without the first layer the copy is part of its module, so each micro-batch's
    reduce-scatter (ZeRO-2/3) and each gather (ZeRO-3) of that layer moves both, one
    collective; a stage that holds both layers keeps one table and moves nothing more."""
    from dataclasses import replace

    from solver_planner.stages.memory import MemoryOptions

    B = 4
    topo = topology(2, 2, "25 GB/s", "host")
    layers = [Layer(f"l{i}", 1e10, 2e10, p, 6.0 * p, 2**20, 2**20, 0.0, allreduces=1) for i, p in enumerate(PARAMS)]
    layers[3] = replace(layers[3], tied_to=0, tied_params=PARAMS[0], tied_optimizer=6.0 * PARAMS[0])
    opts = MemoryOptions(sharding=sharding, gradient_accumulation="fused")
    model = LayerModel("m", layers, 16, None, dtype="bfloat16", options=opts)
    shape = MeshShape(1, 2)
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)
    c = StageConfig(1)
    cc = costs[c]
    tab = costs.tables[1]
    fwd, act, weight = costs.layer_times(c)
    z = costs.zero
    both = PARAMS[3] + PARAMS[0]
    rs = (_affine_of(tab.data_reducescatter, both) - _affine_of(tab.data_reducescatter, PARAMS[3])) * (B - 1) / B
    ag = _affine_of(tab.data_allgather, both) - _affine_of(tab.data_allgather, PARAMS[3])
    assert (z.forward_gathers > 0) == (sharding == "zero-3")
    assert rs > 0 and (sharding == "zero-2" or ag > 0)
    extra_f, extra_a, extra_w = cc.copy_collectives
    assert extra_w[3] == pytest.approx(rs, rel=1e-12) and not extra_w[:3].any()
    assert extra_f[3] == pytest.approx(z.forward_gathers * ag, rel=1e-12)
    assert extra_a[3] == pytest.approx(z.backward_gathers * ag, rel=1e-12)
    # the plan adds them to the stage holding the copy away from the shared layer's mesh
    from solver_planner.stages.partition import Partition, StagePlan

    split = Partition(costs, [StagePlan(0, 1, c), StagePlan(2, 3, c)])
    assert split.copies == [(0, 3, 1)]
    assert split.backward_weight[1] == pytest.approx(weight[2] + weight[3] + rs, rel=1e-12)
    assert split.forward[1] == pytest.approx(fwd[2] + fwd[3] + z.forward_gathers * ag, rel=1e-12)
    assert split.backward_act[1] == pytest.approx(act[2] + act[3] + z.backward_gathers * ag, rel=1e-12)
    assert split.backward_weight[0] == pytest.approx(weight[0] + weight[1], rel=1e-12)
    # the ranges stay without them (a lower bound for any plan, the copy's or not)
    assert cc.backward_weight.at(2, 3) == pytest.approx(weight[2] + weight[3], rel=1e-12)
