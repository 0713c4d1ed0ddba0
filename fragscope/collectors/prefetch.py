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
A plain file of SPLIT_MIN_BYTES or more is parsed by two children, one half each (the second half after the
family types the first declares, :func:`.exposition.parse_recording`'s ``span``); the parent joins the
halves (:func:`.exposition.join_parts`) when that is exactly the whole file's parse (nothing noted or
dropped in either half, no ``# EOF`` before the cut, every name typed alike in both, the caps not reached
together) and reads the file itself otherwise.
Figures: docs/performance.md ("Recording ingest: the parse beside the imports").

Only where it can pay: Linux (fork), at least two CPUs this process may run on, a load average and a
number of other tasks running right now (:func:`busy`) below their number (on a busy machine the child
finds no idle core, and the fork, the copies of written pages and the hand-back cost CPU: ~60 ms more than
one process at load 7 on the 2-core VM), no thread started yet,
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
# A plain file this large is parsed by two children, a half each (the parent's imports take one core for
# ~0.15-0.2 s, the parse of an 8-hour recording of 23 MB ~0.25-0.3 s: one child left the parent waiting for
# most of that; with two the three share the two cores). Smaller files: one child (a few ms of split work).
SPLIT_MIN_BYTES = 4 << 20
_NAME_START = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")

_PENDING: dict[str, list[tuple[int, int]]] = {}  # path -> its children: (pid, read end of its pipe)
spawned = 0  # children started by this process (tests)


def children_for(path: str) -> int:
    """How many children may read ``path`` here (see the module's docstring): 0 (the command reads it
    itself), 1, or 2 when no other task runs on this process's CPUs but one (three processes share them;
    :func:`halves` then says whether the file is one to cut)."""
    forced = os.environ.get(ENV_READ_CHILD, "").strip()
    if forced == "0" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return 0
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() != 1:
        return 0
    if forced == "1":
        return 2
    try:
        cpus = len(os.sched_getaffinity(0))
        load, others = busy()
    except (AttributeError, OSError):
        return 0
    if cpus < 2 or load >= cpus or others >= cpus:
        return 0
    from .safefile import OBSERVE_MIN_BYTES

    try:
        size = os.stat(path).st_size
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
    except OSError:
        return 0  # (the reader says what is wrong, in the parent)
    if size < (MIN_GZIP_BYTES if gz else MIN_BYTES):
        return 0
    try:
        bar = sys.stderr.isatty() and not os.environ.get("NO_COLOR_PROGRESS")  # as cli.base.install_progress
    except (AttributeError, ValueError):
        bar = False
    if bar and size >= OBSERVE_MIN_BYTES:
        return 0
    return 2 if others + 2 <= cpus else 1


def worthwhile(path: str) -> bool:
    """Whether reading ``path`` in a child can pay here (:func:`children_for`)."""
    return children_for(path) > 0


def busy(loadavg: str = "/proc/loadavg") -> tuple[float, int]:
    """(the 1-minute load average, the other tasks running right now): /proc/loadavg's running count less this
    process, which sees a load that began seconds ago where the average lags by a minute; 0 where it cannot
    be read."""
    try:
        with open(loadavg) as fh:
            fields = fh.read().split()
        return float(fields[0]), max(0, int(fields[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0], 0


def start(path: str) -> bool:
    """Fork the children that parse ``path`` when it pays here (:func:`children_for`); True when started."""
    n = children_for(path)
    return n > 0 and spawn(path, halves=n == 2)


def spawn(path: str, halves: bool = True) -> bool:
    """Fork a child that parses ``path`` as :func:`.exposition.read_recording` with its defaults does (with
    ``halves``, two, each half of it, for a large plain file: :func:`cut_in_halves`); True when started
    (:func:`take` and :func:`read` get the result)."""
    if path in _PENDING:
        return False
    from .exposition import parse_recording  # (before the fork: the child imports nothing)

    spans = (halves and cut_in_halves(path)) or [None]
    children = []
    for span in spans:
        child = _fork(path, parse_recording, span)
        if child is None:
            for pid, r in children:
                _end(pid, r)
            return False
        children.append(child)
    _PENDING[path] = children
    global spawned
    spawned += len(children)
    return True


def cut_in_halves(path: str) -> list[tuple[int, int]] | None:
    """The byte spans of ``path``'s two halves for two children: cut at the start of the first line after the
    middle that begins like a sample (a metric name's first character), for a plain file of SPLIT_MIN_BYTES
    or more; None to read it in one child (gzip, small, no such line near the middle)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < SPLIT_MIN_BYTES or fh.read(2) == b"\x1f\x8b":
                return None
            fh.seek(size // 2)
            chunk = fh.read(1 << 16)
    except OSError:
        return None
    i = chunk.find(b"\n")
    while 0 <= i < len(chunk) - 1:
        if chunk[i + 1] in _NAME_START:
            cut = size // 2 + i + 1
            return [(0, cut), (cut, size)]
        i = chunk.find(b"\n", i + 1)
    return None


def _fork(path: str, parse_recording, span) -> tuple[int, int] | None:
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: never returns
        _child(path, w, parse_recording, parent, span)
    os.close(w)
    return pid, r


def _child(path: str, w: int, parse_recording, parent: int, span) -> None:
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
            p, st = parse_recording(path, span=span) if span else parse_recording(path)
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
    children = _PENDING.pop(path, None)
    if children is None:
        return None
    msgs = [_handed_back(pid, r) for pid, r in children]
    if any(m is None for m in msgs):  # a child killed while it wrote (the OOM killer) hands back part of a pickle
        return None
    if len(msgs) == 2:  # two halves: joined where that gives the whole file's parse, else the caller reads it
        if msgs[0][0] != "ok" or msgs[1][0] != "ok":
            return None
        from .exposition import join_parts

        p = join_parts(msgs[0][1], msgs[1][1])
        if p is None:
            return None
        msg = ("ok", p, msgs[0][2])
    else:
        msg = msgs[0]
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


def _handed_back(pid: int, r: int):
    """One child's message, or None when it failed (killed while it wrote, or ended without writing)."""
    status = -1
    try:
        with open(r, "rb") as fh:
            data = fh.read()
    finally:
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            pass
    if not data or status != 0:
        return None
    import pickle

    return pickle.loads(data)


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
    killed sees it and ends: _end_when_orphaned.)"""
    while _PENDING:
        for pid, r in _PENDING.popitem()[1]:
            _end(pid, r)


def _end(pid: int, r: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
    os.close(r)
