"""The Kineto reader's per-event loop: every event's fields checked one by one, for any trace.

The reader's lean pass (kineto_pass) reads what profilers write; everything else (the stdlib decoder's events,
times or ids of other types or out of range, ops linked by flows) comes here: values are converted where
they are used, unusable times skip their event, values out of range raise :class:`BadValue` (the reader's
one-line error).
"""
from __future__ import annotations

from ..timeline_model import KERNEL
from .kineto_events import FLOAT_EXACT_US, Dec, Fallback, NeedTextTimes, Raw, event_from_dict, raw_value
from .kineto_pass import GPU_CATS, HOST_CATS, I64, MARK_CATS, NOT_STEP_CATS, TS_MAX_US, Columns, count_marker
from .kineto_times import text_times

__all__ = ["BadValue", "as_id", "hashable", "usable_time", "event_loop"]

_Dec = Dec
_GPU_CATS, _HOST_CATS, _NOT_STEP_CATS, _MARK_CATS = GPU_CATS, HOST_CATS, NOT_STEP_CATS, MARK_CATS
_TS_MAX_US, _I64 = TS_MAX_US, I64


class BadValue(Exception):
    """A field holding a number out of range (caught and reported with the file and event)."""


def as_id(v, default: int = -1, field: str = "value") -> int:
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
        raise BadValue(f"{field} {str(v)[:30]} out of the 64-bit range")
    return out


_NO_ARGS = event_from_dict({"args": {}}).args  # an event without args: every field None


def hashable(v):
    """pid / tid / flow id as a dict key: scalars only (a list or object becomes None)."""
    return v if isinstance(v, (int, float, str)) else None


def usable_time(v) -> bool:
    """A usable time value: an int, a finite float or a large number's text, within _TS_MAX_US."""
    if isinstance(v, float):
        return -_TS_MAX_US <= v <= _TS_MAX_US  # (False for NaN)
    if isinstance(v, int):
        if isinstance(v, bool):
            return False
        if -_TS_MAX_US <= v <= _TS_MAX_US:
            return True
        raise BadValue(f"time {str(v)[:30]} µs out of range")
    return isinstance(v, _Dec)


def event_loop(events: list, typed: bool) -> Columns:
    """One pass over the events, each checked field by field: ts, dur, pid, tid, id may be JSON text (Raw) still,
    converted here only where they are used; values out of range raise _Bad, unusable times skip the event."""
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
                if not usable_time(ts) or not usable_time(dur):
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
                o_dev.append(v if type(v) is int and -i64 <= v < i64 else as_id(v, field="device"))
                v = args.stream
                if v is None:
                    v = raw_value(e.tid)
                o_stream.append(v if type(v) is int and -i64 <= v < i64 else as_id(v, field="stream"))
                o_kind.append(kind)
                o_ts.append(ts)
                o_dur.append(dur)
                corr = args.correlation
                if type(corr) is not int or not -i64 <= corr < i64:
                    corr = as_id(corr, field="correlation")
                o_corr.append(corr)
                if corr < 0:
                    o_loc[len(o_ts) - 1] = (hashable(raw_value(e.pid)), hashable(raw_value(e.tid)), ts)
                if kind == KERNEL:
                    o_bytes.append(-1)
                    if "ccl" in name and (name.startswith(("nccl", "hccl")) or "ncclKernel" in name
                                          or "ncclDevKernel" in name):
                        o_comm.append(len(o_ts) - 1)
                    o_names.append("")
                else:
                    o_bytes.append(as_id(args.bytes, field="bytes"))
                    o_names.append(name)
            elif cat in host_cats:
                nid = name_ids.get(name)
                if nid is None:
                    nid = name_ids[name] = len(name_ids)
                c_ts.append(ts)
                c_dur.append(dur)
                corr = args.correlation
                if type(corr) is not int or not -i64 <= corr < i64:
                    corr = as_id(corr, field="correlation")
                c_corr.append(corr)
                c_name.append(nid)
                c_ev.append(e)  # its location (pid, tid, ts), built only if flows are needed
            else:
                if name.startswith("ProfilerStep#") and cat not in _NOT_STEP_CATS:
                    steps.append((ts, dur))
                elif cat in _MARK_CATS:
                    count_marker(name, marker_of, marks, mark_names)
        elif ph == "s" or ph == "f":
            cat = e.cat
            if cat == "ac2g":
                flow_ev.append(e)
            elif cat == "fwdbwd" and ph == "s":  # autograd's forward -> backward links: a training step
                marks["backward_links"] = marks.get("backward_links", 0) + 1
    c = Columns()
    c.o_dev, c.o_stream, c.o_kind, c.o_ts, c.o_dur, c.o_corr, c.o_bytes, c.o_names, c.o_loc, c.o_comm = \
        o_dev, o_stream, o_kind, o_ts, o_dur, o_corr, o_bytes, o_names, o_loc, o_comm
    c.c_ts, c.c_dur, c.c_corr, c.c_name, c.c_ev, c.name_ids, c.steps = c_ts, c_dur, c_corr, c_name, c_ev, name_ids, \
        steps
    c.marks, c.mark_names, c.n_x, c.exact = marks, mark_names, n_x, exact
    c.flows = flow_ev.copy
    return c
