"""A stage plan as users see it: the partition, its simulated iteration, and the JSON shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..solve import SolveResult
from ..spec.model import ModelSpec
from ..topology import Topology
from .layers import layer_model
from .partition import Partition
from .pipeline import PipelineRun, simulate_pipeline
from .search import StageSearch, plan_partition

__all__ = ["StagesReport", "plan_stages"]


@dataclass
class StagesReport:
    result: SolveResult[Partition]
    run: PipelineRun
    baseline: PipelineRun | None      # 1F1B, when the schedule is eager-1F1B
    schedule: str

    @property
    def partition(self) -> Partition:
        return self.result.solution

    def stage_rows(self) -> list[dict]:
        p = self.partition
        c = p.costs
        rows = []
        for i, st in enumerate(p.stages):
            tab = c.tables[st.tensor]
            names = [c.model.layers[st.first].name, c.model.layers[st.last].name]
            params = float(c.model.range_sums("params")[st.first, st.last])
            rows.append({
                "layers": [st.first, st.last],
                "layer_names": names,
                "mesh": c.shape.as_list(),
                "devices": [i * c.shape.size, (i + 1) * c.shape.size - 1],
                "data": c.shape.size // st.tensor,
                "tensor": st.tensor,
                "time": p.times[i],
                "memory": self.run.peak_memory[i],
                "planned_memory": p.memory[i],
                "in_flight": self.run.in_flight[i],
                "gradient_reduction": p.gradient[i],
                "gradient_program": tab.gradient_program(params / st.tensor) if c.comm else "none",
            })
        return rows

    def as_dict(self) -> dict:
        p, r = self.partition, self.result
        c = p.costs
        out = {
            "stages": self.stage_rows(),
            "microbatches": c.microbatches,
            "microbatch_size": c.micro_size,
            "iteration_time": self.run.iteration_time,
            "objective": r.objective,
            "bound": r.bound,
            "gap": r.gap,
            "bubble_ratio": self.run.bubble_ratio,
            "schedule": self.schedule,
            "status": r.status.value,
            "method": r.method,
            "solve_time": r.wall_time,
            "device_memory": c.device_memory,
            "search": dict(r.info),
        }
        if self.baseline is not None:
            out["eagerness"] = self.run.eagerness
            out["iteration_time_1f1b"] = self.baseline.iteration_time
            out["hidden_communication"] = self.baseline.iteration_time - self.run.iteration_time
        return out


def plan_stages(topology: Topology, model: ModelSpec, schedule: str = "1f1b", method: str = "auto",
                time_limit: float = 10.0, seed: int = 0, comm: bool = True, stages: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> StagesReport:
    """Partition ``model``'s layers on ``topology`` and simulate the iteration under ``schedule``."""
    search = StageSearch(layer_model(model), topology, schedule, comm)
    result = plan_partition(search, method, time_limit, seed, stages=stages, progress=progress)
    run, base = simulate_pipeline(result.solution, search.cost, schedule)
    return StagesReport(result, run, base, schedule)
