"""Time to a verdict in a preemption storm, against a real vLLM.

    python storm.py --vllm URL --agent [NAME=]URL [--agent NAME=URL ...] [--prometheus URL] --diagnose BIN \
        --load-py load.py --duration 120 --target 15 --out result.json

At t0 this starts heavy load (closed loop, more workers than the KV pool holds) and, at the same moment,
``diagnose URL`` against the engine (no warm-up, no history). It polls the engine's own /metrics every
0.5 s for the first preemption (vllm:num_preemptions_total above its value at t0), each agent's /metrics
for ``fragscope_diagnosis_active{diagnosis="kv-cache-pressure"} 1`` at warning or critical severity
(``fragscope_diagnosis_severity`` >= 2; a cold one started just before t0, a
warm one that watched a calm stretch), a Prometheus server's /api/v1/alerts for its alert rule firing
(the baseline: an alert on the engine's own counter with ``for: 1m``), and timestamps every line diagnose
prints. Prints one JSON object: seconds from the first preemption to each agent's flag, to diagnose's
first warning or critical kv-cache-pressure line and to the alert, with the raw times; exit 0 when every fragscope
verdict came within --target seconds.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

PRE = re.compile(r'^vllm:num_preemptions(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)', re.M)
VERDICT = re.compile(r"\b(?:WARNING|CRITICAL) kv-cache-pressure\b")  # diagnose's finding lines (not info)
ACTIVE = re.compile(r'^fragscope_diagnosis_active\{[^}]*diagnosis="kv-cache-pressure"[^}]*\}\s+1(?:\.0)?\b', re.M)
SEVERITY = re.compile(r'^fragscope_diagnosis_severity\{[^}]*diagnosis="kv-cache-pressure"[^}]*\}\s+([0-9.]+)', re.M)


def flagged(txt: str | None) -> bool:
    """The agent exports kv-cache-pressure as active at warning (2) or critical (3), not info (1)."""
    if not txt or not ACTIVE.search(txt):
        return False
    m = SEVERITY.search(txt)
    return m is not None and float(m.group(1)) >= 2


def get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode("utf-8", "replace")
    except Exception:
        return None


def preemptions(text: str | None) -> float | None:
    if not text:
        return None
    vals = [float(x) for x in PRE.findall(text)]
    return sum(vals) if vals else None


def alert_firing(prom: str, name: str) -> bool:
    txt = get(prom + "/api/v1/alerts")
    if not txt:
        return False
    try:
        alerts = json.loads(txt)["data"]["alerts"]
    except (ValueError, KeyError, TypeError):
        return False
    return any(a.get("labels", {}).get("alertname") == name and a.get("state") == "firing" for a in alerts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--agent", action="append", required=True, help="[NAME=]URL, repeatable")
    ap.add_argument("--prometheus", default=None, help="a Prometheus server evaluating --alert")
    ap.add_argument("--alert", default="VllmPreempting")
    ap.add_argument("--target", type=float, default=15.0, help="seconds after the first preemption")
    ap.add_argument("--diagnose", required=True, help="the diagnose executable")
    ap.add_argument("--load-py", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--concurrency", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    agents = dict((x.split("=", 1) if "=" in x else ("agent", x)) for x in a.agent)
    base_pre = preemptions(get(a.vllm + "/metrics")) or 0.0
    t0 = time.time()
    load = subprocess.Popen([a.python, a.load_py, "--url", a.vllm, "--concurrency", str(a.concurrency),
                             "--max-tokens", str(a.max_tokens), "--duration", str(a.duration), "--grace", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    diag = subprocess.Popen([a.diagnose, a.vllm, "--duration", f"{int(a.duration)}s", "--fail-on", "never"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[tuple[float, str]] = []

    def reader():
        for line in diag.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    t_pre = t_alert = None
    t_agent: dict[str, float | None] = {k: None for k in agents}
    agent_polls = 0
    while time.time() - t0 < a.duration:
        now = time.time()
        if t_pre is None:
            p = preemptions(get(a.vllm + "/metrics"))
            if p is not None and p > base_pre:
                t_pre = now
        for name, url in agents.items():
            if t_agent[name] is None:
                txt = get(url + "/metrics")
                agent_polls += 1
                if flagged(txt):
                    t_agent[name] = now
        if a.prometheus and t_alert is None and alert_firing(a.prometheus, a.alert):
            t_alert = now
        if (t_pre is not None and all(v is not None for v in t_agent.values())
                and any(VERDICT.search(ln) for _, ln in lines)
                and (not a.prometheus or t_alert is not None)):
            break
        time.sleep(max(0.0, 0.5 - (time.time() - now)))
    t_diag = next((t for t, ln in lines if VERDICT.search(ln)), None)
    first_line = next((t for t, ln in lines if ln.strip()), None)
    for p in (diag, load):
        if p.poll() is None:
            p.terminate()
    for p in (diag, load):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    th.join(timeout=5)
    def after(t):
        return None if (t_pre is None or t is None) else round(t - t_pre, 1)

    res = {
        "first_preemption_s_after_load": None if t_pre is None else round(t_pre - t0, 1),
        **{f"agent_{k}_flag_s_after_first_preemption": after(v) for k, v in t_agent.items()},
        "diagnose_verdict_s_after_first_preemption": after(t_diag),
        "alert_for_1m_s_after_first_preemption": after(t_alert) if a.prometheus else "not run",
        "diagnose_first_output_s_after_start": None if first_line is None else round(first_line - t0, 1),
        "diagnose_lines": [f"{t - t0:6.1f} {ln}" for t, ln in lines[:40]],
        "agent_polls": agent_polls,
        "target_s": a.target,
    }
    # the target is this checkout's: an agent named *before (another checkout, for comparison) is reported only
    keys = [f"agent_{k}_flag_s_after_first_preemption" for k in t_agent if not k.endswith("before")] + \
        ["diagnose_verdict_s_after_first_preemption"]
    ok = all(res[k] is not None and res[k] <= a.target for k in keys)
    res["target_met"] = ok
    js = json.dumps(res, indent=1)
    print(js)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(js + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
