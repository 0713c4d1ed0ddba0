"""capacity-saturation: a healthy server that is simply busy. The queue and KV usage rise with
traffic, throughput rises with them (or holds at its peak), with no preemption storm, no
memory pathology and no throttling. The fix is more replicas, not a restart. Never critical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import npstats
from .. import ids
from ..signals import primary
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, RATE_RANGE, AlertRule, num, sig
from ..units import finite_or_none as _f, fmt_pct
from . import common, stats
from . import level as lv
from .frame import Frame

ID = ids.CAPACITY_SATURATION
REQUIRES = ("requests_waiting|kv_cache_usage_ratio", "generation_tokens_total")
# A busy server is not a sick one: where one of these shows its signature in the window (preemptions,
# fragmentation rising, clocks falling), the pipeline drops this diagnosis's change finding.
SUPPRESSED_BY = (ids.KV_CACHE_PRESSURE, ids.ALLOCATOR_FRAGMENTATION, ids.CLOCK_THROTTLING)
CORROBORATES = ("requests_running", "preemptions_total", "ttft_seconds")


@dataclass(frozen=True)
class Config:
    waiting_share: float = 0.5  # requests queue for most of the recent window
    kv_busy: float = 0.80  # or the KV pool runs >= 80 % full
    # Throughput "holds": within 10 % of its best sustained level in the window (the 95th
    # percentile), i.e. the server does as much as it can, and is not degrading.
    tput_at_peak: float = 0.90
    # A trickle of preemptions (< 1/min) is normal at the edge of capacity.
    preempt_trickle_per_min: float = 1.0
    ttft_growth_warning: float = 2.0
    # Level rule: warning when the queue stays >= 2x the running batch this long: every request then waits
    # two batch turnarounds or more (latency at least tripled); 15 min, the change path's recent window
    standing_queue_s: float = 15 * 60.0


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    if not f.has_engine("generation_tokens_total"):
        return Inconclusive(ID, [primary("generation_tokens_total")], "throughput not available")
    if not f.has_engine("requests_waiting") and not f.has_engine("kv_cache_usage_ratio"):
        return Inconclusive(ID, [primary("requests_waiting"), primary("kv_cache_usage_ratio")], "load not observable")
    sp = stats.spans(f)
    evidence: list[Evidence] = []
    agree = 0
    wait = f.engine.get("requests_waiting")
    queued = False
    if wait is not None and np.isfinite(wait).any():
        share = stats.share_true(f, np.nan_to_num(wait) >= 1, sp.recent, np.isfinite(wait))
        wr = stats.nanmedian(wait[stats.mask(f, sp.recent)])
        wb = stats.nanmedian(wait[stats.mask(f, sp.base)])
        queued = math.isfinite(share) and share >= cfg.waiting_share
        evidence.append(Evidence("requests_waiting", wr, wb, 1.0, "requests", sp.recent,
                                 f"queued {share * 100:.0f} % of the recent window", queued))
        agree += queued
    kv = f.engine.get("kv_cache_usage_ratio")
    kv_busy = False
    if kv is not None and np.isfinite(kv).any():
        kr = stats.nanmedian(kv[stats.mask(f, sp.recent)])
        kb = stats.nanmedian(kv[stats.mask(f, sp.base)])
        kv_busy = math.isfinite(kr) and kr >= cfg.kv_busy
        evidence.append(Evidence("kv_cache_usage_ratio", kr, kb, cfg.kv_busy, "ratio", sp.recent, "", kv_busy))
        agree += kv_busy
    if not (queued or kv_busy):
        return []
    tput = f.engine["generation_tokens_total"]
    t_recent = stats.nanmedian(tput[stats.mask(f, sp.recent)])
    t_peak = stats.nanquantile(tput, 0.95)
    t_base = stats.nanmedian(tput[stats.mask(f, sp.base)])
    holding = math.isfinite(t_recent) and t_peak > 0 and t_recent >= cfg.tput_at_peak * t_peak
    evidence.append(Evidence("generation_tokens_per_second", t_recent, t_base, cfg.tput_at_peak * t_peak, "tokens/s",
                             sp.recent, "throughput at its peak: the server is doing all it can" if holding
                             else "throughput below its peak: not plain saturation", holding))
    if not holding:
        return []  # degrading under load is a pathology, left to the other detectors
    agree += 1
    # Quiet on the others' signatures: declared in SUPPRESSED_BY and applied by the pipeline (a preemption
    # storm, fragmentation rising, clocks falling are not "busy, not sick").
    pre = common.preemption_fact(f, sp, cfg.preempt_trickle_per_min)
    for g in f.gpus():  # a server running out of memory is not "busy, not sick"
        ooms = stats.increase(f, f.gpu_cum.get(g, {}).get("torch_ooms_total"), (f.start, f.end))
        if math.isfinite(ooms) and ooms > 0:
            return []
    if pre.evidence is not None:
        pre.evidence.note = "no preemption storm"
        pre.evidence.agrees = True
        evidence.append(pre.evidence)
        agree += 1
    sev = Severity.INFO
    p99 = f.engine.get("ttft_p99_seconds")
    ttft_note = ""
    if p99 is not None and np.isfinite(p99).any():
        c = stats.change(f, p99, sp, floor_rel=0.05)
        if c.known and c.baseline > 0 and c.recent / c.baseline >= cfg.ttft_growth_warning:
            sev = Severity.WARNING
            ttft_note = f"; TTFT p99 {common.fmt_seconds(c.baseline)} → {common.fmt_seconds(c.recent)}"
            evidence.append(Evidence("ttft_p99_seconds", c.recent, c.baseline, c.baseline * cfg.ttft_growth_warning,
                                     "seconds", sp.recent, "users feel the queue", True))
    if queued and wait is not None:
        slope, r2 = stats.slope_per_hour(f, wait, sp.recent)
        if math.isfinite(slope) and slope > 0 and r2 > 0.5:
            sev = Severity.WARNING  # the queue keeps growing: demand exceeds capacity
    conf = stats.confidence(agree, base=0.4)
    onset = stats.onset_time(f, np.nan_to_num(wait) if wait is not None else kv, 1.0 if wait is not None
                             else cfg.kv_busy, 1)
    run = f.engine.get("requests_running")
    rr = stats.nanmedian(run[stats.mask(f, sp.recent)]) if run is not None else math.nan
    summary = (f"Busy, not sick: {t_recent:.0f} tok/s (baseline {t_base:.0f}) with "
               f"{rr:.0f} running" if math.isfinite(rr) else f"Busy, not sick: {t_recent:.0f} tok/s (baseline {t_base:.0f})")
    for e in evidence:
        if e.signal == "requests_waiting" and e.agrees:
            summary += f", {e.observed:.0f} waiting"
        if e.signal == "kv_cache_usage_ratio" and e.agrees:
            summary += f", KV cache {e.observed * 100:.0f} % full"
    summary += f"; no preemption storm, allocator and clocks healthy{ttft_note}."
    ctx = {"tokens_per_s": t_recent, "running": rr}
    return [Finding(ID, sev, conf, summary, onset, evidence, [], {}, context=ctx)]


# --- queue without pathology: capacity ------------------------------------------------------
def level(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The present by itself: requests wait at every sample while work runs, without preempting."""
    wait = f.engine.get("requests_waiting")
    if wait is None or not np.isfinite(wait).any():
        return Inconclusive(ID, [], "the request queue is not exported")
    sp = lv.present_span(f)
    v = stats.finite(wait[stats.mask(f, sp)])
    if not v.size or float(v.min()) < 1:
        return []  # nothing waits (at every sample of the present)
    pre = lv.engine_counter(f, "preemptions_total")
    if math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.preempt_trickle_per_min:
        return []  # preempting: kv-cache-pressure's case
    kv = lv.present_value(f, f.engine.get("kv_cache_usage_ratio"), "p90")
    running = lv.present_value(f, f.engine.get("requests_running"))
    if math.isfinite(running) and running < 1:
        return []  # requests wait while nothing runs: a stalled or starting engine, not one at capacity
    gen = lv.engine_counter(f, "generation_tokens_total")
    if math.isfinite(gen.rate_per_min) and gen.rate_per_min <= 0:
        return []  # no token generated in the present: a stalled engine (engine-stalled), not one at capacity
    if common.window_rate_fall(f) is not None:
        return []  # throughput fell while the batch shrank: degrading, not at capacity (its causes are the others')
    ev = [Evidence("requests_waiting", float(npstats.median(v)), None, 1.0, "requests", sp, "queued at every sample", True)]
    if math.isfinite(kv):
        ev.append(Evidence("kv_cache_usage_ratio", kv, None, cfg.kv_busy, "ratio", sp, "", kv >= cfg.kv_busy))
    standing = common.standing_queue_seconds(f)
    sev = Severity.WARNING if standing >= cfg.standing_queue_s else Severity.INFO
    summary = (f"{float(npstats.median(v)):.0f} requests waiting"
               + (f" with {running:.0f} running" if math.isfinite(running) else "")
               + (f", KV cache {fmt_pct(kv)}" if math.isfinite(kv) else "")
               + (f"; the queue has stayed at least twice the running batch for {standing / 60:.0f} min: each request "
                  "waits two batch turnarounds or more before it starts" if sev is Severity.WARNING else "")
               + f", no preemption storm: the server is at capacity ({lv.basis_note(f)}).")
    return [Finding(ID, sev, 0.4, summary, None, ev, [], {}, context={"basis": "level"})]


# --- PromQL: the change rule over the last hour, for the alert --------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """Requests queued for waiting_share of the last 15 min (or the KV pool at kv_busy), throughput within
    tput_at_peak of its best 5-minute rate of the hour, preempting less than preempt_trickle_per_min."""
    # "queued for a share s of the window" is "the (1 - s) quantile of the queue is >= 1": no subquery
    wait = f"max by ({K}) {sig('requests_waiting', f'quantile_over_time({num(round(1 - cfg.waiting_share, 12))}, {{}})', '15m')}"
    kv = f"max by ({K}) {sig('kv_cache_usage_ratio', 'quantile_over_time(0.5, {})', '15m')}"
    tput = f"sum by ({K}) {sig('generation_tokens_total', 'rate({})', '5m')}"
    pre = f"sum by ({K}) {sig('preemptions_total', 'rate({})', RATE_RANGE)} * 60"
    queued = f"(({wait}) >= 1 or ({kv}) >= {num(cfg.kv_busy)})"
    holding = f"(({tput}) >= {num(cfg.tput_at_peak)} * quantile_over_time(0.95, ({tput})[1h:5m]) > 0)"
    expr = f"{queued} and on ({K}) {holding} unless on ({K}) (({pre}) >= {num(cfg.preempt_trickle_per_min)})"
    return AlertRule(
        "FragscopeCapacitySaturation", ID, expr, "15m", "info",
        "at capacity",
        f"Requests queue at least {cfg.waiting_share * 100:g} % of the time (or the KV cache is at least "
        f"{cfg.kv_busy * 100:g} % full) with throughput within {(1 - cfg.tput_at_peak) * 100:g} % of its peak and "
        f"fewer than {cfg.preempt_trickle_per_min:g} preemptions/min: scale out.",
        "A healthy server that is simply busy: queue or KV usage up, throughput at its peak, no preemption storm.",
        {"waiting_share": cfg.waiting_share, "kv_busy": cfg.kv_busy, "tput_at_peak": cfg.tput_at_peak,
         "preempt_trickle_per_min": cfg.preempt_trickle_per_min},
        shown={"waiting_share": f"quantile_over_time({num(round(1 - cfg.waiting_share, 12))},"})


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    """"At its peak throughput" only where the window showed it (the change path checks throughput holds within
    10 % of its best); the level path sees a queue, not whether throughput holds under it."""
    tps = _f(ctx.get("tokens_per_s"))
    if ctx.get("basis") == "level" or tps is None:
        return ["Add a replica if this queue is the load you expect; the present alone shows the queue, not whether "
                "throughput holds at its best under it (a window of 15 min or more shows it: diagnose --vllm URL "
                "--duration 15m, or the agent's history)."]
    return [f"Add a replica: this one holds its peak throughput ({tps:.0f} tok/s, within 10 % of its best in the "
            "window) while requests queue."]


PLAYBOOK = Playbook(
    ID, "Capacity saturation (healthy but busy)",
    "The server is doing all it can: queue and KV usage rose with traffic, throughput with them, no pathology.",
    ["Scale out: add replicas (or let the autoscaler do it on the queue: vllm:num_requests_waiting, "
     "sglang:num_queue_reqs)."],
    [Action("Autoscale on queue depth (vllm:num_requests_waiting, sglang:num_queue_reqs) or KV usage, not on GPU "
            "utilization.", [], []),
     Action("If latency SLOs matter more than throughput: cap the running batch (vLLM --max-num-seqs, SGLang "
            "--max-running-requests) to bound it.",
            [], ["throughput-oriented batch traffic"])],
    ["requests waiting back to ~0 at the same traffic; TTFT p99 within SLO"], [])


# A queue on a long window whose change path saw no saturation is not reported from the present alone.
LEVEL_ON_LONG_WINDOWS = False
