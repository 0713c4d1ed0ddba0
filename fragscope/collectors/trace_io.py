"""File checks the trace readers share: regular files only (a FIFO or a device would block or never end),
and JSON text read whole under a byte cap, gzip decompressed in bounded steps (a small .gz can unpack to
gigabytes). Raises :class:`~fragscope.timeline_model.TraceError` with one line naming the file."""
from __future__ import annotations

from .safefile import NotRegularFile
from .safefile import open_regular as safe_open

import os
import stat
import zlib

from ..timeline_model import TraceError

# Cap on JSON text, after decompression. Reading holds the text and its objects: peak RSS grows by 4-5
# bytes per byte of trace text (measured: 5.2 on HTA's sampled rank, 1.8 MB of JSON; 4.9 and 4.0 on two
# 33 MB traces; about 100 ms per MB on the shared 2-core VM), so 1 GiB of text needs ~5 GiB.
# Raised with `diagnose trace --max-json-bytes`.
DEFAULT_MAX_JSON_BYTES = 1 << 30
_READ_STEP = 1 << 22  # decompressed bytes per zlib call: the cap is checked at least this often


def check_regular(path: str) -> os.stat_result:
    """stat ``path`` (following links, as open does) and refuse anything but a regular file."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(f"cannot read {path}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"cannot read {path}: not a regular file (a FIFO, socket or device); save the trace "
                         "to a file first")
    return st


def open_regular(path: str):
    """Open ``path`` for binary reading without blocking on a FIFO, and only if it is a regular file."""
    try:
        return safe_open(path)
    except NotRegularFile as e:
        what = "is a directory" if e.is_dir else \
            "not a regular file (a FIFO, socket or device); save the trace to a file first"
        raise TraceError(f"cannot read {path}: {what}") from None
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None


def read_json_bytes(path: str, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic (several members too), at most
    ``max_bytes`` of them (what :func:`prefetch_json_bytes` read already, where it read this file)."""
    pending = _PREFETCHED.pop((path, max_bytes), None)
    if pending is not None:
        thread, got = pending
        thread.join()
        if got and got[1] == _identity(path):  # (the same file, unchanged: else read now, errors included)
            return got[0]
    return _read(path, max_bytes)[0]


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _read(path: str, max_bytes: int, gzip_only: bool = False) -> tuple[bytes | None, tuple]:
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        ident = st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
        size = st.st_size
        head = f.read(2)
        if head != b"\x1f\x8b":
            if gzip_only:
                return None, ident
            if size > max_bytes:
                raise TraceError(f"cannot read {path}: {size:,} bytes of JSON, above the {max_bytes:,}-byte cap "
                                 "(raise it with --max-json-bytes)")
            return head + f.read(max_bytes + 1 - len(head)), ident
        return _gunzip(path, head + f.read(), max_bytes), ident


_PREFETCHED: dict = {}  # (path, max_bytes) -> (thread, [bytes, identity] once read)


def prefetch_json_bytes(path: str, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
    """Start gunzipping ``path`` in a thread, for the next :func:`read_json_bytes` of it: zlib lets other
    threads run while it inflates, so the command's imports go on meanwhile (HTA's ns-resolution trace, 1.2 MB
    of gzip: about 20 ms of inflating on the other core instead of after the imports). Only a gzip file; an
    error, or a file changed meanwhile, is left to the read itself, which then reads as before."""
    import threading

    got: list = []

    def run() -> None:
        try:
            data, ident = _read(path, max_bytes, gzip_only=True)
        except BaseException:  # noqa: BLE001 - (the read itself meets it again and says it)
            return
        if data is not None:
            got.extend((data, ident))

    thread = threading.Thread(target=run, name="fragscope-gunzip", daemon=True)
    _PREFETCHED[(path, max_bytes)] = (thread, got)
    thread.start()


def _gunzip(path: str, raw: bytes, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    data = raw
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            buf = d.decompress(data, _READ_STEP)
            while True:
                total += len(buf)
                if total > max_bytes:
                    raise TraceError(f"cannot read {path}: gzip unpacks to more than the {max_bytes:,}-byte cap "
                                     "(raise it with --max-json-bytes)")
                parts.append(buf)
                if not d.unconsumed_tail:
                    break
                buf = d.decompress(d.unconsumed_tail, _READ_STEP)
            if not d.eof:
                buf = d.flush()
                total += len(buf)
                if total > max_bytes:
                    raise TraceError(f"cannot read {path}: gzip unpacks to more than the {max_bytes:,}-byte "
                                     "cap (raise it with --max-json-bytes)")
                parts.append(buf)
        except zlib.error as e:
            raise TraceError(f"cannot read {path}: truncated or corrupt gzip ({e})") from None
        if not d.eof:
            raise TraceError(f"cannot read {path}: truncated or corrupt gzip (ends inside a member)")
        data = d.unused_data
        if data[:2] != b"\x1f\x8b":
            if data.strip(b"\x00"):
                raise TraceError(f"cannot read {path}: truncated or corrupt gzip (trailing garbage)")
            break  # zero padding after the last member is allowed (as the gzip module does)
    return b"".join(parts)
