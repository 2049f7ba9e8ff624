"""Build a plan's DeviceMeshes and this rank's groups from plan.yaml, under torchrun.

    torchrun --nproc-per-node 8 launch_from_plan.py [plan.yaml]

(default: the plan.yaml beside this file; ``solver-planner plan --emit DIR`` writes both.)
Copy :func:`stage_meshes` into a training script: it is the part of a plan a launcher needs.

torch creates a DeviceMesh's process groups collectively, so *every* rank must create
*every* stage's mesh, in the same order -- a rank that builds only its own stage's mesh pairs
its groups with other ranks' different groups, and collectives then mix stages.  The script
checks the groups it got: the sum of the rank numbers over this rank's tensor group and
data group must be the sums over its stage mesh's row ``launch.ranks[r].data`` and column
``launch.ranks[r].tensor``.
Only torch and PyYAML are needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.distributed.device_mesh import DeviceMesh


def stage_meshes(plan: dict, device_type: str) -> list[DeviceMesh]:
    """Every stage's mesh (rows data replicas, columns tensor positions), in stage order."""
    return [DeviceMesh(device_type, torch.tensor(stage["mesh"]), mesh_dim_names=tuple(stage["mesh_dim_names"]))
            for stage in plan["launch"]["stages"]]


def main(path: Path) -> None:
    plan = yaml.safe_load(path.read_text())
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    if dist.get_world_size() != plan["launch"]["world_size"]:
        raise SystemExit(f"the plan is for {plan['launch']['world_size']} ranks; torchrun started"
                         f" {dist.get_world_size()}")
    meshes = stage_meshes(plan, "cuda" if use_cuda else "cpu")
    me = plan["launch"]["ranks"][rank]
    mesh = meshes[me["stage"]]
    grid = plan["launch"]["stages"][me["stage"]]["mesh"]
    groups = {"tp": grid[me["data"]], "dp": [row[me["tensor"]] for row in grid]}   # its row and its column
    device = torch.device("cuda") if use_cuda else torch.device("cpu")
    for dim, want in groups.items():
        total = torch.tensor([rank], device=device)
        dist.all_reduce(total, group=mesh.get_group(dim))
        if int(total) != sum(want):
            raise SystemExit(f"rank {rank}: its {dim} group sums to {int(total)}, the plan's {want} to {sum(want)}")
    layers = ", ".join(f"{first}-{last}" for first, last in me["chunks"])
    print(f"rank {rank}: stage {me['stage']} (layers {layers}), data {me['data']},"
          f" tensor {me['tensor']}; tensor group {groups['tp']}, data group {groups['dp']}: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "plan.yaml")
