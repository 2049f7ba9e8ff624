"""Per-operator costs of transformer layers: FLOP totals, recomputation, the roofline per operator."""

import numpy as np
import pytest

from solver_planner.compute import ComputeModel
from solver_planner.spec.counts import transformer_counts
from solver_planner.spec.layers import TrainingSpec, TransformerSpec
from solver_planner.spec.model import ModelSpec
from solver_planner.stages.layers import layer_model, transformer_operators
from solver_planner.stages.operators import layer_pass_times, operator_times
from solver_planner.topology import Device, load_topology

SHAPES = [dict(layers=2, hidden=1024, heads=16, sequence=2048, vocab=50304),
          dict(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, activation="swiglu", position="rotary",
               norm="rmsnorm", bias=False, sequence=4096, vocab=128256)]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_gemm_and_attention_flops_add_up_to_the_models_flop_count(shape):
    spec = TransformerSpec(**shape)
    counts = transformer_counts(spec)
    s, h = spec.sequence, spec.hidden
    for attention, skipped in (("materialized", 0.0), ("flash", 2.0 * s * s * h)):
        ops = transformer_operators(spec, "bfloat16", attention)
        block = sum(op.flops for op in ops["block"])
        # materialized attention runs the model's 4 s^2 h; flash skips the causal half
        assert block == pytest.approx(counts.block_flops - skipped, rel=1e-12)
        assert sum(op.flops for op in ops["logits"]) == counts.logits_flops
        assert sum(op.flops for op in ops["embed"]) == 0


def _model(recompute="none", attention="flash", sp=False):
    t = TransformerSpec(**SHAPES[0])
    training = TrainingSpec(global_batch=8, recompute=recompute, attention=attention, sequence_parallel=sp)
    return layer_model(ModelSpec(name="m", transformer=t, training=training))


@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_recomputation_reruns_exactly_the_recomputed_operators(attention):
    comp = ComputeModel.of(load_topology("specs/clusters/dgx-a100-8x8.yaml").device)
    m = _model("auto", attention)
    block = m.layers[1]
    for t in (1, 2):
        times = operator_times(block.ops, comp, 2.0, t)
        fwd, base, wgt = layer_pass_times(m, comp, t, 2.0, "none")
        _, sel, _ = layer_pass_times(m, comp, t, 2.0, "selective")
        _, full, _ = layer_pass_times(m, comp, t, 2.0, "full")
        core = [op.core for op in block.ops]
        assert sel[1] - base[1] == pytest.approx(times["F"][core].sum(), rel=1e-12)
        assert full[1] - base[1] == pytest.approx(fwd[1], rel=1e-12)
        assert fwd[1] == pytest.approx(times["F"].sum()) and wgt[1] == pytest.approx(times["BW"].sum())
        assert sum(core) == (1 if attention == "flash" else 4)


def test_each_operator_is_its_roofline_without_a_compute_block():
    comp = ComputeModel.of(Device("x", 100e12, 80e9, memory_bandwidth=1e12))
    assert comp.mode == "roofline"
    for op in _model().layers[1].ops:
        f, m = op.per_device(4.0, 2, False)
        times = operator_times([op], comp, 4.0, 2)
        expected = max(f / 100e12, m / 1e12)
        assert times["F"][0] == pytest.approx(expected, rel=1e-12), op.name
        # memory-bound passes cost time: never the pure peak
        if op.kind == "memory":
            assert times["F"][0] > 0 and f == 0


def test_sequence_parallelism_splits_the_replicated_passes():
    comp = ComputeModel.of(load_topology("specs/clusters/dgx-a100-8x8.yaml").device)
    plain = layer_pass_times(_model(), comp, 4, 1.0, "none")
    split = layer_pass_times(_model(sp=True), comp, 4, 1.0, "none", sequence_parallel=True)
    assert split[0][1] < plain[0][1] and split[2][1] == pytest.approx(plain[2][1])


def test_small_models_are_less_efficient_than_large_ones():
    """Measured efficiency rises with model size (Narayanan et al. 2021, Table 1): the
    memory-bound passes are a larger share of a small block's time."""
    comp = ComputeModel.of(load_topology("specs/clusters/dgx-a100-8x8.yaml").device)
    eff = []
    for hidden, heads in ((768, 12), (2048, 16), (8192, 64)):
        t = TransformerSpec(layers=2, hidden=hidden, heads=heads, sequence=2048, vocab=51200)
        m = layer_model(ModelSpec(name="m", transformer=t, training=TrainingSpec(global_batch=8)))
        f, a, w = layer_pass_times(m, comp, 1, 1.0, "none")
        seconds = f[1] + a[1] + w[1]
        eff.append(3 * m.layers[1].forward / seconds / comp.peak)
    assert eff[0] < eff[1] < eff[2] < comp.efficiency
    assert np.all(np.diff(eff) > 0)
