"""The compute efficiency model (issue 17, DistIR §4) against its written formula, its
properties on random inputs, and the ranking it exists for: DistIR Table 2's MLP 1B on a
DGX-2, where pure tensor parallelism beats pure pipeline parallelism."""

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver_planner import api
from solver_planner.compute import ComputeModel
from solver_planner.errors import OptionError
from solver_planner.spec import load_model_spec
from solver_planner.topology import load_topology

from conftest import run_cli

DGX2 = "specs/clusters/dgx-v100-16.yaml"
MLP1B = "specs/models/mlp-1b.yaml"


@pytest.fixture(scope="module")
def v100():
    return ComputeModel.of(load_topology(DGX2).device)


def test_the_spec_parameters_are_read(v100):
    assert v100.mode == "efficiency"
    assert (v100.peak, v100.efficiency, v100.half_flops, v100.overhead, v100.memory_bandwidth) == (
        125e12, 0.70, 1e9, 5e-6, 900e9)


def test_a_spec_without_compute_block_or_memory_bandwidth_falls_back_to_peak():
    topo = load_topology("specs/clusters/local-2x2.yaml")
    model = ComputeModel.of(topo.device, "efficiency")
    assert model.is_peak and float(model.time(1e9, 1e12, 3)) == pytest.approx(1e9 / topo.device.flops)


def test_unknown_mode_is_an_option_error(v100):
    with pytest.raises(OptionError, match="did you mean 'peak'"):
        ComputeModel.of(load_topology(DGX2).device, "peek")


@settings(max_examples=200, deadline=None)
@given(flops=st.floats(1e3, 1e15), nbytes=st.floats(0, 1e12), kernels=st.integers(1, 64))
def test_roofline_and_efficiency_curve(v100, flops, nbytes, kernels):
    t = float(v100.time(flops, nbytes, kernels))
    # never faster than the peak at full efficiency, than memory, or than the launches
    assert t >= flops / (v100.peak * v100.efficiency) * (1 - 1e-12)
    assert t >= nbytes / v100.memory_bandwidth * (1 - 1e-12)
    assert t >= kernels * v100.overhead
    arith = t - kernels * v100.overhead
    if arith > nbytes / v100.memory_bandwidth * (1 + 1e-9):
        # compute-bound: the efficiency of a kernel of x FLOPs is e_max x / (x + x_half)
        x = flops / kernels
        achieved = flops / (v100.peak * arith)
        assert achieved == pytest.approx(v100.efficiency * x / (x + v100.half_flops), rel=1e-9)
    # the same FLOPs in fewer, larger kernels are never slower
    if kernels > 1:
        assert float(v100.time(flops, nbytes, 1)) <= t * (1 + 1e-12)



@settings(max_examples=200, deadline=None)
@given(flops=st.one_of(st.just(0.0), st.floats(-1.0, 1e15)), nbytes=st.one_of(st.just(0.0), st.floats(0, 1e12)),
       kernels=st.one_of(st.integers(0, 64), st.floats(0.0, 64.0)), mode=st.sampled_from(["efficiency", "roofline", "peak"]))
def test_one_pass_in_python_numbers_is_the_array_formula(v100, flops, nbytes, kernels, mode):
    """time() of plain numbers takes its own path (Ranges.at reads cells one at a time):
    exactly the array formula's value, in every mode."""
    import numpy as np

    model = ComputeModel.of(load_topology(DGX2).device, mode)
    one = model.time(flops, nbytes, kernels)
    arrays = model.time(np.array([flops]), np.array([nbytes]), np.array([float(kernels)]))
    assert isinstance(one, np.float64) and float(one) == float(arrays[0])

def test_peak_model_is_flops_over_peak():
    peak = ComputeModel.of(load_topology(DGX2).device, "peak")
    assert float(peak.time(125e12, 1e15, 100)) == pytest.approx(1.0)


def _time(config: str, compute: str, batch: int = 128) -> float:
    spec = load_model_spec(MLP1B)
    if batch != spec.training.global_batch:
        spec = spec.model_copy(update={"training": spec.training.model_copy(update={"global_batch": batch})})
    rep = api.stages(DGX2, spec, config=config, compute=compute)
    return rep.run.iteration_time


def test_mlp_1b_pure_tensor_beats_pure_pipeline_as_measured():
    """DistIR Table 2, MLP 1B at batch 128: pure tensor parallelism is best, pure pipeline
    (K = 8P = 128) 21.7x slower.  FLOPs at peak got this backwards (one-sample micro-batches
    looked free); the efficiency model reads each layer's weights once per micro-batch."""
    tensor, pipeline = _time("1,16,1,1", "efficiency"), _time("1,1,16,128", "efficiency")
    assert pipeline > 5 * tensor
    assert _time("1,1,16,128", "peak") < _time("1,16,1,1", "peak")


def test_optimizer_step_follows_the_reductions_in_the_simulation():
    rep = api.stages(DGX2, MLP1B, config="16,1,1,1")
    records = {r.name: r for r in rep.run.timeline.records}
    step = records["optimizer 0"]
    # SGD without a master copy: read and write the weights, read the gradients (3 x 2 GiB /
    # 16 layers of 128 MiB), one kernel per layer, at the V100's 900 GB/s
    assert step.duration == pytest.approx(16 * 5e-6 + 3 * 16 * 128 * 2**20 / 900e9, rel=1e-9)
    last_reduction = max(r.end for r in rep.run.timeline.records if r.category == "gradient-reduction")
    assert step.start >= last_reduction - 1e-12
    assert rep.run.iteration_time == pytest.approx(step.end)
    # the peak model prices FLOPs only: no optimizer task
    peak = api.stages(DGX2, MLP1B, config="16,1,1,1", compute="peak")
    assert not any(r.category == "optimizer" for r in peak.run.timeline.records)


def test_cli_compute_option():
    out = run_cli("stages", DGX2, MLP1B, "--config", "1,16,1,1", "--compute", "peak", "--json", "--no-baselines")
    assert out.returncode == 0 and json.loads(out.stdout)["compute_model"] == "peak"
    out = run_cli("stages", DGX2, MLP1B, "--config", "1,16,1,1", "--json", "--no-baselines")
    assert json.loads(out.stdout)["compute_model"] == "efficiency"
    bad = run_cli("stages", DGX2, MLP1B, "--config", "1,16,1,1", "--compute", "fast")
    assert bad.returncode == 2 and "compute model" in bad.stderr


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(1e9, 1e15), half=st.floats(0, 2.0 * 512 ** 3), overhead=st.floats(0, 1e-4),
       noise=st.lists(st.floats(-0.005, 0.005), min_size=5, max_size=5))
def test_fit_matmul_recovers_the_line(rate, half, overhead, noise):
    """``calibrate``'s fit of the compute model from timed multiplies of several sizes (the
    sizes reach past the half-efficiency point, as calibrate's do on a CPU)."""
    from solver_planner.compute import fit_matmul

    assume(2.0 * 512 ** 3 / rate >= overhead)     # the largest multiply shows its FLOPs
    sides = (64, 128, 256, 384, 512)
    points = [(2.0 * n ** 3, (overhead + (2.0 * n ** 3 + half) / rate) * (1 + e)) for n, e in zip(sides, noise)]
    got_rate, got_half = fit_matmul(points, overhead)
    assert got_rate == pytest.approx(rate, rel=0.1)
    # the intercept is only as good as the noise on the smallest multiply allows
    assert abs(got_half - half) <= 0.1 * (half + rate * overhead) + 0.03 * 2.0 * 64 ** 3


def test_fit_matmul_refuses_flat_timings():
    from solver_planner.compute import fit_matmul

    with pytest.raises(ValueError, match="larger"):
        fit_matmul([(1e6, 1e-3), (1e9, 1e-3 * 0.5)], 0.0)


@settings(max_examples=200, deadline=None)
@given(times=st.lists(st.floats(1e-7, 10.0), min_size=5, max_size=5), overhead=st.floats(0, 1e-3))
def test_calibrate_turns_any_timings_into_a_usable_compute_block(times, overhead):
    """calibrate's compute block from whatever a loaded machine measured (CI once timed a
    larger multiply faster than a smaller one, and minutes of measurements ended in a
    traceback): a positive finite rate and half size, a note exactly when the line could not
    be fitted, and then a model no slower than any multiply it was fitted on."""
    from solver_planner.compute import fit_matmul
    from solver_planner.distributed.calibrate import compute_block

    points = [(2.0 * n ** 3, t) for n, t in zip((64, 128, 256, 384, 512), times)]
    profile = {"matmul": points, "overhead": overhead, "bandwidth": 1e10}
    flops, block, notes = compute_block(profile)
    assert 0 < flops < float("inf") and 0 <= block["half_efficiency_flops"] < float("inf")
    assert block["kernel_overhead"] == overhead and block["matmul_efficiency"] == 1.0
    try:
        fit_matmul(points, overhead)
        fitted = True
    except ValueError:
        fitted = False
    assert bool(notes) == (not fitted)
    if not fitted:
        assert block["half_efficiency_flops"] == 0.0 and "busy" in notes[0]
        for f, t in points:
            assert overhead + f / flops <= max(t, overhead + t / 2) * (1 + 1e-12)


def test_calibrate_notes_inverted_timings():
    from solver_planner.distributed.calibrate import compute_block

    # what the failing CI run measured in effect: the larger multiplies came out faster
    points = [(2.0 * n ** 3, 1e-3 / n) for n in (64, 128, 256, 384, 512)]
    flops, block, notes = compute_block({"matmul": points, "overhead": 0.0, "bandwidth": 1e10})
    assert len(notes) == 1 and "fastest rate observed" in notes[0]
    assert flops == pytest.approx(2.0 * 512 ** 3 / (1e-3 / 512))


def test_the_peak_is_the_training_dtypes():
    """A model trained in float32 runs at the spec's dtype_flops for float32 (a V100 without
    tensor cores: 15.7 TFLOP/s), in float16 at 'flops' (125); MFU uses the same peak."""
    topo = load_topology("specs/clusters/aws-p3.8xlarge-2.yaml")
    assert ComputeModel.of(topo.device, "peak", "float32").peak == 15.7e12
    assert ComputeModel.of(topo.device, "peak", "float16").peak == 125e12
    assert ComputeModel.of(topo.device, "efficiency", "bfloat16").peak == 125e12   # no entry: 'flops'
    spec = load_model_spec(MLP1B)
    fp32 = spec.model_copy(update={"training": spec.training.model_copy(update={"dtype": "float32"})})
    a = api.stages(DGX2, spec, config="1,16,1,1", compute="peak", comm=False)
    b = api.stages(DGX2, fp32, config="1,16,1,1", compute="peak", comm=False)
    compute = [sum(r.duration for r in rep.run.timeline.records if r.category in ("forward", "backward"))
               for rep in (a, b)]
    assert compute[1] == pytest.approx(compute[0] * 125 / 15.7)


def _device(**kw):
    from solver_planner.topology import Device
    return Device("x", kw.pop("flops", 100e12), 80e9, **kw)


def test_without_a_compute_block_the_roofline_runs_when_the_memory_bandwidth_is_known():
    m = ComputeModel.of(_device(memory_bandwidth=2e12))
    assert m.mode == "roofline" and not m.is_peak
    # hand-computed: 1 TFLOP at 100 TFLOP/s = 10 ms; 10 GB at 2 TB/s = 5 ms -> 10 ms
    assert float(m.time(1e12, 10e9, 4)) == pytest.approx(0.010)
    # 1 GFLOP = 10 us; 1 GB = 0.5 ms -> memory-bound: 0.5 ms, never pure peak
    assert float(m.time(1e9, 1e9, 4)) == pytest.approx(0.0005)
    assert float(m.memory_time(4e9)) == pytest.approx(0.002)
    assert float(m.attention_time(1e12, 1e9)) == pytest.approx(0.010)
    assert ComputeModel.of(_device(memory_bandwidth=2e12), "roofline").mode == "roofline"


def test_without_a_memory_bandwidth_either_it_is_the_peak_model():
    m = ComputeModel.of(_device())
    assert m.is_peak and float(m.time(1e9, 1e12)) == pytest.approx(1e-5)
    assert float(m.memory_time(1e12)) == 0.0


def test_the_efficiency_model_reaches_memory_efficiency_of_the_bandwidth():
    from solver_planner.spec.cluster import ComputeSpec
    spec = ComputeSpec(matmul_efficiency=0.8, half_efficiency_flops=0, kernel_overhead=5e-6, memory_efficiency=0.5,
                       attention_efficiency=0.4)
    m = ComputeModel.of(_device(memory_bandwidth=2e12, compute=spec))
    assert m.mode == "efficiency"
    assert float(m.memory_time(1e9, 2)) == pytest.approx(1e-5 + 1e9 / 1e12)          # 2 launches + 1 GB at 1 TB/s
    assert float(m.time(1e9, 1e9)) == pytest.approx(5e-6 + 1e-3)                    # memory side: 1 ms
    assert float(m.time(1e12, 0.0)) == pytest.approx(5e-6 + 1e12 / 80e12)           # 1 TFLOP at 0.8 x 100
    assert float(m.attention_time(1e12, 0.0)) == pytest.approx(5e-6 + 1e12 / 40e12)  # at 0.4 x 100
