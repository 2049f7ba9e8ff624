"""benchmarks/megatron_core_runs.py: Megatron-Core's published GPT weak scaling on H100s,
predicted with each configuration fixed.  The data file is checked against its own MFU
column and the model table's parameter counts, and the README's figures against what the
benchmark prints."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import ROOT, fidelity_figures, fidelity_row, printed_summary
from solver_planner.spec.counts import transformer_counts

sys.path.insert(0, str(ROOT / "benchmarks"))
import megatron_core_runs as runs  # noqa: E402

README = (ROOT / "README.md").read_text()


def test_the_data_file_is_the_published_table():
    rows = runs.load_runs()
    assert len(rows) == 9 and [r.gpus for r in rows] == [48, 96, 192, 384, 768, 1536, 2304, 3072, 6144]
    for r in rows:
        # a transcription slip in the teraFLOP/s or the sizes shows in the table's own MFU column
        assert round(100 * r.tflops_per_gpu * 1e12 / runs.PEAK) == r.mfu, r
        assert r.tensor * r.pipeline * r.data == r.gpus and r.hidden % r.heads == 0
        counts = transformer_counts(runs.model(r).transformer, tied=False)
        assert counts.parameters / 1e9 == pytest.approx(r.parameters, rel=0.035), r   # 1.7B: 1.754 with positions


def test_each_run_is_priced_with_the_settings_the_readme_lists():
    for r in runs.load_runs():
        tr = runs.model(r).training
        assert tr.sequence_parallel == tr.tensor_overlap == (r.tensor > 1)
        assert (tr.optimizer_sharding, tr.gradient_accumulation, tr.gradient_reduce_dtype) == \
            ("distributed", "fused", "float32")
        # Megatron-Core's buckets come from the target (tests/test_megatron_buckets.py) unless set
        assert "gradient_bucket" not in tr.model_fields_set
        assert runs.model(r, megatron_buckets=False).training.gradient_bucket == 25 * 2**20
        per = runs.split(r)
        assert len(per) == r.pipeline and sum(per) == r.layers + 2
    assert not runs.model(runs.load_runs()[3], overlap=False).training.tensor_overlap


def test_the_readme_and_the_fidelity_row_are_what_the_benchmark_prints(capsys):
    assert runs.main([]) == 0
    out = capsys.readouterr().out
    pairs, median, worst, rho, _, ratio = fidelity_row(r"Megatron-Core r0\.8\.0")
    assert (pairs, median, worst, rho, ratio) == printed_summary(out)
    assert f"a median of {median}%, worst {worst}%, and Spearman {float(rho):.2f}" in " ".join(README.split())
    # every run's error the README quotes is a line of the printed table
    quoted = re.findall(r"([+-]\d+\.\d%)\s+\((\d+(?:\.\d)?)B\s+on\s+(\d+)\)", README)
    assert len(quoted) == 9
    for error, size, gpus in quoted:
        line = next(x for x in out.splitlines() if x.split()[:2] == [f"{size}B", gpus])
        assert line.rstrip().endswith(error), (line, error)
    # and the same runs without the tensor-parallel overlap
    assert runs.main(["--no-overlap"]) == 0
    plain = re.search(r"median \|error\| ([\d.]+)%, worst ([\d.]+)%", capsys.readouterr().out).groups()
    assert f"without it, a median of {plain[0]}% (worst {plain[1]}%)" in " ".join(README.split())
    # and with PyTorch DDP's buckets: the slowest reading
    assert runs.main(["--ddp-buckets"]) == 0
    errors = [float(x) for x in re.findall(r" ([+-]\d+\.\d)%$", capsys.readouterr().out, flags=re.M)]
    assert len(errors) == 9 and f"up to {-min(errors):.1f}% too slow" in " ".join(README.split())


def test_the_fidelity_table_row_is_what_fidelity_prints():
    import fidelity

    (got,) = fidelity.megatron_core(lambda _: None)
    assert fidelity_figures(got) == fidelity_row(r"Megatron-Core r0\.8\.0")
