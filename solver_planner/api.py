"""The Python API: one function per question, for scripts and notebooks.

Each function takes spec file paths (or objects already loaded), calls the library's own
entry point for the question and returns that entry point's result object; it adds no
logic of its own beyond reading files and choosing defaults (the ``solver-planner``
command's). Heavy dependencies (OR-Tools, z3, numpy) load when a function first needs
them, not at ``import solver_planner``.

============  ================================================  =========================
function      question                                          returns
============  ================================================  =========================
``load``      read a cluster and a model spec                   ``(Topology, ModelSpec)``
``place``     parallelism matrices ranked by their reductions   ``(reports, SolveResult)``
``verify``    is a reduction program valid? (z3 proof)          ``Verdict``
``reshard``   cross-mesh broadcast schedules                    ``[SolveResult]``
``stages``    pipeline stages on sub-meshes                     ``StagesReport``
``plan``      the whole plan, simulated (optionally written)    ``TrainingPlan``
``check``     re-derive every claim of a plan file              ``CheckReport``
============  ================================================  =========================

``solver_planner.plan`` and ``solver_planner.stages`` are also the names of subpackages,
so those two functions are reached through this module; the recommended import is::

    from solver_planner import api as sp
    plan = sp.plan("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/gpt3-2.6b.yaml")

The paths in the examples are relative to the repository root.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from .errors import OptionError
from .spec import ClusterSpec, ModelSpec, load_cluster_spec, load_model_spec
from .topology import Topology

if TYPE_CHECKING:  # only for annotations: importing these pulls in numpy
    from .placement import ParallelismMatrix
    from .plan.check import CheckReport
    from .plan.compose import TrainingPlan
    from .reduction.dsl import Program
    from .reduction.ranking import PlacementReport
    from .reduction.verify import Verdict
    from .resharding import ReshardingPlan, ReshardingProblem
    from .solve import SolveResult
    from .stages.report import Config, StagesReport

__all__ = ["load", "place", "verify", "reshard", "stages", "plan", "check"]

PathLike = Union[str, "os.PathLike[str]"]


def _path(value, what: str, loaded: str) -> PathLike:
    """``value`` when it names a file; an integer would be read as a file descriptor by
    ``open`` (0: stdin, 1: stdout, which it then closes), so anything else is refused."""
    if isinstance(value, (str, os.PathLike)):
        return value
    raise OptionError(f"{what}: expected a spec file's path or {loaded}, got {type(value).__name__} {value!r:.60}")


def _choice(value, name: str, choices: Sequence[str]) -> None:
    """The command line's choice check (with "did you mean"), as the library's error."""
    from .errors import unknown_choice

    if not isinstance(value, str) or value not in choices:
        raise OptionError(unknown_choice(name, value if isinstance(value, str) else repr(value), tuple(choices)))


def _number(value, name: str, low: float, high: float | None = None, integer: bool = False,
            optional: bool = False):
    """The command line's range check of a number option, as the library's error (a bool is
    not a number here, as in the specs); the value as a Python int or float (numpy's numbers
    are accepted, and would otherwise reach the plan file, which YAML and JSON cannot write)."""
    if value is None and optional:
        return None
    import numbers

    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise OptionError(f"{name}: expected {'an integer' if integer else 'a number'}, got"
                          f" {type(value).__name__} {value!r:.40}")
    value = int(value) if integer else float(value)
    if not low <= value <= (math.inf if high is None else high):          # NaN fails both
        raise OptionError(f"{name}: {value!r} is not in [{low:g}, {'inf' if high is None else format(high, 'g')}]")
    return value


def _topology(cluster: PathLike | ClusterSpec | Topology) -> Topology:
    if isinstance(cluster, Topology):
        return cluster
    if isinstance(cluster, ClusterSpec):
        return Topology(cluster)
    return Topology(load_cluster_spec(_path(cluster, "cluster", "a loaded ClusterSpec or Topology")))


def _model(model: PathLike | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    return load_model_spec(_path(model, "model", "a loaded ModelSpec"))


def load(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec) -> tuple[Topology, ModelSpec]:
    """Read a cluster spec and a model spec.

    Parameters
    ----------
    cluster : str, path, ClusterSpec or Topology
        A cluster spec file (YAML), or a spec or topology already loaded (returned as is).
    model : str, path or ModelSpec
        A model spec file (YAML), or a spec already loaded (returned as is).

    Returns
    -------
    (Topology, ModelSpec)
        The cluster's devices, levels, groups and links, and the validated model spec.

    Raises
    ------
    SpecError
        A file is missing, is not YAML, or does not match its schema; the message names
        the file, line and key path.

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> topo, model = sp.load("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/local-2x4.yaml")
    >>> topo.name, topo.num_devices, topo.level_names
    ('aws-p3.8xlarge-2', 8, ('host', 'gpu'))
    >>> model.name, model.axis_names, [r.name for r in model.reductions]
    ('local-2x4', ['data', 'model'], ['grads', 'data-grads'])
    """
    return _topology(cluster), _model(model)


def _matrix(topo: Topology, spec: ModelSpec, matrix) -> ParallelismMatrix:
    from .placement import ParallelismMatrix

    given = matrix
    try:
        if isinstance(matrix, str):
            matrix = ParallelismMatrix.parse(matrix)
        elif not isinstance(matrix, ParallelismMatrix):
            matrix = ParallelismMatrix.of(matrix)
        matrix.check(spec.axis_sizes, [lv.count for lv in topo.levels])
    except (ValueError, TypeError) as exc:        # the library's error, as every other (README)
        raise OptionError(f"matrix {given!r:.80}: {exc}") from None
    return matrix


def place(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec, method: str = "auto",
          max_size: int = 5, algorithm: str = "ring", size_metric: str = "instructions",
          matrices: Sequence | None = None) -> tuple[list[PlacementReport], SolveResult]:
    """Every placement of the model's parallelism axes on the cluster's levels (parallelism
    matrices, P² §3.1), ranked by the time of its reductions' best synthesized programs.

    Calls :func:`solver_planner.reduction.ranking.rank_placements`.

    Parameters
    ----------
    cluster, model : path or loaded object
        As for :func:`load`; the model needs ``parallelism.axes`` that fill the cluster.
    method : {'auto', 'cp-sat', 'enumerate'}
        How placements are found; ``auto`` enumerates when there are few matrices (at most
        1 000 by a quick bound) and otherwise picks CP-SAT for small models.
    max_size : int
        Largest program size synthesized for each reduction.
    algorithm : {'ring', 'tree'}
        The NCCL algorithm the cost model assumes.
    size_metric : {'instructions', 'paper'}
        How program size is counted (``paper``: P²'s search space).
    matrices : sequence, optional
        Rank only these placements (each a ``ParallelismMatrix``, rows as lists, or text
        such as ``'[[1,2],[2,2]]'``).

    Returns
    -------
    reports : list of PlacementReport
        Best placement first: ``.matrix``, ``.cost`` and, per reduction, ``.reductions[i]``
        with its AllReduce baseline, ``.best`` program (``.text``, ``.time``) and every
        valid ``.programs``. Empty when no placement satisfies the model's constraints.
    found : SolveResult
        The placement search: ``.method`` used, ``.wall_time``, ``.status``.

    Raises
    ------
    SpecError
        A spec is invalid, the model has no parallelism axes, or they do not fill the cluster.
    OptionError
        An unknown ``method``, ``algorithm`` or ``size_metric``, a ``max_size`` out of 1..8,
        or a matrix of other sizes.

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> reports, found = sp.place("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/local-2x4.yaml")
    >>> len(reports), found.method
    (2, 'enumerate')
    >>> best = reports[0]
    >>> str(best.matrix), best.reductions[0].name, best.reductions[0].best.text
    ('[[1,2],[2,2]]', 'grads', 'ReduceScatter(host, InsideGroup); AllReduce(host, Parallel(root)); AllGather(host, InsideGroup)')
    >>> best.reductions[0].speedup > 1     # faster than one AllReduce over all 8 GPUs
    True
    """
    from .choices import SIZE_METRICS
    from .cost import Algorithm
    from .reduction.ranking import rank_placements

    _choice(method, "method", ("auto", "cp-sat", "enumerate"))
    _choice(algorithm, "algorithm", [a.value for a in Algorithm])
    _choice(size_metric, "size metric", SIZE_METRICS)
    max_size = _number(max_size, "max_size", 1, 8, integer=True)          # `place --max-size`'s range
    topo, spec = load(cluster, model)
    chosen = None if matrices is None else [_matrix(topo, spec, m) for m in matrices]
    return rank_placements(topo, spec, method, max_size, algorithm, matrices=chosen, metric=size_metric)


def verify(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec,
           program: str | os.PathLike | Program, matrix=None, reduction: str | None = None,
           timeout: float = 30.0, engine: str = "z3") -> Verdict:
    """Prove a reduction program valid on a placement, or find where it goes wrong.

    Valid means every device ends with the exact sum over its reduction group, whatever
    the data (README, "What a program means"). Composes
    :func:`solver_planner.reduction.ranking.lowering_for`,
    :func:`solver_planner.reduction.verify.system_steps` and
    :func:`solver_planner.reduction.proof.verify_z3`, as ``solver-planner reduce verify`` does.

    Parameters
    ----------
    cluster, model : path or loaded object
        As for :func:`place`.
    program : str, path or Program
        DSL text such as ``'Reduce(gpu, InsideGroup); AllReduce(host, Parallel(root))'``,
        a parsed program (:func:`solver_planner.reduction.dsl.parse_program`), or a YAML
        file of explicit steps (a path, or a string naming an existing file or ending in
        ``.yaml``/``.yml``; see ``examples/*.yaml``).
    matrix : str, list of lists or ParallelismMatrix, optional
        The placement; default: the best under the placement solver's proxy objective
        (:func:`solver_planner.reduction.ranking.proxy_placement`; no program is
        synthesized, so this may differ from ``place(...)[0][0].matrix``).
    reduction : str, optional
        Which of the model's reductions; default: the first.
    timeout : float
        Seconds z3 may take before the verdict is ``'unknown'``.
    engine : {'z3', 'semantics'}
        ``z3`` proves over symbolic data; ``semantics`` applies the rules only.

    Returns
    -------
    Verdict
        ``.status`` is ``'valid'``, ``'invalid'`` (``.violation`` names the step, group,
        device and chunk) or ``'unknown'``; ``.valid``, ``.wall_time``, ``.as_dict()``.

    Raises
    ------
    SpecError
        A spec or explicit-steps file is invalid, or the model asks for no reduction.
    OptionError
        No reduction of that name, an unknown engine, a timeout out of range, DSL text that
        does not parse or fit the hierarchy, or a matrix of the wrong sizes.
    InfeasibleError
        ``matrix`` is None and no placement satisfies the model's constraints.

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> cluster, model = "specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/local-2x4.yaml"
    >>> program = "ReduceScatter(host, InsideGroup); AllReduce(host, Parallel(root)); AllGather(host, InsideGroup)"
    >>> sp.verify(cluster, model, program, matrix="[[1,2],[2,2]]").status
    'valid'
    >>> verdict = sp.verify(cluster, model, "AllReduce(gpu, InsideGroup)", matrix="[[1,2],[2,2]]")
    >>> verdict.status, verdict.violation is not None
    ('invalid', True)
    """
    from .choices import ENGINES

    _choice(engine, "engine", ENGINES)
    timeout = _number(timeout, "timeout", 0.001, 86400)
    if isinstance(program, str) and not program.strip():
        raise OptionError("program: empty; give DSL text such as 'AllReduce(root, InsideGroup)' or a steps file")
    from .reduction.dsl import Instruction

    if not isinstance(program, (str, os.PathLike)) and not (
            isinstance(program, (tuple, list)) and program and all(isinstance(i, Instruction) for i in program)):
        raise OptionError(f"program: expected DSL text, a steps file's path or a parsed program (instructions),"
                          f" got {type(program).__name__} {program!r:.40}")
    from .errors import InfeasibleError
    from .reduction.dsl import parse_program
    from .reduction.ranking import check_placeable, lowering_for, proxy_placement, reduction_named
    from .reduction.verify import system_steps, verify_steps

    topo, spec = load(cluster, model)
    check_placeable(topo, spec)
    red = reduction_named(spec, reduction)
    if matrix is None:
        chosen, _ = proxy_placement(topo, spec)
        if chosen is None:
            raise InfeasibleError("no placement satisfies the model's constraints")
    else:
        chosen = _matrix(topo, spec, matrix)
    lowering = lowering_for(topo, spec, chosen, red)
    if isinstance(program, os.PathLike) or (isinstance(program, str) and (
            program.endswith((".yaml", ".yml")) or Path(program).is_file())):
        from .reduction.explicit import load_explicit_program

        steps = load_explicit_program(program, topo.num_devices)
    else:
        try:
            steps = system_steps(lowering, parse_program(program) if isinstance(program, str) else tuple(program))
        except ValueError as exc:       # a program that does not parse or fit: the library's error
            raise OptionError(f"program {program!r:.80}: {exc}") from None
    if engine == "semantics":
        return verify_steps(lowering, steps)
    from .reduction.proof import verify_z3

    return verify_z3(lowering, steps, timeout)


def reshard(cluster: PathLike | ClusterSpec | Topology,
            model: PathLike | ModelSpec | ReshardingProblem | Sequence[ReshardingProblem],
            name: str | None = None, method: str = "auto", strategy: str = "broadcast", time_limit: float = 10.0,
            seed: int = 0, workers: int = 1) -> list[SolveResult[ReshardingPlan]]:
    """Schedule cross-mesh resharding (the resharding paper §3): which host sends each slice of a
    tensor to the hosts of the next mesh, and when; every schedule is replayed in the
    simulator and checked before it is returned.

    Calls :func:`solver_planner.resharding.plan_resharding` and
    :func:`solver_planner.resharding.check` for each problem.

    Parameters
    ----------
    cluster : path or loaded object
        As for :func:`load`.
    model : path, ModelSpec, ReshardingProblem or a sequence of them
        A model spec with a ``resharding:`` list, or problems built in code with
        ``ReshardingProblem.build(name, shape, dtype, topology, (hosts, per_host, spec),
        (hosts, per_host, spec))`` (handy for sweeping tensor shapes).
    name : str, optional
        Only the model's resharding of this name.
    method : {'auto', 'cp-sat', 'naive', 'load-balance', 'dfs', 'greedy'}
        The scheduler; ``auto`` is CP-SAT on small cases, else the best heuristic.
    strategy : {'broadcast', 'send-recv', ...}
        How one slice reaches its receivers (:class:`solver_planner.resharding.Strategy`).
    time_limit : float
        Budget of CP-SAT (deterministic time, about seconds) or of the DFS.
    seed : int
        Seed of the randomized greedy and of CP-SAT.
    workers : int
        CP-SAT workers; only 1 gives the same plan on every run.

    Returns
    -------
    list of SolveResult
        One per resharding, in the model's order: ``.solution`` is the
        :class:`ReshardingPlan` (``.makespan``, ``.tasks``, ``.sender(i)``,
        ``.schedule``), ``.objective`` its makespan in seconds, ``.bound`` a lower
        bound, ``.gap``, ``.status``, ``.method``. For the table the command prints,
        pass a result to :func:`solver_planner.resharding.report`.

    Raises
    ------
    SpecError
        A spec is invalid, the model has no resharding (or none called ``name``), or a
        mesh does not fit the cluster.
    OptionError
        An unknown method or strategy, or a time limit, seed or worker count out of range.
    PlannerError
        A schedule whose replay disagrees with it (a bug).

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> results = sp.reshard("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/local-2x4.yaml")
    >>> [r.solution.problem.name for r in results]
    ['same-spec', 'transpose', 'replicated-to-sharded', 'uneven']
    >>> best = results[1]
    >>> best.status.value, best.gap, len(best.solution.tasks)
    ('OPTIMAL', 0.0, 16)
    """
    from .choices import RESHARD_METHODS, RESHARD_STRATEGIES
    from .cost import CostModel
    from .resharding import ReshardingProblem, check as check_schedule, plan_resharding, problems_from_model

    _choice(method, "method", RESHARD_METHODS)
    _choice(strategy, "strategy", RESHARD_STRATEGIES)
    time_limit = _number(time_limit, "time_limit", 0.01, 86400)          # `reshard --time-limit`'s range
    workers = _number(workers, "workers", 1, integer=True)
    seed = _number(seed, "seed", -math.inf, integer=True)                # `--seed` takes any integer
    topo = _topology(cluster)
    if isinstance(model, ReshardingProblem):
        problems = [model]
    elif isinstance(model, (list, tuple)):
        problems = list(model)
        if not all(isinstance(p, ReshardingProblem) for p in problems):
            raise OptionError("model: a sequence given must hold ReshardingProblems")
    else:
        problems = problems_from_model(_model(model), topo, name)
    cost = CostModel(topo)
    results = []
    for problem in problems:
        result = plan_resharding(problem, cost, method, strategy, time_limit, seed, workers)
        check_schedule(result.solution, cost)
        results.append(result)
    return results


def _config(config) -> Config | None:
    from .stages.report import Config, parse_config

    if config is None or isinstance(config, Config):
        return config
    if isinstance(config, str):
        return parse_config(config)
    # four positive integers, as --config d,t,p,k
    if not isinstance(config, (list, tuple)) or len(config) != 4:
        raise OptionError(f"config: expected (data, tensor, pipeline, micro-batches), got {config!r:.60}")
    return Config(*(_number(n, f"config's {name}", 1, integer=True)
                    for name, n in zip(("data", "tensor", "pipeline", "micro-batches"), config)))


def _split(split) -> tuple[int, ...] | None:
    from .stages.report import parse_split

    if split is None:
        return None
    if isinstance(split, str):
        return parse_split(split)
    if not isinstance(split, (list, tuple)) or not split:
        raise OptionError(f"split: expected layers per stage such as (10, 12, 12, 10), got {split!r:.60}")
    return tuple(_number(n, "split's layers per stage", 1, integer=True) for n in split)


def _stage_options(method, compute, **numbers) -> dict:
    """What the stages and plan commands' options refuse, refused the same way here; the
    numbers given (by name) as Python numbers."""
    from .choices import COMPUTE_MODELS, STAGE_METHODS

    _choice(method, "method", STAGE_METHODS)
    _choice(compute, "compute", COMPUTE_MODELS)
    # (least, most, integer): the commands' ranges (--seed takes any integer)
    ranges = {"num_stages": (1, None, True), "top": (1, None, True), "time_limit": (0.001, 86400, False),
              "seed": (-math.inf, None, True), "budget": (1, None, True), "simulations": (1, None, True),
              "top_gap": (0, 0.99, False), "devices": (1, None, True), "gap": (0, 0.99, False)}
    required = ("top", "time_limit", "seed")
    return {name: _number(value, name, low, high, integer=whole, optional=name not in required)
            for name, value in numbers.items() for low, high, whole in [ranges[name]]}


def stages(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec, schedule: str = "1f1b",
           method: str = "auto", num_stages: int | None = None, config=None, split=None, top: int = 1,
           baselines: bool = False, comm: bool = True, time_limit: float = 10.0, seed: int = 0,
           budget: int | None = None, simulations: int | None = None, top_gap: float | None = None,
           progress: Callable[[str], None] | None = None, compute: str = "efficiency",
           devices: int | None = None, meshes: str = "equal", gap: float | None = None,
           target: str = "native") -> StagesReport:
    """Cut the model's layers into pipeline stages on equal sub-meshes (or unequal ones), choose each
    stage's (data, tensor) degrees, recomputation and the number of micro-batches, and
    simulate the schedule; the fastest simulated plan wins, with a proven lower bound.

    Calls :func:`solver_planner.stages.report.plan_stages`, as ``solver-planner stages``.

    Parameters
    ----------
    cluster, model : path or loaded object
        As for :func:`load`; the model needs ``layers`` (or ``transformer``) and ``training``.
    schedule : {'1f1b', 'gpipe', 'eager-1f1b'}
        The pipeline schedule family.
    method : {'auto', 'dp', 'cp-sat', 'greedy', 'brute-force'}
        The search.
    num_stages : int, optional
        Only plans with this many stages.
    config : str, tuple or Config, optional
        One configuration ``'d,t,p,k'`` (data, tensor, pipeline degrees, micro-batches).
    split : str or sequence of int, optional
        Layers per stage, e.g. ``'10,12,12,10'``.
    top : int
        Also keep the ``top`` fastest plans (``.result.solutions``).
    baselines : bool
        Also the best pure data, tensor and pipeline plans (three more searches; the
        command does them by default).
    comm : bool
        False prices every communication at zero (a what-if).
    time_limit : float
        CP-SAT deterministic time per subspace (roughly seconds).
    seed : int
        CP-SAT seed.
    budget, simulations : int, optional
        Subspaces solved, and tasks simulated per listed plan, before the search stops with
        a gap (default: the library's).
    top_gap : float, optional
        With ``top > 1``: each listed plan after the first is its pair's best within this
        relative gap (default 0.01), or as close as its share of the budgets gets; each
        plan's ``pair_bound`` proves it.  0 asks for exact ones.
    gap : float, optional
        The search stops once its plan is proven within this relative gap and its bound has
        stopped rising (default 0.01); 0 searches until OPTIMAL or a budget.
    progress : callable, optional
        Called with a line of text as the search advances.
    compute : {'efficiency', 'roofline', 'peak'}
        How compute is timed: kernel efficiency, launch overhead and memory traffic from the
        cluster spec's ``device.compute`` or preset (the roofline when it has none, peak
        without a memory bandwidth either), the roofline ``max(FLOPs / peak, bytes / memory
        bandwidth)``, or FLOPs at peak (:mod:`solver_planner.compute`).
    devices : int, optional
        Use at most this many of the cluster's devices (its first ones); the plans use as
        many as equal meshes can tile (``.use``: how many, and why the rest idle;
        ``.topology``: the cluster they form).
    meshes : {'equal', 'unequal'}
        'unequal': each stage may also take its own shape of Alpa's set (Alpa's space), on up
        to all the devices; under 1f1b, eager-1f1b or gpipe, without config, split, top or
        a target.
    target : {'native', 'torchtitan', 'megatron', 'deepspeed'}
        Only plans the framework runs, priced as it runs them (``--target``; README,
        "Framework targets").

    Returns
    -------
    StagesReport
        ``.partition`` (the stages: ``.stages[i].first``, ``.last``, ``.tensor``), ``.run``
        (the simulated iteration: ``.iteration_time``, ``.bubble_ratio``,
        ``.peak_memory``), ``.result`` (status, bound, gap, method, wall time) and
        ``.as_dict()`` (what ``--json`` prints).

    Raises
    ------
    SpecError
        A spec is invalid or the model has no layers.
    OptionError
        An unknown schedule or method, or a config / split that contradicts the cluster
        or the model.
    InfeasibleError
        No plan is possible on any part of the cluster (the reason), or none fits in
        device memory (the message gives the smallest shortfall).
    UnknownError
        Nothing found within the limits and nothing proven impossible.

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> rep = sp.stages("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/gpt3-2.6b.yaml", num_stages=2)
    >>> [(st.first, st.last, st.tensor) for st in rep.partition.stages]
    [(0, 17, 2), (18, 33, 2)]
    >>> rep.result.status.value, rep.run.iteration_time > 0
    ('OPTIMAL', True)
    """
    from .stages.report import plan_stages
    from .targets.base import TARGETS

    _choice(target, "target", TARGETS)
    n = _stage_options(method, compute, num_stages=num_stages, top=top, time_limit=time_limit, seed=seed,
                       budget=budget, simulations=simulations, top_gap=top_gap, devices=devices, gap=gap)
    num_stages, top, time_limit, seed, devices = (n[k] for k in ("num_stages", "top", "time_limit", "seed", "devices"))
    budget, simulations, top_gap, gap = (n[k] for k in ("budget", "simulations", "top_gap", "gap"))
    topo, spec = load(cluster, model)
    limits = {k: v for k, v in (("budget", budget), ("simulations", simulations), ("top_gap", top_gap),
                                ("gap", gap)) if v is not None}
    return plan_stages(topo, spec, schedule, method, time_limit, seed, comm=comm, stages=num_stages, top=top,
                       config=_config(config), layer_counts=_split(split), baselines=baselines, progress=progress,
                       compute=compute, devices=devices, meshes=meshes, target=target, **limits)


def plan(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec, schedule: str | None = None,
         method: str = "auto", cross_mesh: str = "broadcast", overlap: bool = True, num_stages: int | None = None,
         config=None, split=None, time_limit: float = 10.0, proof_timeout: float = 30.0, seed: int = 0,
         output: PathLike | None = None, candidates: int = 1,
         progress: Callable[[str], None] | None = None, compute: str = "efficiency",
         devices: int | None = None, target: str = "native", export: PathLike | None = None,
         meshes: str = "equal", budget: int | None = None, simulations: int | None = None,
         gap: float | None = None) -> TrainingPlan:
    """One plan for the whole training job (the resharding paper §5.2-5.3): pipeline stages and their
    (data, tensor) degrees, each stage's placement and z3-proved gradient program, a
    broadcast schedule at every stage boundary, and the iteration simulated with them.

    Calls :func:`solver_planner.plan.make_plan` (and, with ``output``,
    :func:`solver_planner.plan.planfile.write_plan`), as ``solver-planner plan [-o]``.

    Parameters
    ----------
    cluster, model : path or loaded object
        As for :func:`stages`.
    schedule : {'eager-1f1b', '1f1b', 'gpipe', 'interleaved-1f1b', 'zb-h1', 'zb-v'}, optional
        The pipeline schedule family; by default eager-1F1B (the command's default), and under
        a ``target`` the schedule of the fastest plan among those the framework runs.
    method : str
        The stage search, as for :func:`stages`.
    cross_mesh : {'broadcast', 'send-recv', 'free'}
        Stage boundaries: the resharding paper's broadcast schedules, Alpa's send/recv baseline, or
        free (the "Signal Send/Recv" upper bound).
    overlap : bool
        Overlap boundary transfers with computation (False: each transfer holds both
        stages' compute streams).
    num_stages, config, split : optional
        Restrict the stage search, as for :func:`stages`.
    time_limit : float
        CP-SAT limit per subproblem (roughly seconds).
    proof_timeout : float
        z3 time limit per gradient program (seconds).
    seed : int
        Solver seed (one worker: reproducible).
    output : str or path, optional
        Also write the plan file (YAML) here; :func:`check` re-derives it.
    candidates : int
        How many of the stage planner's fastest plans to compose with their real boundary
        schedules; the fastest simulated one is returned (``.search["composed"]`` lists them).
    progress : callable, optional
        Called with a line of text as each part starts.
    compute : {'efficiency', 'roofline', 'peak'}
        How compute is timed (as for :func:`stages`); the plan file records it.
    devices : int, optional
        At most this many of the cluster's devices, as for :func:`stages` (``.use``; the
        plan's ``.topology`` is the part it uses).
    target : {'native', 'torchtitan', 'megatron', 'deepspeed'}
        Plan only what the framework runs, priced as it runs them (``--target``).
    export : str or path, optional
        With a target: also write the framework's own configuration here (``--export``; the
        plan file records it under ``target:``).
    meshes : {'equal', 'unequal'}
        'unequal': stages may also take sub-meshes of different shapes (Alpa's space), as for
        :func:`stages` (``--meshes``).
    budget, simulations, gap : optional
        The stage search's limits, as for :func:`stages` (``--budget``, ``--sim-budget``,
        ``--gap``); the plan file records them, so :func:`check` searches the same way.

    Returns
    -------
    TrainingPlan
        ``.iteration_time`` (seconds, simulated), ``.throughput`` (samples/s), ``.mfu``,
        ``.parts`` (per stage: ``.matrix``, ``.program``, ``.proof``, ``.memory``, ...),
        ``.boundaries`` (per boundary: ``.time`` and its resharding ``.plan``), ``.run``
        (the simulated iteration), ``.solve_times``. The plan file's contents are
        ``solver_planner.plan_document(plan)``.

    Raises
    ------
    SpecError
        A spec is invalid or the model has no layers.
    OptionError
        An unknown schedule, method or ``cross_mesh``, an option out of the command's range,
        or restrictions that contradict the cluster.
    InfeasibleError
        No plan fits in device memory.
    UnknownError
        The stage search found nothing within its limits.

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> p = sp.plan("specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/u-transformer.yaml")
    >>> len(p.parts), [(s.data, s.tensor) for s in p.parts]
    (1, [(2, 4)])
    >>> p.iteration_time > 0 and p.throughput > 0 and 0 < p.mfu < 1
    True
    """
    from .choices import CROSS_MESH
    from .plan import make_plan
    from .targets.base import TARGETS

    _choice(target, "target", TARGETS)
    if export is not None and target == "native":
        raise OptionError("export writes a framework's configuration: give target megatron, torchtitan or deepspeed")
    n = _stage_options(method, compute, num_stages=num_stages, time_limit=time_limit, seed=seed, devices=devices,
                       budget=budget, simulations=simulations, gap=gap)
    num_stages, time_limit, seed, devices = (n[k] for k in ("num_stages", "time_limit", "seed", "devices"))
    limits = {k: n[k] for k in ("budget", "simulations", "gap") if n[k] is not None}
    _choice(cross_mesh, "cross_mesh", CROSS_MESH)
    proof_timeout = _number(proof_timeout, "proof_timeout", 0.001, 86400)
    candidates = _number(candidates, "candidates", 1, 50, integer=True)
    topo, spec = load(cluster, model)
    result = make_plan(topo, spec, schedule=schedule, method=method, cross_mesh=cross_mesh, overlap=overlap,
                       stages=num_stages, config=_config(config), layer_counts=_split(split), time_limit=time_limit,
                       seed=seed, proof_timeout=proof_timeout, candidates=candidates, progress=progress,
                       compute=compute, devices=devices, target=target, meshes=meshes, **limits)
    if output is not None or export is not None:
        from .plan.planfile import plan_document, write_export, write_plan

        doc = write_plan(result, Path(output)) if output is not None else plan_document(result)
        if export is not None:
            write_export(doc, Path(export))
    return result


def check(cluster: PathLike | ClusterSpec | Topology, model: PathLike | ModelSpec,
          plan: PathLike | dict[str, Any] | TrainingPlan, proof_timeout: float = 30.0) -> CheckReport:
    """Re-derive every claim of a plan from the cluster and model specs: each gradient
    program proved again with z3, each boundary schedule re-checked and replayed, the
    iteration simulated again and compared with the recorded times and memory.

    Calls :func:`solver_planner.plan.check.check_plan`, as ``solver-planner check``.

    Parameters
    ----------
    cluster, model : path or loaded object
        The specs the plan was made from.
    plan : str, path, dict or TrainingPlan
        A plan file written by :func:`plan` (``output=``) or ``solver-planner plan -o``,
        its contents as read by ``solver_planner.read_plan``, or a plan just made.
    proof_timeout : float
        z3 time limit per gradient program (seconds).

    Returns
    -------
    CheckReport
        ``.exit_code`` (0 every part holds, 1 a part does not, 3 a proof timed out),
        ``.first_failure``, ``.findings`` (``.part``, ``.status``, ``.message`` each),
        ``.as_dict()``.

    Raises
    ------
    SpecError
        A spec is invalid.
    PlanFileError
        The file is missing or is not a plan file (a file whose contents do not hold is
        not an error: it gives exit code 1).

    Examples
    --------
    >>> from solver_planner import api as sp
    >>> cluster, model = "specs/clusters/aws-p3.8xlarge-2.yaml", "specs/models/u-transformer.yaml"
    >>> report = sp.check(cluster, model, sp.plan(cluster, model, schedule="1f1b"))
    >>> report.exit_code, report.first_failure
    (0, None)
    >>> sorted({f.status for f in report.findings})
    ['ok']
    """
    from .plan.check import check_plan
    from .plan.compose import TrainingPlan
    from .plan.planfile import plan_document, read_plan

    proof_timeout = _number(proof_timeout, "proof_timeout", 0.001, 86400)
    topo, spec = load(cluster, model)
    if isinstance(plan, TrainingPlan):
        doc = plan_document(plan)
    elif isinstance(plan, dict):
        doc = plan
    else:
        doc = read_plan(Path(_path(plan, "plan", "a TrainingPlan or a plan document")))
    return check_plan(topo, spec, doc, proof_timeout)
