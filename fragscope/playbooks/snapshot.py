"""Playbooks of the memory-snapshot diagnoses, on :class:`fragscope.model.Action`, attached to the
findings of :func:`fragscope.detectors.snapshot.analyse_snapshot` (reading a file first:
:mod:`fragscope.snapshot_pipeline`).

The snapshot diagnoses (``allocator-fragmentation`` and the ``oom-*`` classes, docs/snapshot.md) carry
a playbook computed from the snapshot: ``PYTORCH_CUDA_ALLOC_CONF`` options, each an :class:`Action`
below (its ``text`` is the option's *why*) judged against the recorded allocator settings, plus one
:class:`Action` per OOM class. The JSON shape (``diagnosis``, ``immediate``, ``actions``, ``options[]``
with ``setting, env, applies, status, why, preconditions, contraindications``) is the contract of
docs/snapshot.md and unchanged from when it was built inside the detector.
"""
from __future__ import annotations

import math

from ..collectors.snapshot import Snapshot
from ..detectors.snapshot import (
    FRAGMENTATION,
    OOM_CAPACITY,
    OOM_CROSS_STREAM,
    OOM_MEMORY_CAP,
    OOM_OUTSIDE_PYTORCH,
    OOM_PRIVATE_POOL,
    analyse_snapshot,
)
from ..detectors.snapshot_allocator import MiB, fmt_bytes
from ..model import Action, Finding
from ..advice.fixes import EXPANDABLE_CONTRA, EXPANDABLE_PRE

# PYTORCH_CUDA_ALLOC_CONF options: text = why it helps
EXPANDABLE_SEGMENTS = Action(
    "one growable segment per stream (virtual-memory mapping): sizes that change a little "
    "(batch N -> N+1) no longer leave slivers at segment ends, and free pages can be unmapped",
    list(EXPANDABLE_PRE), list(EXPANDABLE_CONTRA))
MAX_SPLIT_SIZE = Action(
    "blocks this large or larger are never split, so small requests cannot shatter them; "
    "PyTorch's docs keep it as a last resort for OOMs with many inactive split blocks",
    ["native allocator", "fragmentation involves blocks larger than 20 MiB (the value must be > 20)"],
    [
        "can cost performance: large requests can no longer reuse bigger cached blocks, so there are "
        "more cudaMalloc/cudaFree calls; compare throughput before and after",
        "redundant once expandable_segments:True works", "ignored by backend:cudaMallocAsync",
    ],
)
GC_THRESHOLD = Action(
    "frees old unused cached blocks before the allocator reaches the flush-everything retry "
    "(device sync, latency spike); PyTorch's docs name servers as the target",
    [
        "torch.cuda.set_per_process_memory_fraction() is set: the collector runs only under a "
        "memory fraction (CUDACachingAllocator: garbage_collect_cached_blocks behind set_fraction; "
        "pytorch/pytorch#74261)", "value in (0, 1)",
    ],
    [
        "does nothing for free blocks inside partly used segments (they are not releasable)",
        "ignored by backend:cudaMallocAsync",
    ],
)
# what to do per OOM class (beyond the allocator options)
OOM_CLASS_ACTIONS: dict[str, list[Action]] = {
    OOM_CROSS_STREAM: [Action(
        "free blocks are cached per stream: allocate on the stream that frees, or call "
        "tensor.record_stream() only where needed; torch.cuda.empty_cache() after a side-stream "
        "phase returns whole free segments")],
    OOM_PRIVATE_POOL: [Action(
        "CUDA-graph / MemPool private pools keep their memory while the graph or pool lives: "
        "capture fewer batch sizes (vLLM: fewer cudagraph capture sizes or a lower "
        "--max-num-seqs; --enforce-eager to confirm), share one pool between graphs, or "
        "delete unused graphs / pools")],
    OOM_MEMORY_CAP: [Action(
        "the driver had room but the allocator refused: check "
        "torch.cuda.set_per_process_memory_fraction() (and the engine's memory budget, e.g. "
        "vLLM --gpu-memory-utilization) against what this process needs")],
    OOM_OUTSIDE_PYTORCH: [Action(
        "memory is held outside this process's PyTorch cache: list GPU processes "
        "(nvidia-smi --query-compute-apps=pid,used_memory --format=csv), check NCCL buffers "
        "and other tenants; lower vLLM --gpu-memory-utilization or move the other tenant")],
    OOM_CAPACITY: [
        Action("the workload needs more memory than the GPU has: lower the batch "
               "(vLLM --max-num-seqs / --max-num-batched-tokens) or context length (--max-model-len), "
               "quantize weights or KV cache, or shard over more GPUs"),
        Action("allocator settings will not help: allocated is close to reserved"),
    ],
}
ASYNC_BACKEND_NOTE = ("backend:cudaMallocAsync is in effect: the caching-allocator knobs below are ignored; "
                      "switch to the native backend before tuning them")


def _pow2_floor(x: float) -> int:
    return 1 << int(math.floor(math.log2(x))) if x >= 1 else 0


def _option(setting: str, action: Action, applies, status: str) -> dict:
    return {"setting": setting, "env": f"PYTORCH_CUDA_ALLOC_CONF={setting}", "applies": applies, "status": status,
            "why": action.text, "preconditions": list(action.preconditions),
            "contraindications": list(action.contraindications)}


def snapshot_playbook(diagnosis: str, settings: dict, dm: dict, oom: dict | None = None) -> dict:
    """Playbook for a snapshot diagnosis, with actions computed from the numbers and settings.

    ``settings``: ``allocator_settings_summary``; ``dm``: default-pool numbers now (the dump);
    ``oom``: the ``ooms[]`` entry the finding is about, if any.
    """
    async_backend = settings.get("backend") == "cudaMallocAsync"
    exp_on = settings.get("expandable_segments") is True
    gct_set = (settings.get("garbage_collection_threshold") or 0) > 0
    options: list[dict] = []
    immediate: list[str] = [ASYNC_BACKEND_NOTE] if async_backend else []
    actions: list[str] = []
    if diagnosis in (FRAGMENTATION, OOM_CROSS_STREAM):
        options.append(_option(
            "expandable_segments:True", EXPANDABLE_SEGMENTS, not exp_on and not async_backend,
            "already on" if exp_on else ("ignored by backend:cudaMallocAsync" if async_backend
                                         else "recommended first")))
    if diagnosis == FRAGMENTATION:
        target = None
        if oom is not None:
            target = oom["size_bytes"]
        elif dm.get("largest_free_block_bytes"):
            target = dm["largest_free_block_bytes"]
        mb = _pow2_floor(target / MiB) if target else 0
        cur = settings.get("max_split_size_bytes")
        ok = mb > 20 and not async_backend
        options.append(_option(
            f"max_split_size_mb:{max(mb, 32)}", MAX_SPLIT_SIZE, ok and (cur is None or cur > mb * MiB),
            ("already set to " + fmt_bytes(cur)) if cur is not None else
            ("starting value: the largest power of two at or below the failing request / largest free block"
             if ok else "not applicable: requests here are too small (must be > 20 MiB)")))
        # applies None: depends on a per-process memory fraction, which a snapshot does not record
        options.append(_option(
            "garbage_collection_threshold:0.8", GC_THRESHOLD, False if async_backend or gct_set else None,
            "already set" if gct_set else "only with a per-process memory fraction"))
        if dm.get("releasable_bytes"):
            immediate.append(f"torch.cuda.empty_cache() would return {fmt_bytes(dm['releasable_bytes'])} to "
                             f"the driver, but not the {fmt_bytes(dm.get('non_releasable_inactive_bytes'))} "
                             f"stuck beside live tensors")
    actions += [a.text for a in OOM_CLASS_ACTIONS.get(diagnosis, [])]
    for o in options:
        if o["applies"] is True:
            actions.append(f"set {o['env']} (not if: {o['contraindications'][0]})")
    return {"diagnosis": diagnosis, "immediate": immediate, "actions": actions, "options": options}


def attach_snapshot_playbooks(doc: dict, findings: list[Finding]) -> tuple[dict, list[Finding]]:
    """Replace each finding's playbook context (set by the analysis) with its playbook; refresh ``doc``."""
    for f in findings:
        ctx = (f.playbook or {}).get("context") if isinstance(f.playbook, dict) else None
        if ctx is not None:
            f.playbook = snapshot_playbook(ctx["diagnosis"], ctx["settings"], ctx["dm"], ctx["oom"])
    doc["findings"] = [f.to_dict() for f in findings]
    doc["playbook"] = findings[0].playbook if findings else None
    return doc, findings


def diagnose_snapshot(snap: Snapshot, **kw) -> tuple[dict, list[Finding]]:
    """Analyse a normalised snapshot and attach playbooks: the document of docs/snapshot.md and its findings.

    Keyword arguments go to :func:`fragscope.detectors.snapshot.analyse_snapshot` (cfg, device,
    device_total_bytes).
    """
    return attach_snapshot_playbooks(*analyse_snapshot(snap, **kw))


__all__ = ["snapshot_playbook", "attach_snapshot_playbooks", "diagnose_snapshot",
           "EXPANDABLE_SEGMENTS", "MAX_SPLIT_SIZE", "GC_THRESHOLD", "OOM_CLASS_ACTIONS"]
