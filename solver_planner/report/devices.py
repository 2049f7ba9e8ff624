"""The device map every cluster picture shares: one row per host, one column per device of
a host, with lines between the instances of every level (thicker for outer levels)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .style import HIGHLIGHT

__all__ = ["DeviceGrid"]


class DeviceGrid:
    """Where device ``d`` of ``topology`` sits: row ``host(d)``, column ``d`` within its host."""

    def __init__(self, topology):
        self.topology = topology
        self.cols = topology.devices_per_host
        self.rows = topology.num_hosts

    def cell(self, d: int) -> tuple[int, int]:
        return d // self.cols, d % self.cols

    def centre(self, d: int) -> tuple[float, float]:
        r, c = self.cell(d)
        return c + 0.5, r + 0.5

    def array(self, values: Sequence[float]) -> np.ndarray:
        return np.asarray(values, dtype=float).reshape(self.rows, self.cols)

    def draw(self, ax, values: Sequence[float], cmap, vmin: float, vmax: float, labels: Sequence | None = None,
             gid: str | None = None):
        """Colour every device by ``values`` (NaN: left blank); separators for every level."""
        mesh = ax.pcolormesh(self.array(values), cmap=cmap, vmin=vmin, vmax=vmax, edgecolors="white",
                             linewidth=0.4 if self.rows * self.cols <= 256 else 0.0)
        if gid:
            mesh.set_gid(gid)
        topo = self.topology
        counts = [lv.count for lv in topo.levels]
        h = topo.host_level
        for j in range(len(counts) - 1):
            if j == h:
                continue
            if j > h:   # a level inside a host: separators between its instances' columns
                stride = int(np.prod(counts[j + 1:]))
                for x in range(stride, self.cols, stride):
                    ax.axvline(x, color="black", linewidth=0.8 + 0.4 * (len(counts) - j))
            else:       # a level above the hosts: separators between its instances' rows
                stride = int(np.prod(counts[j + 1:h + 1]))
                for y in range(stride, self.rows, stride):
                    ax.axhline(y, color="black", linewidth=0.8 + 0.6 * (h - j))
        if labels is not None and self.rows * self.cols <= 64:
            for d, text in enumerate(labels):
                x, y = self.centre(d)
                ax.text(x, y, str(text), ha="center", va="center", fontsize=6, color="white")
        ax.set_xlim(0, self.cols)
        ax.set_ylim(self.rows, 0)
        ax.set_aspect("equal" if self.rows <= 4 * self.cols else "auto")
        xs = range(0, self.cols, max(1, math.ceil(self.cols / 8)))
        ys = range(0, self.rows, max(1, math.ceil(self.rows / 8)))
        ax.set_xticks([c + 0.5 for c in xs])
        ax.set_xticklabels([str(c) for c in xs])
        ax.set_yticks([r + 0.5 for r in ys])
        ax.set_yticklabels([str(r) for r in ys])
        ax.set_xlabel(f"device within {topo.level_names[topo.host_level]}")
        ax.set_ylabel(topo.level_names[topo.host_level])
        ax.tick_params(length=0)
        return mesh

    def groups(self, ax, groups: Sequence[Sequence[int]], colour="black", width: float = 1.2, gid: str | None = None):
        """Outline device groups: a line through the members in the order written (first
        member, the root, marked with a dot)."""
        from matplotlib.collections import LineCollection

        lines = [[self.centre(d) for d in g] for g in groups if len(g) > 1]
        if not lines:
            return None
        col = LineCollection(lines, colors=colour, linewidths=width, alpha=0.9)
        if gid:
            col.set_gid(gid)
        ax.add_collection(col)
        roots = np.array([self.centre(g[0]) for g in groups if len(g) > 1])
        ax.scatter(roots[:, 0], roots[:, 1], s=6, color=colour, zorder=3)
        return col

    def mark(self, ax, d: int, gid: str, colour: str = HIGHLIGHT, style: str = "solid"):
        """A thick frame around device ``d``'s cell."""
        from matplotlib.patches import Rectangle

        r, c = self.cell(d)
        rect = Rectangle((c, r), 1, 1, fill=False, edgecolor=colour, linewidth=2.5, linestyle=style, zorder=4)
        rect.set_gid(gid)
        ax.add_patch(rect)
        return rect
