"""The playout bound (stages/objective.py): each stage's own ops played out in its order, and
the backlog its gradients leave on the earlier stages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from solver_planner.cost import CostModel
from solver_planner.stages import Layer, LayerModel, MeshShape, Schedule, simulate_schedule
from solver_planner.stages import objective
from solver_planner.stages.costs import StageCosts, cost_tables
from solver_planner.stages.objective import bounds
from solver_planner.stages.partition import Partition, StagePlan

from test_stages_objective import topology

REL = 1e-9
SCHEDULES = [Schedule("1f1b"), Schedule("eager-1f1b", 2, True), Schedule("eager-1f1b", 4, False), Schedule("gpipe"),
             Schedule("zb-h1")]


def chain(S: int, B: int, cuts, flops=None, act_mib: float = 8.0):
    """``S`` stages of one GPU each on ``S`` hosts joined by 25 GB/s, layers cut at ``cuts``
    (first, last), no parameters: the stages and their transfers are the whole iteration."""
    topo = topology(S, 1, "25 GB/s", "host")
    act = act_mib * 2**20
    layers = cuts[-1][1] + 1
    flops = flops or [2e11] * layers
    model = LayerModel("chain", [Layer(f"l{i}", x, 2 * x, 0.0, 0.0, act, act, 0.0, allreduces=0, weight=x)
                                 for i, x in enumerate(flops)], max(64, B), None)
    shape = MeshShape(1, 1)
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)
    return Partition(costs, [StagePlan(a, b, costs.configs[0]) for a, b in cuts])


def without_playout(plan, schedule, monkeypatch) -> float:
    with monkeypatch.context() as patch:
        patch.setattr(objective, "PLAYOUT_CELLS", 0)
        return bounds(plan, schedule).value


@pytest.mark.parametrize("B", [8, 16, 24])
def test_a_slow_stage_behind_faster_ones_holds_their_gradients_back(B, monkeypatch):
    """Stage 1 holds two layers, the seven after it one each: the gradients the fast stages
    send back queue up in front of it.  The stage, cycle and phase bounds see each stage
    alone (GPipe 20% and eager-1F1B 6% under the simulated time at B = 8); the playout of the
    last stage, then the backlog in front of stage 1, is the critical path."""
    S = 8
    plan = chain(S, B, [(0, 0), (1, 2)] + [(i, i) for i in range(3, S + 1)])
    gains = {}
    for schedule in SCHEDULES:
        sim = simulate_schedule(plan, schedule).iteration_time
        value = bounds(plan, schedule).value
        before = without_playout(plan, schedule, monkeypatch)
        assert before <= value <= sim * (1 + REL), schedule
        assert value >= 0.995 * sim, (schedule, value / sim)
        gains[str(schedule)] = before / sim
    if B == 8:
        assert gains["gpipe"] < 0.81 and gains["eager-1f1b(e=2, weight delay)"] < 0.94


@st.composite
def chains(draw):
    S = draw(st.integers(2, 6))
    B = draw(st.integers(1, 16))
    sizes = [draw(st.integers(1, 3)) for _ in range(S)]
    cuts, first = [], 0
    for n in sizes:
        cuts.append((first, first + n - 1))
        first += n
    flops = [draw(st.sampled_from([5e10, 2e11, 8e11])) for _ in range(first)]
    act = draw(st.sampled_from([1.0, 8.0, 64.0]))
    return chain(S, B, cuts, flops, act), draw(st.sampled_from(SCHEDULES))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_the_playout_bound_is_below_the_simulated_time(case):
    """Stages of unequal speed and transfers of every size, under every schedule without
    model chunks: the objective with the playout never passes the simulated time."""
    plan, schedule = case
    sim = simulate_schedule(plan, schedule).iteration_time
    assert bounds(plan, schedule).value <= sim * (1 + REL), schedule


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(1, 9), st.sampled_from(["1f1b", "eager-1f1b", "gpipe"]),
       st.sets(st.integers(1, 11), max_size=3), st.randoms(use_true_random=False))
def test_the_playout_s_backlog_of_every_stage_is_the_link_bound_s_per_stage(S, B, kind, cut, rnd):
    """The playout bound's backlog (``_backlogs``, every stage at once) is the link bound's
    (``_backlog``, one stage at a time, stopping at a stage not joined to the next) on the
    same ends, for every stage, with links missing anywhere."""
    import numpy as np

    from solver_planner.stages.link import backlog_counts
    from solver_planner.stages.schedule import family

    schedule = family(kind, S)[0]
    f, ch, bw, D = ([rnd.uniform(0.1, 2.0) for _ in range(S)] for _ in range(4))
    grad = {(i - 1, i): rnd.uniform(0.0, 1.0) for i in range(1, S) if i not in cut}
    act = dict(grad)
    delays = [False] * S
    ends = np.array([[rnd.uniform(0.0, 50.0) for _ in range(B)] for _ in range(S)])
    work = np.array([nf * f[r] + nc * ch[r] + nw * bw[r]
                     for r, (nf, nc, nw) in enumerate(backlog_counts(schedule, S, r, B) for r in range(S))])
    every = objective._backlogs(ends, work, ch, grad, D)
    for p in range(S):
        one = objective._backlog(schedule, S, p, B, ends[p], f, ch, bw, act, grad, D, delays)
        assert float(every[p].max()) == pytest.approx(one, rel=1e-12, abs=1e-12) or one == -float("inf") == every[p].max()
