"""Kernel-timeline diagnosis ids and thresholds (the source of each default beside it). Pure data."""
from __future__ import annotations

from dataclasses import dataclass
from .. import ids

LAUNCH_BOUND = ids.LAUNCH_BOUND  # same id as the time-series detector
SYNC_BOUND = ids.SYNC_BOUND
ALLOCATOR_STALLS = ids.ALLOCATOR_STALLS
UNIFIED_MEMORY_THRASHING = ids.UNIFIED_MEMORY_THRASHING  # managed pages migrating on demand (faults/evictions)


@dataclass(frozen=True, slots=True)
class Config:
    # HTA get_idle_time_breakdown consecutive_kernel_delay = 30 (trace µs): a shorter gap between
    # back-to-back ops whose launch came in time is launch overhead ("kernel wait").
    kernel_wait_cutoff_s: float = 30e-6
    # HTA cuda_kernel_launch_stats runtime_cutoff = 50 µs: launch calls up to this long can make
    # "short kernels" (GPU time < launch time); longer calls are runtime outliers.
    runtime_cutoff_s: float = 50e-6
    # HTA cuda_kernel_launch_stats launch_delay_cutoff = 100 µs: a longer launch delay means work was
    # queued on the GPU, i.e. the host was ahead -- evidence against launch-bound.
    launch_delay_cutoff_s: float = 100e-6
    # nsys analyze gpu_gaps: gaps of 500 ms or more are reported as program-level stalls.
    long_gap_s: float = 0.5
    # nsys analyze gpu_time_util: windows below 50 % GPU time are reported as under-used.
    idle_ratio_min: float = 0.5
    idle_ratio_critical: float = 0.8  # project-chosen: the GPU waits 4/5 of the time
    # project-chosen: the mechanism explains the majority of the idle time
    wait_share_min: float = 0.5
    sync_gap_share_min: float = 0.5
    # A gap "follows a sync" when a synchronizing call was in progress when the GPU went idle
    # (it returns as the GPU drains); tolerance for host/GPU clock skew = HTA's kernel-wait cutoff.
    sync_tolerance_s: float = 30e-6
    # nsys analyze cuda_memcpy_sync: host->device synchronous copies of 64 KB or less are ignored.
    memcpy_sync_min_bytes: int = 64 * 1024
    min_ops: int = 10  # project-chosen: fewer GPU ops on a device cannot support a verdict
    # project-chosen: one lone cudaMalloc after warm-up can be a lazy init; two or more are churn.
    alloc_min_calls: int = 2
    alloc_time_share_warn: float = 0.01  # project-chosen: 1 % of the steady window in malloc/free
    exclude_last_step: bool = True  # as HTA: the last ProfilerStep is often cut short by the stop
    # project-chosen: a few demand migrations are managed memory's first touch; 16 or more (a 2 MB
    # prefetch granule is 32 64 KB pages: a single first touch can show up as several rows) are a pattern.
    um_min_migrations: int = 16
    um_time_ratio_warn: float = 0.1  # project-chosen: migrations take 10 % of the trace window
    um_time_ratio_critical: float = 0.25  # project-chosen, with migrations in both directions (ping-pong)

