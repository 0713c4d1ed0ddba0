"""engine-stalled: requests running or waiting, yet no token generated, no prompt processed and no request
finished for a stated time, while the server still answers its metrics (the process is alive).

Mechanism: an engine step takes milliseconds (decode) to a few seconds (a long prefill chunk); the
engine's counters move with every step that has work. When they stop while requests are in flight, the
engine loop is blocked: a collective that never completes (an NCCL deadlock or a lost rank: the GPUs
spin in the NCCL kernel at 100 % utilization), or a host-side hang (a stuck Python thread, a stopped or
blocked process: the GPUs idle at 0 %). The readiness probe still passes (the API server answers), so
this is the incident a pod's health checks miss. Told apart from saturation: a saturated engine
generates tokens at its capacity; a stalled one generates none.

A stopped engine process is a stall by itself, whatever the request gauges say: in vLLM V1 the scheduler's
gauges (running, waiting) are published by the engine core process, so a core stopped between requests
(SIGSTOP, a debugger) freezes them at 0 in flight while the requests sent since queue, unseen, in the API
server. The process collector reads each engine process's state (/proc/PID/stat, proc(5)): T (stopped
by a signal) or t (stopped by a debugger) in every sample over ``stopped_s`` fires, critical, naming the
process; D (uninterruptible sleep, a disk wait) does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import npstats
from .. import ids
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, PRESENT, RATE_RANGE, AlertRule, TriageCheck, sig as psig
from ..signals import any_of
from ..units import finite_or_none as _f
from . import common, stats
from .frame import Frame

ID = ids.ENGINE_STALLED
REQUIRES = ("requests_running", "generation_tokens_total")
CORROBORATES = ("requests_waiting", "prompt_tokens_total", "request_success_total", "gpu_utilization_ratio",
                "process_cpu_seconds_total", "process_stopped_processes")
STOPPED = "process_stopped_processes"
PROGRESS = ("generation_tokens_total", "prompt_tokens_total", "request_success_total")


@dataclass(frozen=True)
class Config:
    # A decode step is 10-100 ms and a chunked-prefill step at most a few seconds (vLLM's default chunk is
    # 2,048-8,192 tokens: a 100k-token prompt is ~13 steps, ~10 s on an H100); 15 s without one token while
    # requests are in flight is no slow step. Short enough that the agent says so within half a minute of
    # the stall (its watch pass looks every few seconds; a real vLLM stopped under load: docs/e2e.md).
    stall_s: float = 15.0
    critical_s: float = 60.0  # a minute: every request in flight has missed any reasonable deadline
    util_spin: float = 0.90  # GPUs pegged with no progress: a collective that never completes
    util_idle: float = 0.10  # GPUs idle with no progress: the host side hangs
    cpu_idle: float = 0.02  # the engine processes used < 2 % of a core: stopped or blocked, not spinning
    flat_scrapes: int = 2  # scrapes of the token counter since it last moved
    # An engine process stopped (state T or t) in every sample over at least this long, two samples at least:
    # the tools that stop a live process to read it let it go within a second (py-spy dump suspends it for
    # the milliseconds its stacks take to read; gdb's `gcore` for the seconds a core dump takes to write, a
    # few GB/s of memory), so a stop seen in two samples 5 s apart was not a profiler's. Shorter than
    # stall_s: a stop is named before the token counter could say anything (and it says nothing when the
    # engine was idle at the stop, its gauges frozen at 0 in flight).
    stopped_s: float = 5.0
    stopped_samples: int = 2


def _stopped(f: Frame, cfg: Config) -> Finding | None:
    """The engine processes stopped (T/t) in every sample of their newest ``stopped_s`` or more, the newest
    sample within a scrape interval of the present; None when none is (or the state is not collected)."""
    raw = f.process_raw.get(STOPPED)
    if not raw:
        return None
    now = max(f.end, f.last_seen.get(STOPPED, -math.inf))
    fresh = now - max(f.step, f.scrape_interval) * 1.5
    hits = []  # (stopped since, last sample, samples, pid, name)
    for pid, (name, ts, vs) in raw.items():
        if ts.size == 0 or ts[-1] < fresh or not vs[-1] >= 0.5:
            continue  # a process gone (no newer sample) or running now
        run = np.flatnonzero(~(vs >= 0.5))
        first = int(run[-1]) + 1 if run.size else 0
        n = ts.size - first
        since = float(ts[first])
        if n >= cfg.stopped_samples and float(ts[-1]) - since >= cfg.stopped_s:
            hits.append((since, float(ts[-1]), n, pid, name))
    if not hits:
        return None
    hits.sort()
    since = hits[0][0]
    stopped_s = now - since
    who = ", ".join(f"pid {pid}" + (f" ({name})" if name else "") for _, _, _, pid, name in hits)
    ev = [Evidence(STOPPED, float(len(hits)), None, 1.0, "processes", (s0, s1),
                   f"pid {pid}{f' ({name})' if name else ''} in state T or t in all {n} samples over "
                   f"{s1 - s0:.0f} s: stopped by a signal (SIGSTOP/SIGTSTP) or a debugger", True)
          for s0, s1, n, pid, name in hits]
    gauges = ""
    run_g = f.engine.get("requests_running")
    if run_g is not None and np.isfinite(run_g).any():
        r = float(run_g[np.flatnonzero(np.isfinite(run_g))[-1]])
        wait = f.engine.get("requests_waiting")
        w = float(wait[np.flatnonzero(np.isfinite(wait))[-1]]) if wait is not None and np.isfinite(wait).any() \
            else math.nan
        ev.append(Evidence("requests_running", r, None, None, "requests", (since, now),
                           "as the engine last published it: a stopped engine core publishes nothing new", True))
        gauges = (f"; the engine's gauges read {r:.0f} running" + (f", {w:.0f} waiting" if math.isfinite(w) else "")
                  + ", frozen while it is stopped (requests sent since wait unseen)")
    summary = (f"Engine process {who} stopped (state T: SIGSTOP/SIGTSTP or a debugger) for at least "
               f"{stopped_s:.0f} s (since {common.fmt_time(since)}): it serves nothing until resumed" + gauges + ".")
    ctx = {"stalled_seconds": stopped_s, "kind": "stopped", "since": since,
           "pids": [pid for _, _, _, pid, _ in hits]}
    return Finding(ID, Severity.CRITICAL, stats.confidence(3, base=0.45), summary, since, ev,
                   [], {}, context=ctx)


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    stopped = _stopped(f, cfg)
    if stopped is not None:
        return [stopped]  # whatever the request gauges say: a stopped core freezes them
    if not f.has_engine("requests_running"):
        return Inconclusive(ID, [any_of("requests_running")], "requests in flight not exported")
    cums = {s: f.engine_cum[s] for s in PROGRESS if s in f.engine_cum}
    if "generation_tokens_total" not in cums:
        return Inconclusive(ID, [any_of("generation_tokens_total")], "generated tokens not exported")
    run = f.engine["requests_running"]
    wait = f.engine.get("requests_waiting")
    inflight = np.nan_to_num(run, nan=0.0) + (np.nan_to_num(wait, nan=0.0) if wait is not None else 0.0)
    ok = np.isfinite(run)
    if not ok.any() or not ok[-1]:
        return []  # no current scrape: the source is down, which the agent reports apart
    # raw sample times, not the grid's (the grid may end just before the newest sample, and carries a value
    # up to three steps past its last sample: both would read as frozen counters)
    now = max([f.end] + [f.last_seen[s] for s in ("requests_running", *cums) if math.isfinite(f.last_seen.get(s, math.nan))])
    # the engine must still answer now: the gauge and the token counter sampled within the last scrape interval
    fresh = now - max(f.step, f.scrape_interval) * 1.5
    if not all(f.last_seen.get(s, -math.inf) >= fresh for s in ("requests_running", "generation_tokens_total")):
        return []
    moved = [f.last_change[s] for s in cums if math.isfinite(f.last_change.get(s, math.nan))]
    last_progress = max(moved) if moved else None
    gen = cums["generation_tokens_total"]
    if int(np.isfinite(gen).sum()) < 2:
        return []  # one scrape: no progress can be measured
    first_seen = float(f.t[np.flatnonzero(np.isfinite(gen))[0]])
    since = last_progress if last_progress is not None else first_seen
    stalled_s = now - since
    # two scrapes after the last move, not one: a single repeated value can be a duplicated or cached scrape
    if stalled_s < cfg.stall_s or f.flat_samples.get("generation_tokens_total", 0) < cfg.flat_scrapes:
        return []
    during = (f.t > since) & ok
    if not during.any() or not np.all(inflight[during] >= 1):
        return []  # nothing in flight for part of it: an idle engine makes no tokens
    span = (since, now)
    n_run = npstats.nanmedian(run[during])
    n_wait = npstats.nanmedian(wait[during]) if wait is not None and np.isfinite(wait[during]).any() else math.nan
    ev = [Evidence("generation_tokens_total", 0.0, None, None, "tokens", span,
                   f"no token for {stalled_s:.0f} s" + ("" if last_progress is not None else " (the whole window)"),
                   True),
          Evidence("requests_running", n_run, None, 1.0, "requests", span, "in flight throughout", True)]
    if math.isfinite(n_wait):
        ev.append(Evidence("requests_waiting", n_wait, None, None, "requests", span, "", n_wait >= 1))
    kind = "unknown"
    utils = {}
    for g in f.gpus():
        x = f.gpu[g].get("gpu_utilization_ratio")
        if x is not None:
            u = stats.nanmedian(x[(f.t > since)])
            if math.isfinite(u):
                utils[g] = u
    if utils:
        u = float(npstats.median(list(utils.values())))
        if u >= cfg.util_spin:
            kind = "collective"
        elif u <= cfg.util_idle:
            kind = "host"
        ev.append(Evidence("gpu_utilization_ratio", u, None, None, "ratio", span,
                           {"collective": "GPUs pegged with no progress: a collective that never completes",
                            "host": "GPUs idle: the host side is stuck"}.get(kind, ""), True))
    cpu_note = ""
    cpu = f.engine_cum.get("process_cpu_seconds_total")
    if cpu is not None:
        m = (f.t >= since) & np.isfinite(cpu)
        if m.sum() >= 2 and f.t[m][-1] > f.t[m][0]:
            rate = float((cpu[m][-1] - cpu[m][0]) / (f.t[m][-1] - f.t[m][0]))
            idle = rate < cfg.cpu_idle
            cpu_note = (f"the engine processes used {rate * 100:.0f} % of a core"
                        + (": stopped or blocked" if idle else ": busy on the host"))
            ev.append(Evidence("process_cpu_seconds_per_second", rate, None, cfg.cpu_idle, "cores", span, cpu_note,
                               True))
            if kind == "unknown" and idle:
                kind = "host"
    sev = Severity.CRITICAL if stalled_s >= cfg.critical_s else Severity.WARNING
    agree = 2 + (kind != "unknown") + (math.isfinite(n_wait) and n_wait >= 1)
    conf = stats.confidence(agree, base=0.45)
    at_least = "" if last_progress is not None else "at least "
    summary = (f"No token generated and no request finished for {at_least}{stalled_s:.0f} s (since "
               f"{common.fmt_time(since)}) while {n_run:.0f} requests run"
               + (f" and {n_wait:.0f} wait" if math.isfinite(n_wait) and n_wait >= 1 else "")
               + "; the server still answers its metrics")
    if kind == "collective":
        summary += f"; GPU utilization {max(utils.values()) * 100:.0f} %: a collective (NCCL) that never completes"
    elif kind == "host":
        summary += "; " + ("GPUs idle" if utils else cpu_note) + ": a host-side hang"
    summary += "."
    missing = [] if utils else ["gpu utilization (tells an NCCL deadlock from a host-side hang)"]
    ctx = {"stalled_seconds": stalled_s, "kind": kind, "since": since, "running": n_run}
    return [Finding(ID, sev, conf, summary, since, ev, missing, {}, context=ctx)]


# --- PromQL: the stall rule, for the alert ---------------------------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """Requests in flight and no token generated over twice critical_s (a range needs two samples at a
    one-minute scrape), the server still answering /metrics."""
    window = 2 * cfg.critical_s
    running = f"sum by ({K}) {psig('requests_running', '{}', None)}"
    tokens = f"sum by ({K}) {psig('generation_tokens_total', 'increase({})', f'{window:.0f}s')}"
    expr = f"({running}) >= 1 and on ({K}) ({tokens}) == 0"
    return AlertRule(
        "FragscopeEngineStalled", ID, expr, "1m", "critical",
        "engine stalled (requests running, no tokens)",
        f"Requests are running yet no token was generated for {window / 60:g} minutes: capture stacks (py-spy dump) "
        "and restart the engine.",
        "Requests in flight, no token generated, the server still answering /metrics. Fast: the readiness "
        "probe does not catch it.",
        {"critical_s": cfg.critical_s}, shown={"critical_s": f"[{window:.0f}s]"})


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """Requests running or waiting and no token generated over twice critical_s (value: requests in flight).

    The alert's range (2 x critical_s = 2 min): a counter's increase needs two samples, and a one-minute
    scrape gives two only in two minutes; a target whose counter has fewer samples in it never trips."""
    window = f"{2 * cfg.critical_s:.0f}s"
    running = f"sum by ({K}) {psig('requests_running', 'min_over_time({})', present, m)}"
    waiting = f"sum by ({K}) {psig('requests_waiting', 'min_over_time({})', present, m)}"
    tokens = f"sum by ({K}) {psig('generation_tokens_total', 'increase({})', window, m)}"
    inflight = f"(({running}) + on ({K}) ({waiting}) or ({running}))"
    return f"({inflight} >= 1) and on ({K}) (({tokens}) == 0)"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("requests_in_flight", "max_over_time", triage_check, "requests_in_flight")


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    kind = ctx.get("kind")
    s = _f(ctx.get("stalled_seconds")) or 0
    if kind == "stopped":
        pids = " ".join(str(p) for p in ctx.get("pids") or ()) or "<pid>"
        return [f"Find who stopped it (stopped for {s:.0f} s): ps -o pid,ppid,stat,lstart,cmd -p {pids} (stat T: a "
                "signal, t: a debugger); grep TracerPid /proc/<pid>/status names an attached debugger (detach "
                "it); a SIGSTOP or SIGTSTP came from a person, a job-control shell (Ctrl-Z) or a tool.",
                f"Resume it: kill -CONT {pids}. Requests queued while it was stopped are served, or have timed out.",
                "If it is slow or stuck once resumed: py-spy dump --pid <pid> for its stacks (after resuming: a "
                "stopped process shows only where it was stopped)."]
    acts = [f"Capture the stacks before restarting (the engine has made no progress for {s:.0f} s): "
            "py-spy dump --pid <engine core pid> (and each worker's), or send SIGUSR1 where faulthandler is "
            "registered."]
    if kind == "collective":
        acts.append("The GPUs spin with no progress: an NCCL collective waits for a rank that never joins. Restart "
                    "with NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 / TORCH_NCCL_TRACE_BUFFER_SIZE set "
                    "so the next hang names the rank.")
    elif kind == "host":
        acts.append("The GPUs idle: the host side is stuck (a blocked or stopped process, a deadlocked thread). "
                    "Check the processes' state (ps -o stat: T stopped, D blocked on I/O) before restarting.")
    return acts


PLAYBOOK = Playbook(
    ID, "Engine stalled: requests in flight, no progress",
    "Requests are running or waiting, yet the engine produces no token and finishes no request while its "
    "API server still answers: the engine loop is blocked (an NCCL collective that never completes, or a "
    "host-side hang). Readiness probes pass; every request in flight times out.",
    ["Capture stacks first (py-spy dump --pid PID for the engine core and each worker), then restart the "
     "engine (delete the pod): a hung collective does not recover by itself.",
     "Take the replica out of the load balancer: it accepts requests it will not serve."],
    [Action("Make the next hang diagnosable and bounded: NCCL_DEBUG=INFO (WARN in steady state), "
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a collective timeout, so a lost rank fails the process "
            "instead of hanging it.",
            ["a multi-GPU (tensor- or pipeline-parallel) engine"],
            ["NCCL_DEBUG=INFO logs every communicator: keep it off in steady state on busy nodes"]),
     Action("Add a liveness check on progress, not on the HTTP port: fail it when requests run and "
            "generation_tokens_total has not moved for a minute (this alert, or a probe script).",
            ["the engine exports its counters"],
            ["very long single prefills (hundreds of thousands of tokens) on slow GPUs can exceed a short "
             "threshold: size it above the longest prefill"])],
    ["generation_tokens_total rises again and requests finish after the restart",
     "no new engine-stalled finding over the next hour"],
    ["PyTorch docs: torch.distributed environment variables (TORCH_NCCL_ASYNC_ERROR_HANDLING, "
     "TORCH_NCCL_TRACE_BUFFER_SIZE)", "NCCL docs: environment variables (NCCL_DEBUG)",
     "py-spy: py-spy dump --pid"])


RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
