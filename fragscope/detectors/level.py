"""Level evidence: the present state judged by itself, against physical and documented limits.

Change evidence (the detectors' baseline-versus-recent comparison) needs a calm stretch before the
incident inside the window. The on-call engineer often holds one scrape, a few minutes, or a window
that lies wholly inside the incident. An expert still answers from the present state: a KV pool at
the edge with requests queued and preemptions, an allocator holding a quarter of its memory unusable
while allocations retry, an SM clock far below the product's maximum with a slowdown reason set.

Each diagnosis that can judge the present writes its level rule beside its change rule, in its own
module (``level`` in kv_pressure.py, fragmentation.py, throttling.py, saturation.py), with its
thresholds in the same Config. This module holds what they share: the present (the last minute of the
window, at least three samples, or the single scrape), counters as the present can tell them (a rate
where two samples exist, else the lifetime total), and the wording of the basis. Lifetime counters
from one scrape are reported as lifetime, rates only where two samples exist.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import npstats
from ..units import fmt_count
from . import stats
from .frame import Frame

PRESENT_S = 60.0  # the present: the last minute (at least three samples)
# The latest evidence: the last 15 s (at least three samples). After a calm stretch the minute's p90 and
# rates still hold the calm samples for up to a minute; a rule may judge the latest samples on their own
# when what they show is strong enough to stand alone (kv_pressure.level: a preemption storm).
LATEST_S = 15.0


def present_span(f: Frame, span_s: float = PRESENT_S) -> tuple[float, float]:
    p = max(span_s, (3 if span_s >= PRESENT_S else 2) * f.step)
    return (max(f.start, f.end - p), f.end)


def latest_is_shorter(f: Frame) -> bool:
    """Whether the latest evidence is a span apart from the present: at most half of it (samples every 15 s
    or more often) and the window reaches back before it. Slower scrapes hold three or four samples in
    the present: nothing shorter is worth judging on its own."""
    lat = max(LATEST_S, 2 * f.step)
    return 2 * lat <= max(PRESENT_S, 3 * f.step) and present_span(f, LATEST_S)[0] > present_span(f)[0]


def present_value(f: Frame, x: np.ndarray | None, how: str = "median", span_s: float = PRESENT_S) -> float:
    if x is None:
        return math.nan
    v = stats.finite(x[stats.mask(f, present_span(f, span_s))])
    if not v.size:
        v = stats.finite(x[-3:])
    if not v.size:
        return math.nan
    return float({"median": npstats.median, "max": np.max, "min": np.min}[how](v)) if how != "p90" \
        else float(npstats.quantile(v, 0.9))


def _rate_per_min(f: Frame, cum: np.ndarray | None, span: tuple[float, float]) -> float:
    """Counter increase per minute over ``span``; NaN with fewer than two samples."""
    if cum is None:
        return math.nan
    m = stats.mask(f, span) & np.isfinite(cum)
    t = f.t[m]
    if t.size < 2 or t[-1] <= t[0]:
        return math.nan
    v = cum[m]
    return float((v[-1] - v[0]) / (t[-1] - t[0]) * 60.0)


@dataclass
class Counter:
    """A counter as the present can tell it: a rate where two samples exist (and their spacing is known),
    else the lifetime total and, between scrapes of unknown spacing, the increase between them."""

    rate_per_min: float
    lifetime: float
    between: float = math.nan  # increase across scrapes whose spacing is unknown

    @property
    def known(self) -> bool:
        return math.isfinite(self.rate_per_min) or math.isfinite(self.lifetime)


def _counter(f: Frame, cum: np.ndarray | None, lifetime: float, span_s: float = PRESENT_S) -> Counter:
    if f.rates_known:
        return Counter(_rate_per_min(f, cum, present_span(f, span_s)), lifetime)
    inc = math.nan
    if cum is not None and np.isfinite(cum).sum() >= 2:
        v = cum[np.isfinite(cum)]
        inc = float(v[-1] - v[0])
    return Counter(math.nan, lifetime, inc)


def engine_counter(f: Frame, sig: str, span_s: float = PRESENT_S) -> Counter:
    return _counter(f, f.engine_cum.get(sig), f.engine_total.get(sig, math.nan), span_s)


def gpu_counter(f: Frame, g: str, sig: str) -> Counter:
    return _counter(f, f.gpu_cum.get(g, {}).get(sig), f.gpu_total.get(g, {}).get(sig, math.nan))


def counter_text(c: Counter, what: str, since: str) -> str:
    if math.isfinite(c.rate_per_min):
        return f"{c.rate_per_min:.1f} {what}/min now"
    one = what.rstrip('s') if what.endswith('s') else what
    if math.isfinite(c.between):
        return (f"{fmt_count(c.between, one, what)} between the scrapes (their spacing is unknown: no rate), "
                f"{fmt_count(c.lifetime, one, what)} since {since}")
    return f"{fmt_count(c.lifetime, one, what)} since {since} (one scrape: no rate)"


def single_sample(f: Frame) -> bool:
    return f.points <= 1


def basis_note(f: Frame) -> str:
    return ("one scrape: judged on the present state; lifetime counters are totals since the process started"
            if single_sample(f) else "no baseline in this window: judged on the present state")
