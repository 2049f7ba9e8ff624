"""Helpers every ``solver-planner`` command shares: error handling, JSON, the console."""

import functools
import json
import math
import sys
from pathlib import Path

import typer
from rich.console import Console

from ..choices import DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS, RISE, STALL
from ..errors import (InfeasibleError, MissingDependencyError, OptionError, PlannerError, SpecError, SpecIssue,
                      UnknownError)
from ..spec import deciding_key, load_cluster_spec, load_model_spec, load_yaml
from ..spec.plausible import implausible
from ..topology import Topology

JSON_OPT = typer.Option(False, "--json", help="Print JSON for machines instead of tables.")
DEVICES_OPT = typer.Option(None, "--devices", min=1, show_default=False,
                           help="Use at most this many of the cluster's devices (its first ones; default: all). Plans"
                                " use as many as equal meshes can tile; the output says how many idle and why.")
# the stage search's limits, for `stages` and for `plan` (whose file records them for `check`)
BUDGET_OPT = typer.Option(DEFAULT_BUDGET, "--budget", min=1,
                          help="Subspaces the branch and bound solves before it stops with a gap.")
SIM_BUDGET_OPT = typer.Option(DEFAULT_SIMULATIONS, "--sim-budget", min=1,
                              help="Simulated tasks per listed plan before the search stops with a gap.")
GAP_OPT = typer.Option(DEFAULT_GAP, "--gap", min=0.0, max=0.99,
                       help="Stop once the plan is proven within this relative gap and the bound has stopped"
                            f" rising ({STALL} subspaces without a {RISE:.1%} rise); 0 searches until OPTIMAL or a"
                            " budget.")
COMPUTE_OPT = typer.Option(
    "efficiency", "--compute", help="How compute is timed: efficiency (kernel efficiency, launch overhead and memory"
    " traffic from the cluster's device.compute or device preset; the roofline when it has none), roofline"
    " (max(FLOPs / peak, bytes / memory bandwidth) per operator) or peak (FLOPs at peak). Without a memory"
    " bandwidth (no preset, no device.memory_bandwidth) the roofline is the peak; the output names the model used.")


def console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _json_default(value):
    return str(value)


def _finite(value):
    """JSON has no infinity: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def print_json(data) -> None:
    typer.echo(json.dumps(_finite(data), indent=2, default=_json_default))


_JSON_ERRORS = [False]      # set while a command that got --json runs: errors go to stdout too


def error_object(message: str, code: int, exc: Exception | None = None) -> dict:
    """``{"error": {"code", "file", "line", "key", "message"}}`` (file, line and key are
    null unless a spec error or a plan file's error names them)."""
    file = line = key = None
    if isinstance(exc, SpecError):
        first = exc.issues[0]
        file, line, key = first.file, first.line, first.path or None
    elif getattr(exc, "file", None) is not None:       # a plan file that is not one (PlanFileError)
        file, line = exc.file, getattr(exc, "line", None)
    out = {"error": {"code": code, "file": file, "line": line, "key": key, "message": message}}
    if isinstance(exc, SpecError) and len(exc.issues) > 1:
        # the spec's other problems, each as the message names the first
        out["error"]["also"] = [{"file": i.file, "line": i.line, "key": i.path or None, "message": str(i)}
                                for i in exc.issues[1:]]
    if isinstance(exc, UnknownError):
        # an undecided search says so like a decided one, with what it proved
        bound = exc.bound
        out = {"status": "UNKNOWN", "bound": bound if bound is not None and math.isfinite(bound) else None, **out}
    return out


def fail(message: str, code: int, exc: Exception | None = None) -> None:
    """Exit with ``code`` after one line on stderr (and, under --json, the error object on stdout)."""
    if _JSON_ERRORS[0]:
        print_json(error_object(message, code, exc))
    typer.echo(f"error: {message}", err=True)
    if isinstance(exc, SpecError):
        # the message counts the spec's other problems ("and 2 more"): say each, one a line
        for issue in exc.issues[1:]:
            typer.echo(f"  also: {issue}", err=True)
    raise typer.Exit(code)


def handles_errors(fn):
    """Turn library errors into one-line messages and the documented exit codes; with
    ``--json`` (a keyword ``as_json``) also into a JSON error object on stdout."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = _JSON_ERRORS[0]
        _JSON_ERRORS[0] = bool(kwargs.get("as_json", False))
        try:
            return fn(*args, **kwargs)
        except (SpecError, OptionError, MissingDependencyError) as exc:
            fail(str(exc), 2, exc)
        except UnknownError as exc:
            fail(f"unknown: {exc}", 3, exc)
        except InfeasibleError as exc:
            fail(f"infeasible: {exc}", 1, exc)
        except PlannerError as exc:
            fail(str(exc), 1, exc)
        except MemoryError:      # a command without a memory bound (memory.bounded) ran out
            fail("out of memory", 2)
        finally:
            _JSON_ERRORS[0] = before

    return wrapper


def check_output(path: Path | None, what: str, folder: bool = False) -> None:
    """Refuse an output path before the work starts (exit 2): its folder must exist, and
    it must not be a folder (``folder``: it is one, or will be created in an existing one)."""
    if path is None:
        return
    path = Path(path).expanduser()
    if folder:
        if path.exists() and not path.is_dir():
            fail(f"{what} {path} is a file, not a folder", 2)
        parent = path.resolve().parent
    else:
        if path.is_dir():
            fail(f"{what} {path} is a folder; give a file name", 2)
        parent = path.resolve().parent
    if not parent.is_dir():
        fail(f"{what} {path}: folder {parent} does not exist", 2)
    import os

    if not os.access(parent, os.W_OK):
        fail(f"{what} {path}: folder {parent} is not writable", 2)


def check_plot(path: Path | None, what: str = "--plot") -> None:
    """Check a picture's path before the work: its folder, its extension, matplotlib (exit 2)."""
    check_output(path, what)
    if path is not None:
        from ..report import prepare

        prepare(path, what)


def _where_kind(path: Path) -> tuple[str, SpecIssue] | None:
    """(kind, where: file, line and key) of the key that decides what the file is; None when
    the file is unreadable (its loader then says why) or no key decides."""
    try:
        data, source = load_yaml(path)
    except SpecError:
        return None
    found = deciding_key(data)
    if found is None:
        return None
    kind, key = found
    return kind, source.issue((key,), "")


def _spec_of(path: Path, kind: str, load):
    """The ``kind`` spec at ``path``: a spec of the other kind given in its place gets a
    hint naming the key that says so (exit 2); implausible values are warned about."""
    found = _where_kind(path)
    if found is not None and found[0] != kind:
        at = found[1]
        # a SpecError, so that --json's error object names the file, line and key too
        issue = SpecIssue(at.file, at.line, at.path, f"a {found[0]} spec's key, in the file given where the {kind}"
                          " spec goes: the cluster comes first (solver-planner COMMAND CLUSTER MODEL ...)")
        err = SpecError(issue)
        fail(str(err), 2, err)
    spec = load(path)
    warn(implausible(spec))
    return spec


def warn(notes) -> None:
    """Each note on stderr as one ``warning:`` line (what ``--json`` carries in its object)."""
    for note in notes:
        typer.echo(f"warning: {note}", err=True)


def topology_of(path: Path) -> Topology:
    """The cluster at ``path`` (see :func:`_spec_of`)."""
    return Topology(_spec_of(path, "cluster", load_cluster_spec))


def model_of(path: Path):
    """The model spec at ``path`` (see :func:`_spec_of`)."""
    return _spec_of(path, "model", load_model_spec)


TRACE_DETAIL_OPT = typer.Option(
    "stages", "--trace-detail",
    help="stages: one process per pipeline stage with a track per stream, one counter of busy ports per link"
         " class, and beyond 64 micro-batches the steady state merged into slices that say which micro-batches"
         " and how many tasks they hold (warm-up and cool-down whole). full: every device's and every link"
         " port's tasks (warns first when that is over 100 MB).")
TRACE_WARN_BYTES = 100e6   # about what Perfetto's UI still opens comfortably


def check_trace_detail(detail: str) -> None:
    if detail not in ("stages", "full"):
        fail(f"--trace-detail {detail!r}: expected stages or full", 2)


def write_trace(timeline, path: Path, topology, detail: str, stage_size: int, links: bool = False) -> None:
    """``--trace`` with ``--trace-detail``; a full trace over :data:`TRACE_WARN_BYTES` is announced first."""
    from ..simulate import estimate_full_bytes, write_chrome_trace

    check_trace_detail(detail)
    if detail == "full":
        size = estimate_full_bytes(timeline, links, topology)
        if size > TRACE_WARN_BYTES:
            # decimal megabytes, as --help and the README state the limit
            typer.echo(f"warning: the full trace is about {size / 1e6:,.0f} MB; Perfetto's UI struggles above"
                       f" {TRACE_WARN_BYTES / 1e6:.0f} MB (--trace-detail stages aggregates it)", err=True)
    out = write_chrome_trace(timeline, path, topology, links=links, detail=detail, stage_size=stage_size)
    typer.echo(f"wrote {out}", err=True)
