"""LogParser: text lines in, :class:`LogEvent` records out (timestamps carried, repeats folded)."""
from __future__ import annotations

import time
from datetime import timezone, tzinfo
from typing import Iterable

from .events import LogEvent
from .jobkind import note_markers
from .patterns import async_oom_complete, fill_async_oom, parse_message
from .prefixes import Clock, split_line
from .rejoin import MAX_LINES as REJOIN_MAX_LINES, best_join, has_head


# a line that opens a traceback or says the engine died (vLLM V0 async engine, V1 engine core)
CRASH_MARKERS = ("Traceback (most recent call last)", "Engine background task failed", "EngineDeadError",
                 "encountered a fatal error")

# the last field each engine prints on a stats line: a record without it may continue on the next line
_LAST_FIELD = {"vllm-v0": "kv_usage_ratio", "vllm-v1": "kv_usage_ratio", "sglang": "waiting"}


class LogParser:
    """Stateful line parser: carries the last timestamp to lines without one, infers the year of
    ``MM-DD`` timestamps from ``reference`` (unix seconds; default now) and the date of ``HH:MM:SS``
    ones from the previous line, and folds repeats of the same OOM message (the worker, the engine
    core and the traceback each print it) into one event.

    Counters for the caller: ``line_no`` (physical lines fed), ``engine_lines`` (lines that carried an
    engine prefix: a vLLM header, an SGLang time prefix), ``undated_lines`` (records whose date was
    inferred from a time of day only), ``job_markers`` (the kinds of job whose own text appeared: jobkind.py).
    """

    OOM_REPEAT_SECONDS = 30.0  # same figures within this window: the same OOM printed again

    def __init__(self, reference: float | None = None, tz: tzinfo | None = None) -> None:
        self.tz = tz or timezone.utc
        self.set_reference(reference)
        self.line_no = 0
        self.engine_lines = 0
        self.undated_lines = 0
        self.job_markers: set[str] = set()  # kinds of job whose own text was seen (jobkind.MARKERS)
        self.crash_lines: list[int] = []  # lines that open a traceback or say the engine died (first 16)
        self.last_ts: float | None = None
        self._last_oom: tuple | None = None
        self._last_oom_ts: float | None = None
        self._last_oom_event: LogEvent | None = None
        self._last_shortfall: tuple | None = None
        self._wrap: tuple[LogEvent, str] | None = None  # a stats record cut at the end of the previous line
        self._async: LogEvent | None = None  # a cudaMallocAsync OOM whose figures follow on the next lines
        self._async_lines = 0
        self.duplicate_ooms = 0  # cudaMallocAsync OOMs found to repeat the previous one once their figures were read
        # a message whose text goes on over the next lines (rejoin.py): its text so far, line, time and events
        self._held: tuple[str, int, float | None, int | None, list[LogEvent]] | None = None
        self._held_n = 0
        self._last_async: tuple | None = None  # (figures, ts, event) of the last complete one, for repeats

    def set_reference(self, reference: float | None) -> None:
        self.clock = Clock(time.time() if reference is None else float(reference), self.tz)

    def feed(self, line: str) -> list[LogEvent]:
        self.line_no += 1
        if not line or line.isspace():
            return []
        events: list[LogEvent] = []
        counted = False
        note_markers(line, self.job_markers, self.line_no)
        if len(self.crash_lines) < 16 and any(m in line for m in CRASH_MARKERS):
            self.crash_lines.append(self.line_no)
        recs = split_line(line, self.clock, self.last_ts)
        if self._async is not None and recs:
            if self._async_lines < 8 and fill_async_oom(self._async.fields, recs[0].msg):
                self._async_lines += 1
                if async_oom_complete(self._async.fields):
                    self._end_async()
                return []
            self._end_async()
        if self._held is not None and recs:
            r0 = recs[0]
            if (self._held_n < REJOIN_MAX_LINES and len(recs) == 1 and r0.ts is None and not r0.engine_line
                    and r0.pid is None and self._rejoin(r0.msg)):
                return self._rejoined
            self._held = None
        wrap, self._wrap = self._wrap, None
        if wrap is not None and recs and self._continues(wrap, recs[0]):
            recs = recs[1:]
        last_stats: tuple[LogEvent, str] | None = None
        for rec in recs:
            if rec.engine_line and not counted:
                self.engine_lines += 1
                counted = True
            if rec.ts is not None:
                self.last_ts = rec.ts
                if not rec.dated:
                    self.undated_lines += 1
            ts = self.last_ts
            last_stats = None
            for kind, fields, engine, source in parse_message(rec.msg):
                if kind == "oom" and async_oom_complete(fields) and self._is_repeat_oom(fields, ts):
                    continue
                if kind == "startup_memory_shortfall":
                    sig = tuple(sorted(fields.items()))
                    if sig == self._last_shortfall:
                        continue
                    self._last_shortfall = sig
                if kind in ("collective_timeout", "engine_dead", "host_oom_kill"):
                    fields["timestamped"] = rec.ts is not None  # else the time is the last line's that had one
                ev = LogEvent(kind, ts, self.line_no, fields, engine, source, rec.msg[:400], rec.pid)
                if kind == "oom":
                    self._last_oom_event = ev
                    if not async_oom_complete(fields):
                        self._async, self._async_lines = ev, 0
                if kind == "stats" and _LAST_FIELD.get(source, "") not in fields:
                    last_stats = (ev, rec.msg)
                events.append(ev)
        self._wrap = last_stats
        last = recs[-1] if recs else None
        if last is not None and has_head(last.msg):
            mine = [e for e in events if e.line_no == self.line_no and e.text == last.msg[:400]]
            self._held, self._held_n = (last.msg, self.line_no, self.last_ts, last.pid, mine), 0
        return events

    def _rejoin(self, cont: str) -> bool:
        """Join the held message with ``cont`` when that reads more of it: events already emitted for it are
        completed in place, new ones are emitted with the first line's number (``self._rejoined``)."""
        text, line_no, ts, pid, mine = self._held
        j = best_join(text, cont)
        if j is None:
            return False
        joined = j[0]
        self._rejoined = []
        for kind, fields, engine, source in parse_message(joined):
            old = next((e for e in mine if e.kind == kind), None)
            if old is not None:
                old.fields.clear()
                old.fields.update(fields)
                old.text = joined[:400]
                continue
            if kind == "oom" and self._is_repeat_oom(fields, ts):
                continue
            ev = LogEvent(kind, ts, line_no, fields, engine, source, joined[:400], pid)
            mine.append(ev)
            self._rejoined.append(ev)
        self._held, self._held_n = (joined, line_no, ts, pid, mine), self._held_n + 1
        return True

    def _end_async(self) -> None:
        """A cudaMallocAsync OOM's block ended: the same figures again within the repeat window (the exception
        and its traceback's last line each print it) are one OOM; the copy is marked ``duplicate``."""
        ev, self._async = self._async, None
        ev.fields.pop("_limit_label", None)
        sig = tuple(sorted((k, v) for k, v in ev.fields.items() if k != "repeats"))
        last = self._last_async
        if (last is not None and last[0] == sig and (ev.ts is None or last[1] is None
                                                     or abs(ev.ts - last[1]) <= self.OOM_REPEAT_SECONDS)):
            last[2].fields["repeats"] = last[2].fields.get("repeats", 1) + 1
            ev.fields["duplicate"] = True
            self.duplicate_ooms += 1  # already emitted (its figures came after it): counters subtract it
            return
        self._last_async = (sig, ev.ts, ev)

    @staticmethod
    def _continues(wrap: tuple[LogEvent, str], rec) -> bool:
        """A pasted line wrapped at the terminal's width ("Running: 32 r" / "eqs, Swapped: …"): the next
        physical line has no prefix of its own, and the two halves make a fuller record. The event
        already emitted is completed in place (LogState holds the same fields dict)."""
        if rec.ts is not None or rec.engine_line or rec.pid is not None or not rec.msg:
            return False
        ev, head = wrap
        for joined in (head + rec.msg, head + " " + rec.msg):
            found = parse_message(joined)
            if found and found[0][0] == ev.kind and len(found[0][1]) > len(ev.fields):
                ev.fields.clear()
                ev.fields.update(found[0][1])
                ev.text = joined[:400]
                return True
        return False

    def _is_repeat_oom(self, fields: dict, ts: float | None) -> bool:
        sig = tuple(sorted((k, v) for k, v in fields.items() if not isinstance(v, list)))
        repeat = (sig == self._last_oom and self._last_oom_event is not None
                  and (ts is None or self._last_oom_ts is None or abs(ts - self._last_oom_ts) <= self.OOM_REPEAT_SECONDS))
        if repeat:
            self._last_oom_event.fields["repeats"] = self._last_oom_event.fields.get("repeats", 1) + 1
            return True
        self._last_oom, self._last_oom_ts = sig, ts
        return False


def parse_log_line(line: str, reference: float | None = None, tz: tzinfo | None = None) -> LogEvent | None:
    """The first event on one line (None if the line holds nothing fragscope reads).

    A line without a timestamp gets ``ts=None``; :func:`parse_log` carries the previous one.
    """
    ev = LogParser(reference, tz).feed(line)
    return ev[0] if ev else None


def parse_log(lines: Iterable[str], reference: float | None = None, tz: tzinfo | None = None) -> list[LogEvent]:
    """Every event in ``lines`` (an open file works), in order, timestamps carried forward."""
    p = LogParser(reference, tz)
    out: list[LogEvent] = []
    for line in lines:
        out.extend(p.feed(line))
    return out
