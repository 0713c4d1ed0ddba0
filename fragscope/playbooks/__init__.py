"""Playbooks: one per diagnosis. Each says what to do now, what fixes it for good (with values
computed from the evidence and the engine's config), when *not* to apply each fix, and how to
verify it worked. Ids are contracts (docs/diagnoses.md).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..model import Report, Window


@dataclass
class Action:
    text: str
    preconditions: list[str] = field(default_factory=list)
    contraindications: list[str] = field(default_factory=list)


@dataclass
class Playbook:
    id: str
    title: str
    meaning: str
    immediate: list[str]
    durable: list[Action]
    verify: list[str]
    references: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


EXPANDABLE_CONTRA = [
    "tensor parallelism >= 2 with vLLM's custom all-reduce: expandable segments have crashed it "
    "(use --disable-custom-all-reduce or leave the setting off)",
    "vLLM sleep mode (--enable-sleep-mode): its CuMemAllocator conflicts with expandable segments",
    "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: native allocator options are ignored",
    "with it on, inactive_split_bytes stops counting expandable blocks (pytorch#159564): judge "
    "fragmentation from memory snapshots afterwards",
]

PLAYBOOKS: dict[str, Playbook] = {p.id: p for p in [
    Playbook(
        "allocator-fragmentation", "PyTorch allocator fragmentation",
        "Memory the caching allocator holds is split into pieces too small for new requests; the engine "
        "runs smaller batches, preempts and stalls on allocation retries while the GPU looks busy.",
        ["Restart the engine (rolling, one replica at a time): fragmentation only clears when the "
         "process releases its segments.",
         "If a restart is impossible right now: drain traffic from this replica to healthy peers."],
        [Action("Lower gpu_memory_utilization to leave the allocator headroom outside the KV pool "
                "(0.9 → 0.85 typical).",
                ["the KV pool can shrink by that share without hitting kv-cache-pressure "
                 "(check vllm:kv_cache_usage_perc peaks < 0.9)"],
                ["the model's max_model_len only just fits: fewer KV blocks can make startup fail "
                 "(\"larger than the available KV cache memory\")"]),
         Action("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in place "
                "instead of leaving slivers.",
                ["PyTorch >= 2.1 with the native allocator"], EXPANDABLE_CONTRA),
         Action("Schedule restarts every 12–24 h until the durable fix is proven.",
                ["more than one replica behind the load balancer"],
                ["a single replica: each restart is an outage (~1–5 min model load)"]),
         Action("If fragmentation persists: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<size> so large cached "
                "blocks are never split by small requests (start at 512).",
                ["inactive_split_bytes is a large share of reserved"],
                ["it can cost throughput (more cudaMalloc calls); not with expandable_segments",
                 "ignored under backend:cudaMallocAsync"])],
        ["fragscope_torch_fragmentation_ratio returns to its baseline (< 10 %) after the restart and stays "
         "flat for 6 h",
         "torch allocation retries stay at 0/min; preemptions back to ~0",
         "tokens/s at the same traffic returns to the baseline; running batch back to its baseline"],
        ["pytorch docs: notes/cuda.rst 'Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF'",
         "pytorch/pytorch#29554 (fragmentation measure), #159564 (expandable segments and inactive_split)"]),
    Playbook(
        "kv-cache-pressure", "KV-cache pressure and preemption storm",
        "The KV block pool is full; the scheduler preempts running sequences to free blocks and redoes "
        "their work, requests queue and TTFT's tail explodes.",
        ["Shed or redirect load: route new requests to replicas with KV headroom.",
         "Cap concurrency now: lower max_num_seqs (restart needed) or the gateway's concurrency limit."],
        [Action("Cap max_num_seqs near the batch the pool can hold.",
                ["the preemptions come from too many concurrent sequences"],
                ["a throughput-optimised batch job: a lower cap reduces throughput"]),
         Action("Give the KV cache more memory: raise gpu_memory_utilization (e.g. 0.90 → 0.92–0.95).",
                ["NVML shows free memory outside vLLM's budget and no allocator fragmentation"],
                ["allocator fragmentation or OOMs already seen: less headroom makes them worse",
                 "other processes share the GPU"]),
         Action("Shorten max_model_len to what traffic needs (request length histograms), so fewer "
                "blocks per sequence are reserved.",
                ["p99 request length is well below max_model_len"],
                ["clients legitimately send long contexts"]),
         Action("Add replicas (scale out) or enable prefill/decode separation for long prompts.",
                ["budget for more GPUs"], []),
         Action("Use an FP8 KV cache (--kv-cache-dtype fp8) to double the tokens per GiB.",
                ["a GPU and attention backend supporting FP8 KV"],
                ["accuracy-sensitive workloads not yet validated with FP8 KV"])],
        ["rate(vllm:num_preemptions_total[5m]) back to ~0",
         "vllm:kv_cache_usage_perc peaks below ~0.9", "TTFT p99 back within ~2x of p50 trends"],
        ["vLLM docs: 'Preemption' in optimization.md"]),
    Playbook(
        "memory-leak", "GPU memory leak",
        "Live allocations grow without bound, independent of traffic; the process will run out of memory.",
        ["Restart the engine before it OOMs (rolling), and capture a memory snapshot first "
         "(fragscope capture --kind snapshot) to find what holds the memory."],
        [Action("Find the owner: record memory history (torch.cuda.memory._record_memory_history) and compare "
                "two snapshots an hour apart (diagnose snapshot); look for growing allocation stacks.",
                ["the engine runs under fragscope-probe or you can set env vars at start"],
                ["memory history recording costs ~2 µs per allocation: keep max_entries bounded"]),
         Action("Check request-scoped caches (LoRA adapters, prefix caches outside vLLM, logits processors, "
                "custom outputs kept in Python lists).", [], []),
         Action("Until fixed: scheduled restarts before the projected exhaustion time.",
                ["more than one replica"], ["a single replica"])],
        ["fragscope_torch_allocated_bytes flat (slope ~0) over hours at steady traffic",
         "no torch OOMs"],
        ["pytorch docs: torch_cuda_memory.html (memory snapshots)"]),
    Playbook(
        "clock-throttling", "GPU clock throttling",
        "The GPU lowered its clocks for power or temperature; the same work runs slower.",
        ["Check the node: fans, inlet temperature, power capping (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER).",
         "Move traffic away from this GPU/node if throughput matters more than capacity."],
        [Action("Thermal: fix cooling (airflow, blanking panels, fan policy, datacenter inlet temperature).",
                ["reason hw_thermal_slowdown / sw_thermal_slowdown or temperature >= ~83 °C"], []),
         Action("Power: check the power limit (nvidia-smi -q -d POWER) against the board's default; raise it "
                "if it was capped below default.",
                ["reason sw_power_cap with a limit below the default TDP"],
                ["facility power budget: the cap may be deliberate"]),
         Action("hw_slowdown / hw_power_brake_slowdown: a hardware or PSU signal — drain the node and open a "
                "hardware ticket.", ["reason hw_slowdown or hw_power_brake_slowdown"], [])],
        ["SM clock back near its max under load; throttle reasons inactive; tokens/s back to baseline"],
        ["NVML nvmlDeviceGetCurrentClocksEventReasons"]),
    Playbook(
        "launch-bound", "Host-bound kernel launches",
        "Requests are running but the GPU waits on the CPU between kernels.",
        ["Check the engine's CPU: is the container throttled (cgroup cpu.stat) or pinned to too few cores?"],
        [Action("Use CUDA graphs: remove --enforce-eager (vLLM captures decode graphs by default).",
                ["the model and its batch sizes are graph-capturable"],
                ["graph capture needs extra GPU memory (logged 'Graph capturing finished ... took X GiB'): "
                 "check headroom first"]),
         Action("Give the engine more CPU: raise the CPU limit/request, avoid CPU throttling, pin threads.", [], []),
         Action("Increase the batch (max_num_seqs, max_num_batched_tokens) so each launch does more work.",
                ["KV headroom (no preemptions)"], ["latency-sensitive traffic: larger batches raise ITL"]),
         Action("Fuse small kernels (torch.compile, fused ops) to cut launch count.", [], [])],
        ["kernel gap p50 back to tens of µs; GPU idle share < 10 %; utilization up at the same traffic"],
        ["HTA idle time and kernel launch statistics"]),
    Playbook(
        "capacity-saturation", "Capacity saturation (healthy but busy)",
        "The server is doing all it can: queue and KV usage rose with traffic, throughput with them, no pathology.",
        ["Scale out: add replicas (or let the autoscaler do it on vllm:num_requests_waiting)."],
        [Action("Autoscale on queue depth (vllm:num_requests_waiting) or KV usage, not on GPU utilization.",
                [], []),
         Action("If latency SLOs matter more than throughput: cap max_num_seqs to bound the batch.",
                [], ["throughput-oriented batch traffic"])],
        ["requests waiting back to ~0 at the same traffic; TTFT p99 within SLO"], []),
    Playbook(
        "kv-block-size-mismatch", "KV block size too large for the sequences",
        "Partial last blocks waste KV memory: the pool holds fewer sequences than it could.",
        ["Nothing urgent: plan a config change."],
        [Action("Set --block-size to about half the average sequence length (a supported size).",
                ["the attention backend supports that block size (FlashAttention needs multiples of 16)"],
                ["prefix caching hit rates depend on block granularity: re-check them after the change"])],
        ["more KV blocks in use per request at the same traffic; fewer preemptions at peaks"],
        ["seed 001: waste ≈ (block_size − 1) / (2 × avg_seq_len + block_size − 1)"]),
    # --- deep-evidence verdicts (snapshots, traces, logs): docs/snapshot.md, docs/trace.md, docs/logs.md ---
    Playbook(
        "oom-capacity", "Out of memory: plain capacity",
        "The allocator had no free memory worth the name: the workload needs more than the GPU holds.",
        ["Reduce the memory the failing step needs (smaller batch / max_num_seqs, shorter max_model_len)."],
        [Action("Lower gpu_memory_utilization's KV share or max_num_batched_tokens so activations fit.",
                ["the OOM happens in a forward pass, not at startup"], []),
         Action("Quantise weights or the KV cache, or shard across more GPUs (tensor parallelism).",
                ["accuracy validated for the quantised format"], [])],
        ["no OOM at the same load; peak reserved below the GPU's memory"], []),
    Playbook(
        "oom-outside-pytorch", "Out of memory: memory held outside PyTorch",
        "PyTorch's own pool was small; the GPU's memory was held by something else (NCCL buffers, CUDA "
        "graphs' private pools, another process, a leak in a native library).",
        ["Find the holder: nvidia-smi --query-compute-apps, per-process NVML memory (fragscope agent)."],
        [Action("Account for non-torch memory in gpu_memory_utilization (vLLM profiles it at startup).",
                [], ["another tenant shares the GPU: isolate it (MIG, separate GPUs) instead"])],
        ["per-process GPU memory adds up to NVML used; no OOM at the same load"], []),
    Playbook(
        "oom-cross-stream", "Out of memory: free memory stranded on another stream",
        "Enough memory was free, but cached on another CUDA stream's blocks, which this stream cannot reuse.",
        ["torch.cuda.empty_cache() at a quiet point returns whole free segments (not split ones)."],
        [Action("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (one growable segment per stream).",
                ["PyTorch >= 2.1, native allocator"], EXPANDABLE_CONTRA),
         Action("Avoid allocating on side streams, or record_stream / synchronise so blocks return.", [], [])],
        ["next snapshot shows little inactive memory on idle streams"], []),
    Playbook(
        "oom-private-pool", "Out of memory: memory pinned in a private pool",
        "Free memory sat in a private pool (CUDA graphs' memory pool, a MemPool) that ordinary allocations cannot use.",
        ["Capture fewer CUDA graph batch sizes, or release graphs no longer used."],
        [Action("Reduce vLLM's captured graph sizes (compilation_config cudagraph_capture_sizes / max_num_seqs).",
                [], ["fewer graphs mean more eager (launch-bound) steps at uncaptured sizes"])],
        ["private-pool bytes in the snapshot shrink; no OOM at the same load"], []),
    Playbook(
        "oom-memory-cap", "Out of memory: per-process memory cap",
        "The device still had room, but a per-process limit (set_per_process_memory_fraction or the "
        "allocator's memory-fraction policy) refused the request.",
        ["Check torch.cuda.set_per_process_memory_fraction / the engine's memory fraction settings."],
        [Action("Raise the cap to what the process needs, or lower the workload.",
                ["no other process relies on the memory the cap protects"], [])],
        ["no OOM rejections (num_oom_rejections flat)"], []),
    Playbook(
        "kv-capacity-gap", "KV-cache capacity below the estimate",
        "The engine allocated fewer KV tokens than the kv-budget estimate for this model and GPU: memory went "
        "elsewhere (CUDA graphs, NCCL buffers, activation peak, another process) or the config differs.",
        ["Read the startup log's memory profile lines (diagnose logs) to see where memory went."],
        [Action("If CUDA graphs take the gap: capture fewer sizes, or accept it (graphs pay back in speed).",
                [], []),
         Action("If another process holds memory: isolate the GPU.", [], [])],
        ["logged KV capacity within ~10 % of `fragscope kv-budget`"], []),
    Playbook(
        "sync-bound", "Host synchronisation stalls",
        "The host blocks on the GPU (cudaDeviceSynchronize / cudaStreamSynchronize / synchronous copies), "
        "so it cannot queue the next work in time.",
        ["Find the synchronising call sites in the trace (diagnose trace lists them)."],
        [Action("Replace synchronous copies with pinned-memory *Async copies; avoid .item()/.cpu() in the hot loop.",
                [], []),
         Action("Use events (cudaStreamWaitEvent) instead of full synchronisation.", [], [])],
        ["synchronous API time share falls; GPU idle share falls"], ["nsys analyze cuda_api_sync"]),
    Playbook(
        "allocator-stalls", "Allocator stalls in the timeline",
        "cudaMalloc/cudaFree calls in steady state: the caching allocator is flushing and re-allocating "
        "(allocation retries), each a device synchronisation.",
        ["Check the allocator: fragscope_torch_alloc_retries_total, a memory snapshot (diagnose snapshot)."],
        [Action("See allocator-fragmentation's fixes (headroom, expandable_segments).", [], EXPANDABLE_CONTRA)],
        ["no cudaMalloc/cudaFree between warm-up and the end of the trace"], []),
]}


def _f(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def computed_actions(diag_id: str, ctx: dict, config: dict) -> list[str]:
    """Concrete actions with values from the evidence and the engine's config."""
    acts: list[str] = []
    gmu = _f(config.get("gpu_memory_utilization"))
    if diag_id == "allocator-fragmentation":
        slack = _f(ctx.get("slack_bytes"))
        total = _f(ctx.get("gpu_memory_total_bytes"))
        step = 0.05  # seed: 0.9 -> 0.85 leaves the allocator headroom outside the KV pool
        head = f" (~{step * total / 1024**3:.1f} GiB of this GPU)" if total else ""
        waste = f"; the allocator now holds {slack / 1024**3:.1f} GiB it cannot use" if slack else ""
        if gmu is not None:
            acts.append(f"Restart now, then set --gpu-memory-utilization {max(0.5, gmu - step):.2f} "
                        f"(currently {gmu:.2f}) to leave {step:.2f} of the GPU{head} as allocator headroom{waste}.")
        else:
            acts.append(f"Restart now, then lower --gpu-memory-utilization by {step:.2f} (e.g. 0.90 → "
                        f"{0.90 - step:.2f}); the current value was not exposed (vllm:cache_config_info).")
        acts.append("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless tensor-parallel >= 2 with custom "
                    "all-reduce or sleep mode is on.")
        acts.append("Schedule rolling restarts every 12–24 h until fragmentation stays flat.")
    elif diag_id == "kv-cache-pressure":
        running = _f(ctx.get("running"))
        if running:
            acts.append(f"Cap --max-num-seqs at ~{max(1, int(running * 0.8))} (80 % of the {running:.0f} sequences "
                        f"running at the edge) or add replicas.")
        kvb = _f(config.get("kv_cache_memory_bytes"))
        if kvb:
            # --kv-cache-memory-bytes overrides gpu_memory_utilization for the KV pool (vLLM >= 0.11)
            acts.append(f"If NVML shows free memory and the allocator is healthy: raise --kv-cache-memory-bytes "
                        f"{kvb / 1024**2:.0f} MiB → {kvb * 1.25 / 1024**2:.0f} MiB (it overrides "
                        f"--gpu-memory-utilization for the KV pool).")
        elif gmu is not None and gmu < 0.95:
            acts.append(f"If NVML shows free memory and the allocator is healthy: raise --gpu-memory-utilization "
                        f"{gmu:.2f} → {min(0.95, gmu + 0.03):.2f}.")
        for c in ctx.get("cause", []) or []:
            acts.append(f"Traffic changed ({c}): size the pool for it or route long requests elsewhere.")
    elif diag_id == "memory-leak":
        h = _f(ctx.get("hours_to_full"))
        if h is not None:
            acts.append(f"Restart within {max(0.0, h * 0.8):.1f} h (memory exhausted in ~{h:.1f} h at this rate); "
                        "take a memory snapshot first.")
    elif diag_id == "clock-throttling":
        acts.append(f"Reason {ctx.get('reason', 'unknown')}: see the matching durable fix; clocks are "
                    f"{(_f(ctx.get('clock_drop_ratio')) or 0) * 100:.0f} % down.")
    elif diag_id == "launch-bound":
        acts.append("Remove --enforce-eager if set (CUDA graphs), and check the container's CPU throttling.")
    elif diag_id == "capacity-saturation":
        acts.append("Add a replica: this one is at its peak throughput.")
    elif diag_id == "kv-block-size-mismatch":
        rec = ctx.get("recommended_block_size")
        if rec:
            acts.append(f"Set --block-size {rec} (now {ctx.get('block_size', '?'):.0f}); expected KV waste "
                        f"{(_f(ctx.get('waste')) or 0) * 100:.0f} % → {(_f(ctx.get('recommended_waste')) or 0) * 100:.0f} %.")
    return acts


def build_playbook(diag_id: str, ctx: dict, config: dict) -> dict | None:
    pb = PLAYBOOKS.get(diag_id)
    if pb is None:
        return None
    d = pb.to_dict()
    d["actions"] = computed_actions(diag_id, ctx or {}, config or {})
    return d


def attach_playbooks(report: Report) -> Report:
    """Replace each finding's detector context with its full playbook (computed actions included)."""
    for f in report.findings:
        pb = f.playbook if isinstance(f.playbook, dict) else {}
        if "immediate" in pb or "options" in pb:
            continue  # already built (e.g. a snapshot's own playbook)
        ctx = dict(pb.get("context", {}))
        config = ctx.pop("_config", {})
        f.playbook = build_playbook(f.id, ctx, config)
    return report


def diagnose(window: Window) -> Report:
    """Run every detector over ``window`` and attach playbooks: the one entry point for callers."""
    from ..detectors.engine import run_detectors

    return attach_playbooks(run_detectors(window))


def render_playbook_text(pb: Playbook) -> str:
    lines = [f"{pb.id}: {pb.title}", "", pb.meaning, "", "Now:"]
    lines += [f"  - {x}" for x in pb.immediate]
    lines += ["", "Durable fixes:"]
    for a in pb.durable:
        lines.append(f"  - {a.text}")
        for p in a.preconditions:
            lines.append(f"      when: {p}")
        for c in a.contraindications:
            lines.append(f"      not when: {c}")
    lines += ["", "Verify:"] + [f"  - {v}" for v in pb.verify]
    if pb.references:
        lines += ["", "References:"] + [f"  - {r}" for r in pb.references]
    return "\n".join(lines)
