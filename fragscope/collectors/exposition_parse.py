"""The streaming line parser: Prometheus text (0.0.4) and OpenMetrics lines -> columns per series.

``parse_lines`` serves live scrapes (no timestamps: the scrape time is used), recordings (timestamps in
seconds, OpenMetrics, or milliseconds, Prometheus text) and pastes of scrapes (``scrapes=True``). One
cache entry per distinct series line head; recordings' well-formed lines take a fast path (one
``rsplit`` and a dict hit; bench/bench_ingest.py, figures in docs/performance.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..model import Sample, SeriesKey, Window
from ..signals import DCGM_BLANK_THRESHOLD, normalise_name
from .exposition_paste import (NUM_TAIL, PASTE_START, could_continue, depaste, is_debris, join_wrapped,
                               table_row, unescape_html)
from .exposition_syntax import (MS_THRESHOLD, NAME_RE, US_THRESHOLD, ENV_MAX_POINTS, ENV_MAX_SERIES,
                                ParseError, bad_bound, big_timestamp, family_type, valid_sample, parse_labels)
from .inputs import MAX_LINE_CHARS, OVERLONG
from .segments import GENERIC_PREFIXES, SegmentTracker

# A run of this many lines without a sample (blank lines, comments, junk) is not metrics text: a gzip
# bomb of newlines stops here (~0.3 s) instead of at the decompression cap.
MAX_LINES_WITHOUT_SAMPLE = 1_000_000
# Give up when this many of the first lines are not metrics text (e.g. an HTML page, a binary).
_EARLY_BAD_LIMIT = 20
# ...or when more than this share of all sample lines are unparsable.
_BAD_RATIO_LIMIT = 0.05
# Scrapes (pastes): up to this many unparsable lines are skipped whatever their share (prose around
# a paste in a bug report: "When I run this command, I get the following results:").
_PASTE_BAD_LINES = 3
# A sample wrapped over more than this many lines is not rejoined.
_MAX_PIECES = 64
# Live scrapes' caches of parsed series heads (key_cache, LineCache): entries, and the longest head kept
# (a vLLM V1 page has ~600 series lines of ~100 bytes; a page whose labels churn, or one 3.9 MB label
# value, must not be memoised: ~8,192 entries of at most 4 KiB stay under a few MB).
MAX_KEY_CACHE = 8192
# Recordings' distinct timestamp texts remembered by the fast path (a week at 15 s is 40,320; ~7 MB at most).
MAX_TS_SEEN = 65536
MAX_CACHED_HEAD = 4096
# Series lines one live scrape parses (collectors/vllm.py, dcgm.py), twice the agent's series per collector:
# a vLLM V1 engine keeps ~200, a dcgm-exporter of 8 GPUs ~400. Past it only lines of series already known are
# read, the rest counted
# (a page of 40,000 churning series parsed in full made ~20 MB of short-lived objects a scrape, whose
# few survivors kept the allocator's arenas from being returned: 110 MB RSS after the churn stopped).
MAX_KEPT_LINES = 4096


# The longest series line a live scrape reads (a vLLM line is ~100-900 bytes; the agent keeps label values
# of at most 2 KiB anyway, agent/budget.py): one 3.9 MB label value cost a 717 MB peak through the old
# label regex and still ~40 MB of copies through the parse.
MAX_SCRAPE_LINE = 16384


def keep_line(kept: list, line: str, line_cache: "LineCache | None", counts: dict | None) -> None:
    """Append ``line`` to ``kept`` while under MAX_KEPT_LINES, or past it when its series is known to
    ``line_cache``; otherwise count it in ``counts["line_limit"]``. A line longer than MAX_SCRAPE_LINE is
    counted in ``counts["line_length"]``, never parsed."""
    if len(line) > MAX_SCRAPE_LINE:
        if counts is not None:
            counts["line_length"] = counts.get("line_length", 0) + 1
        return
    if len(kept) < MAX_KEPT_LINES or (line_cache is not None and line.rsplit(None, 1)[0] in line_cache.heads):
        kept.append(line)
    elif counts is not None:
        counts["line_limit"] = counts.get("line_limit", 0) + 1


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
    table_rows: int = 0  # "series | value" rows of a query result's table (Prometheus' web UI, in markdown)
    bad_bounds: int = 0  # bucket / quantile series dropped: le or quantile not a number
    ts_units: set = field(default_factory=set)  # "microseconds", "nanoseconds" when converted
    ignored_timestamps: int = 0  # scrape mode: samples whose own timestamp was ignored
    truncated: bool = False  # the text ended inside a sample line
    tail_without_sample: int = 0  # lines after the last sample

    def to_window(self, source: str = "") -> Window:
        from .scrapes import bulk_window  # (numpy: not imported with the parser, see collectors/segments.py)

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


# Live scrapes: a collector's LineCache maps a series line's head (the text before its value) to what the
# parser made of that head, so that the next scrape of the same page reads each line with one rsplit, one
# dict hit and one float (LineCache.scrape). The parser's outcome for a head (name, labels, dropped) depends
# on the head alone once no # TYPE line is in play, which is why it learns only then.
_DROP = ("", (), 0, False)  # a head whose lines are not read (not kept by the collector, a bad bound)


class LineCache:
    """What the parser made of each series line of a collector's pages, for :meth:`scrape`.

    Bounded: at most ``max_heads`` heads, ~250 bytes each; when full it starts again (a hostile page whose
    labels change every scrape refills it; a page with more distinct lines than that gains nothing from it
    and costs one dict store a line, on top of the full parse it takes anyway).
    Only for the sample lines a collector picks out of its pages by a name-prefix regex: the caller hands
    :meth:`scrape` those same lines, and falls back to the full parser whenever it returns None.
    """

    __slots__ = ("heads", "series", "max_heads", "scrapes")

    def __init__(self, max_heads: int = 8192) -> None:
        self.heads: dict[str, tuple] = {}  # head -> series entry (name, labels, [last scrape], dcgm) or _DROP
        self.series: dict[tuple, tuple] = {}  # (name, labels) -> its entry, shared by heads naming the same series
        self.max_heads = max_heads
        self.scrapes = 0

    def learn(self, head: str, key: SeriesKey | None) -> None:
        """``head`` as the full parser took it (mode 3, no # TYPE line seen) and the series it names (None:
        dropped). Only heads a raw line can be read back by (:meth:`scrape`) are kept: not starting like a
        paste or a comment, no ``&`` (the parser unescapes HTML in such lines)."""
        if (len(head) > MAX_CACHED_HEAD or head[0] in PASTE_START or head[0] == "#" or "&" in head
                or head.startswith(("HELP ", "TYPE "))):
            return
        if len(self.heads) >= self.max_heads:
            self.clear()
        if key is None:
            self.heads[head] = _DROP
            return
        sk = (key.name, key.labels)
        e = self.series.get(sk)
        if e is None:
            e = self.series[sk] = (key.name, key.labels, [0], key.name.startswith("DCGM_"))
        self.heads[head] = e

    def drop(self, line: str) -> None:
        """A line whose series the collector does not keep, by its name alone (the name is in the head)."""
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and len(parts[0]) <= MAX_CACHED_HEAD:
            if len(self.heads) >= self.max_heads:
                self.clear()
            self.heads[parts[0]] = _DROP

    def clear(self) -> None:
        self.heads.clear()
        self.series.clear()

    def scrape(self, matches: Iterable, ts: float, group: int = 0) -> list[Sample] | None:
        """The samples of the lines ``matches`` hold (``re.Match`` objects, each line as its ``group``; the
        lines the collector's full path reads, in page order), read through the learnt heads; exactly
        what the full parser gives for those lines (same samples, same order), or None when it cannot
        tell (a line not seen before, a value that is not a number, a series twice in one scrape, nothing
        kept): then the caller runs the full parser.

        Why it is the same: a learnt head is what the parser takes as the head (the text up to its last
        ``}``, or its one word), and a value that ``float`` reads holds no ``}``, space or ``&``: the parser
        takes such a line's head and single value exactly so, and its outcome depends on the head alone."""
        heads = self.heads
        self.scrapes += 1
        now = self.scrapes
        out: list[Sample] = []
        for m in matches:
            parts = m.group(group).rsplit(None, 1)
            if len(parts) != 2:
                return None
            e = heads.get(parts[0])
            if e is None:
                return None
            if e is _DROP:
                continue
            try:
                value = float(parts[1])
            except ValueError:
                return None
            if e[3] and value > DCGM_BLANK_THRESHOLD:
                continue  # DCGM blank sentinel, as the parser drops it
            seen = e[2]
            if seen[0] == now:
                return None  # the parser groups a repeated series' points together
            seen[0] = now
            out.append(Sample(e[0], e[1], ts, value))
        return out or None


def parse_lines(lines: Iterable[str], default_ts: float | None = None, source: str = "input",
                keep_created: bool = False, key_cache: dict | None = None, *, scrapes: bool = False,
                max_series: int | None = None, max_points: int | None = None,
                max_lines_without_sample: int = MAX_LINES_WITHOUT_SAMPLE,
                line_cache: LineCache | None = None, families: dict[str, str] | None = None) -> Parsed:
    """Parse exposition text line by line.

    ``default_ts`` (unix seconds) applies to samples without a timestamp; when it is None such
    samples are an error (a recording must carry timestamps), unless ``scrapes``: then the first
    sample decides: with a timestamp the file is a recording (as above), without one it is one or
    more scrapes, each sample's time is its scrape's index (``Parsed.segments`` tells the scrapes
    apart; scrapes.build_window makes the window). ``key_cache``, a dict the caller keeps between
    scrapes, remembers each series line's parsed name and labels: a collector that scrapes the same
    ~600 series every second then skips the label parsing (~60 % of the cost). ``max_series`` and
    ``max_points`` stop the parse with a ParseError naming the cap, as does a run of
    ``max_lines_without_sample`` lines without a sample. ``line_cache`` (live scrapes only) learns each
    new series head for :meth:`LineCache.scrape`. ``families``: the family types declared before the first
    line (:func:`declared_types`; the lines are the rest of a file, collectors/prefetch.py).
    """
    p = Parsed()  # p.bad_lines counts the unparsable lines as they come
    family_types: dict[str, str] = dict(families) if families else {}
    cache: dict[str, tuple | None] = {}
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
    samples = 0
    # Recordings: a line "HEAD VALUE TIMESTAMP" whose head is a series already seen takes the fast path
    # below (one rsplit, one dict hit, two floats); anything else (a new series, a comment, a timestamp
    # that needs more than the millisecond conversion, a bad line) falls through to the full parser.
    fast = mode == 1
    ts_seen: dict[str, float] = {}
    learn = line_cache if mode == 3 else None
    om_ts = False  # a fast-path timestamp was in seconds (Parsed.openmetrics_ts)
    last_head, last_entry = None, None  # the fast path's last series line head and its cache entry
    it = iter(lines)
    end = object()
    while True:
        if fast and since_sample < max_lines_without_sample:
            # The recording's run of samples of series already seen, in this inner loop: one rsplit on " ",
            # a dict hit, a float (the timestamp's text read once). A line that is anything else ends the run
            # and goes to the full parser below (a head before other whitespace, or a trailing one, is not a
            # cached head: each cached head is the full parser's, which ends in "}" or a name).
            run_from = lineno
            for line in it:
                lineno += 1
                parts = line.rsplit(" ", 2)
                if len(parts) != 3:
                    break
                head = parts[0]
                if head != last_head:
                    entry = cache.get(head, False)
                    if entry is False:
                        break
                    last_head, last_entry = head, entry
                else:
                    entry = last_entry
                ts = ts_seen.get(parts[2])
                try:
                    value = float(parts[1])
                    if ts is None:
                        ts = float(parts[2])
                        if ts > MS_THRESHOLD:
                            ts = ts / 1000.0 if ts < US_THRESHOLD else -1.0
                        elif ts >= 0.0:
                            om_ts = True
                        if len(ts_seen) >= MAX_TS_SEEN:
                            ts_seen.clear()
                        ts_seen[parts[2]] = ts
                except ValueError:
                    break  # the full parser says what is wrong
                if ts < 0.0 or ts != ts:
                    break
                if entry is None or (entry[4] and value > DCGM_BLANK_THRESHOLD):
                    continue
                entry[1].append(ts)
                entry[2].append(value)
                samples += 1
                if samples == points_cap:
                    raise points_reached(source, points_cap, lineno)
            else:
                if lineno > run_from:
                    early_ok += lineno - run_from
                    since_sample = 0
                break  # the end of the input
            if lineno - 1 > run_from:  # the samples before the line that ended the run
                early_ok += lineno - 1 - run_from
                since_sample = 0
        else:
            line = next(it, end)
            if line is end:
                break
            lineno += 1
        since_sample += 1
        if since_sample > max_lines_without_sample:
            raise ParseError(f"{source}: {max_lines_without_sample:,} lines in a row without a sample "
                             f"(line {lineno}): not metrics text")
        if not line or line == "\n":
            continue
        if line[0] in PASTE_START:
            line = depaste(line)
            if line is None:
                p.junk_lines += 1
                continue
            if line == "\n":
                continue
        if mode != 1 and "&" in line:
            line = unescape_html(line)  # a paste copied from HTML source: &quot; &gt; &amp;
        if pending is not None:
            line, pending, pieces = next_piece(p, line, pending, pending_no, pieces)
            if line is None:
                continue
        if mode != 1 and line[0] in "HT" and line.startswith(("HELP ", "TYPE ")):
            line = "# " + line  # a paste where markdown ate the "# " (a heading inside a quote)
        if line[0] == "#":
            if mode != 1:  # free text: a wrap continues it on the next lines (~300 characters at 80 columns)
                after_comment = 3 if line.startswith("# HELP") else 0
            if line.startswith("# EOF") or line.startswith("#EOF"):
                fast = False
                read_eof(p, seg if mode == 2 else None)
                continue
            early_ok += read_meta_line(line, p, family_types, seg if mode != 1 else None)
            continue
        if p.saw_eof and mode != 2:
            continue  # nothing is allowed after # EOF; ignore trailing garbage quietly
        if after_comment:
            continues_comment, cont_left, after_comment = True, after_comment - 1, 0
        else:
            continues_comment, cont_left = False, 0
        if (mode == 2 or mode == 0) and "|" in line:  # files without timestamps only: a query result's table
            # pasted from Prometheus' web UI
            row = table_row(line)
            if row is None:
                p.junk_lines += 1
                continue
            if row is not line:
                p.table_rows += 1
                line = row
        # --- a sample line ------------------------------------------------------------------
        brace = line.find("{")
        try:
            if brace >= 0:
                close = line.rfind("}")
                if close < brace:
                    if mode != 1 and could_continue(line):
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
                if not rest and mode != 1 and could_continue(line):
                    pending, pending_no, pieces = line, lineno, 2
                    continue
                raise ValueError("expected 'name value [timestamp]'")
            entry = cache.get(head, False)
            if entry is False:
                name, labels = series_name_labels(head, brace, key_cache)
                entry = series_entry(p, name, labels, family_types, keep_created, series_cap, source, lineno)
                cache[head] = entry
                if learn is not None and not family_types:
                    learn.learn(head, entry[0] if entry is not None else None)
            value = float(rest[0])
            has_ts = len(rest) >= 2 and not rest[1].startswith("#")
            if mode == 0:
                mode = 1 if has_ts else 2
                if mode == 1:
                    p.segments = seg = None
                    fast = True
            if mode == 2:
                if has_ts:
                    p.ignored_timestamps += 1
                ts = 0.0  # set below, once the series is known
            elif has_ts:
                ts = sample_time(p, rest[1])
            else:
                if default_ts is None:
                    raise ParseError(f"{source}: line {lineno}: sample without a timestamp in a recording "
                                     "(record with timestamps, or diagnose a live endpoint)")
                ts = default_ts
        except ParseError:
            raise
        except (ValueError, IndexError) as e:
            last, after_comment = refused_line(p, line, lineno, e, mode, last, continues_comment, cont_left,
                                               early_ok, source)
            continue
        early_ok += 1
        since_sample = 0
        if entry is None:
            continue
        if entry[4] and value > DCGM_BLANK_THRESHOLD:
            continue  # DCGM blank sentinel: not available, not a value
        if mode == 2:
            ts = seg.sample(head, entry[0], entry[3], value)
            last = (entry, rest[0]) if len(rest) == 1 else None
        entry[1].append(ts)
        entry[2].append(value)
        samples += 1
        if samples == points_cap:
            raise points_reached(source, points_cap, lineno)
    if pending is not None:  # the text ends inside a sample: a paste or a download cut short
        p.notes.append(f"the text ends inside a sample (line {pending_no}: {pending.strip()[:60]!r}): "
                       "cut short; that sample is not read")
        p.truncated = True
    p.lines = lineno
    p.tail_without_sample = since_sample
    p.openmetrics_ts = p.openmetrics_ts or om_ts
    p.samples = samples
    p.scrape_mode = mode == 2
    check_and_note(p, source)
    return p


def points_reached(source: str, cap: int, lineno: int) -> ParseError:
    """The error that stops a parse at its cap on points."""
    return ParseError(f"{source}: {cap:,} points reached (line {lineno}): the cap on points per input; raise it "
                      f"with {ENV_MAX_POINTS}=N if the file is genuine")


def next_piece(p: Parsed, line: str, pending: str, pending_no: int, pieces: int) -> tuple[str | None, str | None, int]:
    """The line after an incomplete sample (a paste wrapped by a browser or terminal): the two joined when they
    make one sample; a further piece kept pending (up to _MAX_PIECES) while it is no sample of its own;
    otherwise the pending text counts as an unparsable line and ``line`` is read by itself. Returns (the line to
    read, or None when it was taken as a piece; what stays pending; the pieces so far)."""
    joined = join_wrapped(pending, line)
    if joined is not None:
        p.joined_lines += 1
        return joined, None, pieces
    if pieces < _MAX_PIECES and line[0] != "#" and not valid_sample(line):
        return None, pending.rstrip("\r\n") + line.strip(" \t\r\n"), pieces + 1  # a third piece, and so on
    p.bad_lines += 1
    if p.first_bad is None:
        p.first_bad = f"line {pending_no}: incomplete sample: {pending.strip()[:80]!r}"
    return line, None, pieces


def sample_time(p: Parsed, text: str) -> float:
    """A sample's own timestamp in seconds: OpenMetrics seconds as they are, Prometheus text's milliseconds
    (and microseconds or nanoseconds, by magnitude: noted in ``p.ts_units``) converted; negative or not a
    number is a ValueError."""
    ts = float(text)
    if ts > MS_THRESHOLD:
        if ts < US_THRESHOLD:
            ts /= 1000.0
        else:
            ts = big_timestamp(ts, p.ts_units)
    elif ts >= 0.0:
        p.openmetrics_ts = True
    else:
        raise ValueError("timestamp before 1970 or not a number")
    p.saw_timestamps = True
    return ts


def refused_line(p: Parsed, line: str, lineno: int, err: Exception, mode: int, last: tuple | None,
                 continues_comment: bool, cont_left: int, early_ok: int, source: str) -> tuple[tuple | None, int]:
    """A line the sample parser refused (``err``). In scrapes it may finish the last sample's value that a wrap
    cut ("...} 1.7740114" + "61287601e+09"); outside recordings it may be the rest of a wrapped # HELP line or
    paste debris (counted as junk); otherwise it is an unparsable line, and the first lines all being so is a
    ParseError (not metrics text). Returns the scrape's last sample (None once repaired) and the lines after
    a comment that may still continue it."""
    if mode == 2 and last is not None and NUM_TAIL.match(line):
        try:
            fixed = float(last[1] + line.strip())
        except ValueError:
            pass
        else:
            last[0][2][-1] = fixed
            p.joined_lines += 1
            return None, 0
    if mode != 1 and (continues_comment or is_debris(line)):
        p.junk_lines += 1
        return last, (cont_left if continues_comment else 0)
    p.bad_lines += 1
    if p.first_bad is None:
        p.first_bad = (f"line {lineno}: longer than {MAX_LINE_CHARS:,} characters, not a sample line"
                       if line == OVERLONG else f"line {lineno}: {err}: {line.strip()[:80]!r}")
    if early_ok == 0 and p.bad_lines >= _EARLY_BAD_LIMIT:
        raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})") from None
    return last, 0


def read_eof(p: Parsed, seg: SegmentTracker | None) -> None:
    """An OpenMetrics ``# EOF``: the text is OpenMetrics; in scrapes it closes one scrape."""
    p.saw_eof = True
    p.openmetrics = True
    p.saw_meta = True
    if seg is not None:
        seg.eof()


def read_meta_line(line: str, p: Parsed, family_types: dict[str, str], seg: SegmentTracker | None) -> int:
    """A comment line other than ``# EOF``: ``# TYPE`` records its family's type, ``# HELP`` / ``# UNIT``
    are noted (``seg``, outside recordings, sees TYPE and HELP to tell scrapes apart), as are old Triton's
    ``#HELP`` / ``#TYPE`` without a space. Returns 1 for such a metadata line, 0 for any other comment."""
    parts = line[1:].split(None, 3)
    if len(parts) >= 3 and parts[0] == "TYPE":
        fam = normalise_name(parts[1])
        family_types[fam] = parts[2].strip().lower()
        p.saw_meta = True
        if seg is not None:
            seg.meta("TYPE", fam)
        return 1
    if parts and parts[0] in ("HELP", "UNIT"):
        p.saw_meta = True
        if seg is not None and parts[0] == "HELP" and len(parts) >= 2:
            seg.meta("HELP", normalise_name(parts[1]))
        return 1
    if line.startswith("#HELP") or line.startswith("#TYPE"):  # old Triton: no space
        seg_ = line[5:].split(None, 2)
        if line.startswith("#TYPE") and len(seg_) >= 2:
            family_types[normalise_name(seg_[0])] = seg_[1].strip().lower()
        p.saw_meta = True
        return 1
    return 0


def series_name_labels(head: str, brace: int, key_cache: dict | None) -> tuple[str, tuple]:
    """The metric name and labels of a sample line's head (the text up to its last "}", or its first
    word), from ``key_cache`` when the caller's earlier scrapes saw it; a bad name is a ValueError."""
    known = key_cache.get(head) if key_cache is not None else None
    if known is not None:
        return known
    if brace >= 0:
        name = head[:brace].strip()
        labels = parse_labels(head[brace + 1: -1])
    else:
        name = head
        labels = ()
    if not NAME_RE.match(name):
        raise ValueError(f"bad metric name {name[:60]!r}")
    name = normalise_name(name)
    if key_cache is not None and len(head) <= MAX_CACHED_HEAD:
        if len(key_cache) >= MAX_KEY_CACHE:  # label churn (e.g. request ids): stay bounded
            key_cache.clear()
        key_cache[head] = (name, labels)
    return name, labels


def series_entry(p: Parsed, name: str, labels: tuple, family_types: dict[str, str], keep_created: bool,
                 series_cap: int, source: str, lineno: int) -> tuple | None:
    """The column a series' samples go to: (key, times, values, generic prefix?, DCGM?), or None for a
    series that is not kept (a ``_created`` family unless ``keep_created``; a bucket or quantile with a
    bad bound, counted in ``p.bad_bounds``). A new series past ``series_cap`` is a ParseError naming
    ``source`` and ``lineno``."""
    t = family_type(p.types, family_types, name)
    if not keep_created and name.endswith("_created") and t in ("counter", "histogram", "summary", "gaugehistogram"):
        return None
    if labels and (t == "summary" or name.endswith("_bucket")) and bad_bound(name, labels):
        p.bad_bounds += 1
        return None
    key = SeriesKey(name, labels)
    col = p.cols.get(key)
    if col is None:
        if len(p.cols) == series_cap:
            raise ParseError(f"{source}: more than {series_cap:,} series (line {lineno}): the cap on series "
                             f"per input; raise it with {ENV_MAX_SERIES}=N if the file is genuine")
        col = p.cols[key] = ([], [])
    return (key, col[0], col[1], name.startswith(GENERIC_PREFIXES), name.startswith("DCGM_"))


def declared_types(data) -> dict[str, str]:
    """The family types the comment lines of a recording's start ``data`` (bytes, or an mmap of them: UTF-8,
    any line ends) declare, as its parse leaves them. Only the comment lines are decoded."""
    families: dict[str, str] = {}
    scratch = Parsed()
    starts = [0] if data[:1] == b"#" else []
    cr = data.find(b"\r") >= 0
    for sep in (b"\n#", b"\r#") if cr else (b"\n#",):  # a comment line starts after a line end (\n, \r\n, \r)
        i = data.find(sep)
        while i >= 0:
            starts.append(i + 1)
            i = data.find(sep, i + 1)
    n = len(data)
    for start in sorted(starts):
        ends = [e for e in (data.find(b"\n", start), data.find(b"\r", start) if cr else -1) if e >= 0]
        line = bytes(data[start:min(ends) if ends else n]).decode("utf-8")
        if not line.startswith(("# EOF", "#EOF")):
            read_meta_line(line, scratch, families, None)
    return families


# What a part's parse may have met for the two parts to join into the whole file's parse: nothing noted,
# dropped, skipped or converted (a file with any of it is read whole: what its notes count spans both parts).
_CLEAN = ("bad_lines", "junk_lines", "joined_lines", "table_rows", "bad_bounds", "ignored_timestamps", "notes",
          "ts_units", "truncated", "scrape_mode")


def merge_parts(a: Parsed, b: Parsed, max_series: int, max_points: int,
                max_lines_without_sample: int) -> Parsed | None:
    """The parse of a whole recording from those of its first part ``a`` and the rest ``b`` (b parsed after
    a's family types, :func:`declared_types`): what parsing the file in one go gives, or None where the parts
    cannot tell (anything noted or dropped, ``a`` past an ``# EOF``, a name typed differently in the parts,
    the caps reached across the parts, a run of lines without samples across the cut); then the caller reads
    the file whole. ``a``'s columns (lists, or arrays as the read children hand them back) are extended in
    place and ``a`` returned; nothing is changed when None is returned."""
    if any(getattr(a, f) or getattr(b, f) for f in _CLEAN) or a.saw_eof or not a.samples or not b.samples:
        return None
    if a.samples + b.samples >= max_points > 0 or a.tail_without_sample >= max_lines_without_sample:
        return None
    if any(a.types[n] != t for n, t in b.types.items() if n in a.types):
        return None
    cols = a.cols
    if len(cols) + sum(k not in cols for k in b.cols) > max_series > 0:
        return None
    for k, (ts, vs) in b.cols.items():
        col = cols.get(k)
        if col is None:
            cols[k] = (ts, vs)
        else:
            col[0].extend(ts)
            col[1].extend(vs)
    for n, t in b.types.items():
        a.types.setdefault(n, t)
    a.lines += b.lines
    a.samples += b.samples
    a.tail_without_sample = b.tail_without_sample
    for f in ("saw_eof", "saw_timestamps", "openmetrics", "openmetrics_ts", "saw_meta"):
        setattr(a, f, getattr(a, f) or getattr(b, f))
    return a


def check_and_note(p: Parsed, source: str) -> None:
    """After the last line: no samples, or too many unparsable lines, is a ParseError; otherwise what
    was skipped, dropped, converted or joined becomes a note."""
    bad = p.bad_lines
    if p.samples == 0:
        if bad:
            raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})")
        if p.saw_meta:
            # prometheus_client prints a labelled metric's # HELP / # TYPE before any child exists: a
            # server that has served nothing yet, or a paste that kept only the headers
            raise ParseError(f"{source}: no samples: metric families declared (# HELP / # TYPE lines) but no "
                             "sample lines; labelled metrics appear after the server's first request, or the "
                             "paste kept only the headers")
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
    if p.table_rows:
        p.notes.append(f"{p.table_rows} rows of a query result's table (\"series | value\", copied from "
                       "Prometheus' web UI) read as samples: a query result, not a raw scrape (labels such as "
                       "instance and job are Prometheus')")
    if p.ignored_timestamps:
        p.notes.append(f"{p.ignored_timestamps} samples carried their own timestamp in a file read as scrapes "
                       "(its first sample had none): those timestamps were ignored")
