"""Kineto JSON -> typed events: the fields the timeline reads, nothing else.

Two decoders give the same events (tests/test_trace_kineto_typed.py checks them against each other):
- with msgspec (a dependency; the stdlib path where it cannot be imported), a schema of the fields used (``ph cat name ts dur pid tid id``
  and four of ``args``): every other field is skipped unparsed, and the time fields stay as their JSON text
  (:class:`msgspec.Raw`) until the timeline converts the few it keeps. On HTA's ns-resolution sample trace
  (15 MB of JSON, 69k events): 0.07 s here against 1.0 s for ``json.loads`` with the exact-number hook.
  Anything the schema does not expect (an event that is not an object, a float or a string where an id is,
  a name that is not text) makes the whole file go through the stdlib decoder instead, which reads
  what it reads today, errors included.
- without it, the stdlib ``json.loads`` with the exact-number hook, each event's fields copied out.

Number semantics, both ways: an integer is an int; a float below 2**41 µs in magnitude is a float; any
larger float keeps its decimal text (:class:`Dec`) so its ns are converted exactly.
"""
from __future__ import annotations

import json
from typing import Union

from ..timeline_model import TraceError

try:  # typed decoding (a dependency); the stdlib fallback below where it cannot be imported
    import msgspec
    from msgspec import Raw
except ImportError:  # pragma: no cover - exercised with FRAGSCOPE_JSON_DECODER=stdlib
    msgspec = None

    class Raw:  # type: ignore[no-redef]  # (never instantiated: `type(x) is Raw` is simply False)
        pass

__all__ = ["Dec", "Event", "EventTextTime", "Args", "parse_float", "decode_trace", "decode_lean", "event_from_dict",
           "raw_value", "Fallback", "NeedTextTimes", "TYPED", "LEAN_X", "LEAN_FLOW_START"]

# A float JSON number below this many µs (2**41 µs, 25 days) converts to ns exactly enough (its float64
# step is under 0.5 ns); above it (epoch µs: 1.7e15, where float64 keeps 0.25 µs steps) the number is kept
# as its decimal text and converted exactly.
FLOAT_EXACT_US = float(1 << 41)


class Dec(str):
    """The text of a JSON number too large for an exact float64 ns conversion."""

    __slots__ = ()


def parse_float(text):
    f = float(text)
    if -FLOAT_EXACT_US < f < FLOAT_EXACT_US:
        return f
    return Dec(text if type(text) is str else text.decode())


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class Fallback(Exception):
    """The typed decoding met something it does not expect: read the file with the stdlib decoder."""


class NeedTextTimes(Exception):
    """A float time at or above 2**41 µs in a trace decoded with numeric times: decode its times as text."""


if msgspec is not None:
    class Args(msgspec.Struct, gc=False):
        device: Union[int, None] = None
        stream: Union[int, None] = None
        correlation: Union[int, None] = None
        bytes: Union[int, None] = None

    class Event(msgspec.Struct, gc=False):
        """One trace event, times as numbers (a trace whose times are ints or floats below 2**41 µs); pid,
        tid, id as JSON text (Raw), or None when absent."""
        ph: Union[str, None] = None
        cat: Union[str, None] = None
        name: Union[str, None] = None
        ts: Union[int, float, None] = None
        dur: Union[int, float, None] = 0
        pid: Raw = None
        tid: Raw = None
        id: Raw = None
        args: Union[Args, None] = None

    class EventTextTime(msgspec.Struct, gc=False):
        """The same, ts as JSON text (Raw): for traces whose times are epoch µs with sub-µs digits."""
        ph: Union[str, None] = None
        cat: Union[str, None] = None
        name: Union[str, None] = None
        ts: Raw = None
        dur: Union[int, float, None] = 0
        pid: Raw = None
        tid: Raw = None
        id: Raw = None
        args: Union[Args, None] = None

    class _Doc(msgspec.Struct, gc=False):
        traceEvents: list[Event]
        schemaVersion: Raw = None
        traceName: Raw = None
        baseTimeNanoseconds: Raw = None
        distributedInfo: Raw = None

    class _DocTextTime(msgspec.Struct, gc=False):
        traceEvents: list[EventTextTime]
        schemaVersion: Raw = None
        traceName: Raw = None
        baseTimeNanoseconds: Raw = None
        distributedInfo: Raw = None

    _DECODERS = {False: msgspec.json.Decoder(_Doc), True: msgspec.json.Decoder(_DocTextTime)}
    _ANY = msgspec.json.Decoder(float_hook=parse_float)
    TYPED = (Event, EventTextTime)

    # The lean schemas (kineto_pass): one struct per phase ("ph", the union's tag), each with only what the
    # analysis reads of it; a phase not listed here, or an event without one, fails the decode (the full
    # schemas above then read the file).
    class LeanX(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        cat: Union[str, None] = None
        name: Union[str, None] = None
        ts: Union[int, float, None] = None
        dur: Union[int, float, None] = 0
        args: Union[Args, None] = None

    class LeanXText(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        cat: Union[str, None] = None
        name: Union[str, None] = None
        ts: Raw = None
        dur: Union[int, float, None] = 0
        args: Union[Args, None] = None

    class LeanFlowStart(msgspec.Struct, tag_field="ph", tag="s", gc=False):
        cat: Union[str, None] = None

    # The other phases of the Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)
    _LEAN_OTHER = tuple(msgspec.defstruct(f"LeanPhase{i}", [], tag_field="ph", tag=ph, gc=False)
                        for i, ph in enumerate(("B", "E", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "t",
                                                "f", "P", "O", "N", "D", "M", "V", "v", "R", "c", "(", ")")))

    def _lean_doc(x):
        return msgspec.defstruct("LeanDoc", [("traceEvents", list[Union[(x, LeanFlowStart, *_LEAN_OTHER)]]),
                                             *((k, Raw, None) for k in _META)], gc=False)

    _META = ("schemaVersion", "traceName", "baseTimeNanoseconds", "distributedInfo")
    _LEAN_DECODERS = {False: msgspec.json.Decoder(_lean_doc(LeanX)), True: msgspec.json.Decoder(_lean_doc(LeanXText))}
    LEAN_X = {False: LeanX, True: LeanXText}
    LEAN_FLOW_START = LeanFlowStart
else:
    class Args:  # type: ignore[no-redef]
        __slots__ = ("device", "stream", "correlation", "bytes")

        def __init__(self, device, stream, correlation, nbytes):
            self.device, self.stream, self.correlation, self.bytes = device, stream, correlation, nbytes

    class Event:  # type: ignore[no-redef]
        __slots__ = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args")

        def __init__(self, ph=None, cat=None, name=None, ts=None, dur=0, pid=None, tid=None, id=None, args=None):
            self.ph, self.cat, self.name, self.ts, self.dur = ph, cat, name, ts, dur
            self.pid, self.tid, self.id, self.args = pid, tid, id, args

    EventTextTime = Event
    _DECODERS = _ANY = _LEAN_DECODERS = None
    TYPED = ()
    LEAN_X = {False: None, True: None}
    LEAN_FLOW_START = None


class _DictArgs:
    __slots__ = ("device", "stream", "correlation", "bytes")

    def __init__(self, a: dict):
        g = a.get
        self.device, self.stream, self.correlation, self.bytes = g("device"), g("stream"), g("correlation"), \
            g("bytes")


class _DictEvent:
    """An event from the stdlib decoder: its fields as decoded Python values."""

    __slots__ = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args")

    def __init__(self, e: dict):
        g = e.get
        self.ph, self.cat, self.name, self.ts, self.dur = g("ph"), g("cat"), g("name"), g("ts"), g("dur", 0)
        self.pid, self.tid, self.id = g("pid"), g("tid"), g("id")
        a = g("args")
        self.args = _DictArgs(a) if type(a) is dict or isinstance(a, dict) else None


def event_from_dict(e: dict) -> _DictEvent:
    return _DictEvent(e)


_DIGITS = frozenset(b"-0123456789")


def raw_value(r):
    """A Raw field's Python value, as ``json.loads`` with the exact-number hook gives it. Numbers take a
    short path (int(), float() on the text); anything else (text, objects, true/false/null) goes through
    msgspec's own decoder. Raises Fallback where the stdlib decoder would refuse the number (an integer
    beyond Python's 4,300-digit limit)."""
    if type(r) is not Raw:
        return r
    b = bytes(r)
    if b[0] in _DIGITS:
        dot = b.find(b".")
        if dot >= 15 and b"e" not in b and b"E" not in b:  # 14+ integer digits: above 2**41, kept as text
            return Dec(b.decode())
        if dot >= 0 or b"e" in b or b"E" in b:
            return parse_float(b)
        try:
            return int(b)
        except ValueError:
            raise Fallback from None
    try:
        return _ANY.decode(b)
    except (msgspec.DecodeError, ValueError):
        raise Fallback from None


def decode_trace(raw: bytes, path: str, mode: str = "auto") -> tuple[list, dict]:
    """The trace's events (typed) and its top-level metadata (schemaVersion, traceName, baseTimeNanoseconds,
    distributedInfo as Python values). ``mode``: "auto" (times as numbers or as text, as the first event's
    ts looks), "numbers", "text", "stdlib". Raises TraceError (one line) on text that is no trace."""
    if _DECODERS is not None and mode != "stdlib":
        text = _text_times_likely(raw) if mode == "auto" else mode == "text"
        for as_text in ((text, not text) if mode == "auto" else (text,)):
            try:
                doc = _DECODERS[as_text].decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError):
                continue  # the other schema, or the stdlib decoder, reads it or says why not
            try:
                meta = {k: raw_value(getattr(doc, k)) for k in
                        ("schemaVersion", "traceName", "baseTimeNanoseconds", "distributedInfo")}
            except Fallback:
                break
            return doc.traceEvents, meta
    doc = _stdlib_loads(raw, path)
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(f"cannot read {path}: not a PyTorch profiler trace (no traceEvents list)")
    elif isinstance(doc, list):  # Chrome trace "array format"
        events, doc = doc, {}
    else:
        raise TraceError(f"cannot read {path}: not a PyTorch profiler trace (JSON {type(doc).__name__})")
    return events, doc


def decode_lean(raw: bytes, text: bool | None = None) -> tuple[list, dict, bool] | None:
    """The trace's events in the lean schemas (kineto_pass), its metadata as ``decode_trace`` gives it, and
    whether the times are text (``text``; None: as the first ``"ts"`` looks); None where msgspec is missing or
    the lean schemas do not read the file (``decode_trace`` then reads it, or says why not)."""
    if _LEAN_DECODERS is None:
        return None
    if text is None:
        text = _text_times_likely(raw)
    try:
        doc = _LEAN_DECODERS[text].decode(raw)
        meta = {k: raw_value(getattr(doc, k)) for k in _META}
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError, Fallback):
        return None
    return doc.traceEvents, meta, text


def _text_times_likely(raw: bytes) -> bool:
    """Whether the first ``"ts":`` holds a float of 14+ integer digits (epoch µs with sub-µs digits): only
    which schema is tried first; both give the same events."""
    i = raw.find(b'"ts":')
    if i < 0:
        return False
    head = raw[i + 5:i + 40].lstrip()
    digits = len(head) - len(head.lstrip(b"-0123456789"))
    return digits >= 14 and head[digits:digits + 1] in (b".", b"e", b"E")


def _stdlib_loads(raw: bytes, path: str) -> object:
    try:
        return json.loads(raw, parse_float=parse_float, parse_constant=_reject_constant)
    except RecursionError:
        raise TraceError(f"cannot read {path}: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"cannot read {path}: not valid JSON ({msg})") from None
