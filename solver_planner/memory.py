"""The memory bounds of ``place``, ``reduce synth`` and ``reduce verify`` (:data:`MEMORY_BOUND`),
and of ``stages`` and ``plan`` (:data:`STAGES_BOUND`).

Each of these commands may use that many bytes of address space.  Before the
work, the size of the input is turned into an estimate of what the work will hold (the
coefficients below were measured with ``/usr/bin/time -v`` and the process's VmPeak on the
shipped DGX A100 specs, 16 to 100 000 devices); an input whose estimate passes the bound is
refused with exit 2, naming the bound and the size that broke it.  While the work runs,
the process's own address-space limit is the bound (:func:`bounded`), so an estimate that
fell short ends as a refusal too (the ``MemoryError`` becomes a
:class:`~solver_planner.errors.RefusedError`, exit 2) instead of the kernel
killing the process; z3 is given the same limit and then answers unknown.
"""

from __future__ import annotations

import math

import contextlib
from dataclasses import dataclass
from typing import Iterator

from .errors import RefusedError

__all__ = ["MEMORY_BOUND", "STAGES_BOUND", "Estimate", "check", "bounded", "ranking_estimate", "max_placements",
           "verify_estimate",
           "stages_estimate", "address_space", "active_bound"]

MEMORY_BOUND = 2 * 2**30          # bytes of address space: 2 GiB
# The stage search keeps [k, i] tables (first layer k, last layer i) per (mesh, micro-batch)
# pair and configuration: 128 layers on 1 024 GPUs peaked at 1.7 GB, 1 024 layers was killed
# by the kernel at 24 GB.  8 GiB holds about 250 layers with every pair's tables built.
STAGES_BOUND = 8 * 2**30

# What the interpreter and the libraries (numpy, pydantic, z3, OR-Tools) map before any work:
# 165 MB VmPeak measured for `place` on 16 devices; rounded up.
BASE = 256 * 2**20
# Ranking: the arrays of one collective over every edge of a step (held only while it is
# costed; a ring over every device of a host has as many edges per device as the host has
# devices: 4.5 KB per device measured at 8 per host), and the lowered groups every costed
# program keeps (1.6 KB per device and placement measured).
PER_EDGE = 600
PER_DEVICE_KEPT = 2 * 2**10
# Verification: the contributions a device starts with are bit sets as wide as its group
# (n**2 / 16 bytes in all), about 2 KB more per device for the lowered steps, the layout
# and the proof, and 48 bytes per (device, chunk range) value a gather or a misaligned
# reduction writes into a table of its own (33 measured: a scatter inside nodes, one
# across, gathers back, on 8 192 devices: 16.8 million values, 634 MB).
PER_DEVICE_VERIFY = 2 * 2**10
PER_VALUE = 48


_ACTIVE: list[int] = []     # the bounds of the bounded() blocks being run, innermost last


def active_bound() -> int | None:
    """The bound the running work is under (:func:`bounded`), if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@dataclass(frozen=True)
class Estimate:
    """``bytes`` the work is expected to hold at most, and ``what`` drives it (a phrase)."""

    bytes: int
    what: str


def check(estimate: Estimate, command: str, bound: int = MEMORY_BOUND) -> None:
    """Refuse (:class:`RefusedError`, exit 2) when the estimate passes the bound."""
    if estimate.bytes > bound:
        from .units import format_bytes

        need = format_bytes(estimate.bytes)
        if need == format_bytes(bound):             # just over: say by how much
            need = f"{format_bytes(bound)} and {format_bytes(estimate.bytes - bound)}"
        raise RefusedError(f"{command} would need about {need} for {estimate.what}, over its memory bound of"
                           f" {format_bytes(bound)}; refused before starting")


def ranking_estimate(devices: int, devices_per_host: int, placements: int, reductions: int,
                     at_least: str = "") -> Estimate:
    """Ranking ``placements`` x ``reductions`` (:func:`.reduction.ranking.rank_placements`);
    ``at_least``: ``"at least "`` when the placements were counted only up to a limit."""
    edges = devices * max(1, devices_per_host)
    kept = devices * placements * max(1, reductions)
    return Estimate(BASE + PER_EDGE * edges + PER_DEVICE_KEPT * kept,
                    f"{at_least}{placements} placement(s) x {max(1, reductions)} reduction(s) on {devices:,} devices")


def max_placements(devices: int, devices_per_host: int, reductions: int, bound: int = MEMORY_BOUND) -> int:
    """The most placements :func:`ranking_estimate` keeps under ``bound`` (0 when not one)."""
    left = bound - BASE - PER_EDGE * devices * max(1, devices_per_host)
    return max(0, left // (PER_DEVICE_KEPT * devices * max(1, reductions)))


def verify_estimate(devices: int, values: int = 0) -> Estimate:
    """Deciding a program on ``devices`` devices whose gathers and misaligned reductions
    write ``values`` (device, chunk range) values of their own (:func:`.reduction.verify.value_tables`)."""
    what = f"a program on {devices:,} devices" + (f" whose gathers hold {values:,} values" if values else "")
    return Estimate(BASE + devices * devices // 16 + PER_DEVICE_VERIFY * devices + PER_VALUE * values, what)


# Stage search: per (mesh, micro-batch) pair it explores, the [k, i] tables of each
# configuration (layers^2 cells while a model has at most stages.ranges.DENSE layers; past
# that, range tables of about layers x log2(layers) numbers) and the dynamic programs' band
# arrays, per stage an n x n square of the first and last layers it may hold (n = units -
# stages + 1, units = layers up to stages.coarse.EXACT, else stages.coarse.UNITS); a pair whose bands would pass
# PairProblem.DENSE_CELLS builds its cells one by one instead, about that many.  Measured on
# 1 024 A100s with every pair explored: 1.7 GB at 128 equal layers (3.1 million table cells,
# 27.9 million band cells), 9.7 GB at 256 (14.5 and 253 million); these rates cover both.
# How many pairs the branch and bound explores is not known before it runs (GPT 1T on 1 024
# GPUs: 0.7 GB, a seventeenth of every pair's), so the estimate made before starting is of
# the one pair it must explore, the least; the address-space limit covers the rest.
PER_TABLE_CELL = 100
PER_BAND_CELL = 60
PER_RANGE_NUMBER = 8 * 8          # eight range tables of float64 per configuration


def stages_estimate(layers: int, pairs: list[tuple[int, int]]) -> Estimate:
    """What a stage search over ``pairs`` (one ``(configurations, stages)`` per (mesh,
    micro-batch) pair) on ``layers`` layers must hold at least: the tables of the pair that
    needs least, for every configuration."""
    from .stages.coarse import EXACT, UNITS
    from .stages.problem import PairProblem
    from .stages.ranges import DENSE

    units = layers if layers <= EXACT else UNITS
    if layers <= DENSE:
        per_config, tables = PER_TABLE_CELL * layers * layers, f"tables over {layers} x {layers} layer ranges"
    else:
        per_config = PER_RANGE_NUMBER * layers * max(1, math.ceil(math.log2(layers)))
        tables = f"range tables over {layers:,} layers"

    def cells(c: int, s: int) -> int:
        return c * per_config + PER_BAND_CELL * min(c * s * (units - s + 1) ** 2, PairProblem.DENSE_CELLS)

    c, s = min(pairs, key=lambda cs: cells(*cs))
    return Estimate(BASE + cells(c, s), f"even its least (mesh, micro-batch) pair: {s} stages with {c} stage"
                                        f" configurations, each with {tables}")


def address_space() -> int | None:
    """The address space the process maps now (Linux ``VmSize``), or None where unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def bounded(bound: int = MEMORY_BOUND, z3: bool = False) -> Iterator[None]:
    """Run the work under an address-space limit of ``bound``, then restore the limit.

    A fresh command maps far less than the bound before its work, and gets exactly the
    bound.  A process that already maps half of it or more (the Python API inside a larger
    program, or a test runner) gets the bound on top of what it maps: the work's own
    share stays the same and nothing already there starts failing.  ``z3``: also cap
    z3's own memory (it then answers unknown rather than fail an allocation).
    """
    try:
        import resource
    except ImportError:        # not a POSIX system: the estimates alone
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    now = address_space() or 0
    limit = bound if now < bound // 2 else now + bound
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    z3_module = before = None
    if z3:
        import z3 as z3_module

        before = z3_module.get_param("memory_max_size")
        z3_module.set_param("memory_max_size", max(1, (limit - now) // 2**20))
    _ACTIVE.append(bound)
    exhausted = False
    try:
        yield
    except MemoryError:
        exhausted = True
    finally:
        _ACTIVE.pop()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        if z3_module is not None:
            z3_module.set_param("memory_max_size", before)
    if exhausted:   # raised here, once the limit is back: the message needs memory too
        from .units import format_bytes

        raise RefusedError(f"out of memory: the work needed more than its memory bound of {format_bytes(bound)}"
                           " (the estimate made before starting fell short); nothing was decided")
