"""Diagnoses judged on deep evidence (memory snapshots, kernel timelines, engine logs): their
playbooks, registered without a window detector (docs/snapshot.md, docs/trace.md, docs/logs.md)."""
from __future__ import annotations

from .. import ids
from ..model import Action, Playbook
from ..advice.fixes import expandable_segments
from ..advice.jobtext import JobText, only
from .registry import Diagnosis, Source


def _deep(source: str, pb: Playbook, **kw) -> Diagnosis:
    return Diagnosis(pb.id, pb, source=source, alerting=False, **kw)


# Lines that name a job's settings: the engine-independent wording (diagnose explain), and each kind of job's own
# (a finding whose job is known shows that one only: advice/jobs.py JobText).
_LESS_NEED = "Reduce the memory the failing step needs: a smaller batch or shorter sequences"
_ROOM = ("Leave the failing step room: a serving engine pre-allocates most of the GPU for its KV cache, so lower that "
         "share or its per-step token budget (a finding's fix lines name the flags of the job that produced it); "
         "another program: a smaller batch or shorter sequences.")
_OUTSIDE = ("Size what the job pre-allocates for the memory others hold: a serving engine's memory share is of the "
            "whole GPU, so lower it by what is held outside this process (a finding's fix lines name the flag).")
_GRAPHS = ("Capture fewer CUDA-graph sizes with the job's own setting (a finding's fix lines name it; vLLM: "
           "--compilation-config cudagraph_capture_sizes; SGLang: --cuda-graph-max-bs; TGI: --cuda-graphs; a "
           "training loop: fewer shapes under torch.cuda.graph / torch.compile(mode=\"reduce-overhead\")).")


def _less_need(kind: str) -> str:
    from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

    k = KNOBS[kind]
    if kind == "unknown":
        return _LESS_NEED + " (a serving engine: its concurrency and context-length limits)."
    return _LESS_NEED + (f" ({k['name']}: its concurrency and length limits)." if k["serving"] else ".")


def _room(kind: str) -> str:
    from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

    k = KNOBS[kind]
    if kind == "unknown":
        return _ROOM
    if k["memory"]:
        return f"Leave the failing step room: lower {k['memory']} (what {k['name']} pre-allocates) or {k['load']}."
    return f"Make the failing step fit: lower {k['load']}" + (f"; {k['extra']}" if k.get("extra") else "") + "."


def _outside(kind: str) -> str:
    from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

    k = KNOBS[kind]
    if kind == "vllm":
        return "Account for non-torch memory in --gpu-memory-utilization (vLLM profiles it at startup)."
    if kind == "unknown":
        return _OUTSIDE
    if k["memory"]:
        return f"Size {k['name']} for the memory others hold: lower {k['memory']} by what is held outside this process."
    return "Start the job on a GPU (or MIG slice) that nothing else holds memory on."


def _admission_meaning(kind: str) -> str:
    from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

    caps = {"vllm": "vLLM --max-num-seqs", "sglang": "SGLang --max-running-requests", "unknown": _ADMIT_CAPS}
    cap = caps.get(kind) or f"{KNOBS[kind]['name']}: {KNOBS[kind]['load']}"
    return _ADMIT_MEANING.format(cap=cap)


def _long_prompts(kind: str) -> str:
    if kind == "unknown":
        length = _LENGTHS
    else:
        from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

        length = KNOBS[kind].get("length")
    return ("Route very long prompts apart" + (f" or lower {length}" if length else "")
            + " when one long request blocks the queue.")


def _nccl_test(kind: str | None) -> str:
    test = {"vllm": "vLLM's sanity-check script.", None: "a plain torch.distributed all-reduce across the same GPUs "
            "(vLLM's troubleshooting guide has one).", "unknown": None}.get(kind)
    return ("Collective timeout at the group's first collectives: make the GPUs able to talk (peer-to-peer, shared "
            "memory in containers, the network between nodes), checked with NCCL_DEBUG=INFO and "
            + (test or "a plain torch.distributed all-reduce across the same GPUs."))


_DIED = ("The serving engine's process ({who}) exited: requests in flight failed and new ones fail until a restart. "
         "The log names why where it can: a collective (NCCL all-reduce, all-gather) that waited past its timeout, "
         "after which PyTorch's watchdog aborts the process; an out-of-memory error (its own finding); or nothing, when "
         "the engine core's own error is not in the lines given.")
_ADMIT_CAPS = "vLLM --max-num-seqs, SGLang --max-running-requests"
_ADMIT_MEANING = ("Requests waited while the KV pool kept free room, so memory did not hold them back: the running batch "
                  "is at its cap ({cap}), a request at the queue's head needs more KV blocks than are free, the "
                  "batched-token budget limits prefill, or the scheduler is stuck.")
_LENGTHS = "the context-length limit (vLLM --max-model-len, SGLang --context-length)"


def _graphs(kind: str) -> str | None:
    from ..advice.jobs import KNOBS  # (a lookup for one finding's job: not on the trace path)

    g = KNOBS[kind].get("graphs")
    return f"Capture fewer CUDA-graph sizes: {g}." if g else None


def _oom_capacity_actions(ctx: dict, config: dict) -> list[str]:
    """The knobs of the job that ran out of memory (none named when the finding does not say which job)."""
    from ..advice.jobs import KNOBS, kind_of, reduce_need, unknown_note

    kind = kind_of(ctx)
    if kind is None:
        return []
    acts = [unknown_note()] if kind == "unknown" else []
    acts.append("Need less memory at the failing step: " + reduce_need(kind))
    if kind == "vllm":
        # vLLM sizes its KV cache once, from a start-up profile of one forward pass (gpu_worker's
        # determine_available_memory); memory a later step needs beyond that profile comes out of the GPU's
        # (1 - gpu_memory_utilization) share, so that share is the run-time headroom. The value itself comes
        # from the start-up arithmetic (startup-oom, fragscope size), not from this message.
        acts.append("Or leave the failing step more headroom: lower --gpu-memory-utilization (vLLM sizes its KV cache "
                    "from one start-up profile of the forward pass; what a later step needs beyond it comes out of "
                    "the GPU's remaining 1 - utilization share), at the cost of KV capacity: fragscope size --log "
                    "START-UP-LOG gives the value.")
    elif KNOBS[kind]["memory"]:
        acts.append(f"Or change what the engine pre-allocates: {KNOBS[kind]['memory']} (a lower value leaves more of the "
                    "GPU to the failing step).")
    return acts


def _oom_outside_actions(ctx: dict, config: dict) -> list[str]:
    from ..advice.jobs import KNOBS, kind_of, unknown_note

    kind = kind_of(ctx)
    if kind is None:
        return []
    acts = [unknown_note()] if kind == "unknown" else []
    acts.append("Free the GPU of the other holders (nvidia-smi --query-compute-apps=pid,used_memory) or give this "
                + ("server" if KNOBS[kind]["serving"] else "job") + " a GPU (or MIG slice) of its own.")
    if KNOBS[kind]["memory"]:
        acts.append(f"Until then, size {KNOBS[kind]['name']} for what is left: {KNOBS[kind]['memory']}.")
    return acts


def _admission_actions(ctx: dict, config: dict) -> list[str]:
    flag = ctx.get("batch_flag") or "--max-num-seqs"
    cause = ctx.get("cause")
    if cause == "batch-cap":
        return [f"Raise {flag} above {ctx.get('batch_cap')}: the KV pool kept free room while requests waited "
                "(check the activation peak at the larger batch: fragscope size --log FILE)."]
    if cause == "prefill-paced":
        budget = {"vllm": "vLLM --max-num-batched-tokens", "sglang": "SGLang --chunked-prefill-size"}.get(
            ctx.get("job_kind"), "vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size")
        acts = [f"Prefill paces admission at {ctx.get('prompt_tps_max', 0):,.0f} prompt tokens/s: where the GPU is not "
                f"compute-saturated, a larger per-step token budget prefills more per step ({budget}), at the cost "
                "of longer decode steps for the running requests; otherwise add replicas or split prefill from "
                "decode."]
        hit = ctx.get("prefix_cache_hit_ratio")
        if hit is not None and hit < 0.1:
            cache = {"vllm": " (vLLM prefix caching)", "sglang": " (SGLang's radix cache)"}.get(ctx.get("job_kind"), "")
            acts.append(f"Prefix cache hit rate {hit * 100:.1f} %: prompts sharing a prefix (a system prompt, a "
                        f"document) routed to the same replica prefill only their new part{cache}.")
        return acts
    if cause == "stuck":
        return ["The engine generated nothing while requests waited: restart it and read its log around the stall "
                "(a blocked collective, a hung thread); see engine-stalled."]
    from ..advice.jobs import KNOBS

    kind = ctx.get("job_kind")
    length = KNOBS[kind]["length"] if kind in KNOBS and kind != "unknown" else _LENGTHS
    shorter = f"shorter {length}, or route long prompts apart" if length else "route long prompts apart"
    return [f"Read the configured {flag} (the args line) and the lengths of the waiting requests: a request longer than "
            f"the free KV blocks waits at the queue's head ({shorter}); if the batch is at the cap, raise it; if "
            "nothing moves for minutes, the scheduler is stuck: restart."]


def _engine_died_actions(ctx: dict, config: dict) -> list[str]:
    """What the log's cause asks for (detectors/log_crash.py puts it in the finding's context)."""
    from ..advice.jobs import KNOBS, kind_of

    kind = kind_of(ctx)
    name = KNOBS[kind]["name"] if kind and KNOBS[kind]["serving"] else "the server"
    acts = [f"Restart {name}: a process group that timed out, or a dead engine core, does not recover in place."]
    if ctx.get("cause") == "collective-timeout":
        op, seq = ctx.get("op") or "the collective", ctx.get("seq")
        if ctx.get("early"):
            test = ("vLLM's sanity-check script (its troubleshooting guide, \"Incorrect hardware/driver\")"
                    if kind == "vllm" else "a plain torch.distributed all-reduce across the same GPUs")
            acts.append(f"{op} #{seq} never completed: test the GPUs' communication before serving again, with "
                        f"NCCL_DEBUG=INFO and {test}; check peer-to-peer between the GPUs (nvidia-smi topo -m) and, in a "
                        "container, the shared memory NCCL needs (docker --ipc=host or --shm-size, a memory-backed "
                        "emptyDir on /dev/shm in Kubernetes).")
        else:
            acts.append(f"{seq - 1:,} collectives had completed: find the rank that stopped first in the other ranks' "
                        "logs (its first error: an out-of-memory error, a traceback) and GPU errors over the same "
                        "minutes (Xid in dmesg, ECC, NVLink: diagnose on a DCGM or nvidia-smi -q capture).")
    elif ctx.get("cause") == "unknown":
        acts.append("Read the engine core's (or worker's) lines before the first EngineDeadError and run diagnose logs "
                    "on the whole log: the cause (an out-of-memory error, a CUDA error, an assertion) is printed there.")
    return acts


_DEEP = [
    _deep("snapshot", Playbook(
        ids.OOM_CAPACITY, "Out of memory: plain capacity",
        "The allocator had no free memory worth the name: the workload needs more than the GPU holds.",
        [JobText(_LESS_NEED + " (a serving engine: its concurrency and context-length limits).", _less_need)],
        [Action(JobText(_ROOM, _room), ["the OOM happens in a forward pass, not at startup"], []),
         Action("Quantise weights or the KV cache, or shard across more GPUs (tensor parallelism).",
                ["accuracy validated for the quantised format"], [])],
        ["no OOM at the same load; peak reserved below the GPU's memory"], []), also_from=("log",),
        actions=_oom_capacity_actions),
    _deep("snapshot", Playbook(
        ids.OOM_OUTSIDE_PYTORCH, "Out of memory: memory held outside PyTorch",
        "PyTorch's own pool was small; the GPU's memory was held by something else (NCCL buffers, CUDA "
        "graphs' private pools, another process, a leak in a native library).",
        ["Find the holder: nvidia-smi --query-compute-apps, per-process NVML memory (fragscope agent)."],
        [Action(JobText(_OUTSIDE, _outside), [], ["another tenant shares the GPU: isolate it (MIG, separate GPUs) instead"])],
        ["per-process GPU memory adds up to NVML used; no OOM at the same load"], []), also_from=("log",),
        actions=_oom_outside_actions),
    _deep("snapshot", Playbook(
        ids.OOM_CROSS_STREAM, "Out of memory: free memory stranded on another stream",
        "Enough memory was free, but cached on another CUDA stream's blocks, which this stream cannot reuse.",
        ["torch.cuda.empty_cache() at a quiet point returns whole free segments (not split ones)."],
        [expandable_segments("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (one growable segment per stream)."),
         Action("Avoid allocating on side streams, or record_stream / synchronise so blocks return.", [], [])],
        ["next snapshot shows little inactive memory on idle streams"], [])),
    _deep("snapshot", Playbook(
        ids.OOM_PRIVATE_POOL, "Out of memory: memory pinned in a private pool",
        "Free memory sat in a private pool (CUDA graphs' memory pool, a MemPool) that ordinary allocations cannot use.",
        ["Capture fewer CUDA graph batch sizes, or release graphs no longer used."],
        [Action(JobText(_GRAPHS, _graphs), [], ["fewer graphs mean more eager (launch-bound) steps at uncaptured sizes"])],
        ["private-pool bytes in the snapshot shrink; no OOM at the same load"], [])),
    _deep("snapshot", Playbook(
        ids.OOM_MEMORY_CAP, "Out of memory: per-process memory cap",
        "The device still had room, but a per-process limit (set_per_process_memory_fraction or the "
        "allocator's memory-fraction policy) refused the request.",
        ["Check torch.cuda.set_per_process_memory_fraction / the engine's memory fraction settings."],
        [Action("Raise the cap to what the process needs, or lower the workload.",
                ["no other process relies on the memory the cap protects"], [])],
        ["no OOM rejections (num_oom_rejections flat)"], []), also_from=("log",)),
    _deep("log", Playbook(
        ids.ADMISSION_CAPPED, "Requests queued with KV memory free: admission capped",
        JobText(_ADMIT_MEANING.format(cap=_ADMIT_CAPS), _admission_meaning),
        ["Compare the running batch with the configured cap in the engine's args line."],
        [Action("Raise the batch cap when the batch sits at it and the pool keeps free room.",
                ["the activation peak at the larger batch still fits (fragscope size --log)"],
                ["latency-bound traffic: a larger batch lengthens each decode step"]),
         Action(JobText(_long_prompts("unknown"), _long_prompts), [], []),
         Action("Restart a scheduler that admits nothing for minutes (no token generated).", [], [])],
        ["waiting falls to ~0 while KV usage rises toward the pool's size"], []), actions=_admission_actions),
    _deep("log", Playbook(
        ids.KV_CAPACITY_GAP, "KV-cache capacity below the estimate",
        "The engine allocated fewer KV tokens than the kv-budget estimate for this model and GPU: memory went "
        "elsewhere (CUDA graphs, NCCL buffers, activation peak, another process) or the config differs.",
        ["Read the startup log's memory profile lines (diagnose logs) to see where memory went."],
        [Action("If CUDA graphs take the gap: capture fewer sizes, or accept it (graphs pay back in speed).",
                [], []),
         Action("If another process holds memory: isolate the GPU.", [], [])],
        ["logged KV capacity within ~10 % of `fragscope kv-budget`"], [])),
    _deep("trace", Playbook(
        ids.SYNC_BOUND, "Host synchronisation stalls",
        "The host blocks on the GPU (cudaDeviceSynchronize / cudaStreamSynchronize / synchronous copies), "
        "so it cannot queue the next work in time.",
        ["Find the synchronising call sites in the trace (diagnose trace lists them)."],
        [Action("Replace synchronous copies with pinned-memory *Async copies; avoid .item()/.cpu() in the hot loop.",
                [], []),
         Action("Use events (cudaStreamWaitEvent) instead of full synchronisation.", [], [])],
        ["synchronous API time share falls; GPU idle share falls"], ["nsys analyze cuda_api_sync"])),
    _deep("trace", Playbook(
        ids.ALLOCATOR_STALLS, "Allocator stalls in the timeline",
        "cudaFree followed by cudaMalloc in steady state: the caching allocator is flushing and re-allocating "
        "(allocation retries), each a device synchronisation.",
        ["Check the allocator: fragscope_torch_alloc_retries_total, a memory snapshot (diagnose snapshot)."],
        [Action("See allocator-fragmentation's fixes (headroom, expandable_segments).", [],
                list(expandable_segments().contraindications))],
        ["no cudaMalloc/cudaFree between warm-up and the end of the trace"], [])),
    _deep("log", Playbook(
        ids.ENGINE_DIED, "The engine process died",
        JobText(_DIED.format(who="its engine core or a worker"), vllm=_DIED.format(who="vLLM's engine core or a worker")),
        ["Restart the server (its /health fails once the engine is dead: let the orchestrator replace the pod)."],
        [Action("Collective timeout after the group had worked: find the rank that stopped first (the other ranks' "
                "logs, GPU errors over the same minutes) and fix that rank's cause.",
                ["the watchdog's collective number is past the first few"],
                ["raising the timeout (torch.distributed's default for NCCL is 10 min in current releases, 30 min "
                 "in older ones) only delays the crash when a rank is gone"]),
         Action(JobText(_nccl_test(None), _nccl_test),
                ["the watchdog's collective number is among the first few"],
                ["NCCL_P2P_DISABLE=1 works around broken peer-to-peer but slows every all-reduce: only where "
                 "peer-to-peer is shown broken"]),
         Action("Engine dead with no cause in the log: collect the engine core's lines before the first "
                "EngineDeadError and diagnose them.", [], [])],
        ["the server answers /health and serves traffic; no watchdog timeout or EngineDeadError in the log since the "
         "restart"],
        [only("https://docs.vllm.ai/en/latest/usage/troubleshooting/", "vllm"),
         "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group"]),
        actions=_engine_died_actions),
]


def _startup_oom() -> list[Diagnosis]:
    # sizing from the engine's own start-up accounting (docs/sizing.md); kv-pool-undersized is a window
    # diagnosis (playbooks/window.py) that the log reports too
    from ..sizing.playbooks import STARTUP_OOM, startup_oom_actions

    return [Diagnosis(ids.STARTUP_OOM, STARTUP_OOM, source="log", alerting=False, actions=startup_oom_actions)]


def _cpu_fallback() -> list[Diagnosis]:
    from ..detectors import cpu_fallback  # ONNX Runtime profiling JSON (a Chrome trace of node runs): docs/engines.md

    return [_deep("trace", cpu_fallback.PLAYBOOK, actions=cpu_fallback.actions, also_from=("log",))]


def _evidence_trace() -> list[Diagnosis]:
    from ..trace_playbooks import UNIFIED_MEMORY_THRASHING_PLAYBOOK  # (with the timeline's thresholds)

    return [_deep("trace", UNIFIED_MEMORY_THRASHING_PLAYBOOK)]


def _batching() -> list[Diagnosis]:
    from ..detectors import batching  # Triton config.pbtxt + its counters

    return [_deep("config", batching.PLAYBOOK, actions=batching.actions)]


# Declaration order (the registry's); the ones declared here load without importing a detector or the sizing
# arithmetic ("local": tried first by a lookup by id), the others import the module that declares them.
SOURCES = (Source("evidence", lambda: _DEEP, local=True), Source("sizing", _startup_oom),
           Source("evidence_trace", _evidence_trace, local=True),
           Source("cpu_fallback", _cpu_fallback), Source("batching", _batching))
