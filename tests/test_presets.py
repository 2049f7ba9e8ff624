"""Device presets: a data file of datasheet and microbenchmark numbers, overridable key by key."""

import json
import textwrap

import pytest

from solver_planner.errors import SpecError
from solver_planner.spec import load_cluster_spec
from solver_planner.spec.plausible import implausible
from solver_planner.spec.presets import preset_names, presets
from solver_planner.topology import Topology

from conftest import run_cli

SPEC = textwrap.dedent("""\
    name: t
    levels:
      - {{name: node, count: 1}}
      - {{name: gpu, count: 8}}
    device: {device}
    interconnects:
      - {{name: nvswitch, level: gpu, bandwidth: 300 GB/s, latency: 2us}}
    """)


def spec(device: str, file: str = "c.yaml"):
    return load_cluster_spec(file, SPEC.format(device=device))


def test_the_issue_names_a_preset_for_each_device():
    names = set(preset_names())
    for wanted in ("V100-SXM2-16GB", "V100-SXM3-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB",
                   "H100-PCIe-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "MI300X", "L40S"):
        assert wanted in names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_with_datasheet_numbers_and_a_compute_block(name):
    s = spec(f"{{preset: {name}}}")
    d = s.device
    assert d.name == presets()[name]["name"] and d.preset == name
    assert 1e14 <= d.flops <= 1e16 and 1e10 <= d.memory <= 1e12 and 5e11 <= d.memory_bandwidth <= 1e13
    assert d.dtype_flops["float32"] < d.flops
    c = d.compute
    assert 0.5 <= c.matmul_efficiency <= 0.9 and 0.7 <= c.memory_efficiency <= 0.95
    assert c.half_efficiency_flops > 0 and 0 < c.kernel_overhead < 1e-4 and 0 < c.attention_efficiency < 1
    assert implausible(s) == []


def test_keys_written_in_the_spec_override_the_preset_key_by_key():
    s = spec("{preset: A100-SXM4-80GB, memory: 40 GB, name: mine, compute: {kernel_overhead: 3us}}")
    d = s.device
    assert (d.name, d.memory, d.flops, d.memory_bandwidth) == ("mine", 40e9, 312e12, 2039e9)
    assert d.compute.kernel_overhead == pytest.approx(3e-6)          # the spec's
    assert d.compute.matmul_efficiency == 0.719                      # the preset's, merged in
    assert "memory" not in s.preset_filled and "name" not in s.preset_filled
    assert "compute.matmul_efficiency" in s.preset_filled and "compute.kernel_overhead" not in s.preset_filled
    assert "flops" in s.preset_filled and "memory_bandwidth" in s.preset_filled


def test_an_unknown_preset_is_refused_with_file_line_and_did_you_mean():
    with pytest.raises(SpecError) as info:
        spec("{preset: A100-SXM-80GB}", "mine.yaml")
    issue = info.value.issues[0]
    assert (issue.file, issue.line, issue.path) == ("mine.yaml", 5, "device.preset")
    assert "did you mean 'A100-SXM4-80GB'" in issue.message


def test_show_prints_what_the_preset_filled_in(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(SPEC.format(device="{preset: H100-SXM5-80GB, memory: 94 GB}"))
    out = run_cli("show", path)
    assert out.returncode == 0, out.stderr
    assert "device preset H100-SXM5-80GB" in out.stdout and "filled in:" in out.stdout
    assert "memory bandwidth 3.35 TB/s (preset)" in out.stdout and "matmul efficiency 0.67 (preset)" in out.stdout
    assert "memory 87.5 GiB," in out.stdout.replace("\n", " ")      # the spec's 94 GB, not marked
    info = json.loads(run_cli("show", path, "--json").stdout)["device"]
    assert info["preset"] == "H100-SXM5-80GB" and "memory" not in info["preset_filled"]


@pytest.mark.parametrize("device, path, words", [
    ("{name: X, flops: 1024, memory: 80 GiB, memory_bandwidth: 2 TB/s}", "device.flops", "1024 FLOP/s"),
    ("{name: X, flops: 312 TFLOP/s, dtype_flops: {float32: 20}, memory: 80 GiB, memory_bandwidth: 2 TB/s}",
     "device.dtype_flops.float32", "20 FLOP/s"),
    ("{name: X, flops: 312 TFLOP/s, memory: 80 GiB, memory_bandwidth: 2039}", "device.memory_bandwidth", "2039 B/s"),
    ("{name: X, flops: 312 TFLOP/s, memory: 80 GiB}", "device", "neither a 'preset' nor a 'memory_bandwidth'"),
])
def test_devices_no_real_hardware_has_are_warned_about_with_file_and_line(tmp_path, device, path, words):
    file = tmp_path / "c.yaml"
    file.write_text(SPEC.format(device=device))
    warnings = implausible(load_cluster_spec(file))
    assert len(warnings) == 1 and f"{file}:5: {path}: " in warnings[0] and words in warnings[0]
    if path == "device.flops":                 # the commands print the warnings (one case: each run takes a second)
        for command in (["validate", file], ["show", file]):
            out = run_cli(*command)
            assert out.returncode == 0 and f"warning: {file}:5: {path}: " in out.stderr


def test_a_transformer_whose_hidden_size_is_not_a_multiple_of_its_heads_is_refused(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("name: m\ntransformer: {layers: 2, hidden: 7, heads: 32, sequence: 16, vocab: 100}\n"
                     "training: {global_batch: 8}\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(SPEC.format(device="{preset: A100-SXM4-80GB}"))
    for command in (["validate", model], ["stages", cluster, model], ["plan", cluster, model]):
        out = run_cli(*command)
        assert out.returncode == 2 and f"{model}:2: transformer.heads: hidden 7 is not a multiple of heads 32" \
            in out.stderr, (command, out.stderr)


def test_preset_gemm_efficiencies_are_the_published_microbenchmark_table():
    import csv

    from solver_planner.spec.presets import PRESETS_FILE
    path = PRESETS_FILE.parent / "mamf.csv"
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    checked = 0
    best = {row["accelerator"]: float(row["mamf_tflops"]) / float(row["peak_tflops"]) for row in rows}
    # the A100's training layers over its best shape: the ratio the other best-shape presets carry
    ratio = presets()["A100-SXM4-80GB"]["compute"]["matmul_efficiency"] / best["NVIDIA A100 SXM"]
    assert ratio == pytest.approx(0.837, abs=0.001)
    for row in rows:
        mamf = best[row["accelerator"]]
        for name in row["presets"].split():
            eff = presets()[name]["compute"]["matmul_efficiency"]
            if name.startswith("A100"):
                # fitted to training layers (tests/test_layer_timings.py): below the best shape's
                assert eff < mamf, name
                continue
            assert eff == pytest.approx(mamf * ratio, abs=0.006), name
            checked += 1
    assert checked >= 4
    # the PCIe H100, not in the table: the SXM's best shape less its power limit, times the ratio
    assert presets()["H100-PCIe-80GB"]["compute"]["matmul_efficiency"] == pytest.approx(0.78 * ratio, abs=0.006)
    sxm, pcie = (presets()[n]["compute"]["matmul_efficiency"] for n in ("A100-SXM4-80GB", "A100-PCIe-80GB"))
    assert pcie == pytest.approx(sxm * 256.4 / 267.9, abs=0.0005)
