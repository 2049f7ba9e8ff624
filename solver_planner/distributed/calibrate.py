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
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import units
from ..compute import fit_matmul
from ..cost import CostModel
from ..errors import PlannerError
from ..spec.cluster import load_cluster_spec
from ..topology import Topology
from .launch import choose_backend, join_job, run_workers

__all__ = ["KINDS", "Measurement", "Fit", "Calibration", "measure", "fit", "calibrate", "compute_block", "cluster_yaml",
           "parse_levels", "DEFAULT_SIZES"]

KINDS = ("p2p", "p2p-pairs", "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "allreduce-pairs")
DEFAULT_SIZES = (4 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024)
MATMUL_SIDES = (64, 128, 256, 384, 512)  # float32 matrices timed for the compute model
COPY_BYTES = 64 * 2**20                   # the copy timed for the memory bandwidth


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

    @property
    def best(self) -> Fit:
        return min(self.fits, key=lambda f: (f.error, f.sharing))

    def spec(self, name: str | None = None) -> dict[str, Any]:
        return cluster_dict(name or f"local-{self.backend}-{self.world}", self.levels, self.best, self.flops,
                            self.memory, self.compute, self.memory_bandwidth)

    def as_dict(self) -> dict[str, Any]:
        best = self.best
        topo = self.topology(best)
        return {"world": self.world, "backend": self.backend, "levels": [list(lv) for lv in self.levels],
                "flops": self.flops, "memory": self.memory, "memory_bandwidth": self.memory_bandwidth,
                "compute": self.compute, "notes": list(self.notes),
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
    """The compute model's measurements (:mod:`solver_planner.compute`): the best time of
    single matrix multiplies of several sizes, of an almost empty kernel (the overhead), and
    the bandwidth of a large copy (read once, written once)."""
    def best_time(fn, repeat: int = 7) -> float:
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

    matmul = []
    for n in MATMUL_SIDES:
        a = torch.randn(n, n, device=device)
        matmul.append((2.0 * n ** 3, best_time(lambda: a @ a)))
    one = torch.ones(1, device=device)
    overhead = best_time(lambda: one.add_(1.0), 50)
    big = torch.ones(COPY_BYTES // 4, device=device)
    out = torch.empty_like(big)                 # preallocated: time the copy, not the allocation
    copy = best_time(lambda: out.copy_(big))
    return {"matmul": matmul, "overhead": overhead, "bandwidth": 2 * COPY_BYTES / copy}


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
    profile = {"matmul": [(f, statistics.median(p["matmul"][i][1] for p in profiles))
                          for i, (f, _) in enumerate(profiles[0]["matmul"])],
               "overhead": statistics.median(p["overhead"] for p in profiles),
               "bandwidth": statistics.median(p["bandwidth"] for p in profiles)}
    return backend, out, profile


def cluster_dict(name: str, levels: Sequence[tuple[str, int]], f: Fit, flops: float, memory: float,
                 compute: dict | None = None, memory_bandwidth: float | None = None) -> dict:
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
    flops, compute, notes = compute_block(profile)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
    return Calibration(world, used, parsed, measured, flops, memory, fit(parsed, measured, world), compute,
                       profile["bandwidth"], notes)


def compute_block(profile: dict) -> tuple[float, dict, list[str]]:
    """(the spec's flops, its ``compute`` block, notes) from a device profile.

    The rate large multiplies tend to is the spec's flops (efficiency 1 of it); the overhead
    and the size at which half of it is reached come from the line's intercept.  When the
    timings are too disturbed for a line (larger multiplies not slower: a busy machine), the
    rate is the fastest one observed and the half-efficiency size 0 -- a model that is never
    slower than what was measured -- and a note says so instead of failing minutes of work.
    """
    overhead = profile["overhead"]
    notes: list[str] = []
    try:
        flops, half = fit_matmul(profile["matmul"], overhead)
    except ValueError as exc:
        rates = [f / max(t - overhead, t / 2) for f, t in profile["matmul"] if f > 0 and t > 0]
        if not rates:
            raise PlannerError(f"no usable matrix-multiply timings: {exc}") from None
        flops, half = max(rates), 0.0
        notes.append(f"{exc} (the machine was probably busy): flops is the fastest rate observed,"
                     f" {flops / 1e9:.3g} GFLOP/s, with no half-efficiency size; calibrate again on an idle machine")
    compute = {"matmul_efficiency": 1.0, "half_efficiency_flops": half, "kernel_overhead": overhead}
    return flops, compute, notes


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
    return "\n".join(lines) + "\n" + yaml.safe_dump(cal.spec(name), sort_keys=False)
