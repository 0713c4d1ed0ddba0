"""The canonical view detectors read: every signal resampled onto one time grid, in base units.

A Window holds raw series (vLLM V0 or V1 names, fragscope or DCGM GPU names, several engines,
pids and GPUs). A Frame resolves the aliases of fragscope/signals.py, converts units, turns
counters into reset-aware rates, histograms into rolling quantiles, and groups GPU signals by GPU.
NaN marks "no data at this time": absent is never zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..collectors.engines import derive
from ..model import Series, Window
from ..signals import (DCGM_FB_RESERVED, DCGM_REASON_BITMASKS, DCGM_VIOLATION_REASONS, SIGNALS, VLLM_RUNNING,
                       VLLM_V0_KV, VLLM_V1_KV)

# Prometheus' default lookback for instant vectors is 5 min; we use a tighter one tied to the
# scrape interval so a dead source shows as a gap, not as a flat line.
_LOOKBACK_STEPS = 3.0
_SPARSE_LOOKBACK_S = 20 * 60.0  # kernel-gap captures every ~10 min (issue 2)
_RATE_WINDOW_S = 120.0  # like rate(x[2m]) at a 15 s scrape interval
_HIST_WINDOW_S = 300.0  # TTFT quantiles over 5-minute windows
_MAX_POINTS = 20000

SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap",
                    "hw_power_brake_slowdown")
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")


@dataclass
class Frame:
    t: np.ndarray  # grid timestamps (unix seconds)
    step: float  # seconds between grid points
    scrape_interval: float
    engine: dict[str, np.ndarray] = field(default_factory=dict)
    engine_cum: dict[str, np.ndarray] = field(default_factory=dict)  # cumulative increases (counters)
    gpu: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # gpu -> signal -> values
    gpu_cum: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    throttle: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # gpu -> reason -> 0/1
    config: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels
    sources: dict[str, str] = field(default_factory=dict)  # signal id -> raw metric used
    restarts: list[float] = field(default_factory=list)  # times engine counters reset
    hist_avg: dict[str, float] = field(default_factory=dict)  # e.g. request_prompt_tokens -> mean
    hist_count: dict[str, float] = field(default_factory=dict)  # observations over the window
    engine_generation: str | None = None  # "v1" | "v0" | None
    # Counters' last raw values (summed over series): lifetime totals since each process started,
    # what one scrape can say ("1,234 preemptions since the engine started").
    engine_total: dict[str, float] = field(default_factory=dict)
    gpu_total: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_model: dict[str, str] = field(default_factory=dict)  # gpu -> product name (DCGM modelName label)
    points: int = 0  # samples of the longest series, counted up to 3 (1 = a single scrape)
    hist_lifetime: set[str] = field(default_factory=set)
    rates_known: bool = True  # False: scrapes without timestamps and no known interval: counts, not rates  # hist_avg taken from lifetime totals (one scrape)

    @property
    def start(self) -> float:
        return float(self.t[0]) if self.t.size else math.nan

    @property
    def end(self) -> float:
        return float(self.t[-1]) if self.t.size else math.nan

    def has_engine(self, sig: str) -> bool:
        a = self.engine.get(sig)
        return a is not None and bool(np.isfinite(a).any())

    def has_gpu(self, gpu: str, sig: str) -> bool:
        a = self.gpu.get(gpu, {}).get(sig)
        return a is not None and bool(np.isfinite(a).any())

    def any_gpu_has(self, sig: str) -> bool:
        return any(self.has_gpu(g, sig) for g in self.gpu)

    def gpus(self) -> list[str]:
        return sorted(self.gpu, key=lambda g: (len(g), g))


# ---------------------------------------------------------------------------------------------
def _interval(series: list[Series]) -> float | None:
    diffs = []
    for s in series:
        if len(s) >= 2:  # two scrapes already tell the interval (a live first verdict)
            d = float(np.median(np.diff(s.ts)))
            if d > 0:
                diffs.append(d)
    return float(np.median(diffs)) if diffs else None


def _span(s: Series, grid: np.ndarray, lookback: float) -> tuple[int, int]:
    """Grid indices [lo, hi) where ``s`` can have a fresh value: from its first point to its last point
    + lookback; outside, every sampler gives NaN. Sampling only the span keeps the frame linear in the
    number of points: a short-lived series (one per request id) costs its span, not the whole grid
    (bench/bench_ingest.py --churn: 10k such series took 24 s and 2.4 GB, quadratic, before)."""
    if not len(s):
        return 0, 0
    lo = int(np.searchsorted(grid, s.ts[0], side="left"))
    hi = int(np.searchsorted(grid, s.ts[-1] + lookback, side="right"))
    return lo, max(lo, hi)


class _Agg:
    """NaN-aware sum / max / min / mean of sampled spans, one series at a time (instead of stacking
    one full-grid row per series). One series alone is returned as sampled, like _nanagg."""

    def __init__(self, n: int, how: str) -> None:
        self.how = how
        self.n = n
        self.cnt = np.zeros(n, dtype=np.int64)
        self.acc = np.full(n, {"max": -np.inf, "min": np.inf}.get(how, 0.0))
        self.first: tuple[int, np.ndarray] | None = None
        self.added = 0

    def add(self, lo: int, vals: np.ndarray) -> None:
        self.added += 1
        if self.added == 1:
            self.first = (lo, vals)
        sl = slice(lo, lo + vals.size)
        ok = np.isfinite(vals)
        self.cnt[sl] += ok
        if self.how == "max":
            np.fmax(self.acc[sl], vals, out=self.acc[sl])
        elif self.how == "min":
            np.fmin(self.acc[sl], vals, out=self.acc[sl])
        else:
            self.acc[sl] += np.where(ok, vals, 0.0)

    def result(self) -> np.ndarray:
        out = np.full(self.n, np.nan)
        if self.added == 1:
            lo, vals = self.first
            out[lo:lo + vals.size] = vals
            return out
        has = self.cnt > 0
        out[has] = self.acc[has] / self.cnt[has] if self.how == "mean" else self.acc[has]
        return out


def _gauge_span(s: Series, grid: np.ndarray, lookback: float) -> tuple[int, np.ndarray]:
    lo, hi = _span(s, grid, lookback)
    return lo, _sample_gauge(s, grid[lo:hi], lookback)


def _counter_span(s: Series, grid: np.ndarray, lookback: float, w: int
                  ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = _span(s, grid, lookback)
    r, c, resets = _sample_counter(s, grid[lo:hi], lookback, w)
    return lo, r, c, resets


def _sample_gauge(s: Series, grid: np.ndarray, lookback: float) -> np.ndarray:
    idx = np.searchsorted(s.ts, grid, side="right") - 1
    ok = idx >= 0
    out = np.full(grid.size, np.nan)
    ii = idx[ok]
    fresh = (grid[ok] - s.ts[ii]) <= lookback
    vals = s.values[ii]
    vals = np.where(fresh, vals, np.nan)
    out[ok] = vals
    return out


def counter_increases(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative increase of a counter with resets (a drop means the process restarted and the
    counter began again from 0). Returns (cumulative increase, reset mask)."""
    d = np.empty_like(v)
    if v.size == 0:
        return d, np.zeros(0, dtype=bool)
    d[0] = 0.0
    d[1:] = np.diff(v)
    reset = np.zeros(v.size, dtype=bool)
    reset[1:] = d[1:] < 0
    d[reset] = v[reset]
    return np.cumsum(d), reset


def _sample_counter(s: Series, grid: np.ndarray, lookback: float, w: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rate per second over ``w`` grid steps, the cumulative increase on the grid, reset times."""
    cum, reset = counter_increases(s.values)
    idx = np.searchsorted(s.ts, grid, side="right") - 1
    ok = idx >= 0
    ii = np.where(ok, idx, 0)
    fresh = ok & ((grid - s.ts[ii]) <= lookback)
    c = np.where(fresh, cum[ii], np.nan)
    tt = np.where(fresh, s.ts[ii], np.nan)
    rate = np.full(grid.size, np.nan)
    if grid.size > w:
        dc = c[w:] - c[:-w]
        dt = tt[w:] - tt[:-w]
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(dt > 0, dc / dt, np.nan)
        rate[w:] = r
        # the first w points: rate from the first sample
    if grid.size:
        first = np.argmax(fresh) if fresh.any() else None
        if first is not None:
            for i in range(first + 1, min(first + w, grid.size)):
                if fresh[i] and tt[i] > tt[first]:
                    rate[i] = (c[i] - c[first]) / (tt[i] - tt[first])
    return rate, c, s.ts[reset]


def _last_total(series: list[Series], scale: float) -> float:
    """Sum of the series' last values: a counter's lifetime total (NaN when none has a value)."""
    vals = [float(s.values[-1]) * scale for s in series if len(s) and np.isfinite(s.values[-1])]
    return float(sum(vals)) if vals else math.nan


def _nansum_stack(arrs: list[np.ndarray]) -> np.ndarray:
    m = np.vstack(arrs)
    allnan = np.all(np.isnan(m), axis=0)
    out = np.nansum(m, axis=0)
    out[allnan] = np.nan
    return out


def _nanagg(arrs: list[np.ndarray], how: str) -> np.ndarray:
    if len(arrs) == 1:
        return arrs[0]
    if how == "sum":
        return _nansum_stack(arrs)
    m = np.vstack(arrs)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if how == "max":
                return np.nanmax(m, axis=0)
            if how == "min":
                return np.nanmin(m, axis=0)
            return np.nanmean(m, axis=0)


def _gpu_id(s: Series) -> str:
    g = s.key.label("gpu")
    if g is None:
        g = s.key.label("UUID") or s.key.label("gpu_uuid") or s.key.label("device") or "0"
    return g


def histogram_quantile(q: float, les: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Prometheus' histogram_quantile over a matrix of cumulative bucket counts.

    ``les`` sorted upper bounds (last may be +Inf); ``counts`` shape (buckets, time), cumulative.
    """
    n_b, n_t = counts.shape
    out = np.full(n_t, np.nan)
    total = counts[-1]
    for j in range(n_t):
        tot = total[j]
        if not np.isfinite(tot) or tot <= 0:
            continue
        col = np.maximum.accumulate(np.nan_to_num(counts[:, j], nan=0.0))
        rank = q * tot
        b = int(np.searchsorted(col, rank, side="left"))
        if b >= n_b:
            b = n_b - 1
        if math.isinf(les[b]):
            out[j] = les[b - 1] if b > 0 else np.nan
            continue
        lo = les[b - 1] if b > 0 else 0.0
        c_lo = col[b - 1] if b > 0 else 0.0
        c_hi = col[b]
        if c_hi == c_lo:
            out[j] = les[b]
        else:
            out[j] = lo + (les[b] - lo) * (rank - c_lo) / (c_hi - c_lo)
    return out


# ---------------------------------------------------------------------------------------------
_ENGINE_AGG = {
    "requests_running": "sum",
    "requests_waiting": "sum",
    "kv_cache_usage_ratio": "max",
}
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


def build_frame(window: Window) -> Frame:
    window = derive(window)  # engine adapters' derived series (TensorRT-LLM KV usage, SGLang per-rank merge)
    by_name: dict[str, list[Series]] = {}
    for s in window:
        by_name.setdefault(s.name, []).append(s)

    # Grid step: the scrape interval of the engine/GPU series.
    dense = [s for n, ss in by_name.items() if not n.startswith("fragscope_kernel") and
             not n.endswith("_bucket") for s in ss if len(s) >= 2]
    interval = _interval(dense) or 15.0
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
        if sig.kind == "info":
            for s in series:
                f.config.update({k: v for k, v in s.key.labels})
            continue
        if sig.kind == "histogram":
            _histogram(f, sig_id, metric, by_name, grid, lookback, w)
            continue
        if sig.scope == "engine":
            if sig.kind == "counter":
                rates, cums = _Agg(grid.size, "sum"), _Agg(grid.size, "sum")
                for s in series:
                    lo, r, c, resets = _counter_span(s, grid, lookback, w)
                    rates.add(lo, r * scale)
                    cums.add(lo, c * scale)
                    f.restarts.extend(float(x) for x in resets)
                f.engine[sig_id] = rates.result()
                f.engine_cum[sig_id] = cums.result()
                f.engine_total[sig_id] = _last_total(series, scale)
            else:
                agg = _Agg(grid.size, _ENGINE_AGG.get(sig_id, "sum"))
                for s in series:
                    lo, v = _gauge_span(s, grid, lookback)
                    agg.add(lo, v * scale)
                f.engine[sig_id] = agg.result()
            continue
        # GPU-scope signals
        if sig_id == "gpu_throttle_reason_active":
            for s in series:
                g = _gpu_id(s)
                reason = s.key.label("reason") or "unknown"
                f.throttle.setdefault(g, {})[reason] = _sample_gauge(s, grid, lookback)
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
                f.gpu.setdefault(_gpu_id(s), {})[name] = _sample_gauge(s, grid, _SPARSE_LOOKBACK_S)
            continue
        per_gpu: dict[str, _Agg] = {}
        per_gpu_cum: dict[str, _Agg] = {}
        sparse = sig_id == "gpu_idle_ratio"
        for s in series:
            g = _gpu_id(s)
            if g not in per_gpu:
                per_gpu[g] = _Agg(grid.size, "sum" if sig.kind == "counter" else _GPU_AGG.get(sig_id, "mean"))
            if sig.kind == "counter":
                lo, r, c, _ = _counter_span(s, grid, lookback, w)
                per_gpu[g].add(lo, r * scale)
                per_gpu_cum.setdefault(g, _Agg(grid.size, "sum")).add(lo, c * scale)
            else:
                lo, v = _gauge_span(s, grid, _SPARSE_LOOKBACK_S if sparse else lookback)
                per_gpu[g].add(lo, v * scale)
        for g, agg in per_gpu.items():
            f.gpu.setdefault(g, {})[sig_id] = agg.result()
        for g, agg in per_gpu_cum.items():
            f.gpu_cum.setdefault(g, {})[sig_id] = agg.result()
            f.gpu_total.setdefault(g, {})[sig_id] = _last_total([s for s in series if _gpu_id(s) == g], scale)

    _dcgm_throttle(f, by_name, grid, lookback, w)

    # dcgm-exporter has no FB_TOTAL by default: total = used + free (+ reserved).
    for g, sigs in f.gpu.items():
        if "gpu_memory_total_bytes" not in sigs and "gpu_memory_used_bytes" in sigs \
                and "gpu_memory_free_bytes" in sigs:
            total = sigs["gpu_memory_used_bytes"] + sigs["gpu_memory_free_bytes"]
            res = [s for s in by_name.get(DCGM_FB_RESERVED, []) if _gpu_id(s) == g]
            if res:
                total = total + _sample_gauge(res[0], grid, lookback) * 1024.0 * 1024.0
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

    f.restarts = _dedupe_times(f.restarts, tol=max(60.0, 4 * step))
    f.rates_known = window.timestamps != "none" or window.scrape_interval_known
    for ss in by_name.values():
        for s in ss:
            if s.key.labels and any(k == "modelName" for k, _ in s.key.labels):
                f.gpu_model.setdefault(_gpu_id(s), s.key.label("modelName"))
            f.points = max(f.points, min(3, len(s)))
    if VLLM_V1_KV in by_name or any(
            s.key.label("engine") is not None for s in by_name.get(VLLM_RUNNING, [])):
        f.engine_generation = "v1"
    elif VLLM_V0_KV in by_name:
        f.engine_generation = "v0"
    return f


# NVML clocks-event reason bits (nvmlClocksEventReason*), as DCGM_FI_DEV_CLOCKS_EVENT_REASONS
# (older name DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) reports them.
NVML_REASON_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# DCGM violation counters (ns of throttling): throttled for most of the time = the reason is active.
_VIOLATION_REASONS = DCGM_VIOLATION_REASONS


def _dcgm_throttle(f: Frame, by_name: dict[str, list[Series]], grid: np.ndarray, lookback: float, w: int) -> None:
    """Throttle reasons from dcgm-exporter, for GPUs without fragscope's NVML reasons."""
    have = set(f.throttle)
    for name in DCGM_REASON_BITMASKS:
        for s in by_name.get(name, []):
            g = _gpu_id(s)
            if g in have:
                continue
            mask = _sample_gauge(s, grid, lookback)
            ok = np.isfinite(mask)
            bits = np.where(ok, mask, 0).astype(np.int64)
            for bit, reason in NVML_REASON_BITS.items():
                f.throttle.setdefault(g, {})[reason] = np.where(ok, (bits & bit) > 0, np.nan).astype(float)
            f.sources.setdefault("gpu_throttle_reason_active", name)
    have = set(f.throttle)
    for name, reason in _VIOLATION_REASONS.items():
        for s in by_name.get(name, []):
            g = _gpu_id(s)
            if g in have:
                continue
            rate = _sample_counter(s, grid, lookback, w)[0] * 1e-9  # ns of throttling per second
            f.throttle.setdefault(g, {})[reason] = np.where(np.isfinite(rate), rate >= 0.5, np.nan).astype(float)
            f.sources.setdefault("gpu_throttle_reason_active", name)


def _dedupe_times(ts: list[float], tol: float) -> list[float]:
    out: list[float] = []
    for t in sorted(ts):
        if not out or t - out[-1] > tol:
            out.append(t)
    return out


def _histogram(f: Frame, sig_id: str, metric: str, by_name: dict[str, list[Series]], grid: np.ndarray,
               lookback: float, w: int) -> None:
    buckets: dict[float, list[Series]] = {}
    for s in by_name.get(metric + "_bucket", []):
        le = s.key.label("le")
        if le is None:
            continue
        try:
            buckets.setdefault(float(le), []).append(s)
        except ValueError:
            continue
    # window averages from _sum / _count
    tot_sum = tot_cnt = 0.0
    for s in by_name.get(metric + "_sum", []):
        c, _ = counter_increases(s.values)
        tot_sum += float(c[-1]) if c.size else 0.0
    for s in by_name.get(metric + "_count", []):
        c, _ = counter_increases(s.values)
        tot_cnt += float(c[-1]) if c.size else 0.0
    if tot_cnt == 0 and all(len(s) == 1 for s in by_name.get(metric + "_count", [])):
        # one scrape: the lifetime average since the engine started (sum / count as exported)
        tot_sum = sum(float(s.values[-1]) for s in by_name.get(metric + "_sum", []) if len(s))
        tot_cnt = sum(float(s.values[-1]) for s in by_name.get(metric + "_count", []) if len(s))
        if tot_cnt > 0:
            f.hist_lifetime.add(sig_id)
    if tot_cnt > 0:
        f.hist_avg[sig_id] = tot_sum / tot_cnt
        f.hist_count[sig_id] = tot_cnt
    # rolling mean per request (rate(_sum) / rate(_count)), e.g. prompt length over time
    sums, cnts = _Agg(grid.size, "sum"), _Agg(grid.size, "sum")
    for s in by_name.get(metric + "_sum", []):
        lo, r, _, _ = _counter_span(s, grid, lookback, w)
        sums.add(lo, r)
    for s in by_name.get(metric + "_count", []):
        lo, r, _, _ = _counter_span(s, grid, lookback, w)
        cnts.add(lo, r)
    if sums.added and cnts.added:
        rs, rc = sums.result(), cnts.result()
        with np.errstate(invalid="ignore", divide="ignore"):
            f.engine[sig_id + "_mean"] = np.where(rc > 0, rs / rc, np.nan)
        f.engine[sig_id + "_rate"] = rc  # observations per second (requests finishing)
    if sig_id != "ttft_seconds" or not buckets:
        return
    les = np.array(sorted(buckets))
    hw = max(1, int(round(_HIST_WINDOW_S / f.step)))
    cum_rows = []
    for le in les:
        agg = _Agg(grid.size, "sum")
        for s in buckets[le]:
            lo, _, c, _ = _counter_span(s, grid, lookback, w)
            agg.add(lo, c)
        cum_rows.append(agg.result())
    cum = np.vstack(cum_rows)
    delta = np.full_like(cum, np.nan)
    if cum.shape[1] > hw:
        delta[:, hw:] = cum[:, hw:] - cum[:, :-hw]
    f.engine["ttft_p50_seconds"] = histogram_quantile(0.5, les, delta)
    f.engine["ttft_p99_seconds"] = histogram_quantile(0.99, les, delta)
