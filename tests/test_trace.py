import json

from solver_planner.cost import CostModel
from solver_planner.simulate import Simulation, add_collective, add_compute, to_chrome_trace, write_chrome_trace


def build(a100):
    cm = CostModel(a100)
    sim = Simulation()
    c0 = add_compute(sim, cm, 0, 312e9)
    c1 = add_compute(sim, cm, 16, 312e9)
    ar = add_collective(sim, cm, "allreduce", [[0, 16]], 1e9, deps=[c0, c1])
    sim.add("bookkeeping", 0.5, ["lock"], deps=[ar])
    return sim.run()


def test_trace_events_follow_the_trace_event_format(a100, tmp_path):
    tl = build(a100)
    path = write_chrome_trace(tl, tmp_path / "t.json", a100)
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    # A task appears once per device it runs on (the all-reduce on 2), or once if it has none.
    assert len(complete) == 1 + 1 + 2 + 1
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    rec = tl[2]
    ar_events = [e for e in complete if e["args"]["task"] == 2]
    for e in ar_events:
        assert e["ts"] == rec.start * 1e6 and e["dur"] == rec.duration * 1e6


def test_one_process_per_host_one_track_per_device_and_stream(a100):
    trace = to_chrome_trace(build(a100), a100)
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(procs.values()) == {"node 0", "node 1", "resources"}
    node0 = next(p for p, n in procs.items() if n == "node 0")
    assert {n for (p, _), n in threads.items() if p == node0} == {"device 0 compute", "device 0 comm"}
    # Every complete event sits on a named process and thread.
    for e in events:
        if e["ph"] == "X":
            assert e["pid"] in procs and (e["pid"], e["tid"]) in threads


def test_trace_without_topology(a100):
    trace = to_chrome_trace(build(a100))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"devices", "resources"}
