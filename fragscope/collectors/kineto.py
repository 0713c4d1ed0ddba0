"""PyTorch profiler / Kineto Chrome-trace JSON (``*.pt.trace.json``, ``.gz`` too) -> columnar Timeline.

The columnar model it fills is :class:`fragscope.timeline_model.Timeline` (the Nsight Systems reader
:mod:`fragscope.collectors.nsys` fills it too); the format dispatch is :mod:`.trace_format`.
Format notes: ../shared/notes/formats-and-analyses.md section 4; contract: docs/trace.md.

Kineto facts this parser relies on: ``ts``/``dur`` are microseconds (floats with sub-µs digits in
new traces); GPU rows use pid = device index and tid = stream; a launch links to its GPU ops by
``args.correlation`` (fallback: the ``ac2g`` flow pair); ``cuLaunchKernel`` (cuda_driver category,
Triton / torch.compile) and ``cudaGraphLaunch`` (one correlation -> many kernels) are launches too.
"""
from __future__ import annotations

import gzip
import json
import zlib

import numpy as np

from ..timeline_model import KERNEL, MEMCPY, MEMSET, Timeline, TraceError, classify_api, copy_kind_from_name

__all__ = ["read_kineto", "timeline_from_events", "Timeline", "TraceError"]

_GPU_CATS = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
             "gpu_memset": MEMSET, "Memset": MEMSET}
_HOST_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "cuda_runtime_api", "Driver"}


def _load_json(path: str) -> object:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"cannot read {path}: truncated or corrupt gzip ({e})") from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        msg = str(e).splitlines()[0]
        raise TraceError(f"cannot read {path}: not valid JSON ({msg})") from None


def _int(v, default: int = -1) -> int:
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return default
    return default


def read_kineto(path: str) -> Timeline:
    """Parse a Kineto trace file into a Timeline. Raises TraceError (one line) on bad input."""
    doc = _load_json(path)
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(f"cannot read {path}: not a PyTorch profiler trace (no traceEvents list)")
    elif isinstance(doc, list):  # Chrome trace "array format"
        events, doc = doc, {}
    else:
        raise TraceError(f"cannot read {path}: not a PyTorch profiler trace (JSON {type(doc).__name__})")
    if not events:
        raise TraceError(f"cannot read {path}: empty trace (no events)")
    return timeline_from_events(events, path, doc)


def timeline_from_events(events: list, source: str = "", doc: dict | None = None) -> Timeline:
    """Build a Timeline from Chrome-trace events (one pass, plain Python; columns built with numpy)."""
    doc = doc or {}
    o_dev: list[int] = []
    o_stream: list[int] = []
    o_kind: list[int] = []
    o_ts: list[float] = []
    o_dur: list[float] = []
    o_corr: list[int] = []
    o_bytes: list[int] = []
    o_names: list[str] = []
    c_ts: list[float] = []
    c_dur: list[float] = []
    c_corr: list[int] = []
    c_name: list[int] = []
    c_loc: list[tuple] = []
    name_ids: dict[str, int] = {}
    steps: list[tuple[float, float]] = []
    flows_s: dict = {}
    flows_f: dict = {}
    o_loc: dict[int, tuple] = {}
    o_comm: list[int] = []
    n_x = 0
    gpu_cats, host_cats = _GPU_CATS, _HOST_CATS
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X":
            n_x += 1
            cat = e.get("cat")
            kind = gpu_cats.get(cat)
            ts = e.get("ts")
            dur = e.get("dur", 0)
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                continue
            args = e.get("args") or {}
            if kind is not None:
                dev = args.get("device")
                o_dev.append(_int(dev if dev is not None else e.get("pid")))
                st = args.get("stream")
                o_stream.append(_int(st if st is not None else e.get("tid")))
                o_kind.append(kind)
                o_ts.append(ts)
                o_dur.append(dur)
                corr = _int(args.get("correlation"))
                o_corr.append(corr)
                if corr < 0:
                    o_loc[len(o_ts) - 1] = (e.get("pid"), e.get("tid"), ts)
                if kind == KERNEL:
                    o_bytes.append(-1)
                    nm = e.get("name") or ""
                    if nm.startswith(("nccl", "hccl")) or "ncclKernel" in nm or "ncclDevKernel" in nm:
                        o_comm.append(len(o_ts) - 1)
                    o_names.append("")
                else:
                    o_bytes.append(_int(args.get("bytes")))
                    o_names.append(e.get("name") or "")
            elif cat in host_cats:
                name = e.get("name") or ""
                nid = name_ids.get(name)
                if nid is None:
                    nid = name_ids[name] = len(name_ids)
                c_ts.append(ts)
                c_dur.append(dur)
                c_corr.append(_int(args.get("correlation")))
                c_name.append(nid)
                c_loc.append((e.get("pid"), e.get("tid"), ts))
            else:
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    steps.append((ts, ts + dur))
        elif ph == "s" or ph == "f":
            if e.get("cat") == "ac2g" and "id" in e:
                loc = (e.get("pid"), e.get("tid"), e.get("ts"))
                if ph == "s":
                    flows_s[e["id"]] = loc  # at the launch call on the CPU row
                else:
                    flows_f[loc] = e["id"]  # at the GPU op (bp "e")
    if n_x == 0:
        raise TraceError(f"cannot read {source}: not a PyTorch profiler trace (no complete 'X' events)")
    if not o_ts:
        raise TraceError(f"cannot read {source}: no GPU activity (no kernel, memcpy or memset events); "
                         "profile with ProfilerActivity.CUDA")

    # µs floats -> int ns. Subtract an integer µs base first: epoch µs * 1000 exceeds 2**53, where a
    # float64 keeps only 256 ns steps.
    ts_a = np.asarray(o_ts, dtype=np.float64)
    base_us = float(np.floor(ts_a.min()))
    op_start, op_end = _to_ns(ts_a, np.asarray(o_dur, dtype=np.float64), base_us)
    call_start, call_end = _to_ns(np.asarray(c_ts, dtype=np.float64), np.asarray(c_dur, dtype=np.float64),
                                  base_us)
    st_a = np.asarray([s[0] for s in steps], dtype=np.float64)
    st_b = np.asarray([s[1] - s[0] for s in steps], dtype=np.float64)
    step_s, step_e = _to_ns(st_a, st_b, base_us)
    names = list(name_ids)
    kinds_by_name = np.array([classify_api(n) for n in names] or [0], dtype=np.int8)
    call_name = np.asarray(c_name, dtype=np.int32)
    call_kind = kinds_by_name[call_name] if call_name.size else np.zeros(0, dtype=np.int8)

    # Link GPU ops to their launch calls: args.correlation first, then ac2g flows.
    op_corr = np.asarray(o_corr, dtype=np.int64)
    call_corr = np.asarray(c_corr, dtype=np.int64)
    op_launch = _link_by_key(op_corr, call_corr)
    if flows_f and (op_launch < 0).any():
        call_at = {loc: i for i, loc in enumerate(c_loc)}
        for i, loc in o_loc.items():
            fid = flows_f.get(loc)
            src = flows_s.get(fid) if fid is not None else None
            j = call_at.get(src) if src is not None else None
            if j is not None:
                op_launch[i] = j

    kind_a = np.asarray(o_kind, dtype=np.int8)
    copy_kind = np.zeros(kind_a.size, dtype=np.int8)
    pageable = np.zeros(kind_a.size, dtype=bool)
    for i in np.flatnonzero(kind_a != KERNEL).tolist():
        nm = o_names[i]
        copy_kind[i] = copy_kind_from_name(nm)
        pageable[i] = "Pageable" in nm

    comm = np.zeros(kind_a.size, dtype=bool)
    comm[o_comm] = True
    epoch = None
    if op_start.size and op_start.min() > 10**18:  # µs since the unix epoch (after 2001) -> wall clock
        epoch = 0
    base = doc.get("baseTimeNanoseconds")
    meta = {"schema_version": doc.get("schemaVersion"), "events": len(events),
            "trace_name": doc.get("traceName"), "distributed_rank": (doc.get("distributedInfo") or {}).get("rank")}
    if base is not None:
        meta["base_time_ns"] = base
    return Timeline(
        source=source, format="kineto-json",
        op_device=np.asarray(o_dev, dtype=np.int64), op_stream=np.asarray(o_stream, dtype=np.int64),
        op_pid=np.full(kind_a.size, -1, dtype=np.int64), op_kind=kind_a,
        op_start=op_start, op_end=np.maximum(op_end, op_start),
        op_bytes=np.asarray(o_bytes, dtype=np.int64), op_copy_kind=copy_kind, op_pageable=pageable,
        op_launch=op_launch, op_comm=comm,
        call_start=call_start, call_end=np.maximum(call_end, call_start),
        call_kind=call_kind, call_name=call_name, call_names=names,
        steps=sorted(zip(step_s.tolist(), step_e.tolist())),
        epoch_offset_ns=epoch, meta=meta)


def _to_ns(ts_us: np.ndarray, dur_us: np.ndarray, base_us: float) -> tuple[np.ndarray, np.ndarray]:
    base_ns = np.int64(int(base_us) * 1000)
    rel = ts_us - base_us
    start = np.rint(rel * 1000.0).astype(np.int64) + base_ns
    end = np.rint((rel + dur_us) * 1000.0).astype(np.int64) + base_ns
    return start, end


def _link_by_key(op_key: np.ndarray, call_key: np.ndarray) -> np.ndarray:
    """Index of the call with the same key for each op (-1: none; keys < 0 never match)."""
    out = np.full(op_key.size, -1, dtype=np.int64)
    if not call_key.size or not op_key.size:
        return out
    order = np.argsort(call_key, kind="stable")
    sk = call_key[order]
    pos = np.searchsorted(sk, op_key)
    pos_c = np.minimum(pos, sk.size - 1)
    hit = (sk[pos_c] == op_key) & (op_key >= 0)
    out[hit] = order[pos_c[hit]]
    return out
