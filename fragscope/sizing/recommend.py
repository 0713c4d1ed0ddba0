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
from dataclasses import asdict, dataclass, field

from .startup import StartupAccounting

from ..units import GiB as GIB, MiB as MIB

# Case ids (contract: docs/sizing.md#cases)
STARTUP_OOM = "startup-oom"
RUNTIME_OOM = "runtime-oom"
POOL_TOO_SMALL = "pool-too-small"
MEMORY_ELSEWHERE = "memory-held-elsewhere"
CASES = (STARTUP_OOM, RUNTIME_OOM, POOL_TOO_SMALL, MEMORY_ELSEWHERE)


@dataclass(frozen=True)
class SizingConfig:
    # Headroom kept free beyond the measured peaks: max(margin_min_bytes, margin_ratio x total).
    # Sources of its size: vLLM's CUDA-graph estimate missed the real capture by 15 MiB (vllm#57475,
    # RTX 5090 24 GB) and 0.03 GiB (25 %) on a 0.11 GiB pool (vllm-windows-build#4 log); a TP=8 run
    # ended 1.37 GiB over its budget (vllm#51590). 0.5 GiB or 2 % covers the single-GPU cases; pass a
    # larger margin (--margin-gib) for tensor parallelism.
    margin_min_bytes: float = 0.5 * GIB
    margin_ratio: float = 0.02
    # "pool too small": the pool ran full while sequences waited or were preempted. vLLM preempts only
    # when no free block is left; 0.95 is the KV usage the saved V0 incident shows around preemptions.
    full_kv_usage: float = 0.95
    # a change below one utilization step (0.01) is not worth a restart
    min_step: float = 0.01
    # other processes holding less than this are noise (the CUDA context of a monitoring tool: ~0.3-0.5 GiB)
    elsewhere_min_bytes: float = 1.0 * GIB

    def margin(self, total: float) -> float:
        return max(self.margin_min_bytes, self.margin_ratio * total)


@dataclass
class Recommendation:
    engine: str | None
    cases: list[dict] = field(default_factory=list)  # {"case", "evidence", "change"}
    settings: dict = field(default_factory=dict)  # flag -> value to set
    alternatives: dict = field(default_factory=dict)  # flag -> value: another way to the same end (not both)
    current: dict = field(default_factory=dict)  # flag -> value in force
    outcome: dict = field(default_factory=dict)  # kv_cache_bytes, kv_cache_tokens, max_concurrency, ...
    arithmetic: list[str] = field(default_factory=list)  # the steps, in order, with figures
    missing: list[str] = field(default_factory=list)  # what to capture to decide
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  # "ok" (nothing to change) | "change" | "inconclusive"

    def to_dict(self) -> dict:
        d = asdict(self)
        return _finite(d)


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def g(x: float | None) -> str:
    """GiB with two decimals (the engines' own precision); MiB below 1 GiB so small figures stay visible."""
    if x is None:
        return "n/a"
    if abs(x) < GIB:
        return f"{x / MIB:.2f} MiB"
    return f"{x / GIB:.2f} GiB"


def floor_step(u: float, step: float = 0.01) -> float:
    return math.floor(u / step + 1e-9) * step


def ceil_step(u: float, step: float = 0.01) -> float:
    return math.ceil(u / step - 1e-9) * step


def t4(x: float) -> str:
    """A ratio truncated (not rounded) to 4 decimals, so '0.95998 -> 0.95' never reads '0.9600 -> 0.95'."""
    return f"{math.floor(x * 1e4 + 1e-9) / 1e4:.4f}"


def tokens_per_sequence(length: float, block_size: int | None) -> int:
    """KV tokens one sequence of ``length`` tokens occupies: whole blocks (vLLM allocates by block)."""
    b = block_size or 1
    return int(math.ceil(length / b) * b)


# ---------------------------------------------------------------------------------------------
def recommend(acc: StartupAccounting, runtime: dict | None = None, cfg: SizingConfig = SizingConfig(),
              target_concurrency: int | None = None, target_len: int | None = None) -> Recommendation:
    """The recommendation for one engine: which case applies, what to set, and the arithmetic."""
    runtime = runtime or {}
    rec = Recommendation(engine=acc.engine)
    if not acc.has_accounting:
        rec.status = "inconclusive"
        rec.missing.append("the engine's start-up log (the lines that size the KV cache: vLLM 'Available KV cache "
                           "memory' / 'GPU KV cache size' / '# GPU blocks', SGLang 'KV Cache is allocated')")
        return rec
    _current(acc, rec)
    if acc.engine == "sglang":
        _sglang(acc, runtime, cfg, rec, target_concurrency, target_len)
    else:
        _vllm(acc, runtime, cfg, rec, target_concurrency, target_len)
    if rec.status == "ok" and not rec.cases and rec.missing:
        rec.status = "inconclusive"
    return rec


def _current(acc: StartupAccounting, rec: Recommendation) -> None:
    for k, flag in (("gpu_memory_utilization", "--gpu-memory-utilization"),
                    ("kv_cache_memory_bytes_setting", "--kv-cache-memory-bytes"),
                    ("mem_fraction_static", "--mem-fraction-static"), ("max_num_seqs", "--max-num-seqs"),
                    ("max_model_len", "--max-model-len"), ("max_running_requests", "--max-running-requests")):
        v = getattr(acc, k)
        if v is not None:
            rec.current[flag] = v


def _total(acc: StartupAccounting) -> float | None:
    if acc.total_gpu_memory_bytes:
        return acc.total_gpu_memory_bytes
    f = acc.failure or {}
    for k in ("total_bytes",):
        if f.get(k):
            return float(f[k])
    for o in acc.runtime_ooms:
        if o.get("total_bytes"):
            return float(o["total_bytes"])
    return None


def _budget(acc: StartupAccounting, total: float | None) -> float | None:
    if acc.requested_memory_bytes:
        return acc.requested_memory_bytes
    if total and acc.gpu_memory_utilization:
        return total * acc.gpu_memory_utilization
    return None


def _others_from_oom(o: dict) -> float | None:
    procs = o.get("other_processes") or []
    if not procs:
        return None
    this = o.get("process_in_use_bytes")
    # PyTorch >= 2.2 lists every process on the device, this one included ("this process has")
    return float(sum(p["bytes"] for p in procs if this is None or abs(p["bytes"] - this) > MIB))


# ---------------------------------------------------------------------------------------------
def _vllm(acc, runtime, cfg, rec, target_concurrency, target_len) -> None:
    A = rec.arithmetic
    total = _total(acc)
    if total is None and runtime.get("device_total_bytes"):
        total = float(runtime["device_total_bytes"])
        rec.notes.append(f"GPU total {g(total)} from NVML (the log does not print it); NVML's total can exceed what "
                         "CUDA reports to vLLM by ~0.5 GiB (H100: 79.65 vs 79.19 GiB), so values are a little high")
    u0 = acc.gpu_memory_utilization
    budget = _budget(acc, total)
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
        _vllm_startup_failure(acc, f, total, budget, non_kv, bpt, cfg, rec)
        return
    if acc.runtime_ooms:
        _vllm_runtime_oom(acc, acc.runtime_ooms[-1], total, budget, kv0, bpt, runtime, cfg, rec)
        return
    _vllm_runtime(acc, runtime, total, budget, non_kv, kv0, bpt, cfg, rec, target_concurrency, target_len)


def _outside(acc, runtime, total, budget, rec) -> tuple[float | None, str]:
    """Memory held beyond the engine's budget at the observed peak (this engine's extras + others).

    Only a measurement counts (NVML used at peak): the start-up log's CUDA-graph figure alone misses
    other processes and activation growth, so it is shown, never used to grow the pool.
    """
    used = runtime.get("device_used_peak_bytes")
    if used is not None and budget is not None:
        return max(0.0, float(used) - budget), (f"device used at peak {g(used)} (NVML) - budget {g(budget)}")
    if acc.cuda_graph_bytes is not None and not acc.cuda_graph_in_budget:
        rec.notes.append(f"CUDA graphs took {g(acc.cuda_graph_bytes)} outside the budget at start-up (log); the "
                         "headroom also needs what other processes and activation peaks held: not measured")
    return None, ""


def _ceiling(acc, runtime, total, budget, cfg, rec) -> float | None:
    """The highest utilization that keeps the observed outside-budget memory plus the margin free."""
    if total is None or budget is None:
        return None
    out, why = _outside(acc, runtime, total, budget, rec)
    margin = cfg.margin(total)
    if out is None:
        rec.missing.append("peak device memory under load (NVML used vs total over a busy window: a recording "
                           "from the fragscope sidecar or `fragscope record`) to know the headroom outside the "
                           "budget")
        return None
    u_max = floor_step((total - out - margin) / total)
    rec.arithmetic.append(f"outside the budget at peak = {why} = {g(out)}")
    rec.arithmetic.append(f"ceiling = (total {g(total)} - outside {g(out)} - margin {g(margin)}) / total = "
                          f"{t4((total - out - margin) / total)} -> {u_max:.2f}")
    return u_max


def _elsewhere(acc, runtime, total, cfg, rec) -> None:
    others = runtime.get("other_processes_peak_bytes")
    if others is None:
        for o in ([acc.failure] if acc.failure else []) + acc.runtime_ooms:
            v = _others_from_oom(o) if o else None
            if v is not None:
                others = v
    if others is not None and others >= cfg.elsewhere_min_bytes:
        rec.status = "change"
        rec.cases.append({
            "case": MEMORY_ELSEWHERE,
            "evidence": f"other processes hold {g(others)} of this GPU" + (f" ({others / total * 100:.1f} %)" if total else ""),
            "change": "move them off this GPU (or give this engine a dedicated GPU / MIG slice); until then every "
                      "utilization below is computed with that memory taken"})


def _vllm_startup_failure(acc, f, total, budget, non_kv, bpt, cfg, rec) -> None:
    A = rec.arithmetic
    kind = f["kind"]
    u0 = acc.gpu_memory_utilization
    rec.status = "change"
    if kind == "startup-shortfall":
        free, tot, req = f["free_bytes"], f["total_bytes"], f["requested_bytes"]
        others = tot - free
        margin = cfg.margin(tot)
        u = floor_step((free - margin) / tot)
        A.append(f"free at start {g(free)} of {g(tot)}: {g(others)} held before this engine started")
        A.append(f"requested {g(req)} = {tot / GIB:.2f} GiB x {f['gpu_memory_utilization']:g} > free {g(free)}")
        A.append(f"utilization that fits = (free {g(free)} - margin {g(margin)}) / total {g(tot)} = "
                 f"{t4((free - margin) / tot)} -> {u:.2f}")
        rec.cases.append({"case": MEMORY_ELSEWHERE, "evidence": f"{g(others)} of the GPU was in use before start-up "
                          f"(another process, a zombie engine, or another vLLM instance)",
                          "change": "free that memory, or start with the utilization below"})
        rec.cases.append({"case": STARTUP_OOM, "evidence": "vLLM refused to start: free memory below the requested "
                          "budget", "change": f"--gpu-memory-utilization {u:.2f}"})
        if u <= 0:
            rec.notes.append("no utilization fits: the GPU is effectively full; free it first")
        else:
            rec.settings["--gpu-memory-utilization"] = round(u, 2)
        if acc.weights_bytes is None:
            rec.notes.append("whether the model still fits at that utilization is unknown (the log stopped before "
                             "loading weights): weights + activations must stay under the new budget")
        return
    if kind in ("no-kv-memory", "kv-insufficient"):
        _vllm_pool_cannot_hold(acc, f, total, budget, non_kv, bpt, cfg, rec)
        return
    # an OOM while starting
    phase = f.get("phase") or "unknown"
    _elsewhere(acc, {}, total, cfg, rec)
    if f.get("requested_bytes") is None or f.get("free_bytes") is None:
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during start-up ({phase}); the message "
                          f"carries no figures ({f.get('wording', 'CUDA error')})",
                          "change": "lower --gpu-memory-utilization; the amount cannot be computed"})
        rec.missing.append("the PyTorch OOM text with figures ('Tried to allocate X ... of which Y is free'): "
                           "rerun with CUDA_LAUNCH_BLOCKING=1, or once with --enforce-eager to read the profile")
        rec.status = "inconclusive"
        return
    tot = total or float(f["total_bytes"])
    shortfall = max(0.0, float(f["requested_bytes"]) - float(f["free_bytes"]))
    margin = cfg.margin(tot)
    base = budget if budget is not None else (tot * u0 if u0 else None)
    A.append(f"OOM during {phase}: tried to allocate {g(f['requested_bytes'])} with {g(f['free_bytes'])} free -> "
             f"short by {g(shortfall)}")
    if base is None or u0 is None:
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during {phase}",
                          "change": f"shrink the KV pool by at least {g(shortfall + margin)}"})
        rec.missing.append("the --gpu-memory-utilization in force")
        return
    u = floor_step((base - shortfall - margin) / tot)
    A.append(f"utilization that would have started = (budget {g(base)} - shortfall {g(shortfall)} - margin "
             f"{g(margin)}) / total {g(tot)} = {t4((base - shortfall - margin) / tot)} -> {u:.2f}")
    change = f"--gpu-memory-utilization {u:.2f} (was {u0:g})"
    rec.settings["--gpu-memory-utilization"] = round(u, 2)
    if acc.kv_cache_bytes is not None:
        kvb = int(acc.kv_cache_bytes - shortfall - margin)
        A.append(f"or pin the pool: --kv-cache-memory-bytes = KV {g(acc.kv_cache_bytes)} - shortfall - margin = "
                 f"{kvb:,} bytes ({g(kvb)})")
        rec.outcome["kv_cache_bytes"] = kvb
        if acc.kv_bytes_per_token:
            rec.outcome["kv_cache_tokens"] = int(kvb / acc.kv_bytes_per_token)
    rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during {phase} at utilization {u0:g}",
                      "change": change})
    if phase == "graph-capture":
        rec.notes.append("CUDA-graph capture needs memory the failed run never measured: the value frees the failed "
                         "allocation plus the margin, a lower bound. If it fails again, run once with "
                         "--enforce-eager (or fewer --cudagraph-capture-sizes) and read 'Graph capturing finished "
                         "... took X GiB' from a successful start.")


def _vllm_pool_cannot_hold(acc, f, total, budget, non_kv, bpt, cfg, rec) -> None:
    A = rec.arithmetic
    u0 = acc.gpu_memory_utilization
    if f["kind"] == "kv-insufficient":
        L = f["max_model_len"]
        need, avail = f.get("needed_bytes"), f.get("available_bytes")
        if need is None and f.get("available_tokens") is not None:  # V0 wording: tokens, not bytes
            have = f["available_tokens"]
            A.append(f"one sequence of max_model_len {L:,} needs {L:,} KV tokens; the pool holds {have:,}")
            if bpt:
                need, avail = L * bpt, have * bpt
            est = have
        else:
            A.append(f"one sequence of max_model_len {L:,} needs {g(need)} of KV; the pool has {g(avail)}")
            est = f.get("estimated_max_model_len")
        options = []
        if est:
            options.append(f"--max-model-len {est}")
        if need is not None and total and u0:
            margin = cfg.margin(total)
            u = ceil_step(u0 + (need - avail) / total)
            A.append(f"utilization for one full-length sequence = {u0:g} + (need {g(need)} - have {g(avail)}) / total "
                     f"{g(total)} = {u0 + (need - avail) / total:.4f} -> {u:.2f} (must stay <= 1 - margin/total = "
                     f"{1 - margin / total:.4f})")
            if u <= 1 - margin / total:
                options.insert(0, f"--gpu-memory-utilization {u:.2f}")
                rec.settings["--gpu-memory-utilization"] = round(u, 2)  # keeps the model length asked for
        if est:
            (rec.alternatives if rec.settings else rec.settings)["--max-model-len"] = est
        if need is None or not (total and u0):
            rec.notes.append("the utilization that would hold one full-length sequence needs the GPU total, the "
                             "utilization in force and the KV bytes per token (not all in this log)")
        rec.cases.append({"case": STARTUP_OOM, "evidence": "the KV pool cannot hold one sequence of max_model_len",
                          "change": " or ".join(options) or "more GPUs (tensor parallelism) or an fp8 KV cache"})
        return
    # "No available memory for the cache blocks": the budget does not cover weights + activations
    parts = {k: getattr(acc, k) for k in ("weights_bytes", "activation_peak_bytes", "non_torch_memory_bytes")}
    known = {k: v for k, v in parts.items() if v is not None}
    evidence = "the budget does not cover weights + activations: no KV blocks left ('No available memory for the cache blocks')"
    if total is None or u0 is None or "weights_bytes" not in known:
        rec.cases.append({"case": STARTUP_OOM, "evidence": evidence,
                          "change": "raise --gpu-memory-utilization (it is a cap on the engine's whole footprint, "
                                    "not the KV share)"})
        rec.missing.append("the profile split (weights, activation peak, non-torch) and the GPU total: they are on the "
                           "'model weights take ... ' / 'Model loading took' lines at INFO (V1 >= 0.10 prints the "
                           "split only at DEBUG: VLLM_LOGGING_LEVEL=DEBUG)")
        rec.status = "inconclusive"
        return
    margin = cfg.margin(total)
    non_kv_need = sum(known.values())
    min_kv = 0.0
    if bpt and acc.max_model_len:
        min_kv = bpt * acc.max_model_len
    u = ceil_step((non_kv_need + min_kv) / total + 0.01)
    A.append("non-KV need = " + " + ".join(f"{k.replace('_bytes', '').replace('_', ' ')} {g(v)}" for k, v in known.items())
             + f" = {g(non_kv_need)}")
    A.append(f"floor = (non-KV {g(non_kv_need)} + one max-length sequence {g(min_kv)}) / total {g(total)} + one "
             f"step = {(non_kv_need + min_kv) / total + 0.01:.4f} -> {u:.2f}")
    if u > 1 - margin / total:
        rec.cases.append({"case": STARTUP_OOM, "evidence": evidence, "change": "the model does not fit this GPU with "
                          "room for a KV pool: use tensor parallelism, a quantized checkpoint, or a larger GPU"})
    else:
        rec.settings["--gpu-memory-utilization"] = round(u, 2)
        rec.cases.append({"case": STARTUP_OOM, "evidence": evidence,
                          "change": f"--gpu-memory-utilization {u:.2f} (was {u0:g}); that is the floor: each further "
                                    "0.01 adds " + g(total * 0.01) + " of KV"})
    if not bpt:
        rec.notes.append("KV bytes per token are unknown (no pool was made): the floor holds no full-length sequence; "
                         "`fragscope kv-budget --model-config config.json` gives the per-token size")


def _vllm_runtime_oom(acc, o, total, budget, kv0, bpt, runtime, cfg, rec) -> None:
    A = rec.arithmetic
    rec.status = "change"
    u0 = acc.gpu_memory_utilization
    _elsewhere(acc, runtime, total, cfg, rec)
    if o.get("requested_bytes") is None or total is None or budget is None or u0 is None:
        rec.cases.append({"case": RUNTIME_OOM, "evidence": "out of memory while serving",
                          "change": "lower --gpu-memory-utilization; the amount cannot be computed"})
        rec.missing.append("the OOM's figures, the GPU total and the utilization in force")
        rec.status = "inconclusive"
        return
    shortfall = max(0.0, float(o["requested_bytes"]) - float(o.get("free_bytes", 0.0)))
    margin = cfg.margin(total)
    u = floor_step((budget - shortfall - margin) / total)
    A.append(f"runtime OOM: tried to allocate {g(o['requested_bytes'])} with {g(o.get('free_bytes'))} free -> short by "
             f"{g(shortfall)}")
    A.append(f"utilization = (budget {g(budget)} - shortfall {g(shortfall)} - margin {g(margin)}) / total {g(total)} = "
             f"{t4((budget - shortfall - margin) / total)} -> {u:.2f}")
    u_max = _ceiling(acc, runtime, total, budget, cfg, rec)
    if u_max is not None and u_max < u:
        A.append(f"the measured ceiling {u_max:.2f} is lower: use it")
        u = u_max
    rec.settings["--gpu-memory-utilization"] = round(u, 2)
    unalloc = o.get("reserved_unallocated_bytes")
    ev = f"out of memory while serving at utilization {u0:g}"
    if unalloc:
        ev += f"; {g(unalloc)} reserved by PyTorch but unallocated (fragmentation: see allocator-fragmentation)"
    rec.cases.append({"case": RUNTIME_OOM, "evidence": ev, "change": f"--gpu-memory-utilization {u:.2f} (was {u0:g})"})
    if kv0 is not None:
        kv_new = kv0 - (u0 - u) * total
        rec.outcome["kv_cache_bytes"] = int(kv_new)
        if bpt:
            rec.outcome["kv_cache_tokens"] = int(kv_new / bpt)
            A.append(f"KV pool at {u:.2f} = {g(kv0)} - ({u0:g} - {u:.2f}) x {g(total)} = {g(kv_new)} = "
                     f"{int(kv_new / bpt):,} tokens")


def _vllm_runtime(acc, runtime, total, budget, non_kv, kv0, bpt, cfg, rec, target_concurrency, target_len) -> None:
    A = rec.arithmetic
    u0 = acc.gpu_memory_utilization
    _elsewhere(acc, runtime, total, cfg, rec)
    if not runtime:
        rec.missing.append("run-time evidence (a recording over a busy window: KV usage, preemptions, running and "
                           "waiting requests, sequence lengths, NVML used vs total); `fragscope size --recording`")
    L = target_len or runtime.get("seq_len_p95_tokens") or runtime.get("seq_len_mean_tokens")
    demand = target_concurrency or runtime.get("concurrent_demand_peak")
    pressure = _pool_pressure(runtime, cfg)
    u_max = _ceiling(acc, runtime, total, budget, cfg, rec) if runtime else None
    if L and bpt:
        per_seq = tokens_per_sequence(L, acc.block_size)
        conc0 = acc.pool_tokens // per_seq
        A.append(f"sequences of {L:,.0f} tokens ({per_seq:,} with whole blocks) the pool holds now = "
                 f"{acc.pool_tokens:,} / {per_seq:,} = {conc0:,}")
        rec.outcome["max_concurrency_now"] = conc0
    need_u = None
    if L and bpt and demand and non_kv is not None and total:
        per_seq = tokens_per_sequence(L, acc.block_size)
        need_kv = demand * per_seq * bpt
        need_u = ceil_step((non_kv + need_kv) / total)
        A.append(f"KV for the demand = {demand:,.0f} sequences x {per_seq:,} tokens x {bpt / 1024:.1f} KiB = {g(need_kv)}")
        A.append(f"utilization for the demand = (non-KV {g(non_kv)} + {g(need_kv)}) / total {g(total)} = "
                 f"{t4((non_kv + need_kv) / total)} -> {need_u:.2f}")
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
    # the pool is too small for the traffic (or for the stated target)
    ev = pressure or f"target {target_concurrency} sequences of {L} tokens"
    if u_max is None or u0 is None or total is None or kv0 is None:
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": ev, "change": "a larger KV pool; the value needs the "
                          "measured headroom"})
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
            rec.missing.append("sequence lengths served (vllm:request_prompt_tokens + request_generation_tokens)")
        return
    kv_new = kv0 + (u - u0) * total
    A.append(f"KV pool at {u:.2f} = {g(kv0)} + ({u:.2f} - {u0:g}) x {g(total)} = {g(kv_new)}")
    rec.settings["--gpu-memory-utilization"] = round(u, 2)
    rec.outcome["kv_cache_bytes"] = int(kv_new)
    change = f"--gpu-memory-utilization {u:.2f} (was {u0:g})"
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


def _pool_pressure(runtime: dict, cfg: SizingConfig) -> str | None | bool:
    """A sentence when the pool ran full under demand; False when it was watched and never did; None: unknown."""
    if not runtime:
        return None
    kv = runtime.get("kv_usage_peak_ratio")
    pre = runtime.get("preemptions_total")
    by_reason = runtime.get("preemptions_by_reason") or {}
    waiting = runtime.get("waiting_peak")
    if kv is None and pre is None:
        return None
    bits = []
    kv_full_pre = by_reason.get("kv_full")
    if by_reason:
        if kv_full_pre:
            bits.append(f"{kv_full_pre:,.0f} preemptions for lack of KV blocks (reason kv_full)")
        other = {k: v for k, v in by_reason.items() if k != "kv_full" and v}
        if other:
            bits.append("other preemptions: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(other.items())) +
                        " (not a pool-size problem)")
        if not kv_full_pre:
            bits = [b for b in bits if not b.startswith("other")]
    elif pre:
        bits.append(f"{pre:,.0f} preemptions")
    full = kv is not None and kv >= cfg.full_kv_usage
    if full:
        bits.insert(0, f"KV usage peaked at {kv * 100:.1f} %")
        if waiting:
            bits.append(f"{waiting:,.0f} requests waiting at peak")
    kv_full_evidence = bool(kv_full_pre) if by_reason else bool(pre)
    if kv_full_evidence or (full and waiting):
        return "; ".join(bits)
    return False


# ---------------------------------------------------------------------------------------------
def _sglang(acc, runtime, cfg, rec, target_concurrency, target_len) -> None:
    """SGLang: kv_pool = free_after_weights - free_at_init x (1 - mem_fraction_static)."""
    A = rec.arithmetic
    m0 = acc.mem_fraction_static
    T = acc.sglang_free_at_init_bytes
    if T is None and acc.sglang_free_after_weights_bytes is not None and acc.weights_bytes is not None:
        T = acc.sglang_free_after_weights_bytes + acc.weights_bytes
        A.append(f"memory at init = free after weights {g(acc.sglang_free_after_weights_bytes)} + weights "
                 f"{g(acc.weights_bytes)} = {g(T)}")
    bpt = acc.kv_bytes_per_token
    if bpt:
        A.append(f"KV bytes per token = {g(acc.kv_cache_bytes)} / {acc.pool_tokens:,} tokens = {bpt / 1024:.1f} KiB")
    head = acc.sglang_free_after_graphs_bytes or acc.sglang_free_after_pool_bytes
    if head is not None:
        A.append(f"left outside the pool for activations after start-up: {g(head)}")
    if m0 is None:
        rec.missing.append("mem_fraction_static in force (the server_args line; SGLang picks it per GPU when unset)")
    if T is None:
        rec.missing.append("SGLang's 'Load weight begin/end ... avail mem' lines")
    f = acc.failure
    if f is not None:
        rec.status = "change"
        if f["kind"] == "no-kv-memory":
            rec.cases.append({"case": STARTUP_OOM, "evidence": "SGLang found no memory for the KV pool ('Not enough "
                              "memory. Please try to increase --mem-fraction-static')",
                              "change": "raise --mem-fraction-static (it is the share the pool and weights may use, "
                                        "counted from the memory free at init)"})
            if T and m0 is not None and acc.sglang_free_after_weights_bytes is not None:
                need_reserved = acc.sglang_free_after_weights_bytes - (bpt or 0) * (acc.context_len or 0)
                m = ceil_step(1 - need_reserved / T + 0.01)
                A.append(f"mem_fraction_static floor = 1 - (free after weights - one context) / init = {m:.2f}")
                rec.settings["--mem-fraction-static"] = round(m, 2)
            return
        if f["kind"] == "oom" and f.get("requested_bytes") is not None and T and m0 is not None:
            short = max(0.0, f["requested_bytes"] - f.get("free_bytes", 0.0))
            margin = cfg.margin(T)
            m = floor_step(m0 - (short + margin) / T)
            A.append(f"OOM during {f.get('phase') or 'start-up'}: short by {g(short)}; mem_fraction_static = {m0:g} - "
                     f"(short {g(short)} + margin {g(margin)}) / init {g(T)} = {t4(m0 - (short + margin) / T)} -> {m:.2f}")
            rec.settings["--mem-fraction-static"] = round(m, 2)
            rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during {f.get('phase') or 'start-up'}",
                              "change": f"--mem-fraction-static {m:.2f} (was {m0:g})"})
            return
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"start-up failed ({f['kind']})",
                          "change": "lower --mem-fraction-static; the amount needs the OOM's figures"})
        rec.status = "inconclusive"
        return
    if acc.runtime_ooms:
        o = acc.runtime_ooms[-1]
        rec.status = "change"
        if o.get("requested_bytes") is not None and T and m0 is not None:
            short = max(0.0, o["requested_bytes"] - o.get("free_bytes", 0.0))
            margin = cfg.margin(T)
            m = floor_step(m0 - (short + margin) / T)
            A.append(f"runtime OOM short by {g(short)}: mem_fraction_static = {m0:g} - (short + margin {g(margin)}) / "
                     f"init {g(T)} = {m:.2f}")
            rec.settings["--mem-fraction-static"] = round(m, 2)
            rec.cases.append({"case": RUNTIME_OOM, "evidence": "out of memory while serving (activations outgrew the "
                              "memory left outside the pool)", "change": f"--mem-fraction-static {m:.2f} (was {m0:g})"})
        else:
            rec.cases.append({"case": RUNTIME_OOM, "evidence": "out of memory while serving",
                              "change": "lower --mem-fraction-static"})
            rec.status = "inconclusive"
        return
    pressure = _pool_pressure(runtime, cfg)
    if not runtime:
        rec.missing.append("run-time evidence (token usage, retractions, queue, NVML used vs total)")
        return
    if not pressure:
        if pressure is False:
            rec.notes.append("the pool never ran full in the window: no change needed for this traffic")
        return
    used = runtime.get("device_used_peak_bytes")
    total = runtime.get("device_total_bytes")
    if used is None or total is None or T is None or m0 is None:
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": pressure,
                          "change": "a larger --mem-fraction-static; the value needs peak device memory (NVML)"})
        rec.missing.append("peak device memory under load (NVML used vs total)")
        rec.status = "inconclusive"
        return
    margin = cfg.margin(total)
    spare = total - used - margin
    m = floor_step(m0 + spare / T)
    A.append(f"spare at peak = total {g(total)} - used {g(used)} - margin {g(margin)} = {g(spare)}")
    A.append(f"mem_fraction_static = {m0:g} + spare / init {g(T)} = {t4(m0 + spare / T)} -> {m:.2f}")
    if m < m0 + cfg.min_step - 1e-9:
        rec.cases.append({"case": POOL_TOO_SMALL, "evidence": pressure + "; no headroom left on the GPU",
                          "change": "lower --max-running-requests, or more GPUs / an fp8 KV cache"})
        rec.status = "change"
        return
    rec.status = "change"
    rec.settings["--mem-fraction-static"] = round(m, 2)
    kv_new = acc.kv_cache_bytes + (m - m0) * T if acc.kv_cache_bytes is not None else None
    change = f"--mem-fraction-static {m:.2f} (was {m0:g})"
    if kv_new is not None and bpt:
        tokens = int(kv_new / bpt)
        rec.outcome.update(kv_cache_bytes=int(kv_new), kv_cache_tokens=tokens)
        A.append(f"pool = {g(acc.kv_cache_bytes)} + ({m:.2f} - {m0:g}) x {g(T)} = {g(kv_new)} = {tokens:,} tokens")
        change += f": {tokens:,} KV tokens"
    rec.cases.append({"case": POOL_TOO_SMALL, "evidence": pressure, "change": change})
