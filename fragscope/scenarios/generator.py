"""The scenario simulator: a fluid model of one vLLM engine and its GPUs, sampled every ``step_s``.

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

from ..kvbudget import GIB, expected_waste_ratio, kv_budget
from ..model import SeriesKey, make_labels
from .spec import Scenario, Truth

# --- reference operating point (seed 001 / the fragmentation reference case) ---------------------
V0_TOK_S = 11.75  # per-sequence decode speed at batch -> 0 (tokens/s)
K_BATCH = 512.0  # batch at which per-sequence speed halves: v(R) = V0 / (1 + R / K)
REF_GEN_TOK_S = 1203.0  # generation tokens/s at load 1 (batch ~128 at 9.4 tok/s/seq)
PROMPT_LEN, GEN_LEN = 512.0, 256.0  # mean tokens per request by default (avg_seq_len 768)
TIMEOUT_S = 120.0  # clients abandon queued requests after about this long
CTX_BYTES = int(1.1 * GIB)  # CUDA context + NCCL + non-torch memory per GPU
MAX_CLOCK_MHZ = 1980.0  # H100 SXM max SM clock
KERNEL_EVERY_S = 600.0  # one trace capture every 10 minutes
MODEL_LEN = 8192

# vLLM V1 TTFT buckets (vllm/v1/metrics/loggers.py; same as the cncf scrape); V0 stopped at 10 s.
TTFT_BUCKETS_V1 = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TTFT_BUCKETS_V0 = TTFT_BUCKETS_V1[:16]
# build_1_2_5_buckets(max_model_len=8192)
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
FINISHED_REASONS_V1 = ("stop", "length", "abort", "error", "repetition")
FINISHED_REASONS_V0 = ("stop", "length", "abort")
THROTTLE_LABELS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                   "hw_power_brake_slowdown")

_erf = np.frompyfunc(math.erf, 1, 1)


def _lognorm_cdf(x: float, median: np.ndarray, sigma: float) -> np.ndarray:
    z = (math.log(x) - np.log(np.maximum(median, 1e-12))) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + _erf(z).astype(np.float64))


def _ramp(s: Scenario, rel: np.ndarray, onset: float) -> np.ndarray:
    """Pathology progress 0..1 after onset (linear, exponential or a step)."""
    ramp_s = s.ramp_s if s.ramp_s else min(6 * 3600.0, max(s.duration_s - onset, s.step_s))
    x = np.clip((rel - onset) / ramp_s, 0.0, 1.0)
    if s.ramp == "step":
        p = (rel >= onset).astype(np.float64)
    elif s.ramp == "exp":
        k = 4.0
        p = (np.exp(k * x) - 1.0) / (math.exp(k) - 1.0)
    else:
        p = x
    p[rel < onset] = 0.0
    return p


def _solve_batch(gen_tok_s: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """Batch R at which R × v(R) = gen_tok_s (inf when unreachable)."""
    x = gen_tok_s / (V0_TOK_S * np.maximum(eff, 1e-6))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(x < K_BATCH * 0.999, x / (1.0 - x / K_BATCH), np.inf)
    return r


def _cum_int(x: np.ndarray, segments: list[slice], prehistory: float = 0.0) -> np.ndarray:
    """Cumulative integer counter from non-negative increments, restarting at 0 in each segment.

    ``prehistory`` (steps): the first segment starts where the counter stood after that many steps
    like the first one (the engine ran before the recording began).
    """
    out = np.empty_like(x, dtype=np.float64)
    for j, sl in enumerate(segments):
        c = np.cumsum(np.maximum(x[sl], 0.0))
        if j == 0 and c.size:
            c = c + max(float(x[sl][0]), 0.0) * prehistory
        out[sl] = np.round(c)
    return out


def generate(s: Scenario) -> tuple[dict[SeriesKey, tuple[np.ndarray, np.ndarray]], dict[str, str], Truth]:
    """Simulate ``s``; return columns (sample name + labels -> (ts, values)), sample types, and the truth."""
    rng = np.random.default_rng(s.seed)
    nz = s.noise
    n = max(1, int(round(s.duration_s / s.step_s)))
    dt = float(s.step_s)
    rel = np.arange(n, dtype=np.float64) * dt
    ts = s.start_ts + rel
    kind = s.kind
    sev = s.severity
    G = s.gpus
    affected = tuple(g for g in (s.affected_gpus if s.affected_gpus is not None else
                                 ((0,) if kind in ("clock-throttling", "throttling-with-load") else range(G)))
                     if 0 <= g < G)
    onset = s.onset_s if s.onset_s is not None else s.duration_s / 3.0
    static_kind = kind == "kv-block-size-mismatch"
    if static_kind:
        onset = 0.0
    p = _ramp(s, rel, onset) if sev > 0 else np.zeros(n)
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
    if kind == "kv-block-size-mismatch":
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
    load = s.load * {"clock-throttling": 1.45, "throttling-with-load": 1.3, "launch-bound": 0.5}.get(kind, 1.0)
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
    elif kind == "capacity-saturation":
        lam *= 1.0 + 1.2 * sev * p
    elif kind == "leak-with-traffic":
        lam *= 1.0 + 0.4 * p_traffic
    elif kind == "throttling-with-load":
        lam *= 1.0 + 0.35 * np.exp(-0.5 * ((rel - onset - 1800.0) / 3600.0) ** 2)
    elif kind == "kv-cache-pressure":
        # longer requests: generation x1.5 and prompts long enough that the KV demand of the batch the
        # traffic needs reaches (0.9 + 0.15 × severity) × the KV pool at full progress (whatever the wave).
        lg_end = lg0 * 1.5
        r_need = _solve_batch(lam0 * wave * lg_end, np.ones(n))
        r_need = np.minimum(np.where(np.isfinite(r_need), r_need, s.max_num_seqs), s.max_num_seqs)
        target = 0.9 + 0.15 * sev
        ctx_end = target * num_blocks / r_need * block - (block - 1) / 2.0
        lp_end = np.maximum(lp0, ctx_end - lg_end / 2.0)
        lp = lp0 + (lp_end - lp0) * p
        lg = lg0 + (lg_end - lg0) * p

    # clocks per GPU (MHz) and their effect on the engine (tensor parallel: the slowest GPU paces all)
    clock = np.full((G, n), MAX_CLOCK_MHZ)
    throttled = kind in ("clock-throttling", "throttling-with-load")
    clock_low = max(600.0, MAX_CLOCK_MHZ - 580.0 * sev)
    if throttled:
        for g in affected:
            clock[g] = MAX_CLOCK_MHZ - (MAX_CLOCK_MHZ - clock_low) * p
        eff = eff * clock.min(axis=0) / MAX_CLOCK_MHZ
    if kind == "launch-bound":
        eff = eff * (1.0 - 0.6 * min(sev, 1.5) * p)
    if kind == "allocator-fragmentation":
        eff = eff * (1.0 - 0.15 * min(sev, 2.0) * p)  # retries: cache flush + device sync

    r_dem = _solve_batch(lam * lg, eff)  # batch the traffic needs
    r_nom = float(np.median(_solve_batch(lam0 * np.full(1, lg0), np.ones(1))))  # ~128 at load 1
    frag_cap = np.full(n, np.inf)
    if kind == "allocator-fragmentation":
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
    if kind == "allocator-fragmentation":
        pre_rate = pre_rate + 5.0 * min(sev, 2.0) * p
    if kind == "capacity-saturation":
        pre_rate = pre_rate + 0.002 * p  # a trickle
    pre_inc = PRE + pre_rate * dt
    pre_inc = np.maximum(0.0, pre_inc + (rng.poisson(pre_inc) - pre_inc) * nz) * up

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
        if kind == "allocator-fragmentation" and hit:
            gap = np.minimum(0.7, gap + 0.30 * sev * pg)
            inact_share = 0.3 + 0.6 * pg
            retry_rate = (40.0 / 60.0) * sev * pg
        elif kind == "stable-slack":
            gap = np.clip(0.25 + rng.normal(0, 0.003, n) * nz, 0.2, 0.3)
            inact_share = np.full(n, 0.2)
        alloc = res * (1.0 - gap)
        if kind in ("memory-leak", "leak-with-traffic") and hit:
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
        if kind == "allocator-fragmentation":
            r_would = np.minimum(np.where(np.isfinite(r_dem), r_dem, s.max_num_seqs), s.max_num_seqs)
            base = np.maximum(base, 0.95 * (1.0 - np.exp(-r_would / 50.0)))
        if kind == "launch-bound":
            base = base * (1.0 - 0.55 * min(sev, 1.4) * p)
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
        if kind == "allocator-fragmentation":
            m50 = 4.0 ** (min(sev, 1.5) * pk)
            m99 = 40.0 ** (min(sev, 1.5) * pk)
            idle_g = idle_g + 0.12 * min(sev, 1.5) * pk
        elif kind == "launch-bound":
            m50 = 17.5 ** (min(sev, 1.5) * pk)
            m99 = 60.0 ** (min(sev, 1.5) * pk)
        ln = lambda: np.exp(rng.normal(0, 0.15, k_idx.size) * nz)  # noqa: E731
        gap50[g] = np.round(20e-6 * m50 * ln(), 7)
        gap99[g] = np.maximum(gap50[g], np.round(50e-6 * m99 * ln(), 7))
        idle[g] = np.round(np.clip(idle_g + rng.normal(0, 0.01, k_idx.size) * nz, 0.0, 1.0), 3)

    # --- TTFT (mixture: served at once vs queued), request-length histograms --------------------
    adm_rate = np.maximum(ADM / dt, 0.05)
    wq = np.minimum(W / adm_rate, TIMEOUT_S)
    fq = np.clip(W / (W + ADM + 1e-9), 0.0, 0.98)
    preempt_share = np.clip(pre_inc / np.maximum(ADM, 1.0), 0.0, 0.5)
    m0 = (0.045 + 0.00012 * lp) / np.maximum(eff, 0.05)
    ttft_edges = TTFT_BUCKETS_V1 if s.engine == "v1" else TTFT_BUCKETS_V0
    slow = np.clip(fq + preempt_share * (1 - fq), 0.0, 0.99)
    slow_median = m0 + np.maximum(wq, 2.0 * m0 + preempt_share * 8.0)
    ttft_cdf = [(1 - slow) * _lognorm_cdf(le, m0, 0.45) + slow * _lognorm_cdf(le, slow_median, 0.6)
                for le in ttft_edges]
    ttft_sum_inc = ADM * ((1 - slow) * m0 * math.exp(0.45**2 / 2) + slow * slow_median * math.exp(0.6**2 / 2))
    sig_len = 0.4 if lp0 < 100 else 0.8
    lp_cdf = [_lognorm_cdf(le, lp * math.exp(-sig_len**2 / 2), sig_len) for le in TOKEN_BUCKETS]
    lg_cdf = [_lognorm_cdf(le, lg * math.exp(-sig_len**2 / 2), sig_len) for le in TOKEN_BUCKETS]

    # --- assemble columns -----------------------------------------------------------------------
    cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    types: dict[str, str] = {}
    eng_labels = {"model_name": s.model_name}
    if s.engine == "v1":
        eng_labels["engine"] = "0"
    pre_h = max(0.0, s.uptime_s) / dt  # counters' history before the recording, in steps

    def put(name: str, labels: dict, values: np.ndarray, typ: str, mask: np.ndarray | None = None,
            t: np.ndarray | None = None) -> None:
        if any(name == d or name.startswith(d) for d in s.drop):
            return
        tt = t if t is not None else (ts[mask] if mask is not None else ts)
        vv = values[mask] if mask is not None else values
        if tt.size == 0:
            return
        cols[SeriesKey(name, make_labels(labels))] = (np.asarray(tt, dtype=np.float64),
                                                      np.asarray(vv, dtype=np.float64))
        types[name] = typ

    put("vllm:num_requests_running", eng_labels, np.round(R), "gauge", up)
    put("vllm:num_requests_waiting", eng_labels, np.round(W), "gauge", up)
    kv_name = "vllm:kv_cache_usage_perc" if s.engine == "v1" else "vllm:gpu_cache_usage_perc"
    kv_obs = np.clip(kv_usage * (1.0 + rng.normal(0, 0.005, n) * nz), 0.0, 1.0)
    put(kv_name, eng_labels, np.round(kv_obs, 4), "gauge", up)
    put("vllm:num_preemptions_total", eng_labels, _cum_int(pre_inc, segments, pre_h), "counter", up)
    put("vllm:prompt_tokens_total", eng_labels, _cum_int(ADM * lp, segments, pre_h), "counter", up)
    put("vllm:generation_tokens_total", eng_labels, _cum_int(GEN, segments, pre_h), "counter", up)
    reasons = FINISHED_REASONS_V1 if s.engine == "v1" else FINISHED_REASONS_V0
    fin_inc = {"stop": FIN * 0.9, "length": FIN * 0.1, "abort": ABT.copy(), "error": np.zeros(n),
               "repetition": np.zeros(n)}
    if s.engine == "v1":
        fin_inc["error"] = ooms_engine * 3.0
    else:
        fin_inc["abort"] = fin_inc["abort"] + ooms_engine * 3.0
    for rs in reasons:
        put("vllm:request_success_total", {**eng_labels, "finished_reason": rs},
            _cum_int(fin_inc[rs] * up, segments, pre_h), "counter", up)

    def histogram(name: str, edges, cdfs, count_inc, sum_inc, sum_round: int | None) -> None:
        cum_count = _cum_int(count_inc * up, segments, pre_h)
        for le, cdf in zip(edges, cdfs):
            put(f"{name}_bucket", {**eng_labels, "le": repr(float(le))},
                np.minimum(_cum_int(count_inc * cdf * up, segments, pre_h), cum_count), "histogram", up)
        put(f"{name}_bucket", {**eng_labels, "le": "+Inf"}, cum_count, "histogram", up)
        put(f"{name}_count", eng_labels, cum_count, "histogram", up)
        acc_sum = np.empty(n)
        for sl in segments:
            acc_sum[sl] = np.cumsum(np.maximum(sum_inc[sl] * up[sl], 0.0))
            if sl.start == 0 and n:
                acc_sum[sl] += max(float(sum_inc[0]), 0.0) * pre_h
        acc_sum = np.round(acc_sum, sum_round) if sum_round is not None else np.round(acc_sum)
        put(f"{name}_sum", eng_labels, acc_sum, "histogram", up)

    histogram("vllm:time_to_first_token_seconds", ttft_edges, ttft_cdf, ADM, ttft_sum_inc, 3)
    histogram("vllm:request_prompt_tokens", TOKEN_BUCKETS, lp_cdf, FIN, FIN * lp, None)
    histogram("vllm:request_generation_tokens", TOKEN_BUCKETS, lg_cdf, FIN, FIN * lg, None)
    cc = {"block_size": str(block), "cache_dtype": "auto", "enable_prefix_caching": "True",
          "gpu_memory_utilization": str(s.gpu_memory_utilization), "num_gpu_blocks": str(num_blocks),
          "num_cpu_blocks": "None" if s.engine == "v1" else "2048", "swap_space": "4.0"}
    if s.engine == "v1":
        cc["engine"] = "0"
    put("vllm:cache_config_info", cc, np.ones(n), "gauge", up)

    uuids = [f"GPU-{int(rng.integers(0, 2**32)):08x}-{int(rng.integers(0, 2**16)):04x}-"
             f"{int(rng.integers(0, 2**16)):04x}-{int(rng.integers(0, 2**16)):04x}-"
             f"{int(rng.integers(0, 2**48)):012x}" for _ in range(G)]
    used = reserved + CTX_BYTES
    used[:, down] = 0.5 * GIB
    for g in range(G):
        if s.gpu_source == "fragscope":
            gl = {"gpu": str(g), "gpu_uuid": uuids[g]}
            put("fragscope_gpu_memory_used_bytes", gl, used[g], "gauge")
            put("fragscope_gpu_memory_total_bytes", gl, np.full(n, T), "gauge")
            put("fragscope_gpu_memory_free_bytes", gl, T - used[g], "gauge")
            put("fragscope_gpu_utilization_ratio", gl, util[g], "gauge")
            put("fragscope_gpu_sm_clock_hertz", gl, clock[g] * 1e6, "gauge")
            put("fragscope_gpu_sm_clock_max_hertz", gl, np.full(n, MAX_CLOCK_MHZ * 1e6), "gauge")
            put("fragscope_gpu_temperature_celsius", gl, temp[g], "gauge")
            put("fragscope_gpu_power_watts", gl, power[g], "gauge")
            for rs in THROTTLE_LABELS:
                put("fragscope_gpu_throttle_reason_active", {**gl, "reason": rs}, reason[rs][g].astype(float), "gauge")
        elif s.gpu_source == "dcgm":
            gl = {"gpu": str(g), "UUID": uuids[g], "pci_bus_id": f"00000000:{0x18 + 0x10 * g:02X}:00.0",
                  "device": f"nvidia{g}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-1",
                  "DCGM_FI_DRIVER_VERSION": "580.105.08"}
            fb_reserved = 479.0
            used_mib = np.round(used[g] / (1024 * 1024))
            put("DCGM_FI_DEV_FB_USED", gl, used_mib, "gauge")
            put("DCGM_FI_DEV_FB_FREE", gl, np.round(T / (1024 * 1024)) - used_mib - fb_reserved, "gauge")
            put("DCGM_FI_DEV_FB_RESERVED", gl, np.full(n, fb_reserved), "gauge")
            put("DCGM_FI_DEV_GPU_UTIL", gl, np.round(util[g] * 100.0), "gauge")
            put("DCGM_FI_DEV_SM_CLOCK", gl, clock[g], "gauge")
            put("DCGM_FI_DEV_GPU_TEMP", gl, temp[g], "gauge")
            put("DCGM_FI_DEV_POWER_USAGE", gl, power[g], "gauge")
        if s.torch_probe:
            for si, sl in enumerate(segments):
                pid = str(4100 + 7 * g + 1000 * si)
                tl = {"pid": pid, "gpu": str(g)}
                m = up.copy()
                m[: sl.start] = False
                m[sl.stop:] = False
                put("fragscope_torch_allocated_bytes", tl, allocated[g], "gauge", m)
                put("fragscope_torch_reserved_bytes", tl, reserved[g], "gauge", m)
                put("fragscope_torch_inactive_split_bytes", tl, inactive[g], "gauge", m)
                put("fragscope_torch_alloc_retries_total", tl, _cum_int(retries_inc[g], segments, pre_h), "counter", m)
                put("fragscope_torch_ooms_total", tl, _cum_int(ooms_inc[g], segments, pre_h), "counter", m)
        if s.kernel_stats and k_idx.size:
            kt = ts[k_idx]
            put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.5"}, gap50[g], "summary", t=kt)
            put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.99"}, gap99[g], "summary", t=kt)
            put("fragscope_gpu_idle_ratio", {"gpu": str(g)}, idle[g], "gauge", t=kt)

    truth = _truth(s, kind, onset, block, avg_len if avg_len is not None else lp0 + lg0, ts, rel, p, R, W,
                   GEN, pre_inc, reserved, allocated, util, clock, kv_usage, ooms_inc, restart_i, affected)
    return cols, types, truth


def _truth(s, kind, onset, block, avg_len, ts, rel, p, R, W, GEN, pre_inc, reserved, allocated, util, clock,
           kv_usage, ooms_inc, restart_i, affected) -> Truth:
    diag: set[str] = set()
    tolerated: set[str] = set()
    notes = []
    present = s.severity > 0
    if kind in ("allocator-fragmentation", "kv-cache-pressure", "memory-leak", "clock-throttling",
                "launch-bound", "capacity-saturation") and present:
        diag.add(kind)
    if kind == "leak-with-traffic" and present:
        diag.add("memory-leak")
    if kind == "throttling-with-load" and present:
        diag.add("clock-throttling")
    if kind in ("clock-throttling", "throttling-with-load", "traffic-surge", "leak-with-traffic"):
        tolerated.add("capacity-saturation")
    if kind == "kv-cache-pressure":
        tolerated.add("capacity-saturation")
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
    }[kind]
    return Truth(diagnoses=diag, onset_ts=onset_ts, notes="; ".join([desc, *notes]), tolerated=tolerated - diag,
                 figures=figs)
