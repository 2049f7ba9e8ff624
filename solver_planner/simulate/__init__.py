"""Discrete-event simulation over shared resources, timelines and Perfetto traces."""

from .engine import Simulation, Task
from .tasks import add_broadcast, add_collective, add_compute, add_transfer, compute_resource
from .timeline import Record, Timeline
from .trace import estimate_full_bytes, to_chrome_trace, to_stage_trace, write_chrome_trace

__all__ = [
    "Simulation", "Task", "Timeline", "Record", "to_chrome_trace", "write_chrome_trace", "to_stage_trace", "estimate_full_bytes",
    "add_collective", "add_transfer", "add_broadcast", "add_compute", "compute_resource",
]
