#!/usr/bin/env python3
"""Time bounds the unit tests used to assert, measured here instead (unit tests check mechanisms, benchmarks
time them: DEVELOPERS.md). Each line prints the measured figure, its bound and the ratio.

    python bench/bench_bounds.py

- a pathological engine-log line (thousands of pattern starts without their closing figure, 64 KiB): the
  parser's lookahead is bounded, not quadratic (bound 1 s);
- 240 seeded mutations of real engine logs through read + analyse (bound 30 s);
- an HTTP GET whose total timeout (0.4 s) must hold against a server trickling bytes (bound 1.8 s for a
  0.3 s and a 0.4 s timeout in a row).
"""
from __future__ import annotations

import gzip
import http.server
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fragscope.collectors.enginelog import LogInputError, parse_log_line, read_log_file  # noqa: E402
from fragscope.collectors.http import FetchError, http_get  # noqa: E402
from fragscope.detectors.logs import analyse_log  # noqa: E402


def report(name: str, seconds: float, bound: float) -> None:
    print(f"{name:52s} {seconds:8.3f} s   bound {bound:6.1f} s   ratio {seconds / bound:5.2f}"
          + ("" if seconds < bound else "   OVER"))


def pathological_line() -> None:
    line = "Sequence group x is preempted by PreemptionMode.RECOMPUTE " * 1100 + "block_size= Namespace(" * 2000
    t0 = time.perf_counter()
    assert parse_log_line(line[: 64 << 10]) is None
    report("pathological log line (64 KiB)", time.perf_counter() - t0, 1.0)


def mutations(tmp: Path) -> None:
    import test_logs_hostile as t  # the test's own mutator and seed files

    rng = random.Random(20261201)
    seeds = [(t.DATA / n).read_bytes()[:20000] for n in t.FUZZ_SOURCES]
    f = tmp / "m.log"
    t0 = time.perf_counter()
    for i in range(240):
        data = t._mutate(seeds[i % len(seeds)], rng)
        if i % 8 == 7:
            gz = gzip.compress(data)
            data = gz[: len(gz) // 2] if i % 16 == 15 else gz
        f.write_bytes(data)
        try:
            info = read_log_file(str(f), reference=t.utc(2026, 6, 1))
        except LogInputError:
            continue
        analyse_log(info.events)
    report("240 mutated engine logs, read + analysed", time.perf_counter() - t0, 30.0)


class _Slow(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05 if self.path == "/trickle" else 1.0)
        except OSError:
            pass


def total_timeouts() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    t0 = time.monotonic()
    for path, timeout in (("/slow", 0.3), ("/trickle", 0.4)):
        try:
            http_get(url + path, timeout_s=timeout)
        except FetchError:
            pass
    report("HTTP total timeouts 0.3 s + 0.4 s (slow, trickle)", time.monotonic() - t0, 1.8)
    srv.shutdown()


def main() -> None:
    import tempfile

    pathological_line()
    with tempfile.TemporaryDirectory() as d:
        mutations(Path(d))
    total_timeouts()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
