"""Per-target figures for the fleet summary and the peer comparison: signals present, tokens/s,
allocator fragmentation, the model served (all from one target's Window)."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ..model import Window
from ..signals import SIGNALS
from .grouping import ENGINE_PREFIXES

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
    """The ``model_name`` label of the target's first engine series (None: no engine series)."""
    for k in window.series:
        if k.name.startswith(ENGINE_PREFIXES):
            m = k.label("model_name")
            if m:
                return m
    return None
