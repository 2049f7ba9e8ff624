"""Stages on unequal sub-meshes (Alpa's space): placement, transfers between meshes of
unequal data degrees, the simulators and objective on such plans, the lower bound of
stages/unequal.py against brute force over every plan of tiny instances, and the CLI."""

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver_planner.cost import CostModel
from solver_planner.errors import PlannerError
from solver_planner.stages import Layer, LayerModel, MemoryOptions, Schedule, family, simulate_schedule
from solver_planner.stages.costs import MeshShape, StageCosts, cost_tables
from solver_planner.stages.fastsim import iteration
from solver_planner.stages.meshes import MeshCosts, _overlaps, pack
from solver_planner.stages.objective import bounds, fits
from solver_planner.stages.partition import Partition, StagePlan
from solver_planner.stages.search import StageSearch, plan_partition
from solver_planner.stages.unequal import UnequalSpace, alpa_shapes, search_unequal
from conftest import ROOT
from test_stages_objective import random_layer, topology

REL = 1e-9
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _model(draw, n: int, tie: bool) -> LayerModel:
    layers = []
    for i in range(n):
        layers.append(random_layer(draw, f"l{i}"))
    if tie and n >= 3:
        layers[-1] = Layer(**{**layers[-1].__dict__, "tied_to": 0, "tied_params": layers[0].params + 2**20,
                              "tied_optimizer": layers[0].optimizer})
    opts = MemoryOptions(("none",), draw(st.sampled_from(["none", "zero-1", "zero-3"])), draw(st.booleans()),
                         draw(st.booleans()), 4 * 2**20)
    return LayerModel("random", layers, 16, None, options=opts)


def _tables(topo):
    cost = CostModel(topo)
    memo: dict = {}

    def tables(shape):
        if shape not in memo:
            memo[shape] = cost_tables(topo, cost, shape)
        return memo[shape]
    return tables


@st.composite
def unequal_plans(draw):
    """A random plan whose stages take random shapes of Alpa's set (and where they go)."""
    hosts, gpus = draw(st.sampled_from([(2, 2), (2, 4), (1, 4), (3, 2)]))
    topo = topology(hosts, gpus, draw(st.sampled_from(["1 GB/s", "40 GB/s"])), draw(st.sampled_from(["host", "device"])))
    n = draw(st.integers(2, 6))
    model = _model(draw, n, draw(st.booleans()))
    B = draw(st.sampled_from([1, 2, 4, 8]))
    tables = _tables(topo)
    shapes, left = [], topo.num_devices
    S = draw(st.integers(1, min(n, topo.num_devices)))
    for _ in range(S):
        fit = [s for s in alpa_shapes(hosts, gpus) if s.size <= left - (S - len(shapes) - 1)]
        if not fit:
            return None
        shapes.append(draw(st.sampled_from(fit)))
        left -= shapes[-1].size
    parts = [StageCosts(model, topo, s, B, tables(s)) for s in shapes]
    if any(not c.configs for c in parts):
        return None
    costs = MeshCosts(parts, pack(shapes, topo))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1)))
    edges = [0] + cuts + [n]
    stages = [StagePlan(edges[j], edges[j + 1] - 1, draw(st.sampled_from(parts[j].configs))) for j in range(S)]
    return Partition(costs, stages), family(draw(st.sampled_from(["1f1b", "gpipe", "eager-1f1b"])), S)


def test_overlaps_split_a_micro_batch_exactly():
    for a, b in itertools.product(range(1, 9), repeat=2):
        parts = _overlaps(a, b)
        assert math.isclose(sum(w for _, _, w in parts), 1.0)
        for i in range(a):
            assert math.isclose(sum(w for x, _, w in parts if x == i), 1 / a)
        for j in range(b):
            assert math.isclose(sum(w for _, y, w in parts if y == j), 1 / b)


@given(st.lists(st.sampled_from(alpa_shapes(3, 8)), min_size=1, max_size=8))
def test_pack_places_meshes_inside_hosts_without_overlap(shapes):
    topo = topology(3, 8, "1 GB/s", "host")
    layout = pack(shapes, topo)
    if sum(s.size for s in shapes) > topo.num_devices:
        assert layout is None
        return
    used = [d for p in range(len(shapes)) for d in layout.devices(p)]
    assert len(used) == len(set(used)) and max(used) < topo.num_devices
    for p, s in enumerate(shapes):
        devs = layout.devices(p)
        if s.devices_per_host < 8:       # inside one host
            assert devs[0] // 8 == devs[-1] // 8
        else:                            # whole hosts
            assert devs[0] % 8 == 0
    if len(set(shapes)) == 1:
        assert layout.offsets == tuple(p * shapes[0].size for p in range(len(shapes)))


@SETTINGS
@given(st.data())
def test_equal_shapes_through_mesh_costs_are_the_equal_plan(data):
    """The special case: MeshCosts with one shape prices and simulates exactly as StageCosts."""
    hosts, gpus = data.draw(st.sampled_from([(2, 2), (2, 4), (4, 2)]))
    topo = topology(hosts, gpus, "4 GB/s", data.draw(st.sampled_from(["host", "device"])))
    n = data.draw(st.integers(2, 6))
    model = _model(data.draw, n, data.draw(st.booleans()))
    shape = data.draw(st.sampled_from([s for s in alpa_shapes(hosts, gpus) if topo.num_devices // s.size <= n
                                       and topo.num_devices % s.size == 0]))
    tables = _tables(topo)
    B = data.draw(st.sampled_from([1, 2, 4]))
    costs = StageCosts(model, topo, shape, B, tables(shape))
    if not costs.configs:
        return
    S = costs.stages
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1)))
    edges = [0] + cuts + [n]
    stages = [StagePlan(edges[j], edges[j + 1] - 1, data.draw(st.sampled_from(costs.configs))) for j in range(S)]
    if len({s.tensor for s in stages}) > 1:
        stages = [StagePlan(s.first, s.last, stages[0].config) for s in stages]
    equal = Partition(costs, stages)
    mixed = Partition(MeshCosts([costs] * S, pack([shape] * S, topo)), stages)
    for sch in family("eager-1f1b", S):
        a, b = simulate_schedule(equal, sch), simulate_schedule(mixed, sch)
        # bit for bit: at a tie the simulator's order flips on an ulp of a price
        assert a.iteration_time == b.iteration_time, sch
        x, y = bounds(equal, sch), bounds(mixed, sch)
        for field in ("stage", "cycle", "port", "phase", "value"):
            assert math.isclose(getattr(x, field), getattr(y, field), rel_tol=1e-12, abs_tol=1e-15), field


def test_equal_shapes_through_mesh_costs_tie_like_the_equal_plan():
    """Regression (hypothesis found it): stage 1's last backward ends, in exact arithmetic, when
    its previous gradient transfer frees the NICs.  MeshCosts priced that transfer per byte of
    the micro-batch, an ulp off StageCosts' price per lane, so the next transfer and a gradient
    bucket took the NICs in opposite orders (eager-1F1B: 0.04226 s against 0.04194 s)."""
    topo = topology(4, 2, "4 GB/s", "host")
    layers = [Layer(f"l{i}", f, f, 0.0, 0.0, act, act, 0.0, allreduces=0, weight=0.0)
              for i, (f, act) in enumerate([(1e11, 9 * 2**20), (0.25e11, 0.0), (2e11, 0.0)])]
    layers[-1] = Layer(**{**layers[-1].__dict__, "tied_to": 0, "tied_params": 2**20, "tied_optimizer": 0.0})
    model = LayerModel("random", layers, 16, None, options=MemoryOptions(("none",), "none", False, True, 4 * 2**20))
    shape = MeshShape(2, 2)
    costs = StageCosts(model, topo, shape, 2, _tables(topo)(shape))
    stages = [StagePlan(0, 0, costs.configs[0]), StagePlan(1, 2, costs.configs[0])]
    assert costs.configs[0].tensor == 1
    equal = Partition(costs, stages)
    mixed = Partition(MeshCosts([costs] * 2, pack([shape] * 2, topo)), stages)
    assert equal.activation_time(0, 1) == mixed.activation_time(0, 1)
    assert equal.gradient_time(1, 0) == mixed.gradient_time(1, 0)
    for sch in family("eager-1f1b", 2):
        a, b = simulate_schedule(equal, sch), simulate_schedule(mixed, sch)
        assert a.iteration_time == b.iteration_time, sch
        assert iteration(mixed, sch).time == b.iteration_time, sch


@SETTINGS
@given(unequal_plans())
def test_unequal_plans_objective_below_simulation_and_fast_simulator_exact(case):
    if case is None:
        return
    plan, schedules = case
    for sch in schedules:
        run = simulate_schedule(plan, sch)
        fast = iteration(plan, sch)
        assert math.isclose(fast.time, run.iteration_time, rel_tol=REL), (plan, sch)
        b = bounds(plan, sch)
        assert b.value <= run.iteration_time * (1 + REL), (plan, sch, b, run.iteration_time)


def _all_plans(space: UnequalSpace):
    """Every plan of the space: shapes per stage (sizes within the cluster), cuts, configs."""
    L, N = space.L, space.N
    for S in range(1, min(L, N) + 1):
        for cuts in itertools.combinations(range(1, L), S - 1):
            edges = (0,) + cuts + (L,)
            for shapes in itertools.product(space.shapes, repeat=S):
                if sum(sh.shape.size for sh in shapes) > N:
                    continue
                costs = MeshCosts([sh.costs for sh in shapes], pack([sh.shape for sh in shapes], space.topology))
                for cfgs in itertools.product(*[sh.configs for sh in shapes]):
                    yield Partition(costs, [StagePlan(edges[j], edges[j + 1] - 1, cfgs[j]) for j in range(S)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_unequal_bound_is_below_every_plan_and_optimal_is_brute_forces(data):
    """Brute force over every plan of a 4-device cluster (every shape sequence, split and
    configuration): the bound of stages/unequal.py is at most the fastest plan's simulated time
    for that micro-batch count, and the search's OPTIMAL plan is the fastest."""
    topo = topology(2, 2, data.draw(st.sampled_from(["1 GB/s", "40 GB/s"])), "host",
                    memory=data.draw(st.sampled_from(["64 GiB", "3 GiB"])))
    n = data.draw(st.integers(2, 4))
    model = _model(data.draw, n, data.draw(st.booleans()))
    kind = data.draw(st.sampled_from(["1f1b", "gpipe", "eager-1f1b"]))
    search = StageSearch(model, topo, kind, microbatches=[data.draw(st.sampled_from([2, 4]))])
    B = search.microbatches[0]
    space = UnequalSpace(model, topo, B, kind, search.tables)
    best = math.inf
    for plan in _all_plans(space):
        for sch in family(kind, plan.costs.stages):
            if fits(plan, sch):
                best = min(best, simulate_schedule(plan, sch).iteration_time)
    assert space.bound() <= best * (1 + REL)
    # with the equal-mesh search first: its bound covers its pairs, the unequal bound the rest
    try:
        equal = plan_partition(search)
    except PlannerError:
        equal = None
    covered = [(p.costs.shape, p.B, p.S) for p in search.pairs()]
    for result in (search_unequal(search), search_unequal(search, equal, None, covered,
                                                          equal.bound if equal else math.inf)):
        if result is None:
            assert best == math.inf
            continue
        assert result.bound <= best * (1 + REL) and result.objective >= best * (1 - REL)
        if result.status.value == "OPTIMAL":
            assert math.isclose(result.objective, best, rel_tol=1e-9)


def test_unequal_search_never_loses_to_the_equal_one():
    from solver_planner.spec import load_model_spec
    from solver_planner.stages.layers import layer_model
    from solver_planner.topology import load_topology

    topo = load_topology(ROOT / "specs/clusters/local-2x4.yaml")
    model = layer_model(load_model_spec(ROOT / "specs/models/gpt-tiny.yaml"))
    search = StageSearch(model, topo, "1f1b")
    equal = plan_partition(search)
    both = search_unequal(search, equal)
    assert both.objective <= equal.objective
    assert both.bound <= both.objective * (1 + REL)


def test_cli_unequal_meshes(tmp_path):
    from typer.testing import CliRunner
    from solver_planner.cli import app

    runner = CliRunner()
    args = ["stages", str(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml"), str(ROOT / "specs/models/gpt3-2.6b.yaml"),
            "--meshes", "unequal",
            "--no-baselines"]
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["search"]["meshes"] == "unequal" and doc["bound"] <= doc["iteration_time"]
    used = [d for st in doc["stages"] for d in range(st["devices"][0], st["devices"][1] + 1)]
    assert len(used) == len(set(used))
    res = runner.invoke(app, args + ["--config", "1,2,4,1024"])
    assert res.exit_code == 2 and "--config" in res.output
    for cmd in ("stages", "plan"):
        bad = [cmd] + args[1:3] + ["--meshes", "uneven"]
        res = runner.invoke(app, bad)
        assert res.exit_code == 2 and "unknown meshes 'uneven'" in res.output and "equal, unequal" in res.output


def test_the_picture_of_an_unequal_plan_says_each_stages_devices(tmp_path):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner
    from solver_planner.cli import app

    svg = tmp_path / "p.svg"
    res = CliRunner().invoke(app, ["stages", str(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml"),
                                   str(ROOT / "specs/models/gpt3-2.6b.yaml"),
                                   "--meshes", "unequal", "--no-baselines", "--plot", str(svg)])
    assert res.exit_code == 0, res.output
    text = svg.read_text()
    # the plan's meshes: 1x1 and 1x2 (the README's example)
    assert "1 device" in text and "2 devices" in text and "4 devices" not in text


def test_plans_of_an_equal_shape_the_equal_search_does_not_cover_stay_under_the_bound():
    """The fastest plan of this instance is one stage on one device (all of one shape, but not a
    pair of the equal-mesh search, whose 1x1 plans have 4 stages): the bound combined from the
    equal search's and the unequal programs' must stay under it (brute force over every plan)."""
    topo = topology(2, 2, "1 GB/s", "host", memory="1024 GiB")
    layers = [Layer(f"l{i}", 1e10, 2e10, 2**30, 0.0, 64 * 2**20, 64 * 2**20, 0.0, weight=1e10) for i in range(4)]
    model = LayerModel("m", layers, 8, None, options=MemoryOptions())
    search = StageSearch(model, topo, "1f1b", microbatches=[4])
    space = UnequalSpace(model, topo, 4, "1f1b", search.tables)
    best, fastest = math.inf, None
    for plan in _all_plans(space):
        for sch in family("1f1b", plan.costs.stages):
            if fits(plan, sch) and simulate_schedule(plan, sch).iteration_time < best:
                best, fastest = simulate_schedule(plan, sch).iteration_time, plan
    assert fastest.costs.layout.shapes == (MeshShape(1, 1),)
    equal = plan_partition(search)
    covered = [(p.costs.shape, p.B, p.S) for p in search.pairs()]
    assert (MeshShape(1, 1), 4, 4) in covered and equal.objective > best
    result = search_unequal(search, equal, None, covered, equal.bound)
    assert result.bound <= best * (1 + REL)
    assert math.isclose(result.objective, best, rel_tol=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_stage_program_is_exact_per_stage_count_and_shape_flag(data):
    """X(0, N, s, flag) of stages/unequal.py against every (shapes, split) of s stages: the least
    largest A, where flag is the tracked shape all stages take or 'other' (what lets the bound leave
    out the equal search's pairs)."""
    hosts, gpus = data.draw(st.sampled_from([(2, 2), (1, 4), (3, 2)]))
    topo = topology(hosts, gpus, "4 GB/s", "host", memory=data.draw(st.sampled_from(["64 GiB", "3 GiB"])))
    n = data.draw(st.integers(2, 5))
    model = _model(data.draw, n, False)
    B = data.draw(st.sampled_from([2, 4]))
    space = UnequalSpace(model, topo, B, data.draw(st.sampled_from(["1f1b", "eager-1f1b"])), _tables(topo))
    # the shapes whose one-shape plans get their own flag (the equal search's, in a search)
    tracked = tuple(sorted(data.draw(st.sets(st.integers(0, len(space.shapes) - 1)))))
    T = len(tracked)
    X = space._dp("A", tracked)[0][0, space.N]
    want = np.full(X.shape, np.inf)
    for S in range(1, min(n, topo.num_devices) + 1):
        for cuts in itertools.combinations(range(1, n), S - 1):
            edges = (0,) + cuts + (n,)
            for js in itertools.product(range(len(space.shapes)), repeat=S):
                if sum(space.shapes[j].shape.size for j in js) > topo.num_devices:
                    continue
                value = max(space.shapes[j].A_min[edges[p], edges[p + 1] - 1, S - p] for p, j in enumerate(js))
                flag = tracked.index(js[0]) if len(set(js)) == 1 and js[0] in tracked else T
                want[S, flag] = min(want[S, flag], value)
    assert np.array_equal(X[:, :T + 1], want[:, :T + 1])
    # leaving out (shape, stage count) pairs of tracked shapes removes exactly those cells
    Xt, Yt = space._dp("A", tracked)[0], space._dp("a", tracked)[0]
    Y = Yt[0, space.N]
    for t, j in enumerate(tracked):
        for S in range(1, space.S + 1):
            keep = np.ones(X.shape, dtype=bool)
            keep[S, t] = False
            expect = max(np.min(np.where(keep, X, np.inf)), np.min(np.where(keep, Y, np.inf)))
            assert space._bound(Xt, Yt, tracked, [(space.shapes[j].shape, S)]) == expect


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bounds_with_a_stage_count_or_a_device_cap_hold_over_those_plans(data):
    """--stages and --devices: the bound over plans of that many stages (or at most that many
    devices) is at most the fastest of them (brute force) and at least the unrestricted bound."""
    topo = topology(2, 2, "4 GB/s", "host")
    n = data.draw(st.integers(2, 4))
    model = _model(data.draw, n, False)
    tables = _tables(topo)
    stages = data.draw(st.integers(1, min(n, 4)))
    devices = data.draw(st.integers(1, 3))
    free = UnequalSpace(model, topo, 2, "1f1b", tables).bound()
    for space, keep in ((UnequalSpace(model, topo, 2, "1f1b", tables, stages=stages),
                         lambda plan: plan.costs.stages == stages),
                        (UnequalSpace(model, topo, 2, "1f1b", tables, devices=devices),
                         lambda plan: plan.costs.layout.used <= devices)):
        best = math.inf
        for plan in _all_plans(UnequalSpace(model, topo, 2, "1f1b", tables)):
            if keep(plan) and fits(plan, Schedule("1f1b")):
                best = min(best, simulate_schedule(plan, Schedule("1f1b")).iteration_time)
        assert free <= space.bound() <= best * (1 + REL)
        _, plans = space.plans()
        assert all(keep(plan) for plan in plans)


def test_cli_unequal_meshes_take_a_stage_count_and_a_device_cap():
    from typer.testing import CliRunner
    from solver_planner.cli import app

    res = CliRunner().invoke(app, ["stages", str(ROOT / "specs/clusters/aws-p3.8xlarge-4.yaml"),
                                   str(ROOT / "specs/models/gpt3-6.7b.yaml"), "--meshes", "unequal", "--no-baselines",
                                   "--stages", "5", "--devices", "14", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["stages"]) == 5 and doc["devices"]["used"] <= 14
    assert doc["devices"]["reason"].endswith("(--devices 14)")


def test_unequal_meshes_keep_the_device_cap_when_no_equal_plan_fits_it():
    """4 stages on at most 3 devices: no plan (exit 1), not an 8-device plan of the equal search."""
    from typer.testing import CliRunner
    from solver_planner.cli import app

    res = CliRunner().invoke(app, ["stages", str(ROOT / "specs/clusters/local-2x4.yaml"),
                                   str(ROOT / "specs/models/gpt-tiny.yaml"), "--meshes", "unequal", "--no-baselines",
                                   "--stages", "4", "--devices", "3"])
    assert res.exit_code == 1, res.output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_alpas_objective_program_finds_its_least_plan(data):
    """The candidates of Alpa's objective (sum of stage latencies + (B - 1) x the largest),
    with no caps merged and no limit on the programs, against every (shapes, split,
    configuration) of the space that fits: the first candidate has the least objective."""
    from solver_planner.stages import unequal

    hosts, gpus = data.draw(st.sampled_from([(2, 2), (1, 4), (3, 2)]))
    topo = topology(hosts, gpus, "4 GB/s", "host", memory=data.draw(st.sampled_from(["64 GiB", "3 GiB"])))
    n = data.draw(st.integers(2, 5))
    model = _model(data.draw, n, False)
    B = data.draw(st.sampled_from([2, 4, 16]))
    stages = data.draw(st.sampled_from([None, 2]))
    space = UnequalSpace(model, topo, B, data.draw(st.sampled_from(["1f1b", "eager-1f1b"])), _tables(topo),
                         stages=stages)

    def objective(t):
        return sum(t) + (B - 1) * max(t)

    least = math.inf
    for S in range(1, min(n, topo.num_devices) + 1):
        if stages not in (None, S):
            continue
        for cuts in itertools.combinations(range(1, n), S - 1):
            edges = (0,) + cuts + (n,)
            for js in itertools.product(range(len(space.shapes)), repeat=S):
                if sum(space.shapes[j].shape.size for j in js) > topo.num_devices:
                    continue
                t = [min((float(sh.w[c, edges[p], edges[p + 1] - 1]) for c in range(len(sh.configs))
                          if sh.fit[c, edges[p], edges[p + 1] - 1, S - p]), default=math.inf)
                     for p, sh in enumerate(space.shapes[j] for j in js)]
                least = min(least, objective(t))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unequal, "CAP_STEP", 1e-12)
        plans = space.alpa_plans(most=10**6)
    if not math.isfinite(least):
        assert plans == []
        return
    shapes = {sh.shape: sh for sh in space.shapes}
    first = plans[0]
    t = []
    for p, stage in enumerate(first.stages):
        sh = shapes[first.costs.of(p).shape]
        c = sh.configs.index(stage.config)
        assert sh.fit[c, stage.first, stage.last, first.costs.stages - p]        # it fits
        t.append(float(sh.w[c, stage.first, stage.last]))
    assert math.isclose(objective(t), least, rel_tol=1e-9)
    assert stages in (None, first.costs.stages)
    assert sum(first.costs.of(p).shape.size for p in range(first.costs.stages)) <= topo.num_devices
