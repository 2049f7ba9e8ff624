"""``plan --report``: one self-contained HTML file for a whole plan: its summary, every
picture (inline SVG: nothing is fetched when it is opened), the tables, each reduction
program's proof status, and the commands that reproduce it."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Sequence

from .style import figure, svg_text

__all__ = ["plan_report", "write_plan_report", "link_utilisation", "MAX_BOUNDARIES"]

MAX_BOUNDARIES = 4      # boundary schedules drawn (the others are in the table)
MAX_BOUNDARY_HEIGHT = 12.0   # inches: hundreds of ports share it (a row each, names thinned)
MAX_PROGRAMS = 3        # distinct stage gradient programs drawn step by step
MAX_PROGRAM_DEVICES = 256   # a larger stage's program is in the table only (its device map is unreadable)

CSS = """
body { font-family: 'DejaVu Sans', Arial, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f2f2f2; } td.num { text-align: right; }
.valid { color: #009E73; font-weight: bold; } .bad { color: #D55E00; font-weight: bold; } .plain { color: inherit; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
details { margin: 0.6em 0; } summary { cursor: pointer; }
"""


SVG_LIMIT = 200_000   # bytes: a larger figure (thousands of bars, a 1 024-device map) is inlined as PNG
PNG_DPI = 110


def _render(fig) -> str:
    """The figure as SVG text, or, when that is over :data:`SVG_LIMIT`, as ``"png:<img ...>"``
    (a PNG inlined as data), so that the report of a 1 024-GPU plan stays about a megabyte."""
    import base64
    import io

    from .style import _metadata

    svg = svg_text(fig)
    if len(svg) <= SVG_LIMIT:
        return svg
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI, metadata=_metadata("png"))
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'png:<img alt="figure" style="max-width:100%" src="data:image/png;base64,{data}">'


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
    from ..stages.memory import stage_memory
    from .pipeline import figure_height, pipeline_figure
    from .resharding import resharding_figure

    c = plan.partition.costs
    out = []
    with figure(11, figure_height(plan.run)) as fig:
        pipeline_figure(fig, plan.run, plan.partition.stage_size, c.device_memory,
                        f"{plan.model.name} on {plan.topology.name}, {plan.schedule}", breakdown(plan),
                        stage_memory(plan.partition, plan.run.peak_memory), plan.topology.device.reserved)
        out.append(("The simulated iteration: pipeline per stage, memory per stage, where the time goes.",
                     _render(fig)))
    with figure(9, 2.6 + 0.12 * plan.topology.num_hosts) as fig:
        _stage_map(fig, plan)
        out.append(("Where each stage lives, and each device's data / tensor coordinate in its stage.",
                     _render(fig)))
    out += _programs(plan)
    drawn = [b for b in plan.boundaries if b.result is not None and b.result.solution is not None]
    for b in drawn[:MAX_BOUNDARIES]:
        ports = len(b.result.solution.instance.resources)
        with figure(10, min(2 * (0.16 * ports + 1.4), MAX_BOUNDARY_HEIGHT)) as fig:
            resharding_figure(fig, b.result, plan.topology, index=len(out))
            out.append((f"Boundary {b.kind} {b.src}->{b.dst}: broadcast schedule per port, beside the naive one.",
                         _render(fig)))
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
        table = plan.partition.table(part.index)
        nbytes = min(float(table.grad_bytes[part.first, part.last]), table.bucket_cap)
        panels = len(steps) + 1
        with figure(10, 2.6 * -(-panels // 4) + 0.8) as fig:
            program_figure(sub, steps, lowering.hierarchy.size, nbytes,
                           f"stage {part.index} gradient bucket ({part.data} replicas x {part.tensor}): proof {part.proof}",
                           fig=fig)
            out.append((f"Stage {part.index}'s gradient program, step by step on its sub-mesh (devices numbered"
                        f" within the stage): {part.program}; z3 proof: {part.proof}.", _render(fig)))
    return out


_TAB20 = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
          "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
          "#17becf", "#9edae5")


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
    from matplotlib.colors import ListedColormap

    axes = fig.subplots(1, 3)
    stages = len(plan.parts)
    # stages are categories: neighbours get different hues (tab20's dark shades, then its light
    # ones; it cycles beyond 20 stages, the legend names the first 20), labels on small clusters
    palette = ListedColormap([f"C{i % 10}" if stages <= 10 else _TAB20[(2 * i + (i % 20 >= 10)) % 20]
                              for i in range(stages)])
    grid.draw(axes[0], stage, palette, -0.5, stages - 0.5,
              labels=[("" if math.isnan(v) else int(v)) for v in stage], gid="map-stage")
    axes[0].set_title("stage")
    from matplotlib.patches import Patch

    shown = min(stages, 20)
    fig.legend(handles=[Patch(color=palette(i), label=f"stage {i}") for i in range(shown)], fontsize=6,
               ncols=min(shown, 10), loc="outside lower center", frameon=False)
    for ax, values, name in ((axes[1], data, "data coordinate"), (axes[2], tensor, "tensor coordinate")):
        top = max((v for v in values if not math.isnan(v)), default=0)
        mesh = grid.draw(ax, values, SEQUENTIAL, -0.5, top + 0.5,
                         labels=[("" if math.isnan(v) else int(v)) for v in values], gid=f"map-{name.split()[0]}")
        ax.set_title(name)
        bar = fig.colorbar(mesh, ax=ax, shrink=0.8, label=name)
        bar.set_ticks(_integer_ticks(int(top)))      # a coordinate is whole: no 0.5 between two
        bar.minorticks_off()


def _integer_ticks(top: int, most: int = 8) -> list[int]:
    """Ticks for the integers 0..``top``: each of them up to ``most``, else every
    ceil((top + 1) / most)-th, as the device map's axes are thinned; ``top`` always (it
    replaces the tick before it when that is within half a step, or when there are ``most``).

    >>> _integer_ticks(1), _integer_ticks(15), _integer_ticks(31)
    ([0, 1], [0, 2, 4, 6, 8, 10, 12, 15], [0, 4, 8, 12, 16, 20, 24, 31])
    """
    step = max(1, -(-(top + 1) // most))
    ticks = list(range(0, top + 1, step))
    if ticks[-1] != top:
        if top - ticks[-1] > step / 2 and len(ticks) < most:
            ticks.append(top)
        else:
            ticks[-1] = top
    return ticks


MAX_PORTS_LISTED = 10   # busiest link ports listed under the per-class table


def link_utilisation(plan) -> list[dict]:
    """Per link class (interconnect): its ports, the share of the iteration they are busy
    (mean over the ports that carry anything, and the busiest), from the simulated timeline."""
    T = plan.run.iteration_time or 1.0
    busy: dict[str, float] = {}
    for rec in plan.run.timeline.records:
        for res in rec.resources:
            name = str(res)
            if not name.startswith("stage["):
                busy[name] = busy.get(name, 0.0) + rec.duration
    classes: dict[str, list[tuple[float, str]]] = {}
    for port, t in busy.items():
        classes.setdefault(port.split("[", 1)[0], []).append((t / T, port))
    out = []
    for name, ports in sorted(classes.items()):
        ports.sort(reverse=True)
        out.append({"interconnect": name, "ports used": len(ports), "mean": sum(u for u, _ in ports) / len(ports),
                    "busiest": ports[0][0], "busiest port": ports[0][1], "ports": ports[:MAX_PORTS_LISTED]})
    return out


def _links(plan) -> str:
    rows = link_utilisation(plan)
    if not rows:
        return "<p>No link carries anything in the simulated iteration.</p>"
    table = _table(["interconnect", "ports used", "busy, mean over them", "busiest port", "its share"],
                   [[r["interconnect"], r["ports used"], f"{r['mean']:.1%}", r["busiest port"], f"{r['busiest']:.1%}"]
                    for r in rows], num=(1, 2, 4))
    top = sorted((p for r in rows for p in r["ports"]), reverse=True)[:MAX_PORTS_LISTED]
    # the simulator plays only these on ports; a reader would otherwise take the links for idle
    note = ("<p>What the simulator plays on ports: transfers between stages, gradient reductions and tied"
            " all-reduces. Tensor-parallel collectives and ZeRO-3 parameter gathers are priced inside each"
            " layer's time (the breakdown's tensor-parallel term), not here.</p>")
    return (note + table + "<details><summary>the busiest ports</summary>"
            + _table(["port", "busy share of the iteration"], [[p, f"{u:.1%}"] for u, p in top], num=(1,))
            + "</details>")


def plan_report(plan, doc: dict, commands: Sequence[str] = ()) -> str:
    """The HTML text of the report of ``plan`` (its plan document ``doc``,
    :func:`solver_planner.plan.planfile.plan_document`)."""
    from .. import units

    e = html.escape
    s = doc["schedule"]
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{e(doc['model'])} on {e(doc['cluster'])}: plan</title><style>{CSS}</style></head><body>",
             f"<h1>{e(doc['model'])} on {e(doc['cluster'])}</h1>",
             f"<p>{units.format_count(len(doc['stages']), 'stage')} of {units.format_meshes(doc['mesh'])}"
             f" meshes, {doc['microbatches']}"
             f" micro-batches of {doc['microbatch_size']}, schedule {e(s['kind'])}; iteration"
             f" <b>{e(units.format_time(doc['iteration_time']))}</b> (simulated), {doc['throughput']:.1f} samples/s,"
             f" MFU {doc['mfu']:.1%}, bubble {doc['bubble_ratio']:.1%}; cross-mesh boundaries {e(doc['cross_mesh'])},"
             f" {doc['communication_hidden']['hidden_fraction']:.1%} of their time hidden.</p>"]
    if "idle" in doc:            # a plan on part of the cluster: say so before anything else
        idle = doc["idle"]
        parts.append(f"<p>Devices: the first {idle['used']:,} of {doc['devices']:,} (MFU over them);"
                     f" {idle['devices']:,} idle: {e(idle['reason'])}.</p>")
    parts.append("<h2>Stages and proofs</h2>")
    rows = []
    for st in doc["stages"]:
        # a reduce-scatter (ZeRO) is no all-reduce by design: said plainly, not as a warning
        kind = "valid" if st["proof"] in ("valid", "not needed") else "plain" if st["proof"] == "not an all-reduce" \
            else "bad"
        proof = _Raw(f"<span class=\"{kind}\">{e(st['proof'])}</span>"
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
    parts.append(_table(["part (on the critical path; they add up to the iteration)", "time"],
                        [[k.replace("_", " "), units.format_time(v)] for k, v in doc["breakdown"].items()], num=(1,)))
    parts.append("<h2>Links</h2>")
    parts.append(_links(plan))
    ranks = doc.get("launch", {}).get("ranks", [])
    if ranks:
        parts.append("<h2>Ranks</h2>")
        parts.append(f"<details><summary>rank &rarr; (stage, data, tensor) for all {len(ranks)} ranks"
                     " (torchrun's host-major numbering)</summary>")
        parts.append(_table(["rank", "host", "stage", "dp", "tp"],
                            [[r["rank"], r["host"], r["stage"], r["data"], r["tensor"]] for r in ranks],
                            num=(0, 1, 2, 3, 4)))
        parts.append("</details>")
    parts.append("<h2>Pictures</h2>")
    for n, (caption, svg) in enumerate(_figures(plan)):
        parts.append(f"<figure>{_inline(svg, n) if svg.startswith('<') else svg[4:]}"
                     f"<figcaption>{e(caption)}</figcaption></figure>")
    target = doc.get("target") or {}
    if target.get("export"):
        # what the framework is launched with: the plan file's recorded export (check derives it)
        parts.append(f"<h2>{e(str(target.get('framework', 'framework')))} configuration</h2><pre>"
                     + e(target["export"]) + "</pre>")
    if commands:
        parts.append("<h2>Reproduce</h2><pre>" + "\n".join(e(c) for c in commands) + "</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_plan_report(path: Path | str, plan, doc: dict, commands: Sequence[str] = ()) -> Path:
    """Write :func:`plan_report` to ``path``."""
    path = Path(path)
    path.write_text(plan_report(plan, doc, commands), encoding="utf-8")
    return path
