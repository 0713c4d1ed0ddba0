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
from ..timeline_model import (KERNEL, MEMCPY, MEMSET, Timeline, TraceError, classify_api, copy_kind_from_name,
                              workload_marker)
from .kineto_events import (FLOAT_EXACT_US, TYPED, Dec, Fallback, NeedTextTimes, Raw, decode_trace, event_from_dict,
                            raw_value)
from .kineto_times import text_times, texts_ns
from .trace_io import DEFAULT_MAX_JSON_BYTES, read_json_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = ["read_kineto", "timeline_from_events", "Timeline", "TraceError"]

_GPU_CATS = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
             "gpu_memset": MEMSET, "Memset": MEMSET}
_HOST_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "cuda_runtime_api", "Driver"}
# Categories whose ProfilerStep#N rows are not steps: the GPU-side copy of each CPU annotation
# (gpu_user_annotation, one per stream that ran work in the step).
_NOT_STEP_CATS = {"gpu_user_annotation"}
# Host-side rows whose names can mark the workload (training vs serving).
_MARK_CATS = {"cpu_op", "user_annotation", "python_function", "Operator", "cpu_instant_event"}

_TS_MAX_US = (1 << 62) // 1000  # |ts|, |dur| in µs whose ns fit int64 with room for sums (year 2116)
_I64 = 1 << 63
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


class _Bad(Exception):
    """A field holding a number out of range (caught and reported with the file and event)."""


def _int(v, default: int = -1, field: str = "value") -> int:
    """An id from a JSON value: ints, integral floats and decimal strings; ``default`` for anything
    else; _Bad when out of int64's range."""
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        out = v
    elif isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return default
        out = int(v)
    elif isinstance(v, str) and not isinstance(v, _Dec):
        try:
            out = int(v)
        except ValueError:
            return default
    else:
        return default
    if not -_I64 <= out < _I64:
        raise _Bad(f"{field} {str(v)[:30]} out of the 64-bit range")
    return out


_NO_ARGS = event_from_dict({"args": {}}).args  # an event without args: every field None


def _hashable(v):
    """pid / tid / flow id as a dict key: scalars only (a list or object becomes None)."""
    return v if isinstance(v, (int, float, str)) else None


def read_kineto(path: str, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> Timeline:
    """Parse a Kineto trace file into a Timeline. Raises TraceError (one line) on bad input."""
    with _gc_paused():
        return _read_kineto(path, max_json_bytes)


def _read_kineto(path: str, max_json_bytes: int) -> Timeline:
    raw = _load_raw(path, max_json_bytes)
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


def _num(v) -> bool:
    """A usable time value: an int, a finite float or a large number's text, within _TS_MAX_US."""
    if isinstance(v, float):
        return -_TS_MAX_US <= v <= _TS_MAX_US  # (False for NaN)
    if isinstance(v, int):
        if isinstance(v, bool):
            return False
        if -_TS_MAX_US <= v <= _TS_MAX_US:
            return True
        raise _Bad(f"time {str(v)[:30]} µs out of range")
    return isinstance(v, _Dec)


def _from_events(events: list, n_events: int, source: str, doc: dict) -> Timeline:
    """One pass over typed events (kineto_events.Event or its stdlib twin): ts, dur, pid, tid, id may be
    JSON text (Raw) still, converted here only where they are used."""
    o_dev: list[int] = []
    o_stream: list[int] = []
    o_kind: list[int] = []
    o_ts: list = []
    o_dur: list = []
    o_corr: list[int] = []
    o_bytes: list[int] = []
    o_names: list[str] = []
    c_ts: list = []
    c_dur: list = []
    c_corr: list[int] = []
    c_name: list[int] = []
    marker_of: dict[str, str | None] = {}
    c_ev: list = []  # host calls' events, for their locations
    name_ids: dict[str, int] = {}
    steps: list[tuple] = []
    flow_ev: list = []  # ac2g flow events: turned into links only if some GPU op has no correlation
    o_loc: dict[int, tuple] = {}
    o_comm: list[int] = []
    marks: dict[str, int] = {}
    mark_names: dict[str, list[str]] = {}
    n_x = 0
    exact = False  # a time came as a large number's text: convert every time exactly
    gpu_cats, host_cats, ts_max, i64, f_exact = _GPU_CATS, _HOST_CATS, _TS_MAX_US, _I64, FLOAT_EXACT_US
    no_args = _NO_ARGS
    typed = bool(events) and type(events[0]) in TYPED
    # Times kept as JSON text (epoch µs with sub-µs digits): converted in one pass, in event order
    next_text_time = iter(text_times([e.ts for e in events if e.ph == "X" and type(e.ts) is Raw]
                                      if typed else ())).__next__
    for e in events:
        ph = e.ph
        if ph == "X":
            n_x += 1
            cat = e.cat
            if type(cat) is not str and not isinstance(cat, str):
                cat = ""
            kind = gpu_cats.get(cat)
            ts = e.ts
            if type(ts) is Raw:
                ts = next_text_time()  # (this event's, converted in bulk above)
                if type(ts) is Raw:
                    ts = raw_value(ts)
            dur = e.dur
            # Inline checks for the common types (plain ints and floats in range); anything else takes the
            # general checks (_num, _int), which skip, convert or raise as before.
            t1, t2 = type(ts), type(dur)
            if typed:
                # A float this large comes only from msgspec's numeric schema (the stdlib hook keeps its
                # text): its ns need the text.
                if t1 is float and (ts >= f_exact or ts <= -f_exact):
                    raise NeedTextTimes
                if t2 is float and (dur >= f_exact or dur <= -f_exact):
                    raise Fallback
            if t1 is _Dec and (t2 is float or t2 is int) and -ts_max <= dur <= ts_max:
                exact = True  # (epoch µs with sub-µs digits: the large number's text, checked when converted)
            elif not ((t1 is float or t1 is int) and (t2 is float or t2 is int) and -ts_max <= ts <= ts_max
                      and -ts_max <= dur <= ts_max):
                if not _num(ts) or not _num(dur):
                    continue
                if type(ts) is _Dec or type(dur) is _Dec:
                    exact = True
            args = e.args
            if args is None:
                args = no_args
            name = e.name
            if type(name) is not str and not isinstance(name, str):
                name = ""
            if kind is not None:
                v = args.device
                if v is None:
                    v = raw_value(e.pid)
                o_dev.append(v if type(v) is int and -i64 <= v < i64 else _int(v, field="device"))
                v = args.stream
                if v is None:
                    v = raw_value(e.tid)
                o_stream.append(v if type(v) is int and -i64 <= v < i64 else _int(v, field="stream"))
                o_kind.append(kind)
                o_ts.append(ts)
                o_dur.append(dur)
                corr = args.correlation
                if type(corr) is not int or not -i64 <= corr < i64:
                    corr = _int(corr, field="correlation")
                o_corr.append(corr)
                if corr < 0:
                    o_loc[len(o_ts) - 1] = (_hashable(raw_value(e.pid)), _hashable(raw_value(e.tid)), ts)
                if kind == KERNEL:
                    o_bytes.append(-1)
                    if "ccl" in name and (name.startswith(("nccl", "hccl")) or "ncclKernel" in name
                                          or "ncclDevKernel" in name):
                        o_comm.append(len(o_ts) - 1)
                    o_names.append("")
                else:
                    o_bytes.append(_int(args.bytes, field="bytes"))
                    o_names.append(name)
            elif cat in host_cats:
                nid = name_ids.get(name)
                if nid is None:
                    nid = name_ids[name] = len(name_ids)
                c_ts.append(ts)
                c_dur.append(dur)
                corr = args.correlation
                if type(corr) is not int or not -i64 <= corr < i64:
                    corr = _int(corr, field="correlation")
                c_corr.append(corr)
                c_name.append(nid)
                c_ev.append(e)  # its location (pid, tid, ts), built only if flows are needed
            else:
                if name.startswith("ProfilerStep#") and cat not in _NOT_STEP_CATS:
                    steps.append((ts, dur))
                elif cat in _MARK_CATS:
                    m = marker_of.get(name, 0)
                    if m == 0:  # (names repeat: one test per distinct name)
                        m = marker_of[name] = workload_marker(name)
                    if m is not None:
                        marks[m] = marks.get(m, 0) + 1
                        ex = mark_names.setdefault(m, [])
                        if len(ex) < 3 and name not in ex:
                            ex.append(name)
        elif ph == "s" or ph == "f":
            cat = e.cat
            if cat == "ac2g":
                flow_ev.append(e)
            elif cat == "fwdbwd" and ph == "s":  # autograd's forward -> backward links: a training step
                marks["backward_links"] = marks.get("backward_links", 0) + 1
    if n_x == 0:
        raise TraceError(f"cannot read {source}: not a PyTorch profiler trace (no complete 'X' events)")
    if not o_ts:
        raise TraceError(f"cannot read {source}: no GPU activity (no kernel, memcpy or memset events{_cats_seen(events)})"
                         "; profile with ProfilerActivity.CUDA")

    # The columns: numpy arrays, or for a small trace Python lists behind the same operations (fragscope.vec):
    # the same values, without numpy's import.
    if vec.numpy_for(len(o_ts) + len(c_ts)):
        import numpy as np
    else:
        np = vec
    if exact:
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
    if flow_ev and (op_launch < 0).any():
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
    start = np.asarray(start, dtype=np.int64)
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
