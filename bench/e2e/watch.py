"""Poll a fragscope agent (and the vLLM server it watches) during one load phase; check the outcome.

Used by bench/e2e_vllm_cpu.sh. Every ``--every`` seconds for ``--duration`` seconds it reads the agent's
``/api/v1/findings`` and ``/metrics`` and the engine's own ``/metrics`` (ground truth: preemptions,
KV usage, running/waiting), and prints one line. At the end it prints the agent's last findings with
their evidence, the agent's CPU and RSS over the phase (from /proc/PID), writes everything to
``--out`` (JSON), and checks the expectation:

  --expect none                 no finding at any poll (the agent stays quiet)
  --expect kv-cache-pressure    the finding is active at the end of the phase

Exit status: 0 expectation met, 1 not met, 2 the agent could not be read at all.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request

CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def prom(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named metric over its label sets (one engine here)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in names:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                pass
    return out


def active_diagnoses(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.startswith("fragscope_diagnosis_active{"):
            m = _LINE.match(line)
            if m and float(m.group(3)) > 0:
                out.append(m.group(2))
    return out


def proc(pid: int) -> tuple[float, int] | None:
    """(CPU seconds user+system, RSS bytes) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as fh:
            rss = int(fh.read().split()[1]) * PAGE
        return (int(f[11]) + int(f[12])) / CLK, rss
    except (OSError, IndexError, ValueError):
        return None


def fmt_ev(e: dict) -> str:
    def n(x):
        return "-" if x is None else (f"{x:.3g}" if isinstance(x, (int, float)) else str(x))
    s = f"{e['signal']}: observed {n(e.get('observed'))}"
    if e.get("baseline") is not None:
        s += f", baseline {n(e['baseline'])}"
    if e.get("threshold") is not None:
        s += f", threshold {n(e['threshold'])}"
    s += f" {e.get('unit', '')}".rstrip()
    if e.get("note"):
        s += f" ({e['note']})"
    return s + ("" if e.get("agrees", True) else "  [against]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True, help="agent base URL, e.g. http://127.0.0.1:9400")
    ap.add_argument("--engine-metrics", required=True, help="the engine's /metrics URL (ground truth)")
    ap.add_argument("--agent-pid", type=int, default=None)
    ap.add_argument("--label", default="phase")
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--expect", required=True, help="none | a diagnosis id")
    ap.add_argument("--require-judged", default=None, metavar="ID",
                    help="with --expect none: ID must have been judged (not inconclusive) at some poll, "
                         "or quiet means nothing")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    t0 = time.time()
    p0 = proc(a.agent_pid) if a.agent_pid else None
    rss_max = p0[1] if p0 else None
    polls = []
    seen: dict[str, dict] = {}
    last = None
    read_ok = 0
    judged: list[float] = []
    deadline = time.monotonic() + a.duration
    while True:
        now = time.time()
        row: dict = {"t": round(now - t0, 1)}
        try:
            v = prom(get(a.engine_metrics).decode("utf-8", "replace"),
                     ("vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                      "vllm:num_requests_waiting"))
            row["engine"] = {"preemptions_total": v.get("vllm:num_preemptions_total"),
                             "kv_usage": v.get("vllm:kv_cache_usage_perc"),
                             "running": v.get("vllm:num_requests_running"),
                             "waiting": v.get("vllm:num_requests_waiting")}
        except OSError as e:
            row["engine_error"] = str(e)[:120]
        try:
            rep = json.loads(get(a.agent + "/api/v1/findings"))
            met = get(a.agent + "/metrics").decode("utf-8", "replace")
            read_ok += 1
            last = rep
            ids = [f"{f['id']}({f['severity']},{f['confidence']:.2f})" for f in rep.get("findings", [])]
            row["findings"] = ids
            row["status"] = rep.get("status")
            row["exported_active"] = active_diagnoses(met)
            row["inconclusive"] = sorted(i["id"] for i in rep.get("inconclusive", []))
            if rep.get("status") == "ok" and a.require_judged and a.require_judged not in row["inconclusive"]:
                judged.append(row["t"])
            for f in rep.get("findings", []):
                s = seen.setdefault(f["id"], {"first_seen_t": row["t"], "polls": 0, "severities": []})
                s["polls"] += 1
                s["last_seen_t"] = row["t"]
                if f["severity"] not in s["severities"]:
                    s["severities"].append(f["severity"])
        except (OSError, ValueError) as e:
            row["agent_error"] = str(e)[:120]
        if a.agent_pid:
            p = proc(a.agent_pid)
            if p:
                rss_max = max(rss_max or 0, p[1])
                row["agent_rss_mb"] = round(p[1] / 1e6, 1)
        polls.append(row)
        e = row.get("engine", {})
        print(f"  [{a.label} +{row['t']:5.0f}s] engine: preemptions={e.get('preemptions_total')} "
              f"kv={e.get('kv_usage') if e.get('kv_usage') is None else round(e['kv_usage'], 2)} "
              f"running={e.get('running')} waiting={e.get('waiting')} | agent: "
              f"{row.get('findings', row.get('agent_error'))} exported={row.get('exported_active', [])}"
              f"{' (judging)' if judged and judged[-1] == row['t'] else ''}",
              flush=True)
        if time.monotonic() + a.every > deadline:
            break
        time.sleep(a.every)

    p1 = proc(a.agent_pid) if a.agent_pid else None
    wall = time.time() - t0
    agent_res = None
    if p0 and p1:
        agent_res = {"cpu_seconds": round(p1[0] - p0[0], 2), "wall_seconds": round(wall, 1),
                     "cpu_percent_of_one_core": round(100 * (p1[0] - p0[0]) / wall, 2) if wall else None,
                     "rss_mb_end": round(p1[1] / 1e6, 1), "rss_mb_max": round(rss_max / 1e6, 1)}
    print(f"== {a.label}: what the agent flagged at the end ({time.strftime('%H:%M:%S')}) ==")
    if last is None:
        print("  agent never answered")
    elif not last.get("findings"):
        print(f"  no findings (status {last.get('status')}); inconclusive: "
              f"{sorted(i['id'] for i in last.get('inconclusive', []))}")
    for f in (last or {}).get("findings", []):
        print(f"  {f['id']} [{f['severity']}, confidence {f['confidence']:.2f}] {f['summary']}")
        for ev in f.get("evidence", []):
            print(f"     - {fmt_ev(ev)}")
        if f.get("missing"):
            print(f"     missing: {', '.join(f['missing'])}")
    print(f"  seen during the phase: {json.dumps(seen) if seen else 'nothing'}")
    if agent_res:
        print(f"  agent process: {agent_res}")

    if read_ok == 0:
        ok, code = False, 2
    elif a.expect == "none":
        ok = not seen
        if a.require_judged:
            print(f"  {a.require_judged} judged (not inconclusive) at {len(judged)} of {len(polls)} polls"
                  + (f", from +{judged[0]:.0f} s" if judged else ": quiet means nothing"))
            ok = ok and bool(judged)
        code = 0 if ok else 1
    else:
        ok = any(f["id"] == a.expect for f in (last or {}).get("findings", []))
        code = 0 if ok else 1
    print(f"  expectation '{a.expect}': {'MET' if ok else 'NOT MET'}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"label": a.label, "expect": a.expect, "met": ok, "polls": polls, "seen": seen, "judged_at": judged,
                       "last_report": last, "agent_process": agent_res}, fh, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
