"""One judgement of a PyTorch OOM message from its own figures: which process in its list is the one that
failed, and what dominates the memory the allocation lacked. Pure. docs/logs.md#ooms.

Used by the log detector (detectors/log_oom.py, ``diagnose logs``) and the sizing arithmetic
(sizing/arith.py and sizing/failures.py, ``fragscope size --log``), so the two never give one OOM two causes.

PyTorch >= 2.2 lists every process with memory on the device ("Process P has X GiB memory in use"),
the failing one included; it says "this process has" only when it recognises its own pid. Inside a
container (another PID namespace) it does not, so the failing process appears as an ordinary "Process P"
line. Counting that line as "another process" doubles the engine's own memory (vllm_v1_oom.log:
"Process 4121 has 78.12 GiB" is the EngineCore pid=4121 that failed).
"""
from __future__ import annotations

import math

GIB = 1024.0 ** 3
MIB = 1024.0 ** 2

# An allocation needs a little more than it asks: cudaMalloc rounds to 2 MiB pages, the message rounds
# each figure to 0.01 GiB (~10 MiB), the driver keeps a reserve. Free memory within this slack of the
# request did not really cover it; free memory beyond it did (then the device did not refuse: a cap).
ALLOC_SLACK_BYTES = 64.0 * MIB
# Memory in use outside this process's PyTorch pool always includes its CUDA context (300-600 MiB on
# current GPUs and drivers) plus cuBLAS/cuDNN workspaces and NCCL buffers (tens to hundreds of MiB).
# Held memory is named as the cause only above 1 GiB and 10 % of the GPU: more than that baseline.
OUTSIDE_MIN_BYTES = 1.0 * GIB
OUTSIDE_MIN_SHARE = 0.10
# A working caching allocator always holds some reserved-but-unallocated memory: every block is rounded
# (512 B small, 2 MiB large), requests of 1-10 MiB take 20 MiB segments, and the tail of the last segment
# of each size stays unused until something fits it. PyTorch's own hint is "reserved >> allocated"; the
# fragmentation playbook calls < 10 % of reserved a healthy baseline. Below 5 % of reserved, even all of
# the slack handed back would let the workload grow by under 5 % before the same OOM: the pool is full of
# live tensors (capacity), whatever the slack-versus-shortfall arithmetic says (a 142 MiB slack on a
# 9.2 GiB pool, bcmi/libcom#54; 321 MiB on 36.3 GiB, awslabs/keys_values#92).
STRANDED_MIN_SHARE = 0.05
# fragmentation-contributed: stranded >= 20 % of reserved (PyTorch's "reserved >> allocated") and >= a
# quarter of the shortfall
CONTRIBUTING_RATIO = 0.20
CONTRIBUTING_SHORTFALL = 0.25

VERDICTS = ("memory-cap", "other-process", "outside-pytorch", "fragmentation", "fragmentation-contributed",
            "capacity", "outside-allocator", "unknown")


def split_self(listed: list[dict], pool: float | None, used: float | None,
               in_use_self: float | None) -> tuple[list[dict], int | None]:
    """(the other processes, the pid taken to be this process or None) from an OOM's process list.

    ``pool``: this process's PyTorch pool (reserved bytes; allocated when reserved is cut off), ``used``:
    total - free on the device, ``in_use_self``: "this process has" bytes when printed. When the listed
    processes plus this process's pool exceed what is in use on the device (1 % tolerance for the
    2-decimal rounding of the message), one of them is this process: the smallest entry that holds at
    least the pool."""
    if not listed or in_use_self is not None or pool is None or used is None:
        return listed, None
    if sum(o["bytes"] for o in listed) + pool <= used * 1.01:
        return listed, None
    cands = [o for o in listed if o["bytes"] >= pool * 0.99]
    if not cands:
        return listed, None
    me = min(cands, key=lambda o: o["bytes"])
    return [o for o in listed if o is not me], me["pid"]


def _fin(x) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %" if x < 0.1 else f"{x * 100:.0f} %"


def _size(x: float) -> str:
    return f"{x / GIB:.2f} GiB" if abs(x) >= GIB else f"{x / MIB:.2f} MiB"


def judge_oom(f: dict, contributing_ratio: float = CONTRIBUTING_RATIO,
              contributing_shortfall: float = CONTRIBUTING_SHORTFALL) -> dict:
    """An OOM event's fields (as parsed, bytes) -> its figures and its verdict, the first that applies:

    ``memory-cap`` free covered the request plus the allocation slack (a per-process cap refused);
    ``other-process`` / ``outside-pytorch`` *dominant*: memory held by other processes (listed) or outside this
    process's pool covers what the allocation lacked **and** is more than this process's whole pool;
    ``fragmentation``: the pool's reserved-but-unallocated bytes cover what the allocation lacked and are at
    least 5 % of reserved; ``fragmentation-contributed``; ``other-process`` / ``outside-pytorch`` (covering
    the lack); ``capacity``; ``outside-allocator`` (``CUDA error: out of memory``); ``unknown`` (figures missing).
    ``judged_by`` says in one sentence what decided it."""
    req, free = _fin(f.get("requested_bytes")), _fin(f.get("free_bytes"))
    unalloc, reserved = _fin(f.get("reserved_unallocated_bytes")), _fin(f.get("reserved_bytes"))
    total, alloc = _fin(f.get("total_bytes")), _fin(f.get("allocated_bytes"))
    in_use_self = _fin(f.get("process_in_use_bytes"))
    listed = list(f.get("other_processes") or [])
    used = (total - free) if total is not None and free is not None else None
    pool = reserved if reserved is not None else alloc  # allocated: a lower bound of the pool when reserved is cut off
    others, self_pid = split_self(listed, pool, used, in_use_self)
    others_bytes = float(sum(o["bytes"] for o in others)) if others else None
    outside = (used - pool) if used is not None and pool is not None else None
    inconsistency = None
    if pool is not None and total is not None and pool > total * 1.01:
        # more than the device holds: a driver that spills into system memory (Windows WDDM shared GPU memory, the
        # CUDA "sysmem fallback" policy); the message's figures cannot all describe device memory
        inconsistency = (f"PyTorch holds {_size(pool)} on a {_size(total)} GPU ({_size(pool - total)} more than the "
                         "device has): the driver is spilling into system memory (Windows shared GPU memory, the "
                         "CUDA sysmem fallback policy), so the figures do not add up on the device")
    elif outside is not None and outside < -max(ALLOC_SLACK_BYTES, 0.01 * (total or 0.0)):
        inconsistency = (f"PyTorch's pool ({_size(pool)}) is larger than the memory in use on the device "
                         f"({_size(used)} = total - free): the figures do not add up")
    if inconsistency is not None:
        outside = None  # flagged, never clipped to 0
    elif outside is not None:
        outside = max(0.0, outside)  # within the message's rounding
    out = {"requested_bytes": req, "total_bytes": total, "free_bytes": free, "allocated_bytes": alloc,
           "reserved_bytes": reserved, "reserved_unallocated_bytes": unalloc,
           "reserved_unallocated_derived": bool(f.get("reserved_unallocated_derived")),
           "process_in_use_bytes": in_use_self, "other_processes": listed,
           "memory_limit_bytes": _fin(f.get("memory_limit_bytes")),
           "other_processes_bytes": others_bytes, "self_listed_pid": self_pid,
           "other_processes_share_of_total": (round(others_bytes / total, 4) if others_bytes is not None and total
                                              else None),
           "held_outside_pytorch_bytes": outside,
           "non_pytorch_this_process_bytes": (max(0.0, in_use_self - pool) if in_use_self is not None
                                              and pool is not None else None),
           "figures_inconsistent": inconsistency is not None, "inconsistency": inconsistency,
           "fragmentation_ratio": None, "shortfall_bytes": None, "unmet_bytes": None,
           "verdict": "unknown", "judged_by": "the message lacks the figures to judge"}
    if f.get("wording") == "cuda-error":
        out["verdict"] = "outside-allocator"  # cudaErrorMemoryAllocation from NCCL, cuBLAS, graph capture...
        out["judged_by"] = "a CUDA call outside PyTorch's caching allocator failed; the message has no figures"
        return out
    ratio = None
    if unalloc is not None and reserved:
        ratio = out["fragmentation_ratio"] = round(unalloc / reserved, 4)
    if req is None or free is None:
        return out
    out["shortfall_bytes"] = max(0.0, req - free)
    # what the allocation lacked, the slack included when free memory only just covered the request
    unmet = out["unmet_bytes"] = max(0.0, req + ALLOC_SLACK_BYTES - free)
    outside_floor = max(OUTSIDE_MIN_BYTES, OUTSIDE_MIN_SHARE * total) if total else OUTSIDE_MIN_BYTES
    others_cover = others_bytes is not None and others_bytes >= unmet
    outside_cover = outside is not None and outside >= unmet and outside >= outside_floor
    share_total = (lambda x: f" ({_pct(x / total)} of the GPU)" if total else "")
    pool_txt = f"this process's PyTorch pool ({_size(pool)})" if pool is not None else "this process's PyTorch pool"
    cap = _fin(f.get("memory_limit_bytes"))  # cudaMallocAsync: the user-supplied memory fraction, in bytes
    if cap is not None and total is not None and cap < total and alloc is not None and alloc + req > cap:
        out["verdict"] = "memory-cap"
        out["judged_by"] = (f"allocated {_size(alloc)} + requested {_size(req)} exceed PyTorch's limit {_size(cap)} "
                            f"(set by a memory fraction) below the device's {_size(total)}")
    elif unmet <= 0:
        out["verdict"] = "memory-cap"
        out["judged_by"] = f"free memory ({_size(free)}) covered the request ({_size(req)}) with room to spare"
    elif others_cover and pool is not None and others_bytes > pool:
        out["verdict"] = "other-process"
        out["judged_by"] = (f"other processes hold {_size(others_bytes)}{share_total(others_bytes)}, more than "
                            f"{pool_txt}: they dominate, whatever else the message shows")
    elif outside_cover and others_bytes is None and outside > pool:
        out["verdict"] = "outside-pytorch"
        out["judged_by"] = (f"{_size(outside)}{share_total(outside)} is held outside {pool_txt} and is more "
                            "than the pool itself: it dominates, whatever else the message shows")
    elif unalloc is not None and unalloc >= unmet and ratio is not None and ratio >= STRANDED_MIN_SHARE:
        out["verdict"] = "fragmentation"
        out["judged_by"] = (f"{_size(unalloc)} reserved but unallocated ({_pct(ratio)} of reserved) covers the "
                            f"{_size(unmet)} the allocation lacked")
    elif unalloc is not None and ratio is not None and ratio >= contributing_ratio \
            and unalloc >= contributing_shortfall * unmet:
        out["verdict"] = "fragmentation-contributed"
        out["judged_by"] = (f"{_size(unalloc)} reserved but unallocated ({_pct(ratio)} of reserved) is a large "
                            f"share of the pool but less than the {_size(unmet)} the allocation lacked")
    elif others_cover:
        out["verdict"] = "other-process"
        out["judged_by"] = (f"other processes hold {_size(others_bytes)}{share_total(others_bytes)}, more than the "
                            f"{_size(unmet)} the allocation lacked")
    elif outside_cover:
        out["verdict"] = "outside-pytorch"
        out["judged_by"] = (f"{_size(outside)}{share_total(outside)} held outside {pool_txt} covers the "
                            f"{_size(unmet)} the allocation lacked")
        if f.get("wording") == "cuda-malloc-async":
            out["judged_by"] += (" (with the cudaMallocAsync backend the pool is what PyTorch has allocated: the rest "
                                 "is other processes, the CUDA context, or freed blocks CUDA's memory pool still holds)")
    elif pool is None and unalloc is None:
        # the message stops before PyTorch's own figures (a pasted first line: "... of which 448.00 KiB is
        # free."): fragmentation, memory outside PyTorch and capacity cannot be told apart, and "PyTorch's own
        # pool filled the GPU" would be a guess
        out["verdict"] = "unknown"
        out["judged_by"] = "the message stops before PyTorch's own figures (reserved / allocated)"
    else:
        out["verdict"] = "capacity"
        if inconsistency is not None:
            out["judged_by"] = inconsistency + "; the workload is past the GPU's capacity"
        elif unalloc is not None and ratio is not None and unalloc >= unmet:
            out["judged_by"] = (f"the {_size(unalloc)} reserved but unallocated would cover the {_size(unmet)} the "
                                f"allocation lacked, but it is only {_pct(ratio)} of reserved: the allocator's "
                                "ordinary rounding, not fragmentation; the pool is full of live tensors")
        else:
            out["judged_by"] = "neither stranded slack nor memory held elsewhere covers what the allocation lacked"
    return out
