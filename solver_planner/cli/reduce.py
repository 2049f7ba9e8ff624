"""``solver-planner place`` and ``solver-planner reduce synth|verify``: placements and
reduction programs (P²).  Thin: argument parsing and printing only."""

import math
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import units
from ..choices import SIZE_METRICS as METRICS
from ..choices import ENGINES
from ..errors import unknown_choice
from ..memory import MEMORY_BOUND, bounded, verify_estimate
from ..memory import check as check_memory
from .common import JSON_OPT, check_plot, console, fail, handles_errors, model_of, print_json, topology_of

reduce_app = typer.Typer(help="Synthesize and verify reduction programs (P²).", no_args_is_help=True,
                         rich_markup_mode=None)

MAX_SIZE_OPT = typer.Option(5, "--max-size", min=1, max=8, help="Largest program size to synthesize.")
METRIC_OPT = typer.Option("instructions", "--size-metric",
                          help="How program size is counted: 'instructions' (each counts 1) or 'paper' (P²'s"
                               " space: InsideGroup 1, Parallel/Master 2, R-Broadcast verbatim).")
ALGO_OPT = typer.Option("ring", "--algorithm", "-a", help="NCCL algorithm the cost model assumes: ring or tree.")
MATRIX_OPT = typer.Option(None, "--matrix",
                          help="Placement as [[...],...] (rows = axes, columns = levels); default: the best-ranked one.")
VERIFY_MATRIX_OPT = typer.Option(None, "--matrix",
                                 help="Placement as [[...],...] (rows = axes, columns = levels); default: the best"
                                      " under the placement solver's proxy objective (no program is synthesized).")
REDUCTION_OPT = typer.Option(None, "--reduction", "-r", help="Which reduction of the model spec; default: the first.")
PLOT_HELP = " (.svg or .png, by the extension; needs solver-planner[plot])."


def _wrote(path) -> None:
    typer.echo(f"wrote {path}", err=True)


def _progress(label: str):
    """A progress bar on stderr when it is a terminal; otherwise nothing."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)
        if done + 1 >= total:
            bar.stop()

    return update


def _check_choices(algorithm: str, size_metric: str) -> None:
    if algorithm not in ("ring", "tree"):
        fail(f"unknown algorithm {algorithm!r}; expected ring or tree", 2)
    if size_metric not in METRICS:
        fail(f"unknown size metric {size_metric!r}; expected {' or '.join(METRICS)}", 2)


def _load(cluster: Path, model: Path):
    from ..reduction.ranking import check_placeable
    topo = topology_of(cluster)
    spec = model_of(model)
    check_placeable(topo, spec)
    return topo, spec


def _ranked(topo, spec, algorithm):
    """Every placement ranked (for the best-ranked default of --matrix), best first."""
    from ..reduction.ranking import rank_placements
    reports, _ = rank_placements(topo, spec, algorithm=algorithm, progress=_progress("ranking placements"),
                                 memory_bound=MEMORY_BOUND)
    if not reports:
        fail("no placement satisfies the model's constraints", 1)
    return reports


def _matrix(topo, spec, text, algorithm):
    from ..placement import ParallelismMatrix
    if text is None:
        return _ranked(topo, spec, algorithm)[0].matrix
    try:
        matrix = ParallelismMatrix.parse(text)
        matrix.check(spec.axis_sizes, [lv.count for lv in topo.levels])
    except ValueError as exc:
        fail(str(exc), 2)
    return matrix


def _verify_matrix(topo, spec, text) -> tuple:
    """The placement to prove on and how it was chosen: ``--matrix``, else the solver's best
    under the proxy objective (a proof is about one placement; ranking them all by their
    synthesized programs would cost far more than the proof)."""
    from ..reduction.ranking import proxy_placement
    if text is not None:
        return _matrix(topo, spec, text, "ring"), "given"
    chosen, result = proxy_placement(topo, spec)
    if chosen is None:
        fail("no placement satisfies the model's constraints", 1)
    return chosen, f"the best under the placement solver's proxy objective ({result.method}; give --matrix to choose)"


def read_program(topo, lowering, program: str):
    """PROGRAM as ``(steps, labels, title)``: a YAML file of explicit steps (labels None) or DSL text."""
    from ..reduction import format_program, parse_program
    from ..reduction.explicit import load_explicit_program
    from ..reduction.verify import system_steps

    path = Path(program)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_explicit_program(path, topo.num_devices), None, f"explicit steps from {path}"
    try:
        parsed = parse_program(program)
        steps = system_steps(lowering, parsed)
    except ValueError as exc:
        fail(str(exc), 2)
    return steps, [str(i) for i in parsed], format_program(parsed)


def place(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML).", show_default=False),
    model: Path = typer.Argument(..., help="Model spec with parallelism axes and reductions.", show_default=False),
    method: str = typer.Option("auto", "--method", "-m", help="Placement search: auto, cp-sat or enumerate."),
    max_size: int = MAX_SIZE_OPT,
    size_metric: str = METRIC_OPT,
    algorithm: str = ALGO_OPT,
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Show only the best N placements."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the best placement's device map per axis, its"
                                        " best programs' groups, and AllReduce vs best program per placement"
                                        + PLOT_HELP),
    as_json: bool = JSON_OPT,
) -> None:
    """Every placement, ranked by the cost of its best reduction programs.

    For each placement and reduction: the time of a single AllReduce, the best
    synthesized program and its time, and how many valid programs were synthesized.
    Memory: at most 2 GiB; a ranking estimated to need more is refused before it starts
    (exit 2).
    """
    from ..reduction.ranking import rank_placements

    if method not in ("auto", "cp-sat", "enumerate"):
        fail(unknown_choice("method", method, ("auto", "cp-sat", "enumerate")), 2)
    _check_choices(algorithm, size_metric)
    check_plot(plot)
    topo, spec = _load(cluster, model)
    with bounded():
        reports, result = rank_placements(topo, spec, method, max_size, algorithm,
                                          progress=_progress("ranking placements"), metric=size_metric,
                                          memory_bound=MEMORY_BOUND)
    if not reports:
        fail("no placement satisfies the model's constraints (the matrices' rows must multiply to the axis sizes"
             " and columns to the level counts)", 1)
    shown = reports[:top] if top else reports
    if plot is not None:
        from ..report.placement import plot_placements

        _wrote(plot_placements(plot, topo, spec, reports))
    if as_json:
        print_json({"cluster": topo.name, "model": spec.name, "levels": list(topo.level_names),
                    "axes": spec.axis_names, "method": result.method, "solve_time": result.wall_time,
                    "count": len(reports), "algorithm": algorithm, "placements": [r.as_dict() for r in shown]})
        return
    table = Table(title=f"{spec.name} on {topo.name}: {len(reports)} placements (rows {', '.join(spec.axis_names)};"
                        f" columns {', '.join(topo.level_names)}), found by {result.method}")
    for col in ("#", "matrix", "reduction", "AllReduce", "best program", "best", "speedup", "programs"):
        table.add_column(col)
    if not spec.reductions:
        table.caption = "the model requests no reduction, so the placements are not ranked"
    for rank, rep in enumerate(shown, 1):
        if not rep.reductions:
            table.add_row(str(rank), str(rep.matrix), "-", "-", "-", "-", "-", "-")
        for n, red in enumerate(rep.reductions):
            table.add_row(str(rank) if n == 0 else "", str(rep.matrix) if n == 0 else "", red.name,
                          units.format_time(red.allreduce.time),
                          "none needed (one device per group)" if red.nothing_to_reduce else red.best.text,
                          units.format_time(red.best.time),
                          f"{red.speedup:.2f}x", str(len(red.programs)))
    console().print(table)


@reduce_app.command("synth")
@handles_errors
def synth(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML).", show_default=False),
    model: Path = typer.Argument(..., help="Model spec (YAML).", show_default=False),
    matrix: Optional[str] = MATRIX_OPT,
    reduction: Optional[str] = REDUCTION_OPT,
    max_size: int = MAX_SIZE_OPT,
    size_metric: str = METRIC_OPT,
    algorithm: str = ALGO_OPT,
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Show only the N fastest programs."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the fastest program step by step: its device"
                                        " groups and the bytes each device holds" + PLOT_HELP),
    as_json: bool = JSON_OPT,
) -> None:
    """The valid reduction programs of one placement, fastest first, with their times.

    Memory: at most 2 GiB; a synthesis estimated to need more is refused before it starts
    (exit 2).
    """
    from ..cost import CostModel
    from ..reduction.ranking import lowering_for, reduce_on_placement, reduction_named
    from ..reduction.synthesis import DEFAULT_MAX_SIZE
    from ..reduction.verify import system_steps

    _check_choices(algorithm, size_metric)
    check_plot(plot)
    topo, spec = _load(cluster, model)
    red = reduction_named(spec, reduction)
    with bounded():
        if matrix is None and (max_size, size_metric) == (DEFAULT_MAX_SIZE, "instructions"):
            # the ranking synthesized exactly these programs on its best placement: reuse them
            best = _ranked(topo, spec, algorithm)[0]
            chosen, rep = best.matrix, best.reductions[spec.reductions.index(red)]
        else:
            chosen = _matrix(topo, spec, matrix, algorithm)
            rep = reduce_on_placement(topo, spec, chosen, red, max_size, algorithm, CostModel(topo),
                                      metric=size_metric, memory_bound=MEMORY_BOUND)
    shown = rep.programs[:top] if top else rep.programs
    if plot is not None:
        from ..report.program import plot_program

        best = rep.best
        lowering = lowering_for(topo, spec, chosen, red)
        _wrote(plot_program(plot, topo, system_steps(lowering, best.program), lowering.hierarchy.size, red.bytes,
                            f"{best.text} on placement {chosen} ({units.format_time(best.time)})",
                            [str(i) for i in best.program], best.step_times))
    if as_json:
        print_json({"matrix": chosen.as_lists(), "reduction": red.name, "hierarchy": str(rep.hierarchy),
                    "size_metric": size_metric, "max_size": max_size,
                    "allreduce_time": rep.allreduce.time, "count": len(rep.programs),
                    "programs": [{"program": p.text, "time": p.time, "step_times": p.step_times} for p in shown]})
        return
    con = console()
    con.print(f"placement {chosen}, reduction '{red.name}' over {', '.join(red.axes)}"
              f" ({units.format_bytes(red.bytes)} per device); synthesis hierarchy {rep.hierarchy}")
    if rep.nothing_to_reduce:
        con.print("nothing to reduce: every group of the reduction holds one device, so no program is needed")
        return
    table = Table(title=f"{len(rep.programs)} valid programs of size <= {max_size} ({size_metric});"
                        f" AllReduce alone takes {units.format_time(rep.allreduce.time)}")
    for col in ("#", "program", "time", "speedup"):
        table.add_column(col)
    for n, p in enumerate(shown, 1):
        table.add_row(str(n), p.text, units.format_time(p.time),
                      f"{rep.allreduce.time / p.time:.2f}x" if p.time > 0 else "-")
    con.print(table)


@reduce_app.command("verify")
@handles_errors
def verify(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML).", show_default=False),
    model: Path = typer.Argument(..., help="Model spec (YAML).", show_default=False),
    program: str = typer.Argument(..., help="DSL text, e.g. 'Reduce(node, InsideGroup); ...', or a YAML file of"
                                             " explicit steps.", show_default=False),
    matrix: Optional[str] = VERIFY_MATRIX_OPT,
    reduction: Optional[str] = REDUCTION_OPT,
    engine: str = typer.Option("z3", "--engine", help="z3 (a proof over symbolic data) or semantics (the rules)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds z3 may take before answering unknown (> 0)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the program step by step, the counterexample"
                                        " highlighted" + PLOT_HELP),
    as_json: bool = JSON_OPT,
) -> None:
    """Prove a reduction program valid for a placement, or show the counterexample.

    Valid: every device ends with the exact sum over its reduction group, whatever the
    data, the way the collective library computes it (README: "What a program means").
    Exit 0 and 'valid' when proved; 1 with the step, group, device and chunk where it
    goes wrong when invalid; 3 when z3 could not decide within --timeout.  Memory: at most
    2 GiB; a program estimated to need more is refused before it is decided (exit 2).
    """
    from ..reduction import format_program, parse_program
    from ..reduction.ranking import lowering_for, reduction_named
    from ..reduction.verify import verify_steps

    if not (math.isfinite(timeout) and timeout > 0):
        fail(f"--timeout must be a positive number of seconds, not {timeout}", 2)
    if engine not in ENGINES:
        fail(unknown_choice("engine", engine, ENGINES), 2)
    check_plot(plot)
    topo, spec = _load(cluster, model)
    red = reduction_named(spec, reduction)
    check_memory(verify_estimate(topo.num_devices), "verifying on this cluster")
    chosen, how = _verify_matrix(topo, spec, matrix)
    with bounded(z3=engine == "z3"):
        lowering = lowering_for(topo, spec, chosen, red)
        steps, labels, _ = read_program(topo, lowering, program)
        form = "DSL program" if labels is not None else f"explicit steps from {program}"
        if engine == "z3":
            from ..reduction.proof import verify_z3

            verdict = verify_z3(lowering, steps, timeout, MEMORY_BOUND)
        else:
            verdict = verify_steps(lowering, steps, MEMORY_BOUND)
    if plot is not None:
        from ..report.program import plot_program

        _wrote(plot_program(plot, topo, steps, lowering.hierarchy.size, red.bytes,
                            f"{form if labels is None else format_program(parse_program(program))}"
                            f" on placement {chosen}", labels, verdict=verdict))
    if as_json:
        print_json({"matrix": chosen.as_lists(), "matrix_chosen": how, "reduction": red.name, "program": form,
                    **verdict.as_dict()})
    else:
        status = {"valid": "valid: every device ends with its group's exact sum, for any data",
                  "invalid": "invalid", "unknown": "unknown: not decided within the time limit (nothing proved)"}
        if how != "given":
            typer.echo(f"placement {chosen}: {how}")
        typer.echo(f"placement {chosen}, reduction '{red.name}', {form}: {status[verdict.status]}"
                   f" ({verdict.engine}, {units.format_time(verdict.wall_time)}"
                   f"{', ' + verdict.detail if verdict.detail else ''})")
        if verdict.violation is not None:
            typer.echo(f"counterexample: {verdict.violation}")
        if verdict.failure is not None and verdict.failure != verdict.violation:
            typer.echo(f"so at the end: {verdict.failure}")
        for w in verdict.warnings:
            typer.echo(f"note: {w} (P²'s Fig. 8 rejects this step, but it does not change the result: a wasted"
                       " step)")
        for c in verdict.local_copies:
            who = ", ".join(f"{what} on devices {units.format_rows(tuple(c[what]))}" for what in ("pack", "unpack")
                            if c[what])
            typer.echo(f"local copies on torch.distributed (ranks ordered ascending, chunks at their own offsets):"
                       f" step {c['step']} group {c['group']}: {who}")
    raise typer.Exit({"valid": 0, "invalid": 1}.get(verdict.status, 3))
