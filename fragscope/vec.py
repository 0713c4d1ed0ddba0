"""The few one-dimensional numpy operations the kernel-timeline reader and analysis use, over Python lists.

A small trace (a few thousand GPU ops) is read and analysed in less time than ``import numpy`` takes (0.10-0.15
s of a 0.3 s ``diagnose trace``), so below a size bar the Kineto reader builds its columns as :class:`Vec`
and the analysis runs the same code on them: :func:`xp_of` gives the namespace of a column (this module
or numpy), and each function of the analysis calls the operations through it. Every operation here gives
numpy's values for the dtypes and shapes the timeline code uses (int64, float64 and bool columns, 1-D):
integer arithmetic is exact in both, float arithmetic is the same IEEE double operations in the same order
(sums left to right, as numpy's for the short arrays summed here and bincount's weights), sorts are stable.
tests/test_trace_vectors.py runs ``diagnose trace`` both ways on every trace in tests/data and compares.

Not a general array library: no broadcasting beyond array-with-scalar, no 2-D, no NaN handling (timeline
columns hold none).
"""
from __future__ import annotations

import math
import operator
import os
from bisect import bisect_left, bisect_right
from itertools import accumulate, compress, repeat

__all__ = ["Vec", "xp_of", "numpy_for", "NUMPY_MIN_ROWS"]

# dtypes: "b" bool, "i" any integer width, "f" float64 (numpy's names below map onto these)
bool_, int8, int16, int32, int64, intp, uint8, uint16, float64 = "b", "i", "i", "i", "i", "i", "i", "i", "f"
_DT = {bool: "b", int: "i", float: "f", "b": "b", "i": "i", "f": "f"}
_CAST = {"b": bool, "i": int, "f": float}

# Rows (GPU ops + host calls) from which a Kineto trace's columns are numpy arrays: below it the pure-Python
# columns read and analyse faster than numpy's import alone (bench/bench_trace.py prints both sides).
NUMPY_MIN_ROWS = 20_000
ENV = "FRAGSCOPE_TRACE_ARRAYS"  # numpy | python: force one side (tests, benchmarks); unset: by size


def numpy_for(rows: int) -> bool:
    """Whether a timeline of ``rows`` ops and calls gets numpy columns."""
    force = os.environ.get(ENV, "").strip().lower()
    if force in ("numpy", "python"):
        return force == "numpy"
    return rows >= NUMPY_MIN_ROWS


def _dt(dtype) -> str:
    if dtype is None:
        return "f"
    d = _DT.get(dtype)
    if d is None:
        d = "b" if dtype == "bool" else "f" if str(dtype).startswith("float") else "i"
    return d


class Vec:
    """A 1-D column: ``v`` a list of Python bools, ints or floats, ``dt`` its dtype ("b", "i", "f")."""

    __slots__ = ("v", "dt")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, v: list, dt: str) -> None:
        self.v, self.dt = v, dt

    # --- shape and conversion ------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.v)

    def __len__(self) -> int:
        return len(self.v)

    def __iter__(self):
        return iter(self.v)

    def __repr__(self) -> str:
        return f"Vec({self.v!r}, {self.dt!r})"

    def tolist(self) -> list:
        return list(self.v)

    def astype(self, dtype) -> "Vec":
        d = _dt(dtype)
        if d == self.dt:
            return Vec(list(self.v), d)
        c = _CAST[d]
        return Vec(list(map(c, self.v)), d)

    def copy(self) -> "Vec":
        return Vec(list(self.v), self.dt)

    # --- reductions -------------------------------------------------------------------------------------
    def min(self):
        return min(self.v)  # (ValueError when empty, as numpy's)

    def max(self):
        return max(self.v)

    def sum(self):
        if self.dt == "f":
            out = 0.0
            for x in self.v:
                out += x
            return out
        return sum(self.v) if self.dt == "i" else self.v.count(True) + 0

    def any(self) -> bool:
        return len(self.v) > self.v.count(0)

    def all(self) -> bool:
        return all(self.v)

    def sort(self) -> None:
        self.v.sort()

    # --- indexing -----------------------------------------------------------------------------------------
    def __getitem__(self, k):
        if type(k) is int:
            return self.v[k]
        if type(k) is slice:
            return Vec(self.v[k], self.dt)
        if type(k) is Vec and k.dt == "b":
            return Vec(list(compress(self.v, k.v)), self.dt)
        return Vec(list(map(self.v.__getitem__, k)), self.dt)

    def __setitem__(self, k, val) -> None:
        v, c = self.v, _CAST[self.dt]
        if type(k) is int:
            v[k] = c(val)
            return
        if type(k) is slice:
            idx = range(*k.indices(len(v)))
        elif type(k) is Vec and k.dt == "b":
            idx = compress(range(len(v)), k.v)
        else:
            idx = k.v if type(k) is Vec else k
        if type(val) is Vec or type(val) is list:
            vals = val.v if type(val) is Vec else val
            for i, x in zip(idx, vals):
                v[i] = c(x)
        else:
            x = c(val)
            for i in idx:
                v[i] = x

    # --- element-wise operators -------------------------------------------------------------------------
    def _bin(self, o, f, dt=None):
        if type(o) is Vec:
            r = list(map(f, self.v, o.v))
            d = dt or ("f" if "f" in (self.dt, o.dt) else "i")
        else:
            r = list(map(f, self.v, repeat(o, len(self.v))))
            d = dt or ("f" if self.dt == "f" or type(o) is float else "i")
        return Vec(r, d)

    def _rbin(self, o, f):
        return Vec(list(map(f, repeat(o, len(self.v)), self.v)), "f" if self.dt == "f" or type(o) is float else "i")

    def __add__(self, o):
        return self._bin(o, _add)

    def __radd__(self, o):
        return self._rbin(o, _add)

    def __sub__(self, o):
        return self._bin(o, _sub)

    def __rsub__(self, o):
        return self._rbin(o, _sub)

    def __mul__(self, o):
        return self._bin(o, _mul)

    def __rmul__(self, o):
        return self._rbin(o, _mul)

    def __truediv__(self, o):
        return self._bin(o, _div, "f")

    def __neg__(self):
        return Vec([-a for a in self.v], self.dt)

    def __lshift__(self, o):
        return self._bin(o, _lshift, "i")

    def __and__(self, o):
        return self._bin(o, _and, "b" if self.dt == "b" else "i")

    def __or__(self, o):
        return self._bin(o, _or, "b" if self.dt == "b" else "i")

    def __iand__(self, o):
        self.v = self._bin(o, _and, self.dt).v
        return self

    def __ior__(self, o):
        self.v = self._bin(o, _or, self.dt).v
        return self

    def __invert__(self):
        if self.dt == "b":
            return Vec(list(map(operator.not_, self.v)), "b")
        return Vec([~a for a in self.v], self.dt)

    def _cmp(self, o, f):
        """A comparison: an int compared with a float as numpy does, both as float64."""
        a = self.v
        if type(o) is Vec:
            b = o.v
            if (self.dt == "f") != (o.dt == "f"):
                a, b = (list(map(float, a)), b) if o.dt == "f" else (a, list(map(float, b)))
            return Vec(list(map(f, a, b)), "b")
        if type(o) is float and self.dt != "f":
            a = list(map(float, a))
        elif self.dt == "f" and type(o) is int:
            o = float(o)
        return Vec(list(map(f, a, repeat(o, len(a)))), "b")

    def __eq__(self, o):  # type: ignore[override]
        return self._cmp(o, _eq)

    def __ne__(self, o):  # type: ignore[override]
        return self._cmp(o, _ne)

    def __lt__(self, o):
        return self._cmp(o, _lt)

    def __le__(self, o):
        return self._cmp(o, _le)

    def __gt__(self, o):
        return self._cmp(o, _gt)

    def __ge__(self, o):
        return self._cmp(o, _ge)


_add, _sub, _mul, _lshift, _and, _or = operator.add, operator.sub, operator.mul, operator.lshift, operator.and_, \
    operator.or_
_eq, _ne, _lt, _le, _gt, _ge = operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge


def _div(a, b):
    return float(a) / float(b)  # (numpy: both to float64, then divide; a zero divisor is never passed)


def _vals(x) -> list:
    return x.v if type(x) is Vec else list(x)


# --- constructors ---------------------------------------------------------------------------------------
def asarray(x, dtype=None) -> Vec:
    if type(x) is Vec:
        return x if dtype is None or _dt(dtype) == x.dt else x.astype(dtype)
    vals = list(x)
    if dtype is None:
        d = "f" if any(type(a) is float for a in vals) else "b" if vals and all(type(a) is bool for a in vals) else "i"
    else:
        d = _dt(dtype)
    c = _CAST[d]
    return Vec(list(map(c, vals)), d)


def array(x, dtype=None) -> Vec:
    return asarray(x, dtype).copy() if type(x) is Vec else asarray(x, dtype)


def fromiter(it, dtype=None, count: int = -1) -> Vec:
    return asarray(list(it), dtype)


def zeros(n: int, dtype=float64) -> Vec:
    d = _dt(dtype)
    return Vec([_CAST[d](0)] * n, d)


empty = zeros


def ones(n: int, dtype=float64) -> Vec:
    d = _dt(dtype)
    return Vec([_CAST[d](1)] * n, d)


def full(n: int, value, dtype=None) -> Vec:
    d = _dt(dtype) if dtype is not None else ("f" if type(value) is float else "i")
    return Vec([_CAST[d](value)] * n, d)


def arange(n: int) -> Vec:
    return Vec(list(range(n)), "i")


class _IInfo:
    def __init__(self, bits: int) -> None:
        self.min, self.max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def iinfo(dtype) -> _IInfo:
    return _IInfo(64)


# --- functions --------------------------------------------------------------------------------------------
def where(cond: Vec, a, b) -> Vec:
    av = a.v if type(a) is Vec else None
    bv = b.v if type(b) is Vec else None
    out = [(av[i] if av is not None else a) if m else (bv[i] if bv is not None else b) for i, m in enumerate(cond.v)]
    dts = {x.dt if type(x) is Vec else ("f" if type(x) is float else "i") for x in (a, b)}
    d = "f" if "f" in dts else "i" if "i" in dts else "b"
    return Vec([_CAST[d](x) for x in out] if len(dts) > 1 else out, d)


def flatnonzero(a) -> Vec:
    v = _vals(a)
    return Vec(list(compress(range(len(v)), v)), "i")


def count_nonzero(a) -> int:
    v = _vals(a)
    return len(v) - v.count(0)  # (False == 0 == 0.0)


def argsort(a, kind: str | None = None) -> Vec:
    v = _vals(a)
    return Vec(sorted(range(len(v)), key=v.__getitem__), "i")  # (stable, as kind="stable")


def lexsort(keys) -> Vec:
    """Indices sorting by the last key, then the one before... (stable), as numpy's."""
    cols = [_vals(k) for k in reversed(keys)]
    n = len(cols[0]) if cols else 0
    return Vec(sorted(range(n), key=lambda i: tuple(c[i] for c in cols)), "i")


def searchsorted(a, v, side: str = "left"):
    s = _vals(a)
    f = bisect_left if side == "left" else bisect_right
    if type(v) is Vec or type(v) is list:
        return Vec([f(s, x) for x in _vals(v)], "i")
    return f(s, v)


def unique(a, return_index: bool = False):
    v = _vals(a)
    first: dict = {}
    for i, x in enumerate(v):
        if x not in first:
            first[x] = i
    keys = sorted(first)
    d = a.dt if type(a) is Vec else "i"
    if return_index:
        return Vec(keys, d), Vec([first[k] for k in keys], "i")
    return Vec(keys, d)


def bincount(x, weights=None, minlength: int = 0) -> Vec:
    v = _vals(x)
    n = max(max(v) + 1 if v else 0, minlength)
    if weights is None:
        out = [0] * n
        for i in v:
            out[i] += 1
        return Vec(out, "i")
    w = _vals(weights)
    outf = [0.0] * n
    for i, y in zip(v, w):
        outf[i] += y
    return Vec(outf, "f")


def diff(a) -> Vec:
    v = _vals(a)
    d = a.dt if type(a) is Vec else ("f" if any(type(x) is float for x in v) else "i")
    return Vec([b - c for c, b in zip(v, v[1:])], d)


def concatenate(parts) -> Vec:
    out: list = []
    dts = set()
    for p in parts:
        out.extend(_vals(p))
        dts.add(p.dt if type(p) is Vec else ("f" if any(type(x) is float for x in p) else "i"))
    return Vec(out, "f" if "f" in dts else "i" if "i" in dts else "b")


def cumsum(a) -> Vec:
    out, t = [], 0
    for x in _vals(a):
        t = t + x
        out.append(t)
    return Vec(out, a.dt if type(a) is Vec else "i")


def floor(x):
    return float(math.floor(x))


def rint(a):
    if type(a) is Vec:
        return Vec([float(round(x)) for x in a.v], "f")
    return float(round(a))


def _out(res: Vec, out: Vec | None) -> Vec:
    if out is None:
        return res
    c = _CAST[out.dt]
    out.v[:] = [c(x) for x in res.v] if res.dt != out.dt else res.v
    return out


def subtract(a, b, out: Vec | None = None) -> Vec:
    return _out(a - b if type(a) is Vec else _as_vec(a) - b, out)


def add(a, b, out: Vec | None = None) -> Vec:
    return _out(a + b if type(a) is Vec else _as_vec(a) + b, out)


def _as_vec(x) -> Vec:
    return x if type(x) is Vec else asarray(x)


class _Maximum:
    def __call__(self, a, b, out: Vec | None = None) -> Vec:
        if type(a) is not Vec:
            a, b = b, a
        return _out(a._bin(b, max), out)

    @staticmethod
    def accumulate(a: Vec) -> Vec:
        return Vec(list(accumulate(a.v, max)), a.dt)


maximum = _Maximum()


def minimum(a, b, out: Vec | None = None) -> Vec:
    if type(a) is not Vec:
        a, b = b, a
    return _out(a._bin(b, min), out)


def xp_of(a):
    """The namespace for a column: this module for a :class:`Vec`, else numpy."""
    if type(a) is Vec:
        import sys

        return sys.modules[__name__]
    import numpy

    return numpy
