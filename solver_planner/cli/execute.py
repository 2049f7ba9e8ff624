"""``solver-planner execute reduction|reshard``: run lowered plans on local processes with
torch.distributed and check them.  Thin: argument parsing and printing only."""

import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import units
from ..errors import unknown_choice
from .common import JSON_OPT, check_output, console, fail, handles_errors, model_of, print_json, topology_of
from .reduce import MATRIX_OPT, MAX_SIZE_OPT, REDUCTION_OPT, _load, _matrix, read_program
from ..choices import RESHARD_METHODS as METHODS

execute_app = typer.Typer(help="Run plans on local processes with torch.distributed and check every rank.",
                          no_args_is_help=True, rich_markup_mode=None)

# One process per device on this machine: more than this is refused unless asked for.
MAX_RANKS = 16

BACKEND_OPT = typer.Option("auto", "--backend", help="gloo (CPU), nccl (a GPU per rank) or auto.")
REPEAT_OPT = typer.Option(3, "--repeat", min=1, help="Timed runs of each plan; times are their medians.")
WARMUP_OPT = typer.Option(1, "--warmup", min=0, help="Untimed runs before them.")
TIMEOUT_OPT = typer.Option(300.0, "--timeout", min=1.0, help="Seconds before a hung job is stopped.")
EMIT_OPT = typer.Option(None, "--emit", help="Write the lowered plans as a Python module runnable with torchrun.")
DRY_OPT = typer.Option(False, "--dry-run", help="Lower (and --emit, or print) the plans without running them;"
                                                " needs no torch.")
MAX_RANKS_OPT = typer.Option(MAX_RANKS, "--max-ranks", min=2, help="Refuse plans needing more local processes.")
MEMORY_OPT = typer.Option("4GiB", "--memory", help="Refuse plans whose buffers (all ranks) exceed this.")


def _status(message: str):
    if sys.stderr.isatty():
        from rich.console import Console

        return Console(stderr=True).status(message)
    return nullcontext()


def _check_world(world: int, max_ranks: int) -> None:
    if world > max_ranks:
        fail(f"this needs {world} local processes (one per device), more than --max-ranks {max_ranks}; use a"
             " smaller cluster spec (e.g. one written by 'solver-planner calibrate') or raise --max-ranks", 2)


def _guard(plans, max_ranks: int, memory: str) -> None:
    _check_world(max(p.world for p in plans), max_ranks)
    try:
        limit = units.parse_bytes(memory)
    except ValueError as exc:
        fail(str(exc), 2)
    need = max(2 * p.buffer_bytes() for p in plans)  # the buffers and one copy in flight
    if need > limit:
        fail(f"the buffers need about {units.format_bytes(need)}, more than --memory {units.format_bytes(limit)};"
             " make them smaller (--bytes / --shape) or raise --memory", 2)


def _emit(plans, path: Optional[Path]) -> None:
    from ..distributed.emit import module_text
    if path is None:
        return
    command = "solver-planner " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        text = module_text(plans, command)
    except ValueError as exc:
        fail(f"--emit: {exc} (choose one with --name)", 2)
    path.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {path} (run: torchrun --nproc-per-node {plans[0].world} {path})", err=True)


def _ms(seconds: float) -> str:
    return units.format_time(seconds)


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.2f}" if predicted > 0 else "-"


def _report(executions, verdicts, as_json: bool, header: str) -> None:
    failed = [e for e in executions if not e.ok]
    if as_json:
        out = []
        for e, v in zip(executions, verdicts):
            d = e.as_dict()
            if v is not None:
                d["verify"] = v
            out.append(d)
        print_json({"ok": not failed, "plans": out})
    else:
        con = console()
        con.print(header)
        if len(executions) == 1:
            e = executions[0]
            table = Table(title=f"{e.plan.title}: {e.plan.world} {e.backend} processes, median of {e.repeat}")
            for col in ("step", "ranks", "bytes", "predicted", "measured", "measured/predicted"):
                table.add_column(col)
            for n, s in enumerate(e.plan.steps):
                table.add_row(f"{n + 1}: {s.label}", str(len(s.ranks)), units.format_bytes(s.nbytes),
                              _ms(s.predicted), _ms(e.step_times[n]), _ratio(e.step_times[n], s.predicted))
            table.add_row("total", "", "", _ms(e.plan.predicted), _ms(e.total), _ratio(e.total, e.plan.predicted))
            con.print(table)
        else:
            table = Table(title=f"{len(executions)} plans on {executions[0].plan.world} {executions[0].backend}"
                                f" processes, median of {executions[0].repeat}")
            verified = any(v is not None for v in verdicts)
            for col in ("#", "plan") + ("verify",) * verified + ("check", "predicted", "measured", "measured/predicted"):
                table.add_column(col)
            for n, (e, v) in enumerate(zip(executions, verdicts), 1):
                table.add_row(str(n), e.plan.title, *([v or "-"] if verified else []), "ok" if e.ok else "WRONG",
                              _ms(e.plan.predicted), _ms(e.total), _ratio(e.total, e.plan.predicted))
            con.print(table)
        con.print(f"{len(executions) - len(failed)} of {len(executions)} plan(s): every rank holds exactly what it"
                  " must")
        for e in failed:
            con.print(f"WRONG: {e.plan.title}: {len(e.failures)} rank(s) wrong")
            for f in e.failures:
                con.print(f"  {f.describe(e.plan)}")
    if failed:
        raise typer.Exit(1)


@execute_app.command("reduction")
@handles_errors
def execute_reduction(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML); one local process per device.", show_default=False),
    model: Path = typer.Argument(..., help="Model spec (YAML).", show_default=False),
    program: Optional[str] = typer.Argument(None, help="DSL text or a YAML file of explicit steps; default: every"
                                                       " synthesized program, fastest first.", show_default=False),
    matrix: Optional[str] = MATRIX_OPT,
    reduction: Optional[str] = REDUCTION_OPT,
    max_size: int = MAX_SIZE_OPT,
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Run only the N fastest synthesized programs."),
    nbytes: Optional[str] = typer.Option(None, "--bytes", "-b", help="Bytes reduced per device; default: the"
                                                                     " model spec's."),
    backend: str = BACKEND_OPT,
    repeat: int = REPEAT_OPT,
    warmup: int = WARMUP_OPT,
    timeout: float = TIMEOUT_OPT,
    max_ranks: int = MAX_RANKS_OPT,
    memory: str = MEMORY_OPT,
    emit: Optional[Path] = EMIT_OPT,
    dry_run: bool = DRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Run reduction programs of a placement on one local process per device and check that
    every rank ends with the exact sum over its reduction group.

    Prints each step's measured time next to the cost model's prediction for CLUSTER.
    Exits 1 when a rank holds a wrong element (naming the rank, the step and the element)
    or when a program cannot be lowered; 2 on bad input or without torch.
    """
    from ..distributed.jobs import chunk_elems, reduction_run, synthesized_runs
    from ..reduction.ranking import lowering_for, reduction_named

    check_output(emit, "--emit")
    topo, spec = _load(cluster, model)
    if not dry_run:
        _check_world(topo.num_devices, max_ranks)
    red = reduction_named(spec, reduction)
    chosen = _matrix(topo, spec, matrix, "ring")
    lowering = lowering_for(topo, spec, chosen, red)
    size = red.bytes
    if nbytes is not None:
        try:
            size = units.parse_bytes(nbytes)
        except ValueError as exc:
            fail(str(exc), 2)
    if program is None:
        runs = synthesized_runs(topo, spec, chosen, red, size, max_size, top)
        if not runs:
            # one device per group: nothing to run (it printed a blank line and exited 0)
            fail(f"nothing to reduce: every group of reduction '{red.name}' holds one device on {chosen}, so no"
                 " program is synthesized; give a PROGRAM to run one anyway", 1)
    else:
        steps, labels, title = read_program(topo, lowering, program)
        runs = [reduction_run(topo, lowering, steps, size, title, labels)]
    k = lowering.hierarchy.size
    header = (f"placement {chosen}, reduction '{red.name}' over {', '.join(red.axes)}:"
              f" {units.format_bytes(chunk_elems(lowering, size) * k * 4)} per rank in {k} chunks")
    _finish([r.plan for r in runs], [r.verdict for r in runs], header, backend, repeat, warmup, timeout, max_ranks,
            memory, emit, dry_run, as_json)


def _finish(plans, verdicts, header, backend, repeat, warmup, timeout, max_ranks, memory, emit, dry_run, as_json):
    from ..distributed.launch import execute_plans, require_torch

    _emit(plans, emit)
    if dry_run:
        if as_json:
            print_json({"plans": [p.as_dict() for p in plans]})
        elif emit is None:
            typer.echo("\n\n".join(p.format() for p in plans))
        return
    require_torch()
    _guard(plans, max_ranks, memory)
    executions = []
    by_world: dict[int, list[int]] = {}
    for n, p in enumerate(plans):
        by_world.setdefault(p.world, []).append(n)
    results = {}
    for world, indices in by_world.items():
        with _status(f"running {len(indices)} plan(s) on {world} local processes"):
            for n, e in zip(indices, execute_plans([plans[i] for i in indices], backend, repeat, warmup, timeout)):
                results[n] = e
    executions = [results[n] for n in range(len(plans))]
    _report(executions, verdicts, as_json, header)


@execute_app.command("reshard")
@handles_errors
def execute_reshard(
    cluster: Path = typer.Argument(..., exists=True, dir_okay=False, help="Cluster spec (YAML)."),
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="Model spec with a 'resharding:' list."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Run only this resharding of the model."),
    method: str = typer.Option("auto", "--method", "-m", help=f"Scheduler: {', '.join(METHODS)}."),
    time_limit: float = typer.Option(10.0, "--time-limit", "-t", min=0.01, max=86400,
                                     help="Budget of the scheduler."),
    shape: Optional[str] = typer.Option(None, "--shape", help="Run on a tensor of this shape instead of the"
                                                              " spec's, e.g. 64,32,16 (same rank)."),
    backend: str = BACKEND_OPT,
    repeat: int = REPEAT_OPT,
    warmup: int = WARMUP_OPT,
    timeout: float = TIMEOUT_OPT,
    max_ranks: int = MAX_RANKS_OPT,
    memory: str = MEMORY_OPT,
    emit: Optional[Path] = EMIT_OPT,
    dry_run: bool = DRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Schedule each resharding of MODEL (the resharding paper §3), run its broadcasts on one local
    process per mesh device, and check that every destination rank holds exactly its
    slice of the tensor.

    Each step is one unit task; its measured span is printed next to the scheduled one.
    Exits 1 when a rank holds a wrong element; 2 on bad input or without torch.
    """
    from ..distributed.jobs import resharding_plans

    if method not in METHODS:
        fail(unknown_choice("method", method, METHODS), 2)
    check_output(emit, "--emit")
    topo = topology_of(cluster)
    spec = model_of(model)
    dims = None
    if shape is not None:
        try:
            dims = tuple(int(x) for x in shape.replace("x", ",").split(","))
        except ValueError:
            fail(f"--shape expects sizes such as 64,32,16; got {shape!r}", 2)
    try:
        plans = resharding_plans(topo, spec, name, method, time_limit, dims)
    except ValueError as exc:
        fail(f"--shape: {exc}", 2)
    _finish(plans, [None] * len(plans), f"{spec.name} on {topo.name}", backend, repeat, warmup, timeout, max_ranks,
            memory, emit, dry_run, as_json)


def _written(text: str, output: Optional[Path], as_json: bool, as_dict) -> bool:
    """Write the calibrated spec to ``output`` (or stdout without one) or the JSON; True when
    nothing is left to print (the table follows only with ``-o`` and without ``--json``)."""
    if output is not None:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)
    if as_json:
        print_json(as_dict())
        return True
    if output is None:
        typer.echo(text)
        return True
    return False


def _from_layer_times(path: Path, cluster: Optional[Path], output: Optional[Path], name: Optional[str],
                      levels: Optional[str], as_json: bool) -> None:
    from ..stages.layer_timings import fit_matmul_efficiency, load_layer_timings

    check_output(output, "--output")
    if cluster is None:
        fail("--from-layer-times needs --cluster BASE.yaml: the device whose compute block is fitted", 2)
    if levels is not None or name is not None:
        fail("--levels and --name are for measuring this machine; with --from-layer-times the spec is --cluster's", 2)
    topology = topology_of(cluster)
    rows = load_layer_timings(path)
    with _status(f"fitting matmul_efficiency to {len(rows)} measured layer(s)"):
        try:
            fit = fit_matmul_efficiency(topology, rows)
        except ValueError as exc:
            fail(str(exc), 2)
    text = fit.spec_yaml(cluster, "solver-planner " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    if _written(text, output, as_json, lambda: {**fit.as_dict(), "spec": text}):
        return
    table = Table(title=f"{topology.spec.name}: matmul_efficiency {fit.before} -> {fit.efficiency}"
                        f" (least squared log error over {2 * len(rows)} passes)")
    for col in ("layer", "pass", "measured", "predicted before", "predicted after"):
        table.add_column(col)
    for row, before, after in fit.rows:
        for k, label in enumerate(("forward", "backward")):
            measured = (row.forward, row.backward)[k]
            table.add_row(row.label() if k == 0 else "", label, _ms(measured),
                          f"{_ms(before[k])} ({before[k] / measured - 1:+.1%})",
                          f"{_ms(after[k])} ({after[k] / measured - 1:+.1%})")
    console().print(table)


@handles_errors
def calibrate(
    backend: str = typer.Option("auto", "--backend", help="gloo (CPU), nccl (a GPU per rank) or auto."),
    world: int = typer.Option(4, "--world", "-w", min=2, help="Local processes to measure."),
    levels: Optional[str] = typer.Option(None, "--levels", help="Hierarchy of the spec written, e.g. host=2,proc=2"
                                                                " (product = --world); default host=1,proc=WORLD."),
    sizes: str = typer.Option("4KiB,64KiB,1MiB,4MiB", "--sizes", help="Message sizes measured."),
    repeat: int = typer.Option(10, "--repeat", min=1, help="Timed runs per call and size; the median is kept."),
    name: Optional[str] = typer.Option(None, "--name", help="Cluster name; default local-BACKEND-WORLD."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the cluster spec here (default:"
                                                                      " print it)."),
    timeout: float = TIMEOUT_OPT,
    as_json: bool = JSON_OPT,
    logs: Optional[list[str]] = typer.Argument(
        None, metavar="LOG", show_default=False,
        help="With --from-nccl-tests: nccl-tests outputs, each LOG or LEVEL=LOG (the level a log measures, when its"
             " '# Using devices' lines are missing)."),
    from_nccl_tests: bool = typer.Option(
        False, "--from-nccl-tests", help="Fit the --cluster spec's interconnects (latency, bandwidth, per-collective"
                                         " efficiency) to nccl-tests logs instead of measuring; needs no torch."),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="With --from-nccl-tests or --from-layer-times:"
                                                                   " the base cluster spec (levels, device); the"
                                                                   " rest of it is kept."),
    from_layer_times: Optional[Path] = typer.Option(
        None, "--from-layer-times", metavar="CSV",
        help="Fit the --cluster device's matmul_efficiency to measured forward and backward times of single"
             " transformer layers (columns hidden, heads, sequence, micro_batch, tensor, recompute,"
             " sequence_parallel, forward_ms, backward_ms, optionally attention and dtype; e.g."
             " benchmarks/data/layer_times_a100.csv)."),
) -> None:
    """Measure point-to-point and collective calls on this machine and write a cluster spec
    whose latency and bandwidth make the cost model fit them.

    Prints every measured call next to the fitted model's prediction.  Local runs
    ('execute ... local.yaml ...') can then be compared with predictions.  With
    --from-nccl-tests, fits the interconnects of --cluster to NVIDIA nccl-tests logs
    (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf,
    sendrecv_perf) instead: one-host runs the innermost level, multi-host runs the host level.
    With --from-layer-times, fits the matrix-multiply efficiency of --cluster's device to
    measured times of single transformer layers (a per-layer microbenchmark, such as
    Korthikanti et al. 2022's Table 4, which the A100 presets are fitted to).
    """
    if from_layer_times is not None:
        if from_nccl_tests or logs:
            fail("--from-layer-times and --from-nccl-tests fit different parts of the spec: run them one at a time", 2)
        _from_layer_times(from_layer_times, cluster, output, name, levels, as_json)
        return
    if from_nccl_tests or logs:
        from ..distributed.nccl_tests import calibrate as from_logs

        if not from_nccl_tests:
            fail("LOG arguments are read with --from-nccl-tests (calibrate measures this machine without it)", 2)
        check_output(output, "--output")
        if not logs:
            fail("--from-nccl-tests needs at least one nccl-tests log (LOG or LEVEL=LOG)", 2)
        if cluster is None:
            fail("--from-nccl-tests needs --cluster BASE.yaml: the levels and device the logs are fitted on", 2)
        if levels is not None:
            fail("--levels is for measuring this machine; with --from-nccl-tests the levels are --cluster's", 2)
        topology_of(cluster)                  # a model spec in its place gets a hint; implausible values a warning
        cal = from_logs(cluster, logs, name)
        text = cal.yaml("solver-planner " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        if _written(text, output, as_json, cal.as_dict):
            return
        errors = cal.log_errors()
        fitted = "; ".join(f"{lv.interconnect}: latency {units.format_time(lv.latency)}, bandwidth"
                           f" {units.format_bandwidth(lv.bandwidth)}" for lv in cal.levels)
        table = Table(title=f"fitted to {len(errors)} nccl-tests log(s): {fitted}")
        for col in ("log", "test", "ranks", "hosts", "level", "samples", "median |pred/meas-1|"):
            table.add_column(col)
        for f in cal.runs:
            table.add_row(f"{f.run.file}:{f.run.where}", f"{f.run.program}_perf", str(f.placement.ranks),
                          str(f.placement.hosts or "?"), f"{f.placement.level} ({f.placement.interconnect})",
                          str(len(f.sizes)), f"{f.median_error:.3f}")
        console().print(table)
        for note in cal.notes:
            typer.echo(f"note: {note}", err=True)
        return
    from ..distributed.launch import require_torch

    from ..distributed.calibrate import calibrate as run_calibration
    from ..distributed.calibrate import cluster_yaml, parse_levels

    check_output(output, "--output")      # before minutes of measurements

    require_torch()
    try:
        parse_levels(levels, world)
        byte_sizes = [int(units.parse_bytes(s)) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        fail(str(exc), 2)
    if len(byte_sizes) < 2:
        fail("--sizes needs at least two sizes to tell latency from bandwidth", 2)
    with _status(f"measuring {world} {backend} processes"):
        cal = run_calibration(world, backend, levels, byte_sizes, repeat, timeout)
    command = "solver-planner " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = cluster_yaml(cal, name, command)
    for note in cal.notes:                  # on stderr: --json and the spec on stdout stay clean
        typer.echo(f"note: {note}", err=True)
    if _written(text, output, as_json, cal.as_dict):
        return
    d = cal.as_dict()
    best = cal.best
    ports = "one per process" if best.sharing == "device" else "one shared by all processes"
    table = Table(title=f"{world} {cal.backend} processes: latency {units.format_time(best.latency)}, bandwidth"
                        f" {units.format_bandwidth(best.bandwidth)}, ports: {ports}"
                        f" (rms relative error {best.error:.2f})")
    for col in ("call", "bytes", "measured", "predicted", "measured/predicted"):
        table.add_column(col)
    for m in d["measurements"]:
        table.add_row(m["kind"], units.format_bytes(m["bytes"]), _ms(m["median"]), _ms(m["predicted"]),
                      _ratio(m["median"], m["predicted"]))
    console().print(table)
