"""Pipeline schedules: the order in which each stage runs its forwards and backwards.

* GPipe (Huang et al. 2019): all forwards, then all backwards;
* 1F1B (seed 004 §5, Narayanan et al. 2021): stage ``p`` of ``S`` runs ``W = S - p`` forwards
  (its warm-up), then alternates one backward and one forward, then drains its backwards;
* eager-1F1B (seed 002 §4): like 1F1B with ``e`` more warm-up forwards on the stages that
  have them (``min(e, S - p - 1)``; ``e = S - 1`` is the paper's ``2 (S - p) - 1`` in all),
  so that a forward of another micro-batch sits between two dependent tasks and hides the
  transfer; ``e = 0`` is 1F1B;
* backward weight delaying (seed 002 §4): a backward is split into its activation-gradient
  part ``BA`` (what the previous stage waits for) and its weight-gradient part ``BW``; ``BW``
  runs right after ``BA``, so the gradient transfer overlaps it, or, on a stage whose
  transfer outlasts ``BW`` (the paper's "delay the least to cover all communications", with
  the cost model's times), after the next forward.

Every stage runs its backwards in micro-batch order, and in the steady phase forward
``m + W`` follows backward ``m``: the objective's bounds (:mod:`.objective`) rely on both.

A *family* is the set of schedules one ``--schedule`` stands for: ``1f1b`` and ``gpipe`` one
each; ``eager-1f1b`` every eagerness in ``{0, 1, 2, 4, ..., S - 1}`` with and without weight
delaying, the fastest (by simulation) of those that fit in memory being the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..choices import SCHEDULES

__all__ = ["SCHEDULES", "Schedule", "family", "stage_order", "warmup", "live_peak", "live_count"]


@dataclass(frozen=True, order=True)
class Schedule:
    """One member of a family: the order rule, its eagerness and whether weights are delayed."""

    kind: str = "1f1b"
    eagerness: int = 0
    weight_delay: bool = False

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule '{self.kind}'; expected one of: {', '.join(SCHEDULES)}")

    @property
    def split(self) -> bool:
        return self.weight_delay

    def __str__(self) -> str:
        if self.kind != "eager-1f1b":
            return self.kind
        return f"eager-1f1b(e={self.eagerness}{', weight delay' if self.weight_delay else ''})"


def family(kind: str, stages: int) -> list[Schedule]:
    """The schedules ``--schedule kind`` lets the search choose from on ``stages`` stages."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule '{kind}'; expected one of: {', '.join(SCHEDULES)}")
    if kind != "eager-1f1b":
        return [Schedule(kind)]
    levels = {0, max(0, stages - 1)}
    e = 1
    while e < stages - 1:
        levels.add(e)
        e *= 2
    return [Schedule(kind, e, wd) for e in sorted(levels) for wd in (False, True)]


def warmup(schedule: Schedule, stages: int, p: int, microbatches: int) -> int:
    """Forwards stage ``p`` runs before its first backward (``W_p``)."""
    if schedule.kind == "gpipe":
        return microbatches
    extra = min(schedule.eagerness, stages - p - 1) if schedule.kind == "eager-1f1b" else 0
    return max(1, min(stages - p + extra, microbatches))


def stage_order(schedule: Schedule, stages: int, p: int, microbatches: int,
                delay: bool = False) -> list[tuple[str, int]]:
    """The (op, micro-batch) sequence stage ``p`` runs; ops are ``F`` and ``B``, or ``F``,
    ``BA`` and ``BW`` with weight delaying (``delay``: ``BW`` after the next forward)."""
    B = microbatches
    W = warmup(schedule, stages, p, B)
    order: list[tuple[str, int]] = [("F", m) for m in range(W)]
    nf = W
    for m in range(B):
        if not schedule.split:
            order.append(("B", m))
            if nf < B:
                order.append(("F", nf))
                nf += 1
            continue
        order.append(("BA", m))
        if nf < B and delay:
            order += [("F", nf), ("BW", m)]
            nf += 1
        elif nf < B:
            order += [("BW", m), ("F", nf)]
            nf += 1
        else:
            order.append(("BW", m))
    return order


def live_peak(order: list[tuple[str, int]]) -> int:
    """Most micro-batches whose activations are kept at once (from a forward to the end of
    its backward)."""
    live = peak = 0
    for op, _ in order:
        if op == "F":
            live += 1
            peak = max(peak, live)
        elif op in ("B", "BW"):
            live -= 1
    return peak


def live_count(schedule: Schedule, stages: int, p: int, microbatches: int, delay: bool = False) -> int:
    """:func:`live_peak` of :func:`stage_order` without building it: the warm-up forwards, one
    more when a delayed ``BW`` waits for the next forward."""
    W = warmup(schedule, stages, p, microbatches)
    return W + 1 if schedule.split and delay and microbatches > W else W
