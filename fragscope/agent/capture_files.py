"""The files of captures: taking the probe's and the profiler's files safely, telling a complete trace
from one still being written, and the size of a capture directory (agent/capture.py uses them).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Iterable


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class UnsafeFile(OSError):
    """A file in the probe or profiler directory that the agent refuses to read (one line)."""


MAX_TAKE_BYTES = 8 << 30  # a snapshot pickle of a large model is ~100 MB-2 GB; a trace up to ~1 GB


def trusted_uids(directory: str, extra: Iterable[int] = ()) -> frozenset[int]:
    """Owners whose files in ``directory`` are read: the agent's own user, the directory's owner,
    and ``extra`` (capture.probe_uids)."""
    uids = {os.geteuid(), *extra}
    try:
        uids.add(os.stat(directory).st_uid)
    except OSError:
        pass
    return frozenset(uids)


def take_file(src: str, dest: str, uids: frozenset[int], remove: bool = False,
              max_bytes: int = MAX_TAKE_BYTES) -> int:
    """Copy ``src`` to a new file ``dest`` and return its size, opening ``src`` safely: never through a
    symbolic link (O_NOFOLLOW), never a FIFO or device (O_NONBLOCK, then a regular-file check on the
    open descriptor), owned by one of ``uids``, one link only, at most ``max_bytes``. ``remove``
    unlinks ``src`` afterwards (the probe's files are handed over). Raises UnsafeFile / OSError."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(f"{src}: is a symbolic link; refused") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{src}: not a regular file; refused")
        if st.st_uid not in uids:
            raise UnsafeFile(f"{src}: owned by uid {st.st_uid}, expected one of {sorted(uids)} "
                             "(the agent's user or the directory's owner; see capture.probe_uids); refused")
        if st.st_nlink != 1:
            raise UnsafeFile(f"{src}: has {st.st_nlink} hard links; refused")
        if st.st_size > max_bytes:
            raise UnsafeFile(f"{src}: {st.st_size} bytes, over the {max_bytes} byte limit; refused")
        os.set_blocking(fd, True)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      0o600)
        n = 0
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                n += len(chunk)
                if n > max_bytes:
                    raise UnsafeFile(f"{src}: grew past the {max_bytes} byte limit while read; refused")
                os.write(out, chunk)
        except BaseException:
            os.close(out)
            out = -1
            try:
                os.unlink(dest)
            except OSError:
                pass
            raise
        finally:
            if out >= 0:
                os.close(out)
    finally:
        os.close(fd)
    if remove:
        try:
            os.unlink(src)
        except OSError:
            pass
    return n


def trace_complete(path: str) -> bool:
    """A JSON trace ends with '}' (or ']'); a gzip one decompresses to its end without error."""
    try:
        if path.endswith(".gz"):
            import zlib

            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    d.decompress(chunk, 0)
                    if d.eof:
                        break
            return d.eof
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 64))
            tail = fh.read().rstrip()
        return tail.endswith((b"}", b"]"))
    except (OSError, ValueError, Exception):
        return False
