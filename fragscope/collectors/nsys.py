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

- By default the tables are decoded from the file's b-tree pages with numpy (:mod:`.nsys_pages`: no SQL
  per row, no text), under a read transaction; a table in a layout it does not decode (WAL, overflow
  rows, values that are not integers, broken pages, ...) is read by one of the SQL readers below, which
  also word what is wrong with a hostile file. ``FRAGSCOPE_SQLITE_READER=pages`` asks for it by name.
- With ``connectorx`` installed its Rust SQLite reader fills the columns (about 45 ns per value), through
  its public ``connectorx.read_sql(..., return_type="pandas")`` (the DataFrame's columns are taken as
  numpy arrays; pandas is imported on the first read, about 0.2 s here). connectorx scans each table
  twice (a ``COUNT(*)`` to size its arrays, then the rows) and holds the GIL while it counts: the kernel
  table, the longest read, is started first. If connectorx fails on a table, the stdlib path reads it.
- Without it, SQLite renders each column of a chunk of rows as one ``group_concat`` string (one scan per
  table for all its columns) that numpy parses (about 55 ns per value).
  (Both column readers: :mod:`.sqlite_columns`; the numpy join: :mod:`.nsys_join`.)
- Both backends read the tables in parallel threads (SQLite and connectorx release the GIL), select
  the columns the analysis uses and no more (nameId only when several API ids are wanted), filter
  runtime rows with an ``OR`` chain when few API ids are wanted (see _OR_CHAIN_MAX), post-process in
  place (each new 16 MB array is page faults, 7 ms and more here) and join ops to their launch calls in
  numpy (link).

``FRAGSCOPE_SQLITE_READER=stdlib`` (or ``connectorx``) forces an SQL reader for every table. Hostile files
(views named like CUPTI tables, values that are not integers, sparse rowids, undecodable text):
docs/trace.md, "Limits and hostile input".
"""
from __future__ import annotations

import os
import sqlite3
import threading

import numpy as np

from ..timeline_model import (COPY_UVM_DTOD, COPY_UVM_HTOD, KERNEL, MARK_BACKWARD, MARK_OPTIMIZER, MARK_SERVING,
                              MEMCPY, MEMSET, OTHER, Timeline, TraceError, base_api_name, classify_api)
from . import nsys_pages, sqlite_columns
from .nsys_join import join_key, link, pid_from_global_id
from .sqlite_columns import connect, Fetcher, Query
from .trace_io import check_regular

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
PAGEABLE = 0  # ENUM_CUDA_MEM_KIND: 0 Pageable, 1 Pinned, 2 Device, 4 Managed ...

EXPORT_HINT = "export with: nsys export --type sqlite report.nsys-rep"
# Up to this many ids `a = x OR a = y ...` instead of `a IN (...)`: IN probes an ephemeral index, about
# 0.2 s per 2 M rows whatever the list; a chain costs one comparison per id on rows that do not match
# (0.20 s with 5 ids, 0.44 s with 16, in the worst order; 0.13 s when the first id matches).
_OR_CHAIN_MAX = 4
# The page reader keeps only the bytes of globalPid / globalTid that hold the PID (bits 24-47, all that
# pid_from_global_id reads): 3 bytes gathered per row instead of 8.
_PID_FIELD = (3, 3)
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
        conn = connect(path)
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
        return (f"a query ran past {sqlite_columns.QUERY_TIMEOUT_S:.0f} s (FRAGSCOPE_SQLITE_TIMEOUT_S) and was "
                "stopped")
    if "decode to UTF-8" in msg:
        return "corrupt text in the export (not UTF-8)"
    return msg


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
    fetch = Fetcher(path, "auto" if reader == "pages" else reader)

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
                                      _id_filter(name_col, comm_ids) if comm_ids else None,
                                      nsys_pages.Column(name_col, 0, comm_ids) if comm_ids else None))]
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
                call_query = Query(RUNTIME_TABLE, [("start", 0), ("end", 0), ("globalTid", 0),
                                                    ("correlationId", -1)] + ([("nameId", -1)] if len(ids) > 1 else []),
                                    where=_id_filter("nameId", ids),
                                    post=lambda got: _call_columns(got, ids, name_idx, kinds))
                call_query.pages = ([nsys_pages.Column(e, nv, field=_PID_FIELD if e == "globalTid" else None)
                                     for e, nv in call_query.cols], ("nameId", ids))
                names = list(uniq)
            else:
                names = []

    # All tables at once, one thread each (the kernel and runtime tables dominate and are about equal).
    queries = [q for _, q in op_queries] + ([call_query] if call_query else [])
    by_pages = _read_pages(path, queries) if reader in ("auto", "pages") else []
    rest = [q for q in queries if q not in by_pages]
    fetch.run(rest)
    meta["reader"] = "+".join((["pages"] if by_pages else []) + ([fetch.backend] if rest or not by_pages else []))

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
    op_launch = link(key, c_key)
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
    out = {"um_start": np.zeros(0, dtype=np.int64), "um_end": np.zeros(0, dtype=np.int64),
           "um_device": np.zeros(0, dtype=np.int64), "um_bytes": np.zeros(0, dtype=np.int64),
           "um_copy_kind": np.zeros(0, dtype=np.int8), "um_cause": np.zeros(0, dtype=np.int8)}
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


def _read_pages(path: str, queries: list[Query]) -> list[Query]:
    """The queries the b-tree page reader (:mod:`.nsys_pages`) answers, their results and post-processing
    filled in; one thread per table (numpy releases the GIL). A table it does not decode is left to SQL."""
    done: list[Query] = []
    errors: list[BaseException] = []

    def work(q: Query) -> None:
        try:
            try:
                conn = connect(path)
                try:
                    cols, keep = q.pages
                    got = nsys_pages.read_table(conn, path, q.table, cols, keep)
                finally:
                    conn.close()
            except (nsys_pages.Unsupported, sqlite3.Error, OSError, MemoryError, ValueError, IndexError,
                    OverflowError, TypeError):
                return  # (SQL reads this table: what is wrong with a broken file, it says in its own words)
            q.result = q.post(got) if q.post is not None else got
            done.append(q)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the calling thread
            errors.append(e)

    todo = [q for q in queries if getattr(q, "pages", None) is not None]
    threads = [threading.Thread(target=work, args=(q,), daemon=True) for q in todo[:-1]]
    for t in threads:
        t.start()
    if todo:
        work(todo[-1])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done


def _ops_query(table: str, cols: set[str], kind: int, comm_expr: str | None = None,
               comm_col: nsys_pages.Column | None = None) -> Query:
    # Raw columns only (the PID is taken from globalPid in numpy): both readers then refuse a value that is
    # not an integer (text or a REAL in a crafted file), where an expression such as the former packed
    # (deviceId << 32) | streamId turned it into 0. Two raw columns cost connectorx the same CPU as the
    # packed one (0.45 s against 0.47 s for 1 M kernels; a typeof() guard on the expression cost 0.60 s).
    # streamId is the last column, so the others keep their places.
    q = [("start", 0), ("end", 0), ("deviceId", 0),
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
    q.append(("streamId", 0))
    # the same columns for the page reader: a constant ("0", "-1") has no name; the two tests, by id
    pages = [nsys_pages.Column(e if e in cols else None, nv if e in cols else int(e),
                               field=_PID_FIELD if e == "globalPid" else None)
             if e.lstrip("-").isdigit() or e in cols else None for e, nv in q]
    for i, (e, _) in enumerate(q):
        if e.startswith("(ifnull(srcKind"):
            pages[i] = nsys_pages.Column("srcKind", -1, [PAGEABLE], also=("dstKind",))
        elif comm_expr and e == comm_expr:
            pages[i] = comm_col
    query = Query(table, q, post=lambda got: _ops_columns(kind, got))
    if all(c is not None for c in pages):
        query.pages = (pages, None)
    return query


def _ops_columns(kind: int, got: list[np.ndarray]) -> list[np.ndarray]:
    # In place wherever possible: the arrays are ours, and each new 16 MB array costs page faults
    # (7 to 45 ms each on the development VM, more than the arithmetic).
    start, end, dev, gpid, corr = got[:5]
    n = start.size
    np.maximum(end, start, out=end)
    stream = np.bitwise_and(got[-1], 0xFFFFFFFF, out=got[-1])  # (as nsys's 32-bit stream ids)
    pid = pid_from_global_id(gpid)
    key = join_key(pid, corr, pid_reusable=False)
    # kernels carry no byte count: one read-only -1 broadcast over the rows instead of a 16 MB array
    nbytes = got[5] if kind != KERNEL else np.broadcast_to(np.int64(-1), (n,))
    ckind = got[6].astype(np.int8) if kind == MEMCPY else np.zeros(n, dtype=np.int8)
    pageable = got[7].astype(bool) if kind == MEMCPY else np.zeros(n, dtype=bool)
    comm = got[5].astype(bool) if kind == KERNEL and len(got) > 6 else np.zeros(n, dtype=bool)
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
    c_key = join_key(pid_from_global_id(c_gtid), c_corr, pid_reusable=True)
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


