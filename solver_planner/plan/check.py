"""``check``: a plan file is a certificate; every field it holds is re-derived and compared.

From the cluster and model specs and the plan's choices (the mesh, the micro-batches, each
stage's layers, tensor degree and recomputation, each boundary's sender and start per unit
task, the schedule, the cross-mesh mode), ``check``

1. rebuilds the partition (contiguous layers, possible configurations);
2. places each stage and **proves its gradient program again** with z3 (a respelled
   program is the same program; another one must be the priced one);
3. rebuilds each boundary's unit tasks and checks its schedule: each sender holds its
   slice, no port is used by two tasks at once, durations are the cost model's, every task
   runs as soon as its ports are free; replays it in the simulator; and re-runs the
   resharding solver to re-derive the bound, the status and the method it records;
4. simulates every member of the schedule family again with those schedules: the recorded
   member must be the fastest that fits, and memory, times, bubble, throughput, MFU, the
   breakdown and the hidden communication follow from it;
5. runs the stage search again with the recorded options and composes its candidates:
   its status, bound and gap, and the recorded plan as the fastest composed one;
6. checks the launch layout as a construction (each rank once, groups that partition
   their stage) and rebuilds it from the stages, rank by rank;

and then compares the whole recorded document with the document of the re-derived plan,
leaf by leaf (:func:`.fields.differences`).  A field that differs fails with its path; a
field the format does not have is refused as unknown.  Only ``solve_times`` (wall-clock
measurements of the machine that planned) cannot be re-derived: their form is checked.
Respelled programs, and the order of boundaries and of schedule rows (keyed by their
channel and task), are not meaning and are accepted in any form.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field as datafield
from typing import Any

import numpy as np

from ..choices import (COMPUTE_MODELS, CROSS_MESH, DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS, SCHEDULES,
                       STAGE_METHODS)
from ..targets.base import TARGETS
from ..units import format_span
from ..cost import CostModel
from ..errors import InfeasibleError, PlannerError, RefusedError
from ..reduction.dsl import format_program, parse_program
from ..resharding import ReshardingPlan, Schedule as ReshardingSchedule, TIME_UNIT
from ..resharding import check as check_resharding
from ..solve import SolveResult, Status
from ..spec.model import ModelSpec
from ..stages import Partition, Schedule, StagePlan, StageSearch, simulate_schedule
from ..stages.schedule import VIRTUAL, mesh_of
from ..stages.costs import MeshShape, StageConfig, StageCosts, port_names
from ..stages.meshes import MeshCosts, pack
from ..stages.unequal import alpa_shapes
from ..stages.layers import layer_model
from ..stages.devices import DeviceUse
from ..stages.report import Config, parse_config
from ..subcluster import first_devices, representable
from ..topology import Topology
from .boundaries import Boundary, boundary_problem, directions, solve_boundaries, transfers_of
from .compose import SearchOptions, TrainingPlan, compose_candidates, members, search_stages, simulate_plan
from .fields import FieldError, differences, field, path_text, show
from .launch import held_chunks, launch_problems
from .parts import StagePart, prove_program, stage_parts
from .planfile import plan_document

__all__ = ["Finding", "CheckReport", "check_plan", "SOLVE_TIMES"]

# What plan measures of its own run (seconds): the only fields no check can re-derive.
SOLVE_TIMES = ("stages", "placement_and_proofs", "resharding", "simulation")


@dataclass
class Finding:
    part: str
    status: str            # ok | fail | unknown | skipped
    message: str
    path: str = ""         # the field at fault, e.g. launch.ranks[3].tensor_group


@dataclass
class CheckReport:
    findings: list[Finding] = datafield(default_factory=list)
    iteration_time: float | None = None
    plan: Any = None       # the TrainingPlan re-derived from the file (its boundaries carry the recorded schedules)

    def add(self, part: str, status: str, message: str, path: str = "") -> None:
        self.findings.append(Finding(part, status, message, path))

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def first_failure(self) -> Finding | None:
        return next(iter(self.failures), None)

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
                "failed_parts": list(dict.fromkeys(f.part for f in self.failures)),
                "replayed_iteration_time": self.iteration_time,
                "findings": [vars(f) for f in self.findings]}


class _Stop(Exception):
    """A part failed and everything after it depends on it."""


def check_plan(topology: Topology, model: ModelSpec, doc: dict[str, Any], proof_timeout: float = 30.0
               ) -> CheckReport:
    """Every field of the plan file ``doc`` (from :func:`.planfile.read_plan`), re-derived."""
    rep = CheckReport()
    checker = _Checker(topology, model, doc, proof_timeout, rep)
    try:
        checker.run()
    except _Stop:
        pass
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError) as exc:
        # a value of a kind no check above looked at first: the file is wrong, and says so,
        # rather than crashing (the property tests look for these and add a check)
        rep.add("plan", "fail", f"the plan file holds a value this version cannot read ({type(exc).__name__}: {exc})")
    # every part a failure kept from running says so: nothing is left out unsaid (a target's
    # part only where the file has one)
    said = {f.part for f in rep.findings}
    for part in _PARTS + (("target",) if "target" in doc else ()):
        if part not in checker.ran and part not in said:
            rep.add(part, "skipped", "not checked: it is derived from what failed above")
    return rep


def _reduction_kind(program: str) -> str:
    """What a stage's gradient program must be (the priced one's kind): a reduce-scatter under a
    sharded optimizer, else an all-reduce."""
    steps = program.split(";")
    return "reduce-scatter" if all(x.strip().startswith("ReduceScatter") for x in steps) else "all-reduce"


# the parts of a check, in order (run() says which it reached)
_PARTS = ("inputs", "stages", "launch", "iteration", "memory", "search", "fields")


_ITERATION = {"schedule", "iteration_time", "throughput", "mfu", "bubble_ratio", "breakdown", "communication_hidden",
              "cross_mesh_free_time", "schedules_tried"}
_INPUTS = {"format", "version", "cluster", "model", "devices", "idle"}


class _Checker:
    def __init__(self, topology: Topology, model: ModelSpec, doc: dict, timeout: float, rep: CheckReport):
        self.topology, self.model, self.doc, self.timeout, self.rep = topology, model, doc, timeout, rep
        # the whole cluster; self.topology becomes the part the plan uses (inputs())
        self.cluster = topology
        self.use: DeviceUse | None = None
        self.reported: list[str] = []          # paths already failed (their consequences are not repeated)
        self.searched = False                  # the search's claims were re-derived
        self.ran: set[str] = set()             # the parts of _PARTS run() reached
        self.target_name = "native"            # the search options' target (partition())

    # -- reporting -------------------------------------------------------------------------------
    def fail(self, part: str, path: tuple | str, message: str) -> None:
        text = path if isinstance(path, str) else path_text(path)
        if any(text == p or text.startswith(p + ".") or text.startswith(p + "[") for p in self.reported):
            return
        self.reported.append(text)
        self.rep.add(part, "fail", message, text)

    def ok(self, part: str, message: str) -> None:
        self.rep.add(part, "ok", message)

    def get(self, part: str, path: tuple, kind: type, stop: bool = True):
        """The field at ``path``; a missing or mistyped one fails ``part`` (and stops when
        what follows needs it)."""
        try:
            return field(self.doc, path, kind)
        except FieldError as exc:
            self.fail(part, exc.path, exc.message)
            if stop:
                raise _Stop from None
            return None

    def part_of(self, path: tuple) -> str:
        head = path[0] if path else ""
        if head == "stages" and len(path) > 1:
            return f"stage {path[1]}"
        if head == "boundaries" and len(path) > 1:
            entry = self.doc["boundaries"][path[1]] if isinstance(self.doc.get("boundaries"), list) and \
                isinstance(path[1], int) and path[1] < len(self.doc["boundaries"]) else None
            if isinstance(entry, dict) and all(isinstance(entry.get(k), (str, int)) for k in ("kind", "src", "dst")):
                return f"boundary {entry['kind']} {entry['src']}->{entry['dst']}"
            return f"boundaries[{path[1]}]"
        if head in ("launch", "search", "target"):
            return head
        if head == "stage_planner_time":
            return "search"
        if head in _ITERATION:
            return "iteration"
        if head in _INPUTS:
            return "inputs"
        if head == "time_unit":
            return "boundaries"
        return "plan"

    # -- the parts -------------------------------------------------------------------------------
    def run(self) -> None:
        self.ran.add("inputs")
        self.inputs()
        options = self.options()
        self.use = self.device_use()
        self.ran.add("stages")
        part = self.partition(options)
        parts = self.stages(part)
        self.ran.add("launch")
        self.launch(parts)
        self.ran.add("target")
        self.target(part, options)
        bounds = self.boundaries(part, parts, options)
        if bounds is None:
            self.rep.add("iteration", "skipped", "needs every boundary's schedule (see the failures above)")
            return
        self.ran.add("iteration")
        plan = self.iteration(part, parts, bounds)
        if plan is None:
            return
        self.ran.add("memory")
        self.rep.plan = plan
        self.ran.add("search")
        if options is None:
            self.rep.add("search", "skipped", "needs the search's options (see the failure above)")
        else:
            self.search(plan, options)
        self.ran.add("fields")
        self.fields(plan)

    def inputs(self) -> None:
        doc, topo = self.doc, self.topology
        if doc.get("cluster") != topo.name or doc.get("devices") != topo.num_devices:
            self.fail("inputs", "cluster" if doc.get("cluster") != topo.name else "devices",
                      f"the plan is for cluster {show(doc.get('cluster'))}"
                                           f" ({show(doc.get('devices'))} devices), not {show(topo.name)}"
                                           f" ({topo.num_devices})")
            raise _Stop
        if doc.get("model") != self.model.name:
            self.fail("inputs", "model", f"the plan is for model {show(doc.get('model'))}, not {show(self.model.name)}")
            raise _Stop
        # the model spec edited since (its global batch), said as an input, not as what it breaks
        want = self.model.training.global_batch if self.model.training is not None else None
        batch, B, size = doc.get("global_batch"), doc.get("microbatches"), doc.get("microbatch_size")
        if type(batch) is not int or batch != want:
            made = (f"{B} micro-batches of {size} samples make a global batch of {batch}"
                    if type(B) is int and type(size) is int and B * size == batch
                    else f"the plan is for a global batch of {show(batch)}")
            self.fail("inputs", "global_batch", f"{made}; the model's is {show(want)}")
            raise _Stop
        used = topo.num_devices
        # a plan of the unequal search lists each stage's mesh shape (stages/unequal.py): it runs
        # on the whole cluster, its meshes packed from device 0
        mesh = doc.get("mesh")
        self.unequal = isinstance(mesh, list) and bool(mesh) and all(isinstance(m, list) for m in mesh)
        if "idle" in doc and self.unequal:
            used = self.get("inputs", ("idle", "used"), int)
            if not 1 <= used < topo.num_devices:
                self.fail("inputs", ("idle", "used"), f"{show(used)} is not a number of devices fewer than"
                                                      f" {show(topo.name)}'s {topo.num_devices}")
                raise _Stop
        elif "idle" in doc:
            used = self.get("inputs", ("idle", "used"), int)
            if not 1 <= used < topo.num_devices or not representable(topo, used):
                self.fail("inputs", ("idle", "used"), f"{show(used)} is not a whole part of {show(topo.name)}'s"
                                                      f" {topo.num_devices} devices, fewer than all")
                raise _Stop
            self.topology = first_devices(topo, used)
        self.used = used
        self.ok("inputs", f"cluster {show(topo.name)}, model {show(self.model.name)}"
                          + (f", its first {used:,} devices" if used < topo.num_devices else ""))

    def device_use(self) -> DeviceUse:
        """The file's account of the devices the plan uses (the plan is checked on them);
        the search run again derives it (:meth:`search`), else it is not compared twice."""
        used, N = self.used, self.cluster.num_devices
        reason = self.doc.get("idle", {}).get("reason", "") if isinstance(self.doc.get("idle"), dict) else ""
        return DeviceUse(N, used, reason if isinstance(reason, str) else "")

    def options(self) -> SearchOptions | None:
        """The stage search's options (what ``check`` runs the search with again)."""
        where = ("search", "options")
        opts = self.get("search", where, dict, stop=False)
        if opts is None:
            return None
        try:
            method = field(opts, ("method",), str)
            if method not in STAGE_METHODS:
                raise FieldError(("method",), f"{show(method)} is not a stage search method"
                                              f" ({', '.join(STAGE_METHODS)})")
            stages = opts.get("stages")
            if stages is not None:
                stages = field(opts, ("stages",), int)
            config = opts.get("config")
            if config is not None:
                config = parse_config(field(opts, ("config",), str))
            split = opts.get("split")
            if split is not None:
                split = tuple(field(opts, ("split", i), int) for i in range(len(field(opts, ("split",), list))))
            candidates = field(opts, ("candidates",), int)
            time_limit = field(opts, ("time_limit",), float)
            seed = field(opts, ("seed",), int)
            target = field(opts, ("target",), str) if "target" in opts else "native"
            if target not in TARGETS:
                raise FieldError(("target",), f"{show(target)} is not a target ({', '.join(TARGETS)})")
            devices = field(opts, ("devices",), int) if "devices" in opts else None
            if devices is not None and not 1 <= devices <= self.cluster.num_devices:
                raise FieldError(("devices",), f"{devices} is not 1..{self.cluster.num_devices} devices")
            meshes = field(opts, ("meshes",), str) if "meshes" in opts else "equal"
            if meshes not in ("equal", "unequal"):
                raise FieldError(("meshes",), f"{show(meshes)} is not equal or unequal")
            budget = field(opts, ("budget",), int) if "budget" in opts else DEFAULT_BUDGET
            if budget < 1:
                raise FieldError(("budget",), f"{budget} subspaces: the search needs at least 1")
            simulations = field(opts, ("simulations",), int) if "simulations" in opts else DEFAULT_SIMULATIONS
            if simulations < 1:
                raise FieldError(("simulations",), f"{simulations} simulated tasks: the search needs at least 1")
            gap = field(opts, ("gap",), float) if "gap" in opts else DEFAULT_GAP
            if not 0 <= gap < 1:
                raise FieldError(("gap",), f"{gap!r}: the gap the search may stop at must be in [0, 1)")
            if not 1 <= candidates <= 50 or not 0 < time_limit <= 86400 or not 0 <= seed < 2**31:
                raise FieldError((), "candidates must be 1..50, time_limit in (0, 86400] s and seed in 0..2^31-1")
        except FieldError as exc:
            self.fail("search", where + exc.path, exc.message)
            return None
        except PlannerError as exc:
            self.fail("search", where + ("config",), str(exc))
            return None
        return SearchOptions(method, stages, config, split, candidates, time_limit, seed, target, devices, meshes,
                             budget, simulations, gap)

    def partition(self, options: SearchOptions | None) -> Partition:
        self.target_name = options.target if options is not None else "native"
        if self.unequal:
            costs, mesh, entries = self.unequal_meshes()
        else:
            costs, mesh, entries = self.equal_meshes(options)
        return self.stage_plans(costs, mesh, entries)

    def unequal_meshes(self):
        """The per-stage meshes of a plan of the unequal search, placed as the search places them."""
        topo, part_name = self.topology, "stages"
        lm = layer_model(self.model)
        allowed = alpa_shapes(topo.num_hosts, topo.devices_per_host)
        shapes = []
        for m in range(len(self.doc["mesh"])):
            hosts = self.get(part_name, ("mesh", m, 0), int)
            per_host = self.get(part_name, ("mesh", m, 1), int)
            if len(self.doc["mesh"][m]) != 2 or MeshShape(hosts, per_host) not in allowed:
                self.fail(part_name, ("mesh", m), f"{show(self.doc['mesh'][m])} is not one of Alpa's mesh shapes on"
                                                  f" {show(topo.name)}: {', '.join(map(str, allowed))}")
                raise _Stop
            shapes.append(MeshShape(hosts, per_host))
        B = self.microbatch_count(lm)
        compute = self.compute_model()
        layout = pack(shapes, topo)
        if layout is None:
            each = ", ".join(f"mesh[{m}] {s}" for m, s in enumerate(shapes))
            self.fail(part_name, "mesh", f"the meshes take {sum(s.size for s in shapes):,} devices ({each});"
                                         f" {show(topo.name)} has {topo.num_devices:,}")
            raise _Stop
        if layout.used != self.used:
            said = f"idle.used says {self.used:,}" if "idle" in self.doc else "the file has no idle block saying so"
            each = ", ".join(f"mesh[{m}] {s}" for m, s in enumerate(shapes))
            self.fail("inputs", "idle", f"the plan's meshes ({each}) use {layout.used:,} of {topo.num_devices:,}"
                                        f" devices; {said}")
            raise _Stop
        if self.chunking().virtual > 1:
            self.fail("iteration", "schedule.virtual", "unequal meshes run one model chunk per stage")
            raise _Stop
        search = StageSearch(lm, topo, "1f1b", microbatches=[B], compute=compute)
        costs = MeshCosts([StageCosts(lm, topo, s, B, search.tables(s)) for s in shapes], layout)
        entries = self.get(part_name, ("stages",), list)
        if len(entries) != len(shapes):
            self.fail(part_name, "stages", f"the plan lists {len(shapes)} meshes and {len(entries)} stages")
            raise _Stop
        return costs, tuple(range(len(shapes))), entries

    def microbatch_count(self, lm) -> int:
        B = self.get("stages", ("microbatches",), int)
        if B < 1 or lm.global_batch % B:
            self.fail("stages", "microbatches", f"{B} micro-batches do not divide the global batch of"
                                                f" {lm.global_batch}")
            raise _Stop
        size = self.doc.get("microbatch_size")
        if type(size) is int and B * size != lm.global_batch:
            # one of the two is not the plan's.  The size is derived from the count (and
            # compared with the other fields at the end), so an edited size leaves the rest
            # checked; an edited count changes everything derived from it, the boundaries'
            # tensors first, whose recorded first dimension is then still the size: said here
            # by name, the parts it decides listed as skipped
            shapes = [b.get("tensor", {}).get("shape") for b in self.doc.get("boundaries") or []
                      if isinstance(b, dict) and isinstance(b.get("tensor"), dict)]
            if any(isinstance(x, list) and x and x[0] == size for x in shapes):
                self.fail("stages", "microbatches", f"{B} micro-batches of {size} samples (microbatch_size, the"
                                                    f" boundaries' tensors) are {B * size} samples, not the global"
                                                    f" batch of {lm.global_batch}")
                raise _Stop
        return B

    def compute_model(self) -> str:
        compute = self.get("stages", ("compute",), str)
        if compute not in COMPUTE_MODELS:
            self.fail("stages", "compute", f"{show(compute)} is not a compute model ({', '.join(COMPUTE_MODELS)})")
            raise _Stop
        return compute

    def equal_meshes(self, options: SearchOptions | None):
        topo, part_name = self.topology, "stages"
        lm = layer_model(self.model, options.target if options is not None else "native")
        hosts = self.get(part_name, ("mesh", 0), int)
        per_host = self.get(part_name, ("mesh", 1), int)
        if len(self.doc["mesh"]) != 2 or hosts < 1 or per_host < 1:
            self.fail(part_name, "mesh", f"must be [hosts, devices per host], got {show(self.doc['mesh'])}")
            raise _Stop
        B = self.microbatch_count(lm)
        shape = MeshShape(hosts, per_host)
        if shape.size > topo.num_devices or topo.num_devices % shape.size or per_host > topo.devices_per_host \
                or (hosts > 1 and per_host != topo.devices_per_host):
            self.fail(part_name, "mesh", f"{hosts}x{per_host} meshes do not tile {show(topo.name)}"
                                         f" ({topo.num_devices} devices, {topo.devices_per_host} per host)")
            raise _Stop
        compute = self.compute_model()
        # a framework target's plans price its flat gradient collective (targets/search.py)
        native = options is None or options.target == "native"
        pairs = StageSearch(lm, topo, "1f1b", shapes=[shape], microbatches=[B], compute=compute,
                            synthesize=native).pairs()
        if not pairs:
            self.fail(part_name, "mesh", f"no plan has {shape} meshes and {B} micro-batches on {show(topo.name)}")
            raise _Stop
        costs = pairs[0].costs
        schedule = self.chunking()
        v = schedule.virtual
        entries = self.get(part_name, ("stages",), list)
        self.layers_held(entries, lm.num_layers)
        if len(entries) != costs.stages * v and len(entries) % costs.stages == 0 and len(entries) > costs.stages:
            self.fail("iteration", "schedule.virtual", f"{v}, but the plan lists {len(entries)} model chunks on"
                                                       f" {costs.stages} stages")
            raise _Stop
        used = len(entries) // v * shape.size if len(entries) % v == 0 else None
        if used is not None and used != topo.num_devices and used <= self.cluster.num_devices:
            # the stages use another part of the cluster than the file's account says
            said = (f"idle.used says {topo.num_devices:,}" if "idle" in self.doc
                    else "the file has no idle block saying so")
            self.fail("inputs", "idle", f"the plan's {len(entries) // v} stages of {shape} meshes use {used:,} of"
                                        f" {self.cluster.num_devices:,} devices; {said}")
            raise _Stop
        if len(entries) != costs.stages * v:
            what = f"{costs.stages} stages" if v == 1 else f"{costs.stages} stages of {v} model chunks each ({schedule})"
            self.fail(part_name, "stages", f"{what} tile the cluster with {shape} meshes; the plan lists {len(entries)}")
            raise _Stop
        mesh = tuple(mesh_of(schedule, costs.stages, k) for k in range(len(entries)))
        return costs, mesh, entries

    def layers_held(self, entries: list, layers: int) -> None:
        """Stages that leave layers to none are a stage missing from the file (one cut
        short, or edited), which the device count read off the stage count would otherwise
        report as idle devices: said first, naming the layers.  Malformed entries are left to
        :meth:`stage_plans`, which names their fields."""
        spans = []
        for p in range(len(entries)):
            try:
                spans.append((field(self.doc, ("stages", p, "layers", 0), int),
                              field(self.doc, ("stages", p, "layers", 1), int)))
            except FieldError:
                return
            if not 0 <= spans[-1][0] <= spans[-1][1] < layers:
                return          # [last, first], or past the model: that entry is what is wrong
        held = np.zeros(layers + 1, dtype=int)          # layers held by some stage, by differences
        for first, last in spans:
            held[first] += 1
            held[last + 1] -= 1
        none = np.flatnonzero(np.cumsum(held)[:layers] == 0)
        if not spans or not len(none):
            return          # every layer held (stages out of order are stage_plans' to say)
        a = int(none[0])
        breaks = np.flatnonzero(np.diff(none) > 1)       # the first run of layers no stage holds
        b = int(none[breaks[0]] if len(breaks) else none[-1])
        after = [p for p, (first, _) in enumerate(spans) if first > b]
        if after:
            p = after[0]
            self.fail("stages", ("stages", p, "layers"),
                      f"{show(entries[p]['layers'])}: {_held(a, b)} by no stage")
        else:
            self.fail("stages", ("stages", len(spans) - 1, "layers"),
                      f"the stages end at layer {a - 1}; {_held(a, b)} by no stage (the model has {layers} layers)")
        raise _Stop

    def stage_plans(self, costs, mesh: tuple, entries: list) -> Partition:
        """Each stage's layers and configuration, checked against its mesh's tables."""
        part_name, lm = "stages", costs.model
        schedule = self.chunking()
        B = costs.microbatches
        plans, expect = [], 0
        for p in range(len(entries)):
            first = self.get(part_name, ("stages", p, "layers", 0), int)
            last = self.get(part_name, ("stages", p, "layers", 1), int)
            t = self.get(part_name, ("stages", p, "tensor"), int)
            rec = self.get(part_name, ("stages", p, "recompute"), str)
            if len(entries[p]["layers"]) != 2 or last < first or last >= lm.num_layers:
                self.fail(part_name, ("stages", p, "layers"),
                          f"{show(entries[p]['layers'])} is not [first, last] of a model with {lm.num_layers} layers")
                raise _Stop
            if first != expect:
                before = f"where stages[{p - 1}].layers ends (layer {expect - 1})" if p else "at layer 0"
                self.fail(part_name, ("stages", p, "layers"),
                          f"{show(entries[p]['layers'])} does not start {before}: stages hold contiguous layers,"
                          " in order")
                raise _Stop
            stage = self.get(part_name, ("stages", p, "pipeline_stage"), int)
            if stage != mesh[p]:
                self.fail(part_name, ("stages", p, "pipeline_stage"),
                          f"{stage}, but {schedule} runs chunk {p} on pipeline stage {mesh[p]}")
                raise _Stop
            config = StageConfig(t, rec)
            own = costs.of(mesh[p])
            if config not in own.configs:
                why = own.model.tensor_refusal(t) if type(t) is int and t >= 1 else None
                modes = own.model.options.recompute
                if why is None and rec not in modes:
                    # which modes are searched at all: the spec's training.recompute, a target's
                    # rules, and auto leaving out a selective mode that changes nothing here
                    why = (f"the search tries recompute {' and '.join(modes)} only for this model"
                           f" (training.recompute{', the target' if self.target_name != 'native' else ''})"
                           if isinstance(rec, str) else None)
                self.fail(part_name, ("stages", p), f"tensor {t} with recompute {show(rec)} is not possible on"
                                                    f" {own.shape} meshes with {B} micro-batches"
                                                    + (f" ({why})" if why else ""))
                raise _Stop
            plans.append(StagePlan(first, last, config))
            expect = last + 1
        if expect != lm.num_layers:
            self.fail(part_name, ("stages", len(entries) - 1, "layers"),
                      f"the stages end at layer {expect - 1}; the model has {lm.num_layers} layers")
            raise _Stop
        try:
            part = Partition(costs, plans, mesh)
        except ValueError as exc:        # the chunks of one stage with different configurations
            self.fail(part_name, "stages", str(exc))
            raise _Stop from None
        v = part.virtual
        chunks = f" x {v} model chunks" if v > 1 else ""
        self.ok(part_name, f"{len(plans) // v} stages{chunks} of contiguous layers on {part.meshes} meshes, {B}"
                           " micro-batches")
        return part

    def chunking(self) -> Schedule:
        """The recorded family's schedule with the recorded chunk count (its eagerness and
        weight delaying are the iteration's to check): where each model chunk runs."""
        kind = self.get("iteration", ("schedule", "family"), str)
        if kind not in SCHEDULES:
            self.fail("iteration", "schedule.family", f"{show(kind)} is not a schedule family ({', '.join(SCHEDULES)})")
            raise _Stop
        v = self.get("iteration", ("schedule", "virtual"), int)
        try:
            return Schedule(kind if kind in VIRTUAL else "1f1b", virtual=v)
        except ValueError as exc:
            self.fail("iteration", "schedule.virtual", f"{v}: {exc}" if kind in VIRTUAL else
                      f"{v}, but {kind} runs one model chunk per stage")
            raise _Stop from None

    def stages(self, part: Partition) -> list[StagePart]:
        """Placements and gradient programs as :func:`.parts.stage_parts` derives them (the
        program proved again); a recorded program other than the priced one fails."""
        derived = stage_parts(part, self.topology, timeout=self.timeout)
        for p, stage in enumerate(derived):
            name = f"stage {p}" if part.virtual == 1 else f"chunk {p} (stage {stage.stage})"
            text = self.get(name, ("stages", p, "gradient_program"), str, stop=False)
            if text is None:
                continue
            if text != "none":
                try:
                    text = format_program(parse_program(text))     # a respelled program is the same program
                except ValueError as exc:
                    self.fail(name, ("stages", p, "gradient_program"), f"does not parse: {exc}")
                    continue
            if text != stage.program:
                try:
                    status, detail, _ = prove_program(stage.matrix, stage.mesh, self.topology.level_names, text,
                                                      self.timeout) if text != "none" else \
                        ("invalid", "there are replicas whose gradients must be reduced", 0.0)
                except ValueError as exc:
                    # parsed, but names what this cluster's hierarchy has not (a level): this
                    # field is wrong, and the other parts are still checked
                    self.fail(name, ("stages", p, "gradient_program"), f"{show(text)}: {exc}")
                    continue
                if status == "invalid":
                    self.fail(name, ("stages", p, "gradient_program"),
                              f"{show(text)} is not a valid {_reduction_kind(stage.program)}: {detail}")
                else:
                    self.fail(name, ("stages", p, "gradient_program"),
                              f"{show(text, 400)} is not the program the plan's times price ({show(stage.program, 400)})")
                continue
            if stage.proof == "invalid":
                self.fail(name, ("stages", p, "gradient_program"),
                          f"{show(text)} is not a valid {_reduction_kind(stage.program)}: {stage.proof_detail}")
            elif stage.proof == "unknown":
                self.rep.add(name, "unknown", f"z3 did not decide {show(text)} within {self.timeout:g} s",
                             path_text(("stages", p, "gradient_program")))
            else:
                self.ok(name, f"layers {stage.first}-{stage.last}, d={stage.data} t={stage.tensor}, placement"
                              f" {stage.matrix}, program {stage.proof} ({stage.proof_time:.2f} s)")
        return derived

    def target(self, part: Partition, options: SearchOptions | None) -> None:
        """A framework target's configuration and export, from the stages and the recorded
        schedule alone, so that a wrong boundary or time does not hide them (the whole file
        is compared again at the end, where what failed here is not said twice)."""
        name = options.target if options is not None else "native"
        if name == "native" or not isinstance(self.doc.get("schedule"), dict):
            return                  # no target section is wanted: the fields part says so
        from ..targets.search import target_config, target_module

        try:
            recorded = Schedule(self.doc["schedule"].get("kind"), self.doc["schedule"].get("eagerness"),
                                self.doc["schedule"].get("weight_delay"), part.virtual)
            cfg = target_config(part, recorded, self.model, name)
        except (TypeError, ValueError):
            self.rep.add("target", "skipped", "needs the recorded schedule (the iteration part names what is wrong)")
            return
        why = target_module(name).allows(cfg)
        if why:
            self.fail("target", ("target", "config"), f"{name} does not run the recorded stages: {why}")
            return
        want = {"framework": name, "config": cfg.as_dict(), "export": target_module(name).export(cfg)}
        count = 0
        for path, message in differences(self.doc.get("target"), want, ("target",)):
            count += 1
            self.fail("target", path, message)
        if not count:
            self.ok("target", f"{name}: the configuration and the export derived from the stages")

    def launch(self, parts: list[StagePart]) -> None:
        stages = [{"chunks": [[s.first, s.last] for s in chunks], "devices": list(chunks[0].devices)}
                  for chunks in held_chunks(parts)]
        problems = launch_problems(self.doc.get("launch"), self.topology, stages, self.used)
        for path, message in problems:
            self.fail("launch", path, message)
        if not problems:
            self.ok("launch", f"{self.used} ranks, each once; every stage's tensor and data groups"
                              " partition it")

    def boundaries(self, part: Partition, parts: list[StagePart], options: SearchOptions | None
                   ) -> list[Boundary] | None:
        """Each recorded boundary schedule, rebuilt and checked; ``None`` when one fails."""
        topo = self.topology
        cost = CostModel(topo)
        cross = self.get("boundaries", ("cross_mesh",), str)
        if cross not in CROSS_MESH:
            self.fail("boundaries", "cross_mesh", f"{show(cross)} is not a cross-mesh mode ({', '.join(CROSS_MESH)})")
            raise _Stop
        if self.doc.get("time_unit") != TIME_UNIT or isinstance(self.doc.get("time_unit"), bool):
            self.fail("boundaries", "time_unit", f"must be {TIME_UNIT:g} s (the schedules' integer unit), got"
                                                 f" {show(self.doc.get('time_unit'))}")
            raise _Stop
        entries = self.get("boundaries", ("boundaries",), list)
        want = directions(part)
        got = [tuple(e.get(k) for k in ("kind", "src", "dst")) if isinstance(e, dict) else None for e in entries]
        if sorted(map(str, got)) != sorted(map(str, want)):
            wanted = ", ".join(f"{k} {s}->{d}" for k, s, d in want)
            seen: set = set()
            for b, key in enumerate(got):
                if key not in want or key in seen:
                    what = "names no direction of a channel" if key not in want else "repeats a direction"
                    self.fail("boundaries", ("boundaries", b), f"{what} (kind, src, dst: {show(list(key or []))});"
                                                               f" the plan's stages have: {wanted}")
                    raise _Stop
                seen.add(key)
            self.fail("boundaries", "boundaries", f"must have one entry per direction of each channel: {wanted}")
            raise _Stop
        t = options.time_limit if options is not None else SearchOptions.time_limit
        seed = options.seed if options is not None else SearchOptions.seed
        solved = {b.key: b for b in solve_boundaries(part, parts, topo, cost, cross, time_limit=t, seed=seed)}
        out: list[Boundary] = []
        ok = True
        for b, entry in enumerate(entries):
            kind, src, dst = got[b]
            name = f"boundary {kind} {src}->{dst}"
            at = ("boundaries", b)
            problem = boundary_problem(part, parts, topo, kind, src, dst)
            strategy = self.get(name, at + ("strategy",), str, stop=False)
            if strategy != cross:
                if strategy is not None:
                    self.fail(name, at + ("strategy",), f"{show(strategy)}, but the plan's cross_mesh is {show(cross)}:"
                                                        " every boundary moves its tensors that way")
                ok = False
                continue
            if cross == "free":
                out.append(Boundary(kind, src, dst, problem, None, 0.0, ()))
                self.ok(name, "priced as free (cross_mesh: free, an upper bound on speed, not a plan to run)")
                continue
            built = self.schedule(name, at, problem, cost, strategy, solved[kind, src, dst])
            if built is not None:
                built = Boundary(kind, src, dst, problem, *built)
            if built is None:
                ok = False
            else:
                out.append(built)
        return out if ok else None

    def schedule(self, name: str, at: tuple, problem, cost: CostModel, strategy: str, solved: Boundary
                 ) -> tuple[SolveResult, float, tuple[str, ...]] | None:
        """The recorded schedule of one boundary, checked and replayed: (its result, with the
        bound and method the resharding solver re-derives, the replayed time, its ports)."""
        rows = self.get(name, at + ("schedule",), list, stop=False)
        if rows is None:
            return None
        # the unit tasks and their candidates as the re-derived solve built them (a boundary that
        # is another one on other devices renamed, resharding/relabel.py, tested equal to a fresh
        # build): building each again took a fifth of check on 100 000 GPUs (130 builds, 9 s)
        mine = solved.plan
        tasks, inst, costs = mine.tasks, mine.instance, mine.costs
        if len(rows) != len(tasks):
            self.fail(name, at + ("schedule",), f"{len(rows)} scheduled tasks; the resharding has {len(tasks)} unit"
                                                " tasks")
            return None
        choice, start, end = [0] * len(tasks), [0] * len(tasks), [0] * len(tasks)
        row_of: dict[int, int] = {}
        for r in range(len(rows)):
            i = self.get(name, at + ("schedule", r, "task"), int, stop=False)
            sender = self.get(name, at + ("schedule", r, "sender_device"), int, stop=False)
            s = self.get(name, at + ("schedule", r, "start"), int, stop=False)
            e = self.get(name, at + ("schedule", r, "end"), int, stop=False)
            if None in (i, sender, s, e):
                return None
            if not 0 <= i < len(tasks) or i in row_of:
                self.fail(name, at + ("schedule", r, "task"), f"task {i} is not one of the {len(tasks)} unit tasks,"
                                                              " or is listed twice")
                return None
            row_of[i] = r
            senders = [k for k, cand in enumerate(inst.candidates[i]) if cand.device == sender]
            if not senders:
                senders_of = sorted(c.device for c in inst.candidates[i])
                held = sender in tasks[i].holders
                self.fail(name, at + ("schedule", r, "sender_device"),
                          f"task {i} ({problem.describe_slice(tasks[i].slice)}): device {sender}"
                          + (" holds it but is not one of its candidate senders (one device per host, or per port"
                             " where the devices send through ports of their own)" if held else " does not hold it")
                          + f"; its candidate senders are devices {senders_of}")
                return None
            choice[i], start[i], end[i] = senders[0], s, e
        sched = ReshardingSchedule(tuple(choice), tuple(start), tuple(end))
        for i in range(len(tasks)):
            c = inst.candidates[i][choice[i]]
            if start[i] < 0 or end[i] - start[i] != c.duration:
                self.fail(name, at + ("schedule", row_of[i], "end"),
                          f"task {i} ({problem.describe_slice(tasks[i].slice)}) runs from unit {start[i]} to"
                          f" {end[i]}, but the cost model times it at {c.duration} units from device {c.device}")
                return None
        problems = inst.violations(sched)
        if problems:
            self.fail(name, at + ("schedule",), f"not a feasible schedule: {problems[0]}")
            return None
        early = inst.left_shift(sched)
        for i in sched.order():
            if early.start[i] != start[i]:
                self.fail(name, at + ("schedule", row_of[i], "start"),
                          f"task {i} ({problem.describe_slice(tasks[i].slice)}) is recorded at units"
                          f" {start[i]}..{end[i]}, but the tasks before it on its ports let it run at"
                          f" {early.start[i]}..{early.end[i]}: every task runs as soon as its ports are free")
                return None
        plan = ReshardingPlan(problem, strategy, tasks, inst, sched, costs)
        try:
            timeline = check_resharding(plan, cost)
        except PlannerError as exc:
            self.fail(name, at + ("schedule",), f"the replay does not hold: {exc}")
            return None
        res = solved.result
        bound = res.bound
        status = Status.OPTIMAL if sched.makespan <= round(bound / TIME_UNIT) else Status.FEASIBLE
        result = SolveResult(status, res.method, plan, plan.makespan, bound, 0.0, [plan], {})
        ports = port_names({r for rec in timeline.records for r in rec.resources})
        self.ok(name, f"{len(tasks)} unit tasks, feasible, replayed in {timeline.makespan * 1e3:.3f} ms"
                      f" ({status.value}, bound {bound * 1e3:.3f} ms by {res.method})")
        return result, timeline.makespan, ports

    def iteration(self, part: Partition, parts: list[StagePart], bounds: list[Boundary]) -> TrainingPlan | None:
        kind = self.doc["schedule"]["family"]           # read and checked with the partition
        overlap = self.get("iteration", ("overlap",), bool)
        cross = self.doc["cross_mesh"]
        if cross == "free" and not overlap:
            self.fail("iteration", "overlap", "false, but free transfers have nothing to overlap (plan refuses"
                                              " --no-overlap with --cross-mesh free)")
            return None
        family = members(kind, part)
        try:
            recorded = Schedule(self.get("iteration", ("schedule", "kind"), str),
                                self.get("iteration", ("schedule", "eagerness"), int),
                                self.get("iteration", ("schedule", "weight_delay"), bool), part.virtual)
        except ValueError as exc:
            self.fail("iteration", "schedule.kind", str(exc))
            return None
        if recorded not in family:
            self.fail("iteration", "schedule", f"{recorded} is not a member of the {kind} family on"
                                               f" {part.costs.stages} stages")
            return None
        transfers = transfers_of(bounds, part.mesh, synchronous=not overlap)
        memory = part.costs.device_memory
        try:
            run, tried = simulate_plan(part, family, transfers)
        except InfeasibleError:
            mine = simulate_schedule(part, recorded, transfers)
            p = max(range(len(mine.peak_memory)), key=mine.peak_memory.__getitem__)
            self.fail("memory", ("stages", part.mesh.index(p), "memory"),
                      f"stage {p} needs {mine.peak_memory[p] / 2**30:.2f} GiB per device under {recorded}; the device"
                      f" has {memory / 2**30:.2f} GiB (no member of the {kind} family fits)")
            return None
        if run.schedule != recorded:
            why = "does not fit in memory" if tried.get(str(recorded)) == math.inf else \
                f"replays in {tried[str(recorded)]:.9g} s"
            self.fail("iteration", "schedule", f"{recorded} {why}; {run.schedule} of the same family is the fastest"
                                               f" that fits ({run.iteration_time:.9g} s): the plan runs that one"
                                               f" (simulated with the stages, the boundary schedules, overlap,"
                                               f" cross_mesh and compute as recorded)")
            return None
        self.rep.iteration_time = run.iteration_time
        self.ok("memory", f"every stage fits ({max(run.peak_memory) / 2**30:.2f} of {memory / 2**30:.2f} GiB)")
        recorded_time = self.doc.get("iteration_time")
        if isinstance(recorded_time, bool) or not isinstance(recorded_time, (int, float)) or \
                not math.isclose(run.iteration_time, recorded_time, rel_tol=1e-6):
            self.fail("iteration", "iteration_time", f"the iteration replays in {run.iteration_time:.9g} s under"
                                                     f" {run.schedule}; the plan says {show(recorded_time)} (derived"
                                                     " from the stages, the boundary schedules, schedule, overlap,"
                                                     " cross_mesh and compute)")
        else:
            self.ok("iteration", f"replayed in {run.iteration_time:.6g} s under {run.schedule}, the fastest member of"
                                 f" the {kind} family that fits")
        free = simulate_schedule(part, run.schedule, {b.key: (0.0, ()) for b in bounds})
        for stage in parts:
            stage.memory = run.peak_memory[stage.stage]
        return TrainingPlan(self.topology, self.model, part, run.schedule, kind, parts, bounds, run, cross, {},
                            free_time=free.iteration_time, tried=tried, overlap=overlap, use=self.use)

    def search(self, plan: TrainingPlan, options: SearchOptions) -> None:
        """The stage search run again with the recorded options, its candidates composed (the
        recorded plan stands for its own partition): its claims, and the plan as the fastest."""
        try:
            rep, search = search_stages(self.cluster, self.model, plan.family, options,
                                        plan.partition.costs.compute.mode)
            if rep.use != self.use:     # which of the two was edited, no check can tell: both are named
                u = rep.use
                self.fail("search", ("search", "options"), f"with these options the search uses {u.used:,} of"
                                                           f" {u.devices:,} devices ({u.reason or 'all'}); the file"
                                                           f" says idle: {self.use.used:,} ({self.use.reason or 'all'})")
                if rep.use.used != self.use.used:
                    return
            best = compose_candidates(rep.topology, self.model, rep, search, plan.family, plan.cross_mesh,
                                      plan.overlap, options, self.timeout, known=plan)
        except RefusedError:        # over the memory bound: nothing to say about the file (exit 2)
            raise
        except PlannerError as exc:
            self.fail("search", "search.options", f"the stage search with these options does not give a plan: {exc}")
            return
        if best is not plan:
            self.fail("search", "stages", f"with the recorded options the search composes a faster plan:"
                                          f" {best.partition.meshes} meshes, {best.partition.costs.microbatches}"
                                          f" micro-batches, {best.iteration_time:.9g} s per iteration")
            return
        plan.search = search
        self.searched = True
        self.ok("search", f"run again: {search['status']} ({search['method']}, gap {search['gap']:.2%}),"
                          f" {len(search['composed'])} candidate(s) composed, this plan the fastest")

    def fields(self, plan: TrainingPlan) -> None:
        """Every field of the file against the re-derived plan's document."""
        want = plan_document(plan)
        got = self.doc
        times = got.get("solve_times")
        if not isinstance(times, dict) or set(times) != set(SOLVE_TIMES) or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf
                for v in times.values()):
            self.fail("plan", "solve_times", "must give seconds (non-negative numbers) for "
                      + ", ".join(SOLVE_TIMES))
        want["solve_times"] = times                  # measurements: their form is all a check can know
        if not self.searched:                        # failed or skipped above: not compared twice
            for key in ("search", "stage_planner_time"):
                want[key] = got.get(key)
        _align(got, want)
        for p, stage in enumerate(plan.parts):
            if stage.proof == "unknown" and isinstance(got.get("stages"), list) and p < len(got["stages"]) \
                    and isinstance(got["stages"][p], dict):
                # z3 ran out of time here: the recorded verdict is neither confirmed nor refuted
                # (reported as unknown, exit 3)
                for key in ("proof", "proof_detail"):
                    want["stages"][p][key] = got["stages"][p].get(key)
        count = 0
        for path, message in differences(got, want):
            count += 1
            self.fail(self.part_of(path), path, message)
        if not count:
            self.ok("fields", f"every field equals the plan re-derived from the specs ({_leaves(want)} values);"
                              " solve_times are measurements, checked for form only")


def _align(got: dict, want: dict) -> None:
    """Put ``want``'s boundaries and schedule rows in the file's order (they are keyed by
    channel and task, so their order is not meaning), and its programs in the file's
    spelling where it is the same program."""
    for p, (g, w) in enumerate(zip(got.get("stages") or [], want["stages"])):
        if isinstance(g, dict) and isinstance(g.get("gradient_program"), str):
            try:
                if format_program(parse_program(g["gradient_program"])) == w["gradient_program"]:
                    w["gradient_program"] = g["gradient_program"]
            except ValueError:
                pass
    rows = got.get("boundaries")
    if not isinstance(rows, list):
        return
    by_key = {(b["kind"], b["src"], b["dst"]): b for b in want["boundaries"]}
    keys = [(e.get("kind"), e.get("src"), e.get("dst")) if isinstance(e, dict) else None for e in rows]
    if sorted(map(str, keys)) != sorted(map(str, by_key)):
        return
    want["boundaries"] = [copy.deepcopy(by_key[k]) for k in keys]
    for g, w in zip(rows, want["boundaries"]):
        if isinstance(g.get("schedule"), list) and isinstance(w.get("schedule"), list):
            by_task = {r["task"]: r for r in w["schedule"]}
            order = [r.get("task") if isinstance(r, dict) else None for r in g["schedule"]]
            if sorted(map(str, order)) == sorted(map(str, by_task)):
                w["schedule"] = [by_task[t] for t in order]


def _leaves(doc: Any) -> int:
    if isinstance(doc, dict):
        return sum(_leaves(v) for v in doc.values())
    if isinstance(doc, list):
        return sum(_leaves(v) for v in doc)
    return 1


def _held(a: int, b: int) -> str:
    """``layer 5 is held`` / ``layers 5-8 are held``."""
    return f"layer {a} is held" if a == b else f"layers {format_span(a, b)} are held"
