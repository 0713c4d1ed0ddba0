"""Giving memory back: the agent's RSS returns to its budget after a large body or a heavy query.

CPython frees large objects with ``free()``; glibc keeps what it freed in the heap (and in one arena
per thread) unless told otherwise, and its *dynamic* mmap threshold makes it worse: after one 16 MiB
buffer is freed, allocations up to 16 MiB stop being mmapped and stay in the heap for good. Measured
(bench/bench_agent_hostile.py, docs/agent.md#memory): 49 -> 74 MB after one gzip bomb and 89 MB
after a 400k-line body, kept for the process's life. Two calls fix it on glibc, and are no-ops
elsewhere (musl returns memory by itself; macOS is not a sidecar target):

- :func:`tune` (once, at agent start): a fixed mmap threshold (128 KiB, glibc's default, but no
  longer raised dynamically), so large buffers are mmapped and unmapped on free; a trim threshold.
- :func:`trim` (after a large allocation went away): ``malloc_trim(0)`` hands free heap pages of
  every arena back to the kernel. It costs ~0.1-2 ms, so it runs on demand, not every tick.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger("fragscope.agent")

_M_TRIM_THRESHOLD = -1  # mallopt parameters, glibc malloc.h
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024
TRIM_THRESHOLD_BYTES = 1024 * 1024
ARENA_MAX = 2  # one per thread by default (8 x cores): each keeps its own freed memory

_libc = None
_lock = threading.Lock()


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        try:
            name = ctypes.util.find_library("c") or "libc.so.6"
            lib = ctypes.CDLL(name)
            if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt"):
                _libc = lib
        except OSError:
            pass
    return _libc or None


def tune() -> bool:
    """Fix glibc's malloc thresholds for this process (True when applied)."""
    lib = _glibc()
    if lib is None:
        return False
    ok = all(lib.mallopt(p, v) == 1 for p, v in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                                                  (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
                                                  (_M_ARENA_MAX, ARENA_MAX)))
    if not ok:
        log.debug("mallopt refused a setting; memory is still trimmed on demand")
    return ok


def trim() -> bool:
    """Return free heap memory to the kernel (True when glibc released some)."""
    lib = _glibc()
    if lib is None:
        return False
    with _lock:  # one at a time: concurrent trims only contend on the arena locks
        return bool(lib.malloc_trim(0))


def rss_bytes() -> int | None:
    """Resident set size of this process (bytes), from /proc (None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Trimmer:
    """Trim when RSS grew by more than ``grow_bytes`` since the last look (housekeeping calls it
    every 2 s: one read of /proc/self/statm, ~10 µs)."""

    def __init__(self, grow_bytes: int = 4 * 1024 * 1024) -> None:
        self.grow = grow_bytes
        self.low = rss_bytes()
        self.trims = 0

    def check(self) -> None:
        rss = rss_bytes()
        if rss is None:
            return
        if self.low is None or rss < self.low:
            self.low = rss
        elif rss - self.low > self.grow:
            trim()
            self.trims += 1
            self.low = rss_bytes() or rss
