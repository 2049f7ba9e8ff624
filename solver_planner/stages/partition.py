"""A stage plan: contiguous layer ranges with a configuration each, on one mesh shape and
micro-batch count, and the per-stage numbers every evaluator reads."""

from __future__ import annotations

import numpy as np

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
    """A full plan for one (mesh shape, micro-batch count), or for meshes of unequal shapes
    when ``costs`` is a :class:`~.meshes.MeshCosts` (``costs.of(m)``: mesh m's tables).

    Stage ``p`` runs ``forward[p]`` per micro-batch, ``backward_act[p] + backward_weight[p]``
    backward; ``channels[(p, q)]`` are the bytes per sample that go from stage ``p`` to a
    later stage ``q`` (the next one, or farther for a skip connection).

    With model chunks (interleaved 1F1B, ZB-V), ``stages`` are the chunks in model order and
    ``mesh[k]`` the mesh (pipeline stage) chunk ``k`` runs on; every mesh holds the same
    number of chunks.  Without, ``mesh[p] = p``.
    """

    def __init__(self, costs: StageCosts, stages: list[StagePlan] | tuple[StagePlan, ...],
                 mesh: tuple[int, ...] | None = None):
        stages = tuple(stages)
        L = costs.model.num_layers
        mesh = tuple(range(len(stages))) if mesh is None else tuple(mesh)
        per_mesh = len(stages) // costs.stages if costs.stages else 0
        if (len(stages) % costs.stages or len(mesh) != len(stages)
                or sorted(mesh) != sorted(p for p in range(costs.stages) for _ in range(per_mesh))):
            raise ValueError(f"{len(stages)} chunks on meshes {mesh} do not fill {costs.stages} stages evenly")
        if stages[0].first != 0 or stages[-1].last != L - 1 or any(
                a.last + 1 != b.first for a, b in zip(stages, stages[1:])) or any(s.first > s.last for s in stages):
            raise ValueError(f"not a partition of {L} layers into {len(stages)} stages: {stages}")
        for m, st in zip(mesh, stages):
            own = costs.of(m)
            if st.config not in own.configs:
                raise ValueError(f"configuration {st.config} is not possible on {own.shape} with"
                                 f" {costs.microbatches} micro-batches")
        config_of: dict[int, object] = {}
        if any(config_of.setdefault(m, st.config) != st.config for m, st in zip(mesh, stages)):
            raise ValueError("the chunks of one mesh must share its configuration")
        self.costs = costs
        self.stages = stages
        self.mesh = mesh

    @property
    def virtual(self) -> int:
        """Model chunks per mesh."""
        return len(self.stages) // self.costs.stages

    @property
    def key(self) -> tuple:
        return (self.costs.key, self.costs.microbatches, self.stages, self.mesh)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partition) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        cuts = ", ".join(f"{s.first}-{s.last}:{s.config}" for s in self.stages)
        return f"Partition({self.meshes}, B={self.costs.microbatches}, [{cuts}])"

    @property
    def meshes(self) -> str:
        """The mesh shape, or each mesh's shape when they differ."""
        shapes = [self.costs.of(m).shape for m in range(self.costs.stages)]
        return str(shapes[0]) if len(set(shapes)) == 1 else " ".join(map(str, shapes))

    @property
    def equal(self) -> bool:
        """Every mesh has the same shape."""
        return len({self.costs.of(m).shape for m in range(self.costs.stages)}) == 1

    @property
    def stage_size(self):
        """What the pictures place tasks by: the devices per mesh, or on unequal meshes
        ``{device: (mesh, its devices)}`` (:func:`solver_planner.simulate.trace.stage_of`)."""
        c = self.costs
        if self.equal:
            return c.mesh_size(0)
        return {c.first_device(m) + j: (m, c.mesh_size(m)) for m in range(c.stages) for j in range(c.mesh_size(m))}

    def table(self, p: int):
        """The :class:`~.costs.ConfigCosts` of stage (chunk) ``p``: its configuration on its mesh."""
        return self.costs.of(self.mesh[p])[self.stages[p].config]

    def _per_stage(self, attr: str) -> list[float]:
        # one lookup per (mesh tables, configuration): a range table reads many cells at once
        groups: dict = {}
        for p, s in enumerate(self.stages):
            groups.setdefault((id(self.costs.of(self.mesh[p])), s.config), []).append(p)
        out = [0.0] * len(self.stages)
        for members in groups.values():
            table = getattr(self.table(members[0]), attr)
            firsts = np.asarray([self.stages[p].first for p in members])
            lasts = np.asarray([self.stages[p].last for p in members])
            for p, v in zip(members, np.asarray(table[firsts, lasts], dtype=float).tolist()):
                out[p] = v
        return out

    def _with_copies(self, attr: str, part: int) -> list[float]:
        """:meth:`_per_stage`, plus what each tied copy held away from its shared layer's mesh
        adds (its ZeRO collectives, :attr:`.costs.ConfigCosts.copy_collectives` ``[part]``)."""
        out = self._per_stage(attr)
        for _, b, q in self.copies:
            extra = self.table(q).copy_collectives
            if extra:
                out[q] += float(extra[part][b])
        return out

    @cached_property
    def forward(self) -> list[float]:
        return self._with_copies("forward", 0)

    @cached_property
    def backward_act(self) -> list[float]:
        return self._with_copies("backward_act", 1)

    @cached_property
    def backward_weight(self) -> list[float]:
        return self._with_copies("backward_weight", 2)

    @cached_property
    def backward(self) -> list[float]:
        return [a + w for a, w in zip(self.backward_act, self.backward_weight)]

    @cached_property
    def tail_full(self) -> list[float]:
        return self._per_stage("tail_full")

    @cached_property
    def gather_ready(self) -> list[float]:
        """When each chunk's first forward may start, its first parameter gather done (0
        without Megatron-LM's --overlap-param-gather: :attr:`.costs.ConfigCosts.gather_ready`)."""
        return self._gather("gather_ready")

    @cached_property
    def gather_wait(self) -> list[float]:
        """How much longer each chunk's first forward takes, waiting for the gathers that
        follow (:attr:`.costs.ConfigCosts.gather_wait`)."""
        return self._gather("gather_wait")

    def _gather(self, attr: str) -> list[float]:
        out = []
        for p, st in enumerate(self.stages):
            table = getattr(self.table(p), attr)
            out.append(0.0 if table is None else float(table[st.first, st.last]))
        return out

    @cached_property
    def optimizer(self) -> list[float]:
        """Each stage's optimizer step (the last part of :attr:`tail_full` and :attr:`tail_weight`)."""
        return self._per_stage("optimizer")

    @cached_property
    def tail_weight(self) -> list[float]:
        return self._per_stage("tail_weight")

    def memory(self, live: list[int]) -> list[float]:
        """Peak bytes per device of each stage with ``live[p]`` micro-batches kept."""
        c = self.costs
        return [float(c.of(m).memory(s.config, n)[s.first, s.last]) for m, s, n in zip(self.mesh, self.stages, live)]

    def mesh_memory(self, orders: list[list[tuple[str, int, int]]]) -> tuple[list[float], list[int]]:
        """Peak bytes per device of each mesh running ``orders`` ((op, chunk, micro-batch) per
        mesh), and the most micro-batches it keeps at once: its chunks' weights, gradients
        and optimizer state, the activations of every micro-batch between its forward and
        the end of its backward on each chunk (the peak of their sum over the order), and
        the largest transient of a backward.  A tied copy on the mesh of its original is
        counted like one elsewhere (a little memory too much, never too little)."""
        c = self.costs
        parts = [tuple(float(x[s.first, s.last]) for x in c.of(m).memory_parts(s.config))
                 for m, s in zip(self.mesh, self.stages)]
        out, counts = [], []
        for p, order in enumerate(orders):
            chunks = [k for k in range(len(self.stages)) if self.mesh[k] == p]
            live = peak = 0.0
            n = most = 0
            for op, k, _ in order:
                if op == "F":
                    live += parts[k][1]
                    n += 1
                    peak, most = max(peak, live), max(most, n)
                elif op in ("B", "BW"):
                    live -= parts[k][1]
                    n -= 1
            out.append(sum(parts[k][0] for k in chunks) + peak + max(parts[k][2] for k in chunks))
            counts.append(most)
        return out, counts

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
        """One micro-batch's tensors from stage p to stage q (0 if none, or on one mesh)."""
        if (p, q) not in self.channels:
            return 0.0
        return self.costs.pipe_time(self.stages[p].tensor, self.mesh[p], self.stages[q].tensor, self.mesh[q],
                                    self.channels[p, q])

    def gradient_time(self, q: int, p: int) -> float:
        """One micro-batch's gradients from stage q back to stage p < q (0 if none)."""
        if (p, q) not in self.channels:
            return 0.0
        return self.costs.pipe_time(self.stages[q].tensor, self.mesh[q], self.stages[p].tensor, self.mesh[p],
                                    self.channels[p, q])

    def transfer_ports(self, p: int, q: int) -> tuple[str, ...]:
        """The ports one micro-batch's tensors from stage (chunk) ``p`` to ``q`` hold (none
        between chunks of one mesh)."""
        if self.mesh[p] == self.mesh[q]:
            return ()
        return self.costs.pipe_ports(self.stages[p].tensor, self.mesh[p], self.stages[q].tensor, self.mesh[q])

    @cached_property
    def copies(self) -> list[tuple[int, int, int]]:
        """(shared layer, layer holding a copy, stage of the copy) for ties split over meshes."""
        own = self.owner
        return [(a, b, own[b]) for a, b in self.costs.model.ties() if self.mesh[own[a]] != self.mesh[own[b]]]

