"""``solver-planner plan`` and ``solver-planner check``: one verified plan for a whole job.
Thin: argument parsing and printing only (the library is :mod:`solver_planner.plan`)."""

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import units
from ..errors import unknown_choice
from .common import (BUDGET_OPT, COMPUTE_OPT, DEVICES_OPT, GAP_OPT, SIM_BUDGET_OPT, JSON_OPT, TRACE_DETAIL_OPT, check_output, check_plot, check_trace_detail, console,
                     error_object, fail, handles_errors, model_of, print_json, topology_of, warn, write_trace)
from ..choices import CROSS_MESH as STRATEGIES
from ..choices import SCHEDULES
from ..choices import STAGE_METHODS as METHODS


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        typer.echo(f"\r\x1b[K{text}", err=True, nl=False)


@handles_errors
def plan(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False,
                                 help="Model spec with 'layers' (or 'transformer') and 'training'."),
    schedule: Optional[str] = typer.Option(None, "--schedule", "-s", show_default=False,
                                           help=f"Pipeline schedule family: {', '.join(SCHEDULES)} (default eager-1f1b;"
                                           " with --target, the schedule of the fastest plan among those the"
                                           " framework runs)."),
    target: str = typer.Option("native", "--target", help="Plan only what this framework runs: native, megatron,"
                               " torchtitan, deepspeed; the plan file then records the framework's configuration."),
    export: Optional[Path] = typer.Option(None, "--export", help="With --target: write the framework's own"
                                          " configuration here (Megatron-LM arguments, torchtitan launcher"
                                          " arguments, DeepSpeed JSON)."),
    method: str = typer.Option("auto", "--method", "-m", help=f"Stage search: {', '.join(METHODS)}."),
    cross_mesh: str = typer.Option("broadcast", "--cross-mesh",
                                   help="Stage boundaries: broadcast (the resharding paper's schedules), send-recv (Alpa's"
                                        " baseline) or free (Signal Send/Recv: the upper bound)."),
    overlap: bool = typer.Option(True, "--overlap/--no-overlap",
                                 help="Overlap boundary transfers with computation (--no-overlap: each transfer"
                                      " holds both stages' compute streams)."),
    num_stages: Optional[int] = typer.Option(None, "--stages", min=1, help="Only plans with this many stages."),
    candidates: int = typer.Option(1, "--candidates", min=1, max=50,
                                   help="How many of the stage planner's fastest plans to compose with their real"
                                        " boundary schedules; the fastest simulated one wins."),
    config: Optional[str] = typer.Option(None, "--config", help="One configuration d,t,p,k (as for 'stages')."),
    split: Optional[str] = typer.Option(None, "--split", help="Layers per stage, e.g. 10,12,12,10."),
    devices: Optional[int] = DEVICES_OPT,
    meshes: str = typer.Option("equal", "--meshes", help="equal: every stage on one mesh shape; unequal: each stage"
                               " on its own shape of Alpa's set, on up to all the devices (as for stages)."),
    time_limit: float = typer.Option(10.0, "--time-limit", "-t", min=0.001, max=86400,
                                     help="CP-SAT limit per subproblem (roughly seconds)."),
    proof_timeout: float = typer.Option(30.0, "--proof-timeout", min=0.001, max=86400,
                                        help="z3 time limit per gradient program (seconds)."),
    seed: int = typer.Option(0, "--seed", help="Solver seed (one worker: reproducible)."),
    budget: int = BUDGET_OPT,
    sim_budget: int = SIM_BUDGET_OPT,
    gap: float = GAP_OPT,
    compute: str = COMPUTE_OPT,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the plan file (YAML) here."),
    trace: Optional[Path] = typer.Option(None, "--trace",
                                         help="Write the simulated iteration as a Perfetto trace (see"
                                              " --trace-detail)."),
    trace_detail: str = TRACE_DETAIL_OPT,
    emit: Optional[Path] = typer.Option(None, "--emit",
                                        help="Write, into this folder, the specs and commands with which"
                                             " 'solver-planner execute' runs the plan's gradient programs and"
                                             " boundary reshardings on local processes, the plan, launch_from_plan.py (its torchrun launch recipe) and the commands to launch and run it."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the pipeline Gantt per stage, memory per stage and"
                                        " where the iteration goes (.svg or .png, by the extension; needs"
                                        " solver-planner[plot])."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write one self-contained HTML report (summary,"
                                          " every picture, tables, proofs, the commands that reproduce it)."),
    as_json: bool = JSON_OPT,
) -> None:
    """One plan for the whole job: pipeline stages and their (data, tensor) degrees, each
    stage's placement and proven gradient program, a broadcast schedule at every stage
    boundary, and the iteration simulated with all of them (the resharding paper §5.2-5.3).
    Memory: at most 8 GiB of address space, as for 'stages' (exit 2 beyond it).

    Exit codes: 0 plan found; 1 no plan is possible or none fits in memory, or a part could not be proved; 2 bad spec or option, or over the memory bound; 3 a search or proof ran out of time with nothing proven.
    """  # noqa: E501 - one line, so that the help text does not break mid-sentence
    from ..memory import STAGES_BOUND, bounded
    from ..plan import make_plan
    from ..plan.emit import emit_execute_specs
    from ..plan.planfile import plan_document, write_export, write_plan
    from ..stages.report import parse_config, parse_split

    if cross_mesh not in STRATEGIES:
        fail(unknown_choice("--cross-mesh", cross_mesh, STRATEGIES), 2)
    check_output(output, "--output")
    check_output(trace, "--trace")
    check_trace_detail(trace_detail)
    check_output(emit, "--emit", folder=True)
    check_plot(plot)
    check_plot(report, "--report")
    check_output(export, "--export")
    if export is not None and target == "native":
        fail("--export writes a framework's configuration: give --target megatron, torchtitan or deepspeed", 2)
    topo = topology_of(cluster)
    spec = model_of(model)
    try:
        with bounded(STAGES_BOUND, z3=True):
            result = make_plan(topo, spec, schedule, method, cross_mesh, overlap, num_stages,
                               parse_config(config) if config is not None else None,
                               parse_split(split) if split is not None else None, time_limit, seed, proof_timeout,
                               candidates, progress=_progress, compute=compute, target=target, devices=devices,
                               meshes=meshes, budget=budget, simulations=sim_budget, gap=gap)
    finally:
        if sys.stderr.isatty():
            typer.echo("\r\x1b[K", err=True, nl=False)
    doc = write_plan(result, output) if output is not None else plan_document(result)
    if output is not None:
        typer.echo(f"wrote {output}", err=True)
    if not as_json:                     # else its "warnings" say it
        warn(doc["warnings"])
    if export is not None:
        write_export(doc, export)
        typer.echo(f"wrote {export} ({target} configuration)", err=True)
    if trace is not None:
        write_trace(result.run.timeline, trace, result.topology, trace_detail, result.partition.stage_size, links=True)
    if emit is not None:
        emitted = emit_execute_specs(result, cluster, emit, doc, model)
        typer.echo(f"wrote {emit}/commands.yaml ({len(emitted['commands'])} commands)", err=True)
    if plot is not None:
        from ..plan.compose import breakdown
        from ..report.pipeline import plot_pipeline
        from ..stages.memory import stage_memory

        c = result.partition.costs
        path = plot_pipeline(plot, result.run, result.partition.stage_size, c.device_memory,
                             f"{spec.name} on {topo.name}{result.use.part if result.use is not None else ''},"
                             f" {result.schedule}", breakdown(result),
                             stage_memory(result.partition, result.run.peak_memory), result.topology.device.reserved)
        typer.echo(f"wrote {path}", err=True)
    if report is not None:
        import shlex

        from ..report.html import write_plan_report

        again = ["solver-planner"] + [a for a in sys.argv[1:]]
        commands = [" ".join(shlex.quote(a) for a in again)]
        if output is not None:
            commands.append(" ".join(shlex.quote(str(a)) for a in ("solver-planner", "check", cluster, model, output)))
        typer.echo(f"wrote {write_plan_report(report, result, doc, commands)}", err=True)
    invalid = [s for s in result.parts if s.proof == "invalid"]
    undecided = [s for s in result.parts if s.proof == "unknown"]
    error = None
    if invalid:
        error = (f"stage {invalid[0].index}: its gradient program is not a valid all-reduce: {invalid[0].proof_detail}",
                 1)
    elif undecided:
        error = (f"stage {undecided[0].index}: z3 did not prove its gradient program within {proof_timeout:g} s", 3)
    _finish(doc, error, as_json, _print)


def _finish(data: dict, error: tuple[str, int] | None, as_json: bool, show) -> None:
    """Print the result (one JSON object under --json, the error inside it), then exit
    with the error's code after one line on stderr."""
    if as_json:
        print_json({**data, "error": error_object(*error)["error"]} if error else data)
    else:
        show(data)
    if error is not None:
        typer.echo(f"error: {error[0]}", err=True)
        raise typer.Exit(error[1])


def _print(doc: dict) -> None:
    out = console()
    s = doc["schedule"]
    v = s["virtual"]
    chunks = f" x {v} model chunks" if v > 1 else ""
    n = len(doc["stages"]) // v
    out.print(f"[bold]{doc['model']}[/] on {doc['cluster']}: {units.format_count(n, 'stage')}{chunks} of"
              f" {units.format_meshes(doc['mesh'])} meshes, {units.format_count(doc['microbatches'], 'micro-batch')} of"
              f" {doc['microbatch_size']}, {s['kind']}"
              + (f" (eagerness {s['eagerness']}{', weight delay' if s['weight_delay'] else ''})"
                 if s["kind"] == "eager-1f1b" else ""))
    if "idle" in doc:
        idle = doc["idle"]
        out.print(f"  devices: {idle['used']:,} of {doc['devices']:,} used, {idle['devices']:,} idle: {idle['reason']}")
    table = Table("stage" if v == 1 else "stage (chunk)", "layers", "devices", "d", "t", "placement",
                  "gradient program", "proof", "memory")
    for st in doc["stages"]:
        first, last = st["layers"]
        name = str(st["index"]) if v == 1 else f"{st['pipeline_stage']} ({st['index']})"
        table.add_row(name, units.format_span(first, last, st["layer_names"]),
                      units.format_span(st["devices"][0], st["devices"][-1]), str(st["data"]), str(st["tensor"]),
                      str(st["matrix"]).replace(" ", ""), st["gradient_program"], st["proof"],
                      units.format_bytes(st["memory"]))
    out.print(table)
    reserved = f", {units.format_bytes(doc['memory_reserved'])} more reserved" if doc["memory_reserved"] else ""
    out.print(f"  memory: plans fill at most {units.format_bytes(doc['device_memory'])} a device{reserved}")
    if doc["boundaries"]:
        table = Table("boundary", "tensor", "specs", "strategy", "unit tasks", "time / micro-batch", "status")
        for b in doc["boundaries"]:
            table.add_row(f"{b['kind']} {b['src']}->{b['dst']}", f"{b['tensor']['shape']} {b['tensor']['dtype']}",
                          f"{b['src_spec']} -> {b['dst_spec']}", b["strategy"], str(b.get("unit_tasks", "-")),
                          units.format_time(b["time"]), b.get("status", "-"))
        out.print(table)
    bd = doc["breakdown"]
    hid = doc["communication_hidden"]
    out.print(f"  iteration {units.format_time(doc['iteration_time'])} (simulated, {doc['compute']} compute model):"
              f" {doc['throughput']:.1f} samples/s,"
              f" MFU {doc['mfu']:.1%}, bubble {doc['bubble_ratio']:.1%}")
    out.print("  critical path: " + ", ".join(f"{k.replace('_', ' ')} {units.format_time(v)}"
                                            for k, v in bd.items() if v > 0) + " (they add up to the iteration)")
    if doc["boundaries"]:
        out.print(f"  cross-mesh transfers {units.format_time(hid['cross_mesh_total'])} per iteration,"
                  f" {hid['hidden_fraction']:.1%} hidden; with them free the iteration takes"
                  f" {units.format_time(doc['cross_mesh_free_time'])}")
    else:
        out.print("  no cross-mesh transfers (one stage)")
    if doc["cross_mesh"] == "free":
        out.print("  [yellow]cross-mesh communication priced as free[/]: an upper bound on speed (the cross-mesh"
                  " resharding paper's Signal Send/Recv), not a plan to run")
    search = doc["search"]
    if search:
        out.print(f"  stage search {search['status']} ({search['method']}, gap {search['gap']:.2%}); solve times: "
                  + ", ".join(f"{k.replace('_', ' ')} {units.format_time(v)}" for k, v in doc["solve_times"].items()))


@handles_errors
def check(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="Model spec (YAML)."),
    plan_file: Path = typer.Argument(..., dir_okay=False, help="Plan file written by 'plan -o'."),
    proof_timeout: float = typer.Option(30.0, "--proof-timeout", min=0.001, max=86400,
                                        help="z3 time limit per gradient program (seconds)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Re-check a plan file against CLUSTER and MODEL: every gradient program proved again
    with z3, every boundary schedule re-checked and replayed, the iteration simulated again
    and compared with the recorded times and memory.

    Exit codes: 0 every part holds; 1 a part does not (the first is named); 2 unreadable plan file or spec; 3 a proof timed out.
    """  # noqa: E501
    rep = checked_plan(cluster, model, plan_file, proof_timeout)[2]

    def show(_data) -> None:
        out = console()
        colours = {"ok": "green", "fail": "red", "unknown": "yellow", "skipped": "yellow"}
        marks = {k: " " * (8 - len(k)) + f"[{c}]{'FAIL' if k == 'fail' else k}[/]" for k, c in colours.items()}
        shown: dict[str, int] = {}
        for f in rep.findings:
            shown[f.part] = shown.get(f.part, 0) + 1
            if f.status == "fail" and shown[f.part] > MAX_FAILURES_SHOWN:
                continue
            out.print(f"{marks[f.status]}  {_where(f)}{f.message}", highlight=False, soft_wrap=True)
        for part, n in shown.items():
            hidden = sum(1 for f in rep.findings if f.part == part and f.status == "fail") - MAX_FAILURES_SHOWN
            if hidden > 0:
                out.print(f"{marks['fail']}  {part}: {hidden} more failing field(s) (--json lists them all)",
                          soft_wrap=True)

    first = rep.first_failure
    error = (f"{_where(first)}{first.message}", 1) if first is not None else \
        ("a proof timed out; nothing failed", 3) if rep.exit_code == 3 else None
    _finish(rep.as_dict(), error, as_json, show)


def checked_plan(cluster: Path, model: Path, plan_file: Path, proof_timeout: float = 30.0):
    """(topology, model spec, :class:`~solver_planner.plan.check.CheckReport`) of a plan file;
    exit 2 when a file cannot be read.  The check runs the stage search again, under the
    memory bound of ``plan`` (8 GiB)."""
    from ..memory import STAGES_BOUND, bounded
    from ..plan.check import check_plan
    from ..plan.planfile import PlanFileError, read_plan

    topo = topology_of(cluster)
    spec = model_of(model)
    try:
        doc = read_plan(plan_file)
    except PlanFileError as exc:
        fail(str(exc), 2, exc)
    with bounded(STAGES_BOUND, z3=True):
        return topo, spec, check_plan(topo, spec, doc, proof_timeout)


MAX_FAILURES_SHOWN = 8    # per part, in the human output (the JSON has all)


def _where(finding) -> str:
    """``part: path: `` once each (the path alone when it starts with the part's name)."""
    if not finding.path:
        return f"{finding.part}: "
    if finding.path.split(".")[0].split("[")[0] == finding.part:
        return f"{finding.path}: "
    return f"{finding.part}: {finding.path}: "
