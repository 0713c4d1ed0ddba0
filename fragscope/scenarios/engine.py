"""Stage 1 of the simulator: one vLLM engine as a fluid queue, sampled every ``step_s``.

Traffic (requests/s, with a daily wave and AR(1) noise) arrives into a queue; the engine admits
requests up to the tightest of three caps (``max_num_seqs``, the KV blocks that fit, and, under
allocator fragmentation, the batch the allocator can still serve); running requests finish at the
per-sequence decode speed, which falls with batch size, clock throttling and host-bound launches.
Clients give up after ``TIMEOUT_S`` in the queue (aborts). Everything else (KV usage, tokens,
preemptions, TTFT, utilization, allocator state, kernel gaps) is derived from that state with
seeded noise. Mechanisms and figures: docs/scenarios.md.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ids
from ..kvbudget import GIB, kv_budget
from .mechanism import (GEN_LEN, K_BATCH, MAX_CLOCK_MHZ, PROMPT_LEN, REF_GEN_TOK_S, TIMEOUT_S, V0_TOK_S, Run, ramp,
                        solve_batch)
from .spec import Scenario


def simulate_engine(s: Scenario, rng: np.random.Generator) -> Run:
    """Traffic, request shape, the admission queue and preemptions of ``s`` (draws from ``rng`` in a fixed order)."""
    nz = s.noise
    n = max(1, int(round(s.duration_s / s.step_s)))
    dt = float(s.step_s)
    rel = np.arange(n, dtype=np.float64) * dt
    ts = s.start_ts + rel
    # kv-pool-undersized is kv-cache-pressure's mechanism judged with the GPU's headroom (truth.py)
    kind = ids.KV_CACHE_PRESSURE if s.kind == ids.KV_POOL_UNDERSIZED else s.kind
    sev = s.severity
    G = max(2, s.gpus) if kind in (ids.RANK_STRAGGLER, "rank-idle-by-design") else s.gpus  # a rank needs peers
    affected = tuple(g for g in (s.affected_gpus if s.affected_gpus is not None else
                                 ((0,) if kind in (ids.CLOCK_THROTTLING, "throttling-with-load") else range(G)))
                     if 0 <= g < G)
    onset = s.onset_s if s.onset_s is not None else s.duration_s / 3.0
    if kind == ids.ENGINE_STALLED and s.onset_s is None:
        onset = max(0.0, s.duration_s - 20 * 60.0)  # a hang is noticed within the hour: its last 20 minutes
    static_kind = kind == ids.KV_BLOCK_SIZE_MISMATCH
    if static_kind:
        onset = 0.0
    p = ramp(s, rel, onset) if sev > 0 else np.zeros(n)
    if static_kind:
        p[:] = 1.0

    # --- restart: engine down for a while, counters reset, the pathology clears ---------------
    down = np.zeros(n, dtype=bool)
    segments = [slice(0, n)]
    restart_i = None
    if s.restart_at_s is not None and 0 < s.restart_at_s < s.duration_s:
        restart_i = int(math.ceil(s.restart_at_s / dt))
        down_s = max(dt, 90.0)
        down[(rel >= s.restart_at_s) & (rel < s.restart_at_s + down_s)] = True
        p[rel >= s.restart_at_s] = 0.0
        if restart_i < n:
            segments = [slice(0, restart_i), slice(restart_i, n)]

    # --- request shape -------------------------------------------------------------------------
    block = s.block_size
    avg_len = s.avg_seq_len
    if kind == ids.KV_BLOCK_SIZE_MISMATCH:
        if block == 16:
            block = 64
        if avg_len is None:
            avg_len = 32
    if avg_len is not None:
        lp0, lg0 = avg_len * 2.0 / 3.0, avg_len / 3.0
    else:
        lp0, lg0 = PROMPT_LEN, GEN_LEN
    num_blocks = s.num_gpu_blocks or kv_budget(
        gpu_memory_bytes=s.gpu_memory_total_bytes, gpu_memory_utilization=s.gpu_memory_utilization,
        weights_bytes=16 * GIB / G, overhead_bytes=2 * GIB, block_size=block, num_layers=32,
        num_kv_heads=max(1, 8 // G), head_dim=128, dtype_bytes=2).num_blocks

    # --- traffic ---------------------------------------------------------------------------------
    load = s.load * {ids.CLOCK_THROTTLING: 1.45, "throttling-with-load": 1.3, ids.LAUNCH_BOUND: 0.5,
                     ids.ENGINE_CPU_STARVED: 0.5, "link-idle-downshift": 0.4}.get(kind, 1.0)
    lam0 = REF_GEN_TOK_S * load / lg0  # requests/s
    wave = np.ones(n)
    if s.daily_wave:
        phase = rng.uniform(0, 86400.0)
        wave = 1.0 + 0.2 * np.sin(2 * math.pi * (rel + phase) / 86400.0)
    else:
        rng.uniform(0, 1)  # keep later draws aligned
    e = rng.normal(0.0, 0.02, n) * nz
    ar = np.empty(n)
    acc = 0.0
    for i in range(n):  # AR(1) demand noise
        acc = 0.9 * acc + e[i]
        ar[i] = acc
    lam = lam0 * wave * np.exp(ar)
    lp = np.full(n, lp0)
    lg = np.full(n, lg0)
    eff = np.ones(n)  # per-sequence speed multiplier (clock, host-bound launches, allocator stalls)

    p_traffic = np.clip(rel / max(s.duration_s, dt), 0, 1)
    if kind == "traffic-surge":
        lam *= 1.0 + 0.4 * sev * p
    elif kind == "traffic-drop":
        lam *= 1.0 - 0.75 * min(sev, 1.2) * p
    elif kind == ids.CAPACITY_SATURATION:
        lam *= 1.0 + 1.2 * sev * p
    elif kind == "leak-with-traffic":
        lam *= 1.0 + 0.4 * p_traffic
    elif kind == "throttling-with-load":
        lam *= 1.0 + 0.35 * np.exp(-0.5 * ((rel - onset - 1800.0) / 3600.0) ** 2)
    elif kind == ids.KV_CACHE_PRESSURE:
        # longer requests: generation x1.5 and prompts long enough that the KV demand of the batch the
        # traffic needs reaches (0.9 + 0.15 × severity) × the KV pool at full progress (whatever the wave).
        lg_end = lg0 * 1.5
        r_need = solve_batch(lam0 * wave * lg_end, np.ones(n))
        r_need = np.minimum(np.where(np.isfinite(r_need), r_need, s.max_num_seqs), s.max_num_seqs)
        target = 0.9 + 0.15 * sev
        ctx_end = target * num_blocks / r_need * block - (block - 1) / 2.0
        lp_end = np.maximum(lp0, ctx_end - lg_end / 2.0)
        lp = lp0 + (lp_end - lp0) * p
        lg = lg0 + (lg_end - lg0) * p

    # clocks per GPU (MHz) and their effect on the engine (tensor parallel: the slowest GPU paces all)
    clock = np.full((G, n), MAX_CLOCK_MHZ)
    throttled = kind in (ids.CLOCK_THROTTLING, "throttling-with-load")
    clock_low = max(600.0, MAX_CLOCK_MHZ - 580.0 * sev)
    if throttled:
        for g in affected:
            clock[g] = MAX_CLOCK_MHZ - (MAX_CLOCK_MHZ - clock_low) * p
        eff = eff * clock.min(axis=0) / MAX_CLOCK_MHZ
    if kind == ids.LAUNCH_BOUND:
        eff = eff * (1.0 - 0.6 * min(sev, 1.5) * p)
    if kind == ids.ENGINE_CPU_STARVED:  # every step waits for the next CFS period (scenarios/host.py)
        eff = eff * (1.0 - 0.5 * min(sev, 1.5) * p)
    if kind == ids.RANK_STRAGGLER:  # one rank's clock (no slowdown reason): the slowest paces every step
        clock[G - 1] = MAX_CLOCK_MHZ * (1.0 - 0.16 * min(sev, 3.0) * p)  # severity 1: 84 % of the maximum
        eff = eff * clock.min(axis=0) / MAX_CLOCK_MHZ
    if kind == ids.ALLOCATOR_FRAGMENTATION:
        eff = eff * (1.0 - 0.15 * min(sev, 2.0) * p)  # retries: cache flush + device sync

    r_dem = solve_batch(lam * lg, eff)  # batch the traffic needs
    r_nom = float(np.median(solve_batch(lam0 * np.full(1, lg0), np.ones(1))))  # ~128 at load 1
    frag_cap = np.full(n, np.inf)
    if kind == ids.ALLOCATOR_FRAGMENTATION:
        r_top = min(float(s.max_num_seqs), float(np.nanmax(np.where(np.isfinite(r_dem), r_dem, s.max_num_seqs))) * 1.05)
        cap_end = max(4.0, r_nom * (1.0 - 0.75 * min(sev, 1.25)))
        frag_cap = r_top + (cap_end - r_top) * p

    # blocks per running sequence: prompt + half the generation, rounded up to blocks
    ctx = lp + lg / 2.0
    bps = np.maximum(1.0, (ctx + (block - 1) / 2.0) / block)
    kv_cap = num_blocks / bps

    arrivals = lam * dt
    arrivals = np.maximum(0.0, arrivals + (rng.poisson(arrivals) - arrivals) * nz)

    # --- the queue ------------------------------------------------------------------------------
    RP = np.zeros(n)  # batch right after admission: what holds KV blocks when the cache is the limit
    R = np.zeros(n); W = np.zeros(n); FIN = np.zeros(n); ADM = np.zeros(n); ABT = np.zeros(n)
    PRE = np.zeros(n); GEN = np.zeros(n)
    r = min(r_dem[0], s.max_num_seqs, kv_cap[0], frag_cap[0]) if np.isfinite(r_dem[0]) else s.max_num_seqs
    w = 0.0
    for i in range(n):
        if down[i]:
            r = w = 0.0
            continue
        # sub-steps short against a request's lifetime, so short requests are not under-served
        k = max(1, int(math.ceil(dt / max(0.25 * lg[i] / V0_TOK_S, 1e-3))))
        k = min(k, 400)
        h = dt / k
        cap = min(float(s.max_num_seqs), kv_cap[i], frag_cap[i])
        fin_s = adm_s = abt_s = pre_s = 0.0
        a = arrivals[i] / k
        decay = math.exp(-h / TIMEOUT_S)
        for _ in range(k):
            v = V0_TOK_S * eff[i] / (1.0 + r / K_BATCH)
            fin = r * (1.0 - math.exp(-v * h / lg[i]))
            r1 = r - fin
            pre = max(0.0, r1 - cap)
            r1 -= pre
            w += pre
            adm = min(w + a, max(0.0, cap - r1))
            r1 += adm
            w = w + a - adm
            abt = w * (1.0 - decay)
            w -= abt
            r = r1
            fin_s += fin; adm_s += adm; abt_s += abt; pre_s += pre
        # a scrape sees the batch at a random moment of the sub-step: its time average, not the peak
        x = V0_TOK_S * eff[i] / (1.0 + r / K_BATCH) * h / lg[i]
        r_seen = r * (1.0 - math.exp(-x)) / x if x > 1e-9 else r
        R[i], W[i], FIN[i], ADM[i], ABT[i], PRE[i] = r_seen, w, fin_s, adm_s, abt_s, pre_s
        RP[i] = r
        GEN[i] = fin_s * lg[i]
    up = ~down
    kv_usage = np.clip(RP * bps / num_blocks, 0.0, 1.0)

    # preemptions: batch-cap shrink + KV exhaustion while sequences grow + allocator failures
    full = np.clip((kv_usage - 0.95) / 0.05, 0.0, 1.0)
    v_now = V0_TOK_S * eff / (1.0 + R / K_BATCH)
    pre_rate = full * R * v_now / (block * bps)
    if kind == ids.ALLOCATOR_FRAGMENTATION:
        pre_rate = pre_rate + 5.0 * min(sev, 2.0) * p
    if kind == ids.CAPACITY_SATURATION:
        pre_rate = pre_rate + 0.002 * p  # a trickle
    pre_inc = PRE + pre_rate * dt
    pre_inc = np.maximum(0.0, pre_inc + (rng.poisson(pre_inc) - pre_inc) * nz) * up

    return Run(
        G=G, R=R, affected=affected, clock=clock, down=down, dt=dt, kind=kind, n=n, nz=nz, onset=onset, p=p,
        r_dem=r_dem, r_nom=r_nom, rel=rel, restart_i=restart_i, sev=sev, throttled=throttled, up=up, ABT=ABT,
        ADM=ADM, FIN=FIN, GEN=GEN, W=W, avg_len=avg_len, block=block, eff=eff, kv_usage=kv_usage, lg=lg, lg0=lg0,
        lp=lp, lp0=lp0, num_blocks=num_blocks, pre_inc=pre_inc, segments=segments, ts=ts)
