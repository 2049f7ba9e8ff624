"""The pipeline picture stays readable at scale: beyond ZOOM_ABOVE micro-batch passes a stage
the iteration is drawn as busy shares (a bounded number of artists, whose areas are the
records' busy time) and three zoom windows of at most ZOOM_TASKS compute tasks a stage,
whose numbers fit their bars and do not overlap; many model chunks are shaded in at most
three ranges; a small plan keeps one bar and one number per task."""

import re

import pytest

from solver_planner.simulate.timeline import Record
from solver_planner.simulate.trace import stage_of
from solver_planner.stages import simulate_schedule
from solver_planner.stages.schedule import mesh_of

from conftest import CLUSTERS, SPECS
from test_stages_chunks import balanced

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

from solver_planner.report.pipeline import (BINS, KINDS, ZOOM_ABOVE, ZOOM_TASKS, figure_height,  # noqa: E402
                                            kind_of, pipeline_figure, stage_bars, zoomed)

COMPUTE = ("forward", "backward", "weight-gradient")
BAR = re.compile(r"(zoom-)?stage-(\d+)-(forward|backward|weight-gradient)(-chunks-\d+)?(-window-\d+)?$")


def picture(run, stage_size):
    """The figure ``plot_pipeline`` would save, laid out on an Agg canvas (text extents)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from solver_planner.report.style import figure

    with figure(11, figure_height(run)) as fig:
        FigureCanvasAgg(fig)
        pipeline_figure(fig, run, stage_size, 64 * 2**30, "t")
        fig.draw_without_rendering()
        return fig


def gids(ax) -> list[str]:
    return [a.get_gid() or "" for a in ax.get_children()]


def top_axes(fig):
    return next(ax for ax in fig.axes if "stage-row-0" in gids(ax))


def zoom_axes(fig):
    return [ax for ax in fig.axes if any(g.startswith("zoom-stage-") for g in gids(ax))]


def compute_bars(ax) -> dict[int, list[tuple[float, float, float, float]]]:
    """Each stage's compute bars on ``ax`` as display boxes (x0, x1, y0, y1), clipped to the axes."""
    box = ax.get_window_extent()
    out: dict[int, list] = {}
    for coll in ax.collections:
        m = BAR.match(coll.get_gid() or "")
        if not m:
            continue
        for path in coll.get_paths():
            xy = coll.get_transform().transform(path.vertices)
            x0, x1 = max(xy[:, 0].min(), box.x0), min(xy[:, 0].max(), box.x1)
            out.setdefault(int(m.group(2)), []).append((x0, x1, xy[:, 1].min(), xy[:, 1].max()))
    return out


def numbers(ax):
    """The micro-batch numbers written on ``ax``'s bars (the white, clipped texts)."""
    return [t for t in ax.texts if t.get_color() == "white"]


def assert_numbers_fit(ax):
    """Every number lies inside one compute bar, is narrower than it, and overlaps no other."""
    bars = [b for row in compute_bars(ax).values() for b in row]
    boxes = [t.get_window_extent() for t in numbers(ax)]
    for t, e in zip(numbers(ax), boxes):
        cx, cy = (e.x0 + e.x1) / 2, (e.y0 + e.y1) / 2
        home = [b for b in bars if b[0] <= cx <= b[1] and b[2] <= cy <= b[3]]
        assert home, t.get_text()
        assert e.width <= home[0][1] - home[0][0] + 0.5, (t.get_text(), e.width, home[0][1] - home[0][0])
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0


def assert_busy_shares_are_the_records(ax, run, stage_size, stages):
    """The area of each stage's compute shares is the busy time of its records (nothing drawn
    that did not happen); at most BINS steps per share, one share per kind and stage."""
    from matplotlib.patches import StepPatch

    records = run.timeline.records
    T = run.iteration_time
    busy: dict[tuple[int, str], float] = {}
    for r in records:
        key = (min(stage_of(r.devices[0], stage_size), stages - 1), kind_of(r).replace(" ", "-"))
        busy[key] = busy.get(key, 0.0) + r.end - r.start
    heights = {int(g.split("-")[1]): c.get_paths()[0].get_extents().height
               for c, g in zip(ax.collections, (c.get_gid() or "" for c in ax.collections)) if g.endswith("-idle")}
    assert sorted(heights) == list(range(stages))
    steps = [p for p in ax.patches if isinstance(p, StepPatch)]
    assert 0 < len(steps) <= stages * len(KINDS)
    drawn = set()
    for patch in steps:
        _, p, kind = re.match(r"stage-(\d+)-(.+)$", patch.get_gid()).group(0, 1, 2)
        p = int(p)
        values, edges, baseline = patch.get_data()
        assert len(values) <= BINS
        drawn.add((p, kind))
        if kind in COMPUTE + ("optimizer-step",):
            area = sum((b - v) / heights[p] * (e1 - e0) for v, b, e0, e1 in zip(values, baseline, edges, edges[1:]))
            assert area * T / edges[-1] == pytest.approx(busy[p, kind], rel=1e-9, abs=T * 1e-12)
    assert drawn == set(busy)


@pytest.fixture(scope="module")
def long_1f1b():
    """1F1B over 4 stages and 256 micro-batches (no communication)."""
    plan, s = balanced(4, 256, 1, "1f1b")
    return simulate_schedule(plan, s), plan.costs.shape.size


@pytest.fixture(scope="module")
def many_chunks():
    """Interleaved 1F1B, 4 stages of 12 model chunks each (48 chunks), 16 micro-batches."""
    plan, s = balanced(4, 16, 12, "interleaved-1f1b")
    return simulate_schedule(plan, s), plan.costs.shape.size, s


def test_256_microbatches_are_busy_shares_and_three_readable_windows(long_1f1b):
    run, size = long_1f1b
    # a window of 12 tasks a stage at most (its bars about 20 points wide), about 2 points a bin
    assert ZOOM_TASKS <= 12 and BINS <= 400
    assert zoomed(run)
    fig = picture(run, size)
    top = top_axes(fig)
    # the iteration: shares per stage and kind, no bar or number per task
    assert_busy_shares_are_the_records(top, run, size, 4)
    assert len(top.collections) <= 4 and not numbers(top)
    assert [t.get_text() for t in top.texts] == ["A", "B", "C"]
    zooms = zoom_axes(fig)
    assert len(zooms) == 3
    assert [ax.get_title().split(":")[0] for ax in zooms] == ["A", "B", "C"]
    written = 0
    for i, ax in enumerate(zooms):
        # each window is where the iteration's picture marks it
        span = next(p for p in top.patches if p.get_gid() == f"zoom-window-{i}")
        x = span.get_extents().transformed(top.transData.inverted())
        assert (x.x0, x.x1) == pytest.approx(ax.get_xlim(), rel=1e-9, abs=1e-12)
        rows = compute_bars(ax)
        assert set(rows) == set(range(4))
        assert all(1 <= len(row) <= ZOOM_TASKS for row in rows.values()), {p: len(r) for p, r in rows.items()}
        assert_numbers_fit(ax)
        written += len(numbers(ax))
        assert len(numbers(ax)) <= 4 * ZOOM_TASKS
    assert written >= 2 * ZOOM_TASKS          # the windows are numbered, not just coloured
    assert sum(len(ax.texts) for ax in fig.axes) <= 3 + 3 * 4 * ZOOM_TASKS
    # the warm-up starts at 0 and the cool-down holds the last pass on every stage
    last = max(r.end for r in run.timeline.records if r.category in ("forward", "backward"))
    scale = run.iteration_time / top.get_xlim()[1] * 1.005
    assert zooms[0].get_xlim()[0] == 0.0 and zooms[2].get_xlim()[1] * scale >= last * (1 - 1e-9)


def test_dozens_of_model_chunks_are_shaded_in_three_ranges(many_chunks):
    run, size, s = many_chunks
    assert run.schedule.virtual == 12 and zoomed(run)
    fig = picture(run, size)
    legend = [t.get_text() for t in fig.subfigs[0].legends[0].get_texts()]
    assert [x for x in legend if x.startswith("model chunks")] == ["model chunks 0-15", "model chunks 16-31",
                                                                   "model chunks 32-47"]
    shades = set()
    for ax in zoom_axes(fig):
        rows = compute_bars(ax)
        assert all(len(row) <= ZOOM_TASKS for row in rows.values())
        assert_numbers_fit(ax)
        for coll in ax.collections:
            m = BAR.match(coll.get_gid() or "")
            if m and m.group(3) == "forward":
                shades.add(tuple(coll.get_facecolor()[0]))
        for t in numbers(ax):
            m, chunk = map(int, t.get_text().split("."))
            # a number m.c sits on the row of the stage that runs chunk c
            assert mesh_of(s, 4, chunk) == round(t.get_position()[1]) and 0 <= m < 16
    assert 2 <= len(shades) <= 3


def test_a_small_plan_keeps_a_bar_and_a_number_per_task():
    plan, s = balanced(2, 4, 1, "1f1b")
    run = simulate_schedule(plan, s)
    assert not zoomed(run)
    fig = picture(run, plan.costs.shape.size)
    assert not zoom_axes(fig)
    top = top_axes(fig)
    rows = compute_bars(top)
    assert {p: len(row) for p, row in rows.items()} == {0: 8, 1: 8}      # 4 forwards, 4 backwards a stage
    texts = sorted(t.get_text() for t in numbers(top))
    assert texts == sorted([str(m) for m in range(4)] * 4)
    assert_numbers_fit(top)
    assert "numbers on bars: micro-batch" in top.get_title()


def test_the_cut_is_micro_batch_passes():
    """32 passes a stage: bar by bar; 33: shares and windows (micro-batches x chunks)."""
    assert ZOOM_ABOVE == 32
    for (B, v), zoom in (((32, 1), False), ((36, 1), True), ((16, 2), False), ((20, 2), True)):
        plan, s = balanced(2, B, v, "1f1b" if v == 1 else "interleaved-1f1b")
        assert zoomed(simulate_schedule(plan, s)) is zoom, (B, v)


def test_back_to_back_tasks_stay_apart_and_a_task_s_pieces_are_one_bar():
    def rec(i, name, start, end, category="backward"):
        return Record(i, name, start, end, (), (0,), "compute", category, {})

    # two wide forwards back to back are two bars, not one merged unnumbered bar
    recs = [rec(0, "F0 mb0", 0.0, 1.0, "forward"), rec(1, "F0 mb1", 1.0, 2.0, "forward")]
    assert stage_bars(recs, 1, 1, 10.0)[0, "forward"] == [(0.0, 1.0, "0"), (1.0, 1.0, "1")]
    # a last backward cut in per-layer pieces (its reductions overlap it) is one numbered bar
    pieces = [rec(i, f"B0 mb3 layer {7 - i}", i * 0.5, (i + 1) * 0.5) for i in range(4)]
    assert stage_bars(pieces, 1, 1, 10.0, merge=False)[0, "backward"] == [(0.0, 2.0, "3")]


@pytest.mark.slow
def test_a_planned_iteration_of_256_micro_batches_with_transfers(tmp_path):
    """GPT-3 2.6B on 2 hosts of 4 V100, d,t,p,k = 1,2,4,256, through the command; its SVG
    stays small (the shares are rasterized: 114 KB, where a bar per task took 597 KB)."""
    from conftest import run_cli

    out = tmp_path / "p.svg"
    r = run_cli("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml", "--config",
                "1,2,4,256", "--no-baselines", "--plot", out)
    assert r.returncode == 0, r.stderr
    from solver_planner import api

    rep = api.stages(CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml", config="1,2,4,256")
    fig = picture(rep.run, rep.partition.stage_size)
    assert_busy_shares_are_the_records(top_axes(fig), rep.run, rep.partition.stage_size, 4)
    for ax in zoom_axes(fig):
        assert all(len(row) <= ZOOM_TASKS for row in compute_bars(ax).values())
        assert_numbers_fit(ax)
    assert out.stat().st_size < 250_000
