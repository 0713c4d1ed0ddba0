#!/usr/bin/env python3
"""Fleet diagnosis benchmark: 20 pods, 6 hours at 15 s, against a real Prometheus (issue 4).

    python bench/bench_fleet.py [--pods 20] [--hours 6] [--keep DIR]

Generates one recording per pod (fragscope.scenarios: mostly healthy replicas of one model, plus a
fragmentation, a KV-pressure and a throttling incident), backfills them with ``promtool tsdb
create-blocks-from openmetrics``, starts Prometheus on 127.0.0.1 and times:

* baseline: the same HTTP requests with the answers only downloaded (requests, no decoding): what
  the server and the transfer cost, the floor for any client;
* fetch: fragscope's batched fetch and decoding into columns;
* diagnose: grouping, the detectors on every pod, outliers;
* CLI: ``diagnose --prometheus URL`` end to end in a fresh process (imports included).

Target (issue 4): under 10 s for the fleet diagnosis. Needs the Debian ``prometheus`` package.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import requests  # noqa: E402

from fragscope.collectors.prometheus import PromConfig, PrometheusClient, signal_batches  # noqa: E402
from fragscope.fleet import diagnose_fleet  # noqa: E402
from fragscope.model import SeriesKey, make_labels  # noqa: E402
from fragscope.scenarios import Scenario, generate  # noqa: E402
from fragscope.scenarios.writers import write_columns  # noqa: E402

INCIDENTS = {3: "allocator-fragmentation", 8: "kv-cache-pressure", 14: "clock-throttling"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--hours", type=float, default=6)
    ap.add_argument("--keep", default=None, help="keep the recordings and the TSDB in this directory")
    a = ap.parse_args()
    prom_bin, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom_bin or not promtool:
        print("needs prometheus and promtool (apt-get install prometheus)", file=sys.stderr)
        return 2
    work = a.keep or tempfile.mkdtemp(prefix="fragscope-bench-fleet-")
    os.makedirs(work, exist_ok=True)
    tsdb = os.path.join(work, "tsdb")
    duration = a.hours * 3600
    t0 = time.perf_counter()
    gen_s = backfill_s = 0.0
    lines = 0
    start = end = None
    for i in range(a.pods):
        kind = INCIDENTS.get(i, "healthy")
        s = Scenario(kind, duration_s=duration, seed=100 + i)
        g0 = time.perf_counter()
        cols, types, _ = generate(s)
        cols = {SeriesKey(k.name, make_labels(dict(k.labels, namespace="llm", pod=f"vllm-{i:02d}"))): v
                for k, v in cols.items()}
        path = os.path.join(work, f"vllm-{i:02d}.om")
        write_columns(cols, types, path, openmetrics=True)
        start = min(float(t[0]) for t, _ in cols.values()) if start is None else start
        end = max(float(t[-1]) for t, _ in cols.values()) if end is None else end
        gen_s += time.perf_counter() - g0
        with open(path, "rb") as fh:
            lines += sum(1 for _ in fh)
        b0 = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", path, tsdb], check=True,
                       capture_output=True)
        backfill_s += time.perf_counter() - b0
    print(f"recordings: {a.pods} pods x {a.hours:g} h at 15 s, {lines:,} lines; generated in {gen_s:.1f} s, "
          f"promtool backfill {backfill_s:.1f} s")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = os.path.join(work, "prometheus.yml")
    with open(cfg, "w") as fh:
        fh.write("global:\n  scrape_interval: 15s\n")
    proc = subprocess.Popen([prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        else:
            print("prometheus did not become ready", file=sys.stderr)
            return 1
        # warm the server's page cache once, as a running Prometheus would be
        client = PrometheusClient(PromConfig(url))
        diagnose_fleet(client, start, end)

        # baseline: the same requests, bodies downloaded, nothing decoded
        dur_ms = int((end - start) * 1000) + 1
        b0 = time.perf_counter()
        nbytes = 0
        for b in signal_batches():
            r = requests.get(url + "/api/v1/query", params={"query": f'{{__name__=~"{b.regex()}"}}[{dur_ms}ms]',
                                                            "time": f"{end:.3f}"}, timeout=120)
            nbytes += len(r.content)
        base_s = time.perf_counter() - b0

        client = PrometheusClient(PromConfig(url))
        f0 = time.perf_counter()
        rep = diagnose_fleet(client, start, end)
        total_s = time.perf_counter() - f0
        points = sum(len(t.window.series[k]) for t in rep.targets for k in t.window.series)

        c0 = time.perf_counter()
        cli = subprocess.run([sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()",
                              "--prometheus", url, "--start", repr(start), "--end", repr(end), "--fail-on", "never",
                              "--format", "json"], capture_output=True, text=True)
        cli_s = time.perf_counter() - c0
        if cli.returncode != 0:
            print(f"CLI failed: {cli.stderr.strip()}", file=sys.stderr)

        print(f"fleet: {len(rep.targets)} targets, {rep.series:,} series, {points:,} points, "
              f"{nbytes / 1e6:.1f} MB of JSON")
        print(f"baseline (same {len(signal_batches())} requests, sequential, download only): {base_s:.2f} s")
        print(f"fragscope fetch: {rep.queries} queries, {rep.fetch_seconds:.2f} s "
              f"({rep.fetch_seconds / base_s:.2f}x baseline; {PARALLEL} in parallel)")
        print(f"diagnose {len(rep.targets)} targets: {rep.diagnose_seconds:.2f} s")
        print(f"fleet diagnosis in-process: {total_s:.2f} s  (target < 10 s: {'met' if total_s < 10 else 'MISSED'})")
        print(f"diagnose --prometheus CLI, fresh process: {cli_s:.2f} s")
        top = [(str(t.id), t.top.id if t.top else "-") for t in rep.ordered()[:4]]
        print(f"worst targets: {top}; outliers: {[(o.target, o.metric) for o in rep.outliers]}")
        print(f"total benchmark time {time.perf_counter() - t0:.1f} s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


from fragscope.collectors.prometheus import PARALLEL_REQUESTS as PARALLEL  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
