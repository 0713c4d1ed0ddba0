"""The agent's threads: one per collector, the detectors, captures, housekeeping.

Each is a function over the :class:`~fragscope.agent.daemon.Agent` that runs until its stop event.
Isolation: each collector runs in its own thread (a hung HTTP or NVML call stalls only that
collector; housekeeping's watchdog marks it down once it overruns its timeout), with exponential
backoff after failures. All loops wake on the agent's one time grid (``Agent.on_grid``).
Logging is once per state change, never per tick.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import time
from typing import Any

from .. import units
from ..model import CollectResult, SeriesKey
from . import memory
from .health import down_collectors, explain_down
from .state import CollectorHealth
from .store import is_signal

log = logging.getLogger("fragscope.agent")

HOUSEKEEPING_S = 2.0  # watchdog resolution; every wake-up of an idle thread costs CPU


def one_line(e: BaseException | str) -> str:
    """An error as one line, always naming its type (the agent's logs and collector states)."""
    return units.one_line(f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else e, 300)


def mark_down(h: CollectorHealth, err: str, now: float) -> None:
    """Record a collector as down (``down_since`` is kept from its first failure in a row)."""
    if h.up is not False or h.down_since is None:
        h.down_since = now
    h.up = False
    h.errors_total += 1
    h.last_error = err


# ---------------------------------------------------------------------------------------------
def collector_loop(agent: Any, h: CollectorHealth, obj: Any) -> None:
    interval = h.interval
    next_due = agent._base
    state = agent.state
    stop = agent._stop
    while not stop.is_set():
        delay = next_due - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        t0 = time.monotonic()
        c0 = time.thread_time()
        now = time.time()
        agent.clock.check(now, t0)
        h.in_flight_since = t0
        try:
            res = obj.collect(now)
            if not isinstance(res, CollectResult):
                raise TypeError(f"collect() returned {type(res).__name__}, not CollectResult")
            err = None if res.up else (res.error or "down")
        except Exception as e:  # noqa: BLE001 - the protocol says never raises; be safe anyway
            res = CollectResult(up=False, error=one_line(e))
            err = res.error
        dt = time.monotonic() - t0
        h.in_flight_since = None
        h.runs_total += 1
        h.last_duration = dt
        was = h.up
        if err is None:
            h.up = True
            h.last_error = None
            h.last_success = time.time()
            h.down_since = None
            h.backoff = 0.0
            if was is False:
                log.info("collector %s: up again", h.name)
        else:
            prev_err = h.last_error
            mark_down(h, err, now)
            h.backoff = min(agent.cfg.max_backoff, max(interval, h.backoff * 2 or interval))
            if was is not False or (prev_err or "")[:60] != err[:60]:
                log.warning("collector %s: down (%s); retrying with backoff up to %gs", h.name, err,
                            agent.cfg.max_backoff)
        h.budget.note(obj)  # what the collector left out itself (lines, files, devices past its caps)
        if res.samples:  # the memory budget: series and labels past the limits dropped, counted
            try:
                res.samples = h.budget.admit(res.samples)
            except Exception as e:  # noqa: BLE001 - a bad sample must not stop the collector
                log.error("collector %s: samples not admitted (%s)", h.name, one_line(e))
                res.samples = []
        # latest values for the exporter: on failure keep nothing stale (absent, not old values)
        h.latest = res.samples
        h.missing = res.missing
        if res.samples:
            sig = [s for s in res.samples if is_signal(s.name)]
            state.ring.add(sig)
            if state.store is not None:
                state.store.append(res.samples if state.store.keep_all else sig)
        state.bump()
        h.cpu_seconds += time.thread_time() - c0
        wait = interval if err is None else h.backoff
        mono = time.monotonic()
        # overran: skip missed ticks rather than bursting; stay on the agent's grid either way
        next_due = agent.on_grid(max(next_due + wait, mono + 0.2 * wait, mono), interval)


# ---------------------------------------------------------------------------------------------
def add_startup_findings(report: Any, sources: list) -> None:
    """A server that never came up exports no metrics: only the engine log the agent follows can say
    why (startup-oom, with the utilization that would have started). Added to the judging round's report
    with its playbook; nothing when no source follows a log or the last start-up went through."""
    from ..sizing.detect import startup_findings

    found = startup_findings(sources)
    if found:
        from ..model import rank_findings
        from ..playbooks import attach_playbooks

        report.findings = rank_findings(list(report.findings) + found)
        attach_playbooks(report)


def detect_once(agent: Any) -> None:
    st = agent.state
    now = time.time()
    t0 = time.monotonic()
    c0 = time.thread_time()
    try:
        w = st.ring.window_at(now, source="fragscope agent (live)")
        if agent._detect is not None:
            report = agent._detect(w)
        else:
            from ..pipeline import diagnose

            report = diagnose(w)
        add_startup_findings(report, [obj for _, obj in agent._collectors])
        add_recent_findings(report, st.ring, now)
        # a source that is down explains what the detectors could not judge (agent/health.py)
        explain_down(report, down_collectors(st.collectors.values()), now)
        if agent._capture is not None:
            with agent._att_lock:
                for f in report.findings:
                    f.attachments.extend(agent._atts.get(finding_key(f), ()))
            if report.findings:
                agent._capture_q[:] = [(list(report.findings), now)]  # latest only
                agent._capture_wake.set()
        prev = {(f.id, f.severity.value) for f in st.report.findings} if st.report else set()
        cur = {(f.id, f.severity.value) for f in report.findings}
        for fid, sev in sorted(cur - prev):
            log.warning("diagnosis %s (%s) active", fid, sev)
        for fid, sev in sorted(prev - cur):
            log.info("diagnosis %s (%s) cleared", fid, sev)
        st.report, st.report_at = report, now
        st.detector.last_error = None
        if st.store is not None:
            st.store.put_meta("last_report", json.dumps({"at": now, "report": report.to_dict()},
                                                        default=json_default))
    except Exception as e:  # noqa: BLE001 - a detector bug must not kill the agent
        st.detector.errors += 1
        if st.detector.last_error is None:
            log.error("detectors failed (%s); will retry", one_line(e))
        st.detector.last_error = one_line(e)
    st.detector.runs += 1
    st.detector.last_run = now
    st.detector.last_duration = time.monotonic() - t0
    st.detector.cpu_seconds += time.thread_time() - c0
    st.bump()


WATCH_SPAN_S = 120.0
# The last 20 s judged on their own, every scrape as it came (Ring.recent_window), as a fresh look at the
# engine would see the present: an agent that watched a calm stretch judges the last minute with the calm in
# it, and at the ring's 5 s steps a storm's first scrapes fall between grid points (a real storm: flagged
# 8.7 s after the first preemption by the agent that watched 4 calm minutes, 2.4 s by one started 10 s
# before it).
RECENT_SPAN_S = 20.0
# What the last 20 s are judged on: the signals of the pool's level rule (kv-cache-pressure: a storm starts
# within seconds; clocks and the allocator change over minutes and are the 2-minute look's). Only these
# series make the recent frame: its cost is per series (0.5 ms for these against 4.4 ms for a vLLM and DCGM
# page's 40 series on the 2-core VM).
RECENT_SIGNALS = ("kv_cache_usage_ratio", "preemptions_total", "requests_waiting", "requests_running")


@functools.lru_cache(maxsize=1)
def recent_names() -> frozenset[str]:
    """The raw metric names of RECENT_SIGNALS (signals.py: every engine's source of each)."""
    from ..signals import SIGNALS

    out: set[str] = set()
    for sid in RECENT_SIGNALS:
        for src in SIGNALS[sid].sources:
            out.update((src.metric, src.metric + "_total"))
    return frozenset(out)


def judge_recent(ring: Any, now: float) -> list:
    """Warning and critical findings of the ring's last RECENT_SPAN_S judged on their own by the level rules
    (made for any window down to one scrape: docs/diagnoses.md, level evidence), on RECENT_SIGNALS; the
    detectors that judge short windows themselves (a stall's 15 s, a throttled share) keep the watch pass's
    2 minutes."""
    from ..pipeline import judge_level

    names = recent_names()
    w = ring.recent_window(now, source="fragscope agent (recent)", span=RECENT_SPAN_S,
                           keep=lambda k: k.name in names)
    return [f for f in judge_level(w) if f.severity.rank >= 1]


def add_recent_findings(report: Any, ring: Any, now: float) -> None:
    """Add to a judging round's report what the last RECENT_SPAN_S show by themselves that the full window
    does not (a diagnosis it lacks, or at a higher severity), with its playbook: the present is judged on
    its own, so a warm agent is not slower than a cold one. What the full window reports stands otherwise."""
    try:
        recent = judge_recent(ring, now)
    except Exception as e:  # noqa: BLE001 - the full run's findings stand
        log.debug("recent window not judged (%s)", one_line(e))
        return
    have: dict[str, int] = {}
    for f in report.findings:
        have[f.id] = max(have.get(f.id, -1), f.severity.rank)
    add = [f for f in recent if f.severity.rank > have.get(f.id, -1)]
    if not add:
        return
    from ..model import rank_findings
    from ..playbooks import attach_playbooks

    ids = {f.id for f in add}
    report.findings = rank_findings([f for f in report.findings if f.id not in ids] + add)
    attach_playbooks(report)


@functools.lru_cache(maxsize=65536)
def watch_keeps(key: SeriesKey) -> bool:
    """Whether the watch pass reads a series: all but the finite ``le`` buckets of histograms. Buckets
    are 109 of the 161 series of a vLLM V1 pod and two thirds of the watch's cost; the present-state
    path reads histograms through ``_sum`` / ``_count`` (the ``+Inf`` bucket kept marks the family
    present), only trend detectors read quantiles. tests/test_agent_cost.py checks the findings are the
    same with and without them on every scenario kind."""
    if not key.name.endswith("_bucket"):
        return True
    try:
        return math.isinf(float(key.label("le") or "nan"))
    except ValueError:
        return True


def watch_once(agent: Any) -> bool:
    """A cheap look at the present: the last 2 minutes of the ring judged on level evidence alone
    (pipeline's short-window path, without its signal summary or playbooks). True when it shows a
    warning or critical finding that the last full run did not report: the caller then runs the
    detectors at once. When no sample reached the ring since the last look (every collector stalled),
    the last look's findings stand: nothing is rebuilt."""
    st = agent.state
    c0 = time.thread_time()
    try:
        ver = st.ring.version
        cached = getattr(agent, "_watch_seen", None)
        if cached is not None and cached[0] == ver:
            quick = cached[1]
            st.detector.watch_skipped += 1
        else:
            st.detector.watch_runs += 1
            from ..pipeline import judge_present

            now = time.time()
            w = st.ring.window_at(now, source="fragscope agent (watch)", span=WATCH_SPAN_S, keep=watch_keeps)
            quick = {(f.id, f.severity.value) for f in judge_present(w) if f.severity.rank >= 1}
            quick |= {(f.id, f.severity.value) for f in judge_recent(st.ring, now)}
            agent._watch_seen = (ver, quick)
    except Exception:  # noqa: BLE001 - the full run reports detector errors
        return False
    finally:
        used = time.thread_time() - c0
        st.detector.cpu_seconds += used
        st.detector.watch_cpu_seconds += used
    known = {(f.id, f.severity.value) for f in st.report.findings} if st.report else set()
    # what a brought-forward run did not confirm is not asked about again until the next scheduled run
    known |= getattr(agent, "_watch_unconfirmed", set())
    new = quick - known
    agent._watch_pending = new
    return bool(new)


def detector_loop(agent: Any) -> None:
    # first run once the first round of samples is in, then every detect.interval, on the grid; between
    # runs, every detect.watch_interval, a look at the present that brings the next run forward
    cfg = agent.cfg
    first = min(cfg.detect_interval, max(2.0, 2 * cfg.interval))
    next_due = agent.on_grid(agent._base + first, min(cfg.interval, first))
    watch = cfg.detect_watch_interval
    while True:
        wait = max(0.0, next_due - time.monotonic())
        if watch > 0 and agent.state.report is not None:
            wait = min(wait, watch)
        if agent._stop.wait(wait):
            return
        early = time.monotonic() < next_due - 1e-3
        if early:
            if not watch_once(agent):
                continue
            log.info("the present shows a new diagnosis: running the detectors now")
        agent._detect_once()
        if early:
            got = {(f.id, f.severity.value) for f in agent.state.report.findings} if agent.state.report else set()
            agent._watch_unconfirmed = getattr(agent, "_watch_unconfirmed", set()) | (agent._watch_pending - got)
        else:
            agent._watch_unconfirmed = set()
        next_due = agent.on_grid(max(time.monotonic() + cfg.detect_interval,
                                     time.monotonic() + min(1.0, cfg.detect_interval)),
                                 min(cfg.interval, cfg.detect_interval))


# ---------------------------------------------------------------------------------------------
def capture_loop(agent: Any) -> None:
    """Captures block for seconds (a profile, a snapshot): they run here, never in the detector
    thread. Attachments are kept per (finding id, subject) and re-attached on every run."""
    cfg, cap = agent.cfg, agent._capture
    every = float(cfg.capture_profile_every or 0.0)
    next_profile = time.monotonic() + min(every, 60.0) if every > 0 else math.inf
    while not agent._stop.is_set():
        # sleep until a finding arrives (the event) or the next periodic profile; no idle ticks
        agent._capture_wake.wait(min(30.0, max(0.05, next_profile - time.monotonic())))
        agent._capture_wake.clear()
        if time.monotonic() >= next_profile:
            # periodic short profile: the kernel-gap signals of the time series
            next_profile = time.monotonic() + every
            try:
                left = cap.budget_left(time.time())  # periodic ones count too
                if cfg.vllm_urls and cfg.capture_profiler_dir and (left is None or left > 0):
                    att = cap.capture("profile", time.time())
                    if not att.get("ok"):
                        log.warning("periodic profile: %s", att.get("error") or att.get("verdict"))
            except Exception as e:  # noqa: BLE001
                log.error("periodic profile failed (%s)", one_line(e))
            agent._record(cap.pop_samples())
        if not agent._capture_q:
            continue
        findings, now = agent._capture_q.pop()
        try:
            new = cap.on_findings(findings, now)
        except Exception as e:  # noqa: BLE001
            log.error("capture: failed (%s)", one_line(e))
            continue
        agent._record(cap.pop_samples())
        if new:
            with agent._att_lock:
                for a in new:
                    key = (str(a.get("finding")), tuple(sorted((str(k), str(v)) for k, v in
                                                               (a.get("subject") or {}).items())))
                    lst = agent._atts.setdefault(key, [])
                    lst.append(a)
                    del lst[:-20]
            agent.state.bump()


# ---------------------------------------------------------------------------------------------
def housekeeping_loop(agent: Any) -> None:
    """Flush the history, apply retention, watch for hung collectors and clock jumps."""
    st, cfg = agent.state, agent.cfg
    next_flush = time.monotonic() + cfg.flush_interval
    next_maint = time.monotonic() + 5.0
    period = HOUSEKEEPING_S
    trimmer = memory.Trimmer()  # RSS back down after a large body or query (agent/memory.py)
    while not agent._stop.wait(max(0.0, agent.on_grid(time.monotonic() + 0.5 * period, period)
                                   - time.monotonic())):
        c0 = time.thread_time()
        mono = time.monotonic()
        st.heartbeat = mono
        if not st.first_round_done and all(h.runs_total > 0 or h.up is False for h in st.collectors.values()):
            st.first_round_done = True
        agent.clock.check(time.time(), mono)
        trimmer.check()
        for h in st.collectors.values():
            since = h.in_flight_since
            if since is not None and mono - since > h.timeout and h.up is not False:
                mark_down(h, f"hung: no answer for {mono - since:.0f} s (timeout {h.timeout:g} s)", time.time())
                h.latest = []
                log.warning("collector %s: %s; other collectors continue", h.name, h.last_error)
                st.bump()
        if st.store is not None:
            if mono >= next_flush:
                st.store.flush()
                next_flush = mono + cfg.flush_interval
            if mono >= next_maint:
                st.store.maintain()
                next_maint = mono + 60.0
        st.housekeeping_cpu_seconds += time.thread_time() - c0


def finding_key(f: Any) -> tuple:
    return (f.id, tuple(sorted((str(k), str(v)) for k, v in (f.subject or {}).items())))


def json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)
