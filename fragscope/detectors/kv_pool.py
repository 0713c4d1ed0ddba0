"""kv-pool-undersized from metrics alone: the KV pool ran full for the traffic at the chosen
--gpu-memory-utilization while the GPU kept memory nothing used. docs/sizing.md#metrics-alone.

Mechanism: vLLM sizes its KV pool once, at start-up, as total x utilization minus the profiled non-KV
peak (weights, activations, non-torch). Whatever lies beyond total x utilization is never used by the
pool. When the pool runs out of blocks the scheduler preempts (reason kv_full) and requests queue,
while NVML shows that memory free. PyTorch's caching allocator keeps what it reserved (it returns
memory only on empty_cache), so NVML's used memory holds the engine's high-water mark between scrapes;
what a scrape can still miss is covered by the margin (sizing.SizingConfig: max(0.5 GiB, 2 % of the GPU)).

Inputs (no configuration, no log): ``vllm:cache_config_info`` labels (gpu_memory_utilization,
num_gpu_blocks, block_size; recent vLLM kv_cache_memory_bytes, kv_cache_size_tokens), NVML or DCGM
memory used/total per GPU, KV usage, preemptions (by reason where vLLM labels them: only kv_full
counts), running/waiting, request lengths. The arithmetic is :func:`fragscope.sizing.recommend`'s.
"""
from __future__ import annotations

import numpy as np

from ..model import Finding, Inconclusive
from ..promql import K, KG, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, quote, sig as psig
from ..signals import any_of, primary, wanted_by_reason
from ..sizing.arith import SizingConfig, pool_pressure
from ..sizing.detect import detect_kv_pool_undersized
from ..sizing.playbooks import KV_POOL_UNDERSIZED, kv_pool_undersized_actions
from ..sizing.playbooks import KV_POOL_UNDERSIZED_ID as ID
from ..sizing.runtime import runtime_from_frame
from ..sizing.accounting import accounting_from_cache_config
from .frame import Frame
from .kv_pressure import Config as _KvConfig

REQUIRES = ("kv_cache_usage_ratio", "preemptions_total|preemptions_by_reason_total", "cache_config_info",
            "gpu_memory_used_bytes", "gpu_memory_total_bytes")
CORROBORATES = ("kv_cache_pool_bytes", "preemptions_kv_full_total", "requests_waiting", "requests_running", "request_prompt_tokens",
                "request_generation_tokens", "torch_reserved_bytes")
Config = SizingConfig  # margin, "full" KV usage, minimum step: documented in docs/sizing.md


def detect(f: Frame, cfg: SizingConfig = SizingConfig()) -> list[Finding] | Inconclusive:
    if not f.has_engine("kv_cache_usage_ratio"):
        return Inconclusive(ID, [any_of("kv_cache_usage_ratio")], "KV-cache usage not available")
    rt = runtime_from_frame(f)
    pressure = pool_pressure(rt, cfg)
    if pressure is None:
        return Inconclusive(ID, [primary("preemptions_total")], "KV usage alone cannot tell a full pool from a busy "
                            "one: preemptions are needed")
    if not pressure:
        return []  # the pool never ran full under demand (or only priority preemptions): nothing to size
    by_reason = rt.get("preemptions_by_reason") or {}
    if not (by_reason.get("kv_full") if by_reason else rt.get("preemptions_total")):
        # KV near full with a queue but no preemption: how a saturated server looks when the batch cap,
        # compute or one sample's spike binds as well as when the pool does; only a preemption proves the
        # scheduler ran out of blocks (capacity-saturation judges the queue). `fragscope size` still sizes it.
        return []
    kv_peak = rt.get("kv_usage_peak_ratio")
    if not rt.get("preemptions_by_reason") and (kv_peak is None or kv_peak < cfg.full_kv_usage):
        # unlabelled preemptions while no sample saw the pool full: priority preemptions (V1 priority
        # scheduling) or a full pool between scrapes; a reason label would tell them apart (no released vLLM has it)
        return Inconclusive(ID, [wanted_by_reason()],
                            f"{pressure}, yet KV usage peaked at {(kv_peak or 0) * 100:.0f} % in the samples: "
                            "preempted for lack of blocks, or by priority, cannot be told")
    acc = accounting_from_cache_config(f.config, f.engine_generation)
    pool = f.engine.get("kv_cache_pool_bytes")  # the engine log's start-up figure (the agent following the log)
    if pool is not None and acc.kv_cache_memory_bytes_setting is None:
        last = pool[np.isfinite(pool)]
        if last.size and last[-1] > 0:
            acc.kv_cache_bytes = float(last[-1])
    missing = []
    if acc.gpu_memory_utilization is None and acc.kv_cache_memory_bytes_setting is None:
        missing.append(primary("cache_config_info") + "{gpu_memory_utilization}")
    if not acc.has_accounting:
        missing.append(primary("cache_config_info") + "{num_gpu_blocks}")
    for key, sig in (("device_total_bytes", "gpu_memory_total_bytes"), ("device_used_peak_bytes",
                                                                          "gpu_memory_used_bytes")):
        if rt.get(key) is None:
            missing.append(any_of(sig, engine_only=False))
    if missing:
        return Inconclusive(ID, missing, f"the KV pool ran full ({pressure}) but the utilization in force or the "
                            "GPU's headroom is not exposed")
    w = (f.start, f.end) if f.t.size else None
    res = detect_kv_pool_undersized(acc, rt, cfg, window=w, basis="level")
    if isinstance(res, list):
        for x in res:
            rec = x.context.get("recommendation") or {}
            x.context["assumption"] = (
                f"non-KV peaks = NVML's highest used sample (every {f.scrape_interval:.0f} s; the caching allocator "
                f"keeps what it reserved) plus a margin of max({cfg.margin_min_bytes / 2**30:.1f} GiB, "
                f"{cfg.margin_ratio * 100:.0f} % of the GPU)")
            if rt.get("torch_reserved_peak_bytes") is not None:
                x.context["assumption"] += (f"; PyTorch reserved peaked at {rt['torch_reserved_peak_bytes'] / 2**30:.2f} "
                                            "GiB (probe), inside that figure")
            rec.setdefault("notes", []).append(x.context["assumption"])
    return res


# --- PromQL: the level rule, for the fleet triage and the alert ---------------------------------
PREEMPT_PER_MIN = _KvConfig().preempt_per_min  # "preempting", as kv-cache-pressure's level rule counts it


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: SizingConfig = SizingConfig()) -> str:
    """KV usage p90 >= 95 % with kv_full (else unlabelled) preemptions >= 1/min while every GPU keeps >= 1 % spare.

    Preemptions count with reason kv_full where vLLM labels them, unlabelled ones otherwise; spare is what
    stays free at the GPU's peak beyond the sizing margin, max(0.5 GiB, 2 % of the GPU), and must reach one
    utilization step (value: the smallest spare share of the target's GPUs). NVML's total is needed: dcgm-exporter's default
    counters lack FB_TOTAL, so DCGM-only targets are left to the deep fetch."""
    kv = f"max by ({K}) {psig('kv_cache_usage_ratio', 'quantile_over_time(0.9, {})', present, m)}"
    kv_full = (f"sum by ({K}) {psig('preemptions_by_reason_total', 'rate({})', rate, m, extra='reason=' + quote('kv_full'))}"
               " * 60")
    labelled = f"group by ({K}) {psig('preemptions_by_reason_total', '{}', None, m)}"
    unlabelled = f"(sum by ({K}) {psig('preemptions_total', 'rate({})', rate, m)} * 60 unless on ({K}) {labelled})"
    total = f"max by ({KG}) {psig('gpu_memory_total_bytes', 'max_over_time({})', present, m)}"
    used = f"max by ({KG}) {psig('gpu_memory_used_bytes', 'max_over_time({})', present, m)}"
    margin = f"clamp_min(({total}) * {num(cfg.margin_ratio)}, {cfg.margin_min_bytes:.0f})"
    spare = f"min by ({K}) ((({total}) - ({used}) - {margin}) / (({total}) > 0))"
    return (f"(({spare}) >= {num(cfg.min_step)}) and on ({K}) ({kv} >= {num(cfg.full_kv_usage)})"
            f" and on ({K}) ((({kv_full}) or {unlabelled}) >= {num(PREEMPT_PER_MIN)})")


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("gpu_memory_spare_beyond_margin_ratio", "max_over_time", triage_check, "spare_ratio")


def alert_rule(cfg: SizingConfig = SizingConfig()) -> AlertRule:
    return AlertRule(
        "FragscopeKvPoolUndersized", ID, triage_check(cfg=cfg), "15m", "warning",
        "KV pool too small while the GPU has headroom",
        f"KV cache p90 at or above {cfg.full_kv_usage * 100:g} % and preempting for lack of blocks while every GPU "
        f"keeps more than max({cfg.margin_min_bytes / 2**30:g} GiB, {cfg.margin_ratio * 100:g} %) + "
        f"{cfg.min_step * 100:g} % free: raise --gpu-memory-utilization (diagnose --vllm URL computes the value).",
        "KV pool too small while the GPU has headroom (docs/sizing.md): preemptions for lack of blocks (reason "
        "kv_full where labelled) with memory left beyond the sizing margin at the GPU's peak.",
        {"full_kv_usage": cfg.full_kv_usage, "margin_ratio": cfg.margin_ratio, "min_step": cfg.min_step,
         "margin_min_bytes": cfg.margin_min_bytes})


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
# The playbook and its actions live with the sizing arithmetic, which reports the same id from an engine's
# start-up log (docs/sizing.md): one playbook whichever evidence found it.
PLAYBOOK = KV_POOL_UNDERSIZED
actions = kv_pool_undersized_actions
ALSO_FROM = ("log",)
RUNS_ON_SHORT_WINDOWS = True  # a level judgement: peaks over whatever window is given
