"""The README's compute-model figures are what the command next to them prints."""

import math
import re

import pytest

from solver_planner import api, units

from conftest import ROOT

README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## The compute model"):README.index("## The simulator")]
COLUMNS = [("dgx-v100-16", "peak"), ("dgx-v100-16", "roofline"), ("dgx-v100-16", "efficiency"),
           ("dgx2-datasheet", "efficiency")]


def table_rows():
    rows = re.findall(r"^\| pure \w+ ([\d,]+) \| (.*) \|$", SECTION, re.M)
    assert len(rows) == 3
    return [(config, [cell.strip() for cell in cells.split("|")][:len(COLUMNS)]) for config, cells in rows]


@pytest.mark.parametrize("config, cells", table_rows())
def test_the_compute_model_table_is_what_stages_prints(config, cells):
    # `solver-planner stages CLUSTER specs/models/mlp-1b.yaml --config D,T,P,K -s 1f1b --compute MODEL`
    for (cluster, compute), cell in zip(COLUMNS, cells):
        rep = api.stages(ROOT / "specs" / "clusters" / f"{cluster}.yaml", ROOT / "specs" / "models" / "mlp-1b.yaml",
                         schedule="1f1b", config=config, compute=compute)
        assert rep.compute == compute
        assert units.format_time(rep.run.iteration_time) == cell, (config, cluster, compute)


def test_the_gpt3_39b_walk_through_is_what_plan_prints():
    # `solver-planner plan specs/clusters/dgx-a100-8x8.yaml specs/models/gpt3-39b.yaml -s 1f1b -o plan.yaml`
    text = README[README.index("**A walk through one plan.**"):README.index("### From a plan to a running job")]
    seconds, samples, mfu, bubble = re.search(
        r"simulates at ([\d.]+) s \(([\d.]+) samples/s, MFU ([\d.]+)%, bubble ([\d.]+)%", text).groups()
    plan = api.plan(ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml", ROOT / "specs" / "models" / "gpt3-39b.yaml",
                    schedule="1f1b")
    assert f"{plan.iteration_time:.1f}" == seconds and f"{plan.throughput:.1f}" == samples
    assert f"{plan.mfu * 100:.1f}" == mfu and f"{plan.run.bubble_ratio * 100:.1f}" == bubble
    # the rest of the paragraph, read off the plan file's data
    from solver_planner.plan.planfile import plan_document

    doc = plan_document(plan)
    count, hosts, per_host, micro, size = re.search(
        r"(\d+) stages of two nodes each \((\d)x(\d)\s+meshes\), (\d+) micro-batches of (\d+)", text).groups()
    assert (len(doc["stages"]), doc["mesh"], doc["microbatches"], doc["microbatch_size"]) == (
        int(count), [int(hosts), int(per_host)], int(micro), int(size))
    assert all((st["data"], st["tensor"], st["matrix"]) == (4, 4, [[2, 2], [1, 4]]) for st in doc["stages"])
    program = re.search(r"each gradient program `([^`]+)`", text.replace("\n", " ")).group(1)
    assert all(st["gradient_program"] == program for st in doc["stages"])
    shape, tasks, ms = re.search(r"moves a `(\[[\d, ]+\])` float16 activation .*? as (\d+) unit tasks.*?\(([\d.]+) ms per",
                                 text, re.S).groups()
    for b in doc["boundaries"]:
        assert (str(b["tensor"]["shape"]), b["unit_tasks"], b["status"]) == (shape, int(tasks), "OPTIMAL")
        assert f"{b['time'] * 1e3:.2f}" == ms
    total, hidden = re.search(r"the transfers \(([\d.]+) s per iteration\) are ([\d.]+)% hidden", text).groups()
    cm = doc["communication_hidden"]
    assert (f"{cm['cross_mesh_total']:.2f}", f"{100 * cm['hidden_fraction']:.1f}") == (total, hidden)
    rank = doc["launch"]["ranks"][25]
    assert (rank["stage"], rank["chunks"], rank["data"], rank["tensor"]) == (1, [[13, 24]], 2, 1)


def test_distir_table_2_pure_strategy_winners_and_best_configurations_on_both_specs():
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import distir_grid as grid

    from solver_planner.spec import load_cluster_spec
    from solver_planner.spec.model import load_model_spec
    from solver_planner.topology import Topology

    spec = load_model_spec(grid.MODELS["mlp-1b"])
    table = [r for r in grid.load_table() if r.model == "mlp-1b"]
    for cluster in ("dgx-v100-16.yaml", "dgx2-datasheet.yaml"):
        topo = Topology(load_cluster_spec(ROOT / "specs" / "clusters" / cluster))
        rows = [grid.run_row(topo, spec, row, "efficiency") for row in table]
        agree = grid.agreement(rows)
        # every pure-strategy winner but batch 8 192's (the README says why)
        assert (agree["same_pure_winner"], agree["winner_rows"]) == (11, 12), cluster
        # the best configuration: 8 and 9 of 12 rows (the issue asks for 80%; not reached)
        assert agree["same_best"] == {"dgx-v100-16.yaml": 8, "dgx2-datasheet.yaml": 9}[cluster], cluster
        if cluster == "dgx-v100-16.yaml":
            _misses_are_the_volume_ties(grid, rows, spec)
            # and MLP 17B's fifth tie: 2/8 against the paper's 4/4 at 2hD/T = 8 192 (h = 16 384)
            big = next(r for r in grid.load_table() if r.model == "mlp-17b" and r.batch == 8192)
            spec17 = load_model_spec(grid.MODELS["mlp-17b"])
            row = grid.run_row(topo, spec17, big, "efficiency")
            assert (row.best.config, big.best) == (grid.Config(2, 8, 1, 1), grid.Config(4, 4, 1, 1))
            assert big.batch == 2 * math.isqrt(int(spec17.layers[0].params) // 2) * 2 // 8


def _misses_are_the_volume_ties(grid, rows, spec):
    """The README's DistIR item: the misses between (D, T) and (2D, T/2) sit at the batch
    2hD/T where both move the same bytes, and at 4 096 and 16 384 the SGD step's difference
    (three passes over the P/T bytes a device holds, at 900 GB/s) is about all the time between
    them."""
    h = math.isqrt(int(spec.layers[0].params) // 2)          # fp16 square weights of width h
    assert h == 8192
    ties = {}
    for row in rows:
        ours, paper = row.best.config, row.paper.best
        if ours == paper:
            continue
        if ours.pipeline == paper.pipeline == 1 and {ours.data / paper.data, paper.data / ours.data} >= {2.0}:
            wide = min((ours, paper), key=lambda c: c.data)    # the more tensor-parallel one
            assert row.paper.batch == 2 * h * wide.data // wide.tensor, row.paper.batch
            ties[row.paper.batch] = (row.outcome(wide).time, row.outcome(grid.Config(2 * wide.data, wide.tensor // 2,
                                                                                       1, 1)).time, wide.tensor)
    assert sorted(ties) == [1024, 4096, 16384, 65536]
    readme = {4096: ("0.89", "0.68"), 16384: ("1.79", "1.84")}
    params = sum(int(layer.params) for layer in spec.layers)
    for batch, (sgd, between) in readme.items():
        wide, narrow, t = ties[batch]
        step = 3 * params / (t // 2) / 900e9 - 3 * params / t / 900e9
        assert (f"{step * 1e3:.2f}", f"{(narrow - wide) * 1e3:.2f}") == (sgd, between), batch
    text = " ".join(README.split())
    assert "(0.89 ms at batch 4 096, 1.79 ms at 16 384;" in text and "(0.68 ms and 1.84 ms, from `--json`)" in text


def test_the_unequal_mesh_example_is_what_stages_prints():
    # `solver-planner stages specs/clusters/aws-p3.8xlarge-2.yaml specs/models/gpt3-2.6b.yaml --meshes unequal`
    from solver_planner.units import format_meshes as meshes_text

    text = README[README.index("**Unequal sub-meshes**"):README.index("**Plans on part of a cluster**")]
    head = re.search(r"gpt3-2.6b on aws-p3.8xlarge-2: (\d+) stages of (.*) meshes, (\d+) micro-batches", text).groups()
    iteration, objective = re.search(r"iteration ([\d.]+ s) .* objective ([\d.]+ s)", text).groups()
    status, bound, gap = re.search(r"(\w+) \(dp, bound ([\d.]+ s), gap ([\d.]+)%", text).groups()
    equal = re.search(r"takes\n?\s*([\d.]+) s, so unequal meshes gain ([\d.]+)%", text).groups()
    clusters, models = ROOT / "specs" / "clusters", ROOT / "specs" / "models"
    rep = api.stages(clusters / "aws-p3.8xlarge-2.yaml", models / "gpt3-2.6b.yaml", meshes="unequal", baselines=False)
    doc = rep.as_dict()
    assert (str(len(doc["stages"])), meshes_text(doc["mesh"]), str(doc["config"]["microbatches"])) == head
    assert units.format_time(doc["iteration_time"]) == iteration and units.format_time(doc["objective"]) == objective
    assert doc["status"] == status and units.format_time(doc["bound"]) == bound and f"{100 * doc['gap']:.2f}" == gap
    same = api.stages(clusters / "aws-p3.8xlarge-2.yaml", models / "gpt3-2.6b.yaml", baselines=False)
    assert f"{same.run.iteration_time:.1f}" == equal[0]
    assert f"{100 * (1 - doc['iteration_time'] / same.run.iteration_time):.1f}" == equal[1]


def test_the_megatron_row_of_the_fidelity_table_is_what_published_runs_prints():
    # `python benchmarks/published_runs.py` (and `benchmarks/fidelity.py`'s first row)
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import published_runs as runs

    import fidelity

    row = re.search(r"^  \| Megatron-LM Table 1, TFLOP/s per GPU .*?\| 10 \| ([\d.]+)% \| ([\d.]+)% \| ([\d.]+) \|"
                    r" (\d+)% \| ([\d.]+) \|", README, re.M)
    assert row is not None
    loaded = runs.load_runs()
    # the published configurations (Megatron-LM's examples/sc21/run_table_1.sh), not defaults
    assert [r.micro_batch for r in loaded] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    assert [r.virtual for r in loaded] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    assert [r.overlap for r in loaded] == [True] * 4 + [False] * 6
    predicted = [runs.predict(r) for r in loaded]
    summary = runs.summary(predicted)
    assert (f"{summary['median_error'] * 100:.1f}", f"{summary['worst_error'] * 100:.1f}",
            f"{summary['spearman']:.3f}") == row.groups()[:3]
    # the rest of the row, as benchmarks/fidelity.py computes it from the same predictions
    full = fidelity.summary("Megatron-LM Table 1", [r["predicted_tflops"] for r in predicted],
                            [r["measured_tflops"] for r in predicted])
    assert (f"{full['pairwise'] * 100:.0f}", f"{full['median_measured_over_predicted']:.2f}") == row.groups()[3:]


def test_the_stages_transcript_is_what_stages_prints():
    # `solver-planner stages specs/clusters/dgx-a100-8x8.yaml specs/models/gpt3-39b.yaml`: every
    # line the README shows (rows elided with '...'), box-drawing characters and runs of
    # spaces aside; the solve's wall time is a measurement, so it is masked on both sides
    from conftest import run_cli

    cmd = "$ solver-planner stages specs/clusters/dgx-a100-8x8.yaml specs/models/gpt3-39b.yaml\n"
    start = README.index(cmd) + len(cmd)
    shown = README[start:README.index("```", start)].splitlines()
    res = run_cli("stages", "specs/clusters/dgx-a100-8x8.yaml", "specs/models/gpt3-39b.yaml", env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr

    def norm(line: str) -> str:
        line = re.sub(r"[\u2500-\u257f]", " ", line)
        line = re.sub(r"gap ([\d.]+)%, [\d.]+ m?s;", r"gap \1%, <wall>;", line)
        return " ".join(line.split())

    printed = {norm(line) for line in res.stdout.splitlines()}
    lines = [norm(line) for line in shown if line.strip() and line.strip() != "..."]
    assert len(lines) >= 9
    for line in lines:
        assert line in printed, line


@pytest.mark.parametrize("compute", ["efficiency", "peak"])
def test_the_candidates_example_is_what_plan_prints(compute):
    # `solver-planner plan specs/clusters/dgx-h100-4x8.yaml specs/models/mlp16.yaml --candidates 3`
    found = re.search(r"`--candidates 3` finds a plan at\n?\s*([\d.]+) ms where the first choice composes to ([\d.]+) ms"
                      r" with the efficiency compute model;\n?\s*(\d+) us against (\d+) us at peak rate", README)
    assert found is not None
    want = found.groups()[:2] if compute == "efficiency" else found.groups()[2:]
    cluster, model = ROOT / "specs" / "clusters" / "dgx-h100-4x8.yaml", ROOT / "specs" / "models" / "mlp16.yaml"
    times = [api.plan(cluster, model, candidates=n, compute=compute).iteration_time for n in (3, 1)]
    got = tuple(f"{t * 1e3:.4f}" for t in times) if compute == "efficiency" else tuple(f"{t * 1e6:.0f}" for t in times)
    assert got == want


def test_the_check_failure_transcript_is_what_check_prints(tmp_path):
    # the README's two edits of the main job's plan file, then `solver-planner check`
    import yaml
    from typer.testing import CliRunner

    from solver_planner.cli import app

    block = README[README.index("tensor coordinate set to 1 and the first boundary's first task"):]
    want = [line for line in block[block.index("```") + 4:block.index("```", block.index("```") + 3)].splitlines()
            if line.strip()]
    cluster, model = ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml", ROOT / "specs" / "models" / "gpt3-2.6b.yaml"
    path = tmp_path / "plan.yaml"
    api.plan(cluster, model, output=path)
    doc = yaml.safe_load(path.read_text())
    doc["launch"]["ranks"][3]["tensor"] = 1
    task = doc["boundaries"][0]["schedule"][0]
    task["start"], task["end"] = task["start"] + 1000, task["end"] + 1000
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = CliRunner().invoke(app, ["check", str(cluster), str(model), str(path)])
    assert res.exit_code == 1
    got = [line for line in res.output.splitlines() if line.strip().startswith(("FAIL", "skipped"))]
    assert got == want


def test_the_eager_1f1b_line_is_what_stages_prints():
    # `solver-planner stages specs/clusters/aws-p3.8xlarge-2.yaml specs/models/gpt3-2.6b.yaml -s eager-1f1b`
    seconds, speedup = re.search(r"`best 1F1B plan ([\d.]+) s \(OPTIMAL\): eager-1F1B is ([\d.]+)x faster`",
                                 README).groups()
    doc = api.stages(ROOT / "specs" / "clusters" / "aws-p3.8xlarge-2.yaml", ROOT / "specs" / "models" / "gpt3-2.6b.yaml",
                     schedule="eager-1f1b", baselines=True).as_dict()       # the command's default
    assert doc["best_1f1b"]["status"] == "OPTIMAL"
    assert (f"{doc['best_1f1b']['iteration_time']:.1f}", f"{doc['eager_speedup']:.3f}") == (seconds, speedup)


def test_the_deep_model_block_count_is_the_searchs():
    from solver_planner.stages.coarse import UNITS

    assert f"start on {UNITS} block boundaries only" in README


def test_the_cost_transcript_is_what_cost_prints():
    # `solver-planner cost specs/clusters/p2-a100-2x16.yaml --across node --bytes 1GiB --algorithm ring`
    import json

    from typer.testing import CliRunner

    from solver_planner.cli import app

    line = next(x for x in README.splitlines() if x.startswith("$ solver-planner cost "))
    block = README[README.index(line):].split("```")[0].splitlines()
    groups, size = re.search(r"(\d+) group\(s\) of (\d+)", block[1]).groups()
    row = block[3].split()
    res = CliRunner().invoke(app, line[2:].split()[1:] + ["--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["results"][0]
    assert (str(got["groups"]), str(got["group_size"])) == (groups, size)
    assert row == [got["collective"], got["algorithm"], units.format_time(got["time"]).split()[0], "s",
                   units.format_time(got["latency_term"]).split()[0], "us",
                   units.format_time(got["bandwidth_term"]).split()[0], "s",
                   units.format_bandwidth(got["bus_bandwidth"]).split()[0], "MB/s", got["bottleneck"]]
