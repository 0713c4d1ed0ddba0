"""Opening a file given to ``diagnose FILE``: safely, within caps, and telling what it is when it is not
metrics text (a trace, a snapshot, fragscope's own JSON, an engine log) so the error names the command
that reads it.

Caps (docs/collectors.md#recordings, limits): each has a keyword argument and an environment variable.
"""
from __future__ import annotations

import io
import json
import os
import re
import stat
import zlib
from itertools import chain
from typing import IO, Iterator


class InputError(ValueError):
    """The file cannot be read as metrics text; the message is one line naming the file, what it
    looks like and what reads it. (exposition.ParseError subclasses nothing here: the reader wraps it.)"""


# --- caps ------------------------------------------------------------------------------------
# A plain recording: 4 GiB (unchanged since the first reader). An 8-hour recording of every signal at
# 15 s is ~19 MB (bench/bench_ingest.py), so these leave two orders of magnitude of room.
MAX_FILE_BYTES = 4 * 1024**3
# Decompressed bytes of a .gz input: 1 GiB. A gzip bomb of newlines (400 KB -> 400 MB) took 103 s
# before; a real recording compresses 10-20x.
MAX_DECOMPRESSED_BYTES = 1024**3
ENV_MAX_DECOMPRESSED = "FRAGSCOPE_MAX_DECOMPRESSED_BYTES"
# ...and past 64 MiB, no more than 200 times the compressed bytes read so far. Recordings compress
# ~25x (an 8-hour scenario recording: 24.9x), a vLLM scrape ~11x; a bomb of newlines ~1000x. The ratio
# stops a 2 MB bomb after 64 MiB (~1 s) instead of at the 1 GiB cap (12 s on the 2-core VM).
MAX_GZIP_RATIO = 200
GZIP_RATIO_AFTER = 64 * 1024**2
ENV_MAX_GZIP_RATIO = "FRAGSCOPE_MAX_GZIP_RATIO"
# One line longer than this is not exposition text (a label set of a MiB does not exist); reading
# stops at the cap instead of building a string of the whole line.
MAX_LINE_CHARS = 1 << 20
# What iter_lines yields in place of a line longer than its cap (readers say "line N: longer than ...").
OVERLONG = "\x00overlong line"
# How much of the (decompressed) start of a file is looked at to tell what it is.
SNIFF_BYTES = 64 * 1024


def env_int(name: str, default: int) -> int:
    """A positive integer cap from the environment, else ``default``; a bad value is an error."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(float(raw.strip().replace("_", "")))
    except (ValueError, OverflowError):
        raise InputError(f"{name}={raw[:40]!r}: not a number (a positive integer cap)") from None
    if v <= 0:
        raise InputError(f"{name}={raw[:40]!r}: must be a positive integer")
    return v


from .safefile import KINDS as _KINDS, NotRegularFile, open_regular  # noqa: E402


def check_regular(path: str) -> os.stat_result:
    """Refuse what is not a regular file before opening it: a FIFO would block ``open`` forever,
    /dev/zero never ends, a directory is not data."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        what = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputError(f"{path}: is {what}, expected a recording or scrape file")
    return st


def open_binary(path: str) -> IO[bytes]:
    """Open a regular file without blocking (O_NONBLOCK: a FIFO swapped in after the check does not
    hang the open) and check again on the open descriptor (collectors/safefile.py)."""
    try:
        return open_regular(path)
    except NotRegularFile as e:
        raise InputError(f"{path}: is {e.kind}, expected a recording or scrape file") from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None


class GunzipCapped(io.RawIOBase):
    """A gzip stream (several members allowed, like ``gzip``) decompressed in chunks, refusing to
    produce more than ``cap`` bytes. zlib does the work; this only counts and stops."""

    def __init__(self, raw: IO[bytes], cap: int, name: str, max_ratio: int | None = None) -> None:
        self._raw = raw
        self._cap = cap
        self._ratio = max_ratio or env_int(ENV_MAX_GZIP_RATIO, MAX_GZIP_RATIO)
        self._in = 0
        self._name = name
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buf = b""
        self._out = 0
        self._done = False
        self._members = 0
        self._in_member = False
        self._pending = b""

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while not self._buf and not self._done:
            if self._d.unconsumed_tail:
                data = self._d.unconsumed_tail
            elif self._pending:  # bytes after a finished member: the next member
                data, self._pending = self._pending, b""
            else:
                data = self._raw.read(1 << 16)
                self._in += len(data)
                if not data:
                    if self._in_member or self._members == 0:
                        raise InputError(f"{self._name}: truncated gzip stream (it ends before its end marker)")
                    self._done = True
                    return
            if not self._in_member and self._members and not data.strip(b"\x00"):
                continue  # trailing zero padding after the last member is allowed (gzip's rule)
            try:
                chunk = self._d.decompress(data, 1 << 16)
            except zlib.error as e:
                raise InputError(f"{self._name}: corrupt gzip ({e})") from None
            self._in_member = True
            if self._d.eof:
                self._members += 1
                self._pending = self._d.unused_data
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._in_member = False
            self._out += len(chunk)
            if self._out > self._cap:
                raise InputError(
                    f"{self._name}: decompresses to more than {self._cap:,} bytes (the cap on decompressed "
                    f"input; a gzip bomb?); raise it with {ENV_MAX_DECOMPRESSED}=BYTES if the file is genuine")
            if self._out > GZIP_RATIO_AFTER and self._out > self._ratio * max(self._in, 1):
                raise InputError(
                    f"{self._name}: decompresses more than {self._ratio} times its compressed size "
                    f"({self._out:,} bytes from {self._in:,}; a gzip bomb?); raise the ratio with "
                    f"{ENV_MAX_GZIP_RATIO}=N if the file is genuine")
            self._buf = chunk

    def readinto(self, b) -> int:
        self._fill()
        if not self._buf:
            return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def open_text(path: str, max_decompressed_bytes: int | None = None) -> tuple[IO[str], bool]:
    """(text stream, gzipped?) of a regular file, gunzipped with a cap when it starts with the gzip
    magic. The stream decodes UTF-8 strictly (binary data raises UnicodeDecodeError while reading)."""
    cap = max_decompressed_bytes or env_int(ENV_MAX_DECOMPRESSED, MAX_DECOMPRESSED_BYTES)
    fh = open_binary(path)
    try:
        magic = fh.read(2)
        fh.seek(0)
        gz = magic == b"\x1f\x8b"
        raw: IO[bytes] = io.BufferedReader(GunzipCapped(fh, cap, path), 1 << 16) if gz else fh
        return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None), gz
    except BaseException:
        fh.close()
        raise


def read_bytes(path: str, max_bytes: int, what: str = "input") -> bytes:
    """The whole content of the regular file ``path``, gunzipped when it starts with the gzip magic, at most
    ``max_bytes`` bytes *after* decompression (a FIFO, a device, a directory, a larger file or a gzip bomb
    are refused with one line: InputError). The one reader of whole small inputs (a config.pbtxt, a model
    config.json, an ONNX Runtime profile) for every command."""
    try:
        fh = open_regular(path)
    except NotRegularFile as e:
        raise InputError(f"{path}: is {e.kind}, expected a {what} file") from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fh.fileno())
        gz = fh.peek(2)[:2] == b"\x1f\x8b"
        if not gz and st.st_size > max_bytes:
            raise InputError(f"{path}: {st.st_size:,} bytes, larger than the {max_bytes:,} bytes a {what} may be")
        raw: IO[bytes] = GunzipCapped(fh, max_bytes, path) if gz else fh
        chunks = []
        n = 0
        while True:
            chunk = raw.read(min(1 << 20, max_bytes + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
            if n > max_bytes:
                raise InputError(f"{path}: more than {max_bytes:,} bytes{' once decompressed' if gz else ''}, "
                                 f"larger than a {what} may be")
        return b"".join(chunks)
    except InputError:
        raise
    except EOFError:
        raise InputError(f"{path}: truncated gzip stream") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        fh.close()


def iter_lines(text: IO[str], max_line: int = MAX_LINE_CHARS, chunk: int = 1 << 20) -> Iterator[str]:
    """Lines of ``text`` without their line ends, each at most ``max_line`` characters: a longer
    line is yielded as one marker line (never parsed as data) and the rest of it skipped, so no
    string grows past the cap. Reads in chunks and splits them in C (faster than readline per line);
    the lines of a chunk are handed on by ``itertools.chain`` (no generator step per line)."""
    return chain.from_iterable(_line_chunks(text, max_line, chunk))


def _line_chunks(text: IO[str], max_line: int, chunk: int) -> Iterator[list[str]]:
    """The lines of each chunk read (see :func:`iter_lines`), as lists."""
    read = text.read
    buf = ""
    skipping = False
    while True:
        data = read(chunk)
        if not data:
            break
        if skipping:
            nl = data.find("\n")
            if nl < 0:
                continue
            data = data[nl + 1:]
            skipping = False
        buf += data
        lines = buf.split("\n")
        buf = lines.pop()
        if len(buf) > max_line:
            lines.append(OVERLONG)
            buf = ""
            skipping = True
        yield lines
    if buf and not skipping:
        yield [buf]


# --- what is this file? ----------------------------------------------------------------------
_LOG_LINE = re.compile(
    r"^(?:\S+\s+\|\s)?(?:\((?:[A-Za-z][\w\-]*) pid=\d+[^)]*\)\s*)?(?:"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d"  # vLLM
    r"|\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d[^\]]*\]"  # SGLang, CI
    r"|\[\d\d:\d\d:\d\d[^\]]*\]"  # short SGLang
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d"  # kubectl --timestamps, python logging
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*[:\-]\s)")
_LOG_WORDS = re.compile(r"KV cache|preempted|Avg prompt throughput|Decode batch|Prefill batch|"
                        r"OutOfMemoryError|CUDA out of memory|Traceback \(most recent call last\)|Uvicorn|"
                        r"Started server process|Loading model|vLLM|sglang", re.I)


_READER = re.compile(r"(?:read it|read a [\w ]+?) with: diagnose (logs|trace|snapshot|nvidia-smi) FILE")


def reader_of(description: str | None) -> str | None:
    """The ``diagnose`` subcommand a :func:`describe_binary` / :func:`describe_text` answer names, if any."""
    m = _READER.search(description or "")
    return m.group(1) if m else None


def describe_binary(head: bytes) -> str | None:
    """What a file that is not text is, by its first bytes, and the command that reads it."""
    if head.startswith(b"SQLite format 3\x00"):
        return ("an SQLite database (an Nsight Systems export?), not metrics text; "
                "read a kernel timeline with: diagnose trace FILE")
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return ("a Python pickle (a PyTorch memory snapshot?), not metrics text; "
                "read a memory snapshot with: diagnose snapshot FILE")
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (a torch.save checkpoint or a zipped export?), not metrics text; unzip it first"
    return None


def describe_text(head: str) -> str | None:
    """What a text file that failed to parse as metrics is (JSON of some kind, an engine log), with
    the command that reads it. ``head`` is the first SNIFF_BYTES characters."""
    s = head.lstrip("\ufeff \t\r\n")
    # "[2025-03-27 21:33:30 TP0] ..." (SGLang), "[16:43:29] ...", "[rank0]: ..." (torchrun) start with "[" too:
    # a JSON array goes on with a value ({ [ " digit - t f n) or ends (])
    if s[:1] == "{" or (s[:1] == "[" and re.match(r"\[\s*(?:[\[{\"\d\-\]]|true|false|null)", s)
                        and not _LOG_LINE.match(s.split("\n", 1)[0].strip())):
        return _describe_json(s)
    if re.match(r"<(?:!doctype\s+html|html|head|body)\b", s[:200], re.I):
        return ("not Prometheus/OpenMetrics text: an HTML page (a login page, a proxy error, a dashboard?); "
                "save the /metrics URL itself (curl -s URL/metrics > FILE)")
    lines = [ln for ln in s.splitlines()[:200] if ln.strip()]
    other = _other_tool(s, lines)
    if other:
        return other
    if lines:
        logish = sum(1 for ln in lines if _LOG_LINE.match(ln.strip()))
        words = sum(1 for ln in lines if _LOG_WORDS.search(ln))
        if logish >= max(2, len(lines) // 3) or (logish and words >= max(2, len(lines) // 3)) \
                or _engine_lines(lines):
            return ("an engine log (vLLM / SGLang lines), not metrics text; "
                    "read it with: diagnose logs FILE")
    return None


# Line-anchored patterns match blanks with [ \t], never \s: a \s* after ^ under re.M runs over newlines,
# and a head of blank lines (a gzip bomb of newlines) then costs quadratic time (tests/fuzz: a hang).
_PBTXT = re.compile(r"^[ \t]*(?:name|platform|backend|max_batch_size)[ \t]*:[ \t]*\S|^[ \t]*(?:dynamic_batching|"
                    r"instance_group|input|output)[ \t]*[\[{]", re.M)
_NVSMI = re.compile(r"<nvidia_smi_log>|^(?:time(?: \[s\])?|timestamp|# gpu|#Date),[ \t]*\S|==============NVSMI LOG|"
                    r"^[ \t]*(?:Driver Version|CUDA Version)[ \t]*:", re.M | re.I)


def _other_tool(s: str, lines: list[str]) -> str | None:
    """Files an on-call holds beside the metrics that fragscope does not read this way: a Triton
    config.pbtxt (read by ``diagnose triton-batching``), nvidia-smi output (XML, CSV, -q text)."""
    head = "\n".join(lines[:60])
    if len(_PBTXT.findall(head)) >= 2 and not any(ln.startswith("# TYPE") for ln in lines[:60]):
        if re.search(r"\$\{[A-Za-z_]\w*\}", s):
            return ("a Triton model configuration template (config.pbtxt with ${...} placeholders), not metrics text: "
                    "fill the template first (tensorrtllm_backend: tools/fill_template.py), then judge its batching "
                    "with: diagnose triton-batching --config FILE SCRAPE")
        return ("a Triton model configuration (config.pbtxt), not metrics text; judge its batching against the "
                "model's counters with: diagnose triton-batching --config FILE SCRAPE")
    from .nvsmi_table import looks_like_table  # the same layer

    if looks_like_table(s):
        return ("nvidia-smi's table (memory used / total per GPU and per listed process), not metrics text; "
                "read it with: diagnose nvidia-smi FILE")
    if _NVSMI.search(head):
        return ("nvidia-smi output (XML, CSV or -q text), not metrics text; fragscope reads the GPU through NVML "
                "(fragscope agent) or a dcgm-exporter's /metrics page (diagnose http://host:9400)")
    return None


# Start-up accounting lines that carry no prefix when pasted into a bug report (the sizing parser reads them)
_STARTUP_WORDS = re.compile(r"Free memory on device \(|KV Cache is allocated\.|max_total_num_tokens=|"
                            r"# GPU blocks: \d|Available KV cache memory: |server_args=ServerArgs\(|"
                            r"is larger than the maximum number of tokens that can be stored in KV cache")


def _engine_lines(lines: list[str]) -> bool:
    """A paste without line prefixes (a traceback, a preemption warning, a start-up summary copied from a
    bug report) is still an engine log when the engine-log parser finds an event in it or a start-up
    accounting line is there. Only asked once the text failed to parse as metrics."""
    if any(_STARTUP_WORDS.search(ln) for ln in lines):
        return True
    from .enginelog import LogParser  # the same layer; imported here so metrics reading does not load it

    p = LogParser(0.0)
    try:
        return any(p.feed(ln) for ln in lines)
    except Exception:  # noqa: BLE001 -- a sniff: a parser failure only means "not recognised"
        return False


def _describe_json(s: str) -> str:
    keys = set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', s[:SNIFF_BYTES]))
    top = _top_keys(s)
    if top is not None:
        keys = top | keys
    if {"traceEvents"} & keys or ({"ph", "ts"} <= keys and ({"dur", "pid", "tid"} & keys)):
        return ("a JSON trace (PyTorch profiler / Chrome trace format), not metrics text; "
                "read it with: diagnose trace FILE")
    if {"segments", "device_traces"} & keys and ({"blocks", "total_size", "allocated_size", "device_traces"} & keys):
        return ("a PyTorch memory snapshot as JSON, not metrics text; read it with: diagnose snapshot FILE")
    if {"findings", "inconclusive"} <= keys or ({"findings"} & keys and {"window", "verdict", "attachments"} & keys):
        return ("fragscope's own JSON output (findings), not an input; run diagnose on the recording, "
                "trace or snapshot it was made from")
    if {"resultType", "result"} <= keys or ({"status", "data"} <= keys and "resultType" in s[:SNIFF_BYTES]):
        return ("a Prometheus HTTP API response (JSON), not exposition text; diagnose a fleet with: "
                "diagnose --prometheus URL, or save the target's /metrics page instead")
    if _engine_lines([ln for ln in s[:SNIFF_BYTES].splitlines()[:200] if ln.strip()]):
        # an HTTP error body ({"error": "CUDA out of memory. Tried to allocate ..."}, {"detail": ...}): the message
        # inside is what the engine-log reader reads (diagnose logs reads it as it stands)
        return ("a JSON error body holding an engine or PyTorch message (an OOM), not metrics text; "
                "read it with: diagnose logs FILE")
    return ("a JSON document (a config?), not metrics text; diagnose FILE reads Prometheus/OpenMetrics text "
            "(traces: diagnose trace FILE, memory snapshots: diagnose snapshot FILE, logs: diagnose logs FILE)")


def _top_keys(s: str) -> set[str] | None:
    """Top-level keys when the sniffed head is a whole, small JSON object (else None)."""
    if len(s) >= SNIFF_BYTES or s[:1] != "{":
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return set(obj) if isinstance(obj, dict) else None
