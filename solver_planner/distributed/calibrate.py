"""Calibration: measure this machine's torch.distributed calls and write a cluster spec.

Every process of a local job times, at several sizes, a point-to-point transfer, the same
transfer on every disjoint pair at once, and the five collectives on all ranks (and an
all-reduce on every pair at once); a call's time is the span from the first rank starting
to the last finishing, after a barrier; the median over repetitions is kept.

The spec written has the levels the user asks for (e.g. ``host=2,proc=4``, so that
placements and resharding meshes of a real cluster can be tried locally).  All local
processes talk over the same loopback, so every level gets the same two numbers,
``latency`` (alpha) and ``bandwidth`` (B): the innermost level's interconnect carries
them and every outer one is crossed ``via`` it, so that all transfers share its ports.
They are fitted by least squares, on relative errors, to the cost model's own formulas
(:mod:`solver_planner.cost`): for a fixed call the model is ``alpha * a + b / (B e_c)`` with
``a`` and ``b`` read off the model itself and ``e_c`` the efficiency of the call's
collective (``sendrecv`` for point-to-point): the fastest collective gets 1 and ``B``, the
others their fraction of it, written as the interconnects' ``efficiency``.  Two port layouts are fitted, one port per
process and one port shared by all processes (a machine whose cores, not its links,
bound the throughput), and the one that fits better is written.

Each process also measures the compute model of its device (:mod:`solver_planner.compute`,
:func:`_device_profile`): matrix multiplies fitted to the GEMM line, an empty kernel for the
launch overhead, and copies of several sizes fitted to ``overhead + bytes / memory_bandwidth``;
on a GPU the multiplies run in its 16-bit dtypes too, and their rate is the spec's ``flops``.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import units
from ..compute import fit_matmul, fit_stream
from ..cost import CostModel
from ..errors import PlannerError
from ..spec.cluster import load_cluster_spec
from ..topology import Topology
from .launch import choose_backend, join_job, run_workers

__all__ = ["KINDS", "Measurement", "Fit", "Calibration", "measure", "fit", "calibrate", "calibration_of",
           "compute_block", "dtype_rates", "memory_bandwidth", "cluster_yaml", "parse_levels", "DEFAULT_SIZES"]

KINDS = ("p2p", "p2p-pairs", "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "allreduce-pairs")
DEFAULT_SIZES = (4 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024)
# Sizes timed for the compute model, per device kind: matrix sides (square multiplies) and
# copied buffers (each read once and written once).  A GPU's multiplies of a few hundred
# rows take less than a kernel launch, and its small copies stay in its L2 cache (40-50 MB
# on an A100 or H100), so it gets larger ones.  On a CPU all of them together take well under
# a second.
MATMUL_SIDES = {"cpu": (64, 128, 256, 384, 512), "cuda": (1024, 2048, 4096, 6144, 8192)}
COPY_SIZES = {"cpu": tuple(m * 2**20 for m in (1, 4, 16, 64)), "cuda": tuple(m * 2**20 for m in (16, 64, 256, 1024))}
HALF_DTYPES = ("bfloat16", "float16")     # a GPU's 16-bit dtypes, the first it supports gives `flops`
BEST_OF = 7                               # runs of each multiply and copy (the fastest is kept)
OVERHEAD_RUNS = 50                        # runs of the empty kernel


@dataclass(frozen=True)
class Measurement:
    kind: str
    nbytes: int
    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@dataclass(frozen=True)
class Fit:
    sharing: str
    latency: float
    bandwidth: float
    error: float  # root mean square of (predicted / measured - 1)
    ratios: dict[str, float]  # per kind: median of measured / predicted
    efficiency: dict[str, float] = field(default_factory=dict)   # per collective, below 1 only


@dataclass
class Calibration:
    world: int
    backend: str
    levels: list[tuple[str, int]]
    measurements: list[Measurement]
    flops: float
    memory: float
    fits: list[Fit]
    compute: dict | None = None      # the device's compute block (solver_planner.compute), fitted
    memory_bandwidth: float | None = None
    notes: list[str] = field(default_factory=list)   # what the fit had to work around
    dtype_flops: dict[str, float] = field(default_factory=dict)   # rates of the other dtypes timed (a GPU's)
    profile: dict | None = None      # the device's timings (medians over processes), see _device_profile

    @property
    def best(self) -> Fit:
        return min(self.fits, key=lambda f: (f.error, f.sharing))

    def spec(self, name: str | None = None) -> dict[str, Any]:
        return cluster_dict(name or f"local-{self.backend}-{self.world}", self.levels, self.best, self.flops,
                            self.memory, self.compute, self.memory_bandwidth, self.dtype_flops)

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        topo = self.topology(best)
        return {"world": self.world, "backend": self.backend, "levels": [list(lv) for lv in self.levels],
                "flops": self.flops, "dtype_flops": dict(self.dtype_flops), "memory": self.memory,
                "memory_bandwidth": self.memory_bandwidth, "compute": self.compute, "notes": list(self.notes),
                "device_profile": self.profile,
                "fit": {"sharing": best.sharing, "latency": best.latency, "bandwidth": best.bandwidth,
                        "efficiency": best.efficiency,
                        "rms_relative_error": best.error, "measured_over_predicted": best.ratios},
                "fits": [{"sharing": f.sharing, "latency": f.latency, "bandwidth": f.bandwidth,
                          "rms_relative_error": f.error} for f in self.fits],
                "measurements": [{"kind": m.kind, "bytes": m.nbytes, "median": m.median,
                                  "predicted": predict(topo, m), "times": list(m.times)}
                                 for m in self.measurements]}

    def topology(self, f: Fit) -> Topology:
        return topology_for(self.levels, f.sharing, f.latency, f.bandwidth, f.efficiency)


def parse_levels(text: str | None, world: int) -> list[tuple[str, int]]:
    """``"host=2,proc=4"`` -> ``[("host", 2), ("proc", 4)]``; default one host of ``world`` processes."""
    if not text:
        return [("host", 1), ("proc", world)]
    levels = []
    for part in text.split(","):
        name, _, count = part.partition("=")
        if not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"--levels expects name=count pairs such as host=2,proc=4; got {part!r}")
        levels.append((name.strip(), int(count)))
    product = 1
    for _, c in levels:
        product *= c
    if product != world:
        raise ValueError(f"--levels {text} has {product} devices but --world is {world}")
    return levels


def _pairs(world: int) -> list[list[int]]:
    return [[2 * i, 2 * i + 1] for i in range(world // 2)]


def _worker(rank: int, world: int, backend: str, store: str, sizes: Sequence[int], repeat: int, timeout: float,
            results) -> None:
    import traceback

    try:
        import torch
        import torch.distributed as dist

        from .interpreter import ALL_GATHER as ag
        from .interpreter import REDUCE_SCATTER as rs

        device = join_job(rank, world, backend, store, timeout)
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        pairs = _pairs(world)
        pair_groups = [dist.new_group(p) for p in pairs]
        mine = next((g for p, g in zip(pairs, pair_groups) if rank in p), None)
        pair_rank = next((p for p in pairs if rank in p), None)
        records = []
        # All ranks at once: what one process gets while the others work too.
        dist.barrier()
        profile = _device_profile(torch, device, sync)
        for size in sizes:
            elems = max(world, size // 4 // world * world)  # divisible by world for the scatter and gather
            full = torch.ones(elems, device=device)
            part = torch.ones(elems // world, device=device)
            for kind in KINDS:
                for rep in range(repeat + 1):  # the first run warms up
                    dist.barrier()
                    start = time.perf_counter()
                    took_part = True
                    if kind == "p2p":
                        if rank == 0:
                            dist.send(full, 1)
                        elif rank == 1:
                            dist.recv(full, 0)
                        else:
                            took_part = False
                    elif kind == "p2p-pairs":
                        if pair_rank is None:
                            took_part = False
                        elif rank == pair_rank[0]:
                            dist.send(full, pair_rank[1])
                        else:
                            dist.recv(full, pair_rank[0])
                    elif kind == "allreduce":
                        dist.all_reduce(full)
                    elif kind == "reducescatter":
                        rs(part, full)
                    elif kind == "allgather":
                        ag(full, part)
                    elif kind == "broadcast":
                        dist.broadcast(full, src=0)
                    elif kind == "reduce":
                        dist.reduce(full, dst=0)
                    elif kind == "allreduce-pairs":
                        if mine is None:
                            took_part = False
                        else:
                            dist.all_reduce(full, group=mine)
                    sync()
                    if rep and took_part:
                        records.append((kind, elems * 4, rep, start, time.perf_counter()))
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, {"records": records, "profile": profile}, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, traceback.format_exc()))


def _device_profile(torch, device, sync) -> dict:
    """The compute model's measurements (:mod:`solver_planner.compute`), each the best time of
    several runs:

    * ``matmul``: ``(FLOPs, seconds)`` of single square multiplies of several sizes in
      ``dtype``, the dtype whose rate is the spec's ``flops``: float32 on a CPU, on a GPU
      (``device`` ``cuda:N``) the first of :data:`HALF_DTYPES` it supports (bfloat16 only if
      ``torch.cuda.is_bf16_supported()``);
    * ``dtype_matmul`` (GPU only): the same for the other dtypes timed, ``{dtype: points}``
      (float32, and float16 when bfloat16 gave ``flops``), written as ``dtype_flops``;
    * ``overhead``: an almost empty kernel;
    * ``copies``: ``(bytes moved, seconds)`` of copies of several sizes (read once, written
      once: twice the buffer), and ``bandwidth`` fitted to them (:func:`memory_bandwidth`).
    """
    kind = "cuda" if str(device).startswith("cuda") else "cpu"

    def best_time(fn, repeat: int = BEST_OF) -> float:
        # the fastest of several runs: on a shared machine other work only ever adds time,
        # so the minimum is the estimate least disturbed by it (a median of 5 inverted the
        # order of two matrix sizes on a loaded 2-core CI machine)
        fn()
        sync()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    def matmuls(dtype: str) -> list[tuple[float, float]]:
        points = []
        for n in MATMUL_SIDES[kind]:
            a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
            points.append((2.0 * n ** 3, best_time(lambda: a @ a)))
            del a
        return points

    dtypes = ["float32"]
    if kind == "cuda":
        # float32 at torch's default matmul precision (no TF32), the float32 peak dtype_flops means
        halves = [d for d in HALF_DTYPES if d != "bfloat16" or torch.cuda.is_bf16_supported()]
        dtypes = halves + dtypes
    timed = {d: matmuls(d) for d in dtypes}
    one = torch.ones(1, device=device)
    overhead = best_time(lambda: one.add_(1.0), OVERHEAD_RUNS)
    copies = []
    for size in COPY_SIZES[kind]:
        src = torch.ones(size // 4, device=device)
        out = torch.empty_like(src)             # preallocated: time the copy, not the allocation
        copies.append((2.0 * size, best_time(lambda: out.copy_(src))))
        del src, out
    profile: dict[str, Any] = {"dtype": dtypes[0], "matmul": timed[dtypes[0]], "overhead": overhead,
                               "copies": copies}
    if len(dtypes) > 1:
        profile["dtype_matmul"] = {d: timed[d] for d in dtypes[1:]}
    profile["bandwidth"] = memory_bandwidth(profile)[0]
    return profile


def _median_points(lists: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """``(x, seconds)`` lists of the same ``x`` from several processes -> median seconds per ``x``."""
    return [(x, statistics.median(pts[i][1] for pts in lists)) for i, (x, _) in enumerate(lists[0])]


def measure(world: int, backend: str = "auto", sizes: Sequence[int] = DEFAULT_SIZES, repeat: int = 10,
            timeout: float = 300.0) -> tuple[str, list[Measurement], dict]:
    """Run the measurements on ``world`` local processes: (backend used, medians, the
    device's compute profile: medians over processes)."""
    if world < 2:
        raise PlannerError("calibration needs at least 2 processes")
    backend = choose_backend(backend, world)
    with tempfile.TemporaryDirectory(prefix="solver-planner-") as tmp:
        per_rank = run_workers(_worker, world, (backend, os.path.join(tmp, "store"), list(sizes), repeat, timeout),
                               timeout)
    spans: dict[tuple[str, int], dict[int, list[float]]] = {}
    for result in per_rank:
        for kind, nbytes, rep, start, end in result["records"]:
            span = spans.setdefault((kind, nbytes), {}).setdefault(rep, [float("inf"), float("-inf")])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    out = [Measurement(kind, nbytes, tuple(e - s for _, (s, e) in sorted(reps.items())))
           for (kind, nbytes), reps in spans.items()]
    out.sort(key=lambda m: (KINDS.index(m.kind), m.nbytes))
    profiles = [r["profile"] for r in per_rank]
    profile: dict[str, Any] = {"dtype": profiles[0]["dtype"], "matmul": _median_points([p["matmul"] for p in profiles]),
                               "overhead": statistics.median(p["overhead"] for p in profiles),
                               "copies": _median_points([p["copies"] for p in profiles])}
    if "dtype_matmul" in profiles[0]:
        profile["dtype_matmul"] = {d: _median_points([p["dtype_matmul"][d] for p in profiles])
                                   for d in profiles[0]["dtype_matmul"]}
    # the bandwidth fitted to the median copies, not a median of each process's fit
    profile["bandwidth"] = memory_bandwidth(profile)[0]
    return backend, out, profile


def cluster_dict(name: str, levels: Sequence[tuple[str, int]], f: Fit, flops: float, memory: float,
                 compute: dict | None = None, memory_bandwidth: float | None = None,
                 dtype_flops: dict[str, float] | None = None) -> dict:
    inner = levels[-1][0]
    eff = {"efficiency": {k: float(f"{v:.4g}") for k, v in f.efficiency.items()}} if f.efficiency else {}
    ics = [{"name": "loopback", "level": inner, "bandwidth": f"{f.bandwidth / 1e6:.6g} MB/s",
            "latency": f"{f.latency * 1e6:.6g}us", "sharing": f.sharing, **eff}]
    for lv, _ in levels[:-1]:
        # Another level of the same machine: the same loopback, so no latency or bandwidth of its own.
        ics.append({"name": f"{lv}-loopback", "level": lv, "bandwidth": f"{f.bandwidth / 1e6:.6g} MB/s",
                    "latency": "0us", "via": ["loopback"], **eff})
    device: dict[str, Any] = {"name": "cpu-process", "flops": f"{flops / 1e9:.4g} GFLOP/s",
                              "memory": f"{memory / 2 ** 30:.4g} GiB"}
    if dtype_flops:
        device["dtype_flops"] = {d: f"{v / 1e9:.4g} GFLOP/s" for d, v in dtype_flops.items()}
    if memory_bandwidth:
        device["memory_bandwidth"] = f"{memory_bandwidth / 1e9:.4g} GB/s"
    if compute:
        device["compute"] = {"matmul_efficiency": compute["matmul_efficiency"],
                             "half_efficiency_flops": f"{compute['half_efficiency_flops'] / 1e6:.4g} MFLOP",
                             "kernel_overhead": f"{compute['kernel_overhead'] * 1e6:.4g}us"}
    return {"name": name, "levels": [{"name": n, "count": c} for n, c in levels], "device": device,
            "interconnects": ics}


MAX_BANDWIDTH = units.LIMITS["bandwidth"][1]     # the largest bandwidth a cluster spec accepts


def topology_for(levels: Sequence[tuple[str, int]], sharing: str, latency: float, bandwidth: float,
                 efficiency: dict[str, float] | None = None) -> Topology:
    import yaml

    f = Fit(sharing, latency, bandwidth, 0.0, {}, dict(efficiency or {}))
    text = yaml.safe_dump(cluster_dict("fit", levels, f, 1e9, 2 ** 30), sort_keys=False)
    return Topology(load_cluster_spec("<calibration>", text))


def predict(topo: Topology, m: Measurement) -> float:
    """The cost model's time for a measured call (ranks = devices)."""
    cost = CostModel(topo)
    world = topo.num_devices
    pairs = _pairs(world)
    if m.kind == "p2p":
        return cost.transfer_time(0, 1, m.nbytes)
    if m.kind == "p2p-pairs":
        return cost.transfers_time([tuple(p) for p in pairs], m.nbytes)
    if m.kind == "allreduce-pairs":
        return cost.collective("allreduce", pairs, m.nbytes).time
    return cost.collective(m.kind, [list(range(world))], m.nbytes).time


def fit(levels: Sequence[tuple[str, int]], measurements: Sequence[Measurement], world: int) -> list[Fit]:
    """Least-squares ``latency``, ``bandwidth`` and per-collective ``efficiency`` for each
    port layout (module docstring)."""
    fits = []
    for sharing in ("device", f"{world} devices"):
        # The model is alpha * a + b / B: read b (alpha = 0, B = 1) and a + b (alpha = 1, B = 1)
        # off it (specs refuse an infinite bandwidth, so a is not read at B -> infinity).
        unit, no_latency = topology_for(levels, sharing, 1.0, 1.0), topology_for(levels, sharing, 0.0, 1.0)
        b = np.array([predict(no_latency, m) for m in measurements])
        a = np.array([predict(unit, m) for m in measurements]) - b
        y = np.array([m.median for m in measurements])
        rows = np.stack([a / y, b / y], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(rows, np.ones(len(y)), rcond=None)
        if alpha < 0:
            alpha, beta = 0.0, float(np.dot(rows[:, 1], np.ones(len(y))) / np.dot(rows[:, 1], rows[:, 1]))
        if beta <= 0:
            # Noise hid the growth with size: take the smallest bandwidth no measurement
            # contradicts (b / B <= measured for all) and fit the latency alone.
            beta = float(np.min(y / b))
            rest = 1 - beta * rows[:, 1]
            alpha = max(0.0, float(np.dot(rows[:, 0], rest) / np.dot(rows[:, 0], rows[:, 0])))
        alpha, betas = _per_collective(rows, [COLLECTIVE_OF[m.kind] for m in measurements], float(alpha), beta)
        pred = alpha * a + np.array([betas[COLLECTIVE_OF[m.kind]] for m in measurements]) * b
        error = float(np.sqrt(np.mean((pred / y - 1) ** 2)))
        ratios = {k: float(np.median([y[i] / pred[i] for i, m in enumerate(measurements) if m.kind == k]))
                  for k in dict.fromkeys(m.kind for m in measurements)}
        # the fastest collective runs at the bandwidth, the others at their efficiency of it
        fastest = min(betas.values())
        efficiency = {c: float(fastest / v) for c, v in sorted(betas.items()) if fastest / v < 1 - 1e-9}
        # a bandwidth no measurement can tell from infinite is written as the largest a spec holds
        fits.append(Fit(sharing, float(alpha), float(min(1 / fastest, MAX_BANDWIDTH)), error, ratios, efficiency))
    return fits


# which collective's efficiency (cluster spec key) each measured call reaches
COLLECTIVE_OF = {"p2p": "sendrecv", "p2p-pairs": "sendrecv", "allreduce": "allreduce",
                 "allreduce-pairs": "allreduce", "reducescatter": "reducescatter", "allgather": "allgather",
                 "broadcast": "broadcast", "reduce": "reduce"}


def _per_collective(rows: np.ndarray, keys: list[str], alpha: float, beta: float
                    ) -> tuple[float, dict[str, float]]:
    """The model ``alpha a + b / (B e_c)`` with one ``beta_c = 1 / (B e_c)`` per collective:
    linear least squares on relative errors (``rows`` = [a / y, b / y]).  A negative latency
    is refitted at 0; a collective whose ``beta_c`` noise makes non-positive keeps the common
    fit's ``beta``."""
    names = list(dict.fromkeys(keys))
    design = np.zeros((len(keys), 1 + len(names)))
    design[:, 0] = rows[:, 0]
    for i, k in enumerate(keys):
        design[i, 1 + names.index(k)] = rows[i, 1]
    ones = np.ones(len(keys))
    solution, *_ = np.linalg.lstsq(design, ones, rcond=None)
    if solution[0] < 0:
        solution = np.concatenate([[0.0], np.linalg.lstsq(design[:, 1:], ones, rcond=None)[0]])
    betas = {k: float(v) if v > 0 else beta for k, v in zip(names, solution[1:])}
    if any(v <= 0 for v in solution[1:]):
        # refit the latency against the betas kept
        rest = ones - np.array([betas[k] for k in keys]) * rows[:, 1]
        denom = float(np.dot(rows[:, 0], rows[:, 0]))
        return (max(0.0, float(np.dot(rows[:, 0], rest) / denom)) if denom > 0 else 0.0), betas
    return float(solution[0]), betas


def calibrate(world: int, backend: str = "auto", levels: str | None = None, sizes: Sequence[int] = DEFAULT_SIZES,
              repeat: int = 10, timeout: float = 300.0) -> Calibration:
    parsed = parse_levels(levels, world)
    used, measured, profile = measure(world, backend, sizes, repeat, timeout)
    return calibration_of(world, used, parsed, measured, profile)


def calibration_of(world: int, backend: str, levels: Sequence[tuple[str, int]], measured: Sequence[Measurement],
                   profile: dict) -> Calibration:
    """The :class:`Calibration` of measured calls and a device profile (:func:`_device_profile`,
    medians over processes): the interconnect fit, the compute block, the other dtypes' rates and
    the memory bandwidth, with a note for every fit that had to fall back."""
    flops, compute, notes = compute_block(profile)
    rates, rate_notes = dtype_rates(profile)
    bandwidth, bandwidth_notes = memory_bandwidth(profile)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
    return Calibration(world, backend, list(levels), list(measured), flops, memory, fit(levels, measured, world),
                       compute, bandwidth, notes + rate_notes + bandwidth_notes, rates, profile)


def compute_block(profile: dict) -> tuple[float, dict, list[str]]:
    """(the spec's flops, its ``compute`` block, notes) from a device profile.

    The rate large multiplies tend to is the spec's flops (efficiency 1 of it); the overhead
    and the size at which half of it is reached come from the line's intercept.  When the
    timings are too disturbed for a line (larger multiplies not slower: a busy machine), the
    rate is the fastest one observed and the half-efficiency size 0 -- a model that is never
    slower than what was measured -- and a note says so instead of failing minutes of work.
    """
    overhead = profile["overhead"]
    flops, half, notes = _matmul_line(profile["matmul"], overhead, "flops")
    compute = {"matmul_efficiency": 1.0, "half_efficiency_flops": half, "kernel_overhead": overhead}
    return flops, compute, notes


def _matmul_line(points, overhead: float, key: str) -> tuple[float, float, list[str]]:
    """(rate, half-efficiency FLOPs, notes): :func:`~solver_planner.compute.fit_matmul`, or the
    fastest rate observed (with a note naming the spec's ``key``) when no line fits."""
    try:
        rate, half = fit_matmul(points, overhead)
        return rate, half, []
    except ValueError as exc:
        rates = [f / max(t - overhead, t / 2) for f, t in points if f > 0 and t > 0]
        if not rates:
            raise PlannerError(f"no usable matrix-multiply timings: {exc}") from None
        rate = max(rates)
        return rate, 0.0, [f"{exc} (the machine was probably busy): {key} is the fastest rate observed,"
                           f" {rate / 1e9:.3g} GFLOP/s, with no half-efficiency size; calibrate again on an idle"
                           " machine"]


def dtype_rates(profile: dict) -> tuple[dict[str, float], list[str]]:
    """(the spec's ``dtype_flops``, notes) from a device profile: the rate large multiplies of
    each other dtype timed (``profile["dtype_matmul"]``, a GPU's) tend to, fitted as ``flops``
    is (:func:`compute_block`); empty on a CPU, where float32 is ``flops`` itself.  The compute
    block (half-efficiency size, overhead) stays the one of ``flops``' dtype."""
    rates: dict[str, float] = {}
    notes: list[str] = []
    for dtype, points in profile.get("dtype_matmul", {}).items():
        rates[dtype], _, more = _matmul_line(points, profile["overhead"], f"dtype_flops.{dtype}")
        notes += more
    return rates, notes


def memory_bandwidth(profile: dict) -> tuple[float, list[str]]:
    """(the spec's ``memory_bandwidth``, notes) from a device profile's copies:
    :func:`~solver_planner.compute.fit_stream` with the profile's kernel overhead.  When the
    timings are too disturbed for a fit (larger copies not slower: a busy machine), the largest
    copy's rate, with a note, as :func:`compute_block` does for the multiplies.  A profile
    without copies keeps its ``bandwidth``."""
    copies = profile.get("copies")
    if not copies:
        return profile["bandwidth"], []
    try:
        bandwidth, notes = fit_stream(copies, profile["overhead"]), []
    except ValueError as exc:
        usable = [(m, t) for m, t in copies if m > 0 and t > 0]
        if not usable:
            raise PlannerError(f"no usable copy timings: {exc}") from None
        moved, took = max(usable)
        bandwidth = moved / took
        notes = [f"{exc} (the machine was probably busy): memory_bandwidth is the rate of the largest copy"
                 f" ({units.format_bytes(moved / 2)}), {units.format_bandwidth(bandwidth)}; calibrate again on an"
                 " idle machine"]
    # a bandwidth no copy can tell from infinite is written as the largest a spec holds
    return min(bandwidth, MAX_BANDWIDTH), notes


def cluster_yaml(cal: Calibration, name: str | None = None, command: str = "") -> str:
    """The cluster spec as YAML, with comments saying how it was measured and how well it fits."""
    import yaml

    best = cal.best
    sizes = sorted({m.nbytes for m in cal.measurements})
    lines = [f"# Calibrated{' by `' + command + '`' if command else ''} on {socket.gethostname()}"
             f" ({os.cpu_count()} cores): {cal.world} {cal.backend} processes.",
             f"# Calls of {units.format_bytes(sizes[0])} to {units.format_bytes(sizes[-1])}, median of"
             f" {len(cal.measurements[0].times)} runs each, fitted to the cost model's formulas",
             f"# (least squares on relative error): latency {units.format_time(best.latency)},"
             f" bandwidth {units.format_bandwidth(best.bandwidth)},",
             f"# ports: {'one per process' if best.sharing == 'device' else 'one shared by all processes'}"
             f" (rms relative error {best.error:.2f}; the other layout: "
             + ", ".join(f"{f.error:.2f}" for f in cal.fits if f is not best) + ").",
             "# measured / predicted, median per call: "
             + ", ".join(f"{k} {v:.2f}" for k, v in best.ratios.items()) + ".",
             "# Every level is the same machine, so outer levels reach each other through the loopback."]
    lines += _device_lines(cal)
    lines += [f"# Note: {note}" for note in cal.notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(cal.spec(name), sort_keys=False)


def _device_lines(cal: Calibration) -> list[str]:
    """Comment lines saying how the device's compute numbers were measured (empty without a profile)."""
    p = cal.profile
    if not p:
        return []
    sides = [round((f / 2) ** (1 / 3)) for f, _ in p["matmul"]]
    dtype = p.get("dtype", "float32")
    dtypes = " and ".join([dtype, *p.get("dtype_matmul", {})])
    rates = "".join(f", dtype_flops.{d} {units.format_flop_rate(v)}" for d, v in cal.dtype_flops.items())
    half = (cal.compute or {}).get("half_efficiency_flops", 0.0)
    line = _how(fit_matmul, p["matmul"], p["overhead"], "the compute model's line")
    lines = [f"# Device (fastest run of each, median over processes): single {dtypes} matrix multiplies of side"
             f" {sides[0]} to {sides[-1]} ({len(sides)} sizes, {BEST_OF} runs each), an empty kernel"
             f" ({OVERHEAD_RUNS} runs),",
             f"# {line}: flops {units.format_flop_rate(cal.flops)} ({dtype}){rates}, half of it at"
             f" {units.format_flops(half)} per multiply, kernel_overhead {units.format_time(p['overhead'])}."]
    copies = p.get("copies")
    if copies and cal.memory_bandwidth:
        moved = [m for m, _ in copies]
        error = math.sqrt(statistics.fmean(((p["overhead"] + m / cal.memory_bandwidth) / t - 1) ** 2
                                           for m, t in copies if m > 0 and t > 0))
        lines += [f"# Copies of {units.format_bytes(min(moved) / 2)} to {units.format_bytes(max(moved) / 2)}"
                  f" ({len(copies)} sizes, each read once and written once, {BEST_OF} runs each),",
                  f"# {_how(fit_stream, copies, p['overhead'], 'kernel_overhead + bytes moved / memory_bandwidth')}:"
                  f" memory_bandwidth {units.format_bandwidth(cal.memory_bandwidth)} (rms relative error"
                  f" {error:.2f}; memory_efficiency 1)."]
    return lines


def _how(fitter, points, overhead: float, model: str) -> str:
    """'fitted to MODEL', or why not (a fallback's note says what was written instead)."""
    try:
        fitter(points, overhead)
        return f"fitted to {model}"
    except ValueError:
        return f"too disturbed to fit to {model} (see the note)"
