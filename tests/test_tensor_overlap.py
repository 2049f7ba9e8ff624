"""training.tensor_overlap: each tensor-parallel all-gather and reduce-scatter beside the
matrix product it feeds or drains (Megatron-LM's --tp-comm-overlap), checked against a
hand computation from the operators' own times, against the times without overlap and
without communication, and through the spec, the search and the Megatron-LM export."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver_planner import api
from solver_planner.errors import SpecError
from solver_planner.spec import load_cluster_spec, load_model_spec
from solver_planner.spec.layers import TrainingSpec, TransformerSpec
from solver_planner.spec.model import ModelSpec
from solver_planner.stages import StageSearch
from solver_planner.stages.costs import MeshShape, StageConfig, StageCosts
from solver_planner.stages.layers import layer_model
from solver_planner.stages.operators import operator_times
from solver_planner.stages.report import Config
from solver_planner.topology import Topology

from conftest import CLUSTERS

PAIRS = ("qkv", "projection", "mlp-in", "mlp-out")    # forward order: gather, scatter, gather, scatter


def _gpt(overlap: bool, recompute: str = "none", hidden: int = 4096, sequence: int = 2048) -> ModelSpec:
    t = TransformerSpec(layers=4, hidden=hidden, heads=32, sequence=sequence, vocab=32768)
    training = TrainingSpec(global_batch=8, microbatches=8, recompute=recompute, sequence_parallel=True,
                            tensor_overlap=overlap)
    return ModelSpec(name="gpt", transformer=t, training=training)


def _node(bandwidth: float = 450e9) -> Topology:
    spec = load_cluster_spec(CLUSTERS / "dgx-h100-4x8.yaml")
    levels = [lv.model_copy(update={"count": 1}) if i == 0 else lv for i, lv in enumerate(spec.levels)]
    links = [x.model_copy(update={"bandwidth": bandwidth}) if x.level == "gpu" else x for x in spec.interconnects]
    return Topology(spec.model_copy(update={"levels": levels, "interconnects": links}))


def _layer_times(spec: ModelSpec, topo: Topology, t: int, recompute: str = "none", comm: bool = True):
    s = StageSearch(layer_model(spec), topo)
    shape = MeshShape(1, 8)
    costs = StageCosts(s.model, topo, shape, 8, s.tables(shape))
    costs.comm = comm
    return s.model, costs, costs.layer_times(StageConfig(t, recompute))


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("bandwidth", [450e9, 20e9])
def test_a_block_hides_each_collective_behind_its_own_product(t, bandwidth):
    """Forward: the j-th collective beside the j-th product with weights, a two-stage pipeline
    of t chunks, max(c, g) + min(c, g) / t; backward: beside that product's two gradient
    products.  Recomputed from the operators here, per pass, for the block."""
    topo = _node(bandwidth)
    model, costs, (f1, a1, _) = _layer_times(_gpt(True), topo, t)
    _, _, (f0, a0, _) = _layer_times(_gpt(False), topo, t)
    _, _, (fc, ac, _) = _layer_times(_gpt(True), topo, t, comm=False)
    block = next(i for i, x in enumerate(model.layers) if x.name == "block")
    ar = f0[block] - fc[block]                                        # both all-reduces of a pass
    each = ar / 4
    layer = model.layers[block]
    times = operator_times(layer.ops, costs.tables[t].cost.compute, costs.samples(t), t, True)
    names = [op.name for op in layer.ops]
    fwd = bwd = 0.0
    for name in PAIRS:
        k = names.index(name)
        g, gb = times["F"][k], times["BA"][k] + times["BW"][k]
        fwd += max(0.0, each - g) + min(each, g) / t
        bwd += max(0.0, each - gb) + min(each, gb) / t
    assert f1[block] - fc[block] == pytest.approx(fwd, rel=1e-9)
    assert a1[block] - ac[block] == pytest.approx(bwd, rel=1e-9)
    assert fc[block] < f1[block] < f0[block] and ac[block] < a1[block] < a0[block]


def test_a_layer_without_a_product_keeps_its_collective_whole():
    """The embedding's reduce-scatter meets no product: the same as without overlap."""
    topo = _node()
    model, _, (f1, a1, _) = _layer_times(_gpt(True), topo, 8)
    _, _, (f0, a0, _) = _layer_times(_gpt(False), topo, 8)
    embed = [i for i, x in enumerate(model.layers) if x.name == "embed"]
    assert embed and np.allclose(f1[embed], f0[embed]) and np.allclose(a1[embed], a0[embed])


@pytest.mark.parametrize("recompute", ["full", "selective", "selective-op"])
def test_a_recomputed_forward_runs_its_collectives_again_beside_its_products(recompute):
    """Full recomputation re-runs every collective of the forward (Megatron-LM's checkpoint
    keeps only the block's input), each beside its product as in the forward; selective
    re-runs the attention core, which has none; selective-op re-runs the all-gathers, half an
    all-reduce's time, whose products it keeps: nothing to hide them."""
    topo = _node(20e9)
    _, _, (f_plain, _, _) = _layer_times(_gpt(False), topo, 8, "none")
    _, _, (f_none, a_none, _) = _layer_times(_gpt(True), topo, 8, "none")
    _, _, (fc, ac, _) = _layer_times(_gpt(True), topo, 8, "none", comm=False)
    _, _, (f_re, a_re, _) = _layer_times(_gpt(True), topo, 8, recompute)
    _, _, (fc_re, ac_re, _) = _layer_times(_gpt(True), topo, 8, recompute, comm=False)
    exposed_fwd = f_none - fc
    assert exposed_fwd.max() > 0
    extra = (a_re - ac_re) - (a_none - ac)
    want = {"full": exposed_fwd, "selective": 0.0, "selective-op": (f_plain - fc) / 2}[recompute]
    assert np.allclose(extra, want)


def test_overlap_never_slows_a_plan_and_the_search_prices_it():
    topo = _node()
    times = {}
    for overlap in (False, True):
        rep = api.stages(topo, _gpt(overlap, sequence=4096), schedule="1f1b", config=Config(1, 8, 1, 8))
        times[overlap] = rep.run.iteration_time
    assert times[True] < times[False]


def test_the_spec_refuses_overlap_without_sequence_parallelism_or_a_transformer(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, sequence: 128, vocab: 1000}\n"
                    "training:\n  global_batch: 8\n  tensor_overlap: true\n")
    with pytest.raises(SpecError, match=r"m\.yaml:5.*tensor_overlap.*sequence_parallel: true"):
        load_model_spec(path)
    path.write_text("name: m\nlayers:\n  - {name: l, repeat: 4, flops: 1e9, params: 1 MB, activations: 1 MB}\n"
                    "training:\n  global_batch: 8\n  sequence_parallel: true\n  tensor_overlap: true\n")
    with pytest.raises(SpecError, match=r"tensor_overlap.*'layers:' list names none"):
        load_model_spec(path)
    # a spec built in code is refused where the layer model is made, as the command would
    built = _gpt(True)
    built = built.model_copy(update={"training": built.training.model_copy(update={"sequence_parallel": False})})
    with pytest.raises(SpecError, match="sequence_parallel: true"):
        api.stages(_node(), built, schedule="1f1b", config=Config(1, 8, 1, 8))


def test_only_megatron_exports_it():
    from solver_planner.targets import deepspeed, megatron, torchtitan
    from solver_planner.targets.base import TargetConfig

    cfg = TargetConfig(target="megatron", layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384,
                       sequence=2048, vocab=32768, tied_embeddings=False, activation="gelu", global_batch=64,
                       micro_batch_size=1, dtype="bfloat16", optimizer="adam", data=8, tensor=8, pipeline=1,
                       sequence_parallel=True, tensor_overlap=True)
    assert "--tp-comm-overlap" in megatron.parse(megatron.export(cfg))
    assert "needs sequence parallelism" in megatron.allows(dataclasses.replace(cfg, sequence_parallel=False))
    for mod in (torchtitan, deepspeed):
        why = mod.allows(dataclasses.replace(cfg, target=mod.RULES.target))
        assert why is not None
    assert "tensor-parallel collectives" in deepspeed.allows(dataclasses.replace(cfg, target="deepspeed", tensor=1,
                                                                                  data=64, sequence_parallel=False))


def test_show_says_where_the_collectives_run(tmp_path):
    from conftest import run_cli

    path = tmp_path / "m.yaml"
    for overlap, said in ((True, "beside their products (tensor_overlap)"), (False, "between the products")):
        path.write_text("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, sequence: 128, vocab: 1000}\n"
                        f"training: {{global_batch: 8, sequence_parallel: true, tensor_overlap: {str(overlap).lower()}}}\n")
        res = run_cli("show", str(path))
        assert res.returncode == 0 and said in " ".join(res.stdout.split()), res.stdout + res.stderr


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("c,g", [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (0.1, 5.0), (5.0, 0.1)])
def test_the_chunk_pipeline_formula_is_what_the_engine_plays(t, c, g):
    """max(0, c - g) + min(c, g) / t past the product: the collective cut into t chunks on the
    link, each chunk's product on the GPU once its chunk has moved (an all-gather feeding the
    product; a reduce-scatter draining it is the same pipeline backwards), played by the
    event engine."""
    from solver_planner.simulate import Simulation
    from solver_planner.stages.operators import Operator, overlapped_collectives

    sim = Simulation()
    moved = []
    for i in range(t):
        moved.append(sim.add(f"chunk {i}", c / t, resources=["link"], deps=moved[-1:]))
        sim.add(f"product {i}", g / t, resources=["gpu"], deps=[moved[-1]])
    makespan = sim.run().makespan

    class Fixed:                          # a compute model timing the one product at g seconds
        is_peak = False

        def time(self, f, m, k):
            return g

    op = Operator("qkv", "gemm", flops=1.0, weights=1.0)
    gathers, scatters, backward = overlapped_collectives((op,), Fixed(), 1.0, t, c, 1)
    assert gathers + g == pytest.approx(makespan, rel=1e-12)
    assert scatters == 0.0 and backward == pytest.approx(max(0.0, c - 2 * g) + min(c, 2 * g) / t)
