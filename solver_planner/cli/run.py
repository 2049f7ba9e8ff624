"""``solver-planner run``: train a checked plan on local processes.  Thin: parsing and printing."""

import sys
from pathlib import Path

import typer
from rich.table import Table

from .. import units
from .common import JSON_OPT, console, fail, handles_errors, print_json


@handles_errors
def run(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="Model spec (YAML)."),
    plan_file: Path = typer.Argument(..., dir_okay=False, help="Plan file written by 'plan -o'."),
    steps: int = typer.Option(3, "--steps", min=1, max=10_000, help="Training steps."),
    backend: str = typer.Option("gloo", "--backend", help="gloo (CPU processes), nccl (a GPU per rank) or auto."),
    compare: bool = typer.Option(True, "--compare/--no-compare",
                                 help="Also train the model in this process and compare every step's loss and every"
                                      " parameter with it."),
    timeout: float = typer.Option(30.0, "--timeout", min=1.0, max=86400,
                                  help="Seconds a collective may wait before the run is stopped (a dead or stuck"
                                       " rank)."),
    max_ranks: int = typer.Option(0, "--max-ranks", min=0,
                                  help="Refuse plans needing more local processes (0: what this machine's memory"
                                       " hosts)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the data."),
    as_json: bool = JSON_OPT,
) -> None:
    """Train MODEL for --steps steps exactly as PLAN_FILE says, one local process per device
    of CLUSTER: its stages as torch.distributed.pipelining stages with torch's schedule (GPipe,
    1F1B, or eager-1F1B and ZB-H1 as action lists; not the chunked interleaved 1F1B and
    ZB-V), tensor parallelism with
    torch.distributed.tensor.parallel, the plan's proven gradient program over each stage's
    data-parallel groups, its broadcast schedule at every stage boundary, FSDP2 where the plan
    shards the optimizer, activation checkpointing where it recomputes.  The plan is checked
    first ('check'); each step's loss and the final parameters are compared with one process
    training the same model on the same data.

    Exit codes: 0 trained; 1 the plan fails 'check', or a rank failed (named, with its step);
    2 bad spec or plan file, a model or plan that run cannot build, or more processes than
    this machine hosts.
    """
    from ..distributed.launch import require_torch

    require_torch()              # before anything imports it: one line and exit 2 without it
    from ..run.job import run_job
    from ..run.launch import process_limit, run_plan
    from .plan import _where, checked_plan

    _, spec, report = checked_plan(cluster, model, plan_file)
    if report.exit_code != 0 or report.plan is None:
        first = report.first_failure
        why = f"{_where(first)}{first.message}" if first is not None else "a proof timed out"
        fail(f"check refuses the plan ({why}); run trains only plans that check accepts", 1)
    job = run_job(report.plan, spec, steps=steps, seed=seed)
    limit = max_ranks or process_limit()
    if not as_json:
        for note in job.notes:
            print(f"note: {note}", file=sys.stderr)
    result = run_plan(job, backend, timeout=timeout, compare=compare, limit=limit,
                      on_step=_progress(steps, job.world) if sys.stderr.isatty() and not as_json else None)
    data = result.as_dict()
    if as_json:
        print_json(data)
        return
    _show(data)


def _progress(steps: int, world: int):
    """A progress bar on stderr, advanced as the last stage finishes each step."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(f"training on {world} processes"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("steps", total=steps)
    bar.start()

    def on_step(step: int) -> None:
        bar.update(task, completed=step + 1)
        if step + 1 >= steps:
            bar.stop()

    return on_step


def _show(data: dict) -> None:
    out = console()
    table = Table(title=f"{data['world']} {data['backend']} processes, {data['schedule']}, "
                        f"{units.format_count(data['microbatches'], 'micro-batch')} of"
                        f" {data['microbatch_size']}")
    for col in ("step", "loss", "one process", "relative difference", "time"):
        table.add_column(col, justify="right")
    for s in data["steps"]:
        ref = s["reference_loss"]
        diff = "" if ref is None else f"{abs(s['loss'] - ref) / max(abs(ref), 1e-12):.1e}"
        table.add_row(str(s["step"]), f"{s['loss']:.6f}", "" if ref is None else f"{ref:.6f}", diff,
                      units.format_time(s["time"]))
    out.print(table)
    if data["max_parameter_difference"] is not None:
        out.print(f"  parameters after the last step: largest relative difference from one process"
                  f" {data['max_parameter_difference']:.1e} ({data['worst_parameter']})", highlight=False)
    out.print(f"  step time: measured {units.format_time(data['measured_step_time'])} (median after the first"
              f" step), predicted {units.format_time(data['predicted_iteration_time'])}", highlight=False)
