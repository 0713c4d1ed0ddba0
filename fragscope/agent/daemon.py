"""The agent's scheduler: collectors on their own intervals, history, detectors, exporter, API.

Isolation: each collector runs in its own thread (a hung HTTP call or NVML call stalls only that
collector; a watchdog marks it down once it overruns its timeout), with exponential backoff after
failures. Scheduling uses the monotonic clock, so wall-clock jumps change sample timestamps only
(and are logged once). The detectors run every ``detect.interval`` over an in-memory ring of the
recent window at ``detect.step`` resolution (no SQLite reads, no pandas in the steady state).
Logging is once per state change, never per tick. SIGTERM/SIGINT stop it cleanly.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..model import CollectResult, Missing, Report, Sample, SeriesKey, Window
from .config import AgentConfig
from .store import Store, StoreError, is_signal, series_type

log = logging.getLogger("fragscope.agent")


# ---------------------------------------------------------------------------------------------
@dataclass
class CollectorHealth:
    """What the exporter and the API report about one collector (read without locks: each field
    is replaced atomically by the collector's thread)."""

    name: str
    kind: str
    interval: float
    timeout: float
    up: bool | None = None  # None: not run yet
    last_error: str | None = None
    errors_total: int = 0
    runs_total: int = 0
    last_duration: float | None = None
    last_success: float | None = None  # unix seconds
    in_flight_since: float | None = None  # monotonic, while a collect() call runs
    backoff: float = 0.0
    cpu_seconds: float = 0.0  # thread CPU spent collecting and storing this collector's samples
    latest: list[Sample] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "interval_seconds": self.interval, "up": self.up,
                "error": self.last_error, "errors_total": self.errors_total, "runs_total": self.runs_total,
                "duration_seconds": self.last_duration, "last_success": self.last_success,
                "backoff_seconds": self.backoff, "cpu_seconds": round(self.cpu_seconds, 4),
                "samples": len(self.latest),
                "missing": [{"name": m.name, "labels": dict(m.labels), "reason": str(getattr(m.reason, "value",
                                                                                               m.reason)),
                             "detail": m.detail} for m in self.missing[:50]]}


@dataclass
class DetectorHealth:
    runs: int = 0
    errors: int = 0
    last_run: float | None = None
    last_duration: float | None = None
    last_error: str | None = None
    cpu_seconds: float = 0.0


class Ring:
    """Recent history of every signal at a fixed step (last value per step), in numpy buffers."""

    def __init__(self, window_s: float, step_s: float) -> None:
        self.step = float(step_s)
        self.cap = max(4, int(math.ceil(window_s / step_s)) + 1)
        self.window = float(window_s)
        self._d: dict[SeriesKey, list] = {}  # key -> [ts array, value array, n, last bucket, type]
        self._lock = threading.Lock()
        self.out_of_order = 0  # samples older than their series' last step (a clock stepped back)

    def add(self, samples: Iterable[Sample]) -> None:
        step = self.step
        with self._lock:
            d = self._d
            for s in samples:
                key = SeriesKey(s.name, s.labels)
                e = d.get(key)
                b = math.floor(s.ts / step)
                if e is None:
                    e = d[key] = [np.empty(self.cap), np.empty(self.cap), 0, None, series_type(s.name)]
                ts, vs, n = e[0], e[1], e[2]
                if n and b < e[3]:  # older than the last step: the wall clock went back; keep the
                    self.out_of_order += 1  # ring sorted (the agent shifts it once it sees the jump)
                    continue
                if e[3] == b and n:
                    ts[n - 1], vs[n - 1] = s.ts, s.value  # same step: the last value wins
                    continue
                if n == self.cap:  # full: shift left by a quarter (amortised O(1))
                    k = self.cap // 4
                    ts[:-k] = ts[k:]
                    vs[:-k] = vs[k:]
                    n -= k
                ts[n], vs[n] = s.ts, s.value
                e[2], e[3] = n + 1, b

    def shift(self, delta_s: float) -> None:
        """Move every held timestamp by ``delta_s`` (the wall clock jumped by that much): the recent
        history stays continuous with the samples stamped by the new clock."""
        step = self.step
        with self._lock:
            for e in self._d.values():
                n = e[2]
                if n:
                    e[0][:n] += delta_s
                    e[3] = math.floor(e[0][n - 1] / step)

    def window_at(self, now: float, source: str) -> Window:
        lo = now - self.window
        cols = {}
        types = {}
        with self._lock:
            for key, (ts, vs, n, _, typ) in list(self._d.items()):
                if not n:
                    continue
                i = int(np.searchsorted(ts[:n], lo))
                if i >= n:
                    continue
                cols[key] = (ts[i:n].copy(), vs[i:n].copy())
                types[key.name] = typ
        return Window.from_columns(cols, source=source, types=types)

    def __len__(self) -> int:
        return len(self._d)

    def points(self) -> int:
        return sum(e[2] for e in self._d.values())


@dataclass
class AgentState:
    """Everything the exporter and API read. ``version`` grows on every change (exporter cache)."""

    cfg: AgentConfig
    collectors: dict[str, CollectorHealth] = field(default_factory=dict)
    report: Report | None = None
    report_at: float | None = None
    store: Store | None = None
    ring: Ring | None = None
    detector: DetectorHealth = field(default_factory=DetectorHealth)
    started: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    first_round_done: bool = False
    heartbeat: float = field(default_factory=time.monotonic)  # monotonic, by the main loop
    version: int = 0
    notes: list[str] = field(default_factory=list)
    clock_jumps: int = 0
    last_clock_jump_seconds: float | None = None

    def bump(self) -> None:
        self.version += 1


# ---------------------------------------------------------------------------------------------
@dataclass
class Planned:
    name: str
    kind: str
    make: Callable[[], Any]
    interval: float
    timeout: float


def plan_collectors(cfg: AgentConfig) -> list[Planned]:
    """The collectors the config asks for; constructed later, each import failure isolated."""
    plan: list[Planned] = []
    vt = cfg.vllm_timeout
    for i, url in enumerate(cfg.vllm_urls):
        name = "vllm" if len(cfg.vllm_urls) == 1 else f"vllm_{i}"

        def mk(url=url):
            from ..collectors.vllm import VllmCollector

            return VllmCollector(url, timeout_s=vt, max_bytes=cfg.vllm_max_bytes)
        plan.append(Planned(name, "vllm", mk, cfg.interval_of("vllm"), vt + 1.0))
    if cfg.dcgm_url:
        def mk_dcgm():
            from ..collectors.dcgm import DcgmCollector

            return DcgmCollector(cfg.dcgm_url, timeout_s=cfg.dcgm_timeout)
        plan.append(Planned("dcgm", "dcgm", mk_dcgm, cfg.interval_of("dcgm"), cfg.dcgm_timeout + 1.0))
    if cfg.nvml_on():
        def mk_nvml():
            from ..collectors import nvml

            if cfg.nvml_recorded:
                return nvml.NvmlCollector(backend=nvml.RecordedBackend(cfg.nvml_recorded))
            return nvml.NvmlCollector()
        plan.append(Planned("nvml", "nvml", mk_nvml, cfg.interval_of("nvml"), 5.0))
    if cfg.probe_dir:
        def mk_torch():
            from ..collectors.torch import TorchProbeCollector

            return TorchProbeCollector(cfg.probe_dir)
        plan.append(Planned("torch", "torch", mk_torch, cfg.interval_of("torch"), 5.0))
    if cfg.process_enabled:
        def mk_proc():
            from ..collectors.process import ProcessCollector

            return ProcessCollector()
        plan.append(Planned("process", "process", mk_proc, cfg.interval_of("process"), 5.0))
    if cfg.log_file:
        def mk_logs():
            from ..collectors.logs import LogCollector

            return LogCollector(cfg.log_file)
        plan.append(Planned("logs", "logs", mk_logs, cfg.interval_of("logs"), 5.0))
    return plan


def _one_line(e: BaseException | str) -> str:
    s = str(e) if not isinstance(e, BaseException) else f"{type(e).__name__}: {e}"
    s = " ".join(s.split())
    return s[:300]


# ---------------------------------------------------------------------------------------------
class Agent:
    """Runs until :meth:`stop`. Construct, then :meth:`run` (blocking) or :meth:`start`."""

    def __init__(self, cfg: AgentConfig, collectors: list[tuple[str, str, Any, float, float]] | None = None,
                 detect: Callable[[Window], Report] | None = None, serve: bool = True) -> None:
        self.cfg = cfg
        self.state = AgentState(cfg)
        self.state.ring = Ring(cfg.detect_window, cfg.detect_step)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._detect = detect
        self._serve = serve
        self.server = None
        self._capture = None
        self._collectors: list[tuple[CollectorHealth, Any]] = []
        self._explicit = collectors
        self._att_lock = threading.Lock()
        self._atts: dict[tuple, list[dict]] = {}
        self._capture_q: list = []
        self._capture_wake = threading.Event()
        self._wall_offset = time.time() - time.monotonic()
        self._clock_lock = threading.Lock()
        # One time grid for every loop (collectors, housekeeping, detectors), reset by start():
        # threads due at the same instant wake together. On the 2-core VM, five collectors staggered
        # over the second cost 1.6-4.6 % of a core against 0.8-1.7 % aligned (same work; each
        # separate wake-up of an idle thread is what costs; docs/agent.md#performance).
        self._base = time.monotonic()

    # --- setup --------------------------------------------------------------------------------
    def _open_store(self) -> None:
        if not self.cfg.store_enabled:
            return
        path = os.path.join(self.cfg.data_dir, "history.sqlite")
        self.state.store = Store(path, self.cfg.retention, self.cfg.max_store_bytes, self.cfg.store_keep)
        # warm the detection ring from history so a restart keeps judging the same window
        now = time.time()
        try:
            w = self.state.store.query(None, now - self.cfg.detect_window, now, step=self.cfg.detect_step,
                                       max_points=2_000_000)
            samples = [Sample(k.name, k.labels, float(t), float(v)) for k, s in w.series.items()
                       for t, v in zip(s.ts, s.values)]
            samples.sort(key=lambda s: s.ts)
            self.state.ring.add(samples)
            if samples:
                log.info("history %s: %d series, %d recent points reloaded", path, len(w), len(samples))
        except StoreError as e:
            log.warning("history %s: recent window not reloaded (%s)", path, e)
        last = self.state.store.get_meta("last_report")
        if last:
            self.state.notes.append("last report before restart kept in history (meta last_report)")

    def _build_collectors(self) -> None:
        if self._explicit is not None:
            for name, kind, obj, interval, timeout in self._explicit:
                self._add(CollectorHealth(name, kind, interval, timeout), obj)
            return
        for p in plan_collectors(self.cfg):
            h = CollectorHealth(p.name, p.kind, p.interval, p.timeout)
            try:
                obj = p.make()
            except Exception as e:  # noqa: BLE001 - a collector that cannot start stays down, the agent runs
                h.up = False
                h.last_error = f"cannot start: {_one_line(e)}"
                log.error("collector %s: cannot start (%s); continuing without it", p.name, _one_line(e))
                self.state.collectors[p.name] = h
                continue
            self._add(h, obj)

    def _add(self, h: CollectorHealth, obj: Any) -> None:
        self.state.collectors[h.name] = h
        self._collectors.append((h, obj))

    def _build_capture(self) -> None:
        if not self.cfg.capture_enabled:
            return
        try:
            from .capture import CaptureManager

            out = os.path.join(self.cfg.data_dir or ".", "captures")
            # the profiler endpoints hang off the server's base URL, not /metrics
            urls = tuple(u[: -len("/metrics")] if u.rstrip("/").endswith("/metrics") else u
                         for u in (x.rstrip("/") for x in self.cfg.vllm_urls))
            self._capture = CaptureManager(out, probe_dir=self.cfg.probe_dir, vllm_urls=urls,
                                           max_per_hour=self.cfg.capture_max_per_hour,
                                           profiler_dir=self.cfg.capture_profiler_dir)
        except Exception as e:  # noqa: BLE001
            log.error("capture: disabled (%s)", _one_line(e))

    # --- wall clock -----------------------------------------------------------------------------
    CLOCK_JUMP_S = 5.0  # wall - monotonic moving by more than this is a step, not NTP slewing

    def _check_clock(self, wall: float, mono: float) -> None:
        """Notice a wall-clock step (NTP correcting a VM that was paused, someone running `date -s`).

        Scheduling never depends on the wall clock (monotonic), and stored history keeps the
        timestamps it was written with. The detection ring is shifted by the jump so the recent
        window stays continuous (rates and trends are judged on sample spacing, which did not change
        just because the clock did). Called by every collector before it stamps samples and by the
        housekeeping loop; logged once per jump.
        """
        off = wall - mono
        delta = off - self._wall_offset
        if abs(delta) <= self.CLOCK_JUMP_S:
            return
        with self._clock_lock:
            delta = off - self._wall_offset  # another thread may have handled it meanwhile
            if abs(delta) <= self.CLOCK_JUMP_S:
                return
            self._wall_offset = off
            st = self.state
            st.ring.shift(delta)
            st.clock_jumps += 1
            st.last_clock_jump_seconds = delta
            log.warning("wall clock jumped by %+.1f s; scheduling is unaffected (monotonic clock), new "
                        "samples carry the new time, stored history keeps its timestamps, the detection "
                        "window was shifted to stay continuous", delta)
            st.bump()

    # --- collector threads --------------------------------------------------------------------
    def _run_collector(self, h: CollectorHealth, obj: Any) -> None:
        interval = h.interval
        next_due = self._base
        state = self.state
        while not self._stop.is_set():
            delay = next_due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            t0 = time.monotonic()
            c0 = time.thread_time()
            now = time.time()
            self._check_clock(now, t0)
            h.in_flight_since = t0
            try:
                res = obj.collect(now)
                if not isinstance(res, CollectResult):
                    raise TypeError(f"collect() returned {type(res).__name__}, not CollectResult")
                err = None if res.up else (res.error or "down")
            except Exception as e:  # noqa: BLE001 - the protocol says never raises; be safe anyway
                res = CollectResult(up=False, error=_one_line(e))
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
                h.backoff = 0.0
                if was is False:
                    log.info("collector %s: up again", h.name)
            else:
                h.up = False
                h.errors_total += 1
                h.backoff = min(self.cfg.max_backoff, max(interval, h.backoff * 2 or interval))
                if was is not False or (h.last_error or "")[:60] != err[:60]:
                    log.warning("collector %s: down (%s); retrying with backoff up to %gs", h.name, err,
                                self.cfg.max_backoff)
                h.last_error = err
            # latest values for the exporter: on failure keep nothing stale (absent, not old values)
            h.latest = res.samples
            h.missing = res.missing
            if res.samples:
                state.ring.add(s for s in res.samples if is_signal(s.name))
                if state.store is not None:
                    state.store.append(res.samples)
            state.bump()
            h.cpu_seconds += time.thread_time() - c0
            wait = interval if err is None else h.backoff
            mono = time.monotonic()
            # overran: skip missed ticks rather than bursting; stay on the agent's grid either way
            next_due = self._on_grid(max(next_due + wait, mono + 0.2 * wait, mono), interval)

    # --- main loop ----------------------------------------------------------------------------
    def _detect_once(self) -> None:
        st = self.state
        now = time.time()
        t0 = time.monotonic()
        c0 = time.thread_time()
        try:
            w = st.ring.window_at(now, source="fragscope agent (live)")
            if self._detect is not None:
                report = self._detect(w)
            else:
                from ..pipeline import diagnose

                report = diagnose(w)
            if self._capture is not None:
                with self._att_lock:
                    for f in report.findings:
                        f.attachments.extend(self._atts.get(_finding_key(f), ()))
                if report.findings:
                    self._capture_q[:] = [(list(report.findings), now)]  # latest only
                    self._capture_wake.set()
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
                                                            default=_json_default))
        except Exception as e:  # noqa: BLE001 - a detector bug must not kill the agent
            st.detector.errors += 1
            if st.detector.last_error is None:
                log.error("detectors failed (%s); will retry", _one_line(e))
            st.detector.last_error = _one_line(e)
        st.detector.runs += 1
        st.detector.last_run = now
        st.detector.last_duration = time.monotonic() - t0
        st.detector.cpu_seconds += time.thread_time() - c0
        st.bump()

    def _record(self, samples: list) -> None:
        """Samples produced outside a collector (timeline captures): into the ring and history."""
        if not samples:
            return
        self.state.ring.add(samples)
        if self.state.store is not None:
            self.state.store.append(samples)
        self.state.bump()

    def _capture_loop(self) -> None:
        """Captures block for seconds (a profile, a snapshot): they run here, never in the detector
        thread. Attachments are kept per (finding id, subject) and re-attached on every run."""
        every = float(self.cfg.capture_profile_every or 0.0)
        next_profile = time.monotonic() + min(every, 60.0) if every > 0 else math.inf
        while not self._stop.is_set():
            # sleep until a finding arrives (the event) or the next periodic profile; no idle ticks
            self._capture_wake.wait(min(30.0, max(0.05, next_profile - time.monotonic())))
            self._capture_wake.clear()
            if time.monotonic() >= next_profile:
                # periodic short profile: the kernel-gap signals of the time series (issue 2)
                next_profile = time.monotonic() + every
                try:
                    left = self._capture.budget_left(time.time())  # periodic ones count too
                    if self.cfg.vllm_urls and self.cfg.capture_profiler_dir and (left is None or left > 0):
                        att = self._capture.capture("profile", time.time())
                        if not att.get("ok"):
                            log.warning("periodic profile: %s", att.get("error") or att.get("verdict"))
                except Exception as e:  # noqa: BLE001
                    log.error("periodic profile failed (%s)", _one_line(e))
                self._record(self._capture.pop_samples())
            if not self._capture_q:
                continue
            findings, now = self._capture_q.pop()
            try:
                new = self._capture.on_findings(findings, now)
            except Exception as e:  # noqa: BLE001
                log.error("capture: failed (%s)", _one_line(e))
                continue
            self._record(self._capture.pop_samples())
            if new:
                with self._att_lock:
                    for a in new:
                        key = (str(a.get("finding")), tuple(sorted((str(k), str(v)) for k, v in
                                                                   (a.get("subject") or {}).items())))
                        lst = self._atts.setdefault(key, [])
                        lst.append(a)
                        del lst[:-20]
                self.state.bump()

    def _on_grid(self, t: float, period: float) -> float:
        """The first instant of the agent's time grid with the given period at or after ``t``."""
        if period <= 0:
            return t
        k = math.ceil((t - self._base) / period - 1e-9)
        return self._base + max(k, 0) * period

    def _detector_loop(self) -> None:
        # first run once the first round of samples is in, then every detect.interval, on the grid
        first = min(self.cfg.detect_interval, max(2.0, 2 * self.cfg.interval))
        next_due = self._on_grid(self._base + first, min(self.cfg.interval, first))
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            self._detect_once()
            next_due = self._on_grid(max(next_due + self.cfg.detect_interval,
                                         time.monotonic() + min(1.0, self.cfg.detect_interval)),
                                     min(self.cfg.interval, self.cfg.detect_interval))

    HOUSEKEEPING_S = 2.0  # watchdog resolution; every wake-up of an idle thread costs CPU

    def _housekeeping(self) -> None:
        """Flush the history, apply retention, watch for hung collectors and clock jumps."""
        st = self.state
        next_flush = time.monotonic() + self.cfg.flush_interval
        next_maint = time.monotonic() + 5.0
        period = self.HOUSEKEEPING_S
        while not self._stop.wait(max(0.0, self._on_grid(time.monotonic() + 0.5 * period, period)
                                      - time.monotonic())):
            mono = time.monotonic()
            st.heartbeat = mono
            if not st.first_round_done and all(h.runs_total > 0 or h.up is False
                                                for h in st.collectors.values()):
                st.first_round_done = True
            self._check_clock(time.time(), mono)
            for h in st.collectors.values():
                since = h.in_flight_since
                if since is not None and mono - since > h.timeout and h.up is not False:
                    h.up = False
                    h.errors_total += 1
                    h.last_error = f"hung: no answer for {mono - since:.0f} s (timeout {h.timeout:g} s)"
                    h.latest = []
                    log.warning("collector %s: %s; other collectors continue", h.name, h.last_error)
                    st.bump()
            if st.store is not None:
                if mono >= next_flush:
                    st.store.flush()
                    next_flush = mono + self.cfg.flush_interval
                if mono >= next_maint:
                    st.store.maintain()
                    next_maint = mono + 60.0

    def start(self) -> None:
        self._open_store()
        self._build_collectors()
        self._build_capture()
        if self._serve:
            from .api import serve

            self.server = serve(self.state, self.cfg)
        self._base = time.monotonic()
        for h, obj in self._collectors:
            t = threading.Thread(target=self._run_collector, args=(h, obj), name=f"collector-{h.name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        loops = [(self._detector_loop, "detectors"), (self._housekeeping, "housekeeping")]
        if self._capture is not None:
            loops.append((self._capture_loop, "capture"))
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("fragscope agent: %d collectors (%s), listening on %s, history %s",
                 len(self.state.collectors), ", ".join(self.state.collectors) or "none",
                 self.cfg.listen if self._serve else "(not serving)",
                 self.state.store.path if self.state.store else "off")

    def stop(self) -> None:
        self._stop.set()
        self._capture_wake.set()

    def close(self) -> None:
        self._stop.set()
        self._capture_wake.set()
        if self.server is not None:
            try:
                self.server.shutdown()
                self.server.server_close()
            except Exception:  # noqa: BLE001
                pass
        for t in self._threads:
            if t.name in ("detectors", "housekeeping"):
                t.join(timeout=5.0)
        if self.state.store is not None:
            self.state.store.close()  # flushes what is buffered
        for h, obj in self._collectors:
            close = getattr(obj, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass

    def run(self) -> int:
        """Blocking: start, wait for SIGTERM/SIGINT, stop cleanly. Returns the exit code."""
        def _sig(signum, frame):  # noqa: ARG001
            log.info("signal %d: stopping", signum)
            self._stop.set()
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(s, _sig)
            except ValueError:  # not the main thread
                pass
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        try:
            while not self._stop.wait(30.0):  # a signal interrupts the wait (its handler sets the event)
                pass
        finally:
            self.close()
            log.info("fragscope agent stopped")
        return 0


def _finding_key(f: Any) -> tuple:
    return (f.id, tuple(sorted((str(k), str(v)) for k, v in (f.subject or {}).items())))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)
