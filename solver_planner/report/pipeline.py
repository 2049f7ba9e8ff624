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
from ..simulate.trace import stage_devices, stage_of

__all__ = ["KINDS", "kind_of", "stage_bars", "pipeline_figure", "plot_pipeline", "figure_height", "MERGE_PIXELS",
           "MAX_LABELS", "ZOOM_ABOVE"]

# what a bar is -> its colour (Okabe-Ito) and row lane (0: compute stream, 1: communication)
KINDS = {
    "forward": (OKABE_ITO[0], 0),
    "backward": (OKABE_ITO[3], 0),
    "weight gradient": (OKABE_ITO[1], 0),
    "optimizer step": (OKABE_ITO[2], 0),       # with the host's per-iteration work
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
    if record.category == "optimizer":
        return "optimizer step"
    return "communication"


def stage_bars(records, stage_size: int, stages: int, makespan: float, merge: bool = True, chunks: bool = False):
    """``{(stage, kind): [(start, width, label or None), ...]}`` with bars closer than a pixel
    merged (``merge``; otherwise only overlapping ones), and the number of tasks drawn.
    Labels are micro-batch numbers, ``micro-batch.chunk`` with model ``chunks``."""
    tol = makespan / MERGE_PIXELS if merge else -1e-300
    raw: dict[tuple[int, str], list] = {}
    for r in records:
        p = min(stage_of(r.devices[0], stage_size), stages - 1) if r.devices else 0
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
                merged.append([s, e, _microbatch(name, chunks)])
        out[key] = [(s, e - s, label) for s, e, label in merged]
    return out


def _microbatch(name: str, chunks: bool = False) -> str | None:
    """``"F3 mb2"`` -> ``"2"``, or ``"2.3"`` (micro-batch 2 of chunk 3) with ``chunks``."""
    words = name.split()
    for part in words:
        if part.startswith("mb") and part[2:].isdigit():
            chunk = words[0].lstrip("FBAW")
            return f"{part[2:]}.{chunk}" if chunks and chunk.isdigit() else part[2:]
    return None


def zoom_height(stages: int) -> float:
    return max(1.6, 0.12 * stages + 1.0)


def figure_height(run) -> float:
    """Inches :func:`pipeline_figure` wants for ``run``."""
    stages = len(run.peak_memory)
    extra = zoom_height(stages) if _count(run.timeline.records) > ZOOM_ABOVE else 0.0
    return max(2.2, 0.45 * stages + 1.2) + 2.6 + extra


def pipeline_figure(fig, run, stage_size: int, device_memory: float, title: str, breakdown: dict | None = None,
                    memory: list[dict[str, float]] | None = None):
    """Draw a :class:`solver_planner.stages.PipelineRun` into ``fig`` (height:
    :func:`figure_height`); ``breakdown`` (:func:`solver_planner.plan.compose.breakdown`)
    adds the critical path's parts, ``memory`` (:func:`solver_planner.stages.memory.stage_memory`)
    splits each stage's memory.  Beyond :data:`ZOOM_ABOVE` micro-batches, a row shows the
    warm-up and the cool-down with every task."""
    from matplotlib.patches import Patch

    records = run.timeline.records
    stages = len(run.peak_memory)
    T = run.iteration_time or max((r.end for r in records), default=0.0)
    scale, unit = time_unit(T)
    zoomed = _count(records) > ZOOM_ABOVE
    heights = [max(2.2, 0.45 * stages + 1.2)] + ([zoom_height(stages)] if zoomed else []) + [2.4]
    subs = fig.subfigures(len(heights), 1, height_ratios=heights)
    top, bottom = subs[0], subs[-1]
    zoom = subs[1] if zoomed else None
    ax = top.subplots()
    chunked = run.schedule.virtual > 1
    bars = stage_bars(records, stage_size, stages, T, chunks=chunked)
    drawn = sum(len(v) for v in bars.values())
    labels = 0
    label_width = T / 60
    for p in range(stages):
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2" if p % 2 else "white", zorder=0, gid=f"stage-row-{p}")
    # one compute lane, or one lane per kind when bars were merged: merged bars of several
    # kinds would otherwise cover each other
    split = drawn < len(records)
    # the optimizer step runs after every pass of its stage: the forward lane has room
    lanes = {"forward": 0, "backward": 1 if split else 0, "weight gradient": 2 if split else 0, "optimizer step": 0}
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
    ax.set_yticklabels([f"stage {p}" + _devices_label(p, stage_size) for p in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlim(0, T / scale * 1.005 if T > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    merged = (f"\n{len(records)} tasks drawn as {drawn} bars: bars of one kind closer than"
              f" {T / MERGE_PIXELS / scale:.3g} {unit} merged, one lane per kind" if split else
              "; numbers on bars: micro-batch" + (".model chunk" if chunked else ""))
    ax.set_title(f"{title}: iteration {T / scale:.4g} {unit}{merged}", fontsize=8)
    # legends are placed by the layout engine inside the figure ("outside" the axes only)
    # only the kinds the plan has (no weight-gradient bars without weight delaying, no
    # gradient reduction with one replica per stage)
    present = {kind for _, kind in bars}
    top.legend(handles=[Patch(color=c, label=k) for k, (c, _) in KINDS.items() if k in present],
               loc="outside right upper", fontsize=7)
    if zoom is not None:
        for zax, (lo, hi, what) in zip(zoom.subplots(1, 2), _zoom_windows(records, stage_size, stages, T)):
            _gantt(zax, [r for r in records if r.end > lo and r.start < hi], stage_size, stages, lo, hi, scale)
            zax.set_title(f"{what}, every task ({(hi - lo) / scale:.4g} {unit})", fontsize=8)
            zax.set_xlabel(f"time ({unit})")
    panels = 3 if breakdown is not None else 2
    axes = bottom.subplots(1, panels)
    _memory(axes[0], run.peak_memory, device_memory, memory)
    _time_per_stage(axes[1], records, stage_size, stages, T, scale, unit)
    if breakdown is not None:
        _breakdown(axes[2], breakdown, scale, unit)
    return fig


ZOOM_ABOVE = 64   # micro-batches: above this the chart adds warm-up and cool-down at full resolution


def _count(records) -> int:
    return 1 + max((int(m) for r in records if (m := _microbatch(r.name)) is not None), default=-1)


def _devices_label(p: int, stage_size) -> str:
    """On unequal meshes, each stage's devices under its name (they differ from stage to stage)."""
    if isinstance(stage_size, int):
        return ""
    n = stage_devices(p, stage_size)
    return f"\n{n} device{'s' * (n > 1)}"


def _zoom_windows(records, stage_size: int, stages: int, T: float) -> list[tuple[float, float, str]]:
    """Warm-up: until the last stage's first ``stages`` backwards are done (the steady state
    has begun); cool-down: from the first stage's forward of the last ``stages`` micro-batches."""
    k = _count(records)
    last, first = stages - 1, 0
    warm = [r.end for r in records if kind_of(r) == "backward" and r.devices
            and min(stage_of(r.devices[0], stage_size), last) == last and int(_microbatch(r.name) or 0) <= stages]
    cool = [r.start for r in records if kind_of(r) == "forward" and r.devices
            and stage_of(r.devices[0], stage_size) == first and int(_microbatch(r.name) or 0) >= k - stages]
    return [(0.0, max(warm, default=T / 10), "warm-up"), (min(cool, default=T * 0.9), T, "cool-down")]


def _gantt(ax, records, stage_size: int, stages: int, lo: float, hi: float, scale: float) -> None:
    """A zoomed Gantt over [lo, hi]: bars merged only below a pixel of the window."""
    bars = stage_bars(records, stage_size, stages, hi - lo, merge=False)
    for p in range(stages):
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2" if p % 2 else "white", zorder=0)
    for (p, kind), spans in sorted(bars.items()):
        colour, comm = KINDS[kind]
        y, h = (p + 0.18, 0.24) if comm else (p - 0.4, 0.55)
        # white edges: back-to-back tasks stay apart
        ax.broken_barh([(s / scale, w / scale) for s, w, _ in spans], (y, h), facecolors=colour,
                       edgecolors="white", linewidth=0.3, gid=f"zoom-stage-{p}-{kind.replace(' ', '-')}")
    ax.set_yticks(range(stages))
    ax.set_yticklabels([str(p) for p in range(stages)], fontsize=6)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlim(lo / scale, hi / scale)


MEMORY_PARTS = (("weights", OKABE_ITO[0]), ("gradients", OKABE_ITO[4]), ("optimizer", OKABE_ITO[5]),
                ("activations", OKABE_ITO[1]))


def _memory(ax, peak, device_memory: float, split: list[dict[str, float]] | None = None) -> None:
    """Each stage's peak per device, split (weights, gradients, optimizer state, activations)
    when known, against the device's memory.  The axis is scaled to the bars when the device
    is much larger, so that they stay readable; the capacity is then written, not drawn."""
    top = max(list(peak) + [0.0])
    fits_axis = device_memory <= 3 * top
    scale, unit = bytes_unit(max(top, device_memory) if fits_axis else top)
    stages = range(len(peak))
    if split is None:
        split = [{"activations": m} for m in peak]
    bottom = [0.0] * len(peak)
    for key, colour in MEMORY_PARTS:
        values = [parts.get(key, 0.0) / scale for parts in split]
        if not any(values):
            continue
        bars = ax.bar(stages, values, bottom=bottom, color=colour, label=key)
        for p, patch in enumerate(bars.patches):
            patch.set_gid(f"memory-{key}-stage-{p}")
        bottom = [b + v for b, v in zip(bottom, values)]
    for p, m in enumerate(peak):
        if m > device_memory:
            ax.bar(p, m / scale, fill=False, edgecolor=OKABE_ITO[3], linewidth=1.5, gid=f"memory-over-{p}")
    capacity = f"device memory {device_memory / bytes_unit(device_memory)[0]:.4g} {bytes_unit(device_memory)[1]}"
    if fits_axis:
        ax.axhline(device_memory / scale, color="black", linestyle="--", gid="device-memory", label=capacity)
        ax.set_ylim(0, max(device_memory, top) / scale * 1.5)     # the legend above the capacity line
        ax.set_title("memory per stage")
    else:
        ax.set_ylim(0, top / scale * 1.35)
        # the capacity is far above the bars: said in the title, the axis stays on the bars
        ax.set_title(f"memory per stage; {capacity},\nthe largest peak is {top / device_memory:.1%} of it",
                     fontsize=8, gid="device-memory")
    ax.set_xticks(list(stages))
    ax.set_xlabel("stage")
    ax.set_ylabel(f"peak memory per device ({unit})")
    ax.legend(loc="upper right", fontsize=6, ncols=2)


def _time_per_stage(ax, records, stage_size, stages, T, scale, unit) -> None:
    parts = ("forward", "backward", "weight gradient", "optimizer step")
    busy = {(p, k): 0.0 for p in range(stages) for k in parts}
    for r in records:
        k = kind_of(r)
        if (0, k) in busy:
            busy[min(stage_of(r.devices[0], stage_size), stages - 1), k] += r.end - r.start
    bottom = [0.0] * stages
    for k in parts:
        values = [busy[p, k] / scale for p in range(stages)]
        if not any(values):             # a kind the plan does not have: no bar, no legend entry
            continue
        ax.bar(range(stages), values, bottom=bottom, color=KINDS[k][0], label=k, gid=f"time-{k.replace(' ', '-')}")
        bottom = [b + v for b, v in zip(bottom, values)]
    idle = [max(0.0, T / scale - b) for b in bottom]
    ax.bar(range(stages), idle, bottom=bottom, color="#d9d9d9", label="idle (bubble, waits)", gid="time-idle")
    ax.set_xticks(range(stages))
    ax.set_xlabel("stage")
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title("where each stage's time goes")
    ax.set_ylim(0, T / scale * 1.6)   # room for the legend (three rows) above the bars
    ax.legend(loc="upper center", fontsize=6, ncols=2)


BREAKDOWN_COLOURS = {"compute": OKABE_ITO[0], "tensor_parallel": OKABE_ITO[4], "pipeline_transfer": OKABE_ITO[1],
                     "gradient_reduction": OKABE_ITO[5], "optimizer": OKABE_ITO[2], "idle": "#bdbdbd"}


def _breakdown(ax, breakdown: dict, scale, unit) -> None:
    """The critical path's parts (they add up to the iteration)."""
    left = 0.0
    for key, colour in BREAKDOWN_COLOURS.items():
        v = breakdown.get(key, 0.0) / scale
        if v <= 0:
            continue
        ax.barh(0, v, left=left, height=0.6, color=colour, label=key.replace("_", " "), gid=f"breakdown-{key}")
        left += v
    ax.set_yticks([])
    ax.set_ylim(-0.5, 2.2)   # the legend sits above the bar, inside the axes
    ax.set_xlim(0, left * 1.02 if left > 0 else 1)
    ax.set_xlabel(f"time on the critical path ({unit})")
    ax.set_title("where the iteration goes")
    ax.legend(loc="upper center", fontsize=6, ncols=3)


def plot_pipeline(path: Path | str, run, stage_size: int, device_memory: float, title: str,
                  breakdown: dict | None = None, memory: list[dict[str, float]] | None = None) -> Path:
    """Write the pipeline picture of ``run`` to ``path`` (.svg or .png)."""
    with figure(11, figure_height(run)) as fig:
        pipeline_figure(fig, run, stage_size, device_memory, title, breakdown, memory)
        return save(fig, path)
