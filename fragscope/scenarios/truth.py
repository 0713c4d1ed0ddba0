"""The ground truth of a simulated run: which diagnoses a correct reading reports (and which extras
are defensible), when the pathology began, and the run's reference figures before and after."""
from __future__ import annotations

import numpy as np

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
    if kind in ("allocator-fragmentation", "kv-cache-pressure", "memory-leak", "clock-throttling",
                "launch-bound", "capacity-saturation") and present:
        diag.add(kind)
    if kind in ("engine-cpu-starved", "engine-stalled", "host-memory-pressure") and present:
        diag.add(kind)
    if kind in ("rank-straggler", "gpu-hardware-fault") and present and s.gpu_source != "none":
        diag.add(kind)
    if kind == "rank-straggler":
        # the slow rank's clock sits below 80 % of the product's maximum: clock-throttling's level rule
        tolerated.update({"clock-throttling", "capacity-saturation"})
    if kind in ("engine-cpu-starved", "engine-stalled"):
        tolerated.add("capacity-saturation")
    if kind == "leak-with-traffic" and present:
        diag.add("memory-leak")
    if kind == "throttling-with-load" and present:
        diag.add("clock-throttling")
    if kind in ("clock-throttling", "throttling-with-load", "traffic-surge", "leak-with-traffic"):
        tolerated.add("capacity-saturation")
    if kind == "kv-cache-pressure":
        tolerated.add("capacity-saturation")
    if kind == "kv-cache-pressure" and present and s.gpu_source != "none" and _gpu_spare(s, run) >= SIZING.min_step:
        # the pool ran full while the GPU kept memory beyond the sizing margin (the default 0.9 leaves ~10 %):
        # kv-pool-undersized too; at 0.98 nothing is left and kv-cache-pressure stands alone
        diag.add("kv-pool-undersized")
    waste = expected_waste_ratio(block, avg_len)
    if waste >= 0.2:
        diag.add("kv-block-size-mismatch")
    elif waste >= 0.1:
        tolerated.add("kv-block-size-mismatch")
    onset_ts = None
    if diag - {"kv-block-size-mismatch"}:
        onset_ts = s.start_ts + onset
    elif diag:
        onset_ts = s.start_ts
    if s.severity < 0.5 and diag - {"kv-block-size-mismatch"}:
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
        "allocator-fragmentation": "allocator fragmentation: reserved-allocated gap and retries grow, batch and "
                                   "throughput fall at unchanged traffic, utilization stays high",
        "kv-cache-pressure": "longer requests fill the KV cache: usage ~1, preemptions, TTFT p99 up",
        "memory-leak": "allocated memory grows with reserved following, NVML used grows, OOMs at the end",
        "clock-throttling": f"SM clock falls with {s.throttle_reason} on GPU(s) {list(affected)}",
        "launch-bound": "host-bound: low utilization, wide kernel gaps, no memory pathology",
        "capacity-saturation": "traffic ramps past capacity: queue, batch and KV usage up, no pathology",
        "kv-block-size-mismatch": f"block_size {block} for ~{avg_len:.0f}-token sequences",
        "traffic-surge": "demand rises within capacity: throughput rises, nothing wrong",
        "traffic-drop": "demand falls: throughput and batch fall with it, nothing wrong",
        "stable-slack": "a constant 25 % allocator slack with no retries or decline: nothing wrong",
        "leak-with-traffic": "memory leak while traffic rises",
        "throttling-with-load": "clock throttling during a traffic peak",
        "engine-cpu-starved": "the engine container's CPU quota runs out: throttled periods up, steps slower, "
                              "the GPU idles between kernels",
        "engine-stalled": "the engine stops making progress with requests in flight (its last 20 minutes)",
        "rank-straggler": "one GPU of the engine runs a lower SM clock than its peers, no slowdown reason",
        "gpu-hardware-fault": "a hardware fault on GPU 0 (Xid, ECC, row remap or PCIe)",
        "host-memory-pressure": "the engine container's working set climbs to its memory limit",
        "rank-idle-by-design": "one GPU of the pod idles at idle clocks while the others serve: nothing wrong",
        "link-idle-downshift": "PCIe links train down at low load and back up under load: nothing wrong",
        "old-corrected-ecc": "a few corrected ECC errors and one old uncorrectable in the lifetime count: nothing wrong",
        "page-cache-near-limit": "container usage at its limit in page cache, working set at half: nothing wrong",
    }[kind]
    return Truth(diagnoses=diag, onset_ts=onset_ts, notes="; ".join([desc, *notes]), tolerated=tolerated - diag,
                 figures=figs)
