"""--target megatron: the search lists only what Megatron-LM runs, and says why it refuses."""

import json

from typer.testing import CliRunner

from solver_planner.cli import app
from solver_planner.targets.base import TargetConfig
from solver_planner.targets.megatron import allows

from conftest import CLUSTERS, SPECS

MODELS = SPECS / "models"


def _cfg(**kw) -> TargetConfig:
    base = dict(target="megatron", layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=49152, sequence=2048,
                vocab=51200, tied_embeddings=True, activation="gelu", global_batch=1536, micro_batch_size=1,
                dtype="bfloat16", optimizer="adam", data=16, tensor=8, pipeline=8, schedule="1f1b",
                layers_per_chunk=(12,) * 8, recompute="selective", optimizer_sharding="distributed")
    base.update(kw)
    return TargetConfig(**base)


def test_megatron_rules():
    assert allows(_cfg()) is None
    assert "not zb-h1" in allows(_cfg(schedule="zb-h1"))
    assert "distributed optimizer" in allows(_cfg(optimizer_sharding="zero-3"))
    assert "divide over tensor degree" in allows(_cfg(tensor=5))
    assert "same number of blocks" in allows(_cfg(layers_per_chunk=(12, 11, 13, 12, 12, 12, 12, 12)))
    assert allows(_cfg(layers_per_chunk=(10, 13, 13, 13, 13, 13, 13, 8))) is None
    assert "fewer blocks, not more" in allows(_cfg(layers_per_chunk=(14, 12, 12, 12, 12, 12, 12, 10)))
    assert "multiple of the pipeline" in allows(_cfg(schedule="interleaved-1f1b", virtual_stages=2,
                                                     layers_per_chunk=(6,) * 16, global_batch=1544, data=8))


def test_stages_target_megatron_lists_only_runnable_plans():
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"), str(MODELS / "gpt3-39b.yaml"),
                                   "--target", "megatron", "--top", "3", "--json", "--no-baselines"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["status"] == "OPTIMAL" and data["search"]["space"] == "megatron"
    for row in [data] + data.get("top", []):
        tensors = {s["tensor"] for s in row["stages"]}
        assert len(tensors) == 1
        assert row["schedule"].split("(")[0] in ("1f1b", "interleaved-1f1b")


def test_a_schedule_the_target_does_not_run_is_refused():
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"), str(MODELS / "gpt3-39b.yaml"),
                                   "--target", "megatron", "--schedule", "zb-v"])
    assert res.exit_code == 2 and "megatron does not run zb-v" in res.output


def test_the_readmes_megatron_answer_is_what_the_command_prints():
    """The README's GPT-3 175B / 1 024 A100s answer, rerun: the same five configurations."""
    import re
    import shlex

    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("$ solver-planner stages") and "--target megatron" in x)
    argv = shlex.split(line[2:])[1:]
    res = CliRunner().invoke(app, argv + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    block = text[text.index(line):].split("```")[0]
    rows = re.findall(r"^ (\d) +(\d+,\d+,\d+,\d+) ", block, flags=re.M)
    listed = [",".join(str(c["config"][k]) for k in ("data", "tensor", "pipeline", "microbatches"))
              for c in data["top"]]
    assert [r[1] for r in rows] == listed[:5]
