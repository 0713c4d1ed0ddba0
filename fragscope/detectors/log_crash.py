"""The engine dying, as its log shows it: a collective (NCCL) that timed out, the API server's EngineDeadError, a
worker that exited. Pure: events in, a summary dict and findings out. docs/logs.md#findings.

A careful reader of such a log says three things: the server is down (every request in flight failed and new
ones fail until a restart); why, where the log says it (PyTorch's NCCL watchdog fired after a collective waited
past its timeout; an out-of-memory error, which has its own finding); and, for a collective timeout, whether the
process group ever worked: the watchdog prints the collective's sequence number, and one of the first few means
the ranks never exchanged data (set-up: peer-to-peer, shared memory, the network), while a large one means the
group ran and one rank stopped mid-run (the rank whose watchdog fired is the one left waiting, not the cause).
"""
from __future__ import annotations

import signal
import time
from typing import Sequence

from .. import ids
from ..collectors.enginelog.events import LogEvent
from ..model import Evidence, Finding, Severity

# A collective this early in the process group's life (torch.distributed numbers each group's collectives from 1;
# vLLM's start-up runs a handful: the warm-up all-reduce, the memory profile's, CUDA-graph capture's) means the
# ranks never completed their first exchanges: a set-up problem, not a rank that stalled mid-run.
EARLY_SEQ = 10
HOST_FIELDS = ("node", "node_used_bytes", "node_total_bytes", "node_used_ratio", "threshold_ratio", "workers_killed",
               "task_name", "task_pid", "task_used_bytes")
GIB = 1024.0 ** 3


def _hms(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts is not None else "an unknown time"


def _signal_name(code: int) -> str | None:
    """A negative exit code from Python's multiprocessing is the signal that ended the process."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def crash_summary(events: Sequence[LogEvent]) -> dict | None:
    """The JSON contract of docs/logs.md ``crash``: None when the log shows no death."""
    timeouts: dict[tuple, dict] = {}
    if not any(e.kind in ("collective_timeout", "engine_dead", "host_oom_kill") for e in events):
        return None
    for e in events:
        if e.kind != "collective_timeout":
            continue
        f = e.fields
        key = (f.get("rank"), f.get("seq"), f.get("op"))
        if key not in timeouts:  # the watchdog and its thread's exit print the same timeout: one
            timeouts[key] = {"rank": f.get("rank"), "seq": f.get("seq"), "op": f.get("op"),
                             "timeout_seconds": f.get("timeout_seconds"), "ran_seconds": f.get("ran_seconds"),
                             "time": e.ts, "line": e.line_no}
    dead = [e for e in events if e.kind == "engine_dead"]
    workers = [{"pid": e.fields.get("worker_pid"), "exit_code": e.fields.get("exit_code"),
                "signal": _signal_name(e.fields.get("exit_code", 0)), "line": e.line_no}
               for e in dead if e.fields.get("what") == "worker-died"]
    engine_dead = [e for e in dead if e.fields.get("what") in ("engine-dead", "background-task-failed",
                                                               "engine-core-error", "start-failed")]
    aborted = [e for e in dead if e.fields.get("what") == "watchdog-abort"]
    first = min((e for e in events if e.kind in ("collective_timeout", "engine_dead", "host_oom_kill")),
                key=lambda e: e.line_no)
    host = [e for e in events if e.kind == "host_oom_kill"]
    # the cause is the first error the log shows: a host out of memory (a worker killed by Ray's memory monitor), a
    # GPU out-of-memory error, a collective that timed out (the ranks left waiting when another one died)
    firsts = [(e.line_no, c) for c, evs in (("host-oom", host), ("oom", [e for e in events if e.kind == "oom"]),
                                             ("startup-memory", [e for e in events if e.kind in
                                                                 ("startup_memory_shortfall", "kv_insufficient")]),
                                             ("collective-timeout", [e for e in events
                                                                     if e.kind == "collective_timeout"]))
              for e in evs[:1]]
    cause = min(firsts)[1] if firsts else "unknown"
    if cause == "unknown" and not engine_dead and not workers:
        return None  # only PyTorch's "taking the entire process down" without its timeout line: nothing to say
    return {"cause": cause, "first_line": first.line_no, "time": first.ts,
            "timestamped": bool(first.fields.get("timestamped", True)),
            "collective_timeouts": sorted(timeouts.values(), key=lambda t: t["line"]),
            "engine_dead_lines": [e.line_no for e in engine_dead][:16], "engine_dead_count": len(engine_dead),
            "watchdog_aborted": bool(aborted), "workers_died": workers[:16],
            "at_start": any(e.fields.get("what") == "start-failed" for e in dead),
            "host_oom_kills": [{**{k: e.fields.get(k) for k in HOST_FIELDS}, "line": e.line_no} for e in host][:16]}


def crash_findings(crash: dict | None, job_kind: str) -> list[Finding]:
    """``engine-died``: one finding when the log shows the engine dying, unless an out-of-memory error explains it
    (the OOM's own finding is the story then, and the summary's ``crash.cause`` says ``oom``)."""
    if crash is None or crash["cause"] in ("oom", "startup-memory"):
        return []  # the OOM's finding, or the start-up's memory check (kv-capacity-gap, startup-oom), is the story
    if crash["cause"] == "host-oom":
        return [_host_oom_finding(crash, job_kind)]
    at = crash["time"]
    win = (at, at) if at is not None else None
    when = (f"at {_hms(at)}" if crash["timestamped"] or at is None else
            f"after {_hms(at)} (the last timestamp before line {crash['first_line']}, which has none)")
    ev: list[Evidence] = []
    missing: list[str] = []
    ctx: dict = {"cause": crash["cause"], "job_kind": job_kind}
    died = []
    for w in crash["workers_died"]:
        sig = f" (signal {w['signal']})" if w["signal"] else ""
        died.append(f"worker pid {w['pid']} exited with code {w['exit_code']}{sig}")
    if crash["cause"] == "collective-timeout":
        t0 = crash["collective_timeouts"][0]
        ranks = sorted({t["rank"] for t in crash["collective_timeouts"] if t["rank"] is not None})
        seq = t0["seq"]
        early = seq is not None and seq <= EARLY_SEQ
        ctx.update(early=early, seq=seq, op=t0["op"], ranks=ranks)
        waited = (f"waited {t0['ran_seconds']:,.1f} s" if t0["ran_seconds"] is not None else "waited")
        limit = f" (timeout {t0['timeout_seconds']:,.0f} s)" if t0["timeout_seconds"] is not None else ""
        who = f"rank {t0['rank']}" if t0["rank"] is not None else "a rank"
        if crash["watchdog_aborted"] or died:
            how = "PyTorch's NCCL watchdog took the process down"
        else:
            how = ("PyTorch's NCCL watchdog caught it (its default then aborts the process; the exit is not in these "
                   "lines)")
        summary = (f"The engine died {when}: {who} {waited} on collective #{seq} ({t0['op']}){limit} and {how} "
                   f"(line {t0['line']}). ")
        if early:
            summary += (f"Collective #{seq} is among the process group's first: the ranks never completed their first "
                        "exchanges, so the GPUs could not talk (peer-to-peer, shared memory or the network between "
                        "them), not a rank that slowed mid-run.")
        else:
            summary += (f"{seq - 1:,} collectives had completed before it: the group worked, then one rank stopped "
                        "(a crash, a hang, a GPU fault, an out-of-memory error on another rank); the rank whose "
                        "watchdog fired was left waiting and is not the cause.")
        if len(ranks) > 1:
            summary += f" Ranks that timed out: {', '.join(map(str, ranks))}."
        if died:
            summary += " Also: " + "; ".join(died) + "."
        ev.append(Evidence("log_collective_waited_seconds", t0["ran_seconds"], threshold=t0["timeout_seconds"],
                           unit="seconds", window=win, note=f"line {t0['line']}, {t0['op']} #{seq}"))
        ev.append(Evidence("log_collective_seq", float(seq) if seq is not None else None, threshold=float(EARLY_SEQ),
                           note="the collective's number in its process group: at or under the threshold, the group "
                                "never worked"))
        missing.append("the other ranks' logs (the first error)")
        if not early:
            missing.append("GPU errors over the same minutes (Xid, ECC: nvidia-smi -q, DCGM)")
        conf = 0.85
    else:
        n = crash["engine_dead_count"]
        what = []
        if n:
            what.append(f"the engine reports its own death (EngineDeadError, an engine-core exception or a failed "
                        f"start, {n} line(s), first at line {crash['engine_dead_lines'][0]})")
        what += died
        verb = "failed to start" if crash["at_start"] else "died"
        summary = (f"The engine {verb} {when}: " + "; ".join(what) + ". What killed it is not among the lines "
                   "fragscope reads here (no out-of-memory error, no collective timeout): the engine core (or worker) "
                   "prints it before this, as its traceback's last line.")
        ev.append(Evidence("log_engine_dead_lines", float(n), unit="lines", window=win,
                           note=f"first at line {crash['first_line']}"))
        for w in crash["workers_died"][:1]:
            ev.append(Evidence("log_worker_exit_code", float(w["exit_code"]), window=win,
                               note=f"line {w['line']}" + (f", signal {w['signal']}" if w["signal"] else "")))
        missing.append("the engine core's own traceback (the lines before the first EngineDeadError)")
        conf = 0.6
    return [Finding(ids.ENGINE_DIED, Severity.CRITICAL, conf, summary, onset=at, evidence=ev, missing=missing,
                    subject={}, context=ctx, basis="log")]


def _host_oom_finding(crash: dict, job_kind: str) -> Finding:
    """Ray's memory monitor killed a worker: the node's (host) memory ran out, not the GPU's."""
    kills = crash["host_oom_kills"]
    k = next((x for x in kills if x["node_used_ratio"] is not None), kills[0])
    at = crash["time"]
    win = (at, at) if at is not None else None
    ctx = {"ray_kill": True, "job_kind": job_kind, "threshold_ratio": k["threshold_ratio"],
           "task_used_bytes": k["task_used_bytes"], "node_total_bytes": k["node_total_bytes"]}
    ev: list[Evidence] = []
    if k["node_used_ratio"] is not None:
        who = k["task_name"] or "a worker"
        held = f", holding {k['task_used_bytes'] / GIB:.2f} GiB" if k["task_used_bytes"] is not None else ""
        pid = f" (pid {k['task_pid']}{held})" if k["task_pid"] is not None else (f" ({held[2:]})" if held else "")
        summary = (f"Ray's memory monitor killed {who}{pid} when the node's memory reached "
                   f"{k['node_used_bytes'] / GIB:.2f} of {k['node_total_bytes'] / GIB:.2f} GiB "
                   f"({k['node_used_ratio'] * 100:.1f} %, over Ray's threshold {k['threshold_ratio']:g}) (line "
                   f"{k['line']}): host memory ran out, not the GPU's; the worker died without a CUDA error.")
        ev.append(Evidence("log_node_memory_used_ratio", k["node_used_ratio"], threshold=k["threshold_ratio"],
                           unit="ratio", window=win,
                           note=f"node {k['node']}, line {k['line']}; Ray's figures: {k['node_used_ratio']:g} over "
                                f"{k['threshold_ratio']:g}"))
        if k["task_used_bytes"] is not None:
            ev.append(Evidence("log_killed_worker_memory_bytes", k["task_used_bytes"], unit="bytes",
                               note=f"{who}: its share of the node's "
                                    f"{k['node_total_bytes'] / GIB:.2f} GiB"))
        conf = 0.85
        missing = []
    else:
        n = k["workers_killed"]
        summary = (f"Ray killed {n if n else 'one or more'} worker(s) for memory pressure on the node "
                   f"(line {k['line']}): host memory ran out, not the GPU's; these lines do not give the node's figures.")
        ev.append(Evidence("log_workers_killed", float(n) if n else None, window=win, note=f"line {k['line']}"))
        conf = 0.7
        missing = ["the node's memory at the kill (ray logs raylet.out)"]
    return Finding(ids.HOST_MEMORY_PRESSURE, Severity.CRITICAL, conf, summary, onset=at, evidence=ev,
                   missing=missing, subject={}, context=ctx, basis="log")
