import pytest
from hypothesis import given, settings, strategies as st

from solver_planner.cost import CostModel
from solver_planner.errors import PlannerError
from solver_planner.simulate.critical import critical_path
from solver_planner.simulate import Simulation, add_broadcast, add_collective, add_compute, add_transfer

S = 1e9


def test_a_collective_alone_takes_exactly_the_closed_form_time(a100):
    cm = CostModel(a100)
    for kind in ("allreduce", "reducescatter", "allgather", "reduce", "broadcast"):
        for algorithm in ("ring", "tree"):
            for groups in ([list(range(32))], a100.groups_across("node"), a100.groups_within("node")):
                sim = Simulation()
                add_collective(sim, cm, kind, groups, S, algorithm)
                tl = sim.run()
                assert tl[0].start == 0
                assert tl.makespan == cm.collective(kind, groups, S, algorithm).time


def test_transfer_broadcast_and_compute_alone(p3x3):
    cm = CostModel(p3x3)
    sim = Simulation()
    add_transfer(sim, cm, 0, 5, S)
    tl = sim.run()
    assert tl.makespan == cm.transfer_time(0, 5, S)
    sim = Simulation()
    add_broadcast(sim, cm, 0, [4, 5, 8], S)
    assert sim.run().makespan == cm.pipelined_broadcast(0, [4, 5, 8], S).time
    sim = Simulation()
    add_compute(sim, CostModel(p3x3, "peak"), 3, 250e12)
    assert sim.run().makespan == pytest.approx(2.0)


def test_contention_only_when_a_resource_is_shared(a100):
    cm = CostModel(a100)
    # Two cross-node transfers from node 0 both need nic[0].tx: they run one after the other.
    sim = Simulation()
    add_transfer(sim, cm, 0, 16, S)
    add_transfer(sim, cm, 1, 17, S)
    tl = sim.run()
    t = cm.transfer_time(0, 16, S)
    assert (tl[1].start, tl.makespan) == (pytest.approx(t), pytest.approx(2 * t))
    # Opposite directions use tx and rx of different NICs: concurrent (full duplex).
    sim = Simulation()
    add_transfer(sim, cm, 0, 16, S)
    add_transfer(sim, cm, 17, 1, S)
    assert sim.run().makespan == t
    # All-reduces inside each node touch only their own NVSwitch ports: concurrent.
    sim = Simulation()
    for g in a100.groups_within("node"):
        add_collective(sim, cm, "allreduce", [g], S)
    assert sim.run().makespan == cm.collective("allreduce", [list(range(16))], S).time


def test_dependency_order():
    sim = Simulation()
    a = sim.add("a", 2.0, ["r1"])
    b = sim.add("b", 3.0, ["r2"], deps=[a])
    c = sim.add("c", 1.0, ["r3"], deps=[a, b])
    d = sim.add("d", 1.0, ["r2"])  # independent, takes r2 first
    tl = sim.run()
    assert [(tl[i].start, tl[i].end) for i in (a, d, b, c)] == [(0, 2), (0, 1), (2, 5), (5, 6)]


def test_release_time_and_priority():
    sim = Simulation()
    late = sim.add("late", 1.0, ["r"], release=4.0)
    low = sim.add("low", 2.0, ["r"], priority=10)
    high = sim.add("high", 2.0, ["r"], priority=1)
    tl = sim.run()
    assert (tl[high].start, tl[low].start, tl[late].start) == (0, 2, 4)


def test_backfill_when_the_first_in_line_is_blocked():
    sim = Simulation()
    sim.add("holds A", 5.0, ["A"])
    big = sim.add("needs A and B", 1.0, ["A", "B"])
    small = sim.add("needs B", 2.0, ["B"])
    tl = sim.run()
    assert tl[small].start == 0 and tl[big].start == 5


def test_bad_tasks_are_refused():
    sim = Simulation()
    with pytest.raises(ValueError, match="earlier task"):
        sim.add("x", 1.0, deps=[0])
    with pytest.raises(ValueError, match="duration"):
        sim.add("x", -1.0)
    with pytest.raises(ValueError, match="duration"):
        sim.add("x", float("nan"))


def test_empty_simulation():
    assert Simulation().run().makespan == 0


def test_never_running_tasks_are_reported():
    sim = Simulation()
    sim.add("a", 1.0)
    sim.tasks[0].deps = (0,)  # corrupt on purpose: a self-cycle
    with pytest.raises(PlannerError, match="never ran"):
        sim.run()


def reference_schedule(tasks):
    """Naive greedy list scheduling, straight from the engine's definition: at every moment,
    start the startable task with the smallest (priority, id), and repeat until none is left."""
    n = len(tasks)
    start, end = [None] * n, [None] * n
    busy_until = {}
    times = {0.0} | {t["release"] for t in tasks}
    while any(s is None for s in start):
        now = min(times)
        times.discard(now)
        while True:
            startable = [
                i for i, t in enumerate(tasks)
                if start[i] is None and t["release"] <= now
                and all(end[d] is not None and end[d] <= now for d in t["deps"])
                and all(busy_until.get(r, 0.0) <= now for r in t["resources"])
            ]
            if not startable:
                break
            i = min(startable, key=lambda i: (tasks[i]["priority"], i))
            start[i], end[i] = now, now + tasks[i]["duration"]
            for r in tasks[i]["resources"]:
                busy_until[r] = end[i]
            times.add(end[i])
    return start, end


@st.composite
def task_sets(draw):
    n = draw(st.integers(1, 14))
    tasks = []
    for i in range(n):
        tasks.append({
            "duration": draw(st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0])),
            "resources": draw(st.lists(st.sampled_from("ABCD"), max_size=3, unique=True)),
            "deps": draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else [],
            "release": draw(st.sampled_from([0.0, 0.0, 1.0, 2.5])),
            "priority": draw(st.integers(0, 3)),
        })
    return tasks


@settings(max_examples=300, deadline=None)
@given(task_sets())
def test_engine_matches_the_naive_reference_scheduler(tasks):
    sim = Simulation()
    for i, t in enumerate(tasks):
        sim.add(f"t{i}", t["duration"], t["resources"], t["deps"], release=t["release"], priority=t["priority"])
    tl = sim.run()
    start, end = reference_schedule(tasks)
    assert [r.start for r in tl.records] == start
    assert [r.end for r in tl.records] == end
    assert tl.overlaps() == []
    for r, t in zip(tl.records, tasks):
        assert r.start >= max([t["release"]] + [tl[d].end for d in t["deps"]])


@settings(max_examples=150, deadline=None)
@given(task_sets())
def test_the_critical_path_tiles_the_run_with_linked_tasks(tasks):
    """Its pieces tile [0, makespan]; each task piece is that task as it ran; a task follows
    the one before it because it depends on it or waited for a resource it held; a gap
    (no task) ends at a task's release time."""
    sim = Simulation()
    for i, t in enumerate(tasks):
        sim.add(f"t{i}", t["duration"], t["resources"], t["deps"], release=t["release"], priority=t["priority"])
    tl = sim.run()
    path = critical_path(tl)
    if tl.makespan == 0:
        assert all(b == e for _, b, e in path)
        return
    assert path[0][1] == 0.0 and path[-1][2] == tl.makespan
    for (_, _, e), (_, b, _) in zip(path, path[1:]):
        assert e == b
    for k, (i, b, e) in enumerate(path):
        if i is None:
            nxt = path[k + 1][0]
            assert nxt is not None and tasks[nxt]["release"] == e
            continue
        assert (tl[i].start, tl[i].end) == (b, e)
        prev = next((p for p, _, _ in reversed(path[:k]) if p is not None), None) if k and path[k - 1][0] is not None \
            else None
        if prev is not None:
            assert prev in tasks[i]["deps"] or set(tasks[prev]["resources"]) & set(tasks[i]["resources"])


def test_per_resource_views():
    sim = Simulation()
    a = sim.add("a", 2.0, ["nic"])
    sim.add("b", 1.0, ["link"])
    c = sim.add("c", 3.0, ["nic", "link"])
    tl = sim.run()
    assert [r.id for r in tl.on("nic")] == [a, c]
    assert tl.busy_time("nic") == 5.0 and tl.busy_time("link") == 4.0


def _resource_classes_each(tasks) -> tuple[list[tuple[int, ...]], int]:
    """The engine's resource classes worked out resource by resource (the definition)."""
    sig_of: dict[tuple, int] = {}
    sig_ids = [sig_of.setdefault(t.resources, len(sig_of)) for t in tasks]
    users: dict = {}
    for sig, k in sig_of.items():
        for r in sig:
            users.setdefault(r, []).append(k)
    klass: dict[tuple[int, ...], int] = {}
    of = {r: klass.setdefault(tuple(u), len(klass)) for r, u in users.items()}
    per_sig = [tuple(dict.fromkeys(of[r] for r in sig)) for sig in sig_of]
    return [per_sig[k] for k in sig_ids], len(klass)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=10, unique=True), min_size=1, max_size=25))
def test_resource_classes_are_the_definition_s_numbering(holds):
    """The engine's resource classes, counted in C where one tuple alone holds a resource
    (small simulations) or refined with numpy (large ones: here every size takes both), are
    numbered and ordered exactly as the resource-by-resource definition numbers them (the
    simulation breaks ties by them)."""
    from solver_planner.simulate.engine import _resource_classes

    sim = Simulation()
    for n, res in enumerate(holds):
        sim.add(f"t{n}", 1.0, [f"r{r}" for r in res])
    want = _resource_classes_each(sim.tasks)
    assert _resource_classes(sim.tasks) == want
    assert _resource_classes(sim.tasks, large=-1) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=10, unique=True), min_size=1, max_size=25))
def test_port_classes_are_the_definition_s(holds):
    """The stage search's port classes (the engine's, per list of ports, with the lists holding
    each class and whether a list shares one), against the definition list by list."""
    from solver_planner.stages.ports import port_classes

    class Costs:            # the memo's key: any object
        pass

    lists = [tuple(f"r{r}" for r in res) for res in holds]
    users: dict = {}
    for k, ports in enumerate(lists):
        for res in ports:
            users.setdefault(res, []).append(k)
    klass: dict = {}
    of = {res: klass.setdefault(tuple(u), len(klass)) for res, u in users.items()}
    classes = [tuple(dict.fromkeys(of[res] for res in ports)) for ports in lists]
    shared = [any(len(u) > 1 for u in klass if k in u) for k in range(len(lists))]
    assert port_classes(Costs(), lists) == (classes, shared, list(klass))
