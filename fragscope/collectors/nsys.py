"""Nsight Systems SQLite export (``nsys export --type sqlite report.nsys-rep``) -> columnar Timeline.

Opened read-only (``file:...?mode=ro``). Tables exist only when they have data, so the reader checks
``sqlite_master`` and ``PRAGMA table_info`` instead of assuming a schema version; the version
(``META_DATA_EXPORT.EXPORT_SCHEMA_VERSION``) is recorded in ``Timeline.meta``. Kernel and copy rows
join their runtime call on (PID, correlationId) -- ``correlationId`` is unique only within a process;
PID = ``(globalPid >> 24) & 0xFFFFFF``. API names come from ``StringIds`` and carry version suffixes
(``cudaLaunchKernel_v7000``); a CUDA-graph launch maps one correlation to many kernels.
Format notes: ../shared/notes/formats-and-analyses.md section 3; contract: docs/trace.md.

Speed (bench/bench_trace.py, 2 M kernels + 2 M launches; figures in docs/trace.md): Python's sqlite3
builds one tuple per row (about 0.3 µs per value here), too slow for multi-million-kernel exports.

- With ``connectorx`` installed its Rust SQLite reader fills the columns (about 45 ns per value), through
  its public ``connectorx.read_sql(..., return_type="pandas")`` (the DataFrame's columns are taken as
  numpy arrays; pandas is imported on the first read, about 0.2 s here). connectorx scans each table
  twice (a ``COUNT(*)`` to size its arrays, then the rows) and holds the GIL while it counts: the kernel
  table, the longest read, is started first. If connectorx fails on a table, the stdlib path reads it.
- Without it, SQLite renders each column of a rowid range as one ``group_concat`` string (one scan per
  table for all its columns) that numpy parses (about 55 ns per value).
- Both backends read the tables in parallel threads (SQLite and connectorx release the GIL), select
  the columns the analysis uses and no more (nameId only when several API ids are wanted), filter
  runtime rows with an ``OR`` chain when few API ids are wanted (see _OR_CHAIN_MAX), post-process in
  place (each new 16 MB array is page faults, 7 ms and more here) and join ops to their launch calls in
  numpy (_link).

``FRAGSCOPE_SQLITE_READER=stdlib`` forces the fallback.
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

from ..timeline_model import (COPY_UVM_DTOD, COPY_UVM_HTOD, KERNEL, MARK_BACKWARD, MARK_OPTIMIZER, MARK_SERVING,
                              MEMCPY, MEMSET, OTHER, Timeline, TraceError, base_api_name, classify_api)
from .trace_io import check_regular

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
PAGEABLE = 0  # ENUM_CUDA_MEM_KIND: 0 Pageable, 1 Pinned, 2 Device, 4 Managed ...

EXPORT_HINT = "export with: nsys export --type sqlite report.nsys-rep"
_CHUNK_ROWS = 2_000_000  # rows per group_concat string (stays far below SQLite's 1 GB string limit)
# Up to this many ids `a = x OR a = y ...` instead of `a IN (...)`: IN probes an ephemeral index, about
# 0.2 s per 2 M rows whatever the list; a chain costs one comparison per id on rows that do not match
# (0.20 s with 5 ids, 0.44 s with 16, in the worst order; 0.13 s when the first id matches).
_OR_CHAIN_MAX = 4
_PARTITION_MIN_ROWS = 500_000  # connectorx: split a table into rowid ranges read in parallel above this
_CX_LOCK = threading.Lock()
# A stdlib statement running longer than this is stopped (sqlite3 progress handler): a real export's
# largest read takes seconds (2 M rows: ~1 s here); a crafted file must not hang the reader.
QUERY_TIMEOUT_S = float(os.environ.get("FRAGSCOPE_SQLITE_TIMEOUT_S", "600"))
_PROGRESS_OPS = 100_000  # SQLite VM steps between two deadline checks (~1 ms)
# Tables whose content the reader trusts to be plain rows: refused when they are views or virtual tables
# (a recursive view named like a CUPTI table never ends, in SQLite and in connectorx).
_READ_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "StringIds",
                "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME")
CAPTURE_HINT = "capture GPU work with: nsys profile --trace=cuda,nvtx <your command>, then nsys export --type sqlite"
# StringIds values that mark the workload (LIKE is ASCII case-insensitive): what a training step runs
# (autograd nodes, aten::*_backward kernels' names, optimizer annotations over NVTX) or a serving engine.
_MARK_SQL = ((MARK_BACKWARD, "value LIKE '%backward%'"),
             (MARK_OPTIMIZER, "value LIKE 'Optimizer.step#%' OR value LIKE 'Optimizer.zero_grad#%'"),
             (MARK_SERVING, "value LIKE '%vllm%' OR value LIKE '%sglang%'"))


def _connect(path: str) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    deadline = time.monotonic() + QUERY_TIMEOUT_S

    def too_long() -> int:  # nonzero stops the statement: sqlite3.OperationalError "interrupted"
        return time.monotonic() > deadline

    conn.set_progress_handler(too_long, _PROGRESS_OPS)
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}


def _id_filter(col: str, ids: list[int]) -> str:
    if len(ids) <= _OR_CHAIN_MAX:
        return "(" + " OR ".join(f"{col} = {i}" for i in ids) + ")"
    return f"{col} IN ({','.join(map(str, ids))})"


def read_nsys(path: str, reader: str | None = None) -> Timeline:
    """Read an nsys SQLite export into a Timeline. Raises TraceError (one line) on bad input."""
    check_regular(path)
    try:
        conn = _connect(path)
        schema = conn.execute("SELECT name, type, sql FROM sqlite_master WHERE type IN ('table','view')").fetchall()
    except sqlite3.Error as e:
        msg = _sqlite_msg(e)
        raise TraceError(f"cannot read {path}: {msg if msg != _first_line(e) else f'not an SQLite database ({msg})'}"
                         ) from None
    except ValueError as e:  # (UnicodeDecodeError: text that is not UTF-8 in the schema)
        raise TraceError(f"cannot read {path}: corrupt SQLite schema ({_first_line(e)})") from None
    try:
        tables = set()
        for name, typ, sql in schema:
            plain = typ == "table" and isinstance(sql, str) and not sql.lstrip().upper().startswith("CREATE VIRTUAL")
            if name in _READ_TABLES and not plain:
                raise TraceError(f"cannot read {path}: {name} is a {'view' if typ == 'view' else 'virtual table'}, "
                                 f"not a table: not a file nsys wrote; {EXPORT_HINT}")
            if plain and isinstance(name, str):
                tables.add(name)
        return _read(conn, path, tables, reader or os.environ.get("FRAGSCOPE_SQLITE_READER", "auto"))
    except TraceError:
        raise
    except sqlite3.Error as e:
        msg = _sqlite_msg(e)
        raise TraceError(f"cannot read {path}: {msg if msg != _first_line(e) else f'SQLite error ({msg})'}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"cannot read {path}: corrupt text in the export (not UTF-8: {_first_line(e)})") from None
    except (ValueError, OverflowError, TypeError) as e:
        raise TraceError(f"cannot read {path}: unexpected value in the export ({_first_line(e)})") from None
    finally:
        conn.close()


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _sqlite_msg(e: sqlite3.Error) -> str:
    """One line for an SQLite error; the two that mean something else than a broken database, in words."""
    msg = _first_line(e)
    if msg == "interrupted":
        return f"a query ran past {QUERY_TIMEOUT_S:.0f} s (FRAGSCOPE_SQLITE_TIMEOUT_S) and was stopped"
    if "decode to UTF-8" in msg:
        return "corrupt text in the export (not UTF-8)"
    return msg


class _Query:
    """Integer columns of one table: (expression, value when NULL) pairs, an optional WHERE."""

    def __init__(self, table: str, cols: list[tuple[str, int]], where: str = "", post=None) -> None:
        self.table, self.cols, self.where, self.post = table, cols, where, post
        self.result: list[np.ndarray] | None = None  # the columns, then what ``post`` made of them

    def exprs(self) -> list[str]:
        return [e for e, _ in self.cols]


def _read(conn: sqlite3.Connection, path: str, tables: set[str], reader: str) -> Timeline:
    meta: dict = {"tables": sorted(t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_"))}
    if "META_DATA_EXPORT" in tables and {"name", "value"} <= _columns(conn, "META_DATA_EXPORT"):
        md = {k: v for k, v in conn.execute("SELECT name, value FROM META_DATA_EXPORT LIMIT 10000")
              if isinstance(k, str) and isinstance(v, str)}
        meta["schema_version"] = md.get("EXPORT_SCHEMA_VERSION")
        meta["product_version"] = md.get("EXPORT_PRODUCT_VERSION")
    if KERNEL_TABLE not in tables:
        _refuse_without_kernels(conn, path, tables, meta)
    epoch = None
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(conn, "TARGET_INFO_SESSION_START_TIME"):
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and row[0] is not None:
            if isinstance(row[0], bool) or not isinstance(row[0], int):
                raise TraceError(f"cannot read {path}: TARGET_INFO_SESSION_START_TIME.utcEpochNs is not an integer "
                                 f"({str(row[0])[:30]!r}); {EXPORT_HINT}")
            epoch = int(row[0])
    fetch = _Fetcher(path, reader)

    kcols = _columns(conn, KERNEL_TABLE)
    missing = {"start", "end", "deviceId", "streamId"} - kcols
    if missing:
        raise TraceError(f"cannot read {path}: {KERNEL_TABLE} lacks column(s) {', '.join(sorted(missing))}; "
                         f"{EXPORT_HINT}")
    # Communication kernels (HTA's COMM type: ^nccl, ncclKernel, ^hccl), by name id.
    comm_ids: list[int] = []
    name_col = "shortName" if "shortName" in kcols else ("demangledName" if "demangledName" in kcols else None)
    if name_col and "StringIds" in tables:
        comm_ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM StringIds WHERE value LIKE 'nccl%' OR value LIKE 'hccl%' "
            "OR value LIKE '%ncclKernel%' OR value LIKE '%ncclDevKernel%'")]
    op_queries = [(KERNEL, _ops_query(KERNEL_TABLE, kcols, KERNEL,
                                      _id_filter(name_col, comm_ids) if comm_ids else None))]
    if MEMCPY_TABLE in tables:
        op_queries.append((MEMCPY, _ops_query(MEMCPY_TABLE, _columns(conn, MEMCPY_TABLE), MEMCPY)))
    if MEMSET_TABLE in tables:
        op_queries.append((MEMSET, _ops_query(MEMSET_TABLE, _columns(conn, MEMSET_TABLE), MEMSET)))

    # Host API calls: only the kinds the analysis uses (launches, syncs, copies, malloc/free).
    ids: list[int] = []
    names: list[str] = []
    kinds: list[int] = []
    call_query = None
    if RUNTIME_TABLE in tables and "StringIds" in tables:
        rcols = _columns(conn, RUNTIME_TABLE)
        if {"start", "end", "nameId", "correlationId", "globalTid"} <= rcols:
            # API names all start with 'cu' (runtime cuda*, driver cu*): a cheap filter on StringIds.
            for sid, val in conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'cu%'"):
                k = classify_api(val)
                if k != OTHER:
                    ids.append(int(sid))
                    names.append(base_api_name(val))
                    kinds.append(k)
            if ids:
                uniq: dict[str, int] = {}
                name_idx = np.asarray([uniq.setdefault(n, len(uniq)) for n in names], dtype=np.int32)
                # nameId is read only when it tells calls apart (one wanted id: its rows all carry it)
                call_query = _Query(RUNTIME_TABLE, [("start", 0), ("end", 0), ("globalTid", 0),
                                                    ("correlationId", -1)] + ([("nameId", -1)] if len(ids) > 1 else []),
                                    where=_id_filter("nameId", ids),
                                    post=lambda got: _call_columns(got, ids, name_idx, kinds))
                names = list(uniq)
            else:
                names = []

    # All tables at once, one thread each (the kernel and runtime tables dominate and are about equal).
    queries = [q for _, q in op_queries] + ([call_query] if call_query else [])
    fetch.run(queries)
    meta["reader"] = fetch.backend

    parts = [q.result for _, q in op_queries]
    um = _split_migrations(parts, [k for k, _ in op_queries])
    parts = [p for p in parts if p[1].size] or parts[:1]  # (no copy when only the kernel table has rows)
    cols = [np.concatenate([p[i] for p in parts]) if len(parts) > 1 else parts[0][i] for i in range(11)]
    kind, start, end, dev, stream, pid, key, nbytes, ckind, pageable, comm = cols
    if start.size == 0 and um["um_start"].size == 0:
        raise TraceError(f"cannot read {path}: no GPU activity (the kernel, memcpy and memset tables are empty"
                         f"{'; Nsight Systems ' + meta['product_version'] if meta.get('product_version') else ''})"
                         f"; {CAPTURE_HINT}")
    markers, examples = _markers(conn, tables)

    c_start = c_end = c_key = np.zeros(0, dtype=np.int64)
    c_name = np.zeros(0, dtype=np.int32)
    c_kind = np.zeros(0, dtype=np.int8)
    if call_query is not None:
        c_start, c_end, c_key, c_name, c_kind = call_query.result
    op_launch = _link(key, c_key)
    if SYNC_TABLE in tables:
        meta["gpu_sync_events"] = int(conn.execute(f'SELECT count(*) FROM "{SYNC_TABLE}"').fetchone()[0])
    return Timeline(
        source=path, format="nsys-sqlite", op_device=dev, op_stream=stream, op_pid=pid,
        op_kind=kind, op_start=start, op_end=end, op_bytes=nbytes,
        op_copy_kind=ckind, op_pageable=pageable, op_launch=op_launch, op_comm=comm,
        call_start=c_start, call_end=c_end, call_kind=c_kind, call_name=c_name,
        call_names=names, epoch_offset_ns=epoch, meta=meta, markers=markers, marker_examples=examples, **um)


def _refuse_without_kernels(conn: sqlite3.Connection, path: str, tables: set[str], meta: dict) -> None:
    """No kernel table. nsys creates tables only for what it recorded: an export of a CPU-only or API-only
    capture (or of a range with no GPU work) has none. Say which, with the version, and what to capture."""
    nsys_tables = [t for t in tables if t.startswith(("CUPTI_", "TARGET_INFO_", "NVTX_", "OSRT_", "ENUM_NSYS",
                                                       "META_DATA_"))]
    if not nsys_tables and "StringIds" not in tables:
        raise TraceError(f"cannot read {path}: not an Nsight Systems export (no {KERNEL_TABLE} table); "
                         f"{EXPORT_HINT}")
    ver = meta.get("product_version")
    rows = []
    for t in (RUNTIME_TABLE, MEMCPY_TABLE, MEMSET_TABLE):
        if t in tables:
            n = conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            rows.append(f"{n} {t.rsplit('_', 1)[-1].lower()} row{'s' if n != 1 else ''}")
    seen = f"; it holds {', '.join(rows)}" if rows else ""
    raise TraceError(f"cannot read {path}: no CUDA kernel activity in this export (Nsight Systems "
                     f"{ver or 'version unknown'}, no {KERNEL_TABLE} table{seen}: a CPU-only or API-only "
                     f"capture); {CAPTURE_HINT}")


def _split_migrations(parts: list[list[np.ndarray]], kinds: list[int]) -> dict:
    """Unified-memory migrations (copyKind 11-13) out of the memcpy table's columns (in ``parts``, in
    place): they are the driver moving managed pages, not GPU work the program launched. Returns the
    Timeline's um_* fields."""
    out = {"um_start": np.zeros(0, dtype=np.int64), "um_end": np.zeros(0, dtype=np.int64)}
    for i, k in enumerate(kinds):
        if k != MEMCPY:
            continue
        p = parts[i]
        cause = p.pop()  # the memcpy query's extra column (migrationCause)
        ck = p[8]
        mig = (ck >= COPY_UVM_HTOD) & (ck <= COPY_UVM_DTOD)
        if not mig.any():
            continue
        keep = ~mig
        out.update(um_start=p[1][mig], um_end=p[2][mig], um_device=p[3][mig], um_bytes=np.asarray(p[7])[mig],
                   um_copy_kind=ck[mig], um_cause=cause[mig].astype(np.int8))
        parts[i] = [np.asarray(a)[keep] for a in p]
    return out


def _markers(conn: sqlite3.Connection, tables: set[str]) -> tuple[dict, dict]:
    """Workload markers from the export's strings (kernel names, NVTX ranges, API and thread names):
    {marker: count of distinct strings} and up to three examples each."""
    if "StringIds" not in tables:
        return {}, {}
    marks, examples = {}, {}
    for m, cond in _MARK_SQL:
        vals = [v for (v,) in conn.execute(f"SELECT value FROM StringIds WHERE {cond} LIMIT 1000")
                if isinstance(v, str)]
        if vals:
            marks[m] = len(vals)
            examples[m] = [v[:120] for v in vals[:3]]
    return marks, examples


def _ops_query(table: str, cols: set[str], kind: int, comm_expr: str | None = None) -> _Query:
    # Raw columns where possible: device and stream packed in one value (two cheap operators, one
    # value less to transfer); the PID is taken from globalPid in numpy.
    # (a device or stream that is not an integer -- text or a REAL in a crafted file -- would become 0 in
    # the arithmetic: it becomes text instead, which both readers refuse)
    q = [("start", 0), ("end", 0), ("CASE WHEN typeof(deviceId) = 'integer' AND typeof(streamId) = 'integer' "
                                    "THEN (deviceId << 32) | (streamId & 4294967295) ELSE 'not an integer' END", 0),
         ("globalPid" if "globalPid" in cols else "0", 0),
         ("correlationId" if "correlationId" in cols else "-1", -1)]
    if kind != KERNEL:
        q.append(("bytes" if "bytes" in cols else "-1", -1))
    if kind == MEMCPY:
        q.append(("copyKind" if "copyKind" in cols else "0", 0))
        q.append((f"(ifnull(srcKind, -1) = {PAGEABLE} OR ifnull(dstKind, -1) = {PAGEABLE})"
                  if {"srcKind", "dstKind"} <= cols else "0", 0))
        q.append(("migrationCause" if "migrationCause" in cols else "-1", -1))
    if comm_expr:
        q.append((comm_expr, 0))
    return _Query(table, q, post=lambda got: _ops_columns(kind, got))


def _ops_columns(kind: int, got: list[np.ndarray]) -> list[np.ndarray]:
    # In place wherever possible: the arrays are ours, and each new 16 MB array costs page faults
    # (7 to 45 ms each on the development VM, more than the arithmetic).
    start, end, dev_stream, gpid, corr = got[:5]
    n = start.size
    np.maximum(end, start, out=end)
    dev = dev_stream >> 32
    stream = np.bitwise_and(dev_stream, 0xFFFFFFFF, out=dev_stream)
    pid = _pid(gpid)
    key = _join_key(pid, corr, pid_reusable=False)
    # kernels carry no byte count: one read-only -1 broadcast over the rows instead of a 16 MB array
    nbytes = got[5] if kind != KERNEL else np.broadcast_to(np.int64(-1), (n,))
    ckind = got[6].astype(np.int8) if kind == MEMCPY else np.zeros(n, dtype=np.int8)
    pageable = got[7].astype(bool) if kind == MEMCPY else np.zeros(n, dtype=bool)
    comm = got[5].astype(bool) if kind == KERNEL and len(got) > 5 else np.zeros(n, dtype=bool)
    op_kind = np.zeros(n, dtype=np.int8) if kind == 0 else np.full(n, kind, dtype=np.int8)
    out = [op_kind, start, end, dev, stream, pid, key, nbytes, ckind, pageable, comm]
    if kind == MEMCPY:
        out.append(got[8])  # migrationCause: taken out again by _split_migrations
    return out


def _call_columns(got: list[np.ndarray], ids: list[int], name_idx: np.ndarray,
                  kinds: list[int]) -> list[np.ndarray]:
    """Runtime rows -> start, end (>= start), join key, name index, call kind. ``got`` holds nameId as
    a fifth column when more than one id was wanted."""
    c_start, c_end, c_gtid, c_corr = got[:4]
    np.maximum(c_end, c_start, out=c_end)
    c_key = _join_key(_pid(c_gtid), c_corr, pid_reusable=True)
    n = c_start.size
    if len(ids) == 1:
        c_name = np.zeros(n, dtype=np.int32)
        c_kind = np.full(n, kinds[0], dtype=np.int8)
        return [c_start, c_end, c_key, c_name, c_kind]
    c_nid = got[4]
    lut_ids = np.asarray(ids, dtype=np.int64)
    if 0 <= lut_ids.min() and lut_ids.max() < 1 << 22:  # StringIds ids are small: direct tables
        name_lut = np.zeros(int(lut_ids.max()) + 1, dtype=np.int32)
        kind_lut = np.zeros(name_lut.size, dtype=np.int8)
        name_lut[lut_ids] = name_idx
        kind_lut[lut_ids] = kinds
        return [c_start, c_end, c_key, name_lut[c_nid], kind_lut[c_nid]]
    order = np.argsort(lut_ids)
    pos = order[np.searchsorted(lut_ids[order], c_nid)]
    return [c_start, c_end, c_key, name_idx[pos], np.asarray(kinds, dtype=np.int8)[pos]]


def _pid(global_id: np.ndarray) -> np.ndarray:
    """PID = (globalPid >> 24) & 0xFFFFFF, in ``global_id``'s buffer (overwritten)."""
    np.right_shift(global_id, 24, out=global_id)
    return np.bitwise_and(global_id, 0xFFFFFF, out=global_id)


_SCRATCH_ROWS = 1 << 16  # rows per step where a full-length temporary would otherwise be needed
_DENSE_SPAN = 4  # _link: direct table when a block's call keys span at most this times their count


def _join_key(pid: np.ndarray, corr: np.ndarray, pid_reusable: bool) -> np.ndarray:
    """(PID << 32) | correlationId, one int64 join key; -1 where there is no correlation (corr < 0).
    Written over ``pid`` when ``pid_reusable``, else over ``corr`` (in steps, through a small scratch
    buffer: no new full-length array either way)."""
    none = corr < 0
    np.bitwise_and(corr, 0xFFFFFFFF, out=corr)
    if pid_reusable:
        key = np.left_shift(pid, 32, out=pid)
        np.bitwise_or(key, corr, out=key)
    else:
        key = corr
        scratch = np.empty(min(_SCRATCH_ROWS, pid.size), dtype=np.int64)
        for a in range(0, pid.size, _SCRATCH_ROWS):
            b = min(a + _SCRATCH_ROWS, pid.size)
            sc = scratch[: b - a]
            np.left_shift(pid[a:b], 32, out=sc)
            np.bitwise_or(key[a:b], sc, out=key[a:b])
    if none.any():
        key[none] = -1
    return key


def _link(op_key: np.ndarray, call_key: np.ndarray) -> np.ndarray:
    """Index of the call with the same key for each op (-1: none; keys < 0 never match; among calls with
    equal keys the first). Same result as kineto._link_by_key; runtime rows usually come in correlation
    order, so the sort is skipped when the keys are already sorted. One new array (the result), filled
    in blocks of _SCRATCH_ROWS ops by two threads (numpy releases the GIL on each block's operations).

    A block looks only at the calls between its smallest and largest key (ops come roughly in
    correlation order, so that window is about a block long). Correlation ids are dense counters: when
    the window's keys span at most _DENSE_SPAN times its length, a direct table from key to first call
    replaces the binary search (2 M ops against 2 M calls: 39 ms of CPU against 60 ms here)."""
    if not call_key.size or not op_key.size:
        return np.full(op_key.size, -1, dtype=np.int64)
    if call_key.size < 2 or bool((call_key[1:] >= call_key[:-1]).all()):
        order, sk = None, call_key
    else:
        order = np.argsort(call_key, kind="stable")
        sk = call_key[order]
    # Written here first: new memory is paged in by one thread. Two threads paging in their halves at once
    # took three times the CPU on the development VM (2 M ops: 70 ms against 28 ms with this fill).
    pos = np.full(op_key.size, -1, dtype=np.int64)
    last = sk.size - 1
    first_valid = int(np.searchsorted(sk, 0))  # keys < 0 (no correlation) come first and never match

    def part(lo: int, hi: int) -> None:
        # every temporary is this thread's and reused block after block: allocating them anew each
        # block makes glibc map and unmap them (page faults), which doubled this function's time
        scratch = np.empty(min(_SCRATCH_ROWS, hi - lo), dtype=np.int64)
        miss = np.empty(scratch.size, dtype=bool)
        table = keys = iota = np.empty(0, dtype=np.int64)
        first = np.empty(0, dtype=bool)
        for a in range(lo, hi, _SCRATCH_ROWS):
            b = min(a + _SCRATCH_ROWS, hi)
            p, ok, m, sc = pos[a:b], op_key[a:b], miss[: b - a], scratch[: b - a]
            w0 = max(int(np.searchsorted(sk, ok.min())), first_valid)
            w1 = int(np.searchsorted(sk, ok.max(), side="right"))
            win = sk[w0:w1]
            nw = win.size
            span = int(win[-1] - win[0]) + 1 if nw else 0
            dense = 0 < span <= _DENSE_SPAN * max(nw, b - a)
            if dense:
                if keys.size < nw:
                    keys, iota, first = np.empty(nw, dtype=np.int64), np.arange(nw, dtype=np.int64), np.empty(nw, bool)
                np.not_equal(win[1:], win[:-1], out=first[1:nw])
                dense = bool(first[1:nw].all())  # no repeated key (else the binary search below)
            if dense:
                if table.size < span:
                    table = np.empty(span, dtype=np.int64)
                t = table[:span]
                t.fill(-1)
                t[np.subtract(win, win[0], out=keys[:nw])] = iota[:nw]  # key -> position in the window
                idx = np.subtract(ok, win[0], out=sc)
                np.less(idx, 0, out=m)
                m |= idx >= span
                np.clip(idx, 0, span - 1, out=idx)
                np.take(t, idx, out=p)
                p[m] = -1
                np.less(p, 0, out=m)
                p += w0
            else:
                np.add(np.searchsorted(win, ok), w0, out=p)
                np.minimum(p, last, out=p)
                np.not_equal(np.take(sk, p, out=sc), ok, out=m)
                m |= ok < 0
            if order is not None:
                np.take(order, np.maximum(p, 0), out=sc)
                p[:] = sc
            p[m] = -1

    _in_two(op_key.size, part)
    return pos


def _in_two(n: int, fn) -> None:
    """fn(0, half) in a second thread and fn(half, n) here when n is large enough to gain from it."""
    if n < 2 * _SCRATCH_ROWS:
        fn(0, n)
        return
    half = n // 2
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(0, half)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        fn(half, n)
    finally:
        t.join()
    if errors:
        raise errors[0]


class _Fetcher:
    """Reads integer columns of tables as int64 numpy arrays (connectorx when available, else stdlib),
    one thread per table."""

    def __init__(self, path: str, reader: str) -> None:
        self.path = path
        self.backend = "stdlib"
        self._cx = None
        if reader in ("auto", "connectorx"):
            if _cx_available():
                self.backend = "connectorx"
            elif reader == "connectorx":
                raise TraceError("connectorx is not installed (pip install connectorx)")
        self._lock = threading.Lock()

    def run(self, queries: list[_Query]) -> None:
        errors: list[BaseException] = []

        def work(q: _Query) -> None:
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

    def _one(self, q: _Query) -> list[np.ndarray]:
        conn = _connect(self.path)
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

    def _connectorx(self, q: _Query, lo: int, hi: int) -> list[np.ndarray]:
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

    def _cx_read(self, q: _Query, sql: str) -> list[np.ndarray]:
        conn = "sqlite://" + urllib.parse.quote(os.path.abspath(self.path))
        df = _cx().read_sql(conn, sql, return_type="pandas")
        return [df[f"c{i}"].to_numpy(dtype=np.int64, na_value=nv) for i, (_, nv) in enumerate(q.cols)]


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


def _stdlib(conn: sqlite3.Connection, q: _Query, lo: int, hi: int, path: str = "") -> list[np.ndarray]:
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
        n = None
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
                                 f"integers; {EXPORT_HINT}")
            out[i].append(a)
            n = a.size if n is None else n
        after = int(row[0])
        if after >= hi:
            break
    res = [np.concatenate(c) if len(c) > 1 else (c[0] if c else np.zeros(0, dtype=np.int64)) for c in out]
    if len({a.size for a in res}) > 1:
        raise TraceError(f"cannot read {path}: {q.table}: columns of different lengths (values that are not "
                         f"integers); {EXPORT_HINT}")
    return res
