import json

import pytest

from conftest import CLUSTERS, ROOT, SPECS, run_cli

V100 = CLUSTERS / "p2-v100-2x8.yaml"
DP16 = SPECS / "models" / "dp16.yaml"


def test_place_json_has_the_documented_shape():
    result = run_cli("place", CLUSTERS / "p2-a100-4x16.yaml", SPECS / "models" / "p2-example.yaml", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["count"] == len(data["placements"]) == 3
    costs = []
    for p in data["placements"]:
        assert isinstance(p["matrix"], list) and all(isinstance(r, list) for r in p["matrix"])
        (red,) = p["reductions"]
        assert {"name", "allreduce_time", "best_program", "best_time", "programs"} <= set(red)
        assert red["best_time"] <= red["allreduce_time"] and red["programs"] >= 1
        costs.append(red["best_time"])
    assert costs == sorted(costs)


def test_place_method_enumerate_gives_the_same_placements():
    args = (CLUSTERS / "p2-a100-4x16.yaml", SPECS / "models" / "p2-example.yaml", "--json")
    a = json.loads(run_cli("place", *args, "--method", "cp-sat").stdout)
    b = json.loads(run_cli("place", *args, "--method", "enumerate").stdout)
    assert a["method"] == "cp-sat" and b["method"] == "enumerate"
    assert a["placements"] == b["placements"]


def test_reduce_synth_json():
    data = json.loads(run_cli("reduce", "synth", V100, DP16, "--json").stdout)
    assert data["matrix"] == [[2, 8]] and data["count"] == len(data["programs"]) == 142
    times = [p["time"] for p in data["programs"]]
    assert times == sorted(times) and times[0] < data["allreduce_time"]
    assert any(p["program"] == "ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); "
                              "AllGather(node, InsideGroup)" for p in data["programs"][:3])


def test_reduce_verify_exit_codes():
    good = run_cli("reduce", "verify", V100, DP16, ROOT / "examples" / "hierarchical-allreduce-2x8.yaml")
    assert good.returncode == 0 and ": valid" in good.stdout
    bad = run_cli("reduce", "verify", V100, DP16, ROOT / "examples" / "broken-allreduce-2x8.yaml", "--json")
    assert bad.returncode == 1
    cex = json.loads(bad.stdout)["counterexample"]
    assert (cex["step"], cex["rule"], cex["group"], cex["device"]) == (2, "R-AllReduce", [0, 9], 9)
    dsl = run_cli("reduce", "verify", V100, DP16, "Reduce(node, InsideGroup); AllReduce(node, Master(root)); "
                                                  "Broadcast(node, InsideGroup)", "--engine", "semantics")
    assert dsl.returncode == 0


@pytest.mark.slow
def test_reduce_bad_input_exits_2(tmp_path):
    for args in (["Reduce(node, Sideways)"], ["AllReduce(root, InsideGroup)", "--matrix", "[[2,4]]"],
                 ["AllReduce(root, InsideGroup)", "--reduction", "nope"], ["AllReduce(rack, InsideGroup)"]):
        result = run_cli("reduce", "verify", V100, DP16, *args)
        assert result.returncode == 2, args
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    steps = tmp_path / "s.yaml"
    steps.write_text("steps:\n  - {op: AllReduce, groups: [[0, 99]]}\n")
    result = run_cli("reduce", "verify", V100, DP16, steps)
    assert result.returncode == 2 and f"{steps}:2: steps[0].groups[0]: device 99" in result.stderr


def test_reduce_synth_paper_size_metric_gives_the_papers_47():
    data = json.loads(run_cli("reduce", "synth", V100, DP16, "--json", "--size-metric", "paper").stdout)
    assert data["count"] == 47 and data["size_metric"] == "paper"
    bad = run_cli("reduce", "synth", V100, DP16, "--size-metric", "lines")
    assert bad.returncode == 2 and "size metric" in bad.stderr


def test_reduce_verify_refuses_a_timeout_that_is_not_a_positive_number():
    from typer.testing import CliRunner

    from solver_planner.cli import app
    for value in ("nan", "inf", "-1", "0"):
        result = CliRunner().invoke(app, ["reduce", "verify", str(V100), str(DP16), "AllReduce(root, InsideGroup)",
                                          "--timeout", value])
        assert result.exit_code == 2 and "--timeout must be a positive number" in result.output, value


@pytest.mark.slow
def test_explicit_op_names_are_read_in_any_case(tmp_path):
    steps = tmp_path / "lower.yaml"
    steps.write_text("steps:\n  - {op: reduce_scatter, groups: [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]}\n"
                     "  - {op: allreduce, groups: [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]}\n"
                     "  - {op: ALL-GATHER, groups: [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]}\n")
    assert run_cli("reduce", "verify", V100, DP16, steps).returncode == 0
    steps.write_text("steps:\n  - {op: allsum, groups: [[0, 1]]}\n")
    result = run_cli("reduce", "verify", V100, DP16, steps)
    assert result.returncode == 2 and "steps[0].op" in result.stderr


def test_reduce_verify_unknown_exits_3(monkeypatch):
    import z3
    from typer.testing import CliRunner

    from solver_planner.cli import app
    monkeypatch.setattr(z3.Solver, "check", lambda self, *a: z3.unknown)
    result = CliRunner().invoke(app, ["reduce", "verify", str(V100), str(DP16),
                                      str(ROOT / "examples" / "hierarchical-allreduce-2x8.yaml")])
    assert result.exit_code == 3 and ": unknown" in result.output
    assert "proved" not in result.output.replace("nothing proved", "") and "valid" not in result.output


def test_place_lists_placements_even_without_reductions(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("name: nored\nparallelism:\n  axes:\n    - {name: data, size: 4}\n    - {name: model, size: 8}\n")
    result = run_cli("place", CLUSTERS / "p2-a100-2x16.yaml", model)
    assert result.returncode == 0
    assert "[[1,4],[2,4]]" in result.stdout and "[[2,2],[1,8]]" in result.stdout and "not ranked" in result.stdout


def test_place_with_impossible_constraints_exits_1(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("name: m\nparallelism:\n  axes:\n    - {name: data, size: 4}\n    - {name: model, size: 8}\n"
                     "  constraints:\n    - {axis: model, inside: node}\n    - {axis: data, inside: node}\n")
    result = run_cli("place", CLUSTERS / "p2-a100-2x16.yaml", model)
    assert result.returncode == 1 and "no placement satisfies" in result.stderr


def test_steps_and_matrices_name_what_is_wrong_with_their_numbers(tmp_path):
    """A boolean was read as device 1 (YAML's true), a device listed twice in one group was
    said to be in two groups, and [[-2,-8]] 'multiplies to 16, not the axis size 16'."""
    cluster, model = CLUSTERS / "p2-v100-2x8.yaml", SPECS / "models" / "dp16.yaml"
    for text, said in (("[[true, 1]]", "steps[0].groups[0][0]: expected a number, got true"),
                       ("[[0, 0, 1]]", "device 0 is listed twice in this group"),
                       ("[[0, 1], [1, 2]]", "device 1 is in two groups of one step")):
        steps = tmp_path / "steps.yaml"
        steps.write_text(f"steps:\n  - {{op: AllReduce, groups: {text}}}\n")
        r = run_cli("reduce", "verify", cluster, model, steps, "--matrix", "[[2,8]]")
        assert r.returncode == 2 and said in r.stderr, r.stderr
    for matrix, said in (("[[-2,-8]]", "every entry is a positive integer"), ("[[true,8]]", "cannot read a matrix"),
                         ("[[2.5,8]]", "cannot read a matrix")):
        r = run_cli("reduce", "verify", cluster, model, "AllReduce(root, InsideGroup)", "--matrix", matrix)
        assert r.returncode == 2 and said in r.stderr, r.stderr


def test_a_reduction_over_one_device_says_nothing_is_to_reduce(tmp_path):
    """On one device `reduce synth` printed an empty table of '0 valid programs' and `place`
    named AllReduce the best of 0 programs."""
    from conftest import one_device_cluster

    cluster, model = one_device_cluster(tmp_path), tmp_path / "m.yaml"
    model.write_text("name: m\nparallelism:\n  axes:\n    - {name: data, size: 1}\n"
                     "reductions:\n  - {name: grads, axes: [data], bytes: 100 MB}\n")
    r = run_cli("reduce", "synth", cluster, model)
    assert r.returncode == 0 and "nothing to reduce: every group of the reduction holds one device" in r.stdout
    r = run_cli("place", cluster, model)
    assert r.returncode == 0 and "none needed (one device per group)" in r.stdout
    r = run_cli("place", cluster, model, "--json")
    red = json.loads(r.stdout)["placements"][0]["reductions"][0]
    assert red["nothing_to_reduce"] and red["best_program"] is None
    r = run_cli("execute", "reduction", cluster, model, "--dry-run")      # it printed a blank line, exit 0
    assert r.returncode == 1 and "nothing to reduce" in r.stderr and not r.stdout.strip()
