"""``stages`` and ``plan``: the pipeline Gantt (one row per stage: forward, backward, weight
gradient on its compute stream above, activations / gradients and gradient reduction on its
communication stream below; micro-batch numbers on bars wide enough to read), memory per
stage against the device's, and where the iteration time goes.

Pipelines have up to hundreds of thousands of tasks: bars of one kind on one row closer
than a fraction of a pixel are merged, so the picture holds at most a few thousand bars
whatever the size, and says how many tasks it merged.
"""

from __future__ import annotations

from pathlib import Path

from .style import OKABE_ITO, bytes_unit, figure, save, time_unit

__all__ = ["KINDS", "kind_of", "stage_bars", "pipeline_figure", "plot_pipeline", "MERGE_PIXELS", "MAX_LABELS"]

# what a bar is -> its colour (Okabe-Ito) and row lane (0: compute stream, 1: communication)
KINDS = {
    "forward": (OKABE_ITO[0], 0),
    "backward": (OKABE_ITO[3], 0),
    "weight gradient": (OKABE_ITO[1], 0),
    "communication": (OKABE_ITO[4], 1),
    "gradient reduction": (OKABE_ITO[5], 1),
}
MERGE_PIXELS = 800      # merge bars closer than makespan / MERGE_PIXELS (about a pixel)
MAX_LABELS = 300        # micro-batch numbers written at most


def kind_of(record) -> str:
    """The kind of a pipeline task (:func:`solver_planner.stages.simulate_schedule`'s names and categories)."""
    if record.category == "forward":
        return "forward"
    if record.category == "backward":
        return "weight gradient" if record.name.startswith("BW") else "backward"
    if record.category == "gradient-reduction":
        return "gradient reduction"
    return "communication"


def stage_bars(records, stage_size: int, stages: int, makespan: float):
    """``{(stage, kind): [(start, width, label or None), ...]}`` with bars closer than a pixel
    merged, and the number of tasks drawn."""
    tol = makespan / MERGE_PIXELS
    raw: dict[tuple[int, str], list] = {}
    for r in records:
        p = min(r.devices[0] // stage_size, stages - 1) if r.devices else 0
        raw.setdefault((p, kind_of(r)), []).append((r.start, r.end, r.name))
    out = {}
    for key, spans in raw.items():
        spans.sort()
        merged: list[list] = []
        for s, e, name in spans:
            if merged and s - merged[-1][1] <= tol:
                last = merged[-1]
                last[1] = max(last[1], e)
                last[2] = None     # several tasks: no single micro-batch number
            else:
                merged.append([s, e, _microbatch(name)])
        out[key] = [(s, e - s, label) for s, e, label in merged]
    return out


def _microbatch(name: str) -> str | None:
    for part in name.split():
        if part.startswith("mb") and part[2:].isdigit():
            return part[2:]
    return None


def pipeline_figure(fig, run, stage_size: int, device_memory: float, title: str, breakdown: dict | None = None):
    """Draw a :class:`solver_planner.stages.PipelineRun` into ``fig``; ``breakdown``
    (:func:`solver_planner.plan.compose.breakdown`) adds the plan's averaged split."""
    from matplotlib.patches import Patch

    records = run.timeline.records
    stages = len(run.peak_memory)
    T = run.iteration_time or max((r.end for r in records), default=0.0)
    scale, unit = time_unit(T)
    top, bottom = fig.subfigures(2, 1, height_ratios=[max(2.2, 0.45 * stages + 1.2), 2.4])
    ax = top.subplots()
    bars = stage_bars(records, stage_size, stages, T)
    drawn = sum(len(v) for v in bars.values())
    labels = 0
    label_width = T / 60
    for p in range(stages):
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2" if p % 2 else "white", zorder=0, gid=f"stage-row-{p}")
    # one compute lane, or one lane per kind when bars were merged: merged bars of several
    # kinds would otherwise cover each other
    split = drawn < len(records)
    lanes = {"forward": 0, "backward": 1 if split else 0, "weight gradient": 2 if split else 0}
    n_lanes = 3 if split else 1
    for (p, kind), spans in sorted(bars.items()):
        colour, comm = KINDS[kind]
        if comm:
            y, h = p + 0.18, 0.24
        else:
            h = 0.55 / n_lanes
            y = p - 0.4 + lanes[kind] * h
        ax.broken_barh([(s / scale, w / scale) for s, w, _ in spans], (y, h), facecolors=colour,
                       gid=f"stage-{p}-{kind.replace(' ', '-')}")
        if not comm:
            for s, w, label in spans:
                if label is not None and w >= label_width and labels < MAX_LABELS:
                    ax.text((s + w / 2) / scale, y + h / 2, label, ha="center", va="center", fontsize=6,
                            color="white")
                    labels += 1
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {p}" for p in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlim(0, T / scale * 1.005 if T > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    merged = (f"\n{len(records)} tasks drawn as {drawn} bars: bars of one kind closer than"
              f" {T / MERGE_PIXELS / scale:.3g} {unit} merged, one lane per kind" if split else
              "; numbers on bars: micro-batch")
    ax.set_title(f"{title}: iteration {T / scale:.4g} {unit}{merged}", fontsize=8)
    ax.legend(handles=[Patch(color=c, label=k) for k, (c, _) in KINDS.items()], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=7)
    panels = 3 if breakdown is not None else 2
    axes = bottom.subplots(1, panels)
    _memory(axes[0], run.peak_memory, device_memory)
    _time_per_stage(axes[1], records, stage_size, stages, T, scale, unit)
    if breakdown is not None:
        _breakdown(axes[2], breakdown, scale, unit)
    return fig


def _memory(ax, peak, device_memory: float) -> None:
    scale, unit = bytes_unit(max(list(peak) + [device_memory]))
    for p, m in enumerate(peak):
        ax.bar(p, m / scale, color=OKABE_ITO[2] if m <= device_memory else OKABE_ITO[3]).patches[0].set_gid(
            f"memory-stage-{p}")
    ax.axhline(device_memory / scale, color="black", linestyle="--", gid="device-memory",
               label=f"device memory {device_memory / scale:.4g} {unit}")
    ax.set_xticks(range(len(peak)))
    ax.set_xlabel("stage")
    ax.set_ylabel(f"peak memory per device ({unit})")
    ax.set_title("memory per stage")
    ax.legend(loc="lower right", fontsize=7)


def _time_per_stage(ax, records, stage_size, stages, T, scale, unit) -> None:
    busy = {(p, k): 0.0 for p in range(stages) for k in ("forward", "backward", "weight gradient")}
    for r in records:
        k = kind_of(r)
        if (0, k) in busy:
            busy[min(r.devices[0] // stage_size, stages - 1), k] += r.end - r.start
    bottom = [0.0] * stages
    for k in ("forward", "backward", "weight gradient"):
        values = [busy[p, k] / scale for p in range(stages)]
        ax.bar(range(stages), values, bottom=bottom, color=KINDS[k][0], label=k, gid=f"time-{k.replace(' ', '-')}")
        bottom = [b + v for b, v in zip(bottom, values)]
    idle = [max(0.0, T / scale - b) for b in bottom]
    ax.bar(range(stages), idle, bottom=bottom, color="#d9d9d9", label="idle (bubble, waits)", gid="time-idle")
    ax.set_xticks(range(stages))
    ax.set_xlabel("stage")
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title("where each stage's time goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)


BREAKDOWN = (("compute", OKABE_ITO[0]), ("tensor", OKABE_ITO[4]), ("data_parallel", OKABE_ITO[5]),
             ("pipeline", "#bdbdbd"), ("cross_mesh_exposed", OKABE_ITO[1]))


def _breakdown(ax, breakdown: dict, scale, unit) -> None:
    left = 0.0
    for key, colour in BREAKDOWN:
        v = breakdown.get(key, 0.0) / scale
        ax.barh(0, v, left=left, color=colour, label=key.replace("_", " "), gid=f"breakdown-{key}")
        left += v
    ax.set_yticks([])
    ax.set_xlabel(f"time per iteration, averaged over stages ({unit})")
    ax.set_title("where the iteration goes (plan breakdown)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=6, ncols=3)


def plot_pipeline(path: Path | str, run, stage_size: int, device_memory: float, title: str,
                  breakdown: dict | None = None) -> Path:
    """Write the pipeline picture of ``run`` to ``path`` (.svg or .png)."""
    stages = len(run.peak_memory)
    with figure(11, max(2.2, 0.45 * stages + 1.2) + 2.6) as fig:
        pipeline_figure(fig, run, stage_size, device_memory, title, breakdown)
        return save(fig, path)
