"""What every picture shares: the lazy matplotlib import, fixed fonts and SVG ids, the
colour-blind-safe palette, and saving by extension.

Determinism: a fixed ``svg.hashsalt`` (matplotlib otherwise salts its element ids with
random bytes), text kept as text (``svg.fonttype: none``, so no font file is embedded),
one font family shipped with matplotlib, and no creation date in the metadata.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from ..errors import MissingDependencyError, OptionError

__all__ = ["prepare", "require", "figure", "save", "svg_text", "OKABE_ITO", "SUFFIXES", "check_suffix", "time_unit"]

SUFFIXES = (".svg", ".png")

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common form of
# colour blindness.  Sequential data uses the 'cividis' colour map (designed for the same).
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
SEQUENTIAL = "cividis"
HIGHLIGHT = "#D55E00"

RC = {
    "svg.hashsalt": "solver-planner",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "path.simplify": True,
}

INSTALL = "install it with: python -m pip install 'solver-planner[plot]'"


def require():
    """The ``matplotlib`` module; :class:`MissingDependencyError` (exit 2) when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError(f"pictures need matplotlib, which is not installed; {INSTALL}") from None
    return matplotlib


def check_suffix(path: Path | str, what: str = "--plot") -> str:
    """'svg' or 'png' from ``path``'s extension; :class:`OptionError` for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise OptionError(f"{what} {path}: the picture's format comes from its extension; use .svg or .png")
    return suffix[1:]


@contextmanager
def figure(width: float, height: float):
    """A new figure (not registered with pyplot, so no GUI backend is touched) under the
    fixed style; save it inside the ``with`` block."""
    mpl = require()
    from matplotlib.figure import Figure

    with mpl.rc_context(RC):
        yield Figure(figsize=(width, height), layout="constrained")


def _metadata(fmt: str) -> dict:
    if fmt == "svg":
        return {"Date": None, "Creator": "solver-planner"}
    return {"Software": "solver-planner"}


def save(fig, path: Path | str) -> Path:
    """Write ``fig`` as SVG or PNG, by ``path``'s extension; returns the path."""
    path = Path(path)
    fmt = check_suffix(path)
    fig.savefig(path, format=fmt, metadata=_metadata(fmt), dpi=110)
    return path


def svg_text(fig) -> str:
    """``fig`` as SVG text (for inlining in HTML)."""
    import io

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_metadata("svg"))
    return buf.getvalue()


def time_unit(seconds: float) -> tuple[float, str]:
    """A scale and unit name for a time axis whose largest value is ``seconds``."""
    for scale, name in ((1.0, "s"), (1e-3, "ms")):
        if seconds >= scale:
            return scale, name
    return 1e-6, "µs"


def bytes_unit(nbytes: float) -> tuple[float, str]:
    """A scale and unit name (binary prefixes) for a byte axis whose largest value is ``nbytes``."""
    for scale, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return scale, name
    return 1.0, "B"


def prepare(path: Path | str | None, what: str = "--plot") -> None:
    """Before the work: refuse an extension other than .svg / .png (for ``--report``, .html)
    and a missing matplotlib, so that a long solve is not wasted."""
    if path is None:
        return
    if what == "--report":
        if Path(path).suffix.lower() not in (".html", ".htm"):
            raise OptionError(f"--report {path}: the report is one HTML file; give a name ending in .html")
    else:
        check_suffix(path, what)
    require()
