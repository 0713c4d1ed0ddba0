"""The ground truth of a simulated run: which diagnoses a correct reading reports (and which extras
are defensible), when the pathology began, and the run's reference figures before and after."""
from __future__ import annotations

import numpy as np

from .. import ids
from ..kvbudget import expected_waste_ratio
from ..sizing.arith import SizingConfig
from .mechanism import CTX_BYTES, Run
from .spec import Scenario, Truth


SIZING = SizingConfig()


def _gpu_spare(s: Scenario, run: Run) -> float:
    """The smallest share of a GPU left free at its peak beyond the sizing margin (NVML used = reserved + context)."""
    T = float(s.gpu_memory_total_bytes)
    up = ~run.down
    if not up.any():
        return -1.0
    used = run.reserved[:, up] + CTX_BYTES
    return (T - float(np.max(used)) - SIZING.margin(T)) / T


def truth_of(s: Scenario, run: Run) -> Truth:
    """What a correct diagnosis of the simulated ``run`` of ``s`` says."""
    kind, onset, block, ts, rel, R, W = run.kind, run.onset, run.block, run.ts, run.rel, run.R, run.W
    avg_len = run.avg_len if run.avg_len is not None else run.lp0 + run.lg0
    GEN, pre_inc, reserved, allocated, util = run.GEN, run.pre_inc, run.reserved, run.allocated, run.util
    clock, kv_usage, ooms_inc, restart_i, affected = run.clock, run.kv_usage, run.ooms_inc, run.restart_i, run.affected
    diag: set[str] = set()
    tolerated: set[str] = set()
    notes = []
    present = s.severity > 0
    if kind in (ids.ALLOCATOR_FRAGMENTATION, ids.KV_CACHE_PRESSURE, ids.MEMORY_LEAK, ids.CLOCK_THROTTLING,
                ids.LAUNCH_BOUND, ids.CAPACITY_SATURATION) and present:
        diag.add(kind)
    if kind in (ids.ENGINE_CPU_STARVED, ids.ENGINE_STALLED, ids.HOST_MEMORY_PRESSURE) and present:
        diag.add(kind)
    if kind in (ids.RANK_STRAGGLER, ids.GPU_HARDWARE_FAULT) and present and s.gpu_source != "none":
        diag.add(kind)
    if kind == ids.RANK_STRAGGLER:
        # the slow rank's clock sits below 80 % of the product's maximum: clock-throttling's level rule
        tolerated.update({ids.CLOCK_THROTTLING, ids.CAPACITY_SATURATION})
    if kind in (ids.ENGINE_CPU_STARVED, ids.ENGINE_STALLED):
        tolerated.add(ids.CAPACITY_SATURATION)
    if kind == "leak-with-traffic" and present:
        diag.add(ids.MEMORY_LEAK)
    if kind == "throttling-with-load" and present:
        diag.add(ids.CLOCK_THROTTLING)
    if kind in (ids.CLOCK_THROTTLING, "throttling-with-load", "traffic-surge", "leak-with-traffic"):
        tolerated.add(ids.CAPACITY_SATURATION)
    if kind == ids.KV_CACHE_PRESSURE:
        tolerated.add(ids.CAPACITY_SATURATION)
    if kind == ids.KV_CACHE_PRESSURE and present and s.gpu_source != "none" and _gpu_spare(s, run) >= SIZING.min_step:
        # the pool ran full while the GPU kept memory beyond the sizing margin (the default 0.9 leaves ~10 %):
        # kv-pool-undersized too; at 0.98 nothing is left and kv-cache-pressure stands alone
        diag.add(ids.KV_POOL_UNDERSIZED)
    waste = expected_waste_ratio(block, avg_len)
    if waste >= 0.2:
        diag.add(ids.KV_BLOCK_SIZE_MISMATCH)
    elif waste >= 0.1:
        tolerated.add(ids.KV_BLOCK_SIZE_MISMATCH)
    onset_ts = None
    if diag - {ids.KV_BLOCK_SIZE_MISMATCH}:
        onset_ts = s.start_ts + onset
    elif diag:
        onset_ts = s.start_ts
    if s.severity < 0.5 and diag - {ids.KV_BLOCK_SIZE_MISMATCH}:
        notes.append(f"mild (severity {s.severity}): a detector may grade it info/warning")
    if restart_i is not None:
        notes.append(f"engine restarted at +{s.restart_at_s:.0f}s: counters reset, pathology cleared")
    if s.drop:
        notes.append(f"signals left out: {', '.join(s.drop)}")
    if not s.torch_probe:
        notes.append("no torch probe")
    if s.gpu_source == "none":
        notes.append("no GPU exporter")
    # figures: first hour (or the stretch before onset) vs the last 30 minutes before any restart
    end_i = restart_i if restart_i is not None else len(ts)
    b_hi = int(np.searchsorted(rel, min(onset if onset > 0 else 3600.0, 3600.0)))
    b = slice(0, max(b_hi, 2))
    lo_i = int(np.searchsorted(rel, rel[end_i - 1] - 1800.0))
    e = slice(lo_i, end_i)
    dt = s.step_s

    def rate(x, sl):
        return float(np.sum(x[sl]) / max((sl.stop - sl.start) * dt, dt))

    g0 = affected[0] if affected else 0
    figs = {
        "gen_tokens_per_s": (round(rate(GEN, b), 1), round(rate(GEN, e), 1)),
        "running": (round(float(np.mean(R[b])), 1), round(float(np.mean(R[e])), 1)),
        "waiting": (round(float(np.mean(W[b])), 1), round(float(np.mean(W[e])), 1)),
        "preemptions_per_min": (round(rate(pre_inc, b) * 60, 2), round(rate(pre_inc, e) * 60, 2)),
        "kv_cache_usage": (round(float(np.mean(kv_usage[b])), 3), round(float(np.mean(kv_usage[e])), 3)),
        "fragmentation_ratio": tuple(round(float(np.mean(1 - allocated[g0, sl] / np.maximum(reserved[g0, sl], 1))), 3)
                                     for sl in (b, e)),
        "gpu_utilization": (round(float(np.mean(util[g0, b])), 3), round(float(np.mean(util[g0, e])), 3)),
        "sm_clock_mhz": (round(float(np.mean(clock[g0, b]))), round(float(np.mean(clock[g0, e])))),
        "ooms": int(np.sum(ooms_inc)),
        "expected_waste_ratio": round(waste, 3),
        "block_size": block, "avg_seq_len": round(float(avg_len), 1),
    }
    desc = {
        "healthy": "healthy server, traffic with a daily wave",
        ids.ALLOCATOR_FRAGMENTATION: "allocator fragmentation: reserved-allocated gap and retries grow, batch and "
                                   "throughput fall at unchanged traffic, utilization stays high",
        ids.KV_CACHE_PRESSURE: "longer requests fill the KV cache: usage ~1, preemptions, TTFT p99 up",
        ids.MEMORY_LEAK: "allocated memory grows with reserved following, NVML used grows, OOMs at the end",
        ids.CLOCK_THROTTLING: f"SM clock falls with {s.throttle_reason} on GPU(s) {list(affected)}",
        ids.LAUNCH_BOUND: "host-bound: low utilization, wide kernel gaps, no memory pathology",
        ids.CAPACITY_SATURATION: "traffic ramps past capacity: queue, batch and KV usage up, no pathology",
        ids.KV_BLOCK_SIZE_MISMATCH: f"block_size {block} for ~{avg_len:.0f}-token sequences",
        "traffic-surge": "demand rises within capacity: throughput rises, nothing wrong",
        "traffic-drop": "demand falls: throughput and batch fall with it, nothing wrong",
        "stable-slack": "a constant 25 % allocator slack with no retries or decline: nothing wrong",
        "leak-with-traffic": "memory leak while traffic rises",
        "throttling-with-load": "clock throttling during a traffic peak",
        ids.ENGINE_CPU_STARVED: "the engine container's CPU quota runs out: throttled periods up, steps slower, "
                              "the GPU idles between kernels",
        ids.ENGINE_STALLED: "the engine stops making progress with requests in flight (its last 20 minutes)",
        ids.RANK_STRAGGLER: "one GPU of the engine runs a lower SM clock than its peers, no slowdown reason",
        ids.GPU_HARDWARE_FAULT: "a hardware fault on GPU 0 (Xid, ECC, row remap or PCIe)",
        ids.HOST_MEMORY_PRESSURE: "the engine container's working set climbs to its memory limit",
        "rank-idle-by-design": "one GPU of the pod idles at idle clocks while the others serve: nothing wrong",
        "link-idle-downshift": "PCIe links train down at low load and back up under load: nothing wrong",
        "old-corrected-ecc": "a few corrected ECC errors and one old uncorrectable in the lifetime count: nothing wrong",
        "page-cache-near-limit": "container usage at its limit in page cache, working set at half: nothing wrong",
    }[kind]
    return Truth(diagnoses=diag, onset_ts=onset_ts, notes="; ".join([desc, *notes]), tolerated=tolerated - diag,
                 figures=figs)
