"""What a job needs to run a plan: per rank, its stage, layers and (data, tensor)
coordinates; per stage, the rank layout of a ``torch.distributed.DeviceMesh``, whose row
``data`` is a rank's tensor group and column ``tensor`` its data group.  The groups are not
written per rank: they are the mesh's rows and columns, and listing them for every rank grew
the plan file as devices x data degree (260 MB on 100 000 GPUs).

Ranks are the cluster's device indices (host-major, as the cluster spec numbers them and
as ``torchrun --nnodes H --nproc-per-node M`` numbers its ranks).  The layout comes from each
stage's parallelism matrix (P² §2.1), so the placement P² found is the one the job
uses: ``DeviceMesh(device_type, torch.tensor(stage["mesh"]), mesh_dim_names=("dp", "tp"))``
on every rank (a DeviceMesh is built by all ranks of the world), then each rank keeps the
mesh of its own stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compose import TrainingPlan

__all__ = ["launch_layout", "launch_problems", "held_chunks", "MESH_DIM_NAMES"]

MESH_DIM_NAMES = ("dp", "tp")


def held_chunks(parts) -> list[list]:
    """The parts (:class:`.parts.StagePart`, one per model chunk) each pipeline stage holds,
    stage by stage, in model order."""
    held: dict[int, list] = {}
    for s in parts:
        held.setdefault(s.stage, []).append(s)
    return [held[p] for p in sorted(held)]


def launch_layout(plan: TrainingPlan) -> dict[str, Any]:
    """``{"world_size", "stages": [{"stage", "mesh", "mesh_dim_names", "chunks"}], "ranks": [...]}``;
    a rank's pipeline neighbours are the ``mesh`` of the stages before and after its own.
    ``chunks``: the ``[first, last]`` layers of each model chunk the stage runs, in model
    order (one chunk, or ``v`` with interleaved 1F1B and ZB-V)."""
    stages_out = []
    ranks: dict[int, dict[str, Any]] = {}
    for chunks in held_chunks(plan.parts):
        stage = chunks[0].stage
        grid = chunks[0].grid()            # a stage's chunks share its configuration, so its grid
        layers = [[s.first, s.last] for s in chunks]
        stages_out.append({"stage": stage, "mesh": grid, "mesh_dim_names": list(MESH_DIM_NAMES), "chunks": layers})
        names = [list(s.layer_names) for s in chunks]
        for i, row in enumerate(grid):
            for j, dev in enumerate(row):
                ranks[dev] = {"rank": dev, "host": plan.topology.host(dev), "stage": stage, "chunks": layers,
                              "layer_names": names, "data": i, "tensor": j}
    # the devices the plan uses: its cluster's, or the first ones unequal meshes are packed on
    world = plan.use.used if plan.use is not None else plan.topology.num_devices
    return {"world_size": world, "stages": stages_out,
            "ranks": [ranks[d] for d in sorted(ranks)]}


def launch_problems(layout: Any, topology, stages: list[dict[str, Any]], world: int | None = None
                    ) -> list[tuple[tuple, str]]:
    """Why ``layout`` (a plan file's ``launch``) is not a valid construction for a job whose
    pipeline stage ``p`` runs the chunks ``stages[p]["chunks"]`` (``[first, last]`` layers
    each) on devices ``stages[p]["devices"]``:
    ``[(path, message), ...]``, empty when it is one.

    Checked from the layout alone (not from :func:`launch_layout`): the world is the
    cluster's devices; each stage's mesh holds exactly its devices, each once, in a full
    grid; every rank appears once, at its own index, in the stage whose mesh holds it, with
    the coordinates of its place in that mesh (whose row and column are then its groups),
    the stage's chunks and its host.
    """
    out: list[tuple[tuple, str]] = []
    where = ("launch",)
    if not isinstance(layout, dict):
        return [(where, "missing, or not a mapping: a launcher reads every rank's groups from it")]
    world = topology.num_devices if world is None else world      # the devices the plan uses
    if layout.get("world_size") != world or isinstance(layout.get("world_size"), bool):
        out.append((where + ("world_size",), f"is {layout.get('world_size')!s}; the cluster has {world} devices"))
    meshes = layout.get("stages")
    if not isinstance(meshes, list) or len(meshes) != len(stages):
        return out + [(where + ("stages",), f"must list the plan's {len(stages)} stages")]
    place: dict[int, tuple[int, int, int]] = {}
    for p, (entry, st) in enumerate(zip(meshes, stages)):
        at = where + ("stages", p)
        grid = entry.get("mesh") if isinstance(entry, dict) else None
        if not (isinstance(grid, list) and grid and all(isinstance(row, list) and row for row in grid)
                and len({len(row) for row in grid}) == 1
                and all(isinstance(x, int) and not isinstance(x, bool) for row in grid for x in row)):
            out.append((at + ("mesh",), "must be a full grid of ranks (rows data replicas, columns tensor positions)"))
            continue
        flat = [x for row in grid for x in row]
        if sorted(flat) != sorted(st["devices"]) or len(set(flat)) != len(flat):
            out.append((at + ("mesh",), f"must hold stage {p}'s devices {st['devices'][0]}..{st['devices'][-1]},"
                                        " each once"))
            continue
        for i, row in enumerate(grid):
            for j, rank in enumerate(row):
                place[rank] = (p, i, j)
    ranks = layout.get("ranks")
    if not isinstance(ranks, list):
        return out + [(where + ("ranks",), "missing, or not a list")]
    if len(ranks) != world:
        out.append((where + ("ranks",), f"lists {len(ranks)} ranks; the world has {world}"))
    seen: dict[Any, int] = {}
    for k, entry in enumerate(ranks):
        at = where + ("ranks", k)
        if not isinstance(entry, dict):
            out.append((at, "must be a mapping"))
            continue
        rank = entry.get("rank")
        if rank in seen and not isinstance(rank, (list, dict)):
            out.append((at + ("rank",), f"rank {rank} appears twice (also at launch.ranks[{seen[rank]}])"))
            continue
        if not isinstance(rank, (list, dict)):
            seen[rank] = k
        if rank != k or isinstance(rank, bool):
            out.append((at + ("rank",), f"entry {k} must be rank {k}"))
            continue
        if rank not in place:
            continue                 # its stage's mesh was already reported
        p, i, j = place[rank]
        grid = meshes[p]["mesh"]
        want = {"host": topology.host(rank), "stage": p, "chunks": stages[p]["chunks"], "data": i, "tensor": j}
        for key, value in want.items():
            if entry.get(key) != value or type(entry.get(key)) is not type(value):
                out.append((at + (key,), f"must be {value} (rank {rank} is at data {i}, tensor {j} of stage {p}'s"
                                         " mesh)"))
    return out
