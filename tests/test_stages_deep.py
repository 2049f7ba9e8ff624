"""Deep models in linear memory: stage tables as range tables (stages/ranges.py), a large
pair's cells built one by one (problem.py), and past 256 layers stages that start on block
boundaries, with a bound over every cut (stages/coarse.py).

Each is checked against what it replaces or bounds: the dense squares, the band's cells,
enumeration of every plan, the exact least-memory program."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.stages import problem as problem_module
from solver_planner.stages import ranges
from solver_planner.stages.coarse import coarse_cuts, fine_bound, least_memory_floor
from solver_planner.stages.costs import StageCosts
from solver_planner.stages.enumerate import all_plans
from solver_planner.stages.problem import PairProblem, Subspace

from test_stages_objective import instances

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- range tables --------------------------------------------------------------------------
def flow_shop_tail(pieces, reds, k, i) -> float:
    """Backward runs layers i..k; a layer's reduction starts when its piece is done and the
    previous reduction has ended: how long the last reduction outlasts the last piece."""
    t = red_end = 0.0
    for layer in range(i, k - 1, -1):
        t += pieces[layer]
        red_end = max(red_end, t) + reds[layer]
    return max(red_end, t) - t


@SETTINGS
@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=24), st.integers(0, 2**31), st.booleans())
def test_range_tables_are_their_definitions(monkeypatch_values, seed, lazy):
    rng = np.random.default_rng(seed)
    x = np.asarray(monkeypatch_values)
    n = len(x)
    reds = rng.uniform(0, 3, n) * (rng.random(n) < 0.7)
    ties = [(a, b) for a, b in itertools.combinations(range(n), 2) if rng.random() < 0.1][:3]
    old = ranges.DENSE
    ranges.DENSE = -1 if lazy else old           # -1: never build the square
    try:
        tables = {"sum": ranges.Sums(x), "max": ranges.Maxes(x), "tail": ranges.Tail(x, reds),
                  "copy": ranges.CopyBytes(x, ties), "copies": ranges.Copies(n, ties),
                  "mix": 2.0 * ranges.Sums(x) + ranges.Maxes(reds) - 1.0}
        for k, i in itertools.product(range(n), repeat=2):
            want = {"sum": x[k:i + 1].sum(), "max": x[k:i + 1].max() if k <= i else 0.0,
                    "tail": flow_shop_tail(x, reds, k, i) if k <= i else 0.0,
                    "copy": sum(x[b] for a, b in ties if a < k <= b <= i),
                    "copies": float(any(a < k <= b <= i for a, b in ties)),
                    "mix": 2.0 * x[k:i + 1].sum() + reds[k:i + 1].max() - 1.0 if k <= i else -1.0}
            for name, table in tables.items():
                assert float(table[k, i]) == pytest.approx(want[name], rel=1e-9, abs=1e-9), (name, k, i)
        # index arrays and slices read the same cells
        ks, is_ = rng.integers(0, n, 7), rng.integers(0, n, 7)
        for table in tables.values():
            cells = np.asarray(table[ks, is_])
            assert np.array_equal(cells, [float(table[a, b]) for a, b in zip(ks, is_)])
            block = np.asarray(table[slice(0, n), slice(0, n)])
            assert block.shape == (n, n) and block[0, n - 1] == float(table[0, n - 1])
    finally:
        ranges.DENSE = old


SPECIAL = st.sampled_from([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan])
CELL = st.one_of(SPECIAL, st.floats(-1e6, 1e6))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([np.minimum, np.maximum, np.add, np.subtract, np.multiply, np.where]),
       st.lists(CELL, min_size=3, max_size=3), st.lists(CELL, min_size=3, max_size=3), SPECIAL,
       st.sampled_from(["tables", "table first", "number first"]))
def test_a_cell_read_as_plain_numbers_is_numpy_s_value(fn, xs, ys, number, form):
    """Ranges.at of a table of a function (its plain-number stand-in for numpy's, and
    min(x, inf) read as x): the value the vectorised ``values`` gives, NaN and infinities
    included."""
    with np.errstate(all="ignore"):
        if fn is np.where:
            fn = lambda c, x, y: np.where(c > 0, x, y)       # costs._where's form, three arguments
            args = (ranges.Sums(xs), ranges.Maxes(ys), number)
        else:
            a, b = ranges.Maxes(xs), ranges.Maxes(ys)
            args = {"tables": (a, b), "table first": (a, number), "number first": (number, b)}[form]
        table = ranges.apply(fn, *args)
        k, i = np.triu_indices(3)
        want = np.asarray(table.values(k, i), dtype=float)
        got = np.array([table.at(int(x), int(y)) for x, y in zip(k, i)])
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    assert np.array_equal(want[ok], got[ok])      # a zero's sign aside: numpy's own depends on its loop


def test_a_deep_table_is_never_built_as_a_square():
    deep = ranges.Sums(np.ones(ranges.DENSE + 1))
    assert float(deep[3, 10]) == 8.0 and deep._dense is None
    with pytest.raises(MemoryError, match="dense"):
        np.asarray(deep)


@SETTINGS
@given(instances(max_layers=6))
def test_stage_costs_read_the_same_lazily(case):
    """Every table of every configuration, memory included, cell by cell from the range
    tables and from their squares (what the stage search read before): the same numbers."""
    if case is None:
        return
    plan, _ = case
    c = plan.costs
    n = c.model.num_layers
    k, i = np.triu_indices(n)
    old = ranges.DENSE
    try:
        for cfg in c.configs:
            fresh = StageCosts(c.model, c.topology, c.shape, c.microbatches, c.tables, c.comm)
            ranges.DENSE = -1
            lazy = fresh[cfg]
            names = ("forward", "backward_act", "backward_weight", "static", "activation", "transient", "tail_full",
                     "tail_weight", "reduction_all", "grad_bytes", "optimizer")
            cells = {name: np.asarray(getattr(lazy, name)[k, i]) for name in names}
            cells["memory"] = np.asarray(fresh.memory(cfg, 3)[k, i])
            # one cell at a time (Ranges.at: Python numbers, no numpy): exactly the same
            for name in names:
                table = getattr(lazy, name)
                assert [float(table[int(a), int(b)]) for a, b in zip(k, i)] == cells[name].tolist(), name
            ranges.DENSE = old
            dense = c[cfg]
            for name in names:
                assert np.allclose(cells[name], np.asarray(getattr(dense, name))[k, i], rtol=1e-12, atol=0), name
            assert np.allclose(cells["memory"], np.asarray(c.memory(cfg, 3))[k, i], rtol=1e-12, atol=0)
            assert np.all(np.isinf(np.asarray(c.memory(cfg, 3))[np.tril_indices(n, -1)]))
    finally:
        ranges.DENSE = old


# -- a large pair's cells ----------------------------------------------------------------
@SETTINGS
@given(instances(max_layers=6), st.floats(0.0, 1.0))
def test_cells_built_one_by_one_are_the_bands_cells(case, where):
    """A large pair (here forced: every pair counts as large) lists the same cells, with the
    same terms, as the squares give, at every limit."""
    if case is None:
        return
    plan, schedules = case
    dense = PairProblem(plan.costs, schedules)
    sparse = PairProblem(plan.costs, schedules)
    sparse.DENSE_CELLS = -1
    assert sparse.sparse and not dense.sparse
    for p in range(dense.S):
        top = [float(v) for v in dense.stage(p)["T2"].ravel() if math.isfinite(v)]
        limits = [math.inf] + ([min(top) + where * (max(top) - min(top))] if top else [])
        for limit in limits:
            a, b = dense._cells(p, limit), sparse._cells(p, limit)
            for key in ("j", "k", "i", "bk", "bi", "starts", "ends", "firsts"):
                assert np.array_equal(a[key], b[key]), (p, limit, key)
            for key in PairProblem._KEYS:
                assert np.allclose(a[key], b[key], rtol=1e-12, atol=1e-15), (p, limit, key)
            dense._stage.pop(("cells", p))
            sparse._stage.pop(("cells", p))


@SETTINGS
@given(instances(max_layers=7), st.integers(2, 7))
def test_a_large_pairs_window_minima_are_their_definition(case, units):
    """R3's window minima on a large pair: per stage, the least over its configurations and
    the single units of its band of f + c, plus the least transfer in (from the unit's
    previous layer) and out (its last), each read unit by unit here."""
    if case is None:
        return
    plan, schedules = case
    with pytest.MonkeyPatch.context() as mp:
        pair = coarse_pair(plan, schedules, min(units, plan.costs.model.num_layers), mp)
    pair.DENSE_CELLS = -1
    c, S = pair.costs, pair.S
    want_inner, want_last = np.full(S, np.inf), np.full(S, np.inf)
    for p in range(S):
        for j, cfg in enumerate(pair.configs):
            arr = pair._config_arrays(j)
            for u in range(p, p + pair.n):
                k, i = int(pair.pos[u]), int(pair.pos[u + 1]) - 1
                fc = float(arr["F"][k, i]) + float(arr["C"][k, i])
                xg = min(c.transfer(cfg.tensor, p, p - 1)[0] + c.transfer(cfg.tensor, p, p - 1)[1] * arr["act"][int(pair.pos[v]) - 1]
                         for v in range(p, p + pair.n)) if p > 0 else 0.0
                xf = min(c.transfer(cfg.tensor, p, p + 1)[0] + c.transfer(cfg.tensor, p, p + 1)[1] * arr["act"][int(pair.pos[v + 1]) - 1]
                         for v in range(p, p + pair.n)) if p + 1 < S else 0.0
                want_inner[p] = min(want_inner[p], fc + xg + xf)
                want_last[p] = min(want_last[p], fc + xg)
    inner, last = pair._sparse_window_minima()
    assert np.array_equal(inner, want_inner) and np.array_equal(last, want_last)


@SETTINGS
@given(instances(max_layers=6))
def test_a_large_pairs_bound_is_below_every_plan(case):
    """A large pair leaves out the port and neighbour terms and reads the windows at a lower
    least: its bound stays below every plan's R, and the plan it returns is a plan."""
    if case is None:
        return
    plan, schedules = case
    dense = PairProblem(plan.costs, schedules)
    values = [v for v in (dense.relaxation(s) for s in all_plans(dense)) if math.isfinite(v)]
    sparse = PairProblem(plan.costs, schedules)
    sparse.DENSE_CELLS = -1
    lo, best = sparse.minimize(Subspace(sparse, bound=0.0))
    if not values:
        assert best is None
        return
    assert lo <= min(values) * (1 + 1e-9)
    assert best is not None and dense.relaxation(best) >= min(values) * (1 - 1e-9)


# -- block boundaries and the bound over every cut ----------------------------------------
def coarse_pair(plan, schedules, units: int, monkeypatch) -> PairProblem:
    monkeypatch.setattr(problem_module, "UNITS", units)
    monkeypatch.setattr(problem_module, "EXACT", units)
    return PairProblem(plan.costs, schedules)


@SETTINGS
@given(instances(max_layers=7), st.integers(2, 5))
def test_coarse_plans_start_on_block_boundaries_and_the_fine_bound_holds(case, units):
    """With fewer units than layers: every plan the programs consider starts on the blocks'
    first layers; the bound over every cut is below the least R of every plan (enumerated
    over every cut), and the least-memory floor below the exact least memory."""
    if case is None:
        return
    plan, schedules = case
    check_coarse_pair(plan, schedules, units)


def check_coarse_pair(plan, schedules, units: int) -> None:
    fine = PairProblem(plan.costs, schedules)
    with pytest.MonkeyPatch.context() as mp:
        pair = coarse_pair(plan, schedules, units, mp)
    if not pair.coarse:
        assert fine.L <= max(units, fine.S) or fine.S == 1   # a block per stage; one stage: no cut
        return
    pos = set(int(x) for x in pair.pos)
    assert len(pos) == max(units, fine.S) + 1 and {0, fine.L} <= pos
    aligned = list(all_plans(pair))
    assert all(st.first in pos and st.last + 1 in pos for s in aligned for st in s)
    _, best = pair.minimize(Subspace(pair, bound=0.0))
    if best is not None:
        assert all(st.first in pos for st in best)
    values = [v for v in (fine.relaxation(s) for s in all_plans(fine)) if math.isfinite(v)]
    bound = fine_bound(pair, math.inf)
    if values:
        assert bound <= min(values) * (1 + 1e-9)
        assert fine_bound(pair, min(values)) <= min(values) * (1 + 1e-9)
    least, _ = fine._least_memory()
    assert least_memory_floor(pair) <= least * (1 + 1e-9)


def test_the_fine_bound_has_no_phase_term_under_zb_h1():
    """Hypothesis found it (4 stages, 6 layers, B = 2, 2 blocks): under ZB-H1 R has no R3,
    so the first stage's phase (its first forward, the round trip through the later stages,
    B chain ops: 0.068 s) bounds the objective but not R, whose least over every plan is
    0.064 s; the bound over every cut kept the phase term and rose above that least."""
    from solver_planner.cost import CostModel
    from solver_planner.stages import Layer, LayerModel, MemoryOptions, MeshShape, family
    from solver_planner.stages.costs import cost_tables
    from solver_planner.stages.partition import Partition, StagePlan
    from test_stages_objective import topology

    layers = [Layer(f"l{i}", 1e11, 3e11 if i == 0 else 1e11, 0.0, 0.0, 0.0, 0.0, 0.0, allreduces=0,
                    weight=0.0, selective_saved=0.0) for i in range(6)]
    model = LayerModel("chain", layers, 8, None, options=MemoryOptions(("none",), "none", False, False, 4 * 2**20))
    topo = topology(2, 2, "1 GB/s", "host")
    costs = StageCosts(model, topo, MeshShape(1, 1), 2, cost_tables(topo, CostModel(topo), MeshShape(1, 1)), True)
    assert costs.stages == 4
    stages = [StagePlan(a, b, costs.configs[0]) for a, b in ((0, 0), (1, 1), (2, 2), (3, 5))]
    schedules = family("zb-h1", 4)
    fine = PairProblem(costs, schedules)
    least = min(v for v in (fine.relaxation(s) for s in all_plans(fine)) if math.isfinite(v))
    assert least == pytest.approx(0.064048, rel=1e-6)
    check_coarse_pair(Partition(costs, stages), schedules, 2)


def test_blocks_are_about_equal_in_work():
    from test_stages_windows import chain

    plan = chain(40, 8, [1e11 * (1 + (i % 5)) for i in range(40)])
    cuts = coarse_cuts(plan.costs, 8)
    assert len(cuts) == 9 and cuts[0] == 0 and cuts[-1] == 40 and np.all(np.diff(cuts) >= 1)
    work = plan.costs.layer_times(plan.costs.configs[0])
    per_layer = work[0] + work[1] + work[2]
    blocks = [per_layer[a:b].sum() for a, b in zip(cuts[:-1], cuts[1:])]
    assert max(blocks) - min(blocks) <= 2 * per_layer.max()


def deep(tmp_path, layers: int) -> Path:
    path = tmp_path / f"deep{layers}.yaml"
    path.write_text(f"name: deep{layers}\nlayers:\n  - {{name: l, repeat: {layers}, flops: 2 GFLOP, params: 4 MiB,"
                    " activations: 1 MiB, allreduces: 2}\ntraining: {global_batch: 1024, dtype: bfloat16,"
                    " optimizer: adam}\n")
    return path


def test_the_search_on_blocks_reports_the_bound_of_every_cut(tmp_path, monkeypatch):
    """End to end, a 12-layer model whose stages may start on 4 blocks only: the gap printed is
    against the bound over every cut, which is below the best plan brute force finds over every
    cut; the plan found starts on the blocks."""
    from solver_planner.spec import load_model_spec
    from solver_planner.stages import StageSearch, plan_partition
    from solver_planner.stages.layers import layer_model
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml")
    model = layer_model(load_model_spec(deep(tmp_path, 12)))
    search = dict(model=model, topology=topo, schedule="1f1b", microbatches=[8], stages=4)
    exact = plan_partition(StageSearch(**search), method="brute-force")
    monkeypatch.setattr(problem_module, "UNITS", 6)
    monkeypatch.setattr(problem_module, "EXACT", 6)
    coarse = plan_partition(StageSearch(**search), method="dp")
    info = coarse.info["coarse"]
    assert info["layers"] == 12 and info["blocks"] == [6]
    assert coarse.bound <= exact.objective * (1 + 1e-9) and coarse.objective >= exact.objective * (1 - 1e-9)
    cuts = set(PairProblem(coarse.solution.plan.costs, []).pos.tolist())
    assert all(s.first in cuts for s in coarse.solution.plan.stages)
    assert coarse.status.name == ("OPTIMAL" if coarse.bound >= coarse.objective * (1 - 1e-6) else "FEASIBLE")


@pytest.mark.slow
def test_ten_thousand_layers_on_1024_gpus_within_the_bound(tmp_path):
    """The deepest model a spec accepts, end to end under the stage search's memory bound set
    from outside: a plan, with the blocks and the bound over every cut in the JSON.  (1 024
    layers, once killed by the kernel at 24 GB, take the same path: range tables, stages on
    block boundaries, each pair's arrays against a shared budget.)  Ten subspaces of the
    default 2 000, for the suite's time (measured: 55 s against 109 s at 100; what is left is
    the bound over every cut): the arrays are built per pair and the bound over every cut is
    computed whatever the budget; the default budget's run is benchmarks/scale.py's `deep`
    family."""
    from test_memory_bound import outside_limit
    from solver_planner import memory

    result = subprocess.run([sys.executable, "-m", "solver_planner", "stages",
                             str(ROOT / "specs" / "clusters" / "dgx-a100-128x8.yaml"), str(deep(tmp_path, 10_000)),
                             "--no-baselines", "--budget", "10", "--json"], capture_output=True, text=True, cwd=ROOT,
                            preexec_fn=outside_limit(memory.STAGES_BOUND))
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    coarse = out["search"]["coarse"]
    assert coarse["layers"] == 10_000 and min(coarse["blocks"]) == 128
    assert 0 < out["bound"] <= out["iteration_time"]


def test_dropped_caches_give_the_same_search(monkeypatch):
    """Pairs past the shared cache budget drop their arrays and rebuild them on demand: with
    a budget of nothing (every other pair drops everything after each program run) the
    search returns the same plans, times and bounds."""
    from solver_planner.spec import load_model_spec
    from solver_planner.stages import StageSearch, plan_partition
    from solver_planner.stages.layers import layer_model
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml")
    model = layer_model(load_model_spec(ROOT / "specs" / "models" / "gpt3-2.6b.yaml"))

    def run():
        r = plan_partition(StageSearch(model, topo, "1f1b"), top=3)
        return [(c.time, c.pair_bound, tuple(c.plan.stages)) for c in r.solutions], r.bound, r.info["subspaces"]

    kept = run()
    dropped: list = []
    original = PairProblem.drop_caches
    monkeypatch.setattr(PairProblem, "drop_caches", lambda self: (dropped.append(1), original(self)))
    monkeypatch.setattr(problem_module._Caches, "CACHE_BYTES", 0)
    assert run() == kept and dropped


@st.composite
def plain_chains(draw):
    """(costs, family) of a random chain of 2-9 layers on 2-5 one-GPU hosts, one stage
    configuration, FLOPs at peak (no optimizer time), no communication: R1 over a plan is
    then exactly the relaxation fine_bound minimises."""
    from solver_planner.cost import CostModel
    from solver_planner.stages import Layer, LayerModel, MemoryOptions, MeshShape, family
    from solver_planner.stages.costs import cost_tables
    from test_stages_objective import random_layer, topology

    hosts = draw(st.integers(2, 5))
    n = draw(st.integers(hosts, 9))
    topo = topology(hosts, 1, "10 GB/s", "host")
    layers = [random_layer(draw, f"l{i}") for i in range(n)]
    layers = [Layer(**{**x.__dict__, "skips": ()}) for x in layers]
    opts = MemoryOptions(("none",), "none", draw(st.booleans()), draw(st.booleans()), 64 * 2**20)
    model = LayerModel("chain", layers, 8, None, options=opts)
    shape = MeshShape(1, 1)
    B = draw(st.sampled_from([1, 2, 4, 8]))
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), False)
    kind = draw(st.sampled_from(["1f1b", "gpipe", "eager-1f1b"]))
    return costs, family(kind, costs.stages)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_chains())
def test_the_fine_bound_is_r1_where_r1_has_nothing_else(case):
    """Without communication, with one configuration and no optimizer time, R1 over a plan is
    exactly what fine_bound relaxes it to (the transfers and drains are 0, the fill is the
    chain of the earlier layers): its greedy split then finds the least R1 over every plan,
    to its tolerance.  A bound that dropped a term or inflated one would miss it here."""
    costs, schedules = case
    pair = PairProblem(costs, schedules)
    assert len(pair.configs) == 1 and float(costs.optimizer_time(pair.configs[0])[0, 0]) == 0.0
    r1 = [v for v in (pair.terms(s)[0] for s in all_plans(pair)) if math.isfinite(v)]
    bound = fine_bound(pair, math.inf, phase=False)
    if not r1:
        assert bound == math.inf
        return
    assert min(r1) * (1 - 2e-3) <= bound <= min(r1) * (1 + 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_chains(), st.booleans())
def test_the_phase_term_is_below_every_simulated_plan(case, comm):
    """With the phase term (each stage's first backward waits for the round trip through
    the later stages, then the stage runs its backwards and the forwards its warm-up left),
    the bound over every cut stays below the fastest simulated plan of every cut, under
    every schedule of the family; and it is not below the bound without the term."""
    from solver_planner.stages import simulate_schedule
    from solver_planner.stages.objective import fits

    costs, schedules = case
    if comm:
        costs = StageCosts(costs.model, costs.topology, costs.shape, costs.microbatches, costs.tables, True)
    pair = PairProblem(costs, schedules)
    times = [simulate_schedule(pair.plan(s), sch).iteration_time for s in all_plans(pair) for sch in schedules
             if fits(pair.plan(s), sch)]
    with_phase = fine_bound(pair, math.inf)
    assert with_phase >= fine_bound(pair, math.inf, phase=False) * (1 - 1e-9)
    if times:
        assert with_phase <= min(times) * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_layers=7))
def test_the_memory_floor_is_the_least_memory_where_every_stage_keeps_as_much(case):
    """Under GPipe every stage keeps all B micro-batches, so without tied copies the floor
    relaxes nothing: it is the exact least memory (the program over the bands), to its
    tolerance.  Under the instance's family each stage counts its own fewest micro-batches
    (in 1F1B the first stage keeps S): below the exact least memory, and never below the
    floor that counts the fewest of any stage on every stage."""
    if case is None:
        return
    plan, schedules = case
    from solver_planner.stages import family

    pair = PairProblem(plan.costs, family("gpipe", plan.costs.stages))
    least, _ = pair._least_memory()
    floor = least_memory_floor(pair)
    assert floor <= least * (1 + 1e-9)
    if not pair.costs.model.ties() and math.isfinite(least):
        assert floor >= least * (1 - 2e-3)
    # a family whose later stages keep fewer micro-batches: each stage with its own
    own = PairProblem(plan.costs, schedules)
    floor = least_memory_floor(own)
    assert floor <= own._least_memory()[0] * (1 + 1e-9)
    assert floor >= least_memory_floor_fewest(own) * (1 - 2e-3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_layers=7))
def test_the_least_memory_program_is_the_least_over_every_plan(case):
    """The min-max program over the bands against every plan, enumerated: its peak is the
    least over plans of their fullest stage (each stage keeping its fewest micro-batches of
    the family), and the plan it returns has that peak."""
    if case is None:
        return
    plan, schedules = case
    pair = PairProblem(plan.costs, schedules)

    def peak(stages):
        return max(float(np.asarray(pair.costs.memory(st.config, pair.live_min(p)))[st.first, st.last])
                   for p, st in enumerate(stages))

    least, stages = pair._least_memory()
    every = [peak(s) for s in all_plans(pair)]
    if not every:
        assert stages is None and least == math.inf
        return
    assert least == min(every)
    assert peak(stages) == least
    assert stages in set(all_plans(pair))
    # read off the range tables, as on models deeper than a dense square: the same answer
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranges, "DENSE", 2)
        assert PairProblem(plan.costs, schedules)._least_memory() == (least, stages)


def test_the_memory_floor_lets_a_later_stage_hold_what_an_earlier_one_cannot():
    """Three stages under 1F1B keep 3, 2 and 1 micro-batches; of four layers the third's
    activations are ten times the others' and fit only where one is kept.  The least memory
    is 11 units (one layer, one layer, the last two); a greedy split that may not leave a
    stage empty puts both first layers on the first stage (6 units), then finds no room for
    the large one on the second, and would have claimed 20.  The bound over every cut, with
    the memory set to those 11 units, has the same greedy split and the large layer ten
    times the work (so time alone lets the first stage take both small ones): it stays
    below the least R1 of the plans that fit."""
    from solver_planner.cost import CostModel
    from solver_planner.stages import Layer, LayerModel, MemoryOptions, MeshShape, family
    from solver_planner.stages.costs import cost_tables
    from test_stages_objective import topology

    unit = 2**20
    layers = [Layer(f"l{i}", 1e9 * a, 2e9 * a, 0.0, 0.0, a * unit, a * unit, 0.0, allreduces=0)
              for i, a in enumerate((1.0, 1.0, 10.0, 1.0))]
    model = LayerModel("chain", layers, 3, None, options=MemoryOptions(("none",), "none", False, False, 64 * 2**20))
    topo = topology(3, 1, "10 GB/s", "host")
    costs = StageCosts(model, topo, MeshShape(1, 1), 3, cost_tables(topo, CostModel(topo), MeshShape(1, 1)), False)
    pair = PairProblem(costs, family("1f1b", 3))
    assert [pair.live_min(p) for p in range(3)] == [3, 2, 1]
    least, _ = pair._least_memory()
    assert least == pytest.approx(11 * unit, rel=1e-6)
    floor = least_memory_floor(pair)
    assert floor <= least * (1 + 1e-9)
    assert floor >= least_memory_floor_fewest(pair) * (1 - 2e-3)
    costs.device_memory = least * (1 + 1e-9)
    pair = PairProblem(costs, family("1f1b", 3))
    r1 = [v for v in (pair.terms(s)[0] for s in all_plans(pair)) if math.isfinite(v)]
    assert r1 and fine_bound(pair, math.inf) <= min(r1) * (1 + 1e-9)


def least_memory_floor_fewest(pair) -> float:
    """The floor counting the fewest micro-batches of any stage on every stage."""
    fewest = PairProblem(pair.costs, pair.schedules)
    least_live = min(pair.live_min(p) for p in range(pair.S))
    fewest.live_min = lambda p: least_live
    return least_memory_floor(fewest)


def test_interleaved_plans_have_at_most_1024_chunks():
    """10 000 layers on 8 stages would offer 1 250 chunk counts, each plan's bounds growing
    with the square of its chunks (the search ran past 10 minutes): at most 1 024 in all."""
    from solver_planner.stages.schedule import MAX_CHUNKS, virtual_options

    options = virtual_options("interleaved-1f1b", 8, 10_000, 64)
    assert options and max(options) * 8 <= MAX_CHUNKS == 1024 and options == list(range(2, 129))
    assert virtual_options("interleaved-1f1b", 4, 12, 8) == [2, 3]          # few blocks: as before


def test_no_block_aligned_plan_says_so(tmp_path, monkeypatch):
    """When no plan on block boundaries is found while some plan cutting inside blocks may
    exist (its bound is finite), the search does not claim the budget ran out or that nothing
    fits: it names the blocks and --split (here the programs are made to find nothing)."""
    from solver_planner.errors import UnknownError
    from solver_planner.spec import load_model_spec
    from solver_planner.stages import StageSearch, plan_partition
    from solver_planner.stages.layers import layer_model
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml")
    model = layer_model(load_model_spec(deep(tmp_path, 12)))
    monkeypatch.setattr(problem_module, "UNITS", 6)
    monkeypatch.setattr(problem_module, "EXACT", 6)
    monkeypatch.setattr(PairProblem, "feasible", lambda self, *a, **k: None)
    with pytest.raises(UnknownError, match="block boundaries only.*--split"):
        plan_partition(StageSearch(model, topo, "1f1b", microbatches=[8], stages=4), method="dp")


@st.composite
def drained_chains(draw):
    """(costs, family) of a random chain on 2-3 hosts of 2 GPUs, one stage per host with its 2
    GPUs data-parallel: each stage's gradient all-reduce and optimizer step (R1's drain) are
    real, and the first stage's delays every later fill.  20-40 layers on 2 stages, 12-24 on 3:
    fine_bound's pieces of the first stage's ends then hold several layers each."""
    from solver_planner.cost import CostModel
    from solver_planner.stages import Layer, LayerModel, MemoryOptions, MeshShape, family
    from solver_planner.stages.costs import cost_tables
    from test_stages_objective import random_layer, topology

    hosts = draw(st.integers(2, 3))
    n = draw(st.integers(20, 40) if hosts == 2 else st.integers(12, 24))
    topo = topology(hosts, 2, "10 GB/s", "host", efficiency=True)
    layers = [random_layer(draw, f"l{i}") for i in range(n)]
    # every layer with weights (from 64 MiB): drains that grow with each layer a stage takes
    layers = [Layer(**{**x.__dict__, "skips": (), "params": x.params + 2**26}) for x in layers]
    opts = MemoryOptions(("none",), "none", draw(st.booleans()), False, 64 * 2**20)
    model = LayerModel("chain", layers, 8, None, options=opts)
    shape = MeshShape(1, 2)
    B = draw(st.sampled_from([2, 4, 8]))
    costs = StageCosts(model, topo, shape, B, cost_tables(topo, CostModel(topo), shape), True)
    kind = draw(st.sampled_from(["1f1b", "gpipe"]))
    return costs, family(kind, costs.stages)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drained_chains())
def test_the_fine_bound_reads_each_first_stage_drain_where_its_piece_starts(case):
    """With drains, on more layers than fine_bound's pieces of the first stage's ends: a piece
    [a, b] is tested with the drain of its shortest first stage (a) and the later stages
    starting after its longest (b), so it covers every plan whose first stage ends in it.
    The bound stays below the least R1 over every plan, enumerated (with the later stages
    started after a instead, it does not)."""
    costs, schedules = case
    pair = PairProblem(costs, schedules)
    assert all(float(pair._config_arrays(j)["u0"][0, 0]) > 0 for j in range(len(pair.configs)))
    r1 = [v for v in (pair.terms(s)[0] for s in all_plans(pair)) if math.isfinite(v)]
    bound = fine_bound(pair, math.inf, phase=False)
    if r1:
        assert bound <= min(r1) * (1 + 1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drained_chains(), st.booleans())
def test_ruling_out_every_piece_at_once_gives_the_bound_piece_by_piece(case, phase):
    """fine_bound rules a threshold out for every piece of the first stage's ends with one
    relaxed test (the latest start and the least drain of any piece) before testing them one
    by one: the bound is exactly the one testing every piece, with and without the phase."""
    from solver_planner.stages import coarse

    costs, schedules = case
    pair = PairProblem(costs, schedules)
    fast = fine_bound(pair, math.inf, phase=phase)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coarse, "RELAXED_PIECES", False)
        assert fine_bound(pair, math.inf, phase=phase) == fast


@SETTINGS
@given(instances(max_layers=6))
def test_the_fine_bound_holds_where_memory_is_all_that_is_left(case):
    """With the device memory set to the exact least memory, only the plans needing least
    fit; the bound over every cut, whose memory test counts each stage's own fewest
    micro-batches, stays below the least R1 of those plans (enumerated).  Counting the
    first stage's count on every stage would refuse them."""
    if case is None:
        return
    plan, schedules = case
    costs = plan.costs
    least, _ = PairProblem(costs, schedules)._least_memory()
    if not math.isfinite(least) or costs.model.ties():
        return
    costs.device_memory = least * (1 + 1e-9)
    pair = PairProblem(costs, schedules)
    r1 = [v for v in (pair.terms(s)[0] for s in all_plans(pair)) if math.isfinite(v)]
    assert r1                                  # the least-memory plan fits
    assert fine_bound(pair, math.inf, phase=False) <= min(r1) * (1 + 1e-9)


def test_a_deep_model_that_fits_no_cut_is_proven_infeasible(tmp_path, monkeypatch):
    """Stages on blocks, and no plan of any cut fits: under 1F1B stage p keeps 4 - p
    micro-batches of 64 samples per replica (3.1 GiB a layer each), so the 12 layers do not
    fit in 4 stages of 16 GiB V100s, though 3 layers a stage would at one micro-batch each.
    The floor counts each stage's own micro-batches (18.8 GiB; 9.4 GiB with one each), so the
    search proves it (exit 1 with the shortfall), where it used to say the plans on blocks
    were not found and point to --split."""
    from solver_planner.errors import InfeasibleError
    from solver_planner.spec import load_model_spec
    from solver_planner.stages import StageSearch, plan_partition
    from solver_planner.stages.layers import layer_model
    from solver_planner.topology import load_topology

    path = tmp_path / "wide.yaml"
    path.write_text("name: wide\nlayers:\n  - {name: l, repeat: 12, flops: 2 GFLOP, params: 4 MiB,"
                    " activations: 50 MiB, allreduces: 2}\ntraining: {global_batch: 1024, dtype: bfloat16,"
                    " optimizer: adam}\n")
    topo = load_topology(ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml")
    model = layer_model(load_model_spec(path))
    monkeypatch.setattr(problem_module, "UNITS", 6)
    monkeypatch.setattr(problem_module, "EXACT", 6)
    search = StageSearch(model, topo, "1f1b", microbatches=[8], stages=4)
    assert all(p.coarse for p in search.pairs())
    with pytest.raises(InfeasibleError, match="needs at least"):
        plan_partition(search, method="dp")


@pytest.mark.parametrize("work, units", [([1.0, 1.0, 1.3, 8.0, 2.7], 4), ([0.0, 0.0, 0.0, 50.0, 0.0, 0.0, 0.0], 6),
                                         ([5.0] + [0.01] * 11, 8), ([1.0] * 9, 3)])
def test_blocks_are_as_many_as_asked_even_around_a_heavy_layer(monkeypatch, work, units):
    """Equal work puts several boundaries on the layer after a heavy one; the widest blocks
    are then cut again (repeatedly, a block made by one cut may be cut by the next) until
    there are ``units`` blocks, each of at least one layer (hypothesis found 3 of 4)."""
    from types import SimpleNamespace

    from solver_planner.stages import coarse

    monkeypatch.setattr(coarse, "_layer_work", lambda costs: np.asarray(work))
    costs = SimpleNamespace(model=SimpleNamespace(num_layers=len(work)), configs=[None])
    cuts = coarse_cuts(costs, units)
    assert len(cuts) == units + 1 and cuts[0] == 0 and cuts[-1] == len(work)
    assert all(np.diff(cuts) >= 1)
