"""Prometheus exporter over the agent's last snapshot (the only module importing prometheus_client).

A scrape never calls NVML or the network: it reads what the scheduler last stored in the agent
state. The collector lives in a private registry with ``auto_describe=False`` (the default registry
calls ``collect()`` at registration) and builds each group of families under its own try, so one
failure drops that group, counted in ``fragscope_exporter_errors_total``, never the whole scrape.
Metric names are a contract: docs/agent.md#exported-metrics.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Iterator

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import choose_encoder

from .. import __version__
from ..model import Sample
from ..signals import RAW_TO_SIGNAL, SIGNALS
from .store import series_type

log = logging.getLogger("fragscope.agent.exporter")

_FAMILY_SUFFIX = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                  "summary": ("_count", "_sum")}


def family_of(name: str) -> tuple[str, str]:
    """Sample name -> (family name as prometheus_client wants it, type)."""
    t = series_type(name)
    for suf in _FAMILY_SUFFIX.get(t, ()):
        if name.endswith(suf):
            return name[: -len(suf)], t
    if t == "counter":  # a counter sample without _total cannot be exposed as a counter
        return name, "gauge"
    return name, t


def _doc(name: str) -> str:
    hit = RAW_TO_SIGNAL.get(name)
    if hit:
        sig = SIGNALS[hit[0]]
        return f"{sig.id} ({sig.unit}){': ' + sig.doc if sig.doc else ''}"
    return f"{name} (fragscope collector)"


def _labels(labels: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in labels}


class SnapshotCollector:
    """prometheus_client custom collector reading ``state`` (see daemon.AgentState)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.errors: dict[str, int] = {}
        self._logged: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        out: list[Metric] = []
        builders: list[tuple[str, Callable[[], list[Metric]]]] = [
            ("signals", self._signals), ("derived", self._derived), ("diagnoses", self._diagnoses),
            ("collectors", self._health), ("store", self._store), ("agent", self._agent)]
        for group, fn in builders:
            try:
                out.extend(fn())
            except Exception as e:  # noqa: BLE001 - one group's failure must not fail the scrape
                self.errors[group] = self.errors.get(group, 0) + 1
                if group not in self._logged:
                    self._logged.add(group)
                    log.error("exporter: cannot build %s metrics (%s: %s); other metrics are still served",
                              group, type(e).__name__, e)
        m = Metric("fragscope_exporter_errors", "Metric groups that failed to build, by group", "counter")
        for group in ("signals", "derived", "diagnoses", "collectors", "store", "agent"):
            m.add_sample("fragscope_exporter_errors_total", {"group": group}, float(self.errors.get(group, 0)))
        out.append(m)
        yield from out

    # --- collector samples (latest values) ------------------------------------------------------
    def _latest(self) -> list[Sample]:
        samples: list[Sample] = []
        for h in list(self.state.collectors.values()):
            samples.extend(h.latest)
        return samples

    def _signals(self) -> list[Metric]:
        fams: dict[str, Metric] = {}
        seen: set[tuple[str, tuple]] = set()
        for s in self._latest():
            if not s.name.startswith("fragscope_"):
                continue  # engine and DCGM series are scraped from their own exporters
            key = (s.name, s.labels)
            if key in seen:
                continue  # two collectors reporting the same series: first one wins
            seen.add(key)
            fam, typ = family_of(s.name)
            m = fams.get(fam)
            if m is None:
                m = fams[fam] = Metric(fam, _doc(fam if typ != "counter" else s.name), typ)
            m.add_sample(s.name, _labels(s.labels), float(s.value))
        return [fams[k] for k in sorted(fams)]

    def _derived(self) -> list[Metric]:
        alloc: dict[tuple, float] = {}
        reserved: dict[tuple, float] = {}
        for s in self._latest():
            if s.name == "fragscope_torch_allocated_bytes":
                alloc[s.labels] = s.value
            elif s.name == "fragscope_torch_reserved_bytes":
                reserved[s.labels] = s.value
        m = Metric("fragscope_torch_fragmentation_ratio",
                   "1 - allocated/reserved of the PyTorch caching allocator, per pid and gpu (reserved > 0)",
                   "gauge")
        for labels, r in sorted(reserved.items()):
            a = alloc.get(labels)
            if a is None or r <= 0:
                continue  # not available: absent, not 0
            m.add_sample("fragscope_torch_fragmentation_ratio", _labels(labels), max(0.0, 1.0 - a / r))
        return [m] if m.samples else []

    # --- findings -------------------------------------------------------------------------------
    def _diagnoses(self) -> list[Metric]:
        report = self.state.report
        if report is None:
            return []
        # Severity is a value, not a label: a finding moving between warning and critical stays one
        # series, so an alert on it keeps its `for:` (a label would start a new series at each change).
        level: dict[str, int] = {}
        conf: dict[str, float] = {}
        for f in report.findings:
            level[f.id] = max(level.get(f.id, 0), f.severity.level)
            conf[f.id] = max(conf.get(f.id, 0.0), float(f.confidence))
        a = Metric("fragscope_diagnosis_active", "1 while a diagnosis is active, by id", "gauge")
        s = Metric("fragscope_diagnosis_severity",
                   "Highest severity of the active findings with that id: 1 info, 2 warning, 3 critical", "gauge")
        for d, lv in sorted(level.items()):
            a.add_sample("fragscope_diagnosis_active", {"diagnosis": d}, 1.0)
            s.add_sample("fragscope_diagnosis_severity", {"diagnosis": d}, float(lv))
        c = Metric("fragscope_diagnosis_confidence", "Confidence 0-1 of an active diagnosis", "gauge")
        for d, v in sorted(conf.items()):
            c.add_sample("fragscope_diagnosis_confidence", {"diagnosis": d}, v)
        i = Metric("fragscope_diagnosis_inconclusive",
                   "1 when a detector could not judge for lack of signals (not healthy, unknown)", "gauge")
        for d in sorted({x.id for x in report.inconclusive}):
            i.add_sample("fragscope_diagnosis_inconclusive", {"diagnosis": d}, 1.0)
        return [a, s, c, i]

    # --- agent health ---------------------------------------------------------------------------
    def _health(self) -> list[Metric]:
        up = Metric("fragscope_collector_up", "1 when the collector's last run succeeded", "gauge")
        dur = Metric("fragscope_collector_duration_seconds", "Duration of the collector's last run", "gauge")
        err = Metric("fragscope_collector_errors", "Failed runs of the collector", "counter")
        runs = Metric("fragscope_collector_runs", "Runs of the collector", "counter")
        last = Metric("fragscope_collector_last_success_timestamp_seconds",
                      "Unix time of the collector's last successful run", "gauge")
        n = Metric("fragscope_collector_samples", "Samples returned by the collector's last run", "gauge")
        cpu = Metric("fragscope_collector_cpu_seconds", "Agent CPU time spent on the collector", "counter")
        for name, h in sorted(self.state.collectors.items()):
            lab = {"collector": name}
            if h.up is not None:
                up.add_sample("fragscope_collector_up", lab, 1.0 if h.up else 0.0)
            if h.last_duration is not None:
                dur.add_sample("fragscope_collector_duration_seconds", lab, h.last_duration)
            err.add_sample("fragscope_collector_errors_total", lab, float(h.errors_total))
            runs.add_sample("fragscope_collector_runs_total", lab, float(h.runs_total))
            if h.last_success is not None:
                last.add_sample("fragscope_collector_last_success_timestamp_seconds", lab, h.last_success)
            n.add_sample("fragscope_collector_samples", lab, float(len(h.latest)))
            cpu.add_sample("fragscope_collector_cpu_seconds_total", lab, float(h.cpu_seconds))
        return [up, dur, err, runs, last, n, cpu] + self._limits()

    def _limits(self) -> list[Metric]:
        """What the memory budget left out (agent/budget.py): never silent."""
        st = self.state
        drop = Metric("fragscope_series_dropped", "What a collector's source held past the agent's limits, "
                      "left out (samples: series_limit, label_limit, label_length; lines: line_limit, "
                      "log_lines; probe files and devices: probe_*)", "counter")
        held = Metric("fragscope_collector_series", "Series a collector's budget follows", "gauge")
        for name, h in sorted(st.collectors.items()):
            b = getattr(h, "budget", None)
            if b is None:
                continue
            for reason, v in sorted(b.counts().items()):
                drop.add_sample("fragscope_series_dropped_total", {"collector": name, "reason": reason}, float(v))
            held.add_sample("fragscope_collector_series", {"collector": name}, float(b.series))
        out = [drop, held]
        ring = st.ring
        if ring is not None:
            ev = Metric("fragscope_ring_series_evicted", "Series evicted from the detection window, least "
                        "recently seen first, to stay within limits.ring_series / ring_points", "counter")
            ev.add_sample("fragscope_ring_series_evicted_total", {}, float(ring.evicted))
            rd = Metric("fragscope_ring_samples_dropped", "Samples of new series the detection window had no "
                        "room for", "counter")
            rd.add_sample("fragscope_ring_samples_dropped_total", {}, float(ring.dropped))
            rs = Metric("fragscope_ring_series", "Series held in the detection window", "gauge")
            rs.add_sample("fragscope_ring_series", {}, float(len(ring)))
            out += [ev, rd, rs]
        return out

    def _store(self) -> list[Metric]:
        st = self.state.store
        if st is None:
            return []
        s = st.stats()
        out = []
        for name, doc, typ, val in (
                ("fragscope_store_size_bytes", "Bytes of the history on disk (database, WAL)", "gauge",
                 s["disk_bytes"]),
                ("fragscope_store_max_size_bytes", "Configured bound on the history's size", "gauge",
                 s["max_bytes"]),
                ("fragscope_store_series", "Series in the history", "gauge", s["series"]),
                ("fragscope_store_points_written", "Points written to the history", "counter",
                 s["points_written"]),
                ("fragscope_store_points_dropped", "Points lost (disk full, store error)", "counter",
                 s["points_dropped"]),
                ("fragscope_store_points_expired", "Points removed by retention", "counter",
                 s["points_expired"]),
                ("fragscope_store_series_evicted", "Series removed from the history, least recently written "
                 "first, to stay within its series bound", "counter", s.get("series_evicted", 0)),
                ("fragscope_store_degraded", "1 while writes to the history fail", "gauge",
                 1 if s["degraded"] else 0)):
            fam = name[: -len("_total")] if name.endswith("_total") else name
            m = Metric(fam, doc, typ)
            m.add_sample(fam + "_total" if typ == "counter" else fam, {}, float(val))
            out.append(m)
        return out

    def _agent(self) -> list[Metric]:
        st = self.state
        info = Metric("fragscope_agent", "fragscope agent build", "info")
        info.add_sample("fragscope_agent_info", {"version": __version__}, 1.0)
        out = [info]
        d = st.detector
        runs = Metric("fragscope_detector_runs", "Runs of the detectors", "counter")
        runs.add_sample("fragscope_detector_runs_total", {}, float(d.runs))
        errs = Metric("fragscope_detector_errors", "Runs of the detectors that failed", "counter")
        errs.add_sample("fragscope_detector_errors_total", {}, float(d.errors))
        jumps = Metric("fragscope_agent_clock_jumps", "Wall-clock steps the agent noticed (more than 5 s)",
                       "counter")
        jumps.add_sample("fragscope_agent_clock_jumps_total", {}, float(getattr(st, "clock_jumps", 0)))
        out += [runs, errs, jumps]
        if d.last_duration is not None:
            m = Metric("fragscope_detector_duration_seconds", "Duration of the last detector run", "gauge")
            m.add_sample("fragscope_detector_duration_seconds", {}, d.last_duration)
            out.append(m)
        if d.last_run is not None:
            m = Metric("fragscope_detector_last_run_timestamp_seconds", "Unix time of the last detector run",
                       "gauge")
            m.add_sample("fragscope_detector_last_run_timestamp_seconds", {}, d.last_run)
            out.append(m)
        return out


class Exporter:
    """Renders ``/metrics`` from the state; output is cached per state version and format."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.collector = SnapshotCollector(state)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._cache: tuple[Any, str, bytes] | None = None
        self._lock = threading.Lock()

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        version = getattr(self.state, "version", None)
        with self._lock:
            c = self._cache
            if c is not None and version is not None and c[0] == version and c[1] == content_type:
                return c[2], content_type
            body = encoder(self.registry)
            self._cache = (version, content_type, body)
        return body, content_type
