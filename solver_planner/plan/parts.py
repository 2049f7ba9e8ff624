"""Each stage of a plan on its sub-mesh: the placement of its (data, tensor) axes and the
proven program that reduces its gradients.

The stage planner's plan space (:mod:`solver_planner.stages.costs`) keeps a tensor-parallel
group on ``t`` consecutive devices of one host and makes the groups data-parallel replicas.
Here that layout is stated as P²'s parallelism matrix: axes (data, tensor) over the
sub-mesh's levels (hosts, devices per host), found by the placement solver under the rule
"tensor inside a host", which leaves exactly one matrix, ``[[n, m/t], [1, t]]``.  Its device
assignment (§2.1) gives every device its (data, tensor) coordinates, and its synthesis
hierarchy (§3.4) is where the gradient program is written and proved (§3.5, z3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..errors import PlannerError
from ..placement import ParallelismMatrix, PlacementRule, find_placements
from ..reduction.dsl import format_program, parse_program
from ..reduction.hierarchy import Lowering
from ..reduction.proof import verify_z3
from ..reduction.verify import system_steps
from ..stages import Partition
from ..topology import Topology

__all__ = ["StagePart", "stage_matrix", "stage_lowering", "program_text", "prove_program", "stage_parts"]

DATA, TENSOR = 0, 1      # axis rows of a stage's parallelism matrix
AXES = ("data", "tensor")
ZERO3_PROGRAM = "ReduceScatter(root, InsideGroup)"


@dataclass
class StagePart:
    """Stage ``index`` of a plan: its layers, devices, placement and gradient program.  With
    model chunks (interleaved 1F1B, ZB-V) it is chunk ``index``, run by pipeline stage
    ``stage`` on that stage's devices; otherwise ``stage == index``."""

    index: int
    first: int
    last: int
    layer_names: tuple[str, str]
    devices: tuple[int, ...]
    mesh: tuple[int, int]                  # hosts x devices per host of the sub-mesh
    data: int
    tensor: int
    recompute: str
    matrix: ParallelismMatrix
    program: str                           # DSL on the stage's synthesis hierarchy, or "none"
    proof: str = "not needed"              # valid | invalid | unknown | not needed | not an all-reduce
    proof_detail: str = ""
    proof_time: float = 0.0
    memory: float = 0.0
    alternatives: int = 1                  # matrices the placement solver found under the rule
    stage: int = -1                        # the pipeline stage (sub-mesh); -1: ``index``
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stage < 0:
            self.stage = self.index

    def coords(self) -> tuple[tuple[int, int], ...]:
        """(data, tensor) coordinates of each device of the stage, in device order."""
        return _coords(self.matrix, tuple(self.mesh), len(self.devices))

    def grid(self) -> list[list[int]]:
        """``grid[i][j]``: the device of data replica ``i`` and tensor position ``j``."""
        out = [[-1] * self.tensor for _ in range(self.data)]
        for dev, (i, j) in zip(self.devices, self.coords()):
            out[i][j] = dev
        return out


@functools.lru_cache(maxsize=64)
def _coords(matrix: ParallelismMatrix, mesh: tuple[int, int], n: int) -> tuple[tuple[int, int], ...]:
    # a function of the matrix and the sub-mesh alone, which every stage of an equal-mesh
    # plan shares: on 100 000 GPUs, 64 stages of 1 536 devices were each worked out afresh
    return tuple(matrix.axis_coords(list(mesh), j) for j in range(n))


def stage_matrix(mesh: tuple[int, int], data: int, tensor: int) -> tuple[ParallelismMatrix, int]:
    """The placement of (data, tensor) on a sub-mesh of ``mesh`` with tensor groups inside a
    host (the stage planner's rule), found by the placement solver; and how many matrices
    the rule allowed (one: the rule pins the layout)."""
    rule = PlacementRule(TENSOR, "inside", 0)
    res = find_placements([data, tensor], list(mesh), [rule], method="enumerate")
    if res.solution is None:
        raise PlannerError(f"no placement of data {data} x tensor {tensor} on a {mesh[0]}x{mesh[1]} sub-mesh keeps"
                           " the tensor groups inside a host")
    want = ParallelismMatrix.of([[mesh[0], mesh[1] // tensor], [1, tensor]])
    if want not in res.solutions:
        raise PlannerError(f"the placement solver does not list {want}, the layout the stage planner priced")
    return want, len(res.solutions)


def stage_lowering(matrix: ParallelismMatrix, mesh: tuple[int, int], level_names) -> Lowering:
    """The synthesis hierarchy of the data axis on the sub-mesh (devices numbered from 0)."""
    return Lowering(matrix, list(mesh), list(level_names), [DATA])


def program_text(bucket_program: str) -> str:
    """The stage planner's name of a bucket's program as DSL text: a flat collective is one
    instruction over the whole data axis (``root``)."""
    if bucket_program in ("AllReduce", "ReduceScatter"):
        return f"{bucket_program}(root, InsideGroup)"
    return bucket_program


def prove_program(part_matrix: ParallelismMatrix, mesh: tuple[int, int], level_names, program: str,
                  timeout: float) -> tuple[str, str, float]:
    """(status, detail, seconds) of proving ``program`` an all-reduce over the data axis."""
    if program == "none":
        return "not needed", "one replica: nothing to reduce", 0.0
    if program == ZERO3_PROGRAM:
        # a reduce-scatter: each replica keeps one shard of the gradients, there is no all-reduce
        # to prove (ZeRO-3; the distributed optimizer, which gathers the updated parameters
        # ahead of the next forward)
        return ("not an all-reduce", "a reduce-scatter: each replica keeps its shard of the gradients (ZeRO-3, or"
                " the distributed optimizer gathering the updated parameters ahead of the next forward)", 0.0)
    parsed = parse_program(program)
    lowering = stage_lowering(part_matrix, mesh, level_names)
    steps = system_steps(lowering, parsed)
    verdict = verify_z3(lowering, steps, timeout)
    detail = verdict.detail
    if verdict.violation is not None:
        detail = f"{verdict.violation.message} ({detail})" if detail else verdict.violation.message
    return verdict.status, detail, verdict.wall_time


def stage_parts(plan: Partition, topology: Topology, memory: list[float] | None = None, timeout: float = 30.0
                ) -> list[StagePart]:
    """Placement, gradient program and its proof for every stage (model chunk) of ``plan``
    (``memory`` per stage, when known, is recorded with them).  A chunk runs on its pipeline
    stage's devices, and reduces its own gradients there."""
    c = plan.costs
    names = topology.level_names
    out = []
    proofs: dict[tuple, tuple[str, str, float]] = {}
    for p, st in enumerate(plan.stages):
        cc = plan.table(p)
        own = c.of(plan.mesh[p])                # the tables of the stage's mesh shape
        mesh = (own.shape.hosts, own.shape.devices_per_host)
        matrix, count = stage_matrix(mesh, cc.data, st.tensor)
        grad = float(cc.grad_bytes[st.first, st.last])
        reduces = c.comm and cc.data > 1 and grad > 0
        bucket = own.bucket_program(st.tensor, min(grad, cc.bucket_cap)) if reduces else "none"
        program = program_text(bucket) if reduces else "none"
        if program != "none":
            program = format_program(parse_program(program))     # canonical text
        key = (matrix, mesh, program)
        if key not in proofs:      # equal stages share one proof (same hierarchy, same program)
            proofs[key] = prove_program(matrix, mesh, names, program, timeout)
        status, detail, seconds = proofs[key]
        out.append(StagePart(
            index=p, first=st.first, last=st.last,
            layer_names=(c.model.layers[st.first].name, c.model.layers[st.last].name),
            devices=tuple(range(c.first_device(plan.mesh[p]), c.first_device(plan.mesh[p]) + own.shape.size)),
            mesh=mesh,
            data=cc.data, stage=plan.mesh[p],
            tensor=st.tensor, recompute=st.config.recompute, matrix=matrix, program=program, proof=status,
            proof_detail=detail, proof_time=seconds, memory=memory[p] if memory else 0.0,
            alternatives=count))
    return out
