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

import decimal
import gc
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .. import vec
from ..timeline_model import KERNEL, Timeline, TraceError, classify_api, copy_kind_from_name
from .kineto_events import TYPED, Dec, Fallback, NeedTextTimes, decode_lean, decode_trace, event_from_dict, raw_value
from .kineto_loop import BadValue, event_loop, hashable
from .kineto_pass import Columns, LeanNeedsText, lean_columns, texts_ns_at
from .kineto_times import texts_ns
from .trace_io import DEFAULT_MAX_JSON_BYTES, read_json_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = ["read_kineto", "timeline_from_events", "Timeline", "TraceError"]

_Bad, _hashable = BadValue, hashable
_Dec = Dec  # (the name the checks below use)


@contextmanager
def _gc_paused():
    """No cyclic garbage collection while a trace's objects are built (none of them form cycles): the
    collector otherwise walks the growing event list again and again (json.loads of 200k events: 0.86 s
    with it, 0.52 s without, here; bench/bench_trace.py). The switch is process-wide: in the agent, a
    capture's read pauses cyclic collection for its other threads too, for that long (reference counting
    still frees everything acyclic); the previous state is restored, errors included."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _load_raw(path: str, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> bytes:
    raw = read_json_bytes(path, max_bytes)
    if raw.startswith(b"SQLite format 3\x00"):
        raise TraceError(f"cannot read {path}: a compressed SQLite file: decompress it first (gunzip -k {path}), "
                         "then diagnose trace the .sqlite")
    return raw


def _stdlib_only() -> bool:
    """FRAGSCOPE_JSON_DECODER=stdlib: decode with the standard library even where msgspec is installed."""
    return os.environ.get("FRAGSCOPE_JSON_DECODER", "").strip().lower() == "stdlib"


def read_kineto(path: str, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> Timeline:
    """Parse a Kineto trace file into a Timeline. Raises TraceError (one line) on bad input."""
    with _gc_paused():
        return _read_kineto(path, max_json_bytes)


def _read_kineto(path: str, max_json_bytes: int) -> Timeline:
    raw = _load_raw(path, max_json_bytes)
    if not _stdlib_only():
        tl = _lean_timeline(raw, path)
        if tl is not None:
            return tl
    events, doc = decode_trace(raw, path, "stdlib" if _stdlib_only() else "auto")
    if not events:
        raise TraceError(f"cannot read {path}: empty trace (no events)")
    try:
        try:
            return _timeline(events, path, doc)
        except NeedTextTimes:  # epoch-µs float times: decoded again with their text kept (kineto_events)
            events, doc = decode_trace(raw, path, "text")
            return _timeline(events, path, doc)
    except Fallback:  # a value the typed decoding leaves to the stdlib decoder
        events, doc = decode_trace(raw, path, "stdlib")
        return _timeline(events, path, doc)


class _NeedFull(Exception):
    """The lean rows do not do for this trace (an op no call links: the flows would be read)."""


def _lean_timeline(raw: bytes, path: str) -> Timeline | None:
    """The Timeline from the lean schemas and pass (kineto_pass), or None where they do not read the trace (the
    full schemas and the per-event loop then do, as before)."""
    lean = decode_lean(raw)
    if lean is None:
        return None
    events, doc, text = lean
    try:
        c = lean_columns(events, text)
    except LeanNeedsText:  # epoch-µs float times: decoded again with their text kept
        del events
        lean = decode_lean(raw, True)
        if lean is None:
            return None
        events, doc, text = lean
        c = lean_columns(events, text)
    if c is None:
        return None
    try:
        return _timeline_of(c, events, len(events), path, doc)
    except (_NeedFull, _Bad):  # (_Bad: the per-event loop words which value)
        return None


def timeline_from_events(events: list, source: str = "", doc: dict | None = None) -> Timeline:
    """Build a Timeline from Chrome-trace events (dicts, as ``json.loads`` gives them; one pass, plain
    Python; columns built with numpy). Raises TraceError on values no trace holds (times or ids out of
    range)."""
    return _timeline(events, source, doc if isinstance(doc, dict) else {})


def _timeline(events: list, source: str, doc: dict) -> Timeline:
    typed = events
    if events and type(events[0]) not in TYPED:  # dicts from the stdlib decoder (or a caller)
        typed = [event_from_dict(e) for e in events if type(e) is dict or isinstance(e, dict)]
    try:
        return _from_events(typed, len(events), source, doc)
    except _Bad as e:
        raise TraceError(f"cannot read {source}: {e}") from None


def _from_events(events: list, n_events: int, source: str, doc: dict) -> Timeline:
    """The Timeline of typed events (kineto_events.Event or its stdlib twin), through the per-event loop."""
    return _timeline_of(event_loop(events, bool(events) and type(events[0]) in TYPED), events, n_events, source, doc)


def _timeline_of(c: Columns, events: list, n_events: int, source: str, doc: dict) -> Timeline:
    """The Timeline of a trace's rows (``events`` only for the error naming what the trace holds instead)."""
    if c.n_x == 0:
        raise TraceError(f"cannot read {source}: not a PyTorch profiler trace (no complete 'X' events)")
    if not c.o_ts:
        raise TraceError(f"cannot read {source}: no GPU activity (no kernel, memcpy or memset events{_cats_seen(events)})"
                         "; profile with ProfilerActivity.CUDA")
    o_dev, o_stream, o_kind, o_ts, o_dur, o_corr, o_bytes, o_names, o_loc, o_comm = \
        c.o_dev, c.o_stream, c.o_kind, c.o_ts, c.o_dur, c.o_corr, c.o_bytes, c.o_names, c.o_loc, c.o_comm
    c_ts, c_dur, c_corr, c_name, c_ev, name_ids, steps = c.c_ts, c.c_dur, c.c_corr, c.c_name, c.c_ev, c.name_ids, \
        c.steps

    # The columns: numpy arrays, or for a small trace Python lists behind the same operations (fragscope.vec):
    # the same values, without numpy's import.
    if vec.numpy_for(len(o_ts) + len(c_ts)):
        import numpy as np
    else:
        np = vec
    if c.texts is not None:  # time texts of one shape (kineto_pass): o_ts, c_ts, the steps' starts are rows
        op_start, op_end = _text_ns(c.texts, o_ts, o_dur, np)
        call_start, call_end = _text_ns(c.texts, c_ts, c_dur, np)
        step_s, step_e = _text_ns(c.texts, [s[0] for s in steps], [s[1] for s in steps], np)
    elif c.exact:
        op_start, op_end = _exact_ns(o_ts, o_dur, np)
        call_start, call_end = _exact_ns(c_ts, c_dur, np)
        step_s, step_e = _exact_ns([s[0] for s in steps], [s[1] for s in steps], np)
    else:
        # µs floats -> int ns. Subtract an integer µs base first (the products stay small and exact).
        ts_a = np.asarray(o_ts, dtype=np.float64)
        base_us = float(np.floor(ts_a.min()))
        op_start, op_end = _to_ns(ts_a, np.asarray(o_dur, dtype=np.float64), base_us)
        call_start, call_end = _to_ns(np.asarray(c_ts, dtype=np.float64), np.asarray(c_dur, dtype=np.float64),
                                      base_us)
        step_s, step_e = _to_ns(np.asarray([s[0] for s in steps], dtype=np.float64),
                                np.asarray([s[1] for s in steps], dtype=np.float64), base_us)
    names = list(name_ids)
    kinds_by_name = np.array([classify_api(n) for n in names] or [0], dtype=np.int8)
    call_name = np.asarray(c_name, dtype=np.int32)
    call_kind = kinds_by_name[call_name] if call_name.size else np.zeros(0, dtype=np.int8)

    # Link GPU ops to their launch calls: args.correlation first, then ac2g flows.
    op_corr = np.asarray(o_corr, dtype=np.int64)
    call_corr = np.asarray(c_corr, dtype=np.int64)
    op_launch = link_by_key(op_corr, call_corr)
    if c.lean and (op_launch < 0).any():
        raise _NeedFull
    flow_ev = c.flows() if (op_launch < 0).any() else ()
    if flow_ev:
        flows_s, flows_f = _flows(flow_ev)
    else:
        flows_f = None
    if flows_f and (op_launch < 0).any():
        # locations compared by time in ns (the same instant may be written 3.5 or 3.500)
        call_at = {_loc_ns((_hashable(raw_value(c.pid)), _hashable(raw_value(c.tid)), raw_value(c.ts))): i
                   for i, c in enumerate(c_ev)}
        f_at = {_loc_ns(loc): fid for loc, fid in flows_f.items()}
        for i, loc in o_loc.items():
            fid = f_at.get(_loc_ns(loc))
            src = flows_s.get(fid) if fid is not None else None
            j = call_at.get(_loc_ns(src)) if src is not None else None
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
    base = doc.get("baseTimeNanoseconds")
    if op_start.size and op_start.min() > 10**18:  # µs since the unix epoch (after 2001) -> wall clock
        epoch = 0
    elif isinstance(base, int) and not isinstance(base, bool) and 10**18 < base < 1 << 62:
        # newer Kineto: ts on its own clock, unix ns = ts * 1000 + baseTimeNanoseconds (as HTA converts)
        epoch = base
    dist = doc.get("distributedInfo")
    marks, mark_names = c.marks, c.mark_names
    meta = {"schema_version": _scalar(doc.get("schemaVersion")), "events": n_events,
            "trace_name": _scalar(doc.get("traceName")),
            "distributed_rank": _scalar(dist.get("rank")) if isinstance(dist, dict) else None}
    if isinstance(base, int) and not isinstance(base, bool):
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
        epoch_offset_ns=epoch, meta=meta, markers=marks, marker_examples=mark_names)


def _flows(flow_ev: list) -> tuple[dict, dict]:
    """ac2g flow starts (id -> location of the launch call) and ends (location of the GPU op -> id)."""
    flows_s: dict = {}
    flows_f: dict = {}
    for e in flow_ev:
        fid = _hashable(raw_value(e.id))
        if fid is None:
            continue
        loc = (_hashable(raw_value(e.pid)), _hashable(raw_value(e.tid)), _hashable(raw_value(e.ts)))
        if e.ph == "s":
            flows_s[fid] = loc  # at the launch call on the CPU row
        else:
            flows_f[loc] = fid  # at the GPU op (bp "e")
    return flows_s, flows_f


def _cats_seen(events: list) -> str:
    """What the trace holds instead (for the error): its most frequent 'X' categories, and a word when
    they belong to another accelerator (MTIA) than the CUDA / ROCm GPUs analysed here."""
    counts: dict[str, int] = {}
    for e in events:
        if e.ph == "X" and isinstance(e.cat, str):
            counts[e.cat] = counts.get(e.cat, 0) + 1
    if not counts:
        return ""
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:4]
    out = "; categories seen: " + ", ".join(f"{k} {v}" for k, v in top)
    if any(k.startswith("mtia") for k in counts):
        out += "; an MTIA trace: only CUDA and ROCm GPU timelines are analysed"
    return out


def _loc_ns(loc: tuple) -> tuple:
    """(pid, tid, ts) with ts as int ns where it is a number (a flow end and its op are matched on it)."""
    pid, tid, ts = loc
    if isinstance(ts, (int, float, _Dec)) and not isinstance(ts, bool):
        try:
            ts = us_to_ns(ts)
        except (_Bad, OverflowError, ValueError):
            pass
    return pid, tid, ts


def _scalar(v):
    """A metadata value kept only when it is a plain JSON scalar (strings, numbers)."""
    if isinstance(v, _Dec):
        return str(v)
    return v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None


def us_to_ns(v) -> int:
    """µs (int, float below _FLOAT_EXACT_US, or a large number's text) -> int ns, exactly (the text through
    Decimal, rounded half to even)."""
    if isinstance(v, _Dec):
        i, dot, f = v.partition(".")
        if dot and len(f) <= 3 and f.isdigit() and f.isascii() and len(i) < 20:
            # "1712195495505583.123": the ns are the digits themselves (what Decimal gives, ~5x faster)
            ns = int(i + f + "00"[:3 - len(f)])
            if not -(1 << 62) <= ns <= 1 << 62:
                raise _Bad(f"time {str(v)[:30]} µs out of range")
            return ns
        try:
            ns = int((decimal.Decimal(v) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))
        except (ArithmeticError, ValueError):
            raise _Bad(f"time {str(v)[:30]} µs is not a usable number") from None
        if not -(1 << 62) <= ns <= 1 << 62:
            raise _Bad(f"time {str(v)[:30]} µs out of range")
        return ns
    if isinstance(v, int):
        return v * 1000
    return round(v * 1000)


def _exact_ns(ts: list, dur: list, np=None) -> tuple[np.ndarray, np.ndarray]:
    """start, end in int ns from µs values, exact for large numbers (epoch µs with sub-µs digits); ``np`` the
    columns' namespace (numpy, the default, or fragscope.vec)."""
    if np is None:
        import numpy as np
    # us_to_ns's values, all at once (numpy's digits where the columns are numpy's); None when the texts are
    # not all of one shape
    start = texts_ns(ts, None if np is vec else np)
    if start is None:
        start = [us_to_ns(v) for v in ts]
    return _with_durations(np.asarray(start, dtype=np.int64), dur, np)


def _text_ns(texts: tuple, rows: list, dur: list, np) -> tuple[np.ndarray, np.ndarray]:
    """start, end in int ns of the rows of time texts of one shape (kineto_pass), as _exact_ns gives them."""
    start = texts_ns_at(texts, rows, None if np is vec else np)
    return _with_durations(np.asarray(start, dtype=np.int64), dur, np)


def _with_durations(start, dur: list, np) -> tuple[np.ndarray, np.ndarray]:
    if dur and set(map(type, dur)) == {float}:  # round(v * 1000) of each, as us_to_ns (half to even both)
        d = np.rint(np.asarray(dur, dtype=np.float64) * 1000.0).astype(np.int64)
    else:
        d = np.fromiter((us_to_ns(v) for v in dur), dtype=np.int64, count=len(dur))
    return start, start + d


def _to_ns(ts_us: np.ndarray, dur_us: np.ndarray, base_us: float) -> tuple[np.ndarray, np.ndarray]:
    np = vec.xp_of(ts_us)
    base_ns = int(base_us) * 1000
    rel = ts_us - base_us
    start = np.rint(rel * 1000.0).astype(np.int64) + base_ns
    end = np.rint((rel + dur_us) * 1000.0).astype(np.int64) + base_ns
    return start, end


def link_by_key(op_key: np.ndarray, call_key: np.ndarray) -> np.ndarray:
    """Index of the call with the same key for each op (-1: none; keys < 0 never match)."""
    np = vec.xp_of(op_key)
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
