"""Run-time evidence for sizing, as one plain dict of peaks (docs/sizing.md#runtime).

Pure: arrays or a :class:`~fragscope.detectors.frame.Frame` in, a dict out. NaN is "no data at this
time" and is skipped; a key is absent (not 0) when no finite value backs it.

Keys (all optional): ``device_total_bytes``, ``device_used_peak_bytes`` (NVML, whole device),
``process_used_peak_bytes`` (this engine's processes), ``other_processes_peak_bytes``,
``torch_reserved_peak_bytes``, ``torch_allocated_peak_bytes`` (probe), ``kv_usage_peak_ratio``,
``preemptions_total``, ``preemptions_by_reason`` ({reason: count}), ``running_peak``, ``waiting_peak``,
``concurrent_demand_peak`` (max of running + waiting), ``seq_len_mean_tokens``, ``seq_len_p95_tokens``.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def _arr(x) -> np.ndarray | None:
    if x is None:
        return None
    a = np.asarray(x, dtype=float).ravel()
    a = a[np.isfinite(a)]
    return a if a.size else None


def _peak(x) -> float | None:
    a = _arr(x)
    return float(a.max()) if a is not None else None


def _increase(counter) -> float | None:
    """Total increase of a cumulative counter, reset-aware (a drop starts a new run from 0)."""
    a = _arr(counter)
    if a is None:
        return None
    d = np.diff(a)
    return float(np.where(d >= 0, d, a[1:]).sum()) if a.size > 1 else 0.0


def summarize_runtime(*, device_total_bytes=None, device_used_bytes=None, process_used_bytes=None,
                      other_processes_bytes=None, torch_reserved_bytes=None, torch_allocated_bytes=None,
                      kv_usage_ratio=None, preemptions_total=None,
                      preemptions_by_reason: Mapping[str, Sequence[float]] | None = None,
                      running=None, waiting=None, seq_lens=None, seq_len_mean_tokens: float | None = None,
                      seq_len_p95_tokens: float | None = None) -> dict:
    """Peaks over a window from per-sample arrays (gauges as levels, counters as cumulative values)."""
    out: dict = {}
    for key, val in (("device_total_bytes", _peak(device_total_bytes)),
                     ("device_used_peak_bytes", _peak(device_used_bytes)),
                     ("process_used_peak_bytes", _peak(process_used_bytes)),
                     ("other_processes_peak_bytes", _peak(other_processes_bytes)),
                     ("torch_reserved_peak_bytes", _peak(torch_reserved_bytes)),
                     ("torch_allocated_peak_bytes", _peak(torch_allocated_bytes)),
                     ("kv_usage_peak_ratio", _peak(kv_usage_ratio)),
                     ("preemptions_total", _increase(preemptions_total)),
                     ("running_peak", _peak(running)), ("waiting_peak", _peak(waiting))):
        if val is not None:
            out[key] = val
    if preemptions_by_reason:
        reasons = {k: _increase(v) for k, v in preemptions_by_reason.items()}
        reasons = {k: v for k, v in reasons.items() if v is not None}
        if reasons:
            out["preemptions_by_reason"] = reasons
            out.setdefault("preemptions_total", float(sum(reasons.values())))
    r = _arr(running)
    if running is not None and waiting is not None:
        ra = np.asarray(running, dtype=float).ravel()
        wa = np.asarray(waiting, dtype=float).ravel()
        if ra.shape == wa.shape:
            s = ra + wa
            s = s[np.isfinite(s)]
            if s.size:
                out["concurrent_demand_peak"] = float(s.max())
    elif r is not None:
        out["concurrent_demand_peak"] = float(r.max())
    lens = _arr(seq_lens)
    if lens is not None:
        out["seq_len_mean_tokens"] = float(lens.mean())
        out["seq_len_p95_tokens"] = float(np.percentile(lens, 95))
    if seq_len_mean_tokens is not None and math.isfinite(seq_len_mean_tokens):
        out.setdefault("seq_len_mean_tokens", float(seq_len_mean_tokens))
    if seq_len_p95_tokens is not None and math.isfinite(seq_len_p95_tokens):
        out.setdefault("seq_len_p95_tokens", float(seq_len_p95_tokens))
    if "device_total_bytes" in out and "device_used_peak_bytes" in out:
        out["device_free_at_peak_bytes"] = out["device_total_bytes"] - out["device_used_peak_bytes"]
    return out


def runtime_from_frame(frame, gpu: str | None = None, preemptions_by_reason: Mapping | None = None) -> dict:
    """The same dict from a detectors Frame (engine signals + one GPU's NVML and probe signals).

    ``gpu``: which GPU's memory to read (default: the one whose peak used memory is highest).
    ``preemptions_by_reason``: {reason: cumulative counts}; by default read from the frame's labelled
    counter (signals ``preemptions_by_reason_total`` and its ``reason="kv_full"`` part): ``kv_full`` and
    ``other`` (priority, prefix_cache_reset). One scrape (``frame.points == 1``) has no increase: the
    counters' lifetime totals since the engine started stand in.
    """
    e = frame.engine
    cum = dict(frame.engine_cum)
    if frame.points <= 1:  # one scrape: lifetime totals (what the engine counted since it started)
        cum = {k: np.array([0.0, v]) for k, v in frame.engine_total.items() if math.isfinite(v)}
    if preemptions_by_reason is None and "preemptions_by_reason_total" in frame.sources \
            and cum.get("preemptions_by_reason_total") is not None:
        every = np.asarray(cum["preemptions_by_reason_total"], dtype=float)
        kvf = cum.get("preemptions_kv_full_total")
        kvf = np.zeros_like(every) if kvf is None else np.asarray(kvf, dtype=float)  # labelled, no kv_full: 0
        preemptions_by_reason = {"kv_full": kvf, "priority or prefix_cache_reset": every - kvf}
    if gpu is None and frame.gpu:
        def peak_used(k: str) -> float:
            a = _arr(frame.gpu[k].get("gpu_memory_used_bytes"))
            return float(a.max()) if a is not None else -1.0

        gpu = max(frame.gpu, key=peak_used)
    gd = frame.gpu.get(gpu, {}) if gpu is not None else {}
    mean_len = None
    if "request_prompt_tokens" in frame.hist_avg and "request_generation_tokens" in frame.hist_avg:
        mean_len = frame.hist_avg["request_prompt_tokens"] + frame.hist_avg["request_generation_tokens"]
    return summarize_runtime(
        device_total_bytes=gd.get("gpu_memory_total_bytes"), device_used_bytes=gd.get("gpu_memory_used_bytes"),
        torch_reserved_bytes=gd.get("torch_reserved_bytes"), torch_allocated_bytes=gd.get("torch_allocated_bytes"),
        kv_usage_ratio=e.get("kv_cache_usage_ratio"),
        preemptions_total=cum.get("preemptions_total", cum.get("preemptions_by_reason_total")),
        preemptions_by_reason=preemptions_by_reason, running=e.get("requests_running"),
        waiting=e.get("requests_waiting"), seq_len_mean_tokens=mean_len)


def runtime_from_log_events(events, since_line: int = 0) -> dict:
    """The same dict from the engine log's own stats lines and preemption/retraction lines.

    ``events``: :class:`fragscope.collectors.enginelog.LogEvent` records (``parse_log``); only those after
    ``since_line`` (the last start-up) count. Preemption totals are folded by the collector's LogState (V0
    warnings every 50th, V1 "Preemptions: N" per interval, SGLang retractions). No NVML here: the log
    does not say how much of the GPU was free.
    """
    from ..collectors.enginelog import LogState

    state = LogState()
    kv, running, waiting = [], [], []
    for ev in events:
        if ev.line_no <= since_line:
            continue
        state.apply(ev)
        if ev.kind == "stats":
            f = ev.fields
            kv.append(f.get("kv_usage_ratio", math.nan))
            running.append(f.get("running", math.nan))
            waiting.append(f.get("waiting", math.nan))
    return summarize_runtime(kv_usage_ratio=kv or None, running=running or None, waiting=waiting or None,
                             preemptions_total=None if state.preemptions_total is None
                             else [0.0, float(state.preemptions_total)])


def preemptions_by_reason(window, names) -> dict[str, np.ndarray]:
    """{reason: [0, increase]} summed over engines from a labelled preemption counter (else {}).

    ``window``: a :class:`fragscope.model.Window`; ``names``: the counter's raw names (from signals.py, or
    the caller: signals.VLLM_PREEMPTIONS_BY_REASON), tried in order; recent vLLM labels its preemptions
    with ``reason``.
    """
    out: dict[str, float] = {}
    for name in names:
        for s in window.select(name):
            v = np.asarray(s.values, dtype=float)
            if v.size < 2:
                continue
            d = np.diff(v)
            inc = float(np.where(d >= 0, d, v[1:]).sum())  # a drop is a restart: count from 0 again
            reason = s.key.label("reason") or "unknown"
            out[reason] = out.get(reason, 0.0) + inc
        if out:
            break
    return {k: np.array([0.0, v]) for k, v in out.items()}
