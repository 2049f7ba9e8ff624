"""The scripting API reaches the framework targets as the commands do: api.stages(target=),
api.plan(target=, export=)."""

from __future__ import annotations

import pytest

from solver_planner import api
from solver_planner.errors import OptionError

from conftest import CLUSTERS

TINY = ("name: gpt-tiny\ntransformer: {layers: 6, hidden: 64, heads: 4, sequence: 16, vocab: 256}\n"
        "training: {global_batch: 16, dtype: float32, sequence_parallel: true, tensor_overlap: true}\n")


def test_plan_with_a_target_writes_the_export_the_plan_file_records(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    cluster = CLUSTERS / "local-2x4.yaml"
    out, export = tmp_path / "plan.yaml", tmp_path / "megatron.sh"
    p = api.plan(cluster, model, target="megatron", config="2,2,2,4", output=out, export=export)
    import yaml
    doc = yaml.safe_load(out.read_text())
    assert export.read_text() == doc["target"]["export"] and "--tp-comm-overlap" in export.read_text()
    assert p.search["options"]["target"] == "megatron"
    assert api.check(cluster, model, out).exit_code == 0
    # the same search as the stages call under the target
    rep = api.stages(cluster, model, schedule=p.family, config="2,2,2,4", target="megatron")
    assert rep.result.status.value == "OPTIMAL"


def test_the_api_refuses_what_the_command_refuses(tmp_path):
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    cluster = CLUSTERS / "local-2x4.yaml"
    with pytest.raises(OptionError, match="give target megatron"):
        api.plan(cluster, model, export=tmp_path / "x.sh")
    with pytest.raises(OptionError, match="did you mean 'megatron'"):
        api.stages(cluster, model, target="megatrn")
    with pytest.raises(OptionError, match="did you mean 'megatron'"):
        api.plan(cluster, model, target="megatrn")


def test_the_readmes_api_table_names_real_keywords_and_defaults():
    import inspect
    import re

    from conftest import ROOT

    section = (ROOT / "README.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)\((.*?)\)` \|", section, flags=re.M)
    assert {name for name, _ in rows} >= {"stages", "plan", "check", "verify"}
    for name, args in rows:
        params = inspect.signature(getattr(api, name)).parameters
        for key, default in re.findall(r"(\w+)=([^,]+)", args):
            assert key in params, (name, key)
            assert repr(params[key].default) == default.replace('"', "'"), (name, key, default)


def test_run_says_a_target_plans_prediction_is_the_frameworks(tmp_path):
    """run executes a --target plan on torch.distributed, while its prediction prices the
    framework's own runtime (Megatron-Core's buckets): the job's notes say so."""
    from solver_planner.run.job import run_job
    from solver_planner.spec import load_model_spec

    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    cluster = CLUSTERS / "local-2x4.yaml"
    for target in ("megatron", "native"):
        p = api.plan(cluster, model, target=target, config="2,2,2,4", schedule="1f1b")
        job = run_job(p, load_model_spec(model), steps=1)
        said = [n for n in job.notes if n.startswith("planned for")]
        assert said == (["planned for megatron: the prediction prices megatron's own runtime (its gradient buckets"
                         " and defaults); run executes the plan's stages and programs on torch.distributed"]
                        if target == "megatron" else [])


def test_plan_takes_the_stage_searchs_limits_and_meshes_and_records_them(tmp_path):
    """api.plan passes budget, simulations, gap and meshes on as plan does (--budget,
    --sim-budget, --gap, --meshes); the plan file records them and check searches the same
    way, so a plan that the limits cut short still checks."""
    import yaml

    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    cluster = CLUSTERS / "local-2x4.yaml"
    out = tmp_path / "plan.yaml"
    p = api.plan(cluster, model, budget=3, simulations=5000, gap=0.05, output=out)
    opts = yaml.safe_load(out.read_text())["search"]["options"]
    assert (opts["budget"], opts["simulations"], opts["gap"]) == (3, 5000, 0.05)
    assert p.family == "eager-1f1b"                 # the default, as the command's
    assert api.check(cluster, model, out).exit_code == 0
    u = api.plan(cluster, model, meshes="unequal", schedule="1f1b", output=out)
    assert yaml.safe_load(out.read_text())["search"]["options"]["meshes"] == "unequal"
    assert u.iteration_time > 0 and api.check(cluster, model, out).exit_code == 0
