"""Helpers every ``solver-planner`` command shares: error handling, JSON, the console."""

import functools
import json
import math
import sys
from pathlib import Path

import typer
from rich.console import Console

from ..errors import InfeasibleError, MissingDependencyError, OptionError, PlannerError, SpecError, UnknownError
from ..spec import load_cluster_spec, load_model_spec, load_yaml, spec_kind
from ..topology import Topology

JSON_OPT = typer.Option(False, "--json", help="Print JSON for machines instead of tables.")


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
    null unless a spec error names them)."""
    file = line = key = None
    if isinstance(exc, SpecError):
        first = exc.issues[0]
        file, line, key = first.file, first.line, first.path or None
    return {"error": {"code": code, "file": file, "line": line, "key": key, "message": message}}


def fail(message: str, code: int, exc: Exception | None = None) -> None:
    """Exit with ``code`` after one line on stderr (and, under --json, the error object on stdout)."""
    if _JSON_ERRORS[0]:
        print_json(error_object(message, code, exc))
    typer.echo(f"error: {message}", err=True)
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


_MODEL_KEYS = {"parallelism", "reductions", "resharding", "layers", "transformer", "training"}


def _kind_of(path: Path) -> tuple[str | None, str]:
    """('cluster' | 'model' | None, where): the kind the top-level keys say (None when the
    file is unreadable: the loader then says why), and ``file:line: key`` of the key that
    decided it."""
    try:
        data, source = load_yaml(path)
    except SpecError:
        return None, str(path)
    if isinstance(data, dict):
        kind = "cluster" if spec_kind(data) == "cluster" else "model" if _MODEL_KEYS & set(data) else None
        if kind is not None:
            keys = _CLUSTER_KEYS if kind == "cluster" else _MODEL_KEYS
            key = next(k for k in data if k in keys)
            return kind, str(source.issue((key,), "")).rstrip(": ")
    return None, str(path)


_CLUSTER_KEYS = ("levels", "device", "interconnects")


# Below these, a bare number is almost certainly a unit slip ("400" read as 400 B/s where
# 400 Gbps was meant); above them, a latency is seconds where microseconds were meant.
MIN_BANDWIDTH = 1e6          # bytes/s
MAX_LATENCY = 1.0            # s
MIN_REDUCTION = 64           # bytes per device
MIN_MEMORY = 2**20           # bytes per device


def implausible(spec) -> list[str]:
    """Warnings for values a user almost certainly did not mean (a cluster or model spec)."""
    src = spec.source
    out = []
    for i, ic in enumerate(getattr(spec, "interconnects", ()) or ()):
        if ic.bandwidth < MIN_BANDWIDTH:
            out.append(f"{src.issue(('interconnects', i, 'bandwidth'), '')}bandwidth {ic.bandwidth:g} B/s is below"
                       " 1 MB/s: a bare number is bytes per second (write e.g. '400 Gbps' or '50 GB/s')")
        if ic.latency > MAX_LATENCY:
            out.append(f"{src.issue(('interconnects', i, 'latency'), '')}latency {ic.latency:g} s is above 1 s:"
                       " a bare number is seconds (write e.g. '5us')")
    device = getattr(spec, "device", None)
    if device is not None and device.memory < MIN_MEMORY:
        out.append(f"{src.issue(('device', 'memory'), '')}memory {device.memory:g} bytes is below 1 MiB: a bare"
                   " number is bytes (write e.g. '80 GiB')")
    for i, red in enumerate(getattr(spec, "reductions", ()) or ()):
        if red.bytes < MIN_REDUCTION:
            out.append(f"{src.issue(('reductions', i, 'bytes'), '')}a reduction of {red.bytes:g} bytes per device:"
                       " a bare number is bytes (write e.g. '8 MiB')")
    return out


def _warn(spec) -> None:
    for w in implausible(spec):
        typer.echo(f"warning: {w}", err=True)


def topology_of(path: Path) -> Topology:
    """The cluster spec at ``path``; a model spec given in its place gets a hint (exit 2);
    implausible values are warned about on stderr."""
    kind, where = _kind_of(path)
    if kind == "model":
        fail(f"{where}: a model spec's key, in the file given where the cluster spec goes: the cluster comes"
             " first (solver-planner COMMAND CLUSTER MODEL ...)", 2)
    spec = load_cluster_spec(path)
    _warn(spec)
    return Topology(spec)


def model_of(path: Path):
    """The model spec at ``path``; a cluster spec given in its place gets a hint (exit 2)."""
    kind, where = _kind_of(path)
    if kind == "cluster":
        fail(f"{where}: a cluster spec's key, in the file given where the model spec goes: the cluster comes"
             " first (solver-planner COMMAND CLUSTER MODEL ...)", 2)
    spec = load_model_spec(path)
    _warn(spec)
    return spec
