"""Follow a growing text file the way ``tail -F`` does: rotation, truncation, partial last lines.

Generic (no log format here): :class:`FileTail` hands back the complete lines appended since the
last call. Used by the engine-log collector (:mod:`fragscope.collectors.logs`).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass


class NotRegularFile(OSError):
    """The path names a FIFO, device or socket: following it could block forever."""


@dataclass(slots=True)
class _Open:
    """An open file being followed: identity, read offset, and the partial last line held back."""

    fh: object
    dev: int
    ino: int
    offset: int = 0
    partial: bytes = b""
    head: bytes = b""  # the file's first bytes: a file rewritten in place shows a different head


class FileTail:
    """``read_new_lines()``: lines appended since the last call.

    ``from_start=False`` starts at the end of the file (only new lines count); a file that appears
    later, or a rotated-in new file, is read from its beginning, after the rest of the old one. A
    truncation (smaller size, or different first 64 bytes: copytruncate) restarts at 0. Each call reads
    at most ``max_bytes_per_tick`` bytes; a last line without its newline waits for the next call (up to
    ``max_line_bytes``, then it is taken as is). Non-regular files are refused (:class:`NotRegularFile`).
    """

    HEAD_BYTES = 64

    def __init__(self, path: str, *, from_start: bool = False, max_bytes_per_tick: int = 1 << 20,
                 max_line_bytes: int = 1 << 16) -> None:
        self.path = os.fspath(path)
        self.from_start = from_start
        self.max_bytes = max(4096, int(max_bytes_per_tick))
        self.max_line = max(1024, int(max_line_bytes))
        self._t: _Open | None = None
        self._first_open = True

    def _open(self, at_end: bool) -> None:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotRegularFile(f"{self.path} is not a regular file")
        fh = os.fdopen(fd, "rb")
        t = _Open(fh, st.st_dev, st.st_ino)
        if at_end:
            t.offset = st.st_size
            fh.seek(t.offset)
        self._t = t

    def close(self) -> None:
        if self._t is not None:
            try:
                self._t.fh.close()
            except OSError:
                pass
            self._t = None

    def _read(self, budget: int) -> tuple[list[str], int]:
        """Read up to ``budget`` bytes from the open file; complete lines only."""
        t = self._t
        assert t is not None
        t.fh.seek(t.offset)
        data = t.fh.read(budget)
        if not data:
            return [], 0
        if t.offset < self.HEAD_BYTES and len(t.head) == t.offset:  # remember the head as it is read
            t.head = (t.head + data)[:self.HEAD_BYTES]
        t.offset += len(data)
        buf = t.partial + data
        parts = buf.split(b"\n")
        t.partial = parts.pop()
        if len(t.partial) > self.max_line:  # a runaway line without newline: take it, do not grow
            parts.append(t.partial)
            t.partial = b""
        return [p[:self.max_line].decode("utf-8", "replace") for p in parts], len(data)

    def _same_head(self, t: _Open) -> bool:
        """Compare the file's first bytes with those seen before (size alone misses a truncation
        followed by more writes than were there). Remembers up to HEAD_BYTES as the file grows."""
        if t.offset == 0:
            return True
        n = min(self.HEAD_BYTES, t.offset)
        try:
            cur = os.pread(t.fh.fileno(), n, 0)
        except (OSError, AttributeError):
            return True
        if t.head and cur[:len(t.head)] != t.head:
            return False
        if len(t.head) < n:
            t.head = cur
        return True

    def _flush_partial(self) -> list[str]:
        t = self._t
        if t is None or not t.partial:
            return []
        line, t.partial = t.partial.decode("utf-8", "replace"), b""
        return [line]

    def read_new_lines(self) -> list[str]:
        """Lines appended since the last call (rotation and truncation handled). Raises OSError."""
        lines: list[str] = []
        budget = self.max_bytes
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._first_open = False  # a file that appears later is read from its beginning
            if self._t is not None:  # rotated away and not yet replaced: drain the old file
                more, _ = self._read(budget)
                lines += more + self._flush_partial()
                self.close()
                return lines
            raise
        if self._t is None:
            self._open(at_end=self._first_open and not self.from_start)
            self._first_open = False
        t = self._t
        if (st.st_dev, st.st_ino) != (t.dev, t.ino):
            # rotated (rename + new file): finish the old one, then read the new one from the start
            more, n = self._read(budget)
            budget -= n
            if n < self.max_bytes and budget > 0:
                lines += more + self._flush_partial()
                self.close()
                self._open(at_end=False)
            else:
                return more  # old file still has more than a tick's worth
        elif st.st_size < t.offset or not self._same_head(t):  # truncated or rewritten in place (copytruncate)
            t.offset, t.partial, t.head = 0, b"", b""
        if budget > 0:
            more, _ = self._read(budget)
            lines += more
        return lines
