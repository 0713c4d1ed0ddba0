"""Requests queued while the KV pool is full, from an engine log's own stats lines: the pool the configured batch
cap needs at the observed lengths, and what decides whether it fits. Pure. docs/logs.md#findings.

vLLM V1 logs no preemption count, so a pool that runs full shows only as KV usage near 100 % with requests
waiting. The stats lines say how much of the pool the running sequences hold (usage), so each running sequence's
share is usage / running; with the pool's size from the start-up lines that is tokens per sequence, and the pool
that ``--max-num-seqs`` (SGLang ``--max-running-requests``) sequences of that length need follows. Whether that pool
fits is decided by the GPU memory left outside the engine's budget at peak (NVML used vs total), which the log does
not hold: the finding says so and what to capture.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..collectors.enginelog.events import LogEvent
from ..model import Evidence, Finding, Severity
from ..sizing.arith import SizingConfig, ceil_step

GIB = 1024.0 ** 3
ID = "kv-cache-pressure"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    # the pool is full: the saved V0 incident shows 98.3-99.8 % around every preemption; sizing's "pool ran full"
    # line (docs/sizing.md) is 95 %
    full_kv_usage: float = 0.95
    # at least two stats lines (V1 logs one every 10 s) and 20 s: one line can catch a momentary peak
    min_lines: int = 2
    min_seconds: float = 20.0


_BATCH_FLAG = {"sglang": "--max-running-requests", "tgi": "--max-batch-total-tokens"}


def full_pool_queue_finding(events: Sequence[LogEvent], acc=None, job_kind: str = "unknown",
                            cfg: QueueConfig = QueueConfig(), sizing: SizingConfig = SizingConfig()) -> Finding | None:
    """A finding when stats lines show the KV pool full with requests waiting for ``min_seconds`` or more; None
    otherwise. ``acc``: the start-up accounting (:class:`fragscope.sizing.startup.StartupAccounting`) or None."""
    full = [e for e in events if e.kind == "stats" and e.ts is not None
            and e.fields.get("kv_usage_ratio", 0.0) >= cfg.full_kv_usage and e.fields.get("waiting", 0) >= 1
            and e.fields.get("running", 0) >= 1]
    if len(full) < cfg.min_lines or full[-1].ts - full[0].ts < cfg.min_seconds:
        return None
    span = full[-1].ts - full[0].ts
    peak = max(full, key=lambda e: (e.fields["waiting"], e.ts))
    r, w, u = float(peak.fields["running"]), float(peak.fields["waiting"]), float(peak.fields["kv_usage_ratio"])
    flag = _BATCH_FLAG.get(job_kind, "--max-num-seqs")
    share = u / r  # of the pool, per running sequence
    pool = getattr(acc, "pool_tokens", None) if acc is not None else None
    bpt = getattr(acc, "kv_bytes_per_token", None) if acc is not None else None
    cap = getattr(acc, "max_num_seqs", None) if acc is not None else None
    if job_kind == "sglang" and acc is not None:
        cap = getattr(acc, "max_running_requests", None) or cap
    total = getattr(acc, "total_gpu_memory_bytes", None) if acc is not None else None
    u0 = getattr(acc, "gpu_memory_utilization", None) if acc is not None else None
    kv0 = getattr(acc, "kv_cache_bytes", None) if acc is not None else None
    target = cap if cap else r + w
    why_target = f"the configured {flag} {cap}" if cap else f"the {r + w:.0f} requests in the system (running + waiting)"
    parts = [f"KV cache usage at or above {cfg.full_kv_usage * 100:.0f} % with requests waiting on {len(full)} stats "
             f"lines over {span:.0f} s (peak: {w:.0f} waiting behind {r:.0f} running at {u * 100:.1f} %): the pool, "
             f"not the batch cap, limits admission; each running sequence holds ~{share * 100:.1f} % of the pool"]
    ev = [Evidence("log_kv_cache_usage_ratio", u, threshold=cfg.full_kv_usage, unit="ratio", window=(full[0].ts, full[-1].ts),
                   note=f"line {peak.line_no}"),
          Evidence("log_requests_waiting", w, unit="requests"),
          Evidence("log_requests_running", r, unit="requests")]
    missing: list[str] = []
    ctx: dict = {"running": r, "waiting": w, "kv_usage_ratio": u, "target_sequences": target}
    if pool:
        per_seq = u * pool / r
        need = int(math.ceil(target * per_seq))
        parts.append(f"~{per_seq:,.0f} tokens each (u x pool {pool:,} / running); {why_target} at that length need a "
                     f"pool of ~{need:,} tokens ({target / r:.2f}x the {pool:,} it has)")
        ctx.update(per_sequence_tokens=per_seq, pool_tokens=pool, needed_pool_tokens=need)
        fits_now = int(pool // per_seq)
        ctx.update(cap_sequences=fits_now, batch_flag=flag)
        ev.append(Evidence("log_kv_pool_tokens_needed", need, threshold=pool, unit="tokens",
                           note=f"{target:.0f} x {per_seq:,.0f} tokens; the pool holds {fits_now} such sequences"))
        if bpt and total and u0 and kv0:
            need_bytes = need * bpt
            u_need = ceil_step(u0 + (need_bytes - kv0) / total)
            ceiling = 1 - sizing.margin(total) / total
            ctx.update(needed_pool_bytes=need_bytes)
            if u_need <= ceiling:
                ctx["needed_gpu_memory_utilization"] = u_need
            if u_need > ceiling:
                parts.append(f"{need_bytes / GIB:.2f} GiB of KV, utilization {u_need:.2f}: above what this GPU can give "
                             f"({ceiling:.4f} = 1 - margin / total), so it does not fit: cap {flag} at ~{fits_now} "
                             "(what the pool holds at this length), or add a replica / tensor parallelism")
            else:
                parts.append(f"{need_bytes / GIB:.2f} GiB of KV, --gpu-memory-utilization {u_need:.2f} (now {u0:g}); "
                             f"it fits only if the GPU keeps {(need_bytes - kv0) / GIB:.2f} GiB more free outside the "
                             "budget at peak, which NVML used vs total decides (not in this log): "
                             "fragscope size --log FILE --recording REC; else cap "
                             f"{flag} at ~{fits_now}")
                missing.append("peak device memory under load (NVML used vs total)")
        else:
            missing.append("the GPU total, the utilization in force and the pool's bytes (start-up lines) to turn "
                           "tokens into a --gpu-memory-utilization")
    else:
        parts.append(f"{why_target} at that length need {target / r:.2f}x the pool it has")
        missing.append("the engine's start-up lines (GPU KV cache size) to turn the pool's share into tokens")
    return Finding(ID, Severity.WARNING, 0.6 + (0.1 if span >= 60 else 0.0), "; ".join(parts) + ".",
                   onset=full[0].ts, evidence=ev, missing=missing, context=ctx, basis="log")
