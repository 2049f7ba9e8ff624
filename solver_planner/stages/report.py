"""A stage plan as users see it: the search, the plans it lists, baselines, and the JSON shape."""

from __future__ import annotations

import dataclasses
import math

from dataclasses import dataclass, field
from typing import Callable

from ..errors import InfeasibleError, OptionError, PlannerError, UnknownError, unknown_choice
from ..solve import SolveResult, Status
from ..spec.model import ModelSpec
from ..topology import Topology
from .costs import MeshShape
from .devices import DeviceUse, choose_devices
from .layers import LayerModel, layer_model
from .memory import memory_warnings
from .schedule import VIRTUAL
from .search import (DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS, DEFAULT_TOP_GAP, TOLERANCE, Candidate,
                     StageSearch, plan_partition)

__all__ = ["StagesReport", "plan_stages", "parse_config", "parse_split", "plan_row", "Config", "device_use"]


@dataclass(frozen=True)
class Config:
    """DistIR's (data, tensor, pipeline, micro-batches) of a configuration."""

    data: int
    tensor: int
    pipeline: int
    microbatches: int

    def __str__(self) -> str:
        return f"{self.data},{self.tensor},{self.pipeline},{self.microbatches}"


def parse_split(text: str) -> tuple[int, ...]:
    """``10,12,12,10``: layers per stage, positive integers."""
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise OptionError(f"--split expects layers per stage as positive integers, e.g. 10,12,12,10; got {text!r}")
    return counts


def parse_config(text: str) -> Config:
    """``d,t,p,k`` (four positive integers)."""
    parts = [x.strip() for x in text.split(",")]
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) != 4 or min(values) < 1:
        raise OptionError(f"--config expects d,t,p,k (data, tensor, pipeline degrees and micro-batches, positive"
                           f" integers), got {text!r}")
    return Config(*values)


def shape_of(topology: Topology, cfg: Config) -> MeshShape:
    """The sub-mesh of ``d x t`` devices every stage gets, or a clear error."""
    size, M = cfg.data * cfg.tensor, topology.devices_per_host
    if size * cfg.pipeline != topology.num_devices:
        raise OptionError(f"--config {cfg}: d x t x p = {size * cfg.pipeline} devices, but '{topology.name}' has"
                           f" {topology.num_devices}")
    if cfg.tensor > M or M % cfg.tensor:
        raise OptionError(f"--config {cfg}: tensor parallelism stays inside a host; t must divide the"
                           f" {M} devices per host")
    if size < M:
        if M % size:
            raise OptionError(f"--config {cfg}: a stage of {size} devices must divide a host of {M}")
        return MeshShape(1, size)
    if size % M:
        raise OptionError(f"--config {cfg}: a stage of {size} devices must be whole hosts of {M}")
    return MeshShape(size // M, M)


def plan_config(cand: Candidate) -> dict:
    """(data, tensor, pipeline, micro-batches); data and tensor as lists when stages differ."""
    c = cand.plan.costs
    tensors = [st.tensor for st in cand.plan.stages]
    datas = [c.mesh_size(m) // st.tensor for m, st in zip(cand.plan.mesh, cand.plan.stages)]
    return {"data": datas[0] if len(set(datas)) == 1 else datas,
            "tensor": tensors[0] if len(set(tensors)) == 1 else tensors,
            "pipeline": c.stages, "microbatches": c.microbatches}


def plan_row(cand: Candidate) -> dict:
    """One plan: configuration, stages, memory, simulated time and its bounds."""
    plan, run = cand.plan, cand.run
    c = plan.costs
    rows = []
    for p, st in enumerate(plan.stages):
        cc = plan.table(p)
        grad = float(cc.grad_bytes[st.first, st.last])
        m = plan.mesh[p]                    # the pipeline stage (mesh) this model chunk runs on
        own = c.of(m)
        rows.append({
            "layers": [st.first, st.last],
            "layer_names": [c.model.layers[st.first].name, c.model.layers[st.last].name],
            "mesh": own.shape.as_list(),
            "pipeline_stage": m,
            "devices": [c.first_device(m), c.first_device(m) + own.shape.size - 1],
            "data": cc.data,
            "tensor": st.tensor,
            "recompute": st.config.recompute,
            "forward": plan.forward[p],
            "backward": plan.backward[p],
            "time": plan.forward[p] + plan.backward[p],
            "memory": run.peak_memory[m],
            "in_flight": run.in_flight[m],
            "gradient_bytes": grad,
            "gradient_reduction": float(cc.reduction_all[st.first, st.last]) if c.comm else 0.0,
            "gradient_tail": (plan.tail_weight if cand.schedule.split else plan.tail_full)[p],
            "gradient_program": own.bucket_program(st.tensor, min(grad, cc.bucket_cap))
            if c.comm and cc.data > 1 and grad > 0 else "none",
        })
    exact = abs(cand.bounds.value - cand.time) <= 1e-9 * cand.time
    return {
        "config": plan_config(cand),
        # one shape, or each pipeline stage's when they differ (Alpa's unequal sub-meshes)
        "mesh": c.of(0).shape.as_list() if plan.equal else [c.of(m).shape.as_list() for m in range(c.stages)],
        "microbatch_size": c.micro_size,
        "stages": rows,
        "iteration_time": cand.time,
        "objective": cand.bounds.value,
        "objective_exact": exact,
        "binding_bound": cand.bounds.binding,
        "bounds": dataclasses.asdict(cand.bounds),
        "relaxation": cand.relaxation,
        "schedule": str(cand.schedule),
        "eagerness": cand.schedule.eagerness,
        "weight_delay": cand.schedule.weight_delay,
        "virtual_stages": cand.schedule.virtual,
        "schedules_tried": {str(s): t for s, t in sorted(cand.tried.items())},
        "memory": max(run.peak_memory),
        "bubble_ratio": run.bubble_ratio,
        # no plan with this mesh shape and micro-batch count is faster than pair_bound
        "pair_bound": cand.pair_bound,
        "pair_gap": None if cand.pair_bound is None else (cand.time - cand.pair_bound) / cand.time,
    }


@dataclass
class StagesReport:
    result: SolveResult[Candidate]
    schedule: str
    device_memory: float
    baselines: dict = field(default_factory=dict)
    one_f_one_b: SolveResult[Candidate] | None = None
    config: Config | None = None
    compute: str = "efficiency"          # the compute model used (solver_planner.compute.ComputeModel.of)
    # the devices the plans use (the cluster's first ones) and the cluster they form
    use: DeviceUse | None = None
    topology: Topology | None = None

    @property
    def best(self) -> Candidate:
        return self.result.solution

    @property
    def warnings(self) -> list[str]:
        """What a user should know before running the best plan (the memory it leaves free)."""
        return [] if self.topology is None else memory_warnings(self.topology.device, self.best.run.peak_memory)

    @property
    def run(self):
        return self.best.run

    @property
    def partition(self):
        return self.best.plan

    def as_dict(self) -> dict:
        r = self.result
        out = {
            "schedule_family": self.schedule,
            **plan_row(self.best),
            "status": r.status.value,
            "method": r.method,
            "bound": r.bound,
            "gap": r.gap,
            "solve_time": r.wall_time,
            "device_memory": self.device_memory,
            "memory_reserved": 0.0 if self.topology is None else self.topology.device.reserved,
            "warnings": self.warnings,
            "compute_model": self.compute,
            "search": dict(r.info),
        }
        if self.use is not None:
            out["devices"] = self.use.as_dict()
        if self.config is not None:
            out["requested_config"] = str(self.config)
        if len(r.solutions) > 1 or self.config is None:
            out["top"] = [plan_row(c) for c in r.solutions]
        if self.one_f_one_b is not None:
            base = self.one_f_one_b.solution
            # the 1F1B search is over equal meshes (with --meshes unequal too: the eager plan
            # may then be on unequal ones, and the speed-up mixes the two spaces)
            one = self.one_f_one_b
            out["best_1f1b"] = {"iteration_time": base.time, "status": one.status.value,
                                "bound": _finite(one.bound), "gap": _finite(one.gap),
                                "config": plan_config(base), "meshes": "equal"}
            out["eager_speedup"] = base.time / self.best.time
        if self.baselines:
            out["baselines"] = self.baselines
        return out


def _finite(x: float | None) -> float | None:
    """``x`` for JSON: None when it is unknown or infinite."""
    return x if x is not None and math.isfinite(x) else None


def _baselines(topology: Topology, model: LayerModel, schedule: str, method: str, time_limit: float, seed: int,
               comm: bool, best: float, budget: int, simulations: int, compute: str = "efficiency",
               gap: float = DEFAULT_GAP) -> dict:
    """DistIR Table 2: the best pure data, tensor and pipeline plans (or why there is none)."""
    N, M = topology.num_devices, topology.devices_per_host
    whole = MeshShape(N // M, M) if N >= M else MeshShape(1, N)
    cases = {
        "data": (dict(shapes=[whole], tensor=1), f"d={N}, t=1, p=1"),
        "tensor": (dict(shapes=[whole], tensor=N), f"d=1, t={N}, p=1"),
        "pipeline": (dict(shapes=[MeshShape(1, 1)], tensor=1), f"d=1, t=1, p={N}"),
    }
    out = {}
    for name, (restrict, label) in cases.items():
        if name == "tensor" and N > M:
            out[name] = {"possible": False, "config": label,
                         "reason": f"tensor parallelism stays inside a host ({N} devices, {M} per host)"}
            continue
        if name == "pipeline" and N > model.num_layers:
            out[name] = {"possible": False, "config": label,
                         "reason": f"{N} stages need at least {N} layers (the model has {model.num_layers})"}
            continue
        if name == "data" and not any((model.global_batch // b) % N == 0 for b in range(1, model.global_batch + 1)
                                      if model.global_batch % b == 0):
            out[name] = {"possible": False, "config": label,
                         "reason": f"a global batch of {model.global_batch} does not split over {N} replicas"}
            continue
        search = StageSearch(model, topology, schedule, comm, compute=compute, **restrict)
        try:
            res = plan_partition(search, method if method != "brute-force" else "dp", time_limit, seed,
                                 budget=budget, simulations=simulations, gap=gap)
        except PlannerError as exc:
            shortfall = getattr(exc, "shortfall", None)
            out[name] = {"possible": False, "config": label,
                         "reason": f"does not fit: {shortfall}" if shortfall else str(exc)}
            continue
        cand = res.solution
        out[name] = {"possible": True, "config": plan_config(cand), "iteration_time": cand.time,
                     "status": res.status.value, "best_speedup": cand.time / best,
                     "memory": max(cand.run.peak_memory)}
    return out


def device_use(topology: Topology, lm: LayerModel, devices: int | None = None, stages: int | None = None,
               config: Config | None = None, layer_counts: tuple[int, ...] | None = None,
               restrict: dict | None = None, schedule: str = "1f1b") -> DeviceUse:
    """The devices the stage search plans on (:func:`.devices.choose_devices`): a
    configuration's d x t x p, else the most (at most ``devices``) equal meshes can tile
    with a plan in the space searched (``restrict``'s uniform schedules and splits, a
    target's; chunked schedules' own rules)."""
    if config is not None:
        return choose_devices(topology, lm, devices, used=config.data * config.tensor * config.pipeline)
    if layer_counts is not None:
        stages = len(layer_counts)
    restrict = restrict or {}
    kinds = restrict.get("uniform") or ([schedule] if schedule in VIRTUAL else None)
    if kinds is None:
        return choose_devices(topology, lm, devices, stages=stages)
    from .uniform import has_plans

    space = restrict.get("space", "native")
    text = (f"plans {'in the ' + space + ' space' if space != 'native' else 'of ' + ', '.join(kinds)}: its layer"
            f" splits and schedules' rules")
    return choose_devices(topology, lm, devices, stages=stages, rule_text=text,
                          rule=lambda S, B: has_plans(lm.layers, S, B, kinds, restrict.get("splits")))


def _eager(solve: Callable, one_f_one_b: Callable, compare: bool) -> tuple:
    """The eager-1F1B search, and the best 1F1B plan when it is asked for (``compare``) or
    needed: ``(solve's answer, the 1F1B search's result or None)``.

    The eager family holds 1F1B (eagerness 0, no weight delay), so an OPTIMAL eager plan is
    at least as fast as every 1F1B plan and the 1F1B search adds nothing to it.  It runs
    when the eager search stops short (a gap, or no plan found within the limits): if the
    best 1F1B plan is then faster, the eager search is run again from it, so the answer is
    never slower than the best 1F1B plan.  (It used to run first, every time: on random
    16-device instances it was up to 80% of the command and never changed the eager plan,
    ``benchmarks/small_gaps.py``.)"""
    try:
        first = solve(None)
    except UnknownError:
        first = None                      # no plan found within the limits: 1F1B may find one
    if first is not None and first[0].status == Status.OPTIMAL and not compare:
        return first, None
    # not asked for the comparison: only a 1F1B plan faster than the eager ones matters, so
    # they seed the 1F1B search as incumbents (its bound passes them long before its own
    # optimum is proven: seed 52 of small_gaps, 1 488 subspaces to prove 1F1B, 0.3532 s,
    # where the eager plan takes 0.2926 s)
    seeds = None if compare or first is None else [c for c in first[0].solutions
                                                  if getattr(c.plan.costs, "layout", None) is None]
    try:
        base = one_f_one_b(seeds)
    except (InfeasibleError, UnknownError):
        if first is None:
            raise
        return first, None
    shown = base if seeds is None else None       # cut off by the eager plans: no comparison
    faster = [c for c in base.solutions if c.schedule.kind == "1f1b"]
    if first is None or (faster and faster[0].time < first[0].solution.time * (1 - TOLERANCE)):
        # seeded with the 1F1B plans, the eager search returns one at least as fast
        return solve(faster or base.solutions), shown
    return first, shown


def _with_unequal(search: StageSearch, cluster: Topology, method: str, incumbents, args: dict, progress,
                  use: DeviceUse, devices: int | None, no_equal: InfeasibleError | bool = False
                  ) -> tuple[SolveResult[Candidate], Topology, DeviceUse]:
    """The equal-mesh search, then the unequal one (:mod:`.unequal`) over the cluster (at most
    ``devices`` of its first devices) with its plan as the incumbent and its bound over its
    pairs; the result, and the cluster and device use of the plan it returns.  ``no_equal``:
    why no equal plan is possible within the options (the equal search is skipped)."""
    from .unequal import search_unequal

    equal, equal_error, covered_bound = None, None, math.inf
    if no_equal:       # no equal plan within the options: nothing for the equal search to cover
        equal_error = (no_equal if isinstance(no_equal, InfeasibleError) else
                       InfeasibleError(search.impossible_message() if search.pairs() else "no plan on equal meshes"))
    else:
        try:
            equal = plan_partition(search, method, incumbents=incumbents, **args)
            covered_bound = equal.bound
        except (InfeasibleError, UnknownError) as exc:      # no equal plan: an unequal one may fit
            equal_error = exc
            # no equal plan fits (inf), or none was found within the limits: what was proven, if anything
            if isinstance(exc, UnknownError):
                covered_bound = exc.bound if exc.bound is not None else -math.inf
    covered = [] if no_equal else [(p.costs.shape, p.B, p.S) for p in search.pairs()]
    wide = StageSearch(search.model, cluster, search.schedule, search.comm, stages=search.stages,
                       compute=search.compute)
    result = search_unequal(wide, equal, progress, covered, covered_bound, devices)
    if result is None:
        equal_error.args = (f"{equal_error}; unequal meshes: no plan either", *equal_error.args[1:])
        raise equal_error
    layout = getattr(result.solution.plan.costs, "layout", None)
    if layout is None:                       # the equal search's plan: its part of the cluster
        return result, search.topology, use
    # a plan of the unequal search runs on the cluster; its meshes are packed from device 0,
    # so the devices it leaves idle are the last ones
    reason = "" if layout.used == cluster.num_devices else f"unequal meshes use the first {layout.used:,} devices" + (
        f" (--devices {devices:,})" if devices is not None and devices < cluster.num_devices else "")
    return result, cluster, DeviceUse(cluster.num_devices, layout.used, reason)


def plan_stages(topology: Topology, model: ModelSpec, schedule: str = "1f1b", method: str = "auto",
                time_limit: float = 10.0, seed: int = 0, comm: bool = True, stages: int | None = None,
                top: int = 1, config: Config | None = None, layer_counts: tuple[int, ...] | None = None,
                baselines: bool = False, budget: int = DEFAULT_BUDGET, simulations: int = DEFAULT_SIMULATIONS,
                progress: Callable[[str], None] | None = None, compute: str = "efficiency",
                top_gap: float = DEFAULT_TOP_GAP, target: str = "native", devices: int | None = None,
                meshes: str = "equal", gap: float = DEFAULT_GAP) -> StagesReport:
    """Plan ``model`` on ``topology``: the fastest simulated plan (and the ``top`` fastest),
    or one given configuration; with ``baselines``, the best pure strategies (DistIR) and
    for eager-1F1B the best 1F1B plan (searched anyway when the eager search stops short).
    ``target``: only what that framework runs (:mod:`solver_planner.targets.search`); the
    schedule is then the one given, or every one it runs when ``schedule`` is None.
    ``devices``: at most this many of the cluster's devices (its first ones); the plans use
    the most that equal meshes can tile (:mod:`.devices`; the report's ``use`` says how
    many and why the rest idle).  ``meshes="unequal"``: stages may also take sub-meshes of
    different shapes (Alpa's space, :mod:`.unequal`), on up to all the devices.  ``gap``:
    the search stops once its plan is proven within this relative gap and its bound has
    stopped rising (:func:`.search.plan_partition`); 0 searches until OPTIMAL or a budget."""
    lm = layer_model(model, target)
    if meshes not in ("equal", "unequal"):
        raise OptionError(unknown_choice("meshes", meshes, ["equal", "unequal"]))
    if meshes == "unequal":
        fixed = [name for name, v in (("--config", config), ("--split", layer_counts),
                                      ("--top (plan: --candidates)", top > 1 or None)) if v is not None]
        if target != "native":
            fixed.append(f"--target {target}")
        if (schedule or "1f1b") not in ("1f1b", "eager-1f1b", "gpipe"):
            fixed.append(f"--schedule {schedule}")
        if fixed:
            raise OptionError(f"--meshes unequal searches every split and configuration under 1f1b, eager-1f1b or"
                              f" gpipe; it does not take {', '.join(fixed)}")
        from .unequal import check_size

        check_size(lm.num_layers, topology, devices=devices)        # a refusal before any search starts
    # the options are checked against each other before any device is chosen
    if layer_counts is not None:
        if sum(layer_counts) != lm.num_layers or min(layer_counts) < 1:
            raise OptionError(f"--split gives {sum(layer_counts)} layers in {len(layer_counts)} stages; the model has"
                               f" {lm.num_layers} layers and every stage needs one")
        if stages is not None and stages != len(layer_counts):
            raise OptionError(f"--split has {len(layer_counts)} stages, --stages says {stages}")
    if config is not None:
        if lm.global_batch % config.microbatches:
            raise OptionError(f"--config {config}: {config.microbatches} micro-batches do not divide the global batch"
                               f" of {lm.global_batch}")
        if stages is not None and stages != config.pipeline:
            raise OptionError(f"--stages {stages} contradicts --config {config}")
        if layer_counts is not None and len(layer_counts) != config.pipeline:
            raise OptionError(f"--split has {len(layer_counts)} stages, --config {config} says {config.pipeline}")
    restrict: dict = {}
    if target != "native" and method != "auto":
        # a target's space is searched exactly by enumerating its uniform plans: a method
        # asked for would be recorded and never run
        raise OptionError(f"--target {target} searches the plans the framework runs exactly (every uniform"
                          f" split); --method {method} does not apply to it")
    if target != "native":
        from ..targets.search import restriction

        restrict.update(restriction(target, model, schedule))
    schedule = schedule or "1f1b"
    no_equal: InfeasibleError | bool = False
    try:
        use = device_use(topology, lm, devices, stages, config, layer_counts, restrict, schedule)
    except InfeasibleError as exc:
        if meshes != "unequal":
            raise
        # no equal plan within --stages / --devices: only the unequal search runs (and if it
        # finds none either, this is the reason given for equal meshes)
        use, no_equal = DeviceUse(topology.num_devices, topology.num_devices), exc
    from ..subcluster import first_devices

    full = topology
    topology = first_devices(topology, use.used)
    if config is not None:
        # the configuration fixes the mesh, tensor degree and micro-batches; a target's rules
        # still apply to it
        restrict.update(shapes=[shape_of(topology, config)], tensor=config.tensor, microbatches=[config.microbatches])
    if layer_counts is not None:
        restrict["layer_counts"] = tuple(layer_counts)
    args = dict(time_limit=time_limit, seed=seed, top=top, budget=budget, simulations=simulations,
                progress=progress, top_gap=top_gap, gap=gap)
    base = None
    search = StageSearch(lm, topology, schedule, comm, stages=stages, compute=compute, **restrict)

    def solve(incumbents):
        """The search of ``schedule``: (result, the cluster its plan runs on, device use)."""
        if meshes == "unequal":
            return _with_unequal(search, full, method, incumbents, args, progress, use, devices, no_equal)
        return plan_partition(search, method, incumbents=incumbents, **args), topology, use

    try:
        if schedule == "eager-1f1b" and target == "native" and not no_equal:
            result, base = _eager(solve, lambda seeds: plan_partition(
                StageSearch(lm, topology, "1f1b", comm, stages=stages, compute=compute, **restrict), method,
                incumbents=seeds, **args), baselines)
            result, topology, use = result
        else:
            result, topology, use = solve(None)
    except PlannerError as exc:
        if use.idle:            # say on which part of the cluster (its attributes kept: shortfall, bound)
            exc.args = (f"{exc} (on the first {use.used:,} of {use.devices:,} devices: {use.reason})", *exc.args[1:])
        raise
    report = StagesReport(result, schedule, topology.device.budget, one_f_one_b=base, config=config,
                          compute=search.cost.compute.mode, use=use, topology=topology)
    if baselines and config is None and layer_counts is None and target == "native":
        report.baselines = _baselines(topology, lm, schedule, method, time_limit, seed, comm, result.objective,
                                      budget, simulations, compute, gap)
    return report

