"""Hugging Face config.json as a model spec, the TransformerSpec variants, and ``show``.

Published parameter counts: Llama 3 (Meta 2024, model card: 8.03 B and 70.6 B), GPT-2 XL
(Radford et al. 2019: "1542M" in the paper; 1 557 611 200 in the released weights, whose
vocabulary is 50 257), Mistral 7B (Jiang et al. 2023: 7.24 B), GPT-NeoX-20B (Black et al.
2022: 20.55 B), Qwen2-7B (Qwen team 2024: 7.62 B).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, run_cli
from solver_planner.errors import OptionError, SpecError
from solver_planner.spec.counts import transformer_counts
from solver_planner.spec.hf import read_hf_config
from solver_planner.spec.layers import TransformerSpec
from solver_planner.spec.model import load_model_spec
from solver_planner.stages.layers import layer_model, transformer_layers

HF = ROOT / "examples" / "hf"
CLUSTER = ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"


@pytest.mark.parametrize("file, published", [
    ("llama-3-8b.json", 8.03e9), ("llama-3-70b.json", 70.6e9), ("gpt2-xl.json", 1.5576e9),
    ("mistral-7b.json", 7.24e9), ("gpt-neox-20b.json", 20.55e9), ("qwen2-7b.json", 7.62e9),
])
def test_parameter_counts_match_published_figures(file, published):
    spec = load_model_spec(HF / file)
    counts = transformer_counts(spec.transformer, spec.training.tied_embeddings)
    assert counts.parameters == pytest.approx(published, rel=0.01)
    # the layer model holds the same parameters but the final norm (one h- or 2h-vector)
    model = layer_model(spec)
    held = sum(x.params for x in model.layers) / 2            # bfloat16: 2 bytes a parameter
    assert held + counts.final_norm == counts.parameters


def test_exact_counts_of_the_released_weights():
    """Counted tensor by tensor from the released checkpoints' shapes."""
    llama = load_model_spec(HF / "llama-3-8b.json")
    assert transformer_counts(llama.transformer, False).parameters == 8_030_261_248
    gpt2 = load_model_spec(HF / "gpt2-xl.json")
    assert gpt2.training.tied_embeddings and gpt2.transformer.position == "learned"
    assert transformer_counts(gpt2.transformer, True).parameters == 1_557_611_200


def _old_block(h: int, s: int) -> tuple[float, float]:
    return 12.0 * h * h + 13.0 * h, 24.0 * s * h * h + 4.0 * s * s * h


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 4096), st.integers(1, 50_000), st.booleans())
@settings(max_examples=200, deadline=None)
def test_default_shape_is_gpt(heads, per_head, sequence, vocab, tied):
    h = heads * per_head
    t = TransformerSpec(layers=3, hidden=h, heads=heads, sequence=sequence, vocab=vocab)
    params, flops = _old_block(h, sequence)
    layers = transformer_layers(t, "bfloat16", "adam", tied)
    block = layers[1]
    assert block.params == params * 2 and block.forward == flops
    # flash attention (the default) keeps each row's fp32 log-sum-exp, not the scores
    assert block.saved == sequence * h * 24.0 + 4.0 * heads * sequence
    materialized = transformer_layers(t, "bfloat16", "adam", tied, "materialized")[1]
    assert materialized.saved == pytest.approx(sequence * h * (24.0 + 5.0 * heads * sequence / h))
    assert block.saved_replicated == 10.0 * sequence * h and block.selective_saved == 24.0 * sequence * h
    assert block.weight == 24.0 * sequence * h * h
    assert layers[0].params == (vocab * h + sequence * h) * 2
    c = transformer_counts(t, tied)
    assert c.block == params and c.embedding == vocab * h + sequence * h and c.final_norm == 2 * h


def test_variants_change_the_counts_as_the_papers_say():
    h, a, s = 512, 8, 128
    base = TransformerSpec(layers=1, hidden=h, heads=a, sequence=s, vocab=1000)
    gqa = base.model_copy(update={"kv_heads": 2})
    # keys and values shrink from h x h to h x (2 * 64) each (Ainslie et al. 2023)
    assert transformer_counts(base).block_weights - transformer_counts(gqa).block_weights == 2 * h * (h - 2 * 64)
    swiglu = base.model_copy(update={"activation": "swiglu", "ffn_hidden": 1000})
    assert transformer_counts(swiglu).block_weights == 4 * h * h + 3 * h * 1000
    rotary = base.model_copy(update={"position": "rotary"})
    assert transformer_counts(base).embedding - transformer_counts(rotary).embedding == s * h
    rms = base.model_copy(update={"norm": "rmsnorm", "bias": False})
    assert transformer_counts(rms).block == 12 * h * h + 2 * h
    # fewer weights, fewer FLOPs; the attention core stays 4 s^2 h
    assert transformer_counts(gqa).block_flops == 2 * s * transformer_counts(gqa).block_weights + 4 * s * s * h
    # grouped-query attention keeps less: keys and values shrink by kv_heads / heads
    assert transformer_layers(gqa)[1].selective_saved < transformer_layers(base)[1].selective_saved


def test_mixtral_is_refused_naming_experts():
    with pytest.raises(SpecError) as info:
        load_model_spec(HF / "mixtral-8x7b.json")
    text = str(info.value)
    assert "mixtral-8x7b.json:" in text and "experts are not modelled yet" in text
    r = run_cli("stages", CLUSTER, HF / "mixtral-8x7b.json")
    assert r.returncode == 2 and "experts are not modelled yet" in r.stderr and "Traceback" not in r.stderr


def _config(tmp_path: Path, **changes) -> Path:
    data = json.loads((HF / "llama-3-8b.json").read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_unknown_model_type_names_the_supported_ones(tmp_path):
    path = _config(tmp_path, model_type="bert")
    with pytest.raises(SpecError) as info:
        load_model_spec(path)
    issue = info.value.issues[0]
    assert issue.path == "model_type" and issue.line is not None
    assert "'bert'" in issue.message and "llama, mistral, qwen2, gpt2, gpt_neox" in issue.message


def test_missing_key_is_named_with_its_file(tmp_path):
    path = _config(tmp_path, intermediate_size=None)
    with pytest.raises(SpecError) as info:
        load_model_spec(path)
    assert str(info.value).startswith(f"{path}:") and "intermediate_size: missing required key" in str(info.value)


def test_bad_values_are_located_by_line(tmp_path):
    path = _config(tmp_path, num_key_value_heads=7)
    with pytest.raises(SpecError) as info:
        load_model_spec(path)
    issue = info.value.issues[0]
    lines = path.read_text().splitlines()
    assert issue.path == "num_key_value_heads" and '"num_key_value_heads"' in lines[issue.line - 1]
    path = _config(tmp_path, hidden_size=True)
    with pytest.raises(SpecError, match="hidden_size: expected an integer"):
        load_model_spec(path)


def test_hidden_not_a_multiple_of_heads_is_a_spec_error_with_line(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntraining: {global_batch: 8}\ntransformer:\n  layers: 2\n  hidden: 100\n  heads: 3\n"
                    "  sequence: 16\n  vocab: 50\n")
    with pytest.raises(SpecError) as info:
        load_model_spec(path)
    issue = info.value.issues[0]
    assert (issue.line, issue.path) == (6, "transformer.heads") and "not a multiple of heads 3" in issue.message
    path.write_text("name: m\ntraining: {global_batch: 8}\ntransformer: {layers: 2, hidden: 96, heads: 12, sequence: 16,"
                    " vocab: 50,\n  kv_heads: 5}\n")
    with pytest.raises(SpecError) as info:
        load_model_spec(path)
    assert (info.value.issues[0].line, info.value.issues[0].path) == (4, "transformer.kv_heads")


def test_training_yaml_beside_the_config():
    spec = load_model_spec(HF / "llama-3-8b-training.yaml")
    assert spec.transformer.sequence == 8192 and spec.training.global_batch == 512
    assert spec.training.tied_embeddings is False and spec.transformer.kv == 8
    bare = load_model_spec(HF / "llama-3-8b.json")
    assert bare.transformer.sequence == 4096                  # min(8192, 4096)
    assert bare.training.global_batch == 2**22 // 4096 and bare.training.recompute == "auto"


def test_training_yaml_errors(tmp_path):
    (tmp_path / "c.json").write_text((HF / "gpt2-xl.json").read_text())
    path = tmp_path / "m.yaml"
    path.write_text("hf_config: c.json\nsequence: 2048\ntraining: {global_batch: 8}\n")
    with pytest.raises(SpecError, match=r"m.yaml:2: sequence: 2048 tokens, but .* 1024 rows"):
        load_model_spec(path)
    path.write_text("hf_config: c.json\ntraining: {global_batch: 8, tied_embeddings: false}\n")
    with pytest.raises(SpecError, match=r"m.yaml:2: training.tied_embeddings: .*tie_word_embeddings: true"):
        load_model_spec(path)
    path.write_text("hf_config: nope.json\ntraining: {global_batch: 8}\n")
    with pytest.raises(SpecError, match=r"m.yaml:1: hf_config: no such file"):
        load_model_spec(path)
    path.write_text("name: x\nsequence: 8\ntransformer: {layers: 1, hidden: 8, heads: 2, sequence: 4, vocab: 9}\n"
                    "training: {global_batch: 8}\n")
    with pytest.raises(SpecError, match=r"m.yaml:2: sequence: 'sequence' goes with 'hf_config'"):
        load_model_spec(path)
    path.write_text("hf_config: c.json\ntraining: {global_batch: 8}\n")
    spec = load_model_spec(path)
    assert spec.name == "openai-community/gpt2-xl" and spec.training.tied_embeddings


def test_show_json_fields():
    r = run_cli("show", HF / "llama-3-70b.json", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["parameters"] == pytest.approx(70.6e9, rel=0.01)
    # forward FLOPs: about 2 per parameter per token (Kaplan et al. 2020) plus attention
    assert 2 * 70e9 * 4096 < data["flops_per_sample"] < 2 * 72e9 * 4096 + 4 * 4096**2 * 8192 * 80
    assert (data["kv_heads"], data["heads"], data["sequence"], data["tied_embeddings"]) == (8, 64, 4096, False)
    r = run_cli("show", ROOT / "specs" / "models" / "gpt3-175b.yaml", "--json")
    data = json.loads(r.stdout)
    assert data["parameters"] == pytest.approx(175e9, rel=0.01) and data["kind"] == "transformer"
    r = run_cli("show", ROOT / "specs" / "models" / "u-transformer.yaml", "--json")
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["kind"] == "layers" and data["parameters"] > 0 and data["flops_per_sample"] > 0
    r = run_cli("show", HF / "gpt2-xl.json")
    assert r.returncode == 0 and "1,557,611,200" in r.stdout and "yes" in r.stdout


def test_stages_runs_on_llama_3_8b():
    r = run_cli("stages", CLUSTER, HF / "llama-3-8b.json", "--json", "--no-baselines")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["iteration_time"] > 0
    r = run_cli("validate", CLUSTER, HF / "llama-3-8b-training.yaml")
    assert r.returncode == 0 and "34 layers" in r.stdout


def test_run_refuses_what_it_cannot_build():
    from solver_planner.run.model import model_shape

    spec = load_model_spec(HF / "llama-3-8b.json")
    with pytest.raises(OptionError) as info:
        model_shape(spec)
    for feature in ("grouped-query attention", "swiglu", "rotary", "rmsnorm", "without biases"):
        assert feature in str(info.value)
    gpt = load_model_spec(ROOT / "specs" / "models" / "gpt-tiny.yaml")
    assert model_shape(gpt).kind == "gpt"
    # one feature at a time is named too
    t = gpt.transformer.model_copy(update={"bias": "qkv"})
    with pytest.raises(OptionError, match="query, key and value only"):
        model_shape(gpt.model_copy(update={"transformer": t}))


_TYPES = ["llama", "mistral", "qwen2", "gpt2", "gpt_neox", "mixtral", "bert", None, 3]
_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
         "vocab_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions", "n_ctx", "n_inner",
         "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias", "num_local_experts", "num_experts"]
_VALUES = st.one_of(st.integers(-3, 70_000), st.sampled_from([0, 1, 2, 4, 8, 64, 4096, 2**40]), st.booleans(),
                    st.none(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
                    st.lists(st.integers(), max_size=2))


_BASES = {name: json.loads((HF / f"{name}.json").read_text()) for name in ("llama-3-8b", "gpt2-xl", "gpt-neox-20b")}
_LOADED = []


@given(st.sampled_from([None, *_BASES]), st.sampled_from(_TYPES),
       st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=4), st.lists(st.sampled_from(_KEYS), max_size=2))
@settings(max_examples=400, deadline=None)
def test_random_configs_load_or_give_a_spec_error(tmp_path_factory, base, model_type, values, dropped):
    """Published configs with a few keys changed or dropped, or random mappings."""
    data = dict(_BASES[base]) if base is not None else {"model_type": model_type}
    if base is None and model_type is None:
        del data["model_type"]
    data.update(values)
    for key in dropped:
        data.pop(key, None)
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(data))
    try:
        spec = load_model_spec(path)
    except SpecError as exc:
        assert str(exc).startswith(str(path))
        return
    t = spec.transformer
    assert t.hidden % t.heads == 0 and t.heads % t.kv == 0
    counts = transformer_counts(t, spec.training.tied_embeddings)
    assert counts.parameters > 0 and counts.flops_per_sample > 0
    assert len(layer_model(spec).layers) == t.layers + 2
    _LOADED.append(path)


def test_random_configs_loaded_some():
    """The property above met configs that load, not only refusals (runs after it)."""
    if not _LOADED:
        pytest.skip("run with test_random_configs_load_or_give_a_spec_error")
    assert len(_LOADED) >= 20


def test_hf_config_reader_needs_no_transformers():
    """The reader is the standard library's json: a config loads with transformers blocked."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['transformers'] = None\n"
            "from solver_planner.spec.model import load_model_spec\n"
            f"print(load_model_spec({str(HF / 'qwen2-7b.json')!r}).transformer.bias)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "qkv", r.stderr


def test_hf_config_fields_round_trip():
    hf = read_hf_config(HF / "gpt-neox-20b.json")
    assert (hf.model_type, hf.tied, hf.max_positions) == ("gpt_neox", False, 2048)
    t = hf.transformer(2048)
    assert dataclasses.asdict(transformer_counts(t, False))["block"] == 12 * 6144**2 + 13 * 6144
    assert re.fullmatch(r"EleutherAI/gpt-neox-20b", hf.name)


_FIELD_VALUES = {
    "kv_heads": st.one_of(st.integers(-1, 20), st.none()), "ffn_hidden": st.one_of(st.integers(0, 5000), st.none()),
    "activation": st.sampled_from(["gelu", "swiglu", "relu"]), "position": st.sampled_from(["learned", "rotary", 3]),
    "positions": st.one_of(st.integers(0, 300), st.none()), "norm": st.sampled_from(["layernorm", "rmsnorm", True]),
    "bias": st.sampled_from([True, False, "qkv", "kv", 2]),
}


@given(st.integers(1, 16), st.integers(1, 256), st.integers(1, 256),
       st.fixed_dictionaries({}, optional=_FIELD_VALUES))
@settings(max_examples=300, deadline=None)
def test_random_yaml_transformers_load_or_give_a_spec_error(heads, hidden, sequence, extra):
    import yaml

    doc = {"name": "m", "training": {"global_batch": 4},
           "transformer": {"layers": 2, "hidden": hidden, "heads": heads, "sequence": sequence, "vocab": 99, **extra}}
    try:
        spec = load_model_spec("m.yaml", yaml.safe_dump(doc))
    except SpecError as exc:
        assert exc.issues[0].file == "m.yaml" and exc.issues[0].path.startswith("transformer")
        return
    t = spec.transformer
    assert hidden % heads == 0 and heads % t.kv == 0 and t.position_rows in (0,) + (t.positions or sequence,)
    model = layer_model(spec)
    counts = transformer_counts(t, spec.training.tied_embeddings)
    assert sum(x.params for x in model.layers) / 2 + counts.final_norm == counts.parameters
    assert sum(x.forward for x in model.layers) == pytest.approx(counts.flops_per_sample)
    assert all(x.saved >= 0 and (x.selective_saved is None or x.selective_saved <= x.saved) for x in model.layers)


def test_a_one_token_context_gets_the_largest_accepted_batch(tmp_path):
    """Was (found by the random configs above): max_position_embeddings 1 asked for 2**22
    sequences, above the spec limit, and ended in a pydantic traceback."""
    data = dict(_BASES["llama-3-8b"], max_position_embeddings=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    spec = load_model_spec(path)
    assert spec.training.global_batch == 2**20


def test_the_readmes_show_transcript_is_what_show_prints():
    """Each line of the README's `show MODEL` transcript (but the `...` of rows left out) is a
    line the command prints, in that order; the gradient row says the reduction's type."""
    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    block = text[text.index("$ solver-planner show examples/hf/llama-3-8b.json"):].split("```")[0]
    shown = [" ".join(x.split()) for x in block.splitlines()[1:] if x.strip() and x.strip() != "..."]
    res = run_cli("show", "examples/hf/llama-3-8b.json", env={"COLUMNS": "300"})
    assert res.returncode == 0, res.stderr
    printed = [" ".join(x.split()) for x in res.stdout.splitlines()]
    at = [printed.index(x) for x in shown]
    assert at == sorted(at) and any("reduced during the backward in bfloat16" in x for x in shown)
    assert any("under --target megatron reduced in float32; accumulation fused" in x for x in shown)


def test_a_tied_layer_is_counted_once(tmp_path):
    """show's docstring says unique parameters, a layer tied_to another once: both were summed."""
    spec = tmp_path / "tied.yaml"
    spec.write_text("name: tied\nlayers:\n  - {name: a, flops: 1 GFLOP, params: 128 MiB, activations: 16 KiB}\n"
                    "  - {name: b, flops: 1 GFLOP, params: 128 MiB, activations: 16 KiB, tied_to: a}\n"
                    "training: {global_batch: 1, dtype: float16, optimizer: sgd}\n")
    data = json.loads(run_cli("show", spec, "--json").stdout)
    assert data["parameters"] == 128 * 2**20 // 2 and data["flops_per_sample"] == 2e9
