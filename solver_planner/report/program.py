"""A reduction program step by step (``reduce synth`` / ``reduce verify``): one small device
map per step, coloured by the bytes each device holds after it, with the device groups the
step forms drawn through their members; for an invalid program, the step, group and device
of the counterexample framed in the highlight colour."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from .devices import DeviceGrid
from .style import HIGHLIGHT, SEQUENTIAL, bytes_unit, figure, save

__all__ = ["held_bytes", "program_figure", "plot_program", "collective_name"]

NAMES = {"allreduce": "AllReduce", "reducescatter": "ReduceScatter", "allgather": "AllGather", "reduce": "Reduce",
         "broadcast": "Broadcast"}


def collective_name(kind) -> str:
    value = str(getattr(kind, "value", kind))
    return NAMES.get(value, value)


def held_bytes(num_devices: int, k: int, steps, nbytes: float) -> tuple[list[list[float]], int | None]:
    """Bytes each device holds before the program and after each step (:mod:`..reduction.layout`'s
    meaning), and the step at which the library could not run a call (None: every step ran)."""
    from ..reduction.layout import size, trace

    tr = trace(num_devices, k, steps)
    held = [nbytes] * num_devices
    states = [list(held)]
    for calls in tr.calls:
        for call in calls:
            for d, runs in zip(call.group, call.after):
                held[d] = size(runs) * nbytes / k
        states.append(list(held))
    stopped = tr.problem.step if tr.problem is not None else None
    return states, stopped


def program_figure(topology, steps, k: int, nbytes: float, title: str, labels: Sequence[str] | None = None,
                   step_times: Sequence[float] | None = None, verdict=None, fig=None):
    """Draw the program into ``fig`` (a new one when None is given inside :func:`..style.figure`)."""
    from .. import units

    grid = DeviceGrid(topology)
    states, stopped = held_bytes(topology.num_devices, k, steps, nbytes)
    panels = len(steps) + 1
    ncols = min(panels, 4)
    nrows = math.ceil(panels / ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    scale, unit = bytes_unit(nbytes)
    violation = verdict.violation if verdict is not None else None
    bad_step = None
    if violation is not None:
        bad_step = violation.step if violation.step is not None else len(steps) - 1
    mesh = None
    for n in range(nrows * ncols):
        ax = axes[n // ncols][n % ncols]
        if n >= panels:
            ax.set_axis_off()
            continue
        ax.set_gid(f"step-{n}")
        if n >= len(states):   # after a call the library cannot run: not reached
            mesh = grid.draw(ax, [math.nan] * topology.num_devices, SEQUENTIAL, 0, nbytes / scale)
            ax.set_title(f"step {n}: not reached")
            continue
        mesh = grid.draw(ax, [b / scale for b in states[n]], SEQUENTIAL, 0, nbytes / scale)
        if n == 0:
            ax.set_title("before step 1: every device holds all its data")
            continue
        kind, groups = steps[n - 1]
        label = labels[n - 1] if labels is not None else collective_name(kind)
        if labels is None:
            label += f" on {len(groups)} group{'s' * (len(groups) != 1)}"
        when = f" ({units.format_time(step_times[n - 1])})" if step_times is not None else ""
        ax.set_title(f"step {n}{when}: {label}\nbytes held after it", wrap=True)
        grid.groups(ax, groups, gid=f"step-{n}-groups")
        if bad_step == n - 1:
            _highlight(ax, grid, violation, n)
    if stopped is not None and bad_step is None:
        bad_step = stopped
    if verdict is not None and verdict.failure is not None and verdict.failure is not violation:
        f = verdict.failure
        last = axes[(len(states) - 1) // ncols][(len(states) - 1) % ncols]
        grid.mark(last, f.device, "final-failure", style="dashed")
    status = f" - {verdict.status}" if verdict is not None else ""
    fig.suptitle(f"{title}{status}")
    if mesh is not None:
        fig.colorbar(mesh, ax=axes, shrink=0.6, label=f"bytes held per device ({unit})")
    if violation is not None:
        fig.text(0.01, 0.0, f"counterexample: {violation}", fontsize=7, color=HIGHLIGHT, wrap=True, va="bottom",
                 gid="counterexample-text")
    return fig


def _highlight(ax, grid: DeviceGrid, violation, n: int) -> None:
    from matplotlib.patches import Rectangle

    for spine in ax.spines.values():
        spine.set_edgecolor(HIGHLIGHT)
        spine.set_linewidth(3)
    frame = Rectangle((0, 0), 1, 1, transform=ax.transAxes, fill=False, edgecolor=HIGHLIGHT, linewidth=3,
                      clip_on=False)
    frame.set_gid("counterexample-step")
    ax.add_patch(frame)
    if violation.group:
        grid.groups(ax, [violation.group], colour=HIGHLIGHT, width=2.5, gid="counterexample-group")
    grid.mark(ax, violation.device, "counterexample-device")
    if violation.other is not None:
        grid.mark(ax, violation.other, "counterexample-other", style="dashed")
    ax.set_title(ax.get_title() + "\n(counterexample)", color=HIGHLIGHT)


def plot_program(path: Path | str, topology, steps, k: int, nbytes: float, title: str,
                 labels: Sequence[str] | None = None, step_times: Sequence[float] | None = None, verdict=None) -> Path:
    """Write the step-by-step picture of a program to ``path`` (.svg or .png)."""
    panels = len(steps) + 1
    ncols = min(panels, 4)
    nrows = math.ceil(panels / ncols)
    with figure(2.6 * ncols + 1.2, 2.4 * nrows + 0.9) as fig:
        program_figure(topology, steps, k, nbytes, title, labels, step_times, verdict, fig)
        return save(fig, path)
