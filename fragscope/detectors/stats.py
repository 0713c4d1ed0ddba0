"""Robust window statistics shared by the detectors: baseline vs recent, onsets, trends."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from .. import npstats
from .frame import Frame

# The baseline is the early part of the window, the "recent" state its end. Onsets are found
# where a signal leaves its baseline band and stays out (suffix share of exceedances).
BASELINE_SHARE = 0.25
BASELINE_MIN_S = 20 * 60.0
RECENT_MIN_S = 10 * 60.0
RECENT_SHARE = 0.05
STAY_OUT_SHARE = 0.8


def finite(x: np.ndarray) -> np.ndarray:
    return x[np.isfinite(x)]


def nanmedian(x: np.ndarray) -> float:
    v = finite(x)
    return float(npstats.median(v)) if v.size else math.nan


def nanquantile(x: np.ndarray, q: float) -> float:
    v = finite(x)
    return float(npstats.quantile(v, q)) if v.size else math.nan


def nanmax(x: np.ndarray) -> float:
    v = finite(x)
    return float(v.max()) if v.size else math.nan


def mad_scale(x: np.ndarray) -> float:
    v = finite(x)
    if v.size < 3:
        return math.nan
    return float(1.4826 * npstats.median(np.abs(v - npstats.median(v))))


@dataclass
class Spans:
    base: tuple[float, float]
    recent: tuple[float, float]


def spans(f: Frame) -> Spans:
    start, end = f.start, f.end
    span = end - start
    b_len = max(BASELINE_MIN_S, BASELINE_SHARE * span)
    b_len = min(b_len, 0.5 * span)
    r_len = max(RECENT_MIN_S, RECENT_SHARE * span, 3 * f.step)
    r_len = min(r_len, 0.5 * span)
    return Spans((start, start + b_len), (end - r_len, end))


def mask(f: Frame, span: tuple[float, float]) -> np.ndarray:
    return (f.t >= span[0]) & (f.t <= span[1])


@dataclass
class Change:
    """How a signal's recent state compares with its baseline."""

    baseline: float
    recent: float
    scale: float  # robust noise scale of the baseline (>= floor)
    onset: float | None
    n_recent: int
    n_base: int

    @property
    def delta(self) -> float:
        return self.recent - self.baseline

    @property
    def z(self) -> float:
        if not math.isfinite(self.scale) or self.scale <= 0:
            return math.nan
        return self.delta / self.scale

    def ratio(self) -> float:
        if not math.isfinite(self.baseline) or abs(self.baseline) < 1e-12:
            return math.inf if self.recent > 0 else math.nan
        return self.recent / self.baseline

    @property
    def known(self) -> bool:
        return math.isfinite(self.baseline) and math.isfinite(self.recent)


def change(f: Frame, x: np.ndarray | None, sp: Spans | None = None, *, floor_abs: float = 0.0,
           floor_rel: float = 0.02, direction: int = 1, onset_frac: float = 0.25,
           recent_stat: str = "median") -> Change:
    """Baseline (early median) vs recent (late median or quantile), with a robust noise scale and
    the onset: the earliest time after which the signal stays beyond the baseline band.

    ``direction`` +1 looks for rises, -1 for falls.
    """
    if x is None:
        return Change(math.nan, math.nan, math.nan, None, 0, 0)
    sp = sp or spans(f)
    mb, mr = mask(f, sp.base), mask(f, sp.recent)
    b = finite(x[mb])
    r = finite(x[mr])
    if b.size == 0 or r.size == 0:
        return Change(nanmedian(b) if b.size else math.nan, nanmedian(r) if r.size else math.nan,
                      math.nan, None, int(r.size), int(b.size))
    base = float(npstats.median(b))
    if recent_stat == "median":
        rec = float(npstats.median(r))
    else:
        rec = float(npstats.quantile(r, float(recent_stat)))
    sc = mad_scale(b)
    floor = max(floor_abs, floor_rel * abs(base))
    sc = max(sc if math.isfinite(sc) else 0.0, floor)
    ch = Change(base, rec, sc, None, int(r.size), int(b.size))
    if direction * (rec - base) > 0:
        # band edge: a quarter of the way to the recent level, but outside the noise
        edge = base + direction * max(3.0 * sc, onset_frac * abs(rec - base))
        ch.onset = onset_time(f, x, edge, direction)
    return ch


def onset_time(f: Frame, x: np.ndarray, edge: float, direction: int = 1) -> float | None:
    """Earliest grid time after which >= STAY_OUT_SHARE of finite points lie beyond ``edge``."""
    ok = np.isfinite(x)
    if not ok.any():
        return None
    out = np.zeros(x.size)
    with np.errstate(invalid="ignore"):
        out[ok] = (direction * (x[ok] - edge) > 0).astype(float)
    cnt = ok.astype(float)
    suf_out = np.cumsum(out[::-1])[::-1]
    suf_cnt = np.cumsum(cnt[::-1])[::-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(suf_cnt > 0, suf_out / suf_cnt, 0.0)
    cand = np.nonzero((share >= STAY_OUT_SHARE) & (out > 0))[0]
    if cand.size == 0:
        return None
    return float(f.t[cand[0]])


def slope_per_hour(f: Frame, x: np.ndarray, span: tuple[float, float]) -> tuple[float, float]:
    """Least-squares slope (units per hour) and R² over ``span``."""
    m = mask(f, span) & np.isfinite(x)
    if m.sum() < 5:
        return math.nan, math.nan
    return _linfit(f.t[m], x[m])


def _linfit(t: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope per hour and R² of ``y`` over times ``t`` (seconds)."""
    tt = (np.asarray(t, dtype=float) - t[0]) / 3600.0
    yy = np.asarray(y, dtype=float)
    if np.ptp(tt) <= 0:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = np.polyfit(tt, yy, 1)
    ss_res = float(np.sum((yy - (a * tt + b)) ** 2))
    ss_tot = float(np.sum((yy - yy.mean()) ** 2))
    return float(a), (1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0)


def binned_slope_per_hour(f: Frame, x: np.ndarray, span: tuple[float, float], bins: int = 24
                          ) -> tuple[float, float]:
    """Slope and R² of the medians of ``bins`` equal time bins over ``span``: "grows steadily"
    judged on the trend, not on scrape-to-scrape noise (a noisy allocator reading scores a low R²
    on raw points even when it climbs every hour)."""
    m = mask(f, span) & np.isfinite(x)
    if m.sum() < 5:
        return math.nan, math.nan
    t, v = f.t[m], x[m]
    edges = np.linspace(t[0], t[-1], min(bins, max(3, t.size // 3)) + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2)
    tb, vb = [], []
    for b in range(edges.size - 1):
        sel = idx == b
        if sel.any():
            tb.append(float(npstats.median(t[sel])))
            vb.append(float(npstats.median(v[sel])))
    if len(tb) < 3:
        return math.nan, math.nan
    return _linfit(np.array(tb), np.array(vb))


def share_true(f: Frame, cond: np.ndarray, span: tuple[float, float], valid: np.ndarray | None = None) -> float:
    m = mask(f, span)
    if valid is not None:
        m = m & valid
    if m.sum() == 0:
        return math.nan
    return float(cond[m].mean())


def increase(f: Frame, cum: np.ndarray | None, span: tuple[float, float]) -> float:
    """Counter increase over ``span`` from the cumulative-increase array."""
    if cum is None:
        return math.nan
    m = mask(f, span) & np.isfinite(cum)
    if m.sum() < 2:
        return math.nan
    v = cum[m]
    return float(v[-1] - v[0])


def confidence(agreeing: int, base: float = 0.35, per: float = 0.15, against: int = 0,
               cap: float = 0.95) -> float:
    """Grows with each independent agreeing signal; each contrary one takes some back."""
    c = base + per * max(0, agreeing - 1) - 0.1 * against
    return float(min(cap, max(0.05, c)))
