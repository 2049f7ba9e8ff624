"""Stage tables ``M[k, i]`` (a stage of layers k..i) without the ``L x L`` square.

Every stage cost is a sum over its layers (prefix sums), a maximum over them (a sparse table
of range maxima), the flow-shop tail of its gradient reductions (a range maximum too, see
:func:`tail_values`), the tied copies it holds, or an element-wise function of those.  A
:class:`Ranges` answers ``table[k, i]`` for integers, index arrays or slices (an outer block
then, as numpy slicing gives) from ``O(L log L)`` numbers, so a model of 10 000 layers keeps
megabytes where its squares took 800 MB each.  Below the diagonal (``k > i``, no stage) a
table reads ``below``: 0, as the ``np.triu`` squares it replaces, or inf for memory.

Tables of at most :data:`DENSE` layers keep their square once read, computed from the same
expressions, so small models pay no more than before (and read the same numbers).
"""

from __future__ import annotations

import abc
import math
import operator

import numpy as np

__all__ = ["DENSE", "Ranges", "Sums", "Maxes", "Tail", "Copies", "CopyBytes", "Const", "FirstRow", "Rows", "apply"]

_INTS = (int, np.integer)
DENSE = 256           # the largest table a dense square is built for (512 KB of float64)


def _index(key, n: int):
    """(k, i) broadcast index arrays for ``key``; two slices give the outer block."""
    k, i = key
    ks, is_ = isinstance(k, slice), isinstance(i, slice)
    k = np.arange(n)[k] if ks else np.asarray(k)
    i = np.arange(n)[i] if is_ else np.asarray(i)
    if ks and is_:
        k, i = k[:, None], i[None, :]
    elif ks or is_:
        raise IndexError("index a range table with two slices, or with integers and index arrays")
    return k, i


def _row_maxima(v: np.ndarray) -> np.ndarray:
    """``out[k, i] = max(v[k..i])`` for ``k <= i`` (-inf below the diagonal), as running
    maxima along each row of the square."""
    k = np.arange(len(v))
    return np.maximum.accumulate(np.where(k[None, :] >= k[:, None], v[None, :], -np.inf), axis=1)


class Ranges(abc.ABC):
    """A lazy ``[k, i]`` table over ``n`` layers (see the module docstring)."""

    below = 0.0
    keep_square = True          # False: a table read a few cells at a time, built afresh each use

    def __init__(self, n: int):
        self.n = n
        self._dense: np.ndarray | None = None

    @abc.abstractmethod
    def values(self, k: np.ndarray, i: np.ndarray) -> np.ndarray:
        """Values on cells with k <= i (broadcast integer arrays): what each table defines."""

    def __getitem__(self, key):
        if not (isinstance(key, tuple) and len(key) == 2) or any(x is None or x is Ellipsis for x in key):
            return np.asarray(self)[key]          # numpy's other indexing, on the square
        if self._dense is not None or (self.n <= DENSE and self.keep_square):
            return np.asarray(self)[_index(key, self.n)]
        k, i = key
        if isinstance(k, _INTS) and isinstance(i, _INTS):
            # one cell, as plain arithmetic (:meth:`at`): the greedy splits of
            # coarse.fine_bound read hundreds of thousands of them one at a time
            if not (0 <= k < self.n and 0 <= i < self.n):
                raise IndexError(f"cell ({k}, {i}) of a table of {self.n} layers")
            return np.float64(self.at(int(k), int(i)) if k <= i else self.below)
        kk, ii = np.broadcast_arrays(*_index(key, self.n))
        if kk.ndim == 0:
            kk, ii = kk.reshape(1), ii.reshape(1)
            out = self._cells(kk, ii)[0]
            return out
        return self._cells(kk, ii)

    def at(self, k: int, i: int) -> float:
        """``values`` of the one cell ``k <= i``.  The tables below compute it with Python
        numbers read off their arrays (a numpy read of one cell costs tens of microseconds,
        and lists of the arrays would take three times their memory); each gives exactly what
        ``values`` gives (tested)."""
        return float(self.values(np.array([k]), np.array([i]))[0])

    def _cells(self, k: np.ndarray, i: np.ndarray) -> np.ndarray:
        ok = k <= i
        if ok.all():
            return np.asarray(self.values(k, i), dtype=float)
        out = np.full(k.shape, self.below, dtype=float)
        if ok.any():
            out[ok] = self.values(k[ok], i[ok])
        return out

    def __array__(self, dtype=None, copy=None):
        if self._dense is None:
            if self.n > DENSE:
                raise MemoryError(f"a dense [k, i] table of {self.n:,} layers is not built (at most {DENSE:,}); "
                                  "index it by cells instead")
            self._dense = self._square()
        return self._dense if dtype is None else self._dense.astype(dtype)

    def _square(self) -> np.ndarray:
        """Every cell (below the diagonal: ``below``)."""
        k = np.arange(self.n)
        return self._cells(*np.broadcast_arrays(k[:, None], k[None, :]))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    def with_below(self, value: float) -> "Ranges":
        return _Below(self, value)

    def _op(self, other, op, swap=False):
        if isinstance(other, np.ndarray) and other.ndim:        # a square: as numpy would
            return op(other, np.asarray(self)) if swap else op(np.asarray(self), other)
        return apply(op, other, self) if swap else apply(op, self, other)

    def __add__(self, other):
        return self._op(other, operator.add)

    def __radd__(self, other):
        return self._op(other, operator.add, True)

    def __sub__(self, other):
        return self._op(other, operator.sub)

    def __rsub__(self, other):
        return self._op(other, operator.sub, True)

    def __mul__(self, other):
        return self._op(other, operator.mul)

    def __rmul__(self, other):
        return self._op(other, operator.mul, True)

    def __truediv__(self, other):
        return self._op(other, operator.truediv)

    def __rtruediv__(self, other):
        return self._op(other, operator.truediv, True)

    def __neg__(self):
        return apply(operator.neg, self)

    # comparisons read the whole square, as numpy would (small tables only)
    def _compare(self, other, op):
        return op(np.asarray(self), np.asarray(other) if isinstance(other, Ranges) else other)

    def __le__(self, other):
        return self._compare(other, operator.le)

    def __lt__(self, other):
        return self._compare(other, operator.lt)

    def __ge__(self, other):
        return self._compare(other, operator.ge)

    def __gt__(self, other):
        return self._compare(other, operator.gt)


class Const(Ranges):
    def __init__(self, n: int, value: float):
        super().__init__(n)
        self.value = float(value)

    def values(self, k, i):
        return np.full(np.shape(k), self.value)

    def at(self, k, i):
        return self.value


class Sums(Ranges):
    """``values[k] + ... + values[i]``."""

    def __init__(self, values):
        values = np.asarray(values, dtype=float)
        super().__init__(len(values))
        self.prefix = np.concatenate([[0.0], np.cumsum(values)])

    def values(self, k, i):
        return self.prefix[i + 1] - self.prefix[k]

    def at(self, k, i):
        return self.prefix.item(i + 1) - self.prefix.item(k)


class _SparseMax:
    """Range maxima in O(1) from ``log n`` shifted maxima (a sparse table, one row per level)."""

    def __init__(self, values: np.ndarray):
        values = np.asarray(values, dtype=float)
        n = len(values)
        rows = [values]
        width = 1
        while 2 * width <= n:
            prev = rows[-1]
            rows.append(np.concatenate([np.maximum(prev[:-width], prev[width:]), np.full(width, -np.inf)]))
            width *= 2
        self.table = np.stack(rows)         # table[l, k] = max(values[k .. k + 2^l - 1])

    def query(self, k, i):
        k, i = np.asarray(k), np.asarray(i)
        level = np.floor(np.log2(np.maximum(i - k + 1, 1))).astype(int)
        return np.maximum(self.table[level, k], self.table[level, np.maximum(i - (1 << level) + 1, 0)])

    def at(self, k: int, i: int) -> float:
        """``query`` of one range ``k <= i``."""
        level = (i - k + 1).bit_length() - 1
        a, b = self.table.item(level, k), self.table.item(level, i - (1 << level) + 1)
        return a if a >= b or a != a else b          # np.maximum's, NaN included


class Maxes(Ranges):
    """``max(values[k..i])``."""

    def __init__(self, values):
        values = np.asarray(values, dtype=float)
        super().__init__(len(values))
        self.table = _SparseMax(values)

    def values(self, k, i):
        return self.table.query(k, i)

    def at(self, k, i):
        return self.table.at(k, i)

    def _square(self) -> np.ndarray:
        # a running maximum along each row: the same maxima, without a query per cell
        out = _row_maxima(self.table.table[0])
        return np.triu(np.where(np.isfinite(out), out, 0.0))


class Tail(Ranges):
    """``g[k, i]``: how long the reductions of layers k..i outlast their backward pieces.

    Backward runs layers i, i-1, ..., k; layer j's reduction starts when its piece is done
    and the previous reduction has ended.  The last reduction ends at
    ``max_j (sum_{l=j..i} c_l + sum_{l=k..j} s_l)`` after the first piece starts, that is
    ``Pc[i+1] - Ps[k] + max_{k<=j<=i} v_j`` with ``v_j = Ps[j+1] - Pc[j]`` (a range maximum).
    """

    def __init__(self, pieces, reductions):
        pieces = np.asarray(pieces, dtype=float)
        super().__init__(len(pieces))
        self.pc = np.concatenate([[0.0], np.cumsum(pieces)])
        self.ps = np.concatenate([[0.0], np.cumsum(np.asarray(reductions, dtype=float))])
        self.best = _SparseMax(self.ps[1:] - self.pc[:-1])

    def values(self, k, i):
        span = self.pc[i + 1] - self.ps[k] + self.best.query(k, i)
        return np.maximum(span - (self.pc[i + 1] - self.pc[k]), 0.0)

    def at(self, k, i):
        pc, ps = self.pc, self.ps
        span = pc.item(i + 1) - ps.item(k) + self.best.at(k, i)
        out = span - (pc.item(i + 1) - pc.item(k))
        return out if out >= 0.0 or out != out else 0.0   # np.maximum(out, 0.0)

    def _square(self) -> np.ndarray:
        # the same expression, its range maxima as running maxima along each row
        span = self.pc[None, 1:] - self.ps[:-1, None] + _row_maxima(self.best.table[0])
        return np.triu(np.maximum(span - (self.pc[None, 1:] - self.pc[:-1, None]), 0.0))


class FirstRow(Ranges):
    """True (1.0) on the ranges that start at the model's first layer (the stage holding it)."""

    def values(self, k, i):
        k, i = np.broadcast_arrays(np.asarray(k), np.asarray(i))
        return (k == 0).astype(float)

    def at(self, k, i):
        return 1.0 if k == 0 else 0.0


class Rows(Ranges):
    """``values[k]``: a value of the range's first layer."""

    def __init__(self, values):
        values = np.asarray(values, dtype=float)
        super().__init__(len(values))
        self.row = values

    def values(self, k, i):
        k, i = np.broadcast_arrays(np.asarray(k), np.asarray(i))
        return self.row[k]

    def at(self, k, i):
        return self.row.item(k)


class Copies(Ranges):
    """True (1.0) where a stage of layers k..i holds a tied layer b without the layer a it
    shares (``ties``: (a, b) pairs)."""

    def __init__(self, n: int, ties):
        super().__init__(n)
        self.ties = list(ties)

    def values(self, k, i):
        out = np.zeros(np.shape(k), dtype=bool)
        for a, b in self.ties:
            out |= (a < k) & (k <= b) & (b <= i)
        return out.astype(float)


class CopyBytes(Ranges):
    """``per_layer[b]`` summed over the tied copies b a stage of layers k..i holds."""

    def __init__(self, per_layer, ties):
        per_layer = np.asarray(per_layer, dtype=float)
        super().__init__(len(per_layer))
        self.per_layer = per_layer
        self.ties = list(ties)

    def values(self, k, i):
        out = np.zeros(np.shape(k))
        for a, b in self.ties:
            out = out + np.where((a < k) & (k <= b) & (b <= i), self.per_layer[b], 0.0)
        return out


def _least(a, b):
    return a if a <= b or a != a else b             # np.minimum's, NaN included


def _most(a, b):
    return a if a >= b or a != a else b             # np.maximum's, NaN included


# numpy's element-wise functions as their plain-number equivalents, for one cell: a ufunc
# called on two Python numbers costs ten times these
_ON_NUMBERS = {np.minimum: _least, np.maximum: _most, np.add: operator.add, np.subtract: operator.sub,
               np.multiply: operator.mul}
# the function's identity: min(x, inf) is x, whatever x (NaN too)
_IDENTITY = {np.minimum: math.inf, np.maximum: -math.inf}


def _cell_reader(fn, args):
    """``(k, i) -> fn of the args' cells`` as one closure per table, for :meth:`_Apply.at`:
    the deep-model bound reads millions of cells of tables nested a few levels deep, and a
    generator over the arguments per level cost three times the arithmetic."""
    identity = _IDENTITY.get(fn)
    if identity is not None and len(args) == 2:
        for x, y in (args, args[::-1]):
            if isinstance(x, Ranges) and isinstance(y, (float, np.floating)) and y == identity:
                return x.at
    fn = _ON_NUMBERS.get(fn, fn)
    reads = [isinstance(a, Ranges) for a in args]
    if reads == [True, True]:
        a, b = args[0].at, args[1].at
        return lambda k, i: float(fn(a(k, i), b(k, i)))
    if reads == [True, False]:
        a, y = args[0].at, args[1]
        return lambda k, i: float(fn(a(k, i), y))
    if reads == [False, True]:
        x, b = args[0], args[1].at
        return lambda k, i: float(fn(x, b(k, i)))
    if reads == [True]:
        a = args[0].at
        return lambda k, i: float(fn(a(k, i)))
    parts = [(a.at, True) if r else (a, False) for a, r in zip(args, reads)]
    return lambda k, i: float(fn(*[g(k, i) if r else g for g, r in parts]))


class _Apply(Ranges):
    def __init__(self, fn, args, below: float):
        super().__init__(next(a.n for a in args if isinstance(a, Ranges)))
        self.fn = fn
        self.args = args
        self.below = below
        self.at = _cell_reader(fn, args)        # :meth:`Ranges.at`, as one closure

    def values(self, k, i):
        return self.fn(*(a.values(k, i) if isinstance(a, Ranges) else a for a in self.args))


class _Below(Ranges):
    keep_square = False         # memory at one live count: made per call, read on bands and cells

    def __init__(self, inner: Ranges, below: float):
        super().__init__(inner.n)
        self.inner = inner
        self.below = below

    def values(self, k, i):
        return self.inner.values(k, i)

    def at(self, k, i):
        return self.inner.at(k, i)


def apply(fn, *args) -> Ranges:
    """The element-wise ``fn`` of range tables and numbers, as a range table (its value below
    the diagonal is ``fn`` of theirs, as a dense square gave)."""
    if not any(isinstance(a, Ranges) for a in args):
        raise TypeError("apply needs a range table")
    with np.errstate(invalid="ignore"):
        below = fn(*(np.float64(a.below) if isinstance(a, Ranges) else a for a in args))
    below = float(np.asarray(below, dtype=float))
    return _Apply(fn, args, 0.0 if math.isnan(below) else below)
