"""``solver-planner place`` and ``solver-planner reduce synth|verify``: placements and
reduction programs (seed 000).  Thin: argument parsing and printing only."""

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import units
from .cost import CostModel
from .placement import ParallelismMatrix
from .reduction import format_program, parse_program
from .reduction.explicit import load_explicit_program
from .reduction.ranking import check_placeable, lowering_for, rank_placements, reduce_on_placement
from .reduction.verify import system_steps, verify_steps
from .spec import load_model_spec
from .cli_common import JSON_OPT, console, fail, handles_errors, print_json, topology_of

reduce_app = typer.Typer(help="Synthesize and verify reduction programs (seed 000).", no_args_is_help=True)

MAX_SIZE_OPT = typer.Option(5, "--max-size", min=1, max=8, help="Largest program size to synthesize.")
ALGO_OPT = typer.Option("ring", "--algorithm", "-a", help="NCCL algorithm the cost model assumes: ring or tree.")
MATRIX_OPT = typer.Option(None, "--matrix", "-m",
                          help="Placement as [[...],...] (rows = axes, columns = levels); default: the best-ranked one.")
REDUCTION_OPT = typer.Option(None, "--reduction", "-r", help="Which reduction of the model spec; default: the first.")


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


def _load(cluster: Path, model: Path):
    topo = topology_of(cluster)
    spec = load_model_spec(model)
    check_placeable(topo, spec)
    return topo, spec


def _reduction(spec, name):
    if not spec.reductions:
        raise spec.source.error(("reductions",), "the model spec asks for no reduction")
    if name is None:
        return spec.reductions[0]
    for red in spec.reductions:
        if red.name == name:
            return red
    fail(f"no reduction named {name!r}; the model has: {', '.join(r.name for r in spec.reductions)}", 2)


def _matrix(topo, spec, text, algorithm):
    if text is None:
        reports, _ = rank_placements(topo, spec, algorithm=algorithm, progress=_progress("ranking placements"))
        if not reports:
            fail("no placement satisfies the model's constraints", 1)
        return reports[0].matrix
    try:
        matrix = ParallelismMatrix.parse(text)
        matrix.check(spec.axis_sizes, [lv.count for lv in topo.levels])
    except ValueError as exc:
        fail(str(exc), 2)
    return matrix


def read_program(topo, lowering, program: str):
    """PROGRAM as ``(steps, labels, title)``: a YAML file of explicit steps (labels None) or DSL text."""
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
    method: str = typer.Option("auto", "--method", help="Placement search: auto, cp-sat or enumerate."),
    max_size: int = MAX_SIZE_OPT,
    algorithm: str = ALGO_OPT,
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Show only the best N placements."),
    as_json: bool = JSON_OPT,
) -> None:
    """Every placement, ranked by the cost of its best reduction programs.

    For each placement and reduction: the time of a single AllReduce, the best
    synthesized program and its time, and how many valid programs were synthesized.
    """
    topo, spec = _load(cluster, model)
    if method not in ("auto", "cp-sat", "enumerate"):
        fail(f"unknown method {method!r}; expected auto, cp-sat or enumerate", 2)
    if algorithm not in ("ring", "tree"):
        fail(f"unknown algorithm {algorithm!r}; expected ring or tree", 2)
    reports, result = rank_placements(topo, spec, method, max_size, algorithm, progress=_progress("ranking placements"))
    if not reports:
        fail("no placement satisfies the model's constraints (the matrices' rows must multiply to the axis sizes"
             " and columns to the level counts)", 1)
    shown = reports[:top] if top else reports
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
                          units.format_time(red.allreduce.time), red.best.text, units.format_time(red.best.time),
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
    algorithm: str = ALGO_OPT,
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Show only the N fastest programs."),
    as_json: bool = JSON_OPT,
) -> None:
    """The valid reduction programs of one placement, fastest first, with their times."""
    topo, spec = _load(cluster, model)
    red = _reduction(spec, reduction)
    chosen = _matrix(topo, spec, matrix, algorithm)
    rep = reduce_on_placement(topo, spec, chosen, red, max_size, algorithm, CostModel(topo))
    shown = rep.programs[:top] if top else rep.programs
    if as_json:
        print_json({"matrix": chosen.as_lists(), "reduction": red.name, "hierarchy": str(rep.hierarchy),
                    "allreduce_time": rep.allreduce.time, "count": len(rep.programs),
                    "programs": [{"program": p.text, "time": p.time, "step_times": p.step_times} for p in shown]})
        return
    con = console()
    con.print(f"placement {chosen}, reduction '{red.name}' over {', '.join(red.axes)}"
              f" ({units.format_bytes(red.bytes)} per device); synthesis hierarchy {rep.hierarchy}")
    table = Table(title=f"{len(rep.programs)} valid programs of size <= {max_size};"
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
    matrix: Optional[str] = MATRIX_OPT,
    reduction: Optional[str] = REDUCTION_OPT,
    engine: str = typer.Option("z3", "--engine", help="z3 (a proof) or semantics (runs the rules)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds z3 may take before answering unknown."),
    as_json: bool = JSON_OPT,
) -> None:
    """Prove a reduction program valid for a placement, or show the counterexample.

    Exit 0 and 'valid' when proven; 1 with the first violated rule (step, device group,
    device, chunk) when invalid; 3 when the solver could not decide in the time limit.
    """
    topo, spec = _load(cluster, model)
    red = _reduction(spec, reduction)
    chosen = _matrix(topo, spec, matrix, "ring")
    lowering = lowering_for(topo, spec, chosen, red)
    steps, labels, _ = read_program(topo, lowering, program)
    form = "DSL program" if labels is not None else f"explicit steps from {program}"
    if engine == "z3":
        from .reduction.proof import verify_z3

        verdict = verify_z3(lowering, steps, timeout)
    elif engine == "semantics":
        verdict = verify_steps(lowering, steps)
    else:
        fail(f"unknown engine {engine!r}; expected z3 or semantics", 2)
    if as_json:
        print_json({"matrix": chosen.as_lists(), "reduction": red.name, "program": form, **verdict.as_dict()})
    else:
        typer.echo(f"placement {chosen}, reduction '{red.name}', {form}: {verdict.status}"
                   f" ({verdict.engine}, {units.format_time(verdict.wall_time)}{', ' + verdict.detail if verdict.detail else ''})")
        if verdict.violation is not None:
            typer.echo(f"counterexample: {verdict.violation}")
    raise typer.Exit({"valid": 0, "invalid": 1}.get(verdict.status, 3))
