"""Memory-snapshot bytes to plain Python objects, safely and within limits (pickle or JSON, gzip too).

Safety. PyTorch's own viewer opens these files with plain ``pickle.load``, which runs whatever a
crafted file asks for. Real snapshots hold only dicts, lists, tuples, strings, numbers and bools, so
:class:`_RefusingUnpickler` refuses every class lookup (GLOBAL, STACK_GLOBAL, INST, OBJ and the
EXT* registry all go through ``find_class``) and every persistent id. Without a class lookup nothing
callable can reach the unpickler's stack, so REDUCE, NEWOBJ and BUILD can only fail; when a load
fails, the opcode stream is walked with ``pickletools`` (no execution) to name the offending opcode.

Limits by design. The file size and the gzip-decompressed size are capped (``MAX_SNAPSHOT_BYTES``,
256 MiB by default, ``--max-bytes`` / ``FRAGSCOPE_SNAPSHOT_MAX_BYTES`` to raise it); the memory a
pickle or JSON document would take once loaded is estimated from its container opcodes before loading
(:func:`estimate_load_bytes`) and refused above ``LOAD_MEMORY_FACTOR`` x the cap; JSON ``NaN`` /
``Infinity`` tokens and integers of more than 4,300 digits are refused. Only regular files are opened
(a FIFO or a device would block or stream forever), without blocking. Normalisation (and its own
limits): :mod:`fragscope.collectors.snapshot`.
"""
from __future__ import annotations

from .safefile import NotRegularFile, fdopen_observed, open_regular_fd

import contextlib
import gc
import io
import json
import os
import pickle
import pickletools
import threading
import zlib

# A 100k-block snapshot with stack frames and a 100k-entry trace ring is ~10-30 MB (bench/bench_snapshot.py);
# 256 MiB leaves room for ten times that. Raise with --max-bytes / FRAGSCOPE_SNAPSHOT_MAX_BYTES.
MAX_SNAPSHOT_BYTES = 256 * 1024**2
MAX_BYTES_ENV = "FRAGSCOPE_SNAPSHOT_MAX_BYTES"
# Memory a load may take, as a multiple of the cap (256 MiB -> 5 GiB). Measured (tests/fuzz, docs/fuzzing.md):
# realistic snapshots cost 7.8-8.4 B of memory per pickle byte, a pickle made only of 1-byte container
# opcodes (`]`, `}`) 73.6 B; see estimate_load_bytes.
LOAD_MEMORY_FACTOR = 20  # the estimate reads 15-16 B/byte on realistic snapshots: a file at the cap passes
# opcodes that look up or call objects; a snapshot has none of them (SOURCES.txt of the samples)
_DANGEROUS_OPCODES = frozenset({
    "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD",
    "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID",
})


class SnapshotError(ValueError):
    """The file is not a readable, safe memory snapshot. ``str()`` is one line naming the file."""


class _Refused(Exception):
    pass


class _RefusingUnpickler(pickle.Unpickler):
    """C unpickler that refuses every class lookup and persistent id."""

    def find_class(self, module: str, name: str):  # noqa: D401
        raise _Refused(f"pickle references class {module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("pickle uses a persistent id (PERSID)")


def _cap_text(max_bytes: int) -> str:
    return (f"the {_fmt_size(max_bytes)} cap for a memory snapshot (raise it with --max-bytes SIZE or "
            f"{MAX_BYTES_ENV})")


def _fmt_size(n: int) -> str:
    for unit, k in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= k:
            return f"{n // k} {unit}" if n % k == 0 else f"{n / k:.1f} {unit}"
    return f"{n} byte"  # as in "the 100 byte cap"


def read_regular_file(path: str, max_bytes: int, what: str = "a memory snapshot") -> bytes:
    """The bytes of ``path`` if it is a non-empty regular file of at most ``max_bytes``; SnapshotError else.

    Opened with O_NONBLOCK and checked with fstat on the open descriptor, so a FIFO, socket or device
    is refused without blocking, and a file swapped after the check is not read.
    """
    name = str(path)
    try:
        fd, st = open_regular_fd(path)
    except NotRegularFile as e:
        kind = "a directory" if e.is_dir else "a FIFO" if e.is_fifo else "a device or socket"
        raise SnapshotError(f"cannot read {name}: not a regular file ({kind})") from None
    except OSError as e:
        raise SnapshotError(f"cannot read {name}: {e.strerror or e}") from None
    try:
        if st.st_size > max_bytes:
            raise SnapshotError(f"refusing to load {name}: {st.st_size} bytes exceeds {_cap_text(max_bytes)}")
        if st.st_size == 0:
            raise SnapshotError(f"cannot read {name}: empty file, not {what}")
        with fdopen_observed(os.dup(fd), st.st_size, name) as f:  # a progress bar on a terminal
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise SnapshotError(f"cannot read {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew after fstat
        raise SnapshotError(f"refusing to load {name}: more than {max_bytes} bytes exceeds {_cap_text(max_bytes)}")
    return data


# single-byte opcodes / tokens that each create a container object (pickle: EMPTY_DICT, EMPTY_LIST, MARK
# (before DICT, LIST, TUPLE, FROZENSET), TUPLE1-3, EMPTY_SET; JSON: objects and arrays)
_PICKLE_CONTAINER_OPS = b"}](\x85\x86\x87\x8f"  # MARK ( precedes LIST/DICT/TUPLE/FROZENSET
_JSON_CONTAINER_TOKENS = b"{["
_DROP = {k: bytes(b for b in range(256) if b not in k) for k in (_PICKLE_CONTAINER_OPS, _JSON_CONTAINER_TOKENS)}


def estimate_load_bytes(data: bytes, kind: str) -> int:
    """Upper estimate of the memory (bytes) loading ``data`` as ``kind`` ('pickle' or 'json') takes.

    12 B per input byte (realistic snapshots measure 7.8-8.4 B/byte as pickles) plus 64 B (an empty dict
    or list object) per byte that can create a container: a pickle of only `]` opcodes measures 73.6
    B/byte. One C pass (bytes.translate) over the data.
    """
    keep = _PICKLE_CONTAINER_OPS if kind == "pickle" else _JSON_CONTAINER_TOKENS
    n_containers = len(data.translate(None, _DROP[keep]))
    return 12 * len(data) + 64 * n_containers


def _check_load_memory(data: bytes, kind: str, name: str, max_bytes: int) -> None:
    need = estimate_load_bytes(data, kind)
    budget = LOAD_MEMORY_FACTOR * max_bytes
    if need > budget:
        raise SnapshotError(f"refusing to load {name}: loading this {kind} would take about {_fmt_size(need)} of "
                            f"memory ({len(data)} bytes, mostly container opcodes), over {LOAD_MEMORY_FACTOR} x "
                            f"{_cap_text(max_bytes)}")


def load_snapshot_bytes(data: bytes, name: str = "snapshot",
                        max_bytes: int = MAX_SNAPSHOT_BYTES) -> tuple[object, str]:
    """Decode bytes into plain Python objects without running code. Returns (object, container)."""
    gz = data[:2] == b"\x1f\x8b"
    if gz:
        data = _gunzip(data, name, max_bytes)
        if not data:
            raise SnapshotError(f"cannot read {name}: gzip stream is empty, not a memory snapshot")
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        _check_load_memory(data, "json", name, max_bytes)
        return _load_json(data, name), "json.gz" if gz else "json"
    if data[:1] == b"\x80" or head in (b"(", b"}", b"]", b"c"):
        _check_load_memory(data, "pickle", name, max_bytes)
        return _load_pickle(data, name, max_bytes), "pickle.gz" if gz else "pickle"
    raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (neither a pickle nor JSON; "
                        f"write one with torch.cuda.memory._dump_snapshot(path))")


def _gunzip(data: bytes, name: str, max_bytes: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = io.BytesIO()
    try:
        view = memoryview(data)
        step = 1 << 20
        for i in range(0, len(data), step):
            chunk = d.decompress(view[i:i + step], max_bytes + 1 - out.tell())
            out.write(chunk)
            if out.tell() > max_bytes or d.unconsumed_tail:
                raise SnapshotError(f"refusing to load {name}: decompressed size exceeds {_cap_text(max_bytes)}")
            if d.eof:
                break
    except zlib.error as e:
        raise SnapshotError(f"cannot read {name}: corrupt gzip data ({e})") from None
    if not d.eof:
        raise SnapshotError(f"cannot read {name}: truncated gzip file (stream ends before its end marker)")
    return out.getvalue()


def _refuse_constant(token: str):
    raise ValueError(f"{token} is not a JSON number")


def _load_json(data: bytes, name: str) -> object:
    try:
        # NaN / Infinity are not JSON (Python accepts them by default); 1e400 still reads as inf and is
        # refused or dropped where a number is read
        return json.loads(data, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f" at byte {e.pos}" if isinstance(e, json.JSONDecodeError) else ""
        if isinstance(e, json.JSONDecodeError) and (e.msg.startswith("Unterminated")
                                                    or e.pos >= len(e.doc.rstrip())):
            raise SnapshotError(f"cannot read {name}: truncated JSON (ends{where} inside a value)") from None
        detail = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise SnapshotError(f"cannot read {name}: invalid JSON{where} ({detail})") from None
    except RecursionError:
        raise SnapshotError(f"cannot read {name}: JSON nested too deeply, not a memory snapshot") from None
    except ValueError as e:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits), NaN
        msg = str(e).splitlines()[0] if str(e) else "bad number"
        if "digits" in msg:
            msg = "an integer has more digits than Python reads (4,300)"
        raise SnapshotError(f"cannot read {name}: invalid JSON ({msg}), not a memory snapshot") from None


def _load_pickle(data: bytes, name: str, max_bytes: int = MAX_SNAPSHOT_BYTES) -> object:
    # The cyclic GC adds nothing while unpickling plain containers but runs many passes over the
    # growing heap: a 100k-block snapshot (12.7 MB, bench/bench_snapshot.py) loads in 144 ms with it
    # paused against 344 ms with it on.
    budget = LOAD_MEMORY_FACTOR * max_bytes
    if threading.active_count() > 1:  # no process-wide limit in a threaded host (the agent): check exactly
        _check_memo_indices(data, name, budget)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with _address_space_limit(budget):
            return _RefusingUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise SnapshotError(f"refusing to load {name}: {e} (a memory snapshot holds only plain data; "
                            f"this file could run code)") from None
    except MemoryError:
        raise SnapshotError(f"refusing to load {name}: unpickling it needs more than the {_fmt_size(budget)} "
                            f"load budget, {LOAD_MEMORY_FACTOR} x {_cap_text(max_bytes)}") from None
    except Exception as e:  # noqa: BLE001 - any failure is explained from the opcode stream below
        scan = _scan_opcodes(data)
        raise SnapshotError(f"{'refusing to load' if scan[0] else 'cannot read'} {name}: "
                            f"{_explain_pickle_failure(scan, e)}") from None
    finally:
        if was_enabled:
            gc.enable()


# The C unpickler keeps its memo in an array as long as the largest PUT index: one LONG_BINPUT with
# index 2**31 in a 9 KB file makes it allocate and zero 16 GiB (found by tests/fuzz: the kernel killed
# the process at 23.8 GB RSS). A single-threaded process (the CLI) loads under a soft RLIMIT_AS of its
# current size plus the load budget, so any such allocation fails as MemoryError; a threaded host (the
# agent), where a process-wide limit would hit other threads, walks the opcodes first instead (~1 µs
# per opcode) and refuses a memo index the file cannot fill.
@contextlib.contextmanager
def _address_space_limit(extra_bytes: int):
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):  # not Linux: the opcode walk is the guard
        yield
        return
    if threading.active_count() > 1:
        yield
        return
    limit = vm + extra_bytes
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield  # already tighter
        return
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _check_memo_indices(data: bytes, name: str, budget: int) -> None:
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in _PUT_OPS and isinstance(arg, int) and (arg > len(data) or 16 * arg > budget):
                raise SnapshotError(f"refusing to load {name}: pickle memo index {arg} in a {len(data)}-byte file "
                                    f"(the unpickler would allocate {_fmt_size(16 * arg)} for it)")
    except SnapshotError:
        raise
    except Exception:  # noqa: BLE001 - a corrupt stream fails the load itself, with its explanation
        return


# pickletools.genops is pure Python, ~1 µs per opcode: the explanation of a failed load looks at the
# first 100,000 opcodes (~0.1 s), so 8 MiB of junk opcodes cannot stall the error for 10 s and more.
_SCAN_MAX_OPS = 100_000


def _scan_opcodes(data: bytes) -> tuple[tuple[str, int] | None, str | None, bool]:
    """Walk the opcodes (nothing executed): (first dangerous opcode and its byte, the walk's error,
    whether the walk reached the end or an error within ``_SCAN_MAX_OPS``)."""
    try:
        for k, (op, _arg, pos) in enumerate(pickletools.genops(data)):
            if op.name in _DANGEROUS_OPCODES:
                return (op.name, pos), None, True
            if k >= _SCAN_MAX_OPS:
                return None, None, False
    except Exception as e:  # noqa: BLE001 - truncated or corrupt: no dangerous opcode before the damage
        return None, str(e) or type(e).__name__, True
    return None, None, True


def _first_dangerous(data: bytes) -> tuple[str, int] | None:
    return _scan_opcodes(data)[0]


def _explain_pickle_failure(scan: tuple, exc: BaseException) -> str:
    bad, walk_error, complete = scan
    if bad:
        return (f"pickle has a {bad[0]} opcode at byte {bad[1]} (a memory snapshot holds only plain "
                f"data; this file could run code)")
    if walk_error is not None:
        msg = walk_error.splitlines()[0]
        if "exhausted" in msg or "truncated" in msg or "not enough data" in msg or "no newline" in msg:
            return "truncated pickle (data ends before the STOP opcode)"
        return f"corrupt pickle ({msg[:200]})"
    if isinstance(exc, EOFError) or (complete is False and "ran out of input" in str(exc).lower()):
        return "truncated pickle (data ends before the STOP opcode)"
    return f"corrupt pickle ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"




# values read from the file, checked once for every module that reads them
_INT64_MAX = (1 << 63) - 1


def label(v) -> str:
    """A name read from the file, for counts and messages: strings (cut at 200 characters) and 64-bit
    ints as themselves, anything else by type (``str()`` of a 5,000-digit int raises, of a deep list recurses)."""
    if isinstance(v, str):
        return v[:200]
    if i64(v) is not None:
        return str(v)
    return f"<{type(v).__name__}>"


def i64(v) -> int | None:
    """``v`` as an int if it is one (not a bool) that fits in a signed 64-bit integer, else None."""
    if isinstance(v, int) and not isinstance(v, bool) and -_INT64_MAX - 1 <= v <= _INT64_MAX:
        return int(v)
    return None


__all__ = ["SnapshotError", "read_regular_file", "load_snapshot_bytes", "estimate_load_bytes", "MAX_SNAPSHOT_BYTES",
           "MAX_BYTES_ENV", "LOAD_MEMORY_FACTOR"]
