"""Fuzzing harness for the four ``diagnose`` readers: a seeded mutator over the real fixtures, and a runner
that checks the CLI contract on each mutated input.

Readers (``READERS``): ``recording`` (``diagnose FILE``), ``snapshot``, ``trace``, ``logs``. Seeds are the
fixtures in tests/data and examples/ (trimmed at load time where they are large: see ``seeds``).

Contract checked on every run (docs/fuzzing.md):
- exit 0 or 1 only with output on stdout; with ``--format json`` that output parses as strict JSON
  (no ``NaN``/``Infinity`` tokens);
- exit 2 with exactly one non-empty line on stderr;
- never a traceback, never exit 3 (an escaped exception), never another exit code, never past the
  time limit, never past the memory limit (subprocess runs).

Two ways to run an input: in-process through ``fragscope.cli.cli_exit_code`` inside click's ``CliRunner``
isolation (fast; a SIGALRM timer bounds the time and names where a hang was), and as a real subprocess
under ``RLIMIT_AS`` and a timeout (peak RSS from ``wait4``). Used by tests/fuzz/test_fuzz.py and
bench/fuzz.py.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import random
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
READERS = ("recording", "snapshot", "trace", "logs")
REPRO_DIR = Path(__file__).resolve().parent / "repro"


# ---------------------------------------------------------------------------------------------
# seeds
@dataclass
class Seed:
    name: str
    data: bytes
    ext: str  # file name ending the reader may look at (".om", ".pickle", ".json", ".sqlite", ".log")
    kind: str  # "text", "json", "pickle", "sqlite"


def _trim_recording(text: str, points: int = 6) -> str:
    """Keep each series' first ``points`` samples (plus all comment lines): a few KB of a 4.9 MB example."""
    seen: dict[str, int] = {}
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        key = line.rsplit(" ", 2)[0]
        n = seen.get(key, 0)
        if n < points:
            out.append(line)
        seen[key] = n + 1
    return "\n".join(out) + "\n"


def _trim_kineto(doc: dict, per_cat: int = 120) -> dict:
    """Keep the first ``per_cat`` events of each category (kernels, runtime calls, CPU ops...), in file order."""
    taken: dict = {}
    keep = []
    for e in doc.get("traceEvents", []):
        cat = e.get("cat") if isinstance(e, dict) else None
        n = taken.get(cat, 0)
        if n < per_cat:
            keep.append(e)
        taken[cat] = n + 1
    return {**doc, "traceEvents": keep}


def _nsys_seed() -> bytes:
    """A small Nsight Systems SQLite export with the real schema (tests/data/trace/nsys_schema.sql)."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "seed.sqlite")
        c = sqlite3.connect(p)
        c.executescript((DATA / "trace" / "nsys_schema.sql").read_text())
        c.executemany("INSERT INTO StringIds VALUES (?, ?)",
                      [(1, "cudaLaunchKernel_v7000"), (2, "cudaStreamSynchronize_v3020"), (3, "gemm"),
                       (4, "cudaMalloc_v3020")])
        c.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
        gp = (1 << 48) | (1234 << 24)
        for i in range(30):
            t = 1_000_000 + i * 40_000
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                      "nameId, returnValue) VALUES (?,?,1,?,?,?,0)", (t, t + 8_000, gp | 1235, i + 1, 1 if i % 7 else 2))
            c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                      "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                      "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
                      "VALUES (?,?,0,1,7,?,?,3,3,32,1,1,1,128,1,1,0,0,0,0,0)", (t + 9_500, t + 12_500, i + 1, gp))
        c.commit()
        c.close()
        return Path(p).read_bytes()


_SEEDS: dict[str, list[Seed]] = {}


def seeds(reader: str) -> list[Seed]:
    """The real fixtures for ``reader``, loaded once. Large ones are trimmed structurally (see above)."""
    if reader in _SEEDS:
        return _SEEDS[reader]
    out: list[Seed] = []
    if reader == "recording":
        for p in sorted((ROOT / "examples").glob("*.om.gz")):
            out.append(Seed(p.name, _trim_recording(gzip.decompress(p.read_bytes()).decode()).encode(), ".om", "text"))
        for p in sorted((DATA / "collectors").glob("*.metrics.txt")):
            out.append(Seed(p.name, p.read_bytes(), ".prom", "text"))
    elif reader == "snapshot":
        for p in sorted((DATA / "snapshot").glob("*.pickle")):
            raw = p.read_bytes()
            out.append(Seed(p.name, raw, ".pickle", "pickle"))
            from fragscope.collectors.snapshot import load_snapshot_bytes  # the safe loader

            obj, _ = load_snapshot_bytes(raw, p.name)
            out.append(Seed(p.stem + ".json", json.dumps(obj).encode(), ".json", "json"))
    elif reader == "trace":
        for p in sorted((DATA / "trace").glob("*.json.gz")):
            doc = json.loads(gzip.decompress(p.read_bytes()))
            out.append(Seed(p.name[:-3], json.dumps(_trim_kineto(doc)).encode(), ".json", "json"))
        out.append(Seed("nsys_seed.sqlite", _nsys_seed(), ".sqlite", "sqlite"))
    elif reader == "logs":
        for p in sorted((DATA / "logs").glob("*.log")):
            out.append(Seed(p.name, p.read_bytes(), ".log", "text"))
    else:
        raise ValueError(reader)
    _SEEDS[reader] = out
    return out


# ---------------------------------------------------------------------------------------------
# mutations
HOSTILE_NUMBERS = ["NaN", "nan", "Inf", "-Inf", "+Inf", "1e400", "-1e400", "9" * 400, "1" + "0" * 30,
                   "18446744073709551616", "-9223372036854775809", "9223372036854775807", "0", "-1", "-0",
                   ".000.0", "1e-400", "0x10", "1_000", "253402300800", "1700000000000000", "1700000000000000000"]
HOSTILE_VALUES = [float("nan"), float("inf"), -float("inf"), 2**64, -(2**63) - 1, 10**5000, 10**30, -1, 0, 1.5,
                  True, None, "", "x" * 1000, "NaN", [], {}, [1, 2], {"a": 1}, [[[]]], "\u00e9"]


def _numbers(text: bytes) -> list[re.Match]:
    return list(re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text))


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def m_truncate(r: random.Random, data: bytes, **_) -> bytes:
    return data[: r.randrange(0, max(1, len(data)))]


def m_flip(r: random.Random, data: bytes, **_) -> bytes:
    b = bytearray(data)
    for _ in range(r.choice((1, 2, 4, 16))):
        if b:
            b[r.randrange(len(b))] = r.randrange(256)
    return bytes(b)


def m_insert(r: random.Random, data: bytes, **_) -> bytes:
    i = r.randrange(0, len(data) + 1)
    junk = r.choice([b"\x00", b"\xff\xfe", b"\n", b"{", b"[", b'"', b"\\", b"\x80\x04",
                     bytes(r.randrange(256) for _ in range(r.randrange(1, 64)))])
    return data[:i] + junk + data[i:]


def m_delete(r: random.Random, data: bytes, **_) -> bytes:
    if not data:
        return data
    i = r.randrange(len(data))
    return data[:i] + data[i + r.randrange(1, 1 + min(4096, len(data) - i)):]


def m_duplicate_range(r: random.Random, data: bytes, **_) -> bytes:
    if not data:
        return data
    i = r.randrange(len(data))
    j = min(len(data), i + r.randrange(1, 2048))
    k = max(1, min(r.choice((1, 2, 50)), MAX_GROWTH_BYTES // (j - i)))
    return data[:j] + data[i:j] * k + data[j:]


def m_splice(r: random.Random, data: bytes, other: bytes = b"", **_) -> bytes:
    if not other:
        return data
    return data[: r.randrange(len(data) + 1)] + other[r.randrange(len(other) + 1):]


MAX_GROWTH_BYTES = 1 << 20  # a mutation adds at most ~1 MiB (a 100 KB one-line JSON x 1000 would be 100 MB)


def m_dup_lines(r: random.Random, data: bytes, **_) -> bytes:
    ls = _lines(data)
    i = r.randrange(len(ls))
    n = max(2, min(r.choice((2, 10, 1000)), MAX_GROWTH_BYTES // (len(ls[i]) + 1)))
    return b"\n".join(ls[:i] + [ls[i]] * n + ls[i:])


def m_shuffle_lines(r: random.Random, data: bytes, **_) -> bytes:
    ls = _lines(data)
    if len(ls) > 2:
        i = r.randrange(len(ls) - 1)
        j = min(len(ls), i + r.randrange(2, 50))
        part = ls[i:j]
        r.shuffle(part)
        ls[i:j] = part
    return b"\n".join(ls)


def m_number(r: random.Random, data: bytes, **_) -> bytes:
    """Replace one or a few numbers in the text with hostile ones (NaN, Inf, 400 digits, year 10000...)."""
    nums = _numbers(data[: 1 << 20])
    if not nums:
        return data
    out = data
    for m in sorted(r.sample(nums, min(len(nums), r.choice((1, 1, 3, 20)))), key=lambda m: -m.start()):
        out = out[: m.start()] + r.choice(HOSTILE_NUMBERS).encode() + out[m.end():]
    return out


def m_scale_timestamps(r: random.Random, data: bytes, **_) -> bytes:
    """Multiply every 10-digit number (epoch seconds) by 1e3/1e6/1e9 or push it past year 9999."""
    k = r.choice((1000, 10**6, 10**9, 25))
    return re.sub(rb"\b1[5-9]\d{8}\b", lambda m: str(int(m.group()) * k).encode(), data)


def m_many_series(r: random.Random, data: bytes, **_) -> bytes:
    """Many short-lived series over a long span (the quadratic case): n series x 2 points."""
    n = r.choice((200, 2000))
    t0 = 1767225600
    lines = [b"# TYPE fz_gauge gauge"]
    for i in range(n):
        for k in range(2):
            lines.append(b'fz_gauge{pod="p%d"} %d %d' % (i, k, t0 + i * 60 + k * 30))
    return data + b"\n" + b"\n".join(lines) + b"\n"


def m_gzip(r: random.Random, data: bytes, **_) -> bytes:
    z = gzip.compress(data, compresslevel=1, mtime=0)
    what = r.random()
    if what < 0.5:
        return z
    if what < 0.75:
        return z[: r.randrange(10, max(11, len(z)))]  # truncated gzip
    b = bytearray(z)
    b[-8] ^= 0xFF  # bad CRC
    return bytes(b)


BOMB_MIB = 2.0  # "small": 2 MiB unpacked keeps in-process runs light; bench/fuzz.py --bomb-mib for more
_BOMBS: dict = {}


def m_gzip_bomb(r: random.Random, data: bytes, **_) -> bytes:
    """A small gzip bomb: ~8 KB that unpacks to BOMB_MIB MiB (newlines, zeros, `]` or a repeated line)."""
    fill = r.choice((b"\n", b"\x00", b"]", (_lines(data)[:3] or [b"x"])[-1][:200] + b"\n"))
    key = (data[:200], fill, BOMB_MIB)
    if key not in _BOMBS:
        if len(_BOMBS) > 64:
            _BOMBS.clear()
        co = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = fill * ((1 << 18) // len(fill))  # 256 KiB pieces
        _BOMBS[key] = b"".join([co.compress(data[:200])] + [co.compress(chunk) for _ in range(int(BOMB_MIB * 4))]
                               + [co.flush()])
    return _BOMBS[key]


# structure-aware: JSON / pickle documents
def _walk_paths(obj, path=(), out=None, limit=4000):
    if out is None:
        out = []
    if len(out) >= limit:
        return out
    out.append(path)
    if isinstance(obj, dict):
        for k in list(obj)[:50]:
            _walk_paths(obj[k], path + (k,), out, limit)
    elif isinstance(obj, list):
        idx = range(len(obj)) if len(obj) <= 20 else sorted(random.Random(len(obj)).sample(range(len(obj)), 20))
        for i in idx:
            _walk_paths(obj[i], path + (i,), out, limit)
    return out


def _set(obj, path, value):
    if not path:
        return value
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _deep(n: int, leaf=0):
    v = leaf
    for _ in range(n):
        v = [v]
    return v


def mutate_doc(r: random.Random, obj):
    """Change one value deep inside a decoded document: wrong type, hostile number, deep nesting, dup."""
    paths = _walk_paths(obj)
    path = r.choice(paths)
    what = r.random()
    if what < 0.55:
        value = r.choice(HOSTILE_VALUES)
    elif what < 0.65:
        value = f"__DEEP_{r.choice((100, 5000, 200_000))}__"  # written as nested arrays by _json_dumps
    elif what < 0.8 and path:
        parent = _get(obj, path[:-1])
        if isinstance(parent, list):
            parent.extend([parent[path[-1]]] * r.choice((2, 100)))
            return obj
        if isinstance(parent, dict):
            del parent[path[-1]]  # a missing key
            return obj
        value = None
    else:
        cur = _get(obj, path)
        if isinstance(cur, str):  # a number in a string, or a string where a list was
            value = int(cur) if cur.isdigit() and len(cur) < 4000 else [cur]
        else:  # the value as a string (a 5,000-digit int becomes a shorter one)
            value = str(cur) if not isinstance(cur, int) or abs(cur) < 10**4000 else "9" * 4000
    return _set(obj, path, value)


def _json_dumps(obj) -> bytes:
    """JSON as a careless writer would emit it: NaN/Infinity tokens, 5,000-digit ints, deep arrays."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # let json write a 5,000-digit int (a reader must refuse it)
    try:
        text = json.dumps(obj, allow_nan=True)
    finally:
        sys.set_int_max_str_digits(old)
    return re.sub(r'"__DEEP_(\d+)__"', lambda m: "[" * int(m.group(1)) + "0" + "]" * int(m.group(1)),
                  text).encode()


def _pickle_value(v):
    if isinstance(v, str) and v.startswith("__DEEP_"):
        return _deep(min(int(v[7:-2]), 400))  # pickle.dumps recurses too: 400 levels
    return v


def m_doc(r: random.Random, data: bytes, seed: Seed = None, **_) -> bytes:
    """Structure-aware mutation of a JSON or pickle seed (decoded, changed, encoded again)."""
    if seed is None or seed.kind not in ("json", "pickle"):
        return m_number(r, data)
    try:
        if seed.kind == "json":
            obj = json.loads(data)
        else:
            from fragscope.collectors.snapshot import load_snapshot_bytes

            obj, _ = load_snapshot_bytes(data, "seed")
    except Exception:  # noqa: BLE001 - an already-mutated input: fall back to bytes
        return m_flip(r, data)
    for _ in range(r.choice((1, 1, 2, 5))):
        obj = mutate_doc(r, obj)
    if seed.kind == "pickle" and r.random() < 0.8:
        old = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)  # protocol 0 writes ints as text
        try:
            return pickle.dumps(_map_values(obj, _pickle_value), protocol=r.choice((0, 2, 4, 5)))
        finally:
            sys.set_int_max_str_digits(old)
    return _json_dumps(obj)


def _map_values(obj, f):
    if isinstance(obj, dict):
        return {k: _map_values(v, f) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_values(v, f) for v in obj]
    return f(obj)


def m_sqlite(r: random.Random, data: bytes, seed: Seed = None, **_) -> bytes:
    """SQLite-aware: put text, NaN, huge or negative values into random cells, drop a table, add a VIEW."""
    if not data.startswith(b"SQLite format 3\x00"):
        return m_flip(r, data)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.sqlite")
        Path(p).write_bytes(data)
        try:
            c = sqlite3.connect(p)
            tables = [t for (t,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for _ in range(r.choice((1, 3, 10))):
                t = r.choice(tables)
                cols = [row[1] for row in c.execute(f'PRAGMA table_info("{t}")')]
                if not cols:
                    continue
                col = r.choice(cols)
                op = r.random()
                if op < 0.7:
                    v = r.choice(["text", "", float("nan"), 2**63 - 1, -(2**63), 1e308, -1, 0, b"\xff\xfe", None,
                                  "1700000000000000000", 1.5])
                    rowids = [x for (x,) in c.execute(f'SELECT rowid FROM "{t}"')]
                    pick = r.sample(rowids, min(len(rowids), r.choice((1, 5, 1000))))
                    c.executemany(f'UPDATE "{t}" SET "{col}" = ? WHERE rowid = ?', [(v, x) for x in pick])
                elif op < 0.8:
                    c.execute(f'INSERT INTO "{t}" ("{col}") VALUES (?)', (r.choice([2**63 - 1, "x", None]),))
                elif op < 0.9:
                    c.execute(f'DELETE FROM "{t}"')
                else:
                    c.execute(f'DROP TABLE "{t}"')
                    tables.remove(t)
                    if not tables:
                        break
            c.commit()
            c.close()
        except Exception:  # noqa: BLE001 - an already-corrupted file (sqlite3.Error, UnicodeDecodeError...)
            return m_flip(r, data)
        return Path(p).read_bytes()


BYTE_MUTATORS = [m_truncate, m_flip, m_insert, m_delete, m_duplicate_range, m_splice]
TEXT_MUTATORS = [m_dup_lines, m_shuffle_lines, m_number, m_number, m_scale_timestamps]
COMPRESS_MUTATORS = [m_gzip, m_gzip_bomb]


def mutators_for(reader: str, seed: Seed) -> list:
    ms = list(BYTE_MUTATORS) + list(COMPRESS_MUTATORS)
    if seed.kind in ("text", "json"):
        ms += TEXT_MUTATORS
    if seed.kind in ("json", "pickle"):
        ms += [m_doc] * 4
    if seed.kind == "sqlite":
        ms += [m_sqlite] * 6
    if reader == "recording":
        ms += [m_many_series, m_scale_timestamps]
    return ms


@dataclass
class FuzzInput:
    reader: str
    seed: str
    ops: list[str]
    data: bytes
    ext: str
    fmt: str


def generate(reader: str, rnd: random.Random) -> FuzzInput:
    """One mutated input: a seed, 1-3 mutations (the last may wrap it in gzip), a random output format."""
    ss = seeds(reader)
    seed = rnd.choice(ss)
    data = seed.data
    ops = []
    ext = seed.ext
    for _ in range(rnd.choice((1, 1, 2, 3))):
        m = rnd.choice(mutators_for(reader, seed))
        other = rnd.choice(ss).data
        data = m(rnd, data, other=other, seed=seed)
        ops.append(m.__name__[2:])
        if m in COMPRESS_MUTATORS:
            ext += ".gz"
            break
    return FuzzInput(reader, seed.name, ops, data, ext, rnd.choice(("human", "json")))


def argv(reader: str, path: str, fmt: str) -> list[str]:
    sub = [] if reader == "recording" else [reader]
    return [*sub, path, "--format", fmt]


# ---------------------------------------------------------------------------------------------
# running and judging
@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_rss_bytes: int | None = None
    hang: bool = False
    signature: str | None = None  # where it crashed/hung, for grouping into classes


class _Timeout(BaseException):
    """Raised by the SIGALRM handler; a BaseException so ``except Exception`` in the code under test
    cannot swallow it."""


def _alarm(signum, frame):
    raise _Timeout()


def _crash_site(tb_text: str) -> str:
    """``ExcType@module.py:function`` of the innermost fragscope frame in a traceback text."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tb_text)
    m = re.search(r"internal error: (out of memory|\w+)", tb_text)
    if m:
        exc = "MemoryError" if m.group(1) == "out of memory" else m.group(1)
    else:
        last = [ln for ln in tb_text.strip().splitlines() if re.match(r"^\w+(\.\w+)*(Error|Exception|Exit)\b", ln)]
        exc = last[-1].split(":")[0] if last else "?"
    site = "?"
    for f, _line, fn in reversed(frames):
        if "fragscope" in f and "/cli/__init__.py" not in f:
            site = f"{f.split('fragscope/')[-1]}:{fn}"
            break
    return f"{exc}@{site}"


def run_inprocess(args: list[str], timeout_s: float = 10.0, prog: str = "diagnose") -> Outcome:
    """Run ``diagnose ARGS`` (or ``fragscope ARGS``) in this process (the real entry point's error handling,
    --debug on so an escaped exception leaves its traceback for grouping)."""
    from click.testing import CliRunner

    from fragscope.cli import diagnose_group, fragscope_group
    try:
        from fragscope.cli import cli_exit_code
    except ImportError:  # a tree without the crash-only exit (main before it): emulate its old run_and_exit
        cli_exit_code = _old_main

    runner = CliRunner()
    hang = False
    sig = None
    old = signal.signal(signal.SIGALRM, _alarm)
    argv0 = sys.argv[0] if sys.argv else None
    t0 = time.perf_counter()
    with runner.isolation() as streams:
        if sys.argv:
            sys.argv[0] = prog  # the program name error lines start with
        out, err = streams[0], streams[1]
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            rc = cli_exit_code(fragscope_group if prog == "fragscope" else diagnose_group, prog, ["--debug", *args])
        except _Timeout:
            rc, hang = None, True
            sig = "hang@" + _crash_site(traceback.format_exc()).split("@", 1)[1]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            if argv0 is not None:
                sys.argv[0] = argv0
        for f in (sys.stdout, sys.stderr):  # plain sys.stdout.write() calls sit in the wrapper's buffer
            with contextlib.suppress(Exception):
                f.flush()
        so = out.getvalue().decode("utf-8", "replace")
        se = err.getvalue().decode("utf-8", "replace")
    dt = time.perf_counter() - t0
    if sig is None and (rc == 3 or "Traceback" in se):
        sig = _crash_site(se)
    return Outcome(rc, so, se, dt, None, hang, sig)


def _old_main(group, prog: str, args: list[str]) -> int:
    """What ``fragscope.cli.run_and_exit`` did before the crash-only exit: a traceback and exit 1 on a crash."""
    import click

    args = [a for a in args if a != "--debug"]
    try:
        rc = group.main(args=args, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:
        click.echo(f"{prog}: error: {e.format_message()}", err=True)
        return 2
    except click.ClickException as e:
        e.show()
        return e.exit_code or 2
    except BrokenPipeError:
        return 0
    except Exception:  # noqa: BLE001 - the uncaught exception: Python prints it and exits 1
        traceback.print_exc()
        return 1
    return rc if isinstance(rc, int) else 0


def _limit(mem_bytes: int):
    def f():
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        os.setsid()
    return f


def run_subprocess(args: list[str], timeout_s: float = 30.0, mem_bytes: int = 4 << 30,
                   prog: str = "diagnose") -> Outcome:
    """Run ``diagnose ARGS`` (or ``fragscope ARGS``) as a real process under RLIMIT_AS and a timeout; peak
    RSS from wait4."""
    entry = "main" if prog == "fragscope" else "diagnose_main"
    code = f"import sys; sys.argv[0] = {prog!r}; from fragscope.cli import {entry} as m; m()"
    env = dict(os.environ)
    env["FRAGSCOPE_DEBUG"] = "1"
    import fragscope  # the tree under test (PYTHONPATH or the installed one), also in the child

    env["PYTHONPATH"] = str(Path(fragscope.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                             env=env, preexec_fn=_limit(mem_bytes))
        hang = False
        deadline = t0 + timeout_s
        rusage = None
        status = None
        while True:
            pid, status, rusage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                hang = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                _, status, rusage = os.wait4(p.pid, 0)
                break
            time.sleep(0.01)
        p.returncode = 0  # reaped by wait4
        dt = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        so = fo.read().decode("utf-8", "replace")
        se = fe.read().decode("utf-8", "replace")
    sig = None
    if hang:
        sig = "hang@subprocess"
    elif rc == 3 or "Traceback" in se:
        sig = _crash_site(se)
    elif rc < 0:
        sig = f"signal{-rc}@subprocess" + ("(memory limit?)" if rc == -9 else "")
    return Outcome(None if hang else rc, so, se, dt, rusage.ru_maxrss * 1024 if rusage else None, hang, sig)


def _strict_json(text: str):
    def refuse(token):
        raise ValueError(f"invalid JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def judge(o: Outcome, fmt: str) -> str | None:
    """None when the outcome keeps the contract, else the class of the breach (one short phrase)."""
    if o.hang:
        return "hang"
    if o.rc == 3:
        return "crash (exit 3)"
    if "Traceback (most recent call last)" in o.stderr:
        return f"traceback with exit {o.rc}"
    if o.rc in (0, 1):
        if not o.stdout.strip():
            return f"exit {o.rc} without output"
        if fmt == "json":
            try:
                _strict_json(o.stdout)
            except ValueError as e:
                return "invalid JSON" + (" (NaN/Infinity)" if "token" in str(e) else "")
        return None
    if o.rc == 2:
        lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
        if len(lines) != 1:
            return f"exit 2 with {len(lines)} stderr lines"
        return None
    return f"exit {o.rc}"


@dataclass
class Report:
    reader: str
    tried: int = 0
    bytes_total: int = 0
    seconds_total: float = 0.0
    exit_codes: dict = field(default_factory=dict)
    breaches: dict = field(default_factory=dict)  # class signature -> {count, breach, smallest input}
    peak_rss_bytes: int = 0
    slowest_seconds: float = 0.0
    inproc_bytes: int = 0  # in-process runs only: time per MB without interpreter start-up
    inproc_seconds: float = 0.0
    subprocess_runs: int = 0

    def add(self, fi: FuzzInput, o: Outcome, breach: str | None) -> None:
        self.tried += 1
        self.bytes_total += len(fi.data)
        self.seconds_total += o.seconds
        if o.peak_rss_bytes is None:
            self.inproc_bytes += len(fi.data)
            self.inproc_seconds += o.seconds
        else:
            self.subprocess_runs += 1
        self.slowest_seconds = max(self.slowest_seconds, o.seconds)
        key = "hang" if o.hang else str(o.rc)
        self.exit_codes[key] = self.exit_codes.get(key, 0) + 1
        if o.peak_rss_bytes:
            self.peak_rss_bytes = max(self.peak_rss_bytes, o.peak_rss_bytes)
        if breach:
            sig = f"{breach}: {o.signature or '?'}"
            b = self.breaches.setdefault(sig, {"count": 0, "input": fi, "outcome": o})
            b["count"] += 1
            if len(fi.data) < len(b["input"].data):
                b["input"], b["outcome"] = fi, o

    @property
    def crashes(self) -> int:
        return sum(b["count"] for s, b in self.breaches.items() if not s.startswith("hang"))

    @property
    def hangs(self) -> int:
        return sum(b["count"] for s, b in self.breaches.items() if s.startswith("hang"))


def fuzz(reader: str, n: int, seed: int, *, subprocess_every: int = 0, timeout_s: float = 10.0,
         sub_timeout_s: float = 30.0, mem_bytes: int = 4 << 30, workdir: str | None = None,
         progress=None, bomb_mib: float | None = None, self_mem_bytes: int | None = 4 << 30) -> Report:
    """Try ``n`` mutated inputs for ``reader`` (seeded), in-process; every ``subprocess_every``-th (0: none)
    instead as a subprocess under the memory limit. In-process runs share this process's address space,
    capped at its current size + ``self_mem_bytes`` for the run (a blow-up is a MemoryError, not the
    kernel's OOM killer taking the harness). Returns the report (breaches grouped by class)."""
    global BOMB_MIB
    if bomb_mib is not None:
        BOMB_MIB = bomb_mib
    rnd = random.Random(f"{reader}:{seed}")
    rep = Report(reader)
    with tempfile.TemporaryDirectory(dir=workdir) as d, _self_limit(self_mem_bytes):
        for i in range(n):
            fi = generate(reader, rnd)
            path = os.path.join(d, f"in{fi.ext}")
            Path(path).write_bytes(fi.data)
            args = argv(reader, path, fi.fmt)
            sub = subprocess_every and i % subprocess_every == 0
            o = (run_subprocess(args, sub_timeout_s, mem_bytes) if sub else run_inprocess(args, timeout_s))
            rep.add(fi, o, judge(o, fi.fmt))
            if progress:
                progress(i, fi, o)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return rep


@contextlib.contextmanager
def _self_limit(extra: int | None):
    if not extra:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def save_repro(reader: str, sig: str, fi: FuzzInput, out_dir: Path = REPRO_DIR) -> Path:
    """Write one class's smallest input as tests/fuzz/repro/<reader>--<class slug><ext>."""
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", sig).strip("-")[:90]
    p = out_dir / f"{reader}--{slug}{fi.ext}"
    p.write_bytes(fi.data)
    return p


def _signature_of(reader: str, data: bytes, ext: str, fmt: str, d: str, timeout_s: float) -> str | None:
    path = os.path.join(d, f"min{ext}")
    Path(path).write_bytes(data)
    o = run_inprocess(argv(reader, path, fmt), timeout_s)
    breach = judge(o, fmt)
    return f"{breach}: {o.signature or '?'}" if breach else None


def minimize(reader: str, sig: str, fi: FuzzInput, budget: int = 150, timeout_s: float = 10.0) -> FuzzInput:
    """A smaller input with the same breach class: drop line chunks (ddmin-style halving), then bytes from
    the end; gzip inputs are minimised decompressed and compressed again. Hangs and SQLite are kept as is
    (each try of a hang costs the whole timeout). At most ``budget`` runs."""
    if sig.startswith("hang") or fi.data.startswith(b"SQLite format 3"):
        return fi
    gz = fi.data[:2] == b"\x1f\x8b"
    data = fi.data
    if gz:
        try:
            data = gzip.decompress(fi.data)
        except (OSError, EOFError, zlib.error):
            return fi
        if len(data) > 8 << 20:
            return fi

    def wrap(b: bytes) -> bytes:
        return gzip.compress(b, mtime=0) if gz else b

    runs = 0
    with tempfile.TemporaryDirectory() as d:
        def same(b: bytes) -> bool:
            nonlocal runs
            runs += 1
            return _signature_of(reader, wrap(b), fi.ext, fi.fmt, d, timeout_s) == sig

        if not same(data):
            return fi  # not reproducible in isolation (state from an earlier run?): keep the original
        lines = data.split(b"\n")
        n = 2
        while len(lines) >= 2 and runs < budget:
            chunk = max(1, len(lines) // n)
            for i in range(0, len(lines), chunk):
                trial = lines[:i] + lines[i + chunk:]
                if trial and runs < budget and same(b"\n".join(trial)):
                    lines = trial
                    n = max(n - 1, 2)
                    break
            else:
                if chunk == 1:
                    break
                n = min(len(lines), n * 2)
        data = b"\n".join(lines)
        cut = len(data) // 2
        while cut >= 1 and runs < budget:  # the tail of a one-line document
            if same(data[: len(data) - cut]):
                data = data[: len(data) - cut]
            else:
                cut //= 2
    return FuzzInput(fi.reader, fi.seed, fi.ops + ["minimized"], wrap(data), fi.ext, fi.fmt)
