"""What --config, a framework target and a chunked schedule refuse, and why: the reason the
plan cannot run, never a traceback or a shortfall that is not one (a fresh-clone user check
found each of these)."""

from __future__ import annotations

import json
import re
import math
from dataclasses import replace

from typer.testing import CliRunner

from solver_planner.cli import app
from solver_planner.spec import load_model_spec
from solver_planner.stages.costs import MeshShape, StageCosts
from solver_planner.stages.enumerate import balanced_greedy
from solver_planner.stages.layers import layer_model
from solver_planner.stages.objective import peak_memory
from solver_planner.stages.pipeline import simulate_schedule
from solver_planner.stages.problem import PairProblem
from solver_planner.stages.schedule import family
from solver_planner.stages.search import StageSearch
from solver_planner.stages.uniform import uniform_plans
from solver_planner.topology import load_topology

from conftest import CLUSTERS, SPECS

MODELS = SPECS / "models" if (SPECS / "models").exists() else SPECS


def run(*argv: str):
    return CliRunner().invoke(app, [str(a) for a in argv])


def test_a_tensor_degree_must_split_the_heads():
    """32 heads do not split over 3 devices: no configuration of a 1x3 mesh has t = 3 (the
    per-operator model and every framework split the heads), and --config asking for it is
    refused with that reason."""
    model = layer_model(load_model_spec(MODELS / "gpt3-2.6b.yaml"))
    assert model.tensor_refusal(3) == "heads 32 not divisible by tensor 3"
    assert model.tensor_refusal(8) is None
    topo = load_topology(CLUSTERS / "dgx-a100-8x8.yaml")
    search = StageSearch(model, topo)
    tables = search.tables(MeshShape(1, 3))
    assert 3 not in {c.tensor for c in StageCosts(model, topo, MeshShape(1, 3), 1024, tables).configs}
    # the same layers told nothing about their heads (a 'layers:' list) take t = 3
    anything = replace(model, tensor_splits=())
    assert 3 in {c.tensor for c in StageCosts(anything, topo, MeshShape(1, 3), 1024, tables).configs}
    res = run("stages", CLUSTERS / "dgx-a100-8x8.yaml", MODELS / "gpt3-2.6b.yaml", "--config", "1,3,1,1024", "--json")
    assert res.exit_code == 1
    assert "heads 32 not divisible by tensor 3" in json.loads(res.stdout)["error"]["message"]


def test_a_target_with_a_fixed_configuration_keeps_its_rules(tmp_path):
    """--config with --target: the framework's rules still apply (they were dropped, and
    `plan` then failed with a traceback when it exported the plan).  Megatron-LM has no
    ZeRO-3, which the native search runs."""
    spec = tmp_path / "zero3.yaml"
    spec.write_text((MODELS / "gpt3-2.6b.yaml").read_text().replace(
        "optimizer: adam}", "optimizer: adam, optimizer_sharding: zero-3}"))
    cluster = CLUSTERS / "dgx-a100-8x8.yaml"
    assert run("stages", cluster, spec, "--config", "8,1,1,64", "--no-baselines").exit_code == 0
    for command in (["stages", cluster, spec, "--config", "8,1,1,64", "--target", "megatron"],
                    ["plan", cluster, spec, "--config", "8,1,1,64", "--target", "megatron", "-o", tmp_path / "p.yaml"]):
        res = run(*command)
        assert res.exit_code == 1, res.output
        assert "zero-3" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p.yaml").exists()


def test_a_chunked_schedules_shortfall_is_its_own_plans():
    """Interleaved 1F1B on GPT-3 2.6B over 8 V100s: every uniform plan needs more than the
    16 GiB; the refusal names the least any of them needs (enumerated here), not the 1F1B
    plan (which fits, and gave a negative shortfall)."""
    cluster, spec = CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml"
    res = run("stages", cluster, spec, "--config", "1,1,8,512", "-s", "interleaved-1f1b", "--json")
    assert res.exit_code == 1
    message = json.loads(res.stdout)["error"]["message"]
    assert "-" not in message.split("GiB per device, ")[1].split(" GiB short")[0]
    model = layer_model(load_model_spec(spec))
    topo = load_topology(cluster)
    search = StageSearch(model, topo, "interleaved-1f1b", shapes=[MeshShape(1, 1)], microbatches=[512])
    costs = StageCosts(model, topo, MeshShape(1, 1), 512, search.tables(MeshShape(1, 1)))
    pair = PairProblem(costs, family("1f1b", costs.stages))
    plans = list(uniform_plans(pair, ["interleaved-1f1b"]))
    least = min(peak_memory(plan, s) for plan, s in plans)
    assert least > topo.device.budget
    # the peak as the simulator counts it, on every plan of the space
    for plan, s in plans:
        assert math.isclose(max(simulate_schedule(plan, s).peak_memory), peak_memory(plan, s), rel_tol=1e-12)
    # without model chunks the peak comes from the schedule's live counts, the simulator's
    # from its op orders: every member of the eager-1F1B family (weight delaying included)
    one = pair.plan(balanced_greedy(pair))
    for s in family("eager-1f1b", costs.stages):
        assert math.isclose(max(simulate_schedule(one, s).peak_memory), peak_memory(one, s), rel_tol=1e-12), s
    assert f"needs {least / 2**30:.2f} GiB per device, {(least - topo.device.budget) / 2**30:.2f} GiB short" in message
    assert math.isfinite(least)


def test_unequal_meshes_give_the_equal_searchs_reason_and_name_its_space():
    """--meshes unequal: a stage count no plan can have is refused with that reason (not as
    if nothing fitted); under eager-1F1B the 1F1B plan it is compared with is named as the
    equal-mesh one it is."""
    cluster, spec = CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml"
    res = run("stages", cluster, spec, "--meshes", "unequal", "--stages", "40")
    assert res.exit_code == 1
    assert "40 stages need at least 40 devices" in res.output and "fits" not in res.output
    res = run("stages", cluster, spec, "--meshes", "unequal", "-s", "eager-1f1b", "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["best_1f1b"]["meshes"] == "equal"
    res = run("stages", cluster, spec, "--meshes", "unequal", "-s", "eager-1f1b")
    assert "best 1F1B plan on equal meshes" in res.output


def test_a_mistyped_target_lists_every_target_the_option_takes():
    res = run("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml", "--target", "megatrn")
    assert res.exit_code == 2
    assert "native, torchtitan, megatron, deepspeed" in res.output and "did you mean 'megatron'" in res.output


def test_checks_json_error_names_the_plan_files_line(tmp_path):
    """A plan file refused as one (a key said twice) gives its file and line in --json's
    error object, as a spec error does."""
    path = tmp_path / "dup.yaml"
    path.write_text("format: solver-planner-plan\nversion: 4\niteration_time: 1.0\niteration_time: 2.0\n")
    res = run("check", CLUSTERS / "local-2x4.yaml", MODELS / "gpt-tiny.yaml", path, "--json")
    assert res.exit_code == 2
    error = json.loads(res.stdout)["error"]
    assert (error["file"], error["line"]) == (str(path), 4) and "appears twice" in error["message"]


def test_check_names_a_global_batch_the_model_no_longer_has(tmp_path):
    """A model spec whose global batch was edited after planning: check says the plan's
    micro-batches make another global batch, not a later consequence of it."""
    from solver_planner import api

    cluster = CLUSTERS / "local-2x4.yaml"
    plan = tmp_path / "plan.yaml"
    api.plan(cluster, MODELS / "gpt-tiny.yaml", output=plan)
    edited = tmp_path / "gpt-tiny.yaml"
    edited.write_text((MODELS / "gpt-tiny.yaml").read_text().replace("global_batch: 16", "global_batch: 8"))
    res = run("check", cluster, edited, plan)
    assert res.exit_code == 1
    assert "make a global batch of 16; the model's is 8" in res.output


def test_devices_are_chosen_among_tensor_degrees_that_split_the_heads(tmp_path):
    """3 heads and one sample per iteration on 8 devices: no tensor degree above 1 splits
    the heads and no data degree above 1 splits the sample, so equal meshes of 1 device on
    4 stages (one per layer) is the plan: the choice of devices applies the heads rule as the
    search does (it chose 8 and then found nothing)."""
    spec = tmp_path / "m3.yaml"
    spec.write_text("name: m3\ntransformer: {layers: 2, hidden: 48, heads: 3, sequence: 16, vocab: 256}\n"
                    "training: {global_batch: 1, microbatches: auto, dtype: float32, optimizer: adam}\n")
    res = run("stages", CLUSTERS / "local-2x4.yaml", spec, "--no-baselines", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["devices"]["used"] == 4 and {s["tensor"] for s in doc["stages"]} == {1}


def test_an_edited_microbatch_size_leaves_the_other_parts_checked(tmp_path):
    import yaml

    from solver_planner import api

    cluster, model = CLUSTERS / "local-2x4.yaml", MODELS / "gpt-tiny.yaml"
    plan = tmp_path / "plan.yaml"
    api.plan(cluster, model, output=plan)
    doc = yaml.safe_load(plan.read_text())
    doc["microbatch_size"] += 1
    doc["launch"]["ranks"][3]["tensor"] = 5
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run("check", cluster, model, plan, "--json")
    paths = [f["path"] for f in json.loads(res.stdout)["findings"] if f["status"] == "fail"]
    assert "microbatch_size" in paths and "launch.ranks[3].tensor" in paths


def test_a_split_and_a_config_that_disagree_on_the_stage_count_are_refused_as_options():
    """--config d,t,p,k with a --split of another length was refused as 'no plan: not
    possible' (exit 1), where --stages and --split get the option error (exit 2)."""
    cluster, spec = CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml"
    for extra in (["--config", "2,1,4,512"], ["-s", "interleaved-1f1b", "--config", "1,2,4,8"]):
        res = run("stages", cluster, spec, *extra, "--split", "12,11,11")
        assert res.exit_code == 2 and f"--split has 3 stages, --config {extra[-1]} says 4" in res.output, res.output
    res = run("stages", cluster, spec, "--stages", "4", "--split", "12,11,11")
    assert res.exit_code == 2 and "--split has 3 stages, --stages says 4" in res.output


def test_a_shortfall_under_a_hundredth_of_a_gib_is_said_in_its_own_unit(tmp_path):
    """`memory: 80` (bytes: a unit left out) was refused with "needs 0.00 GiB per device,
    0.00 GiB short": the sizes are said in the unit that shows them."""
    spec = (CLUSTERS / "local-2x4.yaml").read_text()
    assert "memory: 2.943 GiB" in spec
    cluster = tmp_path / "c.yaml"
    cluster.write_text(spec.replace("memory: 2.943 GiB", "memory: 80"))
    res = run("plan", cluster, MODELS / "gpt-tiny.yaml")
    assert res.exit_code == 1
    assert "fits in device memory (80 B)" in res.output and "0.00 GiB" not in res.output
    assert re.search(r"needs \d+(\.\d+)? KiB per device, \d+(\.\d+)? KiB short", res.output), res.output
