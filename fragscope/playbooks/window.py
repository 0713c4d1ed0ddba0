"""Diagnoses judged on a metrics window (recordings, live servers, the agent, the fleet): their
playbooks and computed actions, registered with the detector that finds them."""
from __future__ import annotations


from ..detectors import (block_size, fragmentation, kv_pool, kv_pressure, launch_bound, memory_leak, saturation,
                         throttling)
from ..model import Action, Playbook
from ..sizing.playbooks import KV_POOL_UNDERSIZED, kv_pool_undersized_actions
from ..units import GiB, MiB, finite_or_none as _f
from .fixes import EXPANDABLE_CONTRA, EXPANDABLE_ONE_LINE, expandable_segments
from .jobs import KNOBS, kind_of, restart, unknown_note
from .registry import Diagnosis


# --- allocator-fragmentation -------------------------------------------------------------------
def _fragmentation_actions(ctx: dict, config: dict) -> list[str]:
    kind = kind_of(ctx)
    if kind not in (None, "vllm"):
        # a log of another job: its own knobs, no vLLM flag and no rolling restart for a program that is not served
        acts = [unknown_note()] if kind == "unknown" else []
        acts.append(restart(kind))
        mem = KNOBS[kind]["memory"]
        if mem:
            acts.append(f"Leave the allocator headroom outside the engine's pre-allocated memory: lower {mem} by "
                        "about 5 % of the GPU.")
        acts.append(EXPANDABLE_ONE_LINE)
        return acts
    acts: list[str] = []
    gmu = _f(config.get("gpu_memory_utilization"))
    sized = _f(ctx.get("sized_gpu_memory_utilization"))
    slack = _f(ctx.get("slack_bytes"))
    total = _f(ctx.get("gpu_memory_total_bytes"))
    step = 0.05  # 0.9 -> 0.85 (5 % of the GPU) leaves the allocator headroom outside the KV pool
    head = f" (~{step * total / GiB:.1f} GiB of this GPU)" if total else ""
    waste = f"; the allocator now holds {slack / GiB:.1f} GiB it cannot use" if slack else ""
    if sized is not None:
        # the value fragscope size computes from the same log (one question, one answer): docs/sizing.md
        acts.append(f"Restart now, then set --gpu-memory-utilization {sized:.2f}"
                    + (f" (currently {gmu:.2f})" if gmu is not None else "")
                    + ": the value `fragscope size --log` computes from this log's own figures" + f"{waste}.")
    elif gmu is not None:
        acts.append(f"Restart now, then set --gpu-memory-utilization {max(0.5, gmu - step):.2f} "
                    f"(currently {gmu:.2f}) to leave {step:.2f} of the GPU{head} as allocator headroom{waste}.")
    else:
        acts.append(f"Restart now, then lower --gpu-memory-utilization by {step:.2f} (e.g. 0.90 → "
                    f"{0.90 - step:.2f}); the value in force is not in this evidence (vllm:cache_config_info, "
                    "or the engine's args line in its log).")
    acts.append(EXPANDABLE_ONE_LINE)
    acts.append("Schedule rolling restarts every 12–24 h until fragmentation stays flat.")
    return acts


FRAGMENTATION = Diagnosis.from_module(
    fragmentation,
    Playbook(
        fragmentation.ID, "PyTorch allocator fragmentation",
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
         expandable_segments(),
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
    actions=_fragmentation_actions, also_from=("snapshot", "log"))


# --- kv-cache-pressure -------------------------------------------------------------------------
def _kv_actions(ctx: dict, config: dict) -> list[str]:
    acts: list[str] = []
    if ctx.get("crash_line"):  # one preemption, then the run died: the crash is what to read (detectors/logs.py)
        return [f"Read the crash at line {int(ctx['crash_line'])} (its traceback's last line names the error; diagnose "
                "logs lists it when it is an OOM); one preemption needs no change of its own."]
    gmu = _f(config.get("gpu_memory_utilization"))
    running = _f(ctx.get("running"))
    cap = _f(ctx.get("cap_sequences"))
    u_need = _f(ctx.get("needed_gpu_memory_utilization"))
    if cap:  # the log's own arithmetic (detectors/log_queue.py): what the pool holds at the observed length
        acts.append(f"Cap {ctx.get('batch_flag') or '--max-num-seqs'} at {max(1, int(cap))} (what the pool holds at "
                    "the observed length), or add replicas.")
        if u_need is not None:
            acts.append(f"Or grow the pool: --gpu-memory-utilization {u_need:.2f} holds the configured batch at that "
                        "length, if NVML shows that memory free at peak (fragscope size --log FILE --recording REC).")
        return acts
    if running:
        acts.append(f"Cap --max-num-seqs at ~{max(1, int(running * 0.8))} (80 % of the {running:.0f} sequences "
                    f"running at the edge) or add replicas.")
    peers = ctx.get("_peers") or {}
    sized = {k: v for k, v in (peers.get("settings") or {}).items()
             if k in ("--gpu-memory-utilization", "--kv-cache-memory-bytes")}
    kvb = _f(config.get("kv_cache_memory_bytes"))
    if sized:
        # kv-pool-undersized measured the headroom: its value, not a rule of thumb (docs/sizing.md)
        flag, (value, by) = next(iter(sized.items()))
        was = f" (now {gmu:.2f})" if flag == "--gpu-memory-utilization" and gmu is not None else ""
        acts.append(f"Give the KV pool the GPU's unused headroom: {flag} {value}{was}, the value {by} computed "
                    "from the measured peaks.")
    elif kvb:
        # --kv-cache-memory-bytes overrides gpu_memory_utilization for the KV pool (vLLM >= 0.11)
        acts.append(f"If NVML shows free memory and the allocator is healthy: raise --kv-cache-memory-bytes "
                    f"{kvb / MiB:.0f} MiB → {kvb * 1.25 / MiB:.0f} MiB (it overrides "
                    f"--gpu-memory-utilization for the KV pool).")
    elif gmu is not None and gmu < 0.95:
        acts.append(f"If NVML shows free memory and the allocator is healthy: raise --gpu-memory-utilization "
                    f"{gmu:.2f} → {min(0.95, gmu + 0.03):.2f}.")
    for c in ctx.get("cause", []) or []:
        acts.append(f"Traffic changed ({c}): size the pool for it or route long requests elsewhere.")
    return acts


KV_PRESSURE = Diagnosis.from_module(
    kv_pressure,
    Playbook(
        kv_pressure.ID, "KV-cache pressure and preemption storm",
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
    actions=_kv_actions, also_from=("log",))


# --- memory-leak -------------------------------------------------------------------------------
def _leak_actions(ctx: dict, config: dict) -> list[str]:
    h = _f(ctx.get("hours_to_full"))
    if h is None:
        return []
    return [f"Restart within {max(0.0, h * 0.8):.1f} h (memory exhausted in ~{h:.1f} h at this rate); "
            "take a memory snapshot first."]


MEMORY_LEAK = Diagnosis.from_module(
    memory_leak,
    Playbook(
        memory_leak.ID, "GPU memory leak",
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
        ["pytorch docs: torch_cuda_memory.html (memory snapshots)"]), actions=_leak_actions,
    short_window_reason="a leak shows only as growth over time: give it at least 30 min of history "
                        "(e.g. diagnose --agent URL --since 1h, or a recording of that length)",
    min_trend_span_s=30 * 60.0)


# --- clock-throttling --------------------------------------------------------------------------
def _throttling_actions(ctx: dict, config: dict) -> list[str]:
    return [f"Reason {ctx.get('reason', 'unknown')}: see the matching durable fix; clocks are "
            f"{(_f(ctx.get('clock_drop_ratio')) or 0) * 100:.0f} % down."]


THROTTLING = Diagnosis.from_module(
    throttling,
    Playbook(
        throttling.ID, "GPU clock throttling",
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
        ["NVML nvmlDeviceGetCurrentClocksEventReasons"]), actions=_throttling_actions)


# --- launch-bound ------------------------------------------------------------------------------
def _launch_actions(ctx: dict, config: dict) -> list[str]:
    if ctx.get("workload") == "training":
        return ["Capture the training step with CUDA graphs (torch.compile mode='reduce-overhead') or fuse "
                "small kernels, and check the data loader / host CPU is not the bottleneck."]
    return ["Remove --enforce-eager if set (CUDA graphs), and check the container's CPU throttling."]


LAUNCH_BOUND = Diagnosis.from_module(
    launch_bound,
    Playbook(
        launch_bound.ID, "Host-bound kernel launches",
        "Requests are running but the GPU waits on the CPU between kernels.",
        ["Check the engine's CPU: is the container throttled (cgroup cpu.stat) or pinned to too few cores?"],
        [Action("Use CUDA graphs: remove --enforce-eager (vLLM captures decode graphs by default).",
                ["the model and its batch sizes are graph-capturable", "a serving engine (vLLM), not a training job"],
                ["graph capture needs extra GPU memory (logged 'Graph capturing finished ... took X GiB'): "
                 "check headroom first"]),
         Action("Give the engine more CPU: raise the CPU limit/request, avoid CPU throttling, pin threads.", [], []),
         Action("Increase the batch (max_num_seqs, max_num_batched_tokens) so each launch does more work.",
                ["KV headroom (no preemptions)"], ["latency-sensitive traffic: larger batches raise ITL"]),
         Action("Fuse small kernels (torch.compile, fused ops) to cut launch count.", [], [])],
        ["kernel gap p50 back to tens of µs; GPU idle share < 10 %; utilization up at the same traffic"],
        ["HTA idle time and kernel launch statistics"]),
    actions=_launch_actions, also_from=("trace",),
    runs_on_short_windows=True)  # its evidence is level already: work waiting while the GPU idles between kernels


# --- capacity-saturation -----------------------------------------------------------------------
def _saturation_actions(ctx: dict) -> list[str]:
    """"At its peak throughput" only where the window showed it (the change path checks throughput holds within
    10 % of its best); the level path sees a queue, not whether throughput holds under it."""
    tps = _f(ctx.get("tokens_per_s"))
    if ctx.get("basis") == "level" or tps is None:
        return ["Add a replica if this queue is the load you expect; the present alone shows the queue, not whether "
                "throughput holds at its best under it (a window of 15 min or more shows it: diagnose --vllm URL "
                "--duration 15m, or the agent's history)."]
    return [f"Add a replica: this one holds its peak throughput ({tps:.0f} tok/s, within 10 % of its best in the "
            "window) while requests queue."]


SATURATION = Diagnosis.from_module(
    saturation,
    Playbook(
        saturation.ID, "Capacity saturation (healthy but busy)",
        "The server is doing all it can: queue and KV usage rose with traffic, throughput with them, no pathology.",
        ["Scale out: add replicas (or let the autoscaler do it on vllm:num_requests_waiting)."],
        [Action("Autoscale on queue depth (vllm:num_requests_waiting) or KV usage, not on GPU utilization.",
                [], []),
         Action("If latency SLOs matter more than throughput: cap max_num_seqs to bound the batch.",
                [], ["throughput-oriented batch traffic"])],
        ["requests waiting back to ~0 at the same traffic; TTFT p99 within SLO"], []),
    actions=lambda ctx, config: _saturation_actions(ctx), level_on_long_windows=False)


# --- kv-block-size-mismatch --------------------------------------------------------------------
def _block_actions(ctx: dict, config: dict) -> list[str]:
    rec = ctx.get("recommended_block_size")
    if not rec:
        return []
    return [f"Set --block-size {rec} (now {ctx.get('block_size', '?'):.0f}); expected KV waste "
            f"{(_f(ctx.get('waste')) or 0) * 100:.0f} % → {(_f(ctx.get('recommended_waste')) or 0) * 100:.0f} %."]


BLOCK_SIZE = Diagnosis.from_module(
    block_size,
    Playbook(
        block_size.ID, "KV block size too large for the sequences",
        "Partial last blocks waste KV memory: the pool holds fewer sequences than it could.",
        ["Nothing urgent: plan a config change."],
        [Action("Set --block-size to about half the average sequence length (a supported size).",
                ["the attention backend supports that block size (FlashAttention needs multiples of 16)"],
                ["prefix caching hit rates depend on block granularity: re-check them after the change"])],
        ["more KV blocks in use per request at the same traffic; fewer preemptions at peaks"],
        ["vLLM paper (Kwon et al., SOSP 2023), internal fragmentation of the last block: waste ≈ (block_size − 1) / (2 × avg_seq_len + block_size − 1)"]),
    actions=_block_actions, runs_on_short_windows=True)


# --- kv-pool-undersized (docs/sizing.md): metrics alone here; the engine log's figures in diagnose logs ----
KV_POOL = Diagnosis.from_module(
    kv_pool, KV_POOL_UNDERSIZED, actions=kv_pool_undersized_actions,
    also_from=("log",), runs_on_short_windows=True)  # a level judgement: peaks over whatever window is given


# Run order of the window detectors (the order findings of equal rank are listed in).
DIAGNOSES = [FRAGMENTATION, KV_PRESSURE, MEMORY_LEAK, THROTTLING, LAUNCH_BOUND, SATURATION, BLOCK_SIZE, KV_POOL]

__all__ = ["DIAGNOSES", "EXPANDABLE_CONTRA"]
