"""What a job needs to run a plan: per rank, its stage, layers, (data, tensor) coordinates
and process groups; per stage, the rank layout of a ``torch.distributed.DeviceMesh``.

Ranks are the cluster's device indices (host-major, as the cluster spec numbers them and
as ``torchrun --nnodes H --nproc-per-node M`` numbers its ranks).  The layout comes from each
stage's parallelism matrix (seed 000 §2.1), so the placement P² found is the one the job
uses: ``DeviceMesh(device_type, torch.tensor(stage["mesh"]), mesh_dim_names=("dp", "tp"))``
on every rank (a DeviceMesh is built by all ranks of the world), then each rank keeps the
mesh of its own stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compose import TrainingPlan

__all__ = ["launch_layout", "MESH_DIM_NAMES"]

MESH_DIM_NAMES = ("dp", "tp")


def launch_layout(plan: TrainingPlan) -> dict[str, Any]:
    """``{"world_size", "stages": [{"stage", "mesh", "mesh_dim_names", "layers"}], "ranks": [...]}``;
    a rank's pipeline neighbours are the ``mesh`` of the stages before and after its own."""
    stages_out = []
    ranks: dict[int, dict[str, Any]] = {}
    for s in plan.parts:
        grid = s.grid()
        stages_out.append({"stage": s.index, "mesh": grid, "mesh_dim_names": list(MESH_DIM_NAMES),
                           "layers": [s.first, s.last]})
        tensor_groups = [list(row) for row in grid]
        data_groups = [list(col) for col in zip(*grid)]
        for i, row in enumerate(grid):
            for j, dev in enumerate(row):
                ranks[dev] = {
                    "rank": dev, "host": plan.topology.host(dev), "stage": s.index,
                    "layers": [s.first, s.last], "layer_names": list(s.layer_names),
                    "data": i, "tensor": j,
                    "tensor_group": tensor_groups[i], "data_group": data_groups[j],
                }
    return {"world_size": plan.topology.num_devices, "stages": stages_out,
            "ranks": [ranks[d] for d in sorted(ranks)]}
