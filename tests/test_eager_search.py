"""-s eager-1f1b: the eager search runs first; the 1F1B search only when it is asked for
(``baselines``) or when the eager search stops short, and then never leaves a faster 1F1B
plan behind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from solver_planner.errors import InfeasibleError, UnknownError
from solver_planner.solve import Status
from solver_planner.spec import load_model_spec
from solver_planner.stages.report import _eager, plan_stages
from solver_planner.topology import load_topology

from conftest import CLUSTERS, SPECS

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
GPT = SPECS / "models" / "gpt3-2.6b.yaml"


def _cand(time: float, kind: str):
    return SimpleNamespace(time=time, schedule=SimpleNamespace(kind=kind), plan=SimpleNamespace(costs=object()))


def _result(status: Status, *cands):
    return SimpleNamespace(status=status, solution=cands[0], solutions=list(cands))


class _Calls:
    """A fake eager search (``solve``) and 1F1B search, recording what they were given."""

    def __init__(self, eager, one, again=None):
        self.eager, self.one, self.again = eager, one, again
        self.solved: list = []
        self.seeded: list = []

    def solve(self, incumbents):
        self.solved.append(incumbents)
        out = self.eager if len(self.solved) == 1 else self.again
        if isinstance(out, Exception):
            raise out
        return out, "topology", "use"

    def one_f_one_b(self, seeds):
        self.seeded.append(seeds)
        if isinstance(self.one, Exception):
            raise self.one
        return self.one


def test_an_optimal_eager_plan_needs_no_1f1b_search():
    calls = _Calls(_result(Status.OPTIMAL, _cand(1.0, "eager-1f1b")), _result(Status.OPTIMAL, _cand(1.2, "1f1b")))
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=False)
    assert result is calls.eager and base is None and calls.seeded == []


def test_the_comparison_runs_the_whole_1f1b_search():
    calls = _Calls(_result(Status.OPTIMAL, _cand(1.0, "eager-1f1b")), _result(Status.OPTIMAL, _cand(1.2, "1f1b")))
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=True)
    assert result is calls.eager and base is calls.one
    assert calls.seeded == [None]                 # not cut by the eager plans: its own optimum
    assert calls.solved == [None]


def test_an_eager_search_stopped_short_is_checked_against_1f1b_plans_seeded_with_its_own():
    eager = _result(Status.FEASIBLE, _cand(1.0, "eager-1f1b"))
    calls = _Calls(eager, _result(Status.OPTIMAL, eager.solution))    # no 1F1B plan beat it
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=False)
    assert result is eager and base is None
    assert calls.seeded == [eager.solutions] and calls.solved == [None]


def test_a_faster_1f1b_plan_seeds_the_eager_search_again():
    eager = _result(Status.FEASIBLE, _cand(1.0, "eager-1f1b"))
    faster = _cand(0.9, "1f1b")
    again = _result(Status.FEASIBLE, _cand(0.85, "eager-1f1b"), faster)
    calls = _Calls(eager, _result(Status.FEASIBLE, faster, eager.solution), again)
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=False)
    assert result is again and calls.solved == [None, [faster]]
    assert base is None                   # seeded with the eager plans: not the best 1F1B plan proper


def test_no_eager_plan_within_the_limits_falls_back_on_1f1b():
    one = _result(Status.FEASIBLE, _cand(1.2, "1f1b"))
    again = _result(Status.FEASIBLE, _cand(1.2, "1f1b"))
    calls = _Calls(UnknownError("no plan found"), one, again)
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=False)
    assert result is again and base is one and calls.seeded == [None] and calls.solved == [None, one.solutions]
    calls = _Calls(UnknownError("no plan found"), InfeasibleError("nothing fits"))
    with pytest.raises(InfeasibleError):
        _eager(calls.solve, calls.one_f_one_b, compare=False)
    # a 1F1B search that fails does not take the eager plan away
    eager = _result(Status.FEASIBLE, _cand(1.0, "eager-1f1b"))
    calls = _Calls(eager, UnknownError("no plan found"))
    (result, *_), base = _eager(calls.solve, calls.one_f_one_b, compare=False)
    assert result is eager and base is None


@pytest.mark.parametrize("budget", [8, 20, 2000])
def test_eager_1f1b_is_never_slower_than_the_1f1b_search_on_the_same_budget(budget):
    """Whatever the budget stops, the eager answer is at most the 1F1B search's (run alone,
    with the same limits), and its bound covers the 1F1B plans too.  (GPT-3 2.6B on two
    p3.8xlarge hosts: with 8 subspaces neither search finds a plan, with 20 both stop with a
    gap, with the default the eager search is OPTIMAL.)"""
    topo, spec = load_topology(P3), load_model_spec(GPT)
    if budget == 8:
        for schedule in ("eager-1f1b", "1f1b"):
            with pytest.raises(UnknownError):
                plan_stages(topo, spec, schedule, budget=budget)
        return
    eager = plan_stages(topo, spec, "eager-1f1b", budget=budget)
    one = plan_stages(topo, spec, "1f1b", budget=budget).result
    assert eager.best.time <= one.solution.time * (1 + 1e-9)
    assert eager.result.bound <= one.solution.time * (1 + 1e-9)
    assert eager.one_f_one_b is None                       # not asked for
    if budget == 2000:
        assert eager.result.status == Status.OPTIMAL
