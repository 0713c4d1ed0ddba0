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

from .. import ids
from ..collectors.enginelog.events import LogEvent
from ..model import Evidence, Finding, Severity
from ..sizing.arith import SizingConfig, ceil_step

GIB = 1024.0 ** 3
ID = ids.KV_CACHE_PRESSURE


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


# --- a queue the KV pool does not explain --------------------------------------------------------------------------
ADMISSION_ID = ids.ADMISSION_CAPPED


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    # vLLM and SGLang admit a waiting request at the next step (milliseconds) when its KV blocks are free and the
    # batch is under its cap; a queue that stays for three stats lines (V1 logs one every 10 s) while a fifth of
    # the pool or more is free is held by something other than KV memory
    max_kv_usage: float = 0.80
    min_lines: int = 3
    min_seconds: float = 20.0
    min_waiting: int = 2
    # prefill pacing the queue: the engine's prompt throughput varies by at most this share of its highest over the
    # stretch (a constant rate is a limit reached: the per-step batched-token budget or the GPU's prefill compute)
    # while the queue shrinks; vLLM's V1 stats lines average over their 10 s interval, so a flat series is real
    flat_prompt_share: float = 0.05


def admission_capped_finding(events: Sequence[LogEvent], acc=None, job_kind: str = "unknown",
                             cfg: AdmissionConfig = AdmissionConfig()) -> Finding | None:
    """Requests wait on every stats line while the KV pool keeps free room: admission is capped (the batch cap:
    ``--max-num-seqs`` / ``--max-running-requests``), a request at the queue's head needs more blocks than are free,
    or the engine is stuck. None unless it holds on every stats line of a stretch of ``min_seconds``."""
    stats = [e for e in events if e.kind == "stats" and e.ts is not None and "waiting" in e.fields
             and "kv_usage_ratio" in e.fields]
    run: list[LogEvent] = []
    best: list[LogEvent] = []
    for e in stats:  # the longest stretch of consecutive stats lines that all show it
        ok = e.fields["waiting"] >= cfg.min_waiting and e.fields["kv_usage_ratio"] <= cfg.max_kv_usage
        run = run + [e] if ok else []
        if len(run) > len(best):
            best = list(run)
    if len(best) < cfg.min_lines or best[-1].ts - best[0].ts < cfg.min_seconds:
        return None
    span = best[-1].ts - best[0].ts
    whole = len(best) == len(stats)
    r_max = max(e.fields.get("running", 0) for e in best)
    w_min, w_max = min(e.fields["waiting"] for e in best), max(e.fields["waiting"] for e in best)
    kv_max = max(e.fields["kv_usage_ratio"] for e in best)
    gen = [e.fields["generation_tps"] for e in best if "generation_tps" in e.fields]
    flag = _BATCH_FLAG.get(job_kind, "--max-num-seqs")
    cap = None
    if acc is not None:
        cap = (getattr(acc, "max_running_requests", None) if job_kind == "sglang" else None) \
            or getattr(acc, "max_num_seqs", None)
    waiting_txt = f"{w_min:.0f}" if w_min == w_max else f"{w_min:.0f}–{w_max:.0f}"
    parts = [f"{waiting_txt} requests waiting behind at most {r_max:.0f} running on {len(best)} stats lines over "
             f"{span:.0f} s{' (the whole log)' if whole else ''}, while the KV pool stayed at or below "
             f"{kv_max * 100:.1f} % ({(1 - kv_max) * 100:.0f} % or more free): the pool does not explain the queue"]
    ctx: dict = {"running_max": r_max, "waiting_min": w_min, "kv_usage_max": kv_max, "batch_flag": flag,
                 "job_kind": job_kind}
    if cap is not None and r_max >= cap:
        parts.append(f"the running batch is at the configured {flag} {cap}: admission is capped by it")
        ctx["cause"] = "batch-cap"
        ctx["batch_cap"] = cap
    elif gen and max(gen) <= 0.0:
        parts.append("no token generated on these lines: the engine is stuck (see engine-stalled)")
        ctx["cause"] = "stuck"
    elif _prefill_paced(best, cfg, ctx):
        per_adm = ctx.get("prompt_tokens_per_admitted")
        per_req = (f", about {float(format(per_adm, '.2g')):,.0f} prompt tokens per admitted request" if per_adm
                   else "")
        hit = ctx.get("prefix_cache_hit_ratio")
        parts.append(f"the queue moves ({ctx['waiting_first']:.0f} → {ctx['waiting_last']:.0f} waiting, "
                     f"{ctx['admitted_per_second']:.2f} requests/s admitted) at a flat {ctx['prompt_tps_min']:,.0f}–"
                     f"{ctx['prompt_tps_max']:,.0f} prompt tokens/s on every line{per_req}: admission is paced by "
                     "prefill, the engine admits as fast as it prefills (its per-step batched-token budget or the "
                     "GPU's prefill compute), not by memory, the batch cap or a stuck scheduler"
                     + (f"; prefix cache hit rate {hit * 100:.1f} %" if hit is not None else ""))
        ctx["cause"] = "prefill-paced"
    else:
        parts.append((f"the running batch ({r_max:.0f}) is under the configured {flag} {cap}" if cap is not None
                      else f"the configured {flag} is not in this log")
                     + ": a request at the head of the queue needing more KV blocks than are free (a long prompt "
                       "waits; requests behind it wait too), the batched-token budget, or a stuck scheduler")
        ctx["cause"] = "head-of-line-or-cap"
    ev = [Evidence("log_requests_waiting", float(w_min), unit="requests", window=(best[0].ts, best[-1].ts),
                   note=f"lines {best[0].line_no}–{best[-1].line_no}; at least this many on every line"),
          Evidence("log_kv_cache_usage_ratio", kv_max, threshold=cfg.max_kv_usage, unit="ratio", agrees=True,
                   note="the highest on those lines: the pool kept free room"),
          Evidence("log_requests_running", float(r_max), threshold=float(cap) if cap is not None else None,
                   unit="requests", note=f"the configured {flag}" if cap is not None else f"{flag} not in this log")]
    if gen:
        ev.append(Evidence("log_generation_tokens_per_second", float(max(gen)), unit="tokens/s",
                           note="the highest on those lines"))
    if ctx["cause"] == "prefill-paced":
        ev.append(Evidence("log_prompt_tokens_per_second", float(ctx["prompt_tps_max"]), unit="tokens/s",
                           note=f"the highest on those lines; the lowest {ctx['prompt_tps_min']:,.1f}: one rate"))
        budget = "--chunked-prefill-size" if job_kind == "sglang" else "--max-num-batched-tokens"
        missing = [f"the configured {budget} (the engine's args line)"]
    else:
        missing = [] if cap is not None else [f"the configured {flag} (the engine's args line)"]
    sev = Severity.WARNING if span >= 60 or whole else Severity.INFO
    return Finding(ADMISSION_ID, sev, 0.6 + (0.1 if cap is not None else 0.0), "; ".join(parts) + ".",
                   onset=best[0].ts, evidence=ev, missing=missing, context=ctx, basis="log")


def _prefill_paced(best: Sequence[LogEvent], cfg: AdmissionConfig, ctx: dict) -> bool:
    """The queue shrinks while the prompt throughput holds one rate on every line (``flat_prompt_share``): the
    engine prefills at its limit and admits a request as its prefill is done. Puts its figures into ``ctx``."""
    tps = [e.fields.get("prompt_tps") for e in best]
    if any(t is None for t in tps) or min(tps) <= 0.0:
        return False
    if max(tps) - min(tps) > cfg.flat_prompt_share * max(tps):
        return False
    w0, w1 = best[0].fields["waiting"], best[-1].fields["waiting"]
    span = best[-1].ts - best[0].ts
    if w1 >= w0 or span <= 0:
        return False
    rate = (w0 - w1) / span
    hits = [e.fields["prefix_cache_hit_ratio"] for e in best if "prefix_cache_hit_ratio" in e.fields]
    ctx.update(prompt_tps_min=min(tps), prompt_tps_max=max(tps), waiting_first=w0, waiting_last=w1,
               admitted_per_second=round(rate, 4), prompt_tokens_per_admitted=round(sum(tps) / len(tps) / rate),
               prefix_cache_hit_ratio=hits[-1] if hits else None)
    return True
