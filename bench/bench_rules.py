"""Prometheus's cost of fragscope's rule files, before and after a change, measured in one run: three
Prometheus servers scrape the same replayed vLLM and DCGM endpoints at the same interval over the same
seconds, one with no rules (the floor), one with the rule files of a baseline git revision and one with
the working tree's (dashboards/rules/*.yml). Reports each server's CPU (% of one core), the rule
evaluation time it reports itself (``prometheus_rule_group_last_duration_seconds`` per group, scaled to
seconds of evaluation per minute by each group's interval) and the ratio after / before.

    python bench/bench_rules.py [--baseline-ref main] [--seconds 60] [--interval 1] [--rule-interval 5]

The serving pod is tests/data/agent/replay.py (as in bench/bench_agent.py). Needs prometheus.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_agent import ROOT, free_port, start_replay, wait_http  # noqa: E402

RULES = os.path.join(ROOT, "dashboards", "rules")


def rule_files_at(ref: str, dest: str) -> list[str]:
    """The dashboards/rules/*.yml of git revision ``ref``, written under ``dest``."""
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", f"{ref}:dashboards/rules"],
                           capture_output=True, text=True, check=True).stdout.split()
    os.makedirs(dest, exist_ok=True)
    out = []
    for n in names:
        if n.endswith(".yml"):
            text = subprocess.run(["git", "-C", ROOT, "show", f"{ref}:dashboards/rules/{n}"], capture_output=True,
                                  text=True, check=True).stdout
            p = os.path.join(dest, n)
            with open(p, "w") as fh:
                fh.write(text)
            out.append(p)
    return sorted(out)


def start(tmp: str, name: str, targets: list[str], rules: list[str], interval: float, rule_interval: float,
          port: int) -> subprocess.Popen:
    from urllib.parse import urlsplit

    lines = ["global:", f"  scrape_interval: {interval:g}s", f"  scrape_timeout: {min(interval, 10):g}s",
             f"  evaluation_interval: {rule_interval:g}s"]
    if rules:
        lines += ["rule_files:"] + [f"  - {r}" for r in rules]
    lines.append("scrape_configs:")
    for i, url in enumerate(targets):
        u = urlsplit(url)
        lines += [f"  - job_name: t{i}", f"    metrics_path: {u.path}", "    static_configs:",
                  f"      - targets: ['{u.netloc}']", "        labels: {namespace: llm, pod: bench}"]
    d = os.path.join(tmp, "server-" + name)
    os.makedirs(d)
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return subprocess.Popen([shutil.which("prometheus"), f"--config.file={cfg}",
                             f"--storage.tsdb.path={os.path.join(d, 'tsdb')}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "prometheus.log"), "w"),
                            start_new_session=True)


def group_figures(port: int) -> dict[str, tuple[float, float]]:
    """rule group -> (last evaluation seconds, interval seconds), from the server's own metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    last: dict[str, float] = {}
    every: dict[str, float] = {}
    for line in body.splitlines():
        for metric, into in (("prometheus_rule_group_last_duration_seconds{", last),
                             ("prometheus_rule_group_interval_seconds{", every)):
            if line.startswith(metric):
                labels, value = line[len(metric):].rsplit("} ", 1)
                group = labels.split('rule_group="', 1)[1].split('"', 1)[0]
                into[group] = float(value)
    return {g: (last[g], every.get(g, 0.0)) for g in last}


def rule_errors(port: int) -> list[str]:
    doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5))
    return [f"{r.get('name')}: {r.get('lastError')}" for g in doc["data"]["groups"] for r in g["rules"]
            if r.get("lastError")]


def slowest_rules(port: int, n: int = 6) -> list[tuple[float, str]]:
    doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5))
    rules = [(float(r.get("evaluationTime") or 0.0), r.get("name", "")) for g in doc["data"]["groups"]
             for r in g["rules"]]
    return sorted(rules, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-ref", default="main", help="git revision whose dashboards/rules/*.yml is 'before'")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0, help="scrape interval (s)")
    ap.add_argument("--rule-interval", type=float, default=5.0,
                    help="evaluation interval of groups that set none (s; the triage group keeps its 60 s)")
    a = ap.parse_args()
    if not shutil.which("prometheus"):
        raise SystemExit("bench: prometheus not installed (apt-get install prometheus)")
    tmp = tempfile.mkdtemp(prefix="fragscope-rules-")
    procs: list[subprocess.Popen] = []
    try:
        replay = start_replay(tmp, a.seconds + a.warmup + 120)
        procs.append(replay)
        base = f"http://127.0.0.1:{int(replay.stdout.readline().split()[1])}"
        targets = [base + "/vllm/metrics", base + "/dcgm/metrics"]
        sets = {"no rules": [], f"before ({a.baseline_ref})": rule_files_at(a.baseline_ref, os.path.join(tmp, "before")),
                "after (working tree)": sorted(os.path.join(RULES, f) for f in os.listdir(RULES) if f.endswith(".yml"))}
        ports, watched = {}, {}
        for name, rules in sets.items():
            ports[name] = free_port()
            p = start(tmp, name.split()[0], targets, rules, a.interval, a.rule_interval, ports[name])
            procs.append(p)
            watched[name] = psutil.Process(p.pid)
        for port in ports.values():
            wait_http(port, "/-/ready")
        time.sleep(a.warmup)
        for name, port in ports.items():
            errs = rule_errors(port)
            if errs:
                print(f"{name}: rules with errors: {errs[:5]}")
        size = {name: sum(os.path.getsize(r) for r in rules) for name, rules in sets.items()}
        c0 = {k: p.cpu_times() for k, p in watched.items()}
        la0, t0 = os.getloadavg()[0], time.monotonic()
        per_min: dict[str, list[float]] = {k: [] for k in ports}
        while time.monotonic() - t0 < a.seconds:
            for name, port in ports.items():
                figs = group_figures(port)
                per_min[name].append(sum(d * 60.0 / iv for d, iv in figs.values() if iv > 0))
            time.sleep(5.0)
        wall = time.monotonic() - t0
        cpu = {}
        for k, p in watched.items():
            c1 = p.cpu_times()
            cpu[k] = 100.0 * ((c1.user - c0[k].user) + (c1.system - c0[k].system)) / wall
        load = (la0 + os.getloadavg()[0]) / 2
        print(f"{a.seconds:g} s, scrapes every {a.interval:g} s, rule groups every {a.rule_interval:g} s "
              f"(the triage group every 60 s); load average {load:.2f}")
        print(f"{'':24}{'rule files (kB)':>16}{'CPU % of a core':>17}{'rule eval (s/min)':>19}")
        ev = {k: statistics.median(v) if v else 0.0 for k, v in per_min.items()}
        for name in ports:
            print(f"{name:24}{size[name] / 1e3:>16.1f}{cpu[name]:>17.2f}{ev[name]:>19.3f}")
        before, after = list(ports)[1], list(ports)[2]
        floor = cpu["no rules"]
        print(f"after / before: rule evaluation {ev[after] / max(ev[before], 1e-9):.2f}x, CPU {cpu[after] / max(cpu[before], 1e-9):.2f}x, "
              f"CPU above the no-rules floor {(cpu[after] - floor) / max(cpu[before] - floor, 1e-9):.2f}x")
        for name in (before, after):
            print(f"slowest rules, {name}: " + "; ".join(f"{n} {t * 1e3:.2f} ms" for t, n in slowest_rules(ports[name])))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
