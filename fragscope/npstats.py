"""Median, quantile and distinct values of 1-D float64 arrays with exactly numpy's results, without
``numpy.ma``: numpy 2.x's ``np.median``, ``np.quantile`` and ``np.unique`` import it on first use (a
check for masked arrays), ~20 ms of every ``diagnose`` process's start (docs/performance.md). The same
order statistics come from ``np.partition`` / ``np.sort``, combined as numpy combines them (the mean of
the two middle values; the linear quantile's interpolation); any other input (integers, float32,
several dimensions, an empty array, a quantile outside [0, 1]) is numpy's own call (integers are read
by ``unique``).
tests/test_npstats.py checks them against numpy bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

_F8 = np.dtype(np.float64)


def _plain(a) -> np.ndarray | None:
    v = np.asarray(a)
    return v if v.dtype == _F8 and v.ndim == 1 and v.size else None


def median(a) -> float:
    """``float(np.median(a))``."""
    v = _plain(a)
    if v is None:
        return float(np.median(a))
    n = v.size
    k = n // 2
    if n % 2:
        p = np.partition(v, (k, n - 1))
        mid = 0.0 + float(p[k])
    else:
        p = np.partition(v, (k - 1, k, n - 1))
        mid = (0.0 + (float(p[k - 1]) + float(p[k]))) / 2.0
    # numpy's mean of the middle value(s): a sum that starts at 0.0 (so -0.0 reads 0.0), then the division
    return float(p[-1]) if math.isnan(p[-1]) else mid  # a NaN anywhere (sorted last) is the median


def quantile(a, q: float) -> float:
    """``float(np.quantile(a, q))`` (the default, linear method) for a float ``q``."""
    v = _plain(a)
    if v is None or not isinstance(q, float) or not 0.0 <= q <= 1.0:
        return float(np.quantile(a, q))
    n = v.size
    virtual = (n - 1) * q
    if virtual >= n - 1:
        lo = hi = -1
    else:
        lo = math.floor(virtual)
        hi = lo + 1
    p = np.partition(v, sorted({0, n - 1, lo % n, hi % n}))
    if math.isnan(p[-1]):
        return float(p[-1])
    a_, b_ = float(p[lo]), float(p[hi])
    t = virtual - lo
    d = b_ - a_
    return b_ - d * (1 - t) if t >= 0.5 else a_ + d * t


def unique(a) -> np.ndarray:
    """``np.unique(a)``: the sorted distinct values (of 1-D float64 or integers)."""
    v = np.asarray(a)
    if not ((v.dtype == _F8 or v.dtype.kind in "iu") and v.ndim == 1 and v.size):
        return np.unique(a)
    s = np.sort(v)
    if v.dtype == _F8 and math.isnan(s[-1]):
        return np.unique(a)  # NaNs: numpy keeps one
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def nanmedian(a) -> float:
    """``float(np.nanmedian(a))``: the median of the values that are not NaN (NaN when none is)."""
    v = np.asarray(a)
    if v.dtype != _F8 or v.ndim != 1:
        return float(np.nanmedian(a))
    v = v[~np.isnan(v)]
    return median(v) if v.size else math.nan
