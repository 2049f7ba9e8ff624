"""Measured times of one transformer layer, what the cost model predicts for them, and the
matrix-multiply efficiency that makes the two agree.

A per-layer microbenchmark (Korthikanti et al. 2022, Table 4: the forward and the backward of
one layer of a 22B GPT on eight A100s, with and without recomputation and sequence
parallelism) times what a training step repeats, at the shapes training runs, with the
framework's own kernels; a search over matrix shapes for the fastest multiply (the presets'
first source) times none of that.  The prediction is the stage cost model's own (the layer's
operators, :mod:`.operators`, plus its tensor-parallel all-reduces, :meth:`.costs.StageCosts.
layer_times`), on one host of the cluster given, ``tensor`` devices to a replica.

:func:`fit_matmul_efficiency` finds the ``matmul_efficiency`` of the device's compute block
that minimises the squared log error over every measured pass (one dimension: a scan, then a
golden-section search), and refuses timings no efficiency explains.  Nothing else is
fitted; the tables are microbenchmarks, never end-to-end training throughput.

A CSV file of timings has the columns ``hidden, heads, sequence, micro_batch, tensor,
recompute, sequence_parallel, forward_ms, backward_ms``, and may have ``attention`` (flash, the
default, or materialized) and ``dtype`` (bfloat16, the default, float16 or float32), as a
model spec's ``training`` says them; any other column (a row label) is kept as the row's
name.  Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from ..spec.layers import ATTENTION, FLOAT_DTYPES
from .memory import RECOMPUTE_MODES as RECOMPUTE
from pydantic import ValidationError as PydanticError

from ..errors import PlannerError, SpecError, SpecIssue
from ..topology import Topology

__all__ = ["LayerTiming", "load_layer_timings", "predict_layer", "fit_matmul_efficiency", "LayerFit"]

COLUMNS = ("hidden", "heads", "sequence", "micro_batch", "tensor", "recompute", "sequence_parallel",
           "forward_ms", "backward_ms")
OPTIONAL = {"attention": "flash", "dtype": "bfloat16"}      # as a model spec's training defaults
GOLDEN = (math.sqrt(5) - 1) / 2
LOWEST, HIGHEST = 0.05, 1.0          # the efficiencies searched (a spec accepts (0, 1])
STEP = 0.05                          # the scan before the golden-section search
TOLERANCE = 1e-4


@dataclass(frozen=True)
class LayerTiming:
    """One measured layer: its shape, how it ran, and its forward and backward seconds."""

    hidden: int
    heads: int
    sequence: int
    micro_batch: int
    tensor: int
    recompute: str
    sequence_parallel: bool
    forward: float
    backward: float
    attention: str = OPTIONAL["attention"]
    dtype: str = OPTIONAL["dtype"]
    name: str = ""
    where: str = ""                  # file:line, for messages

    def label(self) -> str:
        return self.name or (f"h{self.hidden} b{self.micro_batch} t{self.tensor} {self.recompute}"
                             f"{' +SP' if self.sequence_parallel else ''}")


def _issue(file: str, line: int | None, message: str) -> SpecError:
    return SpecError(SpecIssue(file, line, "", message))


def load_layer_timings(path: str | Path) -> list[LayerTiming]:
    """The rows of a timings file (module docstring); :class:`SpecError` with file and line
    for a missing or repeated column, a value that is not a number, or an unknown mode."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")          # a spreadsheet's byte-order mark
    except (OSError, UnicodeDecodeError) as exc:
        raise _issue(str(path), None, f"cannot read the layer timings: {getattr(exc, 'strerror', None) or exc}") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise _issue(str(path), None, "no layer timings (a header line and at least one row)")
    reader = csv.reader([line for _, line in numbered])
    header = [h.strip().lower() for h in next(reader)]
    first = numbered[0][0]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise _issue(str(path), first, f"the header names {', '.join(twice)} twice")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise _issue(str(path), first, f"the header lacks {', '.join(missing)}; expected the columns"
                                       f" {', '.join(COLUMNS)}")
    rows = []
    for (line, _), cells in zip(numbered[1:], reader):
        def bad(message: str) -> SpecError:
            return _issue(str(path), line, message)

        if len(cells) != len(header):
            raise bad(f"{len(cells)} values for {len(header)} columns")
        rec = {h: c.strip() for h, c in zip(header, cells)}
        ints = {}
        for key in ("hidden", "heads", "sequence", "micro_batch", "tensor"):
            try:
                ints[key] = int(rec[key])
            except ValueError:
                raise bad(f"{key} {rec[key]!r} is not a whole number") from None
            if ints[key] < 1:
                raise bad(f"{key} {rec[key]!r} must be at least 1")
        times = {}
        for key in ("forward_ms", "backward_ms"):
            try:
                times[key] = float(rec[key]) / 1e3
            except ValueError:
                raise bad(f"{key} {rec[key]!r} is not a number of milliseconds") from None
            if not (times[key] > 0 and math.isfinite(times[key])):
                raise bad(f"{key} {rec[key]!r} must be a positive number of milliseconds")
        if ints["hidden"] % ints["heads"]:
            raise bad(f"hidden {ints['hidden']} is not a multiple of heads {ints['heads']}")
        if ints["heads"] % ints["tensor"]:
            raise bad(f"heads {ints['heads']} do not split over tensor {ints['tensor']} devices")
        modes = {k: rec.get(k, "").lower() or default for k, default in (("recompute", ""), *OPTIONAL.items())}
        for key, allowed in (("recompute", RECOMPUTE), ("attention", ATTENTION), ("dtype", tuple(FLOAT_DTYPES))):
            if modes[key] not in allowed:
                raise bad(f"{key} {rec.get(key, '')!r}; expected one of {', '.join(allowed)}")
        sp = rec["sequence_parallel"].lower()
        if sp not in ("true", "false"):
            raise bad(f"sequence_parallel {rec['sequence_parallel']!r}; expected true or false")
        if sp == "true" and ints["sequence"] % ints["tensor"]:
            raise bad(f"sequence parallelism splits the sequence over the tensor degree: sequence"
                      f" {ints['sequence']} does not split over tensor {ints['tensor']}")
        name = " ".join(v for k, v in rec.items() if k not in COLUMNS and k not in OPTIONAL and v)
        rows.append(LayerTiming(sequence_parallel=sp == "true", forward=times["forward_ms"],
                                backward=times["backward_ms"], name=name, where=f"{path}:{line}", **modes, **ints))
    if not rows:
        raise _issue(str(path), first, "no layer timings after the header")
    return rows


def _one_host(topology: Topology, efficiency: float | None) -> Topology:
    """One host of ``topology`` (a layer measured alone runs on one: its first devices,
    :func:`~solver_planner.subcluster.first_devices`), with ``matmul_efficiency`` set to
    ``efficiency`` when given."""
    from ..subcluster import first_devices

    host = first_devices(topology, topology.devices_per_host)
    if efficiency is None:
        return host
    device = host.spec.device
    if device.compute is None:
        raise ValueError(f"{host.spec.name}: the device has no compute block to fit (use a preset such as"
                         " A100-SXM4-80GB, or write `compute:`)")
    compute = device.compute.model_copy(update={"matmul_efficiency": efficiency})
    return Topology(host.spec.model_copy(update={"device": device.model_copy(update={"compute": compute})}))


def predict_layer(topology: Topology, row: LayerTiming, efficiency: float | None = None) -> tuple[float, float]:
    """(forward, backward) seconds the cost model gives one of ``row``'s layers on
    ``topology`` (with ``matmul_efficiency`` set to ``efficiency`` when given): the layer
    alone on one host, ``row.tensor`` devices to a replica, the micro-batch of
    ``row.micro_batch`` samples per replica, the backward with its recomputed forward and
    weight gradients."""
    from .costs import StageConfig
    from .layers import layer_model
    from .report import Config, shape_of
    from .search import StageSearch

    topo = _one_host(topology, efficiency)
    per_host = topo.devices_per_host
    if row.tensor > per_host or per_host % row.tensor:
        raise ValueError(f"{row.where or row.label()}: tensor {row.tensor} does not divide the "
                         f"{per_host} devices of a host of {topo.spec.name}")
    try:
        spec = _layer_spec(row, per_host)
    except (PydanticError, PlannerError) as exc:
        first = exc.errors()[0] if isinstance(exc, PydanticError) else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
        raise ValueError(f"{row.where or row.label()}: this layer is not one a model spec accepts ({why})") from None
    model = layer_model(spec)
    block = next(i for i, layer in enumerate(model.layers) if layer.name == "block")
    config = Config(per_host // row.tensor, row.tensor, 1, 1)
    search = StageSearch(model, topo, "1f1b", True, shapes=[shape_of(topo, config)], tensor=row.tensor,
                         microbatches=[1])
    (pair,) = search.pairs()
    fwd, act, weight = pair.costs.layer_times(StageConfig(row.tensor, row.recompute))
    return float(fwd[block]), float(act[block] + weight[block])


def _layer_spec(row: LayerTiming, per_host: int):
    """A model of the one layer: the host's other devices run replicas of it, each on its own
    micro-batch (a layer's passes do not depend on them; its times hold no gradient reduction)."""
    from ..spec.layers import TrainingSpec, TransformerSpec
    from ..spec.model import ModelSpec

    return ModelSpec(
        name="measured-layer",
        transformer=TransformerSpec(layers=1, hidden=row.hidden, heads=row.heads, sequence=row.sequence, vocab=1024),
        training=TrainingSpec(global_batch=row.micro_batch * (per_host // row.tensor), microbatches=1,
                              dtype=row.dtype, optimizer="adam", recompute=row.recompute,
                              attention=row.attention, sequence_parallel=row.sequence_parallel))


@dataclass(frozen=True)
class LayerFit:
    """The fitted efficiency, the device's before, and per row (measured, before, after)."""

    efficiency: float
    before: float | None
    rows: list[tuple[LayerTiming, tuple[float, float], tuple[float, float]]]

    @staticmethod
    def _errors(pairs) -> list[float]:
        return [p / m - 1 for row, pred in pairs for m, p in zip((row.forward, row.backward), pred)]

    def errors(self, after: bool = True) -> list[float]:
        """pred / measured - 1 of every pass (forward, backward per row)."""
        return self._errors([(row, a if after else b) for row, b, a in self.rows])

    def spec_yaml(self, base: str | Path, command: str = "") -> str:
        """The base cluster spec with ``device.compute.matmul_efficiency`` set to the fit (a
        preset's other compute keys still apply: a key written overrides the preset's alone),
        under a comment header saying what was fitted to what."""
        import statistics

        import yaml

        from ..spec.source import load_yaml

        raw, _ = load_yaml(base)
        device = raw.setdefault("device", {})
        compute = device.get("compute")
        device["compute"] = {**(compute if isinstance(compute, dict) else {}), "matmul_efficiency": self.efficiency}
        before, after = [abs(e) for e in self.errors(False)], [abs(e) for e in self.errors()]
        files = sorted({row.where.rsplit(":", 1)[0] for row, _, _ in self.rows if row.where})
        lines = [f"# Fitted to measured layer times{' by `' + command + '`' if command else ''}.",
                 f"# Base: {base} (its comments are not copied); only device.compute.matmul_efficiency differs",
                 f"# from it: {self.before} -> {self.efficiency}, the least squared log error over every measured",
                 f"# forward and backward ({len(after)} passes of {len(self.rows)} layers from {', '.join(files)}).",
                 f"# |predicted / measured - 1|: median {statistics.median(before):.1%} before,"
                 f" {statistics.median(after):.1%} after; worst {max(before):.1%} before, {max(after):.1%} after."]
        return "\n".join(lines) + "\n" + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)

    def as_dict(self) -> dict:
        return {"matmul_efficiency": self.efficiency, "matmul_efficiency_before": self.before,
                "rows": [{"row": row.label(), "where": row.where,
                          "measured": {"forward": row.forward, "backward": row.backward},
                          "predicted_before": {"forward": b[0], "backward": b[1]},
                          "predicted": {"forward": a[0], "backward": a[1]}} for row, b, a in self.rows]}


def _loss(topology: Topology, rows: list[LayerTiming], efficiency: float) -> float:
    total = 0.0
    for row in rows:
        for measured, predicted in zip((row.forward, row.backward), predict_layer(topology, row, efficiency)):
            total += math.log(predicted / measured) ** 2
    return total


def fit_matmul_efficiency(topology: Topology, rows: list[LayerTiming]) -> LayerFit:
    """The ``matmul_efficiency`` in [0.05, 1] (to 0.001) with the least squared log error
    over every measured forward and backward of ``rows``: a scan in steps of 0.05, then a
    golden-section search around the best step (each pass falls as the efficiency rises, so
    the loss has one valley on real tables; the scan keeps a second one from misleading the
    search).  ``ValueError`` when the best lies at either end of the range: the timings are
    faster or slower than the device at any efficiency (milliseconds read as microseconds,
    the wrong cluster)."""
    if not rows:
        raise ValueError("no layer timings to fit")
    compute = topology.spec.device.compute
    _one_host(topology, 1.0)          # a device without a compute block is refused here
    steps = [round(LOWEST + STEP * k, 10) for k in range(int(round((HIGHEST - LOWEST) / STEP)) + 1)]
    losses = [_loss(topology, rows, e) for e in steps]
    k = min(range(len(steps)), key=lambda i: (losses[i], i))
    lo, hi = steps[max(0, k - 1)], steps[min(len(steps) - 1, k + 1)]
    a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = _loss(topology, rows, a), _loss(topology, rows, b)
    while hi - lo > TOLERANCE:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - GOLDEN * (hi - lo)
            fa = _loss(topology, rows, a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = _loss(topology, rows, b)
    best = round((lo + hi) / 2, 3)
    if best <= LOWEST + 2 * TOLERANCE or best >= HIGHEST - 2 * TOLERANCE:
        side = "slower" if best <= LOWEST + 2 * TOLERANCE else "faster"
        raise ValueError(f"the measured layers run {side} than {topology.spec.name}'s device would at any"
                         f" matmul_efficiency in [{LOWEST}, {HIGHEST}] (the fit stops at {best}): are the"
                         " times in milliseconds, and is this the cluster they were measured on?")
    out = [(row, predict_layer(topology, row), predict_layer(topology, row, best)) for row in rows]
    return LayerFit(best, compute.matmul_efficiency, out)
