"""How long a device takes for a layer's kernels: the compute half of the cost model.

Three models, chosen per run (``--compute``):

* ``peak``: ``FLOPs / peak``, the model of earlier versions.  It makes a kernel of one
  sample as efficient as one of thousands, so tiny micro-batches look free.
* ``roofline`` (the default when the device has a memory bandwidth but no ``compute`` block,
  e.g. a spec written from datasheets): each kernel takes ``max(F / peak, M / memory_bandwidth)``
  (Williams, Waterman & Patterson 2009), never pure peak when the bandwidth is known.
* ``efficiency`` (the default with a ``compute`` block, which a device preset brings; DistIR
  §4: per-op costs are linear regressions on the op's sizes, whose coefficients are kernel
  launch overhead, FLOP rate and DRAM bandwidth).  A pass over a layer that runs ``k``
  matrix-multiply kernels of ``F`` FLOPs in all and moves ``M`` bytes through device memory
  takes::

      k * overhead + max((F + k * x_half) / (peak * e_max),  M / (memory_bandwidth * e_mem))

  The first term of the max is ``F / (peak * e(x))`` with ``e(x) = e_max * x / (x + x_half)``
  the efficiency of a kernel of ``x = F / k`` FLOPs: it rises with the kernel's size and
  saturates at ``e_max``; written this way it is affine in ``F``, i.e. DistIR's
  regression.  The second is the roofline's memory side at the bandwidth a streaming kernel
  reaches (``e_mem``, ``memory_efficiency``): a pass over one sample reads the whole weight
  matrix, so a pipeline of one-sample micro-batches is bound by memory bandwidth, not by
  FLOPs (DistIR Table 2: pure pipeline parallelism 21.7x slower than pure tensor
  parallelism on MLP 1B at batch 128).  Memory-bound passes (norms, activations, the
  optimizer step) take ``k * overhead + M / (memory_bandwidth * e_mem)``
  (:meth:`ComputeModel.memory_time`); fused attention ``k * overhead + max(F / (peak *
  e_att), M / (memory_bandwidth * e_mem))`` (:meth:`ComputeModel.attention_time`).

  The parameters come from the cluster spec's ``device.compute`` block (with ``device.flops``,
  or ``device.dtype_flops`` for the training dtype, and ``device.memory_bandwidth``); a
  device ``preset`` fills them in from published microbenchmarks.  Without a block the
  roofline runs (efficiency 1, no launch overhead); without a memory bandwidth either, the
  peak model, and the spec is warned about.

Transformer layers are priced operator by operator (:mod:`solver_planner.stages.operators`);
other layers as one pass each, as follows.

What each pass of a layer moves (per device, one micro-batch of ``n`` samples per replica,
tensor degree ``t``, weights ``W`` bytes, output activations ``a`` bytes per sample): the
forward reads the weights and the input and writes the output, ``W / t + n a (1 + 1 / t)``
(the input of a tensor-parallel pair is whole, the output split); the activation-gradient
pass the same with gradients; the weight-gradient pass reads the input and the output
gradient and writes the weight gradient, the same again.  The optimizer step reads and
writes every parameter and optimizer-state byte and reads the gradients, ``2 (P + O) + G``,
one kernel per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .choices import COMPUTE_MODELS
from .errors import OptionError, unknown_choice

if TYPE_CHECKING:
    import numpy as np

__all__ = ["COMPUTE_MODELS", "ComputeModel", "fit_matmul", "fit_stream"]

_NUMBERS = (float, int)         # plain Python numbers (ComputeModel.time's one-pass path)


@dataclass(frozen=True)
class ComputeModel:
    """The compute model of one device kind (see the module docstring)."""

    mode: str                       # 'efficiency' or 'peak' (what is actually used)
    peak: float                     # FLOP/s
    efficiency: float = 1.0         # e_max
    half_flops: float = 0.0         # x_half, FLOPs per kernel
    overhead: float = 0.0           # seconds per kernel
    memory_bandwidth: float = 0.0   # bytes/s; 0: memory traffic is free
    memory_efficiency: float = 1.0  # e_mem: the fraction of memory_bandwidth streaming kernels reach
    attention_efficiency: float | None = None   # e_att (None: e_max)

    @classmethod
    def of(cls, device, mode: str = "efficiency", dtype: str | None = None) -> ComputeModel:
        """The model ``mode`` asks for on ``device`` (a :class:`~solver_planner.topology.Device`)
        for a job in ``dtype`` (the peak the spec gives for it): ``efficiency`` without a
        ``compute`` block is the ``roofline``, and the roofline without a memory bandwidth is
        ``peak`` (``mode`` of the result says which ran)."""
        if mode not in COMPUTE_MODELS:
            raise OptionError(unknown_choice("compute model", mode, COMPUTE_MODELS))
        peak = device.peak(dtype) if hasattr(device, "peak") else device.flops
        spec = getattr(device, "compute", None)
        bandwidth = getattr(device, "memory_bandwidth", None) or 0.0
        if mode == "efficiency" and spec is not None:
            return cls("efficiency", peak, spec.matmul_efficiency, spec.half_efficiency_flops,
                       spec.kernel_overhead, bandwidth, spec.memory_efficiency, spec.attention_efficiency)
        if mode != "peak" and bandwidth > 0:
            return cls("roofline", peak, memory_bandwidth=bandwidth)
        return cls("peak", peak)

    @property
    def is_peak(self) -> bool:
        return self.mode == "peak"

    def time(self, flops, nbytes=0.0, kernels=1.0) -> "np.ndarray":
        """Seconds of passes of ``flops`` FLOPs in ``kernels`` kernels moving ``nbytes`` bytes
        (element-wise on arrays); 0 where a pass has neither FLOPs nor bytes."""
        import numpy as np   # here: `import solver_planner` and the CLI's start stay light

        if type(flops) in _NUMBERS and type(nbytes) in _NUMBERS and type(kernels) in _NUMBERS:
            # one pass, in Python numbers: the same formula as below (tested equal), at a
            # tenth of numpy's cost on one value (a stage table's cells are read one at a
            # time by the deep-model bound, each with its optimizer step)
            return np.float64(self._one(float(flops), float(nbytes), float(kernels)))
        f = np.asarray(flops, dtype=float)
        if self.is_peak:
            return f / self.peak
        k = np.asarray(kernels, dtype=float)
        m = np.asarray(nbytes, dtype=float)
        arith = np.where(f > 0, (f + k * self.half_flops) / (self.peak * self.efficiency), 0.0)
        busy = np.maximum(arith, self._memory(m))
        return np.where(busy > 0, k * self.overhead + busy, 0.0)

    def _one(self, f: float, m: float, k: float) -> float:
        if self.is_peak:
            return f / self.peak
        arith = (f + k * self.half_flops) / (self.peak * self.efficiency) if f > 0 else 0.0
        bw = self.streaming_bandwidth
        memory = m / bw if bw > 0 else 0.0
        busy = arith if arith >= memory or arith != arith else memory      # np.maximum's
        return k * self.overhead + busy if busy > 0 else 0.0

    @property
    def streaming_bandwidth(self) -> float:
        """Bytes/s a memory-bound kernel moves (0: memory traffic is free)."""
        return self.memory_bandwidth * self.memory_efficiency

    def _memory(self, m):
        import numpy as np

        bw = self.streaming_bandwidth
        return m / bw if bw > 0 else np.zeros_like(m)

    def memory_time(self, nbytes, kernels=1.0) -> "np.ndarray":
        """Seconds of memory-bound passes (no FLOPs to speak of) moving ``nbytes`` bytes in
        ``kernels`` kernels; 0 under the peak model, which prices FLOPs only."""
        import numpy as np

        m = np.asarray(nbytes, dtype=float)
        if self.is_peak:
            return np.zeros_like(m)
        busy = self._memory(m)
        return np.where(busy > 0, np.asarray(kernels, dtype=float) * self.overhead + busy, 0.0)

    def attention_time(self, flops, nbytes, kernels=1.0) -> "np.ndarray":
        """Seconds of fused (flash) attention kernels: their FLOPs at the attention efficiency,
        or their bytes, whichever takes longer."""
        import numpy as np

        f = np.asarray(flops, dtype=float)
        if self.is_peak:
            return f / self.peak
        eff = self.efficiency if self.attention_efficiency is None else self.attention_efficiency
        busy = np.maximum(f / (self.peak * eff), self._memory(np.asarray(nbytes, dtype=float)))
        return np.where(busy > 0, np.asarray(kernels, dtype=float) * self.overhead + busy, 0.0)

    def describe(self) -> str:
        if self.is_peak:
            return f"peak rate ({self.peak / 1e12:g} TFLOP/s)"
        if self.mode == "roofline":
            return (f"roofline: max(FLOPs / {self.peak / 1e12:g} TFLOP/s, bytes / "
                    f"{self.memory_bandwidth / 1e9:g} GB/s)")
        bw = (f", memory {self.memory_bandwidth / 1e9:g} GB/s at {self.memory_efficiency:g}"
              if self.memory_bandwidth else "")
        return (f"efficiency {self.efficiency:g} of {self.peak / 1e12:g} TFLOP/s, half at "
                f"{self.half_flops / 1e9:g} GFLOP per kernel, {self.overhead * 1e6:g} us per kernel{bw}")


def fit_matmul(points, overhead: float) -> tuple[float, float]:
    """(peak x e_max, x_half) from timed single matrix multiplies ``(FLOPs, seconds)``.

    The model's time of one kernel, ``overhead + (F + x_half) / (peak e_max)``, is affine in
    ``F`` (DistIR §4's regression): a least-squares line ``a + b F`` on relative errors gives
    ``peak e_max = 1 / b`` and ``x_half = (a - overhead) / b`` (at least 0).  ``overhead`` is
    measured apart (an empty kernel), since the line alone cannot tell it from ``x_half``.
    """
    import numpy as np

    pts = [(float(f), float(t)) for f, t in points if f > 0 and t > 0]
    if len(pts) < 2:
        raise ValueError("fitting a matrix-multiply line needs at least two timed sizes")
    f = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    # minimise sum ((a + b f) / t - 1)^2: weighted least squares with weights 1 / t
    A = np.stack([1 / t, f / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if b <= 0:
        raise ValueError("the timed matrix multiplies do not get slower with size; time larger ones")
    return 1.0 / b, max(0.0, (a - overhead) / b)


def fit_stream(points, overhead: float) -> float:
    """``memory_bandwidth`` (bytes/s) from timed copies ``(bytes moved, seconds)``.

    The model's time of a memory-bound kernel moving ``M`` bytes is ``overhead + M /
    memory_bandwidth`` (``memory_efficiency`` 1: the copies are what it is a fraction of).  With
    ``overhead`` measured apart (an empty kernel), the one unknown ``u = 1 / memory_bandwidth``
    is fitted by least squares on relative errors, ``sum ((overhead + u M) / t - 1)^2``, so that
    small copies, where the overhead shows, weigh as much as large ones.  A copy reads its
    buffer once and writes it once: ``M`` is twice the buffer.

    Raises ``ValueError`` with fewer than two usable points (bytes and seconds positive), when
    larger copies are not slower (the least-squares line's slope is not positive: the timings
    are noise), or when the copies take no longer than the overhead alone.

    Examples
    --------
    >>> pts = [(m, 5e-6 + m / 20e9) for m in (2**21, 2**23, 2**25, 2**27)]
    >>> round(fit_stream(pts, 5e-6) / 1e9, 6)
    20.0
    """
    import numpy as np

    pts = [(float(m), float(t)) for m, t in points if m > 0 and t > 0]
    if len(pts) < 2:
        raise ValueError("fitting the memory bandwidth needs at least two timed copy sizes")
    m = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    if len(set(m)) < 2:
        raise ValueError("fitting the memory bandwidth needs copies of at least two sizes")
    # the line a + b m on relative errors (as fit_matmul): is a larger copy slower at all?
    A = np.stack([1 / t, m / t], axis=1)
    (_, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if b <= 0:
        raise ValueError("the timed copies do not get slower with size; time larger ones")
    # the model itself, overhead fixed: residuals (overhead / t - 1) + u m / t
    x = m / t
    u = float(np.dot(1 - overhead / t, x) / np.dot(x, x))
    if u <= 0:
        raise ValueError("the timed copies take no longer than the kernel overhead; time larger ones")
    return 1.0 / u
