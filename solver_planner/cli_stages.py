"""``solver-planner stages``: cut layers into pipeline stages on sub-meshes.  Thin:
argument parsing and printing only."""

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import units
from .cli_common import JSON_OPT, console, fail, handles_errors, print_json, topology_of
from .simulate import write_chrome_trace
from .spec import load_model_spec
from .stages import METHODS, SCHEDULES
from .stages.report import plan_stages


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        typer.echo(f"\rsolving mesh shape / micro-batch pair {done + 1}/{total}", err=True, nl=False)
        if done + 1 == total:
            typer.echo("", err=True)


@handles_errors
def stages(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False,
                                 help="Model spec with 'layers' (or 'transformer') and 'training'."),
    schedule: str = typer.Option("1f1b", "--schedule", "-s", help=f"Pipeline schedule: {', '.join(SCHEDULES)}."),
    method: str = typer.Option("auto", "--method", "-m",
                               help=f"Partitioner: {', '.join(METHODS)}. auto = CP-SAT on small models, else the"
                                    " exact dynamic program, else the balanced greedy."),
    time_limit: float = typer.Option(10.0, "--time-limit", "-t", min=0.01,
                                     help="CP-SAT seconds per (mesh shape, micro-batch count) pair."),
    seed: int = typer.Option(0, "--seed", help="CP-SAT seed."),
    num_stages: Optional[int] = typer.Option(None, "--stages", min=1,
                                             help="Only plans with this many stages (default: search all)."),
    no_comm: bool = typer.Option(False, "--no-comm", help="Price every communication at zero (what-if)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write the simulated iteration as a Perfetto trace."),
    as_json: bool = JSON_OPT,
) -> None:
    """Cut MODEL's layers into pipeline stages on equal sub-meshes of CLUSTER, choose each
    stage's data x tensor degrees and the number of micro-batches (Alpa's objective,
    sum t_i + (B-1) max t_j), then simulate one iteration under the schedule.

    Exit codes: 0 plan found, 1 no plan fits in memory (the smallest shortfall is printed),
    2 bad spec or option.
    """
    if schedule not in SCHEDULES:
        fail(f"unknown schedule {schedule!r}; expected one of: {', '.join(SCHEDULES)}", 2)
    if method not in METHODS:
        fail(f"unknown method {method!r}; expected one of: {', '.join(METHODS)}", 2)
    topo = topology_of(cluster)
    spec = load_model_spec(model)
    rep = plan_stages(topo, spec, schedule, method, time_limit, seed, comm=not no_comm, stages=num_stages,
                      progress=_progress)
    if trace is not None:
        path = write_chrome_trace(rep.run.timeline, trace, topo)
        typer.echo(f"wrote {path}", err=True)
    data = rep.as_dict()
    if as_json:
        print_json(data)
        return
    out = console()
    out.print(f"[bold]{spec.name}[/] on {topo.name}: {len(data['stages'])} stages of"
              f" {'x'.join(map(str, data['stages'][0]['mesh']))} meshes, {data['microbatches']} micro-batches of"
              f" {data['microbatch_size']}, {schedule}")
    table = Table("stage", "layers", "devices", "data", "tensor", "time / micro-batch", "memory / device",
                  "grad sync")
    for i, row in enumerate(data["stages"]):
        first, last = row["layers"]
        names = row["layer_names"]
        table.add_row(str(i), f"{first}-{last} ({names[0]}..{names[1]})", f"{row['devices'][0]}-{row['devices'][1]}",
                      str(row["data"]), str(row["tensor"]), units.format_time(row["time"]),
                      f"{units.format_bytes(row['memory'])} / {units.format_bytes(data['device_memory'])}",
                      units.format_time(row["gradient_reduction"]))
    out.print(table)
    out.print(f"  iteration {units.format_time(data['iteration_time'])} (simulated)   objective"
              f" {units.format_time(data['objective'])}   bubble {data['bubble_ratio']:.1%}")
    if "hidden_communication" in data:
        out.print(f"  eager-1F1B (eagerness {data['eagerness']}) vs 1F1B"
                  f" {units.format_time(data['iteration_time_1f1b'])}: hides"
                  f" {units.format_time(data['hidden_communication'])} of communication")
    gap = data["gap"]
    out.print(f"  {data['status']} ({data['method']}, gap {gap:.2%}, {units.format_time(data['solve_time'])};"
              f" {data['search']['solved_pairs']} of {data['search']['pairs']} shape/micro-batch pairs solved,"
              f" the rest pruned by a lower bound)")
