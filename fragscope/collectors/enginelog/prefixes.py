"""Line prefixes and timestamps: one physical line in, one or more records (message, time, pid) out.

A physical line can hold several records: vLLM's offline progress bar (tqdm) ends without a newline,
so the next log line is written right after it (``Processed prompts: …toks/s]INFO 06-16 21:24:15
metrics.py:341] …``), and interleaved writers glue two stats lines together (``…hit rate: 0.0%INFO
07-28 06:41:19 [loggers.py:118] Engine 000: …``). Each embedded vLLM header starts a record of its own
with its own timestamp. Formats: docs/logs.md#what-is-read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo

# Timestamps outside [1970, 9999) are not trusted (a corrupted or hostile prefix, "year 10000"):
# the record keeps the previous time instead, and nothing downstream meets a date it cannot print.
MIN_TS = 0.0
MAX_TS = 253370764800.0  # 9999-01-01T00:00:00Z

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SYSLOG_ANSI = re.compile(r"#033\[[0-9;?]*[A-Za-z]")
_BARE_SGR_PROC = re.compile(r"^\s*\[\d{1,2}(?:;\d{1,2})?m(\([^)]{1,120}\))\s*\[0m\s*")
# `kubectl logs --timestamps`: "2026-02-24T20:21:58.123456789Z " ; CI / SGLang: "[2026-02-24T20:21:58Z] ",
# "[2026-09-13 16:06:06] ", "[2026-09-13 16:06:06 TP0] ", "[2026-09-13 16:06:06 DP0 TP0] "
_ISO_BRACKET = re.compile(r"^\[(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d{1,12})?(Z|[+-]\d\d:?\d\d)?(?: [^\]]{0,40})?\]\s*")
_ISO_BARE = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d{1,12})?(Z|[+-]\d\d:?\d\d)?\s+")
# SGLang before its dated prefix (2024): "[04:40:55 TP0] ", "[16:43:29] " -- time of day only
_TIME_ONLY = re.compile(r"^\[(\d\d):(\d\d):(\d\d)(?:[.,]\d{1,9})?(?: [^\]]{0,40})?\]\s*")
# docker compose: "vllm-1  | "
# SGLang's rank tag alone, without a time ("[TP0] ", "[DP1 TP3] "): a paste with the time cut off, or a
# logging format without asctime
_RANK_ONLY = re.compile(r"^\[(?:(?:DP|TP|PP|EP|CP)\d{1,4} ?){1,5}\]\s*")
# Python logging's "[INFO] sglang.srt.managers.scheduler_metrics_mixin: " after an asctime prefix
_BRACKET_LEVEL = re.compile(r"^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\]\s+(?:[A-Za-z_][\w.]{0,120}:\s+)?")
# docker compose's "vllm-1  | ", and a bare "| " gutter (a CI log's web view copied: Buildkite prints one per line)
_COMPOSE_PREFIX = re.compile(r"^(?:[\w.\-]+\s+)?\|(?:\s|$)")
# "(APIServer pid=1) ", "(EngineCore_DP0 pid=199) ", "(RayWorkerWrapper pid=7106, ip=10.0.0.1) ",
# "(VllmWorker rank=0 pid=10672) "
_PROC = r"\(([A-Za-z][\w\-]*)(?: [\w\-]{1,20}=[\w.\-]{1,20}){0,3} pid=(\d{1,10})(?:,[^)]{0,80})?\)\s*"
_PROC_PREFIX = re.compile("^" + _PROC)
# vLLM header: "INFO 05-21 21:08:08 [gpu_model_runner.py:4879] " (V0 often "file.py:528] " without "[")
_LEVEL = r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
_HEADER = _LEVEL + r"\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d{1,9})?\s+\[?[\w./\-]{1,200}:\d{1,7}\]\s?"
_VLLM_HEADER = re.compile("^" + _HEADER)
# the same header anywhere in a line, with its optional process prefix (records glued together)
_EMBEDDED = re.compile(r"(?<![A-Za-z(])(?:" + _PROC + r")?" + _HEADER)
_EMBEDDED_HINT = re.compile(r"(?:DEBUG|INFO|WARN|ERROR|CRITICAL)\w*\s+\d\d-\d\d \d\d:")  # cheap pre-check
# Python logging default: "2024-05-01 12:00:00,123 - name - INFO - " is handled by _ISO_BARE; then:
_LEVEL_PREFIX = re.compile(r"^(?:-\s*)?(?:[\w.]+\s+-\s+)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)(?::|\s+-)?\s+")


_PREFIX_FIRST = frozenset("[(0123456789")  # the first character of every prefix the loop below strips


@dataclass(slots=True)
class Record:
    msg: str
    ts: float | None
    pid: int | None
    proc: str
    dated: bool = True  # False: the time came from a time-of-day-only prefix (date inferred)
    engine_line: bool = False  # a vLLM header or an SGLang/ISO prefix was seen: this is an engine log


def _ok(t: float | None) -> float | None:
    return t if t is not None and MIN_TS <= t < MAX_TS else None


class Clock:
    """Turns the prefixes' partial times into unix seconds.

    ``MM-DD HH:MM:SS`` has no year: take the latest year that does not put the line more than two
    days after ``ref`` (a December line read in January lands in last year). ``HH:MM:SS`` has no
    date: take the previous record's date (a step back of more than 12 h is midnight passing), else
    the reference's date. Times without a zone are read in ``tz``.
    """

    def __init__(self, ref: float, tz: tzinfo) -> None:
        self.tz = tz
        ref = min(max(ref, 86400.0 * 3), MAX_TS - 86400.0 * 400)  # room for the +2 days / year search
        self.ref = datetime.fromtimestamp(ref, tz=tz)

    def month_day(self, month: int, day: int, hms: tuple[int, int, int]) -> float | None:
        limit = self.ref + timedelta(days=2)
        for year in range(self.ref.year + 1, self.ref.year - 5, -1):
            try:
                d = datetime(year, month, day, *hms, tzinfo=self.tz)
            except (ValueError, OverflowError):  # 02-29 in a non-leap year, or garbage
                continue
            if d <= limit:
                return _ok(d.timestamp())
        return None

    def time_of_day(self, hms: tuple[int, int, int], last: float | None) -> float | None:
        try:
            base = datetime.fromtimestamp(last, tz=self.tz) if last is not None else self.ref
            d = base.replace(hour=hms[0], minute=hms[1], second=hms[2], microsecond=0)
        except (ValueError, OverflowError, OSError):
            return None
        t = d.timestamp()
        if last is not None and t < last - 12 * 3600:
            t += 86400.0  # midnight passed
        elif last is None and t > self.ref.timestamp() + 3600:
            t -= 86400.0  # the file was last written earlier in the day than this time: yesterday
        return _ok(t)

    def iso(self, m: re.Match) -> float | None:
        try:
            d = datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S")
            frac = float("0." + m.group(3)[1:7]) if m.group(3) else 0.0
            z = m.group(4)
            if z is None:
                d = d.replace(tzinfo=self.tz)
            elif z == "Z":
                d = d.replace(tzinfo=timezone.utc)
            else:
                sign = 1 if z[0] == "+" else -1
                hh, mm = int(z[1:3]), int(z[-2:])
                d = d.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
            return _ok(d.timestamp() + frac)
        except (ValueError, OverflowError):  # month 13, offset +25:00, beyond year 9999
            return None


def _header_ts(m: re.Match, clock: Clock, first: int) -> float | None:
    mo, dd, hh, mi, ss = (int(m.group(i)) for i in range(first, first + 5))
    if not (1 <= mo <= 12 and 1 <= dd <= 31 and hh < 24 and mi < 60 and ss < 62):
        return None
    return clock.month_day(mo, dd, (hh, mi, min(ss, 59)))


def split_line(line: str, clock: Clock, last_ts: float | None) -> list[Record]:
    """The records in one physical line, prefixes stripped; ``ts`` None where the line has none."""
    s = line.rstrip("\r\n")
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    if "#033[" in s:  # rsyslog / journald print the escape byte as "#033"
        s = _SYSLOG_ANSI.sub("", s)
    # Ray's colours with the escape byte lost in a paste: " [36m(RayWorkerVllm pid=5085) [0m [E …"
    if s[:1] in " [" and "m(" in s[:12]:
        m = _BARE_SGR_PROC.match(s)
        if m:
            s = m.group(1) + " " + s[m.end():]
    s = s.strip()
    ts: float | None = None
    pid: int | None = None
    proc = ""
    dated = True
    engine = False
    if "|" in s[:80]:
        m = _COMPOSE_PREFIX.match(s)
        if m and not s.startswith(("INFO", "WARNING", "ERROR", "DEBUG")):
            s = s[m.end():]
    for _ in range(3 if s[:1] in _PREFIX_FIRST else 0):  # prefixes stack: "[iso] (EngineCore pid=1) INFO 05-21 ..."
        m = _ISO_BRACKET.match(s) or _ISO_BARE.match(s)
        if m:
            ts = clock.iso(m) or ts
            s = s[m.end():]
            engine = engine or s.startswith(("Decode batch", "Prefill batch"))
            continue
        m = _TIME_ONLY.match(s)
        if m:
            hms = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            if hms[0] < 24 and hms[1] < 60 and hms[2] < 60:
                ts, dated, engine = clock.time_of_day(hms, last_ts), False, True
                s = s[m.end():]
                continue
        m = _PROC_PREFIX.match(s)
        if m:
            proc, pid = m.group(1), int(m.group(2))
            s = s[m.end():]
            continue
        m = _RANK_ONLY.match(s) or (_BRACKET_LEVEL.match(s) if ts is not None else None)
        if m:
            s = s[m.end():]
            engine = engine or s.startswith(("Decode batch", "Prefill batch"))
            continue
        break
    m = _VLLM_HEADER.match(s)
    if m:
        engine = True
        t = _header_ts(m, clock, 2)
        if ts is None:  # an ISO prefix (with a year) is more precise than MM-DD
            ts, dated = t, True
        s = s[m.end():]
    else:
        m = _LEVEL_PREFIX.match(s)
        if m and ts is not None:
            s = s[m.end():]
    first = Record(s, ts, pid, proc, dated, engine)
    if _EMBEDDED_HINT.search(s, 1) is None:
        return [first]
    cuts = [x for x in _EMBEDDED.finditer(s) if x.start() > 0]
    if not cuts:
        return [first]
    out = [Record(s[:cuts[0].start()].rstrip(), ts, pid, proc, dated, engine)]
    for i, x in enumerate(cuts):
        end = cuts[i + 1].start() if i + 1 < len(cuts) else len(s)
        t = _header_ts(x, clock, 4)
        xpid = int(x.group(2)) if x.group(2) else pid
        out.append(Record(s[x.end():end].rstrip(), t, xpid, x.group(1) or proc, True, True))
    return out
