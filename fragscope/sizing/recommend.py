"""What to set, with the arithmetic shown: utilization / KV bytes / mem-fraction from the engine's own figures.

Pure functions over a :class:`~fragscope.sizing.startup.StartupAccounting` and a plain runtime dict
(:func:`fragscope.sizing.runtime.summarize_runtime`). No I/O, no clock. docs/sizing.md has every
formula and its source.

vLLM (V0 since 0.6.4, V1; worker.py / gpu_worker.py ``determine_available_memory``)::

    budget   = total_gpu_memory x gpu_memory_utilization
    kv_pool  = budget - weights - activation_peak - non_torch [- cuda_graph_estimate, V1 >= 0.21]
    outside  = what the process and others hold beyond the budget (CUDA graphs before 0.21, NCCL, ...)

SGLang (model_runner ``profile_max_num_token``)::

    kv_pool  = free_after_weights - free_at_init x (1 - mem_fraction_static)

A utilization is rounded *down* to 0.01 when it must stay under a ceiling and *up* when it must reach
a floor, so the value printed keeps the promise the arithmetic made.
"""
from __future__ import annotations

import math

# the record, thresholds and case ids are re-exported: callers import them from here (docs/sizing.md)
from .arith import (CASES, GIB, MEMORY_ELSEWHERE, MIB, POOL_TOO_SMALL, RUNTIME_OOM, STARTUP_OOM,  # noqa: F401
                    Recommendation, SizingConfig, budget_gpu_bytes, ceil_step, g, note_memory_elsewhere, oom_cause,
                    pool_pressure, t4, tokens_per_sequence, total_gpu_bytes, utilization_ceiling)
from ..collectors.enginelog.jobkind import KNOBS
from ..signals import primary
from .failures import vllm_runtime_oom, vllm_startup_failure
from .sglang import sglang as _sglang
from .accounting import StartupAccounting


# ---------------------------------------------------------------------------------------------
def recommend(acc: StartupAccounting, runtime: dict | None = None, cfg: SizingConfig = SizingConfig(),
              target_concurrency: int | None = None, target_len: int | None = None,
              job_kind: str | None = None) -> Recommendation:
    """The recommendation for one engine: which case applies, what to set, and the arithmetic. ``job_kind``
    (collectors/enginelog/jobkind.py) names the program when the log shows no vLLM or SGLang line."""
    runtime = runtime or {}
    rec = Recommendation(engine=acc.engine)
    if not acc.has_accounting:
        rec.status = "inconclusive"
        rec.missing.append("the engine's start-up log (the lines that size the KV cache: vLLM 'Available KV cache "
                           "memory' / 'GPU KV cache size' / '# GPU blocks', SGLang 'KV Cache is allocated')")
        return rec
    _current(acc, rec)
    f = acc.failure or {}
    if acc.engine is None and f.get("kind") == "oom" and not f.get("phase"):
        _unknown_program_oom(acc, f, cfg, rec, job_kind)
        return rec
    if acc.engine == "sglang":
        _sglang(acc, runtime, cfg, rec, target_concurrency, target_len)
    else:
        _vllm(acc, runtime, cfg, rec, target_concurrency, target_len)
    if rec.status == "ok" and not rec.cases and rec.missing:
        rec.status = "inconclusive"
    return rec


def _unknown_program_oom(acc, f: dict, cfg, rec: Recommendation, job_kind: str | None = None) -> None:
    """A PyTorch OOM in a log without any serving engine's line: the program that failed is not known to be
    vLLM or SGLang (a training loop, a notebook, a desktop application print the same message), so no engine
    flag is computed; its cause is judged as diagnose logs judges it."""
    rec.status = "inconclusive"
    oom_cause(f, rec)
    note_memory_elsewhere(acc, {}, total_gpu_bytes(acc), cfg, rec)
    k = KNOBS.get(job_kind or "unknown") if job_kind not in (None, "unknown", "vllm", "sglang") else None
    if k is not None:
        rec.notes.append(f"this log is {k['name']}'s, not vLLM's or SGLang's: their flags do not apply; its knobs: "
                         + "; ".join(x for x in (k.get("memory"), k.get("load"), k.get("length"), k.get("extra")) if x))
    else:
        rec.notes.append("no serving engine's start-up lines (vLLM, SGLang) in this log, so what produced it is "
                         "unknown: --gpu-memory-utilization / --mem-fraction-static apply only if a serving engine did; "
                         "for a plain PyTorch program or a training loop the knobs are its batch size, sequence "
                         "length, precision or quantization, and what else runs on the GPU")
    rec.missing.append("the engine's start-up log around the OOM, if a serving engine produced it (start-up or run "
                       "time cannot be told from the OOM alone; diagnose logs FILE judges its cause)")


def _current(acc: StartupAccounting, rec: Recommendation) -> None:
    for k, flag in (("gpu_memory_utilization", "--gpu-memory-utilization"),
                    ("kv_cache_memory_bytes_setting", "--kv-cache-memory-bytes"),
                    ("mem_fraction_static", "--mem-fraction-static"), ("max_num_seqs", "--max-num-seqs"),
                    ("max_model_len", "--max-model-len"), ("max_running_requests", "--max-running-requests")):
        v = getattr(acc, k)
        if v is not None:
            rec.current[flag] = v


# ---------------------------------------------------------------------------------------------
def _vllm(acc, runtime, cfg, rec, target_concurrency, target_len) -> None:
    A = rec.arithmetic
    total = total_gpu_bytes(acc)
    if total is None and runtime.get("device_total_bytes"):
        total = float(runtime["device_total_bytes"])
        rec.notes.append(f"GPU total {g(total)} from NVML (the log does not print it); NVML's total can exceed what "
                         "CUDA reports to vLLM by ~0.5 GiB (H100: 79.65 vs 79.19 GiB), so values are a little high")
    u0 = acc.gpu_memory_utilization
    budget = budget_gpu_bytes(acc, total)
    kv0 = acc.kv_cache_bytes
    if total is None:
        rec.missing.append("the GPU's total memory (vLLM's 'total_gpu_memory' / 'Free memory on device' line, or "
                           "NVML memory.total: run with the fragscope probe or sidecar)")
    if u0 is None and acc.kv_cache_memory_bytes_setting is None:
        rec.missing.append("the --gpu-memory-utilization in force (the engine's args line; default 0.9 is not "
                           "assumed)")
    if total and budget and u0:
        A.append(f"budget = total {g(total)} x gpu_memory_utilization {u0:g} = {g(budget)}")
    non_kv = None
    if budget is not None and kv0 is not None:
        non_kv = budget - kv0
        parts = [f"{n} {g(v)}" for n, v in (("weights", acc.weights_bytes), ("activation peak", acc.activation_peak_bytes),
                                              ("non-torch", acc.non_torch_memory_bytes),
                                              ("CUDA-graph estimate", acc.cuda_graph_estimate_bytes
                                               if acc.cuda_graph_in_budget else None)) if v is not None]
        A.append(f"KV pool = budget {g(budget)} - non-KV {g(non_kv)}" + (f" ({', '.join(parts)})" if parts else "")
                 + f" = {g(kv0)}")
    bpt = acc.kv_bytes_per_token
    if bpt:
        A.append(f"KV bytes per token = {g(kv0)} / {acc.pool_tokens:,} tokens = {bpt / 1024:.1f} KiB")
    f = acc.failure
    if f is not None:
        vllm_startup_failure(acc, f, total, budget, non_kv, bpt, cfg, rec)
        return
    if acc.runtime_ooms:
        vllm_runtime_oom(acc, acc.runtime_ooms[-1], total, budget, kv0, bpt, runtime, cfg, rec)
        return
    _vllm_runtime(acc, runtime, total, budget, non_kv, kv0, bpt, cfg, rec, target_concurrency, target_len)


def _vllm_runtime(acc, runtime, total, budget, non_kv, kv0, bpt, cfg, rec, target_concurrency, target_len) -> None:
    A = rec.arithmetic
    u0 = acc.gpu_memory_utilization
    note_memory_elsewhere(acc, runtime, total, cfg, rec)
    if not runtime:
        rec.missing.append("run-time evidence (a recording over a busy window: KV usage, preemptions, running and "
                           "waiting requests, sequence lengths, NVML used vs total); `fragscope size --recording`")
    L = target_len or runtime.get("seq_len_p95_tokens") or runtime.get("seq_len_mean_tokens")
    demand = target_concurrency or runtime.get("concurrent_demand_peak")
    pressure = pool_pressure(runtime, cfg)
    pinned = acc.kv_cache_memory_bytes_setting is not None  # the utilization does not size the pool
    u_max = utilization_ceiling(acc, runtime, total, budget, cfg, rec) if runtime and not pinned else None
    if L and bpt:
        per_seq = tokens_per_sequence(L, acc.block_size)
        conc0 = acc.pool_tokens // per_seq
        A.append(f"sequences of {L:,.0f} tokens ({per_seq:,} with whole blocks) the pool holds now = "
                 f"{acc.pool_tokens:,} / {per_seq:,} = {conc0:,}")
        rec.outcome["max_concurrency_now"] = conc0
    need_u = None
    if L and demand and acc.pool_tokens and not bpt:
        per_seq = tokens_per_sequence(L, acc.block_size)
        A.append(f"KV tokens the demand wants = {demand:,.0f} sequences x {per_seq:,} tokens = {demand * per_seq:,.0f} "
                 f"(the pool holds {acc.pool_tokens:,})")
    if L and bpt and demand and non_kv is not None and total:
        per_seq = tokens_per_sequence(L, acc.block_size)
        need_kv = demand * per_seq * bpt
        need_u = ceil_step((non_kv + need_kv) / total)
        A.append(f"KV for the demand = {demand:,.0f} sequences x {per_seq:,} tokens x {bpt / 1024:.1f} KiB = {g(need_kv)}")
        A.append(f"utilization for the demand = (non-KV {g(non_kv)} + {g(need_kv)}) / total {g(total)} = "
                 f"{t4((non_kv + need_kv) / total)} -> {need_u:.2f}")
        safe = 1 - cfg.margin(total) / total
        if need_u > safe:
            A.append(f"above 1 - margin / total = {t4(safe)}: no utilization on this GPU holds that demand")
    if pressure is None and not target_concurrency:
        if runtime:
            rec.missing.append("KV usage and preemptions (or SGLang retractions) over the window")
        return
    if not pressure and not target_concurrency:
        rec.notes.append("the pool never ran full in the window: no change needed for this traffic")
        if u_max is not None and u0 is not None and u_max < u0:
            rec.cases.append({"case": RUNTIME_OOM, "evidence": f"peak memory leaves less than the margin: ceiling "
                              f"{u_max:.2f} < utilization {u0:g}", "change": f"--gpu-memory-utilization {u_max:.2f}"})
            rec.settings["--gpu-memory-utilization"] = round(u_max, 2)
            rec.status = "change"
        return
    if not pressure and target_concurrency and rec.outcome.get("max_concurrency_now", -1) >= target_concurrency:
        rec.notes.append(f"the pool already holds {rec.outcome['max_concurrency_now']:,} sequences of {L:,.0f} tokens "
                         f">= the target {target_concurrency:,}: no change needed")
        return
    # the pool is too small for the traffic (or for the stated target)
    ev = pressure or f"target {target_concurrency} sequences of {L} tokens"
    if pinned and runtime:
        _vllm_pinned(acc, runtime, total, cfg, rec, ev, L)
        return
    if u_max is None or u0 is None or total is None:
        change = "a larger KV pool; the value needs the measured headroom"
        if need_u is not None and total:
            if need_u <= 1 - cfg.margin(total) / total:
                change = (f"the demand needs --gpu-memory-utilization {need_u:.2f}; set it only once peak device "
                          "memory (NVML) shows that headroom")
            else:
                change = "more than this GPU can hold: tensor parallelism, an fp8 KV cache, or fewer/shorter sequences"
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev, "change": change})
        rec.status = "inconclusive"
        return
    rec.status = "change"
    if need_u is None:
        u = u_max  # the demand is not measured: the largest pool the measured headroom allows
    elif need_u <= u0:
        u = u_max
        rec.notes.append(f"the observed demand should fit the current pool ({need_u:.2f} <= {u0:g}) yet it ran full: "
                         "sequences longer than the p95, or bursts between samples; sized to the ceiling instead")
    else:
        u = min(u_max, need_u)  # just enough for the observed demand, never above the ceiling
        if need_u > u_max:
            A.append(f"the demand needs {need_u:.2f} but the ceiling is {u_max:.2f}: the GPU cannot hold it")
    if u < u0 + cfg.min_step - 1e-9:
        # no headroom: cap concurrency instead of growing the pool
        if L and bpt:
            per_seq = tokens_per_sequence(L, acc.block_size)
            cap = max(1, acc.pool_tokens // per_seq)
            rec.settings["--max-num-seqs"] = cap
            A.append(f"--max-num-seqs = pool {acc.pool_tokens:,} tokens / {per_seq:,} per sequence = {cap}")
            rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev + "; no headroom left on the GPU",
                              "change": f"--max-num-seqs {cap} (stop preempting: queue instead), then more GPUs "
                                        "(tensor parallelism), an fp8 KV cache or shorter --max-model-len"})
        else:
            rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev + "; no headroom left on the GPU",
                              "change": "more GPUs (tensor parallelism), an fp8 KV cache or fewer concurrent sequences"})
            rec.missing.append(f"sequence lengths served ({primary('request_prompt_tokens')} + "
                               f"{primary('request_generation_tokens')})")
        return
    rec.settings["--gpu-memory-utilization"] = round(u, 2)
    change = f"--gpu-memory-utilization {u:.2f} (was {u0:g})"
    growth = (u - u0) * total
    rec.outcome["kv_cache_growth_bytes"] = int(growth)
    if kv0 is None:  # metrics alone (vllm:cache_config_info): the pool's size in bytes was not seen
        A.append(f"KV pool grows by ({u:.2f} - {u0:g}) x {g(total)} = {g(growth)}")
        change += f": the KV pool grows by {g(growth)}"
        rec.missing.append("the KV pool's size in bytes (start-up log 'Available KV cache memory' / 'GPU KV cache "
                           "size'; `fragscope size --log`) to turn that growth into tokens and sequences")
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev, "change": change})
        return
    kv_new = kv0 + growth
    A.append(f"KV pool at {u:.2f} = {g(kv0)} + ({u:.2f} - {u0:g}) x {g(total)} = {g(kv_new)}")
    rec.outcome["kv_cache_bytes"] = int(kv_new)
    if bpt:
        tokens = int(kv_new / bpt)
        rec.outcome["kv_cache_tokens"] = tokens
        A.append(f"tokens = {g(kv_new)} / {bpt / 1024:.1f} KiB = {tokens:,}")
        if L:
            per_seq = tokens_per_sequence(L, acc.block_size)
            conc = tokens // per_seq
            rec.outcome["max_concurrency"] = conc
            rec.outcome["seq_len_tokens"] = L
            A.append(f"sequences of {L:,.0f} tokens at once = {tokens:,} / {per_seq:,} = {conc:,}")
            change += f": {tokens:,} KV tokens, {conc:,} sequences of {L:,.0f} tokens"
            if demand and conc < demand:
                rec.settings["--max-num-seqs"] = conc
                change += f"; cap --max-num-seqs {conc} (demand {demand:,.0f} does not fit)"
    rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev, "change": change})


def _vllm_pinned(acc, runtime, total, cfg, rec, ev, L) -> None:
    """--kv-cache-memory-bytes is in force: it sizes the pool, not the utilization (vLLM >= 0.11).

    The pool may grow by what stayed free at the observed peak beyond the margin (NVML).
    """
    A = rec.arithmetic
    kv0 = float(acc.kv_cache_memory_bytes_setting)
    used = runtime.get("device_used_peak_bytes")
    if total is None or used is None:
        rec.missing.append("peak device memory under load (NVML used vs total) to know how far the pinned pool "
                           "(--kv-cache-memory-bytes) can grow")
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev,
                          "change": "a larger --kv-cache-memory-bytes; the value needs the measured headroom"})
        rec.status = "inconclusive"
        return
    margin = cfg.margin(total)
    spare = total - float(used) - margin
    A.append(f"spare at peak = total {g(total)} - used at peak {g(used)} (NVML) - margin {g(margin)} = {g(spare)}")
    if spare < cfg.min_step * total:
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev + "; no headroom left on the GPU",
                          "change": "more GPUs (tensor parallelism), an fp8 KV cache or fewer concurrent sequences"})
        rec.status = "change"
        return
    new = math.floor((kv0 + spare) / MIB) * MIB
    A.append(f"--kv-cache-memory-bytes = {g(kv0)} + {g(spare)} = {g(new)} (whole MiB)")
    rec.settings["--kv-cache-memory-bytes"] = int(new)
    rec.outcome["kv_cache_bytes"] = int(new)
    rec.outcome["kv_cache_growth_bytes"] = int(new - kv0)
    change = f"--kv-cache-memory-bytes {int(new)} (was {int(kv0)})"
    if acc.pool_tokens:
        bpt = kv0 / acc.pool_tokens
        tokens = int(new / bpt)
        rec.outcome["kv_cache_tokens"] = tokens
        A.append(f"tokens = {g(new)} / ({g(kv0)} / {acc.pool_tokens:,} tokens) = {tokens:,}")
        change += f": {tokens:,} KV tokens"
        if L:
            per_seq = tokens_per_sequence(L, acc.block_size)
            rec.outcome["max_concurrency"] = tokens // per_seq
            rec.outcome["seq_len_tokens"] = L
            change += f", {tokens // per_seq:,} sequences of {L:,.0f} tokens"
    rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev, "change": change})
    rec.status = "change"
