"""Plans on part of a cluster: the stage search uses the most devices equal meshes can tile
(at most --devices), leaves the rest idle and says how many and why (issue: frontier scale)."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from conftest import CLUSTERS, SPECS, run_cli
from solver_planner.errors import InfeasibleError, OptionError
from solver_planner.spec import load_model_spec
from solver_planner.spec.cluster import ClusterSpec
from solver_planner.stages import StageSearch
from solver_planner.stages.devices import choose_devices
from solver_planner.stages.layers import layer_model
from solver_planner.subcluster import device_counts, first_devices, representable
from solver_planner.topology import Topology, load_topology

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"


@pytest.fixture
def p3_whole(tmp_path):
    """The cluster with all of its 16 GiB plannable (no memory_reserved): the U-transformer's
    3-stage plans need 15.7 GiB a device."""
    path = tmp_path / "p3-whole.yaml"
    path.write_text("".join(line for line in P3.read_text().splitlines(True) if "memory_reserved" not in line))
    return path


def _grown(path, **counts) -> Topology:
    """The cluster of ``path`` with some level counts changed."""
    topo = load_topology(path)
    levels = [lv.model_copy(update={"count": counts.get(lv.name, lv.count)}) for lv in topo.spec.levels]
    return Topology(topo.spec.model_copy(update={"levels": levels}))


def _model(tmp_path, layers: int, batch: int):
    doc = {"name": f"m{layers}-{batch}", "training": {"global_batch": batch, "dtype": "float16", "optimizer": "sgd"},
           "layers": [{"name": "l", "repeat": layers, "flops": "1 GFLOP", "params": "1 MiB", "activations": "1 MiB"}]}
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, load_model_spec(path)


def test_the_first_devices_are_a_cluster_of_the_same_levels_and_numbers():
    topo = _grown(CLUSTERS / "dgx-a100-128x8.yaml", node=5)
    assert device_counts(topo) == [40, 32, 24, 16, 8, 7, 6, 5, 4, 3, 2, 1]
    sub = first_devices(topo, 24)
    assert (sub.num_hosts, sub.devices_per_host) == (3, 8)
    # the same devices: coordinates, hosts and routes of the first 24 agree
    for a, b in [(0, 23), (7, 8), (9, 17)]:
        assert sub.coords(a) == topo.coords(a) and sub.host(b) == topo.host(b)
        assert sub.route(a, b).bandwidth == topo.route(a, b).bandwidth
    one = first_devices(topo, 6)
    assert (one.num_hosts, one.devices_per_host) == (1, 6)
    assert not representable(topo, 12)
    with pytest.raises(OptionError, match="not a whole part"):
        first_devices(topo, 12)


def test_a_hundred_thousand_gpus_get_a_plan_count_with_the_reason():
    """GPT-3 175B: a global batch of 1 536 splits over at most 32 replicas of a count that
    divides 100 000, so no plan tiles the whole cluster (the search said 'not possible')."""
    topo = _grown(CLUSTERS / "dgx-a100-128x8.yaml", node=12_500)
    lm = layer_model(load_model_spec(SPECS / "models" / "gpt3-175b.yaml"))
    use = choose_devices(topo, lm)
    assert (use.devices, use.used, use.idle) == (100_000, 99_840, 160)
    assert "no plan of equal meshes uses 99,841 to 100,000 devices" in use.reason
    # the count has a (mesh, micro-batch) pair, as the search builds them
    assert 99_840 % 8 == 0 and 12_480 == 65 * 192 and (1536 // 8) % 192 == 0
    assert choose_devices(topo, lm, cap=1024).used == 1024
    assert choose_devices(topo, lm, cap=1030).reason.startswith("--devices 1,030 leaves 98,970 out; no plan")


@settings(max_examples=25, deadline=None)
@given(hosts=st.integers(1, 6), per_host=st.sampled_from([1, 2, 3, 4, 8]), layers=st.integers(1, 7),
       batch=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), stages=st.one_of(st.none(), st.integers(1, 5)),
       cap=st.integers(1, 48))
def test_the_arithmetic_agrees_with_the_searchs_own_pairs(tmp_path_factory, hosts, per_host, layers, batch, stages,
                                                         cap):
    """Differential: the count chosen is the largest whole part, at most the cap, on which
    the stage search itself builds a (mesh, micro-batch) pair (memory aside)."""
    topo = _grown(CLUSTERS / "dgx-a100-128x8.yaml", node=hosts, gpu=per_host)
    _, spec = _model(tmp_path_factory.mktemp("m"), layers, batch)
    lm = layer_model(spec)
    cap = min(cap, topo.num_devices)

    def has_pair(count: int) -> bool:
        return bool(StageSearch(lm, first_devices(topo, count), "1f1b", stages=stages).pairs())

    want = next((c for c in device_counts(topo, cap) if has_pair(c)), None)
    if want is None:
        with pytest.raises(InfeasibleError, match="not possible on any part|stages need at least"):
            choose_devices(topo, lm, cap, stages=stages)
    else:
        assert choose_devices(topo, lm, cap, stages=stages).used == want


def test_stages_reports_the_idle_devices_and_check_takes_the_plan(tmp_path, p3_whole):
    res = run_cli("stages", p3_whole, SPECS / "models" / "u-transformer.yaml", "--stages", "3", "--no-baselines", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["devices"] == {"devices": 8, "used": 3, "idle": 5, "reason": data["devices"]["reason"]}
    assert "no plan of 3 equal meshes uses 4 to 8 devices" in data["devices"]["reason"]
    assert data["config"]["pipeline"] == 3 and data["stages"][-1]["devices"] == [2, 2]
    text = run_cli("stages", p3_whole, SPECS / "models" / "u-transformer.yaml", "--stages", "3", "--no-baselines")
    assert "devices: 3 of 8 used, 5 idle: no plan of 3 equal meshes" in " ".join(text.stdout.split())


def test_devices_out_of_range_is_an_option_error_and_no_plan_at_all_exits_1(tmp_path, p3_whole):
    res = run_cli("stages", P3, SPECS / "models" / "u-transformer.yaml", "--devices", "9", "--no-baselines")
    assert res.returncode == 2 and "has 8 devices" in res.stderr
    res = run_cli("stages", P3, SPECS / "models" / "u-transformer.yaml", "--stages", "9", "--no-baselines")
    assert res.returncode == 1 and "9 stages need at least 9 devices; 'aws-p3.8xlarge-2' has 8" in res.stderr
    path, _ = _model(tmp_path, 1, 1)
    res = run_cli("stages", P3, path, "--stages", "2", "--no-baselines")
    assert res.returncode == 1 and "2 stages: not possible on any part of 'aws-p3.8xlarge-2'" in res.stderr
    # a configuration that uses fewer devices than the cluster runs on its first ones
    res = run_cli("stages", p3_whole, SPECS / "models" / "u-transformer.yaml", "--config", "1,1,3,2048", "--no-baselines",
                  "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["devices"]["reason"] == "the configuration uses 3"


def test_plan_on_part_of_a_cluster_checks_and_launches_on_its_devices(tmp_path):
    path, _ = _model(tmp_path, 6, 16)
    out = tmp_path / "plan.yaml"
    report = tmp_path / "plan.html"
    res = run_cli("plan", P3, path, "-s", "1f1b", "--devices", "5", "-o", out, "--report", report)
    assert res.returncode == 0, res.stderr
    assert "Devices: the first 4 of 8 (MFU over them); 4 idle: --devices 5 leaves 3 out" in report.read_text()
    doc = yaml.safe_load(out.read_text())
    assert doc["devices"] == 8 and doc["idle"]["used"] == 4 and doc["search"]["options"]["devices"] == 5
    assert doc["launch"]["world_size"] == 4
    assert sorted(r["rank"] for r in doc["launch"]["ranks"]) == [0, 1, 2, 3]
    assert run_cli("check", P3, path, out).returncode == 0


def test_the_python_api_takes_a_device_cap():
    from solver_planner import api as sp

    rep = sp.stages(P3, SPECS / "models" / "u-transformer.yaml", devices=4)
    assert (rep.use.used, rep.use.idle, rep.topology.num_devices) == (4, 4, 4)
    assert rep.use.reason == "--devices 4 leaves 4 out"
    assert max(st["devices"][1] for st in rep.as_dict()["stages"]) <= 3


def test_the_count_has_a_plan_in_the_space_searched(tmp_path):
    """A chunked schedule or a framework target narrows the space (equal splits, chunks per
    stage): the count chosen is one with a plan there, not only with a (mesh, micro-batch)
    pair (was: exit 1 on 20 devices where 16 have a plan)."""
    model = tmp_path / "gpt-tiny4.yaml"
    model.write_text("name: gpt-tiny4\ntransformer: {layers: 4, hidden: 64, heads: 4, sequence: 16, vocab: 256}\n"
                     "training: {global_batch: 16, microbatches: auto, dtype: float32, optimizer: adam}\n")
    p3x5 = CLUSTERS / "aws-p3.8xlarge-5.yaml"
    res = run_cli("stages", p3x5, model, "-s", "interleaved-1f1b", "--no-baselines", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["devices"]["used"] == 16 and "interleaved-1f1b" in data["devices"]["reason"]
    assert data["virtual_stages"] >= 2
    # 1F1B tiles all 20 (5 stages of one host): the rule is the schedule's, not the model's
    assert json.loads(run_cli("stages", p3x5, model, "--no-baselines", "--json").stdout)["devices"]["idle"] == 0


def test_a_framework_targets_count_follows_its_layer_splits():
    """Megatron-LM shares GPT-3 175B's 96 blocks out equally: 65 stages (the most devices
    equal meshes tile on 100 000 GPUs) is not one of its plans; 48 stages of 256 nodes are."""
    from solver_planner.stages.report import device_use
    from solver_planner.targets.search import restriction

    topo = _grown(CLUSTERS / "dgx-a100-128x8.yaml", node=12_500)
    spec = load_model_spec(SPECS / "models" / "gpt3-175b-megatron.yaml")
    lm = layer_model(spec)
    assert device_use(topo, lm).used == 99_840
    use = device_use(topo, lm, restrict=restriction("megatron", spec, "1f1b"))
    assert use.used == 98_304 and "megatron space" in use.reason


@pytest.mark.parametrize("schedule", ["1f1b", "eager-1f1b"])
def test_a_shortfall_on_part_of_the_cluster_says_which_part(schedule):
    from solver_planner import api as sp

    with pytest.raises(InfeasibleError, match=r"GiB short \(on the first 4 of 8 devices: --devices 4 leaves 4 out\)"):
        sp.stages(P3, SPECS / "models" / "gpt3-6.7b.yaml", schedule=schedule, devices=4)


@settings(max_examples=20, deadline=None)
@given(hosts=st.integers(1, 5), per_host=st.sampled_from([1, 2, 4, 8]), layers=st.integers(1, 9),
       batch=st.sampled_from([1, 2, 4, 8, 16]), schedule=st.sampled_from(["interleaved-1f1b", "zb-v"]),
       cap=st.integers(1, 40))
def test_a_chunked_schedules_count_agrees_with_its_own_plans(tmp_path_factory, hosts, per_host, layers, batch,
                                                             schedule, cap):
    """Differential: with a chunked schedule, the count chosen is the largest whole part on
    which the uniform search enumerates some plan (memory aside)."""
    from solver_planner.stages.report import device_use
    from solver_planner.stages.uniform import uniform_plans

    topo = _grown(CLUSTERS / "dgx-a100-128x8.yaml", node=hosts, gpu=per_host)
    _, spec = _model(tmp_path_factory.mktemp("m"), layers, batch)
    lm = layer_model(spec)
    cap = min(cap, topo.num_devices)

    def has_plan(count: int) -> bool:
        search = StageSearch(lm, first_devices(topo, count), schedule)
        return any(next(uniform_plans(p, [schedule]), None) is not None for p in search.pairs())

    want = next((c for c in device_counts(topo, cap) if has_plan(c)), None)
    if want is None:
        with pytest.raises(InfeasibleError, match="not possible on any part"):
            device_use(topo, lm, cap, schedule=schedule)
    else:
        assert device_use(topo, lm, cap, schedule=schedule).used == want


def test_titles_say_which_part_of_the_cluster_a_plan_uses():
    from solver_planner.stages.devices import DeviceUse

    assert DeviceUse(100_000, 99_840, "why").part == " (first 99,840 of 100,000 devices)"
    assert DeviceUse(8, 8).part == ""
