"""Lowering to torch.distributed, run on real gloo processes (issue 6).

The expensive part, starting processes, happens once per world size in module-scoped
fixtures that run many plans each; the tests then read the results.
"""

import json
import os
import random
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import CLUSTERS, ROOT, SPECS, run_cli
from solver_planner.cost import CostModel
from solver_planner.distributed import lower_reduction
from solver_planner.distributed.emit import module_text
from solver_planner.distributed.jobs import reduction_run, resharding_plans, synthesized_runs
from solver_planner.distributed.launch import execute_plans
from solver_planner.errors import LoweringError
from solver_planner.placement import ParallelismMatrix
from solver_planner.reduction.execute import execute as numpy_execute
from solver_planner.reduction.explicit import load_explicit_program
from solver_planner.reduction.generate import random_program
from solver_planner.reduction.proof import prove
from solver_planner.reduction.verify import check_program
from solver_planner.reduction.ranking import lowering_for
from solver_planner.reduction.synthesis import synthesize_traced
from solver_planner.spec import load_model_spec
from solver_planner.topology import load_topology

MODELS = SPECS / "models"
RANDOM_8 = 24
TINY = 4 * 8 * 3  # bytes reduced per device: 3 float32 elements per chunk of 8

# Hand-written programs on the 8-device [host 2, proc 4] cluster, reducing over all 8.
EXPLICIT_8 = {
    "hierarchical": """steps:
  - {op: ReduceScatter, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
  - {op: AllReduce, groups: [[0, 4], [1, 5], [2, 6], [3, 7]]}
  - {op: AllGather, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}""",
    # Unsorted groups: torch orders a group's ranks, the semantics keeps the written order.
    "unsorted-scatter": """steps:
  - {op: ReduceScatter, groups: [[3, 1, 2, 0], [6, 4, 7, 5]]}
  - {op: AllReduce, groups: [[3, 6], [1, 4], [2, 7], [0, 5]]}
  - {op: AllGather, groups: [[2, 0, 3, 1], [5, 7, 4, 6]]}""",
    # Issue 12's program: device 4 keeps the last block of its host's scatter, the gather puts
    # every chunk back at its own offset, so the hosts add like with like.
    "issue-12": """steps:
  - {op: ReduceScatter, groups: [[0, 1, 2, 3], [5, 6, 7, 4]]}
  - {op: AllGather, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
  - {op: AllReduce, groups: [[0, 4], [1, 5], [2, 6], [3, 7]]}""",
    "reduce-broadcast-roots": """steps:
  - {op: Reduce, groups: [[2, 0, 1, 3], [7, 4, 5, 6]]}
  - {op: AllReduce, groups: [[2, 7]]}
  - {op: Broadcast, groups: [[2, 1, 0, 3], [7, 6, 5, 4]]}""",
    # Invalid: the second all-reduce adds every host's sum again (R-AllReduce: disjoint contributions).
    "double-count": """steps:
  - {op: AllReduce, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
  - {op: AllReduce, groups: [[0, 1, 2, 3, 4, 5, 6, 7]]}""",
    # Invalid: after the scatter, pairs hold different chunks and sum them position by position.
    "mismatched-chunks": """steps:
  - {op: ReduceScatter, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
  - {op: AllReduce, groups: [[0, 1], [2, 3], [4, 5], [6, 7]]}
  - {op: AllGather, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}""",
    # Invalid: the hosts never exchange (post-condition).
    "hosts-only": """steps:
  - {op: AllReduce, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}""",
}


def _setup(cluster, model, matrix, reduction=0):
    topo = load_topology(CLUSTERS / cluster)
    spec = load_model_spec(MODELS / model)
    m = ParallelismMatrix.parse(matrix)
    return topo, spec, m, spec.reductions[reduction]


def _explicit(topo, lowering, name, text):
    steps = load_explicit_program(f"{name}.yaml", topo.num_devices, text)
    return reduction_run(topo, lowering, steps, TINY, name)


@pytest.fixture(scope="module")
def eight():
    """Every synthesized program of two placements and both reductions, and the explicit
    programs, on 8 gloo processes at once."""
    runs = []
    for matrix in ("[[2,1],[1,4]]", "[[1,2],[2,2]]"):
        for red in (0, 1):
            topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", matrix, red)
            for run in synthesized_runs(topo, spec, m, reduction, TINY):
                runs.append(("synthesized", matrix, reduction.name, run))
    topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", "[[2,1],[1,4]]")
    lowering = lowering_for(topo, spec, m, reduction)
    for name, text in EXPLICIT_8.items():
        runs.append(("explicit", name, reduction.name, _explicit(topo, lowering, name, text)))
    # Random programs on 8 devices (reduction/generate.py), the ones torch can run at all.
    rng = random.Random(12)
    while sum(r[0] == "random" for r in runs) < RANDOM_8:
        p = random_program(rng, 8, 8)
        try:
            plan = lower_reduction(p.steps, 8, p.chunks, p.reduction_groups, 3, title=p.recipe)
        except LoweringError:
            continue
        runs.append(("random", p, None, plan))
    executions = execute_plans([r[-1] if r[0] == "random" else r[-1].plan for r in runs], "gloo", repeat=1, warmup=0)
    return runs, executions


@pytest.mark.slow
def test_every_synthesized_program_of_two_level_placements_sums_exactly_on_8_processes(eight):
    runs, executions = eight
    synthesized = [(r, e) for r, e in zip(runs, executions) if r[0] == "synthesized"]
    by_case = {}
    for r, e in synthesized:
        by_case.setdefault((r[1], r[2]), []).append(e)
    assert len(by_case) == 4
    for (matrix, red), found in by_case.items():
        topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", matrix, ("grads", "data-grads").index(red))
        assert len(found) == len(synthesize_traced(lowering_for(topo, spec, m, reduction).hierarchy, 5))
    assert len(by_case[("[[2,1],[1,4]]", "grads")]) > 100
    for (kind, matrix, red, run), e in synthesized:
        assert run.verdict == "valid"
        assert e.ok, (matrix, red, run.plan.title, [f.describe(e.plan) for f in e.failures])
        assert len(e.step_times) == len(run.plan.steps) and all(t >= 0 for t in e.step_times)


@pytest.mark.slow
def test_explicit_programs_pass_exactly_when_verify_accepts_them(eight):
    runs, executions = eight
    verdicts = {r[1]: (r[-1].verdict, e) for r, e in zip(runs, executions) if r[0] == "explicit"}
    assert {k: v for k, (v, _) in verdicts.items()} == {
        "hierarchical": "valid", "unsorted-scatter": "valid", "issue-12": "valid", "reduce-broadcast-roots": "valid",
        "double-count": "invalid", "mismatched-chunks": "invalid", "hosts-only": "invalid"}
    for name, (verdict, e) in verdicts.items():
        assert e.ok == (verdict == "valid"), name
    # The numeric reference executor agrees with the real run on every one of them.
    topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", "[[2,1],[1,4]]")
    low = lowering_for(topo, spec, m, reduction)
    for name, text in EXPLICIT_8.items():
        steps = load_explicit_program(f"{name}.yaml", 8, text)
        assert numpy_execute(8, low.hierarchy.size, steps, low.reduction_groups()).ok == verdicts[name][1].ok


@pytest.mark.slow
def test_random_programs_pass_on_gloo_exactly_when_every_checker_says_valid(eight):
    runs, executions = eight
    random_runs = [(r[1], e) for r, e in zip(runs, executions) if r[0] == "random"]
    assert len(random_runs) == RANDOM_8
    outcomes = []
    for p, e in random_runs:
        rules = check_program(8, p.chunks, p.steps, p.reduction_groups).valid
        proved = prove(8, p.chunks, p.steps, p.reduction_groups).status == "valid"
        ran = numpy_execute(8, p.chunks, p.steps, p.reduction_groups).ok
        assert rules == proved == ran == e.ok, (p, rules, proved, ran, [f.describe(e.plan) for f in e.failures])
        outcomes.append(e.ok)
    assert 3 <= sum(outcomes) <= RANDOM_8 - 3, "the sample should hold valid and invalid programs"


@pytest.mark.slow
def test_a_wrong_sum_names_the_rank_the_step_and_the_element(eight):
    runs, executions = eight
    e = next(e for r, e in zip(runs, executions) if r[1] == "double-count")
    assert {f.rank for f in e.failures} == set(range(8))
    f = e.failures[0]
    assert f.step == 1 and f.index == (0, 0) and f.got != f.want
    # Every contribution was added 4 times: the host sum, then the sum of 4 copies of each host sum.
    assert f.got == 4 * f.want
    text = f.describe(e.plan)
    assert "rank 0" in text and "chunk 0, element 0" in text and "step 2" in text


def test_lowering_refuses_calls_whose_buffers_differ_across_ranks():
    topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", "[[2,1],[1,4]]")
    low = lowering_for(topo, spec, m, reduction)
    steps = load_explicit_program("x.yaml", 8, """steps:
  - {op: Reduce, groups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
  - {op: AllReduce, groups: [[0, 1, 2, 3, 4, 5, 6, 7]]}""")
    with pytest.raises(LoweringError, match=r"step 2: well-formed call on group \[0, 1, 2, 3, 4, 5, 6, 7\]: device 1:"
                                            r" holds 0 chunks but device 0 holds 8"):
        lower_reduction(steps, 8, low.hierarchy.size, low.reduction_groups(), 3)


def test_a_scatter_hands_each_rank_the_chunks_the_semantics_gives_it():
    topo, spec, m, reduction = _setup("local-2x4.yaml", "local-2x4.yaml", "[[2,1],[1,4]]")
    low = lowering_for(topo, spec, m, reduction)
    steps = load_explicit_program("x.yaml", 8, EXPLICIT_8["unsorted-scatter"])
    plan = lower_reduction(steps, 8, 8, low.reduction_groups(), 3)
    # R-ReduceScatter: member n of [3, 1, 2, 0] keeps share n of the 8 chunks.
    kept = {rank: plan.calls[rank][0].recv for rank in (3, 1, 2, 0)}
    assert kept == {3: (0, 1), 1: (2, 3), 2: (4, 5), 0: (6, 7)}
    # torch gives part p of the input to the p-th smallest rank: rank 0's share must come first.
    assert plan.calls[1][0].send[:2] == (6, 7)


@pytest.fixture(scope="module")
def four():
    """Synthesized programs of the 4-process job and its two reshardings, on 4 gloo processes."""
    topo, spec, m, reduction = _setup("local-2x2.yaml", "local-2x2.yaml", "[[2,1],[1,2]]")
    runs = synthesized_runs(topo, spec, m, reduction, 4 * 4 * 5)
    reshard = resharding_plans(topo, spec)
    executions = execute_plans([r.plan for r in runs] + reshard, "gloo", repeat=2, warmup=1)
    return runs, reshard, executions


@pytest.mark.slow
def test_programs_and_reshardings_on_4_processes(four):
    runs, reshard, executions = four
    assert len(runs) >= 5 and len(reshard) == 2
    for e in executions:
        assert e.ok, (e.plan.title, [f.describe(e.plan) for f in e.failures])
        assert e.total > 0 and len(e.step_times) == len(e.plan.steps)
    # Predictions come from the cost model on the same steps: positive, and summed for programs.
    for run, e in zip(runs, executions):
        assert e.plan.predicted == pytest.approx(sum(s.predicted for s in run.plan.steps))
        assert all(s.predicted > 0 for s in run.plan.steps)


@pytest.fixture(scope="module")
def reshardings_8():
    topo = load_topology(CLUSTERS / "local-2x4.yaml")
    spec = load_model_spec(MODELS / "local-2x4.yaml")
    plans = {p.title.split("'")[1]: p for p in resharding_plans(topo, spec)}
    even = [p for name, p in plans.items() if name != "uneven"]
    # A corrupted copy of 'transpose': the first receiver of two broadcasts swap places.
    t = plans["transpose"]
    rank = next(r for r, calls in enumerate(t.calls) if len([c for c in calls if c.recv is not None]) >= 2)
    recv = [i for i, c in enumerate(t.calls[rank]) if c.recv is not None]
    a, b = t.calls[rank][recv[0]], t.calls[rank][recv[1]]
    calls = list(t.calls[rank])
    calls[recv[0]], calls[recv[1]] = replace(a, recv=b.recv), replace(b, recv=a.recv)
    broken = replace(t, title="broken", calls=t.calls[:rank] + (tuple(calls),) + t.calls[rank + 1:])
    executions = execute_plans(even + [broken], "gloo", repeat=1, warmup=0)
    uneven = execute_plans([plans["uneven"]], "gloo", repeat=1, warmup=0)
    return even, executions[:-1], (broken, rank, {a.step, b.step}, executions[-1]), uneven[0]


@pytest.mark.slow
def test_broadcast_schedules_put_exactly_the_destination_slice_on_every_rank(reshardings_8):
    even, executions, _, uneven = reshardings_8
    assert len(even) == 3 and all(p.world == 8 for p in even)
    for e in executions + [uneven]:
        assert e.ok, (e.plan.title, [f.describe(e.plan) for f in e.failures])
    # The uneven case runs on 4 + 3 ranks and pads: 50 rows over 4 source tiles of 13.
    assert uneven.plan.world == 7
    assert [b[0] for b in uneven.plan.data["src"][:4]] == [[0, 13], [13, 26], [26, 39], [39, 50]]
    assert [b[1] for b in uneven.plan.data["dst"][4:]] == [[0, 10], [10, 20], [20, 30]]
    assert uneven.plan.data["shape"] == [50, 30, 16]
    # Every unit task is one broadcast whose members each make exactly one call for it.
    for p in even + [uneven.plan]:
        for s, step in enumerate(p.steps):
            members = [r for r, calls in enumerate(p.calls) if any(c.step == s for c in calls)]
            assert members == list(step.ranks)


@pytest.mark.slow
def test_a_broadcast_written_to_the_wrong_place_is_caught_with_its_step(reshardings_8):
    _, _, (broken, rank, swapped, e), _ = reshardings_8
    assert [f.rank for f in e.failures] == [rank]
    (f,) = e.failures
    assert f.got != f.want
    # The wrong element was last written by one of the two swapped broadcasts.
    assert f.step in swapped
    assert f.describe(broken).startswith(f"rank {rank} (device {broken.devices[rank]}): element ")


@pytest.mark.slow
def test_emitted_module_is_deterministic_and_runs_under_torchrun(tmp_path):
    topo, spec, m, reduction = _setup("local-2x2.yaml", "local-2x2.yaml", "[[2,1],[1,2]]")
    low = lowering_for(topo, spec, m, reduction)
    good = synthesized_runs(topo, spec, m, reduction, 64, top=2)
    bad = reduction_run(topo, low, load_explicit_program("x.yaml", 4, """steps:
  - {op: AllReduce, groups: [[0, 1], [2, 3]]}"""), 64, "hosts only")
    text = module_text([r.plan for r in good])
    assert text == module_text([r.plan for r in good])
    compile(text, "plan.py", "exec")
    assert "solver_planner" not in text.replace("solver-planner", "")
    results = {}
    for name, plans in (("good", [r.plan for r in good]), ("bad", [bad.plan])):
        path = tmp_path / f"{name}.py"
        path.write_text(module_text(plans))
        results[name] = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                                        "--master-port", str(29500 + os.getpid() % 1000 + len(results)), str(path)],
                                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert results["good"].returncode == 0, results["good"].stderr[-2000:]
    assert results["good"].stdout.count(": ok (") == 4 * 2
    assert results["bad"].returncode != 0
    assert "expected" in results["bad"].stdout


@pytest.mark.slow
def test_cli_execute_reduction_reports_steps_and_fails_on_a_wrong_sum(tmp_path):
    cluster, model = CLUSTERS / "local-2x2.yaml", MODELS / "local-2x2.yaml"
    ok = run_cli("execute", "reduction", cluster, model, "--matrix", "[[2,1],[1,2]]", "--top", "2", "-b", "1KiB",
                 "--repeat", "1", "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["ok"] and len(out["plans"]) == 2
    for plan in out["plans"]:
        assert plan["verify"] == "valid" and plan["world"] == 4 and plan["backend"] == "gloo"
        assert all(s["predicted"] > 0 and s["measured"] > 0 for s in plan["steps"])
    program = tmp_path / "hosts-only.yaml"
    program.write_text("steps:\n  - {op: AllReduce, groups: [[0, 1], [2, 3]]}\n")
    emitted = tmp_path / "plan.py"
    bad = run_cli("execute", "reduction", cluster, model, program, "--matrix", "[[2,1],[1,2]]", "-b", "1KiB",
                  "--repeat", "1", "--emit", emitted)
    assert bad.returncode == 1, bad.stderr
    assert "WRONG" in bad.stdout and "rank 0 (device 0): chunk 0, element 0 is" in bad.stdout
    assert "last written by step 1" in bad.stdout
    assert emitted.exists() and "torchrun --nproc-per-node 4" in emitted.read_text()


@pytest.mark.slow
def test_cli_execute_reshard_json():
    r = run_cli("execute", "reshard", CLUSTERS / "local-2x2.yaml", MODELS / "local-2x2.yaml", "--name", "uneven",
                "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    (plan,) = json.loads(r.stdout)["plans"]
    assert plan["ok"] and plan["world"] == 4
    steps = plan["steps"]
    assert steps and all(s["measured"] >= 0 and s["predicted"] > 0 for s in steps)
    assert plan["predicted"] == pytest.approx(max(s["predicted_start"] + s["predicted"] for s in steps))


@pytest.mark.slow
def test_dry_run_is_deterministic_and_needs_no_torch(tmp_path):
    # A torch that cannot be imported, first on the path.
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    args = [sys.executable, "-m", "solver_planner", "execute", "reduction", str(CLUSTERS / "local-2x2.yaml"),
            str(MODELS / "local-2x2.yaml"), "--matrix", "[[2,1],[1,2]]", "--top", "3"]
    first = subprocess.run(args + ["--dry-run", "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    second = subprocess.run(args + ["--dry-run", "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and len(json.loads(first.stdout)["plans"]) == 3
    run = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 2 and "pip install 'solver-planner[torch]'" in run.stderr
    cal = subprocess.run([sys.executable, "-m", "solver_planner", "calibrate", "--world", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert cal.returncode == 2 and "torch" in cal.stderr


@pytest.mark.slow
def test_cli_refuses_more_processes_than_allowed():
    r = run_cli("execute", "reduction", CLUSTERS / "p2-a100-4x16.yaml", MODELS / "p2-example.yaml", "--top", "1")
    assert r.returncode == 2 and "64 local processes" in r.stderr and "--max-ranks 16" in r.stderr
    r = run_cli("execute", "reshard", CLUSTERS / "aws-p3.8xlarge-4.yaml", MODELS / "reshard-2x4-to-2x4.yaml",
                "--max-ranks", "8", "--method", "greedy")
    assert r.returncode == 2 and "16 local processes" in r.stderr
    r = run_cli("execute", "reshard", CLUSTERS / "local-2x2.yaml", MODELS / "local-2x2.yaml", "--memory", "1KiB")
    assert r.returncode == 2 and "--memory" in r.stderr


@pytest.mark.slow
def test_calibrate_writes_a_spec_whose_cost_model_gives_the_reported_predictions(tmp_path):
    out = tmp_path / "local.yaml"
    r = run_cli("calibrate", "--backend", "gloo", "--world", "2", "--sizes", "4KiB,4MiB", "--repeat", "3",
                "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    cal = json.loads(r.stdout)
    topo = load_topology(out)
    assert topo.num_devices == 2 and cal["fit"]["latency"] >= 0 and cal["fit"]["bandwidth"] > 0
    kinds = {m["kind"] for m in cal["measurements"]}
    assert {"p2p", "allreduce", "reducescatter", "allgather", "broadcast", "reduce"} <= kinds
    cost = CostModel(topo)
    for m in cal["measurements"]:
        assert m["median"] > 0 and len(m["times"]) == 3
        if m["kind"] == "p2p":
            predicted = cost.transfer_time(0, 1, m["bytes"])
        elif m["kind"] in ("allreduce", "reducescatter", "allgather", "broadcast", "reduce"):
            predicted = cost.collective(m["kind"], [[0, 1]], m["bytes"]).time
        else:
            continue
        # The spec is written with 6 significant digits.
        assert predicted == pytest.approx(m["predicted"], rel=1e-4)


def test_calibration_fit_recovers_known_parameters_and_survives_noise():
    from solver_planner.distributed.calibrate import Measurement, fit, predict, topology_for

    levels = [("host", 2), ("proc", 2)]
    truth = topology_for(levels, "4 devices", 300e-6, 2e9)
    kinds = ("p2p", "p2p-pairs", "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "allreduce-pairs")
    exact = [Measurement(k, n, (predict(truth, Measurement(k, n, (1.0,))),)) for k in kinds for n in (4096, 1 << 22)]
    fits = {f.sharing: f for f in fit(levels, exact, 4)}
    shared = fits["4 devices"]
    assert shared.latency == pytest.approx(300e-6, rel=1e-6) and shared.bandwidth == pytest.approx(2e9, rel=1e-6)
    assert shared.error < 1e-9 and fits["device"].error > shared.error
    # Larger messages measured faster (noise): still a positive bandwidth that no measurement contradicts.
    noisy = [Measurement("p2p", 4096, (1e-3,)), Measurement("p2p", 1 << 18, (0.9e-3,))]
    for f in fit(levels, noisy, 4):
        assert f.bandwidth > 0 and f.latency >= 0
        no_latency = topology_for(levels, f.sharing, 0.0, f.bandwidth)
        assert all(predict(no_latency, m) <= m.median * (1 + 1e-5) for m in noisy)  # 6 digits in the spec


def test_calibration_fits_an_efficiency_per_collective():
    """Issue 17: calls of one collective slower than the others by a constant factor on their
    bandwidth term come out as that collective's efficiency, the fastest at 1."""
    from solver_planner.distributed.calibrate import Measurement, fit, predict, topology_for

    levels = [("host", 2), ("proc", 2)]
    eff = {"allreduce": 0.25, "broadcast": 0.6, "reduce": 0.5}
    truth = topology_for(levels, "4 devices", 300e-6, 2e9, eff)
    kinds = ("p2p", "p2p-pairs", "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "allreduce-pairs")
    exact = [Measurement(k, n, (predict(truth, Measurement(k, n, (1.0,))),)) for k in kinds for n in (4096, 1 << 22)]
    shared = {f.sharing: f for f in fit(levels, exact, 4)}["4 devices"]
    assert shared.latency == pytest.approx(300e-6, rel=1e-6) and shared.bandwidth == pytest.approx(2e9, rel=1e-6)
    assert shared.efficiency == pytest.approx(eff, rel=1e-6)
    assert shared.error < 1e-9


def test_a_shape_past_the_spec_limit_is_refused_as_the_spec_would_be():
    """`execute reshard --shape` skipped the model spec's 1 PiB tensor limit: a shape of 10^21
    elements overflowed numpy (a traceback, exit 1); 10^18 was priced at 1.2e11 ms."""
    from conftest import run_cli

    base = ["execute", "reshard", ROOT / "specs" / "clusters" / "local-2x4.yaml",
            ROOT / "specs" / "models" / "local-2x4.yaml", "--dry-run", "-n", "uneven"]
    for shape in ("10000000,10000000,10000000", "1000000,1000000,1000000"):
        r = run_cli(*base, "--shape", shape)
        assert r.returncode == 2 and "at most 2**50 (1 PiB)" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert run_cli(*base, "--shape", "64,32,16").returncode == 0
