"""``solver-planner stages``: cut layers into pipeline stages on sub-meshes.  Thin:
argument parsing and printing only."""

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import units
from .common import (BUDGET_OPT, COMPUTE_OPT, DEVICES_OPT, GAP_OPT, SIM_BUDGET_OPT, JSON_OPT, TRACE_DETAIL_OPT, check_output, check_plot, check_trace_detail, console,
                     handles_errors, model_of, print_json, topology_of, warn, write_trace)
from ..choices import DEFAULT_TOP_GAP, SCHEDULES
from ..choices import STAGE_METHODS as METHODS


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        typer.echo(f"\r\x1b[K{text}", err=True, nl=False)


def _work(search: dict) -> str:
    """What the method did before simulating: subspaces solved (dp, cp-sat) or plans priced."""
    if "subspaces" in search:
        return f"{search['subspaces']} subspaces, "
    if "plans_priced" in search:
        return f"{search['plans_priced']} plans priced, "
    return ""


def _plan_table(row: dict, memory: float) -> Table:
    pipeline = row["config"]["pipeline"]
    chunked = isinstance(pipeline, int) and len(row["stages"]) > pipeline
    table = Table("chunk" if chunked else "stage", "layers", "devices", "d", "t", "recompute", "fwd+bwd / micro-batch", "memory / device",
                  "grad sync", "tail")
    for i, st in enumerate(row["stages"]):
        first, last = st["layers"]
        names = st["layer_names"]
        table.add_row(str(i), units.format_span(first, last, names), units.format_span(*st["devices"][:2]),
                      str(st["data"]), str(st["tensor"]), st["recompute"], units.format_time(st["time"]),
                      f"{units.format_bytes(st['memory'])} / {units.format_bytes(memory)}",
                      units.format_time(st["gradient_reduction"]), units.format_time(st["gradient_tail"]))
    return table


def _config(row: dict) -> str:
    """d,t,p,k; a degree that differs between stages as its values, e.g. 2/4."""
    c = row["config"]

    def degree(v) -> str:
        return "/".join(str(x) for x in sorted(set(v))) if isinstance(v, list) else str(v)

    return f"{degree(c['data'])},{degree(c['tensor'])},{c['pipeline']},{c['microbatches']}"


@handles_errors
def stages(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False,
                                 help="Model spec with 'layers' (or 'transformer') and 'training'."),
    schedule: Optional[str] = typer.Option(None, "--schedule", "-s", show_default=False,
                                           help=f"Pipeline schedule: {', '.join(SCHEDULES)} (default 1f1b; with --target,"
                                           " every schedule that framework runs)."),
    target: str = typer.Option("native", "--target", help="Search only what this framework runs: native (every"
                               " plan), torchtitan, megatron, deepspeed (uniform degrees, its layer splits, schedules"
                               " and rules)."),
    method: str = typer.Option("auto", "--method", "-m",
                               help=f"{', '.join(METHODS)}. auto = dp (exact dynamic programs in a branch and"
                                    " bound); brute-force prices every plan (small cases)."),
    time_limit: float = typer.Option(10.0, "--time-limit", "-t", min=0.001, max=86400,
                                     help="CP-SAT deterministic time per subspace (roughly seconds)."),
    seed: int = typer.Option(0, "--seed", help="CP-SAT seed (one worker: reproducible)."),
    num_stages: Optional[int] = typer.Option(None, "--stages", min=1,
                                             help="Only plans with this many stages (default: search all)."),
    top: int = typer.Option(1, "--top", min=1, help="List the N fastest plans (one per mesh / micro-batch pair)."),
    top_gap: float = typer.Option(DEFAULT_TOP_GAP, "--top-gap", min=0.0, max=0.99,
                                  help="With --top: each listed plan after the first is its pair's best within this"
                                       " relative gap, or as close as its share of the budgets gets (each is"
                                       " printed); 0 asks for exact ones."),
    config: Optional[str] = typer.Option(None, "--config",
                                         help="Evaluate one configuration d,t,p,k (data, tensor, pipeline degrees,"
                                              " micro-batches); the best layer split unless --split."),
    split: Optional[str] = typer.Option(None, "--split", help="Layers per stage, e.g. 10,12,12,10."),
    devices: Optional[int] = DEVICES_OPT,
    meshes: str = typer.Option("equal", "--meshes", help="equal: every stage on one mesh shape; unequal: each stage"
                               " on its own shape of Alpa's set (1x1, 1x2, ..., 1xM inside a host, or n whole hosts),"
                               " on up to all the devices (1f1b, eager-1f1b, gpipe; not with --config, --split,"
                               " --top or --target)."),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines",
                                   help="Also the best pure data, tensor and pipeline plans (DistIR Table 2) and, under"
                                   " eager-1f1b, the best 1F1B plan for comparison."),
    budget: int = BUDGET_OPT,
    sim_budget: int = SIM_BUDGET_OPT,
    gap: float = GAP_OPT,
    no_comm: bool = typer.Option(False, "--no-comm", help="Price every communication at zero (what-if)."),
    compute: str = COMPUTE_OPT,
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write the simulated iteration as a Perfetto trace"
                                         " (see --trace-detail)."),
    trace_detail: str = TRACE_DETAIL_OPT,
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the pipeline Gantt per stage, memory per stage and"
                                        " where the time goes (.svg or .png, by the extension; needs"
                                        " solver-planner[plot])."),
    as_json: bool = JSON_OPT,
) -> None:
    """Cut MODEL's layers into pipeline stages on equal sub-meshes of CLUSTER (or, with
    --meshes unequal, sub-meshes of Alpa's shapes that may differ per stage), choose each
    stage's data x tensor degrees (and recomputation) and the number of micro-batches; every
    candidate is simulated and the fastest wins.  The objective printed is a proven lower
    bound of the simulated time; the bound and gap hold over every plan of the search space.

    Plans use the cluster's first devices, as many as equal meshes can tile (at most
    --devices); the rest idle, and the output says how many and why.

    Memory: at most 8 GiB of address space (tables over every first and last layer: about
    200 layers on 1 024 GPUs); a search that reaches it ends with exit 2, and one whose least
    (mesh, micro-batch) pair would pass it is refused before it starts.

    Exit codes: 0 plan found; 1 no plan is possible (the reason is printed) or proven that none fits in memory (the smallest shortfall is printed); 2 bad spec or option, or an instance the method refuses; 3 no plan found within the limits and none proven impossible.
    """  # noqa: E501 - one line, so that the help text does not break mid-sentence
    from ..memory import STAGES_BOUND, bounded
    from ..stages.report import parse_config, parse_split, plan_stages

    check_output(trace, "--trace")
    check_trace_detail(trace_detail)
    check_plot(plot)
    topo = topology_of(cluster)
    spec = model_of(model)
    try:
        cfg = parse_config(config) if config is not None else None
        with bounded(STAGES_BOUND):
            rep = plan_stages(topo, spec, schedule, method, time_limit, seed, comm=not no_comm, stages=num_stages,
                              top=top, config=cfg, layer_counts=parse_split(split) if split is not None else None,
                              baselines=baselines, budget=budget, simulations=sim_budget, progress=_progress,
                              compute=compute, top_gap=top_gap, target=target, devices=devices,
                              meshes=meshes, gap=gap)
    finally:
        if sys.stderr.isatty():
            typer.echo("\r\x1b[K", err=True, nl=False)
    if trace is not None:
        write_trace(rep.run.timeline, trace, rep.topology, trace_detail, rep.partition.stage_size)
    if plot is not None:
        from ..report.pipeline import plot_pipeline
        from ..stages.memory import stage_memory

        path = plot_pipeline(plot, rep.run, rep.partition.stage_size, rep.device_memory,
                             f"{spec.name} on {topo.name}{rep.use.part}, {rep.best.schedule}",
                             memory=stage_memory(rep.partition, rep.run.peak_memory),
                             reserved=rep.topology.device.reserved)
        typer.echo(f"wrote {path}", err=True)
    data = rep.as_dict()
    if as_json:                         # its "warnings" say what stderr would
        print_json(data)
        return
    warn(data["warnings"])
    _print(data, spec.name, topo.name)


def _print(data: dict, model: str, cluster: str) -> None:
    out = console()
    c = data["config"]
    out.print(f"[bold]{model}[/] on {cluster}: {units.format_count(c['pipeline'], 'stage')} of {units.format_meshes(data['mesh'])} meshes,"
              f" {units.format_count(c['microbatches'], 'micro-batch')} of {data['microbatch_size']}, {data['schedule']}"
              f" (d,t,p,k = {_config(data)})")
    idle = data.get("devices", {})
    if idle.get("idle"):
        out.print(f"  devices: {idle['used']:,} of {idle['devices']:,} used, {idle['idle']:,} idle: {idle['reason']}")
    out.print(_plan_table(data, data["device_memory"]))
    if data["memory_reserved"]:
        out.print(f"  memory / device: of {units.format_bytes(data['device_memory'] + data['memory_reserved'])},"
                  f" {units.format_bytes(data['memory_reserved'])} is reserved (device.memory_reserved)")
    exact = "exact" if data["objective_exact"] else f"lower bound, {data['binding_bound']}"
    out.print(f"  iteration {units.format_time(data['iteration_time'])} (simulated, {data['compute_model']} compute"
              f" model)   objective {units.format_time(data['objective'])} ({exact})   bubble"
              f" {data['bubble_ratio']:.1%}")
    s = data["search"]
    gap = data["gap"]
    out.print(f"  {data['status']} ({data['method']}, bound {units.format_time(data['bound'])}, gap {gap:.2%},"
              f" {units.format_time(data['solve_time'])}; {_work(s)}{s.get('simulations', 0)} simulation(s)"
              f" over {s['pairs']} mesh/micro-batch pairs)")
    if data["status"] == "FEASIBLE" and "stopped_at_gap" in s:
        out.print(f"  stopped within --gap {100 * s['stopped_at_gap']:g}%: the bound had not risen by {s['rise']:.1%}"
                  f" over the last {s['stall']} subspaces (--gap 0 searches on to OPTIMAL or the budgets)")
    elif data["status"] == "FEASIBLE" and s.get("budget_exhausted"):
        out.print("  stopped on its budgets (--budget subspaces, --sim-budget simulated tasks)")
    if "coarse" in s:
        cs = s["coarse"]
        blocks = "/".join(f"{b:,}" for b in cs["blocks"])
        out.print(f"  {cs['layers']:,} layers: stages searched on {blocks} blocks of about equal work (Alpa's"
                  f" operator clustering); the bound {units.format_time(cs['bound'])} holds for every cut")
    if s.get("meshes") == "unequal":
        out.print(f"  unequal meshes (Alpa's space) searched too: {s['unequal_simulated']} more plan(s) simulated; the"
                  f" bound holds over equal and unequal meshes")
    if "best_1f1b" in data:
        b = data["best_1f1b"]
        speed = data["eager_speedup"]
        verdict = (f"eager-1F1B is {speed:.3f}x faster" if speed > 1 + 1e-9
                   else "the 1F1B order is the fastest of the family")
        where = " on equal meshes" if s.get("meshes") == "unequal" else ""
        out.print(f"  best 1F1B plan{where} {units.format_time(b['iteration_time'])} ({b['status']}): {verdict}")
    if len(data.get("top", [])) > 1:
        table = Table("#", "d,t,p,k", "mesh", "layers per stage (chunk)", "memory", "iteration (simulated)", "objective",
                      "schedule", "gap in its pair")
        for n, row in enumerate(data["top"], 1):
            counts = [str(st["layers"][1] - st["layers"][0] + 1) for st in row["stages"]]
            counts = ",".join(counts if len(counts) <= 6 else counts[:3] + ["..."] + counts[-2:])
            gap = "?" if row["pair_gap"] is None else f"{row['pair_gap']:.2%}"
            table.add_row(str(n), _config(row), "x".join(map(str, row["mesh"])), counts,
                          units.format_bytes(row["memory"]), units.format_time(row["iteration_time"]),
                          units.format_time(row["objective"]), row["schedule"], gap)
        out.print(table)
        others = s.get("unlisted_bound")
        if others is not None and others < data["top"][-1]["iteration_time"]:
            out.print(f"  a mesh / micro-batch pair not listed (its share of the budgets ran out) may have a plan"
                      f" as fast as {units.format_time(others)}")
    if "baselines" in data:
        table = Table("baseline", "d,t,p,k", "iteration (simulated)", "best plan is")
        for name, b in data["baselines"].items():
            if b["possible"]:
                cfg = b["config"]
                table.add_row(f"pure {name}", f"{cfg['data']},{cfg['tensor']},{cfg['pipeline']},{cfg['microbatches']}",
                              units.format_time(b["iteration_time"]), f"{b['best_speedup']:.2f}x faster")
            else:
                table.add_row(f"pure {name}", b["config"], "-", b["reason"])
        out.print(table)
