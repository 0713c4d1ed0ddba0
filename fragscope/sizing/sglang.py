"""SGLang: kv_pool = free_after_weights - free_at_init x (1 - mem_fraction_static) (ModelRunner.profile_max_num_token).

Pure; called by :func:`fragscope.sizing.recommend.recommend`. docs/sizing.md.
"""
from __future__ import annotations

from .arith import (POOL_TOO_SMALL, RUNTIME_OOM, STARTUP_OOM, ceil_step, floor_step, g, t4, pool_pressure)


# ---------------------------------------------------------------------------------------------
def sglang(acc, runtime, cfg, rec, target_concurrency, target_len) -> None:
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
    # the headroom is the lowest free figure logged after the pool: workspaces and graph capture take from it after
    # "Memory pool end" (sglang_gemma3_startup.log: 14.61 GB at pool end, 13.95 GB when graph capture began)
    seen = [(n, v) for n, v in (("at pool end", acc.sglang_free_after_pool_bytes),
                                ("when graph capture began", acc.sglang_free_at_graph_begin_bytes),
                                ("after graph capture / at serving start", acc.sglang_free_after_graphs_bytes))
            if v is not None]
    head = min(v for _, v in seen) if seen else None
    if head is not None:
        where = min(seen, key=lambda x: x[1])[0]
        A.append(f"left outside the pool for activations after start-up: {g(head)} (free {where})"
                 + ("; " + ", ".join(f"{g(v)} {n}" for n, v in seen if v != head) if len(seen) > 1 else ""))
        rec.outcome["activation_headroom_bytes"] = head
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
    pressure = pool_pressure(runtime, cfg)
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
