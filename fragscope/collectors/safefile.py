"""Opening input files safely: the one place every reader opens a user-given path.

A FIFO would block ``open`` until a writer comes, ``/dev/zero`` never ends, a directory is not data, and a
file swapped for a FIFO between a check and the open would hang a check-then-open. So: open with
O_NONBLOCK, check the *open descriptor* with fstat, refuse anything but a regular file, then switch the
descriptor back to blocking reads. Each reader turns the two errors into its own one-line message.
"""
from __future__ import annotations

import contextvars
import io
import os
import stat
from typing import IO, Callable

KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


class NotRegularFile(Exception):
    """The path is not a regular file; ``kind`` says what it is ("a directory", "a FIFO (named pipe)", ...)."""

    def __init__(self, path: str, kind: str, mode: int) -> None:
        super().__init__(f"{path}: {kind}, not a regular file")
        self.kind = kind
        self.mode = mode

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_fifo(self) -> bool:
        return stat.S_ISFIFO(self.mode)


def kind_of(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


# A process that reads only where an operator allowed (``fragscope mcp --allow-dir``) sets a confined
# opener here: path -> an O_NONBLOCK descriptor, or OSError. Process-wide, so reader threads obey it too.
_CONFINE: Callable[[str], int] | None = None


def set_confinement(opener: "Callable[[str], int] | None") -> None:
    """Open every input through ``opener`` (None: plain ``os.open``)."""
    global _CONFINE
    _CONFINE = opener


def open_regular_fd(path: str) -> tuple[int, os.stat_result]:
    """A blocking-read descriptor of the regular file ``path`` and its stat. Raises OSError when it cannot
    be opened, NotRegularFile when it is anything else than a regular file (the descriptor is closed)."""
    confine = _CONFINE
    fd = (confine(str(path)) if confine is not None else
          os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(str(path), kind_of(st.st_mode), st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


# Progress while reading large inputs: the CLI sets an observer (rich's progress bar on a terminal) for
# the command; readers open inputs through open_regular / fdopen_observed, which count the bytes read
# below the buffer (so peek, read1 and text wrappers work as before). Nothing is shown by default.
Observer = Callable[[int, str], "tuple[Callable[[int], None], Callable[[], None]]"]
_OBSERVER: contextvars.ContextVar[Observer | None] = contextvars.ContextVar("fragscope_read_observer", default=None)
OBSERVE_MIN_BYTES = 32 << 20  # smaller inputs read in a second or two: no bar


def set_observer(fn: Observer | None) -> contextvars.Token:
    """``fn(size, path) -> (advance(n_bytes), done())`` for each large input opened while it is set."""
    return _OBSERVER.set(fn)


class _Counted(io.RawIOBase):
    def __init__(self, raw: io.RawIOBase, advance: Callable[[int], None], done: Callable[[], None]) -> None:
        self._raw, self._advance, self._done = raw, advance, done

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int | None:
        n = self._raw.readinto(b)
        if n:
            self._advance(n)
        return n

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                self._done()
        super().close()


def fdopen_observed(fd: int, size: int, path: str) -> IO[bytes]:
    """A buffered binary reader of ``fd``, counted by the observer when the input is large."""
    fn = _OBSERVER.get()
    if fn is None or size < OBSERVE_MIN_BYTES:
        return os.fdopen(fd, "rb")
    raw = os.fdopen(fd, "rb", buffering=0)
    advance, done = fn(size, str(path))
    return io.BufferedReader(_Counted(raw, advance, done), 1 << 16)


def open_regular(path: str) -> IO[bytes]:
    """Binary reading of a regular file, observed for progress. Raises as open_regular_fd."""
    fd, st = open_regular_fd(path)
    return fdopen_observed(fd, st.st_size, str(path))


class UnsafeFile(OSError):
    """A file in a directory another process writes that the agent refuses to read (one line)."""


def printable(name: str, limit: int = 200) -> str:
    """A file name (or any outside text) safe to put in one log line: control characters (a newline
    would forge a line of its own), backslashes and non-printable characters escaped, length bounded."""
    s = str(name)
    if not s.isprintable() or "\\" in s:
        s = "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def read_untrusted(path: str, uids: frozenset[int] | None, max_bytes: int) -> bytes:
    """The bytes of ``path``, a file another process publishes (the probe directory), read the way the
    agent's captures take files: never through a symbolic link (O_NOFOLLOW), never a FIFO or device
    (O_NONBLOCK, then a regular-file check on the open descriptor), owned by one of ``uids`` (None: any),
    not writable by everyone, one link only, at most ``max_bytes`` (checked on the descriptor and while reading).
    Raises UnsafeFile or OSError."""
    import errno

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, "a symbolic link; refused") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(errno.EINVAL, f"{kind_of(st.st_mode)}, not a regular file; refused")
        if uids is not None and st.st_uid not in uids:
            raise UnsafeFile(errno.EPERM, f"owned by uid {st.st_uid}, expected one of {sorted(uids)} (the agent's "
                                          "user or the directory's owner; see capture.probe_uids); refused")
        if st.st_mode & stat.S_IWOTH:
            raise UnsafeFile(errno.EPERM, "writable by every user; refused")
        if st.st_nlink != 1:  # a hard link to a file elsewhere (the probe publishes by rename: one link)
            raise UnsafeFile(errno.EPERM, f"has {st.st_nlink} hard links; refused")
        if st.st_size > max_bytes:
            raise UnsafeFile(errno.EFBIG, f"{st.st_size} bytes, over the {max_bytes} byte limit; refused")
        chunks = []
        n = 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - n))
            except BlockingIOError:  # O_NONBLOCK on a regular file never blocks; be safe anyway
                break
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
            if n > max_bytes:
                raise UnsafeFile(errno.EFBIG, f"grew past the {max_bytes} byte limit while read; refused")
        return b"".join(chunks)
    finally:
        os.close(fd)
