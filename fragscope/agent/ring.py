"""The agent's in-memory detection window: every signal's recent history at a fixed step.

Numpy buffers per series, last value per step, shifted by a quarter when full (amortised O(1));
``window_at`` hands the detectors a :class:`~fragscope.model.Window` without touching SQLite.
``version`` grows with every accepted sample, so a reader can tell that nothing arrived since it looked.

Bounded whatever the engine exports (agent/budget.py): at most ``max_series`` series and ``max_points``
points of buffer; a series' buffers start small and double up to the window, so a series seen once (label
churn) costs ~1 KB, not the 35 KB of a full 3-hour window at 5 s; past a bound, the series seen least
recently are evicted (counted in ``evicted``).
"""
from __future__ import annotations

import math
import threading
from collections import deque
from typing import Callable, Iterable

import numpy as np

from ..model import Labels, Sample, Series, SeriesKey, Window
from .budget import MAX_RING_POINTS, MAX_RING_SERIES
from .store import series_type

# One entry per series: [ts array, value array, n held, last step index, type, SeriesKey, last add() call,
# the raw samples of the last RECENT_S (deque of (ts, value))]
_TS, _VS, _N, _STEP, _TYPE, _KEY, _SEEN, _RAW = range(8)
_FIRST = 16  # points a new series' buffers hold before they first double
# Every sample of the last RECENT_S is also kept as it came (1 s sampling: ~25 a series), beside the steps:
# the present judged on its own (agent/loops.py judge_recent) sees each scrape, not the last one per step.
RECENT_S = 25.0


class Ring:
    """Recent history of every signal at a fixed step (last value per step), in numpy buffers."""

    def __init__(self, window_s: float, step_s: float, max_series: int = MAX_RING_SERIES,
                 max_points: int = MAX_RING_POINTS) -> None:
        self.step = float(step_s)
        self.cap = max(4, int(math.ceil(window_s / step_s)) + 1)
        self.window = float(window_s)
        self.max_series = max(1, int(max_series))
        self.max_points = max(self.cap, int(max_points))
        self.allocated = 0  # points the buffers can hold, all series together
        self.evicted = 0  # series evicted, least recently seen first, to stay within the bounds
        self.dropped = 0  # samples of new series refused: every series held was seen in the same add()
        self._calls = 0
        # keyed by the plain (name, labels) tuple: hashing it costs a third of hashing a SeriesKey
        self._d: dict[tuple[str, Labels], list] = {}
        self._lock = threading.Lock()
        self.out_of_order = 0  # samples older than their series' last step (a clock stepped back)
        self.version = 0  # accepted samples so far (the watch pass skips when it has not moved)

    def add(self, samples: Iterable[Sample]) -> None:
        step = self.step
        floor, isfinite = math.floor, math.isfinite
        accepted = 0
        keep = RECENT_S
        with self._lock:
            self._calls += 1
            call = self._calls
            d = self._d
            for s in samples:
                t = s.ts
                if not isfinite(t):
                    continue
                key = (s.name, s.labels)
                e = d.get(key)
                b = floor(t / step)
                if e is None:
                    if len(d) >= self.max_series and not self._evict(call, len(d) - self.max_series + 1):
                        self.dropped += 1
                        continue
                    size = min(self.cap, _FIRST)
                    if not self._room(call, size):
                        self.dropped += 1
                        continue
                    e = d[key] = [np.empty(size), np.empty(size), 0, None, series_type(s.name),
                                  SeriesKey(s.name, s.labels), call, deque()]
                    self.allocated += size
                else:
                    e[_SEEN] = call
                n = e[_N]
                if n:
                    last = e[_STEP]
                    if b < last:  # older than the last step: the wall clock went back; keep the
                        self.out_of_order += 1  # ring sorted (the agent shifts it once it sees the jump)
                        continue
                    raw = e[_RAW]
                    if not raw or t > raw[-1][0]:
                        raw.append((t, s.value))
                        while raw[0][0] < t - keep:
                            raw.popleft()
                    if b == last:  # same step: the last value wins
                        e[_TS][n - 1] = t
                        e[_VS][n - 1] = s.value
                        accepted += 1
                        continue
                else:
                    e[_RAW].append((t, s.value))
                ts, vs = e[_TS], e[_VS]
                if n == ts.size:
                    if n < self.cap and self._room(call, min(self.cap, 2 * n) - n):
                        size = min(self.cap, 2 * n)  # grow: double, up to the window
                        self.allocated += size - n
                        ts = np.concatenate((ts[:n], np.empty(size - n)))
                        vs = np.concatenate((vs[:n], np.empty(size - n)))
                        e[_TS], e[_VS] = ts, vs
                    else:  # full (or no room to grow): shift left by a quarter (amortised O(1))
                        k = max(1, n // 4)
                        ts[:-k] = ts[k:]
                        vs[:-k] = vs[k:]
                        n -= k
                ts[n] = t
                vs[n] = s.value
                e[_N], e[_STEP] = n + 1, b
                accepted += 1
            self.version += accepted

    def _room(self, call: int, more: int) -> bool:
        """Whether ``more`` points fit the points bound, evicting series not seen in this call."""
        over = self.allocated + more - self.max_points
        if over <= 0:
            return True
        return self._evict(call, 0, over)

    def _evict(self, call: int, n_series: int, n_points: int = 0) -> bool:
        """Evict the least recently seen series (none seen in this add() call) until ``n_series`` series
        and ``n_points`` points of buffer are freed, plus an eighth of the bound so that eviction stays
        amortised; False when that much cannot be freed."""
        cands = sorted((e for e in self._d.values() if e[_SEEN] != call), key=lambda e: e[_SEEN])
        want_s = n_series + (self.max_series // 8 if n_series else 0)
        want_p = n_points + (self.max_points // 8 if n_points else 0)
        freed_s = freed_p = 0
        for e in cands:
            if freed_s >= want_s and freed_p >= want_p:
                break
            del self._d[(e[_KEY].name, e[_KEY].labels)]
            freed_s += 1
            freed_p += e[_TS].size
            self.allocated -= e[_TS].size
            self.evicted += 1
        return freed_s >= n_series and freed_p >= n_points

    def shift(self, delta_s: float) -> None:
        """Move every held timestamp by ``delta_s`` (the wall clock jumped by that much): the recent
        history stays continuous with the samples stamped by the new clock."""
        step = self.step
        with self._lock:
            for e in self._d.values():
                n = e[_N]
                if n:
                    e[_TS][:n] += delta_s
                    e[_STEP] = math.floor(e[_TS][n - 1] / step)
                e[_RAW] = deque((t + delta_s, v) for t, v in e[_RAW])
            self.version += 1

    def window_at(self, now: float, source: str, span: float | None = None,
                  keep: Callable[[SeriesKey], bool] | None = None) -> Window:
        """The ring's samples from ``now - span`` (default: the whole detection window) on, of the
        series ``keep`` accepts (default: all).

        Built straight into :class:`~fragscope.model.Series`: the ring's times are strictly increasing
        by construction (one point per step, older ones refused), so only non-finite values are dropped
        (what ``Window.from_columns`` would do, without its sort check and extra copies)."""
        lo = now - (self.window if span is None else min(span, self.window))
        out: dict[SeriesKey, Series] = {}
        dropped = 0
        start, end = math.inf, -math.inf
        with self._lock:
            for ts, vs, n, _, typ, key, _, _ in self._d.values():
                if not n or (keep is not None and not keep(key)):
                    continue
                i = int(np.searchsorted(ts[:n], lo)) if ts[0] < lo else 0
                if i >= n:
                    continue
                t, v = ts[i:n].copy(), vs[i:n].copy()
                ok = np.isfinite(v)
                if not ok.all():
                    dropped += int(ok.size - np.count_nonzero(ok))
                    t, v = t[ok], v[ok]
                    if not t.size:
                        continue
                out[key] = Series(key, t, v, typ)
                if t[0] < start:
                    start = float(t[0])
                if t[-1] > end:
                    end = float(t[-1])
        if not out:
            start = end = math.nan
        return Window(out, start, end, source, dropped)

    def recent_window(self, now: float, source: str, span: float = RECENT_S,
                      keep: Callable[[SeriesKey], bool] | None = None) -> Window:
        """Every sample of the last ``span`` seconds (at most RECENT_S) as it came, not one per step: the
        present as a fresh look at the source would sample it."""
        lo = now - min(span, RECENT_S)
        out: dict[SeriesKey, Series] = {}
        start, end = math.inf, -math.inf
        with self._lock:
            for e in self._d.values():
                raw = e[_RAW]
                if not raw or raw[-1][0] < lo or (keep is not None and not keep(e[_KEY])):
                    continue
                pts = [(t, v) for t, v in raw if t >= lo and math.isfinite(v)]
                if not pts:
                    continue
                t = np.fromiter((p[0] for p in pts), float, len(pts))
                v = np.fromiter((p[1] for p in pts), float, len(pts))
                out[e[_KEY]] = Series(e[_KEY], t, v, e[_TYPE])
                start, end = min(start, float(t[0])), max(end, float(t[-1]))
        if not out:
            start = end = math.nan
        return Window(out, start, end, source)

    def __len__(self) -> int:
        return len(self._d)

    def points(self) -> int:
        return sum(e[_N] for e in self._d.values())
