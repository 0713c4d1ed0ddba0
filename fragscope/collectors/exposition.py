"""Prometheus text (0.0.4) and OpenMetrics parsing, streaming, for scrapes and recordings.

One parser serves live scrapes (no timestamps: the scrape time is used) and recordings
(OpenMetrics with timestamps in seconds, or the Prometheus text format with milliseconds).

Why not prometheus_client's parsers: its OpenMetrics parser rejects any histogram with two
timestamped points ("+Inf bucket missing"), so it cannot read long recordings, and its text
parser builds several Python objects per line (measured ~6x slower than this one on an 18 MB
recording: bench/bench_ingest.py). This parser keeps one cache entry per distinct series.
"""
from __future__ import annotations

import html
import io
import math
import re
from dataclasses import dataclass, field
from typing import Iterable

from ..model import Labels, Sample, SeriesKey, Window
from ..signals import DCGM_BLANK_THRESHOLD, SIGNALS, normalise_name
from .inputs import (ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES, MAX_FILE_BYTES, SNIFF_BYTES, GunzipCapped,
                     InputError, check_regular, describe_binary, describe_text, env_int, iter_lines, open_binary)
from .scrapes import GENERIC_PREFIXES, SegmentTracker, build_window, bulk_window


class ParseError(ValueError):
    """Input is not Prometheus/OpenMetrics text; the message is one line naming the problem."""


_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_NAME_START = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{|$)")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gcount", "_gsum")
# Timestamp units by magnitude (now is ~1.8e9 s): above 1e11 (the year 5138 in seconds) milliseconds,
# above 1e14 microseconds, above 1e17 nanoseconds; 1e20 and more is not a timestamp (a bad line).
# Every converted time is then below 1e11 s, so no date printed later is past the year 9999.
_MS_THRESHOLD = 1e11
_US_THRESHOLD = 1e14
_NS_THRESHOLD = 1e17
_TS_MAX = 1e20
# A run of this many lines without a sample (blank lines, comments, junk) is not metrics text: a gzip
# bomb of newlines stops here (~0.3 s) instead of at the decompression cap.
_MAX_LINES_WITHOUT_SAMPLE = 1_000_000
# Caps on what one input may hold (read_recording; raise with the environment variables). A point costs
# ~64 bytes while parsing (two Python floats in lists) and 16 in the window; a series ~1 KB. 10 M points
# is 60 times an 8-hour, 15 s recording of every signal (bench/bench_ingest.py: 165k points... lines).
MAX_SERIES = 1_000_000
MAX_POINTS = 20_000_000
ENV_MAX_SERIES = "FRAGSCOPE_MAX_SERIES"
ENV_MAX_POINTS = "FRAGSCOPE_MAX_POINTS"
# Give up when this many of the first lines are not metrics text (e.g. an HTML page, a binary).
_EARLY_BAD_LIMIT = 20
# ...or when more than this share of all sample lines are unparsable.
_BAD_RATIO_LIMIT = 0.05
# Scrapes (pastes): up to this many unparsable lines are skipped whatever their share (prose around
# a paste in a bug report: "When I run this command, I get the following results:").
_PASTE_BAD_LINES = 3
# A sample wrapped over more than this many lines is not rejoined.
_MAX_PIECES = 64


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")


def parse_labels(raw: str) -> Labels:
    """``a="1",b="x"`` -> (("a","1"),("b","x")). Raises ValueError on malformed input."""
    raw = raw.strip()
    if not raw:
        return ()
    out = []
    pos = 0
    n = len(raw)
    while pos < n:
        m = _LABEL_RE.match(raw, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad label set {{{raw[:80]}}}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


@dataclass
class Parsed:
    """Columns per series plus metadata gathered while parsing."""

    cols: dict[SeriesKey, tuple[list[float], list[float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # sample name -> family type
    lines: int = 0
    samples: int = 0
    bad_lines: int = 0
    first_bad: str | None = None
    saw_eof: bool = False
    saw_timestamps: bool = False
    openmetrics: bool = False
    openmetrics_ts: bool = False  # some timestamp was in seconds (the OpenMetrics convention)
    notes: list[str] = field(default_factory=list)
    saw_meta: bool = False  # a # HELP / # TYPE / # UNIT / # EOF line
    scrape_mode: bool = False  # samples without timestamps, read as scrapes (parse_lines(scrapes=True))
    segments: SegmentTracker | None = None  # the scrapes found (scrape mode)
    junk_lines: int = 0  # paste debris skipped: fences, the curl command, ellipses
    joined_lines: int = 0  # samples a wrapped paste had split over two lines
    bad_bounds: int = 0  # bucket / quantile series dropped: le or quantile not a number
    ts_units: set = field(default_factory=set)  # "microseconds", "nanoseconds" when converted
    ignored_timestamps: int = 0  # scrape mode: samples whose own timestamp was ignored
    truncated: bool = False  # the text ended inside a sample line

    def to_window(self, source: str = "") -> Window:
        w = bulk_window(self.cols, source=source, types=self.types)
        w.notes.extend(self.notes)
        if w.dropped_points:
            w.notes.append(f"{w.dropped_points} points dropped (NaN/Inf values or duplicate timestamps)")
        return w

    def samples_list(self) -> list[Sample]:
        out = []
        for key, (ts, vs) in self.cols.items():
            for t, v in zip(ts, vs):
                out.append(Sample(key.name, key.labels, t, v))
        return out


def _family_type(types: dict[str, str], family_types: dict[str, str], name: str) -> str:
    t = types.get(name)
    if t is not None:
        return t
    t = family_types.get(name)
    if t is None:
        for suf in _SUFFIXES:
            if name.endswith(suf):
                t = family_types.get(name[: -len(suf)])
                if t is not None:
                    break
    t = t or "untyped"
    types[name] = t
    return t


def parse_lines(lines: Iterable[str], default_ts: float | None = None, source: str = "input",
                keep_created: bool = False, key_cache: dict | None = None, *, scrapes: bool = False,
                max_series: int | None = None, max_points: int | None = None) -> Parsed:
    """Parse exposition text line by line.

    ``default_ts`` (unix seconds) applies to samples without a timestamp; when it is None such
    samples are an error (a recording must carry timestamps), unless ``scrapes``: then the first
    sample decides: with a timestamp the file is a recording (as above), without one it is one or
    more scrapes, each sample's time is its scrape's index (``Parsed.segments`` tells the scrapes
    apart; scrapes.build_window makes the window). ``key_cache``, a dict the caller keeps between
    scrapes, remembers each series line's parsed name and labels: a collector that scrapes the same
    ~600 series every second then skips the label parsing (~60 % of the cost). ``max_series`` and
    ``max_points`` stop the parse with a ParseError naming the cap.
    """
    p = Parsed()
    family_types: dict[str, str] = {}
    cache: dict[str, tuple | None] = {}
    cols = p.cols
    types = p.types
    bad = 0
    early_ok = 0
    lineno = 0
    # 0: not known yet; 1: recording (own timestamps); 2: scrapes without timestamps; 3: live scrape
    mode = 0 if scrapes else (1 if default_ts is None else 3)
    seg = SegmentTracker() if scrapes else None
    p.segments = seg
    pending: str | None = None  # an incomplete sample line (a paste wrapped by a browser or terminal)
    pending_no = 0
    pieces = 0
    last = None  # scrape mode: (entry, value text) of the last sample, for a value cut by a wrap
    after_comment = 0  # lines after a # HELP that may continue its text (a wrapped paste)
    since_sample = 0
    series_cap = max_series if max_series is not None else -1
    points_cap = max_points if max_points is not None else -1
    for line in lines:
        lineno += 1
        since_sample += 1
        if since_sample > _MAX_LINES_WITHOUT_SAMPLE:
            raise ParseError(f"{source}: {_MAX_LINES_WITHOUT_SAMPLE:,} lines in a row without a sample "
                             f"(line {lineno}): not metrics text")
        if not line or line == "\n":
            continue
        if line[0] in _PASTE_START:
            line = _depaste(line)
            if line is None:
                p.junk_lines += 1
                continue
            if line == "\n":
                continue
        if mode != 1 and "&" in line:
            line = _unescape_html(line)  # a paste copied from HTML source: &quot; &gt; &amp;
        if pending is not None:
            joined = _join_wrapped(pending, line)
            if joined is not None:
                line = joined
                p.joined_lines += 1
                pending = None
            elif pieces < _MAX_PIECES and line[0] != "#" and not _valid_sample(line):
                pending = pending.rstrip("\r\n") + line.strip(" \t\r\n")  # a third piece, and so on
                pieces += 1
                continue
            else:
                bad += 1
                if p.first_bad is None:
                    p.first_bad = f"line {pending_no}: incomplete sample: {pending.strip()[:80]!r}"
                pending = None
        if mode != 1 and line[0] in "HT" and line.startswith(("HELP ", "TYPE ")):
            line = "# " + line  # a paste where markdown ate the "# " (a heading inside a quote)
        if line[0] == "#":
            if mode != 1:  # free text: a wrap continues it on the next lines (~300 characters at 80 columns)
                after_comment = 3 if line.startswith("# HELP") else 0
            if line.startswith("# EOF") or line.startswith("#EOF"):
                p.saw_eof = True
                p.openmetrics = True
                p.saw_meta = True
                if mode == 2:
                    seg.eof()
                continue
            parts = line[1:].split(None, 3)
            if len(parts) >= 3 and parts[0] == "TYPE":
                fam = normalise_name(parts[1])
                family_types[fam] = parts[2].strip().lower()
                early_ok += 1
                p.saw_meta = True
                if seg is not None and mode != 1:
                    seg.meta("TYPE", fam)
            elif parts and parts[0] in ("HELP", "UNIT"):
                early_ok += 1
                p.saw_meta = True
                if seg is not None and mode != 1 and parts[0] == "HELP" and len(parts) >= 2:
                    seg.meta("HELP", normalise_name(parts[1]))
            elif line.startswith("#HELP") or line.startswith("#TYPE"):  # old Triton: no space
                seg_ = line[5:].split(None, 2)
                if line.startswith("#TYPE") and len(seg_) >= 2:
                    family_types[normalise_name(seg_[0])] = seg_[1].strip().lower()
                early_ok += 1
                p.saw_meta = True
            continue
        if p.saw_eof and mode != 2:
            continue  # nothing is allowed after # EOF; ignore trailing garbage quietly
        if after_comment:
            continues_comment, cont_left, after_comment = True, after_comment - 1, 0
        else:
            continues_comment, cont_left = False, 0
        # --- a sample line ------------------------------------------------------------------
        brace = line.find("{")
        try:
            if brace >= 0:
                close = line.rfind("}")
                if close < brace:
                    if mode != 1 and _could_continue(line):
                        pending, pending_no, pieces = line, lineno, 2
                        continue
                    raise ValueError("unbalanced braces")
                head = line[: close + 1]
                rest = line[close + 1:].split()
            else:
                parts = line.split()
                head = parts[0]
                rest = parts[1:]
            if not rest or len(rest) > 3:
                if not rest and mode != 1 and continues_comment and len(parts) <= 1:
                    p.junk_lines += 1  # the rest of a # HELP line that a wrap moved to its own line
                    after_comment = cont_left
                    continue
                if not rest and mode != 1 and _could_continue(line):
                    pending, pending_no, pieces = line, lineno, 2
                    continue
                raise ValueError("expected 'name value [timestamp]'")
            entry = cache.get(head, False)
            if entry is False:
                known = key_cache.get(head) if key_cache is not None else None
                if known is not None:
                    name, labels = known
                else:
                    if brace >= 0:
                        name = head[:brace].strip()
                        labels = parse_labels(head[brace + 1: -1])
                    else:
                        name = head
                        labels = ()
                    if not _NAME_RE.match(name):
                        raise ValueError(f"bad metric name {name[:60]!r}")
                    name = normalise_name(name)
                    if key_cache is not None:
                        if len(key_cache) > 50_000:  # label churn (e.g. request ids): stay bounded
                            key_cache.clear()
                        key_cache[head] = (name, labels)
                t = _family_type(types, family_types, name)
                if not keep_created and name.endswith("_created") and t in ("counter", "histogram", "summary", "gaugehistogram"):
                    entry = None
                elif labels and (t == "summary" or name.endswith("_bucket")) and _bad_bound(name, labels):
                    entry = None
                    p.bad_bounds += 1
                else:
                    key = SeriesKey(name, labels)
                    col = cols.get(key)
                    if col is None:
                        if len(cols) == series_cap:
                            raise ParseError(
                                f"{source}: more than {series_cap:,} series (line {lineno}): the cap on series "
                                f"per input; raise it with {ENV_MAX_SERIES}=N if the file is genuine")
                        col = cols[key] = ([], [])
                    entry = (key, col[0], col[1], name.startswith(GENERIC_PREFIXES))
                cache[head] = entry
            value = float(rest[0])
            has_ts = len(rest) >= 2 and not rest[1].startswith("#")
            if mode == 0:
                mode = 1 if has_ts else 2
                if mode == 1:
                    p.segments = seg = None
            if mode == 2:
                if has_ts:
                    p.ignored_timestamps += 1
                ts = 0.0  # set below, once the series is known
            elif has_ts:
                ts = float(rest[1])
                if ts > _MS_THRESHOLD:
                    if ts < _US_THRESHOLD:
                        ts /= 1000.0
                    else:
                        ts = _big_timestamp(ts, p)
                elif ts >= 0.0:
                    p.openmetrics_ts = True
                else:
                    raise ValueError("timestamp before 1970 or not a number")
                p.saw_timestamps = True
            else:
                if default_ts is None:
                    raise ParseError(f"{source}: line {lineno}: sample without a timestamp in a recording "
                                     "(record with timestamps, or diagnose a live endpoint)")
                ts = default_ts
        except ParseError:
            raise
        except (ValueError, IndexError) as e:
            if mode == 2 and last is not None and _NUM_TAIL.match(line):
                # a wrap cut the last sample's value: "...} 1.7740114" + "61287601e+09"
                try:
                    fixed = float(last[1] + line.strip())
                except ValueError:
                    pass
                else:
                    last[0][2][-1] = fixed
                    p.joined_lines += 1
                    last = None
                    continue
            if mode != 1 and (continues_comment or _is_debris(line)):
                p.junk_lines += 1
                after_comment = cont_left if continues_comment else 0
                continue
            bad += 1
            if p.first_bad is None:
                p.first_bad = f"line {lineno}: {e}: {line.strip()[:80]!r}"
            if early_ok == 0 and bad >= _EARLY_BAD_LIMIT:
                raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})") from None
            continue
        early_ok += 1
        since_sample = 0
        if entry is None:
            continue
        if entry[0].name.startswith("DCGM_") and value > DCGM_BLANK_THRESHOLD:
            continue  # DCGM blank sentinel: not available, not a value
        if mode == 2:
            ts = seg.sample(head, entry[0], entry[3], value)
            last = (entry, rest[0]) if len(rest) == 1 else None
        entry[1].append(ts)
        entry[2].append(value)
        p.samples += 1
        if p.samples == points_cap:
            raise ParseError(f"{source}: {points_cap:,} points reached (line {lineno}): the cap on points per "
                             f"input; raise it with {ENV_MAX_POINTS}=N if the file is genuine")
    if pending is not None:  # the text ends inside a sample: a paste or a download cut short
        p.notes.append(f"the text ends inside a sample (line {pending_no}: {pending.strip()[:60]!r}): "
                       "cut short; that sample is not read")
        p.truncated = True
    p.lines = lineno
    p.bad_lines = bad
    p.scrape_mode = mode == 2
    if p.samples == 0:
        if bad:
            raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})")
        raise ParseError(f"{source}: no samples (empty or comments only)")
    # A paste (scrapes) may carry a few lines of prose around the data ("here is the output:").
    allowed = _BAD_RATIO_LIMIT * (p.samples + bad)
    if p.scrape_mode:
        allowed = max(allowed, _PASTE_BAD_LINES)
    if bad and bad > allowed:
        raise ParseError(f"{source}: {bad} of {p.samples + bad} sample lines unparsable ({p.first_bad})")
    if bad:
        p.notes.append(f"{bad} unparsable lines skipped (first: {p.first_bad})")
    if p.bad_bounds:
        p.notes.append(f"{p.bad_bounds} histogram bucket / summary quantile series with a bound that is missing or "
                       "not a number (le=\"NaN\", le=\"\", ...) dropped")
    if p.ts_units:
        p.notes.append("timestamps in " + " and ".join(sorted(p.ts_units)) + " (by magnitude) converted to seconds")
    if p.joined_lines:
        p.notes.append(f"{p.joined_lines} sample lines split over two lines (a wrapped paste) joined")
    if p.ignored_timestamps:
        p.notes.append(f"{p.ignored_timestamps} samples carried their own timestamp in a file read as scrapes "
                       "(its first sample had none): those timestamps were ignored")
    return p


# --- paste repair (issue: /metrics pasted into bug reports) ------------------------------------
# First characters of lines that need cleaning before parsing: indentation, markdown quotes and
# fences, shell prompts, non-breaking spaces, a byte-order mark, HTML tags around code blocks.
_PASTE_START = frozenset(" \t>`~$\u00a0\ufeff<")
_FENCE = ("```", "~~~")
_HTML_TAG = re.compile(r"^</?(?:details|summary|pre|code|p|br|div|span|b|i)\b[^>]*>.*$", re.I)
_COMMAND = re.compile(r"(?:^|\s)(?:curl|wget|http|kubectl|docker|oc|grep)\s|^\S*[$#%]\s|^\$\s*$")
_ELLIPSIS = re.compile(r"^\s*(?:\.{2,}|\u2026|\[(?:\.{3}|\u2026|snip|truncated)[^\]]*\])\s*$", re.I)
_NUM_TAIL = re.compile(r"^\s*[0-9.eE+\-]+\s*$")
_ENTITY = re.compile(r"&(?:quot|gt|lt|amp|apos|#\d{1,7}|#[xX][0-9a-fA-F]{1,6});")


def _depaste(line: str) -> str | None:
    """A line with paste debris around it cleaned, or None when the whole line is debris."""
    s = line.replace("\u00a0", " ").lstrip(" \t\ufeff")
    while s[:1] == ">":  # markdown quote, possibly nested
        s = s[1:].lstrip(" \t")
    if not s.strip():
        return "\n"
    if s.startswith(_FENCE) or _HTML_TAG.match(s.strip()):
        return None
    if s[0] == "`":  # inline code around a paste: "`# HELP ..."
        s = s.lstrip("`")
    if s[0] == "$" and (len(s) < 2 or s[1] in " \t\n"):
        return None  # a shell prompt line: "$ curl ... /metrics"
    return s


def _is_debris(line: str) -> bool:
    """A line of a paste that is not data and not worth an error: the command that made the scrape,
    an ellipsis where the reporter cut it, markdown or HTML around the code block."""
    s = line.strip()
    if not s:
        return True
    return bool(_COMMAND.search(s) or _ELLIPSIS.match(s) or _HTML_TAG.match(s) or s.startswith(_FENCE))


def _unescape_html(line: str) -> str:
    """Complete entities only (``&quot;``, not ``&quot`` which html.unescape also decodes): a wrap
    may cut an entity in two, and the join must see it whole."""
    if _ENTITY.search(line) is None:
        return line
    return _ENTITY.sub(lambda m: html.unescape(m.group(0)), line)


def _could_continue(line: str) -> bool:
    """An incomplete sample (a name or label set cut by a wrap): the next line may finish it."""
    s = line.strip()
    return bool(s) and len(s) < 4096 and bool(_NAME_START.match(s))


def _join_wrapped(first: str, second: str) -> str | None:
    """``first`` (incomplete) joined with ``second`` when that makes one valid sample line."""
    a = first.rstrip("\r\n")
    b = second.lstrip(" \t")
    for sep in ("", " "):
        cand = a + sep + b
        if "&" in cand:
            cand = _unescape_html(cand)  # an entity the wrap cut in two: "&quot" + ";"
        if _valid_sample(cand):
            return cand
    return None


def _valid_sample(line: str) -> bool:
    brace = line.find("{")
    try:
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                return False
            name = line[:brace].strip()
            parse_labels(line[brace + 1: close])
            rest = line[close + 1:].split()
        else:
            parts = line.split()
            if not parts:
                return False
            name, rest = parts[0], parts[1:]
        if not rest or len(rest) > 3 or not _NAME_RE.match(name):
            return False
        float(rest[0])
        return True
    except ValueError:
        return False


def _bad_bound(name: str, labels: Labels) -> bool:
    """A histogram bucket whose ``le`` is missing or not a number (NaN, empty, text), or a summary
    sample whose ``quantile`` is not a number: the series means nothing and would poison sorting by bound."""
    bucket = name.endswith("_bucket")
    bound = "le" if bucket else "quantile"
    for k, v in labels:
        if k == bound:
            try:
                f = float(v)
            except ValueError:
                return True
            return f != f  # NaN
    return bucket  # a bucket without le has no place in its histogram


def _big_timestamp(ts: float, p: Parsed) -> float:
    """Microseconds or nanoseconds since 1970, told by magnitude; beyond that, not a timestamp."""
    if ts < _NS_THRESHOLD:
        p.ts_units.add("microseconds")
        return ts / 1e6
    if ts < _TS_MAX:
        p.ts_units.add("nanoseconds")
        return ts / 1e9
    raise ValueError(f"timestamp {ts:.3g} out of range (not seconds, ms, µs or ns since 1970)")


def parse_text(text: str, default_ts: float | None, source: str = "scrape",
               key_cache: dict | None = None) -> Parsed:
    return parse_lines(io.StringIO(text), default_ts=default_ts, source=source, key_cache=key_cache)


def scrape_samples(text: str, ts: float, source: str = "scrape", key_cache: dict | None = None) -> list[Sample]:
    """A live scrape (no timestamps expected) -> samples stamped ``ts``."""
    return parse_text(text, ts, source, key_cache).samples_list()


# ---------------------------------------------------------------------------------------------
# Metric name prefixes of the exporters fragscope knows: a file without timestamps and without any
# # HELP/# TYPE line is read as a scrape only when it names one of these (else "key value" text such
# as a config would pass for metrics).
_KNOWN_PREFIXES = ("vllm:", "sglang:", "DCGM_", "fragscope_", "tgi_", "nv_", "trtllm_", "lmcache:")
_KNOWN_NAMES = frozenset(src.metric for sig in SIGNALS.values() for src in sig.sources)
# ParseErrors after which the file is looked at again to say what it is instead (a trace, a log...)
_SNIFF_AFTER = ("not Prometheus/OpenMetrics text", "no samples", "unparsable", "sample without a timestamp",
                "lines in a row without a sample")


def read_recording(path: str, scrape_interval_s: float | None = None, *, scrape_time: float | None = None,
                   max_series: int | None = None, max_points: int | None = None,
                   max_decompressed_bytes: int | None = None) -> Window:
    """Read a recording or scrapes: OpenMetrics / Prometheus text with timestamps, or one or more
    ``/metrics`` scrapes without them (a ``curl`` output, a paste from a bug report), gzipped or not.

    Scrapes without timestamps get synthetic times: the last one at ``scrape_time`` (default: the
    file's modification time), successive ones ``scrape_interval_s`` apart when given, else
    scrapes.ASSUMED_INTERVAL_S flagged as assumed (``window.scrape_interval_known``). The window says
    how its times were obtained (``timestamps``, ``scrapes``) and its notes what the scrapes can show.
    Raises ParseError with a one-line message naming the file and the problem (and, for a file that
    is something else, the command that reads it). Caps: keyword arguments, else the environment
    variables FRAGSCOPE_MAX_SERIES, FRAGSCOPE_MAX_POINTS, FRAGSCOPE_MAX_DECOMPRESSED_BYTES.
    """
    try:
        return _read(path, scrape_interval_s, scrape_time, max_series, max_points, max_decompressed_bytes)
    except InputError as e:
        raise ParseError(str(e)) from None


def _read(path: str, interval: float | None, scrape_time: float | None, max_series: int | None,
          max_points: int | None, max_decompressed: int | None) -> Window:
    if interval is not None and not (isinstance(interval, (int, float)) and math.isfinite(interval)
                                     and 0 < interval <= 86400):
        raise ParseError(f"scrape interval {interval!r}: expected a number of seconds in (0, 86400]")
    st = check_regular(path)
    if st.st_size == 0:
        raise ParseError(f"{path}: empty file")
    if st.st_size > MAX_FILE_BYTES:
        raise ParseError(f"{path}: {st.st_size} bytes is larger than the 4 GiB limit")
    series_cap = max_series or env_int(ENV_MAX_SERIES, MAX_SERIES)
    points_cap = max_points or env_int(ENV_MAX_POINTS, MAX_POINTS)
    cap = max_decompressed or env_int(ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES)
    fh = open_binary(path)
    try:
        gz = fh.peek(2)[:2] == b"\x1f\x8b"
        raw = io.BufferedReader(GunzipCapped(fh, cap, path), 1 << 16) if gz else fh
        what = describe_binary(raw.peek(16)[:16])
        if what:
            raise ParseError(f"{path}: {what.replace('FILE', path)}")
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None)
        try:
            p = parse_lines(iter_lines(text), default_ts=None, source=path, scrapes=True,
                            max_series=series_cap, max_points=points_cap)
        except UnicodeDecodeError:
            raise ParseError(f"{path}: not text (binary data that is not gzip); expected OpenMetrics or "
                             "Prometheus text with timestamps, or a /metrics scrape") from None
        except ParseError as e:
            if any(m in str(e) for m in _SNIFF_AFTER):
                what = describe_text(_head_text(path, gz, cap))
                if what:
                    raise ParseError(f"{path}: {what.replace('FILE', path)}") from None
            raise
        except EOFError:
            raise ParseError(f"{path}: truncated gzip stream") from None
    finally:
        fh.close()
    if p.scrape_mode:
        if not p.saw_meta and not any(k.name.startswith(_KNOWN_PREFIXES) or k.name in _KNOWN_NAMES
                                      for k in p.cols):
            first = next(iter(p.cols)).name
            raise ParseError(f"{path}: sample without a timestamp, and nothing marks the file as a /metrics scrape "
                             f"(no # HELP/# TYPE line, no metric fragscope reads; first: {first[:60]!r}); "
                             "save a whole scrape (curl -s URL/metrics > FILE) or record with timestamps")
        anchor = scrape_time if scrape_time is not None else st.st_mtime
        w = build_window(p.cols, p.types, p.segments, path, anchor, interval)
        w.notes[:0] = p.notes
    else:
        if p.openmetrics_ts and not p.saw_eof:
            p.notes.append(f"{path}: no '# EOF' line: the file may be truncated")
        if interval is not None:
            p.notes.append(f"scrape interval {interval:g} s ignored: the file carries its own timestamps")
        w = p.to_window(source=path)
        if not math.isfinite(w.start):
            raise ParseError(f"{path}: no finite sample values")
        return w
    if w.dropped_points:
        w.notes.append(f"{w.dropped_points} points dropped (NaN/Inf values or duplicate timestamps)")
    if not math.isfinite(w.start):
        raise ParseError(f"{path}: no finite sample values")
    return w


def _head_text(path: str, gz: bool, cap: int) -> str:
    """The decoded start of the file (for telling what it is after it failed to parse)."""
    try:
        fh = open_binary(path)
    except InputError:
        return ""
    try:
        raw = io.BufferedReader(GunzipCapped(fh, cap, path), 1 << 16) if gz else fh
        data = raw.read(SNIFF_BYTES)
    except (InputError, OSError):
        return ""
    finally:
        fh.close()
    return data.decode("utf-8", errors="replace")
