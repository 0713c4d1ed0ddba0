"""A stand-in serving pod for the agent's tests and bench/bench_agent.py (run as a subprocess).

Serves recorded scrapes on 127.0.0.1 over real HTTP, changing over time, and faults on demand:

    /vllm/metrics     the --vllm files in turn, one every --period seconds (then the last repeats)
    /dcgm/metrics     the --dcgm file
    /html/metrics     an HTML login page (200, text/html)
    /garbage/metrics  binary bytes
    /huge/metrics     a 40 MB body of valid-looking lines
    /slow/metrics     answers after --slow seconds
    /control?mode=M   switch /vllm/metrics to M: ok | html | garbage | error (HTTP 500) | slow
    /control?period=S with --vllm-pages: serve the next pages every S seconds from now on (a storm that
                      speeds up or slows down: its counters' rates scale by the old period / S)

With --vllm-pages FILE (gzip, pages separated by a ``# fragscope-replay page`` line: a recorded
sequence, e.g. a preemption storm) those pages are served in turn instead; with --loop the sequence
starts again after its last page, counters (``_total``, ``_bucket``, ``_count``, ``_sum``) carried on
from where the last page left them, so rates stay what the recording had. ``/metrics`` is the same page
as ``/vllm/metrics`` (an engine's own path).

With --probe-dir it also publishes a PyTorch-probe record (format fragscope-probe/1) for a fake
pid every second, with reserved - allocated growing, plus a half-written record of another pid;
with --log-file it appends vLLM V1 stats lines every second. Prints ``PORT <n>`` when listening.
Stops after --max-seconds (bounded), or on SIGTERM.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MODE = {"vllm": "ok"}
START = time.monotonic()
PAGE_MARK = b"# fragscope-replay page\n"
_COUNTER = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:_total|_bucket|_count|_sum)(?:\{[^}]*\})?) (\S+)$", re.M)


class Pages:
    """Recorded pages in turn, one every ``period`` seconds; with ``loop``, again and again, each pass's
    counters raised by what the whole sequence added (last page minus first)."""

    def __init__(self, bodies: list[bytes], period: float, loop: bool) -> None:
        self.bodies, self.period, self.loop = bodies, period, loop
        self.t0, self.k0 = START, 0.0  # page position k0 at time t0; then one page per period
        first = {m.group(1): float(m.group(2)) for m in _COUNTER.finditer(bodies[0])}
        last = {m.group(1): float(m.group(2)) for m in _COUNTER.finditer(bodies[-1])}
        self.delta = {k: max(0.0, v - first.get(k, 0.0)) for k, v in last.items()}
        self._cache: dict[tuple[int, int], bytes] = {}

    def set_period(self, period: float) -> None:
        now = time.monotonic()
        self.k0, self.t0, self.period = self.k0 + (now - self.t0) / self.period, now, period

    def current(self) -> bytes:
        k = int(self.k0 + (time.monotonic() - self.t0) / self.period)
        if not self.loop:
            return self.bodies[min(k, len(self.bodies) - 1)]
        i, n = k % len(self.bodies), k // len(self.bodies)
        if n == 0:
            return self.bodies[i]
        if (i, n) not in self._cache:
            def bump(m):
                return m.group(1) + b" " + repr(float(m.group(2)) + n * self.delta.get(m.group(1), 0.0)).encode()
            self._cache = {(i, n): _COUNTER.sub(bump, self.bodies[i])}  # one page kept
        return self._cache[(i, n)]


def _make_handler(args, vllm_bodies: list[bytes], dcgm_body: bytes | None, pages: Pages | None = None):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; version=0.0.4; charset=utf-8"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self):  # noqa: N802
            u = urlsplit(self.path)
            p = u.path
            if p == "/control":
                q = parse_qs(u.query)
                if "period" in q and pages is not None:
                    pages.set_period(float(q["period"][0]))
                else:
                    MODE["vllm"] = q.get("mode", ["ok"])[0]
                return self._send(200, b"ok\n")
            if p in ("/vllm/metrics", "/metrics"):
                mode = MODE["vllm"]
                if mode == "ok" and pages is not None:
                    return self._send(200, pages.current())
                if mode == "ok":
                    i = min(int((time.monotonic() - START) / args.period), len(vllm_bodies) - 1)
                    return self._send(200, vllm_bodies[i])
                p = f"/{mode}/metrics"
            if p == "/dcgm/metrics" and dcgm_body is not None:
                return self._send(200, dcgm_body)
            if p == "/html/metrics":
                return self._send(200, b"<!DOCTYPE html><html><body><form>Sign in</form></body></html>",
                                  "text/html; charset=utf-8")
            if p == "/garbage/metrics":
                return self._send(200, bytes(range(256)) * 64, "text/plain")
            if p == "/error/metrics":
                return self._send(500, b"internal error\n")
            if p == "/huge/metrics":
                line = b'vllm:num_requests_running{model_name="m"} 1\n'
                return self._send(200, line * (40 * 1024 * 1024 // len(line)))
            if p == "/slow/metrics":
                time.sleep(args.slow)
                return self._send(200, vllm_bodies[0])
            return self._send(404, b"not found\n")

    return H


def _probe_loop(probe_dir: str, stop: threading.Event) -> None:
    os.makedirs(probe_dir, exist_ok=True)
    pid = 4242
    gib = 1024**3
    # a half-written record of another process: the collector must skip it, not crash
    with open(os.path.join(probe_dir, "torch-999.json"), "w") as fh:
        fh.write('{"format": "fragscope-probe/1", "pid": 999, "ts": 17')
    t0 = time.time()
    while not stop.is_set():
        now = time.time()
        k = now - t0
        reserved = int(20 * gib + k * 0.05 * gib)
        allocated = int(19 * gib)
        rec = {"format": "fragscope-probe/1", "pid": pid, "ts": now, "interval_s": 1.0, "seq": int(k),
               "errors": 0, "sample_us": 45.0, "torch_version": "2.13.0", "devices": [
                   {"index": 0, "gpu": "0", "uuid": "GPU-00000000-0000-0000-0000-000000000000", "stats": {
                       "allocated_bytes.all.current": allocated, "reserved_bytes.all.current": reserved,
                       "inactive_split_bytes.all.current": int((reserved - allocated) * 0.6),
                       "num_alloc_retries": int(k // 5), "num_ooms": 0}}]}
        tmp = os.path.join(probe_dir, f".torch-{pid}.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(rec, fh)
        os.replace(tmp, os.path.join(probe_dir, f"torch-{pid}.json"))
        stop.wait(1.0)


def _log_loop(path: str, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        stamp = time.strftime("%m-%d %H:%M:%S")
        with open(path, "a") as fh:
            fh.write(f"(APIServer pid=1) INFO {stamp} [loggers.py:123] Engine 000: Avg prompt throughput: "
                     f"{100 + n % 7}.0 tokens/s, Avg generation throughput: 250.0 tokens/s, Running: 8 reqs, "
                     f"Waiting: {n % 3} reqs, GPU KV cache usage: 71.5%, Prefix cache hit rate: 12.0%\n")
        stop.wait(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--vllm", action="append", default=[])
    ap.add_argument("--vllm-pages", default=None, help="gzip file of recorded pages (see the docstring)")
    ap.add_argument("--loop", action="store_true", help="with --vllm-pages: start again after the last page")
    ap.add_argument("--dcgm", default=None)
    ap.add_argument("--period", type=float, default=5.0)
    ap.add_argument("--slow", type=float, default=30.0)
    ap.add_argument("--probe-dir", default=None)
    ap.add_argument("--log-file", default=None)
    ap.add_argument("--max-seconds", type=float, default=900.0)
    args = ap.parse_args()
    vllm_bodies = [open(p, "rb").read() for p in args.vllm] or [b"# no vllm file\n"]
    dcgm_body = open(args.dcgm, "rb").read() if args.dcgm else None
    pages = None
    if args.vllm_pages:
        with gzip.open(args.vllm_pages, "rb") as fh:
            bodies = [b for b in fh.read().split(PAGE_MARK) if b.strip()]
        pages = Pages(bodies, args.period, args.loop)
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), _make_handler(args, vllm_bodies, dcgm_body, pages))
    srv.daemon_threads = True
    stop = threading.Event()
    if args.probe_dir:
        threading.Thread(target=_probe_loop, args=(args.probe_dir, stop), daemon=True).start()
    if args.log_file:
        threading.Thread(target=_log_loop, args=(args.log_file, stop), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"PORT {srv.server_address[1]}", flush=True)
    stop.wait(args.max_seconds)
    stop.set()
    srv.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
