"""The Kineto reader's lean pass: a trace decoded with only the fields the analysis needs, read in one loop.

msgspec decodes each event into a struct chosen by its ``ph`` (a tagged union, kineto_events.LEAN_DOCS): a
complete event ('X') keeps ``cat name ts dur`` and four of ``args``, a flow start ('s') its ``cat``, every
other event nothing; no ``ph``, ``pid``, ``tid`` or ``id`` text is kept. On HTA's ns-resolution trace (69k
events, 21k of them flows) that is about half the Python objects of the full schema, and decoding, the pass
and freeing them take about half the time (docs/performance.md). The time texts (epoch µs with sub-µs digits,
``1712195495505583.123``) are not converted one event at a time: the loop keeps each event's row number,
their shape is checked on the texts joined, and the ns of the rows kept are read from the digits
(:func:`texts_ns_at`), the values ``kineto.us_to_ns`` gives them.

What it needs is what a profiler writes; anything else (an event of another phase or that is no object, a
time or duration of another type or out of range, a GPU op without device, stream or correlation id, an id
out of int64's range, a time text of another shape, an op no launch call links: the flows' locations would
be needed) makes :func:`lean_columns` answer None, and the reader decodes the full schema and runs its
per-event loop (kineto._event_loop), which skips, converts or refuses as before. The two give the same rows
(tests/test_kineto_lean.py compares them on every trace here, generated ones and altered copies).
"""
from __future__ import annotations

from ..timeline_model import KERNEL, MEMCPY, MEMSET, workload_marker
from .kineto_events import FLOAT_EXACT_US, LEAN_FLOW_START, LEAN_X, Raw
from .kineto_times import digit_rows

__all__ = ["Columns", "lean_columns", "LeanNeedsText", "texts_ns_at", "GPU_CATS", "HOST_CATS", "NOT_STEP_CATS", "MARK_CATS",
           "TS_MAX_US", "I64"]

GPU_CATS = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
            "gpu_memset": MEMSET, "Memset": MEMSET}
HOST_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "cuda_runtime_api", "Driver"}
# Categories whose ProfilerStep#N rows are not steps: the GPU-side copy of each CPU annotation
# (gpu_user_annotation, one per stream that ran work in the step).
NOT_STEP_CATS = {"gpu_user_annotation"}
# Host-side rows whose names can mark the workload (training vs serving).
MARK_CATS = {"cpu_op", "user_annotation", "python_function", "Operator", "cpu_instant_event"}

TS_MAX_US = (1 << 62) // 1000  # |ts|, |dur| in µs whose ns fit int64 with room for sums (year 2116)
I64 = 1 << 63
_NS_MAX = 1 << 62  # (kineto.us_to_ns's range)


class Columns:
    """A trace's rows before they become the Timeline's columns: what the reader's event pass gives.

    ``o_*`` per GPU op, ``c_*`` per host API call, ``steps`` (start, dur) per ProfilerStep, in event order.
    Times are µs values (int, float or ``Dec``) as the events hold them, except where ``texts`` is set: then
    ``o_ts``, ``c_ts`` and the steps' starts are row numbers into ``texts`` (the time texts of one shape,
    :func:`texts_ns_at` gives their ns). ``exact``: some time is a large number's text (converted exactly).
    ``o_loc`` and ``c_ev`` (locations of ops without a correlation id, the calls' events) and ``flows()``
    (the ac2g flow events) are what linking by flows needs: the lean pass leaves them empty (it gives up on
    a trace that would need them)."""

    __slots__ = ("o_dev", "o_stream", "o_kind", "o_ts", "o_dur", "o_corr", "o_bytes", "o_names", "o_loc", "o_comm",
                 "c_ts", "c_dur", "c_corr", "c_name", "c_ev", "name_ids", "steps", "marks", "mark_names", "n_x",
                 "exact", "texts", "flows", "lean")

    def __init__(self) -> None:
        self.o_dev, self.o_stream, self.o_kind, self.o_ts, self.o_dur = [], [], [], [], []
        self.o_corr, self.o_bytes, self.o_names, self.o_comm = [], [], [], []
        self.o_loc: dict = {}
        self.c_ts, self.c_dur, self.c_corr, self.c_name, self.c_ev = [], [], [], [], []
        self.name_ids: dict = {}
        self.steps: list = []
        self.marks: dict = {}
        self.mark_names: dict = {}
        self.n_x = 0
        self.exact = False
        self.texts = None
        self.flows = list
        self.lean = False


def count_marker(name: str, marker_of: dict, marks: dict, mark_names: dict) -> None:
    """Count a host event named ``name`` that may mark the workload (timeline_model.workload_marker), keeping up
    to three example names per marker; ``marker_of`` remembers each distinct name's answer (names repeat)."""
    m = marker_of.get(name, 0)
    if m == 0:
        m = marker_of[name] = workload_marker(name)
    if m is not None:
        marks[m] = marks.get(m, 0) + 1
        ex = mark_names.setdefault(m, [])
        if len(ex) < 3 and name not in ex:
            ex.append(name)


class _Unusual(Exception):
    """Something the lean pass leaves to the full schema and the per-event loop."""


class LeanNeedsText(Exception):
    """A float time at or above 2**41 µs in lean events decoded with numeric times: decode them with their times
    as text (kineto_events.decode_lean) and read those."""


def lean_columns(events: list, text: bool) -> Columns | None:
    """The rows of lean events (kineto_events.decode_lean: times as numbers, or as text where ``text``), or None
    where the trace holds anything the per-event loop treats apart. Raises LeanNeedsText where numeric times
    need their text."""
    try:
        return _lean(events, text)
    except _Unusual:
        return None


def _lean(events: list, text: bool) -> Columns:
    out = Columns()
    out.lean = True
    o_dev, o_stream, o_kind, o_ts, o_dur, o_corr, o_bytes, o_names, o_comm = \
        out.o_dev, out.o_stream, out.o_kind, out.o_ts, out.o_dur, out.o_corr, out.o_bytes, out.o_names, out.o_comm
    c_ts, c_dur, c_corr, c_name, name_ids = out.c_ts, out.c_dur, out.c_corr, out.c_name, out.name_ids
    steps, marks, mark_names, marker_of = out.steps, out.marks, out.mark_names, {}
    gpu_cats, host_cats, not_step, mark_cats = GPU_CATS, HOST_CATS, NOT_STEP_CATS, MARK_CATS
    ts_max, i64, f_exact = TS_MAX_US, I64, FLOAT_EXACT_US
    x_type, s_type = LEAN_X[text], LEAN_FLOW_START
    times: list = []  # (text: every complete event's time text, in order; its row number stands for it)
    n_x = 0
    for e in events:
        t = type(e)
        if t is x_type:
            cat = e.cat
            kind = gpu_cats.get(cat)
            dur = e.dur
            t2 = type(dur)
            if t2 is float:
                if not -f_exact < dur < f_exact:
                    raise _Unusual
            elif t2 is not int or not -ts_max <= dur <= ts_max:
                raise _Unusual
            if text:
                times.append(e.ts)
                ts = n_x
            else:
                ts = e.ts
                t1 = type(ts)
                if t1 is float:
                    if not -f_exact < ts < f_exact:
                        raise LeanNeedsText  # (its ns need its text: the trace decoded with times as text)
                elif t1 is not int or not -ts_max <= ts <= ts_max:
                    raise _Unusual
            n_x += 1
            name = e.name
            if name is None:
                name = ""
            args = e.args
            if kind is not None:
                if args is None:
                    raise _Unusual
                dev, stream, corr = args.device, args.stream, args.correlation
                if type(dev) is not int or type(stream) is not int or type(corr) is not int:
                    raise _Unusual  # (no device, stream or id: the event's pid / tid, or flows, would be read)
                if not (-i64 <= dev < i64 and -i64 <= stream < i64 and 0 <= corr < i64):
                    raise _Unusual
                o_dev.append(dev)
                o_stream.append(stream)
                o_kind.append(kind)
                o_ts.append(ts)
                o_dur.append(dur)
                o_corr.append(corr)
                if kind == KERNEL:
                    o_bytes.append(-1)
                    if "ccl" in name and (name.startswith(("nccl", "hccl")) or "ncclKernel" in name
                                          or "ncclDevKernel" in name):
                        o_comm.append(len(o_ts) - 1)
                    o_names.append("")
                else:
                    b = args.bytes
                    if b is None:
                        b = -1
                    elif not -i64 <= b < i64:
                        raise _Unusual
                    o_bytes.append(b)
                    o_names.append(name)
            elif cat in host_cats:
                nid = name_ids.get(name)
                if nid is None:
                    nid = name_ids[name] = len(name_ids)
                c_ts.append(ts)
                c_dur.append(dur)
                corr = -1 if args is None else args.correlation
                if corr is None:
                    corr = -1
                elif not -i64 <= corr < i64:
                    raise _Unusual
                c_corr.append(corr)
                c_name.append(nid)
            elif name.startswith("ProfilerStep#") and cat not in not_step:
                steps.append((ts, dur))
            elif cat in mark_cats:
                count_marker(name, marker_of, marks, mark_names)
        elif t is s_type and e.cat == "fwdbwd":  # autograd's forward -> backward links: a training step
            marks["backward_links"] = marks.get("backward_links", 0) + 1
    if not o_ts:
        raise _Unusual  # (no complete event or no GPU op: the loop words the error)
    out.n_x = n_x
    if text:
        out.texts = _one_shape(times)
        out.exact = True
    return out


def _one_shape(raws: list) -> tuple:
    """(digits, width, scale): the time texts joined without their dots when every one is a large number's
    text of one shape (what ``raw_value`` turns into ``Dec`` and ``kineto.us_to_ns`` converts from its digits:
    the same length, 13-16 ASCII digits, a dot, 1-3 more digits, at least 2**41 µs); ``scale`` the power of
    ten to ns."""
    if set(map(type, raws)) != {Raw}:
        raise _Unusual
    width = len(raws[0])
    if set(map(len, raws)) != {width}:
        raise _Unusual
    joined = b"".join(raws)
    n = len(raws)
    dot = joined.find(b".", 0, width)
    frac = width - dot - 1
    if not 13 <= dot <= 16 or not 1 <= frac <= 3:
        raise _Unusual
    if dot == 13 and min(map(bytes, raws)) < b"2199023255553":  # (2**41 + 1 µs: each a float's text below it)
        raise _Unusual
    if joined.count(b".") != n or joined[dot::width].count(b".") != n:
        raise _Unusual
    if dot == 16 and max(joined[0::width]) > 0x33:  # ns from 4e18 on: us_to_ns checks each against 2**62
        raise _Unusual
    digits = joined.replace(b".", b"")
    if not digits.isdigit():  # (bytes: ASCII digits only)
        raise _Unusual
    return digits, width - 1, 3 - frac


def texts_ns_at(texts: tuple, rows, np=None):
    """The ns of the time texts at ``rows`` (row numbers into ``texts``, from :func:`_one_shape`, which keeps
    them below 4e18, within ``us_to_ns``'s range): int64 with ``np`` (numpy: the digits summed column by column
    in uint64, exact below 10**19), else a list of ints."""
    digits, per, scale = texts
    if np is not None:
        rows = np.asarray(rows, dtype=np.intp)
        return digit_rows(np.frombuffer(digits, dtype=np.uint8).reshape(-1, per)[rows], scale, np).astype(np.int64)
    ns = [int(digits[i * per:(i + 1) * per]) for i in rows]
    if scale:
        m = 10 ** scale
        ns = [v * m for v in ns]
    return ns
