"""The agent's in-memory detection window: every signal's recent history at a fixed step.

Numpy buffers per series, last value per step, shifted by a quarter when full (amortised O(1));
``window_at`` hands the detectors a :class:`~fragscope.model.Window` without touching SQLite.
"""
from __future__ import annotations

import math
import threading
from typing import Iterable

import numpy as np

from ..model import Sample, SeriesKey, Window
from .store import series_type


class Ring:
    """Recent history of every signal at a fixed step (last value per step), in numpy buffers."""

    def __init__(self, window_s: float, step_s: float) -> None:
        self.step = float(step_s)
        self.cap = max(4, int(math.ceil(window_s / step_s)) + 1)
        self.window = float(window_s)
        self._d: dict[SeriesKey, list] = {}  # key -> [ts array, value array, n, last bucket, type]
        self._lock = threading.Lock()
        self.out_of_order = 0  # samples older than their series' last step (a clock stepped back)

    def add(self, samples: Iterable[Sample]) -> None:
        step = self.step
        with self._lock:
            d = self._d
            for s in samples:
                key = SeriesKey(s.name, s.labels)
                e = d.get(key)
                b = math.floor(s.ts / step)
                if e is None:
                    e = d[key] = [np.empty(self.cap), np.empty(self.cap), 0, None, series_type(s.name)]
                ts, vs, n = e[0], e[1], e[2]
                if n and b < e[3]:  # older than the last step: the wall clock went back; keep the
                    self.out_of_order += 1  # ring sorted (the agent shifts it once it sees the jump)
                    continue
                if e[3] == b and n:
                    ts[n - 1], vs[n - 1] = s.ts, s.value  # same step: the last value wins
                    continue
                if n == self.cap:  # full: shift left by a quarter (amortised O(1))
                    k = self.cap // 4
                    ts[:-k] = ts[k:]
                    vs[:-k] = vs[k:]
                    n -= k
                ts[n], vs[n] = s.ts, s.value
                e[2], e[3] = n + 1, b

    def shift(self, delta_s: float) -> None:
        """Move every held timestamp by ``delta_s`` (the wall clock jumped by that much): the recent
        history stays continuous with the samples stamped by the new clock."""
        step = self.step
        with self._lock:
            for e in self._d.values():
                n = e[2]
                if n:
                    e[0][:n] += delta_s
                    e[3] = math.floor(e[0][n - 1] / step)

    def window_at(self, now: float, source: str, span: float | None = None) -> Window:
        """The ring's samples from ``now - span`` (default: the whole detection window) on."""
        lo = now - (self.window if span is None else min(span, self.window))
        cols = {}
        types = {}
        with self._lock:
            for key, (ts, vs, n, _, typ) in list(self._d.items()):
                if not n:
                    continue
                i = int(np.searchsorted(ts[:n], lo))
                if i >= n:
                    continue
                cols[key] = (ts[i:n].copy(), vs[i:n].copy())
                types[key.name] = typ
        return Window.from_columns(cols, source=source, types=types)

    def __len__(self) -> int:
        return len(self._d)

    def points(self) -> int:
        return sum(e[2] for e in self._d.values())
