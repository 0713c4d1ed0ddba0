"""vLLM start-up failures and run-time OOMs: the value that would have started, or that stops the OOM.

Pure; called by :func:`fragscope.sizing.recommend.recommend`. docs/sizing.md#cases.
"""
from __future__ import annotations

from .arith import (GIB, MEMORY_ELSEWHERE, RUNTIME_OOM, STARTUP_OOM, ceil_step, floor_step, g, note_memory_elsewhere,
                    oom_cause, t4, utilization_ceiling)


def vllm_startup_failure(acc, f, total, budget, non_kv, bpt, cfg, rec) -> None:
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
    note_memory_elsewhere(acc, {}, total, cfg, rec)
    if f.get("figures"):
        oom_cause(f, rec)
    if kind == "oom" and not f.get("phase"):
        # an OOM message without the start-up lines around it (a pasted traceback): it may as well come from
        # serving, and its cause (a memory cap, fragmentation, another process) is not the pool's size;
        # detect_startup_oom says the same (inconclusive), and diagnose logs judges the OOM itself
        rec.status = "inconclusive"
        rec.missing.append("the engine's start-up log around the OOM (start-up or run time cannot be told from "
                           "the OOM alone; diagnose logs FILE judges its cause)")
        return
    if f.get("requested_bytes") is None or f.get("free_bytes") is None:
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during start-up ({phase}); the message "
                          f"carries no figures ({f.get('wording', 'CUDA error')})",
                          "change": "lower --gpu-memory-utilization; the amount cannot be computed"})
        rec.missing.append("the PyTorch OOM text with figures ('Tried to allocate X ... of which Y is free'): "
                           "rerun with CUDA_LAUNCH_BLOCKING=1, or once with --enforce-eager to read the profile")
        rec.status = "inconclusive"
        return
    tot = total or (float(f["total_bytes"]) if f.get("total_bytes") else None)
    if tot is None:  # the message's total did not read (a malformed figure): no utilization can be computed
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during {phase}",
                          "change": "lower --gpu-memory-utilization; the amount cannot be computed"})
        rec.missing.append("the GPU's total memory (the OOM message's total did not read)")
        rec.status = "inconclusive"
        return
    shortfall = max(0.0, float(f["requested_bytes"]) - float(f["free_bytes"]))
    margin = cfg.margin(tot)
    base = budget if budget is not None else (tot * u0 if u0 else None)
    A.append(f"OOM during {phase}: tried to allocate {g(f['requested_bytes'])} with {g(f['free_bytes'])} free -> "
             f"short by {g(shortfall)}")
    if base is None or u0 is None:
        rec.cases.append({"case": STARTUP_OOM, "evidence": f"out of memory during {phase}",
                          "change": f"shrink the KV pool by at least {g(shortfall + margin)}"})
        if not any("gpu-memory-utilization in force" in m for m in rec.missing):  # _vllm may have said it
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


def vllm_runtime_oom(acc, o, total, budget, kv0, bpt, runtime, cfg, rec) -> None:
    A = rec.arithmetic
    rec.status = "change"
    u0 = acc.gpu_memory_utilization
    note_memory_elsewhere(acc, runtime, total, cfg, rec)
    cause = oom_cause(o, rec) if o.get("figures") else {}
    if o.get("requested_bytes") is None or total is None or budget is None or u0 is None:
        rec.cases.append({"case": RUNTIME_OOM, "evidence": "out of memory while serving",
                          "change": "lower --gpu-memory-utilization; the amount cannot be computed"})
        # name only what is absent (an OOM with all its figures is not "missing the OOM's figures")
        lack = [w for w, v in (("the OOM's figures", o.get("requested_bytes")), ("the GPU total", total),
                               ("the utilization in force", u0 if budget is None else budget)) if v is None]
        if lack and not (lack == ["the utilization in force"] and any("gpu-memory-utilization in force" in m
                                                                      for m in rec.missing)):
            rec.missing.append(", ".join(lack))
        rec.status = "inconclusive"
        return
    shortfall = max(0.0, float(o["requested_bytes"]) - float(o.get("free_bytes", 0.0)))
    margin = cfg.margin(total)
    u = floor_step((budget - shortfall - margin) / total)
    A.append(f"runtime OOM: tried to allocate {g(o['requested_bytes'])} with {g(o.get('free_bytes'))} free -> short by "
             f"{g(shortfall)}")
    A.append(f"utilization = (budget {g(budget)} - shortfall {g(shortfall)} - margin {g(margin)}) / total {g(total)} = "
             f"{t4((budget - shortfall - margin) / total)} -> {u:.2f}")
    u_max = utilization_ceiling(acc, runtime, total, budget, cfg, rec)
    if u_max is not None and u_max < u:
        A.append(f"the measured ceiling {u_max:.2f} is lower: use it")
        u = u_max
    rec.settings["--gpu-memory-utilization"] = round(u, 2)
    unalloc = o.get("reserved_unallocated_bytes")
    ev = f"out of memory while serving at utilization {u0:g}"
    if cause.get("verdict") in ("fragmentation", "fragmentation-contributed") and unalloc:
        ev += f"; {g(unalloc)} reserved by PyTorch but unallocated (fragmentation: see allocator-fragmentation)"
    elif cause.get("verdict") in ("other-process", "outside-pytorch"):
        ev += f"; {cause['judged_by']}"
    rec.cases.append({"case": RUNTIME_OOM, "evidence": ev, "change": f"--gpu-memory-utilization {u:.2f} (was {u0:g})"})
    if kv0 is not None:
        kv_new = kv0 - (u0 - u) * total
        rec.outcome["kv_cache_bytes"] = int(kv_new)
        if bpt:
            rec.outcome["kv_cache_tokens"] = int(kv_new / bpt)
            A.append(f"KV pool at {u:.2f} = {g(kv0)} - ({u0:g} - {u:.2f}) x {g(total)} = {g(kv_new)} = "
                     f"{int(kv_new / bpt):,} tokens")
