"""``calibrate``'s device measurements (the compute model of :mod:`solver_planner.compute`):
copies of several sizes fitted to ``overhead + bytes / memory_bandwidth`` (``fit_stream``),
a GPU's 16-bit and float32 multiplies written as ``flops`` and ``dtype_flops``, the medians
over processes, and the spec and comments ``cluster_yaml`` writes from them.  The GPU paths
run on fake torch objects or on profiles as a GPU returns them; the CPU path runs for real."""

import math
import types

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver_planner.compute import ComputeModel, fit_stream
from solver_planner.distributed import calibrate as cal_mod
from solver_planner.distributed.calibrate import (KINDS, Measurement, calibration_of, cluster_yaml, memory_bandwidth,
                                                  predict, topology_for)
from solver_planner.errors import PlannerError
from solver_planner.spec.cluster import load_cluster_spec
from solver_planner.topology import Topology

MIB = 2**20
MOVED = [2.0 * m * MIB for m in (1, 4, 16, 64)]       # bytes moved by copies of 1 to 64 MiB
LEVELS = [("host", 1), ("proc", 2)]


def _copies(bandwidth, overhead, noise=None):
    noise = noise or [0.0] * len(MOVED)
    return [(m, (overhead + m / bandwidth) * (1 + e)) for m, e in zip(MOVED, noise)]


def _matmuls(rate, half, overhead, sides=(64, 128, 256, 384, 512)):
    return [(2.0 * n ** 3, overhead + (2.0 * n ** 3 + half) / rate) for n in sides]


def _measured():
    """Calls timed exactly as a known loopback would take them (the interconnect fit is not under test)."""
    truth = topology_for(LEVELS, "2 devices", 50e-6, 2e9)
    return [Measurement(k, n, (predict(truth, Measurement(k, n, (1.0,))),)) for k in KINDS for n in (4096, 1 << 22)]


# -- fit_stream ------------------------------------------------------------------------------


def test_fit_stream_recovers_exact_bandwidth():
    assert fit_stream(_copies(25e9, 4e-6), 4e-6) == pytest.approx(25e9, rel=1e-12)
    # the old single-copy rate counts the overhead as transfer time: a GPU's 1 TB/s bandwidth
    # behind a 20 us launch-and-synchronize looks like half of it on a 16 MiB buffer
    points = [(m, 20e-6 + m / 1e12) for m in (2.0 * 16 * MIB, 2.0 * 1024 * MIB)]
    assert points[0][0] / points[0][1] < 0.65e12
    assert fit_stream(points, 20e-6) == pytest.approx(1e12, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(bandwidth=st.floats(1e9, 5e12), overhead=st.floats(0, 1e-4),
       noise=st.lists(st.floats(-0.005, 0.005), min_size=4, max_size=4))
def test_fit_stream_recovers_the_bandwidth_under_noise(bandwidth, overhead, noise):
    assume(MOVED[-1] / bandwidth >= overhead)      # the largest copy shows its bytes
    assert fit_stream(_copies(bandwidth, overhead, noise), overhead) == pytest.approx(bandwidth, rel=0.03)


@pytest.mark.parametrize("points, overhead, match", [
    ([], 0.0, "at least two"),
    ([(MOVED[0], 1e-3)], 0.0, "at least two"),
    ([(MOVED[0], 1e-3), (0.0, 1e-3), (MOVED[1], -1.0)], 0.0, "at least two"),   # unusable points dropped
    ([(MOVED[0], 1e-3), (MOVED[0], 2e-3)], 0.0, "two sizes"),
    ([(MOVED[0], 1e-3), (MOVED[3], 0.5e-3)], 0.0, "larger"),                  # the larger copy faster
    ([(MOVED[0], 1e-3), (MOVED[3], 1e-3)], 0.0, "larger"),                    # flat
    ([(MOVED[0], 1e-6), (MOVED[3], 1.5e-6)], 2e-6, "overhead"),               # faster than an empty kernel
])
def test_fit_stream_refuses_timings_without_a_bandwidth(points, overhead, match):
    with pytest.raises(ValueError, match=match):
        fit_stream(points, overhead)


@settings(max_examples=200, deadline=None)
@given(times=st.lists(st.floats(1e-7, 10.0), min_size=4, max_size=4), overhead=st.floats(0, 1e-3))
def test_memory_bandwidth_turns_any_timings_into_a_usable_bandwidth(times, overhead):
    """What a loaded machine measured never ends minutes of work in a traceback: a positive
    bandwidth a spec holds, and a note exactly when the copies could not be fitted, naming
    the largest copy's rate, which is then what is written."""
    copies = list(zip(MOVED, times))
    bw, notes = memory_bandwidth({"overhead": overhead, "copies": copies})
    assert 0 < bw <= cal_mod.MAX_BANDWIDTH
    try:
        fit_stream(copies, overhead)
        fitted = True
    except ValueError:
        fitted = False
    assert bool(notes) == (not fitted)
    if not fitted:
        assert bw == pytest.approx(min(MOVED[-1] / times[-1], cal_mod.MAX_BANDWIDTH))
        assert "largest copy" in notes[0] and "64 MiB" in notes[0]


def test_memory_bandwidth_without_copies_or_usable_copies():
    assert memory_bandwidth({"overhead": 0.0, "bandwidth": 7e9}) == (7e9, [])   # a profile of earlier versions
    with pytest.raises(PlannerError, match="no usable copy timings"):
        memory_bandwidth({"overhead": 0.0, "copies": [(MOVED[0], 0.0), (MOVED[1], 0.0)]})


# -- the written spec ------------------------------------------------------------------------


def _cpu_profile(bandwidth=30e9, overhead=3e-6):
    return {"dtype": "float32", "matmul": _matmuls(150e9, 2e5, overhead), "overhead": overhead,
            "copies": _copies(bandwidth, overhead), "bandwidth": bandwidth}


def test_a_profile_with_copies_writes_the_fitted_memory_bandwidth():
    profile = _cpu_profile()
    profile["bandwidth"] = 1.0        # measure() refits it: the spec takes the copies' fit, not this key
    cal = calibration_of(2, "gloo", LEVELS, _measured(), profile)
    assert cal.memory_bandwidth == pytest.approx(30e9, rel=1e-9) and cal.notes == [] and cal.dtype_flops == {}
    text = cluster_yaml(cal)
    spec = load_cluster_spec("<calibrated>", text)
    assert spec.device.memory_bandwidth == pytest.approx(30e9, rel=1e-3)      # 4 significant digits
    assert spec.device.flops == pytest.approx(150e9, rel=1e-3) and spec.device.dtype_flops == {}
    assert spec.device.compute.memory_efficiency == 1.0
    # the written model prices every timed copy as it was measured
    model = ComputeModel.of(Topology(spec).device)
    for moved, took in profile["copies"]:
        assert float(model.memory_time(moved)) == pytest.approx(took, rel=2e-3)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    copies = next(line for line in comments if line.startswith("# Copies"))
    assert "1 MiB to 64 MiB (4 sizes" in copies
    fitted = comments[comments.index(copies) + 1]
    assert "fitted to kernel_overhead + bytes moved / memory_bandwidth: memory_bandwidth 30 GB/s" in fitted
    assert "rms relative error 0.00" in fitted
    assert any("float32 matrix multiplies of side 64 to 512 (5 sizes" in line for line in comments)


def test_disturbed_copies_write_the_largest_rate_and_say_so():
    profile = _cpu_profile()
    profile["copies"] = [(m, 1e-3 / (i + 1)) for i, m in enumerate(MOVED)]       # larger copies faster
    cal = calibration_of(2, "gloo", LEVELS, _measured(), profile)
    assert cal.memory_bandwidth == pytest.approx(MOVED[-1] / 0.25e-3)
    assert len(cal.notes) == 1 and "memory_bandwidth is the rate of the largest copy" in cal.notes[0]
    text = cluster_yaml(cal)
    assert "# Note: the timed copies do not get slower with size" in text
    assert "too disturbed to fit to kernel_overhead + bytes moved / memory_bandwidth (see the note)" in text
    assert load_cluster_spec("<calibrated>", text).device.memory_bandwidth == pytest.approx(
        MOVED[-1] / 0.25e-3, rel=1e-3)


def _gpu_profile(bf16=True):
    """A profile as _device_profile returns it on a GPU (rates of an A100-like device)."""
    sides = cal_mod.MATMUL_SIDES["cuda"]
    half = "bfloat16" if bf16 else "float16"
    other = {"float16": _matmuls(300e12, 2e9, 8e-6, sides)} if bf16 else {}
    return {"dtype": half, "matmul": _matmuls(280e12, 3e9, 8e-6, sides), "overhead": 8e-6,
            "dtype_matmul": {**other, "float32": _matmuls(19e12, 1e8, 8e-6, sides)},
            "copies": [(2.0 * s, 8e-6 + 2.0 * s / 1.6e12) for s in cal_mod.COPY_SIZES["cuda"]], "bandwidth": 1.6e12}


@pytest.mark.parametrize("bf16", [True, False])
def test_a_gpu_profile_writes_the_16_bit_rate_as_flops_and_float32_as_dtype_flops(bf16):
    cal = calibration_of(2, "nccl", LEVELS, _measured(), _gpu_profile(bf16))
    assert cal.notes == []
    text = cluster_yaml(cal)
    device = load_cluster_spec("<calibrated>", text).device
    assert device.flops == pytest.approx(280e12, rel=1e-3)
    want = {"float16": 300e12, "float32": 19e12} if bf16 else {"float32": 19e12}
    assert device.dtype_flops == pytest.approx(want, rel=1e-3)
    assert device.compute.half_efficiency_flops == pytest.approx(3e9, rel=1e-3)   # flops' dtype's line
    assert device.memory_bandwidth == pytest.approx(1.6e12, rel=1e-3)
    # a job's peak is its dtype's: float32 at dtype_flops, the 16-bit one at flops
    dev = Topology(load_cluster_spec("<calibrated>", text)).device
    assert ComputeModel.of(dev, "peak", "float32").peak == pytest.approx(19e12, rel=1e-3)
    assert ComputeModel.of(dev, "peak", "bfloat16").peak == pytest.approx(280e12, rel=1e-3)
    head = "bfloat16 and float16 and float32" if bf16 else "float16 and float32"
    assert f"single {head} matrix multiplies of side 1024 to 8192" in text
    assert ("(bfloat16)" if bf16 else "(float16)") in text and "dtype_flops.float32 19 TFLOP/s" in text
    assert "Copies of 16 MiB to 1 GiB (4 sizes" in text


def test_a_disturbed_dtype_line_falls_back_with_a_note():
    profile = _gpu_profile()
    profile["dtype_matmul"]["float32"] = [(f, 1e-3 / (i + 1)) for i, (f, _) in
                                          enumerate(profile["dtype_matmul"]["float32"])]
    cal = calibration_of(2, "nccl", LEVELS, _measured(), profile)
    assert len(cal.notes) == 1 and "dtype_flops.float32 is the fastest rate observed" in cal.notes[0]
    f, t = profile["dtype_matmul"]["float32"][-1]
    assert cal.dtype_flops["float32"] == pytest.approx(f / (t - 8e-6))
    assert cal.flops == pytest.approx(280e12)


# -- the measurements ------------------------------------------------------------------------


class _FakeTorch:
    """Enough of torch for _device_profile on ``cuda:0``: tensors are small CPU ones (the sizes are
    patched down), and every allocation's device and dtype is recorded."""

    def __init__(self, bf16: bool):
        import torch

        self._torch = torch
        self.float32, self.bfloat16, self.float16 = "float32", "bfloat16", "float16"
        self.cuda = types.SimpleNamespace(is_bf16_supported=lambda: bf16)
        self.allocated = []

    def randn(self, n, m, device, dtype):
        self.allocated.append(("randn", device, dtype))
        return self._torch.randn(n, m)

    def ones(self, n, device):
        self.allocated.append(("ones", device, None))
        return self._torch.ones(n)

    def empty_like(self, t):
        return self._torch.empty_like(t)


@pytest.mark.parametrize("bf16", [True, False])
def test_device_profile_on_a_gpu_times_its_16_bit_dtypes_and_float32(monkeypatch, bf16):
    pytest.importorskip("torch")
    monkeypatch.setitem(cal_mod.MATMUL_SIDES, "cuda", (8, 16))
    monkeypatch.setitem(cal_mod.COPY_SIZES, "cuda", (4096, 16384))
    fake = _FakeTorch(bf16)
    syncs = []
    profile = cal_mod._device_profile(fake, "cuda:0", lambda: syncs.append(1))
    half = ["bfloat16", "float16"] if bf16 else ["float16"]
    assert profile["dtype"] == half[0]
    assert list(profile["dtype_matmul"]) == half[1:] + ["float32"]
    assert [d for kind, _, d in fake.allocated if kind == "randn"] == [d for d in half + ["float32"] for _ in (8, 16)]
    assert {dev for _, dev, _ in fake.allocated} == {"cuda:0"} and syncs
    for points in [profile["matmul"], *profile["dtype_matmul"].values()]:
        assert [f for f, _ in points] == [2.0 * 8 ** 3, 2.0 * 16 ** 3]
    assert [m for m, _ in profile["copies"]] == [8192.0, 32768.0]
    assert profile["bandwidth"] == memory_bandwidth(profile)[0] > 0


def test_device_profile_on_this_cpu():
    """The real thing, as each calibrate process runs it: float32 only, copies of growing size."""
    torch = pytest.importorskip("torch")
    profile = cal_mod._device_profile(torch, "cpu", lambda: None)
    assert profile["dtype"] == "float32" and "dtype_matmul" not in profile
    assert [m for m, _ in profile["copies"]] == [2.0 * s for s in cal_mod.COPY_SIZES["cpu"]]
    assert [m for m, _ in profile["copies"]] == sorted(m for m, _ in profile["copies"]) and len(profile["copies"]) >= 2
    assert all(t > 0 for _, t in profile["copies"] + profile["matmul"]) and profile["overhead"] > 0
    assert 0 < profile["bandwidth"] <= cal_mod.MAX_BANDWIDTH and math.isfinite(profile["bandwidth"])
    assert [f for f, _ in profile["matmul"]] == [2.0 * n ** 3 for n in cal_mod.MATMUL_SIDES["cpu"]]


def test_measure_takes_medians_over_processes_and_refits_the_bandwidth(monkeypatch):
    """measure() without processes: three ranks' profiles (GPU-shaped) in, the median of each
    timing out, and the bandwidth fitted to the median copies."""
    pytest.importorskip("torch")
    profiles = []
    for scale in (1.0, 1.1, 3.0):        # the third rank was disturbed: the medians are the second's
        p = _gpu_profile()
        slow = lambda pts: [(x, t * scale) for x, t in pts]   # noqa: E731
        profiles.append({"dtype": p["dtype"], "matmul": slow(p["matmul"]), "overhead": p["overhead"] * scale,
                         "dtype_matmul": {d: slow(v) for d, v in p["dtype_matmul"].items()},
                         "copies": slow(p["copies"]), "bandwidth": 0.0})
    records = [("p2p", 4096, 1, 0.0, 1e-4)]
    monkeypatch.setattr(cal_mod, "choose_backend", lambda backend, world: "nccl")
    monkeypatch.setattr(cal_mod, "run_workers", lambda *a, **k: [{"records": records, "profile": p} for p in profiles])
    backend, measured, profile = cal_mod.measure(3, "nccl")
    assert backend == "nccl" and measured == [Measurement("p2p", 4096, (1e-4,))]
    second = profiles[1]
    assert profile["dtype"] == "bfloat16" and profile["overhead"] == second["overhead"]
    assert profile["matmul"] == second["matmul"] and profile["copies"] == second["copies"]
    assert profile["dtype_matmul"] == second["dtype_matmul"]
    assert profile["bandwidth"] == pytest.approx(fit_stream(second["copies"], second["overhead"]))
