import math

from solver_planner.solve import SolveResult, Status, gap


def test_gap_of_a_minimisation():
    assert gap(10.0, 10.0) == 0.0
    assert gap(10.0, 8.0) == 0.2
    assert gap(None, 8.0) is None and gap(10.0, None) is None
    assert gap(0.0, -1.0) == math.inf


def test_optimality_comes_from_the_gap_not_the_status():
    claimed = SolveResult(Status.OPTIMAL, "cp-sat", objective=10.0, bound=9.0)
    assert not claimed.proven_optimal and claimed.gap == 0.1
    proven = SolveResult(Status.FEASIBLE, "enumerate", objective=3.0, bound=3.0)
    assert proven.proven_optimal
    assert proven.as_dict() == {"status": "FEASIBLE", "method": "enumerate", "objective": 3.0, "bound": 3.0,
                                "gap": 0.0, "wall_time": 0.0}
