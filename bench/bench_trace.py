"""Benchmark ``diagnose trace``: Kineto analysis vs HolisticTraceAnalysis, and nsys SQLite kernels/s.

    python bench/bench_trace.py [--hta-python /tmp/htavenv/bin/python] [--kernels 2000000] [--keep DIR]

HTA in its own venv (its pins clash with ours): python -m venv /tmp/htavenv &&
/tmp/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0. fragscope as the README installs it; with
`.[fast]` for connectorx (the Kineto line printed says which JSON decoder ran: msgspec, a dependency).

1. Kineto: the same work HTA does for its temporal breakdown + idle-time breakdown + kernel-launch stats,
   on the HTA sample traces (tests/data/trace), HTA's real nanosecond-resolution trace (69k events, fetched:
   bench/data/README.md) and a generated 100k-op trace. HTA runs in its own venv (it pins its own
   pandas/plotly). Two figures per trace: in-process (parse + the three analyses inside each interpreter,
   start-up excluded on both sides) and whole process (`diagnose trace FILE --format json` against a fresh
   interpreter importing HTA and running the same three analyses: what a user waits for). Target: fragscope
   >= 8x faster, whole process. The load average is printed beside the figures (the machine may be shared).
   Each trace's line says which columns it got (Python lists under the size bar, numpy above:
   fragscope/vec.py) and whether both, forced in turn, print the same json and human output and exit code.
   FRAGSCOPE_JSON_DECODER=stdlib gives the fallback decoder (where msgspec cannot be imported).
2. nsys: a generated export with the real schema (tests/data/trace/nsys_schema.sql) holding N kernels and
   N cudaLaunchKernel runtime rows. Baseline: Python's sqlite3 fetching the kernels' start/end columns.
   fragscope: read_nsys and analyse + judge in-process (the default b-tree page reader, connectorx and
   stdlib readers), the interpreter start-up floor (`import fragscope.cli`), and the whole process
   (`diagnose trace FILE --format json`, wall and CPU) with each reader, each best of N (median too),
   with the load average (the machine may be shared).
   Target: >= 1.5 M kernel rows/s whole process with the default install (the page reader: numpy decoding
   the tables' pages, no SQL per row), and <= 1.3x a plain process reading the same columns with the same
   reader (no fragscope analysis; bytecode compiled; numpy's and glibc's memory settings as `diagnose trace` asks
   for them). The forced SQL readers keep their own lines, each
   against a plain process reading the same columns with that reader, as before.
   Floors, to tell what is left from what cannot go: connectorx alone running the exact queries the
   reader sends (recorded from one read; each alone and all at once, no post-processing), and the
   start-up and whole process again with a bytecode cache (as installed from a wheel; a checkout run
   with PYTHONDONTWRITEBYTECODE=1 compiles fragscope's sources at every start). These are reported
   beside the target's figure, never instead of it.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "trace"

from fragscope.collectors.kineto import read_kineto  # noqa: E402
from fragscope.collectors.nsys import read_nsys  # noqa: E402
from fragscope.detectors.timeline import analyse, judge  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from benchproc import DIAGNOSE, installed_env, whole as _whole  # noqa: E402

HTA_SCRIPT = r"""
import sys, time, logging, warnings, shutil, tempfile, os
warnings.filterwarnings("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
src, reps = sys.argv[1], int(sys.argv[2])
d = tempfile.mkdtemp(); shutil.copy(src, os.path.join(d, "rank-0.json.gz"))
best = 1e9
for _ in range(reps):
    t = time.perf_counter()
    ta = TraceAnalysis(trace_dir=d)
    ta.get_temporal_breakdown(visualize=False)
    ta.get_idle_time_breakdown(visualize=False)
    ta.get_cuda_kernel_launch_stats(visualize=False)
    best = min(best, time.perf_counter() - t)
print(best)
"""


HTA_WHOLE = r"""
import sys, logging, warnings, shutil, tempfile, os
warnings.filterwarnings("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp(); shutil.copy(sys.argv[1], os.path.join(d, "rank-0.json.gz"))
ta = TraceAnalysis(trace_dir=d)
ta.get_temporal_breakdown(visualize=False)
ta.get_idle_time_breakdown(visualize=False)
ta.get_cuda_kernel_launch_stats(visualize=False)
shutil.rmtree(d)
"""

# HTA's real trace with nanosecond digits (epoch µs as floats: the exact-number path). Not committed (1.2 MB):
# fetched once into bench/data/ (bench/data/README.md: source, licence, checksum).
NS_TRACE = ROOT / "bench" / "data" / "hta_ns_resolution_rank0.json.gz"
NS_TRACE_URL = ("https://raw.githubusercontent.com/facebookresearch/HolisticTraceAnalysis/"
                "c980c48309f7d59edf89271e771db4233dd3ccfa/tests/data/ns_resolution_trace/"
                "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
NS_TRACE_SHA256 = "e279d7280e73719e8dd9550e120cfe081fbe268596bd297fe5fcbf63e2b75a09"


def ns_trace(path: Path) -> Path | None:
    """The real ns-resolution trace: the given path, else fetched from HTA's repository (checksum checked)."""
    import hashlib

    if not path.exists():
        try:
            import urllib.request

            path.parent.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(NS_TRACE_URL, timeout=60) as r:
                path.write_bytes(r.read())
        except OSError as e:
            print(f"   (the ns-resolution trace is not here and could not be fetched: {e}; see bench/data/README.md)")
            return None
    if hashlib.sha256(path.read_bytes()).hexdigest() != NS_TRACE_SHA256:
        print(f"   ({path} is not the expected file (sha256); see bench/data/README.md)")
        return None
    return path


def best_of(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def ours_kineto(path: str) -> None:
    a = analyse(read_kineto(path))
    judge(a)


def both_columns(p: Path, env: dict) -> tuple[str, bool]:
    """Which columns `diagnose trace` gives this trace by default (Python lists under the size bar, numpy
    above: fragscope/vec.py), and whether both give the same output, byte for byte, and exit code."""
    from fragscope import vec

    tl = read_kineto(str(p))
    rows = tl.n_ops + int(tl.call_start.size)
    cols = f"{'numpy' if vec.numpy_for(rows) else 'Python lists'} ({rows:,} ops + calls, bar {vec.NUMPY_MIN_ROWS:,})"
    outs = []
    for side in ("python", "numpy"):
        for fmt in ("json", "human"):
            r = subprocess.run(DIAGNOSE + ["trace", str(p), "--format", fmt, "--fail-on", "info"], capture_output=True,
                               cwd=ROOT, env=dict(env, **{vec.ENV: side}))
            outs.append((fmt, r.returncode, r.stdout, r.stderr))
    return cols, outs[:2] == outs[2:]


def gen_kineto(path: Path, n: int = 100_000) -> Path:
    rng = np.random.default_rng(1)
    t0 = 1_700_000_000_000_000
    ev, t = [], 0
    for i in range(n):
        t += int(rng.integers(5, 40))
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": t0 + t,
                   "dur": 6, "args": {"correlation": i + 1, "External id": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k%d" % (i % 50), "pid": 0, "tid": 7 + i % 3,
                   "ts": t0 + t + 8, "dur": int(rng.integers(2, 30)),
                   "args": {"device": 0, "stream": 7 + i % 3, "correlation": i + 1}})
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode(), 1))
    return path


def bench_kineto(hta_python: str | None, tmp: Path, ns_path: Path, reps_whole: int = 3) -> None:
    print("== Kineto: fragscope vs HTA (parse + temporal breakdown + idle breakdown + launch stats; best of N); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    import importlib.util

    decoder = "msgspec" if importlib.util.find_spec("msgspec") and \
        os.environ.get("FRAGSCOPE_JSON_DECODER", "") != "stdlib" else "stdlib json"
    print(f"   fragscope's JSON decoder: {decoder} (FRAGSCOPE_JSON_DECODER=stdlib for the fallback)")
    env = installed_env(tmp / "pycache")  # compiled bytecode, as installed (bench/benchproc.py)
    traces = [DATA / "hta_alexnet_critical_path.json.gz", DATA / "hta_timeline_sampled_rank0.json.gz"]
    real = ns_trace(ns_path)
    if real is not None:
        traces.append(real)
    traces.append(gen_kineto(tmp / "gen_100k.json.gz"))
    for p in traces:
        reps = 3 if p.stat().st_size > 1e6 else 10
        ours = best_of(lambda: ours_kineto(str(p)), reps)
        line = f"{p.name:40s} {p.stat().st_size / 1e3:8.0f} kB  in-process: fragscope {ours * 1e3:8.1f} ms"
        if hta_python:
            r = subprocess.run([hta_python, "-c", HTA_SCRIPT, str(p), str(reps)], capture_output=True, text=True)
            if r.returncode == 0:
                hta = float(r.stdout.strip().splitlines()[-1])
                line += f"  HTA {hta * 1e3:8.1f} ms  {hta / ours:5.1f}x"
            else:
                line += f"  HTA failed: {r.stderr.strip().splitlines()[-1][:80] if r.stderr.strip() else r.returncode}"
        else:
            line += "  HTA not available (--hta-python)"
        print(line, flush=True)
        cols, same = both_columns(p, env)
        print(f"{'':40s} {'':8s}     columns: {cols}; Python lists and numpy arrays forced in turn: json and human "
              f"output and exit codes {'identical' if same else 'DIFFERENT'}", flush=True)
        ours_w, st = _whole(DIAGNOSE + ["trace", str(p), "--format", "json", "--fail-on", "never"], reps_whole,
                            env)
        line = f"{'':40s} {'':8s}     whole process: fragscope {ours_w * 1e3:8.1f} ms [{st}]"
        if hta_python:
            hta_w, st = _whole([hta_python, "-c", HTA_WHOLE, str(p)], reps_whole)
            line += (f"  HTA {hta_w * 1e3:8.1f} ms [{st}]  ratio {hta_w / ours_w:5.1f}x "
                     f"(target 8x: {'met' if hta_w >= 8 * ours_w else 'not met'})")
        print(line, flush=True)
    # what no Python CLI can go under: an interpreter that imports numpy and exits (and one that imports nothing)
    # (a small trace imports no numpy: its floor is the interpreter with click, which the CLI parses with)
    floor, _ = _whole([sys.executable, "-c", "import numpy"], reps_whole)
    click_floor, _ = _whole([sys.executable, "-c", "import click"], reps_whole)
    bare, _ = _whole([sys.executable, "-c", "pass"], reps_whole)
    print(f"   floor: python -c 'import numpy' {floor * 1e3:8.1f} ms, python -c 'import click' {click_floor * 1e3:6.1f} "
          f"ms, python -c pass {bare * 1e3:6.1f} ms (best of {reps_whole})")
    print(f"   load average after: {os.getloadavg()[0]:.2f}")


def bench_crossover(tmp: Path, reps: int) -> None:
    """Where Python lists stop paying: `diagnose trace --format json` whole process on generated traces of
    growing size, Python lists and numpy forced in turn (the size bar, fragscope/vec.py NUMPY_MIN_ROWS)."""
    from fragscope import vec

    env = installed_env(tmp / "pycache")
    print(f"== Kineto columns: Python lists against numpy, whole process, best of {reps}; load average "
          f"{os.getloadavg()[0]:.2f}; the bar: {vec.NUMPY_MIN_ROWS:,} ops + calls")
    for rows in (1_000, 5_000, 10_000, 20_000, 25_000, 30_000, 40_000):
        p = gen_kineto(tmp / f"gen_{rows}.json.gz", rows // 2)
        line = f"   {rows:7,} ops + calls:"
        for side in ("python", "numpy"):
            t, st = _whole(DIAGNOSE + ["trace", str(p), "--format", "json", "--fail-on", "never"], reps,
                           dict(env, **{vec.ENV: side}))
            line += f"  {'Python lists' if side == 'python' else 'numpy'} {t * 1e3:7.1f} ms [{st}]"
        print(line, flush=True)
    print(f"   load average after: {os.getloadavg()[0]:.2f}")


def gen_nsys(path: Path, n: int) -> Path:
    if path.exists():
        return path
    c = sqlite3.connect(path)
    c.executescript((DATA / "nsys_schema.sql").read_text())
    c.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (2, "gemm"),
                                                           (3, "cudaEventRecord_v3020")])
    c.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_SCHEMA_VERSION", "3.24.0")])
    rng = np.random.default_rng(0)
    gp = (1 << 48) | (4242 << 24)
    chunk = 250_000
    t_next = 1_000_000
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        step = rng.integers(3_000, 30_000, m)
        launch = t_next + np.cumsum(step)
        t_next = int(launch[-1])
        dur = rng.integers(2_000, 40_000, m)
        kstart = launch + 7_000 + rng.integers(0, 3_000, m)
        corr = np.arange(lo + 1, lo + m + 1)
        stream = 7 + (corr % 4)
        c.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, 1, 0, NULL)",
            zip(launch.tolist(), (launch + 5_000).tolist(), [gp | 4243] * m, corr.tolist()))
        c.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
            "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
            "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
            "VALUES (?, ?, 0, 1, ?, ?, ?, 2, 2, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 0)",
            zip(kstart.tolist(), (kstart + dur).tolist(), stream.tolist(), corr.tolist(), [gp] * m))
    c.commit()
    c.close()
    return path


def _whole_process(p: Path, reader: str, reps: int, env_extra: dict | None = None) -> tuple[list, list, str]:
    """Wall and CPU (user+sys) seconds of each of N runs of `diagnose trace FILE --format json` in a fresh
    interpreter."""
    env = dict(os.environ, FRAGSCOPE_SQLITE_READER=reader, **(env_extra or {}))
    walls, cpus, status = [], [], "ok"
    for _ in range(reps):
        r0 = os.times()
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()",
                            "trace", str(p), "--format", "json", "--fail-on", "never"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        walls.append(time.perf_counter() - t)
        r1 = os.times()
        cpus.append((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system))
        if r.returncode != 0:
            status = f"rc={r.returncode} {r.stderr.strip()[:80]}"
    return walls, cpus, status


def _startup(reps: int, env_extra: dict | None = None) -> list:
    env = dict(os.environ, **(env_extra or {}))
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fragscope.cli"], check=True, env=env, cwd=ROOT)
        out.append(time.perf_counter() - t)
    return out


def _med(xs: list) -> float:
    return sorted(xs)[len(xs) // 2]


def _connectorx_floor(p: Path, reps: int) -> None:
    """connectorx alone on the queries read_nsys sends it (recorded once, through its public read_sql as the
    reader calls it): each alone, then all at once in threads as the reader runs them. No post-processing,
    no join, no analysis: the read's floor."""
    import threading

    import connectorx

    sent: list[tuple[str, str]] = []
    real = connectorx.read_sql

    def recorder(conn, query, **kw):
        sent.append((conn, query))
        return real(conn, query, **kw)

    connectorx.read_sql = recorder
    try:
        read_nsys(str(p), reader="connectorx")
    finally:
        connectorx.read_sql = real

    def one(conn: str, sql: str) -> None:
        real(conn, sql, return_type="pandas")

    alone = []
    for conn, sql in sent:
        t = best_of(lambda conn=conn, sql=sql: one(conn, sql), reps)
        alone.append(t)
        table = sql.split(" FROM ", 1)[1].split()[0].strip('"')
        print(f"   floor: connectorx alone on {table:36s} {t:6.2f} s")

    def together() -> None:
        th = [threading.Thread(target=one, args=q) for q in sent]
        for x in th:
            x.start()
        for x in th:
            x.join()

    t = best_of(together, reps)
    print(f"   floor: connectorx, the {len(sent)} queries at once as read_nsys runs them   {t:6.2f} s")


PLAIN = r"""
import json, sqlite3, sys, threading
import numpy as np
path, reader, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def stdlib(table, cols, where):
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    sel = ", ".join(f"group_concat(ifnull({e}, {nv}))" for e, nv in cols)
    row = c.execute(f'SELECT {sel} FROM "{table}"' + (f" WHERE {where}" if where else "")).fetchone()
    return [np.fromstring(v or "", dtype=np.int64, sep=",") for v in row]
def cx(table, cols, where):
    import connectorx
    sel = ", ".join(f"{e} AS c{i}" for i, (e, _) in enumerate(cols))
    df = connectorx.read_sql("sqlite://" + path, f'SELECT {sel} FROM "{table}"' + (f" WHERE {where}" if where else ""),
                             return_type="pandas")
    return [df[f"c{i}"].to_numpy(dtype=np.int64, na_value=nv) for i, (_, nv) in enumerate(cols)]
def pages(table, cols, keep):
    from fragscope.collectors.nsys_pages import Column, read_table  # (numpy and the stdlib only)
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    return read_table(c, path, table, [Column(a[0], a[1], a[2], tuple(a[3]), tuple(a[4]) if a[4] else None)
                                       for a in cols], keep)
fn = {"connectorx": cx, "pages": pages}.get(reader, stdlib)
th = [threading.Thread(target=fn, args=q) for q in queries]
for t in th: t.start()
for t in th: t.join()
"""


def _plain_floor(p: Path, reader: str, reps: int, env: dict) -> float:
    """A plain process (python, numpy, the reader; no fragscope) reading the same columns of the same tables
    with the same reader, one thread per table, as `diagnose trace` does, and nothing else: the whole
    process's floor for that reader."""
    from fragscope.collectors import nsys_pages, sqlite_columns

    sent: list = []
    if reader == "pages":  # the page reader's calls, as read_nsys makes them
        real_pages = nsys_pages.read_table

        def rec_pages(conn, path, table, cols, keep=None):
            sent.append([table, [[c.name, c.null, c.isin, list(c.also), c.field] for c in cols], keep])
            return real_pages(conn, path, table, cols, keep)

        nsys_pages.read_table = rec_pages
        try:
            read_nsys(str(p), reader="pages")
        finally:
            nsys_pages.read_table = real_pages
    else:
        real = sqlite_columns.Fetcher.run

        def recorder(self, queries):
            sent.extend([q.table, q.cols, q.where] for q in queries)
            return real(self, queries)

        sqlite_columns.Fetcher.run = recorder
        try:
            read_nsys(str(p), reader="stdlib")
        finally:
            sqlite_columns.Fetcher.run = real
    walls, cpus = [], []
    for _ in range(reps):
        r0, t = os.times(), time.perf_counter()
        # (numpy's large arrays on small pages and glibc keeping freed memory, as `diagnose trace` asks for
        # them on a large file: the same memory settings, cli/trace_cmd.py)
        subprocess.run([sys.executable, "-c", PLAIN, str(p), reader, json.dumps(sent)], check=True,
                       env=dict(env, NUMPY_MADVISE_HUGEPAGE="0", MALLOC_TRIM_THRESHOLD_=str((1 << 31) - 1),
                                MALLOC_MMAP_THRESHOLD_=str(1 << 30)), cwd=ROOT)
        walls.append(time.perf_counter() - t)
        r1 = os.times()
        cpus.append((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system))
    return min(walls), min(cpus)


def bench_nsys(n: int, tmp: Path, reps: int = 3) -> None:
    from fragscope.cli.trace_cmd import small_pages

    small_pages()  # in-process figures under the CLI's memory setting
    print(f"== nsys SQLite: {n:,} kernels + {n:,} runtime launches (real schema); best of {reps}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    t = time.perf_counter()
    p = gen_nsys(tmp / f"nsys_{n}.sqlite", n)
    print(f"   export ready in {time.perf_counter() - t:.1f} s ({p.stat().st_size / 1e6:.0f} MB)")

    def baseline():
        c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        rows = c.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        np.array(rows, dtype=np.int64)
        c.close()

    base = best_of(baseline, reps)
    print(f"   baseline: sqlite3 fetchall of kernel start,end (in-process)     {base:6.2f} s  "
          f"{n / base / 1e6:5.2f} M rows/s")
    have_cx = __import__("importlib").util.find_spec("connectorx") is not None
    for reader in ["pages"] + (["connectorx"] if have_cx else []) + ["stdlib"]:
        t_r = best_of(lambda: read_nsys(str(p), reader=reader), reps)
        tl = read_nsys(str(p), reader=reader)
        t_a = best_of(lambda: judge(analyse(tl)), reps)
        print(f"   fragscope {reader:10s} in-process: read {t_r:5.2f} s, analyse+judge {t_a:5.2f} s")
    if have_cx:
        _connectorx_floor(p, reps)
    # Interpreter start and the CLI's imports (numpy, click, fragscope.cli): the floor of the whole process.
    bc = {"PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    installed_env(tmp / "pycache")
    t_imp, t_imp_bc = _startup(reps), _startup(reps, bc)
    print(f"   python -c 'import fragscope.cli' (start-up floor)              {min(t_imp):6.2f} s  "
          f"(median {_med(t_imp):4.2f}; with a bytecode cache {min(t_imp_bc):4.2f})")
    env_inst = installed_env(tmp / "pycache")
    for reader in ["auto"] + (["connectorx"] if have_cx else []) + ["stdlib"]:
        walls, cpus, status = _whole_process(p, reader, reps)
        best, cpu = min(walls), min(cpus)
        name = "pages" if reader == "auto" else reader  # (the default: the page reader)
        print(f"   whole process ({name:10s}) diagnose trace --format json  {best:6.2f} s  "
              f"{n / best / 1e6:5.2f} M kernels/s  ({base / best:4.2f}x the baseline's speed; "
              f"target 1.5 M/s: {'met' if n / best >= 1.5e6 else 'not met'}; CPU {cpu:4.2f} s; median wall "
              f"{_med(walls):4.2f} s)  [{status}]")
        # as installed (compiled bytecode), against a plain process reading the same columns, same reader
        walls, cpus, status = _whole_process(p, reader, reps, {k: v for k, v in env_inst.items()
                                                               if k == "PYTHONPYCACHEPREFIX"})
        floor, floor_cpu = _plain_floor(p, name, reps, env_inst)
        print(f"   whole process ({name:10s}) as installed                     {min(walls):6.2f} s  "
              f"{n / min(walls) / 1e6:5.2f} M kernels/s (CPU {min(cpus):4.2f} s); a plain process reading the same "
              f"columns with {name}: {floor:5.2f} s (CPU {floor_cpu:4.2f} s); ratio {min(walls) / floor:4.2f}x wall, "
              f"{min(cpus) / floor_cpu:4.2f}x CPU (target <= 1.3x)  [{status}]", flush=True)
    print(f"   load average after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON", "/tmp/htavenv/bin/python"),
                    help="interpreter with holistictraceanalysis installed")
    ap.add_argument("--kernels", type=int, default=2_000_000)
    ap.add_argument("--keep", default=None, help="folder for generated inputs (reused when present)")
    ap.add_argument("--skip-nsys", action="store_true")
    ap.add_argument("--skip-kineto", action="store_true")
    ap.add_argument("--crossover", action="store_true",
                    help="also time Python lists against numpy columns on generated Kineto traces of growing size")
    ap.add_argument("--reps", type=int, default=3, help="best of N for the nsys and whole-process figures")
    ap.add_argument("--ns-trace", default=str(NS_TRACE),
                    help="HTA's ns-resolution trace (fetched here when absent; bench/data/README.md)")
    args = ap.parse_args()
    hta = args.hta_python if args.hta_python and Path(args.hta_python).exists() else None
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_trace_"))
    tmp.mkdir(parents=True, exist_ok=True)
    if not args.skip_kineto:
        bench_kineto(hta, tmp, Path(args.ns_trace), args.reps)
    if args.crossover:
        bench_crossover(tmp, max(args.reps, 5))
    if not args.skip_nsys:
        bench_nsys(args.kernels, tmp, args.reps)


if __name__ == "__main__":
    main()
