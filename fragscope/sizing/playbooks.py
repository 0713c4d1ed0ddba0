"""Playbooks for the sizing diagnoses (``kv-pool-undersized``, ``startup-oom``). docs/sizing.md#diagnoses.

Module-level constants in the project's one :class:`~fragscope.model.Playbook` type and the computed
actions with the registry's signature ``(ctx, config) -> list[str]`` (values from
:func:`fragscope.sizing.recommend`). The registry (layer above) declares the diagnoses; docs/sizing.md.
"""
from __future__ import annotations

from .. import ids
from ..model import Action, Playbook

KV_POOL_UNDERSIZED_ID = ids.KV_POOL_UNDERSIZED
STARTUP_OOM_ID = ids.STARTUP_OOM

KV_POOL_UNDERSIZED = Playbook(
    KV_POOL_UNDERSIZED_ID, "KV pool too small for the traffic while the GPU has headroom",
    "The KV pool ran full (preemptions for lack of blocks, or usage at its ceiling with requests waiting) at the "
    "chosen --gpu-memory-utilization / --mem-fraction-static, while NVML shows memory on the GPU that nothing used "
    "at the observed peak. The pool was sized too small for this traffic, not the GPU.",
    ["Nothing urgent: preemption costs throughput and latency, not correctness. Shift load to replicas with KV "
     "headroom if TTFT is out of its objective."],
    [Action("Restart with the computed --gpu-memory-utilization (SGLang: --mem-fraction-static): it keeps the "
            "measured outside-budget peak plus the stated margin free and grows the pool by the rest.",
            ["the window covered the busiest traffic and a full start-up (peak device memory is measured, not "
             "assumed)", "no other process is expected to grow on this GPU"],
            ["the GPU is shared (MIG-less co-tenancy, a second engine): another tenant's peak is not in this "
             "window; leave its share free", "CUDA-graph sizes, LoRA adapters or max-num-batched-tokens change at "
             "the same restart: they move the non-KV peak"]),
     Action("Or pin the pool in bytes: --kv-cache-memory-bytes (vLLM >= 0.11) with the computed pool size, so "
            "other residents of the GPU no longer change it.",
            ["vLLM V1 with --kv-cache-memory-bytes"],
            ["the profile pass still runs but its peak is not subtracted: validate with the longest prompt you "
             "serve before trusting it"]),
     Action("Where no headroom is left: cap --max-num-seqs (SGLang --max-running-requests) near the computed "
            "value so requests queue instead of thrashing, then add GPUs (tensor parallelism), an fp8 KV cache "
            "(--kv-cache-dtype fp8) or a shorter --max-model-len.", [],
            ["fp8 KV changes numerics: check quality on your evaluation set"])],
    ["KV usage peaks below its ceiling, or preemptions with reason kv_full stay at 0/min at the same traffic",
     "peak device memory (NVML) stays below total minus the margin; no OOM in the engine log",
     "the start-up log's 'GPU KV cache size' matches the computed token count within a block"],
    ["vLLM docs: configuration/conserving_memory and the gpu_worker determine_available_memory profile "
     "(PRs #10511, #12126)", "vLLM PR #58037 (num_preemptions_by_reason)", "SGLang docs: mem_fraction_static"])

STARTUP_OOM = Playbook(
    STARTUP_OOM_ID, "The engine failed to start for memory",
    "Start-up stopped for memory: a PyTorch OOM while profiling, allocating the KV pool or capturing CUDA "
    "graphs (utilization set too high for what happens outside the profiled budget); 'No available memory for "
    "the cache blocks' / a pool too small for one max-length sequence (set too low, or the model too big); or "
    "less free memory than requested because something else holds the GPU.",
    ["Restart with the computed value (the arithmetic is in the finding): it is the value that would have "
     "started from this log's own figures."],
    [Action("OOM while capturing CUDA graphs or profiling: lower --gpu-memory-utilization to the computed value "
            "(budget minus the failed allocation's shortfall minus the margin).", [],
            ["the computed change is a lower bound: capture needs memory the failed run never measured; if it "
             "fails again use --enforce-eager once to read 'Graph capturing finished ... took X GiB'"]),
     Action("'No available memory for the cache blocks': raise --gpu-memory-utilization to the computed floor "
            "(weights + activation peak + non-torch memory + one max-length sequence), or lower --max-model-len "
            "to the engine's own 'estimated maximum model length'.", [],
            ["the floor is above 1 - margin: the model does not fit this GPU with a KV pool; use tensor "
             "parallelism or a quantized checkpoint"]),
     Action("'Free memory on device ... less than desired': free the memory another process holds, or start "
            "with the computed utilization that fits the free memory.", [],
            ["two engines share the GPU: their utilizations must add up to less than 1 minus the margin"])],
    ["the next start-up reaches 'GPU KV cache size' / 'KV Cache is allocated' and the server's ready line",
     "no OOM in the first hour at peak traffic (CUDA-graph and activation peaks now fit)"],
    ["vLLM issues #2248, #11251, #19186, #57475 (start-up OOM and cache-block wording)",
     "SGLang docs / issue #6027: init OOM vs runtime OOM move mem_fraction_static in opposite directions"])

PLAYBOOKS = {p.id: p for p in (KV_POOL_UNDERSIZED, STARTUP_OOM)}


def kv_pool_undersized_actions(ctx: dict, config: dict) -> list[str]:
    acts = computed_actions(KV_POOL_UNDERSIZED_ID, ctx)
    if ids.ALLOCATOR_FRAGMENTATION in ((ctx.get("_peers") or {}).get("ids") or ()):
        # the allocator grows outside the utilization budget: the free memory measured now is what the
        # fragmented allocator left, and handing it to the KV pool leaves no room for its next segment
        acts.insert(0, "First fix the allocator fragmentation found here (restart, expandable_segments), then "
                       "re-measure: while it lasts, giving its headroom to the KV pool makes an OOM likelier.")
    return acts


def startup_oom_actions(ctx: dict, config: dict) -> list[str]:
    return computed_actions(STARTUP_OOM_ID, ctx)


def computed_actions(diag_id: str, ctx: dict) -> list[str]:
    """The concrete settings from a finding's context (``ctx["recommendation"]`` is Recommendation.to_dict())."""
    rec = (ctx or {}).get("recommendation") or {}
    acts = []
    for case in rec.get("cases", []):
        if diag_id == STARTUP_OOM_ID and case["case"] not in (ids.STARTUP_OOM, "memory-held-elsewhere"):
            continue
        if diag_id == KV_POOL_UNDERSIZED_ID and case["case"] != "pool-too-small":
            continue
        acts.append(f"{case['change']} — {case['evidence']}")
    if rec.get("settings"):
        acts.append("set: " + " ".join(f"{k} {v}" for k, v in rec["settings"].items()))
    return acts
