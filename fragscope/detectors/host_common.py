"""Helpers the engine-, container- and host-scope detectors share: the span a verdict is judged on,
counter increases over it, and the container's CPU figures (throttled share, run-queue share).

These signals sit in ``Frame.engine`` / ``Frame.engine_cum`` (one value per pod: the engine's cgroup, its
processes summed, the host).
"""
from __future__ import annotations

import math

import numpy as np

from . import stats
from .frame import Frame

PRESENT_S = 60.0  # the present: the last minute (the level rules of detectors/level.py)
LONG_WINDOW_S = 30 * 60.0  # from here on the detectors' recent span (>= 10 min) is judged instead


def judged_span(f: Frame) -> tuple[float, float]:
    """The span a present-state verdict reads: the last minute (at least three samples) of a short
    window, the recent span of a long one (stats.spans)."""
    if f.end - f.start >= LONG_WINDOW_S:
        return stats.spans(f).recent
    p = max(PRESENT_S, 3 * f.step)
    return (max(f.start, f.end - p), f.end)


def present_span(f: Frame) -> tuple[float, float]:
    """The last minute (at least three samples)."""
    p = max(PRESENT_S, 3 * f.step)
    return (max(f.start, f.end - p), f.end)


def increase(f: Frame, sig: str, span: tuple[float, float]) -> tuple[float, float]:
    """(increase of an engine-scope counter over ``span``, the seconds it covers); NaN without two samples."""
    cum = f.engine_cum.get(sig)
    if cum is None:
        return math.nan, math.nan
    m = stats.mask(f, span) & np.isfinite(cum)
    t = f.t[m]
    if t.size < 2 or t[-1] <= t[0]:
        return math.nan, math.nan
    v = cum[m]
    return float(v[-1] - v[0]), float(t[-1] - t[0])


def gauge(f: Frame, sig: str, span: tuple[float, float], how: str = "median") -> float:
    x = f.engine.get(sig)
    if x is None:
        return math.nan
    v = stats.finite(x[stats.mask(f, span)])
    if not v.size:
        return math.nan
    return float({"median": np.median, "max": np.max, "min": np.min}[how](v))


def throttled_share(f: Frame, span: tuple[float, float] | None = None) -> float:
    """Share of the container's CFS periods in ``span`` that ran out of quota (NaN: not known)."""
    span = span or judged_span(f)
    thr, _ = increase(f, "container_cpu_throttled_periods_total", span)
    per, _ = increase(f, "container_cpu_periods_total", span)
    if not (math.isfinite(thr) and math.isfinite(per)) or per <= 0:
        return math.nan
    return min(1.0, max(0.0, thr / per))


def runqueue_share(f: Frame, span: tuple[float, float] | None = None) -> float:
    """Share of the engine threads' runnable time spent waiting for a CPU: wait / (wait + run)."""
    span = span or judged_span(f)
    wait, _ = increase(f, "process_runqueue_wait_seconds_total", span)
    run, _ = increase(f, "process_cpu_seconds_total", span)
    if not (math.isfinite(wait) and math.isfinite(run)) or wait + run <= 0:
        return math.nan
    return wait / (wait + run)
