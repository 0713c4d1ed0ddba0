"""Kernel-timeline files: which reader a file needs (by content, not by name), and the checks every
trace file passes first. Readers: :mod:`.kineto` (PyTorch profiler JSON), :mod:`.nsys` (SQLite export)."""
from __future__ import annotations

from ..timeline_model import Timeline, TraceError
from .trace_io import DEFAULT_MAX_JSON_BYTES, open_regular



def read_head(path: str, n: int = 16) -> bytes:
    """The first ``n`` bytes of a regular file (what tells an nsys SQLite export from a Kineto trace);
    TraceError with one line naming the file when it cannot be read."""
    try:
        with open_regular(path) as f:
            return f.read(n)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror or e}") from None

def read_trace(path: str, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> Timeline:
    """Read a kernel timeline, detecting the format by content: Nsight Systems SQLite export, or
    Kineto JSON (plain or gzip, at most ``max_json_bytes`` of JSON text). Regular files only (a FIFO is
    refused, not waited on). Raises TraceError with one line naming the file and the problem."""
    head = read_head(path)
    if head.startswith(b"SQLite format 3\x00"):
        from .nsys import read_nsys

        return read_nsys(path)
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        from .kineto import read_kineto

        return read_kineto(path, max_json_bytes)
    if not head:
        raise TraceError(f"cannot read {path}: empty file")
    raise TraceError(f"cannot read {path}: not a trace (expected an Nsight Systems SQLite export or a "
                     "PyTorch profiler JSON trace, .json or .json.gz)")
