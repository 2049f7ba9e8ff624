"""The plan file: everything needed to re-check a plan and to launch it, as YAML.

Format ``solver-planner-plan``, version 5 (version 4 had no ``device_memory``,
``memory_reserved`` or ``warnings``; version 3 listed each rank's groups; version 2 had one
model chunk per stage: no
``pipeline_stage`` per stage, no ``schedule.virtual``, and ``layers`` where ``launch`` now
has ``chunks``; version 1 had no search options, and its breakdown was per-stage averages).
With model chunks (interleaved 1F1B, ZB-V), ``stages`` lists the chunks in model order,
each with the pipeline stage that runs it (its ``memory``, ``in_flight`` and ``busy`` are
that stage's).  Times are seconds, memory bytes; a boundary's
schedule gives each unit task's sender device and its start and end in integer units of
``time_unit`` seconds (the resharding scheduler's own unit, so the check is exact).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import PlannerError
from ..resharding import TIME_UNIT
from ..stages.memory import memory_warnings
from .compose import TrainingPlan, breakdown, mesh_list
from .fields import kind_of
from . import yamlread, yamltext
from .launch import launch_layout

__all__ = ["FORMAT", "VERSION", "plan_document", "write_document", "write_plan", "read_plan", "PlanFileError"]

FORMAT = "solver-planner-plan"
VERSION = 5                      # 5: the memory reserved and the warnings; 4: a rank's groups are its mesh's row and column
MAX_PLAN_BYTES = 64 * 2**20      # GPT-3 175B on 99 840 GPUs (65 stages of 1 536): 19 MB


class PlanFileError(PlannerError):
    """A plan file that cannot be read as a plan (exit 2), as opposed to one whose
    contents do not hold (exit 1, :mod:`.check`).  ``file`` and ``line`` say where, for
    ``--json``'s error object (the message says it too)."""

    def __init__(self, message: str, file: Path | None = None, line: int | None = None):
        super().__init__(message)
        self.file = None if file is None else str(file)
        self.line = line


def plan_document(plan: TrainingPlan) -> dict[str, Any]:
    """The plan as plain data (what ``-o`` writes and ``--json`` prints)."""
    part = plan.partition
    c = part.costs
    run = plan.run
    stages = []
    for s in plan.parts:
        stages.append({
            "index": s.index, "pipeline_stage": s.stage, "layers": [s.first, s.last],
            "layer_names": list(s.layer_names),
            "devices": list(s.devices), "mesh": list(s.mesh), "data": s.data, "tensor": s.tensor,
            "recompute": s.recompute, "axes": ["data", "tensor"], "matrix": s.matrix.as_lists(),
            "placements_allowed": s.alternatives, "gradient_program": s.program, "proof": s.proof,
            "proof_detail": s.proof_detail, "memory": s.memory, "in_flight": run.in_flight[s.stage],
            "busy": run.busy[s.stage],
        })
    bounds = []
    for b in plan.boundaries:
        entry: dict[str, Any] = {
            "kind": b.kind, "src": b.src, "dst": b.dst, "tensor": {"shape": list(b.problem.shape),
                                                                   "dtype": b.problem.dtype},
            "src_spec": str(b.problem.src.spec), "dst_spec": str(b.problem.dst.spec), "time": b.time,
        }
        rp = b.plan
        if rp is not None:
            res = b.result
            entry.update({
                "strategy": rp.strategy, "status": res.status.value, "bound": res.bound, "method": res.method,
                "unit_tasks": len(rp.tasks),
                "schedule": [{"task": i, "slice": rp.problem.describe_slice(rp.tasks[i].slice),
                              "sender_device": rp.sender(i).device, "receivers": list(rp.tasks[i].receivers),
                              "start": rp.schedule.start[i], "end": rp.schedule.end[i]}
                             for i in rp.schedule.order()],
            })
        else:
            entry["strategy"] = "free"
        bounds.append(entry)
    s = plan.schedule
    return {
        "format": FORMAT, "version": VERSION,
        "cluster": plan.topology.name, "model": plan.model.name,
        "devices": plan.use.devices if plan.use is not None else plan.topology.num_devices,
        # a plan on the cluster's first devices: how many, and why the rest idle (stages/devices.py)
        **({"idle": {"devices": plan.use.idle, "used": plan.use.used, "reason": plan.use.reason}}
           if plan.use is not None and plan.use.idle else {}),
        "schedule": {"family": plan.family, "kind": s.kind, "eagerness": s.eagerness, "weight_delay": s.weight_delay,
                     "virtual": s.virtual},
        "cross_mesh": plan.cross_mesh, "overlap": plan.overlap, "compute": c.compute.mode,
        "mesh": mesh_list(plan.partition), "microbatches": c.microbatches, "microbatch_size": c.micro_size,
        "global_batch": c.model.global_batch,
        "iteration_time": plan.iteration_time,
        "throughput": plan.throughput, "mfu": plan.mfu, "bubble_ratio": run.bubble_ratio,
        "stage_planner_time": plan.stage_planner_time, "cross_mesh_free_time": plan.free_time,
        "communication_hidden": _hidden(plan),
        # what the plan's tensors may fill, what the spec keeps free, and the memory it leaves
        "device_memory": c.device_memory, "memory_reserved": plan.topology.device.reserved,
        "warnings": memory_warnings(plan.topology.device, plan.run.peak_memory),
        "breakdown": breakdown(plan), "schedules_tried": plan.tried, "search": plan.search,
        "solve_times": plan.solve_times, "time_unit": TIME_UNIT,
        "stages": stages, "boundaries": bounds, "launch": launch_layout(plan),
        **_target(plan),
    }


def _target(plan: TrainingPlan) -> dict[str, Any]:
    """With a framework target: its name and the configuration ``--export`` writes (``check``
    derives it again from the plan, so an edited export is refused like any field)."""
    name = (plan.search or {}).get("options", {}).get("target", "native")
    if name == "native":
        return {}
    from ..targets.search import target_config, target_module

    cfg = target_config(plan.partition, plan.schedule, plan.model, name)
    return {"target": {"framework": name, "config": cfg.as_dict(), "export": target_module(name).export(cfg)}}


def _hidden(plan: TrainingPlan) -> dict[str, float]:
    """Cross-mesh transfer time of one iteration, and the part the schedule hides."""
    total = sum(b.time for b in plan.boundaries) * plan.partition.costs.microbatches
    exposed = max(0.0, plan.iteration_time - plan.free_time)
    return {"cross_mesh_total": total, "cross_mesh_exposed": exposed,
            "hidden_fraction": _share(1.0 - exposed / total) if total > 0 else 1.0}


def _share(x: float) -> float:
    """The hidden share, rounding taken off: the exposed time is a difference of two simulated
    times, which can put it a hair above the transfers' own (-2e-16 read "-0.0% hidden").  A
    real negative stays: under --no-overlap the transfers also hold both stages' compute, and
    the exposed time can be many times their own."""
    return 0.0 if -1e-9 < x < 0 else x


def write_document(doc: dict[str, Any], path: Path) -> None:
    """Write plan data as YAML (no anchors or aliases)."""
    Path(path).write_text(yamltext.dump(doc), encoding="utf-8")


def write_plan(plan: TrainingPlan, path: Path) -> dict[str, Any]:
    doc = plan_document(plan)
    write_document(doc, path)
    return doc


def write_export(doc: dict[str, Any], path: Path) -> None:
    """The framework configuration a ``--target`` plan document records (``--export``)."""
    Path(path).write_text(doc["target"]["export"], encoding="utf-8")


def read_plan(path: Path) -> dict[str, Any]:
    """The plan file's data, or :class:`PlanFileError` saying why it is not a plan file."""
    p = Path(path)
    if not p.is_file():
        raise PlanFileError(f"{p}: no such plan file", p)
    if p.stat().st_size > MAX_PLAN_BYTES:
        raise PlanFileError(f"{p}: {p.stat().st_size} bytes is more than a plan file holds ({MAX_PLAN_BYTES})", p)
    try:
        text = p.read_text(encoding="utf-8")
        # a repeated key or an alias is refused: the file says each value once (PyYAML would
        # keep a repeated key's last value silently, and check would certify the file)
        doc = yamlread.load(text, strict=True)
    except yamlread.Refused as exc:
        raise PlanFileError(f"{p}:{exc.line}: {exc.reason}", p, exc.line) from None
    except RecursionError:
        raise PlanFileError(f"{p}: not a plan file: its values nest deeper than Python can read", p) from None
    except UnicodeDecodeError as exc:
        raise PlanFileError(f"{p}: not UTF-8 text (byte {exc.start})", p) from None
    except yaml.reader.ReaderError as exc:
        # libyaml counts bytes of the UTF-8 text, not characters
        line = text.encode("utf-8", "surrogatepass")[:exc.position].count(b"\n") + 1
        ch = exc.character if isinstance(exc.character, str) else chr(exc.character)    # libyaml: a code point
        raise PlanFileError(f"{p}:{line}: not YAML: character {ch!r} is not allowed", p, line) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        reason = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        raise PlanFileError(f"{p}{where}: not YAML: {reason}", p, mark.line + 1 if mark is not None else None) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        # a scalar YAML resolves to a type it cannot build (2001-02-30, '!!bool foo', an
        # integer of 5 000 digits): PyYAML's constructors raise these, not YAMLError
        raise PlanFileError(f"{p}: not a plan file: a value YAML cannot read ({type(exc).__name__}: {exc})", p) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanFileError(f"{p}: not a plan file (expected 'format: {FORMAT}')", p)
    version = doc.get("version")
    if type(version) is not int or version != VERSION:    # 2.0 and true are not the integer 2
        # the key's line, as every other error names one (a plan file's keys start lines)
        line = next((n + 1 for n, row in enumerate(text.splitlines()) if row.startswith("version:")), None)
        raise PlanFileError(f"{p}{'' if line is None else f':{line}'}: version: the plan file's version is"
                            f" {kind_of(version)}; this version of solver-planner reads the integer {VERSION} (write"
                            f" the plan again with 'plan -o')", p, line)
    return doc
