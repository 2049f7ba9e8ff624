"""The port of Alpa's inter-operator stage DP (benchmarks/alpa_dp.py) against a brute force,
Alpa's own loop order, and our cost tables."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from alpa_dp import (ALPA_GAP, INFINITY_N_STAGES, alpa_inputs, alpa_objective, equal_mesh_dp,  # noqa: E402
                     get_submesh_choices, max_n_succ_stages_of, training_dp, training_dp_impl,
                     training_dp_impl_loops)


def brute_force(L, N, B, choices, C, cost, succ):
    """Least ``sum + (B - 1) * max`` over every sequence of contiguous stages, each with a
    submesh choice and a config, using exactly ``N`` devices, stage ``p`` of ``S`` followed by
    ``S - 1 - p <= max_n_succ_stages`` stages.  Returns (cost, stages) or (inf, None)."""
    sizes = [a * b for a, b in choices]
    best = [np.inf, None]

    def extend(start, left, stages):
        if start == L:
            if left:
                return
            S = len(stages)
            if any(succ[a, b - 1, m, c] < S - 1 - p for p, ((a, b), m, c) in enumerate(stages)):
                return
            times = [cost[a, b - 1, m, c] for (a, b), m, c in stages]
            value = sum(times) + (B - 1) * max(times)
            if value < best[0]:
                best[:] = [value, list(stages)]
            return
        for end in range(start + 1, L + 1):
            for m, n in enumerate(sizes):
                if n > left:
                    continue
                for c in range(C):
                    if np.isfinite(cost[start, end - 1, m, c]):
                        extend(end, left - n, stages + [((start, end), m, c)])

    extend(0, N, [])
    return best[0], best[1]


def random_instance(rng):
    L = int(rng.integers(2, 6))
    H = int(rng.integers(1, 3))
    M = int(rng.choice([1, 2, 4]))
    choices = get_submesh_choices(H, M)
    C = int(rng.integers(1, 4))
    # costs on a grid of 1/64: every sum and product below is exact in float64, and distinct
    # costs are further apart than Alpa's gap (its skip is tested on its own below)
    cost = rng.integers(1, 200, size=(L, L, len(choices), C)) / 64.0
    cost[rng.random(cost.shape) < 0.25] = np.inf
    succ = rng.integers(-1, L + 1, size=cost.shape)
    succ[rng.random(cost.shape) < 0.2] = INFINITY_N_STAGES
    B = int(rng.integers(1, 9))
    return L, H * M, B, choices, C, cost, succ


def check_solution(solution, L, N, choices, cost, succ):
    """A solution is contiguous, covers every layer, uses every device, obeys the memory rule."""
    assert solution[0][0][0] == 0 and solution[-1][0][1] == L
    for ((_, b), _, _), ((a2, _), _, _) in zip(solution, solution[1:]):
        assert b == a2
    assert sum(choices[m][0] * choices[m][1] for _, m, _ in solution) == N
    S = len(solution)
    for p, ((a, b), m, c) in enumerate(solution):
        assert a < b and np.isfinite(cost[a, b - 1, m, c])
        assert succ[a, b - 1, m, c] >= S - 1 - p


def test_submesh_choices_are_alphas():
    assert get_submesh_choices(2, 4) == ((1, 1), (1, 2), (1, 4), (2, 4))
    assert get_submesh_choices(1, 1) == ((1, 1),)
    assert get_submesh_choices(8, 8) == ((1, 1), (1, 2), (1, 4), (1, 8)) + tuple((n, 8) for n in range(2, 9))
    assert get_submesh_choices(8, 8, "power_of_two")[4:] == ((2, 8), (4, 8), (8, 8))
    assert get_submesh_choices(8, 8, "small_power_of_two")[4:] == ((2, 8), (4, 8))
    with pytest.raises(ValueError):
        get_submesh_choices(2, 6)


def test_training_dp_equals_brute_force():
    rng = np.random.default_rng(20220711)
    solved = 0
    for _ in range(500):
        L, N, B, choices, C, cost, succ = random_instance(rng)
        want, _ = brute_force(L, N, B, choices, C, cost, succ)
        got, solution = training_dp(L, N, B, choices, C, cost, succ)
        assert got == want
        if np.isinf(want):
            assert solution is None
            continue
        solved += 1
        check_solution(solution, L, N, choices, cost, succ)
        assert alpa_objective(solution, cost, B) == got
    assert solved >= 200           # the comparison is not mostly between two infs


def test_vectorised_dp_is_alphas_loop():
    """Each DP (one t_max) returns what Alpa's nested loops return: cost, and the same
    solution (Alpa's tie-breaking) on a grid where ties are frequent."""
    rng = np.random.default_rng(5)
    for _ in range(60):
        L, N, B, choices, C, cost, succ = random_instance(rng)
        cost = np.where(np.isfinite(cost), np.ceil(cost * 4) / 4, np.inf)    # many equal costs
        for t in np.unique(cost)[::3]:
            assert training_dp_impl(L, N, B, choices, C, cost, succ, t) == \
                training_dp_impl_loops(L, N, B, choices, C, cost, succ, t)


def test_skipping_the_infeasible_prefix_changes_nothing():
    rng = np.random.default_rng(11)
    fewer = 0
    for _ in range(80):
        L, N, B, choices, C, cost, succ = random_instance(rng)
        # costs off the grid, some closer than Alpa's gap: the skip's replay of the gap rule counts
        cost = cost + rng.integers(0, 3, size=cost.shape) * 4e-7
        fast, slow = {}, {}
        a = training_dp(L, N, B, choices, C, cost, succ, stats=fast)
        b = training_dp(L, N, B, choices, C, cost, succ, skip_infeasible_prefix=False,
                        impl=training_dp_impl_loops, stats=slow)
        assert a == b
        fewer += fast["dps"] < slow["dps"]
    assert fewer > 10


def test_gap_skip_is_kept_as_alpa_has_it():
    """Alpa skips a t_max within 1e-6 of the last one evaluated; here that hides the best
    plan (two stages, the larger costing 1 + 5e-7), and Alpa's DP returns the one-stage plan."""
    choices = get_submesh_choices(1, 2)              # (1, 1), (1, 2)
    cost = np.full((2, 2, 2, 1), np.inf)
    cost[0, 0, 0, 0] = 1.0                           # layer 0 on one device
    cost[1, 1, 0, 0] = 1.0 + 5e-7                    # layer 1 on the other
    cost[0, 1, 1, 0] = 1.5                           # both layers on both devices
    succ = np.full(cost.shape, INFINITY_N_STAGES)
    B = 4
    two = 2.0 + 5e-7 + (B - 1) * (1.0 + 5e-7)
    assert brute_force(2, 2, B, choices, 1, cost, succ)[0] == two
    assert training_dp(2, 2, B, choices, 1, cost, succ) == (B * 1.5, [((0, 2), 1, 0)])
    assert training_dp(2, 2, B, choices, 1, cost, succ, skip_infeasible_prefix=False) == (B * 1.5, [((0, 2), 1, 0)])
    stats = {}
    assert training_dp(2, 2, B, choices, 1, cost, succ, gap=0.0, skip_infeasible_prefix=False, stats=stats) == \
        (two, [((0, 1), 0, 0), ((1, 2), 0, 0)])
    # t_max = 1 (no plan), 1 + 5e-7 (the two stages); then 1.5 * B >= best stops the loop
    assert stats["dps"] == stats["alpa_dps"] == 2
    assert ALPA_GAP == 1e-6


def test_memory_rule_counts_successors():
    """A stage allowed ``s`` successors is refused as the first of ``s + 2`` stages."""
    choices = get_submesh_choices(1, 4)              # (1,1), (1,2), (1,4)
    L = 3
    cost = np.full((L, L, 3, 1), np.inf)
    for i in range(L):
        cost[i, i, 0, 0] = 1.0                       # one layer per device, on 1 device each
    cost[0, 0, 1, 0] = 1.0                           # layer 0 on two devices
    succ = np.full(cost.shape, INFINITY_N_STAGES)
    # plan: layer 0 on (1,2) then layers 1, 2 on (1,1): 3 stages, the first has 2 successors
    assert training_dp(L, 4, 2, choices, 1, cost, succ)[0] == 3.0 + 1.0
    succ[0, 0, 1, 0] = 1
    assert training_dp(L, 4, 2, choices, 1, cost, succ) == (np.inf, None)
    assert brute_force(L, 4, 2, choices, 1, cost, succ)[0] == np.inf


@pytest.fixture(scope="module")
def p3_2_6b():
    return alpa_inputs(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml", ROOT / "specs/models/gpt3-2.6b.yaml", 1024)


def test_wiring_on_a_shipped_instance(p3_2_6b):
    from solver_planner.stages.costs import MeshShape, StageConfig, StageCosts
    from solver_planner.stages.layers import layer_model
    from solver_planner.stages.search import StageSearch
    from solver_planner.spec import load_model_spec
    from solver_planner.topology import load_topology

    inp = p3_2_6b
    assert inp.num_devices == 8 and inp.submesh_choices == ((1, 1), (1, 2), (1, 4), (2, 4))
    assert inp.num_layers == 34
    cost, solution = inp.solve()
    assert np.isfinite(cost) and solution
    check_solution(solution, inp.num_layers, 8, inp.submesh_choices, inp.compute_cost, inp.max_n_succ_stages)
    assert sum(np.prod(inp.submesh_choices[m]) for _, m, _ in solution) == 8
    assert alpa_objective(solution, inp.compute_cost, 1024) == pytest.approx(cost, rel=1e-12)
    # the arrays against the tables they come from
    topo = load_topology(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml")
    lm = layer_model(load_model_spec(ROOT / "specs/models/gpt3-2.6b.yaml"))
    costs = StageCosts(lm, topo, MeshShape(1, 4), 1024, StageSearch(lm, topo, "1f1b").tables(MeshShape(1, 4)))
    c = inp.configs.index(StageConfig(4))
    cc = costs[StageConfig(4)]
    assert inp.compute_cost[3, 20, 2, c] == cc.forward[3, 20] + cc.backward[3, 20]
    assert np.isinf(inp.compute_cost[20, 3, 2, c])
    # one sample per micro-batch: a (2, 4) mesh has no config (data degree 8/t does not divide 1)
    assert np.isinf(inp.compute_cost[:, :, 3, :]).all()
    # equal meshes are a restriction of the same DP
    eq_cost, eq_solution, m = equal_mesh_dp(inp)
    assert np.isfinite(eq_cost) and {s for _, s, _ in eq_solution} == {m}
    check_solution(eq_solution, inp.num_layers, 8, inp.submesh_choices, inp.compute_cost, inp.max_n_succ_stages)
    assert eq_cost >= cost


def test_port_on_real_tables_is_alphas_loop(p3_2_6b):
    """On our cost tables (identical blocks: many equal and nearly equal stage costs), the
    vectorised DP is Alpa's loop, and skipping the infeasible t_max changes nothing."""
    tiny = alpa_inputs(ROOT / "specs/clusters/local-2x4.yaml", ROOT / "specs/models/gpt-tiny.yaml", 8)
    args = (tiny.num_layers, tiny.num_devices, 8, tiny.submesh_choices, len(tiny.configs), tiny.compute_cost,
            tiny.max_n_succ_stages)
    for t in np.unique(tiny.compute_cost)[:-1:7]:
        assert training_dp_impl(*args, t) == training_dp_impl_loops(*args, t)
    assert tiny.solve() == tiny.solve(skip_infeasible_prefix=False, impl=training_dp_impl_loops)
    stats = {}
    assert p3_2_6b.solve(stats=stats) == p3_2_6b.solve(skip_infeasible_prefix=False)
    assert stats["dps"] < stats["alpa_dps"]


def test_max_n_succ_stages_is_the_memory_model(p3_2_6b):
    from solver_planner.stages.costs import MeshShape, StageCosts
    from solver_planner.stages.layers import layer_model
    from solver_planner.stages.search import StageSearch
    from solver_planner.spec import load_model_spec
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml")
    lm = layer_model(load_model_spec(ROOT / "specs/models/gpt3-2.6b.yaml"))
    costs = StageCosts(lm, topo, MeshShape(1, 2), 256, StageSearch(lm, topo, "1f1b").tables(MeshShape(1, 2)))
    dev = costs.device_memory
    seen = set()
    for cfg in costs.configs:
        s = max_n_succ_stages_of(costs, cfg)
        upper = np.triu(np.ones(s.shape, dtype=bool))
        assert (s[~upper] == -1).all()
        for k, i in zip(*np.nonzero(upper)):
            n = int(s[k, i])
            seen.add(min(n, 2))
            if n == -1:
                assert costs.memory(cfg, 1)[k, i] > dev
                continue
            assert costs.memory(cfg, n + 1)[k, i] <= dev
            assert n == INFINITY_N_STAGES or costs.memory(cfg, n + 2)[k, i] > dev
    assert seen == {-1, 0, 1, 2}          # the instance exercises each case


def test_unequal_script_quick():
    import subprocess
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "unequal.py"), "--quick"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "aws-p3.8xlarge-2" in out.stdout and "improvement" in out.stdout


@pytest.mark.parametrize("cluster, name, B, faster", [
    ("aws-p3.8xlarge-2", "gpt3-1.3b", 256, True), ("aws-p3.8xlarge-2", "gpt3-1.3b", 1024, True),
    # the instance where neither of our programs reached Alpa's plan (16.62 s against 16.33 s)
    # until the candidates of Alpa's own objective
    ("p2-a100-2x16", "gpt3-15b", 128, False)])
def test_unequal_search_is_never_slower_than_alpas_plan(cluster, name, B, faster):
    """The README's comparison, on three of its instances (ours strictly faster on two): our
    search with unequal meshes, fixed to Alpa's micro-batch count, is at least as fast by
    simulated time as Alpa's training_dp plan placed the same way, and the bound it proves
    is below Alpa's plan too (it covers every plan of that count)."""
    import math

    from alpa_compare import alpa_plan_time
    from unequal import load_model
    from solver_planner.stages.search import StageSearch, plan_partition
    from solver_planner.stages.unequal import search_unequal
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs/clusters" / f"{cluster}.yaml")
    model = load_model(name)
    search = StageSearch(model, topo, "1f1b", microbatches=[B])
    inputs = alpa_inputs(topo, model, B, search=search)
    _, solution = inputs.solve()
    alpa = alpa_plan_time(topo, model, inputs, solution, search)
    equal = plan_partition(search)
    covered = [(p.costs.shape, p.B, p.S) for p in search.pairs()]
    ours = search_unequal(search, equal, None, covered, equal.bound)
    assert math.isfinite(alpa) and ours.objective <= alpa * (1 + 1e-9)
    assert ours.bound <= alpa * (1 + 1e-9) and ours.bound <= ours.objective * (1 + 1e-9)
    if faster:
        assert ours.objective < alpa      # these two instances: strictly faster (README table)
