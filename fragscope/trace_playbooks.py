"""Playbooks for kernel-timeline verdicts that depend on what the trace ran, and for the timeline-only
diagnosis ``unified-memory-thrashing``. Module-level :class:`~fragscope.playbooks.Playbook` constants (for
the diagnosis registry) and :func:`attach_trace_playbooks`, which gives each timeline finding the one that
fits the trace's workload (``analysis["workload"]["kind"]``). Contract: docs/trace.md.
"""
from __future__ import annotations

from .detectors.timeline_config import LAUNCH_BOUND, UNIFIED_MEMORY_THRASHING
from .model import Action, Finding, Playbook

# launch-bound in a training step: no serving-engine flags (a training job has no --enforce-eager).
LAUNCH_BOUND_TRAINING = Playbook(
    LAUNCH_BOUND, "Host-bound kernel launches (training step)",
    "The training step's GPU work is many short kernels and the CPU cannot launch them as fast as the GPU runs "
    "them: the GPU waits between kernels.",
    ["Check the training process's CPU: is the container throttled (cgroup cpu.stat) or pinned to too few "
     "cores, and do DataLoader workers compete with the launching thread?"],
    [Action("Capture the step in CUDA graphs: torch.compile(model, mode=\"reduce-overhead\") or "
            "torch.cuda.make_graphed_callables / torch.cuda.graph for the static part of the step.",
            ["static shapes and no CPU synchronisation inside the captured region"],
            ["dynamic shapes recompile or fall back to eager", "graph capture keeps its memory pool: check "
             "GPU memory headroom first"]),
     Action("Do more work per launch: a larger per-GPU batch (scale the learning rate accordingly), fewer "
            "micro-batches per step.", ["GPU memory headroom"], ["changes the optimisation: re-tune the "
                                                                 "learning rate"]),
     Action("Fuse small ops: torch.compile, fused / foreach optimizers (torch.optim.AdamW(fused=True)), "
            "fused losses and norms.", [], []),
     Action("Keep the launching thread free: DataLoader(num_workers>0, pin_memory=True), "
            ".to(device, non_blocking=True), no per-step .item() / print of tensors.", [], [])],
    ["GPU idle share < 10 % and kernel gap p50 in tens of µs in a new trace of the same step; step time down"],
    ["HTA idle time and kernel launch statistics", "PyTorch CUDA graphs documentation (torch.cuda.graphs)"])

# launch-bound when the trace does not say what it ran: both kinds of advice, each with its condition.
LAUNCH_BOUND_GENERIC = Playbook(
    LAUNCH_BOUND, "Host-bound kernel launches",
    "The GPU waits on the CPU between kernels: launches come later than the GPU could run them.",
    ["Check the process's CPU: is the container throttled (cgroup cpu.stat) or pinned to too few cores?"],
    [Action("Use CUDA graphs: in a vLLM server remove --enforce-eager (decode graphs are captured by default); "
            "in your own PyTorch code torch.compile(mode=\"reduce-overhead\") or torch.cuda.graph.",
            ["the model and its shapes are graph-capturable"],
            ["graph capture needs extra GPU memory: check headroom first"]),
     Action("Do more work per launch: larger batches (serving: max_num_seqs / max_num_batched_tokens; "
            "training: per-GPU batch).", ["memory headroom"], ["latency-sensitive serving traffic: larger "
                                                               "batches raise inter-token latency"]),
     Action("Fuse small kernels (torch.compile, fused ops) to cut the launch count.", [], []),
     Action("Give the process more CPU: raise the CPU limit, avoid throttling, pin the launching thread.", [], [])],
    ["GPU idle share < 10 %; kernel gap p50 in tens of µs at the same load"],
    ["HTA idle time and kernel launch statistics"])

UNIFIED_MEMORY_THRASHING_PLAYBOOK = Playbook(
    UNIFIED_MEMORY_THRASHING, "Unified (managed) memory thrashing",
    "Managed memory (cudaMallocManaged, or a UVM allocator) is migrating page by page on demand between host "
    "and GPU: each GPU page fault stalls the kernels that touch the page, and pages that both sides use move "
    "back and forth.",
    ["Find the managed allocations and who touches them: re-profile with nsys --cuda-um-gpu-page-faults=true "
     "--cuda-um-cpu-page-faults=true and look at the faulting kernels."],
    [Action("Prefetch before use: cudaMemPrefetchAsync(ptr, bytes, device, stream) ahead of the kernels that "
            "read the data (and to cudaCpuDeviceId before the host reads it back).",
            ["the data each phase uses is known"],
            ["the working set is larger than GPU memory: prefetching evicts other managed pages (still "
             "thrashing); shrink the working set first"]),
     Action("Advise the driver: cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, device) for data "
            "the GPU owns, cudaMemAdviseSetAccessedBy for data read from both sides, "
            "cudaMemAdviseSetReadMostly for read-only data (copied, never migrated).", [], []),
     Action("Do not use managed memory on the hot path: cudaMalloc device buffers and cudaMemcpyAsync from "
            "pinned host memory (in PyTorch: ordinary CUDA tensors, not a managed-memory allocator or UVM "
            "offload, for tensors used every step).", [],
            ["the working set only fits because of oversubscription: then offload explicitly (and "
             "asynchronously) instead"])],
    ["nsys: unified-memory rows (CUPTI_ACTIVITY_KIND_MEMCPY copyKind 11/12) drop to a few prefetches; GPU "
     "idle share falls; step or request time down"],
    ["CUDA C++ Programming Guide: Unified Memory, performance tuning (cudaMemPrefetchAsync, cudaMemAdvise)",
     "NVIDIA blog: Maximizing Unified Memory Performance in CUDA"])


def _built(pb: Playbook, actions: list[str]) -> dict:
    d = pb.to_dict()
    d["actions"] = actions
    return d


def playbook_for(finding: Finding, workload_kind: str) -> dict | None:
    """The built playbook (``Playbook.to_dict()`` + ``actions``) a timeline finding gets here, or None to
    leave it to the diagnosis's standard playbook (launch-bound in a serving engine's trace)."""
    if finding.id == UNIFIED_MEMORY_THRASHING:
        return _built(UNIFIED_MEMORY_THRASHING_PLAYBOOK, [
            "Prefetch managed buffers to the GPU before the kernels use them (cudaMemPrefetchAsync) and set "
            "cudaMemAdviseSetPreferredLocation; or allocate them with cudaMalloc and copy explicitly."])
    if finding.id == LAUNCH_BOUND and workload_kind == "training":
        return _built(LAUNCH_BOUND_TRAINING, [
            "Capture the training step in CUDA graphs (torch.compile(mode=\"reduce-overhead\")) or raise the "
            "per-GPU batch, and check the process's CPU throttling."])
    if finding.id == LAUNCH_BOUND and workload_kind != "serving":
        return _built(LAUNCH_BOUND_GENERIC, [
            "Use CUDA graphs (vLLM: remove --enforce-eager; own code: torch.compile(mode=\"reduce-overhead\")) "
            "and check the process's CPU throttling."])
    return None


def attach_trace_playbooks(findings: list[Finding], workload_kind: str) -> None:
    """Give each timeline finding the playbook that fits the workload (in place)."""
    for f in findings:
        pb = playbook_for(f, workload_kind)
        if pb is not None:
            f.playbook = pb
