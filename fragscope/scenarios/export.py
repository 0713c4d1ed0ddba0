"""Stage 3 of the simulator: the run as exported series — vLLM's metric names and labels (V0/V1),
TTFT and request-length histograms, fragscope's NVML or dcgm-exporter GPU families, the torch probe per
pid (a new pid after a restart) and the sparse kernel-timeline summaries."""
from __future__ import annotations

import math

import numpy as np

from ..kvbudget import GIB
from ..model import SeriesKey, make_labels
from .mechanism import (CTX_BYTES, FINISHED_REASONS_V0, FINISHED_REASONS_V1, MAX_CLOCK_MHZ, THROTTLE_LABELS,
                        TIMEOUT_S, TOKEN_BUCKETS, TTFT_BUCKETS_V0, TTFT_BUCKETS_V1, Run, cum_int, lognorm_cdf)
from .host import host_columns
from .spec import Scenario


def export_columns(s: Scenario, rng: np.random.Generator, run: Run) -> tuple[dict, dict[str, str]]:
    """Columns (sample name + labels -> (ts, values)) and sample types of ``run`` (after the GPUs' stage)."""
    ABT, ADM, FIN, G, GEN, R, T, W = run.ABT, run.ADM, run.FIN, run.G, run.GEN, run.R, run.T, run.W
    allocated = run.allocated
    block, clock, down, dt, eff, gap50 = run.block, run.clock, run.down, run.dt, run.eff, run.gap50
    gap99, idle, inactive, k_idx, kv_usage, lg = run.gap99, run.idle, run.inactive, run.k_idx, run.kv_usage, run.lg
    lp, lp0, n, num_blocks, nz, ooms_engine = run.lp, run.lp0, run.n, run.num_blocks, run.nz, run.ooms_engine
    ooms_inc, power, pre_inc, reason, reserved = run.ooms_inc, run.power, run.pre_inc, run.reason, run.reserved
    retries_inc, segments, temp, ts, up, util = run.retries_inc, run.segments, run.temp, run.ts, run.up, run.util
    # --- TTFT (mixture: served at once vs queued), request-length histograms --------------------
    adm_rate = np.maximum(ADM / dt, 0.05)
    wq = np.minimum(W / adm_rate, TIMEOUT_S)
    fq = np.clip(W / (W + ADM + 1e-9), 0.0, 0.98)
    preempt_share = np.clip(pre_inc / np.maximum(ADM, 1.0), 0.0, 0.5)
    m0 = (0.045 + 0.00012 * lp) / np.maximum(eff, 0.05)
    ttft_edges = TTFT_BUCKETS_V1 if s.engine == "v1" else TTFT_BUCKETS_V0
    slow = np.clip(fq + preempt_share * (1 - fq), 0.0, 0.99)
    slow_median = m0 + np.maximum(wq, 2.0 * m0 + preempt_share * 8.0)
    ttft_cdf = [(1 - slow) * lognorm_cdf(le, m0, 0.45) + slow * lognorm_cdf(le, slow_median, 0.6)
                for le in ttft_edges]
    ttft_sum_inc = ADM * ((1 - slow) * m0 * math.exp(0.45**2 / 2) + slow * slow_median * math.exp(0.6**2 / 2))
    sig_len = 0.4 if lp0 < 100 else 0.8
    lp_cdf = [lognorm_cdf(le, lp * math.exp(-sig_len**2 / 2), sig_len) for le in TOKEN_BUCKETS]
    lg_cdf = [lognorm_cdf(le, lg * math.exp(-sig_len**2 / 2), sig_len) for le in TOKEN_BUCKETS]

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
    put("vllm:num_preemptions_total", eng_labels, cum_int(pre_inc, segments, pre_h), "counter", up)
    put("vllm:prompt_tokens_total", eng_labels, cum_int(ADM * lp, segments, pre_h), "counter", up)
    put("vllm:generation_tokens_total", eng_labels, cum_int(GEN, segments, pre_h), "counter", up)
    reasons = FINISHED_REASONS_V1 if s.engine == "v1" else FINISHED_REASONS_V0
    fin_inc = {"stop": FIN * 0.9, "length": FIN * 0.1, "abort": ABT.copy(), "error": np.zeros(n),
               "repetition": np.zeros(n)}
    if s.engine == "v1":
        fin_inc["error"] = ooms_engine * 3.0
    else:
        fin_inc["abort"] = fin_inc["abort"] + ooms_engine * 3.0
    for rs in reasons:
        put("vllm:request_success_total", {**eng_labels, "finished_reason": rs},
            cum_int(fin_inc[rs] * up, segments, pre_h), "counter", up)

    def histogram(name: str, edges, cdfs, count_inc, sum_inc, sum_round: int | None) -> None:
        cum_count = cum_int(count_inc * up, segments, pre_h)
        for le, cdf in zip(edges, cdfs):
            put(f"{name}_bucket", {**eng_labels, "le": repr(float(le))},
                np.minimum(cum_int(count_inc * cdf * up, segments, pre_h), cum_count), "histogram", up)
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
                put("fragscope_torch_alloc_retries_total", tl, cum_int(retries_inc[g], segments, pre_h), "counter", m)
                put("fragscope_torch_ooms_total", tl, cum_int(ooms_inc[g], segments, pre_h), "counter", m)
        if s.kernel_stats and k_idx.size:
            kt = ts[k_idx]
            put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.5"}, gap50[g], "summary", t=kt)
            put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.99"}, gap99[g], "summary", t=kt)
            put("fragscope_gpu_idle_ratio", {"gpu": str(g)}, idle[g], "gauge", t=kt)

    host_columns(s, run, put, uuids)
    return cols, types
