"""Helpers every ``solver-planner`` command shares: error handling, JSON, the console."""

import functools
import json
import math
import sys
from pathlib import Path

import typer
from rich.console import Console

from ..errors import InfeasibleError, MissingDependencyError, OptionError, PlannerError, SpecError, UnknownError
from ..spec import load_cluster_spec
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


def fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def handles_errors(fn):
    """Turn library errors into one-line messages and the documented exit codes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SpecError, OptionError, MissingDependencyError) as exc:
            fail(str(exc), 2)
        except UnknownError as exc:
            fail(f"unknown: {exc}", 3)
        except InfeasibleError as exc:
            fail(f"infeasible: {exc}", 1)
        except PlannerError as exc:
            fail(str(exc), 1)

    return wrapper


def topology_of(path: Path) -> Topology:
    return Topology(load_cluster_spec(path))
