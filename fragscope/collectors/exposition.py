"""Prometheus text (0.0.4) and OpenMetrics input: recordings and scrapes from files, scrape text.

One parser (:mod:`.exposition_parse`) serves live scrapes (no timestamps: the scrape time is used) and
recordings (OpenMetrics with timestamps in seconds, or the Prometheus text format with milliseconds);
this module opens files (gzip, caps, telling other formats apart) and keeps the public names
(``ParseError``, ``parse_lines``, ``parse_text``, ``scrape_samples``, ``read_recording``).
Syntax helpers: :mod:`.exposition_syntax`; paste repair: :mod:`.exposition_paste`.

Why not prometheus_client's parsers: its OpenMetrics parser rejects any histogram with two
timestamped points ("+Inf bucket missing"), so it cannot read long recordings, and its text
parser builds several Python objects per line (measured ~25x slower than this one on an 18 MB
recording: bench/bench_ingest.py). This parser keeps one cache entry per distinct series.
"""
from __future__ import annotations

import io
import math
import os

from ..model import Sample, Window
from ..signals import SIGNALS
from .exposition_parse import LineCache, Parsed, declared_types, merge_parts, parse_lines
from .exposition_syntax import (ENV_MAX_POINTS, ENV_MAX_SERIES, MAX_POINTS, MAX_SERIES, ParseError,
                                parse_labels)
from .inputs import (ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES, MAX_FILE_BYTES, SNIFF_BYTES, GunzipCapped,
                     InputError, check_regular, describe_binary, describe_text, env_int, iter_lines, open_binary,
                     reader_of)

__all__ = ["ParseError", "LineCache", "Parsed", "parse_labels", "parse_lines", "parse_text", "scrape_samples",
           "scrape_kept", "read_recording", "parse_recording", "recording_window",
           "MAX_SERIES", "MAX_POINTS", "ENV_MAX_SERIES", "ENV_MAX_POINTS"]

# A run of this many lines without a sample (blank lines, comments, junk) is not metrics text: a gzip
# bomb of newlines stops here (~0.3 s) instead of at the decompression cap (read_recording passes it).
_MAX_LINES_WITHOUT_SAMPLE = 1_000_000


def parse_text(text: str, default_ts: float | None, source: str = "scrape",
               key_cache: dict | None = None, line_cache: LineCache | None = None) -> Parsed:
    return parse_lines(io.StringIO(text), default_ts=default_ts, source=source, key_cache=key_cache,
                       line_cache=line_cache)


def parse_file(path: str, default_ts: float | None, source: str | None = None) -> Parsed:
    """A scrape or recording file through the one reader contract: a regular file opened without blocking,
    gunzipped with the decompression cap, read line by line with the line cap (a 24 MiB line is one bad
    line, not a 24 MiB string), with the caps on series and points. Raises ParseError (one line)."""
    cap = env_int(ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES)
    try:
        fh = open_binary(path)
    except InputError as e:
        raise ParseError(str(e)) from None
    try:
        gz = fh.peek(2)[:2] == b"\x1f\x8b"
        raw = io.BufferedReader(GunzipCapped(fh, cap, path), 1 << 16) if gz else fh
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None)
        return parse_lines(iter_lines(text), default_ts=default_ts, source=source or path,
                           max_series=env_int(ENV_MAX_SERIES, MAX_SERIES), max_points=env_int(ENV_MAX_POINTS, MAX_POINTS))
    except InputError as e:
        raise ParseError(str(e)) from None
    except UnicodeDecodeError:
        raise ParseError(f"{path}: not text (binary data that is not gzip); expected a /metrics scrape") from None
    except EOFError:
        raise ParseError(f"{path}: truncated gzip stream") from None
    except OSError as e:
        raise ParseError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        fh.close()


def scrape_samples(text: str, ts: float, source: str = "scrape", key_cache: dict | None = None,
                   line_cache: LineCache | None = None) -> list[Sample]:
    """A live scrape (no timestamps expected) -> samples stamped ``ts``. ``line_cache`` learns the
    series lines' heads for :meth:`LineCache.scrape` (the collectors' fast path)."""
    return parse_text(text, ts, source, key_cache, line_cache).samples_list()


_HEAD_BYTES = 64 * 1024  # of a page without a line a collector keeps, parsed only for the parser's error message


def scrape_kept(kept: list[str], text: str, ts: float, source: str, keep: frozenset[str],
                key_cache: dict | None = None, line_cache: LineCache | None = None) -> list[Sample]:
    """The samples of the lines a collector picked out of ``text`` (``kept``, each ending with its newline).
    With none, a bounded head of the page is parsed instead, so that garbage is rejected with the parser's
    one-line message (and a page of other metrics gives no sample)."""
    if not kept:
        head = text[:_HEAD_BYTES]
        if len(text) > _HEAD_BYTES and "\n" in head:
            head = head[: head.rindex("\n") + 1]
        return [s for s in scrape_samples(head, ts, source) if s.name in keep]
    return scrape_samples("".join(kept), ts, source, key_cache, line_cache)


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
        p, st = parse_recording(path, scrape_interval_s, max_series=max_series, max_points=max_points,
                                max_decompressed_bytes=max_decompressed_bytes)
        return recording_window(path, p, st, scrape_interval_s, scrape_time=scrape_time)
    except InputError as e:
        raise ParseError(str(e)) from None


def parse_recording(path: str, scrape_interval_s: float | None = None, *, max_series: int | None = None,
                    max_points: int | None = None, max_decompressed_bytes: int | None = None,
                    span: tuple[int, int] | None = None) -> tuple[Parsed, os.stat_result]:
    """The first half of :func:`read_recording`, without numpy: the checks, the read and the parse of
    ``path``, and its stat (the second half, :func:`recording_window`, makes the window). Raises
    ParseError, or InputError (read_recording turns it into a ParseError).

    ``span`` (start, end): only the lines between those byte offsets of a plain (not gzip) file, each on a
    line start, parsed as they are where they stand in the file: after the family types the lines before
    ``start`` declare (for one file read in two processes, :func:`.exposition_parse.merge_parts` joins
    the halves; collectors/prefetch.py)."""
    interval = scrape_interval_s
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
    cap = max_decompressed_bytes or env_int(ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES)
    fh = open_binary(path)
    families = None
    try:
        gz = fh.peek(2)[:2] == b"\x1f\x8b"
        raw = io.BufferedReader(GunzipCapped(fh, cap, path), 1 << 16) if gz else fh
        if span is None or span[0] == 0:  # (the file's start: what it is, if not text)
            what = describe_binary(raw.peek(16)[:16])
            if what:
                raise ParseError(f"{path}: {what.replace('FILE', path)}", reader_of(what))
        if span is not None:
            if gz:
                raise ValueError("a span of a gzip file")
            start, end = span
            if start:
                import mmap

                with mmap.mmap(fh.fileno(), start, access=mmap.ACCESS_READ) as head:  # (no copy of the half)
                    families = declared_types(head)
            fh.seek(start)
            raw = io.BytesIO(fh.read(end - start))
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None)
        try:
            p = parse_lines(iter_lines(text), default_ts=None, source=path, scrapes=True,
                            max_series=series_cap, max_points=points_cap,
                            max_lines_without_sample=_MAX_LINES_WITHOUT_SAMPLE, families=families)
        except UnicodeDecodeError:
            raise ParseError(f"{path}: not text (binary data that is not gzip); expected OpenMetrics or "
                             "Prometheus text with timestamps, or a /metrics scrape") from None
        except ParseError as e:
            if any(m in str(e) for m in _SNIFF_AFTER):
                what = describe_text(_head_text(path, gz, cap))
                if what:
                    raise ParseError(f"{path}: {what.replace('FILE', path)}", reader_of(what)) from None
            raise
        except EOFError:
            raise ParseError(f"{path}: truncated gzip stream") from None
    finally:
        fh.close()
    return p, st


def join_parts(a: Parsed, b: Parsed) -> Parsed | None:
    """A recording's parse from its two parts' (:func:`parse_recording` with ``span``), with the caps
    :func:`parse_recording` applies; None when the file must be read whole (exposition_parse.merge_parts)."""
    return merge_parts(a, b, env_int(ENV_MAX_SERIES, MAX_SERIES), env_int(ENV_MAX_POINTS, MAX_POINTS),
                       _MAX_LINES_WITHOUT_SAMPLE)


def recording_window(path: str, p: Parsed, st: os.stat_result, scrape_interval_s: float | None = None, *,
                     scrape_time: float | None = None) -> Window:
    """The second half of :func:`read_recording`: the window of what :func:`parse_recording` gave for
    ``path`` (``p``, ``st``), with the same arguments. Raises ParseError."""
    interval = scrape_interval_s
    if p.scrape_mode:
        if not p.saw_meta and not any(k.name.startswith(_KNOWN_PREFIXES) or k.name in _KNOWN_NAMES
                                      for k in p.cols):
            first = next(iter(p.cols)).name
            raise ParseError(f"{path}: sample without a timestamp, and nothing marks the file as a /metrics scrape "
                             f"(no # HELP/# TYPE line, no metric fragscope reads; first: {first[:60]!r}); "
                             "save a whole scrape (curl -s URL/metrics > FILE) or record with timestamps")
        from .scrapes import build_window  # (numpy: the parse above runs without it, collectors/prefetch.py)

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
