"""capacity-saturation: a healthy server that is simply busy. The queue and KV usage rise with
traffic, throughput rises with them (or holds at its peak), with no preemption storm, no
memory pathology and no throttling. The fix is more replicas, not a restart. Never critical.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..signals import primary
from ..model import Evidence, Finding, Inconclusive, Severity
from . import common, stats
from .frame import Frame

ID = "capacity-saturation"
REQUIRES = ("requests_waiting|kv_cache_usage_ratio", "generation_tokens_total")
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
    # quiet on the others' signatures
    pre = common.preemption_fact(f, sp, cfg.preempt_trickle_per_min)
    if pre.present:
        return []  # kv-cache-pressure
    if common.any_frag_rising(f, sp):
        return []
    for g in f.gpus():  # a server running out of memory is not "busy, not sick"
        ooms = stats.increase(f, f.gpu_cum.get(g, {}).get("torch_ooms_total"), (f.start, f.end))
        if math.isfinite(ooms) and ooms > 0:
            return []
    for g in f.gpus():
        if common.throttle_fact(f, g, sp).present:
            return []
        clk = f.gpu[g].get("gpu_sm_clock_hertz")
        if clk is not None and np.isfinite(clk).any():  # clocks fell, reasons or not: not plain load
            c = stats.change(f, clk, sp, direction=-1, floor_rel=0.01)
            if c.known and c.baseline > 0 and 1 - c.recent / c.baseline >= 0.10:
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
