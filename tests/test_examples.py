"""The Python API (solver_planner/api.py) and the scripts in examples/ work as a user runs them."""

import ast
import doctest
import re
import subprocess
import sys

import pytest

import solver_planner
from solver_planner import api as sp
from solver_planner.errors import OptionError, SpecError
from conftest import CLUSTERS, ROOT, SPECS

EXAMPLES = ROOT / "examples"
P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
LOCAL = SPECS / "models" / "local-2x4.yaml"


def run_example(name, *args, cwd):
    """Run examples/NAME.py from another folder (a script must not depend on the current one)."""
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def checked(name, *args, cwd):
    proc = run_example(name, *args, cwd=cwd)
    assert proc.returncode == 0, f"{name}.py exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_script_is_tested_here():
    tested = {n[len("test_example_"):] for n in globals() if n.startswith("test_example_")}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_examples_use_only_the_exported_api():
    allowed = {"solver_planner", "solver_planner.api", "solver_planner.units"}
    for path in EXAMPLES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith("solver_planner") or name in allowed, f"{path.name} imports {name}"
            if node.__class__ is ast.ImportFrom and node.module == "solver_planner":
                for alias in node.names:
                    assert alias.name in solver_planner.__all__, f"{path.name} imports {alias.name}"


def test_example_place(tmp_path):
    out = checked("place", cwd=tmp_path)
    assert "p2-example on p2-a100-4x16: 3 placements found by" in out
    rows = re.findall(r"^ *(\d+)  (\[\[\S+\]\]) +grads +\S+ \S+ +\S+ \S+ +(\d+\.\d+)x", out, re.M)
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert {r[1] for r in rows} == {"[[1,4],[4,4]]", "[[2,2],[2,8]]", "[[4,1],[1,16]]"}
    assert all(float(r[2]) >= 1.0 for r in rows)         # the best program is never slower than AllReduce
    assert f"best placement {rows[0][1]}" in out


def test_example_verify(tmp_path):
    out = checked("verify", cwd=tmp_path)
    assert "hierarchical-allreduce-2x8.yaml: valid (z3" in out
    assert "broken-allreduce-2x8.yaml: invalid (z3" in out
    assert "counterexample: step 2" in out and "[0, 9]" in out
    assert "the same in the DSL: valid (z3" in out


def test_example_reshard(tmp_path):
    out = checked("reshard", cwd=tmp_path)
    names = ["data-parallel", "data-to-operator", "replicated-to-sharded", "data-and-operator", "dim0-to-dim1",
             "operator-parallel"]
    for name in names:
        row = re.search(rf"^{name} .* (\d+\.\d+)%  (OPTIMAL|FEASIBLE) .* (\d+\.\d+)x$", out, re.M)
        assert row, f"no row for {name}:\n{out}"
        assert float(row.group(3)) >= 0.99           # broadcast is never slower than send/recv
    assert "broadcasts to hosts" in out


def test_example_stages(tmp_path):
    out = checked("stages", cwd=tmp_path)
    assert out.startswith("gpt3-2.6b on aws-p3.8xlarge-2:")
    assert re.search(r"^iteration \S+ \S+ \(simulated\)", out, re.M)
    speedup = re.search(r"eager-1F1B is (\d+\.\d+)x faster", out)
    assert speedup and float(speedup.group(1)) >= 1.0     # the eager family contains 1F1B


@pytest.mark.slow
def test_example_plan(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    out = checked("plan", plan_file, cwd=tmp_path)
    assert plan_file.read_text().startswith("format: solver-planner-plan")
    assert "check of plan.yaml: passed (exit code 0)" in out
    assert re.search(r"program is edited: exit code 1, caught at stage \d+$", out, re.M), out
    assert "FAIL" not in out and " fail " not in out
    # what the script printed is what the file says
    doc = solver_planner.read_plan(plan_file)
    assert f"wrote {plan_file}" in out
    assert re.search(rf"{doc['throughput']:.1f} samples/s", out)


@pytest.mark.slow
def test_example_sweep(tmp_path):
    out = checked("sweep", cwd=tmp_path)
    rows = dict(re.findall(r"^(\S+) +\d+ +(\S+) ", out, re.M))
    assert set(rows) >= {"local-2x4", "aws-p3.8xlarge-2", "p2-v100-2x8", "dgx-h100-4x8", "dgx-a100-8x8"}
    assert re.search(r"^local-2x4 +8 +-  no plan: no stage plan fits", out, re.M)
    planned = re.findall(r"^\S+ +(\d+) +(\d+) +\S+ +\d+ +\S+ \S+ +(\d+\.\d+) +(\d+\.\d+)%", out, re.M)
    assert len(planned) >= 4
    assert all(0 < float(mfu) <= 100 for *_, mfu in planned)
    depths = re.findall(r"^aws-p3.8xlarge-2 +8 +(\d+) ", out, re.M)
    assert {"1", "2", "4", "8"} <= set(depths)


def test_api_doctests(monkeypatch):
    monkeypatch.chdir(ROOT)        # the examples name shipped specs relative to the repository
    result = doctest.testmod(sp, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 20 and result.failed == 0


def test_every_facade_function_is_documented():
    for name in sp.__all__:
        doc = getattr(sp, name).__doc__
        for section in ("Parameters", "Returns", "Raises", "Examples"):
            assert f"\n    {section}\n    ---" in doc, f"{name} has no {section} section"


@pytest.mark.parametrize("module", ["solver_planner", "solver_planner.cli"])
def test_import_stays_light(module):
    # the CLI imports each command's solvers when the command runs: a spec error, --help or
    # validate does not pay for the stage search, OR-Tools or numpy
    code = (f"import sys, {module}; heavy = {{'ortools', 'z3', 'numpy', 'networkx', 'torch', 'matplotlib'}};"
            " print(sorted(heavy & {m.split('.')[0] for m in sys.modules}),"
            " sorted(m for m in sys.modules if m.startswith(('solver_planner.stages', 'solver_planner.plan.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []"


def test_lazy_exports_resolve():
    for name in solver_planner.__all__:
        assert getattr(solver_planner, name) is not None, name
    assert solver_planner.TrainingPlan.__module__ == "solver_planner.plan.compose"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        solver_planner.nothing


def test_load_takes_paths_specs_and_topologies():
    topo, model = sp.load(str(P3), LOCAL)
    assert sp.load(topo, model) == (topo, model)
    again, _ = sp.load(topo.spec, model)
    assert again.name == topo.name and again.num_devices == topo.num_devices
    with pytest.raises(SpecError, match="no such file"):
        sp.load(CLUSTERS / "missing.yaml", LOCAL)


def test_verify_reads_explicit_steps_and_agrees_with_the_rules():
    dp16 = SPECS / "models" / "dp16.yaml"
    v100 = CLUSTERS / "p2-v100-2x8.yaml"
    for name, status in (("hierarchical-allreduce-2x8.yaml", "valid"), ("broken-allreduce-2x8.yaml", "invalid")):
        for program in (EXAMPLES / name, str(EXAMPLES / name)):
            for engine in ("z3", "semantics"):
                assert sp.verify(v100, dp16, program, engine=engine).status == status
    with pytest.raises(OptionError, match="no reduction named 'nope'"):
        sp.verify(P3, LOCAL, "AllReduce(root, InsideGroup)", reduction="nope")
    with pytest.raises(OptionError, match="does not read"):
        sp.verify(P3, LOCAL, "AllReduce(host)", matrix=[[1, 2], [2, 2]])


def test_verify_defaults_to_the_proxy_objectives_placement():
    from solver_planner.placement import log_objective, traffic_weights
    from solver_planner.reduction.ranking import proxy_placement

    topo, spec = sp.load(P3, LOCAL)
    chosen, found = proxy_placement(topo, spec)
    every = sp.place(P3, LOCAL, method="enumerate")[1].solutions
    weights = traffic_weights(spec, topo)
    assert log_objective(chosen, weights) == pytest.approx(min(log_objective(m, weights) for m in every))
    # The default's verdict is the pick's, and some program is valid on one placement but not
    # on another (else the first check could not fail).
    told_apart = False
    for program in ("AllReduce(root, InsideGroup)", "AllReduce(host, InsideGroup)", "AllReduce(host, Parallel(root))"):
        verdicts = {str(m): sp.verify(P3, LOCAL, program, matrix=m, reduction="data-grads").status
                    for m in every}
        assert sp.verify(P3, LOCAL, program, reduction="data-grads").status == verdicts[str(chosen)]
        told_apart |= len(set(verdicts.values())) > 1
    assert told_apart


def test_reshard_takes_problems_built_in_code():
    topo = solver_planner.load_topology(P3)
    problem = solver_planner.ReshardingProblem.build("moved", (64, 32), "float32", topo, ([0], 4, ["S1", "R"]),
                                                     ([1], 4, ["R", "S1"]))
    [result] = sp.reshard(topo, problem)
    assert result.solution.problem is problem
    assert result.objective >= result.bound > 0
    both = sp.reshard(topo, [problem, problem], method="naive")
    assert [r.method for r in both] == ["naive", "naive"]


def test_stages_reads_config_and_split_as_text_or_values():
    gpt = SPECS / "models" / "gpt3-2.6b.yaml"
    a = sp.stages(P3, gpt, config="1,4,2,1024", split="17,17")
    b = sp.stages(P3, gpt, config=(1, 4, 2, 1024), split=[17, 17])
    assert [(s.first, s.last, s.tensor) for s in a.partition.stages] == [(0, 16, 4), (17, 33, 4)]
    assert a.run.iteration_time == b.run.iteration_time
    with pytest.raises(OptionError):
        sp.stages(P3, gpt, config="1,4,2")


def test_plan_file_and_check_from_each_form(tmp_path):
    cluster, model = P3, SPECS / "models" / "u-transformer.yaml"
    path = tmp_path / "u.plan.yaml"
    plan = sp.plan(cluster, model, schedule="1f1b", output=path)
    doc = solver_planner.read_plan(path)
    assert doc["iteration_time"] == plan.iteration_time
    for form in (path, str(path), doc, plan):
        assert sp.check(cluster, model, form).exit_code == 0
    doc["iteration_time"] *= 1.5
    assert sp.check(cluster, model, doc).exit_code == 1
    with pytest.raises(solver_planner.PlanFileError, match="no such plan file"):
        sp.check(cluster, model, tmp_path / "missing.yaml")


def test_readme_python_api_section_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```py\n(.*?)```", section, re.S).group(1)
    for name in re.findall(r"examples/\w+\.py", section):
        assert (ROOT / name).is_file(), name
    monkeypatch.chdir(ROOT)
    plan_file = tmp_path / "gpt3.plan.yaml"
    namespace = {}
    exec(compile(code.replace('"gpt3.plan.yaml"', repr(str(plan_file))), "README.md", "exec"), namespace)
    assert plan_file.is_file() and namespace["report"].exit_code == 0
    assert namespace["verdict"].status == "invalid"
    assert len(namespace["results"]) == 6 and len(namespace["reports"]) == 3
    assert len(namespace["stage_plan"].partition.stages) == 2


def test_example_launch_from_plan():
    """examples/launch_from_plan.py is the launch recipe `plan --emit` writes beside a plan
    (tests/test_run.py runs that copy under torchrun on 8 gloo processes, from another
    folder); it needs only torch and PyYAML."""
    import ast

    example = (EXAMPLES / "launch_from_plan.py").resolve()
    assert example == (ROOT / "solver_planner" / "run" / "launch_from_plan.py").resolve()
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(ast.parse(example.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert {m.split(".")[0] for m in imported if m} <= {"__future__", "os", "sys", "pathlib", "torch", "yaml"}
