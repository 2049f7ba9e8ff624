"""Framework exports, checked by each framework's own parser and config classes.

* torchtitan: ``ConfigManager().parse_args`` on the exported arguments, ``ParallelDims`` on
  the world size, and the pipeline helpers that map model parts to ranks.
* Megatron-LM: its argparse lives in ``megatron/training/arguments.py``, which no PyPI
  package ships (the megatron-core wheel holds only ``megatron/core``), so the exported flags
  are checked against ``megatron.FLAG_SCHEMA`` (written from arguments.py) and their values
  are fed to Megatron-Core's own validating dataclasses (``TransformerConfig``,
  ``OptimizerConfig``, ``DistributedDataParallelConfig``) and micro-batch calculator, as
  ``core_transformer_config_from_args`` does with the parsed arguments.
* DeepSpeed: ``deepspeed.runtime.config.DeepSpeedConfig`` on the exported JSON.

Each framework is optional: ``pytest.importorskip`` skips its tests when it is not
installed (the README names the install command CI uses).
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.targets import deepspeed as ds_target
from solver_planner.targets import megatron as mg_target
from solver_planner.targets import torchtitan as tt_target
from solver_planner.targets.base import TargetConfig
from solver_planner.targets.rules import TargetRules, chunk_layers, chunk_order

MODULES = {"megatron": mg_target, "torchtitan": tt_target, "deepspeed": ds_target}


SHAPES = {
    "gpt3_175b": dict(layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=49152, sequence=2048,
                      vocab=51200, tied_embeddings=True, activation="gelu", global_batch=1536, data=8, tensor=8,
                      pipeline=16, bias=True, position="learned", norm="layernorm"),
    "llama3_8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, sequence=8192,
                      vocab=128256, tied_embeddings=False, activation="swiglu", global_batch=512, data=8, tensor=4,
                      pipeline=4),
}


def _config(shape: str, target: str, **kw) -> TargetConfig:
    base = dict(target=target, micro_batch_size=1, dtype="bfloat16", optimizer="adam", **SHAPES[shape])
    if target == "torchtitan":
        base["gradient_reduce_dtype"] = "float32"      # as a --target torchtitan plan records it
    base.update(kw)
    return TargetConfig(**base)


def gpt3_175b(target: str, **kw) -> TargetConfig:
    return _config("gpt3_175b", target, **kw)


def llama3_8b(target: str, **kw) -> TargetConfig:
    return _config("llama3_8b", target, **kw)


MEGATRON_CASES = {
    "gpt3-1f1b": gpt3_175b("megatron", sequence_parallel=True, recompute="selective",
                           optimizer_sharding="distributed"),
    "gpt3-tp-overlap": gpt3_175b("megatron", sequence_parallel=True, tensor_overlap=True,
                                 optimizer_sharding="distributed", gradient_bucket=50_000_000),
    "gpt3-interleaved": gpt3_175b("megatron", virtual_stages=2, schedule="interleaved-1f1b",
                                  sequence_parallel=True, recompute="full",
                                  optimizer_sharding="distributed"),
    "gpt3-first-last": gpt3_175b("megatron", layers_per_chunk=(4,) + (6,) * 14 + (8,)),
    "gpt3-interleaved-first-last": gpt3_175b(
        "megatron", virtual_stages=2, schedule="interleaved-1f1b",
        # rank 0 holds chunks 0 and 16 (2 blocks each), rank 15 chunks 15 and 31 (4 each)
        layers_per_chunk=(2,) + (3,) * 14 + (4,) + (2,) + (3,) * 14 + (4,)),
    "gpt3-uneven-middle": gpt3_175b("megatron", layers_per_chunk=(6, 5, 7) + (6,) * 13),
    "llama8b": llama3_8b("megatron", sequence_parallel=True, context=2, data=4),
    "llama8b-fp32-sgd-no-pp": llama3_8b("megatron", dtype="float32", optimizer="sgd",
                                         pipeline=1, tensor=8, data=4),
}

TORCHTITAN_CASES = {
    "llama8b-1f1b": llama3_8b("torchtitan", sequence_parallel=True, recompute="selective-op",
                              optimizer_sharding="zero-3"),
    "llama8b-interleaved-uneven": llama3_8b(
        "torchtitan", virtual_stages=2, schedule="interleaved-1f1b", recompute="full",
        layers_per_chunk=(2, 4, 4, 4, 4, 4, 4, 6), optimizer_sharding="zero-2"),
    "llama8b-zbv": llama3_8b("torchtitan", virtual_stages=2, schedule="zb-v",
                             optimizer_sharding="zero-3", sequence_parallel=True),
    "llama8b-zbh1": llama3_8b("torchtitan", virtual_stages=2, schedule="zb-h1"),
    "llama8b-gpipe-cp": llama3_8b("torchtitan", schedule="gpipe", context=2, data=4,
                                  micro_batch_size=2),
    "llama8b-no-pp": llama3_8b("torchtitan", pipeline=1, tensor=8, dtype="float32",
                               sequence_parallel=True, micro_batch_size=2),
    "llama70b": dataclasses.replace(
        llama3_8b("torchtitan", tensor=8, pipeline=8, data=4, global_batch=256,
                  optimizer_sharding="zero-3", sequence_parallel=True),
        layers=80, hidden=8192, heads=64, ffn_hidden=28672),
}

DEEPSPEED_CASES = {
    "gpt3-pipeline-zero1": gpt3_175b("deepspeed", tensor=1, optimizer_sharding="zero-1",
                                     recompute="full"),
    "gpt3-zero3": gpt3_175b("deepspeed", tensor=1, pipeline=1, data=128,
                            optimizer_sharding="zero-3"),
    "llama8b-autotp-zero2": llama3_8b("deepspeed", pipeline=1, optimizer_sharding="zero-2",
                                      micro_batch_size=2),
    "llama8b-fp16-sgd": llama3_8b("deepspeed", tensor=1, pipeline=4, dtype="float16",
                                  optimizer="sgd", optimizer_sharding="zero-1"),
}


# --------------------------------------------------------------------------- all targets

@pytest.mark.parametrize("target,cfg", [
    *(("megatron", c) for c in MEGATRON_CASES.values()),
    *(("torchtitan", c) for c in TORCHTITAN_CASES.values()),
    *(("deepspeed", c) for c in DEEPSPEED_CASES.values()),
])
def test_allowed_and_export_is_deterministic(target, cfg):
    mod = MODULES[target]
    assert mod.allows(cfg) is None
    text = mod.export(cfg)
    assert text == mod.export(cfg)
    assert mod.parse(text) == mod.parse(mod.export(cfg))


def test_rules_are_data():
    for mod in MODULES.values():
        assert isinstance(mod.RULES, TargetRules)
        with pytest.raises(dataclasses.FrozenInstanceError):
            mod.RULES.target = "x"
    with pytest.raises(ValueError, match="unknown schedule"):
        dataclasses.replace(mg_target.RULES, schedules=frozenset({"pipedream"}))


def test_export_refuses_what_allows_refuses():
    cfg = gpt3_175b("megatron", schedule="zb-v", virtual_stages=2)
    for mod in MODULES.values():
        why = mod.allows(cfg)
        assert why
        with pytest.raises(ValueError, match="cannot run"):
            mod.export(cfg)


def test_chunk_order_zb_v_folds_the_model():
    cfg = llama3_8b("torchtitan", virtual_stages=2, schedule="zb-v")
    assert chunk_order(cfg) == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1)]
    looped = dataclasses.replace(cfg, schedule="interleaved-1f1b")
    assert chunk_order(looped) == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    assert chunk_layers(dataclasses.replace(cfg, layers_per_chunk=(1,) * 8))[1]  # sums to 8


# ------------------------------------------------------------------------------ Megatron

@pytest.mark.parametrize("name", sorted(MEGATRON_CASES))
def test_megatron_parse_round_trip(name):
    cfg = MEGATRON_CASES[name]
    flags = mg_target.parse(mg_target.export(cfg))
    assert flags["--num-layers"] == cfg.layers
    assert flags["--tensor-model-parallel-size"] == cfg.tensor
    assert flags["--pipeline-model-parallel-size"] == cfg.pipeline
    assert flags["--global-batch-size"] == cfg.global_batch
    assert ("--sequence-parallel" in flags) == cfg.sequence_parallel
    assert ("--tp-comm-overlap" in flags) == cfg.tensor_overlap
    assert flags.get("--ddp-bucket-size") == (cfg.gradient_bucket or None)
    assert ("--untie-embeddings-and-output-weights" in flags) == (not cfg.tied_embeddings)
    assert ("--use-distributed-optimizer" in flags) == (cfg.optimizer_sharding == "distributed")


def test_megatron_parse_refuses_unknown_flags():
    text = mg_target.export(MEGATRON_CASES["gpt3-1f1b"])
    with pytest.raises(ValueError, match="not a Megatron-LM flag"):
        mg_target.parse(text.replace("--num-layers", "--num-layer"))
    with pytest.raises(ValueError, match="needs a value"):
        mg_target.parse(text.replace("--hidden-size 12288", "--hidden-size"))


def _megatron_objects(flags: dict):
    """Megatron-Core's validating configs from exported flags: the field of each flag is
    its name (Megatron-LM's ArgumentGroupFactory and core_transformer_config_from_args)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = (torch.bfloat16 if flags.get("--bf16") else
             torch.float16 if flags.get("--fp16") else torch.float32)
    swiglu = bool(flags.get("--swiglu"))
    tc = TransformerConfig(
        num_layers=flags["--num-layers"],
        hidden_size=flags["--hidden-size"],
        ffn_hidden_size=flags["--ffn-hidden-size"],
        num_attention_heads=flags["--num-attention-heads"],
        num_query_groups=(flags["--num-query-groups"] if flags.get("--group-query-attention")
                          else None),
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        tensor_model_parallel_size=flags["--tensor-model-parallel-size"],
        pipeline_model_parallel_size=flags["--pipeline-model-parallel-size"],
        context_parallel_size=flags["--context-parallel-size"],
        sequence_parallel=bool(flags.get("--sequence-parallel")),
        tp_comm_overlap=bool(flags.get("--tp-comm-overlap")),
        virtual_pipeline_model_parallel_size=flags.get("--num-virtual-stages-per-pipeline-rank"),
        num_layers_in_first_pipeline_stage=flags.get("--decoder-first-pipeline-num-layers"),
        num_layers_in_last_pipeline_stage=flags.get("--decoder-last-pipeline-num-layers"),
        pipeline_model_parallel_layout=flags.get("--pipeline-model-parallel-layout"),
        recompute_granularity=flags.get("--recompute-granularity"),
        recompute_method=flags.get("--recompute-method"),
        recompute_num_layers=flags.get("--recompute-num-layers"),
        bf16=bool(flags.get("--bf16")), fp16=bool(flags.get("--fp16")),
        params_dtype=dtype, pipeline_dtype=dtype,
        add_bias_linear=not flags.get("--disable-bias-linear"), add_qkv_bias=bool(flags.get("--add-qkv-bias")),
        normalization=flags.get("--normalization", "LayerNorm"),
    )
    oc = OptimizerConfig(optimizer=flags["--optimizer"], bf16=tc.bf16, fp16=tc.fp16,
                         params_dtype=dtype,
                         use_distributed_optimizer=bool(flags.get("--use-distributed-optimizer")))
    ddp = DistributedDataParallelConfig(
        # arguments.py: bf16 turns accumulate_allreduce_grads_in_fp32 on unless --grad-reduce-in-bf16
        grad_reduce_in_fp32=bool(flags.get("--accumulate-allreduce-grads-in-fp32"))
        or (bool(flags.get("--bf16")) and not flags.get("--grad-reduce-in-bf16")),
        overlap_grad_reduce=bool(flags.get("--overlap-grad-reduce")),
        overlap_param_gather=bool(flags.get("--overlap-param-gather")),
        bucket_size=flags.get("--ddp-bucket-size"),
        use_distributed_optimizer=bool(flags.get("--use-distributed-optimizer")))
    return tc, oc, ddp


def _megatron_layers(tc, cfg: TargetConfig) -> list[int]:
    """Blocks Megatron-Core builds for each model chunk, in our pipeline order."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    out = []
    for rank, local in chunk_order(cfg):
        if tc.pipeline_model_parallel_layout is not None:
            # get_num_layers_to_build asks parallel_state for the rank with a layout; the
            # layout's 2D table [pp_rank][vp_stage] is what it reads.
            stage = tc.pipeline_model_parallel_layout.layout[rank][local]
            out.append(sum(1 for x in stage if x == LayerType.decoder))
        else:
            vp = local if tc.virtual_pipeline_model_parallel_size else None
            out.append(get_num_layers_to_build(tc, vp_stage=vp, pp_rank=rank))
    return out


@pytest.mark.parametrize("name", sorted(MEGATRON_CASES))
def test_megatron_core_accepts_export(name):
    pytest.importorskip("megatron.core")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    cfg = MEGATRON_CASES[name]
    flags = mg_target.parse(mg_target.export(cfg))
    for flag in flags:
        assert flag in mg_target.FLAG_SCHEMA
    tc, oc, ddp = _megatron_objects(flags)
    assert (tc.virtual_pipeline_model_parallel_size or 1) == cfg.virtual_stages
    assert _megatron_layers(tc, cfg) == list(chunk_layers(cfg)[0])
    assert tc.num_query_groups == cfg.kv_heads
    calc = ConstantNumMicroBatchesCalculator(flags["--global-batch-size"],
                                             flags["--micro-batch-size"], cfg.data,
                                             False, 0)
    assert calc.get() == cfg.microbatches


def test_megatron_schema_names_exist_in_megatron_core():
    """Flags Megatron-LM generates from TransformerConfig fields must name a field of the
    installed Megatron-Core (ArgumentGroupFactory: ``--foo-bar`` is field ``foo_bar``)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    generated = [f for f, (_, src) in mg_target.FLAG_SCHEMA.items() if "TransformerConfig" in src]
    assert generated
    for flag in generated:
        assert flag[2:].replace("-", "_") in fields, flag


def test_megatron_core_rejects_what_it_should():
    """The validation bites: a tampered export fails in Megatron-Core."""
    pytest.importorskip("megatron.core")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    flags = mg_target.parse(mg_target.export(MEGATRON_CASES["gpt3-1f1b"]))
    with pytest.raises(ValueError, match="sequence parallelism"):
        _megatron_objects({**flags, "--tensor-model-parallel-size": 1})
    with pytest.raises(ValueError):
        _megatron_objects({**flags, "--decoder-first-pipeline-num-layers": 5})
    with pytest.raises(AssertionError):
        ConstantNumMicroBatchesCalculator(1537, 1, 8, False, 0)


@pytest.mark.parametrize("cfg,reason", [
    (gpt3_175b("megatron", schedule="zb-v", virtual_stages=2), "no zb-v"),
    (gpt3_175b("megatron", schedule="zb-h1"), "no zb-h1"),
    (gpt3_175b("megatron", schedule="gpipe"), "no gpipe"),
    (gpt3_175b("megatron", optimizer_sharding="zero-3"), "optimizer sharding"),
    (gpt3_175b("megatron", tensor=1, data=64, sequence_parallel=True), "tensor > 1"),
    (gpt3_175b("megatron", global_batch=1001), "not a multiple"),
    (gpt3_175b("megatron", virtual_stages=2, schedule="interleaved-1f1b", global_batch=1544),
     "193 micro-batches"),
    (gpt3_175b("megatron", virtual_stages=2, schedule="interleaved-1f1b", global_batch=8 * 24),
     "multiple of pipeline 16"),
    (gpt3_175b("megatron", tensor=64, data=1), "not divisible by tensor"),
    (gpt3_175b("megatron", layers_per_chunk=(6,) * 15), "entries"),
])
def test_megatron_refusals(cfg, reason):
    why = mg_target.allows(cfg)
    assert why is not None and reason in why, why
    assert "\n" not in why


@st.composite
def _small_megatron(draw):
    p = draw(st.sampled_from([1, 2, 3, 4]))
    v = draw(st.sampled_from([1, 2])) if p > 1 else 1
    n = p * v
    split = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    t = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    d = draw(st.sampled_from([1, 2]))
    mbs = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 12))
    return TargetConfig(
        target="megatron", layers=sum(split), hidden=64 * 8, heads=8, kv_heads=kv,
        ffn_hidden=draw(st.sampled_from([1024, 1536])), sequence=draw(st.sampled_from([64, 96])),
        vocab=1000, tied_embeddings=draw(st.booleans()),
        activation=draw(st.sampled_from(["gelu", "swiglu"])), global_batch=m * d * mbs,
        micro_batch_size=mbs, dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        optimizer="adam", data=d, tensor=t, pipeline=p, context=draw(st.sampled_from([1, 2])),
        virtual_stages=v, schedule="interleaved-1f1b" if v > 1 else "1f1b",
        layers_per_chunk=tuple(split), sequence_parallel=t > 1 and draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        optimizer_sharding=draw(st.sampled_from(["none", "distributed"])),
        gradient_reduce_dtype=draw(st.sampled_from(["", "float32", "bfloat16", "float16"])),
        bias=draw(st.sampled_from([True, False, "qkv"])), position=draw(st.sampled_from(["learned", "rotary"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(_small_megatron())
def test_megatron_allowed_configs_build_in_megatron_core(cfg):
    """Differential: whatever allows() accepts, Megatron-Core accepts and builds the same
    layers per chunk (any split, through first/last flags or the layout)."""
    pytest.importorskip("megatron.core")
    if mg_target.allows(cfg) is not None:
        return
    flags = mg_target.parse(mg_target.export(cfg))
    tc, _, ddp = _megatron_objects(flags)
    assert _megatron_layers(tc, cfg) == list(cfg.layers_per_chunk)
    # the model's biases, and the gradients reduced in the type the plan priced
    assert (tc.add_bias_linear, tc.add_qkv_bias) == (cfg.bias is True, cfg.bias == "qkv")
    assert tc.normalization == {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[cfg.norm]
    assert flags.get("--position-embedding-type", "learned_absolute") == \
        {"learned": "learned_absolute", "rotary": "rope"}[cfg.position]
    # the rotary base is not in the plan: the snippet says so instead of leaving 10000 unsaid
    assert ("--rotary-base" in mg_target.export(cfg)) == (cfg.position == "rotary")
    if cfg.data > 1:
        reduced = "float32" if ddp.grad_reduce_in_fp32 else cfg.dtype     # DDP reduces its grad buffer's type
        assert reduced == (cfg.gradient_reduce_dtype or cfg.dtype)


# ---------------------------------------------------------------------------- torchtitan

def _titan(cfg: TargetConfig):
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(tt_target.argv(tt_target.export(cfg)))


@pytest.mark.parametrize("name", sorted(TORCHTITAN_CASES))
def test_torchtitan_config_manager_accepts_export(name):
    cfg = TORCHTITAN_CASES[name]
    c = _titan(cfg)
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    par, tr = c.parallelism, c.training
    # the model is the registry's, with the plan's dimensions
    model = c.model_spec.model
    layer = model.layers[0]
    assert (len(model.layers), model.dim, layer.attention.n_heads,
            layer.attention.qkv_linear.n_kv_heads, layer.feed_forward.w1.out_features,
            model.vocab_size) == (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads,
                                  cfg.ffn_hidden, cfg.vocab)
    # the world: ParallelDims checks dp_replicate*dp_shard*cp*tp*pp == WORLD_SIZE
    dims = ParallelDims.from_config(par, world_size=cfg.devices)
    assert dims.dp_replicate * dims.dp_shard == cfg.data
    assert (dims.tp, dims.pp, dims.cp) == (cfg.tensor, cfg.pipeline, cfg.context)
    with pytest.raises(AssertionError):
        ParallelDims.from_config(par, world_size=cfg.devices * 2 + 1)
    # batches: trainer.py's accumulation steps and _build_pipeline_schedule's micro-batches
    accumulation = tr.global_batch_size // (tr.local_batch_size * cfg.data)
    assert tr.global_batch_size % (tr.local_batch_size * cfg.data) == 0
    assert tr.seq_len == cfg.sequence
    assert tr.mixed_precision_param == cfg.dtype
    assert (par.enable_sequence_parallel or cfg.tensor == 1) == (cfg.sequence_parallel
                                                                  or cfg.tensor == 1)
    ac = type(c.activation_checkpoint).__name__ if c.activation_checkpoint else None
    assert {"none": None, "selective-op": "Config", "full": "Config"}[cfg.recompute] == ac
    if cfg.recompute != "none":
        # our selective-op is torchtitan's per-operator SelectiveAC
        assert type(c.activation_checkpoint).__qualname__.startswith(
            {"selective-op": "SelectiveAC", "full": "FullAC"}[cfg.recompute])
    if cfg.pipeline == 1:
        assert accumulation == cfg.microbatches
        return
    assert accumulation == 1
    assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == cfg.microbatches
    cls = get_schedule_class(par.pipeline_parallel_schedule)
    parts = par.module_fqns_per_model_part
    assert issubclass(cls, PipelineScheduleSingle) == (len(parts) == cfg.pipeline)
    # torchtitan's own rank -> stage mapping agrees with our chunk order, and the parts cut
    # the model into the planned blocks
    for rank in range(cfg.pipeline):
        stages = _get_pp_rank_to_stage_indices_mapping(rank, cfg.pipeline,
                                                       par.pipeline_parallel_schedule,
                                                       len(parts))
        assert [chunk_order(cfg)[s] for s in stages] == [(rank, v) for v in range(len(stages))]
    # the names are the real model's: build it on the meta device and cut it with
    # torchtitan's own _split_module (which ignores unknown names, hence get_submodule)
    import torch
    from torchtitan.distributed.pipeline_parallel import _split_module

    with torch.device("meta"):
        whole = c.model_spec.model.build()
    for part in parts:
        for fqn in part:
            whole.get_submodule(fqn)
    built = [_split_module(whole, part) for part in parts]
    assert [len(m.layers) for m in built] == list(chunk_layers(cfg)[0])
    assert [m.tok_embeddings is not None for m in built] == [i == 0 for i in range(len(parts))]
    assert [m.lm_head is not None for m in built] == [i == len(parts) - 1
                                                      for i in range(len(parts))]
    flat = [m for part in parts for m in part]
    assert flat == (["tok_embeddings"] + [f"layers.{i}" for i in range(cfg.layers)]
                    + ["norm", "lm_head"])
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == list(chunk_layers(cfg)[0])


@st.composite
def _llama8b_parallel(draw):
    p = draw(st.sampled_from([1, 2, 4, 8]))
    schedule = draw(st.sampled_from(sorted(tt_target.SCHEDULES))) if p > 1 else "1f1b"
    v = {"gpipe": 1, "1f1b": 1, "zb-v": 2}.get(schedule) or draw(st.sampled_from([2, 4]))
    n = p * v
    cuts = sorted(draw(st.lists(st.integers(0, 32), min_size=n - 1, max_size=n - 1)))
    split = tuple(b - a for a, b in zip([0, *cuts], [*cuts, 32]))
    t = draw(st.sampled_from([1, 2, 4, 8]))
    d = draw(st.sampled_from([1, 2, 3]))
    mbs = draw(st.sampled_from([1, 2]))
    return llama3_8b(
        "torchtitan", pipeline=p, tensor=t, data=d, context=draw(st.sampled_from([1, 2])),
        schedule=schedule, virtual_stages=v, layers_per_chunk=split, micro_batch_size=mbs,
        global_batch=d * mbs * draw(st.integers(1, 9)),
        sequence_parallel=t > 1 and draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective-op", "full"])),
        optimizer_sharding=draw(st.sampled_from(["none", "zero-2", "zero-3"])),
        dtype=draw(st.sampled_from(["bfloat16", "float32"])))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(_llama8b_parallel())
def test_torchtitan_allowed_configs_parse(cfg):
    """Differential: whatever allows() accepts, torchtitan's parser and ParallelDims accept,
    and its rank -> stage mapping places our chunks where chunk_order says."""
    pytest.importorskip("torchtitan")
    if tt_target.allows(cfg) is not None:
        return
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    c = _titan(cfg)
    ParallelDims.from_config(c.parallelism, world_size=cfg.devices)
    parts = c.parallelism.module_fqns_per_model_part or [[]]
    assert len(parts) == cfg.pipeline * cfg.virtual_stages
    for rank in range(cfg.pipeline if cfg.pipeline > 1 else 0):
        stages = _get_pp_rank_to_stage_indices_mapping(
            rank, cfg.pipeline, c.parallelism.pipeline_parallel_schedule, len(parts))
        assert [chunk_order(cfg)[s] for s in stages] == [(rank, v) for v in range(len(stages))]


def test_torchtitan_equal_split_matches_its_generator():
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    cfg = TORCHTITAN_CASES["llama8b-zbv"]
    assert tt_target.model_parts(cfg) == _generate_llm_fqn_per_model_part(8, 32, 0, 0)


def test_torchtitan_flavor_table_matches_registry():
    pytest.importorskip("torchtitan")
    import importlib

    from torchtitan.models.llama3 import model_registry

    registry = importlib.import_module("torchtitan.models.llama3.config_registry")
    for f in tt_target.FLAVORS:
        assert callable(getattr(registry, f.config))
        model = model_registry(f.config.split("_")[1].upper()).model
        layer = model.layers[0]
        assert (len(model.layers), model.dim, layer.attention.n_heads,
                layer.attention.qkv_linear.n_kv_heads, layer.feed_forward.w1.out_features,
                model.vocab_size, bool(model.enable_weight_tying),
                layer.attention.rope.max_seq_len) == (
            f.layers, f.hidden, f.heads, f.kv_heads, f.ffn_hidden, f.vocab,
            f.tied_embeddings, f.max_sequence), f.config


def test_torchtitan_parse_round_trip():
    cfg = TORCHTITAN_CASES["llama8b-interleaved-uneven"]
    d = tt_target.parse(tt_target.export(cfg))
    assert d["--config"] == "llama3_8b"
    assert d["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert d["--parallelism.module_fqns_per_model_part"] == tt_target.model_parts(cfg)
    assert d["activation-checkpoint"] == "full"
    assert d["--training.disable_cuda_graphs"] is True
    with pytest.raises(ValueError):
        tt_target.parse("--training.seq_len 1 2\n")


def test_torchtitan_parser_rejects_pipeline_with_cuda_graphs(capsys):
    """The rule the export honours is the framework's: drop the flag and it refuses."""
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    args = tt_target.argv(tt_target.export(TORCHTITAN_CASES["llama8b-zbv"]))
    args.remove("--training.disable_cuda_graphs")
    # tyro reports the Trainer.Config.__post_init__ error argparse-style and exits 2.
    with pytest.raises((ValueError, SystemExit)):
        ConfigManager().parse_args(args)
    out = capsys.readouterr()
    assert "CUDA graphs" in out.out + out.err


@pytest.mark.parametrize("cfg,reason", [
    (gpt3_175b("torchtitan"), "gelu model cannot be expressed"),
    (llama3_8b("torchtitan", layers=30, pipeline=2, data=16), "nearest llama3_8b differs in layers"),
    (llama3_8b("torchtitan", hidden=5120), "model_spec is not a command-line option"),
    (llama3_8b("torchtitan", schedule="zb-h1"), "at least 2 model chunks"),
    (llama3_8b("torchtitan", optimizer_sharding="zero-1"), "optimizer sharding"),
    (llama3_8b("torchtitan", optimizer_sharding="distributed"), "optimizer sharding"),
    (llama3_8b("torchtitan", dtype="float16"), "float16"),
    (llama3_8b("torchtitan", tensor=16, data=2), "not divisible by tensor"),
    (llama3_8b("torchtitan", optimizer="sgd"), "sgd"),
    (llama3_8b("torchtitan", sequence_parallel=True, tensor_overlap=True), "tensor-parallel collectives"),
    # torch's runtime keeps 3 chunks of a rank gathered and re-gathers the rest (max_active_stages)
    (llama3_8b("torchtitan", optimizer_sharding="zero-2", schedule="interleaved-1f1b", virtual_stages=4,
               layers=32), "more than 3 model chunks"),
])
def test_torchtitan_refusals(cfg, reason):
    why = tt_target.allows(cfg)
    assert why is not None and reason in why, why


def test_every_way_a_model_differs_from_torchtitans_llama_is_named_at_once():
    """A spec fixed from one refusal should not meet the next on the next run: tied
    embeddings, biases and LayerNorm are named together."""
    why = tt_target.allows(llama3_8b("torchtitan", tied_embeddings=True, bias=True, norm="layernorm"))
    assert "tied_embeddings True vs False" in why and "transformer.bias" in why and "transformer.norm" in why, why


@pytest.mark.parametrize("chunks, sharding, runs", [(2, "zero-3", True), (4, "none", True), (4, "zero-3", False)])
def test_torchtitan_runs_fsdp2_with_at_most_3_chunks_a_rank(chunks, sharding, runs):
    cfg = llama3_8b("torchtitan", optimizer_sharding=sharding, schedule="interleaved-1f1b", virtual_stages=chunks)
    assert (tt_target.allows(cfg) is None) == runs, tt_target.allows(cfg)


# ----------------------------------------------------------------------------- DeepSpeed

class _DataParallelMPU:
    """The one call DeepSpeedConfig makes of an mpu to learn the data-parallel size."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def _deepspeed_config(d: dict, data: int, monkeypatch):
    dsc = pytest.importorskip("deepspeed.runtime.config")
    # DeepSpeedConfig asks dist.get_rank() before it reads the mpu and falls back to world
    # size 1 without a process group; a rank is all it needs.
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    return dsc.DeepSpeedConfig(d, mpu=_DataParallelMPU(data))


@pytest.mark.parametrize("name", sorted(DEEPSPEED_CASES))
def test_deepspeed_config_accepts_export(name, monkeypatch):
    cfg = DEEPSPEED_CASES[name]
    d = ds_target.parse(ds_target.export(cfg))
    c = _deepspeed_config(d, cfg.data, monkeypatch)
    assert c.world_size == cfg.data
    assert c.train_batch_size == cfg.global_batch
    assert c.train_micro_batch_size_per_gpu == cfg.micro_batch_size
    assert c.gradient_accumulation_steps == cfg.microbatches
    assert c.zero_optimization_stage == {"none": 0, "zero-1": 1, "zero-2": 2,
                                         "zero-3": 3}[cfg.optimizer_sharding]
    assert c.bfloat16_config.enabled == (cfg.dtype == "bfloat16")
    assert c.float16_config.enabled == (cfg.dtype == "float16")
    assert c.optimizer_name.lower() == cfg.optimizer
    assert c.tensor_parallel_config.autotp_size == (cfg.tensor if cfg.tensor > 1 else 0)
    if cfg.pipeline > 1:
        assert c.pipeline["stages"] == cfg.pipeline
        assert c.pipeline["activation_checkpoint_interval"] == (cfg.recompute == "full")


def test_deepspeed_config_rejects_tampered_batch(monkeypatch):
    cfg = DEEPSPEED_CASES["gpt3-pipeline-zero1"]
    d = ds_target.parse(ds_target.export(cfg))
    with pytest.raises(AssertionError, match="train_batch_size"):
        _deepspeed_config({**d, "train_batch_size": cfg.global_batch + 8}, cfg.data, monkeypatch)


def test_deepspeed_parse_refuses_unknown_keys():
    text = ds_target.export(DEEPSPEED_CASES["gpt3-zero3"])
    with pytest.raises(ValueError, match="does not write"):
        ds_target.parse(json.dumps({**json.loads(text), "zero_optimisation": {}}))


@pytest.mark.parametrize("cfg,reason", [
    (gpt3_175b("deepspeed", tensor=1, virtual_stages=2, schedule="interleaved-1f1b"),
     "no interleaved-1f1b"),
    (gpt3_175b("deepspeed", tensor=1, optimizer_sharding="zero-2"), "ZeRO stage 0 or 1"),
    (gpt3_175b("deepspeed", tensor=1, layers_per_chunk=(4,) + (6,) * 14 + (8,)), "uneven"),
    (gpt3_175b("deepspeed"), "AutoTP"),
    (llama3_8b("deepspeed", pipeline=1, optimizer_sharding="zero-3"), "not 3"),
    (llama3_8b("deepspeed", pipeline=1, tensor=1, data=32, recompute="full"),
     "deepspeed.checkpointing"),
    (llama3_8b("deepspeed", pipeline=1, tensor=1, data=32, recompute="selective"),
     "selective"),
    (llama3_8b("deepspeed", tensor=1, context=2, data=16), "context parallelism"),
    (llama3_8b("deepspeed", tensor=1, optimizer_sharding="distributed"), "optimizer sharding"),
])
def test_deepspeed_refusals(cfg, reason):
    why = ds_target.allows(cfg)
    assert why is not None and reason in why, why


def test_every_schedule_is_somebodys():
    """Each of our schedules is exported by some target, so none is dead in the rules."""
    covered = set(itertools.chain.from_iterable(m.RULES.schedules for m in MODULES.values()))
    from solver_planner.targets.base import SCHEDULE_NAMES

    assert covered == set(SCHEDULE_NAMES)
