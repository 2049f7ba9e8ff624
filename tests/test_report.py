"""Pictures (issue 16): every --plot on shipped specs, what the SVGs contain, determinism,
the missing-matplotlib message, and the HTML report in a real headless Chromium."""

import collections
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
import yaml

from conftest import CLUSTERS, ROOT, SPECS, run_cli

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

MODELS = SPECS / "models"
SVG = "{http://www.w3.org/2000/svg}"


def ids(path) -> list[str]:
    """Every id of an SVG file, which must parse as XML."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return [el.get("id") for el in root.iter() if el.get("id")]


def test_place_plot_has_a_map_per_axis_the_best_programs_steps_and_a_bar_pair_per_placement(tmp_path):
    out = tmp_path / "place.svg"
    r = run_cli("place", CLUSTERS / "p2-a100-4x16.yaml", MODELS / "p2-fig11b.yaml", "--json", "--plot", out)
    assert r.returncode == 0, r.stderr
    found = ids(out)
    for axis in ("a0", "a1", "a2"):
        assert f"axis-{axis}-map" in found
    # the best program of r02 is ReduceScatter; AllReduce; AllGather: three step panels with their groups
    assert [i for i in found if re.fullmatch(r"reduction-r02-step-\d-groups", i)] == [
        f"reduction-r02-step-{n}-groups" for n in (1, 2, 3)]
    placements = len(json.loads(r.stdout)["placements"])
    assert placements == 5
    for n in range(1, placements + 1):
        assert f"placement-{n}-allreduce" in found and f"placement-{n}-best" in found


def test_verify_plot_highlights_the_counterexample(tmp_path):
    out = tmp_path / "verify.svg"
    r = run_cli("reduce", "verify", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "dp16.yaml",
                ROOT / "examples" / "broken-allreduce-2x8.yaml", "--plot", out)
    assert r.returncode == 1, r.stderr
    root = ET.parse(out).getroot()
    by_id = {el.get("id"): el for el in root.iter() if el.get("id")}
    for gid in ("counterexample-step", "counterexample-device", "counterexample-group", "counterexample-text"):
        assert gid in by_id, gid
    # the highlighted step is step 2 (its panel holds the frame), and the text names device 9
    step2 = by_id["step-2"]
    assert any(el.get("id") == "counterexample-step" for el in step2.iter())
    assert "device 9" in "".join(by_id["counterexample-text"].itertext())
    # a valid program has no counterexample
    ok = tmp_path / "ok.svg"
    r = run_cli("reduce", "verify", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "dp16.yaml",
                ROOT / "examples" / "hierarchical-allreduce-2x8.yaml", "--plot", ok)
    assert r.returncode == 0, r.stderr
    assert not [i for i in ids(ok) if i.startswith("counterexample")]
    assert {f"step-{n}" for n in range(4)} <= set(ids(ok))


@pytest.mark.slow
def test_synth_plot_png(tmp_path):
    out = tmp_path / "synth.png"
    r = run_cli("reduce", "synth", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "dp16.yaml", "--top", "1", "--plot", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_held_bytes_follow_the_layout():
    from solver_planner.cost import Collective
    from solver_planner.report.program import held_bytes

    steps = [(Collective.REDUCESCATTER, [[0, 1, 2, 3]]), (Collective.ALLGATHER, [[0, 1, 2, 3]])]
    states, stopped = held_bytes(4, 4, steps, 400.0)
    assert states == [[400.0] * 4, [100.0] * 4, [400.0] * 4] and stopped is None


def _resharding(model: str, cluster: str):
    from solver_planner import api

    return api.load(CLUSTERS / cluster, MODELS / model)[0], api.reshard(CLUSTERS / cluster, MODELS / model)


def test_reshard_gantt_has_one_bar_per_unit_task_and_port_and_the_bound(tmp_path):
    from solver_planner.report.resharding import plot_resharding

    topo, results = _resharding("reshard-2x4-to-3x4.yaml", "aws-p3.8xlarge-5.yaml")
    out = plot_resharding(tmp_path / "r.svg", results, topo)
    found = ids(out)
    for n, result in enumerate(results):
        plan = result.solution
        for which, schedule in (("task", plan.schedule), ("naive", None)):
            if schedule is None:
                from solver_planner.resharding.heuristics import naive
                schedule = naive(plan.instance)
            bars = [tuple(map(int, m.groups())) for i in found
                    if (m := re.fullmatch(rf"r{n}-{which}-(\d+)-port-(\d+)", i))]
            expected = sorted((t, r) for t, k in enumerate(schedule.choice)
                              for r in plan.instance.candidates[t][k].resources)
            assert sorted(bars) == expected                       # every unit task, on every port it holds
            assert {t for t, _ in bars} == set(range(len(plan.tasks)))
            rows = [i for i in found if re.fullmatch(rf"r{n}-{which}-row-\d+", i)]
            assert len(rows) == len(plan.instance.resources)      # one row per port
            assert f"r{n}-{which}-lower-bound" in found


@pytest.mark.slow
def test_reshard_cli_plot(tmp_path):
    out = tmp_path / "r.png"
    r = run_cli("reshard", CLUSTERS / "aws-p3.8xlarge-3.yaml", MODELS / "reshard-1x4-to-2x4.yaml", "--plot", out)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1000 and f"wrote {out}" in r.stderr


def test_stages_plot_has_a_row_per_stage_and_microbatch_numbers(tmp_path):
    out = tmp_path / "stages.svg"
    r = run_cli("stages", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "mlp16.yaml", "--no-baselines", "--json",
                "--plot", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    stages = data["config"]["pipeline"]
    found = ids(out)
    assert sorted(i for i in found if i.startswith("stage-row-")) == sorted(f"stage-row-{p}" for p in range(stages))
    assert {f"memory-{part}-stage-{p}" for p in range(stages) for part in ("weights", "gradients", "optimizer",
                                                                          "activations")} <= set(found)
    assert "device-memory" in found
    for p in range(stages):
        assert f"stage-{p}-forward" in found and f"stage-{p}-backward" in found
        # the optimizer step (and the host's 5 ms) is its own kind, not communication
        assert f"stage-{p}-optimizer-step" in found
    assert "time-optimizer-step" in found
    text = out.read_text()
    assert "time (" in text and "peak memory per device (" in text    # axis labels carry units


def test_pipeline_bars_are_merged_and_said_so_when_huge():
    from solver_planner.report.pipeline import MERGE_PIXELS, stage_bars
    from solver_planner.simulate.timeline import Record

    recs = [Record(i, f"F0 mb{i}", i * 1e-3, (i + 1) * 1e-3, (), (0,), "compute", "forward", {})
            for i in range(100_000)]
    bars = stage_bars(recs, 1, 1, 100.0)
    assert len(bars[0, "forward"]) == 1 and bars[0, "forward"][0][:2] == (0.0, pytest.approx(100.0))
    spaced = [Record(i, f"F0 mb{i}", i * 1.0, i + 0.5, (), (0,), "compute", "forward", {}) for i in range(10)]
    bars = stage_bars(spaced, 1, 1, 10.0)
    assert [label for _, _, label in bars[0, "forward"]] == [str(i) for i in range(10)]
    assert MERGE_PIXELS >= 500


def test_same_inputs_same_svg_bytes(tmp_path):
    from solver_planner.report.resharding import plot_resharding

    topo, results = _resharding("reshard-1x4-to-2x4.yaml", "aws-p3.8xlarge-3.yaml")
    a = plot_resharding(tmp_path / "a.svg", results, topo).read_bytes()
    b = plot_resharding(tmp_path / "b.svg", results, topo).read_bytes()
    assert a == b
    assert b"<dc:date>" not in a                                  # no creation date


@pytest.mark.parametrize("args", [
    ("reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", MODELS / "reshard-2x4-to-3x4.yaml"),
    ("stages", CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml"),
], ids=["reshard", "stages"])
def test_a_plot_is_the_same_bytes_whatever_the_hash_seed(tmp_path, args):
    """The README's promise (the same inputs give the same SVG bytes) across processes: a
    port's number once followed a frozenset's order, so reshard's rows were drawn in
    another order under another PYTHONHASHSEED."""
    svgs = []
    for seed in ("0", "1", "7"):
        out = tmp_path / f"{seed}.svg"
        r = run_cli(*args, "--plot", out, env={"PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr
        svgs.append(out.read_bytes())
    assert svgs[0] == svgs[1] == svgs[2]


def test_without_matplotlib_plot_exits_2_with_the_install_hint(tmp_path):
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    r = run_cli("reduce", "synth", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "dp16.yaml", "--plot", tmp_path / "x.svg",
                env={"PYTHONPATH": str(fake.parent)})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "solver-planner[plot]" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.slow
def test_bad_plot_paths_exit_2_before_the_work(tmp_path):
    r = run_cli("reduce", "synth", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "dp16.yaml", "--plot", tmp_path / "x.pdf")
    assert r.returncode == 2 and ".svg or .png" in r.stderr
    r = run_cli("stages", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "mlp16.yaml", "--plot", tmp_path / "no" / "x.svg")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("plan", CLUSTERS / "p2-v100-2x8.yaml", MODELS / "mlp16.yaml", "--report", tmp_path / "r.txt")
    assert r.returncode == 2 and ".html" in r.stderr


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.slow
def test_plan_report_and_plot_open_in_headless_chromium(tmp_path):
    report, plot = tmp_path / "report.html", tmp_path / "plan.svg"
    r = run_cli("plan", CLUSTERS / "aws-p3.8xlarge-2.yaml", MODELS / "gpt3-2.6b.yaml", "-o", tmp_path / "plan.yaml",
                "--report", report, "--plot", plot)
    assert r.returncode == 0, r.stderr
    found = ids(plot)
    assert sorted(i for i in found if i.startswith("stage-row-")) == [f"stage-row-{p}" for p in range(4)]
    assert "breakdown-compute" in found
    assert plot.stat().st_size < 2_000_000                        # 18 000 tasks, merged
    page = report.read_text()
    assert page.count("<svg") >= 3 and "solver-planner check" in page
    proofs = {st["proof"] for st in yaml.safe_load((tmp_path / "plan.yaml").read_text())["stages"]}
    assert proofs and all(f">{p}<" in page for p in proofs), proofs    # each stage's proof, as the file says
    assert not re.search(r'(src|href)="(https?:)?//', page)       # nothing fetched from the network
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome); .ci/run installs it")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1280,1600", report.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists(), "Chromium wrote no screenshot"
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3].reshape(-1, 3)
    colours = collections.Counter(map(tuple, (pixels * 255).astype(int)[::7]))
    white = colours.get((255, 255, 255), 0) / sum(colours.values())
    assert white < 0.97 and len(colours) > 20                    # not blank: text, tables, pictures


def test_plan_report_draws_each_stages_proven_program_step_by_step(tmp_path):
    """A plan whose stages reduce over replicas on two hosts: the report draws the stage's
    program step by step on its sub-mesh (one panel per step, the groups drawn), with its
    proof status in the caption."""
    import yaml

    from solver_planner.plan import make_plan
    from solver_planner.plan.planfile import plan_document
    from solver_planner.report.html import plan_report
    from solver_planner.spec import load_model_spec
    from solver_planner.stages.report import Config
    from solver_planner.topology import load_topology

    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump({
        "name": "m", "training": {"global_batch": 128, "dtype": "float16", "optimizer": "adam"},
        "layers": [{"name": "l", "repeat": 8, "flops": "80 GFLOP", "params": "200 MiB", "activations": "8 MiB"}]}))
    plan = make_plan(load_topology(CLUSTERS / "aws-p3.8xlarge-4.yaml"), load_model_spec(model), "1f1b",
                     config=Config(4, 2, 2, 16))
    program = plan.parts[0].program
    assert "host" in program and plan.parts[0].proof == "valid"
    page = plan_report(plan, plan_document(plan))
    assert f"gradient program, step by step on its sub-mesh (devices numbered within the stage): {program}" in page
    assert "z3 proof: valid" in page
    # the links table says what it leaves out (tensor parallelism is t = 2 here), and the
    # heading counts its stages in words
    assert "Tensor-parallel collectives and ZeRO-3 parameter gathers are priced inside each layer's time" in page
    assert "<p>2 stages of " in page
    steps = len(program.split(";"))
    assert all(re.search(rf'id="f\d+-step-{n}-groups', page) for n in range(1, steps + 1))


# -- pictures at scale ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def many_microbatches():
    """GPT-3 2.6B on 2 hosts of 4 V100: a plan of many micro-batches (the chart zooms)."""
    from solver_planner.plan import make_plan
    from solver_planner.spec import load_model_spec
    from solver_planner.topology import load_topology

    return make_plan(load_topology(CLUSTERS / "aws-p3.8xlarge-2.yaml"), load_model_spec(MODELS / "gpt3-2.6b.yaml"),
                     "1f1b")


def _legends(fig):
    """Every legend of a figure: its own, its subfigures', its axes' (each once)."""
    out = {}
    stack = [fig]
    while stack:
        f = stack.pop()
        for leg in getattr(f, "legends", []):
            out[id(leg)] = leg
        stack += list(getattr(f, "subfigs", []))
    for ax in fig.axes:
        if ax.get_legend() is not None:
            out[id(ax.get_legend())] = ax.get_legend()
    return list(out.values())


def test_legends_stay_inside_their_figures(many_microbatches):
    from solver_planner.plan.compose import breakdown
    from solver_planner.report.html import _stage_map
    from solver_planner.report.pipeline import ZOOM_ABOVE, figure_height, pipeline_figure
    from solver_planner.report.style import figure
    from solver_planner.stages.memory import stage_memory

    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    plan = many_microbatches
    assert plan.partition.costs.microbatches > ZOOM_ABOVE
    c = plan.partition.costs
    # with and without a memory reserve (its legend entry is the longest); the figures get a
    # real canvas, so that draw() lays them out before the extents are read
    for reserved in (0.0, 2**30):
        with figure(11, figure_height(plan.run)) as fig:
            FigureCanvasAgg(fig)
            pipeline_figure(fig, plan.run, c.shape.size, c.device_memory - reserved, "t", breakdown(plan),
                            stage_memory(plan.partition, plan.run.peak_memory), reserved)
            fig.canvas.draw()
            legends = _legends(fig)
            assert len(legends) == 4     # the chart's kinds, memory, time per stage, breakdown
            for leg in legends:
                ext = leg.get_window_extent()
                # inside the figure, and a legend drawn in an axes inside that axes
                box = leg.axes.get_window_extent() if isinstance(leg.parent, Axes) else fig.bbox
                assert box.x0 - 1 <= ext.x0 and ext.x1 <= box.x1 + 1 and box.y0 - 1 <= ext.y0 \
                    and ext.y1 <= box.y1 + 1, [t.get_text() for t in leg.get_texts()]
        # the warm-up and cool-down are drawn at full resolution; memory is split
        gids = {a.get_gid() for a in fig.findobj() if a.get_gid()}
        assert any(g.startswith("zoom-stage-0-forward") for g in gids)
        assert {f"memory-{part}-stage-0" for part in ("weights", "gradients", "optimizer", "activations")} <= gids
    with figure(9, 3) as fig:
        FigureCanvasAgg(fig)
        _stage_map(fig, plan)
        fig.canvas.draw()
        for leg in _legends(fig):
            ext = leg.get_window_extent()
            assert fig.bbox.y0 - 1 <= ext.y0 and ext.x1 <= fig.bbox.x1 + 1
        # the two coordinate maps have colour bars
        assert sum(1 for ax in fig.axes if ax.get_label() == "<colorbar>") == 2


@pytest.mark.parametrize("config, top", [((2, 2, 2, 8), {"data": 1, "tensor": 1}),
                                         ((16, 2, 1, 1), {"data": 15, "tensor": 1})])
def test_coordinate_colour_bars_tick_integers_only(config, top):
    """The data and tensor coordinates are integers, but their colour bars ticked -0.5, 0.5,
    1.5 (and 0.25 steps for two values); now whole coordinates only, the first and the last
    always, at most 8 ticks when there are many (16 data coordinates on 2 hosts of 16)."""
    from solver_planner.plan import make_plan
    from solver_planner.report.html import _stage_map
    from solver_planner.report.style import figure
    from solver_planner.spec import load_model_spec
    from solver_planner.stages.report import Config
    from solver_planner.topology import load_topology

    cluster = "aws-p3.8xlarge-2.yaml" if config[0] == 2 else "p2-a100-2x16.yaml"
    plan = make_plan(load_topology(CLUSTERS / cluster), load_model_spec(MODELS / "gpt-tiny.yaml"), "1f1b",
                     config=Config(*config))
    with figure(9, 3) as fig:
        _stage_map(fig, plan)
        fig.canvas.draw()
        bars = {ax.get_ylabel().split()[0]: ax for ax in fig.axes if ax.get_label() == "<colorbar>"}
        assert set(bars) == {"data", "tensor"}
        for name, ax in bars.items():
            lo, hi = ax.get_ylim()
            ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
            labels = [t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
            assert all(float(t).is_integer() for t in ticks), (name, ticks)
            assert ticks[0] == 0 and ticks[-1] == top[name] and len(ticks) <= 8, (name, ticks)
            assert labels == [str(int(t)) for t in ticks], (name, labels)


def test_report_has_a_rank_table_and_link_utilisation(many_microbatches):
    from solver_planner.plan.planfile import plan_document
    from solver_planner.report.html import link_utilisation, plan_report

    plan = many_microbatches
    page = plan_report(plan, plan_document(plan))
    ranks = plan.topology.num_devices
    table = page[page.index("rank &rarr; (stage, data, tensor)"):]
    table = table[:table.index("</details>")]
    assert table.count("<tr>") == ranks + 1
    rows = link_utilisation(plan)
    assert rows and all(0 <= r["mean"] <= r["busiest"] <= 1 + 1e-9 for r in rows)
    for r in rows:
        assert f"<td>{r['interconnect']}</td>" in page
    assert "white-space: pre-wrap" in page      # the reproduce commands wrap


def test_a_target_plan_s_report_shows_the_framework_s_configuration(tmp_path):
    """The report of a --target torchtitan plan carries what torchtitan is launched with (the
    plan file's recorded export), and a ZeRO-3 stage's reduce-scatter, not an all-reduce by
    design, is not coloured as a warning."""
    import yaml

    from conftest import llama_training

    model = llama_training(tmp_path, recompute="selective-op", optimizer_sharding="zero-3")
    plan, report = tmp_path / "p.yaml", tmp_path / "r.html"
    r = run_cli("plan", CLUSTERS / "dgx-h100-4x8.yaml", model, "--target", "torchtitan", "-o", plan, "--report", report)
    assert r.returncode == 0, r.stderr
    page = report.read_text()
    export = yaml.safe_load(plan.read_text())["target"]["export"]
    assert "<h2>torchtitan configuration</h2><pre>" + export.split("\n")[0] in page
    assert '<span class="plain">not an all-reduce</span>' in page and '<span class="bad">not an all' not in page
