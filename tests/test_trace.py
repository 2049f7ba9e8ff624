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


# -- the aggregated trace (--trace-detail stages) ------------------------------------------

import pytest  # noqa: E402

from conftest import ROOT, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def pipeline_plan():
    """gpt-tiny on local-2x4 as 4 stages of 2 devices and 16 micro-batches."""
    from solver_planner.plan import make_plan
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages.report import parse_config
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(ROOT / "specs/clusters/local-2x4.yaml"))
    spec = load_model_spec(ROOT / "specs/models/gpt-tiny.yaml")
    return topo, make_plan(topo, spec, schedule="1f1b", config=parse_config("1,2,4,16"))


def _names(events):
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def _busy_by_track(events):
    procs, threads = _names(events)
    out = {}
    for e in events:
        if e["ph"] == "X":
            key = (procs[e["pid"]], threads[(e["pid"], e["tid"])])
            out[key] = out.get(key, 0.0) + e["args"].get("busy_us", e["dur"])
    return out


@pytest.mark.parametrize("merge_above", [4, 64])
def test_stage_trace_keeps_every_tasks_time(pipeline_plan, merge_above):
    from solver_planner.simulate import to_stage_trace

    topo, plan = pipeline_plan
    tl = plan.run.timeline
    trace = to_stage_trace(tl, 2, merge_above=merge_above, keep=2)
    events = trace["traceEvents"]
    procs, _ = _names(events)
    assert sorted(set(procs.values())) == ["links"] + [f"stage {p} (2 devices)" for p in range(4)]
    merged = [e for e in events if e.get("cat") == "merged"]
    assert bool(merged) == (merge_above < 16)
    # every task is drawn, whole or inside one merged slice: tasks and busy time per track agree
    want_tasks, want_busy = {}, {}
    for rec in tl.records:   # a task of two stages (the tied embedding's) is on both
        for stage in {d // 2 for d in rec.devices}:
            key = (f"stage {stage} (2 devices)", rec.stream)
            want_tasks[key] = want_tasks.get(key, 0) + 1
            want_busy[key] = want_busy.get(key, 0.0) + rec.duration * 1e6
    got_tasks = {}
    for e in events:
        if e["ph"] == "X":
            key = (procs[e["pid"]], _names(events)[1][(e["pid"], e["tid"])])
            got_tasks[key] = got_tasks.get(key, 0) + e["args"].get("tasks", 1)
    assert got_tasks == want_tasks
    got_busy = _busy_by_track(events)
    assert got_busy.keys() == want_busy.keys()
    for key in want_busy:
        assert got_busy[key] == pytest.approx(want_busy[key], rel=1e-9)
    for e in merged:   # warm-up and cool-down stay whole
        lo, hi = map(int, e["args"]["microbatches"].split("-"))
        assert 2 <= lo <= hi < 14
    # slices of one track never overlap (Perfetto needs nested slices)
    by_track = {}
    for e in events:
        if e["ph"] == "X" and e["cat"] in ("forward", "backward", "merged", "optimizer"):
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))


def test_stage_trace_link_counters(pipeline_plan):
    from solver_planner.simulate import to_stage_trace

    topo, plan = pipeline_plan
    events = to_stage_trace(plan.run.timeline, 2)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["args"]["busy ports"] >= 0 for e in counters)
    # every link class's counter returns to zero at the end of the iteration
    last = {}
    for e in counters:
        last[e["name"]] = e["args"]["busy ports"]
    assert set(last.values()) == {0}


def test_trace_cli_detail_and_determinism(tmp_path):
    out = []
    for n in range(2):
        path = tmp_path / f"t{n}.json"
        res = run_cli("plan", ROOT / "specs/clusters/local-2x4.yaml", ROOT / "specs/models/gpt-tiny.yaml",
                      "--config", "1,2,4,16", "--trace", path, env={"PYTHONHASHSEED": str(n)})
        assert res.returncode == 0, res.stderr
        out.append(path.read_bytes())
    assert out[0] == out[1]
    data = json.loads(out[0])
    assert data["metadata"]["detail"] == "stages"


def test_full_trace_warns_before_writing_a_big_one(pipeline_plan, tmp_path, monkeypatch, capsys):
    from solver_planner.cli import common

    topo, plan = pipeline_plan
    monkeypatch.setattr(common, "TRACE_WARN_BYTES", 1000)
    common.write_trace(plan.run.timeline, tmp_path / "full.json", topo, "full", 2, links=True)
    err = capsys.readouterr().err
    assert "warning: the full trace is about" in err
    full = json.loads((tmp_path / "full.json").read_text())
    # the streamed file is the full trace
    want = to_chrome_trace(plan.run.timeline, topo, links=True)["traceEvents"]
    assert sorted(map(json.dumps, full["traceEvents"])) == sorted(map(json.dumps, want))


# -- the full trace's size estimate (the warning's figure) ------------------------------------

def _wide_collectives(a100):
    """Collectives over up to all 32 devices of two hosts: each holds dozens of ports, so its
    link-track copies (task id only) outnumber and outweigh its device-track events (whole
    arguments and resource list), the mix an estimate pricing every event alike gets wrong."""
    cm = CostModel(a100)
    sim = Simulation()
    prev = [add_compute(sim, cm, d, 312e9) for d in range(32)]
    for n, groups in enumerate([[list(range(32))], [list(range(16)), list(range(16, 32))],
                                [[d, d + 16] for d in range(16)]] * 3):
        prev = [add_collective(sim, cm, "allreduce", groups, 1e8 * (n + 1), deps=prev)]
    sim.add("bookkeeping", 0.5, ["lock"], deps=prev)
    return sim.run()


@pytest.mark.parametrize("links", [True, False])
def test_full_size_estimate_is_the_written_size(a100, pipeline_plan, tmp_path, links):
    import os

    from solver_planner.simulate import estimate_full_bytes

    topo, plan = pipeline_plan
    for tl, top in ((plan.run.timeline, topo), (_wide_collectives(a100), a100)):
        written = os.path.getsize(write_chrome_trace(tl, tmp_path / "full.json", top, links=links, detail="full"))
        assert estimate_full_bytes(tl, links, top) == pytest.approx(written, rel=0.02)
        # from a sample of the tasks too (a big plan's estimate samples 2 000 of them)
        assert estimate_full_bytes(tl, links, top, sample=10) == pytest.approx(written, rel=0.05)


# -- the aggregated trace against the full one --------------------------------------------------

def test_stage_trace_below_the_threshold_is_the_full_trace_per_stage(pipeline_plan):
    """Up to ``merge_above`` micro-batches nothing is merged: the stage trace holds exactly the
    full trace's device-track slices, stage p's being those of device p * stage size (the
    device the simulator runs the stage's work on), with the same names, times and arguments."""
    from solver_planner.simulate import to_stage_trace

    topo, plan = pipeline_plan
    tl = plan.run.timeline
    full = to_chrome_trace(tl, topo, links=True)["traceEvents"]
    stage = to_stage_trace(tl, 2)
    assert stage["metadata"]["merged"] is False and stage["metadata"]["microbatches"] == 16
    fprocs, fthreads = _names(full)
    sprocs, sthreads = _names(stage["traceEvents"])

    def slices(events, procs, threads, track_of):
        out = []
        for e in events:
            track = track_of(procs[e["pid"]], threads[(e["pid"], e["tid"])]) if e["ph"] == "X" else None
            if track is not None:
                args = {k: v for k, v in e["args"].items() if k != "resources"}
                out.append((track_of(procs[e["pid"]], threads[(e["pid"], e["tid"])]), e["name"], e["cat"],
                            e["ts"], e["dur"], json.dumps(args, sort_keys=True)))
        return sorted(out)

    def full_track(proc, thread):
        if proc == "links":
            return None
        device, stream = thread.removeprefix("device ").split(" ", 1)
        assert int(device) % 2 == 0     # only a stage's first device runs tasks
        return f"stage {int(device) // 2} (2 devices)", stream

    want = slices(full, fprocs, fthreads, full_track)
    got = slices(stage["traceEvents"], sprocs, sthreads, lambda proc, thread: (proc, thread))
    assert got == want


def test_full_trace_link_copies_carry_the_task_id(pipeline_plan):
    """The full trace draws each task on its device tracks with its arguments and resources,
    and on one track per link it holds with only its id (the link names the rest): the one
    way it differs from the trace before aggregation, and most of a big trace's bytes."""
    topo, plan = pipeline_plan
    tl = plan.run.timeline
    events = to_chrome_trace(tl, topo, links=True)["traceEvents"]
    procs, threads = _names(events)
    on_links, on_devices = {}, {}
    for e in events:
        if e["ph"] != "X":
            continue
        task = e["args"]["task"]
        if procs[e["pid"]] == "links":
            assert e["args"] == {"task": task}
            on_links.setdefault(task, []).append(threads[(e["pid"], e["tid"])])
        else:
            on_devices.setdefault(task, []).append(e["args"])
    for rec in tl.records:
        assert sorted(on_links.get(rec.id, [])) == sorted(map(str, rec.resources))
        assert len(on_devices[rec.id]) == len(rec.devices)
        for args in on_devices[rec.id]:
            assert args["resources"] == [str(r) for r in rec.resources]
            assert {k: v for k, v in args.items() if k not in ("task", "resources")} == rec.args


@pytest.mark.parametrize("detail", ["stages", "full"])
def test_same_plan_same_bytes(pipeline_plan, tmp_path, detail):
    topo, plan = pipeline_plan
    out = [write_chrome_trace(plan.run.timeline, tmp_path / f"{n}.json", topo, links=True, detail=detail,
                              stage_size=2, merge_above=4).read_bytes() for n in range(2)]
    assert out[0] == out[1]
    json.loads(out[0])


def test_no_warning_below_the_limit_or_for_the_stage_trace(pipeline_plan, tmp_path, monkeypatch, capsys):
    from solver_planner.cli import common
    from solver_planner.simulate import estimate_full_bytes

    topo, plan = pipeline_plan
    tl = plan.run.timeline
    common.write_trace(tl, tmp_path / "full.json", topo, "full", 2, links=True)   # ~100 kB
    assert "warning:" not in capsys.readouterr().err
    # the stage trace never warns: it is the one the warning points to
    monkeypatch.setattr(common, "TRACE_WARN_BYTES", 1000)
    common.write_trace(tl, tmp_path / "stages.json", topo, "stages", 2, links=True)
    assert "warning:" not in capsys.readouterr().err
    # the warning's figure is the estimate, in the decimal megabytes --help states the limit in
    monkeypatch.setattr(common, "TRACE_WARN_BYTES", 10)
    common.write_trace(tl, tmp_path / "full.json", topo, "full", 2, links=True)
    want = f"about {estimate_full_bytes(tl, True, topo) / 1e6:,.0f} MB; Perfetto's UI struggles above 0 MB"
    assert want in capsys.readouterr().err
