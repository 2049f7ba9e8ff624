"""Every claim the stage planner prints, tried against an independent brute force.

The oracle below lists every plan of the search space itself (every mesh shape, micro-batch
count, cut and configuration), simulates it under every schedule of the family, keeps the
runs whose simulated peak memory fits, and takes the fastest.  Then, on small random
instances: the plan returned is never slower than that (and equal when OPTIMAL is claimed),
every bound is below it, the gap is computed from the bound, INFEASIBLE is claimed exactly
when the oracle finds nothing, and its shortfall is the least over every plan.
"""

import dataclasses
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.errors import InfeasibleError
from solver_planner.stages import Layer, LayerModel, MemoryOptions, StageSearch, family, plan_partition
from solver_planner.stages import simulate_schedule
from solver_planner.stages.costs import MeshShape, StageCosts, mesh_shapes
from solver_planner.stages.partition import Partition, StagePlan
from solver_planner.errors import UnknownError

from test_stages_objective import topology

REL = 1e-9


def every_plan(search: StageSearch):
    """(shape, B, plan) for every plan of the search space, enumerated here (not by the
    library), so that the oracle stays independent of the code under test."""
    model, topo = search.model, search.topology
    for shape in search.shapes or mesh_shapes(topo.num_hosts, topo.devices_per_host):
        S = topo.num_devices // shape.size
        if S > model.num_layers:
            continue
        for B in [b for b in range(1, model.global_batch + 1) if model.global_batch % b == 0]:
            costs = StageCosts(model, topo, shape, B, search.tables(shape), search.comm)
            for inner in itertools.combinations(range(1, model.num_layers), S - 1):
                edges = (0,) + inner + (model.num_layers,)
                for configs in itertools.product(costs.configs, repeat=S):
                    yield shape, B, Partition(costs, [StagePlan(edges[j], edges[j + 1] - 1, configs[j])
                                                      for j in range(S)])


def oracle(search: StageSearch) -> dict:
    """{(shape, B): fastest simulated time that fits} over every plan of the space."""
    out: dict = {}
    for shape, B, plan in every_plan(search):
        for sch in family(search.schedule, plan.costs.stages):
            run = simulate_schedule(plan, sch)
            if max(run.peak_memory) <= search.topology.device.memory:
                out[shape, B] = min(out.get((shape, B), math.inf), run.iteration_time)
    return out


def least_peak(search: StageSearch) -> float:
    """The least fullest-device memory of any plan (1F1B-like in-flight counts)."""
    best = math.inf
    for _, B, plan in every_plan(search):
        S = plan.costs.stages
        live = [min(S - p, B) for p in range(S)] if search.schedule != "gpipe" else [B] * S
        best = min(best, max(plan.memory(live)))
    return best


@st.composite
def searches(draw, memory=("64 GiB",)):
    hosts, gpus = draw(st.sampled_from([(2, 2), (1, 4)]))
    topo = topology(hosts, gpus, draw(st.sampled_from(["1 GB/s", "20 GB/s"])), draw(st.sampled_from(["host", "device"])),
                    draw(st.sampled_from(memory)), efficiency=draw(st.booleans()))
    n = draw(st.integers(2, 4))
    layers = []
    for i in range(n):
        f = draw(st.floats(0.05, 3.0)) * 1e11
        act = draw(st.floats(0.0, 40.0)) * 2**20
        skips = (n - 1,) if i == 0 and n >= 3 and draw(st.booleans()) else ()
        layers.append(Layer(f"l{i}", f, f * draw(st.floats(0.5, 3.0)), draw(st.floats(0.0, 1.5)) * 2**30,
                            draw(st.floats(0.0, 3.0)) * 2**30, act, act * draw(st.floats(0.5, 4.0)),
                            allreduces=draw(st.integers(0, 2)), skips=skips))
    if n >= 2 and draw(st.booleans()):
        # the last layer shares the first one's parameters (a tied embedding and logits): the
        # stage holding its copy all-reduces it with the first stage (the relaxation's tie term)
        first = layers[0]
        layers[-1] = dataclasses.replace(layers[-1], tied_to=0, tied_params=first.params * draw(st.floats(0.1, 1.0)),
                                         tied_optimizer=first.optimizer * 0.5)
    opts = MemoryOptions(draw(st.sampled_from([("none",), ("none", "full")])),
                         draw(st.sampled_from(["none", "zero-1", "zero-2", "zero-3"])), False, draw(st.booleans()),
                         draw(st.sampled_from([8 * 2**20, 64 * 2**20])))
    model = LayerModel("random", layers, 4, None, options=opts)
    return StageSearch(model, topo, draw(st.sampled_from(["1f1b", "gpipe", "eager-1f1b"])))


CHECK = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_claims(res, best: float) -> None:
    assert res.objective >= best * (1 - REL), "a plan faster than every plan of the space"
    assert res.bound <= best * (1 + REL), "the bound is not a lower bound"
    assert res.gap == pytest.approx((res.objective - res.bound) / res.objective, abs=1e-12)
    if res.status.value == "OPTIMAL":
        assert res.objective <= best * (1 + REL), "OPTIMAL, but brute force found a faster plan"
    assert max(res.solution.run.peak_memory) <= res.solution.plan.costs.device_memory


@CHECK
@given(searches())
def test_dp_returns_the_fastest_simulated_plan_and_true_certificates(search):
    times = oracle(search)
    res = plan_partition(search, "dp")
    check_claims(res, min(times.values()))
    assert res.status.value == "OPTIMAL"          # small instances: the branch and bound finishes


@pytest.mark.parametrize("sharding", ["zero-2", "zero-3"])
@pytest.mark.parametrize("schedule", ["1f1b", "eager-1f1b"])
def test_a_tied_copy_s_zero_collectives_keep_true_certificates(sharding, schedule):
    """A tied copy on a stage without its layer is gathered (ZeRO-3) and reduce-scattered
    every micro-batch (ZeRO-2/3) with the layer holding it: the stage's times and the
    simulator's per-layer pieces of its last backward must both carry it, or the objective
    (a bound) lands above the simulated time of a plan."""
    topo = topology(2, 2, "1 GB/s", "host", "64 GiB", efficiency=True)
    layers = [Layer(f"l{i}", 1e11 * (1 + i % 3), 2e11, 2**30 * (3 if i == 0 else 1), 2**31, 2**24, 2**25, allreduces=1)
              for i in range(4)]
    layers[-1] = dataclasses.replace(layers[-1], tied_to=0, tied_params=layers[0].params,
                                     tied_optimizer=layers[0].optimizer)
    model = LayerModel("tied", layers, 4, None, options=MemoryOptions(("none",), sharding, False, True, 2**30))
    search = StageSearch(model, topo, schedule)
    from solver_planner.stages.objective import bounds

    held = 0
    for _, _, plan in every_plan(search):
        held += bool(plan.copies)
        for sch in family(search.schedule, plan.costs.stages):
            assert bounds(plan, sch).value <= simulate_schedule(plan, sch).iteration_time * (1 + REL), (plan, sch)
    assert held
    times = oracle(search)
    res = plan_partition(search, "dp")
    check_claims(res, min(times.values()))
    assert res.status.value == "OPTIMAL"


@CHECK
@given(searches())
def test_brute_force_and_cpsat_agree_with_the_oracle(search):
    best = min(oracle(search).values())
    bf = plan_partition(search, "brute-force")
    check_claims(bf, best)
    assert bf.status.value == "OPTIMAL"
    cp = plan_partition(StageSearch(search.model, search.topology, search.schedule), "cp-sat", time_limit=5.0)
    check_claims(cp, best)


@CHECK
@given(searches(), st.integers(1, 4))
def test_budgets_and_greedy_keep_their_certificates(search, budget):
    """Stopped early, a search still only claims what holds."""
    best = min(oracle(search).values())
    for res in (plan_partition(search, "greedy"), plan_partition(search, "dp", budget=budget),
                plan_partition(search, "dp", simulations=1)):
        check_claims(res, best)


@pytest.mark.slow
@CHECK
@given(searches(), st.integers(2, 4))
def test_top_lists_the_fastest_pairs(search, top):
    times = oracle(search)
    res = plan_partition(search, "dp", top=top)
    check_list(res, times, top)


def check_list(res, times: dict, top: int) -> None:
    """What a --top list claims: each plan's pair_bound is below every plan of its pair, no
    pair left out is faster than unlisted_bound or the last listed plan, and top_proven
    means the list is exactly the fastest pairs' best plans."""
    listed = [(c.plan.costs.shape, c.plan.costs.microbatches) for c in res.solutions]
    assert len(set(listed)) == len(listed) <= top
    assert [c.time for c in res.solutions] == sorted(c.time for c in res.solutions)
    for c, key in zip(res.solutions, listed):
        assert c.time >= times[key] * (1 - REL)
        assert c.pair_bound <= c.time
        assert c.pair_bound <= times[key] * (1 + REL), "pair_bound is not a lower bound of its pair"
    # the printed bound holds on its own (was: only together with the last listed time)
    others = res.info["unlisted_bound"]
    for key, t in times.items():
        if key not in listed:
            assert t >= others * (1 - REL), "a pair left out has a faster plan than unlisted_bound"
    if res.info["top_proven"]:
        want = sorted(times.values())[:top]
        assert [c.time for c in res.solutions] == pytest.approx(want, rel=REL)


@CHECK
@given(searches(), st.integers(2, 4), st.sampled_from([0.0, 0.01, 0.3]),
       st.sampled_from([(2000, 300_000), (4, 300_000), (2000, 40), (6, 1)]))
def test_top_lists_keep_their_gaps_under_any_gap_and_budget(search, top, gap, budgets):
    """The gap allowed in a list and the budgets' shares (a pair out of its share is only
    explored for what could beat the fastest plan) loosen the list, never its claims, and
    never the fastest plan's."""
    times = oracle(search)
    budget, simulations = budgets
    args = dict(top=top, top_gap=gap, budget=budget, simulations=simulations)
    incumbents = None
    if search.schedule == "eager-1f1b":
        # as plan_stages does: the eager search starts from the 1F1B search's list
        base = StageSearch(search.model, search.topology, "1f1b")
        incumbents = plan_partition(base, "dp", **args).solutions
    res = plan_partition(search, "dp", incumbents=incumbents, **args)
    check_claims(res, min(times.values()))
    check_list(res, times, top)
    if budgets == (2000, 300_000):
        assert res.status.value == "OPTIMAL"
        if gap == 0.0:
            # ample budgets and no gap: every listed plan is its pair's best
            for c in res.solutions:
                assert c.time == pytest.approx(times[c.plan.costs.shape, c.plan.costs.microbatches], rel=REL)
                assert c.pair_bound == c.time


def test_top_gap_out_of_range_is_refused():
    from solver_planner.errors import OptionError

    search = StageSearch(LayerModel("m", [Layer(f"l{i}", 1e11, 2e11, 2**28, 2**29, 2**22, 2**23) for i in range(3)],
                                    4, None), topology(1, 4, "1 GB/s", "host"))
    with pytest.raises(OptionError, match="gap"):
        plan_partition(search, "dp", top=2, top_gap=1.0)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(searches(memory=("256 MiB", "1 GiB", "3 GiB", "64 GiB")))
def test_infeasible_exactly_when_nothing_fits_with_the_least_shortfall(search):
    times = oracle(search)
    try:
        res = plan_partition(search, "dp")
    except InfeasibleError as exc:
        assert not times, "INFEASIBLE, but brute force found a plan that fits"
        need = least_peak(search)
        assert f"needs {need / 2**30:.2f} GiB" in str(exc)
        return
    except UnknownError:
        pytest.fail("the branch and bound finishes on small instances: UNKNOWN is never right here")
    assert times
    check_claims(res, min(times.values()))


def test_a_tiny_time_limit_is_unknown_or_a_plan_never_infeasible():
    """Reproducer 5: a CP-SAT time-out is not a proof of infeasibility."""
    search = StageSearch(LayerModel("m", [Layer(f"l{i}", 1e11, 2e11, 2**28, 2**29, 2**22, 2**23) for i in range(6)],
                                    8, None), topology(2, 4, "1 GB/s", "host"))
    try:
        res = plan_partition(search, "cp-sat", time_limit=1e-6, budget=3)
    except UnknownError:
        return
    assert res.status.value in ("FEASIBLE", "OPTIMAL")
    assert res.bound <= res.objective


@pytest.mark.parametrize("schedule", ["1f1b", "eager-1f1b"])
def test_a_slow_host_link_keeps_true_certificates(schedule):
    """Brute force on the instance the neighbour cycle (R5, stages/neighbor.py) exists for:
    6 equal layers on 4 one-GPU stages on 2 hosts whose link is much slower than any stage,
    16 samples.  Under 1F1B the best plan's R5 is the largest part of its relaxation, 10%
    under its simulated time; the random instances above, with 4 samples, seldom let R5
    bind, so an R5 above some plan's simulated time would go unnoticed there."""
    layers = [Layer(f"l{i}", 1e11, 2e11, 2**27, 2**28, 48 * 2**20, 48 * 2**20) for i in range(6)]
    search = StageSearch(LayerModel("slow-link", layers, 16, None), topology(2, 2, "2 GB/s", "host"), schedule,
                         shapes=[MeshShape(1, 1)])
    best = min(oracle(search).values())
    res = plan_partition(search, "dp")
    check_claims(res, best)
    assert res.status.value == "OPTIMAL"
    # stopped early, the bound left is the relaxation's over what was not explored: R5 included
    for budget in range(1, 6):
        check_claims(plan_partition(search, "dp", budget=budget), best)
    # and plan by plan: the relaxation (R5 binding on some) under every plan's simulated time
    pairs = {p.B: p for p in search.pairs()}
    binds = 0
    for _, B, plan in every_plan(search):
        runs = [simulate_schedule(plan, sch) for sch in family(schedule, plan.costs.stages)]
        fit = [r.iteration_time for r in runs if max(r.peak_memory) <= search.topology.device.memory]
        terms = pairs[B].terms(plan.stages)
        if fit:
            assert max(terms) <= min(fit) * (1 + REL), (plan, terms, min(fit))
        binds += terms[4] > max(terms[:4])
    assert binds > 0 or schedule != "1f1b"      # eager-1F1B hides the link better: other terms bind


def test_greedy_finding_no_plan_says_why_and_points_to_dp():
    """greedy tries one balanced split per pair; when none fits it is UNKNOWN (a split that
    fits exists: dp finds it), and the advice is not a budget greedy does not have."""
    G = 2**30
    heavy = [Layer(x, 1e11, 2e11, G, 2 * G, 2**20, 2**20) for x in "ab"]
    search = StageSearch(LayerModel("m", heavy + [Layer("c", 2e11, 4e11, 2**20, 2**21, 2**20, 2**20)], 4, None),
                         topology(2, 1, "1 GB/s", "host", memory="8 GiB"))
    with pytest.raises(UnknownError) as exc:
        plan_partition(search, "greedy")
    assert "--method dp" in str(exc.value) and "--budget" not in str(exc.value)
    assert exc.value.bound is not None and exc.value.bound <= plan_partition(search, "dp").objective


def test_out_of_simulations_the_search_still_raises_its_bound(monkeypatch):
    """Once the simulation budget is spent nothing more is simulated, but solving subspaces
    still raises the bound of the plans left (the 1T model on 1 024 GPUs: 29.7% -> 3.3%).
    GPT-3 2.6B on two p3.8xlarge hosts with one simulated task: stopping at once left the
    bound 17% under the optimum; going on proves it within 0.1%.  The bound stays a bound."""
    from conftest import CLUSTERS, SPECS
    from solver_planner import api
    from solver_planner.stages import search

    args = (CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml")
    best = api.stages(*args, schedule="1f1b").result
    assert best.status.name == "OPTIMAL"
    starved = api.stages(*args, schedule="1f1b", simulations=1).result
    assert starved.info["budget_exhausted"] and starved.info["simulations"] == 1
    monkeypatch.setattr(search, "STALL", 0)            # stop as soon as nothing can be simulated
    at_once = api.stages(*args, schedule="1f1b", simulations=1).result
    assert at_once.info["subspaces"] < starved.info["subspaces"]
    assert at_once.bound < 0.9 * best.objective
    assert at_once.bound < starved.bound <= best.objective * (1 + 1e-9)
    assert starved.bound > 0.999 * best.objective
