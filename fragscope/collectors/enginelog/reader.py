"""A log file read safely: regular files only, gzip with a cap on the decompressed size, long
lines cut, binary refused. Errors are :class:`LogInputError` with a one-line message.

Limits, by design (docs/logs.md#limits): ``max_bytes`` of text (after decompression; default
512 MiB, ``diagnose logs --max-bytes``), lines cut at ``max_line_bytes`` (64 KiB; the longest real
engine line seen, a V0 ``args: Namespace(...)`` line, is ~4 KiB).
"""
from __future__ import annotations

from ..safefile import NotRegularFile, fdopen_observed, open_regular_fd

import gzip
import re
import stat
import zlib
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Iterator

from .events import LogEvent
from .parser import LogParser

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_MAX_LINE_BYTES = 64 << 10
_CHUNK = 1 << 20
MAX_BLANK_RUN = 64  # empty lines in a row given to line consumers (iter_file_lines)
_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class LogInputError(ValueError):
    """The file cannot be read as an engine log; the message is one line naming why."""


@dataclass(slots=True)
class LogRead:
    """What reading one file produced, besides the events."""

    events: list[LogEvent] = field(default_factory=list)
    lines: int = 0
    engine_lines: int = 0  # lines with an engine prefix (vLLM header, SGLang time prefix)
    undated_lines: int = 0  # time-of-day-only timestamps, date inferred
    truncated_lines: int = 0  # lines longer than max_line_bytes, cut
    text_bytes: int = 0  # bytes of text read (decompressed)
    compressed: bool = False
    job_markers: set = field(default_factory=set)  # kinds of job whose own text appeared (jobkind.py)
    crash_lines: list = field(default_factory=list)  # lines opening a traceback / saying the engine died
    head: str = ""  # the first 4 KiB of text, for describing a file that is not an engine log
    mtime: float | None = None


def _open_regular(path: str):
    """Open without blocking (a FIFO would wait for a writer) and refuse anything but a regular file."""
    try:
        fd, st = open_regular_fd(path)
    except NotRegularFile as e:
        if e.is_dir:
            raise LogInputError("is a directory, not a log file") from None
        raise LogInputError(f"{e.kind}, not a regular file: give a log file (save a stream first: cmd > engine.log)") \
            from None
    except FileNotFoundError:
        raise LogInputError("no such file") from None
    except IsADirectoryError:
        raise LogInputError("is a directory, not a log file") from None
    except OSError as e:
        raise LogInputError(f"cannot open: {e.strerror or e}") from None
    return fdopen_observed(fd, st.st_size, path), st


def _chunks(path: str, max_bytes: int, info: LogRead) -> Iterator[bytes]:
    fh, st = _open_regular(path)
    info.mtime = st.st_mtime
    with fh:
        magic = fh.read(2)
        fh.seek(0)
        info.compressed = magic == b"\x1f\x8b"
        src = gzip.GzipFile(fileobj=fh, mode="rb") if info.compressed else fh
        what = "decompressed text" if info.compressed else "text"
        total = 0
        first = True
        while True:
            try:
                chunk = src.read(_CHUNK)
            except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
                raise LogInputError(f"cannot read: corrupt or truncated gzip: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                    ) from None
            if not chunk:
                break
            if first:
                first = False
                if b"\x00" in chunk[:8192]:
                    raise LogInputError("binary file, not a text log (give the engine's stdout/stderr log; .gz accepted)")
            total += len(chunk)
            if total > max_bytes:
                raise LogInputError(f"more than {max_bytes} bytes of {what}: over the cap (--max-bytes {max_bytes}); "
                                    "raise it to read this file, or cut the log to the incident")
            info.text_bytes = total
            yield chunk


def iter_lines_bytes(path: str, info: LogRead, max_bytes: int = DEFAULT_MAX_BYTES,
                     max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[bytes | int]:
    """Lines (bytes, without newline, cut at ``max_line_bytes``), or an int: that many empty lines."""
    carry = b""
    skipping = False  # inside a line already cut: drop bytes up to its newline
    for chunk in _chunks(path, max_bytes, info):
        if not info.head:
            info.head = chunk[:4096].decode("utf-8", "replace")
        if not chunk.strip() and not carry and not skipping:  # runs of blank lines (a newline bomb): count them
            n = chunk.count(b"\n")
            if n:
                yield n
            continue
        parts = chunk.split(b"\n")
        if len(parts) > 1:  # at least one newline: parts[0] ends the current line
            if skipping:
                skipping = False  # the cut line ends here
            else:
                p = carry + parts[0]
                if len(p) > max_line_bytes:
                    info.truncated_lines += 1
                    p = p[:max_line_bytes]
                yield p
            carry = b""
            blank = 0
            for p in parts[1:-1]:
                if not p:  # runs of empty lines go out as one count
                    blank += 1
                    continue
                if blank:
                    yield blank
                    blank = 0
                if len(p) > max_line_bytes:
                    info.truncated_lines += 1
                    p = p[:max_line_bytes]
                yield p
            if blank:
                yield blank
        elif skipping:
            continue
        carry += parts[-1]
        if len(carry) > max_line_bytes:  # a runaway line: yield its head now, drop the rest up to its newline
            info.truncated_lines += 1
            yield carry[:max_line_bytes]
            carry, skipping = b"", True
    if carry and not skipping:
        yield carry


def iter_file_lines(path: str, max_bytes: int = DEFAULT_MAX_BYTES,
                    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
    """Lines of a log file (.gz too), undecodable bytes replaced. Raises LogInputError.

    A run of more than MAX_BLANK_RUN empty lines is given as MAX_BLANK_RUN of them: a gzip of newlines
    (400 KB that unpack to 400 MB) made 400 million empty lines for the start-up parser, 102 s; line
    numbers after such a run are short of the file's by the lines left out."""
    info = LogRead()
    for x in iter_lines_bytes(path, info, max_bytes, max_line_bytes):
        if isinstance(x, int):
            for _ in range(min(x, MAX_BLANK_RUN)):
                yield ""
        else:
            yield x.decode("utf-8", "replace")


def read_log_file(path: str, *, reference: float | None = None, tz: tzinfo | None = None,
                  max_bytes: int = DEFAULT_MAX_BYTES, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> LogRead:
    """Parse a whole log file. ``reference`` (for MM-DD years) defaults to the file's mtime."""
    info = LogRead()
    parser: LogParser | None = None
    for x in iter_lines_bytes(path, info, max_bytes, max_line_bytes):
        if parser is None:
            parser = LogParser(reference if reference is not None else info.mtime, tz)
        if isinstance(x, int):
            parser.line_no += x
            continue
        info.events.extend(parser.feed(x.decode("utf-8", "replace")))
    if parser is not None:
        info.lines, info.engine_lines, info.undated_lines = parser.line_no, parser.engine_lines, parser.undated_lines
        info.job_markers = set(parser.job_markers)
        info.crash_lines = list(parser.crash_lines)
    return info


_PROM_LINE = re.compile(r"^[A-Za-z_:][\w:]*(?:\{[^}]*\})?\s+[-+]?(?:\d[\d.eE+-]*|NaN|[+-]?Inf)(?:\s+\d+)?\s*$")


def describe_text(head: str) -> str:
    """What a text that holds no engine line looks like, in a few words (for the one-line error)."""
    lines = [x.strip() for x in head.splitlines() if x.strip()][:40]
    if not lines:
        return "only blank lines"
    first = lines[0]
    # "[TP0] Decode batch…", "[rank0]: …", "[2026-…] …" open with "[" too: a JSON array goes on with a value
    if first[0] == "{" or re.match(r"\[\s*(?:[\[{\"\d\-\]]|true|false|null)", first) and not re.match(r"\[\d{4}-", first):
        return ("JSON, not an engine log (a Kineto trace: diagnose trace FILE; a memory snapshot: "
                "diagnose snapshot FILE)")
    prom = sum(1 for x in lines if x.startswith(("# HELP", "# TYPE", "# EOF")) or _PROM_LINE.match(x))
    if prom >= max(1, len(lines) // 2):
        return "Prometheus / OpenMetrics text (a /metrics scrape or recording: use diagnose FILE)"
    from ..nvsmi_table import looks_like_table

    if looks_like_table(head):
        return "nvidia-smi's table (memory used / total per GPU and per process): read it with: diagnose nvidia-smi FILE"
    sample = first[:60] + ("…" if len(first) > 60 else "")
    return f"plain text without any vLLM, SGLang or PyTorch OOM line (first line: {sample!r})"
