"""Prometheus text (0.0.4) and OpenMetrics parsing, streaming, for scrapes and recordings.

One parser serves live scrapes (no timestamps: the scrape time is used) and recordings
(OpenMetrics with timestamps in seconds, or the Prometheus text format with milliseconds).

Why not prometheus_client's parsers: its OpenMetrics parser rejects any histogram with two
timestamped points ("+Inf bucket missing"), so it cannot read long recordings, and its text
parser builds several Python objects per line (measured ~6x slower than this one on an 18 MB
recording: bench/bench_ingest.py). This parser keeps one cache entry per distinct series.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import IO, Iterable, Iterator

from ..model import Labels, Sample, SeriesKey, Window
from ..signals import DCGM_BLANK_THRESHOLD, normalise_name


class ParseError(ValueError):
    """Input is not Prometheus/OpenMetrics text; the message is one line naming the problem."""


_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gcount", "_gsum")
# Timestamps above this are milliseconds (1e11 s is the year 5138).
_MS_THRESHOLD = 1e11
# Give up when this many of the first lines are not metrics text (e.g. an HTML page, a binary).
_EARLY_BAD_LIMIT = 20
# ...or when more than this share of all sample lines are unparsable.
_BAD_RATIO_LIMIT = 0.05


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

    def to_window(self, source: str = "") -> Window:
        w = Window.from_columns(self.cols, source=source, types=self.types)
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
                keep_created: bool = False, key_cache: dict | None = None) -> Parsed:
    """Parse exposition text line by line.

    ``default_ts`` (unix seconds) applies to samples without a timestamp; when it is None such
    samples are an error (a recording must carry timestamps). ``key_cache``, a dict the caller
    keeps between scrapes, remembers each series line's parsed name and labels: a collector that
    scrapes the same ~600 series every second then skips the label parsing (~60 % of the cost).
    """
    p = Parsed()
    family_types: dict[str, str] = {}
    cache: dict[str, tuple[SeriesKey, list[float], list[float]] | None] = {}
    cols = p.cols
    types = p.types
    bad = 0
    early_ok = 0
    lineno = 0
    for line in lines:
        lineno += 1
        if not line or line == "\n":
            continue
        if line[0] == "#":
            if line.startswith("# EOF") or line.startswith("#EOF"):
                p.saw_eof = True
                p.openmetrics = True
                continue
            parts = line[1:].split(None, 3)
            if len(parts) >= 3 and parts[0] == "TYPE":
                family_types[normalise_name(parts[1])] = parts[2].strip().lower()
                early_ok += 1
            elif parts and parts[0] in ("HELP", "UNIT"):
                early_ok += 1
            elif line.startswith("#HELP") or line.startswith("#TYPE"):  # old Triton: no space
                seg = line[5:].split(None, 2)
                if line.startswith("#TYPE") and len(seg) >= 2:
                    family_types[normalise_name(seg[0])] = seg[1].strip().lower()
                early_ok += 1
            continue
        if p.saw_eof:
            continue  # nothing is allowed after # EOF; ignore trailing garbage quietly
        # --- a sample line ------------------------------------------------------------------
        brace = line.find("{")
        try:
            if brace >= 0:
                close = line.rfind("}")
                if close < brace:
                    raise ValueError("unbalanced braces")
                head = line[: close + 1]
                rest = line[close + 1:].split()
            else:
                parts = line.split()
                head = parts[0]
                rest = parts[1:]
            if not rest or len(rest) > 3:
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
                else:
                    key = SeriesKey(name, labels)
                    col = cols.get(key)
                    if col is None:
                        col = cols[key] = ([], [])
                    entry = (key, col[0], col[1])
                cache[head] = entry
            value = float(rest[0])
            if len(rest) >= 2 and not rest[1].startswith("#"):
                ts = float(rest[1])
                if ts > _MS_THRESHOLD:
                    ts /= 1000.0
                else:
                    p.openmetrics_ts = True
                p.saw_timestamps = True
            else:
                if default_ts is None:
                    raise ParseError(f"{source}: line {lineno}: sample without a timestamp in a recording "
                                     "(record with timestamps, or diagnose a live endpoint)")
                ts = default_ts
        except ParseError:
            raise
        except (ValueError, IndexError) as e:
            bad += 1
            if p.first_bad is None:
                p.first_bad = f"line {lineno}: {e}: {line.strip()[:80]!r}"
            if early_ok == 0 and bad >= _EARLY_BAD_LIMIT:
                raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})") from None
            continue
        early_ok += 1
        if entry is None:
            continue
        if entry[0].name.startswith("DCGM_") and value > DCGM_BLANK_THRESHOLD:
            continue  # DCGM blank sentinel: not available, not a value
        entry[1].append(ts)
        entry[2].append(value)
        p.samples += 1
    p.lines = lineno
    p.bad_lines = bad
    if p.samples == 0:
        if bad:
            raise ParseError(f"{source}: not Prometheus/OpenMetrics text ({p.first_bad})")
        raise ParseError(f"{source}: no samples (empty or comments only)")
    if bad and bad > _BAD_RATIO_LIMIT * (p.samples + bad):
        raise ParseError(f"{source}: {bad} of {p.samples + bad} sample lines unparsable ({p.first_bad})")
    if bad:
        p.notes.append(f"{bad} unparsable lines skipped (first: {p.first_bad})")
    return p


def parse_text(text: str, default_ts: float | None, source: str = "scrape",
               key_cache: dict | None = None) -> Parsed:
    return parse_lines(io.StringIO(text), default_ts=default_ts, source=source, key_cache=key_cache)


def scrape_samples(text: str, ts: float, source: str = "scrape", key_cache: dict | None = None) -> list[Sample]:
    """A live scrape (no timestamps expected) -> samples stamped ``ts``."""
    return parse_text(text, ts, source, key_cache).samples_list()


# ---------------------------------------------------------------------------------------------
_MAX_RECORDING_BYTES = 4 * 1024**3


def _open_text(path: str) -> Iterator[str]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        fh: IO[bytes] = gzip.open(path, "rb")
    else:
        fh = open(path, "rb")
    try:
        text = io.TextIOWrapper(fh, encoding="utf-8", errors="strict", newline=None)
        yield from text
    finally:
        fh.close()


def read_recording(path: str) -> Window:
    """Read a recording (OpenMetrics / Prometheus text with timestamps, optionally gzipped).

    Raises ParseError with a one-line message naming the file and the problem.
    """
    if not os.path.exists(path):
        raise ParseError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ParseError(f"{path}: is a directory, expected a recording file")
    size = os.path.getsize(path)
    if size == 0:
        raise ParseError(f"{path}: empty file")
    if size > _MAX_RECORDING_BYTES:
        raise ParseError(f"{path}: {size} bytes is larger than the 4 GiB limit")
    try:
        p = parse_lines(_open_text(path), default_ts=None, source=path)
    except UnicodeDecodeError:
        raise ParseError(f"{path}: not text (binary data that is not gzip); expected OpenMetrics or "
                         "Prometheus text with timestamps") from None
    except EOFError:
        raise ParseError(f"{path}: truncated gzip stream") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise ParseError(f"{path}: corrupt gzip ({e})") from None
    if p.openmetrics_ts and not p.saw_eof:
        p.notes.append(f"{path}: no '# EOF' line: the file may be truncated")
    w = p.to_window(source=path)
    if not math.isfinite(w.start):
        raise ParseError(f"{path}: no finite sample values")
    return w
