"""Pipeline schedules: the order in which each stage runs its forwards and backwards.

* GPipe (Huang et al. 2019): all forwards, then all backwards;
* 1F1B (DistIR §5, Narayanan et al. 2021): stage ``p`` of ``S`` runs ``W = S - p`` forwards
  (its warm-up), then alternates one backward and one forward, then drains its backwards;
* eager-1F1B (the resharding paper §4): like 1F1B with ``e`` more warm-up forwards on the stages that
  have them (``min(e, S - p - 1)``; ``e = S - 1`` is the paper's ``2 (S - p) - 1`` in all),
  so that a forward of another micro-batch sits between two dependent tasks and hides the
  transfer; ``e = 0`` is 1F1B;
* backward weight delaying (the resharding paper §4): a backward is split into its activation-gradient
  part ``BA`` (what the previous stage waits for) and its weight-gradient part ``BW``; ``BW``
  runs right after ``BA``, so the gradient transfer overlaps it, or, on a stage whose
  transfer outlasts ``BW`` (the paper's "delay the least to cover all communications", with
  the cost model's times), after the next forward.

Every stage runs its backwards in micro-batch order, and in the steady phase forward
``m + W`` follows backward ``m``: the objective's bounds (:mod:`.objective`) rely on both.

* ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3): 1F1B's order with every
  backward split into ``BA`` (input gradient, what the previous stage waits for) and ``BW``
  (weight gradient); stage ``p`` leaves its first ``p`` weight parts for the cool-down,
  where they fill the bubble: the bubble shrinks from ``(S - 1)(f + b)`` to
  ``(S - 1)(f + bA - bW)``, the activation memory stays 1F1B's first stage's;
* interleaved 1F1B (Narayanan et al. 2021 §2.2): the model is cut into ``v S`` chunks, chunk
  ``k`` on stage ``k mod S`` (each stage holds ``v`` chunks, "virtual stages"); a stage runs
  its forwards depth first, a round of micro-batches through one chunk, then the next, and
  its backwards in the reverse chunk order; the bubble is ``(S - 1)(f + b) / v``;
* ZB-V (Qi et al. 2024 §6): ``2 S`` chunks in a V, chunk ``k`` on stage ``k`` going down and
  on ``2 S - 1 - k`` coming back, with split backwards; the bubble vanishes when
  ``f = bA = bW``.

These three follow, step for step, the action lists of PyTorch's
``torch.distributed.pipelining`` (``ScheduleInterleavedZeroBubble`` with one stage per rank,
``ScheduleInterleaved1F1B``, ``ScheduleZBVZeroBubble``), which a test compares with
:func:`mesh_order`: what the plan predicts is what torch runs.  Interleaved 1F1B takes
torch's flexible rounds (``max(1, B // S)`` rounds of ``B / rounds`` micro-batches, so
``B`` must be a multiple of the rounds) rather than the paper's ``B`` multiple of ``S``.

A *family* is the set of schedules one ``--schedule`` stands for: ``1f1b``, ``gpipe`` and
``zb-h1`` one each; ``eager-1f1b`` every eagerness in ``{0, 1, 2, 4, ..., S - 1}`` with and
without weight delaying, the fastest (by simulation) of those that fit in memory being the
plan's; ``interleaved-1f1b`` every chunk count ``v >= 2`` the layers allow and ``zb-v`` its
two chunks (:func:`virtual_options`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..choices import SCHEDULES

__all__ = ["SCHEDULES", "VIRTUAL", "Schedule", "family", "stage_order", "warmup", "live_peak", "live_count",
           "mesh_order", "mesh_of", "chunks_on", "virtual_options", "rounds"]

# the schedules whose stages hold several model chunks
VIRTUAL = ("interleaved-1f1b", "zb-v")


@dataclass(frozen=True, order=True)
class Schedule:
    """One member of a family: the order rule, its eagerness and whether weights are delayed."""

    kind: str = "1f1b"
    eagerness: int = 0
    weight_delay: bool = False
    virtual: int = 1                  # model chunks per stage (interleaved 1F1B, ZB-V)

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule '{self.kind}'; expected one of: {', '.join(SCHEDULES)}")
        if self.kind == "zb-v" and self.virtual != 2:
            raise ValueError(f"ZB-V runs 2 model chunks per stage, not {self.virtual}")
        if self.kind == "interleaved-1f1b" and self.virtual < 2:
            raise ValueError(f"interleaved 1F1B runs at least 2 model chunks per stage, not {self.virtual}")
        if self.kind not in VIRTUAL and self.virtual != 1:
            raise ValueError(f"{self.kind} runs one model chunk per stage, not {self.virtual}")

    @property
    def split(self) -> bool:
        """Backwards run as BA and BW."""
        return self.weight_delay or self.kind in ("zb-h1", "zb-v")

    def __str__(self) -> str:
        if self.kind == "interleaved-1f1b":
            return f"interleaved-1f1b(v={self.virtual})"
        if self.kind != "eager-1f1b":
            return self.kind
        return f"eager-1f1b(e={self.eagerness}{', weight delay' if self.weight_delay else ''})"


def family(kind: str, stages: int) -> list[Schedule]:
    """The schedules ``--schedule kind`` lets the search choose from on ``stages`` stages."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule '{kind}'; expected one of: {', '.join(SCHEDULES)}")
    if kind == "zb-v":
        return [Schedule(kind, virtual=2)]
    if kind == "interleaved-1f1b":
        raise ValueError("interleaved 1F1B's chunk counts depend on the layers: use virtual_options")
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
    if schedule.virtual > 1:
        raise ValueError(f"{schedule} runs several chunks per stage: use mesh_order")
    extra = min(schedule.eagerness, stages - p - 1) if schedule.kind == "eager-1f1b" else 0
    return max(1, min(stages - p + extra, microbatches))


def stage_order(schedule: Schedule, stages: int, p: int, microbatches: int,
                delay: bool = False) -> list[tuple[str, int]]:
    """The (op, micro-batch) sequence stage ``p`` runs; ops are ``F`` and ``B``, or ``F``,
    ``BA`` and ``BW`` with weight delaying (``delay``: ``BW`` after the next forward)."""
    # built once per argument set (a copy each call): the search asks for the same orders
    # for every plan it prices (16 384 micro-batches: 22 s of list building in one plan)
    key = (schedule, stages, p, microbatches, delay)
    order = _ORDERS.get(key)
    if order is None:
        order = tuple(_build_stage_order(schedule, stages, p, microbatches, delay))
        if _ORDERS_HELD[0] + len(order) > ORDER_OPS:
            _ORDERS.clear()                 # a bound on what is kept, not a policy
            _ORDERS_HELD[0] = 0
        _ORDERS[key] = order
        _ORDERS_HELD[0] += len(order)
    return list(order)


# stage orders kept, at most ORDER_OPS ops in all (about 100 bytes each)
ORDER_OPS = 2_000_000
_ORDERS: dict[tuple, tuple[tuple[str, int], ...]] = {}
_ORDERS_HELD = [0]


def _build_stage_order(schedule: Schedule, stages: int, p: int, microbatches: int,
                       delay: bool = False) -> list[tuple[str, int]]:
    B = microbatches
    if schedule.kind == "zb-h1":
        return [(op, m) for op, _, m in _zero_bubble_h1(stages, p, B)]
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
    if schedule.kind == "zb-h1":
        return live_peak(stage_order(schedule, stages, p, microbatches))
    W = warmup(schedule, stages, p, microbatches)
    return W + 1 if schedule.split and delay and microbatches > W else W


# -- schedules by chunk: (op, chunk, micro-batch) per stage -------------------------------
def mesh_of(schedule: Schedule, stages: int, chunk: int) -> int:
    """The stage (mesh) that runs model chunk ``chunk``."""
    if schedule.kind == "zb-v":
        return chunk if chunk < stages else 2 * stages - 1 - chunk
    return chunk % stages


def chunks_on(schedule: Schedule, stages: int, p: int) -> list[int]:
    """The model chunks stage ``p`` holds, in model order."""
    return sorted(k for k in range(stages * schedule.virtual) if mesh_of(schedule, stages, k) == p)


def rounds(stages: int, microbatches: int) -> tuple[int, int] | None:
    """Interleaved 1F1B's (rounds, micro-batches per round): ``max(1, B // S)`` rounds, which
    must divide ``B`` (None when they do not)."""
    n = max(1, microbatches // stages)
    return None if microbatches % n else (n, microbatches // n)


# the most chunks an interleaved plan has in all: the objective's bounds of a plan grow with
# the square of its chunks (10 000 layers on 8 stages would offer 1 250 chunks per stage)
MAX_CHUNKS = 1024


def virtual_options(kind: str, stages: int, blocks: int, microbatches: int) -> list[int]:
    """Chunk counts per stage ``kind`` may use with ``blocks`` repeated layers to share out:
    at least one block per chunk, at most :data:`MAX_CHUNKS` chunks in all, and for
    interleaved 1F1B a round structure ``B`` allows."""
    if kind == "zb-v":
        return [2] if 2 * stages <= blocks else []
    if kind != "interleaved-1f1b" or stages < 2 or rounds(stages, microbatches) is None:
        return []
    return [v for v in range(2, min(blocks, MAX_CHUNKS) // stages + 1)]


def mesh_order(schedule: Schedule, stages: int, p: int, microbatches: int,
               delay: bool = False) -> list[tuple[str, int, int]]:
    """The (op, chunk, micro-batch) sequence stage ``p`` runs, for every schedule (chunk
    ``p`` when a stage holds one)."""
    return list(_mesh_order(schedule, stages, p, microbatches, delay))


@functools.lru_cache(maxsize=1024)
def _mesh_order(schedule: Schedule, stages: int, p: int, microbatches: int, delay: bool) -> tuple:
    # every plan of a pair asks for the same orders (the search reads them per plan)
    if schedule.kind == "interleaved-1f1b":
        return tuple(_interleaved(stages, p, microbatches, schedule.virtual))
    if schedule.kind == "zb-v":
        return tuple(_zero_bubble_v(stages, p, microbatches))
    return tuple((op, p, m) for op, m in stage_order(schedule, stages, p, microbatches, delay))


def _zero_bubble_h1(S: int, p: int, B: int) -> list[tuple[str, int, int]]:
    """ZB-H1: ``S - 1 - p`` warm-up forwards, then forward ``i + W`` and ``BA`` of ``i``
    alternate; from backward ``p`` on, each ``BA`` is followed by the oldest pending ``BW``;
    the ``BW`` left run at the end (Qi et al. 2024 §3, Figure 3)."""
    W = min(S - 1 - p, B)
    out: list[tuple[str, int, int]] = [("F", p, m) for m in range(W)]
    pending = 0
    for i in range(B):
        if W + i < B:
            out.append(("F", p, W + i))
        out.append(("BA", p, i))
        if i >= p:
            out.append(("BW", p, pending))
            pending += 1
    out += [("BW", p, m) for m in range(pending, B)]
    return out


def _interleaved(S: int, p: int, B: int, v: int) -> list[tuple[str, int, int]]:
    """Interleaved 1F1B on stage ``p``: forwards go a round of micro-batches through a chunk
    before the next chunk (depth first), backwards through the chunks in reverse; the
    warm-up covers ``v - 1`` rounds and two steps per stage below the last one."""
    r = rounds(S, B)
    if r is None:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({B}) to be a multiple of its rounds "
                         f"({max(1, B // S)})")
    per_round = r[1]
    total = v * B
    warm = min((v - 1) * per_round + 2 * (S - 1 - p), total)
    fwd_next = [0] * v
    bwd_next = [0] * v
    out: list[tuple[str, int, int]] = []

    def forward(i: int) -> None:
        local = (i // per_round) % v
        out.append(("F", local * S + p, fwd_next[local]))
        fwd_next[local] += 1

    def backward(j: int) -> None:
        local = v - 1 - (j // per_round) % v
        out.append(("B", local * S + p, bwd_next[local]))
        bwd_next[local] += 1

    for i in range(warm):
        forward(i)
    for i in range(warm, total):
        forward(i)
        backward(i - warm)
    for j in range(total - warm, total):
        backward(j)
    return out


def _zero_bubble_v(S: int, p: int, B: int) -> list[tuple[str, int, int]]:
    """ZB-V on stage ``p`` (chunks ``p`` going down, ``2 S - 1 - p`` coming back): warm-up
    forwards of the first chunk, then of both, then the second chunk's F, BA, BW; a steady
    phase of F, BA, BW on each chunk; a cool-down of input gradients whose weight parts fill
    the end (Qi et al. 2024 §6, Figure 8).  Planned with at least ``2 S - 1`` micro-batches;
    the ops of the micro-batches beyond ``B`` are then left out."""
    n = max(2 * S - 1, B)
    c0, c1 = p, 2 * S - 1 - p
    f = {c0: 0, c1: 0}
    b = {c0: 0, c1: 0}
    out: list[tuple[str, int, int]] = []

    def op(kind: str, chunk: int, counter: dict) -> None:
        out.append((kind, chunk, counter[chunk]))
        counter[chunk] += 1

    for _ in range(2 * (S - p) - 1):
        op("F", c0, f)
    for _ in range(p):
        op("F", c1, f)
        op("F", c0, f)
    for _ in range(S - p):
        op("F", c1, f)
        out += [("BA", c1, b[c1]), ("BW", c1, b[c1])]
        b[c1] += 1
    while f[c1] < f[c0] or f[c0] < n:
        if f[c0] < n:
            op("F", c0, f)
        out += [("BA", c0, b[c0]), ("BW", c0, b[c0])]
        b[c0] += 1
        op("F", c1, f)
        out += [("BA", c1, b[c1]), ("BW", c1, b[c1])]
        b[c1] += 1
    w = dict(b)
    for _ in range(p):
        op("BA", c0, b)
        op("BA", c1, b)
    for _ in range(S - p):
        op("BA", c0, b)
        op("BW", c0, w)
    while w[c1] < b[c1]:
        op("BW", c1, w)
    while w[c0] < b[c0]:
        op("BW", c0, w)
    return [x for x in out if x[2] < B]
