"""``reshard``: a Gantt chart of a broadcast schedule, one row per port (a host NIC's send or
receive side, the resources the cost model says a unit task holds), one bar per unit task
on every port it holds, coloured by its destination host; the lower bound as a line; the
naive schedule (the cross-mesh resharding paper, §3.2) beside it on the same time axis."""

from __future__ import annotations

from pathlib import Path

from .style import OKABE_ITO, figure, save, time_unit

__all__ = ["schedule_axes", "resharding_figure", "plot_resharding", "MAX_BARS"]

MAX_BARS = 4000     # above this many (task, port) bars a panel draws one collection per row


def _bars(instance, schedule):
    """(task, row, start, end) of every unit task on every port it holds, in seconds."""
    from ..resharding.schedule import TIME_UNIT

    for i, k in enumerate(schedule.choice):
        c = instance.candidates[i][k]
        for r in c.resources:
            yield i, r, schedule.start[i] * TIME_UNIT, schedule.end[i] * TIME_UNIT


def schedule_axes(ax, plan, schedule, topology, title: str, scale: float, unit: str, bound: float | None = None,
                  prefix: str = "task"):
    """Draw ``schedule`` (of ``plan.instance``) into ``ax``; bars get gids ``{prefix}-{task}-port-{row}``."""
    from matplotlib.patches import Patch

    inst = plan.instance
    dest = [min(topology.host(d) for d in t.receivers) for t in plan.tasks]
    hosts = sorted(set(dest))
    colour = {h: OKABE_ITO[n % len(OKABE_ITO)] for n, h in enumerate(hosts)}
    # rows sorted by interconnect, port and side (gids keep the instance's resource index)
    order = sorted(range(len(inst.resources)), key=lambda r: (str(inst.resources[r].interconnect),
                                                               inst.resources[r].instance, inst.resources[r].direction))
    pos = {r: n for n, r in enumerate(order)}
    bars = [(i, r, s, e) for i, r, s, e in _bars(inst, schedule)]
    if len(bars) <= MAX_BARS:
        for i, r, s, e in bars:
            rect = ax.barh(pos[r], (e - s) / scale, left=s / scale, height=0.7, color=colour[dest[i]],
                           edgecolor="white", linewidth=0.3).patches[0]
            rect.set_gid(f"{prefix}-{i}-port-{r}")
        note = ""
    else:   # one collection per (row, destination): thousands of bars stay one SVG group each
        spans: dict[tuple[int, int], list] = {}
        for i, r, s, e in bars:
            spans.setdefault((r, dest[i]), []).append((s / scale, (e - s) / scale))
        for (r, h), xs in sorted(spans.items()):
            ax.broken_barh(xs, (pos[r] - 0.35, 0.7), facecolors=colour[h], gid=f"{prefix}-row-{r}-dest-{h}")
        note = f" ({len(bars)} bars, drawn per row)"
    for r in range(len(inst.resources)):
        ax.axhspan(pos[r] - 0.5, pos[r] + 0.5, color="#f2f2f2" if pos[r] % 2 else "white", zorder=0,
                   gid=f"{prefix}-row-{r}")
    rows = len(inst.resources)
    every = max(1, -(-rows // 60))    # at most 60 port names: a 1 024-GPU boundary has hundreds of ports
    ax.set_yticks(range(0, rows, every))
    ax.set_yticklabels([_port(inst.resources[r]) for r in order[::every]], fontsize=7 if rows <= 40 else 5)
    ax.set_ylim(len(inst.resources) - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("port")
    makespan = max((e for _, _, _, e in bars), default=0.0)
    if bound is not None:
        ax.axvline(bound / scale, color="black", linestyle="--", linewidth=1.2, gid=f"{prefix}-lower-bound",
                   label="lower bound")
    ax.set_title(f"{title}: makespan {makespan / scale:.4g} {unit}{note}")
    handles = [Patch(color=colour[h], label=f"to host {h}") for h in hosts[:8]]
    if bound is not None:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="black", linestyle="--", label="lower bound"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)


def _port(res) -> str:
    side = {"tx": "send", "rx": "receive"}.get(getattr(res, "direction", ""), "")
    return f"{res} {side}".strip()


def resharding_figure(fig, result, topology, naive: bool = True, index: int = 0):
    """One resharding (``SolveResult`` of :func:`solver_planner.resharding.plan_resharding`):
    its schedule and, with ``naive``, the naive schedule under it on the same time axis.
    Bars' gids: ``r{index}-task-{task}-port-{row}`` (``r{index}-naive-...`` for the naive schedule)."""
    from ..resharding.heuristics import naive as naive_schedule

    plan = result.solution
    other = naive_schedule(plan.instance) if naive else None
    from ..resharding.schedule import TIME_UNIT

    longest = max(plan.makespan, other.makespan * TIME_UNIT if other is not None else 0.0)
    scale, unit = time_unit(longest)
    axes = fig.subplots(2 if naive else 1, 1, squeeze=False, sharex=True)
    schedule_axes(axes[0][0], plan, plan.schedule, topology,
                  f"{plan.problem.name}, {result.method} ({result.status.value})", scale, unit, result.bound,
                  prefix=f"r{index}-task")
    if other is not None:
        schedule_axes(axes[1][0], plan, other, topology, "naive schedule (the resharding paper, §3.2)", scale, unit,
                      result.bound, prefix=f"r{index}-naive")
    return fig


def plot_resharding(path: Path | str, results, topology) -> Path:
    """Write the Gantt charts of every resharding in ``results`` to ``path`` (.svg or .png)."""
    ports = [len(r.solution.instance.resources) for r in results]
    height = sum(2 * (0.16 * p + 1.4) for p in ports) + 0.3
    with figure(10, height) as fig:
        subs = fig.subfigures(len(results), 1, squeeze=False, height_ratios=[p + 8 for p in ports])
        for n, (sub, result) in enumerate(zip(subs[:, 0], results)):
            resharding_figure(sub, result, topology, index=n)
        return save(fig, path)
