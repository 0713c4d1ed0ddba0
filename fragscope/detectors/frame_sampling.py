"""Sampling raw series onto a Frame's time grid: gauges with a lookback, counters as reset-aware rates and
cumulative increases, NaN-aware aggregation of several series one span at a time. Pure numpy.
"""
from __future__ import annotations

import math

import numpy as np

from .. import npstats
from ..model import Series


def series_interval_seconds(series: list[Series]) -> float | None:
    """The median over series of each one's median spacing. Series scraped together share their times
    (every series of one page): each distinct time array's median is computed once (the agent's watch
    pass: ~60 series, a handful of distinct arrays; the medians were a quarter of its frame)."""
    diffs = []
    done: dict[tuple, list] = {}  # (size, first, last) -> [(times, median)] of the arrays seen
    for s in series:
        if len(s) >= 2:  # two scrapes already tell the interval (a live first verdict)
            ts = s.ts
            same = done.setdefault((ts.size, float(ts[0]), float(ts[-1])), [])
            for seen, d in same:
                if seen is ts or np.array_equal(seen, ts):
                    break
            else:
                d = float(npstats.median(np.diff(ts)))
                if len(same) < 4:  # bounded: many different arrays with the same ends cost one compare each
                    same.append((ts, d))
            if d > 0:
                diffs.append(d)
    return float(npstats.median(diffs)) if diffs else None


def _span(s: Series, grid: np.ndarray, lookback: float) -> tuple[int, int]:
    """Grid indices [lo, hi) where ``s`` can have a fresh value: from its first point to its last point
    + lookback; outside, every sampler gives NaN. Sampling only the span keeps the frame linear in the
    number of points: a short-lived series (one per request id) costs its span, not the whole grid
    (bench/bench_ingest.py --churn: 10k such series took 24 s and 2.4 GB, quadratic, before)."""
    if not len(s):
        return 0, 0
    lo = int(np.searchsorted(grid, s.ts[0], side="left"))
    hi = int(np.searchsorted(grid, s.ts[-1] + lookback, side="right"))
    return lo, max(lo, hi)


class Agg:
    """NaN-aware sum / max / min / mean of sampled spans, one series at a time (instead of stacking
    one full-grid row per series). One series alone is returned as sampled."""

    def __init__(self, n: int, how: str) -> None:
        self.how = how
        self.n = n
        self.cnt: np.ndarray | None = None  # made when a second series comes: most signals have one
        self.acc: np.ndarray | None = None
        self.first: tuple[int, np.ndarray] | None = None
        self.added = 0

    def add(self, lo: int, vals: np.ndarray) -> None:
        self.added += 1
        if self.added == 1:
            self.first = (lo, vals)
            return
        if self.added == 2:  # the first series is accumulated now, in the order it came
            self.cnt = np.zeros(self.n, dtype=np.int64)
            self.acc = np.full(self.n, {"max": -np.inf, "min": np.inf}.get(self.how, 0.0))
            self._acc(*self.first)
        self._acc(lo, vals)

    def _acc(self, lo: int, vals: np.ndarray) -> None:
        sl = slice(lo, lo + vals.size)
        ok = np.isfinite(vals)
        self.cnt[sl] += ok
        if self.how == "max":
            np.fmax(self.acc[sl], vals, out=self.acc[sl])
        elif self.how == "min":
            np.fmin(self.acc[sl], vals, out=self.acc[sl])
        else:
            self.acc[sl] += np.where(ok, vals, 0.0)

    def result(self) -> np.ndarray:
        out = np.full(self.n, np.nan)
        if self.added == 0:
            return out
        if self.added == 1:
            lo, vals = self.first
            out[lo:lo + vals.size] = vals
            return out
        has = self.cnt > 0
        out[has] = self.acc[has] / self.cnt[has] if self.how == "mean" else self.acc[has]
        return out


def gauge_span(s: Series, grid: np.ndarray, lookback: float) -> tuple[int, np.ndarray]:
    lo, hi = _span(s, grid, lookback)
    return lo, sample_gauge(s, grid[lo:hi], lookback)


def counter_span(s: Series, grid: np.ndarray, lookback: float, w: int,
                  inc: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = _span(s, grid, lookback)
    r, c, resets = sample_counter(s, grid[lo:hi], lookback, w, inc)
    return lo, r, c, resets


def sample_gauge(s: Series, grid: np.ndarray, lookback: float) -> np.ndarray:
    idx = np.searchsorted(s.ts, grid, side="right") - 1
    ok = idx >= 0
    out = np.full(grid.size, np.nan)
    ii = idx[ok]
    fresh = (grid[ok] - s.ts[ii]) <= lookback
    vals = s.values[ii]
    vals = np.where(fresh, vals, np.nan)
    out[ok] = vals
    return out


def counter_increases(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative increase of a counter with resets (a drop means the process restarted and the
    counter began again from 0). Returns (cumulative increase, reset mask)."""
    d = np.empty_like(v)
    if v.size == 0:
        return d, np.zeros(0, dtype=bool)
    d[0] = 0.0
    d[1:] = np.diff(v)
    reset = np.zeros(v.size, dtype=bool)
    reset[1:] = d[1:] < 0
    d[reset] = v[reset]
    return np.cumsum(d), reset


def sample_counter(s: Series, grid: np.ndarray, lookback: float, w: int,
                    inc: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rate per second over ``w`` grid steps, the cumulative increase on the grid, reset times. ``inc``:
    ``counter_increases(s.values)`` when the caller has it already."""
    cum, reset = inc if inc is not None else counter_increases(s.values)
    idx = np.searchsorted(s.ts, grid, side="right") - 1
    ok = idx >= 0
    ii = np.where(ok, idx, 0)
    fresh = ok & ((grid - s.ts[ii]) <= lookback)
    c = np.where(fresh, cum[ii], np.nan)
    tt = np.where(fresh, s.ts[ii], np.nan)
    rate = np.full(grid.size, np.nan)
    if grid.size > w:
        dc = c[w:] - c[:-w]
        dt = tt[w:] - tt[:-w]
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(dt > 0, dc / dt, np.nan)
        rate[w:] = r
        # the first w points: rate from the first sample
    if grid.size and fresh.any():
        # the first w points: rate from the first sample (one vector operation: a Python loop over
        # the points was a third of a short window's frame, detectors/frame.py)
        first = int(np.argmax(fresh))
        j = slice(first + 1, min(first + w, grid.size))
        t0 = tt[first]
        with np.errstate(invalid="ignore", divide="ignore"):
            take = fresh[j] & (tt[j] > t0)
            rate[j] = np.where(take, (c[j] - c[first]) / (tt[j] - t0), rate[j])
    return rate, c, s.ts[reset]


def last_total(series: list[Series], scale: float) -> float:
    """Sum of the series' last values: a counter's lifetime total (NaN when none has a value)."""
    vals = [float(s.values[-1]) * scale for s in series if len(s) and np.isfinite(s.values[-1])]
    return float(sum(vals)) if vals else math.nan



def gpu_id(s: Series) -> str:
    g = s.key.label("gpu")
    if g is None:
        g = s.key.label("UUID") or s.key.label("gpu_uuid") or s.key.label("device") or "0"
    return g



def dedupe_times(ts: list[float], tol: float) -> list[float]:
    out: list[float] = []
    for t in sorted(ts):
        if not out or t - out[-1] > tol:
            out.append(t)
    return out
