"""Measured layer times (Korthikanti et al. 2022, Table 4) and the matrix-multiply efficiency
fitted to them: the A100 presets carry the fit, the fit is a least-squares minimum, it
recovers an efficiency that generated the timings, and bad tables are refused with their line."""

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.errors import SpecError
from solver_planner.spec import load_cluster_spec
from solver_planner.spec.presets import presets
from solver_planner.stages import layer_timings as lt
from solver_planner.topology import Topology

from conftest import ROOT, run_cli

TABLE = ROOT / "benchmarks" / "data" / "layer_times_a100.csv"
DGX_A100 = ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"
HEADER = "hidden,heads,sequence,micro_batch,tensor,recompute,sequence_parallel,forward_ms,backward_ms,row\n"


@pytest.fixture(scope="module")
def a100():
    return Topology(load_cluster_spec(DGX_A100))


@pytest.fixture(scope="module")
def fitted(a100):
    return lt.fit_matmul_efficiency(a100, lt.load_layer_timings(TABLE))


def test_the_table_is_read_as_published():
    rows = lt.load_layer_timings(TABLE)
    assert [(r.recompute, r.sequence_parallel, round(r.forward * 1e3, 6), round(r.backward * 1e3, 6))
            for r in rows] == [("none", False, 7.7, 11.9), ("none", True, 7.2, 11.8), ("full", False, 7.7, 19.5),
                               ("selective", False, 7.7, 13.2), ("selective", True, 7.2, 13.1)]
    assert {(r.hidden, r.heads, r.sequence, r.micro_batch, r.tensor) for r in rows} == {(6144, 64, 2048, 4, 8)}
    assert rows[0].name == "Baseline no recompute" and rows[0].where.endswith("layer_times_a100.csv:14")
    assert {(r.attention, r.dtype) for r in rows} == {("materialized", "float16")}


def test_the_a100_presets_carry_the_fit(fitted):
    # the number in solver_planner/data/devices.yaml is what the shipped command prints
    p = presets()
    assert p["A100-SXM4-80GB"]["compute"]["matmul_efficiency"] == fitted.efficiency
    assert p["A100-SXM4-40GB"]["compute"]["matmul_efficiency"] == fitted.efficiency
    assert p["A100-PCIe-80GB"]["compute"]["matmul_efficiency"] == round(fitted.efficiency * 256.4 / 267.9, 3)


def test_the_fit_is_a_least_squares_minimum_and_follows_the_table(a100, fitted):
    rows = lt.load_layer_timings(TABLE)
    best = lt._loss(a100, rows, fitted.efficiency)
    for step in (0.002, 0.01, 0.05):
        assert best <= lt._loss(a100, rows, fitted.efficiency - step)
        assert best <= lt._loss(a100, rows, fitted.efficiency + step)
    errors = [abs(e) for e in fitted.errors()]
    assert max(errors) < 0.08 and sorted(errors)[len(errors) // 2] < 0.04
    # recomputation costs what the table says it costs: full re-runs the layer, selective little
    full = next(a for r, _, a in fitted.rows if r.recompute == "full")
    none = next(a for r, _, a in fitted.rows if r.recompute == "none" and not r.sequence_parallel)
    sel = next(a for r, _, a in fitted.rows if r.recompute == "selective" and not r.sequence_parallel)
    assert (full[1] - none[1]) / (19.5 - 11.9) * 1e3 == pytest.approx(1.0, abs=0.12)
    assert (sel[1] - none[1]) / (13.2 - 11.9) * 1e3 == pytest.approx(1.0, abs=0.3)


@settings(max_examples=8, deadline=None)
@given(efficiency=st.floats(0.3, 0.95), hidden=st.sampled_from([1024, 2048, 4096]),
       micro=st.sampled_from([1, 2, 4]), tensor=st.sampled_from([1, 2, 8]),
       recompute=st.sampled_from(["none", "full", "selective"]), attention=st.sampled_from(["flash", "materialized"]))
def test_the_fit_recovers_the_efficiency_that_made_the_timings(a100, efficiency, hidden, micro, tensor, recompute,
                                                               attention):
    rows = []
    for h, b in ((hidden, micro), (hidden * 2, micro * 2)):
        row = lt.LayerTiming(h, 16, 1024, b, tensor, recompute, False, 1.0, 1.0, attention)
        fwd, bwd = lt.predict_layer(a100, row, efficiency)
        rows.append(lt.LayerTiming(h, 16, 1024, b, tensor, recompute, False, fwd, bwd, attention))
    fit = lt.fit_matmul_efficiency(a100, rows)
    assert fit.efficiency == pytest.approx(efficiency, abs=0.002)
    assert max(abs(e) for e in fit.errors()) < 0.01


def test_a_pass_gets_faster_as_the_efficiency_rises(a100):
    row = lt.load_layer_timings(TABLE)[2]
    times = [lt.predict_layer(a100, row, e) for e in (0.4, 0.6, 0.8, 1.0)]
    assert all(a[0] > b[0] and a[1] > b[1] for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("text, line, words", [
    ("hidden,heads\n1,1\n", 1, "the header lacks sequence"),
    (HEADER + "6144,64,2048,4,8,none,false,seven,11.9,x\n", 2, "forward_ms 'seven' is not a number of milliseconds"),
    (HEADER + "6144.5,64,2048,4,8,none,false,7.7,11.9,x\n", 2, "hidden '6144.5' is not a whole number"),
    (HEADER + "6144,64,0,4,8,none,false,7.7,11.9,x\n", 2, "sequence '0' must be at least 1"),
    (HEADER + "6144,64,2049,4,8,none,true,7.7,11.9,x\n", 2, "sequence 2049 does not split over tensor 8"),
    (HEADER.replace(",row", ",hidden") + "6144,64,2048,4,8,none,false,7.7,11.9,6144\n", 1, "names hidden twice"),
    (HEADER + "6144,64,2048,4,8,sometimes,false,7.7,11.9,x\n", 2, "recompute 'sometimes'"),
    (HEADER + "6144,63,2048,4,8,none,false,7.7,11.9,x\n", 2, "not a multiple of heads"),
    (HEADER + "6144,64,2048,4,3,none,false,7.7,11.9,x\n", 2, "do not split over tensor 3"),
    (HEADER + "6144,64,2048,4,8,none,maybe,7.7,11.9,x\n", 2, "sequence_parallel 'maybe'"),
    (HEADER + "6144,64,2048,4,8,none,false,-7.7,11.9,x\n", 2, "forward_ms '-7.7' must be a positive number"),
    (HEADER + "6144,64,2048,4,8,none,false,7.7,nan,x\n", 2, "backward_ms 'nan' must be a positive number"),
    (HEADER + "6144,64,2048,4,8,none,false,7.7\n", 2, "values for 10 columns"),
    ("# only a comment\n" + HEADER, 2, "no layer timings after the header"),
    (HEADER.replace(",row", ",attention") + "6144,64,2048,4,8,none,false,7.7,11.9,fused\n", 2, "attention 'fused'"),
])
def test_a_bad_table_is_refused_with_its_line(tmp_path, text, line, words):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        lt.load_layer_timings(path)
    assert f"t.csv:{line}:" in str(err.value) and words in str(err.value)


def test_calibrate_from_layer_times_writes_a_spec_with_the_fit(tmp_path, fitted):
    out = tmp_path / "fitted.yaml"
    proc = run_cli("calibrate", "--from-layer-times", TABLE, "--cluster", DGX_A100, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "Baseline with recompute" in proc.stdout and f"-> {fitted.efficiency}" in proc.stdout
    spec = load_cluster_spec(out)
    assert spec.device.compute.matmul_efficiency == fitted.efficiency
    assert spec.device.memory_bandwidth == load_cluster_spec(DGX_A100).device.memory_bandwidth   # the preset's rest
    raw = yaml.safe_load(out.read_text())
    assert raw["device"] == {"preset": "A100-SXM4-80GB", "compute": {"matmul_efficiency": fitted.efficiency}}
    proc = run_cli("calibrate", "--from-layer-times", TABLE, "--cluster", DGX_A100, "--json")
    assert proc.returncode == 0 and '"matmul_efficiency": %s' % fitted.efficiency in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--from-layer-times", TABLE], "needs --cluster"),
    (["--from-layer-times", TABLE, "--cluster", DGX_A100, "--from-nccl-tests", "x.log"], "one at a time"),
    (["--from-layer-times", "nowhere.csv", "--cluster", DGX_A100], "cannot read the layer timings"),
    (["--from-layer-times", TABLE, "--cluster", ROOT / "specs" / "clusters" / "local-2x2.yaml"],
     "no compute block"),
])
def test_calibrate_from_layer_times_refuses_what_it_cannot_fit(args, words):
    proc = run_cli("calibrate", *args)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_the_fitted_presets_predict_megatron_lm_table_1_within_the_goal():
    # held out: nothing was fitted to these runs (benchmarks/published_runs.py)
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import published_runs as pr

    rows = [pr.predict(r) for r in pr.load_runs() if r.virtual == 1]
    errors = sorted(abs(r["error"]) for r in rows)
    assert math.isfinite(errors[-1]) and errors[len(errors) // 2] <= 0.10


def test_the_readme_figures_of_the_fit_are_what_it_gives(a100, fitted):
    import re
    import statistics

    text = (ROOT / "README.md").read_text()
    para = text[text.index("**GEMM efficiency from measured layers.**"):text.index("No layer of the other GPUs is measured")]
    rows = lt.load_layer_timings(TABLE)
    best_shape = [lt.predict_layer(a100, r, 0.86) for r in rows]
    before = [p / m - 1 for r, pr in zip(rows, best_shape) for m, p in zip((r.forward, r.backward), pr)]
    whole = [sum(pr) / (r.forward + r.backward) - 1 for r, pr in zip(rows, best_shape)]
    after = [abs(e) for e in fitted.errors()]
    full = next(a for r, _, a in fitted.rows if r.recompute == "full")
    none = next(a for r, _, a in fitted.rows if r.recompute == "none" and not r.sequence_parallel)
    expected = [f"{statistics.median(abs(e) for e in before) * 100:.1f}% fast",
                f"{max(abs(e) for e in whole) * 100:.1f}%\nat worst on a whole layer",
                f"It gives {fitted.efficiency}",
                f"within {statistics.median(after) * 100:.1f}%", f"(median; {max(after) * 100:.1f}% at worst",
                f"+{(full[1] - none[1]) * 1e3:.1f} ms predicted"]
    flat = re.sub(r"\s+", " ", para)
    for words in expected:
        assert re.sub(r"\s+", " ", words) in flat, words
    assert all(e < 0 for e in before[::2])          # every forward predicted fast with the best shape


def test_a_table_is_read_as_a_spreadsheet_writes_it(tmp_path):
    # a byte-order mark, indented comments, upper-case modes: the same rows
    path = tmp_path / "t.csv"
    path.write_text("\ufeff  # measured on our cluster\n" + HEADER.replace("recompute", "Recompute")
                    + "6144,64,2048,4,8,FULL,TRUE,7.7,19.5,x\n", encoding="utf-8")
    (row,) = lt.load_layer_timings(path)
    assert (row.recompute, row.sequence_parallel, row.hidden, row.where.endswith("t.csv:3")) == ("full", True, 6144, True)


@pytest.mark.parametrize("scale", [1e3, 1e-3])
def test_timings_no_efficiency_explains_are_refused(a100, scale):
    # microseconds read as milliseconds (or the other way round): the fit would stop at an
    # end of its range and write a spec that explains nothing
    rows = [lt.LayerTiming(6144, 64, 2048, 4, 8, "none", False, 7.7e-3 * scale, 11.9e-3 * scale, "materialized")]
    with pytest.raises(ValueError, match="slower than" if scale > 1 else "faster than"):
        lt.fit_matmul_efficiency(a100, rows)


def test_a_layer_no_model_spec_accepts_is_refused_with_its_line(a100):
    row = lt.LayerTiming(6144, 64, 20_480_000_000, 4, 8, "none", False, 1.0, 1.0, where="t.csv:7")
    with pytest.raises(ValueError, match=r"^t.csv:7: this layer is not one a model spec accepts \(.*sequence"):
        lt.predict_layer(a100, row)


def test_calibrate_refuses_a_table_in_the_wrong_unit(tmp_path):
    path = tmp_path / "us.csv"
    path.write_text(HEADER + "6144,64,2048,4,8,none,false,7700,11900,microseconds\n")
    proc = run_cli("calibrate", "--from-layer-times", path, "--cluster", DGX_A100)
    assert proc.returncode == 2 and "are the times in milliseconds" in proc.stderr, proc.stderr


def test_the_fidelity_tables_layer_row_is_what_fidelity_prints():
    # `python benchmarks/fidelity.py --skip-local`'s second row, as the README quotes it
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fidelity

    from conftest import fidelity_figures, fidelity_row

    (got,) = fidelity.layer_times(lambda _: None)
    assert fidelity_figures(got) == fidelity_row(r"Korthikanti et al\. 2022 Table 4, one layer's forward and backward")


def test_a_predicted_layer_is_what_the_simulator_gives_one_more_layer(a100):
    # independent of predict_layer's reading of the stage tables: a whole stage simulated by
    # `stages` (one micro-batch), with one block more, takes exactly the predicted passes more
    from solver_planner import api
    from solver_planner.subcluster import first_devices

    host = first_devices(a100, a100.devices_per_host)
    for row in lt.load_layer_timings(TABLE):
        passes = []
        for blocks in (1, 2):
            spec = lt._layer_spec(row, host.devices_per_host)
            spec = spec.model_copy(update={"transformer": spec.transformer.model_copy(update={"layers": blocks})})
            records = api.stages(host, spec, config=f"1,{row.tensor},1,1").run.timeline.records
            passes.append([sum(r.end - r.start for r in records if r.name.startswith(f"{kind}0 mb0"))
                           for kind in "FB"])
        got = (passes[1][0] - passes[0][0], passes[1][1] - passes[0][1])
        assert got == pytest.approx(lt.predict_layer(a100, row), rel=1e-9), row.label()
