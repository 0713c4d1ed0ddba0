"""Verdicts on PyTorch OOM messages found in engine logs, and their findings. docs/logs.md#findings.

Pure: event fields in, a summary dict and findings out. Which cause an OOM message shows is judged once,
from its own figures, by :func:`fragscope.collectors.enginelog.oomproc.judge_oom` (``fragscope size`` uses the
same function): what dominates (other processes, memory outside PyTorch, stranded slack as a share of
reserved, plain capacity), in the order its docstring gives.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

from .. import ids
from ..collectors.enginelog.oomproc import ALLOC_SLACK_BYTES, OUTSIDE_MIN_BYTES, OUTSIDE_MIN_SHARE, judge_oom
from ..model import Evidence, Finding, Severity

GIB = 1024.0 ** 3

# The diagnosis ids an OOM verdict becomes (playbooks: fragscope/playbooks/__init__.py).
VERDICT_IDS = {"fragmentation": ids.ALLOCATOR_FRAGMENTATION, "fragmentation-contributed": ids.ALLOCATOR_FRAGMENTATION,
               "capacity": ids.OOM_CAPACITY, "unknown": ids.OOM_CAPACITY, "outside-pytorch": ids.OOM_OUTSIDE_PYTORCH,
               "other-process": ids.OOM_OUTSIDE_PYTORCH, "outside-allocator": ids.OOM_OUTSIDE_PYTORCH,
               "memory-cap": ids.OOM_MEMORY_CAP}
# re-exported: the verdict's constants live with the one judgement (collectors/enginelog/oomproc.py)
__all__ = ["ALLOC_SLACK_BYTES", "OUTSIDE_MIN_BYTES", "OUTSIDE_MIN_SHARE", "VERDICT_IDS", "oom_summary", "oom_findings"]


def _fin(x) -> float | None:
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _gib(x: float | None) -> str:
    """2 decimals in the unit PyTorch's OOM message uses: GiB from 1 GiB, else MiB / KiB (a 2 MiB graph-capture
    request is not "0.00 GiB", 21.56 MiB free is not "0.02 GiB")."""
    if x is None:
        return "n/a"
    if abs(x) >= GIB or x == 0:
        return f"{x / GIB:.2f} GiB"
    return f"{x / 2 ** 20:.2f} MiB" if abs(x) >= 2 ** 20 else f"{x / 1024:.2f} KiB"


def _hms(ts: float | None) -> str:
    if ts is None:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def oom_summary(ev, cfg) -> dict:
    """One OOM event (fields as parsed) -> the JSON contract of docs/logs.md ``ooms[]``: the figures and the
    verdict of :func:`fragscope.collectors.enginelog.oomproc.judge_oom` (the one judgement ``fragscope size``
    uses too), with the event's time, line and text."""
    f = ev.fields
    j = judge_oom(f, cfg.frag_contributing_ratio, cfg.frag_contributing_shortfall)
    out = {"time": ev.ts, "line": ev.line_no, "wording": f.get("wording"), "device_type": f.get("device_type"),
           "gpu": f.get("gpu"), **j, "repeats": int(f.get("repeats", 1)), "text": ev.text}
    return out


def _window(o: dict):
    return (o["time"], o["time"]) if o["time"] is not None else None


def _fragmentation_finding(gpu: str, items: list[dict], cfg) -> Finding:
    caused = [o for o in items if o["verdict"] == "fragmentation"]
    worst = max(items, key=lambda o: o["reserved_unallocated_bytes"] or 0)
    unalloc, req, free = worst["reserved_unallocated_bytes"], worst["requested_bytes"], worst["free_bytes"]
    total = worst["total_bytes"]
    share_total = (unalloc / total) if (unalloc is not None and total) else None
    if caused:
        conf = 0.85 if not worst["reserved_unallocated_derived"] else 0.8
        conf += 0.05 if unalloc is not None and req is not None and unalloc >= req else 0.0
        conf += min(0.05, 0.025 * (len(caused) - 1))
        sev = (Severity.CRITICAL if share_total is not None and share_total >= cfg.frag_critical_share_of_total
               else Severity.WARNING)
        how = "the bytes existed inside PyTorch's pool but not as one block"
    else:
        conf, sev = 0.5, Severity.WARNING
        how = "fragmentation made the shortfall worse but does not explain it alone"
    ratio = worst["fragmentation_ratio"]
    summary = (f"GPU {gpu or '?'}: OOM at {_hms(worst['time'])} asking {_gib(req)} with {_gib(free)} free and "
               f"{_gib(unalloc)} reserved by PyTorch but unallocated"
               + (f" ({ratio * 100:.0f} % of reserved)" if ratio is not None else "")
               + f": {how}; {len(items)} OOM message(s) like it.")
    ev = [Evidence("log_oom_reserved_unallocated_bytes", unalloc, threshold=worst["shortfall_bytes"], unit="bytes",
                   window=_window(worst),
                   note=("threshold = requested - free (the shortfall)"
                         + ("; derived as reserved - allocated (PyTorch <= 2.0 wording)"
                            if worst["reserved_unallocated_derived"] else ""))),
          Evidence("log_oom_requested_bytes", req, unit="bytes"),
          Evidence("log_oom_free_bytes", free, unit="bytes")]
    if ratio is not None:
        if caused:  # the unallocated bytes alone covered the shortfall: the ratio is context, not a test
            ev.append(Evidence("log_oom_fragmentation_ratio", ratio, unit="ratio",
                               note="reserved-but-unallocated / reserved"))
        else:  # "contributed": judged by this ratio (vllm_v1_oom.log read "+ 7.5 % threshold 20.0 %" before)
            ev.append(Evidence("log_oom_fragmentation_ratio", ratio, threshold=cfg.frag_contributing_ratio,
                               unit="ratio", note="reserved-but-unallocated / reserved",
                               agrees=ratio >= cfg.frag_contributing_ratio))
    return Finding(ids.ALLOCATOR_FRAGMENTATION, sev, min(0.95, conf), summary, onset=items[0]["time"],
                   evidence=ev, missing=["torch_inactive_split_bytes"], subject={"gpu": gpu} if gpu else {})


def _figures(o: dict) -> str:
    return (f"asking {_gib(o['requested_bytes'])} with {_gib(o['free_bytes'])} free of {_gib(o['total_bytes'])}"
            + (f", PyTorch holding {_gib(o['reserved_bytes'])}" if o["reserved_bytes"] is not None else ""))


def _other_finding(gpu: str, verdict: str, items: list[dict]) -> Finding:
    o = items[0]
    n = len(items) + sum(x["repeats"] - 1 for x in items)
    where = f"GPU {gpu}" if gpu else "GPU ?"
    count = f"; {len(items)} OOM(s) like it" + (f" ({n} messages)" if n > len(items) else "")
    ev = [Evidence("log_oom_requested_bytes", o["requested_bytes"], unit="bytes", window=_window(o),
                   note=f"line {o['line']}"),
          Evidence("log_oom_free_bytes", o["free_bytes"], unit="bytes"),
          Evidence("log_oom_total_bytes", o["total_bytes"], unit="bytes")]
    missing: list[str] = []
    subject = {"gpu": gpu} if gpu else {}
    if verdict == "memory-cap":
        summary = (f"{where}: OOM at {_hms(o['time'])} {_figures(o)}: free device memory covered the request, so "
                   f"the device's capacity did not refuse it; a per-process limit did (set_per_process_memory_fraction, "
                   f"an MPS/MIG or container memory limit){count}.")
        ev[1] = Evidence("log_oom_free_bytes", o["free_bytes"], threshold=o["requested_bytes"], unit="bytes",
                         note="free >= requested")
        return Finding(ids.OOM_MEMORY_CAP, Severity.CRITICAL, 0.6, summary, onset=o["time"], evidence=ev,
                       missing=["torch_memory_fraction"], subject=subject)
    if verdict in ("outside-pytorch", "other-process"):
        held = o["held_outside_pytorch_bytes"]
        share = (held / o["total_bytes"]) if held is not None and o["total_bytes"] else None
        parts = [f"{where}: OOM at {_hms(o['time'])} {_figures(o)}"]
        if verdict == "other-process":
            procs = ", ".join(f"pid {p['pid']} {_gib(p['bytes'])}" for p in o["other_processes"]
                              if p["pid"] != o["self_listed_pid"])
            parts.append(f"other processes hold {_gib(o['other_processes_bytes'])} of the GPU ({procs}), more than "
                         f"the {_gib(o['unmet_bytes'])} the allocation lacked")
            conf = 0.85
        else:
            parts.append(f"{_gib(held)}" + (f" ({share * 100:.0f} % of the GPU)" if share is not None else "")
                         + " was held outside this process's PyTorch pool (total − reserved − free), more than the "
                         f"{_gib(o['unmet_bytes'])} the allocation lacked: other processes or non-PyTorch allocations "
                         "(NCCL, native libraries, another tenant) hold the GPU, not this workload's tensors")
            conf = 0.75
            missing.append("gpu_process_memory_bytes")  # who holds it: nvidia-smi / NVML per-process memory
        if o["non_pytorch_this_process_bytes"] is not None:
            parts.append(f"this process itself holds {_gib(o['non_pytorch_this_process_bytes'])} outside PyTorch")
        ev.append(Evidence("log_oom_held_outside_pytorch_bytes", held, threshold=o["unmet_bytes"], unit="bytes",
                           note="total - free - reserved; threshold = requested + 64 MiB allocation slack - free"))
        if o["other_processes_bytes"] is not None:
            ev.append(Evidence("log_oom_other_processes_bytes", o["other_processes_bytes"], unit="bytes",
                               note="processes listed in the message, this process left out"))
        return Finding(ids.OOM_OUTSIDE_PYTORCH, Severity.CRITICAL, conf, "; ".join(parts) + count + ".",
                       onset=o["time"], evidence=ev, missing=missing, subject=subject)
    if verdict == "outside-allocator":
        summary = (f"{where}: CUDA error: out of memory at {_hms(o['time'])} (line {o['line']}): a CUDA call outside "
                   f"PyTorch's caching allocator failed (NCCL, cuBLAS, CUDA graph capture, a native library); the "
                   f"message has no figures{count}.")
        return Finding(ids.OOM_OUTSIDE_PYTORCH, Severity.CRITICAL, 0.4, summary, onset=o["time"], evidence=ev[:1],
                       missing=["oom_figures", "gpu_process_memory_bytes"], subject=subject)
    # capacity / unknown
    if verdict == "unknown":
        lacking = [n for n, v in (("free", o["free_bytes"]), ("total", o["total_bytes"]),
                                  ("reserved", o["reserved_bytes"] if o["reserved_bytes"] is not None
                                   else o["allocated_bytes"])) if v is None]
        told = _figures(o) if o["free_bytes"] is not None else f"asking {_gib(o['requested_bytes'])}"
        summary = (f"{where}: PyTorch OOM at {_hms(o['time'])} (line {o['line']}) {told}; the message lacks the "
                   f"{'/'.join(lacking) or 'free/total/reserved'} figure{'s' if len(lacking) != 1 else ''}, so the "
                   f"cause cannot be told apart{count}.")
        return Finding(ids.OOM_CAPACITY, Severity.CRITICAL, 0.3, summary, onset=o["time"], evidence=ev[:1],
                       missing=[f"oom_{n}_bytes" for n in lacking] or ["oom_free_bytes", "oom_reserved_bytes"],
                       subject=subject)
    held = o["held_outside_pytorch_bytes"]
    bigger = (o["requested_bytes"] is not None and o["total_bytes"] is not None
              and o["requested_bytes"] > o["total_bytes"])
    if o.get("figures_inconsistent"):
        ev.append(Evidence("log_oom_reserved_bytes", o["reserved_bytes"] if o["reserved_bytes"] is not None
                           else o["allocated_bytes"], threshold=o["total_bytes"], unit="bytes", agrees=False,
                           note="more than the device can hold: the figures are flagged, not used"))
        summary = (f"{where}: OOM at {_hms(o['time'])} {_figures(o)}: the figures cannot all be true: "
                   f"{o['inconsistency']}; the workload is far past the GPU's capacity{count}.")
        return Finding(ids.OOM_CAPACITY, Severity.CRITICAL, 0.6, summary, onset=o["time"], evidence=ev,
                       missing=["gpu_memory_used_bytes (NVML: dedicated vs shared memory)"], subject=subject)
    summary = (f"{where}: OOM at {_hms(o['time'])} {_figures(o)}: "
               + ("the request alone is larger than the GPU" if bigger else
                  f"PyTorch's own pool filled the GPU (stranded inside it: {_gib(o['reserved_unallocated_bytes'])}; "
                  f"held outside it: {_gib(held)}), the workload needs more memory than the GPU has")
               + count + ".")
    ev.append(Evidence("log_oom_held_outside_pytorch_bytes", held, unit="bytes", agrees=True,
                       note="total - free - reserved: small, not the cause"))
    return Finding(ids.OOM_CAPACITY, Severity.CRITICAL, 0.7, summary, onset=o["time"], evidence=ev, subject=subject)


def oom_findings(ooms: Sequence[dict], cfg) -> list[Finding]:
    """One finding per (GPU, cause): fragmentation, capacity, memory held outside PyTorch, a memory cap."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for o in ooms:
        diag = VERDICT_IDS.get(o["verdict"], ids.OOM_CAPACITY)
        key = "fragmentation" if diag == ids.ALLOCATOR_FRAGMENTATION else o["verdict"]
        groups.setdefault((str(o.get("gpu") or ""), key), []).append(o)
    out: list[Finding] = []
    for (gpu, key), items in sorted(groups.items()):
        if key == "fragmentation":
            out.append(_fragmentation_finding(gpu, items, cfg))
        else:
            out.append(_other_finding(gpu, key, items))
    return out
