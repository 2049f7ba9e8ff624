"""`device.memory_reserved`: plans fit their tensors into the memory less the reserve, say
so, and a plan that leaves under 1 GiB free on a spec reserving nothing is warned about."""

import json

import pytest
import yaml

from conftest import CLUSTERS, run_cli
from solver_planner.errors import InfeasibleError, SpecError
from solver_planner.plan import make_plan
from solver_planner.plan.check import check_plan
from solver_planner.plan.planfile import plan_document
from solver_planner.spec import load_cluster_spec, load_model_spec
from solver_planner.stages.memory import HEADROOM, memory_warnings
from solver_planner.stages.report import Config, plan_stages
from solver_planner.topology import Topology

GiB = 2**30
MODEL = {"name": "tight", "layers": [{"name": "l", "repeat": 8, "flops": "40 GFLOP", "params": "150 MiB",
                                      "activations": "24 MiB", "allreduces": 1}],
         "training": {"global_batch": 64, "dtype": "float16", "optimizer": "adam"}}


def _cluster(tmp_path, memory: float, reserved: float | None, name: str = "c") -> Topology:
    data = yaml.safe_load((CLUSTERS / "aws-p3.8xlarge-2.yaml").read_text())
    data["device"]["memory"] = f"{memory / GiB:.6f} GiB"
    data["device"].pop("memory_reserved", None)
    if reserved is not None:
        data["device"]["memory_reserved"] = f"{reserved / GiB:.6f} GiB"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return Topology(load_cluster_spec(path)), path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tight.yaml"
    path.write_text(yaml.safe_dump(MODEL))
    return load_model_spec(path), path


def _peak(rep) -> float:
    return max(rep.run.peak_memory)


def test_the_reserve_is_never_planned_into_and_binds(tmp_path, model):
    """Differential: the best plan with no reserve on a device sized to leave it 0.5 GiB free;
    reserving 1 GiB on the same device, every plan listed fits under memory - 1 GiB, so the
    first plan is refused and the search pays for the room (never less than before)."""
    spec, _ = model
    big, _ = _cluster(tmp_path, 64 * GiB, None, "big")
    free_peak = _peak(plan_stages(big, spec, "1f1b", "auto", 10.0, 0))
    memory = free_peak + 0.5 * GiB
    bare, _ = _cluster(tmp_path, memory, None, "bare")
    kept, _ = _cluster(tmp_path, memory, 1 * GiB, "kept")
    first = plan_stages(bare, spec, "1f1b", "auto", 10.0, 0, top=3)
    assert _peak(first) == pytest.approx(free_peak)
    assert first.warnings and "leaves 0.50 GiB" in first.warnings[0]
    reserved = plan_stages(kept, spec, "1f1b", "auto", 10.0, 0, top=3)
    assert reserved.warnings == []                 # the spec said how much the rest takes
    for cand in reserved.result.solutions:
        assert max(cand.run.peak_memory) <= memory - GiB
    assert reserved.best.time >= first.best.time
    data = reserved.as_dict()
    assert data["device_memory"] == pytest.approx(memory - GiB) and data["memory_reserved"] == GiB


def test_the_shortfall_names_the_reserve(tmp_path, model):
    spec, _ = model
    topo, _ = _cluster(tmp_path, 2 * GiB, 1.5 * GiB)
    with pytest.raises(InfeasibleError) as err:
        plan_stages(topo, spec, "1f1b", "auto", 10.0, 0)
    text = str(err.value)
    assert "0.50 GiB (2.00 GiB less device.memory_reserved 1.50 GiB)" in text
    short = float(text.split(" GiB short")[0].rsplit(" ", 1)[1])
    need = float(text.split("needs ")[1].split(" GiB")[0])
    assert short == pytest.approx(need - 0.5, abs=0.011)


@pytest.mark.parametrize("reserved", ["16 GiB", "20 GiB", "-1 GiB"])
def test_a_reserve_not_below_the_memory_is_refused_at_its_line(tmp_path, reserved):
    text = (CLUSTERS / "aws-p3.8xlarge-2.yaml").read_text()
    assert "memory_reserved: 1 GiB" in text
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("memory_reserved: 1 GiB", f"memory_reserved: {reserved}"))
    with pytest.raises(SpecError) as err:
        load_cluster_spec(path)
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "memory_reserved" in s)
    assert f"c.yaml:{line}" in str(err.value) and "memory_reserved" in str(err.value)


def test_the_warning_fires_exactly_under_a_gib_free_without_a_reserve(tmp_path):
    topo, _ = _cluster(tmp_path, 16 * GiB, None)
    dev = topo.device
    assert memory_warnings(dev, [GiB, 16 * GiB - HEADROOM]) == []
    # the largest stage's peak decides
    (note,) = memory_warnings(dev, [GiB, 15.5 * GiB, 2 * GiB])
    assert "peak, 15.50 GiB a device, leaves 0.50 GiB of its 16.00 GiB" in note
    kept, _ = _cluster(tmp_path, 16 * GiB, 0.25 * GiB, "kept")
    assert memory_warnings(kept.device, [15.5 * GiB]) == []


def test_plan_file_records_the_reserve_and_check_refuses_its_edits(tmp_path, model):
    """The plan of a device left 0.5 GiB free carries its warning; editing the reserve, the
    budget or the warning is refused by `check` (the fields are re-derived)."""
    spec, _ = model
    big, _ = _cluster(tmp_path, 64 * GiB, None, "big")
    cfg = Config(2, 1, 4, 8)
    peak = max(make_plan(big, spec, "1f1b", config=cfg).run.peak_memory)
    topo, _ = _cluster(tmp_path, peak + 0.5 * GiB, None)
    doc = plan_document(make_plan(topo, spec, "1f1b", config=cfg))
    assert doc["memory_reserved"] == 0 and doc["device_memory"] == topo.device.memory
    assert len(doc["warnings"]) == 1
    assert check_plan(topo, spec, doc).exit_code == 0
    for key, value in [("memory_reserved", GiB), ("device_memory", doc["device_memory"] * 1.001), ("warnings", [])]:
        edited = json.loads(json.dumps(doc))
        edited[key] = value
        rep = check_plan(topo, spec, edited)
        assert rep.exit_code == 1 and key in rep.first_failure.path, (key, rep.as_dict())


def test_cli_prints_the_warning_and_json_carries_it(tmp_path, model):
    spec, model_path = model
    big, _ = _cluster(tmp_path, 64 * GiB, None, "big")
    peak = _peak(plan_stages(big, spec, "1f1b", "auto", 10.0, 0))
    _, path = _cluster(tmp_path, peak + 0.5 * GiB, None)
    res = run_cli("stages", path, model_path, "--no-baselines")
    assert res.returncode == 0 and "warning: the plan's peak" in res.stderr, res.stderr
    res = run_cli("stages", path, model_path, "--no-baselines", "--json")
    assert res.returncode == 0 and "warning" not in res.stderr
    assert "leaves 0.50 GiB" in json.loads(res.stdout)["warnings"][0]
    _, kept = _cluster(tmp_path, peak + 0.5 * GiB, 0.75 * GiB, "kept")
    res = run_cli("show", kept)
    assert "of it reserved" in res.stdout


@pytest.mark.slow
def test_the_readme_figures_of_the_main_plan_with_and_without_the_reserve(tmp_path):
    import re

    from conftest import ROOT
    from solver_planner import api

    text = " ".join((ROOT / "README.md").read_text().split())
    free, t0, t1, kept = re.search(r"peaked at ([\d.]+) GiB without a reserve \(([\d.]+) s; with it, ([\d.]+) s at"
                                   r" ([\d.]+) GiB\)", text).groups()
    model = ROOT / "specs" / "models" / "gpt3-2.6b.yaml"
    cluster = CLUSTERS / "aws-p3.8xlarge-2.yaml"
    bare = tmp_path / "bare.yaml"
    bare.write_text("".join(line for line in cluster.read_text().splitlines(True) if "memory_reserved" not in line))
    for path, (seconds, peak) in [(bare, (t0, free)), (cluster, (t1, kept))]:
        # the plan's stages are the stage search's (eager-1F1B, plan's default schedule)
        rep = api.stages(path, model, schedule="eager-1f1b", baselines=False)
        assert (f"{rep.run.iteration_time:.1f}", f"{max(rep.run.peak_memory) / GiB:.2f}") == (seconds, peak), path
