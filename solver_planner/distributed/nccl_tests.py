"""Calibration from NVIDIA nccl-tests logs (``solver-planner calibrate --from-nccl-tests``).

nccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``broadcast_perf``, ``reduce_perf``, ``sendrecv_perf``) print, for every run, which host and
device each rank is (``#  Rank  0 Group  0 Pid 1234 on hostA device  0 [0x07] NVIDIA
A100-SXM4-80GB``) and a table: per message size ``S`` the average time of the out-of-place
and of the in-place call, ``algbw = S / t`` and ``busbw = algbw x`` the collective's bus
factor (nccl-tests doc/PERFORMANCE.md; the factors of :func:`solver_planner.cost.bus_factor`).
``size`` is NCCL's full buffer: the AllGather output, the ReduceScatter input, the cost
model's convention too.

Reading.  The table header names the columns (``size count type redop root time algbw
busbw #wrong`` twice; older versions have no ``root`` and an ``error`` column), so rows are
read by name; a missing in-place half, ``N/A``, NCCL's INFO lines, prompts, ``srun
--label`` and ``mpirun --tag-output`` prefixes and the ``# Avg bus bandwidth`` footer are
skipped.  A file may hold several runs (each starts at its ``# nThread`` line, its rank
lines or its header).  Which collective a run measured is read from ``# Collective test
starting: X``, from the command line naming ``X_perf``, from the file name, or from the
``redop``/``root`` columns and ``busbw / algbw``.  A file without a table, a binary or an
oversized file is refused with its name and line (:class:`~solver_planner.errors.SpecError`).

Attribution.  A run's ranks are placed on the base cluster host after host (the ``k``
ranks of the ``j``-th host on the first ``k`` devices of host ``j``); the outermost level
at which they differ is the level whose interconnect it measures: one host, the innermost
interconnect (NVLink); several hosts, the host level's (the NIC).  ``LEVEL=FILE`` names the
level when the rank lines are missing.

Fit.  For a fixed call the cost model's time is linear in a level's latency ``alpha`` and
in ``beta_c = 1 / (bandwidth x efficiency_c)`` of the call's collective ``c``::

    T = a * alpha + b * S * beta_c        (ring: a = steps, b = bus factor)

``a`` and ``b`` are read off :class:`~solver_planner.cost.CostModel` itself, with the
level alone (latency 1 s, 1 B/s; every other interconnect free).  Least squares on
relative error (each row divided by the measured time), with ``alpha, beta >= 0``, gives
``alpha`` and every ``beta_c``; Gauss-Newton steps with the whole model (the other levels
at their values, the base's ``collective_overlap``) then correct for levels that also cost
time.  The bandwidth written is the best collective's, ``max_c 1 / beta_c``, and each
collective's ``efficiency`` is its fraction of it (<= 1).  With a single message size the
latency cannot be told from the bandwidth (likewise when no call measured is mostly latency,
under the base's values): the base's latency is kept.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from math import prod
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import units
from ..cost import CostModel, bus_factor
from ..errors import SpecError, SpecIssue
from ..spec.cluster import ClusterSpec, load_cluster_spec
from ..spec.source import load_yaml
from ..topology import Topology

__all__ = ["COLLECTIVES", "PROGRAMS", "MAX_LOG_BYTES", "RankLine", "Row", "Run", "Placement", "RunFit",
           "LevelFit", "NcclCalibration", "parse_log", "parse_text", "split_log_arg", "place", "calibrate",
           "render_run"]

#: The nccl-tests programs the cost model prices, and the collective each measures.
PROGRAMS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
            "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv"}
COLLECTIVES = tuple(PROGRAMS.values())
#: nccl-tests programs the cost model has no formula for: their runs are skipped.
UNPRICED = ("alltoall", "alltoallv", "gather", "scatter", "hypercube")
MAX_LOG_BYTES = 64 * 2 ** 20
MAX_LINE = 4096
MAX_BANDWIDTH = units.LIMITS["bandwidth"][1]
MIN_LATENCY = units.LIMITS["time"][0]
LATENCY_SHARE = 0.1            # see _fit_level
S_REF = float(2 ** 20)          # the model is linear in S: its slope is read between 0 and this
_REDOP_NONE = ("none",)

_PROGRAM = re.compile(r"\b(" + "|".join(sorted(list(PROGRAMS) + list(UNPRICED), key=len, reverse=True))
                      + r")_perf\b")
# A rank line in two steps (host names may hold spaces; no backtracking over long lines).
_RANK = re.compile(r"#?\s*Rank\s+([0-9]{1,9})\s+(?:Group\s+([0-9]{1,9})\s+)?Pid\s+[0-9]{1,12}\s+on\s")
_DEVICE = re.compile(r"\sdevice\s+([0-9]{1,9})\s+\[[^\]]*\]")
_NTHREAD = re.compile(r"nThread\s+([0-9]{1,6})\s+nGpus\s+([0-9]{1,6})\b")
_LAUNCHER = re.compile(r"\b(mpirun|mpiexec|srun|orterun|prterun|torchrun|aprun|jsrun)\b")
_GPUS_FLAG = re.compile(r"(?:^|\s)(?:-g\s*|--ngpus[=\s]+)([0-9]{1,6})\b")
_THREADS_FLAG = re.compile(r"(?:^|\s)(?:-t\s*|--nthreads[=\s]+)([0-9]{1,6})\b")
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s))")  # mpirun --tag-output; srun --label
_TAG = re.compile(r"\[\d+\]")                                               # mpirun's "[0]" inside lines
_WORD = re.compile(r"^[A-Za-z_][\w]*$")
# The modern layout, for rows pasted without their header.
_DEFAULT_HEADER = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()


def _error(file: str, line: int | None, message: str) -> SpecError:
    return SpecError(SpecIssue(file, line, "", message))


# -- reading ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RankLine:
    """One ``# Using devices`` line: rank, communicator group, host, device index, device name."""

    rank: int
    group: int
    host: str
    device: int
    name: str
    line: int


@dataclass(frozen=True)
class Row:
    """One result row: the message size and the times measured (out-of-place, in-place), in seconds."""

    line: int
    size: int
    times: tuple[float, ...]
    redop: str | None = None
    root: int | None = None
    algbw: float | None = None       # GB/s, out-of-place
    busbw: float | None = None
    dropped: int = 0                 # times out of range (negative, zero, past the limit): not used
    wrong: bool = False              # nccl-tests' own check found wrong results (#wrong > 0)


@dataclass
class Run:
    """One nccl-tests run: what the log says about its ranks and its table."""

    file: str
    line: int
    program: str | None = None       # e.g. 'all_reduce' (from the log or the file name)
    ranks: list[RankLine] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    header_line: int | None = None
    local_gpus: int | None = None    # nThread x nGpus of one process
    launcher: bool = False           # started by mpirun/srun: more than one process
    flag_gpus: int | None = None     # -g x -t on a command line without a launcher
    unreadable: int = 0              # rows that looked like results but could not be read
    wrong: int = 0                   # rows whose #wrong column is not 0: skipped
    dropped: int = 0                 # times out of range in rows otherwise read: skipped

    @property
    def collective(self) -> str | None:
        return PROGRAMS.get(self.program) if self.program else None

    @property
    def where(self) -> int:
        """The line its table starts at (or the run itself, before a table)."""
        return self.header_line or self.line

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(r.host for r in sorted(self.ranks, key=lambda r: r.rank)))

    @property
    def sizes(self) -> list[int]:
        return sorted({r.size for r in self.rows})

    @property
    def samples(self) -> int:
        return sum(len(r.times) for r in self.rows)


@dataclass(frozen=True)
class _Layout:
    redop: int | None
    root: int | None
    times: tuple[int, ...]
    algbw: int | None
    busbw: int | None
    width: int
    needed: int                   # tokens a row must have: through the first time group
    scale: float = 1e-6           # seconds per unit of the time column
    wrong: tuple[int, ...] = ()   # the '#wrong' columns (nccl-tests' count of wrong elements)


def _layout(tokens: list[str], scale: float = 1e-6) -> _Layout | None:
    if not tokens or tokens[0] != "size" or "time" not in tokens:
        return None
    times = tuple(i for i, t in enumerate(tokens) if t == "time")

    def first(name: str) -> int | None:
        return tokens.index(name) if name in tokens else None

    algbw, busbw = first("algbw"), first("busbw")
    if algbw is None and busbw is None:
        return None
    end = times[1] if len(times) > 1 else len(tokens)      # the out-of-place half ends where the next starts
    needed = max(i for i in (times[0], algbw, busbw) if i is not None and i < end) + 1
    wrong = tuple(i for i, t in enumerate(tokens) if t == "#wrong")
    return _Layout(first("redop"), first("root"), times, algbw, busbw, len(tokens), needed, scale, wrong)


def _clean(raw: str) -> str:
    line = _PREFIX.sub("", raw, count=1)
    return _TAG.sub(" ", line) if "[" in line else line


def _is_count(text: str) -> bool:
    """A plain decimal count (ASCII digits, at most 20: no unicode digits, no 4 000-digit ints)."""
    return len(text) <= 20 and text.isascii() and text.isdigit()


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _row(tokens: list[str], layout: _Layout, lineno: int) -> Row | None:
    """A result row, or None when the tokens are not one (junk, a truncated line)."""
    if len(tokens) < layout.needed or len(tokens) > layout.width or not _is_count(tokens[0]):
        return None
    size = int(tokens[0])
    if not 0 < size <= units.LIMITS["bytes"][1]:
        return None
    for i in range(1, min(layout.needed, len(tokens))):     # the columns between must be words or numbers
        if not (_WORD.match(tokens[i]) or _number(tokens[i]) is not None or tokens[i] in ("N/A", "-")):
            return None
    times, dropped = [], 0
    for i in layout.times:
        if i < len(tokens):
            t = _number(tokens[i])
            if t is not None and MIN_LATENCY <= t * layout.scale <= units.LIMITS["time"][1]:
                times.append(t * layout.scale)
            elif t is not None:
                dropped += 1
    if not times:
        return None
    wrong = any(i < len(tokens) and (w := _number(tokens[i])) is not None and w != 0 for i in layout.wrong)
    redop = tokens[layout.redop] if layout.redop is not None else None
    root = None
    if layout.root is not None and re.fullmatch(r"-?[0-9]{1,9}", tokens[layout.root]):
        root = int(tokens[layout.root])
    algbw = _number(tokens[layout.algbw]) if layout.algbw is not None else None
    busbw = _number(tokens[layout.busbw]) if layout.busbw is not None else None
    return Row(lineno, size, tuple(times), redop, root, algbw, busbw, dropped, wrong)


def parse_text(text: str, file: str = "<text>") -> list[Run]:
    """Every run in an nccl-tests log, with at least one result row (see the module docstring).

    Raises :class:`SpecError` naming the file (and the header's line) when there is none.

    >>> runs = parse_text('''# Collective test starting: all_reduce_perf
    ... #  Rank  0 Group  0 Pid   11 on nodeA device  0 [0x07] NVIDIA A100-SXM4-80GB
    ... #  Rank  1 Group  0 Pid   12 on nodeA device  1 [0x0b] NVIDIA A100-SXM4-80GB
    ... #       size         count      type   redop    root     time   algbw   busbw #wrong
    ...      1048576        262144     float     sum      -1    20.50   51.15   51.15      0
    ... # Avg bus bandwidth    : 51.15''')
    >>> [(r.collective, len(r.ranks), r.sizes) for r in runs]
    [('allreduce', 2, [1048576])]
    """
    runs: list[Run] = []
    cur = Run(file, 1)
    layout: _Layout | None = None
    scale = 1e-6
    header_seen: int | None = None

    def start(lineno: int) -> Run:
        nonlocal layout
        runs.append(cur)
        layout = None
        return Run(file, lineno)

    for lineno, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE:          # nccl-tests lines are short; a huge one is junk (and slow to match)
            continue
        line = _clean(raw)
        body = line.strip()
        if not body:
            continue
        prog = _PROGRAM.search(body)
        if prog:
            if "concluded" in body.lower():
                if cur.rows and cur.program is None:
                    cur.program = prog.group(1)
            else:
                if cur.rows:
                    cur = start(lineno)
                cur.program = prog.group(1)
                if not body.startswith("#"):   # a command line
                    if _LAUNCHER.search(body):
                        cur.launcher = True
                    else:
                        g, t = _GPUS_FLAG.search(body), _THREADS_FLAG.search(body)
                        if g:
                            cur.flag_gpus = int(g.group(1)) * (int(t.group(1)) if t else 1)
            if not body.startswith("#"):
                continue
        m = _NTHREAD.search(body)
        if m and body.startswith("#"):
            if cur.rows:
                cur = start(lineno)
            cur.local_gpus = int(m.group(1)) * int(m.group(2))
            continue
        m = _RANK.match(body)
        d = _DEVICE.search(body, m.end() - 1) if m else None
        if m and d:
            if cur.rows:
                cur = start(lineno)
            cur.ranks.append(RankLine(int(m.group(1)), int(m.group(2) or 0), body[m.end():d.start()].strip(),
                                      int(d.group(1)), body[d.end():].strip(), lineno))
            continue
        tokens = body.lstrip("#").split()
        lowered = [t.lower() for t in tokens]
        if lowered and lowered[0] == "size":
            found = _layout(lowered, scale)
            if found is not None:
                if cur.rows:
                    cur = start(lineno)
                layout, cur.header_line = found, lineno
                header_seen = header_seen or lineno
                continue
        if lowered and lowered[0] == "(b)":
            unit = next((t for t in lowered if t in ("(us)", "(ms)", "(s)")), "(us)")
            scale = {"(us)": 1e-6, "(ms)": 1e-3, "(s)": 1.0}[unit]
            if layout is not None:
                layout = dataclasses.replace(layout, scale=scale)
            continue
        if body.startswith("#") or not tokens or not _is_count(tokens[0]):
            continue
        use = layout
        if use is None and len(tokens) in (9, 13):      # rows pasted without their header
            use = _layout(_DEFAULT_HEADER[:len(tokens)], scale)
        if use is None:
            continue
        row = _row(tokens, use, lineno)
        if row is None:
            cur.unreadable += 1
            continue
        if row.wrong:
            cur.wrong += 1
            continue
        cur.dropped += row.dropped
        if cur.header_line is None:
            cur.header_line = lineno
        cur.rows.append(row)
    runs.append(cur)
    kept = [r for r in runs if r.rows]
    if not kept:
        wrong = sum(r.wrong for r in runs)
        if wrong:
            raise _error(file, header_seen, f"every result row that could be read ({wrong}) reports wrong results"
                                            " (#wrong is not 0): nothing to fit")
        if header_seen is not None:
            raise _error(file, header_seen, "the nccl-tests table under this header has no readable result row"
                                            " (truncated?)")
        raise _error(file, None, "no nccl-tests result table: expected a header line such as '#  size  count  type"
                                 "  redop  root  time  algbw  busbw  #wrong ...' followed by result rows")
    for run in kept:
        if run.program is None:
            run.program = _program_from_name(file)
    return kept


def _program_from_name(file: str) -> str | None:
    stem = re.sub(r"[^a-z]", "", Path(file).name.lower())
    for key in ("allreduce", "allgather", "reducescatter", "alltoallv", "alltoall", "broadcast", "sendrecv",
                "hypercube", "gather", "scatter", "reduce"):
        if key in stem:
            return next((p for p in list(PROGRAMS) + list(UNPRICED) if p.replace("_", "") == key), None)
    return None


def parse_log(path: str | Path) -> list[Run]:
    """The runs of an nccl-tests log file; :class:`SpecError` for a missing, unreadable, binary
    or oversized file or one without a result table."""
    path = Path(path)
    name = str(path)
    if path.is_dir():
        raise _error(name, None, "is a folder, not an nccl-tests log")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except FileNotFoundError:
        raise _error(name, None, "no such file") from None
    except OSError as exc:
        raise _error(name, None, f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_LOG_BYTES:
        raise _error(name, None, f"is larger than {units.format_bytes(MAX_LOG_BYTES)}; keep only the nccl-tests"
                                 " output (grep -v 'NCCL INFO')")
    if not data.strip():
        raise _error(name, None, "is empty")
    if b"\x00" in data[:8192]:
        raise _error(name, None, "is a binary file (compressed?), not nccl-tests' text output")
    return parse_text(data.decode("utf-8", errors="replace"), name)


def split_log_arg(arg: str, levels: Sequence[str]) -> tuple[str | None, str]:
    """``'node=2x8.log'`` -> ``('node', '2x8.log')``; ``'a.log'`` -> ``(None, 'a.log')``; a
    file named ``x=y.log`` is that file, but ``x=FILE`` where only FILE exists names a level
    the cluster does not have (:class:`SpecError`, rather than "no such file").

    >>> split_log_arg('gpu=logs/ar.log', ['node', 'gpu']), split_log_arg('x=y.log', ['gpu'])
    (('gpu', 'logs/ar.log'), (None, 'x=y.log'))
    """
    level, sep, rest = arg.partition("=")
    if sep and level in levels and rest:
        return level, rest
    if sep and rest and not Path(arg).exists() and Path(rest).exists():
        raise _error(arg, None, f"no level {level!r} in the base cluster: its levels are {', '.join(levels)}")
    return None, arg


# -- attribution -----------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Where a run's ranks sit on the base cluster and which level's interconnect it measures."""

    level: str
    interconnect: str
    group: tuple[int, ...]
    hosts: int | None
    per_host: int | None
    assumed: str | None = None     # what had to be assumed (said in the notes)

    @property
    def ranks(self) -> int:
        return len(self.group)


def _ranks_from_bandwidths(run: Run, collective: str) -> int | None:
    """The group size NCCL used, from ``busbw / algbw`` (AllReduce 2(n-1)/n, ReduceScatter and
    AllGather (n-1)/n); None where the ratio says nothing (other collectives, noisy columns)."""
    ratios = [r.busbw / r.algbw for r in run.rows if r.algbw and r.busbw and r.algbw >= 5.0]
    if not ratios or collective not in ("allreduce", "allgather", "reducescatter"):
        return None
    ratio = float(np.median(ratios))
    gap = (2.0 if collective == "allreduce" else 1.0) - ratio
    if gap <= 0:
        return None
    n = (2.0 if collective == "allreduce" else 1.0) / gap
    return round(n) if round(n) >= 2 and abs(n - round(n)) < 0.2 else None


def _collective_from_columns(run: Run) -> str | None:
    roots = {r.root for r in run.rows if r.root is not None}
    redops = {r.redop for r in run.rows if r.redop is not None}
    if roots and max(roots) >= 0:
        return "broadcast" if redops <= {"none"} else "reduce"
    n = len({r.rank for r in run.ranks}) or None
    ratios = [r.busbw / r.algbw for r in run.rows if r.algbw and r.busbw and r.algbw >= 5.0]
    if n is None or n < 3 or not ratios:
        return None
    ratio = float(np.median(ratios))
    if abs(ratio - 2 * (n - 1) / n) < 0.01:
        return "allreduce"
    if abs(ratio - (n - 1) / n) < 0.01 and redops and not redops <= {"none"}:
        return "reducescatter"
    return None


def place(run: Run, topo: Topology, level: str | None, collective: str) -> Placement:
    """Put ``run``'s ranks on ``topo`` and name the level it measures (module docstring)."""
    where = run.ranks[0].line if run.ranks else run.header_line
    names = topo.level_names
    if run.ranks:
        ranks = sorted(run.ranks, key=lambda r: r.rank)
        seen = Counter(r.rank for r in ranks)
        twice = [r for r, c in seen.items() if c > 1]
        if twice:
            raise _error(run.file, where, f"rank {twice[0]} is listed twice: the outputs of separate jobs are"
                                          " interleaved (nccl-tests built without MPI=1 runs one job per process);"
                                          " keep one job's output")
        if len({r.group for r in ranks}) > 1:
            raise _error(run.file, where, "ranks in several communicator groups (concurrent collectives); only a"
                                          " run of one group is priced")
        per = Counter(r.host for r in ranks)
        hosts = run.hosts
        if len(set(per.values())) > 1:
            raise _error(run.file, where, "uneven ranks per host (" + ", ".join(f"{per[h]} on {h or '?'}"
                                                                                 for h in hosts[:4]) + ")")
        h, k = len(hosts), per[hosts[0]]
        if h > topo.num_hosts or k > topo.devices_per_host:
            raise _error(run.file, where, f"{h * k} ranks on {h} host(s), {k} per host, do not fit the base"
                                          f" cluster '{topo.name}' ({topo.num_hosts} hosts of"
                                          f" {topo.devices_per_host} devices); give a base cluster at least as large")
        group = tuple(j * topo.devices_per_host + i for j in range(h) for i in range(k))
        if len(group) < 2:
            raise _error(run.file, where, "one rank: nothing crosses an interconnect")
        found = min(topo.divergence_level(group[0], d) for d in group[1:])
        if level is not None and names[found] != level:
            raise _error(run.file, where, f"its {h * k} ranks on {h} host(s) exercise level '{names[found]}', not"
                                          f" '{level}' as the command line says")
        return _placement(topo, run, names[found], group, h, k, None)
    if level is None:
        raise _error(run.file, where, "no '# Using devices' rank lines say which hosts ran this table; name the"
                                      f" level it measures on the command line, e.g. {names[-1]}={run.file}")
    n, assumed = None, None
    if not run.launcher and run.local_gpus:
        n = run.local_gpus
    n = n or _ranks_from_bandwidths(run, collective) or (None if run.launcher else run.flag_gpus)
    li = topo.level_index(level)
    stride = prod(lv.count for lv in topo.levels[li + 1:])     # devices under one instance of the level
    count = topo.levels[li].count
    if n is None:
        n = count * stride
        assumed = f"{n} ranks assumed (one whole instance of the level above '{level}')"
    # Fill each instance of the level as far as possible, across at least two of them.
    k = next((k for k in range(min(stride, n // 2), 0, -1) if n % k == 0 and 2 <= n // k <= count), None)
    if k is None:
        raise _error(run.file, where, f"{n} ranks cannot be spread over at least two instances of level '{level}'"
                                      f" of the base cluster '{topo.name}'")
    group = tuple(j * stride + i for j in range(n // k) for i in range(k))
    return _placement(topo, run, level, group, None, None, assumed)


def _placement(topo: Topology, run: Run, level: str, group, hosts, per_host, assumed) -> Placement:
    serving = [ic.name for ic in topo.interconnects.values() if ic.level == level]
    if not serving:
        raise _error(run.file, run.header_line, f"level '{level}' of the base cluster has no interconnect to fit")
    return Placement(level, serving[0], tuple(group), hosts, per_host, assumed)


# -- the model -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Values:
    latency: float
    bandwidth: float
    efficiency: dict[str, float]

    def effective(self, collective: str) -> float:
        return self.bandwidth * self.efficiency.get(collective, 1.0)


def _topology(spec: ClusterSpec, values: dict[str, _Values], collective: str) -> Topology:
    """The cluster with every interconnect's bandwidth x its efficiency for ``collective`` (the
    meaning of ``efficiency``) and no efficiency left, so the model's formulas apply as they are."""
    ics = []
    for ic in spec.interconnects:
        v = values.get(ic.name) or _Values(ic.latency, ic.bandwidth, dict(getattr(ic, "efficiency", {}) or {}))
        update: dict[str, Any] = {"latency": v.latency, "bandwidth": max(1.0, v.effective(collective))}
        if hasattr(ic, "efficiency"):
            update["efficiency"] = {}
        ics.append(ic.model_copy(update=update))
    return Topology(spec.model_copy(update={"interconnects": ics}))


def call_time(cost: CostModel, collective: str, group: Sequence[int], nbytes: float) -> float:
    """The cost model's time of one nccl-tests call of ``collective`` on ``group`` (``sendrecv``:
    every rank sends to the next one at once)."""
    g = list(group)
    if collective == "sendrecv":     # every rank sends to the next one, at once
        return cost.transfers_time([(g[i], g[(i + 1) % len(g)]) for i in range(len(g))], nbytes)
    return cost.collective(collective, [g], nbytes).time


@dataclass
class RunFit:
    """A run, where it sits, and how well the fitted model predicts it."""

    run: Run
    collective: str
    placement: Placement
    sizes: np.ndarray = field(repr=False)
    times: np.ndarray = field(repr=False)
    predicted: np.ndarray | None = field(default=None, repr=False)

    @property
    def errors(self) -> np.ndarray:
        return np.abs(self.predicted / self.times - 1) if self.predicted is not None else np.array([])

    @property
    def median_error(self) -> float:
        return float(np.median(self.errors)) if self.predicted is not None else math.nan


def _lines(spec: ClusterSpec, values: dict[str, _Values], fits: Sequence[RunFit]) -> list[tuple[float, float]]:
    """(time at 0 bytes, seconds per byte) of each run's call under ``values``."""
    models: dict[str, CostModel] = {}
    out = []
    for f in fits:
        cost = models.get(f.collective)
        if cost is None:
            cost = models[f.collective] = CostModel(_topology(spec, values, f.collective))
        t0 = call_time(cost, f.collective, f.placement.group, 0.0)
        t1 = call_time(cost, f.collective, f.placement.group, S_REF)
        out.append((t0, (t1 - t0) / S_REF))
    return out


def _predict(spec: ClusterSpec, values: dict[str, _Values], fits: Sequence[RunFit]) -> list[np.ndarray]:
    return [t0 + slope * f.sizes for f, (t0, slope) in zip(fits, _lines(spec, values, fits))]


def _lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with the columns scaled to one norm first (latency and 1/bandwidth
    columns differ by many orders of magnitude)."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    x, *_ = np.linalg.lstsq(a / norms, y, rcond=None)
    return x / norms


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every unknown >= 0 (few unknowns: try every set of free ones)."""
    k = a.shape[1]
    best, best_res = np.zeros(k), float(np.dot(y, y))
    for size in range(k, 0, -1):
        for free in combinations(range(k), size):
            x = _lstsq(a[:, list(free)], y)
            if np.all(x >= 0):
                full = np.zeros(k)
                full[list(free)] = x
                r = y - a @ full
                res = float(np.dot(r, r))
                if res < best_res * (1 - 1e-12):
                    best, best_res = full, res
    return best


@dataclass(frozen=True)
class LevelFit:
    """The fitted values of one level's interconnect."""

    level: str
    interconnect: str
    latency: float
    bandwidth: float
    efficiency: dict[str, float]
    latency_fitted: bool
    samples: int
    median_error: float


def _fit_level(spec: ClusterSpec, level: str, ic: str, fits: list[RunFit], values: dict[str, _Values]
               ) -> tuple[_Values, bool, list[str]]:
    """Least squares on relative error for one level (module docstring), then Gauss-Newton
    with the whole model; ``values`` holds the other levels."""
    notes: list[str] = []
    kinds = list(dict.fromkeys(f.collective for f in fits))
    base = next(i for i in spec.interconnects if i.name == ic)
    # The level alone: latency 1 s, 1 B/s; every other interconnect free.
    alone = {i.name: _Values(0.0, MAX_BANDWIDTH, {}) for i in spec.interconnects}
    alone[ic] = _Values(1.0, 1.0, {})
    coeff = _lines(spec, alone, fits)
    # The latency is told from the bandwidth only if some call measured is mostly latency:
    # at least LATENCY_SHARE of its time under the base's values.
    alpha0 = base.latency or 1e-6
    shares = [a * alpha0 / (a * alpha0 + b * float(np.min(f.sizes)) / base.bandwidth) for f, (a, b) in zip(fits, coeff)
              if a > 0]
    free_latency = len({int(s) for f in fits for s in f.sizes}) >= 2 and max(shares, default=0.0) >= LATENCY_SHARE
    y = np.concatenate([f.times for f in fits])
    col_a = np.concatenate([np.full(len(f.sizes), a) for f, (a, _) in zip(fits, coeff)]) / y
    cols_b = np.zeros((len(y), len(kinds)))
    at = 0
    for f, (_, b) in zip(fits, coeff):
        cols_b[at:at + len(f.sizes), kinds.index(f.collective)] = b * f.sizes / y[at:at + len(f.sizes)]
        at += len(f.sizes)
    ones = np.ones(len(y))
    if free_latency:
        x = _nnls(np.column_stack([col_a, cols_b]), ones)
        alpha, betas = float(x[0]), x[1:].copy()
    else:
        alpha = float(base.latency)
        betas = _nnls(cols_b, ones - alpha * col_a)
        notes.append(f"{ic}: no message small enough to tell latency from bandwidth, so its latency is the base's"
                     f" ({units.format_time(alpha)})")
    flat = [j for j in range(len(kinds)) if betas[j] * MAX_BANDWIDTH < 1]
    for j in flat:
        # Time does not grow with size in the measured range: the smallest bandwidth no
        # measurement contradicts (b S / B <= measured for all).
        mask = cols_b[:, j] > 0
        betas[j] = float(np.min(1.0 / cols_b[mask, j])) if mask.any() else 1 / MAX_BANDWIDTH
        notes.append(f"{ic}: {kinds[j]}'s time does not grow with size in the logs; its bandwidth is a lower bound")
    if flat and free_latency:
        rest = ones - cols_b @ betas
        alpha = max(0.0, float(np.dot(col_a, rest) / np.dot(col_a, col_a)))

    def to_values(alpha: float, betas: np.ndarray) -> _Values:
        bws = {k: 1.0 / max(float(b), 1 / MAX_BANDWIDTH) for k, b in zip(kinds, betas)}
        top = max(bws.values())
        return _Values(alpha, top, {k: bw / top for k, bw in bws.items()})

    def residuals(alpha: float, betas: np.ndarray) -> np.ndarray:
        trial = {**values, ic: to_values(alpha, betas)}
        return np.concatenate(_predict(spec, trial, fits)) / y - 1

    # Gauss-Newton with the whole model (other levels at their values, the base's overlap),
    # unless the whole model at the values found cannot come near the logs (another level
    # bounds every run): the level's own values are then the ones worth writing.
    p = np.array([alpha, *betas])
    r = residuals(p[0], p[1:])
    by_itself = col_a * alpha + cols_b @ betas - 1
    steps = 12 if np.median(np.abs(r)) <= 2 * np.median(np.abs(by_itself)) + 0.05 else 0
    for _ in range(steps):
        jac = np.empty((len(y), len(p)))
        for j in range(len(p)):
            if j == 0 and not free_latency:
                jac[:, j] = 0.0
                continue
            h = max(abs(p[j]) * 1e-4, 1e-12 if j == 0 else 1e-20)
            q = p.copy()
            q[j] += h
            jac[:, j] = (residuals(q[0], q[1:]) - r) / h
        step = _lstsq(jac, -r)
        sse, improved = float(np.dot(r, r)), False
        for damping in (1.0, 0.5, 0.25, 0.125):
            q = p + damping * step
            q[0] = max(q[0], 0.0)
            q[1:] = np.maximum(q[1:], 1 / MAX_BANDWIDTH)
            rq = residuals(q[0], q[1:])
            if float(np.dot(rq, rq)) < sse * (1 - 1e-9):
                p, r, improved = q, rq, True
                break
        if not improved:
            break
    return to_values(float(p[0]), p[1:]), free_latency, notes


# -- the whole calibration -------------------------------------------------------------

@dataclass
class NcclCalibration:
    """What ``calibrate --from-nccl-tests`` found: fitted levels, runs and the spec written."""

    base: str
    spec: ClusterSpec
    raw: dict
    levels: list[LevelFit]
    runs: list[RunFit]
    notes: list[str]
    name: str | None = None

    def log_errors(self) -> dict[str, float]:
        """Per log file: median |predicted / measured - 1| over all its rows."""
        out: dict[str, list[np.ndarray]] = {}
        for f in self.runs:
            out.setdefault(f.run.file, []).append(f.errors)
        return {k: float(np.median(np.concatenate(v))) for k, v in out.items()}

    def spec_dict(self) -> dict:
        raw = copy.deepcopy(self.raw)
        if self.name:
            raw["name"] = self.name
        fitted = {lv.interconnect: lv for lv in self.levels}
        for ic in raw.get("interconnects", []):
            lv = fitted.get(ic.get("name")) if isinstance(ic, dict) else None
            if lv is None:
                continue
            ic["bandwidth"] = f"{lv.bandwidth / 1e9:.6g} GB/s"
            ic["latency"] = f"{lv.latency * 1e6:.6g}us" if lv.latency >= MIN_LATENCY else "0us"
            ic["efficiency"] = {k: float(f"{min(1.0, max(1e-4, v)):.4g}") for k, v in sorted(lv.efficiency.items())}
        return raw

    def yaml(self, command: str = "") -> str:
        """The fitted cluster spec, with a comment header saying what was fitted from which logs."""
        import yaml

        lines = [f"# Fitted to nccl-tests logs{' by `' + command + '`' if command else ''}.",
                 f"# Base: {self.base} (its comments are not copied); only the fitted interconnects' bandwidth,",
                 "# latency and efficiency differ from it. Fit: least squares on relative error of the cost model's",
                 "# formulas (ring: steps x latency + bus factor x S / (bandwidth x efficiency)); bandwidth is the",
                 "# best measured collective's, efficiency each one's fraction of it (unmeasured collectives: 1)."]
        errors = self.log_errors()
        for lv in self.levels:
            eff = ", ".join(f"{k} {v:.3g}" for k, v in sorted(lv.efficiency.items()))
            lat = units.format_time(lv.latency) + ("" if lv.latency_fitted else " (base's)")
            lines.append(f"#   {lv.interconnect} (level {lv.level}): latency {lat}, bandwidth"
                         f" {units.format_bandwidth(lv.bandwidth)}; efficiency {eff}")
            for f in self.runs:
                if f.placement.level != lv.level:
                    continue
                where = f"{f.placement.hosts} host(s)" if f.placement.hosts else "hosts not logged"
                lines.append(f"#     {f.run.file}:{f.run.where}: {f.run.program}_perf, {f.placement.ranks} ranks"
                             f" ({where}), {len(f.sizes)} samples, median |pred/meas-1| {f.median_error:.3f}")
        lines.append("# Median |pred/meas-1| per log:")
        lines += [f"#   {k}: {v:.3f}" for k, v in errors.items()]
        for note in self.notes:
            lines.append(f"# Note: {note}")
        lines = [line.replace("\n", " ") for line in lines]
        return "\n".join(lines) + "\n" + yaml.safe_dump(self.spec_dict(), sort_keys=False, allow_unicode=True)

    def as_dict(self) -> dict:
        errors = self.log_errors()
        logs: dict[str, dict] = {}
        for f in self.runs:
            entry = logs.setdefault(f.run.file, {"file": f.run.file, "median_relative_error": errors[f.run.file],
                                                 "runs": []})
            entry["runs"].append({
                "line": f.run.where, "program": f"{f.run.program}_perf", "collective": f.collective,
                "ranks": f.placement.ranks, "hosts": f.placement.hosts, "ranks_per_host": f.placement.per_host,
                "level": f.placement.level, "interconnect": f.placement.interconnect, "samples": len(f.sizes),
                "median_relative_error": f.median_error,
                "rows": [{"bytes": int(s), "measured": float(t), "predicted": float(p)}
                         for s, t, p in zip(f.sizes, f.times, f.predicted)]})
        return {"base": self.base,
                "levels": [{"level": lv.level, "interconnect": lv.interconnect, "latency": lv.latency,
                            "bandwidth": lv.bandwidth, "efficiency": lv.efficiency,
                            "latency_fitted": lv.latency_fitted, "samples": lv.samples,
                            "median_relative_error": lv.median_error} for lv in self.levels],
                "logs": list(logs.values()), "notes": self.notes, "spec": self.spec_dict()}


def calibrate(base: str | Path, logs: Sequence[str], name: str | None = None) -> NcclCalibration:
    """Fit the base cluster's interconnects to nccl-tests logs (``LEVEL=FILE`` or ``FILE``).

    Raises :class:`SpecError` (file and line) for a log or a base spec that cannot be used.
    """
    spec = load_cluster_spec(base)
    raw, _ = load_yaml(base)
    topo = Topology(spec)
    if not logs:
        raise _error(str(base), None, "no nccl-tests log given")
    notes: list[str] = []
    fits: list[RunFit] = []
    for arg in logs:
        level, path = split_log_arg(arg, topo.level_names)
        runs = parse_log(path)
        for run in runs:
            collective = run.collective or _collective_from_columns(run)
            if run.program in UNPRICED:
                notes.append(f"{run.file}:{run.where}: {run.program}_perf skipped (the cost model prices"
                             f" {', '.join(COLLECTIVES)})")
                continue
            if collective is None:
                raise _error(run.file, run.header_line, "cannot tell which collective this table measured: keep the"
                                                        " command line or '# Collective test starting' line, or name"
                                                        " the file after the test (e.g. all_gather_perf.log)")
            p = place(run, topo, level, collective)
            if p.assumed:
                notes.append(f"{run.file}:{run.where}: {p.assumed}")
            if run.unreadable:
                notes.append(f"{run.file}:{run.where}: {run.unreadable} row(s) could not be read and were skipped")
            if run.wrong:
                notes.append(f"{run.file}:{run.where}: {run.wrong} row(s) report wrong results (#wrong is not 0)"
                             " and were skipped")
            if run.dropped:
                notes.append(f"{run.file}:{run.where}: {run.dropped} time(s) out of range (negative, zero or past"
                             f" {units.LIMITS['time'][1]:g} s) were skipped")
            sizes = np.array([r.size for r in run.rows for _ in r.times], dtype=float)
            times = np.array([t for r in run.rows for t in r.times], dtype=float)
            fits.append(RunFit(run, collective, p, sizes, times))
    if not fits:
        raise _error(str(logs[0]), None, "no run of a collective the cost model prices ("
                                         + ", ".join(f"{p}_perf" for p in PROGRAMS) + ")")
    values: dict[str, _Values] = {}
    order = sorted({(topo.level_index(f.placement.level), f.placement.level, f.placement.interconnect)
                    for f in fits}, reverse=True)            # innermost first: outer runs cross inner links
    results = []
    for _, level, ic in order:
        mine = [f for f in fits if f.placement.level == level]
        v, latency_fitted, level_notes = _fit_level(spec, level, ic, mine, values)
        values[ic] = v
        notes += level_notes
        results.append((level, ic, v, latency_fitted, mine))
    for f, pred in zip(fits, _predict(spec, values, fits)):
        f.predicted = pred
    levels = []
    for level, ic, v, latency_fitted, mine in results:
        errs = np.concatenate([f.errors for f in mine])
        alone = {i.name: _Values(0.0, MAX_BANDWIDTH, {}) for i in spec.interconnects}
        alone[ic] = v
        by_itself = np.concatenate([np.abs(p / f.times - 1) for f, p in zip(mine, _predict(spec, alone, mine))])
        if np.median(errs) > 2 * np.median(by_itself) + 0.05:
            notes.append(f"{ic}: other interconnects bound these runs in the model (median |pred/meas-1|"
                         f" {np.median(errs):.3f}, {np.median(by_itself):.3f} with {ic} alone): the base's values of"
                         " the other levels are slower than the logs say; fit them too or correct the base")
        bw = min(v.bandwidth, MAX_BANDWIDTH)
        v = dataclasses.replace(v, latency=min(v.latency, units.LIMITS["time"][1]))
        if v.bandwidth >= MAX_BANDWIDTH:
            notes.append(f"{ic}: no measurement tells its bandwidth from infinite; written as the largest a spec"
                         " holds")
        levels.append(LevelFit(level, ic, v.latency, bw, dict(v.efficiency), latency_fitted, len(errs),
                               float(np.median(errs))))
    out = NcclCalibration(str(base), spec, raw, levels, fits, notes, name)
    load_cluster_spec("<fitted cluster>", out.yaml())      # the spec written must load
    return out


# -- writing logs (tests, benchmarks) ------------------------------------------------------

def _time_text(us: float) -> str:
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def render_run(collective: str, hosts: Sequence[str], per_host: int, rows: Sequence[tuple[int, float, float]],
               device: str = "NVIDIA A100-SXM4-80GB", in_place: bool = True) -> str:
    """One run in nccl-tests' output layout: ``rows`` are (bytes, out-of-place seconds,
    in-place seconds); the bus bandwidth uses :func:`bus_factor` (sendrecv: 1)."""
    program = next(p for p, c in PROGRAMS.items() if c == collective)
    n = len(hosts) * per_host
    redop = "none" if collective in ("allgather", "broadcast") else "sum"
    root = 0 if collective in ("broadcast", "reduce") else -1
    factor = 1.0 if collective == "sendrecv" else bus_factor(collective, n)
    sizes = [r[0] for r in rows]
    out = [f"# Collective test starting: {program}_perf",
           f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) warmup iters: 5 iters: 20"
           " agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for j, host in enumerate(hosts):
        for i in range(per_host):
            out.append(f"#  Rank {j * per_host + i:2d} Group  0 Pid {1000 + j * per_host + i:6d} on {host:>10s}"
                       f" device {i:2d} [0x{16 * i + 7:02x}] {device}")
    out += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
            "   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)"
            "  (GB/s)       "]
    bw_sum = 0.0
    for size, t_out, t_in in rows:
        count = size // 4 // (n if collective in ("allgather", "reducescatter") else 1)
        line = f"{size:12d}  {count:12d}  {'float':>8s}  {redop:>6s}  {root:6d}"
        for t, wrong in ((t_out, "0"), (t_in, "N/A" if collective == "sendrecv" else "0"))[:2 if in_place else 1]:
            alg = size / t / 1e9
            line += f"  {_time_text(t * 1e6)}  {alg:6.2f}  {alg * factor:6.2f}  {wrong:>5s}"
        bw_sum += size / t_out / 1e9 * factor
        out.append(line)
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {bw_sum / len(rows):g} ", "#",
            f"# Collective test concluded: {program}_perf", ""]
    return "\n".join(out)
