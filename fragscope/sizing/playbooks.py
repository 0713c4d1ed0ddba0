"""Playbooks for the sizing diagnoses (``kv-pool-undersized``, ``startup-oom``). docs/sizing.md#diagnoses.

Module-level constants in the project's one :class:`~fragscope.model.Playbook` type and the computed
actions with the registry's signature ``(ctx, config) -> list[str]`` (values from
:func:`fragscope.sizing.recommend`). The registry (layer above) declares the diagnoses; docs/sizing.md.
"""
from __future__ import annotations

from .. import ids
from ..advice.jobtext import JobText, only
from ..model import Action, Playbook


def _per_engine(neutral: str, vllm: str, sglang: str) -> JobText:
    """A line with the engine's own flags (vLLM's or SGLang's: the start-up accounting is theirs); the labelled
    neutral wording for ``diagnose explain`` and metrics windows."""
    return JobText(neutral, vllm=vllm, sglang=sglang)

KV_POOL_UNDERSIZED_ID = ids.KV_POOL_UNDERSIZED
STARTUP_OOM_ID = ids.STARTUP_OOM

KV_POOL_UNDERSIZED = Playbook(
    KV_POOL_UNDERSIZED_ID, "KV pool too small for the traffic while the GPU has headroom",
    _per_engine(*(f"The KV pool ran full (preemptions for lack of blocks, or usage at its ceiling with requests "
                  f"waiting) at the chosen {m}, while NVML shows memory on the GPU that nothing used at the observed "
                  "peak. The pool was sized too small for this traffic, not the GPU."
                  for m in ("memory share (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static)",
                            "--gpu-memory-utilization", "--mem-fraction-static"))),
    ["Nothing urgent: preemption costs throughput and latency, not correctness. Shift load to replicas with KV "
     "headroom if TTFT is out of its objective."],
    [Action(_per_engine(*(f"Restart with the computed {m}: it keeps the measured outside-budget peak plus the stated "
                          "margin free and grows the pool by the rest."
                          for m in ("memory share (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static)",
                                    "--gpu-memory-utilization", "--mem-fraction-static"))),
            ["the window covered the busiest traffic and a full start-up (peak device memory is measured, not "
             "assumed)", "no other process is expected to grow on this GPU"],
            ["the GPU is shared (MIG-less co-tenancy, a second engine): another tenant's peak is not in this "
             "window; leave its share free", _per_engine(*(f"CUDA-graph sizes, LoRA adapters or {b} change at the same restart: they move "
                                       "the non-KV peak" for b in ("the per-step token budget (vLLM "
                                                                  "--max-num-batched-tokens, SGLang "
                                                                  "--chunked-prefill-size)",
                                                                  "--max-num-batched-tokens", "--chunked-prefill-size")))]),
     Action(only("Or pin the pool in bytes: vLLM --kv-cache-memory-bytes (vLLM >= 0.11) with the computed pool size, "
                 "so other residents of the GPU no longer change it.", "vllm"),
            ["vLLM V1 with --kv-cache-memory-bytes"],
            ["the profile pass still runs but its peak is not subtracted: validate with the longest prompt you "
             "serve before trusting it"]),
     Action(_per_engine(*(f"Where no headroom is left: cap {c} near the computed value so requests queue instead of "
                          f"thrashing, then add GPUs (tensor parallelism), an fp8 KV cache ({d}) or a shorter {n}."
                          for c, d, n in (("the running batch (vLLM --max-num-seqs, SGLang --max-running-requests)",
                                           "vLLM --kv-cache-dtype fp8, SGLang fp8_e4m3",
                                           "context length (vLLM --max-model-len, SGLang --context-length)"),
                                          ("--max-num-seqs", "--kv-cache-dtype fp8", "--max-model-len"),
                                          ("--max-running-requests", "--kv-cache-dtype fp8_e4m3",
                                           "--context-length")))), [],
            ["fp8 KV changes numerics: check quality on your evaluation set"])],
    ["KV usage peaks below its ceiling, or preemptions with reason kv_full stay at 0/min at the same traffic",
     "peak device memory (NVML) stays below total minus the margin; no OOM in the engine log",
     "the start-up log's 'GPU KV cache size' matches the computed token count within a block"],
    [only("vLLM docs: configuration/conserving_memory and the gpu_worker determine_available_memory profile "
          "(PRs #10511, #12126)", "vllm"), only("vLLM PR #58037 (num_preemptions_by_reason)", "vllm"),
     only("SGLang docs: mem_fraction_static", "sglang")])

_MEM = ("the memory share (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static)", "--gpu-memory-utilization",
        "--mem-fraction-static")
_LEN = ("the context length (vLLM --max-model-len, SGLang --context-length)", "--max-model-len", "--context-length")
STARTUP_OOM = Playbook(
    STARTUP_OOM_ID, "The engine failed to start for memory",
    "Start-up stopped for memory: a PyTorch OOM while profiling, allocating the KV pool or capturing CUDA "
    "graphs (utilization set too high for what happens outside the profiled budget); 'No available memory for "
    "the cache blocks' / a pool too small for one max-length sequence (set too low, or the model too big); or "
    "less free memory than requested because something else holds the GPU.",
    ["Restart with the computed value (the arithmetic is in the finding): it is the value that would have "
     "started from this log's own figures."],
    [Action(_per_engine(*(f"OOM while capturing CUDA graphs or profiling: lower {m} to the computed value (budget "
                          "minus the failed allocation's shortfall minus the margin)." for m in _MEM)), [],
            [_per_engine(*(f"the computed change is a lower bound: capture needs memory the failed run never "
                           f"measured; if it fails again {e}" for e in (
                               "start once without CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph) "
                               "to read what capture takes",
                               "use --enforce-eager once to read 'Graph capturing finished ... took X GiB'",
                               "start once with --disable-cuda-graph to read what capture takes")))]),
     Action(_per_engine(*(f"'No available memory for the cache blocks': raise {m} to the computed floor (weights + "
                          f"activation peak + non-torch memory + one max-length sequence), or lower {n} to the "
                          "engine's own 'estimated maximum model length'." for m, n in zip(_MEM, _LEN))), [],
            ["the floor is above 1 - margin: the model does not fit this GPU with a KV pool; use tensor "
             "parallelism or a quantized checkpoint"]),
     Action("'Free memory on device ... less than desired': free the memory another process holds, or start "
            "with the computed utilization that fits the free memory.", [],
            ["two engines share the GPU: their utilizations must add up to less than 1 minus the margin"])],
    ["the next start-up reaches 'GPU KV cache size' / 'KV Cache is allocated' and the server's ready line",
     "no OOM in the first hour at peak traffic (CUDA-graph and activation peaks now fit)"],
    [only("vLLM issues #2248, #11251, #19186, #57475 (start-up OOM and cache-block wording)", "vllm"),
     only("SGLang docs / issue #6027: init OOM vs runtime OOM move mem_fraction_static in opposite directions",
          "sglang")])

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
