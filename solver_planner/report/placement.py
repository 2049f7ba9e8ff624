"""``place``: where each parallelism axis lives (one device map per axis, coloured by the
device's coordinate on it), the device groups of the best placement's best programs step by
step, and AllReduce against the best program per placement."""

from __future__ import annotations

import math
from pathlib import Path

from .devices import DeviceGrid
from .program import collective_name
from .style import OKABE_ITO, SEQUENTIAL, figure, save, time_unit

__all__ = ["placement_figure", "plot_placements", "MAX_PLACEMENTS"]

MAX_PLACEMENTS = 16     # bars drawn (best first); the rest are counted in the title
MAX_STEP_ROWS = 3       # reductions whose best program is drawn step by step


def placement_figure(fig, topology, model, reports):
    """Draw the ranking ``reports`` (:func:`solver_planner.reduction.ranking.rank_placements`,
    best first) into ``fig``."""
    from matplotlib.colors import ListedColormap

    best = reports[0]
    counts = [lv.count for lv in topology.levels]
    coords = best.matrix.assignment(counts)
    grid = DeviceGrid(topology)
    reds = best.reductions[:MAX_STEP_ROWS]
    width = max([len(model.axis_names)] + [len(r.best.steps) for r in reds])
    left, right = fig.subfigures(1, 2, width_ratios=[max(2, width) * 1.2, 1.6])
    axes = left.subplots(1 + len(reds), width, squeeze=False)
    for i, name in enumerate(model.axis_names):
        ax = axes[0][i]
        ax.set_gid(f"axis-{name}")
        size = model.axis_sizes[i]
        grid.draw(ax, [c[i] for c in coords], SEQUENTIAL, -0.5, size - 0.5, labels=[c[i] for c in coords],
                  gid=f"axis-{name}-map")
        ax.set_title(f"axis '{name}' (size {size}): coordinate")
    for j in range(len(model.axis_names), width):
        axes[0][j].set_axis_off()
    palette = ListedColormap(OKABE_ITO[:7])
    for r, red in enumerate(reds, 1):
        prog = red.best
        for n in range(width):
            ax = axes[r][n]
            if n >= len(prog.steps):
                ax.set_axis_off()
                continue
            step = prog.steps[n]
            group_of = [math.nan] * topology.num_devices
            for g, members in enumerate(step.groups):
                for d in members:
                    group_of[d] = g % 7
            ax.set_gid(f"reduction-{red.name}-step-{n + 1}")
            grid.draw(ax, group_of, palette, -0.5, 6.5)
            grid.groups(ax, step.groups, gid=f"reduction-{red.name}-step-{n + 1}-groups")
            ax.set_title(f"'{red.name}' step {n + 1}: {collective_name(step.collective)}\n"
                         f"{len(step.groups)} group{'s' * (len(step.groups) != 1)} (colour = group)")
    left.suptitle(f"best placement {best.matrix} (rows {', '.join(model.axis_names)};"
                  f" columns {', '.join(topology.level_names)})")
    _bars(right, reports)
    return fig


def _bars(fig, reports) -> None:
    shown = reports[:MAX_PLACEMENTS]
    ax = fig.subplots()
    scale, unit = time_unit(max([r.allreduce_cost for r in shown] + [r.cost for r in shown] + [1e-9]))
    n = len(shown)
    ys = range(n)
    for y, rep in zip(ys, shown):
        a = ax.barh(y - 0.2, rep.allreduce_cost / scale, height=0.38, color=OKABE_ITO[4],
                    label="AllReduce" if y == 0 else None)
        a.patches[0].set_gid(f"placement-{y + 1}-allreduce")
        b = ax.barh(y + 0.2, rep.cost / scale, height=0.38, color=OKABE_ITO[0],
                    label="best program" if y == 0 else None)
        b.patches[0].set_gid(f"placement-{y + 1}-best")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{i + 1}. {r.matrix}" for i, r in enumerate(shown)], fontsize=7)
    ax.set_ylim(n - 0.5, -0.5)
    several = len(shown[0].reductions) > 1 if shown else False
    ax.set_xlabel(f"time ({unit}){', weighted sum over reductions' if several else ''}")
    more = f" (best {n} of {len(reports)})" if len(reports) > n else ""
    ax.set_title(f"placements{more}")
    ax.legend(loc="lower right")


def plot_placements(path: Path | str, topology, model, reports) -> Path:
    """Write the ``place`` picture of ``reports`` to ``path`` (.svg or .png)."""
    best = reports[0]
    steps = max([len(model.axis_names)] + [len(r.best.steps) for r in best.reductions[:MAX_STEP_ROWS]])
    rows = 1 + len(best.reductions[:MAX_STEP_ROWS])
    grid = DeviceGrid(topology)
    cell = min(2.8, 0.35 * grid.cols + 0.9)
    with figure(cell * max(2, steps) + 3.4, (min(2.6, 0.3 * grid.rows + 1.3)) * rows + 1.0) as fig:
        placement_figure(fig, topology, model, reports)
        return save(fig, path)
