"""``solver-planner reshard``: cross-mesh resharding schedules (the resharding paper).  Thin: argument
parsing and printing only."""

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import units
from ..errors import unknown_choice
from .common import JSON_OPT, check_output, check_plot, console, fail, handles_errors, model_of, print_json, topology_of
from ..choices import RESHARD_METHODS as METHODS
from ..choices import RESHARD_STRATEGIES

ROWS_SHOWN = 24


def _say(message: str) -> None:
    if sys.stderr.isatty():
        typer.echo(message, err=True)


@handles_errors
def reshard(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="Model spec with a 'resharding:' list."),
    method: str = typer.Option("auto", "--method", "-m",
                               help=f"Scheduler: {', '.join(METHODS)}. auto = CP-SAT up to 256 unit tasks, else"
                                    " dispatching improved by CP-SAT on tail windows."),
    strategy: str = typer.Option("broadcast", "--strategy", "-s",
                                 help="How one slice reaches its receivers: "
                                      + ", ".join(RESHARD_STRATEGIES) + "."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Plan only this resharding of the model."),
    time_limit: float = typer.Option(10.0, "--time-limit", "-t", min=0.01, max=86400,
                                     help="Budget of CP-SAT (its deterministic time, about seconds) or the DFS."),
    seed: int = typer.Option(0, "--seed", help="Seed of the randomized greedy and of CP-SAT."),
    workers: int = typer.Option(1, "--workers", min=1, help="CP-SAT search workers; more prove optimality faster,"
                                " but only 1 gives the same plan on every run."),
    all_rows: bool = typer.Option(False, "--all", help=f"Print every unit task (default: the first {ROWS_SHOWN})."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write the replayed schedule as a Perfetto trace."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw a Gantt chart per port of each schedule beside the"
                                        " naive one (.svg or .png, by the extension; needs solver-planner[plot])."),
    as_json: bool = JSON_OPT,
) -> None:
    """Schedule each cross-mesh resharding of MODEL on CLUSTER: which host sends each slice,
    to whom and when (the resharding paper §3), checked by replaying it in the simulator.

    With --json, one resharding prints {"tasks", "makespan", "lower_bound", "status",
    "method", "solve_time", "schedule": [...], ...}; several print {"reshardings": [...]}.
    """
    from ..cost import CostModel
    from ..resharding import check, plan_resharding, problems_from_model, replay, report
    from ..simulate import Simulation, write_chrome_trace

    if method not in METHODS:
        fail(unknown_choice("method", method, METHODS), 2)
    if strategy not in set(RESHARD_STRATEGIES):
        fail(unknown_choice("strategy", strategy, RESHARD_STRATEGIES), 2)
    check_output(trace, "--trace")
    check_plot(plot)
    topo = topology_of(cluster)
    spec = model_of(model)
    cost = CostModel(topo)
    reports, results, sim, offset = [], [], Simulation(), 0.0
    for problem in problems_from_model(spec, topo, name):
        result = plan_resharding(problem, cost, method, strategy, time_limit, seed, workers, progress=_say)
        check(result.solution, cost)
        reports.append(report(result, cost))
        results.append(result)
        replay(result.solution, cost, sim, offset)
        offset += result.objective
    if trace is not None:
        path = write_chrome_trace(sim.run(), trace, topo)
        typer.echo(f"wrote {path}", err=True)
    if plot is not None:
        from ..report.resharding import plot_resharding

        typer.echo(f"wrote {plot_resharding(plot, results, topo)}", err=True)
    if as_json:
        print_json(reports[0] if len(reports) == 1 else {"reshardings": reports})
        return
    for rep in reports:
        _print(rep, all_rows)


def _print(rep: dict, all_rows: bool) -> None:
    out = console()
    src, dst = rep["src"], rep["dst"]
    shape = "x".join(map(str, rep["tensor"]["shape"]))
    out.print(f"[bold]{rep['name']}[/]: {shape} {rep['tensor']['dtype']} ({units.format_bytes(rep['tensor']['bytes'])}),"
              f" {_mesh(src)} -> {_mesh(dst)}, {rep['strategy']}")
    for note in rep["padding"]:
        out.print(f"  padding: {note}")
    table = Table("slice", "bytes", "sender", "receiver hosts", "start", "end")
    rows = rep["schedule"] if all_rows else rep["schedule"][:ROWS_SHOWN]
    for row in rows:
        table.add_row(row["slice"], units.format_bytes(row["bytes"]), f"host {row['sender_host']} (dev {row['sender_device']})",
                      ",".join(map(str, row["receiver_hosts"])), units.format_time(row["start"]),
                      units.format_time(row["end"]))
    out.print(table)
    if len(rows) < len(rep["schedule"]):
        out.print(f"  ... {len(rep['schedule']) - len(rows)} more unit tasks (--all shows them)")
    gap = rep["gap"]
    out.print(f"  unit tasks {rep['tasks']}   makespan {units.format_time(rep['makespan'])}   lower bound"
              f" {units.format_time(rep['lower_bound'])}   gap {gap:.2%}   {rep['status']} ({rep['method']},"
              f" {units.format_time(rep['solve_time'])})")
    sp = rep["speedup"]
    out.print(f"  speedup: {sp['naive']:.2f}x over the naive schedule, {sp['send_recv']:.2f}x over send/recv,"
              f" {sp['local_allgather']:.2f}x over local all-gather (Alpa)")
    moved = rep["bytes"]
    out.print(f"  bytes: tensor {units.format_bytes(moved['tensor'])}, across meshes"
              f" {units.format_bytes(moved['cross_mesh'])}, between hosts {units.format_bytes(moved['between_hosts'])}")


def _mesh(side: dict) -> str:
    rows, cols = side["mesh"]
    return f"{rows}x{cols} mesh on hosts {','.join(map(str, side['hosts']))} {'[' + ','.join(side['spec']) + ']'}"
