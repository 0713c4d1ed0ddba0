"""Integer columns of SQLite tables as int64 numpy arrays, for the Nsight Systems reader: connectorx's
public ``read_sql`` when it is installed, else the stdlib ``sqlite3`` module rendering each column of a
chunk of rows as one ``group_concat`` string that numpy parses; one thread per table (both release the
GIL). Connections are read-only and every stdlib statement runs under a deadline (progress handler).
Speed and design notes: :mod:`fragscope.collectors.nsys`.
"""
from __future__ import annotations

import importlib.util
import os
import sqlite3
import threading
import time
import urllib.parse
import warnings

import numpy as np

from ..timeline_model import TraceError

_CHUNK_ROWS = 2_000_000  # rows per group_concat string (stays far below SQLite's 1 GB string limit)
_PARTITION_MIN_ROWS = 500_000  # connectorx: split a table into rowid ranges read in parallel above this
# "auto": connectorx only when the tables to read hold this many rows together (by rowid span). Its public
# read_sql returns a pandas DataFrame, and importing pandas costs about 0.5 s of CPU here (0.78 s against
# numpy's 0.24 s). Whole `diagnose trace` process, best CPU / best wall, connectorx vs stdlib, exports of N
# kernels + N launches (2-core VM at load 5-7): N = 50 k 0.67 / 1.71 s vs 0.63 / 1.40 s; 125 k 0.99 / 2.54 s
# vs 0.98 / 2.47 s; 250 k 0.91 / 1.90 s vs 1.06 / 1.67 s; 500 k 1.27 / 2.14 s vs 1.39 / 2.87 s; 1 M
# 1.53 / 2.51 s vs 2.26 / 3.59 s. FRAGSCOPE_SQLITE_READER=connectorx forces it.
_CX_MIN_TOTAL_ROWS = 1_000_000
_CX_LOCK = threading.Lock()
# A stdlib statement running longer than this is stopped (sqlite3 progress handler): a real export's
# largest read takes seconds (2 M rows: ~1 s here); a crafted file must not hang the reader.
QUERY_TIMEOUT_S = float(os.environ.get("FRAGSCOPE_SQLITE_TIMEOUT_S", "600"))
_PROGRESS_OPS = 100_000  # SQLite VM steps between two deadline checks (~1 ms)


def connect(path: str) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    deadline = time.monotonic() + QUERY_TIMEOUT_S

    def too_long() -> int:  # nonzero stops the statement: sqlite3.OperationalError "interrupted"
        return time.monotonic() > deadline

    conn.set_progress_handler(too_long, _PROGRESS_OPS)
    return conn



class Query:
    """Integer columns of one table: (expression, value when NULL) pairs, an optional WHERE."""

    def __init__(self, table: str, cols: list[tuple[str, int]], where: str = "", post=None) -> None:
        self.table, self.cols, self.where, self.post = table, cols, where, post
        self.result: list[np.ndarray] | None = None  # the columns, then what ``post`` made of them

    def exprs(self) -> list[str]:
        return [e for e, _ in self.cols]



class Fetcher:
    """Reads integer columns of tables as int64 numpy arrays (connectorx when available, else stdlib),
    one thread per table."""

    def __init__(self, path: str, reader: str) -> None:
        self.path = path
        self.backend = "stdlib"
        self.auto = reader == "auto"
        if reader in ("auto", "connectorx"):
            if _cx_available():
                self.backend = "connectorx"
            elif reader == "connectorx":
                raise TraceError("connectorx is not installed (pip install connectorx)")
        self._lock = threading.Lock()

    def run(self, queries: list[Query]) -> None:
        if self.backend == "connectorx" and self.auto and _rows(self.path, queries) < _CX_MIN_TOTAL_ROWS:
            self.backend = "stdlib"
        errors: list[BaseException] = []

        def work(q: Query) -> None:
            try:
                q.result = self._one(q)
                if q.post is not None:  # in this thread too: numpy releases the GIL on large arrays
                    q.result = q.post(q.result)
            except BaseException as e:  # noqa: BLE001 -- re-raised in the calling thread
                errors.append(e)

        # In the order given, the first (the kernel table, the longest read) first: connectorx holds the
        # GIL while it counts a query's rows (0.06 s for 2 M kernels, 0.1 s for the filtered runtime
        # rows), so a read started before the kernel table's delayed it by that much.
        threads = [threading.Thread(target=work, args=(q,), daemon=True) for q in queries[:-1]]
        for t in threads:
            t.start()
        if queries:
            work(queries[-1])
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _one(self, q: Query) -> list[np.ndarray]:
        conn = connect(self.path)
        try:
            # two statements: SQLite answers a lone min() or max() of the rowid from the b-tree's edge,
            # but scans the whole table for both in one statement (0.1 s on 2 M kernels)
            (lo,) = conn.execute(f'SELECT min(rowid) FROM "{q.table}"').fetchone()
            (hi,) = conn.execute(f'SELECT max(rowid) FROM "{q.table}"').fetchone()
            if lo is None:
                return [np.zeros(0, dtype=np.int64) for _ in q.cols]
            if self.backend == "connectorx":
                try:
                    return self._connectorx(q, int(lo), int(hi))
                except Exception:  # noqa: BLE001 -- any connectorx failure: fall back to the stdlib reader
                    with self._lock:
                        self.backend = "stdlib"
            return _stdlib(conn, q, int(lo), int(hi), self.path)
        finally:
            conn.close()

    def _connectorx(self, q: Query, lo: int, hi: int) -> list[np.ndarray]:
        sel = ", ".join(f"{e} AS c{i}" for i, e in enumerate(q.exprs()))
        sql = f'SELECT {sel} FROM "{q.table}"'
        parts = _cx_parts(hi - lo + 1)
        if parts <= 1:
            return self._cx_read(q, sql + (f" WHERE {q.where}" if q.where else ""))
        # Rowid ranges, one read_sql call each in its own thread, joined in rowid order (connectorx's
        # own multi-query read returns the partitions in no fixed order).
        step = (hi - lo + parts) // parts
        cond = f" AND ({q.where})" if q.where else ""
        # (the last range open above: lo + parts * step can pass 2**63 - 1, which SQLite would read as a REAL)
        sqls = [f"{sql} WHERE rowid >= {lo + i * step}" + (f" AND rowid < {lo + (i + 1) * step}" if i < parts - 1
                                                            else "") + cond for i in range(parts)]
        out: list = [None] * parts
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                out[i] = self._cx_read(q, sqls[i])
            except BaseException as e:  # noqa: BLE001 -- re-raised below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(1, parts)]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [np.concatenate([o[j] for o in out]) for j in range(len(q.cols))]

    def _cx_read(self, q: Query, sql: str) -> list[np.ndarray]:
        conn = "sqlite://" + urllib.parse.quote(os.path.abspath(self.path))
        df = _cx().read_sql(conn, sql, return_type="pandas")
        return [df[f"c{i}"].to_numpy(dtype=np.int64, na_value=nv) for i, (_, nv) in enumerate(q.cols)]


def _rows(path: str, queries: list[Query]) -> int:
    """Rows of the tables to read, by rowid span (an upper bound; two b-tree edge lookups per table)."""
    conn = connect(path)
    try:
        n = 0
        for q in queries:
            (lo,) = conn.execute(f'SELECT min(rowid) FROM "{q.table}"').fetchone()
            (hi,) = conn.execute(f'SELECT max(rowid) FROM "{q.table}"').fetchone()
            if lo is not None:
                n += int(hi) - int(lo) + 1
        return n
    finally:
        conn.close()


def _cx_available() -> bool:
    try:
        return importlib.util.find_spec("connectorx") is not None  # locates it without importing it
    except (ImportError, ValueError):
        return False


def _cx():
    """The connectorx package, imported once (from any reader thread). connectorx 0.4.6 calls a pandas API
    that pandas 3 deprecates: that warning, from connectorx's own module only, is silenced here
    (``warnings.catch_warnings`` per call would swap process-wide state across threads)."""
    with _CX_LOCK:
        import connectorx

        # (re-added each call: an identical filter is replaced, not stacked; test runners reset filters)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"connectorx(\..*)?$")
        return connectorx


def _cx_parts(rows: int) -> int:
    """Rowid ranges to read one table in (in parallel threads); the kernel and runtime tables already
    run side by side, so split further only with spare cores."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if rows < _PARTITION_MIN_ROWS:
        return 1
    return max(1, min(8, cpus // 2))


def _stdlib(conn: sqlite3.Connection, q: Query, lo: int, hi: int, path: str = "") -> list[np.ndarray]:
    # One scan per chunk of rows for all columns; each column comes back as one string (no per-row
    # Python objects). group_concat skips NULLs, hence ifnull: the columns stay aligned. Chunks are
    # _CHUNK_ROWS rows from the last rowid read (keyset pagination): sparse rowids (1 and 2**63-1) take
    # one step, not 2**63 / _CHUNK_ROWS of them.
    inner = ", ".join(f"ifnull({e}, {nv}) AS x{i}" for i, (e, nv) in enumerate(q.cols))
    outer = ", ".join(f"group_concat(x{i})" for i in range(len(q.cols)))
    cond = f" AND ({q.where})" if q.where else ""
    out: list[list[np.ndarray]] = [[] for _ in q.cols]
    after, first = lo, True
    while True:
        where = (f"rowid >= {lo}" if first else f"rowid > {after}") + cond
        row = conn.execute(f'SELECT max(r), {outer} FROM (SELECT rowid AS r, {inner} FROM "{q.table}" WHERE '
                           f'{where} ORDER BY rowid LIMIT {_CHUNK_ROWS})').fetchone()
        first = False
        if row[0] is None:
            break
        for i, sv in enumerate(row[1:]):
            if sv is None:
                a = np.zeros(0, dtype=np.int64)
            elif isinstance(sv, str):
                try:
                    a = np.fromstring(sv, dtype=np.int64, sep=",")
                except ValueError:
                    a = None
            else:
                a = None
            if a is None:
                raise TraceError(f"cannot read {path}: {q.table}: {q.cols[i][0]} holds values that are not "
                                 "integers")
            out[i].append(a)
        after = int(row[0])
        if after >= hi:
            break
    res = [np.concatenate(c) if len(c) > 1 else (c[0] if c else np.zeros(0, dtype=np.int64)) for c in out]
    if len({a.size for a in res}) > 1:
        raise TraceError(f"cannot read {path}: {q.table}: columns of different lengths (values that are not "
                         "integers)")
    return res
