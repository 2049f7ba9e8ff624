"""``calibrate --from-nccl-tests`` (issue 17 part 4): reading nccl-tests logs, attributing
each run to the level it measures, and fitting latency, bandwidth and per-collective
efficiency to the cost model's own formulas."""

import functools
import json
import re

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import CLUSTERS, ROOT, SPECS, run_cli
from solver_planner.cost import CostModel
from solver_planner.distributed import nccl_tests as nt
from solver_planner.errors import SpecError
from solver_planner.spec.cluster import load_cluster_spec
from solver_planner.topology import Topology

DATA = ROOT / "benchmarks" / "data" / "nccl-tests"
KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv")

# The truth: per interconnect (latency, bandwidth, efficiency per collective); the best
# collective of each has efficiency 1, so the fit must find these very numbers.
TRUTH = {"nvswitch": (2e-6, 300e9, {"allgather": 1.0, "allreduce": 0.8, "reducescatter": 0.9, "broadcast": 0.7,
                                    "reduce": 0.75, "sendrecv": 0.85}),
         "nic": (8e-6, 25e9, {"allreduce": 1.0, "allgather": 0.9})}
BASE = {"nvswitch": (1e-6, 100e9, {}), "nic": (1e-6, 10e9, {})}     # deliberately wrong starting values


def cluster_text(values, levels=(("node", 4), ("gpu", 8)), collective=None, name="synthetic"):
    """A cluster spec; with ``collective``, every bandwidth is multiplied by its efficiency for
    it and no efficiency is written (the meaning of ``efficiency``, without relying on it)."""
    ics = []
    for ic_name, level in (("nvswitch", levels[1][0]), ("nic", levels[0][0])):
        lat, bw, eff = values[ic_name]
        ic = {"name": ic_name, "level": level, "latency": f"{lat * 1e6:g}us", "sharing": "device"}
        if collective is None:
            ic["bandwidth"] = f"{bw / 1e9:g} GB/s"
            if eff:
                ic["efficiency"] = dict(eff)
        else:
            ic["bandwidth"] = f"{bw * eff.get(collective, 1.0) / 1e9:g} GB/s"
        ics.append(ic)
    return yaml.safe_dump({"name": name, "levels": [{"name": n, "count": c} for n, c in levels],
                           "device": {"name": "GPU", "flops": "100 TFLOP/s", "memory": "80 GiB",
                                      "memory_bandwidth": "2 TB/s"},
                           "interconnects": ics}, sort_keys=False)


@functools.lru_cache(maxsize=None)
def truth_model(collective, levels=(("node", 4), ("gpu", 8))):
    return CostModel(Topology(load_cluster_spec("<truth>", cluster_text(TRUTH, levels, collective))))


def truth_time(collective, group, nbytes, levels=(("node", 4), ("gpu", 8))):
    cost = truth_model(collective, levels)
    if collective == "sendrecv":
        return cost.transfers_time([(group[i], group[(i + 1) % len(group)]) for i in range(len(group))], nbytes)
    return cost.collective(collective, [list(group)], nbytes).time


def synthetic_log(collective, hosts, per_host, noise=0.02, seed=0, sizes=None, levels=(("node", 4), ("gpu", 8))):
    rng = np.random.default_rng(seed)
    stride = levels[1][1]
    group = [j * stride + i for j in range(hosts) for i in range(per_host)]
    rows = []
    for s in sizes or [2 ** k for k in range(3, 31)]:
        t = truth_time(collective, group, s, levels)
        rows.append((s, t * (1 + rng.normal(0, noise)), t * (1 + rng.normal(0, noise))))
    return nt.render_run(collective, [f"node{j:02d}" for j in range(hosts)], per_host, rows)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """One-host logs of every collective, two-host logs of two, and the base spec."""
    d = tmp_path_factory.mktemp("nccl")
    paths = []
    for seed, kind in enumerate(KINDS):
        p = d / f"{kind}-1x8.log"
        p.write_text(synthetic_log(kind, 1, 8, seed=seed))
        paths.append(p)
    for seed, kind in enumerate(("allreduce", "allgather")):
        p = d / f"{kind}-2x8.log"
        p.write_text(synthetic_log(kind, 2, 8, seed=10 + seed))
        paths.append(p)
    base = d / "base.yaml"
    base.write_text(cluster_text(BASE))
    return d, base, paths


@pytest.fixture(scope="module")
def fitted(synthetic):
    _, base, paths = synthetic
    return nt.calibrate(base, [str(p) for p in paths])


# -- the fit ---------------------------------------------------------------------------

def test_fit_recovers_latency_bandwidth_and_efficiencies(fitted):
    levels = {lv.interconnect: lv for lv in fitted.levels}
    assert set(levels) == {"nvswitch", "nic"}
    for name, (lat, bw, eff) in TRUTH.items():
        lv = levels[name]
        assert lv.latency_fitted
        assert lv.latency == pytest.approx(lat, rel=0.03)
        assert lv.bandwidth == pytest.approx(bw, rel=0.03)
        assert set(lv.efficiency) == set(eff)
        for kind, e in eff.items():
            assert lv.efficiency[kind] == pytest.approx(e, rel=0.03), (name, kind)
        assert max(lv.efficiency.values()) == 1.0
    # 2% noise: the median |pred/meas - 1| of an exact model is about 0.67 x 2%.
    for log, err in fitted.log_errors().items():
        assert err < 0.025, log
    assert not fitted.notes


def test_fit_is_exact_without_noise(tmp_path):
    paths = []
    for kind in ("allreduce", "broadcast"):
        p = tmp_path / f"{kind}.log"
        p.write_text(synthetic_log(kind, 1, 8, noise=0.0))
        paths.append(str(p))
    p = tmp_path / "ar2.log"
    p.write_text(synthetic_log("allreduce", 2, 8, noise=0.0))
    base = tmp_path / "base.yaml"
    base.write_text(cluster_text(BASE))
    cal = nt.calibrate(base, paths + [str(p)])
    got = {lv.interconnect: lv for lv in cal.levels}
    assert got["nvswitch"].bandwidth == pytest.approx(300e9 * 0.8, rel=2e-3)      # allreduce is the best measured
    assert got["nvswitch"].efficiency["broadcast"] == pytest.approx(0.7 / 0.8, rel=2e-3)
    assert got["nic"].latency == pytest.approx(8e-6, rel=2e-3)
    # nccl-tests prints 4-5 significant digits of time: the fit is that exact.
    assert max(cal.log_errors().values()) < 2e-3


def test_written_spec_keeps_the_base_and_the_cost_model_reproduces_the_fit(fitted, synthetic):
    _, base, paths = synthetic
    text = fitted.yaml("solver-planner calibrate --from-nccl-tests ...")
    spec = load_cluster_spec("<fitted>", text)
    base_raw = yaml.safe_load(base.read_text())
    written = yaml.safe_load(text)
    assert written["levels"] == base_raw["levels"] and written["device"] == base_raw["device"]
    for before, after in zip(base_raw["interconnects"], written["interconnects"]):
        assert {k: v for k, v in before.items() if k not in ("bandwidth", "latency", "efficiency")} == \
               {k: v for k, v in after.items() if k not in ("bandwidth", "latency", "efficiency")}
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any(str(base) in line for line in header)
    for p in paths:
        assert any(str(p) in line for line in header), p
    # The cost model on the written spec (efficiency applied by cost.py) predicts what the fit said.
    cost = CostModel(Topology(spec))
    for f in fitted.runs:
        g = list(f.placement.group)
        for s, pred in zip(f.sizes[::7], f.predicted[::7]):
            if f.collective == "sendrecv":
                t = cost.transfers_time([(g[i], g[(i + 1) % len(g)]) for i in range(len(g))], s)
            else:
                t = cost.collective(f.collective, [g], s).time
            assert t == pytest.approx(pred, rel=1e-3), (f.run.file, s)


def test_fit_accounts_for_the_other_levels_when_they_do_not_overlap(tmp_path):
    """With collective_overlap 0 a two-host run also pays its NVLink part: the level's own
    least squares alone would absorb it into the NIC; the whole-model steps take it out."""
    def no_overlap(text):
        data = yaml.safe_load(text)
        data["collective_overlap"] = 0.0
        return yaml.safe_dump(data, sort_keys=False)

    rng = np.random.default_rng(1)
    paths = []
    for kind, hosts in (("allreduce", 1), ("allgather", 1), ("allreduce", 2), ("allgather", 2)):
        cost = CostModel(Topology(load_cluster_spec("<truth>", no_overlap(cluster_text(TRUTH, collective=kind)))))
        group = [j * 8 + i for j in range(hosts) for i in range(8)]
        rows = []
        for s in [2 ** k for k in range(3, 31)]:
            t = cost.collective(kind, [group], s).time
            rows.append((s, t * (1 + rng.normal(0, 0.01)), t * (1 + rng.normal(0, 0.01))))
        p = tmp_path / f"{kind}-{hosts}.log"
        p.write_text(nt.render_run(kind, [f"h{j}" for j in range(hosts)], 8, rows))
        paths.append(str(p))
    base = tmp_path / "base.yaml"
    base.write_text(no_overlap(cluster_text(BASE)))
    nic = next(lv for lv in nt.calibrate(base, paths).levels if lv.interconnect == "nic")
    assert nic.bandwidth == pytest.approx(25e9, rel=0.02) and nic.latency == pytest.approx(8e-6, rel=0.02)
    assert nic.efficiency["allgather"] == pytest.approx(0.9, rel=0.02)
    base.write_text(cluster_text(BASE))       # overlap 1: the NVLink part is (wrongly) the NIC's
    nic = next(lv for lv in nt.calibrate(base, paths).levels if lv.interconnect == "nic")
    assert nic.bandwidth < 0.95 * 25e9


def test_single_size_keeps_the_base_latency_and_fits_the_bandwidth(tmp_path):
    p = tmp_path / "all_reduce_perf.log"
    p.write_text(synthetic_log("allreduce", 2, 8, noise=0.0, sizes=[2 ** 30]))
    base = tmp_path / "base.yaml"
    base.write_text(cluster_text(BASE))
    cal = nt.calibrate(base, [str(p)])
    (lv,) = cal.levels
    assert not lv.latency_fitted and lv.latency == 1e-6
    # within 3%: with 8 rails the NIC is no longer far below the (deliberately wrong) NVSwitch
    # of the base, whose share of the time the single size cannot separate
    assert lv.bandwidth == pytest.approx(25e9, rel=0.03)
    assert any("latency is the base's" in n for n in cal.notes)


# -- reading and attribution -----------------------------------------------------------

def test_rendered_rows_have_nccl_tests_columns():
    """The writer the synthetic logs come from puts every column where nccl-tests does."""
    real = (DATA / "gcp-a3mega-h100-2x8-all_reduce.log").read_text().splitlines()
    header = [line for line in real if line.startswith("#       size") or line.startswith("#        (B)")]
    rows = [line for line in real if re.match(r"\s+\d+\s", line)]
    mine = nt.render_run("allreduce", ["a", "b"], 8, [(8, 135.8e-6, 123.5e-6), (8589934592, 47535e-6, 47743e-6)])
    lines = mine.splitlines()
    assert [line.rstrip() for line in lines if line.startswith("#       size") or line.startswith("#        (B)")] \
        == [line.rstrip() for line in header]

    def ends(line):
        return [m.end() for m in re.finditer(r"\S+", line)]

    got = [line for line in lines if re.match(r"\s+\d+\s", line)]
    assert ends(got[0]) == ends(rows[0]) and ends(got[1]) == ends(rows[-1])
    assert got[0] == rows[0]


def test_level_comes_from_the_rank_lines(tmp_path):
    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    one = nt.parse_text(synthetic_log("allreduce", 1, 8, sizes=[1 << 20]), "a.log")[0]
    two = nt.parse_text(synthetic_log("allreduce", 2, 4, sizes=[1 << 20]), "b.log")[0]
    assert (one.hosts, len(one.ranks)) == (["node00"], 8)
    p1, p2 = nt.place(one, topo, None, "allreduce"), nt.place(two, topo, None, "allreduce")
    assert (p1.level, p1.interconnect, p1.group) == ("gpu", "nvswitch", tuple(range(8)))
    assert (p2.level, p2.interconnect, p2.group, p2.hosts, p2.per_host) == \
        ("node", "infiniband", (0, 1, 2, 3, 8, 9, 10, 11), 2, 4)
    # The command line may name the level only when it agrees with the rank lines.
    assert nt.place(two, topo, "node", "allreduce").level == "node"
    with pytest.raises(SpecError, match="exercise level 'node', not 'gpu'"):
        nt.place(two, topo, "gpu", "allreduce")


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("#  Rank  7 Group", "#  Rank  6 Group"), "rank 6 is listed twice"),
    (lambda t: re.sub(r"(Rank  7 Group  0 Pid\s+\d+ on)\s+node01", r"\1 node00", t), "uneven ranks per host"),
    (lambda t: t.replace("Group  0 Pid   1007", "Group  1 Pid   1007"), "several communicator groups"),
])
def test_inconsistent_rank_lines_are_refused(edit, message):
    text = edit(synthetic_log("allreduce", 2, 4, sizes=[1 << 20]))
    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    with pytest.raises(SpecError, match=message):
        nt.place(nt.parse_text(text, "x.log")[0], topo, None, "allreduce")


def test_a_run_larger_than_the_base_is_refused():
    topo = Topology(load_cluster_spec(CLUSTERS / "local-2x4.yaml"))
    run = nt.parse_text(synthetic_log("allreduce", 2, 8, sizes=[1 << 20]), "big.log")[0]
    with pytest.raises(SpecError, match=r"big.log:\d+: 16 ranks on 2 host\(s\), 8 per host, do not fit"):
        nt.place(run, topo, None, "allreduce")


def test_without_rank_lines_the_level_must_be_named_and_the_size_is_read_elsewhere(tmp_path):
    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    (run,) = nt.parse_log(DATA / "a100-nvlink-1x8-sendrecv.log")
    assert run.collective == "sendrecv" and not run.ranks and run.flag_gpus == 8
    with pytest.raises(SpecError, match="name the level"):
        nt.place(run, topo, None, "sendrecv")
    assert nt.place(run, topo, "gpu", "sendrecv").group == tuple(range(8))
    # AllReduce without rank lines: 2(n-1)/n = busbw / algbw gives n.
    text = "\n".join(line for line in synthetic_log("allreduce", 2, 4, sizes=[1 << 28]).splitlines()
                     if "Rank" not in line and "nThread" not in line)
    run = nt.parse_text(text, "ar.log")[0]
    assert nt.place(run, topo, "node", "allreduce").group == (0, 1, 2, 3, 8, 9, 10, 11)
    assert nt.split_log_arg("node=ar.log", topo.level_names) == ("node", "ar.log")
    assert nt.split_log_arg("rack=ar.log", topo.level_names) == (None, "rack=ar.log")


def test_the_parser_reads_the_variants_seen_in_the_wild():
    """Launcher prefixes, INFO lines inside the table, no in-place half, N/A, old layouts
    (no root column, an 'error' column, rank lines without Group), several runs, footers."""
    text = """\
$ srun -n 2 ./build/all_gather_perf -b 1M -e 2M
0: # nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20
0: #  Rank  0 Group  0 Pid  11 on       hostA device  0 [0x07] NVIDIA A100-SXM4-80GB
0: #  Rank  1 Group  0 Pid  12 on       hostB device  0 [0x07] NVIDIA A100-SXM4-80GB
0: #       size         count      type   redop    root     time   algbw   busbw #wrong
0: #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
0:      1048576        131072     float    none      -1    50.00   20.97   10.49      0
hostA:11:11 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 7000 - Destroy COMPLETE
0:      2097152        262144     float    none      -1    90.00   23.30   11.65    N/A
0: # Avg bus bandwidth    : 11.07
[1,0]<stdout>:# Collective test starting: broadcast_perf
[1,0]<stdout>:#   Rank  0 Pid  21 on hostA device  0 [0x07] Tesla V100-SXM2-32GB
[1,0]<stdout>:#   Rank  1 Pid  22 on hostA device  1 [0x0b] Tesla V100-SXM2-32GB
[1,0]<stdout>:#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
[1,0]<stdout>:#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[1,0]<stdout>:     4194304       1048576   float    none    100.0   41.94   41.94  0e+00    N/A    N/A    N/A    N/A
[1,0]<stdout>:     8388608       2097152   float    none    190.0   44.15   44.15  0e+00    189.0   44.38   44.38  0e+00
     1677721
# Out of bounds values : 0 OK
"""
    first, second = nt.parse_text(text, "mixed.log")
    assert first.collective == "allgather" and first.hosts == ["hostA", "hostB"]
    assert [r.size for r in first.rows] == [1048576, 2097152]
    assert [r.times for r in first.rows] == [pytest.approx((50e-6,)), pytest.approx((90e-6,))]
    assert second.collective == "broadcast" and second.hosts == ["hostA"] and len(second.ranks) == 2
    assert [(r.size, len(r.times)) for r in second.rows] == [(4194304, 1), (8388608, 2)]
    assert second.rows[1].times == pytest.approx((190e-6, 189e-6))


def test_real_logs_are_read():
    expected = {"gcp-a3mega-h100-2x8-all_reduce.log": [("allreduce", 16, 2, 31)],
                "oci-bm-gpu-h100.8-2x8-all_reduce.log": [("allreduce", 16, 2, 5)],
                "oci-bm-gpu4.8-a100-1x8-2x8-all_reduce.log": [("allreduce", 8, 1, 1), ("allreduce", 16, 2, 1)],
                "a100-nvlink-1x8-sendrecv.log": [("sendrecv", 0, 0, 4)]}
    assert {p.name for p in DATA.glob("*.log")} == set(expected)
    for name, runs in expected.items():
        got = nt.parse_log(DATA / name)
        assert [(r.collective, len(r.ranks), len(r.hosts), len(r.rows)) for r in got] == runs, name
        assert all(r.unreadable == 0 for r in got)


@pytest.mark.parametrize("base, logs, bounds", [
    # (log, lowest and highest plausible fitted bandwidth of its level in GB/s, largest median error).
    # NICs are per GPU in these specs and a ring collective across nodes runs one ring per GPU
    # of a node (cost.py), so the fit is per NIC: 8 rails of 2 x 200 Gb/s (OCI H100) or
    # 2 x 100 Gb/s (OCI A100) are 50 and 25 GB/s each.
    ("dgx-h100-4x8.yaml", ["gcp-a3mega-h100-2x8-all_reduce.log"], {"infiniband": (20, 50, 0.25)}),
    ("dgx-h100-4x8.yaml", ["oci-bm-gpu-h100.8-2x8-all_reduce.log"], {"infiniband": (45, 65, 0.05)}),
    ("dgx-a100-8x8.yaml", ["oci-bm-gpu4.8-a100-1x8-2x8-all_reduce.log", "gpu=a100-nvlink-1x8-sendrecv.log"],
     {"nvswitch": (150, 300, 0.15), "infiniband": (20, 30, 0.05)}),
])
def test_real_logs_give_a_sane_fit(base, logs, bounds):
    args = [str(DATA / log) if "=" not in log else log.split("=")[0] + "=" + str(DATA / log.split("=")[1])
            for log in logs]
    cal = nt.calibrate(CLUSTERS / base, args)
    for lv in cal.levels:
        low, high, worst = bounds[lv.interconnect]
        assert low * 1e9 <= lv.bandwidth <= high * 1e9, (lv.interconnect, lv.bandwidth)
        assert 0 <= lv.latency <= 50e-6 and all(0 < e <= 1 for e in lv.efficiency.values())
        assert lv.median_error <= worst, (lv.interconnect, lv.median_error)
    load_cluster_spec("<fitted>", cal.yaml())


# -- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"hello\nworld\n", "no nccl-tests result table"),
    (b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4, "binary file"),
    (b"#       size   count   type  redop  root  time  algbw  busbw #wrong\n  1048576  26", ":1: the nccl-tests table"),
    (b"#  size count type redop root time algbw busbw #wrong\n 8 2 float sum -1 1e999 0 0 0\n", "no readable result"),
])
def test_unusable_logs_are_refused_with_file_and_line(tmp_path, content, message):
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    with pytest.raises(SpecError, match=re.escape(message)) as info:
        nt.parse_log(p)
    assert str(p) in str(info.value)


def test_folders_missing_and_oversized_files_are_refused(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match="is a folder"):
        nt.parse_log(tmp_path)
    with pytest.raises(SpecError, match="no such file"):
        nt.parse_log(tmp_path / "missing.log")
    big = tmp_path / "big.log"
    big.write_text(synthetic_log("allreduce", 1, 8))
    monkeypatch.setattr(nt, "MAX_LOG_BYTES", 1000)
    with pytest.raises(SpecError, match="is larger than"):
        nt.parse_log(big)


VALID = synthetic_log("allreduce", 2, 4, sizes=[8, 4096, 1 << 20, 1 << 26], levels=(("node", 2), ("gpu", 4)))


@st.composite
def damaged_logs(draw):
    """A valid log, then lines dropped, duplicated or cut, tokens swapped for huge or odd
    numbers, and junk (control characters, binary, unicode) put in."""
    lines = VALID.splitlines()
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "dup", "cut", "token", "junk"]))
        if action == "drop":
            del lines[i]
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif action == "token":
            tokens = lines[i].split() or [""]
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[j] = draw(st.sampled_from(["1e308", "1e-300", "inf", "nan", "-5", "0", "N/A",
                                              "99999999999999999999999999", "1" * 400, "#", "Rank", "size"]))
            lines[i] = "  ".join(tokens)
        else:
            lines.insert(i, draw(st.text(max_size=80)))
        if not lines:
            break
    return "\n".join(lines).encode("utf-8", errors="replace") + draw(st.binary(max_size=40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=damaged_logs())
def test_damaged_logs_give_a_fit_or_a_spec_error_never_a_traceback(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("damaged")
    base = d / "base.yaml"
    base.write_text(cluster_text(BASE, levels=(("node", 2), ("gpu", 4))))
    p = d / "all_reduce_perf.log"
    p.write_bytes(data)
    try:
        cal = nt.calibrate(base, [str(p)])
    except SpecError as exc:
        assert str(exc)
        return
    for lv in cal.levels:
        assert np.isfinite(lv.latency) and lv.latency >= 0 and 0 < lv.bandwidth <= nt.MAX_BANDWIDTH
    load_cluster_spec("<fitted>", cal.yaml())


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=400))
def test_arbitrary_text_is_read_or_refused(text):
    try:
        runs = nt.parse_text(text, "junk.log")
    except SpecError as exc:
        assert "junk.log" in str(exc)
    else:
        assert all(r.rows for r in runs)


# -- the command -----------------------------------------------------------------------

def test_cli_refuses_bad_input_with_exit_2_and_one_line(synthetic, tmp_path):
    from typer.testing import CliRunner

    from solver_planner.cli import app

    d, base, paths = synthetic
    empty, binary = tmp_path / "empty.log", tmp_path / "binary.log"
    empty.write_text("")
    binary.write_bytes(b"\x00\x01" * 100)
    cases = [
        ([str(empty)], "is empty"),
        ([str(binary)], "binary file"),
        ([str(tmp_path)], "is a folder"),
        ([str(tmp_path / "nope.log")], "no such file"),
        (["gpu=" + str(paths[0]), str(paths[-1])], None),         # explicit level agreeing: fine
        (["node=" + str(paths[0])], "exercise level 'gpu', not 'node'"),
    ]
    runner = CliRunner()
    for logs, message in cases:
        r = runner.invoke(app, ["calibrate", "--from-nccl-tests", *logs, "--cluster", str(base)])
        if message is None:
            assert r.exit_code == 0, r.output
            continue
        assert r.exit_code == 2, (logs, r.output)
        assert message in r.stderr and "Traceback" not in r.output
        assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["calibrate", "--from-nccl-tests", str(paths[0])])
    assert r.exit_code == 2 and "--cluster" in r.stderr
    r = runner.invoke(app, ["calibrate", str(paths[0]), "--cluster", str(base)])
    assert r.exit_code == 2 and "--from-nccl-tests" in r.stderr
    r = runner.invoke(app, ["calibrate", "--from-nccl-tests", str(paths[0]), "--cluster", str(base), "-o",
                            str(tmp_path / "no" / "such" / "dir.yaml")])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    r = runner.invoke(app, ["calibrate", "--from-nccl-tests", str(empty), "--cluster", str(base), "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["file"] == str(empty)


@pytest.mark.slow
def test_cli_writes_a_spec_that_place_and_stages_use(tmp_path):
    levels = (("host", 2), ("proc", 4))          # the shape of specs/models/local-2x4.yaml
    logs = []
    for kind, hosts, per in (("allreduce", 1, 4), ("allgather", 1, 4), ("allreduce", 2, 4)):
        p = tmp_path / f"{kind}-{hosts}x{per}.log"
        p.write_text(synthetic_log(kind, hosts, per, levels=levels, seed=hosts))
        logs.append(p)
    base = tmp_path / "base.yaml"
    base.write_text(cluster_text(BASE, levels=levels, name="two-hosts"))
    out = tmp_path / "fitted.yaml"
    r = run_cli("calibrate", "--from-nccl-tests", *logs, "--cluster", base, "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert {lv["interconnect"] for lv in report["levels"]} == {"nvswitch", "nic"}
    assert all(log["median_relative_error"] < 0.03 for log in report["logs"])
    nvs = next(lv for lv in report["levels"] if lv["interconnect"] == "nvswitch")
    assert nvs["bandwidth"] == pytest.approx(300e9, rel=0.03) and nvs["efficiency"]["allreduce"] == \
        pytest.approx(0.8, rel=0.03)
    assert "calibrate --from-nccl-tests" in out.read_text().splitlines()[0]
    r = run_cli("place", out, SPECS / "models" / "local-2x4.yaml", "--json")
    assert r.returncode == 0, r.stderr
    r = run_cli("show", out)
    assert r.returncode == 0, r.stderr
    fitted_h100 = tmp_path / "h100.yaml"
    r = run_cli("calibrate", "--from-nccl-tests", DATA / "gcp-a3mega-h100-2x8-all_reduce.log", "--cluster",
                CLUSTERS / "dgx-h100-4x8.yaml", "-o", fitted_h100)
    assert r.returncode == 0, r.stderr
    assert "infiniband" in r.stdout and "gcp-a3mega-h100-2x8-all_reduce.log" in fitted_h100.read_text()
    r = run_cli("stages", fitted_h100, SPECS / "models" / "gpt3-2.6b.yaml")
    assert r.returncode == 0, r.stderr


def test_wrong_results_out_of_range_times_and_an_unknown_level_are_said(tmp_path):
    """A row nccl-tests itself found wrong (#wrong > 0) was fitted, a negative time dropped
    without a word, and LEVEL=FILE with a level the base has not was 'no such file'."""
    log = ROOT / "benchmarks" / "data" / "nccl-tests" / "oci-bm-gpu-h100.8-2x8-all_reduce.log"
    out, edited = [], 0
    for line in log.read_text().splitlines():
        tokens = line.split()
        if tokens and tokens[0].isdigit() and len(tokens) >= 12 and edited < 2:
            if edited == 0:
                tokens[8] = "3"                   # the out-of-place #wrong
            else:
                tokens[5] = "-" + tokens[5]       # a negative out-of-place time
            edited += 1
            line = "  " + "  ".join(tokens)
        out.append(line)
    bad = tmp_path / "bad.log"
    bad.write_text("\n".join(out) + "\n")
    cluster = CLUSTERS / "dgx-h100-4x8.yaml"
    r = run_cli("calibrate", "--from-nccl-tests", bad, "--cluster", cluster, "-o", tmp_path / "f.yaml")
    assert r.returncode == 0, r.stderr
    assert "1 row(s) report wrong results (#wrong is not 0) and were skipped" in r.stderr
    assert "1 time(s) out of range (negative, zero or past" in r.stderr
    r = run_cli("calibrate", "--from-nccl-tests", f"foo={log}", "--cluster", cluster, "-o", tmp_path / "g.yaml")
    assert r.returncode == 2 and "no level 'foo'" in r.stderr and "its levels are node, gpu" in r.stderr
    # every row flagged wrong: said so, not "no readable result row (truncated?)"
    out = []
    for line in log.read_text().splitlines():
        tokens = line.split()
        if tokens and tokens[0].isdigit() and len(tokens) >= 12:
            tokens[8] = "5"
            line = "  " + "  ".join(tokens)
        out.append(line)
    bad.write_text("\n".join(out) + "\n")
    r = run_cli("calibrate", "--from-nccl-tests", bad, "--cluster", cluster, "-o", tmp_path / "h.yaml")
    assert r.returncode == 2 and "reports wrong results (#wrong is not 0): nothing to fit" in r.stderr, r.stderr
