"""Time to detection of a preemption storm on a cold start (issue 10), against a real vLLM.

    python storm.py --vllm URL --agent URL --diagnose BIN --load-py load.py --duration 120 --out result.json

At t0 this starts heavy load (closed loop, more workers than the KV pool holds) and, at the same moment,
``diagnose URL`` against the engine (no warm-up, no history). It polls the engine's own /metrics every
0.5 s for the first preemption (vllm:num_preemptions_total above its value at t0) and the agent's /metrics
for ``fragscope_diagnosis_active{diagnosis="kv-cache-pressure"} 1``, and timestamps every line diagnose
prints. Prints one JSON line: seconds from the first preemption to the agent's flag and to diagnose's first
line naming kv-cache-pressure (target <= 30 s for both), with the raw times.
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
ACTIVE = re.compile(r'^fragscope_diagnosis_active\{[^}]*diagnosis="kv-cache-pressure"[^}]*\}\s+1(?:\.0)?\b', re.M)


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--diagnose", required=True, help="the diagnose executable")
    ap.add_argument("--load-py", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--concurrency", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

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
    t_pre = t_agent = None
    agent_polls = 0
    while time.time() - t0 < a.duration:
        now = time.time()
        if t_pre is None:
            p = preemptions(get(a.vllm + "/metrics"))
            if p is not None and p > base_pre:
                t_pre = now
        if t_agent is None:
            txt = get(a.agent + "/metrics")
            agent_polls += 1
            if txt and ACTIVE.search(txt):
                t_agent = now
        if t_pre is not None and t_agent is not None and any("kv-cache-pressure" in ln for _, ln in lines):
            break
        time.sleep(0.5)
    t_diag = next((t for t, ln in lines if "kv-cache-pressure" in ln), None)
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
    res = {
        "first_preemption_s_after_load": None if t_pre is None else round(t_pre - t0, 1),
        "agent_flag_s_after_first_preemption": None if (t_pre is None or t_agent is None) else round(t_agent - t_pre, 1),
        "diagnose_verdict_s_after_first_preemption": None if (t_pre is None or t_diag is None) else round(t_diag - t_pre, 1),
        "diagnose_first_output_s_after_start": None if first_line is None else round(first_line - t0, 1),
        "diagnose_lines": [f"{t - t0:6.1f} {ln}" for t, ln in lines[:40]],
        "agent_polls": agent_polls,
    }
    ok = all(res[k] is not None and res[k] <= 30 for k in ("agent_flag_s_after_first_preemption",
                                                             "diagnose_verdict_s_after_first_preemption"))
    res["target_met"] = ok
    js = json.dumps(res, indent=1)
    print(js)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(js + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
