"""Agent RSS under hostile traffic, against its 60 MB budget (issue 12).

    python bench/bench_agent_hostile.py [--history-points 2000000] [--settle 6]

A real `fragscope agent` (history on, NVML replayed, one vLLM source) is started against a local
server whose /metrics can be switched to: a 50 MB body without Content-Length; a gzip bomb
(~400 KB on the wire, 400 MB of newlines once inflated); 400k short lines. Its history is seeded
with ``--history-points`` points over 35 days (40 series), as an agent that has run for weeks.
Phases, each followed by ``--settle`` seconds of normal scrapes before RSS is read:

    baseline -> one 50 MB body -> one gzip bomb -> 400k-line body
             -> 20 concurrent /api/v1/window?since=31d -> 20 concurrent raw /api/v1/signals

Prints RSS (and the peak, VmHWM) after each phase, and each phase's answers (HTTP codes).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "agent")
BUDGET_MB = 60.0


def _bomb(inflated: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\n" * (1 << 20)
    out = [c.compress(block) for _ in range(inflated >> 20)]
    out.append(c.flush())
    return b"".join(out)


class Pod:
    def __init__(self) -> None:
        with open(os.path.join(DATA, "vllm_cpu_0.32.0_before.txt"), "rb") as fh:
            self.ok = fh.read()
        self.bomb = _bomb(400 << 20)
        self.mode = "ok"
        pod = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                mode = pod.mode
                if mode == "big":  # 50 MB, chunked, no Content-Length
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    line = b"vllm:num_requests_waiting{model_name=\"m\"} 1\n" * 1000
                    try:
                        for _ in range((50 << 20) // len(line)):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                body, extra = pod.ok, {}
                if mode == "bomb":
                    body, extra = pod.bomb, {"Content-Encoding": "gzip"}
                elif mode == "lines":
                    body = b"vllm:x 1\n" * 400_000
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss(pid: int) -> tuple[float, float]:
    rss = hwm = 0.0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return rss, hwm


def _get(url: str, timeout: float = 120) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except OSError:
        return -1


def _seed(data_dir: str, points: int) -> None:
    sys.path.insert(0, ROOT)
    from fragscope.agent.store import Store
    from fragscope.model import Sample

    st = Store(os.path.join(data_dir, "history.sqlite"), retention_s=60 * 86400.0)
    n_series = 40
    per = max(1, points // n_series)
    now = time.time()
    span = 35 * 86400.0
    for i in range(per):
        t = now - span + i * span / per
        st.append([Sample("vllm:num_requests_waiting", (("engine", str(k)),), t, float(i % 7)) for k in range(n_series)])
        if i % 5000 == 0:
            st.flush()
    st.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history-points", type=int, default=2_000_000)
    ap.add_argument("--settle", type=float, default=6.0)
    args = ap.parse_args()
    pod = Pod()
    data = tempfile.mkdtemp(prefix="fragscope-hostile-")
    t = time.monotonic()
    _seed(data, args.history_points)
    print(f"history seeded: {args.history_points} points in {time.monotonic() - t:.0f} s", flush=True)
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(os.path.join(data, "agent.log"), "w")
    p = subprocess.Popen([sys.executable, "-c", "from fragscope.cli import main; main()", "agent",
                          "--listen", f"127.0.0.1:{port}", "--data-dir", data, "--interval", "1s", "--no-process",
                          "--vllm", pod.url, "--nvml-recorded", os.path.join(DATA, "nvml_h100_idle_load.json")],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    rows = []
    try:
        deadline = time.monotonic() + 60
        while _get(api + "/healthz", 2) != 200:
            if time.monotonic() > deadline:
                raise SystemExit("agent did not start")
            time.sleep(0.3)
        time.sleep(args.settle)

        def row(phase: str, answers: str = "") -> None:
            time.sleep(args.settle)
            rss, hwm = _rss(p.pid)
            rows.append((phase, rss, hwm, answers))
            print(f"{phase:<44} RSS {rss:6.1f} MB  peak {hwm:6.1f} MB  {answers}", flush=True)

        row("baseline (1 s sampling, history seeded)")
        for mode, name, secs in (("big", "one 50 MB body (chunked)", 1.5), ("bomb", "one gzip bomb (400 MB inflated)", 1.5),
                                 ("lines", "400k-line body (3.6 MB)", 1.5)):
            pod.mode = mode
            time.sleep(secs)
            pod.mode = "ok"
            row(name)
        for label, path in (("20 x /api/v1/window?since=31d", "/api/v1/window?since=31d"),
                            ("20 x raw /api/v1/signals over 31 d", "/api/v1/signals?names=vllm:num_requests_waiting"
                             "&start=-31d&step=0")):
            with cf.ThreadPoolExecutor(20) as ex:
                codes = list(ex.map(lambda _: _get(api + path), range(20)))
            row(label, "HTTP " + json.dumps({c: codes.count(c) for c in sorted(set(codes))}))
    finally:
        p.terminate()
        p.wait(10)
        log.close()
    worst = max(r[1] for r in rows)
    print(f"\nbudget {BUDGET_MB:.0f} MB: settled RSS max {worst:.1f} MB ({'within' if worst <= BUDGET_MB else 'OVER'}); "
          f"peak (VmHWM) {max(r[2] for r in rows):.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
