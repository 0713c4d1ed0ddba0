"""Fleet diagnosis over Prometheus: one Window per serving target, diagnosed, summarised, compared.

Data flow: :func:`fragscope.collectors.prometheus.fetch` (a few batched requests for the whole
fleet) -> :func:`group_targets` (series -> targets, rules below) -> ``diagnose`` per target ->
:func:`find_outliers` (peers serving the same model) -> :class:`FleetReport` (``to_dict`` is the
contract of ``diagnose --prometheus --format json``, documented in docs/fleet.md).

Grouping rules (docs/fleet.md#grouping):

1. A series belongs to the Kubernetes pod named by ``exported_pod`` (+ ``exported_namespace``) when
   it has one: Prometheus renames a scraped ``pod`` label that way when the target's own labels
   (dcgm-exporter's pod) clash and ``honor_labels`` is off. Else ``pod`` (+ ``namespace``), else
   ``pod_name`` (+ ``pod_namespace``, old dcgm-exporter releases).
2. Series without any pod label are grouped by the host part of ``instance``; when one host runs
   several engine instances (vLLM on :8000 and :8001), each ``instance`` is its own target, since
   nothing tells which GPU serves which engine.
3. Series with neither (e.g. a backfilled recording) form one target named ``(unlabelled)``.

Labels are kept as they are: the detectors see the same series a recording of the pod would hold.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Mapping

import numpy as np

from ..model import Report, SeriesKey, Window, rank_findings
from ..signals import SIGNALS
from ..units import iso as _iso

# Signals whose absence a target's summary names (the detectors' inputs; optional DCGM extras such
# as power or violation counters are left out).
CORE_SIGNALS = (
    "requests_running", "requests_waiting", "kv_cache_usage_ratio", "preemptions_total",
    "generation_tokens_total", "prompt_tokens_total", "request_success_total", "ttft_seconds",
    "request_prompt_tokens", "request_generation_tokens", "cache_config_info",
    "gpu_memory_used_bytes", "gpu_utilization_ratio", "gpu_sm_clock_hertz", "gpu_temperature_celsius",
    "torch_allocated_bytes", "torch_reserved_bytes", "torch_inactive_split_bytes",
    "torch_alloc_retries_total", "kernel_gap_seconds", "gpu_idle_ratio",
)
# Fleet comparisons use the last RECENT_SECONDS of the window: the state now, not a 6-hour average
# that a regression of the last hour barely moves.
RECENT_SECONDS = 30 * 60
# Outliers: modified z-score of Iglewicz & Hoaglin (1993), z = 0.6745 (x - median) / MAD, flagged
# beyond 3.5; when MAD is 0 (most peers identical) the mean absolute deviation stands in, scaled by
# 1.2533 (its ratio to sigma under normality). A difference must also matter in practice:
OUTLIER_Z = 3.5
MIN_PEERS = 3  # including the candidate: fewer cannot tell an outlier from a split
THROUGHPUT_MIN_REL_DIFF = 0.20  # 20 % of the peers' median tokens/s
FRAGMENTATION_MIN_ABS_DIFF = 0.05  # 5 points of reserved memory (seeds: 5 % healthy -> 35 %)

UNLABELLED = "(unlabelled)"
_ENGINE_PREFIXES = ("vllm:", "sglang:")


@dataclass(frozen=True, order=True)
class TargetId:
    """Who a series belongs to: a pod (namespace, pod), an instance, or nothing."""

    kind: str  # "pod" | "instance" | "host" | "none"
    namespace: str | None
    name: str

    def __str__(self) -> str:
        if self.kind == "pod":
            return f"{self.namespace}/{self.name}" if self.namespace else self.name
        return self.name


def pod_of(labels: Mapping[str, str] | tuple) -> tuple[str | None, str | None]:
    """(namespace, pod) of a series by rule 1, or (None, None)."""
    d = dict(labels) if not isinstance(labels, Mapping) else labels
    if d.get("exported_pod"):
        return d.get("exported_namespace") or d.get("namespace"), d["exported_pod"]
    if d.get("pod"):
        return d.get("namespace"), d["pod"]
    if d.get("pod_name"):
        return d.get("pod_namespace") or d.get("namespace"), d["pod_name"]
    return None, None


def _host(instance: str) -> str:
    if instance.startswith("["):  # [::1]:9090
        return instance.split("]")[0] + "]"
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def group_targets(cols: Mapping[SeriesKey, tuple[np.ndarray, np.ndarray]]) -> dict[TargetId, dict[SeriesKey, tuple]]:
    """Assign every series to a target (rules in the module docstring)."""
    out: dict[TargetId, dict[SeriesKey, tuple]] = {}
    no_pod: list[tuple[SeriesKey, str | None]] = []
    for key, col in cols.items():
        labels = dict(key.labels)
        ns, pod = pod_of(labels)
        if pod:
            out.setdefault(TargetId("pod", ns, pod), {})[key] = col
        else:
            no_pod.append((key, labels.get("instance")))
    if no_pod:
        engines_per_host: dict[str, set[str]] = {}
        for key, inst in no_pod:
            if inst and key.name.startswith(_ENGINE_PREFIXES):
                engines_per_host.setdefault(_host(inst), set()).add(inst)
        for key, inst in no_pod:
            if not inst:
                tid = TargetId("none", None, UNLABELLED)
            elif len(engines_per_host.get(_host(inst), ())) > 1:
                tid = TargetId("instance", None, inst)
            else:
                tid = TargetId("host", None, _host(inst))
            out.setdefault(tid, {})[key] = cols[key]
    return out


# ---------------------------------------------------------------------------------------------
def present_signals(names: Iterable[str]) -> set[str]:
    """Canonical signal ids with at least one raw series among ``names``."""
    names = set(names)
    have = set()
    for sig in SIGNALS.values():
        for src in sig.sources:
            raw = src.metric
            if raw in names or (sig.kind == "histogram" and raw + "_bucket" in names):
                have.add(sig.id)
                break
    return have


def counter_increase(ts: np.ndarray, vs: np.ndarray) -> float:
    """Increase of a cumulative counter, resets (a drop) counted from zero as Prometheus does."""
    if vs.size < 2:
        return 0.0
    d = np.diff(vs)
    return float(np.where(d >= 0, d, vs[1:]).sum())


def _recent(ts: np.ndarray, vs: np.ndarray, end: float, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    lo = np.searchsorted(ts, end - seconds, side="left")
    return ts[lo:], vs[lo:]


def throughput(window: Window, seconds: float = RECENT_SECONDS) -> float | None:
    """Generated tokens per second over the last ``seconds`` of the window (all engines summed)."""
    total, have = 0.0, False
    for src in SIGNALS["generation_tokens_total"].sources:
        for s in window.select(src.metric):
            ts, vs = _recent(s.ts, s.values, window.end, seconds)
            if ts.size >= 2 and ts[-1] > ts[0]:
                total += counter_increase(ts, vs) / (ts[-1] - ts[0])
                have = True
        if have:
            break
    return total if have else None


def fragmentation(window: Window, seconds: float = RECENT_SECONDS) -> float | None:
    """Largest share of allocator-reserved memory not allocated, over GPUs, recent mean (0-1)."""
    per_gpu: dict[str, list[float]] = {}
    for name, idx in (("fragscope_torch_reserved_bytes", 0), ("fragscope_torch_allocated_bytes", 1)):
        for s in window.select(name):
            ts, vs = _recent(s.ts, s.values, window.end, seconds)
            if ts.size:
                acc = per_gpu.setdefault(s.key.label("gpu", "?"), [0.0, 0.0, 0, 0])
                acc[idx] += float(vs.mean())
                acc[2 + idx] += 1
    ratios = [1.0 - a / r for r, a, nr, na in per_gpu.values() if nr and na and r > 0]
    if ratios:
        return max(0.0, max(ratios))
    vals = []
    for s in window.select("fragscope_torch_fragmentation_ratio"):
        ts, vs = _recent(s.ts, s.values, window.end, seconds)
        if ts.size:
            vals.append(float(vs.mean()))
    return max(vals) if vals else None


def model_of(window: Window) -> str | None:
    for k in window.series:
        if k.name.startswith(_ENGINE_PREFIXES):
            m = k.label("model_name")
            if m:
                return m
    return None


# ---------------------------------------------------------------------------------------------
@dataclass
class Outlier:
    target: str
    model: str
    metric: str  # "throughput_tokens_per_second" | "fragmentation_ratio"
    value: float
    peer_median: float
    robust_z: float
    direction: str  # "low" | "high"
    peers: int

    def to_dict(self) -> dict:
        return {"target": self.target, "model": self.model, "metric": self.metric,
                "value": _r(self.value), "peer_median": _r(self.peer_median),
                "robust_z": round(self.robust_z, 2), "direction": self.direction, "peers": self.peers}


def robust_z(values: np.ndarray) -> np.ndarray | None:
    """Modified z-scores (MAD, falling back to mean absolute deviation); None when all are equal."""
    med = float(np.median(values))
    dev = np.abs(values - med)
    mad = float(np.median(dev))
    if mad > 0:
        return 0.6745 * (values - med) / mad
    mean_ad = float(dev.mean())
    if mean_ad > 0:
        return (values - med) / (1.253314 * mean_ad)
    return None


def find_outliers(targets: list["FleetTarget"]) -> list[Outlier]:
    """Targets whose throughput or fragmentation differs from peers serving the same model."""
    by_model: dict[str, list[FleetTarget]] = {}
    for t in targets:
        if t.model:
            by_model.setdefault(t.model, []).append(t)
    out = []
    for model, group in sorted(by_model.items()):
        for metric, attr, low_is_bad in (("throughput_tokens_per_second", "throughput", True),
                                         ("fragmentation_ratio", "fragmentation", False)):
            members = [t for t in group if getattr(t, attr) is not None]
            if len(members) < MIN_PEERS:
                continue
            vals = np.array([getattr(t, attr) for t in members], dtype=float)
            z = robust_z(vals)
            if z is None:
                continue
            med = float(np.median(vals))
            for t, v, zi in zip(members, vals, z):
                if abs(zi) <= OUTLIER_Z:
                    continue
                if metric.startswith("throughput") and abs(v - med) < THROUGHPUT_MIN_REL_DIFF * abs(med):
                    continue
                if metric.startswith("fragmentation") and abs(v - med) < FRAGMENTATION_MIN_ABS_DIFF:
                    continue
                out.append(Outlier(str(t.id), model, metric, float(v), med, float(zi),
                                   "low" if zi < 0 else "high", len(members)))
    return out


# ---------------------------------------------------------------------------------------------
@dataclass
class FleetTarget:
    id: TargetId
    window: Window | None  # dropped after diagnosis when streaming (triage mode); None if not examined
    report: Report | None = None
    error: str | None = None  # the detectors failed on this target (one line)
    model: str | None = None
    throughput: float | None = None
    fragmentation: float | None = None
    missing_signals: list[str] | None = field(default_factory=list)  # None: not examined
    series_count: int | None = None  # series deep-fetched (None: not examined)
    flags: list = field(default_factory=list)  # triage.Flag, the level checks this target tripped
    examined: str | None = "deep"  # why deep-fetched: flagged | outlier | peer-sample | whole-fleet | deep; None: not

    @property
    def top(self):
        if self.report is None or not self.report.findings:
            return None
        return rank_findings(self.report.findings)[0]

    @property
    def status(self) -> str:
        if self.error:
            return "error"
        if self.examined is None:
            return "flagged" if self.flags else "triage-clear"
        if self.top is not None:
            return "finding"
        if self.report is not None and self.report.inconclusive:
            return "inconclusive"
        return "no-finding"

    def to_dict(self) -> dict:
        top = self.top
        return {
            "target": str(self.id),
            "kind": self.id.kind,
            "namespace": self.id.namespace,
            "pod": self.id.name if self.id.kind == "pod" else None,
            "instance": self.id.name if self.id.kind in ("instance", "host") else None,
            "model": self.model,
            "status": self.status,
            "top_finding": None if top is None else {
                "id": top.id, "severity": top.severity.value, "confidence": round(float(top.confidence), 3),
                "onset": top.onset, "summary": top.summary},
            "throughput_tokens_per_second": _r(self.throughput),
            "fragmentation_ratio": _r(self.fragmentation),
            "series": self.series_count if self.series_count is not None else (
                len(self.window) if self.window is not None else None),
            "missing_signals": None if self.missing_signals is None else list(self.missing_signals),
            "error": self.error,
            "triage": {"flagged": bool(self.flags), "checks": [f.to_dict() for f in self.flags],
                       "examined": self.examined},
            "report": self.report.to_dict() if self.report is not None else None,
        }


@dataclass
class FleetReport:
    source: str
    window: tuple[float, float]
    selector: str | None
    mode: str
    step: float | None
    targets: list[FleetTarget]
    outliers: list[Outlier]
    queries: int
    fetch_seconds: float
    diagnose_seconds: float
    series: int
    missing_everywhere: list[str]
    notes: list[str] = field(default_factory=list)
    triage: dict | None = None  # fleet.triage (docs/fleet.md#triage); {"mode": "off"} on the full download

    def ordered(self) -> list[FleetTarget]:
        """Worst first: top severity, then flagged by the triage, then confidence, then name."""
        def key(t: FleetTarget):
            top = t.top
            return (-(top.severity.rank if top else -1), not t.flags, -(top.confidence if top else 0), str(t.id))
        return sorted(self.targets, key=key)

    def to_dict(self) -> dict:
        return {
            "fleet": {
                "source": self.source,
                "window": {"start": self.window[0], "end": self.window[1]},
                "selector": self.selector,
                "mode": self.mode,
                "step": self.step,
                "queries": self.queries,
                "fetch_seconds": round(self.fetch_seconds, 3),
                "diagnose_seconds": round(self.diagnose_seconds, 3),
                "series": self.series,
                "targets": len(self.targets),
                "missing_everywhere": list(self.missing_everywhere),
                "notes": list(self.notes),
                "triage": self.triage if self.triage is not None else {"mode": "off"},
            },
            "targets": [t.to_dict() for t in self.ordered()],
            "outliers": [o.to_dict() for o in self.outliers],
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


def build_targets(cols: Mapping[SeriesKey, tuple[np.ndarray, np.ndarray]], types: Mapping[str, str],
                  source: str = "") -> list[FleetTarget]:
    """Group fetched columns into targets, each with its Window (no diagnosis yet)."""
    res = []
    for tid, tcols in sorted(group_targets(cols).items()):
        w = Window.from_columns(tcols, source=f"{source} {tid}".strip(), types=types)
        if not len(w):
            continue
        have = present_signals(w.names())
        t = FleetTarget(tid, w, model=model_of(w), throughput=throughput(w), fragmentation=fragmentation(w),
                        missing_signals=[s for s in CORE_SIGNALS if s not in have])
        res.append(t)
    return res


def diagnose_targets(targets: list[FleetTarget], diagnose: Callable[[Window], Report] | None = None) -> float:
    """Run the detectors on each target; a failure is kept on its target, never stops the fleet."""
    if diagnose is None:
        from ..pipeline import diagnose as diagnose  # noqa: PLC0415
    t0 = time.perf_counter()
    for t in targets:
        try:
            t.report = diagnose(t.window)
        except Exception as e:  # one pod's odd data must not hide the rest of the fleet
            t.error = f"detectors failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return time.perf_counter() - t0


def diagnose_fleet_full(client, start: float, end: float, selector: str | None = None, step: float | None = None,
                        diagnose: Callable[[Window], Report] | None = None) -> FleetReport:
    """The full download (``--triage off``): every series of every target in 7 batched requests, then
    group, diagnose and compare. Raises PrometheusError (one line) when nothing matches."""
    from ..collectors.prometheus import PrometheusError, fetch  # noqa: PLC0415

    fr = fetch(client, start, end, selector=selector, step=step)
    if not fr.cols:
        sel = f" matching {selector}" if selector else ""
        raise PrometheusError(
            f"Prometheus at {client.base}: no vLLM, GPU or fragscope series{sel} between "
            f"{_iso(start)} and {_iso(end)}; check --selector and --since/--start/--end")
    targets = build_targets(fr.cols, fr.types, source=client.base)
    dsec = diagnose_targets(targets, diagnose)
    everywhere = set(CORE_SIGNALS)
    for t in targets:
        everywhere &= set(t.missing_signals)
    notes = list(fr.notes)
    notes += _gpu_only_note(targets)
    return FleetReport(client.base, (start, end), selector, fr.mode, fr.step, targets, find_outliers(targets),
                       fr.queries, fr.seconds, dsec, len(fr.cols), [s for s in CORE_SIGNALS if s in everywhere],
                       notes, {"mode": "off"})


def _gpu_only_note(targets: list[FleetTarget]) -> list[str]:
    gpu_only = [str(t.id) for t in targets if t.model is None and not t.missing_signals.count("gpu_memory_used_bytes")]
    if gpu_only and any(t.model for t in targets):
        return [f"{len(gpu_only)} target(s) have GPU or probe series but no serving-engine series "
                     f"({', '.join(gpu_only[:5])}{', ...' if len(gpu_only) > 5 else ''}): is dcgm-exporter's "
                     "Kubernetes pod mapping on?"]
    return []


# ---------------------------------------------------------------------------------------------
# Triage first, then deep fetch only for the flagged targets (docs/fleet.md#triage)
PEER_SAMPLE = 3  # healthy targets deep-diagnosed beside the flagged ones, as a check on the triage
DEEP_LIMIT = 100  # at most this many targets deep-fetched (flagged first); the rest keep their triage
TRIAGE_MODES = ("auto", "rules", "queries", "off")


def triage_target_id(labels: Mapping[str, str]) -> TargetId:
    """The target a triage answer's (namespace, pod, instance) names (grouping rules 1-3)."""
    if labels.get("pod"):
        return TargetId("pod", labels.get("namespace") or None, labels["pod"])
    if labels.get("instance"):
        return TargetId("host", None, _host(labels["instance"]))
    return TargetId("none", None, UNLABELLED)


def target_matchers(tid: TargetId) -> list[tuple[str, str, str]]:
    """Label matchers that select one target's series (merged with the user's selector)."""
    from .triage import rx_escape  # noqa: PLC0415

    if tid.kind == "pod":
        return ([("namespace", "=", tid.namespace)] if tid.namespace else []) + [("pod", "=", tid.name)]
    if tid.kind == "instance":
        return [("instance", "=", tid.name), ("pod", "=", ""), ("exported_pod", "=", "")]
    if tid.kind == "host":
        return [("instance", "=~", rx_escape(tid.name) + "(:[0-9]+)?"), ("pod", "=", ""), ("exported_pod", "=", "")]
    return [("instance", "=", ""), ("pod", "=", ""), ("exported_pod", "=", "")]


def sample_peers(healthy: list[TargetId], n: int) -> list[TargetId]:
    """``n`` targets spread evenly over the sorted healthy ones (deterministic)."""
    healthy = sorted(healthy)
    if n <= 0 or not healthy:
        return []
    if len(healthy) <= n:
        return healthy
    return [healthy[int(i * len(healthy) / n)] for i in range(n)]


def diagnose_fleet(client, start: float, end: float, selector: str | None = None, step: float | None = None,
                   diagnose: Callable[[Window], Report] | None = None, triage: str = "auto",
                   peers: int = PEER_SAMPLE, deep_limit: int = DEEP_LIMIT,
                   progress: Callable[[int, int, str], None] | None = None) -> FleetReport:
    """Triage the fleet in PromQL, then fetch and diagnose the flagged targets one at a time.

    ``triage`` is auto (recorded triage rules when they cover the window, else queries), rules,
    queries, or off (the full download of every series: :func:`diagnose_fleet_full`).
    Memory holds one target's series at a time; the report keeps each target's report, not its data.
    """
    if triage == "off":
        return diagnose_fleet_full(client, start, end, selector=selector, step=step, diagnose=diagnose)
    from ..collectors.prometheus import Batch, PrometheusError, fetch, parse_selector, signal_batches  # noqa: PLC0415
    from . import triage as tri  # noqa: PLC0415

    if diagnose is None:
        from ..pipeline import diagnose as diagnose  # noqa: PLC0415
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PrometheusError(f"empty time window: start {start} is not before end {end}")
    user = parse_selector(selector) if isinstance(selector, str) else list(selector or [])
    q0 = client.queries
    tr = tri.run_triage(client, start, end, user, mode=triage)
    # triage answers -> targets (several keys can name one host target)
    light: dict[TargetId, FleetTarget] = {}
    for key, tt in tr.targets.items():
        tid = triage_target_id(tt.labels)
        t = light.get(tid)
        if t is None:
            t = light[tid] = FleetTarget(tid, None, missing_signals=None, examined=None)
        t.flags.extend(tt.flags)
        t.model = t.model or tt.model
        if tt.throughput is not None:
            t.throughput = (t.throughput or 0.0) + tt.throughput
        if tt.fragmentation is not None:
            t.fragmentation = tt.fragmentation if t.fragmentation is None else max(t.fragmentation, tt.fragmentation)
    if not light:
        sel = f" matching {selector}" if selector else ""
        raise PrometheusError(
            f"Prometheus at {client.base}: no vLLM, GPU or fragscope series{sel} between "
            f"{_iso(start)} and {_iso(end)}; check --selector and --since/--start/--end")
    targets = list(light.values())
    outliers = find_outliers(targets)
    flagged = sorted(t.id for t in targets if t.flags)
    odd = sorted({light_id for o in outliers for light_id in light if str(light_id) == o.target} - set(flagged))
    healthy = [t.id for t in targets if not t.flags and t.id not in odd]
    sampled = sample_peers(healthy, peers)
    plan = [(tid, "flagged") for tid in flagged] + [(tid, "outlier") for tid in odd] + \
        [(tid, "peer-sample") for tid in sampled]
    if len(targets) <= len(plan) or len(targets) <= peers:
        plan = [(t, "flagged" if light[t].flags else "whole-fleet") for t in sorted(light)]
    skipped = plan[deep_limit:]
    plan = plan[:deep_limit]
    notes = list(tr.notes)
    if skipped:
        notes.append(f"{len(skipped)} flagged or outlying target(s) beyond --deep-limit {deep_limit} were not "
                     f"deep-diagnosed; their triage values are listed (status 'flagged')")

    fetch_s = diag_s = 0.0
    series = 0
    mode, fstep = "raw", step
    done: set[TargetId] = set()
    # one request per target (plus the exported_ variant for DCGM): a pod's series are a few MB
    (one_batch,) = [Batch(tuple(sorted(n for b in signal_batches() for n in b.names)),
                          {n: k for b in signal_batches() for n, k in b.types.items()})]

    def deep(tid: TargetId):
        return fetch(client, start, end, selector=user + target_matchers(tid), step=step, batches=[one_batch])

    # stream: fetch the next target while the detectors run on this one (two targets in memory at most)
    order = [tid for tid, _ in plan]
    why_of = dict(plan)
    with ThreadPoolExecutor(max_workers=1) as ex:
        nxt = ex.submit(deep, order[0]) if order else None
        for i, tid in enumerate(order):
            if progress is not None:
                progress(i, len(order), str(tid))  # the CLI's bar: targets deep-fetched so far
            fr = nxt.result()
            nxt = ex.submit(deep, order[i + 1]) if i + 1 < len(order) else None
            why = why_of[tid]
            if tid in done:
                continue
            fetch_s += fr.seconds
            mode, fstep = fr.mode, fr.step
            for n in fr.notes:
                if n not in notes:
                    notes.append(n)
            built = build_targets(fr.cols, fr.types, source=client.base)
            series += len(fr.cols)
            del fr
            same = [b for b in built if b.id == tid or (tid.kind == "host" and b.id.kind == "instance"
                                                        and _host(b.id.name) == tid.name)]
            if same and not any(b.id == tid for b in same) and light[tid] in targets:
                # the host runs several engines: each instance is its own target (rule 2)
                for b in same:
                    nt = light.setdefault(b.id, FleetTarget(b.id, None, missing_signals=None, examined=None))
                    nt.flags = nt.flags or list(light[tid].flags)
                targets.remove(light[tid])
            if not same:
                lt = light[tid]
                lt.examined = why
                lt.series_count = 0
                lt.missing_signals = list(CORE_SIGNALS)
                lt.error = "triage named this target but the deep fetch found none of its series"
                done.add(tid)
                continue
            for b in built:
                if b.id in done:
                    continue
                d0 = time.perf_counter()
                diagnose_targets([b], diagnose)
                diag_s += time.perf_counter() - d0
                lt = light.get(b.id)
                if lt is None:  # a target the triage keyed differently (an engine instance of a host)
                    lt = light[b.id] = FleetTarget(b.id, None, missing_signals=None, examined=None)
                    targets.append(lt)
                lt.report, lt.error, lt.examined = b.report, b.error, why
                lt.model = b.model or lt.model
                lt.missing_signals = b.missing_signals
                lt.series_count = len(b.window)
                if lt.throughput is None:
                    lt.throughput = b.throughput
                if lt.fragmentation is None:
                    lt.fragmentation = b.fragmentation
                done.add(b.id)
                b.window = None  # stream: keep the report, not the data
    examined = [t for t in targets if t.examined is not None]
    everywhere = set(CORE_SIGNALS)
    for t in examined:
        everywhere &= set(t.missing_signals or ())
    missed = [f"{t.id} ({t.top.id})" for t in examined if t.examined == "peer-sample" and t.top is not None]
    if missed:
        notes.append(f"sampled healthy peer(s) have findings the triage did not flag: {', '.join(missed)}; the "
                     "triage checks levels only (see fleet.triage.unchecked), rerun with --triage off for a full "
                     "diagnosis")
    notes += _gpu_only_note([t for t in examined if t.missing_signals is not None])
    info = {"mode": tr.mode, "queries": tr.queries, "seconds": round(tr.seconds, 3),
            "checks": list(tri.CHECK_IDS), "unchecked": list(tri.UNCHECKED),
            "fleet_targets": len(targets), "flagged": len(flagged), "outliers": len(odd),
            "peers_sampled": sum(1 for _, w in plan if w == "peer-sample"),
            "examined": len(examined), "not_examined": len(targets) - len(examined)}
    return FleetReport(client.base, (start, end), selector, mode, fstep, targets, outliers,
                       client.queries - q0, fetch_s, diag_s, series,
                       [s for s in CORE_SIGNALS if s in everywhere] if examined else [], notes, info)
