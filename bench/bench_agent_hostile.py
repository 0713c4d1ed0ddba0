"""Agent RSS under hostile traffic, against its 60 MB budget.

    python bench/bench_agent_hostile.py [--history-points 2000000] [--settle 6] [--suite all|bodies|engine]

A real `fragscope agent` (history on, NVML replayed, one vLLM source) is started against a local
server whose /metrics can be switched to: a 50 MB body without Content-Length; a gzip bomb
(~400 KB on the wire, 400 MB of newlines once inflated); 400k short lines. Its history is seeded
with ``--history-points`` points over 35 days (40 series), as an agent that has run for weeks.
Phases, each followed by ``--settle`` seconds of normal scrapes before RSS is read:

    baseline -> one 50 MB body -> one gzip bomb -> 400k-line body
             -> 20 concurrent /api/v1/window?since=31d -> 20 concurrent raw /api/v1/signals

The ``engine`` suite (what a hostile engine, probe directory or log can make the agent hold):

    label churn: 40,000 series whose label values change every scrape, for --churn-s seconds
    -> one 3.9 MB label value -> a denormal gauge (5e-324; the agent page must still answer 200)
    -> 20 probe records of 4,000 devices each, then deleted -> a FIFO, a symbolic link and a record
    with a 401-digit integer beside a good record -> a 400-digit number in a start-up log line

After each, the collectors that are down and what the agent says it dropped (/api/v1/status).
Prints RSS (and the peak, VmHWM) after each phase, and each phase's answers (HTTP codes).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import re
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
        self.scrape = 0
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
                if mode == "churn":  # every scrape new label values: 40,000 series never seen before
                    pod.scrape += 1
                    body = pod.ok + b"".join(b'vllm:num_requests_waiting{model_name="m",request_id="%d-%d"} 1\n'
                                             % (pod.scrape, i) for i in range(40_000))
                elif mode == "longlabel":
                    body = pod.ok + b'vllm:num_requests_waiting{model_name="' + b"x" * 3_900_000 + b'"} 1\n'
                elif mode == "denormal":
                    body = re.sub(rb"(?m)^(vllm:(?:kv|gpu)_cache_usage_perc\{[^}]*\}) \S+", rb"\1 5e-324", pod.ok)
                elif mode == "bomb":
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


def _record(pid: int, devices: int) -> bytes:
    stats = {k: 1 << 30 for k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                                  "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms")}
    devs = [{"gpu": i, "uuid": f"GPU-{pid:08d}-{i:08d}", "stats": stats} for i in range(devices)]
    return json.dumps({"format": "fragscope-probe/1", "pid": pid, "ts": time.time(), "devices": devs},
                      separators=(",", ":")).encode()


def _put(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _status(api: str) -> tuple[str, str]:
    """(collectors down, what the agent says it dropped) from /api/v1/status."""
    try:
        with urllib.request.urlopen(api + "/api/v1/status", timeout=60) as r:
            st = json.loads(r.read())
    except (OSError, ValueError) as e:
        return f"status unreadable ({type(e).__name__})", ""
    cols = st.get("collectors") or []
    cols = cols.values() if isinstance(cols, dict) else cols
    down = sorted(c.get("name", "?") for c in cols if c.get("up") is False)
    lim = st.get("limits") or {}
    dropped = ", ".join(f"{k} {v:,}" for k, v in sorted((lim.get("dropped") or {}).items()) if v)
    return ("down: " + ", ".join(down)) if down else "all collectors up", dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history-points", type=int, default=2_000_000)
    ap.add_argument("--settle", type=float, default=6.0)
    ap.add_argument("--suite", choices=("all", "bodies", "engine"), default="all")
    ap.add_argument("--churn-s", type=float, default=20.0, help="seconds of label churn (40,000 new series a scrape)")
    args = ap.parse_args()
    pod = Pod()
    data = tempfile.mkdtemp(prefix="fragscope-hostile-")
    probe = os.path.join(data, "probe")
    os.makedirs(probe)
    engine_log = os.path.join(data, "engine.log")
    with open(engine_log, "w") as fh:
        fh.write("INFO 12-31 23:58:11 gpu_executor.py:122] # GPU blocks: 7264, # CPU blocks: 512\n")
    t = time.monotonic()
    _seed(data, args.history_points)
    print(f"history seeded: {args.history_points} points in {time.monotonic() - t:.0f} s", flush=True)
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(os.path.join(data, "agent.log"), "w")
    p = subprocess.Popen([sys.executable, "-c", "from fragscope.cli import main; main()", "agent",
                          "--listen", f"127.0.0.1:{port}", "--data-dir", data, "--interval", "1s", "--no-process",
                          "--vllm", pod.url, "--nvml-recorded", os.path.join(DATA, "nvml_h100_idle_load.json"),
                          "--probe-dir", probe, "--log-file", engine_log],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    rows = []
    try:
        deadline = time.monotonic() + 60
        while _get(api + "/healthz", 2) != 200:
            if time.monotonic() > deadline:
                raise SystemExit("agent did not start")
            time.sleep(0.3)
        time.sleep(args.settle)

        stop_probe = threading.Event()

        def publish() -> None:  # a live probe beside the hostile files: its record renewed every 2 s
            while not stop_probe.wait(2.0):
                _put(os.path.join(probe, "torch-1.json"), _record(1, 1))
        _put(os.path.join(probe, "torch-1.json"), _record(1, 1))
        threading.Thread(target=publish, daemon=True).start()

        def row(phase: str, answers: str = "") -> None:
            time.sleep(args.settle)
            rss, hwm = _rss(p.pid)
            down, dropped = _status(api)
            rows.append((phase, rss, hwm, answers))
            print(f"{phase:<44} RSS {rss:6.1f} MB  peak {hwm:6.1f} MB  {answers}  [{down}]"
                  + (f"  dropped: {dropped}" if dropped else ""), flush=True)

        row("baseline (1 s sampling, history seeded)")
        if args.suite in ("all", "engine"):
            pod.mode = "churn"
            time.sleep(args.churn_s)
            pod.mode = "ok"
            row(f"label churn, 40k new series/scrape, {args.churn_s:g} s")
            pod.mode = "longlabel"
            time.sleep(2.5)
            pod.mode = "ok"
            row("one 3.9 MB label value")
            pod.mode = "denormal"
            time.sleep(2.5)
            row("denormal gauge (5e-324)", f"agent page HTTP {_get(api + '/?format=html')}")
            pod.mode = "ok"
            for i in range(20):
                _put(os.path.join(probe, f"torch-{100 + i}.json"), _record(100 + i, 4000))
            time.sleep(3)
            for i in range(20):
                os.unlink(os.path.join(probe, f"torch-{100 + i}.json"))
            row("20 probe records x 4,000 devices, deleted")
            os.mkfifo(os.path.join(probe, "torch-7.json"))
            os.symlink(os.path.join(probe, "torch-1.json"), os.path.join(probe, "torch-8.json"))
            _put(os.path.join(probe, "torch-9.json"), _record(9, 1).replace(b'"num_ooms":1073741824',
                                                                             b'"num_ooms":' + b"9" * 401))
            _put(os.path.join(probe, "torch-10\nWARNING forged.json"), _record(10, 1))
            time.sleep(3)
            row("probe dir: FIFO, symlink, 401 digits, newline")
            with open(engine_log, "a") as fh:
                fh.write("INFO 12-31 23:59:11 worker.py:1] Memory profiling takes 1.2 seconds; the current vLLM "
                         "instance can use total_gpu_memory (" + "9" * 400 + " GiB) x gpu_memory_utilization "
                         "(0.90) = 71.23GiB\n")
                fh.write("INFO 12-31 23:59:12 metrics.py:1] Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs, "
                         "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.0%, CPU KV cache usage: 0.0%.\n")
            time.sleep(3)
            row("log: 400-digit number in a start-up line")
        for mode, name, secs in (() if args.suite == "engine" else (("big", "one 50 MB body (chunked)", 1.5), ("bomb", "one gzip bomb (400 MB inflated)", 1.5),
                                 ("lines", "400k-line body (3.6 MB)", 1.5))):
            pod.mode = mode
            time.sleep(secs)
            pod.mode = "ok"
            row(name)
        for label, path in (() if args.suite == "engine" else (("20 x /api/v1/window?since=31d", "/api/v1/window?since=31d"),
                            ("20 x raw /api/v1/signals over 31 d", "/api/v1/signals?names=vllm:num_requests_waiting"
                             "&start=-31d&step=0"))):
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
