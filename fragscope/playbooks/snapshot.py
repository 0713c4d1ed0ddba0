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
from ..advice.jobs import KNOBS
from ..advice.jobtext import JobText, line_for, lines_for

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
# What to do per OOM class (beyond the allocator options). A line that names a job's settings is a JobText: its
# value names them beside each engine's name; the snapshot's job (its stack frames: doc["job"]) picks that job's own.
def _graphs(kind: str) -> str:
    g = KNOBS[kind].get("graphs")
    how = f"capture fewer batch sizes ({g})" if g and kind == "unknown" else (
        f"capture fewer batch sizes ({KNOBS[kind]['name']}: {g})" if g else "capture fewer batch sizes")
    return (f"CUDA-graph / MemPool private pools keep their memory while the graph or pool lives: {how}, share one "
            "pool between graphs, or delete unused graphs / pools")


def _cap(kind: str) -> str:
    mem = KNOBS[kind]["memory"]
    budget = (f" (and {KNOBS[kind]['name']}'s memory budget, {mem})" if mem else "") if kind != "unknown" else (
        " (and a serving engine's memory budget, e.g. vLLM --gpu-memory-utilization, SGLang --mem-fraction-static, "
        "TGI --cuda-memory-fraction)")
    return (f"the driver had room but the allocator refused: check torch.cuda.set_per_process_memory_fraction()"
            f"{budget} against what this process needs")


def _outside(kind: str) -> str:
    k = KNOBS[kind]
    if kind == "vllm":
        fix = "lower vLLM --gpu-memory-utilization or move the other tenant"
    elif kind == "unknown":
        fix = ("move the other tenant, or lower a serving engine's memory share by what it holds (vLLM "
               "--gpu-memory-utilization, SGLang --mem-fraction-static, TGI --cuda-memory-fraction)")
    elif k["memory"]:
        fix = f"lower {k['name']}'s {k['memory']} or move the other tenant"
    else:
        fix = "move the other tenant or give the job a GPU (or MIG slice) of its own"
    return ("memory is held outside this process's PyTorch cache: list GPU processes (nvidia-smi "
            f"--query-compute-apps=pid,used_memory --format=csv), check NCCL buffers and other tenants; {fix}")


def _capacity(kind: str) -> str:
    k = KNOBS[kind]
    if kind == "vllm":
        return ("the workload needs more memory than the GPU has: lower the batch (vLLM --max-num-seqs / "
                "--max-num-batched-tokens) or context length (--max-model-len), quantize weights or KV cache, or "
                "shard over more GPUs")
    if kind == "unknown":
        return ("the workload needs more memory than the GPU has: lower the batch or the sequence length (a serving "
                "engine: its concurrency and context-length limits, e.g. vLLM --max-num-seqs / --max-model-len, "
                "SGLang --max-running-requests / --context-length), quantize weights, or shard over more GPUs")
    less = f"lower {k['load']}" + (f" or {k['length']}" if k.get("length") else "") + (
        f"; {k['extra']}" if k.get("extra") else "")
    return (f"the workload needs more memory than the GPU has: {less}; quantize weights"
            + (" or KV cache" if k["serving"] else "") + ", or shard over more GPUs")


UNKNOWN_JOB_NOTE = ("The snapshot's stack frames do not show what produced it (a serving engine, a training loop, a "
                    "notebook): the fixes below are the program's own; engine flags apply only if a serving engine "
                    "produced it.")
OOM_CLASS_ACTIONS: dict[str, list[Action]] = {
    OOM_CROSS_STREAM: [Action(
        "free blocks are cached per stream: allocate on the stream that frees, or call "
        "tensor.record_stream() only where needed; torch.cuda.empty_cache() after a side-stream "
        "phase returns whole free segments")],
    OOM_PRIVATE_POOL: [Action(JobText(_graphs("unknown"), _graphs))],
    OOM_MEMORY_CAP: [Action(JobText(_cap("unknown"), _cap))],
    OOM_OUTSIDE_PYTORCH: [Action(JobText(_outside("unknown"), _outside))],
    OOM_CAPACITY: [
        Action(JobText(_capacity("unknown"), _capacity)),
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


def snapshot_playbook(diagnosis: str, settings: dict, dm: dict, oom: dict | None = None,
                      kind: str | None = None) -> dict:
    """Playbook for a snapshot diagnosis, with actions computed from the numbers and settings.

    ``settings``: ``allocator_settings_summary``; ``dm``: default-pool numbers now (the dump);
    ``oom``: the ``ooms[]`` entry the finding is about, if any; ``kind``: the job that produced the snapshot (its
    ``job.kind``, a ``KNOBS`` kind): actions name that job's settings only (None: each engine's, labelled).
    """
    kind = kind if kind in KNOBS else None
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
    if kind is not None:  # the contraindications about another engine left out (advice/jobtext.py)
        for o in options:
            o["preconditions"] = lines_for(o["preconditions"], kind)
            o["contraindications"] = lines_for(o["contraindications"], kind)
    class_actions = [str(line_for(a.text, kind)) for a in OOM_CLASS_ACTIONS.get(diagnosis, [])]
    if kind == "unknown" and any(isinstance(a.text, JobText) for a in OOM_CLASS_ACTIONS.get(diagnosis, [])):
        actions.append(UNKNOWN_JOB_NOTE)
    actions += class_actions
    for o in options:
        if o["applies"] is True:
            actions.append(f"set {o['env']} (not if: {o['contraindications'][0]})")
    return {"diagnosis": diagnosis, "immediate": immediate, "actions": actions, "options": options}


def attach_snapshot_playbooks(doc: dict, findings: list[Finding]) -> tuple[dict, list[Finding]]:
    """Replace each finding's playbook context (set by the analysis) with its playbook, in the knobs of the job the
    snapshot's frames show (``doc["job"]``); refresh ``doc``."""
    kind = (doc.get("job") or {}).get("kind")
    for f in findings:
        ctx = (f.playbook or {}).get("context") if isinstance(f.playbook, dict) else None
        if ctx is not None:
            f.playbook = snapshot_playbook(ctx["diagnosis"], ctx["settings"], ctx["dm"], ctx["oom"], kind)
            f.context.setdefault("job_kind", kind)
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
           "EXPANDABLE_SEGMENTS", "MAX_SPLIT_SIZE", "GC_THRESHOLD", "OOM_CLASS_ACTIONS", "UNKNOWN_JOB_NOTE"]
