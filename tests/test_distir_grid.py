"""DistIR Table 2's benchmark (benchmarks/distir_grid.py): its specs, grid, data and a quick run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from solver_planner import api
from solver_planner.stages.report import Config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import distir_grid  # noqa: E402

# DistIR Table 1: layers, width, model size in GB (fp16)
TABLE1 = {"mlp-1b": (16, 8192, 2.2), "mlp-17b": (64, 16384, 34.4), "mlp-103b": (96, 32768, 206.2)}


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_mlp_specs_load_and_match_table1(name):
    topo, spec = api.load(distir_grid.CLUSTER, distir_grid.MODELS[name])
    layers, width, gb = TABLE1[name]
    assert topo.num_devices == 16 and topo.devices_per_host == 16    # one host: T may span all 16
    assert topo.device.memory == 32 * 2**30 and topo.device.compute is not None
    assert len(spec.layers) == layers and all(x.repeat == 1 for x in spec.layers)
    # Table 1 rounds up: 2.147, 34.36 and 206.16 GB print as 2.2, 34.4 and 206.2
    assert math.ceil(sum(x.params for x in spec.layers) / 1e8) / 10 == gb
    assert all(x.flops == 2 * width**2 and x.params == 2 * width**2 and x.activations == 2 * width
               for x in spec.layers)
    # Megatron pairs: column-parallel (no all-reduce) then row-parallel (one all-reduce)
    assert [x.allreduces for x in spec.layers] == [0, 1] * (layers // 2)
    assert spec.training.dtype == "float16" and spec.training.optimizer == "sgd"


def test_shipped_specs_validate():
    paths = [distir_grid.CLUSTER, *distir_grid.MODELS.values()]
    result = subprocess.run([sys.executable, "-m", "solver_planner", "validate", *map(str, paths)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok ") == 4 and result.stdout.count("consistent with dgx-v100-16") == 3


def test_grid_small_case_by_hand():
    """Batch 16: P = 1 gives D in {1, 2, 4, 8, 16} with K = 1 (5); for P > 1, each (D, T, P)
    takes K in {2, ..., 16 / D}: P = 2: D = 8, 4, 2, 1 -> 1 + 2 + 3 + 4; P = 4: 2 + 3 + 4;
    P = 8: 3 + 4; P = 16: 4; 35 in all."""
    configs = distir_grid.grid(16)
    assert len(configs) == len(set(configs)) == 35
    for c in configs:
        assert c.data * c.tensor * c.pipeline == 16
        assert (c.microbatches == 1) if c.pipeline == 1 else (2 <= c.microbatches <= 128)
        assert 16 % (c.data * c.microbatches) == 0


def test_grid_bounds():
    # large batches: 15 (D, T, P) triples, 5 with P = 1 and 10 with the 7 values of K: 75
    # (DistIR Table 1's N_grid for MLP 1B)
    assert len(distir_grid.grid(4096)) == len(distir_grid.grid(262144)) == 75
    big = distir_grid.grid(262144)
    assert {c.microbatches for c in big if c.pipeline > 1} == set(distir_grid.MICROBATCHES)
    assert max(c.microbatches for c in big) == 128
    small = distir_grid.grid(128)
    assert len(small) == 65
    assert all(128 // (c.data * c.microbatches) >= 1 for c in small)
    assert Config(8, 1, 2, 32) not in small and Config(8, 1, 2, 16) in small
    assert all(set(distir_grid.BASELINES.values()) <= set(distir_grid.grid(b)) for b in (128, 4096))
    # uniform stages: P must divide the layers
    assert {c.pipeline for c in distir_grid.grid(4096, layers=12)} == {1, 2, 4}


def test_table2_data_has_every_row():
    rows = distir_grid.load_table()
    assert len(rows) == 27
    assert [sum(r.model == m for r in rows) for m in TABLE1] == [12, 11, 4]
    assert all(r.model in distir_grid.MODELS for r in rows)
    by_key = {(r.model, r.batch): r for r in rows}
    assert len(by_key) == 27
    first = by_key["mlp-1b", 128]
    assert first.best == Config(1, 16, 1, 1) and first.speedup == {"data": 7.5, "tensor": 1.1, "pipeline": 21.7}
    last17 = by_key["mlp-17b", 131072]
    assert last17.best == Config(4, 2, 2, 32) and set(last17.speedup.values()) == {None}
    assert by_key["mlp-1b", 65536].speedup["tensor"] is None
    assert by_key["mlp-103b", 256].speedup == {"data": None, "tensor": 1.0, "pipeline": None}
    for r in rows:     # every best configuration is in the grid it was chosen from
        layers = TABLE1[r.model][0]
        assert r.best in distir_grid.grid(r.batch, layers=layers)


def test_spearman():
    assert distir_grid.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert distir_grid.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take their mean rank: ranks (1.5, 1.5, 3) and (1, 2, 3)
    assert distir_grid.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)
    assert distir_grid.spearman([1, 2], [1, 2]) is None and distir_grid.spearman([1, 1, 1], [1, 2, 3]) is None


def test_quick_run_of_the_script():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "distir_grid.py"), "--quick",
                             "--models", "mlp-1b", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[1/1] mlp-1b batch 128" in result.stderr           # progress on stderr
    data = json.loads(result.stdout)
    assert data["compute"] == "efficiency" and len(data["rows"]) == 1
    row = data["rows"][0]
    assert row["model"] == "mlp-1b" and row["batch"] == 128 and row["configs"] == 65
    assert row["best"]["paper"] == "1/16/1/1"
    assert all(row["speedup"][k]["ours"] >= 1.0 for k in ("data", "tensor", "pipeline"))
    assert set(data["agreement"]) >= {"same_best_fraction", "same_pure_winner_fraction", "spearman"}


def test_peak_model_and_table_output(capsys):
    assert distir_grid.main(["--models", "mlp-1b", "--batches", "128", "--compute", "peak"]) == 0
    out = capsys.readouterr()
    assert "compute model: peak" in out.out and "same best configuration:" in out.out
    assert "mlp-1b       128" in out.out and "[1/1] mlp-1b batch 128" in out.err
