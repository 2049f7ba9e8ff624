"""A plan's reduction programs and boundary reshardings as specs ``solver-planner execute`` runs.

``execute reduction`` runs a program on one local process per device of a cluster spec, so
each stage gets the spec of its sub-mesh (the cluster's levels with the sub-mesh's counts)
and a model spec with its (data, tensor) axes, the rule that keeps tensor groups inside a
host, and its gradient bucket as the reduction; the command passes the plan's program and
placement matrix.  ``execute reshard`` runs a model spec's ``resharding:`` entries on the
whole cluster: each boundary whose layouts a mesh spec can state (a tensor group that is a
whole host row, ``S0``, or a single device, ``S01``) is one entry; the others are listed
with the reason.  Equal stages share one pair of files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import PlannerError
from ..spec import load_cluster_spec
from .compose import TrainingPlan
from .planfile import write_document

__all__ = ["emit_execute_specs"]


def _dump(data: dict, path: Path) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")


def _mesh_spec(plan: TrainingPlan, p: int) -> dict[str, Any] | str:
    """``{hosts, devices_per_host, first_device, spec}`` of stage ``p``'s activation layout,
    or why a mesh spec cannot state it."""
    part = plan.parts[p]
    topo = plan.topology
    n, m = part.mesh
    first = part.devices[0]
    hosts = sorted({topo.host(d) for d in part.devices})
    if part.tensor == 1:
        entry = "S01"        # one replica per device, row-major = device order
    elif part.tensor == m:
        entry = "S0"         # one replica per host row
    else:
        return (f"stage {p}: tensor groups of {part.tensor} inside rows of {m} devices have no mesh spec"
                " (S0 splits by host, S01 by device)")
    return {"hosts": hosts, "devices_per_host": m, "first_device": first - topo.host_devices(hosts[0])[0],
            "spec": [entry, "R"]}


def emit_execute_specs(plan: TrainingPlan, cluster_file: Path, out: Path, document: dict | None = None,
                       model_file: Path | None = None) -> dict[str, Any]:
    """Write the specs into folder ``out``; return ``{"commands": [...], "skipped": [...]}``
    (also written as ``out/commands.yaml``).  With the plan's ``document``: also
    ``out/plan.yaml`` and ``out/launch_from_plan.py`` (the torchrun launch recipe, which reads
    the plan beside it), and the commands that launch and run it.  Every path in the commands
    is absolute, so they work from any directory."""
    out = Path(out).resolve()
    cluster_file = Path(cluster_file).resolve()
    out.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path(cluster_file).read_text(encoding="utf-8"))
    topo = plan.topology
    commands: list[str] = []
    skipped: list[str] = []
    done: dict[tuple, str] = {}
    level_names = list(topo.level_names)
    for part in plan.parts:
        if part.program == "none" or part.proof != "valid":
            skipped.append(f"stage {part.index}: no all-reduce to run ({part.proof})")
            continue
        if len(level_names) != 2:
            skipped.append(f"stage {part.index}: sub-mesh specs are written for two-level clusters only")
            continue
        c = plan.partition.costs
        table = plan.partition.table(part.index)
        nbytes = int(min(float(table.grad_bytes[part.first, part.last]), table.bucket_cap))
        key = (part.mesh, part.data, part.tensor, part.program, nbytes)
        if key in done:
            commands.append(done[key].replace("{stage}", str(part.index)))
            continue
        stem = f"stage-{part.index}"
        sub = dict(raw)
        sub["name"] = f"{raw['name']}-{stem}"
        sub["levels"] = [dict(lv, count=k) for lv, k in zip(raw["levels"], part.mesh)]
        cluster_path = out / f"{stem}.cluster.yaml"
        _dump(sub, cluster_path)
        try:
            load_cluster_spec(cluster_path)
        except PlannerError as exc:
            skipped.append(f"stage {part.index}: its sub-mesh is not a valid cluster spec: {exc}")
            continue
        model = {
            "name": f"{plan.model.name}-{stem}",
            "description": f"stage {part.index} of the plan: layers {part.first}-{part.last}; its gradient bucket",
            "parallelism": {"axes": [{"name": "data", "size": part.data}, {"name": "tensor", "size": part.tensor}],
                            "constraints": [{"axis": "tensor", "inside": level_names[0]}]},
            "reductions": [{"name": "gradients", "axes": ["data"], "bytes": nbytes}],
        }
        model_path = out / f"{stem}.model.yaml"
        _dump(model, model_path)
        matrix = str(part.matrix).replace(" ", "")
        cmd = (f"solver-planner execute reduction {cluster_path} {model_path} '{part.program}' --matrix '{matrix}'"
               f"  # stage {{stage}}")
        done[key] = cmd
        commands.append(cmd.replace("{stage}", str(part.index)))
    entries = []
    for b in plan.boundaries:
        if b.plan is None:
            continue
        src, dst = _mesh_spec(plan, b.src), _mesh_spec(plan, b.dst)
        reason = src if isinstance(src, str) else dst if isinstance(dst, str) else None
        if reason is not None:
            skipped.append(f"boundary {b.kind} {b.src}->{b.dst}: {reason}")
            continue
        entries.append({"name": f"{b.kind}-{b.src}-{b.dst}", "shape": list(b.problem.shape), "dtype": b.problem.dtype,
                        "src": src, "dst": dst})
    if entries:
        path = out / "boundaries.model.yaml"
        _dump({"name": f"{plan.model.name}-boundaries",
               "description": "the plan's stage boundaries, one micro-batch each", "resharding": entries}, path)
        commands.append(f"solver-planner execute reshard {cluster_file} {path}")
    if document is not None:
        import shutil

        write_document(document, out / "plan.yaml")
        # copied by path: importing it would import torch, which planning does not need
        shutil.copyfile(Path(__file__).resolve().parents[1] / "run" / "launch_from_plan.py",
                        out / "launch_from_plan.py")
        topo = plan.topology
        hosts, per_host = topo.num_devices // topo.devices_per_host, topo.devices_per_host
        commands.append(f"torchrun --nnodes {hosts} --nproc-per-node {per_host} {out / 'launch_from_plan.py'}"
                        f"  # on every host, with its --node-rank and --rdzv-endpoint; on one machine:"
                        f" --nproc-per-node {topo.num_devices}")
        if model_file is not None:
            commands.append(f"solver-planner run {cluster_file} {Path(model_file).resolve()} {out / 'plan.yaml'}")
    result = {"commands": commands, "skipped": skipped}
    write_document(result, out / "commands.yaml")
    return result
