"""Nsight Systems SQLite export (``nsys export --type sqlite report.nsys-rep``) -> columnar Timeline.

Opened read-only (``file:...?mode=ro``). Tables exist only when they have data, so the reader checks
``sqlite_master`` and ``PRAGMA table_info`` instead of assuming a schema version; the version
(``META_DATA_EXPORT.EXPORT_SCHEMA_VERSION``) is recorded in ``Timeline.meta``. Kernel and copy rows
join their runtime call on (PID, correlationId) -- ``correlationId`` is unique only within a process;
PID = ``(globalPid >> 24) & 0xFFFFFF``. API names come from ``StringIds`` and carry version suffixes
(``cudaLaunchKernel_v7000``); a CUDA-graph launch maps one correlation to many kernels.
Format notes: ../shared/notes/formats-and-analyses.md section 3; contract: docs/trace.md.

Speed: Python's sqlite3 builds one tuple per row (about 0.7 µs per value here), too slow for
multi-million-kernel exports. With ``connectorx`` installed the columns are read by its Rust SQLite
reader (about 2.4x faster than the stdlib fetch in bench/bench_trace.py); without it a stdlib
fallback lets SQLite render each column as one ``group_concat`` string that numpy parses (about 2x
faster than ``fetchall``). ``FRAGSCOPE_SQLITE_READER=stdlib`` forces the fallback.
"""
from __future__ import annotations

import os
import sqlite3
import urllib.parse
import warnings

import numpy as np

from .kineto import (KERNEL, MEMCPY, MEMSET, OTHER, Timeline, TraceError, _link_by_key, base_api_name,
                     classify_api)

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
PAGEABLE = 0  # ENUM_CUDA_MEM_KIND: 0 Pageable, 1 Pinned, 2 Device, 4 Managed ...

EXPORT_HINT = "export with: nsys export --type sqlite report.nsys-rep"
_CHUNK_ROWS = 2_000_000  # rows per group_concat string (stays far below SQLite's 1 GB string limit)


def _pid_sql(col: str) -> str:
    return f"((ifnull({col}, 0) >> 24) & 16777215)"


def _key_sql(gcol: str) -> str:
    # (PID << 32) | correlationId: one int64 join key; -1 when the row has no correlation
    return f"CASE WHEN correlationId IS NULL THEN -1 ELSE ({_pid_sql(gcol)} << 32) | (correlationId & 4294967295) END"


def _connect(path: str) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    return sqlite3.connect(uri, uri=True)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}


def read_nsys(path: str, reader: str | None = None) -> Timeline:
    """Read an nsys SQLite export into a Timeline. Raises TraceError (one line) on bad input."""
    if not os.path.isfile(path):
        raise TraceError(f"cannot read {path}: no such file")
    try:
        conn = _connect(path)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
    except sqlite3.Error as e:
        raise TraceError(f"cannot read {path}: not an SQLite database ({e})") from None
    try:
        return _read(conn, path, tables, reader or os.environ.get("FRAGSCOPE_SQLITE_READER", "auto"))
    except sqlite3.Error as e:
        raise TraceError(f"cannot read {path}: SQLite error ({str(e).splitlines()[0]})") from None
    finally:
        conn.close()


def _read(conn: sqlite3.Connection, path: str, tables: set[str], reader: str) -> Timeline:
    if KERNEL_TABLE not in tables:
        raise TraceError(f"cannot read {path}: not an Nsight Systems export (no {KERNEL_TABLE} table); "
                         f"{EXPORT_HINT}")
    meta: dict = {"tables": sorted(t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_"))}
    if "META_DATA_EXPORT" in tables:
        md = dict(conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())
        meta["schema_version"] = md.get("EXPORT_SCHEMA_VERSION")
        meta["product_version"] = md.get("EXPORT_PRODUCT_VERSION")
    epoch = None
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(conn, "TARGET_INFO_SESSION_START_TIME"):
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and row[0] is not None:
            epoch = int(row[0])
    fetch = _Fetcher(conn, path, reader)
    meta["reader"] = fetch.backend

    kcols = _columns(conn, KERNEL_TABLE)
    missing = {"start", "end", "deviceId", "streamId"} - kcols
    if missing:
        raise TraceError(f"cannot read {path}: {KERNEL_TABLE} lacks column(s) {', '.join(sorted(missing))}; "
                         f"{EXPORT_HINT}")
    parts = []  # (kind, start, end, device, stream, pid, key, bytes, copy_kind, pageable)
    # Communication kernels (HTA's COMM type: ^nccl, ncclKernel, ^hccl), by name id.
    comm_ids: list[int] = []
    name_col = "shortName" if "shortName" in kcols else ("demangledName" if "demangledName" in kcols else None)
    if name_col and "StringIds" in tables:
        comm_ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM StringIds WHERE value LIKE 'nccl%' OR value LIKE 'hccl%' "
            "OR value LIKE '%ncclKernel%' OR value LIKE '%ncclDevKernel%'")]
    kparts = _read_ops(fetch, KERNEL_TABLE, kcols, KERNEL,
                       comm_expr=f"{name_col} IN ({','.join(map(str, comm_ids))})" if comm_ids else None)
    parts.append(kparts)
    if MEMCPY_TABLE in tables:
        parts.append(_read_ops(fetch, MEMCPY_TABLE, _columns(conn, MEMCPY_TABLE), MEMCPY))
    if MEMSET_TABLE in tables:
        parts.append(_read_ops(fetch, MEMSET_TABLE, _columns(conn, MEMSET_TABLE), MEMSET))
    cols = [np.concatenate([p[i] for p in parts]) for i in range(11)]
    kind, start, end, dev, stream, pid, key, nbytes, ckind, pageable, comm = cols
    if start.size == 0:
        raise TraceError(f"cannot read {path}: no GPU activity (the kernel, memcpy and memset tables are empty)")

    # Host API calls: only the kinds the analysis uses (launches, syncs, copies, malloc/free).
    names: list[str] = []
    c_start = c_end = c_key = np.zeros(0, dtype=np.int64)
    c_name = np.zeros(0, dtype=np.int32)
    c_kind = np.zeros(0, dtype=np.int8)
    if RUNTIME_TABLE in tables and "StringIds" in tables:
        rcols = _columns(conn, RUNTIME_TABLE)
        if {"start", "end", "nameId", "correlationId", "globalTid"} <= rcols:
            ids, names, kinds = [], [], []
            # API names all start with 'cu' (runtime cuda*, driver cu*): a cheap filter on StringIds.
            for sid, val in conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'cu%'"):
                k = classify_api(val)
                if k != OTHER:
                    ids.append(int(sid))
                    names.append(base_api_name(val))
                    kinds.append(k)
            if ids:
                id_list = ",".join(str(i) for i in ids)
                c_start, c_end, c_key, c_nid = fetch.columns(
                    RUNTIME_TABLE, ["start", "end", _key_sql("globalTid"), "nameId"],
                    where=f"nameId IN ({id_list})")
                lut_ids = np.asarray(ids, dtype=np.int64)
                order = np.argsort(lut_ids)
                pos = order[np.searchsorted(lut_ids[order], c_nid)]
                uniq: dict[str, int] = {}
                name_idx = np.asarray([uniq.setdefault(n, len(uniq)) for n in names], dtype=np.int32)
                c_name = name_idx[pos]
                c_kind = np.asarray(kinds, dtype=np.int8)[pos]
                names = list(uniq)
    op_launch = _link_by_key(key, c_key)
    if SYNC_TABLE in tables:
        meta["gpu_sync_events"] = int(conn.execute(f'SELECT count(*) FROM "{SYNC_TABLE}"').fetchone()[0])
    return Timeline(
        source=path, format="nsys-sqlite", op_device=dev, op_stream=stream, op_pid=pid,
        op_kind=kind.astype(np.int8), op_start=start, op_end=np.maximum(end, start), op_bytes=nbytes,
        op_copy_kind=ckind.astype(np.int8), op_pageable=pageable.astype(bool), op_launch=op_launch,
        op_comm=comm.astype(bool),
        call_start=c_start, call_end=np.maximum(c_end, c_start), call_kind=c_kind, call_name=c_name,
        call_names=names, epoch_offset_ns=epoch, meta=meta)


def _read_ops(fetch: "_Fetcher", table: str, cols: set[str], kind: int,
              comm_expr: str | None = None) -> list[np.ndarray]:
    # device, stream and PID packed into one integer (fewer columns to transfer: the read dominates):
    # device (CUDA ordinal < 128) << 56 | stream (uint32) << 24 | PID (24 bits)
    pid = _pid_sql("globalPid") if "globalPid" in cols else "0"
    exprs = ["start", "end", f"((deviceId & 127) << 56) | ((streamId & 4294967295) << 24) | {pid}",
             "ifnull(correlationId, -1)" if "correlationId" in cols else "-1"]
    if kind != KERNEL:
        exprs += ["ifnull(bytes, -1)" if "bytes" in cols else "-1"]
    if kind == MEMCPY:
        exprs += ["ifnull(copyKind, 0)" if "copyKind" in cols else "0",
                  (f"(ifnull(srcKind, -1) = {PAGEABLE} OR ifnull(dstKind, -1) = {PAGEABLE})"
                   if {"srcKind", "dstKind"} <= cols else "0")]
    if comm_expr:
        exprs.append(comm_expr)
    got = fetch.columns(table, exprs)
    n = got[0].size
    start, end, grp, corr = got[:4]
    dev = grp >> 56
    stream = (grp >> 24) & 0xFFFFFFFF
    pid = grp & 0xFFFFFF
    key = np.where(corr >= 0, (pid << 32) | (corr & 0xFFFFFFFF), -1)
    nbytes = got[4] if kind != KERNEL else np.full(n, -1, dtype=np.int64)
    ckind = got[5] if kind == MEMCPY else np.zeros(n, dtype=np.int64)
    pageable = got[6] if kind == MEMCPY else np.zeros(n, dtype=np.int64)
    comm = got[-1] if comm_expr else np.zeros(n, dtype=np.int64)
    return [np.full(n, kind, dtype=np.int8), start, end, dev, stream, pid, key, nbytes, ckind, pageable, comm]


class _Fetcher:
    """Reads integer columns of one table as numpy arrays (connectorx when available, else stdlib)."""

    def __init__(self, conn: sqlite3.Connection, path: str, reader: str) -> None:
        self.conn, self.path = conn, path
        self.backend = "stdlib"
        if reader in ("auto", "connectorx"):
            try:
                import connectorx  # noqa: F401

                self.backend = "connectorx"
            except ImportError:
                if reader == "connectorx":
                    raise TraceError("connectorx is not installed (pip install connectorx)") from None

    def columns(self, table: str, exprs: list[str], where: str = "") -> list[np.ndarray]:
        if self.backend == "connectorx":
            try:
                return self._cx(table, exprs, where)
            except Exception:  # noqa: BLE001 -- any connectorx failure: fall back to the stdlib reader
                self.backend = "stdlib"
        return self._stdlib(table, exprs, where)

    def _cx(self, table: str, exprs: list[str], where: str) -> list[np.ndarray]:
        import connectorx as cx

        sel = ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
        sql = f'SELECT {sel} FROM "{table}"' + (f" WHERE {where}" if where else "")
        with warnings.catch_warnings():  # connectorx 0.4.6 uses a pandas API deprecated in pandas 3
            warnings.simplefilter("ignore")
            df = cx.read_sql("sqlite://" + urllib.parse.quote(os.path.abspath(self.path)), sql,
                             return_type="pandas")
        return [df[f"c{i}"].to_numpy(dtype=np.int64, na_value=-1) for i in range(len(exprs))]

    def _stdlib(self, table: str, exprs: list[str], where: str) -> list[np.ndarray]:
        lo, hi = self.conn.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        out: list[list[np.ndarray]] = [[] for _ in exprs]
        if lo is None:
            return [np.zeros(0, dtype=np.int64) for _ in exprs]
        cond = f" AND ({where})" if where else ""
        for a in range(int(lo), int(hi) + 1, _CHUNK_ROWS):
            rng = f"rowid >= {a} AND rowid < {a + _CHUNK_ROWS}{cond}"
            for i, e in enumerate(exprs):
                # One string per column and chunk: no per-row Python objects.
                (s,) = self.conn.execute(f'SELECT group_concat(x) FROM (SELECT ifnull({e}, -1) AS x FROM "{table}" '
                                         f'WHERE {rng} ORDER BY rowid)').fetchone()
                out[i].append(np.fromstring(s, dtype=np.int64, sep=",") if s else np.zeros(0, dtype=np.int64))
        return [np.concatenate(c) if len(c) > 1 else c[0] for c in out]


__all__ = ["read_nsys", "EXPORT_HINT", "MEMSET"]
