"""The layer model: per-layer work and memory, per sample, in execution order.

Defaults, each a standard rule of thumb:

* backward FLOPs = 2 x forward (one product for the input gradient, one for the weight
  gradient; Kaplan et al. 2020 §2.1, Narayanan et al. 2021 §5.1);
* gradients take as many bytes as the parameters;
* optimizer state per parameter: Adam keeps two fp32 moments and, when training in 16
  bits, an fp32 master copy (seed 002 Table 1: 216M parameters, 432M optimizer-state
  parameters, 2.95 GB of weights and optimizer = 2 + 4 + 8 bytes per parameter); plain
  SGD keeps only the master copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PlannerError
from ..spec.layers import FLOAT_DTYPES, LayerSpec, TrainingSpec, TransformerSpec
from ..spec.model import ModelSpec

__all__ = ["Layer", "LayerModel", "transformer_layers", "layer_model", "optimizer_bytes_per_param"]


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> float:
    """Optimizer-state bytes per parameter (see the module docstring)."""
    master = 4.0 if FLOAT_DTYPES[dtype] < 4 else 0.0
    moments = 8.0 if optimizer == "adam" else 0.0
    return master + moments


@dataclass(frozen=True)
class Layer:
    """One layer, quantities per sample; ``skips`` are indices of later layers reading its output."""

    name: str
    forward: float
    backward: float
    params: float
    optimizer: float
    activations: float
    saved: float
    saved_replicated: float = 0.0
    allreduces: int = 2
    skips: tuple[int, ...] = ()


def transformer_layers(spec: TransformerSpec, dtype: str = "bfloat16", optimizer: str = "adam") -> list[Layer]:
    """Embedding, ``spec.layers`` decoder blocks and the logits layer of a GPT-style model.

    Per sample of ``s`` tokens, hidden size ``h``, ``a`` heads, vocabulary ``V``, ``e``
    bytes per element:

    * block parameters ``12 h^2 + 13 h`` and forward FLOPs ``24 s h^2 + 4 s^2 h``
      (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
      Clusters", §5.1: 72 B s l h^2 (1 + s/6h) FLOPs per iteration for l layers, of which a
      third is the forward pass);
    * activations kept for backward ``s h (34 + 5 a s / h)`` bytes at 16 bits, of which
      ``10 s h`` stay on every tensor-parallel device and the rest is split (Korthikanti et
      al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1);
    * the embedding holds ``V h + s h`` parameters (token and position tables); the
      logits layer shares the token table (GPT-3 ties them) and costs ``2 s h V`` FLOPs.
    """
    s, h, a, v = spec.sequence, spec.hidden, spec.heads, spec.vocab
    e = FLOAT_DTYPES[dtype]
    opt = optimizer_bytes_per_param(optimizer, dtype)
    scale = e / 2.0                      # Korthikanti's byte counts assume 16-bit activations
    out = float(s * h * e)
    block_params = 12.0 * h * h + 13.0 * h
    block_fwd = 24.0 * s * h * h + 4.0 * s * s * h
    layers = [Layer("embed", 0.0, 0.0, (v * h + s * h) * e, (v * h + s * h) * opt, out, out, 0.0, 1)]
    block = Layer("block", block_fwd, 2 * block_fwd, block_params * e, block_params * opt, out,
                  s * h * (24.0 + 5.0 * a * s / h) * scale, 10.0 * s * h * scale, 2)
    layers += [block] * spec.layers
    logits = 2.0 * s * h * v
    layers.append(Layer("logits", logits, 2 * logits, 0.0, 0.0, 0.0, float(s * v * e), 0.0, 1))
    return layers


def _from_specs(specs: list[LayerSpec], training: TrainingSpec) -> list[Layer]:
    opt = optimizer_bytes_per_param(training.optimizer, training.dtype) / FLOAT_DTYPES[training.dtype]
    index: dict[str, int] = {}
    n = 0
    for spec in specs:
        index.setdefault(spec.name, n)
        n += spec.repeat
    layers = []
    for spec in specs:
        layer = Layer(
            name=spec.name,
            forward=spec.flops,
            backward=2 * spec.flops if spec.backward_flops is None else spec.backward_flops,
            params=spec.params,
            optimizer=spec.params * opt if spec.optimizer_state is None else spec.optimizer_state,
            activations=spec.activations,
            saved=spec.activations if spec.saved is None else spec.saved,
            saved_replicated=spec.saved_replicated,
            allreduces=spec.allreduces,
            skips=tuple(index[t] for t in spec.skip_to),
        )
        layers += [layer] * spec.repeat
    return layers


@dataclass
class LayerModel:
    """The layers of a model with prefix sums, so a stage's totals cost O(1)."""

    name: str
    layers: list[Layer]
    global_batch: int
    microbatches: int | None          # None: search
    dtype: str = "bfloat16"
    arrays: dict[str, np.ndarray] = field(init=False, repr=False)
    _cache: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise PlannerError(f"model '{self.name}' has no layers")
        cols = {
            "forward": [x.forward for x in self.layers],
            "backward": [x.backward for x in self.layers],
            "params": [x.params for x in self.layers],
            "optimizer": [x.optimizer for x in self.layers],
            "saved": [x.saved for x in self.layers],
            "saved_replicated": [x.saved_replicated for x in self.layers],
            "allreduces": [x.allreduces for x in self.layers],
            "allreduce_bytes": [x.allreduces * x.activations for x in self.layers],
        }
        self.arrays = {k: np.concatenate([[0.0], np.cumsum(np.asarray(v, dtype=float))]) for k, v in cols.items()}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def edges(self) -> list[tuple[int, int, float]]:
        """Every tensor that leaves a layer for a later one: (producer, consumer, bytes per sample)."""
        out = [(i, i + 1, x.activations) for i, x in enumerate(self.layers[:-1])]
        out += [(i, j, x.activations) for i, x in enumerate(self.layers) for j in x.skips if j != i + 1]
        return out

    def range_sums(self, key: str) -> np.ndarray:
        """``M[k, i]`` = sum of ``key`` over layers k..i (inclusive), 0 below the diagonal.
        Cached: every (mesh, micro-batch) problem reads the same matrices."""
        if key not in self._cache:
            p = self.arrays[key]
            self._cache[key] = np.triu(p[None, 1:] - p[:-1, None])
        return self._cache[key]

    def boundary_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        if "boundary" not in self._cache:
            self._cache["boundary"] = self._boundary_bytes()
        return self._cache["boundary"]

    def _boundary_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per sample, for a stage of layers k..i: bytes it sends forward (to later stages)
        and bytes of gradients it sends backward (to earlier stages)."""
        n = self.num_layers
        send = np.zeros((n, n))
        recv = np.zeros((n, n))
        k = np.arange(n)[:, None]
        i = np.arange(n)[None, :]
        for a, b, nbytes in self.edges():
            send += np.where((k <= a) & (a <= i) & (i < b), nbytes, 0.0)
            recv += np.where((a < k) & (k <= b) & (b <= i), nbytes, 0.0)
        return np.triu(send), np.triu(recv)


def layer_model(model: ModelSpec) -> LayerModel:
    """The layer model of a model spec; a clear error when it has none."""
    if model.training is None or (not model.layers and model.transformer is None):
        raise model.source.error((), "stage partitioning needs 'layers' (or 'transformer') and 'training' sections")
    t = model.training
    if model.transformer is not None:
        layers = transformer_layers(model.transformer, t.dtype, t.optimizer)
    else:
        layers = _from_specs(model.layers, t)
    micro = None if t.microbatches == "auto" else int(t.microbatches)
    return LayerModel(model.name, layers, t.global_batch, micro, t.dtype)
