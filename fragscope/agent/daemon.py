"""The agent: its collectors, history, detectors, exporter and API, started and stopped together.

This module wires the parts (docs/agent.md#design): the config's collectors (agent/plan.py), each
in its own thread, the in-memory detection ring (agent/ring.py), the shared state the exporter and
API read (agent/state.py), the threads' loops (agent/loops.py) and wall-clock watch
(agent/clock.py). Scheduling uses the monotonic clock on one time grid; SIGTERM/SIGINT stop it
cleanly.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from typing import Any, Callable

from ..model import Report, Sample, Window
from . import loops, memory
from .budget import Limits, SeriesBudget
from .clock import CLOCK_JUMP_S, ClockWatch
from .config import AgentConfig
from .loops import HOUSEKEEPING_S, finding_key as _finding_key  # noqa: F401 - kept importable
from .plan import Planned, plan_collectors  # noqa: F401 - kept importable
from .ring import Ring
from .state import AgentState, CollectorHealth, DetectorHealth  # noqa: F401 - kept importable
from .store import Store, StoreError

log = logging.getLogger("fragscope.agent")


# ---------------------------------------------------------------------------------------------
class Agent:
    """Runs until :meth:`stop`. Construct, then :meth:`run` (blocking) or :meth:`start`."""

    CLOCK_JUMP_S = CLOCK_JUMP_S
    HOUSEKEEPING_S = HOUSEKEEPING_S

    def __init__(self, cfg: AgentConfig, collectors: list[tuple[str, str, Any, float, float]] | None = None,
                 detect: Callable[[Window], Report] | None = None, serve: bool = True) -> None:
        self.cfg = cfg
        self.state = AgentState(cfg)
        self.state.ring = Ring(cfg.detect_window, cfg.detect_step, cfg.max_ring_series, cfg.max_ring_points)
        self._limits = Limits(max_series_per_collector=cfg.max_series_per_collector,
                              max_label_value_bytes=cfg.max_label_value_bytes,
                              max_ring_series=cfg.max_ring_series, max_ring_points=cfg.max_ring_points)
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
        self.clock = ClockWatch(self.state)
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
                h.up, h.down_since = False, time.time()
                h.last_error = f"cannot start: {loops.one_line(e)}"
                log.error("collector %s: cannot start (%s); continuing without it", p.name, loops.one_line(e))
                self.state.collectors[p.name] = h
                continue
            self._add(h, obj)

    def _add(self, h: CollectorHealth, obj: Any) -> None:
        h.budget = SeriesBudget(self._limits)
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
            extra = {"probe_uids": self.cfg.capture_probe_uids} if self.cfg.capture_probe_uids else {}
            self._capture = CaptureManager(out, probe_dir=self.cfg.probe_dir, vllm_urls=urls,
                                           max_per_hour=self.cfg.capture_max_per_hour,
                                           profiler_dir=self.cfg.capture_profiler_dir, **extra)
        except Exception as e:  # noqa: BLE001
            log.error("capture: disabled (%s)", loops.one_line(e))

    def _record(self, samples: list) -> None:
        """Samples produced outside a collector (timeline captures): into the ring and history."""
        if not samples:
            return
        self.state.ring.add(samples)
        if self.state.store is not None:
            self.state.store.append(samples)
        self.state.bump()

    # --- threads (fragscope/agent/loops.py) ------------------------------------------------------
    def _run_collector(self, h: CollectorHealth, obj: Any) -> None:
        loops.collector_loop(self, h, obj)

    def _detect_once(self) -> None:
        loops.detect_once(self)

    def _detector_loop(self) -> None:
        loops.detector_loop(self)

    def _capture_loop(self) -> None:
        loops.capture_loop(self)

    def _housekeeping(self) -> None:
        loops.housekeeping_loop(self)

    def _check_clock(self, wall: float, mono: float) -> None:
        self.clock.check(wall, mono)

    def on_grid(self, t: float, period: float) -> float:
        """The first instant of the agent's time grid with the given period at or after ``t``."""
        if period <= 0:
            return t
        k = math.ceil((t - self._base) / period - 1e-9)
        return self._base + max(k, 0) * period

    _on_grid = on_grid

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
        workers = [(self._detector_loop, "detectors"), (self._housekeeping, "housekeeping")]
        if self._capture is not None:
            workers.append((self._capture_loop, "capture"))
        for target, name in workers:
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
        memory.tune()  # this process is the sidecar: large buffers mmapped, freed memory returned
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        try:
            # A signal normally interrupts the wait (its handler sets the event); the 1 s bound keeps the
            # exit prompt where a preloaded libc wrapper (libfaketime's timed waits) restarts the wait instead.
            while not self._stop.wait(1.0):
                pass
        finally:
            self.close()
            log.info("fragscope agent stopped")
        return 0
