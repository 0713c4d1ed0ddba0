"""Histogram signals on a Frame: window averages from _sum / _count, per-request rolling means, and
TTFT quantiles over 5-minute windows (Prometheus' histogram_quantile, vectorised over the grid).
"""
from __future__ import annotations

import numpy as np

from ..model import Series
from .frame_model import Frame
from .frame_sampling import Agg, counter_span, counter_increases

_HIST_WINDOW_S = 300.0  # TTFT quantiles over 5-minute windows


def histogram_quantile(q: float, les: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Prometheus' histogram_quantile over a matrix of cumulative bucket counts, all grid points at once.

    ``les`` sorted upper bounds (last may be +Inf); ``counts`` shape (buckets, time), cumulative. NaN
    where the total (last bucket) is not a positive number. Per point: the bucket counts made monotone
    (NaN as 0), the first bucket reaching ``q`` x total, linear interpolation inside it (0 as the first
    bucket's lower bound); in the +Inf bucket, the highest finite bound.
    """
    n_b, n_t = counts.shape
    out = np.full(n_t, np.nan)
    total = counts[-1]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(total) & (total > 0)
    if n_b == 0 or not ok.any():
        return out
    cols = np.flatnonzero(ok)
    col = np.maximum.accumulate(np.nan_to_num(counts[:, cols], nan=0.0), axis=0)
    rank = q * total[cols]
    # first bucket with col >= rank (searchsorted "left" on each monotone column), the last one at most
    b = np.minimum((col < rank).sum(axis=0), n_b - 1)
    les = np.asarray(les, dtype=np.float64)
    up = les[b]
    has_lo = b > 0
    bm1 = np.maximum(b - 1, 0)
    lo = np.where(has_lo, les[bm1], 0.0)
    c_lo = np.where(has_lo, col[bm1, np.arange(cols.size)], 0.0)
    c_hi = col[b, np.arange(cols.size)]
    with np.errstate(invalid="ignore", divide="ignore"):
        interp = np.where(c_hi == c_lo, up, lo + (up - lo) * (rank - c_lo) / (c_hi - c_lo))
    out[cols] = np.where(np.isinf(up), np.where(has_lo, lo, np.nan), interp)
    return out


def fill_histogram(f: Frame, sig_id: str, metric: str, by_name: dict[str, list[Series]], grid: np.ndarray,
               lookback: float, w: int) -> None:
    buckets: dict[float, list[Series]] = {}
    for s in by_name.get(metric + "_bucket", []):
        le = s.key.label("le")
        if le is None:
            continue
        try:
            buckets.setdefault(float(le), []).append(s)
        except ValueError:
            continue
    # window averages from _sum / _count
    sum_ser, cnt_ser = by_name.get(metric + "_sum", []), by_name.get(metric + "_count", [])
    incs = [counter_increases(s.values) for s in sum_ser], [counter_increases(s.values) for s in cnt_ser]
    tot_sum = sum((float(c[-1]) for c, _ in incs[0] if c.size), 0.0)
    tot_cnt = sum((float(c[-1]) for c, _ in incs[1] if c.size), 0.0)
    if tot_cnt == 0 and all(len(s) == 1 for s in cnt_ser):
        # one scrape: the lifetime average since the engine started (sum / count as exported)
        tot_sum = sum(float(s.values[-1]) for s in sum_ser if len(s))
        tot_cnt = sum(float(s.values[-1]) for s in cnt_ser if len(s))
        if tot_cnt > 0:
            f.hist_lifetime.add(sig_id)
    if tot_cnt > 0:
        f.hist_avg[sig_id] = tot_sum / tot_cnt
        f.hist_count[sig_id] = tot_cnt
    # rolling mean per request (rate(_sum) / rate(_count)), e.g. prompt length over time
    sums, cnts = Agg(grid.size, "sum"), Agg(grid.size, "sum")
    for s, inc in zip(sum_ser, incs[0]):
        lo, r, _, _ = counter_span(s, grid, lookback, w, inc)
        sums.add(lo, r)
    for s, inc in zip(cnt_ser, incs[1]):
        lo, r, _, _ = counter_span(s, grid, lookback, w, inc)
        cnts.add(lo, r)
    if sums.added and cnts.added:
        rs, rc = sums.result(), cnts.result()
        with np.errstate(invalid="ignore", divide="ignore"):
            f.engine[sig_id + "_mean"] = np.where(rc > 0, rs / rc, np.nan)
        f.engine[sig_id + "_rate"] = rc  # observations per second (requests finishing)
    if sig_id != "ttft_seconds" or not buckets:
        return
    les = np.array(sorted(buckets))
    hw = max(1, int(round(_HIST_WINDOW_S / f.step)))
    cum_rows = []
    for le in les:
        agg = Agg(grid.size, "sum")
        for s in buckets[le]:
            lo, _, c, _ = counter_span(s, grid, lookback, w)
            agg.add(lo, c)
        cum_rows.append(agg.result())
    cum = np.vstack(cum_rows)
    delta = np.full_like(cum, np.nan)
    if cum.shape[1] > hw:
        delta[:, hw:] = cum[:, hw:] - cum[:, :-hw]
    f.engine["ttft_p50_seconds"] = histogram_quantile(0.5, les, delta)
    f.engine["ttft_p99_seconds"] = histogram_quantile(0.99, les, delta)
