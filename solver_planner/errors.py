"""Exception hierarchy of solver_planner.

Every error the library raises on purpose derives from :class:`PlannerError`, so a caller
(the CLI in particular) can tell a user mistake from a bug.  The CLI maps them to exit
codes: :class:`SpecError`, :class:`OptionError` and :class:`MissingDependencyError` exit 2,
:class:`UnknownError` (a search that ran out of limits without an answer) exits 3,
:class:`InfeasibleError` and the others exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlannerError", "SpecError", "SpecIssue", "InfeasibleError", "UnitError", "LoweringError",
           "MissingDependencyError", "OptionError", "RefusedError", "UnknownError"]


class PlannerError(Exception):
    """Base class of every deliberate solver_planner error."""


class UnitError(PlannerError, ValueError):
    """A quantity such as ``"100Gbps"`` could not be read.

    It derives from ``ValueError`` so that pydantic turns it into a validation error
    located at the offending key.
    """


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec file: where it is and what was expected there."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        key = f" {self.path}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class SpecError(PlannerError):
    """A spec file is malformed or inconsistent.

    ``str(error)`` is a single line naming the file, the line, the key path and what was
    expected; further problems found in the same pass are counted at its end and kept in
    :attr:`issues`.
    """

    def __init__(self, issues: list[SpecIssue] | SpecIssue):
        # In file order, so the message names the first problem a reader meets.
        self.issues = sorted([issues] if isinstance(issues, SpecIssue) else issues, key=lambda i: (i.line or 0, i.path))
        if not self.issues:
            raise ValueError("SpecError needs at least one issue")
        first = str(self.issues[0])
        more = len(self.issues) - 1
        super().__init__(first if not more else f"{first} (and {more} more problem{'s' * (more > 1)})")


class InfeasibleError(PlannerError):
    """The problem as posed has no solution; the message says why.  ``shortfall``: when the
    reason is memory, the least a plan needs and how much is missing, as a phrase
    (``"needs 81.2 GiB per device, 1.2 GiB short"``) a summary can quote."""

    def __init__(self, message: str, shortfall: str | None = None):
        super().__init__(message)
        self.shortfall = shortfall


class LoweringError(PlannerError):
    """A program or schedule cannot become torch.distributed calls that match across ranks
    (the members of a call would hand it buffers of different sizes)."""


class MissingDependencyError(PlannerError):
    """An optional package (torch) is needed; the message says how to install it."""


class OptionError(PlannerError):
    """The options ask for something impossible for this cluster and model (exit 2)."""


def closest(value, choices, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The choices spelled most like ``value``, best first (what every "did you mean" offers)."""
    import difflib

    return difflib.get_close_matches(str(value), [str(c) for c in choices], n=n, cutoff=cutoff)


def unknown_choice(what: str, value, choices) -> str:
    """``unknown method 'cpsat'; expected one of: ... (did you mean 'cp-sat'?)``."""
    choices = [str(c) for c in choices]
    close = closest(value, choices)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {what} {str(value)!r}; expected one of: {', '.join(choices)}{hint}"


class RefusedError(OptionError):
    """The method cannot finish this instance; said before starting (exit 2)."""


class UnknownError(PlannerError):
    """Nothing was found within the limits and nothing was proven impossible (exit 3).
    ``bound``: the best lower bound proven on the answer, when the search has one."""

    def __init__(self, message: str, bound: float | None = None):
        super().__init__(message)
        self.bound = bound
