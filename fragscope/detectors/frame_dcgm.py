"""Throttle reasons from dcgm-exporter (clocks-event bitmask or violation counters) on a Frame, for GPUs
without fragscope's NVML reasons.
"""
from __future__ import annotations

import numpy as np

from ..model import Series
from ..signals import DCGM_REASON_BITMASKS, DCGM_VIOLATION_REASONS
from .frame_model import Frame
from .frame_sampling import gpu_id, sample_counter, sample_gauge

# NVML clocks-event reason bits (nvmlClocksEventReason*), as DCGM_FI_DEV_CLOCKS_EVENT_REASONS
# (older name DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) reports them.
NVML_REASON_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# DCGM violation counters (ns of throttling): throttled for most of the time = the reason is active.
_VIOLATION_REASONS = DCGM_VIOLATION_REASONS


def dcgm_throttle(f: Frame, by_name: dict[str, list[Series]], grid: np.ndarray, lookback: float, w: int) -> None:
    """Throttle reasons from dcgm-exporter, for GPUs without fragscope's NVML reasons."""
    have = set(f.throttle)
    for name in DCGM_REASON_BITMASKS:
        for s in by_name.get(name, []):
            g = gpu_id(s)
            if g in have:
                continue
            mask = sample_gauge(s, grid, lookback)
            ok = np.isfinite(mask)
            bits = np.where(ok, mask, 0).astype(np.int64)
            for bit, reason in NVML_REASON_BITS.items():
                f.throttle.setdefault(g, {})[reason] = np.where(ok, (bits & bit) > 0, np.nan).astype(float)
            f.sources.setdefault("gpu_throttle_reason_active", name)
    have = set(f.throttle)
    for name, reason in _VIOLATION_REASONS.items():
        for s in by_name.get(name, []):
            g = gpu_id(s)
            if g in have:
                continue
            rate = sample_counter(s, grid, lookback, w)[0] * 1e-9  # ns of throttling per second
            f.throttle.setdefault(g, {})[reason] = np.where(np.isfinite(rate), rate >= 0.5, np.nan).astype(float)
            f.sources.setdefault("gpu_throttle_reason_active", name)
