"""``diagnose FILE``'s read in a forked child while the parent imports numpy and the detectors.

A whole ``diagnose FILE`` process spends about as long importing (the interpreter, numpy, click, the
detectors: ~0.2 s) as it spends parsing an 8-hour recording (~0.2 s), one after the other on one core.
The parse needs none of those imports (:func:`.exposition.parse_recording` runs without numpy), so the
console entry forks a child that parses the file while the parent imports; the child hands back what it
parsed, its columns as ``array('d')`` (one pickle of ~3.4 MB for 213k points, ~4 ms to write, ~1 ms to
read back), and the parent makes the window (:func:`.exposition.recording_window`) as the reader
would have. The same floats, the same errors (a ParseError comes back as its message and reader); when
anything else goes wrong in the child (an OSError, a crash) the parent reads the file itself.
A child whose parent is gone (killed: SIGKILL runs no handler) ends itself within ORPHAN_POLL_S.
Figures: docs/performance.md ("Recording ingest: the parse beside the imports").

Only where it can pay: Linux (fork), at least two CPUs this process may run on and a load average below
their number (on a busy machine the child finds no idle core, and the fork, the copies of written pages and
the hand-back cost CPU: ~60 ms more than one process at load 7 on the 2-core VM), no thread started yet,
a file large enough that its parse outweighs the fork and the hand-back, and not when the command shows
a progress bar for it (a terminal, a large input: the bar is drawn by the process that reads).
``FRAGSCOPE_READ_CHILD=0`` never forks; ``=1`` forks whatever the load and the size (Linux, no thread).
"""
from __future__ import annotations

import _thread
import os
import sys
import time

# A plain file smaller than this parses in a few ms (~1 µs a line of ~110 bytes): less than the fork and
# the hand-back save; a gzipped one expands ~20x (docs/collectors.md#recordings).
MIN_BYTES = 512 * 1024
MIN_GZIP_BYTES = 32 * 1024

ENV_READ_CHILD = "FRAGSCOPE_READ_CHILD"
ORPHAN_POLL_S = 0.25  # how often the child looks whether its parent is still there

_PENDING: dict[str, tuple[int, int]] = {}  # path -> (child pid, read end of its pipe)
spawned = 0  # children started by this process (tests)


def worthwhile(path: str) -> bool:
    """Whether reading ``path`` in a child can pay here (see the module's docstring)."""
    forced = os.environ.get(ENV_READ_CHILD, "").strip()
    if forced == "0" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() != 1:
        return False
    if forced == "1":
        return True
    try:
        cpus = len(os.sched_getaffinity(0))
        if cpus < 2 or os.getloadavg()[0] >= cpus:
            return False
    except (AttributeError, OSError):
        return False
    from .safefile import OBSERVE_MIN_BYTES

    try:
        size = os.stat(path).st_size
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False  # (the reader says what is wrong, in the parent)
    if size < (MIN_GZIP_BYTES if gz else MIN_BYTES):
        return False
    try:
        bar = sys.stderr.isatty() and not os.environ.get("NO_COLOR_PROGRESS")  # as cli.base.install_progress
    except (AttributeError, ValueError):
        bar = False
    return not (bar and size >= OBSERVE_MIN_BYTES)


def start(path: str) -> bool:
    """Fork a child that parses ``path`` when it pays here (:func:`worthwhile`); True when one was started."""
    return worthwhile(path) and spawn(path)


def spawn(path: str) -> bool:
    """Fork a child that parses ``path`` as :func:`.exposition.read_recording` with its defaults does;
    True when one was started (:func:`take` and :func:`read` get its result)."""
    if path in _PENDING:
        return False
    from .exposition import parse_recording  # (before the fork: the child imports nothing)

    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return False
    if pid == 0:  # the child: never returns
        _child(path, w, parse_recording, parent)
    os.close(w)
    _PENDING[path] = (pid, r)
    global spawned
    spawned += 1
    return True


def _child(path: str, w: int, parse_recording, parent: int) -> None:
    code = 1
    try:
        import gc
        import pickle
        import signal
        from array import array

        from .exposition import ParseError
        from .inputs import InputError

        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: the parent answers it; this one just ends
        gc.disable()  # (a short-lived process that makes no cycles)
        _thread.start_new_thread(_end_when_orphaned, (parent,))
        try:
            p, st = parse_recording(path)
        except (ParseError, InputError) as e:
            msg = ("error", str(e), getattr(e, "reader", None))
        else:
            p.cols = {k: (array("d", ts), array("d", vs)) for k, (ts, vs) in p.cols.items()}
            msg = ("ok", p, st)
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with open(w, "wb") as fh:
            fh.write(data)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent reads the file itself and says what is wrong
        pass
    finally:
        os._exit(code)  # no teardown, no atexit, no flush of the parent's buffers


def _end_when_orphaned(parent: int) -> None:
    """The child's watch on its parent: once the parent is gone (killed, SIGKILL included: no handler runs),
    nobody will read what the child parses, so it ends within ORPHAN_POLL_S instead of parsing on (a 4 GiB
    file is minutes of a core). A sleeping thread: the parse keeps the interpreter between its wake-ups."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(1)


def pending(path: str) -> bool:
    """Whether a child is reading ``path`` (its result not taken yet)."""
    return path in _PENDING


def take(path: str):
    """What the child parsed for ``path``: (Parsed, os.stat_result) with its columns as numpy arrays (a
    recording with timestamps) or lists (scrapes), as :func:`.exposition.parse_recording` returns them;
    None when no child read it or it failed (the caller reads the file itself). Raises the child's
    ParseError."""
    pending = _PENDING.pop(path, None)
    if pending is None:
        return None
    pid, r = pending
    status = -1
    try:
        with open(r, "rb") as fh:
            data = fh.read()
    finally:
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            pass
    if not data or status != 0:  # a child killed while it wrote (the OOM killer) hands back part of a pickle
        return None
    import pickle

    msg = pickle.loads(data)
    if msg[0] == "error":
        from .exposition import ParseError

        raise ParseError(msg[1], msg[2])
    p, st = msg[1], msg[2]
    if p.scrape_mode:  # scrapes.build_window reads lists (small inputs)
        p.cols = {k: (ts.tolist(), vs.tolist()) for k, (ts, vs) in p.cols.items()}
    else:  # scrapes.bulk_window concatenates arrays: the same float64 values as from the lists
        import numpy as np

        p.cols = {k: (np.frombuffer(ts, dtype=np.float64), np.frombuffer(vs, dtype=np.float64))
                  for k, (ts, vs) in p.cols.items()}
    return p, st


def read(path: str):
    """The window of ``path`` from its child (:func:`.exposition.read_recording`'s result and errors), or
    None when no child read it (the caller reads it)."""
    from .exposition import ParseError, recording_window
    from .inputs import InputError

    try:
        got = take(path)
        if got is None:
            return None
        return recording_window(path, got[0], got[1])
    except InputError as e:
        raise ParseError(str(e)) from None


def abandon() -> None:
    """End the children whose result nobody took (the command failed before reading its file, or read it
    differently): the console entry calls this as it exits. (Not an atexit handler: one registered keeps
    the command from ending without the interpreter's teardown, cli.base.exit_now. A child whose parent was
    killed ends when it hands back its result: no reader.)"""
    import signal

    while _PENDING:
        _, (pid, r) = _PENDING.popitem()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        os.close(r)
