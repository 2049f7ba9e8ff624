"""``check``: re-derive everything a plan file claims from the cluster and model specs.

Each stage's layers, configuration, devices and placement; each gradient program, proved
again with z3; each boundary's schedule, re-checked for feasibility (senders hold their
slices, no port used twice at once, durations from the cost model) and replayed; the whole
iteration simulated again with those schedules and compared with the recorded times and
memory.  Nothing recorded is trusted: a hand-edited plan fails at the first part that does
not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..choices import COMPUTE_MODELS
from ..cost import CostModel
from ..placement import ParallelismMatrix
from ..reduction.dsl import format_program, parse_program
from ..resharding import ReshardingPlan, Schedule as ReshardingSchedule, build_instance
from ..resharding import check as check_resharding
from ..spec.model import ModelSpec
from ..stages import Partition, Schedule, StagePlan, StageSearch, simulate_schedule
from ..stages.costs import MeshShape, StageConfig, port_names
from ..stages.layers import layer_model
from ..topology import Topology
from .boundaries import Boundary, boundary_problem, transfers_of
from .parts import StagePart, prove_program, stage_parts

__all__ = ["Finding", "CheckReport", "check_plan", "RELATIVE"]

RELATIVE = 1e-6       # recorded and replayed times must agree to this (YAML keeps ~17 digits)


@dataclass
class Finding:
    part: str
    status: str            # ok | fail | unknown
    message: str


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    iteration_time: float | None = None

    def add(self, part: str, status: str, message: str) -> None:
        self.findings.append(Finding(part, status, message))

    @property
    def first_failure(self) -> Finding | None:
        return next((f for f in self.findings if f.status == "fail"), None)

    @property
    def exit_code(self) -> int:
        if self.first_failure is not None:
            return 1
        if any(f.status == "unknown" for f in self.findings):
            return 3
        return 0

    def as_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {"ok": self.exit_code == 0, "exit_code": self.exit_code,
                "first_failure": None if first is None else vars(first),
                "replayed_iteration_time": self.iteration_time,
                "findings": [vars(f) for f in self.findings]}


class _Stop(Exception):
    """A part failed and what follows depends on it."""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RELATIVE, abs_tol=1e-12)


def _get(doc: dict, key: str, kind, where: str):
    value = doc.get(key) if isinstance(doc, dict) else None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _Stop(f"{where}: '{key}' is missing or not {getattr(kind, '__name__', kind)}")
    return value


def check_plan(topology: Topology, model: ModelSpec, doc: dict[str, Any], proof_timeout: float = 30.0
               ) -> CheckReport:
    """Every claim of the plan file ``doc`` (from :func:`.planfile.read_plan`), re-derived."""
    rep = CheckReport()
    try:
        _check(topology, model, doc, proof_timeout, rep)
    except _Stop as stop:
        part = stop.args[1] if len(stop.args) > 1 else "plan"
        rep.add(part, "fail", stop.args[0])
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        # a value of the wrong type or size somewhere the checks above did not look first:
        # the file is wrong, and says so, rather than crashing
        rep.add("plan", "fail", f"the plan file holds a value this version cannot read: {type(exc).__name__}: {exc}")
    return rep


def _check(topology: Topology, model: ModelSpec, doc: dict, timeout: float, rep: CheckReport) -> None:
    if doc.get("cluster") != topology.name or doc.get("devices") != topology.num_devices:
        raise _Stop(f"the plan is for cluster '{doc.get('cluster')}' ({doc.get('devices')} devices), not"
                    f" '{topology.name}' ({topology.num_devices})", "inputs")
    if doc.get("model") != model.name:
        raise _Stop(f"the plan is for model '{doc.get('model')}', not '{model.name}'", "inputs")
    rep.add("inputs", "ok", f"cluster '{topology.name}', model '{model.name}'")
    part = _partition(topology, model, doc)
    rep.add("stages", "ok", f"{len(part.stages)} stages of contiguous layers on {part.costs.shape} meshes,"
                            f" {part.costs.microbatches} micro-batches")
    parts = _stage_parts(topology, part, doc, timeout, rep)
    boundaries = _boundaries(topology, part, parts, doc, rep)
    _iteration(part, doc, boundaries, rep)


def _partition(topology: Topology, model: ModelSpec, doc: dict) -> Partition:
    lm = layer_model(model)
    mesh = doc.get("mesh")
    B = doc.get("microbatches")
    if not (isinstance(mesh, list) and len(mesh) == 2 and all(isinstance(x, int) and x > 0 for x in mesh)):
        raise _Stop(f"'mesh' must be [hosts, devices per host], got {mesh!r}", "stages")
    if not isinstance(B, int) or B < 1 or lm.global_batch % B:
        raise _Stop(f"'microbatches' {B!r} does not divide the global batch of {lm.global_batch}", "stages")
    shape = MeshShape(*mesh)
    if shape.size > topology.num_devices or topology.num_devices % shape.size or \
            shape.devices_per_host > topology.devices_per_host:
        raise _Stop(f"a {shape} mesh does not tile '{topology.name}'", "stages")
    compute = doc.get("compute", "efficiency")
    if compute not in COMPUTE_MODELS:
        raise _Stop(f"'compute' must be one of {', '.join(COMPUTE_MODELS)}, got {compute!r}", "stages")
    pairs = StageSearch(lm, topology, "1f1b", shapes=[shape], microbatches=[B], compute=compute).pairs()
    if not pairs:
        raise _Stop(f"no plan has {shape} meshes and {B} micro-batches on '{topology.name}'", "stages")
    costs = pairs[0].costs
    entries = doc.get("stages")
    if not isinstance(entries, list) or len(entries) != costs.stages:
        raise _Stop(f"{costs.stages} stages expected on {shape} meshes, the plan lists"
                    f" {len(entries) if isinstance(entries, list) else entries!r}", "stages")
    plans = []
    for p, st in enumerate(entries):
        where = f"stage {p}"
        layers = _get(st, "layers", list, where)
        t = _get(st, "tensor", int, where)
        rec = _get(st, "recompute", str, where)
        if len(layers) != 2 or not all(isinstance(x, int) for x in layers):
            raise _Stop(f"{where}: 'layers' must be [first, last]", "stages")
        plans.append(StagePlan(layers[0], layers[1], StageConfig(t, rec)))
    try:
        return Partition(costs, plans)
    except ValueError as exc:
        raise _Stop(str(exc), "stages") from None


def _stage_parts(topology: Topology, part: Partition, doc: dict, timeout: float, rep: CheckReport
                 ) -> list[StagePart]:
    """The stages as :func:`.parts.stage_parts` derives them (placement, the priced program
    and its proof), compared with what the file records."""
    derived = stage_parts(part, topology, timeout=timeout)
    for p, (stage, entry) in enumerate(zip(derived, doc["stages"])):
        where = f"stage {p}"
        devices = list(stage.devices)
        if entry.get("devices") != devices:
            raise _Stop(f"{where}: devices {entry.get('devices')!r} are not the stage's sub-mesh"
                        f" {devices[0]}..{devices[-1]}", where)
        if entry.get("data") != stage.data:
            raise _Stop(f"{where}: data degree {entry.get('data')!r}, but {len(devices)} devices with tensor"
                        f" {stage.tensor} make {stage.data}", where)
        try:
            given = ParallelismMatrix.of(entry.get("matrix"))
            given.check([stage.data, stage.tensor], list(stage.mesh))
        except (TypeError, ValueError) as exc:
            raise _Stop(f"{where}: placement matrix {entry.get('matrix')!r}: {exc}", where) from None
        if given != stage.matrix:
            raise _Stop(f"{where}: placement {given} is not the layout the plan was priced with ({stage.matrix})",
                        where)
        text = entry.get("gradient_program")
        if not isinstance(text, str):
            raise _Stop(f"{where}: 'gradient_program' is missing", where)
        if text != "none":
            try:
                text = format_program(parse_program(text))
            except ValueError as exc:
                raise _Stop(f"{where}: gradient program does not parse: {exc}", where) from None
        if text != stage.program:
            # a program other than the priced one: say whether it is wrong, or only not priced
            status, detail, _ = prove_program(stage.matrix, stage.mesh, topology.level_names, text, timeout) \
                if text != "none" else ("invalid", "no program, but the stage has replicas to reduce", 0.0)
            if status == "invalid":
                raise _Stop(f"{where}: gradient program '{text}' is not a valid all-reduce: {detail}", where)
            raise _Stop(f"{where}: gradient program '{text}' is not the one the plan's times price"
                        f" ('{stage.program}')", where)
        if stage.proof == "invalid":
            raise _Stop(f"{where}: gradient program '{text}' is not a valid all-reduce: {stage.proof_detail}", where)
        if stage.proof == "unknown":
            rep.add(where, "unknown", f"z3 did not decide '{text}' within {timeout:g} s")
        else:
            rep.add(where, "ok", f"layers {stage.first}-{stage.last}, d={stage.data} t={stage.tensor}, placement"
                                 f" {stage.matrix}, program {stage.proof} ({stage.proof_time:.2f} s)")
    return derived


def _boundaries(topology: Topology, part: Partition, parts: list[StagePart], doc: dict, rep: CheckReport
                ) -> list[Boundary]:
    cost = CostModel(topology)
    entries = doc.get("boundaries")
    if not isinstance(entries, list):
        raise _Stop("'boundaries' is missing", "boundaries")
    want = [(k, s, d) for (p, q) in part.channels for (k, s, d) in (("act", p, q), ("grad", q, p))]
    got = [(e.get("kind"), e.get("src"), e.get("dst")) if isinstance(e, dict) else None for e in entries]
    if sorted(map(str, got)) != sorted(map(str, want)):
        raise _Stop(f"the plan's boundaries {got} are not the partition's channels {want}", "boundaries")
    strategy = doc.get("cross_mesh")
    out = []
    for entry in entries:
        kind, src, dst = entry["kind"], entry["src"], entry["dst"]
        where = f"boundary {kind} {src}->{dst}"
        problem = boundary_problem(part, parts, topology, kind, src, dst)
        if strategy == "free" or not part.costs.comm:
            out.append(Boundary(kind, src, dst, problem, None, 0.0, ()))
            continue
        rows = entry.get("schedule")
        strat = entry.get("strategy")
        if not isinstance(rows, list) or strat not in ("broadcast", "send-recv"):
            raise _Stop(f"{where}: 'schedule' or 'strategy' missing", where)
        tasks, inst, costs = build_instance(problem, cost, strat)
        if len(rows) != len(tasks):
            raise _Stop(f"{where}: {len(rows)} scheduled tasks, the resharding has {len(tasks)} unit tasks", where)
        choice, start, end = [0] * len(tasks), [0] * len(tasks), [0] * len(tasks)
        seen = set()
        for row in rows:
            i = row.get("task") if isinstance(row, dict) else None
            if not isinstance(i, int) or not 0 <= i < len(tasks) or i in seen:
                raise _Stop(f"{where}: task index {i!r} is wrong or repeated", where)
            seen.add(i)
            senders = [k for k, cand in enumerate(inst.candidates[i]) if cand.device == row.get("sender_device")]
            if not senders:
                raise _Stop(f"{where}: task {i} ({problem.describe_slice(tasks[i].slice)}): device"
                            f" {row.get('sender_device')!r} does not hold the slice on a sending host", where)
            if not (isinstance(row.get("start"), int) and isinstance(row.get("end"), int)):
                raise _Stop(f"{where}: task {i}: start and end must be integers (time units)", where)
            choice[i], start[i], end[i] = senders[0], row["start"], row["end"]
        sched = ReshardingSchedule(tuple(choice), tuple(start), tuple(end))
        problems = inst.violations(sched)
        if problems:
            raise _Stop(f"{where}: infeasible schedule: {problems[0]}", where)
        plan = ReshardingPlan(problem, strat, tasks, inst, sched, costs)
        timeline = check_resharding(plan, cost)
        recorded = _get(entry, "time", float, where)
        if not _close(timeline.makespan, recorded):
            raise _Stop(f"{where}: replayed in {timeline.makespan:.9g} s, the plan says {recorded!r}", where)
        ports = tuple(port_names({r for rec in timeline.records for r in rec.resources}))
        out.append(Boundary(kind, src, dst, problem, None, timeline.makespan, ports))
        rep.add(where, "ok", f"{len(tasks)} unit tasks, feasible, replayed in {timeline.makespan * 1e3:.3f} ms")
    return out


def _iteration(part: Partition, doc: dict, boundaries: list[Boundary], rep: CheckReport) -> None:
    s = doc.get("schedule")
    try:
        sched = Schedule(s["kind"], int(s["eagerness"]), bool(s["weight_delay"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise _Stop(f"schedule {s!r}: {exc}", "iteration") from None
    run = simulate_schedule(part, sched, transfers_of(boundaries, synchronous=not doc.get("overlap", True)))
    rep.iteration_time = run.iteration_time
    memory = part.costs.device_memory
    for p, (peak, entry) in enumerate(zip(run.peak_memory, doc["stages"])):
        if peak > memory:
            raise _Stop(f"stage {p} needs {peak / 2**30:.2f} GiB per device under {sched}; the device has"
                        f" {memory / 2**30:.2f} GiB", "memory")
        recorded = _get(entry, "memory", float, f"stage {p}")
        if not _close(peak, recorded):
            raise _Stop(f"stage {p}: memory {peak:.6g} bytes replayed, the plan says {recorded!r}", "memory")
    rep.add("memory", "ok", f"every stage fits ({max(run.peak_memory) / 2**30:.2f} of {memory / 2**30:.2f} GiB)")
    recorded = doc.get("iteration_time")
    if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or \
            not _close(run.iteration_time, float(recorded)):
        raise _Stop(f"the iteration replays in {run.iteration_time:.9g} s under {sched}; the plan says"
                    f" {recorded!r}", "iteration")
    rep.add("iteration", "ok", f"replayed in {run.iteration_time:.6g} s under {sched}, as recorded")
