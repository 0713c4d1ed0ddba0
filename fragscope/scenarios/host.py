"""The run beyond the GPU's memory: the engine container's CPU quota and throttling, its processes' CPU
and run-queue delay, its memory cgroup and the host's memory, and the GPUs' hardware-health fields
(Xid, ECC, row remapping, PCIe link and replays), exported in every scenario as the agent's process
collector and NVML (or dcgm-exporter) publish them; and the two stages of a stalled engine.

Mechanisms (docs/scenarios.md): a CPU quota runs out in a growing share of CFS periods while every step
slows (engine.py: the per-sequence speed falls, the GPU idles between kernels as in launch-bound); a
stall freezes the engine's progress counters with requests in flight, the GPUs either spinning in a
collective (100 %) or idle (a host-side hang); the container's working set climbs towards its limit
(an OOM kill at the end of a severe run); a hardware fault shows in one GPU's fields. Draws come from
a generator of their own, so every other series of a scenario is what it was without them.
"""
from __future__ import annotations

import numpy as np

from .. import ids
from ..kvbudget import GIB
from .mechanism import Run
from .spec import Scenario

QUOTA_CORES = 4.0
PERIODS_PER_S = 10.0  # cfs_period_us = 100000
LIMIT_BYTES = 64 * GIB
HOST_TOTAL_BYTES = 512 * GIB
FAULTS = ("xid-79", "dbe-xid-48", "remap-failed", "pcie-gen", "pcie-replays")


def stall_kind(s: Scenario) -> str:
    """collective (GPUs spin at 100 %) on even seeds, host (GPUs idle) on odd ones."""
    return "collective" if s.seed % 2 == 0 else "host"


def fault_kind(s: Scenario) -> str:
    return FAULTS[s.seed % len(FAULTS)]


def _stall_from(s: Scenario, run: Run) -> int | None:
    if s.kind != ids.ENGINE_STALLED or s.severity <= 0:
        return None
    idx = np.flatnonzero(run.p > 0)
    return int(idx[0]) if idx.size else None


def stall_engine(s: Scenario, run: Run) -> None:
    """From the onset the engine makes no progress: no token, no admission, no finished request; the batch
    and the queue hold where they were (clients keep their connections)."""
    i0 = _stall_from(s, run)
    if i0 is None:
        return
    keep_r = float(max(run.R[max(0, i0 - 1)], 1.0))
    keep_w = float(run.W[max(0, i0 - 1)])
    for a in (run.GEN, run.FIN, run.ADM, run.ABT, run.pre_inc):
        a[i0:] = 0.0
    run.R[i0:] = keep_r
    run.W[i0:] = keep_w + np.minimum(np.arange(run.n - i0) * 0.2, 40.0)  # a few more arrive before clients give up
    run.kv_usage[i0:] = run.kv_usage[max(0, i0 - 1)]


def stall_gpus(s: Scenario, run: Run) -> None:
    i0 = _stall_from(s, run)
    if i0 is None:
        return
    run.util[:, i0:] = 1.0 if stall_kind(s) == "collective" else 0.0


def host_columns(s: Scenario, run: Run, put, uuids: list[str]) -> None:
    """Add the container / process / host and GPU hardware series through the exporter's ``put``."""
    rng = np.random.default_rng(s.seed * 7919 + 24)
    n, ts, dt, p, kind, nz = run.n, run.ts, run.dt, run.p, s.kind, s.noise
    sev = s.severity
    up = run.up
    # --- CPU: the container's quota and throttling; the engine processes' CPU and run-queue delay ----
    share = np.clip(0.01 + 0.01 * rng.standard_normal(n) * nz, 0.0, 0.05)
    if kind == ids.ENGINE_CPU_STARVED and sev > 0:
        share = np.clip(share + (0.25 + 0.3 * min(sev, 1.5)) * p, 0.0, 0.95)
    busy = np.clip(0.3 + 0.5 * run.util.mean(axis=0), 0.1, 1.0)  # cores' worth of the quota in use
    cores = QUOTA_CORES * np.where(share > 0.1, 1.0, busy * 0.6)
    if kind == ids.ENGINE_STALLED and sev > 0:
        i0 = _stall_from(s, run)
        if i0 is not None:
            cores[i0:] = 1.0 if stall_kind(s) == "collective" else 0.005
    periods = np.cumsum(np.full(n, PERIODS_PER_S * dt))
    put("fragscope_container_cpu_quota_cores", {}, np.full(n, QUOTA_CORES), "gauge")
    put("fragscope_container_cpu_periods_total", {}, periods, "counter")
    put("fragscope_container_cpu_throttled_periods_total", {}, np.round(np.cumsum(share * PERIODS_PER_S * dt)),
        "counter")
    put("fragscope_container_cpu_throttled_seconds_total", {}, np.round(np.cumsum(share * 0.5 * dt), 3), "counter")
    wait_share = np.clip(0.05 + 0.02 * rng.standard_normal(n) * nz, 0.0, 0.2)
    run_s = np.cumsum(cores * dt) + 3600.0
    put("fragscope_process_cpu_seconds_total", {"pid": "4100"}, np.round(run_s, 2), "counter")
    put("fragscope_process_runqueue_wait_seconds_total", {"pid": "4100"},
        np.round(np.cumsum(cores * dt * wait_share / (1 - wait_share)) + 100.0, 3), "counter")
    # --- memory: the engine cgroup's working set, limit, OOM kills; the host -------------------------
    ws_ratio = 0.45 + 0.02 * np.sin(np.arange(n) * dt / 3600.0) + 0.003 * rng.standard_normal(n) * nz
    kills = np.zeros(n)
    if kind == ids.HOST_MEMORY_PRESSURE and sev > 0:
        ws_ratio = ws_ratio + (min(0.995, 0.90 + 0.05 * sev) - 0.45) * p
        if sev >= 1.5:
            hit = np.flatnonzero(p >= 0.95)
            if hit.size:
                kills[hit[0]:] = 1.0
    ws_ratio = np.clip(ws_ratio, 0.05, 0.999)
    put("fragscope_container_memory_working_set_bytes", {}, np.round(ws_ratio * LIMIT_BYTES), "gauge", up)
    usage = ws_ratio + (0.99 - ws_ratio) * (1.0 if kind == "page-cache-near-limit" else 0.2)
    put("fragscope_container_memory_usage_bytes", {}, np.round(usage * LIMIT_BYTES), "gauge", up)
    put("fragscope_container_memory_limit_bytes", {}, np.full(n, float(LIMIT_BYTES)), "gauge")
    put("fragscope_container_oom_kills_total", {}, kills, "counter")
    put("fragscope_host_memory_total_bytes", {}, np.full(n, float(HOST_TOTAL_BYTES)), "gauge")
    put("fragscope_host_memory_available_bytes", {},
        np.round(HOST_TOTAL_BYTES * (0.55 - 0.3 * (ws_ratio - 0.45) * LIMIT_BYTES / HOST_TOTAL_BYTES)), "gauge")
    put("fragscope_host_swap_in_bytes_total", {}, np.full(n, 4096.0 * 12), "counter")
    put("fragscope_host_swap_out_bytes_total", {}, np.full(n, 4096.0 * 40), "counter")
    # --- GPU hardware health -------------------------------------------------------------------------
    if s.gpu_source == "none":
        return
    fault = fault_kind(s) if kind == ids.GPU_HARDWARE_FAULT and s.severity > 0 else None
    on = p > 0
    for g in range(run.G):
        hit = fault is not None and g == 0
        xid = np.zeros(n)
        dbe = np.zeros(n)
        sbe = np.zeros(n)
        sbe_agg = np.zeros(n)
        dbe_agg = np.zeros(n)
        pending = np.zeros(n)
        failed = np.zeros(n)
        gen = np.full(n, 5.0)
        replays = np.zeros(n)
        if kind == "old-corrected-ecc" and g == 0:
            sbe[:] = 3.0
            sbe_agg[:] = 12.0
            dbe_agg[:] = 1.0  # one uncorrectable error in the board's life, long ago
        if kind == "link-idle-downshift":
            gen = np.where(run.util[g] >= 0.5, 5.0, 1.0)  # ASPM / dynamic link speed at low load
        if hit and fault == "xid-79":
            xid[on] = 79.0
        elif hit and fault == "dbe-xid-48":
            xid[on] = 48.0
            dbe[on] = 2.0
            dbe_agg[on] = 2.0
            pending[on] = 1.0
        elif hit and fault == "remap-failed":
            failed[on] = 1.0
        elif hit and fault == "pcie-gen":
            gen = np.where(on, 3.0, gen)
        elif hit and fault == "pcie-replays":
            replays = np.cumsum(np.where(on, 40.0 / 60.0 * dt * max(sev, 0.5), 0.0))
        if s.gpu_source == "fragscope":
            gl = {"gpu": str(g), "gpu_uuid": uuids[g]}
            names = ("fragscope_gpu_last_xid", "fragscope_gpu_ecc_uncorrected_volatile_total",
                     "fragscope_gpu_ecc_corrected_volatile_total", "fragscope_gpu_ecc_uncorrected_aggregate_total",
                     "fragscope_gpu_row_remap_pending", "fragscope_gpu_row_remap_failed",
                     "fragscope_gpu_pcie_link_gen", "fragscope_gpu_pcie_link_gen_max",
                     "fragscope_gpu_pcie_link_width", "fragscope_gpu_pcie_link_width_max",
                     "fragscope_gpu_pcie_replays_total")
        else:
            gl = {"gpu": str(g), "UUID": uuids[g], "device": f"nvidia{g}", "modelName": "NVIDIA H100 80GB HBM3",
                  "Hostname": "gpu-node-1"}
            names = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                     "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                     "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
                     "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
        vals = (xid, dbe, sbe, dbe_agg, pending, failed, gen, np.full(n, 5.0), np.full(n, 16.0), np.full(n, 16.0),
                np.round(replays))
        types = ("gauge", "counter", "counter", "counter", "gauge", "gauge", "gauge", "gauge", "gauge", "gauge",
                 "counter")
        for name, v, typ in zip(names, vals, types):
            put(name, gl, v, typ)
    del sbe_agg
