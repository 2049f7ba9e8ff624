"""Costing programs with the shared cost model; the simulator replays every one exactly."""

import textwrap

import pytest

from solver_planner.cost import CostModel
from solver_planner.placement import ParallelismMatrix
from solver_planner.reduction import Lowering, parse_program, synthesize
from solver_planner.reduction.ranking import cost_program, rank_placements, replay
from solver_planner.spec import load_model_spec

S = 1e9


def test_hierarchical_program_cost_by_hand(a100):
    # Data parallelism over all 32 GPUs of 2 A100 nodes.
    low = Lowering(ParallelismMatrix.of([[2, 16]]), (2, 16), ("node", "gpu"), [0])
    program = parse_program("ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); AllGather(node, InsideGroup)")
    c = cost_program(CostModel(a100), low, program, S)
    inside = 15 * 2e-6 + 15 / 16 * S / 270e9             # 16 GPUs on NVSwitch, both nodes at once
    across = 2 * 10e-6 + 1 * (S / 16) / (8e9 / 16)        # 16 pairs share each NIC, 1/16 of the data
    assert c.step_times == pytest.approx([inside, across, inside])
    assert c.time == pytest.approx(2 * inside + across)
    assert [s.nbytes[0] for s in c.steps] == pytest.approx([S, S / 16, S])  # AllGather: its output


def test_every_program_replays_to_its_cost(a100):
    low = Lowering(ParallelismMatrix.of([[2, 4], [1, 4]]), (2, 16), ("node", "gpu"), [0])
    cost = CostModel(a100)
    programs = synthesize(low.hierarchy)
    assert len(programs) > 50
    for p in programs:
        for algorithm in ("ring", "tree"):
            costed = cost_program(cost, low, p, S, algorithm)
            sim = replay(cost, costed, algorithm, check=False)
            assert sim.run().makespan == pytest.approx(costed.time, rel=1e-12)


MODEL = textwrap.dedent("""\
    name: two-reductions
    parallelism:
      axes:
        - {name: data, size: 4}
        - {name: model, size: 8}
    reductions:
      - {name: grads, axes: [data], bytes: 1 GiB}
      - {name: activations, axes: [model], bytes: 64 MiB, weight: 48}
    """)


def test_placements_are_ranked_by_weighted_best_cost(a100):
    model = load_model_spec("m.yaml", MODEL)
    reports, result = rank_placements(a100, model)
    assert len(reports) == len(result.solutions) == 2  # [[1,4],[2,4]] and [[2,2],[1,8]]
    costs = [r.cost for r in reports]
    assert costs == sorted(costs)
    for rep in reports:
        assert rep.cost == pytest.approx(sum(r.weight * r.best.time for r in rep.reductions))
        for red in rep.reductions:
            times = [p.time for p in red.programs]
            assert times == sorted(times)
            assert red.best.time <= red.allreduce.time  # the single AllReduce is among the candidates
    # The heavy, frequent model-axis reduction should stay inside the nodes.
    assert reports[0].matrix.rows[1][0] == 1


def test_rank_refuses_a_model_that_does_not_fit(a100):
    from solver_planner.errors import SpecError
    model = load_model_spec("m.yaml", MODEL.replace("size: 8", "size: 4"))
    with pytest.raises(SpecError, match="16 devices, but cluster"):
        rank_placements(a100, model)
