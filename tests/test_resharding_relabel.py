"""A solved resharding reused on an isomorphic problem (resharding/relabel.py) is exactly what
solving that problem afresh gives: the same schedule rows, makespan, bound, status and ports."""

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CLUSTERS
from solver_planner.cost import CostModel
from solver_planner.plan import make_plan
from solver_planner.plan.boundaries import boundary_of, solve_boundaries
from solver_planner.plan.parts import stage_parts
from solver_planner.resharding import ReshardingProblem, plan_resharding
from solver_planner.resharding.relabel import relabel, signature
from solver_planner.spec import load_model_spec
from solver_planner.stages.costs import port_names
from solver_planner.stages.report import Config
from solver_planner.topology import load_topology

P3X5 = load_topology(CLUSTERS / "aws-p3.8xlarge-5.yaml")      # one NIC per host
DGX = load_topology(CLUSTERS / "dgx-a100-8x8.yaml")           # one NIC per GPU
RING = load_topology(CLUSTERS / "p2-v100-2x8.yaml")           # an NVLink ring inside each host
COSTS = {id(P3X5): CostModel(P3X5), id(DGX): CostModel(DGX)}
SPECS = ["S0,R", "R,S0", "S1,R", "S01,R", "R,R", "S0,S1"]


def ports_of(result):
    plan = result.solution
    return tuple(port_names({r for i in range(len(plan.tasks)) for r in plan.unit_cost(i).resources}))


def same(a, b, topo):
    assert a.solution.rows(topo) == b.solution.rows(topo)
    assert (a.objective, a.bound, a.status) == (b.objective, b.bound, b.status)
    assert ports_of(a) == ports_of(b)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([P3X5, DGX]), st.integers(1, 2), st.integers(1, 4), st.integers(1, 2), st.integers(1, 4),
       st.sampled_from(SPECS), st.sampled_from(SPECS), st.integers(1, 24), st.integers(1, 3), st.data())
def test_a_renamed_schedule_is_the_fresh_solve(topo, sh, sw, dh, dw, sspec, dspec, rows, cols, data):
    per_host = topo.devices_per_host
    sw, dw = min(sw, per_host), min(dw, per_host)

    def problem(first_host):
        src = (list(range(first_host, first_host + sh)), sw, sspec)
        dst = (list(range(first_host + sh, first_host + sh + dh)), dw, dspec)
        return ReshardingProblem.build("p", (rows, cols * 1024), "float32", topo, src, dst)

    hosts = topo.num_hosts - sh - dh
    a, b = data.draw(st.integers(0, hosts)), data.draw(st.integers(0, hosts))
    pa, pb = problem(a), problem(b)
    assert signature(pa, topo) == signature(pb, topo)      # whole hosts moved: nothing told apart
    cost = COSTS[id(topo)]
    ra = plan_resharding(pa, cost, "auto", "broadcast", 10.0, 0)
    rb = plan_resharding(pb, cost, "auto", "broadcast", 10.0, 0)
    moved = relabel(ra, pb, topo)
    same(moved, rb, topo)
    # and its replay in the simulator (what a plan's boundary records) is the fresh one's
    fresh = boundary_of("act", 0, 1, pb, rb, cost)
    assert ports_of(moved) == fresh.ports


def test_what_cannot_be_renamed_in_order_is_solved_afresh():
    cost = COSTS[id(P3X5)]
    forward = ReshardingProblem.build("p", (8, 64), "float32", P3X5, ([0], 4, "S0,R"), ([1], 4, "S0,R"))
    backward = ReshardingProblem.build("p", (8, 64), "float32", P3X5, ([3], 4, "S0,R"), ([2], 4, "S0,R"))
    assert signature(forward, P3X5) == signature(backward, P3X5)
    assert relabel(plan_resharding(forward, cost), backward, P3X5) is None     # host 3 before host 2
    # a ring's segments depend on where devices sit around it: never renamed
    ring = ReshardingProblem.build("p", (8, 64), "float32", RING, ([0], 4, "S0,R"), ([1], 4, "S0,R"))
    assert signature(ring, RING) is None


def test_a_plans_boundaries_are_what_solving_each_afresh_gives(tmp_path):
    """Four equal stages on four hosts: six boundaries, most of them one problem moved."""
    layers = [{"name": "l", "repeat": 8, "flops": "50 GFLOP", "params": "100 MiB", "activations": "8 MiB"}]
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "layers": layers,
                                    "training": {"global_batch": 64, "dtype": "float16", "optimizer": "adam"}}))
    topo = load_topology(CLUSTERS / "aws-p3.8xlarge-4.yaml")
    plan = make_plan(topo, load_model_spec(path), "1f1b", config=Config(2, 2, 4, 16))
    cost = CostModel(topo)
    parts = stage_parts(plan.partition, topo)
    bounds = solve_boundaries(plan.partition, parts, topo, cost)
    keys = [signature(b.problem, topo) for b in bounds]
    assert len(set(keys)) < len(keys)                          # some were renamed
    for b in bounds:
        fresh = plan_resharding(b.problem, cost, "auto", "broadcast", 10.0, 0)
        same(b.result, fresh, topo)
        want = boundary_of(b.kind, b.src, b.dst, b.problem, fresh, cost)
        assert (b.time, b.ports) == (want.time, want.ports)
