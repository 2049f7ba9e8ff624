"""The end-to-end plan: `check` replays what `plan` recorded, tampered plans are caught, the
composition changes nothing but the boundaries, and eager-1F1B never loses to 1F1B."""

import copy
import importlib
import math
import json
import random

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import CLUSTERS, SPECS, run_cli
from plan_mutations import exempt
from test_stages_meshes import unequal_plans
from solver_planner.errors import InfeasibleError
from solver_planner.plan import compose, make_plan
from solver_planner.plan.compose import BREAKDOWN_PARTS, breakdown
from solver_planner.plan.check import check_plan
from solver_planner.plan.planfile import PlanFileError, plan_document, read_plan, write_document, write_plan
from solver_planner.spec import load_model_spec
from solver_planner.stages import family, simulate_schedule
from solver_planner.stages.report import Config
from solver_planner.topology import load_topology

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
GPT = SPECS / "models" / "gpt3-2.6b.yaml"


def model_file(tmp_path, layers, batch=64, name="m", microbatches=None, extra=""):
    training = {"global_batch": batch, "dtype": "float16", "optimizer": "adam"}
    if microbatches is not None:
        training["microbatches"] = microbatches
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "layers": layers, "training": training}) + extra)
    return path


def random_layers(rng: random.Random, skips: bool, n: int | None = None):
    n = n or rng.randint(4, 8)
    layers = []
    for i in range(n):
        layer = {"name": f"l{i}", "flops": f"{rng.uniform(5, 400):.1f} GFLOP", "params": f"{rng.uniform(1, 300):.1f} MiB",
                 "activations": f"{rng.uniform(0.5, 40):.2f} MiB", "allreduces": rng.choice([0, 1, 2])}
        layers.append(layer)
    if skips and n >= 4:
        a = rng.randint(0, n - 3)
        layers[a]["skip_to"] = [f"l{rng.randint(a + 2, n - 1)}"]
    return layers


@pytest.fixture(scope="module")
def p3():
    return load_topology(P3)


def test_plan_then_check_replays_the_recorded_time(tmp_path):
    out = tmp_path / "plan.yaml"
    r = run_cli("plan", str(P3), str(GPT), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    r = run_cli("check", str(P3), str(GPT), str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["replayed_iteration_time"] == pytest.approx(doc["iteration_time"], rel=1e-9)
    assert read_plan(out)["iteration_time"] == doc["iteration_time"]


@pytest.mark.parametrize("seed", [0, 1, 2] + [pytest.param(s, marks=pytest.mark.slow) for s in (3, 4, 5)])
def test_random_plans_check_and_eager_never_loses(tmp_path, p3, seed):
    """Random layers (with a skip connection on odd seeds), stage counts and schedules: the
    plan file checks, its replay equals the plan, and on the same partition the eager-1F1B
    family is never slower than 1F1B."""
    rng = random.Random(seed)
    path = model_file(tmp_path, random_layers(rng, skips=seed % 2 == 1), batch=rng.choice([16, 32, 64]))
    spec = load_model_spec(path)
    schedule = rng.choice(["1f1b", "eager-1f1b", "gpipe"])
    plan = make_plan(p3, spec, schedule, stages=rng.choice([2, 4, None]), proof_timeout=60)
    doc = plan_document(plan)
    rep = check_plan(p3, spec, copy.deepcopy(doc))
    assert rep.exit_code == 0, rep.first_failure
    assert rep.iteration_time == pytest.approx(plan.iteration_time, rel=1e-12)
    assert all(s.proof in ("valid", "not needed") for s in plan.parts)
    one = compose(p3, spec, plan.partition, "1f1b")
    eager = compose(p3, spec, plan.partition, "eager-1f1b")
    assert eager.iteration_time <= one.iteration_time * (1 + 1e-12)


def test_free_cross_mesh_equals_the_stage_planner_without_communication(tmp_path, p3):
    """With data and tensor degrees 1 the only communication is cross-mesh: the plan with it
    free (the boundaries' override) and the stage planner with every communication zeroed
    (its cost tables' switch) are two routes to the same iteration."""
    rng = random.Random(7)
    path = model_file(tmp_path, random_layers(rng, skips=True, n=10), batch=32)
    cfg = "1,1,8,8"
    r1 = run_cli("plan", str(P3), str(path), "--config", cfg, "--cross-mesh", "free", "-s", "1f1b", "--json")
    assert r1.returncode == 0, r1.stderr
    a = json.loads(r1.stdout)
    split = ",".join(str(s["layers"][1] - s["layers"][0] + 1) for s in a["stages"])
    r2 = run_cli("stages", str(P3), str(path), "--config", cfg, "--split", split, "--no-comm", "--json",
                 "--no-baselines")
    assert r2.returncode == 0, r2.stderr
    b = json.loads(r2.stdout)
    assert [s["layers"] for s in a["stages"]] == [s["layers"] for s in b["stages"]]
    assert a["iteration_time"] == pytest.approx(b["iteration_time"], rel=1e-12)


def test_priced_boundaries_add_time_only_where_they_are_exposed(reduced):
    topo, spec, _ = reduced
    plan = make_plan(topo, spec, "1f1b", config=REDUCED)
    free = simulate_schedule(plan.partition, plan.schedule, {b.key: (0.0, ()) for b in plan.boundaries})
    assert plan.free_time == pytest.approx(free.iteration_time, rel=1e-12)
    assert plan.iteration_time >= plan.free_time * (1 - 1e-12)
    assert plan.boundaries and all(b.time > 0 and b.plan is not None for b in plan.boundaries)


# -- tampering ---------------------------------------------------------------------------------

P3X4 = CLUSTERS / "aws-p3.8xlarge-4.yaml"
REDUCED = Config(4, 2, 2, 16)     # d=4 over two hosts per stage: a synthesized P² program to prove


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """A plan whose stages reduce over replicas on two hosts (a proven P² program each) and
    whose boundaries have several unit tasks."""
    topo = load_topology(P3X4)
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB",
               "allreduces": 2}]
    spec = load_model_spec(model_file(tmp_path_factory.mktemp("reduced"), layers, batch=128, name="reduced"))
    plan = make_plan(topo, spec, "1f1b", config=REDUCED)
    assert any(s.program != "none" and "host" in s.program and s.proof == "valid" for s in plan.parts)
    return topo, spec, plan_document(plan)


def _check(reduced, doc):
    topo, spec, _ = reduced
    return check_plan(topo, spec, doc)


def test_untouched_plan_checks(reduced):
    assert _check(reduced, copy.deepcopy(reduced[2])).exit_code == 0


def test_a_wrong_program_is_caught(reduced):
    doc = copy.deepcopy(reduced[2])
    p = next(s["index"] for s in doc["stages"] if s["gradient_program"] != "none")
    doc["stages"][p]["gradient_program"] = "ReduceScatter(host, InsideGroup)"
    rep = _check(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.part == f"stage {p}"
    assert "not a valid all-reduce" in rep.first_failure.message


def test_a_valid_program_other_than_the_priced_one_is_caught(reduced):
    doc = copy.deepcopy(reduced[2])
    p = next(s["index"] for s in doc["stages"] if s["gradient_program"] != "none")
    other = "AllReduce(root, InsideGroup)" if doc["stages"][p]["gradient_program"] != "AllReduce(root, InsideGroup)" \
        else "Reduce(host, InsideGroup); AllReduce(host, Master(root)); Broadcast(host, InsideGroup)"
    doc["stages"][p]["gradient_program"] = other
    rep = _check(reduced, doc)
    assert rep.exit_code == 1 and "is not the program the plan's times price" in rep.first_failure.message


def test_an_overlapping_schedule_is_caught(reduced):
    topo = reduced[0]
    doc = copy.deepcopy(reduced[2])
    # two tasks sent from one host: they share its NIC
    first, second = next((a, b) for bd in doc["boundaries"] for a in bd.get("schedule", [])
                         for b in bd.get("schedule", []) if a is not b and a["start"] < b["start"]
                         and topo.host(a["sender_device"]) == topo.host(b["sender_device"]))
    length = second["end"] - second["start"]
    second["start"], second["end"] = first["start"], first["start"] + length
    rep = _check(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.part.startswith("boundary")
    assert "overlap" in rep.first_failure.message


def test_a_sender_without_the_slice_is_caught(reduced):
    doc = copy.deepcopy(reduced[2])
    b = next(b for b in doc["boundaries"] if b.get("schedule"))
    b["schedule"][0]["sender_device"] = b["schedule"][0]["receivers"][0]     # a device of the receiving stage
    rep = _check(reduced, doc)
    assert rep.exit_code == 1 and "does not hold it; its candidate senders are devices" in rep.first_failure.message


def test_an_edited_time_is_caught(reduced):
    doc = copy.deepcopy(reduced[2])
    doc["iteration_time"] *= 0.99
    rep = _check(reduced, doc)
    assert rep.exit_code == 1 and rep.first_failure.part == "iteration"


def test_a_stage_that_does_not_fit_is_caught(tmp_path, p3):
    """Moving layers onto one stage (every recorded schedule still feasible) overflows it."""
    layers = [{"name": "l", "repeat": 12, "flops": "50 GFLOP", "params": "1 GiB", "activations": "1 MiB"}]
    spec = load_model_spec(model_file(tmp_path, layers, batch=16))
    plan = make_plan(p3, spec, "1f1b", config=Config(1, 2, 4, 16))
    doc = plan_document(plan)
    assert [s["layers"] for s in doc["stages"]] == [[0, 2], [3, 5], [6, 8], [9, 11]]
    assert check_plan(p3, spec, copy.deepcopy(doc)).exit_code == 0
    for stage, layers in zip(doc["stages"], ([0, 8], [9, 9], [10, 10], [11, 11])):
        stage["layers"] = layers
    rep = check_plan(p3, spec, doc)
    memory = [f for f in rep.failures if f.part == "memory"]      # (the launch layout's layers fail too)
    assert rep.exit_code == 1 and memory and "GiB per device" in memory[0].message, rep.failures


def test_wrong_inputs_and_files(tmp_path, reduced):
    path = tmp_path / "plan.yaml"
    write_document(reduced[2], path)
    r = run_cli("check", str(CLUSTERS / "aws-p3.8xlarge-3.yaml"), str(GPT), str(path))
    assert r.returncode == 1 and "inputs" in r.stderr and "Traceback" not in r.stderr
    for text in ("format: something-else\n", "a: [1, 2\n", "a: &x [1]\nb: *x\nformat: solver-planner-plan\n",
                 "\x00\x01", "format: solver-planner-plan\nversion: 99\n",
                 "format: solver-planner-plan\nformat: solver-planner-plan\n",
                 "format: solver-planner-plan\nk: 1\n<<: {k: 2}\n", "format: solver-planner-plan\nt: 2001-02-30\n",
                 "format: solver-planner-plan\nt: !!str y\nz: " + "[" * 30000 + "]" * 30000 + "\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_bytes(text.encode("utf-8", "surrogatepass"))
        with pytest.raises(PlanFileError) as err:
            read_plan(bad)
        assert "\n" not in str(err.value) and str(bad) in str(err.value)
    # a version this release does not read is named with its line
    bad.write_text("format: solver-planner-plan\ncluster: c\nversion: 4\n")
    with pytest.raises(PlanFileError, match=r"bad.yaml:3: version: the plan file's version is the integer 4"):
        read_plan(bad)
    # the line of a forbidden character after multi-byte ones (libyaml counts bytes)
    bad.write_text("a: " + "é" * 23 + "\nb: 1\nc: 2\nd: 3\ne: \x07\n")
    with pytest.raises(PlanFileError, match=r"bad.yaml:5: not YAML: character"):
        read_plan(bad)
    # a key said twice is refused with its line, whatever the values (a certificate says each
    # thing once; YAML readers keep the last value silently)
    text = path.read_text()
    twice = text.replace("\niteration_time: ", "\niteration_time: 1.0\niteration_time: ", 1)
    assert twice != text
    bad.write_text(twice)
    line = twice[:twice.index("iteration_time: 1.0")].count("\n") + 2
    with pytest.raises(PlanFileError, match=rf":{line}: the key 'iteration_time' appears twice"):
        read_plan(bad)
    # one of them through the command line: exit 2, one line
    r = run_cli("check", str(P3), str(GPT), str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    r = run_cli("check", str(P3), str(GPT), str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "no such plan file" in r.stderr


def test_output_paths_are_checked_before_the_work(tmp_path):
    r = run_cli("plan", str(P3), str(GPT), "-o", str(tmp_path / "nowhere" / "plan.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("plan", str(P3), str(GPT), "--cross-mesh", "carrier-pigeon")
    assert r.returncode == 2 and "--cross-mesh" in r.stderr


def test_written_plan_has_no_aliases_and_reads_back(tmp_path, reduced):
    topo, spec, _ = reduced
    plan = make_plan(topo, spec, "1f1b", config=REDUCED)
    path = tmp_path / "plan.yaml"
    doc = write_plan(plan, path)
    assert "&id" not in path.read_text() and "*id" not in path.read_text()
    assert read_plan(path)["boundaries"] == json.loads(json.dumps(doc["boundaries"]))


# -- launch layout -------------------------------------------------------------------------------

def test_launch_layout_matches_the_priced_groups(reduced):
    """Every rank once; a stage's mesh rows are the tensor groups the stage planner priced,
    its columns the data groups; coordinates are the placement matrix's (P² §2.1)."""
    topo, spec, _ = reduced
    plan = make_plan(topo, spec, "1f1b", config=REDUCED)
    lay = plan_document(plan)["launch"]
    assert [r["rank"] for r in lay["ranks"]] == list(range(topo.num_devices))
    tables = plan.partition.costs.tables
    for stage, part in zip(lay["stages"], plan.parts):
        assert stage["mesh_dim_names"] == ["dp", "tp"]
        assert stage["mesh"] == tables[part.tensor].tensor_groups(part.index)
        for j, dev in enumerate(part.devices):
            rank = lay["ranks"][dev]
            assert (rank["data"], rank["tensor"]) == part.matrix.axis_coords(list(part.mesh), j)
            # its groups are the mesh's row and column, not written again per rank
            assert stage["mesh"][rank["data"]][rank["tensor"]] == dev and "tensor_group" not in rank


@pytest.mark.slow
def test_trace_has_a_track_per_link(tmp_path):
    out = tmp_path / "trace.json"
    r = run_cli("plan", str(P3), str(GPT), "--trace", str(out))
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert "links" in names
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert any("ethernet" in t or "nic" in t.lower() for t in threads), sorted(threads)[:10]


# -- what execute runs ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("config", ["8,1,2,16", "4,2,2,16"])
def test_emitted_specs_lower_under_execute(tmp_path, config):
    """`plan --emit` writes specs `execute` accepts: every command lowers (--dry-run, no
    torch needed); boundaries a mesh spec cannot state are listed, not dropped silently."""
    import shlex
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB",
               "allreduces": 2}]
    model = model_file(tmp_path, layers, batch=128, name="reduced")
    out = tmp_path / "emit"
    r = run_cli("plan", str(P3X4), str(model), "--config", config, "-s", "1f1b", "--emit", str(out))
    assert r.returncode == 0, r.stderr
    emitted = yaml.safe_load((out / "commands.yaml").read_text())
    reductions = [c for c in emitted["commands"] if " reduction " in c]
    reshards = [c for c in emitted["commands"] if " reshard " in c]
    assert len(reductions) == 2                        # one per stage, both with a program
    if config.startswith("8,1"):
        assert len(reshards) == 1 and not emitted["skipped"]
    else:
        assert not reshards and len(emitted["skipped"]) == 2 and "no mesh spec" in emitted["skipped"][0]
    launch = [c for c in emitted["commands"] if c.startswith("torchrun ")]
    assert len(launch) == 1 and str(out.resolve() / "launch_from_plan.py") in launch[0]
    assert (out / "plan.yaml").is_file() and (out / "launch_from_plan.py").is_file()
    for cmd in reductions + reshards:
        args = shlex.split(cmd, comments=True)
        assert args[0] == "solver-planner"
        r = run_cli(*args[1:], "--dry-run", "--json")
        assert r.returncode == 0, (cmd, r.stderr)


@pytest.mark.slow
def test_emitted_gradient_program_runs_exactly_on_gloo(tmp_path):
    """The proven program of a plan's stage, run by torch.distributed (gloo) on one process
    per device of the stage's sub-mesh, leaves every rank with the exact sums."""
    pytest.importorskip("torch")
    import shlex
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "2 MiB", "activations": "8 MiB"}]
    model = model_file(tmp_path, layers, batch=128, name="small")
    out = tmp_path / "emit"
    r = run_cli("plan", str(P3X4), str(model), "--config", "4,2,2,16", "-s", "1f1b", "--emit", str(out))
    assert r.returncode == 0, r.stderr
    cmd = next(c for c in yaml.safe_load((out / "commands.yaml").read_text())["commands"] if " reduction " in c)
    r = run_cli(*shlex.split(cmd, comments=True)[1:], "--repeat", "1", "--warmup", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True


@pytest.mark.slow
def test_more_candidates_never_give_a_slower_plan(tmp_path, p3):
    """Composing the stage planner's 3 best plans with their real boundaries keeps the
    fastest: never slower than composing its first choice alone, and it is the least of
    the composed times it reports."""
    rng = random.Random(11)
    spec = load_model_spec(model_file(tmp_path, random_layers(rng, skips=True, n=8), batch=32))
    one = make_plan(p3, spec, "1f1b")
    three = make_plan(p3, spec, "1f1b", candidates=3)
    composed = [c["iteration_time"] for c in three.search["composed"] if c["iteration_time"] is not None]
    assert len(three.search["composed"]) == 3
    assert three.iteration_time == min(composed)
    assert three.iteration_time <= one.iteration_time
    assert composed[0] == pytest.approx(one.iteration_time, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_breakdown_adds_up_to_the_iteration_on_random_plans(tmp_path, p3, seed):
    """The breakdown's parts are the critical path's: each >= 0, together exactly the iteration."""
    rng = random.Random(seed)
    spec = load_model_spec(model_file(tmp_path, random_layers(rng, skips=seed % 2 == 0), batch=rng.choice([16, 32])))
    plan = make_plan(p3, spec, rng.choice(["1f1b", "gpipe", "eager-1f1b"]), time_limit=2.0)
    bd = breakdown(plan)
    assert list(bd) == list(BREAKDOWN_PARTS)
    assert all(v >= 0 for v in bd.values())
    assert sum(bd.values()) == pytest.approx(plan.iteration_time, rel=1e-12)
    assert bd["idle"] == 0.0                    # a pipeline has no release times


def test_breakdown_prices_compute_from_flops(tmp_path, reduced):
    """One stage on one host, no replicas: every pass is on the critical path, so ``compute``
    is B passes of the efficiency model's kernels (solver_planner/compute.py's formula,
    written out here from the layer specs and the device's parameters) and B - 1 additions
    of each layer's gradients (``gradient_accumulation: add``, the default), the rest of the
    passes is tensor-parallel, and the optimizer step ends the iteration."""
    raw = yaml.safe_load(P3.read_text())
    raw["levels"][0]["count"] = 1
    raw["name"] = "one-host"
    cluster = tmp_path / "one-host.yaml"
    cluster.write_text(yaml.safe_dump(raw))
    topo = load_topology(cluster)
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB",
               "allreduces": 2}]
    spec = load_model_spec(model_file(tmp_path, layers, batch=16, name="one"))
    plan = make_plan(topo, spec, "1f1b", config=Config(1, 4, 1, 4))
    bd = breakdown(plan)
    dev, c = topo.device, topo.device.compute
    n = 16 / 4                                        # samples per micro-batch
    flops = 80e9 * n / 4                              # each pass: forward, input grads, weight grads
    moved = 200 * 2**20 / 4 + n * 8 * 2**20 * (1 + 1 / 4)
    one = c.kernel_overhead + max((flops + c.half_efficiency_flops) / (dev.flops * c.matmul_efficiency),
                                  moved / dev.memory_bandwidth)
    # each addition reads both gradients and writes one: 3 x (params / t) bytes, one kernel
    add = c.kernel_overhead + 3 * 200 * 2**20 / 4 / dev.memory_bandwidth
    assert bd["compute"] == pytest.approx(3 * one * 8 * 4 + add * 8 * 3, rel=1e-9)
    assert bd["tensor_parallel"] > 0 and bd["pipeline_transfer"] == bd["gradient_reduction"] == 0
    assert bd["compute"] + bd["tensor_parallel"] + bd["optimizer"] == pytest.approx(plan.iteration_time, rel=1e-12)
    # MFU and throughput of the reduced plan, from the spec: the model's FLOPs over the
    # iteration at the cluster's peak
    topo, spec, doc = reduced
    model_flops = 3 * 80e9 * 8 * 128                  # forward, and backward at twice the forward (the default)
    assert doc["mfu"] == pytest.approx(model_flops / (doc["iteration_time"] * topo.num_devices * topo.device.flops),
                                       rel=1e-9)
    assert doc["throughput"] == pytest.approx(128 / doc["iteration_time"], rel=1e-12)


def test_a_proof_that_times_out_exits_3(reduced, monkeypatch):
    import solver_planner.plan.parts as parts_mod
    monkeypatch.setattr(parts_mod, "prove_program", lambda *a, **k: ("unknown", "", 0.0))
    rep = _check(reduced, copy.deepcopy(reduced[2]))
    assert rep.exit_code == 3 and rep.first_failure is None


def _leaves(doc, path=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, path + (i,))
    else:
        yield path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_values_of_any_kind_never_crash_check(reduced, data):
    """Any leaf of a plan file replaced by a value of any kind or size (NaN, 2^70, text,
    lists, mappings): check answers and never raises, and refuses every change (the only
    fields it cannot re-derive are the measured solve_times; tests/plan_mutations.py)."""
    doc = copy.deepcopy(reduced[2])
    # (candidates above the pairs the search can list change nothing: tested in test_plan_certificate.py)
    leaves = [p for p in _leaves(doc) if not exempt(p) and p != ("search", "options", "candidates")]
    path = data.draw(st.sampled_from(leaves))
    value = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                                st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3), st.just({})))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    rep = _check(reduced, doc)
    assert rep.exit_code in (0, 1, 3)
    original = reduced[2]
    for key in path:
        original = original[key]
    same = value == original and type(value) is type(original) or (
        isinstance(original, float) and not isinstance(value, bool) and isinstance(value, int) and value == original)
    if not same:
        assert rep.exit_code == 1, (path, value)


def test_check_json_is_one_object_with_the_error(tmp_path, reduced):
    doc = copy.deepcopy(reduced[2])
    doc["iteration_time"] *= 2
    path = tmp_path / "plan.yaml"
    write_document(doc, path)
    layers = [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB",
               "allreduces": 2}]
    model = model_file(tmp_path, layers, batch=128, name="reduced")
    r = run_cli("check", str(P3X4), str(model), str(path), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)                  # one object: the report, with the error in it
    assert out["ok"] is False and out["error"]["code"] == 1 and "iteration" in out["error"]["message"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(unequal_plans())
def test_each_distinct_order_simulated_once_is_every_member_simulated(drawn):
    """simulate_plan simulates each distinct set of op orders once (eager-1F1B's higher
    eagerness levels repeat orders once the micro-batches cap every warm-up): the times it
    reports per member, and the member it picks, are those of simulating every member."""
    assume(drawn is not None)
    compose_module = importlib.import_module("solver_planner.plan.compose")     # the module, not the function
    part, _ = drawn
    fam = family("eager-1f1b", part.costs.stages)
    want = {}
    for s in fam:
        r = simulate_schedule(part, s)
        want[str(s)] = r.iteration_time if max(r.peak_memory) <= part.costs.device_memory else math.inf
    calls = []
    fast = compose_module.pipeline_run
    compose_module.pipeline_run = lambda *a: calls.append(a[1]) or fast(*a)
    try:
        run, tried = compose_module.simulate_plan(part, fam, None)
    except InfeasibleError:
        assert all(t == math.inf for t in want.values())
        return
    finally:
        compose_module.pipeline_run = fast
    assert tried == want
    fastest = min(want.values())
    assert run.schedule == next(s for s in fam if want[str(s)] == fastest) and run.iteration_time == fastest
    if part.costs.microbatches == 1:
        # one micro-batch: every warm-up is 1 whatever the eagerness; with and without weight delaying
        assert len(calls) == 2 < len(fam) or len(fam) == 2


def test_the_hidden_share_of_transfers_stays_within_zero_and_one(tmp_path):
    """A global batch of 1 on DGX H100 nodes: the transfers are all exposed, and the
    difference of two simulated times put the hidden share at -2.2e-16 ("-0.0% hidden")."""
    from solver_planner import api
    from solver_planner.plan.planfile import plan_document

    model = tmp_path / "gb1.yaml"
    model.write_text("name: gb1\ntransformer: {layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocab: 51200}\n"
                     "training: {global_batch: 1, dtype: bfloat16, optimizer: adam}\n")
    hidden = plan_document(api.plan(CLUSTERS / "dgx-h100-4x8.yaml", model))["communication_hidden"]
    assert hidden["cross_mesh_total"] > 0 and 0.0 <= hidden["hidden_fraction"] <= 1.0
    assert hidden["hidden_fraction"] == 0.0


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("config", ["2,2,2,4", "1,2,4,8", "2,1,4,8"])
def test_the_plans_members_are_simulated_fast_and_equal_to_the_engine(config, overlap):
    """simulate_plan prices each member of the family with the fast simulator, boundary
    schedules included (with --no-overlap they hold the compute streams: the engine then):
    time, busy and task count equal the engine's bit for bit, and the timeline the plan
    reads is the engine's."""
    from solver_planner import api
    from solver_planner.plan.boundaries import transfers_of
    from solver_planner.plan.compose import members
    from solver_planner.stages import simulate_schedule
    from solver_planner.stages.fastsim import iteration

    p = api.plan(CLUSTERS / "local-2x4.yaml", SPECS / "models" / "gpt-tiny.yaml", config=config, overlap=overlap)
    transfers = transfers_of(p.boundaries, p.partition.mesh, synchronous=not overlap)
    assert transfers
    for s in members(p.family, p.partition):
        fast, slow = iteration(p.partition, s, transfers), simulate_schedule(p.partition, s, transfers)
        assert (fast.time, fast.busy, fast.tasks) == (slow.iteration_time, slow.busy, len(slow.timeline)), s
        assert fast.engine or overlap          # transfers holding compute streams: the engine
    assert p.run.timeline.makespan == p.iteration_time and len(p.run.timeline.records) > 0
