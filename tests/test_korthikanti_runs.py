"""benchmarks/korthikanti_runs.py: Korthikanti et al. 2022's end-to-end GPT iterations (Table 5),
predicted with each configuration fixed.  The data file is checked against the model FLOPs
utilization Megatron-LM's README prints for the same runs, the split against the layers,
and the README's rows against what the benchmark prints."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import ROOT, fidelity_figures, fidelity_row, printed_summary
from solver_planner.spec.counts import transformer_counts

sys.path.insert(0, str(ROOT / "benchmarks"))
import korthikanti_runs as runs  # noqa: E402

README = (ROOT / "README.md").read_text()
# Megatron-LM's README: "Model FLOPs Utilization" of the 22B, 175B, 530B and 1T runs of the paper
PUBLISHED_MFU = {22: 0.415, 175: 0.514, 530: 0.560, 1000: 0.563}


def test_the_data_file_gives_the_published_utilization_and_parameter_counts():
    rows = runs.load_runs()
    assert len(rows) == 8 and {r.mode for r in rows} == {"full", "present"}
    for r in rows:
        mfu = r.model_flops / (r.seconds * r.gpus * 312e12)
        if r.mode == "present":
            assert mfu == pytest.approx(PUBLISHED_MFU[int(r.parameters)], abs=0.0015), r
        billions = transformer_counts(runs.model(r).transformer, tied=True).parameters / 1e9
        assert billions == pytest.approx(r.parameters, rel=0.04), r


def test_the_split_holds_every_block_and_the_end_layers():
    for r in runs.load_runs():
        per = runs.split(r)
        assert len(per) == r.pipeline and sum(per) == r.layers + 2 and max(per) - min(per) <= 2


def test_the_readme_and_the_fidelity_row_are_what_the_benchmark_prints(capsys):
    assert runs.main([]) == 0
    out = capsys.readouterr().out
    pairs, median, worst, rho, _, ratio = fidelity_row(r"Korthikanti et al\. 2022 Table 5")
    assert (pairs, median, worst, rho, ratio) == printed_summary(out)
    # every run's error the README quotes is a line of the printed table
    quoted = re.findall(r"([+-]\d+\.\d%) \((\d+B|1T) (full|selective)", README)
    assert len(quoted) == 8
    for error, size, mode in quoted:
        size = "1000B" if size == "1T" else size
        line = next(x for x in out.splitlines() if x.strip().startswith(size)
                    and (("full" in x and "selective" not in x) if mode == "full" else "selective" in x))
        assert line.rstrip().endswith(error), (line, error)


def test_the_fidelity_table_row_is_what_fidelity_prints():
    # `python benchmarks/fidelity.py --skip-local`'s row, as the README quotes it
    import fidelity

    (got,) = fidelity.korthikanti(lambda _: None)
    assert fidelity_figures(got) == fidelity_row(r"Korthikanti et al\. 2022 Table 5")
