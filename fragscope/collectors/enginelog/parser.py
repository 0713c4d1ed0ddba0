"""LogParser: text lines in, :class:`LogEvent` records out (timestamps carried, repeats folded)."""
from __future__ import annotations

import time
from datetime import timezone, tzinfo
from typing import Iterable

from .events import LogEvent
from .patterns import parse_message
from .prefixes import Clock, split_line


class LogParser:
    """Stateful line parser: carries the last timestamp to lines without one, infers the year of
    ``MM-DD`` timestamps from ``reference`` (unix seconds; default now) and the date of ``HH:MM:SS``
    ones from the previous line, and folds repeats of the same OOM message (the worker, the engine
    core and the traceback each print it) into one event.

    Counters for the caller: ``line_no`` (physical lines fed), ``engine_lines`` (lines that carried an
    engine prefix: a vLLM header, an SGLang time prefix), ``undated_lines`` (records whose date was
    inferred from a time of day only).
    """

    OOM_REPEAT_SECONDS = 30.0  # same figures within this window: the same OOM printed again

    def __init__(self, reference: float | None = None, tz: tzinfo | None = None) -> None:
        self.tz = tz or timezone.utc
        self.set_reference(reference)
        self.line_no = 0
        self.engine_lines = 0
        self.undated_lines = 0
        self.last_ts: float | None = None
        self._last_oom: tuple | None = None
        self._last_oom_ts: float | None = None
        self._last_oom_event: LogEvent | None = None
        self._last_shortfall: tuple | None = None

    def set_reference(self, reference: float | None) -> None:
        self.clock = Clock(time.time() if reference is None else float(reference), self.tz)

    def feed(self, line: str) -> list[LogEvent]:
        self.line_no += 1
        if not line or line.isspace():
            return []
        events: list[LogEvent] = []
        counted = False
        for rec in split_line(line, self.clock, self.last_ts):
            if rec.engine_line and not counted:
                self.engine_lines += 1
                counted = True
            if rec.ts is not None:
                self.last_ts = rec.ts
                if not rec.dated:
                    self.undated_lines += 1
            ts = self.last_ts
            for kind, fields, engine, source in parse_message(rec.msg):
                if kind == "oom" and self._is_repeat_oom(fields, ts):
                    continue
                if kind == "startup_memory_shortfall":
                    sig = tuple(sorted(fields.items()))
                    if sig == self._last_shortfall:
                        continue
                    self._last_shortfall = sig
                ev = LogEvent(kind, ts, self.line_no, fields, engine, source, rec.msg[:400], rec.pid)
                if kind == "oom":
                    self._last_oom_event = ev
                events.append(ev)
        return events

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
