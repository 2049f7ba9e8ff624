"""The ``solver-planner`` command: parses arguments, calls the library, prints.

Exit codes: 0 success; 1 infeasible or invalid (the reason is printed); 2 bad input (a spec
error printed on one line as ``file:line: key.path: what was expected``, no traceback).
Human tables go to stdout; ``--json`` prints machine-readable JSON instead.
"""

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from .. import units
from ..errors import SpecError, unknown_choice
from ..spec import check_fits, check_meshes, json_schema, load_cluster_spec, load_model_spec, load_yaml, spec_kind
from ..topology import Topology
from ..spec.plausible import implausible
from .common import (JSON_OPT, check_output, console, error_object, fail, handles_errors, print_json, topology_of,
                     warn)
from .execute import calibrate, execute_app
from .plan import check, plan
from .reduce import place, reduce_app
from .reshard import reshard
from .run import run
from .show import show
from .stages import stages

app = typer.Typer(
    name="solver-planner",
    help="Plan and prove how a deep-learning job is spread over a GPU cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: flags print as flags (rich's panels print "--json <bool>") and
    # docstrings are re-wrapped to the terminal instead of keeping their line breaks
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"solver-planner {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print the version and exit.")) -> None:
    """Plan and prove how a deep-learning job is spread over a GPU cluster."""


# -- validate ---------------------------------------------------------------------------
@app.command()
@handles_errors
def validate(
    specs: List[Path] = typer.Argument(..., help="Cluster and model spec files (YAML).", show_default=False),
    as_json: bool = JSON_OPT,
) -> None:
    """Check spec files, and each model against each cluster among them.

    Every problem is reported as file:line: key.path: what was expected. A model must be
    consistent with the cluster given (axis sizes, meshes), or with at least one of several
    (the summary names which); with no cluster, the summary says it was not checked against
    one. A model whose weights and optimizer state cannot fit in a cluster's memory however
    they are spread is warned about (stages and plan decide what fits). Exits 2 if any file
    has a problem.
    """
    results = []
    clusters, models = [], []
    for path in specs:
        entry = {"file": str(path), "kind": None, "ok": False, "summary": None, "errors": []}
        results.append(entry)
        try:
            data, _ = load_yaml(path)
            entry["kind"] = spec_kind(data)
            if entry["kind"] == "cluster":
                spec = load_cluster_spec(path)
                entry["warnings"] = implausible(spec)
                clusters.append(spec)
                entry["summary"] = f"cluster '{spec.name}': {spec.num_devices} devices"
            else:
                mspec = load_model_spec(path)
                entry["warnings"] = implausible(mspec)
                models.append((mspec, entry))
                axes = " x ".join(f"{a.name}={a.size}" for a in mspec.parallelism.axes) if mspec.parallelism else "no axes"
                entry["summary"] = (f"model '{mspec.name}': {axes}, {len(mspec.reductions)} reduction(s),"
                                    f" {len(mspec.resharding)} resharding(s)")
                if mspec.layers or mspec.transformer is not None:
                    n = sum(x.repeat for x in mspec.layers) if mspec.layers else mspec.transformer.layers + 2
                    entry["summary"] += f", {n} layers"

            entry["ok"] = True
        except SpecError as exc:
            entry["errors"] = [str(i) for i in exc.issues]
    # each model against each cluster given: with one cluster a model must fit it; with
    # several, at least one (the others are named); with none, the summary says so
    topos = [Topology(c) for c in clusters]
    for mspec, entry in models:
        if not entry["ok"]:
            continue
        if not topos:
            entry["summary"] += "; not checked against a cluster (none given)"
            continue
        fits, misfits = [], []
        for topo in topos:
            try:
                check_fits(mspec, topo.num_devices, topo.name)
                check_meshes(mspec, topo.num_hosts, topo.num_devices // topo.num_hosts, topo.name)
                fits.append(topo.name)
            except SpecError as exc:
                misfits.append((topo.name, exc))
        entry["fits"] = fits
        entry["does_not_fit"] = {name: str(exc.issues[0]) for name, exc in misfits}
        # consistent is not enough: a model whose weights and optimizer state alone exceed
        # the cluster's memory has no plan there (`stages` says by how much)
        too_large = {topo.name: floor for topo in topos if topo.name in fits
                     and (floor := static_floor(mspec, topo)) is not None and floor > topo.device.budget}
        entry["too_large"] = {name: {"bytes_per_device_at_least": round(b)} for name, b in too_large.items()}
        for topo in topos:
            if topo.name in too_large:
                entry.setdefault("warnings", []).append(
                    f"{entry['file']}: model '{mspec.name}' cannot fit in {topo.name}'s memory: its weights and"
                    f" optimizer state need at least {too_large[topo.name] / 2**30:.2f} GiB per device even spread"
                    f" over all {topo.num_devices} devices ({topo.device.budget / 2**30:.2f} GiB usable); `stages`"
                    f" prints the plan needing least")
        if fits:
            entry["summary"] += f"; consistent with {', '.join(fits)}"
            if misfits:
                entry["summary"] += f"; not {', '.join(name for name, _ in misfits)}"
        else:
            entry["ok"] = False
            entry["errors"] = [str(i) for _, exc in misfits for i in exc.issues]
    bad = [r for r in results if not r["ok"]]
    if as_json:
        print_json({"ok": not bad, "files": results})
    else:
        for r in results:
            if r["ok"]:
                typer.echo(f"ok     {r['file']}  ({r['summary']})")
            warn(r.get("warnings", []))
        for r in bad:
            for line in r["errors"]:
                typer.echo(f"error: {line}", err=True)
    if bad:
        raise typer.Exit(2)


def static_floor(model, topology: Topology) -> float | None:
    """:func:`.stages.memory.least_static_per_device` of a model with layers on ``topology``;
    None for a model without layers."""
    if not model.layers and model.transformer is None:
        return None
    from ..stages.layers import layer_model
    from ..stages.memory import least_static_per_device

    return least_static_per_device(layer_model(model), topology.num_devices)


# -- cost -------------------------------------------------------------------------------
@app.command()
@handles_errors
def cost(
    cluster: Path = typer.Argument(..., help="Cluster spec (YAML).", show_default=False),
    collective: str = typer.Option("allreduce", "--collective", "-c",
                                   help="allreduce, reducescatter, allgather, reduce, broadcast, or 'all'."),
    nbytes: str = typer.Option("1GiB", "--bytes", "-b", help="Buffer size per device, e.g. '1GiB' or '512 MB'."),
    level: Optional[str] = typer.Option(None, "--level", "-l",
                                        help="Run on the devices inside each instance of this level, all groups at once."),
    across: Optional[str] = typer.Option(None, "--across",
                                         help="Run on the devices that differ only at this level, all groups at once."),
    algorithm: str = typer.Option("all", "--algorithm", "-a", help="ring, tree, or 'all'."),
    as_json: bool = JSON_OPT,
) -> None:
    """Time of one collective on the groups of a level (the whole cluster by default).

    Groups of one call run concurrently and share links: --across node on a cluster with
    one NIC per node puts every cross-node pair behind the same NIC.
    """
    from ..cost import Algorithm, Collective, CostModel

    topo = topology_of(cluster)
    try:
        size = units.parse_bytes(nbytes)
        kinds = list(Collective) if collective == "all" else [Collective.parse(collective)]
        if algorithm != "all" and algorithm not in [a.value for a in Algorithm]:
            raise ValueError(unknown_choice("algorithm", algorithm, [a.value for a in Algorithm] + ["all"]))
        algos = list(Algorithm) if algorithm == "all" else [Algorithm(algorithm)]
        if level is not None and across is not None:
            raise ValueError("give --level or --across, not both")
        if level is not None:
            groups, scope = topo.groups_within(level), f"within each {level}"
        elif across is not None:
            groups, scope = topo.groups_across(across), f"across {across}"
        else:
            groups, scope = [list(range(topo.num_devices))], "of all devices"
    except ValueError as exc:
        fail(str(exc), 2)
    warnings = []
    if max(len(g) for g in groups) < 2:
        if topo.num_devices < 2:
            hint = f"'{topo.name}' has one device"
        else:
            hint = (f"'{topo.name}' has levels {', '.join(topo.level_names)}: --level L groups the devices inside"
                    f" each L, --across L one device of each L")
        warnings.append(f"every group {scope} has one device: a collective on one device moves nothing ({hint})")
    warn(warnings)
    model = CostModel(topo)
    rows = []
    for kind in kinds:
        for algo in algos:
            c = model.collective(kind, groups, size, algo)
            rows.append({
                "collective": c.collective, "algorithm": c.algorithm, "groups": c.groups, "group_size": c.group_size,
                "bytes": size, "time": c.time, "latency_term": c.latency_term, "bandwidth_term": c.bandwidth_term,
                "bus_bandwidth": c.bus_bandwidth, "bottleneck": c.bottleneck,
            })
    if as_json:
        print_json({"cluster": topo.name, "scope": scope, "warnings": warnings, "results": rows})
        return
    table = Table(title=f"{topo.name}: {len(groups)} group(s) of {max(len(g) for g in groups)} ({scope}), "
                        f"{units.format_bytes(size)} per device")
    for col in ("collective", "algorithm", "time", "latency", "bandwidth term", "bus bandwidth", "bottleneck"):
        table.add_column(col)
    for r in rows:
        busbw = "-" if r["bus_bandwidth"] == float("inf") else units.format_bandwidth(r["bus_bandwidth"])
        table.add_row(r["collective"], r["algorithm"], units.format_time(r["time"]), units.format_time(r["latency_term"]),
                      units.format_time(r["bandwidth_term"]), busbw, r["bottleneck"] or "-")
    console().print(table)


# -- schema -----------------------------------------------------------------------------
@app.command()
@handles_errors
def schema(
    kind: str = typer.Argument(..., help="'cluster' or 'model'.", show_default=False),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
    as_json: bool = typer.Option(False, "--json", help="The schema is JSON either way; errors too with --json."),
) -> None:
    """Print the JSON Schema of a spec kind, for editors that validate YAML."""
    if kind not in ("cluster", "model"):
        fail(f"unknown spec kind {kind!r}; expected 'cluster' or 'model'", 2)
    check_output(output, "--output")
    text = json.dumps(json_schema(kind), indent=2)
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n", encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)


app.command()(show)
app.command()(handles_errors(place))
app.add_typer(reduce_app, name="reduce")
app.command()(reshard)
app.command()(stages)
app.command()(plan)
app.command()(check)
app.add_typer(execute_app, name="execute")
app.command()(calibrate)
app.command()(run)


def _unknown_option_message(exc) -> str:
    """``No such option: --budgett (closest: --budget, --sim-budget)``. click compares the
    names with their dashes, which alone make '--hel' look like '--meshes'; here the names
    are compared without them, and --help is left to the '-h' hint that follows."""
    import difflib

    typed = exc.option_name.lstrip("-")
    ctx = getattr(exc, "ctx", None)
    help_names = set(ctx.help_option_names) if ctx is not None else set()
    names = {}                                          # 'sim-budget' -> '--sim-budget'
    for param in getattr(ctx and ctx.command, "params", []):
        if getattr(param, "param_type_name", None) == "option" and not getattr(param, "hidden", False):
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--") and opt not in help_names:
                    names[opt[2:]] = opt
    # a name the typed word begins ('--time' for '--time-limit') is close however long it is
    score = {n: max(difflib.SequenceMatcher(None, typed, n).ratio(), 0.6 * (len(typed) >= 3 and n.startswith(typed)))
             for n in names}
    close = sorted((n for n in names if score[n] >= 0.6), key=lambda n: (-score[n], n))[:3]
    if close:
        return f"{exc.message} (closest: {', '.join(names[n] for n in close)})"
    return f"{exc.message} (none of this command's options is close)"


def _plan_file_hint(ctx, argv: list[str]) -> str:
    """For a command that takes CLUSTER MODEL PLAN_FILE and got fewer: which given file is a
    plan file, the cluster and model it names, and the order to give them in ('' if none)."""
    import re
    from pathlib import Path

    from ..plan.planfile import FORMAT

    if ctx is None or not any(getattr(p, "name", None) == "plan_file" for p in ctx.command.params):
        return ""
    for arg in argv:
        path = Path(arg)
        try:
            if arg.startswith("-") or not path.is_file():
                continue
            with path.open(encoding="utf-8", errors="replace") as f:
                head = f.read(4096)                 # the names are the file's first keys
        except OSError:
            continue
        if not re.match(rf"format: {re.escape(FORMAT)}\s", head):
            continue
        names = dict(re.findall(r"^(cluster|model): (.+)$", head, re.M))
        named = (f" for cluster '{names['cluster']}' and model '{names['model']}'"
                 if {"cluster", "model"} <= names.keys() else "")
        return (f"; {arg} is a plan file{named}: give their spec files first,"
                f" '{ctx.command_path} CLUSTER.yaml MODEL.yaml {arg}'")
    return ""


def main() -> None:
    """The entry point: click's own errors (a bad option value, a missing argument) exit 2
    with one line, and under ``--json`` also print the error object on stdout."""
    import re
    import sys

    try:
        code = app(standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as exc:
        # click's usage errors (a bad option value, a missing argument), whether typer uses
        # the click package or carries its own copy: they can show themselves and have a code
        if not (hasattr(exc, "show") and hasattr(exc, "exit_code") and hasattr(exc, "format_message")):
            raise
        message = exc.format_message()
        if str(getattr(exc, "option_name", None)).startswith("--") and hasattr(exc, "possibilities"):
            message = _unknown_option_message(exc)      # click's NoSuchOption for a long option
        if getattr(getattr(exc, "param", None), "param_type_name", None) == "argument":
            hint = _plan_file_hint(getattr(exc, "ctx", None), sys.argv[1:])       # 'check plan.yaml'
            message = message.rstrip(".") + hint if hint else message
        if "--json" in sys.argv[1:]:
            out = error_object(message, exc.exit_code)
            missing = re.search(r"'([^']+)' does not exist", message)
            if missing:                     # an input file that is not there: say which
                out["error"]["file"] = missing.group(1)
            print_json(out)
        # one line, as every other error (click would add its usage block)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} -h')" if ctx is not None and ctx.command_path else ""
        typer.echo(f"error: {message}{hint}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
