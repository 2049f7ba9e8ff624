"""From specs to lowered plans: what ``execute reduction`` and ``execute reshard`` run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..cost import Collective, CostModel
from ..placement import ParallelismMatrix
from ..reduction.hierarchy import Lowering
from ..reduction.ranking import lowering_for, reduce_on_placement
from ..reduction.verify import system_steps, verify_steps
from ..resharding import plan_resharding, problems_from_model
from ..resharding.tasks import resize
from ..spec.model import ModelSpec, ReductionSpec
from ..topology import Topology
from .lower import lower_reduction, lower_resharding
from .plan import DistributedPlan

__all__ = ["ReductionRun", "chunk_elems", "reduction_run", "synthesized_runs", "resharding_plans"]


@dataclass(frozen=True)
class ReductionRun:
    """A lowered reduction program and what the semantics says of it ('valid' / 'invalid')."""

    plan: DistributedPlan
    verdict: str


def chunk_elems(lowering: Lowering, nbytes: float) -> int:
    """float32 elements per chunk so that the ``k`` chunks hold at least ``nbytes``."""
    return max(1, math.ceil(nbytes / 4 / lowering.hierarchy.size))


def reduction_run(topology: Topology, lowering: Lowering, steps: Sequence[tuple[Collective, Sequence[Sequence[int]]]],
                  nbytes: float, title: str, labels: Sequence[str] | None = None,
                  cost: CostModel | None = None) -> ReductionRun:
    """Verify ``steps`` with the semantics and lower them (raises LoweringError if they cannot run)."""
    verdict = verify_steps(lowering, steps).status
    plan = lower_reduction(steps, topology.num_devices, lowering.hierarchy.size, lowering.reduction_groups(),
                           chunk_elems(lowering, nbytes), cost or CostModel(topology), labels=labels, title=title)
    return ReductionRun(plan, verdict)


def synthesized_runs(topology: Topology, model: ModelSpec, matrix: ParallelismMatrix, reduction: ReductionSpec,
                     nbytes: float | None = None, max_size: int = 5, top: int | None = None,
                     cost: CostModel | None = None) -> list[ReductionRun]:
    """Every synthesized program of ``reduction`` on ``matrix``, fastest first (the first ``top``)."""
    cost = cost or CostModel(topology)
    lowering = lowering_for(topology, model, matrix, reduction)
    report = reduce_on_placement(topology, model, matrix, reduction, max_size, "ring", cost)
    size = reduction.bytes if nbytes is None else nbytes
    return [reduction_run(topology, lowering, system_steps(lowering, p.program), size, p.text,
                          [str(i) for i in p.program], cost)
            for p in (report.programs[:top] if top else report.programs)]


def resharding_plans(topology: Topology, model: ModelSpec, name: str | None = None, method: str = "auto",
                     time_limit: float = 10.0, shape: Sequence[int] | None = None) -> list[DistributedPlan]:
    """Schedule the model's reshardings (optionally on a tensor of another ``shape``) and lower them."""
    cost = CostModel(topology)
    problems = problems_from_model(model, topology, name)
    if shape is not None:
        problems = [resize(p, shape) for p in problems]
    plans = []
    for prob in problems:
        result = plan_resharding(prob, cost, method, time_limit=time_limit)
        assert result.solution is not None
        plans.append(lower_resharding(result.solution))
    return plans
