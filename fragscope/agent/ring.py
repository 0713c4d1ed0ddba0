"""The agent's in-memory detection window: every signal's recent history at a fixed step.

Numpy buffers per series, last value per step, shifted by a quarter when full (amortised O(1));
``window_at`` hands the detectors a :class:`~fragscope.model.Window` without touching SQLite.
``version`` grows with every accepted sample, so a reader can tell that nothing arrived since it looked.
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Iterable

import numpy as np

from ..model import Labels, Sample, Series, SeriesKey, Window
from .store import series_type

# One entry per series: [ts array, value array, n held, last step index, type, SeriesKey]
_TS, _VS, _N, _STEP, _TYPE, _KEY = range(6)


class Ring:
    """Recent history of every signal at a fixed step (last value per step), in numpy buffers."""

    def __init__(self, window_s: float, step_s: float) -> None:
        self.step = float(step_s)
        self.cap = max(4, int(math.ceil(window_s / step_s)) + 1)
        self.window = float(window_s)
        # keyed by the plain (name, labels) tuple: hashing it costs a third of hashing a SeriesKey
        self._d: dict[tuple[str, Labels], list] = {}
        self._lock = threading.Lock()
        self.out_of_order = 0  # samples older than their series' last step (a clock stepped back)
        self.version = 0  # accepted samples so far (the watch pass skips when it has not moved)

    def add(self, samples: Iterable[Sample]) -> None:
        step = self.step
        floor, isfinite = math.floor, math.isfinite
        accepted = 0
        with self._lock:
            d = self._d
            for s in samples:
                t = s.ts
                if not isfinite(t):
                    continue
                key = (s.name, s.labels)
                e = d.get(key)
                b = floor(t / step)
                if e is None:
                    e = d[key] = [np.empty(self.cap), np.empty(self.cap), 0, None, series_type(s.name),
                                  SeriesKey(s.name, s.labels)]
                n = e[_N]
                if n:
                    last = e[_STEP]
                    if b == last:  # same step: the last value wins
                        e[_TS][n - 1] = t
                        e[_VS][n - 1] = s.value
                        accepted += 1
                        continue
                    if b < last:  # older than the last step: the wall clock went back; keep the
                        self.out_of_order += 1  # ring sorted (the agent shifts it once it sees the jump)
                        continue
                ts, vs = e[_TS], e[_VS]
                if n == self.cap:  # full: shift left by a quarter (amortised O(1))
                    k = self.cap // 4
                    ts[:-k] = ts[k:]
                    vs[:-k] = vs[k:]
                    n -= k
                ts[n] = t
                vs[n] = s.value
                e[_N], e[_STEP] = n + 1, b
                accepted += 1
            self.version += accepted

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
            for ts, vs, n, _, typ, key in self._d.values():
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

    def __len__(self) -> int:
        return len(self._d)

    def points(self) -> int:
        return sum(e[_N] for e in self._d.values())
