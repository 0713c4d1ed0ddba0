"""Opening input files safely: the one place every reader opens a user-given path.

A FIFO would block ``open`` until a writer comes, ``/dev/zero`` never ends, a directory is not data, and a
file swapped for a FIFO between a check and the open would hang a check-then-open. So: open with
O_NONBLOCK, check the *open descriptor* with fstat, refuse anything but a regular file, then switch the
descriptor back to blocking reads. Each reader turns the two errors into its own one-line message.
"""
from __future__ import annotations

import os
import stat

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


def open_regular_fd(path: str) -> tuple[int, os.stat_result]:
    """A blocking-read descriptor of the regular file ``path`` and its stat. Raises OSError when it cannot
    be opened, NotRegularFile when it is anything else than a regular file (the descriptor is closed)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
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
