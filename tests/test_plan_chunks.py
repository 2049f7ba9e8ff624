"""Plans with model chunks (interleaved 1F1B, ZB-V) end to end: `plan` composes them, the
plan file records which pipeline stage runs each chunk, `check` re-derives them, the
pictures draw each chunk on its stage, and `run` says it does not execute them yet."""

import json

import pytest
import yaml

from conftest import CLUSTERS, run_cli
from solver_planner.errors import OptionError
from solver_planner.plan import make_plan
from solver_planner.plan.boundaries import directions
from solver_planner.plan.check import check_plan
from solver_planner.plan.planfile import plan_document
from solver_planner.report.pipeline import stage_bars
from solver_planner.spec import load_model_spec
from solver_planner.stages import simulate_schedule
from solver_planner.stages.memory import stage_memory
from solver_planner.stages.report import Config
from solver_planner.stages.schedule import Schedule, mesh_of
from solver_planner.topology import load_topology

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
GPT8 = {"name": "tiny-gpt-8", "transformer": {"layers": 8, "hidden": 256, "heads": 8, "sequence": 128, "vocab": 1000},
        "training": {"global_batch": 16, "microbatches": "auto", "dtype": "float16", "optimizer": "adam"}}


@pytest.fixture(scope="module")
def gpt8(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt8") / "gpt8.yaml"
    path.write_text(yaml.safe_dump(GPT8))
    return path, load_model_spec(path), load_topology(P3)


@pytest.mark.parametrize("kind", ["interleaved-1f1b", "zb-v"])
def test_a_chunked_plan_is_what_its_parts_say(gpt8, kind):
    """The plan's chunks sit where the schedule puts them, its boundaries are the channels
    that cross stages (none between two chunks of one stage), its memory per stage is what
    the stage's chunks hold, and its iteration is the simulation of its partition under its
    schedule with those boundaries."""
    _, spec, topo = gpt8
    plan = make_plan(topo, spec, kind, config=Config(1, 2, 4, 8))
    part = plan.partition
    assert part.virtual == 2 and plan.schedule == Schedule(kind, virtual=2)
    assert part.mesh == tuple(mesh_of(plan.schedule, 4, k) for k in range(8))
    assert [s.stage for s in plan.parts] == list(part.mesh)
    for s in plan.parts:
        size = part.costs.shape.size
        assert s.devices == tuple(range(s.stage * size, (s.stage + 1) * size))
    keys = sorted(b.key for b in plan.boundaries)
    assert keys == sorted(directions(part))
    assert all(part.mesh[b.src] != part.mesh[b.dst] for b in plan.boundaries)
    if kind == "zb-v":
        assert (3, 4) in part.channels and ("act", 3, 4) not in keys     # the V's turn: one stage
    transfers = {b.key: (b.time, b.ports) for b in plan.boundaries}
    again = simulate_schedule(part, plan.schedule, transfers)
    assert again.iteration_time == pytest.approx(plan.iteration_time, rel=1e-12)
    split = stage_memory(part, plan.run.peak_memory)
    assert len(split) == 4
    for m, parts in enumerate(split):
        assert sum(parts.values()) == pytest.approx(plan.run.peak_memory[m], rel=1e-9)
        held = [k for k in range(8) if part.mesh[k] == m]
        w = part.costs.static_split(part.stages[0].config)[0]
        assert parts["weights"] == pytest.approx(sum(float(w[part.stages[k].first, part.stages[k].last])
                                                     for k in held))


def test_pictures_label_each_chunk_on_its_stage(gpt8):
    _, spec, topo = gpt8
    plan = make_plan(topo, spec, "interleaved-1f1b", config=Config(1, 2, 4, 8))
    size = plan.partition.costs.shape.size
    bars = stage_bars(plan.run.timeline.records, size, 4, plan.iteration_time, merge=False, chunks=True)
    seen = set()
    for (row, kind), spans in bars.items():
        if kind != "forward":
            continue
        for _, _, label in spans:
            m, k = map(int, label.split("."))
            assert plan.partition.mesh[k] == row
            seen.add((m, k))
    assert seen == {(m, k) for m in range(8) for k in range(8)}


def test_plan_and_check_from_the_command_line(gpt8, tmp_path):
    path, _, _ = gpt8
    out = tmp_path / "plan.yaml"
    r = run_cli("plan", P3, path, "-s", "zb-v", "--config", "1,2,4,8", "-o", out, "--plot", tmp_path / "p.svg")
    assert r.returncode == 0, r.stderr
    assert "4 stages x 2 model chunks" in r.stdout and "stage (chunk)" in r.stdout
    assert (tmp_path / "p.svg").stat().st_size > 0
    doc = yaml.safe_load(out.read_text())
    assert doc["schedule"]["virtual"] == 2 and [s["pipeline_stage"] for s in doc["stages"]] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert doc["launch"]["stages"][0]["chunks"] == [doc["stages"][0]["layers"], doc["stages"][7]["layers"]]
    for rank in doc["launch"]["ranks"]:
        assert rank["chunks"] == doc["launch"]["stages"][rank["stage"]]["chunks"]
    r = run_cli("check", P3, path, out, "--json")
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["ok"] is True


def test_a_moved_chunk_is_refused(gpt8):
    """Chunks swapped between stages (a partition the simulator could run, but not the
    schedule's placement of chunks) and a chunk count that does not match."""
    _, spec, topo = gpt8
    doc = plan_document(make_plan(topo, spec, "interleaved-1f1b", config=Config(1, 2, 4, 8)))
    bad = json.loads(json.dumps(doc))
    bad["stages"][1]["pipeline_stage"] = 2
    f = check_plan(topo, spec, bad).first_failure
    assert f.path == "stages[1].pipeline_stage" and "runs chunk 1 on pipeline stage 1" in f.message
    bad = json.loads(json.dumps(doc))
    bad["schedule"]["virtual"] = 4
    f = check_plan(topo, spec, bad).first_failure
    assert f.path == "schedule.virtual" and "8 model chunks on 4 stages" in f.message
    bad = json.loads(json.dumps(doc))
    bad["schedule"]["virtual"] = 1
    f = check_plan(topo, spec, bad).first_failure
    assert f.path == "schedule.virtual"


def test_run_says_it_does_not_execute_chunks_yet(gpt8):
    from solver_planner.run.job import run_job

    _, spec, topo = gpt8
    plan = make_plan(topo, spec, "interleaved-1f1b", config=Config(1, 2, 4, 8))
    with pytest.raises(OptionError, match="2 model chunks per stage"):
        run_job(plan, spec)
