#!/usr/bin/env python3
"""Fleet diagnosis benchmark: N pods x 6 h at 15 s in a real Prometheus, triage against full download (issue 15).

    python bench/bench_fleet.py [--sizes 20,50,100,200] [--hours 6] [--baseline-max 100] [--rules] [--keep DIR]
    python bench/bench_fleet.py --pods 2000 --hours 1 [--gpus 5] [--subset 200] [--queries] [--keep DIR]

Generates one recording per pod (fragscope.scenarios: healthy replicas of one model with 5 incidents
among the first 20 pods: two allocator-fragmentation, kv-cache-pressure, clock-throttling,
memory-leak), backfills them with ``promtool tsdb create-blocks-from openmetrics`` size by size
(20, then 30 more, ...), restarts Prometheus on 127.0.0.1 over the grown TSDB, and for each size runs
``diagnose --prometheus URL --format json`` in a fresh process and reports its wall time and peak RSS
(``os.wait4``), for:

* **triage** (the default, ``--triage queries``: level checks in PromQL, deep fetch of the flagged
  pods plus 3 healthy peers, one pod at a time);
* **baseline: full download** (``--triage off``: every series of every pod, the path before issue
  15), up to ``--baseline-max`` pods (it grows with the fleet: ~0.5 GB of JSON at 200 pods);
* with ``--rules``: the triage recording rules backfilled (``promtool tsdb create-blocks-from
  rules``) at the largest size, then ``--triage rules`` (one instant query).

Target (issue 15): <= 15 s and <= 500 MB RSS at 200 pods with 5 incidents; the cost grows with the
flagged pods, not the fleet. Needs the Debian ``prometheus`` package (prometheus, promtool).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import requests  # noqa: E402

from fragscope.model import SeriesKey, make_labels  # noqa: E402
from fragscope.scenarios import Scenario, generate  # noqa: E402
from fragscope.scenarios.writers import write_columns  # noqa: E402

INCIDENTS = {3: "allocator-fragmentation", 8: "kv-cache-pressure", 11: "memory-leak", 14: "clock-throttling",
             17: "allocator-fragmentation"}
RULES = os.path.join(ROOT, "dashboards", "rules", "fragscope-triage.yml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_name(i: int) -> str:
    return f"vllm-{i:03d}"


def backfill(work: str, tsdb: str, pods: range, duration: float, promtool: str) -> tuple[float, float, float, float]:
    """Generate and backfill ``pods``; returns (generate s, backfill s, start, end)."""
    gen_s = bf_s = 0.0
    start = end = None
    for i in pods:
        g0 = time.perf_counter()
        cols, types, _ = generate(Scenario(INCIDENTS.get(i, "healthy"), duration_s=duration, seed=100 + i))
        cols = {SeriesKey(k.name, make_labels(dict(k.labels, namespace="llm", pod=pod_name(i)))): v
                for k, v in cols.items()}
        path = os.path.join(work, "pod.om")
        write_columns(cols, types, path, openmetrics=True)
        s0 = min(float(t[0]) for t, _ in cols.values())
        e0 = max(float(t[-1]) for t, _ in cols.values())
        start, end = (s0, e0) if start is None else (min(start, s0), max(end, e0))
        gen_s += time.perf_counter() - g0
        b0 = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", path, tsdb], check=True,
                       capture_output=True)
        bf_s += time.perf_counter() - b0
        os.unlink(path)
    return gen_s, bf_s, start, end


class Server:
    def __init__(self, prom_bin: str, work: str, tsdb: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(work, "prometheus.yml")
        with open(cfg, "w") as fh:
            fh.write("global:\n  scrape_interval: 15s\n")
        self.proc = subprocess.Popen([prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                                      f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--storage.tsdb.retention.time=100y"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.close()
        raise RuntimeError("prometheus did not become ready")

    def settle(self, limit_s: float = 240) -> float:
        """Wait for the TSDB to finish compacting the backfilled (overlapping) blocks, as a server that
        has been running would have: compaction runs once a minute; stable block count after it."""
        t0 = time.monotonic()

        def blocks() -> tuple[float, float]:
            vals = {}
            for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
                for name in ("prometheus_tsdb_blocks_loaded", "prometheus_tsdb_compactions_total"):
                    if line.startswith(name + " "):
                        vals[name] = float(line.split()[1])
            return vals.get("prometheus_tsdb_blocks_loaded", -1), vals.get("prometheus_tsdb_compactions_total", 0)

        first = blocks()
        last, stable_since = first, time.monotonic()
        while time.monotonic() - t0 < limit_s:
            time.sleep(5)
            now = blocks()
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - t0 > 65 and time.monotonic() - stable_since >= 15:
                break
        return time.monotonic() - t0

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


# The child's own peak RSS: VmHWM of its address space, read by the child itself as it exits. (os.wait4's
# ru_maxrss is not it: Linux carries the forking parent's high-water mark into the child across exec, so a
# parent holding 400 MB of generated fleet reported 427 MB for a client that peaks far lower.)
_HWM = ("import atexit, os, sys; sys.argv[0] = 'diagnose'\n"
        "def _hwm():\n"
        "    with open('/proc/self/status') as f, open(os.environ['BENCH_HWM_FILE'], 'w') as o:\n"
        "        o.write(next(l for l in f if l.startswith('VmHWM:')).split()[1])\n"
        "atexit.register(_hwm)\n"
        "from fragscope.cli import diagnose_main; diagnose_main()")


def run_cli_rss(url: str, start: float, end: float, *extra: str) -> tuple[float, float, dict | None, str]:
    """As run_cli, with the child's own peak RSS (its VmHWM at exit)."""
    args = [sys.executable, "-c", _HWM, "--prometheus", url, "--start", repr(start), "--end", repr(end),
            "--fail-on", "never", "--format", "json", *extra]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".hwm") as hwm:
        t0 = time.perf_counter()
        p = subprocess.run(args, stdout=out, stderr=err, env=dict(os.environ, PYTHONPATH=ROOT,
                                                                    BENCH_HWM_FILE=hwm.name))
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        body, msg = out.read(), err.read().decode(errors="replace").strip()
        try:
            rss_mb = int(open(hwm.name).read()) / 1024
        except ValueError:
            rss_mb = float("nan")
    del p
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    return wall, rss_mb, doc, msg


def summary(doc: dict | None) -> str:
    if doc is None:
        return "FAILED"
    f = doc["fleet"]
    tri = f.get("triage") or {}
    found = sorted({t["top_finding"]["id"] for t in doc["targets"] if t.get("top_finding")})
    return (f"{f['queries']} queries (triage {tri.get('queries', 0)} in {tri.get('seconds', 0):.1f} s), deep fetch "
            f"{f['fetch_seconds']:.1f} s, detectors {f['diagnose_seconds']:.1f} s, {f['series']:,} series deep, "
            f"{tri.get('flagged', '-')} flagged, {tri.get('examined', f['targets'])} examined of {f['targets']}; "
            f"findings {found}")


def _families(text: str) -> list[tuple[str, str]]:
    """OpenMetrics text -> [(family header lines, sample lines)] in order (# EOF dropped)."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# EOF"):
            continue
        if line.startswith("#"):
            if not out or out[-1][1]:
                out.append((line, []))
            else:
                out[-1] = (out[-1][0] + line, out[-1][1])
        else:
            out[-1][1].append(line)
    return [(h, "".join(b)) for h, b in out]


def _more_gpus(cols: dict, healthy: dict, gpus: int) -> dict:
    """``cols`` with GPUs 1..gpus-1 added: the healthy template's GPU series (gpu="0") relabelled."""
    out = dict(cols)
    for g in range(1, gpus):
        for k, v in healthy.items():
            lab = dict(k.labels)
            if lab.get("gpu") != "0":
                continue
            lab["gpu"] = str(g)
            if "gpu_uuid" in lab:
                lab["gpu_uuid"] = f"{lab['gpu_uuid']}-{g}"
            out[SeriesKey(k.name, make_labels(lab))] = v
    return out


def big_backfill(work: str, tsdb: str, pods: int, duration: float, promtool: str, batch: int,
                 templates: int = 20, gpus: int = 1) -> tuple[float, float, float, float, int]:
    """A large fleet, fast: ``templates`` healthy pods and the incident pods generated once, each pod's
    text their template's with its own pod label, ``batch`` pods per OpenMetrics file (families kept
    contiguous), one promtool backfill per file. Returns (generate s, backfill s, start, end, samples)."""
    import io

    from fragscope.scenarios.writers import write_columns as _wc

    g0 = time.perf_counter()
    placeholder = "@@POD@@"
    tmpl: dict[object, list[tuple[str, str]]] = {}
    start = end = None
    samples = 0
    healthy0 = generate(Scenario("healthy", duration_s=duration, seed=99))[0] if gpus > 1 else {}
    for key in [("healthy", k) for k in range(templates)] + [(kind, i) for i, kind in INCIDENTS.items()]:
        kind, seed = key
        cols, types, _ = generate(Scenario(kind, duration_s=duration, seed=100 + seed))
        if gpus > 1:
            cols = _more_gpus(cols, healthy0, gpus)
        cols = {SeriesKey(k.name, make_labels(dict(k.labels, namespace="llm", pod=placeholder))): v
                for k, v in cols.items()}
        buf = io.StringIO()
        _wc(cols, types, buf, openmetrics=True)
        tmpl[key] = _families(buf.getvalue())
        s0 = min(float(t[0]) for t, _ in cols.values())
        e0 = max(float(t[-1]) for t, _ in cols.values())
        start, end = (s0, e0) if start is None else (min(start, s0), max(end, e0))
        samples_per = sum(len(t) for t, _ in cols.values())
    gen_s, bf_s = time.perf_counter() - g0, 0.0
    path = os.path.join(work, "batch.om")
    for lo in range(0, pods, batch):
        g0 = time.perf_counter()
        heads: dict[str, str] = {}
        bodies: dict[str, list[str]] = {}
        for i in range(lo, min(pods, lo + batch)):
            key = (INCIDENTS[i], i) if i in INCIDENTS else ("healthy", i % templates)
            name = pod_name(i)
            for head, body in tmpl[key]:
                fam = head.rsplit("# TYPE ", 1)[-1].split(" ", 1)[0]
                heads.setdefault(fam, head)
                bodies.setdefault(fam, []).append(body.replace(placeholder, name))
            samples += samples_per
        with open(path, "w") as fh:
            for fam, head in heads.items():
                fh.write(head)
                fh.writelines(bodies[fam])
            fh.write("# EOF\n")
        gen_s += time.perf_counter() - g0
        b0 = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", path, tsdb], check=True,
                       capture_output=True)
        bf_s += time.perf_counter() - b0
        os.unlink(path)
    return gen_s, bf_s, start, end, samples


def _proc_cpu(pid: int) -> float:
    """user + system CPU seconds of a process (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def big_fleet(a, prom_bin: str, promtool: str) -> int:
    """--pods N: one fleet of N pods, the triage recording rules backfilled, then `diagnose --prometheus`
    with the rules over the whole fleet and over its first --subset pods (the same incidents): fragscope's
    wall time and peak RSS, and the Prometheus server's CPU and RSS for the same run beside them."""
    work = a.keep or tempfile.mkdtemp(prefix="fragscope-bench-fleet-")
    os.makedirs(work, exist_ok=True)
    tsdb = os.path.join(work, "tsdb")
    t_all = time.perf_counter()
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(open('/proc/loadavg').read().split()[:3])}; "
          f"{a.pods:,} pods x {a.gpus} GPU(s) x {a.hours:g} h at 15 s; incidents at pods "
          f"{', '.join(f'{pod_name(i)} ({k})' for i, k in sorted(INCIDENTS.items()))}", flush=True)
    if not os.path.isdir(tsdb) or not os.listdir(tsdb):
        g, b, start, end, n = big_backfill(work, tsdb, a.pods, a.hours * 3600, promtool, a.batch, gpus=a.gpus)
        with open(os.path.join(work, "span.json"), "w") as fh:
            json.dump({"start": start, "end": end, "samples": n}, fh)
        print(f"      generated in {g:.0f} s, backfilled with promtool in {b:.0f} s ({n:,} samples)", flush=True)
    with open(os.path.join(work, "span.json")) as fh:
        span = json.load(fh)
    start, end = span["start"], span["end"]
    srv = Server(prom_bin, work, tsdb)
    try:
        print(f"      (TSDB compaction settled {srv.settle():.0f} s after start)", flush=True)
        if not os.path.exists(os.path.join(work, "rules-done")):
            r0 = time.perf_counter()
            out = os.path.join(work, "rule-blocks")
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", "--start", str(int(start)),
                            "--end", str(int(end) + 60), "--url", srv.url, "--output-dir", out, RULES],
                           check=True, capture_output=True)
            srv.close()
            for blk in os.listdir(out):
                shutil.move(os.path.join(out, blk), os.path.join(tsdb, blk))
            open(os.path.join(work, "rules-done"), "w").close()
            print(f"      triage rules backfilled with promtool in {time.perf_counter() - r0:.0f} s", flush=True)
            srv = Server(prom_bin, work, tsdb)
            srv.settle()
        print(f"{'pods':>6} {'path':<24} {'seconds':>8} {'peak RSS MB':>12}  {'server CPU s':>12} "
              f"{'server RSS MB':>13}  what")
        sub = f'{{pod=~"vllm-(?:{"|".join(f"{i:03d}" for i in range(min(a.subset, a.pods)))})"}}'
        runs = [(a.pods, "triage (rules)", ("--triage", "rules")),
                (min(a.subset, a.pods), "triage (rules), subset", ("--triage", "rules", "--selector", sub))]
        if a.queries:
            runs.append((a.pods, "triage (queries)", ("--triage", "queries", "--timeout", "600")))
        for n, label, extra in runs:
            run_cli_rss(srv.url, start, end, *extra)  # the server's page cache warm once
            c0 = _proc_cpu(srv.proc.pid)
            wall, rss, doc, err = run_cli_rss(srv.url, start, end, *extra)
            cpu = _proc_cpu(srv.proc.pid) - c0
            print(f"{n:>6} {label:<24} {wall:>8.2f} {rss:>12.0f}  {cpu:>12.2f} {_proc_rss_mb(srv.proc.pid):>13.0f}  "
                  f"{summary(doc)} {err[:200]}", flush=True)
    finally:
        srv.close()
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20,50,100,200")
    ap.add_argument("--hours", type=float, default=6)
    ap.add_argument("--baseline-max", type=int, default=100, help="full download only up to this many pods")
    ap.add_argument("--rules", action="store_true", help="also backfill the triage rules at the largest size")
    ap.add_argument("--keep", default=None, help="keep the TSDB in this directory")
    ap.add_argument("--pods", type=int, default=0,
                    help="instead: one fleet of this many pods (healthy pods from 20 generated templates), the "
                         "rules backfilled, diagnosed with the rules; e.g. --pods 2000 --hours 1")
    ap.add_argument("--batch", type=int, default=100, help="--pods: pods per promtool backfill")
    ap.add_argument("--gpus", type=int, default=1, help="--pods: GPUs per pod (GPU and allocator series each)")
    ap.add_argument("--subset", type=int, default=200, help="--pods: also diagnose only the first N pods")
    ap.add_argument("--queries", action="store_true", help="--pods: also --triage queries (slow on the server)")
    a = ap.parse_args()
    sizes = sorted(int(x) for x in a.sizes.split(","))
    prom_bin, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom_bin or not promtool:
        print("needs prometheus and promtool (apt-get install prometheus)", file=sys.stderr)
        return 2
    if a.pods:
        return big_fleet(a, prom_bin, promtool)
    work = a.keep or tempfile.mkdtemp(prefix="fragscope-bench-fleet-")
    os.makedirs(work, exist_ok=True)
    tsdb = os.path.join(work, "tsdb")
    duration = a.hours * 3600
    t_all = time.perf_counter()
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"]
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(load)}; incidents at pods "
          f"{', '.join(f'{pod_name(i)} ({k})' for i, k in sorted(INCIDENTS.items()))}")
    print(f"{'pods':>5} {'path':<22} {'seconds':>8} {'peak RSS MB':>12}  what")
    have = 0
    start = end = None
    rows = []
    for n in sizes:
        g, b, s0, e0 = backfill(work, tsdb, range(have, n), duration, promtool)
        start, end = (s0, e0) if start is None else (min(start, s0), max(end, e0))
        have = n
        srv = Server(prom_bin, work, tsdb)
        try:
            settled = srv.settle()
            print(f"      (TSDB compaction settled {settled:.0f} s after start)", flush=True)
            run_cli_rss(srv.url, start, end, "--triage", "queries")  # warm the server's page cache once
            wall, rss, doc, err = run_cli_rss(srv.url, start, end, "--triage", "queries")
            rows.append((n, "triage", wall, rss))
            print(f"{n:>5} {'triage (queries)':<22} {wall:>8.2f} {rss:>12.0f}  {summary(doc)} {err[:200]}")
            if n <= a.baseline_max:
                wall, rss, doc, err = run_cli_rss(srv.url, start, end, "--triage", "off")
                rows.append((n, "full", wall, rss))
                print(f"{n:>5} {'baseline: full download':<22} {wall:>8.2f} {rss:>12.0f}  {summary(doc)} {err[:200]}")
            if a.rules and n == sizes[-1]:
                r0 = time.perf_counter()
                out = os.path.join(work, "rule-blocks")
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", "--start", str(int(start)),
                                "--end", str(int(end) + 60), "--url", srv.url, "--output-dir", out, RULES],
                               check=True, capture_output=True)
                srv.close()
                for blk in os.listdir(out):
                    shutil.move(os.path.join(out, blk), os.path.join(tsdb, blk))
                print(f"      triage rules backfilled with promtool in {time.perf_counter() - r0:.1f} s")
                srv = Server(prom_bin, work, tsdb)
                srv.settle()
                run_cli_rss(srv.url, start, end, "--triage", "rules")
                wall, rss, doc, err = run_cli_rss(srv.url, start, end, "--triage", "rules")
                print(f"{n:>5} {'triage (rules)':<22} {wall:>8.2f} {rss:>12.0f}  {summary(doc)} {err[:200]}")
        finally:
            srv.close()
        print(f"      ({n - (sizes[sizes.index(n) - 1] if sizes.index(n) else 0)} pods generated in {g:.1f} s, "
              f"backfilled in {b:.1f} s)", flush=True)
    tri = [r for r in rows if r[1] == "triage"]
    if len(tri) >= 2:
        (n0, _, w0, m0), (n1, _, w1, m1) = tri[0], tri[-1]
        print(f"triage growth {n0} -> {n1} pods: time x{w1 / w0:.2f}, RSS x{m1 / m0:.2f} (fleet x{n1 / n0:.1f})")
    full = {r[0]: r for r in rows if r[1] == "full"}
    for n, _, w, m in tri:
        if n in full:
            print(f"{n} pods: triage {w:.1f} s / {m:.0f} MB vs full download {full[n][2]:.1f} s / "
                  f"{full[n][3]:.0f} MB ({full[n][2] / w:.1f}x faster, {full[n][3] / m:.1f}x less memory)")
    print(f"total benchmark time {time.perf_counter() - t_all:.0f} s")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
