"""``stages`` and ``plan``: the pipeline Gantt (one row per stage: forward, backward, weight
gradient on its compute stream above, activations / gradients and gradient reduction on its
communication stream below; micro-batch numbers on bars wide enough to read), memory per
stage against the device's, and where the iteration time goes.

Pipelines have up to hundreds of thousands of tasks.  Up to :data:`ZOOM_ABOVE` micro-batch
passes a stage (micro-batches x model chunks) every task is a bar (sub-pixel bars merged
with their neighbours, and said so).  Beyond, a bar per task would be noise: the whole
iteration is drawn as each stage's busy share per kind in at most :data:`BINS` time bins
(summed from the simulation's records; a full row is a stage busy all the time), and three
windows under it (the warm-up, the middle of the steady state, the cool-down) draw every
task again, each with at most :data:`ZOOM_TASKS` compute tasks a stage, so that bars and
their numbers stay readable.  Model chunks are shaded in at most three ranges of chunks.
"""

from __future__ import annotations

from pathlib import Path

from .style import OKABE_ITO, bytes_unit, figure, save, time_unit
from ..simulate.trace import stage_devices, stage_of

__all__ = ["KINDS", "kind_of", "stage_bars", "pipeline_figure", "plot_pipeline", "figure_height", "zoomed",
           "MERGE_PIXELS", "MAX_LABELS", "ZOOM_ABOVE", "ZOOM_TASKS", "BINS"]

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
MAX_LABELS = 300        # micro-batch numbers written at most (per axes)
ZOOM_ABOVE = 32         # micro-batch passes a stage; above, busy shares and zoom windows
ZOOM_TASKS = 8          # compute tasks a stage runs inside one zoom window, at most
BINS = 300              # time bins of the busy shares at most (about 2 points each)
LABEL_PT = 6            # font size of the numbers on bars
# model chunks: consecutive ranges of chunks in darker shades of each kind's colour (share
# of black mixed in); dozens of chunks would need dozens of indistinguishable hues, and
# lighter shades of the forward's blue would read as communication's sky blue
SHADES = {1: (0.0,), 2: (0.0, 0.45), 3: (0.0, 0.3, 0.55)}
COMPUTE = ("forward", "backward", "weight gradient")     # the kinds a micro-batch pass runs
IDLE = "#d9d9d9"
EDGES = {"edgecolors": "white", "linewidth": 0.3}        # back-to-back compute tasks stay apart


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
    merged when one of them is narrower than a pixel (``merge``; otherwise only overlapping
    ones).  The per-layer pieces of one task (a last backward whose reductions overlap it)
    are one bar.  Labels are micro-batch numbers, ``micro-batch.chunk`` with model
    ``chunks``; ``None`` where several tasks became one bar."""
    tol = makespan / MERGE_PIXELS if merge else -1e-300
    raw: dict[tuple[int, str], list] = {}
    for r in records:
        raw.setdefault((_stage(r, stage_size, stages), kind_of(r)), []).append((r.start, r.end, r.name))
    out = {}
    for key, spans in raw.items():
        spans.sort()
        merged: list[list] = []
        for s, e, name in spans:
            task = _task(name)
            close = merged and s - merged[-1][1] <= tol and min(e - s, merged[-1][1] - merged[-1][0]) <= tol
            if close or (merged and task == merged[-1][3]):
                last = merged[-1]
                last[1] = max(last[1], e)
                if task != last[3]:
                    last[2] = last[3] = None     # several tasks: no single micro-batch number
            else:
                merged.append([s, e, _microbatch(name, chunks), task])
        out[key] = [(s, e - s, label) for s, e, label, _ in merged]
    return out


def _stage(record, stage_size, stages: int) -> int:
    return min(stage_of(record.devices[0], stage_size), stages - 1) if record.devices else 0


def _task(name: str) -> str:
    """``"B3 mb2 layer 7"`` -> ``"B3 mb2"``: the task a per-layer piece belongs to."""
    return name.split(" layer ")[0] if " mb" in name else name


def _microbatch(name: str, chunks: bool = False) -> str | None:
    """``"F3 mb2"`` -> ``"2"``, or ``"2.3"`` (micro-batch 2 of chunk 3) with ``chunks``."""
    words = name.split()
    for part in words:
        if part.startswith("mb") and part[2:].isdigit():
            chunk = words[0].lstrip("FBAW")
            return f"{part[2:]}.{chunk}" if chunks and chunk.isdigit() else part[2:]
    return None


def zoomed(run) -> bool:
    """Whether the picture of ``run`` draws busy shares and zoom windows: beyond
    :data:`ZOOM_ABOVE` micro-batch passes a stage (micro-batches x model chunks; at 64, 1F1B
    bars on a full-width axis are about 4 points wide, too narrow for their numbers)."""
    records = run.timeline.records
    return _count(records) * run.schedule.virtual > ZOOM_ABOVE and max((r.end for r in records), default=0.0) > 0


def _count(records) -> int:
    return 1 + max((int(m) for r in records if (m := _microbatch(r.name)) is not None), default=-1)


def zoom_height(stages: int) -> float:
    return max(1.8, 0.2 * stages + 1.0)


def figure_height(run) -> float:
    """Inches :func:`pipeline_figure` wants for ``run``."""
    stages = len(run.peak_memory)
    extra = zoom_height(stages) if zoomed(run) else 0.0
    return max(2.2, 0.45 * stages + 1.2) + 2.6 + extra


class _Chunks:
    """Model chunks in shades: chunk ``c`` of ``K`` in range ``c * G // K`` of ``G <= 3``."""

    def __init__(self, virtual: int, stages: int):
        self.total, self.ranges = stages * virtual, min(virtual, len(SHADES))

    def of(self, label: str | None) -> int | None:
        """The range of a bar's ``micro-batch.chunk`` label (None: several tasks, or no chunks)."""
        if self.ranges == 1 or label is None or "." not in label:
            return None
        return int(label.split(".")[1]) * self.ranges // self.total

    def colour(self, colour: str, group: int | None):
        from matplotlib.colors import to_rgb

        mix = 0.0 if group is None else SHADES[self.ranges][group]
        return tuple(c * (1 - mix) for c in to_rgb(colour))

    def legend(self) -> list:
        from matplotlib.patches import Patch

        if self.ranges == 1:
            return []
        out = []
        for g in range(self.ranges):
            members = [c for c in range(self.total) if c * self.ranges // self.total == g]
            # swatches in the forward's shades (a grey would read as idle)
            out.append(Patch(color=self.colour(KINDS["forward"][0], g),
                             label=f"model chunks {members[0]}-{members[-1]}"))
        return out


def pipeline_figure(fig, run, stage_size: int, device_memory: float, title: str, breakdown: dict | None = None,
                    memory: list[dict[str, float]] | None = None, reserved: float = 0.0):
    """Draw a :class:`solver_planner.stages.PipelineRun` into ``fig`` (height:
    :func:`figure_height`); ``breakdown`` (:func:`solver_planner.plan.compose.breakdown`)
    adds the critical path's parts, ``memory`` (:func:`solver_planner.stages.memory.stage_memory`)
    splits each stage's memory.  When :func:`zoomed`, the iteration is drawn as busy shares,
    and a row of windows draws every task of the warm-up, the steady state and the cool-down."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    records = run.timeline.records
    stages = len(run.peak_memory)
    T = run.iteration_time or max((r.end for r in records), default=0.0)
    scale, unit = time_unit(T)
    zoom = zoomed(run)
    chunks = _Chunks(run.schedule.virtual, stages)
    labels = []         # numbers on bars, written once the layout has sized every axes
    numbers = "; numbers on bars: micro-batch" + (".model chunk" if run.schedule.virtual > 1 else "")
    heights = [max(2.2, 0.45 * stages + 1.2)] + ([zoom_height(stages)] if zoom else []) + [2.4]
    subs = fig.subfigures(len(heights), 1, height_ratios=heights)
    top, bottom = subs[0], subs[-1]
    ax = top.subplots()
    for p in range(stages):
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2" if p % 2 else "white", zorder=0, gid=f"stage-row-{p}")
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {p}" + _devices_label(p, stage_size) for p in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlim(0, T / scale * 1.005 if T > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    if zoom:
        rows = _row_tasks(records, stage_size, stages)
        width = _bin_width(records, T)
        present = _busy_rows(ax, records, stage_size, stages, T, scale, width)
        windows = _zoom_windows(rows, T)
        for i, (lo, hi, _) in enumerate(windows):
            ax.axvspan(lo / scale, hi / scale, color="black", alpha=0.12, lw=0, zorder=3, gid=f"zoom-window-{i}")
            ax.text((lo + hi) / 2 / scale, 1.0, "ABC"[i], transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=7)
        note = (f"\n{len(records)} tasks as each stage's busy share of every {width / scale:.3g} {unit} by kind"
                f" (a full row: always busy); A-C: every task, numbered micro-batch"
                + (".model chunk" if run.schedule.virtual > 1 else ""))
    else:
        bars = stage_bars(records, stage_size, stages, T, chunks=run.schedule.virtual > 1)
        drawn = sum(len(v) for v in bars.values())
        present = {kind for _, kind in bars}
        # one compute lane, or one lane per kind when bars of several tasks were merged:
        # merged bars of several kinds would otherwise cover each other
        split = any(label is None for (_, kind), spans in bars.items() if kind in COMPUTE for _, _, label in spans)
        lanes = {"forward": 0, "backward": 1 if split else 0, "weight gradient": 2 if split else 0,
                 "optimizer step": 0}      # the optimizer step runs after every pass: the forward lane has room

        def lane(p: int, kind: str) -> tuple[float, float]:
            if KINDS[kind][1]:
                return p + 0.18, 0.24
            h = 0.55 / (3 if split else 1)
            return p - 0.4 + lanes[kind] * h, h

        labels.append(_draw_bars(ax, bars, 0.0, T, scale, chunks, lane, "stage", **EDGES))
        note = (f"\n{len(records)} tasks drawn as {drawn} bars: bars of one kind closer than"
                f" {T / MERGE_PIXELS / scale:.3g} {unit} merged, one lane per kind" if split else
                numbers)
    ax.set_title(f"{title}: iteration {T / scale:.4g} {unit}{note}", fontsize=8, pad=12 if zoom else 6)
    # legends are placed by the layout engine inside the figure ("outside" the axes only);
    # only the kinds the plan has (no weight-gradient bars without weight delaying, no
    # gradient reduction with one replica per stage)
    top.legend(handles=[Patch(color=c, label=k) for k, (c, _) in KINDS.items() if k in present]
               + ([Patch(color=IDLE, label="idle (bubble, waits)")] if "idle" in present else []) + chunks.legend(),
               loc="outside right upper", fontsize=7)
    if zoom:
        zaxes = subs[1].subplots(1, len(windows), sharey=True, squeeze=False)[0]
        for i, (zax, (lo, hi, what)) in enumerate(zip(zaxes, windows)):
            labels.append(_gantt(zax, records, stage_size, stages, lo, hi, scale, chunks, f"-window-{i}"))
            zax.set_title(f"{'ABC'[i]}: {what}, every task ({(hi - lo) / scale:.4g} {unit})", fontsize=8)
            zax.set_xlabel(f"time ({unit})")
            zax.xaxis.set_major_locator(MaxNLocator(4))    # long tick labels (12.34) stay apart
        zaxes[0].set_ylabel("stage", fontsize=7)
    panels = 3 if breakdown is not None else 2
    axes = bottom.subplots(1, panels)
    _memory(axes[0], run.peak_memory, device_memory, memory, reserved)
    _time_per_stage(axes[1], records, stage_size, stages, T, scale, unit)
    if breakdown is not None:
        _breakdown(axes[2], breakdown, scale, unit)
    engine = fig.figure.get_layout_engine()
    if engine is not None:
        engine.execute(fig.figure)
    if sum(write() for write in labels) == 0:
        # no bar was wide enough for its number: the title does not promise numbers
        ax.set_title(ax.get_title().replace(numbers, ""), fontsize=8, pad=12 if zoom else 6)
    return fig


def _devices_label(p: int, stage_size) -> str:
    """On unequal meshes, each stage's devices under its name (they differ from stage to stage)."""
    if isinstance(stage_size, int):
        return ""
    n = stage_devices(p, stage_size)
    return f"\n{n} device{'s' * (n > 1)}"


def _draw_bars(ax, bars, lo: float, hi: float, scale: float, chunks: _Chunks, lane, gid: str, suffix: str = "",
               **edges):
    """``bars`` (:func:`stage_bars`) over [lo, hi] at ``lane(stage, kind) -> (y, height)``,
    model chunks in shades.  Returns what writes the micro-batch numbers on the compute
    bars they fit on, to call once the layout has sized the axes."""
    todo = []
    for (p, kind), spans in sorted(bars.items()):
        colour, comm = KINDS[kind]
        y, h = lane(p, kind)
        shaded: dict[int | None, list] = {}
        for s, w, label in spans:
            shaded.setdefault(chunks.of(label), []).append((s / scale, w / scale))
        for group, xs in sorted(shaded.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            name = f"{gid}-{p}-{kind.replace(' ', '-')}" + ("" if group is None else f"-chunks-{group}") + suffix
            ax.broken_barh(xs, (y, h), facecolors=chunks.colour(colour, group), gid=name, **({} if comm else edges))
        if not comm:
            # the part of each bar inside the axes
            todo += [(max(s, lo), min(s + w, hi), y, h, label) for s, w, label in spans if label is not None]

    def write() -> int:
        box = ax.get_window_extent()
        points = 72 / ax.figure.dpi
        width, row = box.width * points, box.height * points / abs(ax.get_ylim()[0] - ax.get_ylim()[1])
        written = 0
        for a, b, y, h, label in todo:
            if written < MAX_LABELS and h * row >= LABEL_PT + 1 and (b - a) / (hi - lo) * width >= _text_pt(label):
                ax.text((a + b) / 2 / scale, y + h / 2, label, ha="center", va="center", fontsize=LABEL_PT,
                        color="white", clip_on=True)
                written += 1
        return written

    return write


def _text_pt(label: str) -> float:
    """Points ``label`` needs at :data:`LABEL_PT` with a little room (DejaVu Sans: digits
    0.64 em, the point 0.32 em)."""
    return (0.64 * len(label) - 0.32 * label.count(".")) * LABEL_PT + 3


def _bin_width(records, T: float) -> float:
    """The busy shares' bin: a whole number of steady-state periods (the median time between
    two forwards of one model chunk), at least ``T / BINS``.  A bin of 1.5 periods would see
    one task more or less from bin to bin: an even steady state would be drawn rippled."""
    import numpy as np

    starts: dict[str, list[float]] = {}
    for r in records:
        if r.category == "forward":
            starts.setdefault(r.name.split()[0], []).append(r.start)
    gaps = np.concatenate([np.diff(sorted(v)) for v in starts.values()] or [np.zeros(0)])
    period = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else T / BINS
    return period * max(1, int(np.ceil(T / BINS / period - 1e-9))) if period > 0 else T / BINS


def _busy_rows(ax, records, stage_size, stages: int, T: float, scale: float, width: float) -> set[str]:
    """Each stage's busy share per kind in bins ``width`` long (the last one may be shorter),
    stacked on its compute band (a full band: busy every instant of the bin, the rest idle);
    the share of each bin with a transfer, and with a gradient reduction, in two thin bands
    under it.  The kinds drawn."""
    import numpy as np

    spans: dict[tuple[int, str], list] = {}
    for r in records:
        spans.setdefault((_stage(r, stage_size, stages), kind_of(r)), []).append((r.start, r.end))
    edges = np.arange(0.0, T, width)
    edges = np.append(edges, T) if T - edges[-1] > width * 1e-6 else np.append(edges[:-1], T)
    bins = len(edges) - 1
    # band of each kind: (bottom, height); y grows downwards (stage 0 on top)
    band = {"communication": (0.30, 0.14), "gradient reduction": (0.45, 0.12)}
    for p in range(stages):
        # what no kind covers is idle, in the grey of the time-per-stage panel's idle share
        ax.broken_barh([(0.0, T / scale)], (p + 0.12 - 0.54, 0.54), facecolors=IDLE, gid=f"stage-{p}-idle",
                       rasterized=True)
        stacked = np.zeros(bins)
        for kind, (colour, comm) in KINDS.items():
            if (p, kind) not in spans:
                continue
            share = _shares(spans[p, kind], edges)
            base, h = band.get(kind, (0.12, 0.54))
            below = stacked if not comm else np.zeros(bins)
            # rasterized: in an SVG, hundreds of bins of every kind and stage would be megabytes of paths
            ax.stairs(p + base - (below + share) * h, edges / scale, baseline=p + base - below * h, fill=True,
                      color=colour, lw=0, gid=f"stage-{p}-{kind.replace(' ', '-')}", rasterized=True)
            if not comm:
                stacked = np.minimum(stacked + share, 1.0)   # one compute stream: shares add up to at most 1
    return {kind for _, kind in spans} | {"idle"}


def _shares(spans, edges):
    """The share of each bin between ``edges`` covered by ``spans`` [(start, end)] (overlaps once)."""
    import numpy as np

    union: list[list[float]] = []
    for s, e in sorted(spans):
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    starts, ends = (np.array([u[i] for u in union]) for i in (0, 1))

    def before(points, x):          # sum over points p < x of (x - p)
        n = np.searchsorted(points, x)
        return x * n - np.concatenate(([0.0], np.cumsum(points)))[n]

    covered = before(starts, edges) - before(ends, edges)
    return np.clip(np.diff(covered) / np.diff(edges), 0.0, 1.0)


def _row_tasks(records, stage_size, stages: int) -> list[list[tuple[float, float]]]:
    """Each stage's compute tasks (per-layer pieces joined) as (start, end), by start."""
    tasks: dict[str, list] = {}
    for r in records:
        if kind_of(r) in COMPUTE:
            span = tasks.setdefault(_task(r.name), [r.start, r.end, _stage(r, stage_size, stages)])
            span[0], span[1] = min(span[0], r.start), max(span[1], r.end)
    rows: list[list[tuple[float, float]]] = [[] for _ in range(stages)]
    for s, e, p in tasks.values():
        rows[p].append((s, e))
    return [sorted(row) for row in rows]


def _zoom_windows(rows, T: float) -> list[tuple[float, float, str]]:
    """Three windows, each with at most :data:`ZOOM_TASKS` compute tasks on every stage: from
    the start (the fill), around the middle of the passes (the steady state), and the last
    tasks (the drain) with a quarter more after them (reductions, optimizer steps)."""
    rows = [row for row in rows if row]
    n, half = ZOOM_TASKS, ZOOM_TASKS // 2
    # a task overlaps [lo, hi] when it ends after lo and starts before hi
    warm = min((row[n][0] for row in rows if len(row) > n), default=T)
    cool = max((row[-n - 1][1] for row in rows if len(row) > n), default=0.0)
    last = max((row[-1][1] for row in rows), default=T)
    mid = (min((row[0][0] for row in rows), default=0.0) + last) / 2
    after = [[s for s, _ in row if s >= mid] for row in rows]
    before = [[e for _, e in row if e <= mid] for row in rows]
    hi = min((a[half] for a in after if len(a) > half), default=T)
    lo = max((b[-half] for b in before if len(b) >= half), default=0.0)
    windows = [(0.0, warm, "warm-up"), (lo, hi, "steady state"), (cool, min(T, last + (last - cool) / 4), "cool-down")]
    return [w for w in windows if w[1] > w[0]]


def _gantt(ax, records, stage_size, stages: int, lo: float, hi: float, scale: float, chunks: _Chunks,
           suffix: str):
    """Every task of [lo, hi] (only overlapping bars merged), numbered where the number fits."""
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlim(lo / scale, hi / scale)
    for p in range(stages):
        ax.axhspan(p - 0.5, p + 0.5, color="#f2f2f2" if p % 2 else "white", zorder=0)
    inside = [r for r in records if r.end > lo and r.start < hi]
    bars = stage_bars(inside, stage_size, stages, hi - lo, merge=False, chunks=chunks.ranges > 1)

    def lane(p: int, kind: str) -> tuple[float, float]:
        return (p + 0.18, 0.24) if KINDS[kind][1] else (p - 0.4, 0.55)

    write = _draw_bars(ax, bars, lo, hi, scale, chunks, lane, "zoom-stage", suffix, **EDGES)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([str(p) for p in range(stages)], fontsize=6)
    return write


# the colours the pipeline's bars give the same things (activations: the forwards'; gradients:
# their reduction's; optimizer state: its step's), the static weights neutral
MEMORY_PARTS = (("weights", "#666666"), ("gradients", KINDS["gradient reduction"][0]),
                ("optimizer", KINDS["optimizer step"][0]), ("activations", KINDS["forward"][0]))


def _memory(ax, peak, device_memory: float, split: list[dict[str, float]] | None = None, reserved: float = 0.0
            ) -> None:
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
    def size(n: float) -> str:
        return f"{n / bytes_unit(n)[0]:.4g} {bytes_unit(n)[1]}"

    # ``device_memory`` is what plans may fill: the device's less what the spec reserves
    capacity = (f"device memory {size(device_memory)}" if not reserved else
                f"plans may fill {size(device_memory)} ({size(reserved)} reserved)")
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
    ax.bar(range(stages), idle, bottom=bottom, color=IDLE, label="idle (bubble, waits)", gid="time-idle")
    ax.set_xticks(range(stages))
    ax.set_xlabel("stage")
    ax.set_ylabel(f"time per iteration ({unit})")
    ax.set_title("where each stage's time goes")
    ax.set_ylim(0, T / scale * 1.6)   # room for the legend (three rows) above the bars
    ax.legend(loc="upper center", fontsize=6, ncols=2)


# as the pipeline's bars colour the same things (pipeline transfers: its communication lane);
# tensor parallelism, which has no bar of its own, the one colour left
BREAKDOWN_COLOURS = {"compute": KINDS["forward"][0], "tensor_parallel": OKABE_ITO[6],
                     "pipeline_transfer": KINDS["communication"][0], "gradient_reduction": KINDS["gradient reduction"][0],
                     "optimizer": KINDS["optimizer step"][0], "parameter_gather": OKABE_ITO[7], "idle": "#bdbdbd"}


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
                  breakdown: dict | None = None, memory: list[dict[str, float]] | None = None,
                  reserved: float = 0.0) -> Path:
    """Write the pipeline picture of ``run`` to ``path`` (.svg or .png); ``device_memory`` is
    what plans may fill, ``reserved`` what the spec keeps free beside it."""
    with figure(11, figure_height(run)) as fig:
        pipeline_figure(fig, run, stage_size, device_memory, title, breakdown, memory, reserved)
        return save(fig, path)
