"""A plan file is a certificate: `check` re-derives every field it holds, refuses every edit
that changes what the file says, and names the field it refuses."""

import copy
import json
import random
import re

import pytest
import yaml

from conftest import CLUSTERS, run_cli
from plan_mutations import leaf_edits, names, structure_edits
from solver_planner.plan import make_plan
from solver_planner.plan import check as check_module
from solver_planner.plan.check import check_plan
from solver_planner.plan.launch import launch_problems
from solver_planner.plan.planfile import VERSION, PlanFileError, plan_document, read_plan, write_document
from solver_planner.spec import load_model_spec
from solver_planner.stages.report import Config
from solver_planner.topology import load_topology

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
P3X4 = CLUSTERS / "aws-p3.8xlarge-4.yaml"
TINY_GPT = {"name": "tiny-gpt", "transformer": {"layers": 6, "hidden": 256, "heads": 8, "sequence": 128,
                                                "vocab": 1000},
            "training": {"global_batch": 16, "microbatches": "auto", "dtype": "float16", "optimizer": "adam"}}


@pytest.fixture(autouse=True, scope="module")
def _search_once_per_input():
    """`check` runs the stage search again on every call; here about 4 500 calls share a
    handful of inputs.  The search is a deterministic function of its arguments (whatever the hash
    seed: test_stages.py's JSON test), so each distinct input is searched once and its report reused;
    an edit of the search's options, schedule or compute model is a new input and searches
    again.  The search's claims dict is copied, since composing writes into it."""
    real = check_module.search_stages
    memo: dict = {}

    def search_stages(topology, model, schedule, options, compute="efficiency"):
        key = (id(topology), id(model), schedule, json.dumps(options.as_dict(), sort_keys=True), compute)
        if key not in memo:
            # the inputs are kept alive with the answer, so that their ids are never reused
            memo[key] = (topology, model, real(topology, model, schedule, options, compute))
        rep, search = memo[key][2]
        return rep, copy.deepcopy(search)

    check_module.search_stages = search_stages
    yield
    check_module.search_stages = real


def _spec(tmp_path_factory, data, name):
    path = tmp_path_factory.mktemp(name) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, load_model_spec(path)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """Stages of 8 devices on two hosts: d=4 replicas reduce with a proven P² program, and
    the boundaries have several unit tasks."""
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB",
               "allreduces": 2}]
    path, spec = _spec(tmp_path_factory, {"name": "reduced", "layers": layers,
                                          "training": {"global_batch": 128, "dtype": "float16", "optimizer": "adam"}},
                       "reduced")
    topo = load_topology(P3X4)
    plan = make_plan(topo, spec, "1f1b", config=Config(4, 2, 2, 16))
    return topo, spec, plan_document(plan), path


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A small GPT (logits tied to the embedding on the last stage) under eager-1F1B with
    weight delaying, 4 stages of 2 devices."""
    path, spec = _spec(tmp_path_factory, TINY_GPT, "tiny-gpt")
    topo = load_topology(P3)
    plan = make_plan(topo, spec, "eager-1f1b", config=Config(1, 2, 4, 4))
    assert plan.schedule.weight_delay and plan.partition.copies
    return topo, spec, plan_document(plan), path


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    """Interleaved 1F1B: 8 model chunks, two on each of 4 stages of 2 devices; a GPT whose
    logits (tied to the embedding) are on the last chunk."""
    path, spec = _spec(tmp_path_factory, {**TINY_GPT, "transformer": {**TINY_GPT["transformer"], "layers": 8}},
                       "tiny-gpt-8")
    topo = load_topology(P3)
    plan = make_plan(topo, spec, "interleaved-1f1b", config=Config(1, 2, 4, 8))
    assert plan.partition.virtual == 2 and plan.partition.copies
    return topo, spec, plan_document(plan), path


@pytest.fixture(scope="module")
def zbv(tmp_path_factory):
    """ZB-V: chunks in a V over 4 stages (chunks 3 and 4 on the last stage: a channel with no
    boundary), split backwards."""
    path, spec = _spec(tmp_path_factory, {**TINY_GPT, "transformer": {**TINY_GPT["transformer"], "layers": 8}},
                       "tiny-gpt-8")
    topo = load_topology(P3)
    plan = make_plan(topo, spec, "zb-v", config=Config(1, 2, 4, 8))
    assert plan.partition.mesh == (0, 1, 2, 3, 3, 2, 1, 0)
    return topo, spec, plan_document(plan), path


@pytest.fixture(scope="module")
def idle(tmp_path_factory):
    """A plan on part of a cluster: --devices 14 of 16, and a configuration of 3 stages of
    one 4-GPU host each (12 devices; 4 idle)."""
    path, spec = _spec(tmp_path_factory, TINY_GPT, "tiny-gpt")
    topo = load_topology(P3X4)
    plan = make_plan(topo, spec, "1f1b", config=Config(1, 4, 3, 4), devices=14)
    assert (plan.use.used, plan.use.idle, plan.topology.num_devices) == (12, 4, 12)
    return topo, spec, plan_document(plan), path


UNEQUAL_LAYERS = [{"name": "l", "repeat": 8, "flops": "800 GFLOP", "params": "1 GiB", "activations": "8 MiB",
                   "allreduces": 2}]


@pytest.fixture(scope="module")
def unequal(tmp_path_factory):
    """A plan of the unequal search (Alpa's space): 5 stages on meshes of 2, 2, 1, 1 and 2
    devices of two 4-GPU hosts."""
    path, spec = _spec(tmp_path_factory, {"name": "unequal", "layers": UNEQUAL_LAYERS,
                                          # fused: on this instance the add per micro-batch makes equal meshes best
                       "training": {"global_batch": 64, "dtype": "float16", "optimizer": "adam",
                                    "gradient_accumulation": "fused"}},
                       "unequal")
    topo = load_topology(P3)
    plan = make_plan(topo, spec, "1f1b", meshes="unequal")
    assert not plan.partition.equal and plan.use.idle == 0
    return topo, spec, plan_document(plan), path


@pytest.fixture(scope="module")
def unequal_idle(tmp_path_factory):
    """A plan of the unequal search on part of the cluster: a small model is fastest on one
    4-GPU host (the other idles)."""
    layers = [{**UNEQUAL_LAYERS[0], "flops": "80 GFLOP", "params": "200 MiB"}]
    path, spec = _spec(tmp_path_factory, {"name": "unequal-idle", "layers": layers,
                                          "training": {"global_batch": 16, "dtype": "float16", "optimizer": "adam"}},
                       "unequal-idle")
    topo = load_topology(P3)
    plan = make_plan(topo, spec, "1f1b", meshes="unequal")
    assert (plan.use.used, plan.use.idle, plan.topology.num_devices) == (4, 4, 8)
    return topo, spec, plan_document(plan), path


def _refused(case, doc):
    topo, spec, _, _ = case
    return check_plan(topo, spec, doc)


def test_untouched_plans_check(reduced, tied, interleaved, zbv, idle, unequal, unequal_idle):
    for case in (reduced, tied, interleaved, zbv, idle, unequal, unequal_idle):
        rep = _refused(case, copy.deepcopy(case[2]))
        assert rep.exit_code == 0, rep.first_failure
        assert {f.part for f in rep.findings} >= {"inputs", "stages", "launch", "memory", "iteration", "search",
                                                   "fields"}


def _edits(doc):
    return list(leaf_edits(doc)) + list(structure_edits(doc))


def _assert_refused(case, path, what, new):
    rep = _refused(case, new)
    if path == ("search", "options", "candidates") and rep.exit_code == 0:
        # more candidates than the search has (mesh, micro-batch) pairs to list: the same answers
        assert case[2]["search"]["candidates"] < new["search"]["options"]["candidates"]
        return
    if path == ("overlap",) and not case[2]["boundaries"] and rep.exit_code == 0:
        # one stage: no boundary to overlap, so the plan is the same either way (make_plan
        # writes either, as asked)
        return
    assert rep.exit_code == 1, (what, rep.exit_code)
    assert names(rep, path), (what, [(f.path, f.message) for f in rep.failures])
    for f in rep.failures:
        # the part and the path are said once (by the report), and no Python repr shows
        # (``StagePlan(first=...)``, ``np.float64``)
        assert not f.message.startswith(f.part), (what, f.message)
        assert not (f.path and f.message.startswith(f.path + ":")), (what, f.message)
        assert not re.search(r"\b[A-Z]\w+\(\w+=|np\.|numpy|<class", f.message), (what, f.message)


@pytest.mark.parametrize("which", ["reduced", "tied", "interleaved", "zbv", "idle", "unequal", "unequal_idle"])
def test_sampled_edits_are_refused_and_named(request, which):
    """Twenty edits of each plan file, drawn with a fixed seed: changed leaves (each to a
    value of its kind that means something else), deleted and unknown keys, deleted,
    repeated and swapped list entries.  Each exits 1 and names the field once, in words."""
    case = request.getfixturevalue(which)
    edits = _edits(case[2])
    for path, what, new in random.Random(24).sample(edits, 20):
        _assert_refused(case, path, what, new)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["reduced", "tied", "interleaved", "zbv"])
def test_every_edit_is_refused_and_named(request, which):
    """Every leaf and every structure of the plan file (about 1 100 edits each)."""
    case = request.getfixturevalue(which)
    for path, what, new in _edits(case[2]):
        _assert_refused(case, path, what, new)


def test_every_edit_of_what_a_plan_on_part_of_a_cluster_says_is_refused(idle):
    """The devices it uses and why the rest idle, the cap it was asked, and what follows
    from the count (the launch layout's world size, the devices of each stage)."""
    doc = idle[2]
    assert doc["devices"] == 16 and doc["idle"] == {
        "devices": 4, "used": 12, "reason": "--devices 14 leaves 2 out; the configuration uses 12"}
    assert doc["search"]["options"]["devices"] == 14 and doc["launch"]["world_size"] == 12
    heads = (("devices",), ("idle",), ("search", "options", "devices"), ("launch", "world_size"))
    edits = [e for e in _edits(doc) if any(e[0][:len(h)] == h for h in heads)]
    assert len(edits) >= 8
    for path, what, new in edits:
        _assert_refused(idle, path, what, new)
    for gone in ("idle", "devices"):                # the whole account removed
        new = copy.deepcopy(doc)
        if gone == "devices":
            del new["search"]["options"]["devices"]
        else:
            del new["idle"]
        assert _refused(idle, new).exit_code == 1, gone


def test_a_stage_missing_from_the_file_is_named_by_the_layers_no_stage_holds(reduced, interleaved, idle):
    """A stage deleted (or a file cut short) used to be read as idle devices the file does
    not account for; the layers left to no stage come first, for the first, a middle and
    the last stage, on every device count, and with model chunks."""
    for case in (reduced, interleaved, idle):
        doc = case[2]
        n = len(doc["stages"])
        for gone in sorted({0, n // 2, n - 1}):
            new = copy.deepcopy(doc)
            lost = new["stages"].pop(gone)["layers"]
            rep = _refused(case, new)
            assert rep.exit_code == 1
            held = f"layer {lost[0]} is" if lost[0] == lost[1] else f"layers {lost[0]}-{lost[1]} are"
            said = rep.first_failure.message
            assert f"{held} held by no stage" in said, said


@pytest.mark.slow
def test_every_edit_of_the_meshes_of_an_unequal_plan_is_refused(unequal, unequal_idle):
    """Each stage's mesh shape, the devices each stage holds, the search's meshes option, the
    devices used and why the rest idle."""
    assert unequal[2]["mesh"] == [[1, 2], [1, 2], [1, 1], [1, 1], [1, 2]]
    assert unequal[2]["search"]["options"]["meshes"] == "unequal"
    heads = (("mesh",), ("search", "options", "meshes"), ("idle",), ("devices",), ("launch", "world_size"))
    for case in (unequal, unequal_idle):
        edits = [e for e in _edits(case[2]) if any(e[0][:len(h)] == h for h in heads)
                 or (len(e[0]) == 3 and e[0][0] == "stages" and e[0][2] == "devices")]
        assert len(edits) >= 8
        for path, what, new in edits:
            _assert_refused(case, path, what, new)


def _rows(doc):
    return next(b for b in doc["boundaries"] if len(b["schedule"]) > 0)["schedule"]


def _set(path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
    return edit


def _swap_ranks(doc):
    r = doc["launch"]["ranks"]
    r[2], r[5] = r[5], r[2]


def _duplicate_rank(doc):
    doc["launch"]["ranks"][3] = copy.deepcopy(doc["launch"]["ranks"][2])


def _transpose(doc):
    mesh = doc["launch"]["stages"][1]["mesh"]
    doc["launch"]["stages"][1]["mesh"] = [list(c) for c in zip(*mesh)]


def _hosts_zero(doc):
    for r in doc["launch"]["ranks"]:
        r["host"] = 0


def _free_claim(doc):
    doc["cross_mesh"] = "free"
    doc["iteration_time"] = doc["cross_mesh_free_time"]


def _drop_receivers(doc):
    for row in doc["boundaries"][0]["schedule"]:
        del row["receivers"]


def _shift_task(doc):
    row = doc["boundaries"][0]["schedule"][-1]
    row["start"] += 1000
    row["end"] += 1000


def _both(*edits):
    def edit(doc):
        for e in edits:
            e(doc)
    return edit


# Every edit the issue lists ("a plan file is a certificate"), with the field it must name.
ISSUE_EDITS = {
    "launch: two ranks' entries swapped": (_swap_ranks, "launch.ranks[2]"),
    "launch: a rank duplicated": (_duplicate_rank, "launch.ranks[3]"),
    "launch: a stage's mesh transposed": (_transpose, "launch.stages[1].mesh"),
    "launch: world_size doubled": (_set(("launch", "world_size"), lambda v: 2 * v), "launch.world_size"),
    "launch: a rank's tensor coordinate 999": (_set(("launch", "ranks", 1, "tensor"), 999),
                                                "launch.ranks[1].tensor"),
    "launch: every rank's host 0": (_hosts_zero, "launch.ranks[4].host"),
    "launch deleted": (lambda d: d.pop("launch"), "launch"),
    "cross_mesh free, its time claimed": (_free_claim, "cross_mesh"),
    "cross_mesh send-recv, broadcast rows kept": (_set(("cross_mesh",), "send-recv"), "cross_mesh"),
    "send-recv everywhere, broadcast rows kept": (
        _both(_set(("cross_mesh",), "send-recv"),
              *[_set(("boundaries", i, "strategy"), "send-recv") for i in range(6)]), "boundaries[0]"),
    "receivers dropped": (_drop_receivers, "boundaries[0].schedule[0].receivers"),
    "receivers [999]": (_set(("boundaries", 0, "schedule", 0, "receivers"), [999]),
                        "boundaries[0].schedule[0].receivers"),
    "time_unit 1e-6": (_set(("time_unit",), 1e-6), "time_unit"),
    "a slice": (_set(("boundaries", 0, "schedule", 0, "slice"), "[0:1, 0:7]"), "boundaries[0].schedule[0].slice"),
    "a task shifted by 1000 units": (_shift_task, "boundaries[0].schedule[0].start"),
    "tensor shape": (_set(("boundaries", 0, "tensor", "shape", 0), 3), "boundaries[0].tensor.shape"),
    "tensor dtype": (_set(("boundaries", 0, "tensor", "dtype"), "float32"), "boundaries[0].tensor.dtype"),
    "src_spec": (_set(("boundaries", 0, "src_spec"), "[R,R]"), "boundaries[0].src_spec"),
    "dst_spec": (_set(("boundaries", 1, "dst_spec"), "[S0,S1]"), "boundaries[1].dst_spec"),
    "throughput doubled": (_set(("throughput",), lambda v: 2 * v), "throughput"),
    "mfu 0.99": (_set(("mfu",), 0.99), "mfu"),
    "bubble_ratio 0": (_set(("bubble_ratio",), 0.0), "bubble_ratio"),
    "breakdown edited": (_set(("breakdown", "compute"), lambda v: v / 2), "breakdown.compute"),
    "communication_hidden edited": (_set(("communication_hidden", "hidden_fraction"), 1.0),
                                    "communication_hidden.hidden_fraction"),
    "global_batch doubled": (_set(("global_batch",), lambda v: 2 * v), "global_batch"),
    "microbatch_size doubled": (_set(("microbatch_size",), lambda v: 2 * v), "microbatch_size"),
    "search FEASIBLE": (_set(("search", "status"), "FEASIBLE"), "search.status"),
    "search gap": (_set(("search", "gap"), 0.05), "search.gap"),
    "search bound": (_set(("search", "bound"), lambda v: v * 1.5), "search.bound"),
    "proof flipped": (_set(("stages", 0, "proof"), "invalid"), "stages[0].proof"),
    "proof_detail edited": (_set(("stages", 0, "proof_detail"), "proved by hand"), "stages[0].proof_detail"),
    "layer_names": (_set(("stages", 1, "layer_names", 0), "embed"), "stages[1].layer_names"),
    "stage index": (_set(("stages", 2, "index"), 3), "stages[2].index"),
    "stage mesh": (_set(("stages", 2, "mesh"), [2, 1]), "stages[2].mesh"),
    "1f1b on an eager plan with weight delay": (_set(("schedule", "kind"), "1f1b"), "schedule"),
    "schedule family alone": (_set(("schedule", "family"), "1f1b"), "schedule"),
    "version 2.0": (_set(("version",), 2.0), "version"),
    "version true": (_set(("version",), True), "version"),
}


@pytest.mark.parametrize("name", sorted(ISSUE_EDITS))
def test_the_edits_that_passed_before_are_refused(tied, name):
    edit, field = ISSUE_EDITS[name]
    doc = copy.deepcopy(tied[2])
    edit(doc)
    rep = _refused(tied, doc)
    assert rep.exit_code == 1, name
    text = " ".join(f"{f.path} {f.message}" for f in rep.failures)
    assert re.search(re.escape(field) + r"(?![0-9])", text), (name, [(f.path, f.message) for f in rep.failures])


def test_a_version_of_another_type_is_not_read(tmp_path, tied):
    path = tmp_path / "plan.yaml"
    write_document(tied[2], path)
    text = path.read_text()
    assert f"version: {VERSION}\n" in text
    for version in (f"{VERSION}.0", "true", "1", f"{VERSION - 1}", f"'{VERSION}'"):
        path.write_text(text.replace(f"version: {VERSION}\n", f"version: {version}\n"))
        with pytest.raises(PlanFileError, match="version"):
            read_plan(path)
    r = run_cli("check", P3, tied[3], path)
    assert r.returncode == 2 and "version" in r.stderr and r.stderr.count("\n") == 1


def test_reordered_stages_and_a_string_count_say_what_is_wrong(tied):
    doc = copy.deepcopy(tied[2])
    doc["stages"][0], doc["stages"][1] = doc["stages"][1], doc["stages"][0]
    f = _refused(tied, doc).first_failure
    assert f.path == "stages[0].layers" and "does not start at layer 0" in f.message and "StagePlan" not in f.message
    doc = copy.deepcopy(tied[2])
    doc["microbatches"] = str(doc["microbatches"])
    f = _refused(tied, doc).first_failure
    assert f.path == "microbatches" and f.message == 'expected an integer, got the string "4"'


def test_a_shifted_task_names_its_boundary_and_task(tied):
    doc = copy.deepcopy(tied[2])
    _shift_task(doc)
    f = _refused(tied, doc).first_failure
    assert f.part == "boundary act 0->1" and f.path == "boundaries[0].schedule[0].start"
    assert "task 0" in f.message and "as soon as its ports are free" in f.message


def test_order_and_spelling_that_mean_nothing_are_accepted(reduced):
    """Boundaries and schedule rows in another order (keyed by channel and task), a program
    respelled: the same plan."""
    doc = copy.deepcopy(reduced[2])
    doc["boundaries"].reverse()
    for b in doc["boundaries"]:
        b["schedule"].reverse()
    stage = next(s for s in doc["stages"] if s["gradient_program"] != "none")
    stage["gradient_program"] = stage["gradient_program"].replace(", ", ",").replace(";", " ;")
    assert _refused(reduced, doc).exit_code == 0


def test_solve_times_are_checked_for_form_only(tied):
    doc = copy.deepcopy(tied[2])
    doc["solve_times"]["stages"] *= 3                    # another machine, another time: the same plan
    assert _refused(tied, doc).exit_code == 0
    for bad in ({"stages": -1.0}, "fast", {**doc["solve_times"], "extra": 1.0}):
        doc["solve_times"] = bad
        f = _refused(tied, doc).first_failure
        assert f is not None and f.path.startswith("solve_times")


def test_check_json_is_the_whole_report_with_the_failure_marked(tmp_path, tied):
    doc = copy.deepcopy(tied[2])
    doc["launch"]["ranks"][1]["tensor"] = 999
    doc["mfu"] = 0.99
    path = tmp_path / "plan.yaml"
    write_document(doc, path)
    r = run_cli("check", P3, tied[3], path, "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["error"]["code"] == 1
    assert set(out["failed_parts"]) == {"launch", "iteration"}
    failed = [(f["part"], f["path"]) for f in out["findings"] if f["status"] == "fail"]
    assert ("launch", "launch.ranks[1].tensor") in failed and ("iteration", "mfu") in failed
    assert any(f["status"] == "ok" and f["part"] == "iteration" for f in out["findings"])
    # the human output: one line per finding, the part and the path once
    r = run_cli("check", P3, tied[3], path)
    line = next(x for x in r.stdout.splitlines() if "launch.ranks[1].tensor" in x)
    assert "launch: launch" not in line and line.count("launch.ranks[1].tensor") == 1


def test_the_launch_layout_is_a_valid_construction(tied, reduced):
    """What `launch_problems` checks without the plan's own layout code: the derived layout
    passes; every single-field edit of a rank fails at that rank."""
    for case in (tied, reduced):
        topo, doc = case[0], case[2]
        stages = [{"chunks": [s["layers"]], "devices": s["devices"]} for s in doc["stages"]]
        assert launch_problems(doc["launch"], topo, stages) == []
        for key in ("rank", "host", "stage", "data", "tensor", "chunks"):
            bad = copy.deepcopy(doc["launch"])
            value = bad["ranks"][3][key]
            bad["ranks"][3][key] = [[a, b + 1] for a, b in value] if key == "chunks" else \
                [v + 1 for v in value] if isinstance(value, list) else value + 1
            found = launch_problems(bad, topo, stages)
            assert found and found[0][0][:3] == ("launch", "ranks", 3), (key, found)


def test_the_search_s_budgets_are_recorded_and_every_edit_of_them_refused(tmp_path):
    """`plan --budget / --sim-budget`: the file records the limits the search ran under (only
    when asked: files from before these options have neither), `check` runs the search again
    under them, and refuses each edit, the default one and a deleted key included (a larger
    budget finds a faster plan on this instance)."""
    from solver_planner.stages.report import plan_stages

    model = CLUSTERS.parent / "models" / "gpt3-2.6b.yaml"
    topo, spec = load_topology(P3), load_model_spec(model)
    exact = plan_stages(topo, spec, "1f1b")          # the default budgets prove this instance
    assert exact.result.status.value == "OPTIMAL"
    for option, key, value, default in (("--budget", "budget", 30, 2000), ("--sim-budget", "simulations", 1, 300000)):
        path = tmp_path / f"{key}.yaml"
        result = run_cli("plan", P3, model, "-s", "1f1b", option, value, "-o", path)
        assert result.returncode == 0, result.stderr
        doc = yaml.safe_load(path.read_text())
        opts = doc["search"]["options"]
        assert opts[key] == value and not ({"budget", "simulations"} - {key}) & set(opts)
        assert doc["search"]["status"] == "FEASIBLE" and doc["search"]["gap"] > 0.1
        # what the smaller budget claims holds against the proven optimum
        assert doc["search"]["bound"] <= exact.best.time * (1 + 1e-9) <= doc["search"]["objective"] * (1 + 2e-9)
        assert check_plan(topo, spec, doc).exit_code == 0
        for new in (default, 0, -3, True, str(value), 2.5, None, "gone"):
            edited = copy.deepcopy(doc)
            if new == "gone":
                del edited["search"]["options"][key]
            else:
                edited["search"]["options"][key] = new
            rep = check_plan(topo, spec, edited)
            assert rep.exit_code == 1 and names(rep, ("search", "options", key)), (key, new, rep.first_failure)


def test_the_gap_the_search_may_stop_at_is_recorded_and_checked(tmp_path):
    """`plan --gap`: recorded when not the default, read back by `check` (which runs the
    search again at it), and a value the search refuses is refused at its field."""
    model = CLUSTERS.parent / "models" / "gpt3-2.6b.yaml"
    topo, spec = load_topology(P3), load_model_spec(model)
    path = tmp_path / "gap.yaml"
    result = run_cli("plan", P3, model, "-s", "1f1b", "--gap", "0", "-o", path)
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(path.read_text())
    assert doc["search"]["options"]["gap"] == 0.0
    assert check_plan(topo, spec, doc).exit_code == 0
    default = tmp_path / "default.yaml"
    assert run_cli("plan", P3, model, "-s", "1f1b", "-o", default).returncode == 0
    assert "gap" not in yaml.safe_load(default.read_text())["search"]["options"]
    for new in (-0.1, 1.0, True, "0.01", None, float("nan")):
        edited = copy.deepcopy(doc)
        edited["search"]["options"]["gap"] = new
        rep = check_plan(topo, spec, edited)
        assert rep.exit_code == 1 and names(rep, ("search", "options", "gap")), (new, rep.first_failure)
    bad = run_cli("plan", P3, model, "--gap", "1.5")
    assert bad.returncode == 2 and "--gap" in bad.stderr


def test_a_halved_micro_batch_count_is_named_and_every_part_it_stops_says_so(reduced):
    """Halving `microbatches` was reported as wrong slices in every boundary's schedule,
    never by its name, and the parts after the boundaries (search, fields) were neither run
    nor said to be skipped.  (An edited `microbatch_size` alone is a derived field: named
    at the end, the other parts checked; tests/test_config_refusals.py.)"""
    doc = copy.deepcopy(reduced[2])
    doc["microbatches"] //= 2
    rep = _refused(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.path == "microbatches", rep.first_failure
    assert "micro-batches of" in rep.first_failure.message and names(rep, ("microbatches",))
    skipped = {f.part for f in rep.findings if f.status == "skipped"}
    assert skipped >= {"launch", "iteration", "memory", "search", "fields"}
    doc = copy.deepcopy(reduced[2])
    doc["microbatch_size"] *= 2
    rep = _refused(reduced, doc)
    assert rep.first_failure.path == "microbatch_size" and not any(f.status == "skipped" for f in rep.findings)


def test_a_recompute_mode_the_spec_does_not_search_says_so(reduced):
    """An edited stage recompute mode the model's training.recompute never searches was
    refused as "not possible on 2x4 meshes", as if the mesh were why."""
    doc = copy.deepcopy(reduced[2])
    assert doc["stages"][0]["recompute"] == "none" and reduced[1].training.recompute == "none"
    doc["stages"][0]["recompute"] = "full"
    rep = _refused(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.path == "stages[0]"
    assert "the search tries recompute none only for this model (training.recompute)" in rep.first_failure.message


def test_a_program_naming_a_level_the_cluster_lacks_is_that_fields_failure(reduced):
    """`AllReduce(roxt, InsideGroup)` parses but names no level of the hierarchy: it ended
    the whole check as "a value this version cannot read", no field named, nothing else
    checked."""
    doc = copy.deepcopy(reduced[2])
    program = doc["stages"][0]["gradient_program"]
    assert "root" in program
    doc["stages"][0]["gradient_program"] = program.replace("root", "roxt")
    rep = _refused(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.path == "stages[0].gradient_program"
    assert "no level 'roxt'" in rep.first_failure.message
    assert {"launch", "iteration", "search"} <= {f.part for f in rep.findings if f.status != "skipped"}
    assert not any(f.status == "skipped" for f in rep.findings)


def test_a_schedule_failure_lists_the_memory_part_as_skipped(tmp_path):
    """The iteration part refusing the recorded schedule member kept the memory part from
    running, and it was neither ok nor listed as skipped."""
    from solver_planner import api
    from solver_planner.plan.planfile import read_plan
    from conftest import CLUSTERS, SPECS

    cluster, model = CLUSTERS / "local-2x4.yaml", SPECS / "models" / "gpt-tiny.yaml"
    out = tmp_path / "p.yaml"
    api.plan(cluster, model, config="1,2,4,8", output=out)
    doc = read_plan(out)
    doc["schedule"]["eagerness"] += 1
    rep = check_plan(*api.load(cluster, model), doc)
    assert rep.exit_code == 1 and rep.first_failure.part == "iteration"
    assert {f.part for f in rep.findings if f.status == "skipped"} >= {"memory", "search", "fields"}
