"""benchmarks/torchtitan_runs.py: torchtitan's published Llama runs on 64 A100s, predicted
with each configuration fixed.  The model shapes are checked against the parameter counts
Meta publishes, and the README's fidelity row against what the benchmark prints."""

from __future__ import annotations

import re
import statistics
import sys

import pytest

from conftest import ROOT
from solver_planner.spec.counts import transformer_counts

sys.path.insert(0, str(ROOT / "benchmarks"))
import torchtitan_runs as runs  # noqa: E402

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name, billions", [("llama2-13b", 13.0), ("llama2-70b", 69.0), ("llama3-8b", 8.03),
                                            ("llama3-70b", 70.6)])
def test_the_shapes_have_the_published_parameter_counts(name, billions):
    run = next(r for r in runs.load_runs() if r.model == name)
    counts = transformer_counts(runs.model(run, "none").transformer, tied=False)
    assert counts.parameters / 1e9 == pytest.approx(billions, rel=0.01)


def test_the_data_file_is_the_published_table():
    rows = runs.load_runs()
    assert len(rows) == 8 and {r.checkpointing for r in rows} == {"no", "full", "selective layer", "selective op"}
    # torchtitan's MFU counts 6 N + 12 l h s FLOPs per token (N: every parameter): it and the
    # tokens per second it prints must agree with the A100's 312 TFLOP/s
    for r in rows:
        layers, hidden, *_, seq = runs.SHAPES[r.model]
        n = transformer_counts(runs.model(r, "none").transformer, tied=False).parameters
        flops = 6 * n + 12 * layers * hidden * seq
        assert r.wps * flops / 312e12 == pytest.approx(r.mfu, abs=0.006), r


def test_the_readme_row_is_what_the_benchmark_prints():
    topo = runs.cluster()
    rows = [runs.predict(r, topo) for r in runs.load_runs()]
    summ = runs.summary(rows)
    row = re.search(r"^  \| torchtitan, Llama with FSDP2 on 64 A100s.*?\| (\d) \| ([\d.]+)% \| ([\d.]+)% \|"
                    r" ([\d.]+) \| \d+% \| ([\d.]+) \|", README, re.M)
    assert row is not None
    exact = [r for r in rows if r["exact"]]
    ratio = statistics.median(r["measured_wps"] / r["predicted_wps"] for r in exact)
    assert (str(summ["exact_rows"]), f"{100 * summ['median_error']:.1f}", f"{100 * summ['worst_error']:.1f}",
            f"{summ['spearman']:.3f}", f"{ratio:.2f}") == row.groups()
    ranged = re.search(r"counterpart here: (\d) of (\d) such rows measured between", README)
    assert ranged is not None and (str(summ["measured_within_range"]), str(summ["ranged_rows"])) == ranged.groups()


def test_the_printed_table_says_what_the_readme_says(capsys):
    # `python benchmarks/torchtitan_runs.py`, as the README runs it: the exact rows' errors
    assert runs.main([]) == 0
    out = capsys.readouterr().out
    figures = re.findall(r"([+-][\d.]+%)\s+\(Llama [23] \d+B[,)]", README)
    assert len(figures) == 6
    for figure in figures:
        assert f" {figure}\n" in out, figure
    assert "rows priced exactly: 6" in out and "2 of 2" in out
