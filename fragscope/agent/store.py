"""Embedded history: SQLite (WAL), one row per point keyed by (series id, integer ms timestamp).

Why SQLite: in the standard library, crash-safe (WAL + synchronous=NORMAL survives ``kill -9``; a
power cut may lose the last commits, not corrupt the file), and a sidecar needs nothing bigger.
Writes are batched (one transaction per flush). Disk use is bounded two ways: retention by age, and
by size (oldest points dropped first); ``PRAGMA max_page_count`` caps the file hard at 125 % of the
size bound, so a runaway never fills the volume. A full disk (SQLITE_FULL, "database or disk is
full") marks the store degraded, drops the oldest data and keeps the agent running.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from ..model import Labels, Sample, SeriesKey, Window
from ..signals import RAW_TO_SIGNAL, SIGNALS
from .store_read import FETCH_ROWS, HistoryScan, StoreError, TooManyPoints, series_points, query_bounds  # noqa: F401

log = logging.getLogger("fragscope.agent.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id     INTEGER PRIMARY KEY,
    name   TEXT NOT NULL,
    labels TEXT NOT NULL,          -- JSON [[name, value], ...], sorted by name
    type   TEXT NOT NULL,
    UNIQUE (name, labels)
);
CREATE TABLE IF NOT EXISTS points (
    sid INTEGER NOT NULL,
    t   INTEGER NOT NULL,          -- unix milliseconds
    v   REAL    NOT NULL,
    PRIMARY KEY (sid, t)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_SCHEMA_VERSION = "1"
_HIST_SUFFIXES = ("_bucket", "_count", "_sum")
CHUNK = 5000  # rows per write transaction
# Samples kept in memory while the store cannot write (then the oldest go): a buffered row is ~100 bytes
# (a tuple and a float pair), so this is ~10 MB, a minute of 1,600 series at 1 s.
MAX_BUFFER = 100_000
# Series the history holds; a new one past it evicts the series written least recently (its points
# too), counted in series_evicted. An id costs ~300 bytes of memory (its key in _ids): ~1.2 MB. A large
# 8-GPU pod writes ~700 signal series (store.keep = "signals").
MAX_SERIES = 4096


def series_type(name: str) -> str:
    """The Prometheus type of a sample name, from the signal table or its suffix."""
    hit = RAW_TO_SIGNAL.get(name)
    if hit:
        kind = SIGNALS[hit[0]].kind
        return "gauge" if kind == "info" else kind
    for suf in _HIST_SUFFIXES:
        if name.endswith(suf):
            hit = RAW_TO_SIGNAL.get(name[: -len(suf)])
            if hit and SIGNALS[hit[0]].kind in ("histogram", "summary"):
                return SIGNALS[hit[0]].kind
    if name.endswith("_total"):
        return "counter"
    if name.endswith("_bucket"):
        return "histogram"
    return "gauge"


def infer_types(keys: Iterable[SeriesKey]) -> dict[str, str]:
    """Types of sample names seen together (a scrape's samples carry no TYPE line): ``X_count`` and
    ``X_sum`` are histogram parts when ``X_bucket`` exists, summary parts when ``X`` has quantiles."""
    keys = list(keys)
    names = {k.name for k in keys}
    hist = {n[:-7] for n in names if n.endswith("_bucket")}
    summ = {k.name for k in keys if k.label("quantile") is not None}
    out = {}
    for n in names:
        t = series_type(n)
        if n in summ:
            t = "summary"
        for suf in ("_count", "_sum"):
            if n.endswith(suf):
                base = n[: -len(suf)]
                if base in hist:
                    t = "histogram"
                elif base in summ:
                    t = "summary"
        out[n] = t
    return out


@functools.lru_cache(maxsize=8192)  # asked for every sample of every tick; a scrape repeats its names
def is_signal(name: str) -> bool:
    """Whether a sample feeds a detector or the exporter (``store.keep = "signals"``)."""
    if name.startswith("fragscope_"):
        return True
    if name in RAW_TO_SIGNAL:
        return True
    for suf in _HIST_SUFFIXES:
        if name.endswith(suf) and name[: -len(suf)] in RAW_TO_SIGNAL:
            return True
    return False


def _labels_json(labels: Labels) -> str:
    return json.dumps([list(p) for p in labels], separators=(",", ":"))


def _is_full(e: sqlite3.OperationalError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    return code == getattr(sqlite3, "SQLITE_FULL", 13) or "database or disk is full" in str(e)


# ---------------------------------------------------------------------------------------------
class Store:
    """History on disk. Thread-safe: collectors ``append``, the daemon ``flush``es and ``maintain``s,
    the API ``query``s (reads run on their own connection; WAL lets them proceed during a write)."""

    def __init__(self, path: str, retention_s: float = 7 * 86400.0, max_bytes: int = 1024**3,
                 keep: str = "signals", max_series: int = MAX_SERIES) -> None:
        self.path = path
        self.retention_s = float(retention_s)
        self.max_bytes = int(max_bytes)
        self.keep_all = keep == "all"
        self.degraded: str | None = None  # one line while writes fail
        self.points_written = 0
        self.points_dropped = 0  # lost to a full disk or a broken store (counted, never silent)
        self.points_expired = 0  # removed by retention
        self.flushes = 0
        self._buf: list[tuple[str, Labels, float, float]] = []
        self._buf_lock = threading.Lock()
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self.max_series = max(1, int(max_series))
        self.series_evicted = 0  # series removed (with their points) to stay within max_series
        # (name, labels) -> id of every series held, least recently written first
        self._ids: OrderedDict[tuple[str, Labels], int] = OrderedDict()
        self._logged: set[str] = set()
        self._degraded_logged_at = -1e9
        d = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{d}: cannot create the data directory ({e.strerror or e}); "
                             "give a writable --data-dir") from None
        try:
            self._w = self.connect()
            self._w.executescript(_SCHEMA)
            cur = self._w.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if cur is None:
                self._w.execute("INSERT INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))
            elif cur[0] != _SCHEMA_VERSION:
                raise StoreError(f"{path}: history schema {cur[0]} is not {_SCHEMA_VERSION}; "
                                 "move the file away or point --data-dir elsewhere")
            self._w.commit()
            self._load_ids()
            self._r = self.connect()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{path}: cannot open the history ({e}); move the file away or point "
                             "--data-dir elsewhere") from None
        self._page_size = self._w.execute("PRAGMA page_size").fetchone()[0]
        # Hard cap at 125 % of the bound: retention keeps it under max_bytes, this stops a runaway.
        self._w.execute(f"PRAGMA max_page_count = {max(64, int(self.max_bytes * 1.25 // self._page_size))}")

    def connect(self) -> sqlite3.Connection:
        # autocommit mode; transactions are explicit BEGIN/COMMIT
        c = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False, isolation_level=None)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA journal_size_limit=16777216")  # truncate the WAL back to 16 MiB
        return c

    def _log_once(self, key: str, level: int, msg: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg)

    # --- writing ------------------------------------------------------------------------------
    def append(self, samples: Iterable[Sample]) -> int:
        """Buffer samples for the next flush. Non-finite values are skipped (absent, not 0)."""
        keep_all = self.keep_all
        rows = [(s.name, s.labels, s.ts, s.value) for s in samples
                if (keep_all or is_signal(s.name)) and math.isfinite(s.value) and math.isfinite(s.ts)]
        if rows:
            with self._buf_lock:
                self._buf.extend(rows)
                over = len(self._buf) - MAX_BUFFER
                if over > 0:
                    del self._buf[:over]
                    self.points_dropped += over
        return len(rows)

    def pending(self) -> int:
        return len(self._buf)

    def _sid(self, name: str, labels: Labels) -> int:
        ids = self._ids
        key = (name, labels)
        sid = ids.get(key)
        if sid is None:
            while len(ids) >= self.max_series:  # evict the series written least recently, points and all
                _, old = ids.popitem(last=False)
                self._w.execute("DELETE FROM points WHERE sid=?", (old,))
                self._w.execute("DELETE FROM series WHERE id=?", (old,))
                self.series_evicted += 1
            lj = _labels_json(labels)
            self._w.execute("INSERT OR IGNORE INTO series (name, labels, type) VALUES (?, ?, ?)",
                            (name, lj, series_type(name)))
            sid = self._w.execute("SELECT id FROM series WHERE name=? AND labels=?", (name, lj)).fetchone()[0]
            ids[key] = sid
        else:
            ids.move_to_end(key)
        return sid

    def _load_ids(self) -> None:
        """The ids of the series held, oldest first; a history holding more than ``max_series`` (written
        by an earlier version without the bound) keeps the newest ones (within the transaction)."""
        c = self._w
        n = c.execute("SELECT count(*) FROM series").fetchone()[0]
        if n > self.max_series:
            cut = c.execute("SELECT id FROM series ORDER BY id DESC LIMIT 1 OFFSET ?",
                            (self.max_series - 1,)).fetchone()[0]
            c.execute("BEGIN")
            c.execute("DELETE FROM points WHERE sid < ?", (cut,))
            c.execute("DELETE FROM series WHERE id < ?", (cut,))
            c.execute("COMMIT")
            self.series_evicted += n - self.max_series
        self._ids = OrderedDict(((name, tuple(tuple(p) for p in json.loads(labels))), sid) for sid, name, labels
                                in c.execute("SELECT id, name, labels FROM series ORDER BY id"))

    def flush(self) -> int:
        """Write buffered samples, in transactions of at most ``CHUNK`` rows (oldest first, so on a
        full disk the newest survive). Never raises; returns points written."""
        with self._buf_lock:
            rows, self._buf = self._buf, []
        if not rows:
            return 0
        written = 0
        with self._wlock:
            for i in range(0, len(rows), CHUNK):
                n, keep = self._flush_chunk(rows[i:i + CHUNK])
                written += n
                if keep:  # transient error (e.g. locked): keep the rest for the next flush
                    with self._buf_lock:
                        self._buf[:0] = rows[i:][-MAX_BUFFER:]
                    break
        return written

    def _flush_chunk(self, rows: list) -> tuple[int, bool]:
        for attempt in (0, 1):
            try:
                n = self._write(rows)
            except sqlite3.OperationalError as e:
                self._rollback()
                if _is_full(e) and attempt == 0:
                    self._mark_degraded(f"disk full: {e}")
                    self._drop_oldest(0.2)
                    continue
                self._mark_degraded(str(e))
                if _is_full(e):
                    self.points_dropped += len(rows)
                    return 0, False
                return 0, True
            except sqlite3.DatabaseError as e:
                self._rollback()
                self._mark_degraded(str(e))
                self.points_dropped += len(rows)
                return 0, False
            if self.degraded and attempt == 0:
                if time.monotonic() - self._degraded_logged_at > 600.0:
                    log.warning("store %s: writing again (was degraded: %s)", self.path, self.degraded)
                self.degraded = None
            self.points_written += n
            self.flushes += 1
            return n, False
        return 0, False

    def _write(self, rows: list[tuple[str, Labels, float, float]]) -> int:
        c = self._w
        c.execute("BEGIN")
        sid = self._sid
        data = [(sid(name, labels), int(round(ts * 1000.0)), v) for name, labels, ts, v in rows]
        c.executemany("INSERT OR REPLACE INTO points (sid, t, v) VALUES (?, ?, ?)", data)
        c.execute("COMMIT")
        return len(data)

    def _rollback(self) -> None:
        try:
            self._w.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        # ids created (or evicted) in a rolled-back transaction: reload
        try:
            self._ids = OrderedDict(((n, tuple(tuple(p) for p in json.loads(lj))), i) for i, n, lj in
                                    self._w.execute("SELECT id, name, labels FROM series ORDER BY id"))
        except sqlite3.Error:
            self._ids = OrderedDict()

    def _mark_degraded(self, why: str) -> None:
        was = self.degraded
        self.degraded = why.splitlines()[0] if why else "error"
        now = time.monotonic()
        # log on the change of state, at most every 10 minutes when a full disk makes it flap
        if was is None and now - self._degraded_logged_at > 600.0:
            self._degraded_logged_at = now
            log.error("store %s: degraded (%s); the agent keeps running, oldest history is dropped to "
                      "make room", self.path, self.degraded)

    # --- retention ----------------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes of live pages in the database (free pages are reused, not counted)."""
        with self._wlock:
            pc = self._w.execute("PRAGMA page_count").fetchone()[0]
            fl = self._w.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pc - fl) * self._page_size)

    def disk_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal", "-shm"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total

    def _bounds(self) -> tuple[int, int] | None:
        lo, hi = None, None
        for (sid,) in self._w.execute("SELECT id FROM series").fetchall():
            a = self._w.execute("SELECT t FROM points WHERE sid=? ORDER BY t ASC LIMIT 1", (sid,)).fetchone()
            if a is None:
                continue
            b = self._w.execute("SELECT t FROM points WHERE sid=? ORDER BY t DESC LIMIT 1", (sid,)).fetchone()
            lo = a[0] if lo is None else min(lo, a[0])
            hi = b[0] if hi is None else max(hi, b[0])
        return None if lo is None else (lo, hi)

    def _delete_before(self, cutoff_ms: int) -> int:
        """Per series, so each delete is a primary-key range (no full scan, no extra index)."""
        n = 0
        c = self._w
        c.execute("BEGIN")
        try:
            for (sid,) in c.execute("SELECT id FROM series").fetchall():
                n += c.execute("DELETE FROM points WHERE sid=? AND t<?", (sid, cutoff_ms)).rowcount
            c.execute("COMMIT")
        except sqlite3.Error:
            self._rollback()
            raise
        self.points_expired += n
        return n

    def _drop_oldest(self, fraction: float) -> int:
        try:
            b = self._bounds()
            if b is None:
                return 0
            lo, hi = b
            cutoff = lo + max(1, int((hi - lo) * fraction))
            return self._delete_before(cutoff)
        except sqlite3.Error as e:
            self._log_once("drop-failed", logging.ERROR, f"store {self.path}: cannot drop old data ({e})")
            return 0

    def maintain(self, now: float | None = None) -> dict:
        """Apply retention by age, then by size. Never raises."""
        now = time.time() if now is None else now
        out = {"expired": 0, "size_dropped": 0}
        with self._wlock:
            try:
                out["expired"] = self._delete_before(int((now - self.retention_s) * 1000))
            except sqlite3.Error as e:
                self._log_once("retention-failed", logging.ERROR, f"store {self.path}: retention failed ({e})")
            for _ in range(8):
                pc = self._w.execute("PRAGMA page_count").fetchone()[0]
                fl = self._w.execute("PRAGMA freelist_count").fetchone()[0]
                if (pc - fl) * self._page_size <= self.max_bytes:
                    break
                n = self._drop_oldest(0.2)
                out["size_dropped"] += n
                if n == 0:
                    break
            try:
                self._w.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass
        return out

    # --- meta ---------------------------------------------------------------------------------
    def put_meta(self, key: str, value: str) -> None:
        with self._wlock:
            try:
                self._w.execute("BEGIN")
                self._w.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
                self._w.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback()
                self._log_once("meta-" + key, logging.WARNING, f"store {self.path}: cannot save {key} ({e})")

    def get_meta(self, key: str) -> str | None:
        with self._rlock:
            row = self._r.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    # --- reading ------------------------------------------------------------------------------
    def series_list(self) -> list[tuple[int, str, Labels, str]]:
        with self._rlock:
            rows = self._r.execute("SELECT id, name, labels, type FROM series").fetchall()
        return [(i, n, tuple(tuple(p) for p in json.loads(lj)), t) for i, n, lj, t in rows]

    def query(self, names: Sequence[str] | None, start: float, end: float, step: float | None = None,
              max_points: int | None = None, source: str = "") -> Window:
        """Series whose name is in ``names`` (a family name matches its _bucket/_count/_sum/_total
        samples; None: all) over [start, end] unix seconds. ``step`` keeps the last point of each
        step. Raises TooManyPoints past ``max_points``."""
        wanted, lo, hi, step_ms = query_bounds(names, start, end, step)
        cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
        types: dict[str, str] = {}
        total = 0
        with self._rlock:
            for sid, name, labels, typ in self.series_list_unlocked():
                if wanted is not None and name not in wanted:
                    continue
                cur = series_points(self._r, sid, lo, hi, step_ms)
                # in blocks straight into numpy (16 bytes a point), never a list of row tuples (~110
                # bytes a point), and stopped as soon as the bound is passed
                parts = []
                while True:
                    rows = cur.fetchmany(FETCH_ROWS)
                    if not rows:
                        break
                    total += len(rows)
                    if max_points is not None and total > max_points:
                        cur.close()
                        raise TooManyPoints(f"more than {max_points} points in the range: narrow it, name fewer "
                                            "signals or give a larger step")
                    parts.append(np.array(rows, dtype=np.float64))
                if not parts:
                    continue
                arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
                cols[SeriesKey(name, labels)] = (arr[:, 0] / 1000.0, arr[:, 1])
                types[name] = typ
        w = Window.from_columns(cols, source=source or f"agent history {self.path}", types=types)
        return w

    def scan(self, names: Sequence[str] | None, start: float, end: float, step: float | None = None,
             max_points: int | None = None) -> "HistoryScan":
        """The same series and points as :meth:`query`, read lazily for streaming (api.py): counted
        first (TooManyPoints before anything is sent), then each series' times and values in blocks of
        8192 rows, all from one read snapshot on a connection of its own. Close it (or exhaust it)."""
        return HistoryScan(self, names, start, end, step, max_points)

    def series_list_unlocked(self) -> list[tuple[int, str, Labels, str]]:
        rows = self._r.execute("SELECT id, name, labels, type FROM series").fetchall()
        return [(i, n, tuple(tuple(p) for p in json.loads(lj)), t) for i, n, lj, t in rows]

    def stats(self) -> dict:
        return {"path": self.path, "disk_bytes": self.disk_bytes(), "max_bytes": self.max_bytes,
                "retention_seconds": self.retention_s, "series": len(self._ids),
                "points_written": self.points_written, "points_dropped": self.points_dropped,
                "points_expired": self.points_expired, "pending": self.pending(),
                "max_series": self.max_series, "series_evicted": self.series_evicted,
                "degraded": self.degraded}

    def close(self) -> None:
        self.flush()
        with self._wlock:
            for c in (self._w, self._r):
                try:
                    c.close()
                except sqlite3.Error:
                    pass
