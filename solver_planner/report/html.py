"""``plan --report``: one self-contained HTML file for a whole plan: its summary, every
picture (inline SVG: nothing is fetched when it is opened), the tables, each reduction
program's proof status, and the commands that reproduce it."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Sequence

from .style import figure, svg_text

__all__ = ["plan_report", "write_plan_report", "MAX_BOUNDARIES"]

MAX_BOUNDARIES = 4      # boundary schedules drawn (the others are in the table)
MAX_PROGRAMS = 3        # distinct stage gradient programs drawn step by step
MAX_PROGRAM_DEVICES = 256   # a larger stage's program is in the table only (its device map is unreadable)

CSS = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f2f2f2; } td.num { text-align: right; }
.valid { color: #009E73; font-weight: bold; } .bad { color: #D55E00; font-weight: bold; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
"""


def _inline(svg: str, n: int) -> str:
    """An SVG document as an element of the page: no XML prolog, ids made unique per figure."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r'id="([^"]+)"', lambda m: f'id="f{n}-{m.group(1)}"', svg)
    svg = re.sub(r'url\(#([^)]+)\)', lambda m: f'url(#f{n}-{m.group(1)})', svg)
    return re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#f{n}-{m.group(1)}"', svg)


def _table(header: Sequence[str], rows: Sequence[Sequence], num: Sequence[int] = ()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = ' class="num"' if i in num else ""
            cells.append(f"<td{cls}>{v if isinstance(v, _Raw) else html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


class _Raw(str):
    """Already HTML."""


def _figures(plan) -> list[tuple[str, str]]:
    """(caption, SVG) of every picture of ``plan`` (a :class:`solver_planner.plan.compose.TrainingPlan`)."""
    from ..plan.compose import breakdown
    from .pipeline import pipeline_figure
    from .resharding import resharding_figure

    c = plan.partition.costs
    out = []
    stages = len(plan.run.peak_memory)
    with figure(11, max(2.2, 0.45 * stages + 1.2) + 2.6) as fig:
        pipeline_figure(fig, plan.run, c.shape.size, c.device_memory,
                        f"{plan.model.name} on {plan.topology.name}, {plan.schedule}", breakdown(plan))
        out.append(("The simulated iteration: pipeline per stage, memory per stage, where the time goes.",
                     svg_text(fig)))
    with figure(9, 2.6 + 0.12 * plan.topology.num_hosts) as fig:
        _stage_map(fig, plan)
        out.append(("Where each stage lives, and each device's data / tensor coordinate in its stage.",
                     svg_text(fig)))
    out += _programs(plan)
    drawn = [b for b in plan.boundaries if b.result is not None and b.result.solution is not None]
    for b in drawn[:MAX_BOUNDARIES]:
        ports = len(b.result.solution.instance.resources)
        with figure(10, 2 * (0.16 * ports + 1.4)) as fig:
            resharding_figure(fig, b.result, plan.topology, index=len(out))
            out.append((f"Boundary {b.kind} {b.src}->{b.dst}: broadcast schedule per port, beside the naive one.",
                         svg_text(fig)))
    return out


def _programs(plan) -> list[tuple[str, str]]:
    """Each distinct stage gradient program, step by step on its stage's sub-mesh (the
    devices numbered from 0 within the stage), with its proof status."""
    from ..plan.parts import stage_lowering
    from ..reduction.dsl import parse_program
    from ..reduction.verify import system_steps
    from ..spec.cluster import ClusterSpec
    from ..topology import Topology
    from .program import program_figure

    c = plan.partition.costs
    out: list[tuple[str, str]] = []
    seen: set = set()
    for part in plan.parts:
        key = (part.matrix, part.program)
        if part.program == "none" or part.proof == "not an all-reduce" or key in seen or len(out) >= MAX_PROGRAMS:
            continue
        seen.add(key)
        if len(part.devices) > MAX_PROGRAM_DEVICES or len(plan.topology.levels) != 2:
            continue
        data = plan.topology.spec.model_dump(mode="json", exclude_none=True)
        data["name"] = f"{plan.topology.name} stage {part.index}"
        for level, count in zip(data["levels"], part.mesh):
            level["count"] = count
        sub = Topology(ClusterSpec.model_validate(data))
        lowering = stage_lowering(part.matrix, part.mesh, plan.topology.level_names)
        program = parse_program(part.program)
        steps = system_steps(lowering, program)
        grad = float(c[plan.partition.stages[part.index].config].grad_bytes[part.first, part.last])
        nbytes = min(grad, c.model.options.gradient_bucket)
        panels = len(steps) + 1
        with figure(10, 2.6 * -(-panels // 4) + 0.8) as fig:
            program_figure(sub, steps, lowering.hierarchy.size, nbytes,
                           f"stage {part.index} gradient bucket ({part.data} replicas x {part.tensor}): proof {part.proof}",
                           fig=fig)
            out.append((f"Stage {part.index}'s gradient program, step by step on its sub-mesh (devices numbered"
                        f" within the stage): {part.program}; z3 proof: {part.proof}.", svg_text(fig)))
    return out


def _stage_map(fig, plan) -> None:
    import math

    from .devices import DeviceGrid
    from .style import SEQUENTIAL

    topo = plan.topology
    grid = DeviceGrid(topo)
    stage = [math.nan] * topo.num_devices
    data = [math.nan] * topo.num_devices
    tensor = [math.nan] * topo.num_devices
    for part in plan.parts:
        for d, (x, t) in zip(part.devices, part.coords()):
            stage[d], data[d], tensor[d] = part.index, x, t
    axes = fig.subplots(1, 3)
    for ax, values, name in ((axes[0], stage, "stage"), (axes[1], data, "data coordinate"),
                             (axes[2], tensor, "tensor coordinate")):
        top = max((v for v in values if not math.isnan(v)), default=0)
        grid.draw(ax, values, SEQUENTIAL, -0.5, top + 0.5, labels=[("" if math.isnan(v) else int(v)) for v in values],
                  gid=f"map-{name.split()[0]}")
        ax.set_title(name)


def plan_report(plan, doc: dict, commands: Sequence[str] = ()) -> str:
    """The HTML text of the report of ``plan`` (its plan document ``doc``,
    :func:`solver_planner.plan.planfile.plan_document`)."""
    from .. import units

    e = html.escape
    s = doc["schedule"]
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{e(doc['model'])} on {e(doc['cluster'])}: plan</title><style>{CSS}</style></head><body>",
             f"<h1>{e(doc['model'])} on {e(doc['cluster'])}</h1>",
             f"<p>{len(doc['stages'])} stages of {'x'.join(map(str, doc['mesh']))} meshes, {doc['microbatches']}"
             f" micro-batches of {doc['microbatch_size']}, schedule {e(s['kind'])}; iteration"
             f" <b>{e(units.format_time(doc['iteration_time']))}</b> (simulated), {doc['throughput']:.1f} samples/s,"
             f" MFU {doc['mfu']:.1%}, bubble {doc['bubble_ratio']:.1%}; cross-mesh boundaries {e(doc['cross_mesh'])},"
             f" {doc['communication_hidden']['hidden_fraction']:.1%} of their time hidden.</p>"]
    parts.append("<h2>Stages and proofs</h2>")
    rows = []
    for st in doc["stages"]:
        ok = st["proof"] in ("valid", "not needed")
        proof = _Raw(f"<span class=\"{'valid' if ok else 'bad'}\">{e(st['proof'])}</span>"
                     + (f" ({e(st['proof_detail'])})" if st.get("proof_detail") else ""))
        rows.append([st["index"], f"{st['layers'][0]}-{st['layers'][1]} ({st['layer_names'][0]}..{st['layer_names'][1]})",
                     f"{st['devices'][0]}-{st['devices'][-1]}", st["data"], st["tensor"],
                     str(st["matrix"]).replace(" ", ""), st["gradient_program"], proof,
                     units.format_bytes(st["memory"])])
    parts.append(_table(["stage", "layers", "devices", "d", "t", "placement", "gradient program", "proof",
                         "memory / device"], rows, num=(0, 3, 4, 8)))
    if doc["boundaries"]:
        parts.append("<h2>Stage boundaries</h2>")
        parts.append(_table(["boundary", "tensor", "specs", "strategy", "unit tasks", "time / micro-batch", "status"],
                            [[f"{b['kind']} {b['src']}->{b['dst']}", f"{b['tensor']['shape']} {b['tensor']['dtype']}",
                              f"{b['src_spec']} -> {b['dst_spec']}", b["strategy"], b.get("unit_tasks", "-"),
                              units.format_time(b["time"]), b.get("status", "-")] for b in doc["boundaries"]],
                            num=(4, 5)))
    parts.append("<h2>Where the iteration goes</h2>")
    parts.append(_table(["part (averaged over stages)", "time"],
                        [[k.replace("_", " "), units.format_time(v)] for k, v in doc["breakdown"].items()], num=(1,)))
    parts.append("<h2>Pictures</h2>")
    for n, (caption, svg) in enumerate(_figures(plan)):
        parts.append(f"<figure>{_inline(svg, n)}<figcaption>{e(caption)}</figcaption></figure>")
    if commands:
        parts.append("<h2>Reproduce</h2><pre>" + "\n".join(e(c) for c in commands) + "</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_plan_report(path: Path | str, plan, doc: dict, commands: Sequence[str] = ()) -> Path:
    """Write :func:`plan_report` to ``path``."""
    path = Path(path)
    path.write_text(plan_report(plan, doc, commands), encoding="utf-8")
    return path
