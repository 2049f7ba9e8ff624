"""The link bound (stages/link.py): two neighbouring stages and their channel played out alone."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.cost import CostModel
from solver_planner.stages import Layer, LayerModel, MeshShape, Schedule, family, simulate_schedule
from solver_planner.stages.costs import StageCosts, cost_tables
from solver_planner.stages import link, objective
from solver_planner.stages.link import PC, PF, PW, QC, QF, QW, link_numbers, link_steps, link_time
from solver_planner.stages.objective import bounds
from solver_planner.stages.partition import Partition, StagePlan
from solver_planner.stages.problem import PairProblem
from solver_planner.stages.schedule import stage_order

from test_stages_objective import topology

SCHEDULES = [Schedule("1f1b"), Schedule("gpipe"), Schedule("zb-h1")] + family("eager-1f1b", 4)


@pytest.mark.parametrize("S, B", [(2, 1), (2, 5), (4, 3), (4, 9), (6, 16)])
@pytest.mark.parametrize("delays", [(False, False), (True, False), (False, True), (True, True)])
def test_the_steps_run_each_stage_in_its_order_and_after_what_it_waits_for(S, B, delays):
    for schedule in SCHEDULES + family("eager-1f1b", S):
        for p in range(S - 1):
            steps = link_steps(schedule, S, p, B, *delays)
            mine = [(op, m) for op, m in stage_order(schedule, S, p, B, delays[0])]
            theirs = [(op, m) for op, m in stage_order(schedule, S, p + 1, B, delays[1])]
            names = {PF: "F", PW: "BW", QF: "F", QW: "BW"}
            chain = "BA" if schedule.split else "B"
            got_p = [(names.get(code, chain), m) for code, m in steps if code in (PF, PC, PW)]
            got_q = [(names.get(code, chain), m) for code, m in steps if code in (QF, QC, QW)]
            assert got_p == mine and got_q == theirs, (schedule, p)
            at = {step: i for i, step in enumerate(steps)}
            for m in range(B):
                assert at[PF, m] < at[QF, m] and at[QC, m] < at[PC, m], (schedule, p, m)


def two_hosts(B: int, act_mib: float, layers: int = 2):
    """``layers`` stages of one GPU each on two hosts joined by 1 GB/s, no parameters (no
    gradient reductions or optimizer step): the link and the stages are the whole iteration."""
    topo = topology(2, 1, "1 GB/s", "host") if layers == 2 else topology(2, 2, "1 GB/s", "host")
    act = act_mib * 2**20
    model = LayerModel("link", [Layer(f"l{i}", 2e11, 4e11, 0.0, 0.0, act, act, 0.0, allreduces=0, weight=2e11)
                                for i in range(layers)], max(16, B), None)
    shape = MeshShape(1, 1)
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)
    return Partition(costs, [StagePlan(p, p, costs.configs[0]) for p in range(layers)])


@pytest.mark.parametrize("B", [1, 2, 4, 8, 16, link.LINK_MICROBATCHES])
@pytest.mark.parametrize("kind", ["1f1b", "gpipe", "eager-1f1b", "zb-h1"])
def test_two_stages_and_their_link_are_the_whole_iteration(kind, B):
    """On two stages whose transfers outlast their ops and nothing else runs, the link bound
    plays out every task of the iteration: the objective is the simulated time (the other
    bounds count one transfer per crossing: up to 40% under it)."""
    plan = two_hosts(B, act_mib=16)
    assert plan.activation_time(0, 1) > 2 * max(plan.forward)
    for schedule in family(kind, 2):
        run = simulate_schedule(plan, schedule)
        assert bounds(plan, schedule).value == pytest.approx(run.iteration_time, rel=1e-9), schedule


def test_past_its_limit_the_link_bound_is_left_out(monkeypatch):
    """One micro-batch past ``LINK_MICROBATCHES`` the bound is not played: under ZB-H1 on two
    link-paced stages the objective without the playout bound, exact at the limit, is then 5%
    below the simulated time (a lower bound all the same).  The playout bound, which has no
    such limit on two stages, sees this plan too."""
    schedule = Schedule("zb-h1")         # exact at the limit (above); the others see it without
    for B, below in ((link.LINK_MICROBATCHES, False), (link.LINK_MICROBATCHES + 1, True)):
        plan = two_hosts(B, act_mib=16)
        run = simulate_schedule(plan, schedule)
        with monkeypatch.context() as patch:
            patch.setattr(objective, "PLAYOUT_CELLS", 0)
            assert (bounds(plan, schedule).value < 0.99 * run.iteration_time) == below, B
        assert 0.99 * run.iteration_time <= bounds(plan, schedule).value <= run.iteration_time * (1 + 1e-9), B


def test_the_link_bound_stays_below_the_simulation_when_other_links_share_the_ports():
    """Four stages on two hosts of two GPUs: the channel between hosts shares no port with
    another, those inside share the host's NVLink ports with the next channel's; the bound
    leaves out every wait for another channel, so it stays at or below the simulated time."""
    plan = two_hosts(8, act_mib=16, layers=4)
    for schedule in family("eager-1f1b", 4) + [Schedule("1f1b")]:
        run = simulate_schedule(plan, schedule)
        b = bounds(plan, schedule)
        assert b.value <= run.iteration_time * (1 + 1e-9)
        assert b.value >= 0.97 * run.iteration_time, (schedule, b, run.iteration_time)


def test_the_relaxation_reads_the_link_bound_on_cells(monkeypatch):
    """R5 of a whole plan (the programs' arrays) counts the link bound: on two stages with
    nothing after the link and no tails it is the objective (the round trip after stage 1
    and the drains, which the cells do not know, are 0 here); without it R is lower."""
    plan = two_hosts(8, act_mib=16)
    schedules = family("eager-1f1b", 2)
    objective = min(bounds(plan, s).value for s in schedules)
    r5 = PairProblem(plan.costs, schedules).terms(plan.stages)[4]
    assert r5 == pytest.approx(objective, rel=1e-9)
    monkeypatch.setattr(PairProblem, "_links_on", lambda self: False)
    without = PairProblem(plan.costs, schedules).terms(plan.stages)
    assert max(without) < 0.97 * objective, without


def test_a_link_that_does_not_pace_adds_nothing():
    """Transfers shorter than the sender's forward and the receiver's chain op never wait for
    each other: the link bound is not computed (-inf), the bounds are what they were."""
    plan = two_hosts(8, act_mib=0.01)
    from solver_planner.stages import objective

    assert objective._link_bound(plan, Schedule("1f1b"), (False, (0, 0)), None, plan.forward, plan.backward,
                                 {(0, 1): plan.activation_time(0, 1)}, {(0, 1): plan.gradient_time(1, 0)},
                                 [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]) == -math.inf


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCHEDULES + family("eager-1f1b", 5)), st.integers(2, 5), st.integers(1, 12),
       st.booleans(), st.booleans(), st.lists(st.floats(0.0, 10.0), min_size=9, max_size=9))
def test_the_compiled_steps_are_the_loop(schedule, S, B, dp, dq, values):
    """link_numbers (one straight-line function per order) = link_time (the loop) on numbers
    = link_time on arrays, exactly: R5 plays a few pairs of cells one by one and more as
    arrays, and a plan's terms must not depend on which."""
    import numpy as np

    for p in range(S - 1):
        steps = link_steps(schedule, S, p, B, dp, dq)
        want = link_time(steps, B, *values)
        arrays = link_time(steps, B, *(np.array([v, v]) for v in values), mx=np.maximum)
        assert all(list(x) == [y, y] for x, y in zip(arrays, want))
        for _ in range(link.COMPILE_AFTER + 1):       # the loop until compiled, then the function
            assert link_numbers(schedule, S, p, B, dp, dq)(*values) == want
        # with each chain op's end (the objective's backlog): the same four, and the ends
        # agree with the loop's, compiled or not
        loop = link_time(steps, B, *values, ends=True)
        assert loop[:4] == want and len(loop[4]) == B and loop[4][B - 1] == want[0]
        for _ in range(link.COMPILE_AFTER + 1):
            assert link_numbers(schedule, S, p, B, dp, dq, ends=True)(*values) == loop


def test_r5_plays_cells_alike_one_by_one_as_arrays_and_in_slices(monkeypatch):
    """R5's link term of a batch of cell pairs does not depend on how it is played: in Python
    numbers (a few pairs), as arrays, or as arrays in slices (many pairs)."""
    import numpy as np

    from solver_planner.stages import problem

    plan = two_hosts(8, act_mib=16)
    pair = PairProblem(plan.costs, family("eager-1f1b", 2))
    a, b = (pair._value(p, st) for p, st in enumerate(plan.stages))
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.5, 1.5, size=(7, 2))          # cells of different lengths and transfers
    cells = [{k: v * scale[:, j] for k, v in cell.items() if k in problem._CELL} for j, cell in enumerate((a, b))]
    numbers = pair._link_term(0, *cells)
    monkeypatch.setattr(problem, "_LINK_ARRAYS", 0)
    arrays = pair._link_term(0, *cells)
    monkeypatch.setattr(problem, "_LINK_SLICE", 3)
    sliced = pair._link_term(0, *cells)
    for x, y, z in zip(numbers, arrays, sliced):
        assert list(x) == list(y) == list(z)
    assert np.isfinite(numbers[0]).any()                 # some pairs are paced: a real comparison


def _small_gaps_instance(seed: int, tmp_path):
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("small_gaps", ROOT / "benchmarks" / "small_gaps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.instance(seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed, config", [(54, (1, 2, 4, 8)), (54, (1, 2, 4, 4)), (53, (1, 2, 4, 8))])
def test_optimal_under_the_link_bound_is_what_brute_force_simulates(seed, config, tmp_path):
    """The OPTIMAL the link bound lets the search print, refuted if it can be by brute force
    (every split and configuration of the pair simulated): on small_gaps' instances whose cut
    crosses a 10 Gbps host link, with a configuration whose link paces the best plan."""
    from solver_planner.stages import objective
    from solver_planner.stages.report import Config, plan_stages

    topo, spec, schedule, _ = _small_gaps_instance(seed, tmp_path)
    cfg = Config(*config)
    fast = plan_stages(topo, spec, schedule, config=cfg).result
    brute = plan_stages(topo, spec, schedule, config=cfg, method="brute-force").result
    assert fast.status.value == "OPTIMAL" and brute.status.value == "OPTIMAL"
    assert fast.solution.time == pytest.approx(brute.solution.time, rel=1e-9)
    # the link bound takes part: some link of the plan found paces its two stages
    plan, s = fast.solution.plan, fast.solution.schedule
    act = {(p, q): plan.activation_time(p, q) for p, q in plan.channels}
    grad = {(p, q): plan.gradient_time(q, p) for p, q in plan.channels}
    ch = plan.backward_act if s.split else plan.backward
    assert any(link.paced(act[p, q], grad[p, q], plan.forward[p], ch[q]) for p, q in act if q == p + 1)
    assert objective.bounds(plan, s).value <= fast.solution.time * (1 + 1e-9)


@pytest.mark.parametrize("seed", [52, 54])
def test_the_backlog_behind_a_link_bounds_the_plans_it_paces(tmp_path, seed):
    """``benchmarks/small_gaps.py`` seeds 52 and 54: a 10 Gbps host link paces eager-1F1B
    plans, the activations pass it back to back, and the gradients reach an earlier, slower
    stage late, with all its backward passes still to run: the critical path, which the
    link bound missed (6-7% under the simulated time).  With the backlog it binds on the
    plans the search simulates, and stays a bound: the search checks each simulated plan
    against its objective and raises otherwise (a backlog once shared through the memo of
    another schedule's orders did, on seed 52).  Each member of a family priced with the
    shared memo gets its own bounds."""
    import random
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import schedule_floor
    from small_gaps import instance

    import solver_planner.stages.objective as objective

    topo, spec, schedule, _ = instance(seed, tmp_path)
    pairs, _ = schedule_floor.simulated_pairs(topo, spec, schedule, budget=30, simulations=200_000)
    assert pairs
    binds = 0
    for _, greedy, plan, s in pairs:
        value = bounds(plan, s).value
        assert value <= greedy * (1 + 1e-9)
        keep = objective._backlog
        objective._backlog = lambda *args: -math.inf
        try:
            binds += value > bounds(plan, s).value
        finally:
            objective._backlog = keep
        memo: dict = {}
        members = family("eager-1f1b", len(plan.stages))
        for member in random.Random(seed).sample(members, len(members)):
            assert bounds(plan, member, memo=memo) == bounds(plan, member)
    assert binds


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(SCHEDULES + family("eager-1f1b", 5)), st.integers(2, 5), st.integers(1, 12), st.booleans())
def test_a_stage_s_backlog_counts_its_ops_from_each_chain_op_to_its_last(schedule, S, B, delay):
    """link.backlog_counts against a count over the stage's order written out."""
    for r in range(S):
        order = stage_order(schedule, S, r, B, delay)
        chain = [i for i, (op, _) in enumerate(order) if op in ("B", "BA")]
        nf, nc, nw = link.backlog_counts(schedule, S, r, B, delay)
        for m in range(B):
            first = next(i for i in chain if order[i][1] == m)
            ops = [op for op, _ in order[first:chain[-1] + 1]]
            assert (nf[m], nc[m], nw[m]) == (ops.count("F"), ops.count("B") + ops.count("BA"), ops.count("BW"))


@pytest.mark.parametrize("seed", [52, 54])
def test_r5_counts_the_backlog_on_the_stage_before_a_paced_link(tmp_path, seed, monkeypatch):
    """R5's link term also follows the gradient back through the earlier stages (the
    objective's backlog): with their own values and drains on a whole plan or a prefix, and
    stage p - 1 at the least of its cells inside the programs.  On the plans the search
    simulates for small_gaps' seeds 52 and 54 the relaxation stays at most the family's least
    objective, and the backlog raises it (seed 54 went from a 2.7% gap to OPTIMAL, 52 from
    2.4% to 0.4%: its plans' backlog is two stages back)."""
    import sys

    import numpy as np

    from conftest import ROOT
    from solver_planner.stages import problem

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import schedule_floor
    from small_gaps import instance

    topo, spec, schedule, _ = instance(seed, tmp_path)
    pairs, _ = schedule_floor.simulated_pairs(topo, spec, schedule, budget=30, simulations=200_000)
    plans = list({id(plan): plan for _, _, plan, _ in pairs}.values())
    assert plans
    raised = 0
    for plan in plans:
        members = family("eager-1f1b", len(plan.stages))
        least = min(bounds(plan, m).value for m in members)
        pair = PairProblem(plan.costs, members)
        with_backlog = pair.relaxation(plan.stages)
        assert with_backlog <= least * (1 + 1e-9)
        with monkeypatch.context() as m:
            for name in ("_backlog_term", "_known_backlog"):
                m.setattr(problem.PairProblem, name, lambda self, *args: np.full(len(args[-2]), -np.inf))
            without = PairProblem(plan.costs, members).relaxation(plan.stages)
        assert without <= with_backlog
        raised += with_backlog > without * (1 + 1e-9)
    assert raised


def test_r5_s_backlog_is_the_same_played_one_by_one_as_arrays_and_in_slices(tmp_path, monkeypatch):
    """The backlog reads the ends of p's chain ops, which the numbers and the sliced arrays
    return in two shapes: the same terms either way, for cells of a later pair (p > 0) whose
    stage p - 1 is read from its least cells, or whose earlier stages are known."""
    import numpy as np

    from solver_planner.stages import problem

    topo, spec, schedule, _ = _small_gaps_instance(54, tmp_path)
    from solver_planner.stages.report import plan_stages

    plan = plan_stages(topo, spec, schedule, budget=20).best.plan
    members = family("eager-1f1b", len(plan.stages))
    pair = PairProblem(plan.costs, members)
    p = 3
    a, b = pair._value(p, plan.stages[p]), pair._value(p + 1, plan.stages[p + 1])
    rng = np.random.default_rng(1)
    scale = rng.uniform(0.7, 1.3, size=(9, 2))
    cells = [{k: (v * scale[:, j] if k != "k" else np.full(9, v)) for k, v in cell.items() if k in problem._CELL}
             for j, cell in enumerate((a, b))]
    # stage p - 1 at its least cells, and the earlier stages known (their own values)
    earlier = tuple(pair._value(q, plan.stages[q]) for q in range(p - 1, -1, -1))
    played = {}
    for known in (None, earlier):
        numbers = pair._link_term(p, *cells, known)
        with monkeypatch.context() as m:
            m.setattr(problem, "_LINK_ARRAYS", 0)
            arrays = pair._link_term(p, *cells, known)
            m.setattr(problem, "_LINK_SLICE", 4)
            sliced = pair._link_term(p, *cells, known)
        for x, y, z in zip(numbers, arrays, sliced):
            assert np.allclose(x, y, rtol=1e-12) and np.allclose(y, z, rtol=1e-12)
        played[known is None] = sliced
    # the backlog is part of it: without it the second term is lower on some cell; the known
    # stages bound at least as high as the least cells of stage p - 1
    assert (played[False][1] >= played[True][1] - 1e-12).all()
    for name in ("_backlog_term", "_known_backlog"):
        monkeypatch.setattr(problem.PairProblem, name, lambda self, *args: np.full(len(args[-2]), -np.inf))
    assert (pair._link_term(p, *cells)[1] < played[True][1]).any()
