"""Reading the agent's history back: query bounds, one series' points, and :class:`HistoryScan`, the
streamed read the API serves (series by series, block by block, from one read snapshot)."""
from __future__ import annotations

import json
import math
import sqlite3
from typing import Any, Sequence

import numpy as np

from ..model import SeriesKey

class StoreError(RuntimeError):
    """The history cannot be opened or queried; one-line message naming the file."""


class TooManyPoints(StoreError):
    pass


_FAMILY_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info")
FETCH_ROWS = 8192  # rows per fetchmany()


def query_bounds(names: Sequence[str] | None, start: float, end: float,
                  step: float | None) -> tuple[set[str] | None, int, int, int]:
    """(wanted sample names or None for all, start ms, end ms, step ms or 0) of a history query."""
    wanted: set[str] | None = None
    if names:
        wanted = set()
        for n in names:
            wanted.add(n)
            wanted.update(n + s for s in _FAMILY_SUFFIXES)
    step_ms = int(step * 1000) if step and step > 0 else 0
    return wanted, int(math.floor(start * 1000)), int(math.ceil(end * 1000)), step_ms


def series_points(c: sqlite3.Connection, sid: int, lo: int, hi: int, step_ms: int) -> sqlite3.Cursor:
    """A cursor over (t ms, v) of one series in [lo, hi], the last point of each step when step_ms."""
    if step_ms:
        # SQLite: a bare column next to max() comes from the row holding the max.
        return c.execute("SELECT max(t), v FROM points WHERE sid=? AND t>=? AND t<=? GROUP BY t/? ORDER BY 1",
                         (sid, lo, hi, step_ms))
    return c.execute("SELECT t, v FROM points WHERE sid=? AND t>=? AND t<=? ORDER BY t", (sid, lo, hi))


_SCAN_CACHE_KIB = 512  # SQLite page cache of a scan's own connection (the default is 2 MiB)


class HistoryScan:
    """One history query read series by series, block by block: what the API streams.

    Memory: one block of 8192 rows (~1 MB of row tuples, 64 KiB as numpy) and a 512 KiB page cache,
    whatever the number of points; ``Store.query`` holds every point at once (16 bytes each in numpy,
    twice while the Window is cleaned). Each series is read twice (its times, then its values, the
    order the JSON document needs) inside one read transaction, so both passes see the same rows
    even while the writer commits (WAL snapshot)."""

    def __init__(self, store: Any, names: Sequence[str] | None, start: float, end: float,
                 step: float | None, max_points: int | None) -> None:
        wanted, self.lo, self.hi, self.step_ms = query_bounds(names, start, end, step)
        try:
            self._c = sqlite3.connect(store.path, timeout=5.0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"{store.path}: cannot read the history ({e})") from None
        self.series: list[tuple[int, SeriesKey, str, int]] = []  # (sid, key, type, points)
        self.total = 0
        try:
            self._c.execute(f"PRAGMA cache_size=-{_SCAN_CACHE_KIB}")
            self._c.execute("BEGIN")  # one snapshot for the count and both passes
            rows = self._c.execute("SELECT id, name, labels, type FROM series").fetchall()
            found = []
            for sid, name, lj, typ in rows:
                if wanted is not None and name not in wanted:
                    continue
                key = SeriesKey(name, tuple(tuple(p) for p in json.loads(lj)))
                found.append((key.name, key.labels, sid, key, typ))
            found.sort(key=lambda r: (r[0], r[1]))
            for _, _, sid, key, typ in found:
                if self.step_ms:
                    n = self._c.execute("SELECT count(*) FROM (SELECT 1 FROM points WHERE sid=? AND t>=? AND "
                                        "t<=? GROUP BY t/?)", (sid, self.lo, self.hi, self.step_ms)).fetchone()[0]
                else:
                    n = self._c.execute("SELECT count(*) FROM points WHERE sid=? AND t>=? AND t<=?",
                                        (sid, self.lo, self.hi)).fetchone()[0]
                if not n:
                    continue
                self.total += n
                if max_points is not None and self.total > max_points:
                    raise TooManyPoints(f"more than {max_points} points in the range: narrow it, name fewer "
                                        "signals or give a larger step")
                self.series.append((sid, key, typ, n))
        except BaseException:
            self.close()
            raise

    def column(self, sid: int, which: str):
        """The series' times (``"t"``, unix seconds) or values (``"v"``) in order, as numpy blocks."""
        cur = series_points(self._c, sid, self.lo, self.hi, self.step_ms)
        i = 0 if which == "t" else 1
        try:
            while True:
                rows = cur.fetchmany(FETCH_ROWS)
                if not rows:
                    return
                arr = np.array(rows, dtype=np.float64)[:, i]
                del rows
                yield arr / 1000.0 if i == 0 else arr
        finally:
            cur.close()

    def close(self) -> None:
        c, self._c = getattr(self, "_c", None), None
        if c is not None:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            c.close()
