"""A stage plan: contiguous layer ranges with a configuration each, on one mesh shape and
micro-batch count, and the per-stage numbers every evaluator reads."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .costs import StageConfig, StageCosts

__all__ = ["StagePlan", "Partition"]


@dataclass(frozen=True, order=True)
class StagePlan:
    """Layers ``first..last`` (inclusive) with configuration ``config``."""

    first: int
    last: int
    config: StageConfig

    @property
    def tensor(self) -> int:
        return self.config.tensor


class Partition:
    """A full plan for one (mesh shape, micro-batch count).

    Stage ``p`` runs ``forward[p]`` per micro-batch, ``backward_act[p] + backward_weight[p]``
    backward; ``channels[(p, q)]`` are the bytes per sample that go from stage ``p`` to a
    later stage ``q`` (the next one, or farther for a skip connection).
    """

    def __init__(self, costs: StageCosts, stages: list[StagePlan] | tuple[StagePlan, ...]):
        stages = tuple(stages)
        L = costs.model.num_layers
        if len(stages) != costs.stages or stages[0].first != 0 or stages[-1].last != L - 1 or any(
                a.last + 1 != b.first for a, b in zip(stages, stages[1:])) or any(s.first > s.last for s in stages):
            raise ValueError(f"not a partition of {L} layers into {costs.stages} stages: {stages}")
        for st in stages:
            if st.config not in costs.configs:
                raise ValueError(f"configuration {st.config} is not possible on {costs.shape} with"
                                 f" {costs.microbatches} micro-batches")
        self.costs = costs
        self.stages = stages

    @property
    def key(self) -> tuple:
        return (self.costs.shape, self.costs.microbatches, self.stages)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partition) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        cuts = ", ".join(f"{s.first}-{s.last}:{s.config}" for s in self.stages)
        return f"Partition({self.costs.shape}, B={self.costs.microbatches}, [{cuts}])"

    def _per_stage(self, attr: str) -> list[float]:
        return [float(getattr(self.costs[s.config], attr)[s.first, s.last]) for s in self.stages]

    @cached_property
    def forward(self) -> list[float]:
        return self._per_stage("forward")

    @cached_property
    def backward_act(self) -> list[float]:
        return self._per_stage("backward_act")

    @cached_property
    def backward_weight(self) -> list[float]:
        return self._per_stage("backward_weight")

    @cached_property
    def backward(self) -> list[float]:
        return [a + w for a, w in zip(self.backward_act, self.backward_weight)]

    @cached_property
    def tail_full(self) -> list[float]:
        return self._per_stage("tail_full")

    @cached_property
    def tail_weight(self) -> list[float]:
        return self._per_stage("tail_weight")

    def memory(self, live: list[int]) -> list[float]:
        """Peak bytes per device of each stage with ``live[p]`` micro-batches kept."""
        c = self.costs
        return [float(c.memory(s.config, n)[s.first, s.last]) for s, n in zip(self.stages, live)]

    @cached_property
    def owner(self) -> list[int]:
        out = []
        for p, st in enumerate(self.stages):
            out += [p] * (st.last - st.first + 1)
        return out

    @cached_property
    def channels(self) -> dict[tuple[int, int], float]:
        """Bytes per sample from stage p to a later stage q, for every pair some tensor crosses."""
        out: dict[tuple[int, int], float] = {}
        own = self.owner
        for a, b, nbytes in self.costs.model.edges():
            if own[a] != own[b]:
                out[own[a], own[b]] = out.get((own[a], own[b]), 0.0) + nbytes
        return dict(sorted(out.items()))

    def activation_time(self, p: int, q: int) -> float:
        """One micro-batch's tensors from stage p to stage q (0 if none)."""
        if (p, q) not in self.channels:
            return 0.0
        t = self.stages[p].tensor
        return self.costs.transfer_time(t, p, q, self.channels[p, q] * self.costs.samples(t))

    def gradient_time(self, q: int, p: int) -> float:
        """One micro-batch's gradients from stage q back to stage p < q (0 if none)."""
        if (p, q) not in self.channels:
            return 0.0
        t = self.stages[q].tensor
        return self.costs.transfer_time(t, q, p, self.channels[p, q] * self.costs.samples(t))

    @cached_property
    def copies(self) -> list[tuple[int, int, int]]:
        """(shared layer, layer holding a copy, stage of the copy) for ties split over stages."""
        own = self.owner
        return [(a, b, own[b]) for a, b in self.costs.model.ties() if own[a] != own[b]]

