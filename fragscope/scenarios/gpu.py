"""Stage 2 of the simulator: each GPU under the engine — the PyTorch allocator (reserved, allocated,
inactive splits, retries, OOMs), utilization, SM clock, temperature, power, throttle reasons, and the
sparse kernel-timeline captures (gap p50/p99, idle share)."""
from __future__ import annotations

import numpy as np

from .. import ids
from ..kvbudget import GIB
from .mechanism import CTX_BYTES, KERNEL_EVERY_S, MAX_CLOCK_MHZ, THROTTLE_LABELS, Run
from .spec import Scenario


def simulate_gpus(s: Scenario, rng: np.random.Generator, run: Run) -> None:
    """Add the GPUs' state to ``run`` (after :func:`simulate_engine`, drawing from the same ``rng``)."""
    G, R, affected, clock, down, dt, kind = run.G, run.R, run.affected, run.clock, run.down, run.dt, run.kind
    n, nz, onset, p, r_dem, r_nom, rel = run.n, run.nz, run.onset, run.p, run.r_dem, run.r_nom, run.rel
    restart_i, sev, throttled, up = run.restart_i, run.sev, run.throttled, run.up
    # --- GPU memory / allocator ------------------------------------------------------------------
    T = float(s.gpu_memory_total_bytes)
    reserved0 = s.gpu_memory_utilization * T - CTX_BYTES
    ceiling = T - CTX_BYTES - 0.25 * GIB
    util_load = 0.95 * (1.0 - np.exp(-R / 50.0))
    reserved = np.zeros((G, n)); allocated = np.zeros((G, n)); inactive = np.zeros((G, n))
    retries_inc = np.zeros((G, n)); ooms_inc = np.zeros((G, n))
    for g in range(G):
        hit = g in affected
        gj = 1.0 + 0.08 * rng.standard_normal()  # per-GPU jitter of the pathology
        pg = np.clip(p * max(0.5, gj), 0.0, 1.0) if hit else np.zeros(n)
        gap = 0.05 - 0.01 * (R / max(r_nom, 1.0) - 1.0) + rng.normal(0, 0.002, n) * nz
        gap = np.clip(gap, 0.02, 0.08)
        res = np.full(n, reserved0) * (1.0 + rng.normal(0, 0.0005, n) * nz)
        inact_share = np.full(n, 0.3)
        retry_rate = np.zeros(n)
        oom_rate = np.zeros(n)
        if kind == ids.ALLOCATOR_FRAGMENTATION and hit:
            gap = np.minimum(0.7, gap + 0.30 * sev * pg)
            inact_share = 0.3 + 0.6 * pg
            retry_rate = (40.0 / 60.0) * sev * pg
        elif kind == "stable-slack":
            gap = np.clip(0.25 + rng.normal(0, 0.003, n) * nz, 0.2, 0.3)
            inact_share = np.full(n, 0.2)
        alloc = res * (1.0 - gap)
        if kind in (ids.MEMORY_LEAK, "leak-with-traffic") and hit:
            alloc0 = reserved0 * 0.95
            span = max(s.duration_s - onset, dt)
            rate = (ceiling * 0.965 - alloc0) / (0.92 * span) * sev * max(0.5, gj)
            age = np.maximum(0.0, rel - onset)
            if restart_i is not None and restart_i < n:
                age[restart_i:] = 0.0
            want = alloc0 + rate * age
            alloc = np.where(age > 0, want, alloc)
            res = np.where(age > 0, np.maximum(res, alloc / 0.965), res)
            over = res > ceiling
            near = res > ceiling - 0.5 * GIB
            res = np.minimum(res, ceiling)
            alloc = np.minimum(alloc, ceiling * 0.985)
            retry_rate = np.where(near, 0.5, 0.0)
            oom_rate = np.where(over, 1.0 / 60.0, 0.0)
            inact_share = np.full(n, 0.3)
        ina = (res - alloc) * inact_share
        reserved[g] = np.round(res / 512.0) * 512.0
        allocated[g] = np.round(alloc / 512.0) * 512.0
        inactive[g] = np.round(np.minimum(ina, res - alloc) / 512.0) * 512.0
        m = retry_rate * dt
        retries_inc[g] = np.maximum(0.0, m + (rng.poisson(m) - m) * nz) * up
        m = oom_rate * dt
        ooms_inc[g] = np.maximum(0.0, m + (rng.poisson(m) - m) * nz) * up
    ooms_engine = ooms_inc.sum(axis=0)

    # --- GPU utilization, clocks, temperature, power, throttle reasons --------------------------
    util = np.zeros((G, n)); temp = np.zeros((G, n)); power = np.zeros((G, n))
    reason = {r_: np.zeros((G, n)) for r_ in THROTTLE_LABELS}
    for g in range(G):
        base = util_load.copy()
        if kind == ids.ALLOCATOR_FRAGMENTATION:
            r_would = np.minimum(np.where(np.isfinite(r_dem), r_dem, s.max_num_seqs), s.max_num_seqs)
            base = np.maximum(base, 0.95 * (1.0 - np.exp(-r_would / 50.0)))
        if kind in (ids.LAUNCH_BOUND, ids.ENGINE_CPU_STARVED):
            base = base * (1.0 - 0.55 * min(sev, 1.4) * p)
        if kind == "rank-idle-by-design" and g == G - 1:
            base = np.zeros(n)  # a GPU the engine does not use (a spare, or a stage with nothing to do)
        if throttled and g in affected:
            base = base + 0.04 * p
        u = np.clip(base + rng.normal(0, 0.015, n) * nz, 0.0, 1.0)
        u[down] = 0.0
        util[g] = np.round(u, 2)
        t_base = 42.0 + 26.0 * u + rng.normal(0, 0.6, n) * nz
        pw = 85.0 + 560.0 * u + rng.normal(0, 8.0, n) * nz
        if throttled and g in affected:
            if s.throttle_reason in ("hw_thermal_slowdown", "sw_thermal_slowdown"):
                t_base = t_base + (89.0 + 2.0 * min(sev, 2.0) - t_base) * np.minimum(1.0, 1.5 * p)
            else:
                pw = np.where(p > 0, 700.0 + rng.normal(0, 3.0, n) * nz, pw)
        if kind == "rank-idle-by-design" and g == G - 1:
            clock[g] = 345.0  # idle clocks (NVML reason gpu_idle)
        ck = clock[g] - np.abs(rng.normal(0, 6.0, n)) * nz
        clock[g] = np.round(ck / 15.0) * 15.0
        active = clock[g] < MAX_CLOCK_MHZ - 60.0
        if throttled and g in affected:
            reason[s.throttle_reason][g] = active
            if s.throttle_reason in ("hw_thermal_slowdown", "hw_power_brake_slowdown"):
                reason["hw_slowdown"][g] = active
        reason["gpu_idle"][g] = u < 0.01
        temp[g] = np.round(t_base)
        power[g] = np.round(pw, 1)

    # --- kernel-timeline captures (sparse) ------------------------------------------------------
    k_idx = np.nonzero((np.floor(rel / KERNEL_EVERY_S) != np.floor((rel - dt) / KERNEL_EVERY_S)) & up)[0]
    gap50 = np.zeros((G, k_idx.size)); gap99 = np.zeros((G, k_idx.size)); idle = np.zeros((G, k_idx.size))
    for g in range(G):
        pk = p[k_idx] if g in affected else np.zeros(k_idx.size)
        m50 = np.ones(k_idx.size); m99 = np.ones(k_idx.size)
        idle_g = 1.0 - util[g, k_idx] * 0.98
        if kind == ids.ALLOCATOR_FRAGMENTATION:
            m50 = 4.0 ** (min(sev, 1.5) * pk)
            m99 = 40.0 ** (min(sev, 1.5) * pk)
            idle_g = idle_g + 0.12 * min(sev, 1.5) * pk
        elif kind in (ids.LAUNCH_BOUND, ids.ENGINE_CPU_STARVED):
            m50 = 17.5 ** (min(sev, 1.5) * pk)
            m99 = 60.0 ** (min(sev, 1.5) * pk)
        ln = lambda: np.exp(rng.normal(0, 0.15, k_idx.size) * nz)  # noqa: E731
        gap50[g] = np.round(20e-6 * m50 * ln(), 7)
        gap99[g] = np.maximum(gap50[g], np.round(50e-6 * m99 * ln(), 7))
        idle[g] = np.round(np.clip(idle_g + rng.normal(0, 0.01, k_idx.size) * nz, 0.0, 1.0), 3)

    run.__dict__.update(dict(
        T=T, reserved=reserved, allocated=allocated, inactive=inactive, retries_inc=retries_inc, ooms_inc=ooms_inc,
        ooms_engine=ooms_engine, util=util, temp=temp, power=power, reason=reason, k_idx=k_idx, gap50=gap50,
        gap99=gap99, idle=idle))
