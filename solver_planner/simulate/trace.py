"""Chrome trace (Perfetto) export of a :class:`Timeline`.

The format is the Trace Event Format's JSON object form: complete events (``"ph": "X"``)
with microsecond ``ts``/``dur``, and metadata events naming processes and threads.  One
process per host (an instance of the topology's host level), one track ("thread") per
device and stream; a task on several devices (a collective) appears on each of their
tracks.  Tasks without devices go to a process named "resources", one track per first
resource.  ui.perfetto.dev and chrome://tracing open the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timeline import Timeline

if TYPE_CHECKING:
    from ..topology import Topology

__all__ = ["to_chrome_trace", "write_chrome_trace"]

_US = 1e6  # trace timestamps are in microseconds


def to_chrome_trace(timeline: Timeline, topology: Topology | None = None, links: bool = False) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], "displayTimeUnit": "ms"}``);
    ``links``: every task also on one track per resource it holds (a process "links")."""
    events: list[dict[str, Any]] = []
    processes: dict[str, int] = {}
    threads: dict[tuple[int, str], int] = {}

    def track(process: str, thread: str) -> tuple[int, int]:
        pid = processes.setdefault(process, len(processes))
        key = (pid, thread)
        if key not in threads:
            threads[key] = len(threads)
        return pid, threads[key]

    for rec in sorted(timeline.records, key=lambda r: (r.start, r.id)):
        if rec.devices:
            places = []
            for d in rec.devices:
                if topology is not None:
                    host = topology.host(d)
                    proc = f"{topology.level_names[topology.host_level]} {host}"
                else:
                    proc = "devices"
                places.append((proc, f"device {d} {rec.stream}"))
        else:
            places = [("resources", str(rec.resources[0]) if rec.resources else rec.stream)]
        if links and rec.devices:
            places += [("links", str(r)) for r in rec.resources]
        args = {"task": rec.id, **{k: v for k, v in rec.args.items() if _jsonable(v)}}
        if rec.resources:
            args["resources"] = [str(r) for r in rec.resources]
        for proc, thread in places:
            pid, tid = track(proc, thread)
            events.append({
                "name": rec.name, "cat": rec.category or rec.stream, "ph": "X",
                "ts": rec.start * _US, "dur": rec.duration * _US, "pid": pid, "tid": tid, "args": args,
            })
    meta: list[dict[str, Any]] = []
    for proc, pid in processes.items():
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": proc}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for (pid, thread), tid in threads.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def write_chrome_trace(timeline: Timeline, path: str | Path, topology: Topology | None = None,
                       links: bool = False) -> Path:
    """Write the trace to ``path`` and return it."""
    path = Path(path)
    path.write_text(json.dumps(to_chrome_trace(timeline, topology, links)), encoding="utf-8")
    return path
