"""Chrome trace (Perfetto) export of a :class:`Timeline`.

The format is the Trace Event Format's JSON object form: complete events (``"ph": "X"``)
with microsecond ``ts``/``dur``, and metadata events naming processes and threads.  One
process per host (an instance of the topology's host level), one track ("thread") per
device and stream; a task on several devices (a collective) appears on each of their
tracks.  Tasks without devices go to a process named "resources", one track per first
resource.  ui.perfetto.dev and chrome://tracing open the file.

That full form grows with devices times links: a 1 024-GPU plan holds about a million
(task, link) pairs.  :func:`to_stage_trace` is the aggregated form ``plan`` and ``stages``
write by default: one process per pipeline stage (its devices run the same work, so the
stage is drawn once), a track per stream; one counter per link class (interconnect) giving
how many of its ports are busy; and beyond ``merge_above`` micro-batches, the steady state's
consecutive micro-batch tasks on a track merged into one slice whose arguments say which
micro-batches and how many tasks it holds and their busy time, while warm-up and cool-down
keep every task.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timeline import Timeline

if TYPE_CHECKING:
    from ..topology import Topology

__all__ = ["to_chrome_trace", "write_chrome_trace", "to_stage_trace", "estimate_full_bytes", "MERGE_ABOVE", "KEEP"]

MERGE_ABOVE = 64   # micro-batches: above this, the steady state's tasks are merged
KEEP = 8           # micro-batches kept whole at each end (warm-up, cool-down) when merging
_MICROBATCH = re.compile(r"\bmb(\d+)\b")

_US = 1e6  # trace timestamps are in microseconds


def to_chrome_trace(timeline: Timeline, topology: Topology | None = None, links: bool = False) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], "displayTimeUnit": "ms"}``);
    ``links``: every task also on one track per resource it holds (a process "links")."""
    return {"traceEvents": list(_full_events(timeline, topology, links)), "displayTimeUnit": "ms"}


def _full_events(timeline: Timeline, topology: Topology | None, links: bool):
    """The full trace's events one by one (metadata last: the format does not order them)."""
    tracks = _Tracks()
    track = tracks.track

    for rec in sorted(timeline.records, key=lambda r: (r.start, r.id)):
        args, short = _full_args(rec)
        for proc, thread in _full_places(rec, topology, links):
            pid, tid = track(proc, thread)
            yield _complete(rec, pid, tid, args if proc != "links" else short)
    yield from tracks.metadata()


def _full_places(rec, topology: Topology | None, links: bool) -> list[tuple[str, str]]:
    """The (process, thread) tracks a task is drawn on in the full trace."""
    if rec.devices:
        places = [(_host_process(d, topology), f"device {d} {rec.stream}") for d in rec.devices]
    else:
        places = [("resources", str(rec.resources[0]) if rec.resources else rec.stream)]
    if links and rec.devices:
        places += [("links", str(r)) for r in rec.resources]
    return places


def _host_process(device: int, topology: Topology | None) -> str:
    """The full trace's process of a device: its host ("node 3"), or "devices" without a topology."""
    if topology is None:
        return "devices"
    return f"{topology.level_names[topology.host_level]} {topology.host(device)}"


def _full_args(rec) -> tuple[dict[str, Any], dict[str, Any]]:
    """A task's arguments on its device tracks, and on its link tracks: there the track names
    the link and the task id the rest (a collective on hundreds of ports would otherwise
    repeat its whole resource list hundreds of times)."""
    args = {"task": rec.id, **{k: v for k, v in rec.args.items() if _jsonable(v)}}
    if rec.resources:
        args["resources"] = [str(r) for r in rec.resources]
    return args, {"task": rec.id}


def _complete(rec, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": rec.name, "cat": rec.category or rec.stream, "ph": "X", "ts": rec.start * _US,
            "dur": rec.duration * _US, "pid": pid, "tid": tid, "args": args}


class _Tracks:
    """Process and thread ids in order of first use, and their metadata events."""

    def __init__(self) -> None:
        self.processes: dict[str, int] = {}
        self.threads: dict[tuple[int, str], int] = {}

    def track(self, process: str, thread: str) -> tuple[int, int]:
        pid = self.processes.setdefault(process, len(self.processes))
        key = (pid, thread)
        if key not in self.threads:
            self.threads[key] = len(self.threads)
        return pid, self.threads[key]

    def metadata(self):
        for proc, pid in self.processes.items():
            yield {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": proc}}
            yield {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        for (pid, thread), tid in self.threads.items():
            yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}}
            yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def estimate_full_bytes(timeline: Timeline, links: bool = False, topology: Topology | None = None,
                        sample: int = 2000) -> int:
    """About how many bytes :func:`write_chrome_trace` writes in full detail, without building
    the events: the tracks' metadata exactly, and each kind of event (a device track's, which
    carries the task's arguments and resource list, and a link track's copy, which carries
    only the task id: often ten times shorter, and most of a big trace) as its count times
    its mean size over an evenly spaced ``sample`` of the tasks."""
    records = timeline.records
    device_tracks: set[tuple[int, str]] = set()
    other_tracks: set[str] = set()
    link_tracks: set[Any] = set()
    counts = [0, 0]            # events on device (or resource) tracks, on link tracks
    for rec in records:
        if rec.devices:
            device_tracks.update((d, rec.stream) for d in rec.devices)
            counts[0] += len(rec.devices)
            if links:
                link_tracks.update(rec.resources)
                counts[1] += len(rec.resources)
        else:
            other_tracks.add(str(rec.resources[0]) if rec.resources else rec.stream)
            counts[0] += 1
    tracks = _Tracks()
    for d, stream in sorted(device_tracks):
        tracks.track(_host_process(d, topology), f"device {d} {stream}")
    for name in sorted(other_tracks):
        tracks.track("resources", name)
    for res in sorted(link_tracks, key=str):
        tracks.track("links", str(res))
    meta = sum(len(_dumps(e)) + 1 for e in tracks.metadata())
    # ids as wide as the trace's own (their digits are in every event)
    pid, tid = 10 ** (len(str(len(tracks.processes))) - 1), 10 ** (len(str(len(tracks.threads))) - 1)
    sizes, sampled = [0, 0], [0, 0]    # summed sizes and counts of the sample's events, per kind
    for rec in records[:: max(1, len(records) // sample)]:
        args, short = _full_args(rec)
        on_devices = max(1, len(rec.devices))
        sizes[0] += on_devices * (len(_dumps(_complete(rec, pid, tid, args))) + 1)
        sampled[0] += on_devices
        if links and rec.devices and rec.resources:
            sizes[1] += len(rec.resources) * (len(_dumps(_complete(rec, pid, tid, short))) + 1)
            sampled[1] += len(rec.resources)
    events = sum(count * size / max(1, n) for count, size, n in zip(counts, sizes, sampled))
    return int(events + meta + len(_dumps({"traceEvents": [], "displayTimeUnit": "ms"})))


def _dumps(event: dict[str, Any]) -> str:
    """One event as the file holds it (compact separators: no space after "," and ":")."""
    return json.dumps(event, separators=(",", ":"))


def stage_of(device: int, stage_size) -> int:
    """The pipeline stage drawn for ``device``: ``device // stage_size`` when every stage has
    ``stage_size`` devices, else ``stage_size[device]``'s stage (``{device: (stage, devices)}``,
    unequal meshes)."""
    return device // stage_size if isinstance(stage_size, int) else stage_size[device][0]


def stage_devices(stage: int, stage_size) -> int:
    """The devices of ``stage`` (see :func:`stage_of`)."""
    if isinstance(stage_size, int):
        return stage_size
    return next(n for p, n in stage_size.values() if p == stage)


def to_stage_trace(timeline: Timeline, stage_size: int, merge_above: int = MERGE_ABOVE, keep: int = KEEP,
                   level_of: dict[str, str] | None = None) -> dict[str, Any]:
    """The aggregated trace (see the module docstring).  ``stage_size``: devices per stage
    (the simulator draws stage ``p`` on device ``p * stage_size``); ``level_of``: a link
    class's label (interconnect name -> e.g. "nvswitch (node)")."""
    events: list[dict[str, Any]] = []
    tracks = _Tracks()
    track = tracks.track

    records = sorted(timeline.records, key=lambda r: (r.start, r.id))
    mbs = [int(m.group(1)) for r in records if (m := _MICROBATCH.search(r.name))]
    count = max(mbs) + 1 if mbs else 0
    merging = count > merge_above

    def middle(rec) -> int | None:
        m = _MICROBATCH.search(rec.name)
        if not merging or m is None:
            return None
        mb = int(m.group(1))
        return mb if keep <= mb < count - keep else None

    runs: dict[tuple[int, int], dict[str, Any]] = {}   # open merged slice per track

    def close(key) -> None:
        run = runs.pop(key, None)
        if run is None:
            return
        lo, hi = run["mbs"]
        events.append({"name": f"steady state: micro-batches {lo}-{hi}", "cat": "merged", "ph": "X",
                       "ts": run["start"] * _US, "dur": (run["end"] - run["start"]) * _US, "pid": key[0],
                       "tid": key[1], "args": {"tasks": run["tasks"], "busy_us": run["busy"] * _US,
                                               "microbatches": f"{lo}-{hi}", "kinds": sorted(run["kinds"])}})

    busy: dict[str, list[tuple[float, int]]] = {}
    for rec in records:
        held: dict[str, int] = {}
        for res in rec.resources:
            name = str(res).split("[", 1)[0]
            if name != "stage":     # a stage's compute stream, drawn on the stage's own track
                held[name] = held.get(name, 0) + 1
        for name, k in held.items():
            busy.setdefault(name, []).extend(((rec.start, k), (rec.end, -k)))
        if rec.devices:
            stages = sorted({stage_of(d, stage_size) for d in rec.devices})
            places = [(f"stage {p} ({stage_devices(p, stage_size)} devices)", rec.stream) for p in stages]
        else:
            places = [("resources", str(rec.resources[0]) if rec.resources else rec.stream)]
        mb = middle(rec)
        for proc, thread in places:
            key = track(proc, thread)
            if mb is None:
                close(key)
                events.append({"name": rec.name, "cat": rec.category or rec.stream, "ph": "X",
                               "ts": rec.start * _US, "dur": rec.duration * _US, "pid": key[0], "tid": key[1],
                               "args": {"task": rec.id, **{k: v for k, v in rec.args.items() if _jsonable(v)}}})
                continue
            run = runs.setdefault(key, {"start": rec.start, "end": rec.end, "tasks": 0, "busy": 0.0,
                                        "mbs": [mb, mb], "kinds": set()})
            run["end"] = max(run["end"], rec.end)
            run["tasks"] += 1
            run["busy"] += rec.duration
            run["mbs"] = [min(run["mbs"][0], mb), max(run["mbs"][1], mb)]
            run["kinds"].add(rec.category or rec.stream)
    for key in list(runs):
        close(key)
    counters = []
    for name in sorted(busy):
        label = (level_of or {}).get(name, name)
        pid, tid = track("links", f"{label}: ports busy")
        level, last_t = 0, None
        changes = sorted(busy[name])
        for n, (t, delta) in enumerate(changes):
            level += delta
            if n + 1 < len(changes) and changes[n + 1][0] == t:
                continue   # one value per instant
            if last_t is not None and counters and counters[-1]["pid"] == pid and \
                    counters[-1]["args"]["busy ports"] == level:
                continue
            counters.append({"name": f"{label}: ports busy", "ph": "C", "ts": t * _US, "pid": pid,
                             "args": {"busy ports": level}})
            last_t = t
    meta = list(tracks.metadata())
    info = {"detail": "stages", "microbatches": count, "merged": merging,
            "kept_whole": f"micro-batches 0-{keep - 1} and {count - keep}-{count - 1}" if merging else "all"}
    return {"traceEvents": meta + events + counters, "displayTimeUnit": "ms", "metadata": info}


def write_chrome_trace(timeline: Timeline, path: str | Path, topology: Topology | None = None,
                       links: bool = False, detail: str = "full", stage_size: int = 1,
                       merge_above: int = MERGE_ABOVE) -> Path:
    """Write the trace to ``path`` and return it: ``detail`` "full" (:func:`to_chrome_trace`,
    written event by event, so that a large one is never one string in memory) or "stages"
    (:func:`to_stage_trace`)."""
    path = Path(path)
    if detail == "stages":
        level_of = None
        if topology is not None:
            level_of = {name: f"{name} ({ic.level})" if ic.level else name
                        for name, ic in topology.interconnects.items()}
        trace = to_stage_trace(timeline, stage_size, merge_above, level_of=level_of)
        events, rest = trace["traceEvents"], {k: v for k, v in trace.items() if k != "traceEvents"}
    elif detail == "full":
        events, rest = _full_events(timeline, topology, links), {"displayTimeUnit": "ms"}
    else:
        raise ValueError(f"unknown trace detail {detail!r}; expected stages or full")
    with path.open("w", encoding="utf-8") as f:
        f.write('{"traceEvents": [')
        for n, event in enumerate(events):
            f.write(("," if n else "") + _dumps(event))
        f.write("]," + json.dumps(rest)[1:])
    return path
