"""The canonical view detectors read: every signal resampled onto one time grid, in base units.

A Window holds raw series (vLLM V0 or V1 names, fragscope or DCGM GPU names, several engines,
pids and GPUs). A Frame resolves the aliases of fragscope/signals.py, converts units, turns
counters into reset-aware rates, histograms into rolling quantiles, and groups GPU signals by GPU.
NaN marks "no data at this time": absent is never zero. Sampling: :mod:`.frame_sampling`;
histograms: :mod:`.frame_histograms`; dcgm-exporter throttle reasons: :mod:`.frame_dcgm`.
"""
from __future__ import annotations

import math
import numpy as np

from ..collectors.engines import derive
from ..model import Series, Window
from ..signals import DCGM_FB_RESERVED, GPU_SCOPE, SIGNALS, TARGET_SCOPES, VLLM_RUNNING, VLLM_V0_KV, VLLM_V1_KV
from .frame_model import SLOWDOWN_REASONS, THERMAL_REASONS, Frame
from .frame_dcgm import NVML_REASON_BITS, dcgm_throttle
from .frame_histograms import fill_histogram, histogram_quantile
from .frame_sampling import (Agg, counter_span, dedupe_times, gauge_span, gpu_id, series_interval_seconds, last_total,
                             sample_gauge, counter_increases)

__all__ = ["Frame", "build_frame", "counter_increases", "histogram_quantile", "NVML_REASON_BITS",
           "SLOWDOWN_REASONS", "THERMAL_REASONS"]

# Prometheus' default lookback for instant vectors is 5 min; we use a tighter one tied to the
# scrape interval so a dead source shows as a gap, not as a flat line.
_LOOKBACK_STEPS = 3.0
_SPARSE_LOOKBACK_S = 20 * 60.0  # kernel-gap captures every ~10 min
_RATE_WINDOW_S = 120.0  # like rate(x[2m]) at a 15 s scrape interval
_MAX_POINTS = 20000

# ---------------------------------------------------------------------------------------------
_ENGINE_AGG = {
    "requests_running": "sum",
    "requests_waiting": "sum",
    "kv_cache_usage_ratio": "max",
    # one cgroup per pod, or several containers (cAdvisor): the fullest one, not a sum
    "container_cpu_quota_cores": "max",
    "container_memory_working_set_bytes": "max",
    "container_memory_limit_bytes": "max",
    "container_memory_swap_bytes": "max",
    "host_memory_available_bytes": "min",
    "host_memory_total_bytes": "max",
}
# per-process gauges kept raw, per pid, beside their engine-wide sum (Frame.process_raw)
PER_PROCESS_RAW = ("process_stopped_processes",)
_GPU_AGG = {  # several pids or exporters on one GPU
    "torch_allocated_bytes": "sum",
    "torch_reserved_bytes": "sum",
    "torch_inactive_split_bytes": "sum",
}


def _pick_source(window: Window, sig_id: str, by_name: dict[str, list[Series]]
                 ) -> tuple[str | None, float, list[Series]]:
    sig = SIGNALS[sig_id]
    for src in sig.sources:
        if sig.kind == "histogram":
            ser = by_name.get(src.metric + "_bucket", [])
        else:
            ser = by_name.get(src.metric, [])
        if ser:
            return src.metric, src.scale, ser
    return None, 1.0, []


def _last_change(series: list[Series]) -> tuple[float, int]:
    """The newest raw sample time at which any of ``series`` differed from its previous sample (NaN: none
    moved in the window), and the fewest samples any series took since its own last change (how many
    scrapes confirm it stood still). Raw times, not the grid's: what a stall is measured from."""
    best, flat = math.nan, None
    for s in series:
        v = np.asarray(s.values)
        if v.size < 2:
            continue
        idx = np.flatnonzero(v[1:] != v[:-1])
        n_after = int(v.size - 2 - idx[-1]) if idx.size else int(v.size - 1)
        flat = n_after if flat is None else min(flat, n_after)
        if idx.size:
            t = float(s.ts[idx[-1] + 1])
            best = t if not math.isfinite(best) else max(best, t)
    return best, (flat if flat is not None else 0)


def _per_pid(series: list[Series], scale: float) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """pid -> (its newest name, raw times, raw values): a pid's series under several names (a process that
    renamed itself) merged in time order."""
    by: dict[str, list[Series]] = {}
    for s in series:
        labels = dict(s.key.labels)
        by.setdefault(labels.get("pid", ""), []).append(s)
    out = {}
    for pid, ss in by.items():
        ts = np.concatenate([np.asarray(s.ts, dtype=np.float64) for s in ss])
        vs = np.concatenate([np.asarray(s.values, dtype=np.float64) for s in ss]) * scale
        order = np.argsort(ts, kind="stable")
        newest = max((s for s in ss if len(s)), key=lambda s: float(s.ts[-1]), default=ss[0])
        out[pid] = (dict(newest.key.labels).get("name", ""), ts[order], vs[order])
    return out


def build_frame(window: Window) -> Frame:
    window = derive(window)  # engine adapters' derived series (TensorRT-LLM KV usage, SGLang per-rank merge)
    by_name: dict[str, list[Series]] = {}
    for s in window:
        by_name.setdefault(s.name, []).append(s)

    # Grid step: the scrape interval of the engine/GPU series.
    dense = [s for n, ss in by_name.items() if not n.startswith("fragscope_kernel") and
             not n.endswith("_bucket") for s in ss if len(s) >= 2]
    interval = series_interval_seconds(dense) or 15.0
    interval = max(interval, 0.5)
    span = (window.end - window.start) if math.isfinite(window.start) else 0.0
    step = max(interval, span / _MAX_POINTS if span > 0 else interval)
    n = int(span // step) + 1 if span > 0 else 1
    grid = window.start + step * np.arange(n, dtype=np.float64)
    lookback = _LOOKBACK_STEPS * step + 1e-6
    w = max(1, int(round(_RATE_WINDOW_S / step)))
    if step >= _RATE_WINDOW_S:
        w = 1
    f = Frame(t=grid, step=step, scrape_interval=interval)

    for sig_id, sig in SIGNALS.items():
        metric, scale, series = _pick_source(window, sig_id, by_name)
        if metric is None:
            continue
        f.sources[sig_id] = metric
        f.last_seen[sig_id] = max((float(s.ts[-1]) for s in series if len(s)), default=math.nan)
        if sig.kind == "counter":
            f.last_change[sig_id], f.flat_samples[sig_id] = _last_change(series)
        if sig.kind == "info":
            for s in series:
                f.config.update({k: v for k, v in s.key.labels})
            continue
        if sig.kind == "histogram":
            fill_histogram(f, sig_id, metric, by_name, grid, lookback, w)
            continue
        if sig.scope in TARGET_SCOPES:  # one value per target (engine-wide)
            if sig.kind == "counter":
                rates, cums = Agg(grid.size, "sum"), Agg(grid.size, "sum")
                for s in series:
                    lo, r, c, resets = counter_span(s, grid, lookback, w)
                    rates.add(lo, r * scale)
                    cums.add(lo, c * scale)
                    f.restarts.extend(float(x) for x in resets)
                f.engine[sig_id] = rates.result()
                f.engine_cum[sig_id] = cums.result()
                f.engine_total[sig_id] = last_total(series, scale)
            else:
                agg = Agg(grid.size, _ENGINE_AGG.get(sig_id, "sum"))
                for s in series:
                    lo, v = gauge_span(s, grid, lookback)
                    agg.add(lo, v * scale)
                f.engine[sig_id] = agg.result()
                if sig_id in PER_PROCESS_RAW:
                    f.process_raw[sig_id] = _per_pid(series, scale)
            continue
        if sig.scope != GPU_SCOPE:  # signals.py refuses other scopes at import: never filed under a GPU by default
            raise ValueError(f"signal {sig_id}: scope {sig.scope!r} has no place in the frame")
        # GPU-scope signals
        if sig_id == "gpu_throttle_reason_active":
            for s in series:
                g = gpu_id(s)
                reason = s.key.label("reason") or "unknown"
                f.throttle.setdefault(g, {})[reason] = sample_gauge(s, grid, lookback)
            continue
        if sig_id == "kernel_gap_seconds":
            for s in series:
                q = s.key.label("quantile")
                if q is None:
                    continue
                name = {"0.5": "kernel_gap_p50_seconds", "0.99": "kernel_gap_p99_seconds"}.get(q)
                if name is None:
                    try:
                        qf = float(q)
                    except ValueError:
                        continue
                    name = "kernel_gap_p50_seconds" if abs(qf - 0.5) < 1e-9 else (
                        "kernel_gap_p99_seconds" if abs(qf - 0.99) < 1e-9 else None)
                    if name is None:
                        continue
                f.gpu.setdefault(gpu_id(s), {})[name] = sample_gauge(s, grid, _SPARSE_LOOKBACK_S)
            continue
        per_gpu: dict[str, Agg] = {}
        per_gpu_cum: dict[str, Agg] = {}
        sparse = sig_id == "gpu_idle_ratio"
        for s in series:
            g = gpu_id(s)
            if g not in per_gpu:
                per_gpu[g] = Agg(grid.size, "sum" if sig.kind == "counter" else _GPU_AGG.get(sig_id, "mean"))
            if sig.kind == "counter":
                lo, r, c, _ = counter_span(s, grid, lookback, w)
                per_gpu[g].add(lo, r * scale)
                per_gpu_cum.setdefault(g, Agg(grid.size, "sum")).add(lo, c * scale)
            else:
                lo, v = gauge_span(s, grid, _SPARSE_LOOKBACK_S if sparse else lookback)
                per_gpu[g].add(lo, v * scale)
        for g, agg in per_gpu.items():
            f.gpu.setdefault(g, {})[sig_id] = agg.result()
        for g, agg in per_gpu_cum.items():
            f.gpu_cum.setdefault(g, {})[sig_id] = agg.result()
            f.gpu_total.setdefault(g, {})[sig_id] = last_total([s for s in series if gpu_id(s) == g], scale)

    dcgm_throttle(f, by_name, grid, lookback, w)

    # dcgm-exporter has no FB_TOTAL by default: total = used + free (+ reserved).
    for g, sigs in f.gpu.items():
        if "gpu_memory_total_bytes" not in sigs and "gpu_memory_used_bytes" in sigs \
                and "gpu_memory_free_bytes" in sigs:
            total = sigs["gpu_memory_used_bytes"] + sigs["gpu_memory_free_bytes"]
            res = [s for s in by_name.get(DCGM_FB_RESERVED, []) if gpu_id(s) == g]
            if res:
                total = total + sample_gauge(res[0], grid, lookback) * 1024.0 * 1024.0
            sigs["gpu_memory_total_bytes"] = total
        # derived allocator ratios
        if "torch_reserved_bytes" in sigs and "torch_allocated_bytes" in sigs:
            r = sigs["torch_reserved_bytes"]
            a = sigs["torch_allocated_bytes"]
            with np.errstate(invalid="ignore", divide="ignore"):
                sigs["torch_fragmentation_ratio"] = np.where(r > 0, np.clip((r - a) / r, 0.0, 1.0), np.nan)
                if "torch_inactive_split_bytes" in sigs:
                    sigs["torch_inactive_split_ratio"] = np.where(
                        r > 0, np.clip(sigs["torch_inactive_split_bytes"] / r, 0.0, 1.0), np.nan)

    f.restarts = dedupe_times(f.restarts, tol=max(60.0, 4 * step))
    f.rates_known = window.timestamps != "none" or window.scrape_interval_known
    for ss in by_name.values():
        for s in ss:
            if s.key.labels and any(k == "modelName" for k, _ in s.key.labels):
                f.gpu_model.setdefault(gpu_id(s), s.key.label("modelName"))
            f.points = max(f.points, min(3, len(s)))
    if VLLM_V1_KV in by_name or any(
            s.key.label("engine") is not None for s in by_name.get(VLLM_RUNNING, [])):
        f.engine_generation = "v1"
    elif VLLM_V0_KV in by_name:
        f.engine_generation = "v0"
    return f

