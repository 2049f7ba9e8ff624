"""recompute: selective-op, torchtitan's per-operator selective checkpointing (``SelectiveAC``):
a block keeps its input, the attention kernel's outputs and every other matrix product's
output, and re-runs the rest.  The cost model's count is checked by hand, and against torch
running the same rule on the run engine's block; torchtitan is the only target that takes it,
and the only one whose ``selective`` it is."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import CLUSTERS, SPECS, llama_training
from solver_planner.cli import app
from solver_planner.errors import SpecError
from solver_planner.spec.layers import TrainingSpec, TransformerSpec
from solver_planner.spec.model import ModelSpec
from solver_planner.stages.layers import _op_reruns, layer_model, transformer_layers
from solver_planner.stages.memory import saved_per_sample, recompute_flops, transient_per_sample
from solver_planner.targets import deepspeed, megatron, torchtitan

LLAMA3_8B = TransformerSpec(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                            sequence=8192, activation="swiglu", position="rotary", norm="rmsnorm", bias=False)


def test_every_second_product_of_a_block_is_rerun():
    # torchtitan 0.3.0's Llama: wqkv (kept), wo (re-run), w1 (kept), w3 (re-run), w2 (kept)
    assert _op_reruns(LLAMA3_8B) == {"qkv": 0.0, "projection": 1.0, "mlp-in": 0.5, "mlp-out": 0.0}
    # three QKV products (torchtitan before 0.3): wq kept, wk re-run, wv kept; wo is the 4th
    three = _op_reruns(LLAMA3_8B.model_copy(update={"fused_qkv": False}))
    assert three["qkv"] == pytest.approx(1024 / (4096 + 2 * 1024)) and three["projection"] == 1.0
    # GELU: wqkv, wo, the up product (kept), the down product (re-run)
    gpt = TransformerSpec(layers=2, hidden=64, heads=4, sequence=16, vocab=256)
    assert _op_reruns(gpt.model_copy(update={"bias": False})) == {"qkv": 0.0, "projection": 1.0, "mlp-in": 0.0,
                                                                 "mlp-out": 1.0}
    # a biased product runs as addmm: kept and not counted (GPT's biases: every product kept)
    assert set(_op_reruns(gpt).values()) == {0.0}
    # biases on QKV only (Qwen2): wo is the first product counted (kept), w1 kept, w3 and w2 re-run
    assert _op_reruns(LLAMA3_8B.model_copy(update={"bias": "qkv"})) == {"qkv": 0.0, "projection": 0.0,
                                                                        "mlp-in": 0.5, "mlp-out": 1.0}


def test_what_a_llama_block_keeps_and_reruns_by_hand():
    s, h, a, kv, f, e = 8192, 4096, 32, 1024, 14336, 2
    block = transformer_layers(LLAMA3_8B, "bfloat16")[1]
    # split over t: the QKV output, FlashAttention's output and fp32 log-sum-exp, w1's output
    split = s * (h + 2 * kv) * e + s * h * e + 4 * a * s + s * f * e
    # the block's input: split only under sequence parallelism
    replicated = s * h * e
    # w2's output: the partial sums over the whole sequence on every tensor device
    whole = s * h * e
    # under sequence parallelism the reduce-scatters after wo and w2 are kept: 1/t of the sequence each
    scattered = 2 * s * h * e
    for t, sp in ((1, False), (2, False), (2, True), (8, True)):
        kept = split / t + (replicated / t + scattered / t if sp else replicated) + whole
        assert saved_per_sample([block], "selective-op", t, sp)[0] == pytest.approx(kept)
        none = saved_per_sample([block], "none", t, sp)[0]
        assert transient_per_sample([block], "selective-op", t, sp)[0] == pytest.approx(max(none - kept, 0))
    # re-run: wo (2 s h^2) and w3 (2 s h f)
    assert recompute_flops([block], "selective-op")[0] == pytest.approx(2 * s * h * h + 2 * s * h * f)
    # torchtitan checkpoints the blocks only: the embedding and the logits keep what they keep
    embed, logits = transformer_layers(LLAMA3_8B, "bfloat16")[0], transformer_layers(LLAMA3_8B, "bfloat16")[-1]
    for layer in (embed, logits):
        assert saved_per_sample([layer], "selective-op", 1, False)[0] == saved_per_sample([layer], "none", 1, False)[0]
        assert recompute_flops([layer], "selective-op")[0] == 0


def _spec(recompute: str, **transformer) -> ModelSpec:
    t = LLAMA3_8B.model_copy(update=transformer)
    return ModelSpec(name="llama", transformer=t, training=TrainingSpec(global_batch=64, recompute=recompute,
                                                                          optimizer_sharding="zero-3"))


def test_selective_op_lies_between_none_and_full_in_time_and_memory():
    from solver_planner.cost import CostModel
    from solver_planner.spec import load_cluster_spec
    from solver_planner.stages.costs import StageConfig, StageCosts, cost_tables
    from solver_planner.stages.meshes import MeshShape
    from solver_planner.stages.layers import LayerModel
    from solver_planner.stages.memory import MemoryOptions
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    shape = MeshShape(1, 8)
    for sp in (False, True):
        opts = MemoryOptions(("none", "selective-op", "full"), "none", sequence_parallel=sp)
        model = LayerModel("llama", transformer_layers(LLAMA3_8B.model_copy(update={"sequence": 2048})), 64, None,
                           options=opts)
        c = StageCosts(model, topo, shape, 8, cost_tables(topo, CostModel(topo), shape))
        for t in (1, 2, 8):
            none, op, full = (c[StageConfig(t, r)] for r in ("none", "selective-op", "full"))
            k, i = 0, model.num_layers - 1
            assert full.activation[k, i] < op.activation[k, i] < none.activation[k, i]
            assert none.backward_act[k, i] < op.backward_act[k, i] < full.backward_act[k, i]
            assert none.transient[k, i] == 0 < op.transient[k, i]
            assert op.forward[k, i] == none.forward[k, i]


def _torch_block(spec: TransformerSpec):
    """A pre-norm block as torchtitan's Llama writes it, in the shape ``spec`` describes (no
    biases; one fused QKV product or three; GELU or SwiGLU; PyTorch's SDPA)."""
    import torch
    import torch.nn.functional as F

    h, f, heads = spec.hidden, spec.ffn, spec.heads
    kv = spec.kv * h // heads

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
            if spec.fused_qkv:
                self.wqkv = torch.nn.Linear(h, h + 2 * kv, bias=False)
            else:
                self.wq, self.wk, self.wv = (torch.nn.Linear(h, w, bias=False) for w in (h, kv, kv))
            self.wo = torch.nn.Linear(h, h, bias=False)
            self.w1 = torch.nn.Linear(h, f, bias=False)
            self.w3 = torch.nn.Linear(h, f, bias=False) if spec.activation == "swiglu" else None
            self.w2 = torch.nn.Linear(f, h, bias=False)

        def forward(self, x):
            y = self.norm1(x)
            q, k, v = (self.wqkv(y).split([h, kv, kv], -1) if spec.fused_qkv
                       else (self.wq(y), self.wk(y), self.wv(y)))
            b, s = q.shape[:2]           # the whole sequence, also when x holds a part of it
            q, k, v = (z.view(b, s, -1, h // heads).transpose(1, 2) for z in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
            x = x + self.wo(att.transpose(1, 2).reshape(b, s, -1))
            y = self.norm2(x)
            inner = F.silu(self.w1(y)) * self.w3(y) if self.w3 is not None else F.gelu(self.w1(y))
            return x + self.w2(inner)

    return Block()


def _measure(block, batch: int, spec: TransformerSpec, part: int = 1) -> tuple[int, int]:
    """(matrix-product FLOPs ``block`` runs in its backward, bytes its selective-checkpoint
    cache holds after the forward) on ``batch`` samples, of which each of ``part`` devices
    holds a share of the sequence (sequence parallelism)."""
    import torch
    import torch.utils.checkpoint as tuc
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default:
                (m, k), n = args[0].shape, args[1].shape[1]
                self.flops += 2 * m * k * n
            return func(*args, **(kwargs or {}))

    stores, original = [], tuc.create_selective_checkpoint_contexts

    def spy(policy, *a, **kw):
        forward, recompute = original(policy, *a, **kw)
        stores.append(forward.storage)
        return forward, recompute

    tuc.create_selective_checkpoint_contexts = spy
    try:
        torch.manual_seed(0)
        x = torch.randn(batch, spec.sequence // part, spec.hidden, requires_grad=True)
        loss = block(x).square().sum()
    finally:
        tuc.create_selective_checkpoint_contexts = original
    kept = 0
    for store in stores:
        for outputs in store.values():
            for value in outputs.values():
                leaves = torch.utils._pytree.tree_leaves(value)
                for t in (getattr(v, "val", v) for v in leaves):
                    t = getattr(t, "_local_tensor", t)          # a DTensor: this device's part
                    if isinstance(t, torch.Tensor):
                        kept += t.numel() * t.element_size()
    with Products() as count:
        loss.backward()
    return count.flops, kept


@pytest.mark.parametrize("fused, activation", [(True, "swiglu"), (False, "swiglu"), (False, "gelu"), (True, "gelu")])
def test_torch_reruns_and_keeps_what_the_cost_model_prices(fused, activation):
    """Differential: a bias-free block under torch's selective checkpointing with the run
    engine's rule (``run.stage.checkpointed``) re-runs, in backward, exactly the matrix-product
    FLOPs ``recompute_flops`` prices, and its cache holds exactly the bytes ``saved_per_sample``
    prices besides the block's input (fp32, one device); and torchtitan's own ``SelectiveAC``
    makes the same product decisions."""
    pytest.importorskip("torch")
    from solver_planner.run.stage import checkpointed

    spec = TransformerSpec(layers=1, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, sequence=16, vocab=256,
                           activation=activation, position="rotary", norm="rmsnorm", bias=False, fused_qkv=fused)
    batch = 3
    plain, _ = _measure(_torch_block(spec), batch, spec)
    op, kept = _measure(checkpointed(_torch_block(spec), "selective-op"), batch, spec)
    layer = transformer_layers(spec, "float32")[1]
    assert op - plain == pytest.approx(batch * recompute_flops([layer], "selective-op")[0])
    block_input = spec.sequence * spec.hidden * 4
    assert kept == pytest.approx(batch * (saved_per_sample([layer], "selective-op", 1, False)[0] - block_input))
    tt = pytest.importorskip("torchtitan.distributed.activation_checkpoint")
    theirs = tt.SelectiveAC(tt.SelectiveAC.Config(force_recompute_mm_shapes_by_fqns=[]))._wrap_block(_torch_block(spec))
    assert _measure(theirs, batch, spec)[0] == op


def test_only_torchtitan_takes_it_and_names_it_for_our_selective():
    base = dict(target="torchtitan", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, sequence=8192,
                vocab=128256, tied_embeddings=False, activation="swiglu", global_batch=64, micro_batch_size=1,
                dtype="bfloat16", optimizer="adam", data=8, tensor=1, pipeline=8, layers_per_chunk=(4,) * 8,
                optimizer_sharding="zero-3", gradient_reduce_dtype="float32")
    from solver_planner.targets.base import TargetConfig

    tt = TargetConfig(**base, recompute="selective-op")
    assert torchtitan.allows(tt) is None
    assert "activation-checkpoint:selective" in torchtitan.export(tt).splitlines()
    why = torchtitan.allows(dataclasses.replace(tt, recompute="selective"))
    assert "no selective recompute" in why and "recompute: selective-op" in why
    for mod, target in ((megatron, "megatron"), (deepspeed, "deepspeed")):
        cfg = dataclasses.replace(tt, target=target, optimizer_sharding="none", gradient_reduce_dtype="")
        assert "selective-op" in (mod.allows(dataclasses.replace(cfg, recompute="selective-op")) or "")


def test_auto_searches_the_modes_the_target_runs():
    assert layer_model(_spec("auto")).options.recompute == ("none", "selective", "full")
    assert layer_model(_spec("auto"), "megatron").options.recompute == ("none", "selective", "full")
    assert layer_model(_spec("auto"), "torchtitan").options.recompute == ("none", "full", "selective-op")
    assert layer_model(_spec("auto"), "deepspeed").options.recompute == ("none", "full")


def test_a_layers_list_is_refused_with_its_line(tmp_path):
    from solver_planner.spec import load_model_spec

    path = tmp_path / "m.yaml"
    path.write_text("name: m\nlayers:\n  - {name: l, repeat: 4, flops: 1 GFLOP, params: 1 MiB, activations: 1 MiB}\n"
                    "training:\n  global_batch: 8\n  recompute: selective-op\n")
    with pytest.raises(SpecError) as err:
        layer_model(load_model_spec(path))
    assert "m.yaml:6" in str(err.value) and "transformer" in str(err.value)
    # when the file is read, so `validate` says so too (it accepted the file before)
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 2 and "m.yaml:6: training.recompute: selective-op" in res.output


def test_plan_target_torchtitan_exports_selective_op_and_check_passes(tmp_path):
    model = llama_training(tmp_path, recompute="selective-op", optimizer_sharding="zero-3")
    cluster = str(CLUSTERS / "dgx-a100-8x8.yaml")
    plan, out = tmp_path / "p.yaml", tmp_path / "tt.args"
    res = CliRunner().invoke(app, ["plan", cluster, str(model), "--target", "torchtitan", "-o", str(plan),
                                   "--export", str(out)])
    assert res.exit_code == 0, res.output
    assert torchtitan.parse(out.read_text())["activation-checkpoint"] == "selective"
    assert CliRunner().invoke(app, ["check", cluster, str(model), str(plan)]).exit_code == 0
    # the attention-core granularity is refused for torchtitan, with the mode to use instead
    model.write_text(model.read_text().replace("recompute: selective-op,", "recompute: selective,"))
    res = CliRunner().invoke(app, ["plan", cluster, str(model), "--target", "torchtitan", "-o", str(plan)])
    assert res.exit_code == 1 and "recompute: selective-op" in res.output


def test_show_says_how_the_qkv_projections_run(tmp_path):
    src = (SPECS / "models" / "gpt3-2.6b.yaml").read_text()
    assert "fused_qkv" not in src
    res = CliRunner().invoke(app, ["show", str(SPECS / "models" / "gpt3-2.6b.yaml")])
    assert res.exit_code == 0 and "one fused product" in res.output
    path = tmp_path / "m.yaml"
    path.write_text(src.replace("transformer: {", "transformer: {fused_qkv: false, ", 1) if "transformer: {" in src
                    else src.replace("transformer:\n", "transformer:\n  fused_qkv: false\n", 1))
    res = CliRunner().invoke(app, ["show", str(path)])
    assert res.exit_code == 0 and "three products" in res.output, res.output


def test_torchtitan_refuses_what_would_make_selective_op_count_other_products():
    from solver_planner.targets.base import TargetConfig

    cfg = TargetConfig(target="torchtitan", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                       sequence=8192, vocab=128256, tied_embeddings=False, activation="swiglu", global_batch=64,
                       micro_batch_size=1, dtype="bfloat16", optimizer="adam", data=8, tensor=1, pipeline=8,
                       layers_per_chunk=(4,) * 8, optimizer_sharding="zero-3", gradient_reduce_dtype="float32",
                       recompute="selective-op")
    assert torchtitan.allows(cfg) is None
    assert "no linear biases" in torchtitan.allows(dataclasses.replace(cfg, bias="qkv"))
    # its Llama's positions and norm, which the export cannot change either
    assert "rotary positions and RMSNorm" in torchtitan.allows(dataclasses.replace(cfg, norm="layernorm"))
    assert "learned positions" in torchtitan.allows(dataclasses.replace(cfg, position="learned"))
    assert "fused_qkv: false" in torchtitan.allows(dataclasses.replace(cfg, fused_qkv=False))
    # three QKV products change nothing torchtitan runs without selective-op
    assert torchtitan.allows(dataclasses.replace(cfg, fused_qkv=False, recompute="full")) is None
    big = dataclasses.replace(cfg, layers=126, hidden=16384, heads=128, ffn_hidden=53248, tensor=8,
                              layers_per_chunk=(126 // 7,) * 7, pipeline=7)
    assert torchtitan.allows(dataclasses.replace(big, recompute="full")) is None
    assert "Float8" in torchtitan.allows(big)


def test_selective_op_reruns_the_tensor_parallel_communication_it_does_not_keep():
    """Full re-runs every tensor-parallel all-reduce; selective-op too without sequence
    parallelism, and under it only the all-gathers (torchtitan keeps the reduce-scatters'
    outputs): half the volume."""
    from solver_planner.cost import CostModel
    from solver_planner.spec import load_cluster_spec
    from solver_planner.stages.costs import StageConfig, StageCosts, cost_tables
    from solver_planner.stages.layers import LayerModel
    from solver_planner.stages.memory import MemoryOptions
    from solver_planner.stages.meshes import MeshShape
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    shape, t = MeshShape(1, 8), 4
    for sp, share in ((False, 1.0), (True, 0.5)):
        opts = MemoryOptions(("none", "selective-op"), "none", sequence_parallel=sp)
        model = LayerModel("llama", transformer_layers(LLAMA3_8B.model_copy(update={"sequence": 2048})), 64, None,
                           options=opts)
        c = StageCosts(model, topo, shape, 8, cost_tables(topo, CostModel(topo), shape))
        with_comm = [np.asarray(c.layer_times(StageConfig(t, r))[1]) for r in ("none", "selective-op")]
        compute = [np.asarray(c.compute_times(StageConfig(t, r))[1]) for r in ("none", "selective-op")]
        a, b = c.tables[t].tensor_allreduce
        ar = model.column("allreduces") * (a + b * model.column("activations") * c.samples(t))
        assert (with_comm[1] - compute[1]) - (with_comm[0] - compute[0]) == pytest.approx(share * ar)


_TP_SPEC = TransformerSpec(layers=1, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, sequence=16, vocab=256,
                           activation="swiglu", position="rotary", norm="rmsnorm", bias=False, fused_qkv=False)


def _sequence_parallel_rank(rank: int, init: str, results) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    from solver_planner.run.stage import checkpointed

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        block = _torch_block(_TP_SPEC)
        gathered = ColwiseParallel(input_layouts=Shard(1))
        parallelize_module(block, init_device_mesh("cpu", (2,)), {
            "norm1": SequenceParallel(), "norm2": SequenceParallel(), "wq": gathered, "wk": gathered,
            "wv": gathered, "w1": gathered, "w3": gathered, "wo": RowwiseParallel(output_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1))})
        results[rank] = _measure(checkpointed(block, "selective-op"), 3, _TP_SPEC, part=2)[1]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_torch_keeps_what_the_cost_model_prices_under_tensor_and_sequence_parallelism(tmp_path):
    """Differential, on 2 gloo processes with torch's tensor and sequence parallelism: each
    device's selective-checkpoint cache holds the bytes ``saved_per_sample`` prices at t = 2
    with sequence parallelism, besides its share of the block's input: the row-parallel
    products' outputs whole, the reduce-scatters' outputs and the column-parallel ones split."""
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(_sequence_parallel_rank, args=(f"file://{tmp_path / 'store'}", results), nprocs=2)
    layer = transformer_layers(_TP_SPEC, "float32")[1]
    block_input = _TP_SPEC.sequence * _TP_SPEC.hidden * 4 / 2
    want = 3 * (saved_per_sample([layer], "selective-op", 2, True)[0] - block_input)
    assert dict(results) == {0: pytest.approx(want), 1: pytest.approx(want)}
