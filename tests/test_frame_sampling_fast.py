"""detectors/frame_sampling.py's vectorised pieces against the plain loops they replaced: the scrape
interval (each distinct time array's median once) and a counter's first-window rates."""
from __future__ import annotations

import numpy as np
import pytest

from fragscope.detectors.frame_sampling import series_interval_seconds, sample_counter
from fragscope.model import Series, SeriesKey


def _series(name: str, ts, vs, typ: str = "counter") -> Series:
    return Series(SeriesKey(name, ()), np.asarray(ts, dtype=float), np.asarray(vs, dtype=float), typ)


def _interval_plain(series) -> float | None:
    diffs = [float(np.median(np.diff(s.ts))) for s in series if len(s) >= 2]
    diffs = [d for d in diffs if d > 0]
    return float(np.median(diffs)) if diffs else None


def _first_rates_plain(s: Series, grid: np.ndarray, lookback: float, w: int) -> np.ndarray:
    """The loop of the first w points, as it was written before (reference)."""
    rate, c, _ = sample_counter(s, grid, lookback, w)
    idx = np.searchsorted(s.ts, grid, side="right") - 1
    ok = idx >= 0
    ii = np.where(ok, idx, 0)
    fresh = ok & ((grid - s.ts[ii]) <= lookback)
    tt = np.where(fresh, s.ts[ii], np.nan)
    out = np.full(grid.size, np.nan)
    if grid.size > w:
        out[w:] = rate[w:]
    if fresh.any():
        first = int(np.argmax(fresh))
        for i in range(first + 1, min(first + w, grid.size)):
            if fresh[i] and tt[i] > tt[first]:
                out[i] = (c[i] - c[first]) / (tt[i] - tt[first])
    return out


def test_interval_equals_the_median_over_every_series():
    rng = np.random.default_rng(7)
    shared = np.cumsum(rng.uniform(0.9, 1.2, 120)) + 1.7e9
    series = [_series(f"a{i}", shared.copy(), np.arange(120)) for i in range(40)]  # one page: same times
    # same size and ends as the shared array but different spacing inside (must not be taken for it)
    odd = shared.copy()
    odd[1:-1] = np.linspace(shared[0], shared[-1], 120)[1:-1] + 5.0
    odd.sort()
    series += [_series(f"b{i}", odd + 0.0, np.arange(120)) for i in range(3)]
    series += [_series(f"c{i}", shared[::3].copy(), np.arange(40)) for i in range(30)]  # a slower source
    series += [_series("one", shared[:1].copy(), [1.0])]
    assert series_interval_seconds(series) == pytest.approx(_interval_plain(series), abs=0)
    # the slower source outnumbering the page moves the answer: the shortcut keeps the per-series vote
    more = series + [_series(f"d{i}", shared[::3].copy(), np.arange(40)) for i in range(20)]
    assert series_interval_seconds(more) == _interval_plain(more) and series_interval_seconds(more) > 2.5
    assert series_interval_seconds([]) is None and series_interval_seconds(series[-1:]) is None


@pytest.mark.parametrize("start,w", [(0.0, 120), (30.0, 120), (0.0, 8), (57.3, 200)])
def test_first_window_rates_equal_the_loop(start, w):
    grid = 1.7e9 + np.arange(0.0, 150.0, 1.0)
    ts = 1.7e9 + start + np.cumsum(np.r_[0.0, np.full(60, 1.01), [9.0], np.full(30, 1.0)])  # a gap
    vs = np.cumsum(np.r_[5.0, np.arange(1, ts.size) % 7])
    vs[70:] -= vs[70] - 2.0  # a reset
    s = _series("x_total", ts, vs)
    got = sample_counter(s, grid, 3.0, w)[0]
    want = _first_rates_plain(s, grid, 3.0, w)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).sum() > 20


@pytest.mark.parametrize("how", ["sum", "mean", "max", "min"])
def test_agg_of_spans_equals_the_stacked_rows(how):
    """Agg (one series kept as sampled, accumulation from the second on) against full-grid rows stacked
    and reduced with numpy's NaN-aware functions: same values, NaN where no series has one."""
    from fragscope.detectors.frame_sampling import Agg

    n = 12
    spans = [(0, np.array([1.0, np.nan, 3.0, 4.0])), (2, np.array([5.0, 6.0, np.nan])), (9, np.array([2.0, 7.0]))]
    assert np.isnan(Agg(n, how).result()).all()  # nothing added: no data anywhere
    for k in (1, 2, 3):
        agg = Agg(n, how)
        rows = np.full((k, n), np.nan)
        for i, (lo, v) in enumerate(spans[:k]):
            agg.add(lo, v)
            rows[i, lo:lo + v.size] = v
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = {"sum": np.nansum, "mean": np.nanmean, "max": np.nanmax, "min": np.nanmin}[how](rows, axis=0)
        want[np.isnan(rows).all(axis=0)] = np.nan
        np.testing.assert_array_equal(agg.result(), want)
