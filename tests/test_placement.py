"""Parallelism matrices (P² §3.1, Fig. 2): conformance of the solver model and enumeration."""

import itertools
import math
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from solver_planner.errors import SpecError
from solver_planner.placement import (ParallelismMatrix, PlacementRule, enumerate_matrices, find_placements,
                                      log_objective, resolve_rules)
from solver_planner.spec import load_model_spec

FIG2_LEVELS = (1, 2, 2, 4)  # [(rack,1), (server,2), (CPU,2), (GPU,4)]


def name(device):
    """Fig. 2a's names: CPUs A, B (server 0), C, D (server 1), 4 GPUs each."""
    return "ABCD"[device // 4] + str(device % 4)


def test_fig2_placements_are_all_found():
    found = {m.rows for m in enumerate_matrices([4, 4], FIG2_LEVELS)}
    assert {((1, 2, 2, 1), (1, 1, 1, 4)), ((1, 2, 1, 2), (1, 1, 2, 2)), ((1, 1, 2, 2), (1, 2, 1, 2))} <= found
    assert len(found) == 4  # the fourth puts data on the GPUs: [[1,1,1,4],[1,2,2,1]]


def test_fig2b_every_cpu_is_a_replica_every_gpu_a_shard():
    m = ParallelismMatrix.of([[1, 2, 2, 1], [1, 1, 1, 4]])
    coords = m.assignment(FIG2_LEVELS)
    for d, (data, shard) in enumerate(coords):
        assert data == d // 4 and shard == d % 4  # CPU index, GPU index
    assert sorted(coords) == [(a, b) for a in range(4) for b in range(4)]


def test_fig2d_reduction_groups_along_the_shards():
    # P² §2.2: with Fig. 2d, reducing along parameter shards reduces {A0, A1} and
    # {A2, A3} inside a CPU, and A0 with C0 across servers (Fig. 4b's "A0 and C0").
    m = ParallelismMatrix.of([[1, 1, 2, 2], [1, 2, 1, 2]])
    groups = [sorted(name(d) for d in g) for g in m.reduction_groups(FIG2_LEVELS, axes=[1])]
    assert ["A0", "A1", "C0", "C1"] in groups and ["A2", "A3", "C2", "C3"] in groups
    assert len(groups) == 4 and all(len(g) == 4 for g in groups)


def test_fig2c_assignment():
    m = ParallelismMatrix.of([[1, 2, 1, 2], [1, 1, 2, 2]])
    # GPU level 4 = data 2 x shard 2 (data most significant); CPU level carries shards.
    assert m.axis_coords(FIG2_LEVELS, 0) == (0, 0)
    assert m.axis_coords(FIG2_LEVELS, 1) == (0, 1)
    assert m.axis_coords(FIG2_LEVELS, 2) == (1, 0)
    assert m.axis_coords(FIG2_LEVELS, 4) == (0, 2)   # B0: the second CPU holds shards 2, 3
    assert m.axis_coords(FIG2_LEVELS, 8) == (2, 0)   # C0: server 1 holds data 2, 3


def test_device_at_inverts_axis_coords():
    for m in enumerate_matrices([4, 2, 6], [2, 4, 6]):
        for d in range(48):
            assert m.device_at((2, 4, 6), m.axis_coords((2, 4, 6), d)) == d


def test_check_refuses_bad_matrices():
    with pytest.raises(ValueError, match="row 0"):
        ParallelismMatrix.of([[1, 2], [2, 8]]).check([4, 16], [2, 16])
    with pytest.raises(ValueError, match="column"):
        ParallelismMatrix.of([[2, 2], [2, 8]]).check([4, 16], [2, 32])
    ParallelismMatrix.of([[1, 4], [2, 4]]).check([4, 8], [2, 16])


def test_parse_matrix():
    assert ParallelismMatrix.parse("[[1,2],[2,8]]") == ParallelismMatrix.parse("1,2;2,8")
    with pytest.raises(ValueError, match="cannot read"):
        ParallelismMatrix.parse("[[1,2],")


def brute_force(axis_sizes, level_counts):
    """Every integer matrix with entries dividing their level counts that satisfies Eq. 1-2."""
    n, m = len(axis_sizes), len(level_counts)
    choices = [[d for d in range(1, h + 1) if h % d == 0] for h in level_counts] * n
    out = set()
    for flat in itertools.product(*choices):
        rows = tuple(tuple(flat[i * m:(i + 1) * m]) for i in range(n))
        if all(math.prod(r) == p for r, p in zip(rows, axis_sizes)) and \
                all(math.prod(r[j] for r in rows) == h for j, h in enumerate(level_counts)):
            out.add(rows)
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3).flatmap(
    lambda levels: st.tuples(st.just(levels), st.permutations(
        [f for h in levels for f in _split(h)]).map(lambda fs: _group(fs)))))
def test_solver_enumeration_and_brute_force_agree(case):
    level_counts, axis_sizes = case
    expected = brute_force(axis_sizes, level_counts)
    for method in ("cp-sat", "enumerate"):
        result = find_placements(axis_sizes, level_counts, method=method)
        assert {m.rows for m in result.solutions} == expected
        assert result.method == method
        for m in result.solutions:
            m.check(axis_sizes, level_counts)


def _split(h):
    """Prime factors of h (1 for h == 1)."""
    out, q = [], 2
    while h > 1:
        while h % q == 0:
            out.append(q)
            h //= q
        q += 1
    return out or [1]


def _group(factors):
    """Cut a list of factors into 1-3 axis sizes whose product is the device count."""
    k = 1 + len(factors) % 3
    sizes = [1] * k
    for i, f in enumerate(factors):
        sizes[i % k] *= f
    return sizes


def test_optimum_is_at_least_as_good_as_every_enumerated_matrix():
    weights = [[0.0, 3.0, 1.0], [0.5, 0.1, 0.0], [2.0, 0.0, 0.25]]
    best = find_placements([4, 6, 4], [2, 6, 8], weights=weights, method="cp-sat")
    assert best.status.value == "OPTIMAL" and best.gap == 0
    values = [log_objective(m, weights) for m in enumerate_matrices([4, 6, 4], [2, 6, 8])]
    assert best.objective == pytest.approx(min(values))
    assert best.objective == pytest.approx(log_objective(best.solution, weights))
    enum = find_placements([4, 6, 4], [2, 6, 8], weights=weights, method="enumerate")
    assert enum.objective == pytest.approx(best.objective)


def test_rules_restrict_both_methods_alike():
    rules = [PlacementRule(1, "inside", 2)]  # shards never leave a CPU
    for method in ("cp-sat", "enumerate"):
        found = [m.rows for m in find_placements([4, 4], FIG2_LEVELS, rules, method=method).solutions]
        assert found == [((1, 2, 2, 1), (1, 1, 1, 4))]
    rules = [PlacementRule(0, "fix", 3, 2), PlacementRule(1, "not_split_over", 1)]
    for method in ("cp-sat", "enumerate"):
        found = [m.rows for m in find_placements([4, 4], FIG2_LEVELS, rules, method=method).solutions]
        assert found == [((1, 2, 1, 2), (1, 1, 2, 2))]
    impossible = [PlacementRule(0, "fix", 3, 3)]
    for method in ("cp-sat", "enumerate"):
        result = find_placements([4, 4], FIG2_LEVELS, impossible, method=method)
        assert result.solutions == [] and result.status.value == "INFEASIBLE"


def test_auto_says_which_method_it_used(monkeypatch):
    import solver_planner.placement.search as search
    small = find_placements([4, 4], FIG2_LEVELS)
    assert small.method == "cp-sat"
    monkeypatch.setattr(search, "AUTO_THRESHOLD", 4)  # 2 axes x 4 levels x 1 prime = 8 variables
    big = find_placements([4, 4], FIG2_LEVELS)
    assert big.method == "enumerate" and [m.rows for m in big.solutions] == [m.rows for m in small.solutions]


MODEL = textwrap.dedent("""\
    name: m
    parallelism:
      axes:
        - {name: data, size: 4}
        - {name: model, size: 16}
      constraints:
        - {axis: model, inside: node}
        - {axis: data, not_split_over: gpu}
    """)


def test_rules_from_the_model_spec(a100x4):
    rules = resolve_rules(load_model_spec("m.yaml", MODEL), a100x4)
    assert rules == [PlacementRule(1, "inside", 0), PlacementRule(0, "not_split_over", 1)]
    found = find_placements([4, 16], [4, 16], rules).solutions
    assert [m.rows for m in found] == [((4, 1), (1, 16))]


@pytest.mark.parametrize("old, new, line, path, message", [
    ("inside: node", "inside: rack", 7, "parallelism.constraints[0].inside", "no level named 'rack'"),
])
def test_rule_naming_an_unknown_level(a100x4, old, new, line, path, message):
    with pytest.raises(SpecError) as info:
        resolve_rules(load_model_spec("m.yaml", MODEL.replace(old, new)), a100x4)
    issue = info.value.issues[0]
    assert (issue.line, issue.path) == (line, path) and message in issue.message


@pytest.mark.parametrize("old, new, line, path, message", [
    ("{axis: model, inside: node}", "{axis: modle, inside: node}", 7, "parallelism.constraints[0].axis", "no axis"),
    ("{axis: model, inside: node}", "{axis: model}", 7, "parallelism.constraints[0]", "exactly one of"),
    ("{axis: model, inside: node}", "{axis: model, level: node}", 7, "parallelism.constraints[0]", "go together"),
])
def test_bad_rules_in_the_spec(old, new, line, path, message):
    with pytest.raises(SpecError) as info:
        load_model_spec("m.yaml", MODEL.replace(old, new))
    issue = info.value.issues[0]
    assert (issue.line, issue.path) == (line, path) and message in issue.message


def _binary_tree(tmp_path, n: int):
    """n levels of 2 devices each (2**n devices) and a model of n axes of size 2."""
    levels = "".join(f"  - {{name: l{j}, count: 2}}\n" for j in range(n))
    links = "".join(f"  - {{name: n{j}, level: l{j}, bandwidth: 10 GB/s, latency: 1us, sharing: device}}\n"
                    for j in range(n))
    cluster = tmp_path / "tree.yaml"
    cluster.write_text(f"name: tree\nlevels:\n{levels}device: {{name: X, flops: 100 TFLOP/s, memory: 16 GiB,"
                       f" memory_bandwidth: 1 TB/s}}\ninterconnects:\n{links}")
    axes = "".join(f"    - {{name: a{i}, size: 2}}\n" for i in range(n))
    model = tmp_path / "axes.yaml"
    model.write_text(f"name: axes\nparallelism:\n  axes:\n{axes}reductions:\n  - {{name: g, axes: [a0, a1, a2],"
                     " bytes: 1 GB}\n")
    return cluster, model


def test_sixteen_axes_on_sixteen_levels_have_one_placement_found_and_the_list_refused(tmp_path):
    """16! matrices: `reduce verify` without --matrix listed them all to pick one (it never
    ended), and `place` listed them for 100 s before its memory bound refused them."""
    from conftest import run_cli
    from solver_planner.placement.enumerate import enumerate_matrices
    from solver_planner.placement.search import find_placements

    one = find_placements([2] * 16, [2] * 16, weights=[[1.0] * 16] * 16, every=False)
    assert one.method == "cp-sat" and one.solution is not None
    one.solution.check([2] * 16, [2] * 16)
    first = enumerate_matrices([2] * 16, [2] * 16, limit=5)
    assert len(first) == 5 and first == sorted(first, key=lambda m: m.rows)
    assert enumerate_matrices([2, 2], [2, 2], limit=5) == enumerate_matrices([2, 2], [2, 2])   # 2 of them
    cluster, model = _binary_tree(tmp_path, 16)
    r = run_cli("place", cluster, model, "--top", "1")
    assert r.returncode == 2 and "for at least 14 placement(s)" in r.stderr and "refused before starting" in r.stderr
    r = run_cli("reduce", "verify", cluster, model, "AllReduce(root, InsideGroup)")
    assert r.returncode == 0 and "valid" in r.stdout and "(cp-sat; give --matrix to choose)" in r.stdout, r.stderr


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=6, max_size=6), min_size=6, max_size=6))
def test_one_placement_from_cp_sat_is_the_best_of_every_matrix_listed(weights):
    """Above 1 000 matrices by the bound, one placement asked for is CP-SAT's optimum, not the
    best of a list (`reduce verify` without --matrix): checked against listing all 720 of six
    axes of 2 on six levels of 2 (the bound says 46 656) under random traffic weights."""
    from solver_planner.placement.search import count_bound, log_objective

    sizes = [2] * 6
    assert count_bound(sizes, sizes) > 1000
    one = find_placements(sizes, sizes, weights=weights, every=False)
    assert one.method == "cp-sat"
    listed = enumerate_matrices(sizes, sizes)
    best = min(log_objective(m, weights) for m in listed)
    assert log_objective(one.solution, weights) == pytest.approx(best, abs=1e-6)


@given(st.integers(1, 100_000), st.integers(1, 64), st.integers(0, 8))
def test_the_placements_ranked_under_the_bound_are_the_most_the_estimate_allows(devices, per_host, reductions):
    """`place` lists placements only up to max_placements + 1: that count must be exactly where
    the ranking's estimate passes the bound, so the cut list is refused when the whole list
    would have been and nothing that fitted is refused."""
    from solver_planner.memory import MEMORY_BOUND, max_placements, ranking_estimate

    n = max_placements(devices, per_host, reductions)
    assert ranking_estimate(devices, per_host, n + 1, reductions).bytes > MEMORY_BOUND
    if n:
        assert ranking_estimate(devices, per_host, n, reductions).bytes <= MEMORY_BOUND
