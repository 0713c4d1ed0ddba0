"""Diagnosis ids: the names findings, alerts, exported series and docs use (contracts: docs/diagnoses.md).

Code names a diagnosis by these constants, never by a string literal: a misspelt constant fails at import,
a misspelt string is a diagnosis nobody reports. A new diagnosis adds its constant here and its module
(docs/diagnoses.md, "Adding a diagnosis").
"""
from __future__ import annotations

# --- window diagnoses (judged on metrics: detectors/<diagnosis>.py) ---------------------------------
ALLOCATOR_FRAGMENTATION = "allocator-fragmentation"
KV_CACHE_PRESSURE = "kv-cache-pressure"
MEMORY_LEAK = "memory-leak"
CLOCK_THROTTLING = "clock-throttling"
LAUNCH_BOUND = "launch-bound"
CAPACITY_SATURATION = "capacity-saturation"
KV_BLOCK_SIZE_MISMATCH = "kv-block-size-mismatch"
KV_POOL_UNDERSIZED = "kv-pool-undersized"
ENGINE_CPU_STARVED = "engine-cpu-starved"
ENGINE_STALLED = "engine-stalled"
RANK_STRAGGLER = "rank-straggler"
GPU_HARDWARE_FAULT = "gpu-hardware-fault"
HOST_MEMORY_PRESSURE = "host-memory-pressure"

# --- deep evidence: memory snapshots ------------------------------------------------------------------
OOM_CAPACITY = "oom-capacity"
OOM_OUTSIDE_PYTORCH = "oom-outside-pytorch"
OOM_CROSS_STREAM = "oom-cross-stream"
OOM_PRIVATE_POOL = "oom-private-pool"
OOM_MEMORY_CAP = "oom-memory-cap"

# --- deep evidence: engine logs -----------------------------------------------------------------------
KV_CAPACITY_GAP = "kv-capacity-gap"
ADMISSION_CAPPED = "admission-capped"
STARTUP_OOM = "startup-oom"
ENGINE_DIED = "engine-died"

# --- deep evidence: traces ----------------------------------------------------------------------------
SYNC_BOUND = "sync-bound"
ALLOCATOR_STALLS = "allocator-stalls"
UNIFIED_MEMORY_THRASHING = "unified-memory-thrashing"
CPU_FALLBACK = "cpu-fallback"

# --- model config + counters (Triton) -----------------------------------------------------------------
BATCHING_MISCONFIGURATION = "batching-misconfiguration"

ALL = tuple(v for k, v in sorted(globals().items()) if k.isupper() and isinstance(v, str))
