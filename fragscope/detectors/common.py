"""Engine- and GPU-level facts several detectors weigh (computed once per frame).

Each fact is a small, independent signal with its evidence. Detectors combine them: one signal
is suggestive, several that agree make a diagnosis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..model import Evidence
from ..units import fmt_bytes, fmt_clock as fmt_time, fmt_pct, fmt_seconds  # noqa: F401  (detectors format through common)
from . import stats
from .frame import SLOWDOWN_REASONS, Frame
from .stats import Change, Spans


@dataclass
class Defaults:
    # A throughput fall counts when >= 15 % below baseline (the fragmentation reference case: 1200 -> 300 tok/s is -75 %;
    # -15 % is well outside the few-% noise of a steady server).
    tput_drop: float = 0.15
    # Preemptions: vLLM preempts only when the KV block pool is exhausted; a healthy server
    # runs at ~0/min. 1/min sustained is a real, if small, storm (a preemption storm runs at hundreds per minute).
    preempt_per_min: float = 1.0
    # Kernel gaps: seed 50 µs -> 2 ms; a doubling of the median gap is a real change.
    gap_ratio: float = 2.0
    # "Busy" GPU: NVML utilization >= 70 % (85-90 % throughout the fragmentation reference case).
    util_busy: float = 0.70
    # Waiting requests: a queue exists when >= 1 request waits for most of the recent window.
    waiting_share: float = 0.5
    # KV pool "near full" (vLLM preempts at 100 %; scheduling watermark ~1 %).
    kv_high: float = 0.90


D = Defaults()


@dataclass
class Fact:
    present: bool
    evidence: Evidence | None = None
    value: float = math.nan
    onset: float | None = None
    extra: dict = field(default_factory=dict)


def _w(sp: tuple[float, float]) -> tuple[float, float]:
    return (float(sp[0]), float(sp[1]))


def throughput_fact(f: Frame, sp: Spans, drop: float = D.tput_drop) -> Fact:
    """Generation throughput fell vs baseline."""
    x = f.engine.get("generation_tokens_total")
    if x is None or not np.isfinite(x).any():
        return Fact(False)
    ch = stats.change(f, x, sp, direction=-1, floor_rel=0.02)
    if not ch.known or ch.baseline <= 0:
        return Fact(False)
    rel = 1.0 - ch.recent / ch.baseline
    present = rel >= drop and ch.delta < -2.0 * ch.scale
    ev = Evidence("generation_tokens_per_second", ch.recent, ch.baseline, ch.baseline * (1 - drop),
                  "tokens/s", _w(sp.recent), f"{rel * 100:+.0f} % vs baseline".replace("+-", "-")
                  if rel < 0 else f"-{rel * 100:.0f} % vs baseline", present)
    return Fact(present, ev, rel, ch.onset, {"change": ch})


def demand_unchanged_fact(f: Frame, sp: Spans) -> Fact:
    """Traffic did not fall: a queue exists or grew, or the running + waiting total held up.

    Throughput that falls with demand is a quiet hour; throughput that falls while requests wait
    is a sick server.
    """
    run = f.engine.get("requests_running")
    wait = f.engine.get("requests_waiting")
    if run is None and wait is None:
        return Fact(False)
    if wait is not None and np.isfinite(wait).any():
        share = stats.share_true(f, np.nan_to_num(wait) >= 1, sp.recent, np.isfinite(wait))
        base_share = stats.share_true(f, np.nan_to_num(wait) >= 1, sp.base, np.isfinite(wait))
        wr = stats.nanmedian(wait[stats.mask(f, sp.recent)])
        wb = stats.nanmedian(wait[stats.mask(f, sp.base)])
        if math.isfinite(share) and share >= D.waiting_share and (not math.isfinite(base_share) or share > base_share):
            ev = Evidence("requests_waiting", wr, wb, 1.0, "requests", _w(sp.recent),
                          f"requests queued {share * 100:.0f} % of the recent window")
            return Fact(True, ev, wr)
    if run is not None and wait is not None:
        tot = np.nan_to_num(run) + np.nan_to_num(wait)
        tot[~(np.isfinite(run) | np.isfinite(wait))] = np.nan
        ch = stats.change(f, tot, sp, direction=-1)
        if ch.known and ch.baseline > 0 and ch.recent >= 0.85 * ch.baseline:
            ev = Evidence("requests_running+waiting", ch.recent, ch.baseline, 0.85 * ch.baseline, "requests",
                          _w(sp.recent), "demand held up")
            return Fact(True, ev, ch.recent)
    return Fact(False)


def batch_shrink_fact(f: Frame, sp: Spans, drop: float = 0.25) -> Fact:
    run = f.engine.get("requests_running")
    if run is None or not np.isfinite(run).any():
        return Fact(False)
    ch = stats.change(f, run, sp, direction=-1, floor_abs=0.5)
    if not ch.known or ch.baseline <= 0:
        return Fact(False)
    rel = 1 - ch.recent / ch.baseline
    present = rel >= drop and ch.delta < -2 * ch.scale
    ev = Evidence("requests_running", ch.recent, ch.baseline, ch.baseline * (1 - drop), "requests",
                  _w(sp.recent), "running batch shrank" if present else "", present)
    return Fact(present, ev, rel, ch.onset)


def preemption_fact(f: Frame, sp: Spans, per_min: float = D.preempt_per_min) -> Fact:
    x = f.engine.get("preemptions_total")
    if x is None or not np.isfinite(x).any():
        return Fact(False)
    cum = f.engine_cum.get("preemptions_total")
    r_dur = sp.recent[1] - sp.recent[0]
    b_dur = sp.base[1] - sp.base[0]
    inc_r = stats.increase(f, cum, sp.recent)
    inc_b = stats.increase(f, cum, sp.base)
    rate_r = inc_r / r_dur * 60 if r_dur > 0 and math.isfinite(inc_r) else stats.nanmedian(x[stats.mask(f, sp.recent)]) * 60
    rate_b = inc_b / b_dur * 60 if b_dur > 0 and math.isfinite(inc_b) else stats.nanmedian(x[stats.mask(f, sp.base)]) * 60
    # Absolute, not relative: a healthy engine preempts ~never, so a sustained rate is a symptom even
    # when the window opens in the middle of it (no clean baseline).
    present = math.isfinite(rate_r) and rate_r >= per_min
    onset = None
    if present:
        onset = stats.onset_time(f, x * 60, max(per_min / 2, rate_b * 2 if math.isfinite(rate_b) else 0), 1)
    ev = Evidence("preemptions_per_minute", rate_r, rate_b, per_min, "/min", _w(sp.recent), "", present)
    return Fact(present, ev, rate_r, onset, {"base": rate_b})


def kv_fact(f: Frame, sp: Spans, high: float = D.kv_high) -> Fact:
    x = f.engine.get("kv_cache_usage_ratio")
    if x is None or not np.isfinite(x).any():
        return Fact(False)
    m = stats.mask(f, sp.recent)
    med = stats.nanmedian(x[m])
    p90 = stats.nanquantile(x[m], 0.9)
    base = stats.nanmedian(x[stats.mask(f, sp.base)])
    present = (math.isfinite(med) and med >= high) or (math.isfinite(p90) and p90 >= 0.97)
    onset = stats.onset_time(f, x, high - 0.05, 1) if present else None
    ev = Evidence("kv_cache_usage_ratio", med, base, high, "ratio", _w(sp.recent),
                  f"p90 {p90 * 100:.0f} %" if math.isfinite(p90) else "", present)
    return Fact(present, ev, med, onset, {"p90": p90})


def gap_fact(f: Frame, gpu: str | None, sp: Spans, ratio: float = D.gap_ratio) -> Fact:
    """Kernel-launch gaps (median) widened vs baseline on ``gpu`` (or any GPU)."""
    gpus = [gpu] if gpu is not None else f.gpus()
    best = Fact(False)
    for g in gpus:
        for q in ("kernel_gap_p50_seconds", "kernel_gap_p99_seconds"):
            x = f.gpu.get(g, {}).get(q)
            if x is None or not np.isfinite(x).any():
                continue
            ch = stats.change(f, x, sp, floor_rel=0.05, floor_abs=1e-6)
            if not ch.known or ch.baseline <= 0:
                continue
            r = ch.recent / ch.baseline
            present = r >= ratio
            ev = Evidence(q, ch.recent, ch.baseline, ch.baseline * ratio, "seconds",
                          _w(sp.recent), f"×{r:.1f} vs baseline" + (f" (GPU {g})" if gpu is None else ""), present)
            if best.evidence is None or (present and not best.present) or (present == best.present and r > best.value):
                best = Fact(present, ev, r, ch.onset)
    return best


def util_busy_fact(f: Frame, gpu: str | None, sp: Spans, busy: float = D.util_busy) -> Fact:
    gpus = [gpu] if gpu is not None else f.gpus()
    vals = []
    for g in gpus:
        x = f.gpu.get(g, {}).get("gpu_utilization_ratio")
        if x is not None and np.isfinite(x).any():
            vals.append(stats.nanmedian(x[stats.mask(f, sp.recent)]))
    vals = [v for v in vals if math.isfinite(v)]
    if not vals:
        return Fact(False)
    v = float(np.mean(vals))
    ev = Evidence("gpu_utilization_ratio", v, None, busy, "ratio", _w(sp.recent),
                  "GPU stays busy: utilization is not effective throughput" if v >= busy else "", v >= busy)
    return Fact(v >= busy, ev, v)


def throttle_fact(f: Frame, gpu: str, sp: Spans) -> Fact:
    """Any clock slowdown reason active for most of the recent window (more than in baseline)."""
    reasons = f.throttle.get(gpu, {})
    best = None
    for r in SLOWDOWN_REASONS:
        x = reasons.get(r)
        if x is None:
            continue
        valid = np.isfinite(x)
        share = stats.share_true(f, np.nan_to_num(x) > 0.5, sp.recent, valid)
        base = stats.share_true(f, np.nan_to_num(x) > 0.5, sp.base, valid)
        # hw_slowdown is NVML's umbrella for hw_thermal / hw_power_brake: prefer the specific reason
        if math.isfinite(share) and (best is None or share > best[1] + 1e-9 or
                                     (best[0] == "hw_slowdown" and share >= best[1] - 1e-9)):
            best = (r, share, base)
    if best is None:
        return Fact(False)
    r, share, base = best
    present = share >= 0.5 and (not math.isfinite(base) or share - base >= 0.3)
    ev = Evidence(f"gpu_throttle_reason_active{{reason={r}}}", share, base, 0.5, "ratio", _w(sp.recent),
                  "share of time active", present)
    onset = stats.onset_time(f, np.nan_to_num(reasons[r]), 0.5, 1) if present else None
    return Fact(present, ev, share, onset, {"reason": r})


def frag_rise(f: Frame, gpu: str, sp: Spans) -> Change | None:
    x = f.gpu.get(gpu, {}).get("torch_fragmentation_ratio")
    if x is None or not np.isfinite(x).any():
        return None
    return stats.change(f, x, sp, floor_abs=0.003)


def any_frag_rising(f: Frame, sp: Spans, rise: float = 0.05) -> bool:
    for g in f.gpus():
        ch = frag_rise(f, g, sp)
        if ch is not None and ch.known and (ch.delta >= rise or ch.recent >= 0.25):
            return True
    return False


def earliest(*ts: float | None) -> float | None:
    v = [t for t in ts if t is not None and math.isfinite(t)]
    return min(v) if v else None


# --- short windows (the level path): what the whole window still shows ----------------------------------------------
def window_rate_fall(f: Frame, sig: str = "generation_tokens_total", drop: float = 0.25) -> tuple[float, float] | None:
    """(rate in the window's first third, rate in its last third), per second, when the last is at least ``drop``
    below the first and the running batch shrank too: throughput falling under load is a pathology, not a server
    at capacity (the change path asks the same of longer windows: within 10 % of its best). None otherwise or
    when the window has fewer than 4 samples."""
    rate = f.engine.get(sig)  # the frame holds a counter as its per-second rate
    run = f.engine.get("requests_running")
    if rate is None or run is None or f.t.size < 4 or f.end <= f.start:
        return None
    third = (f.end - f.start) / 3
    spans = ((f.start, f.start + third), (f.end - third, f.end))
    r0, r1 = (stats.nanmedian(rate[stats.mask(f, s)]) for s in spans)
    if not (math.isfinite(r0) and math.isfinite(r1)):
        return None
    b0 = stats.nanmedian(run[stats.mask(f, spans[0])])
    b1 = stats.nanmedian(run[stats.mask(f, spans[1])])
    if r0 > 0 and r1 <= (1 - drop) * r0 and math.isfinite(b0) and math.isfinite(b1) and b1 < b0:
        return r0, r1
    return None


def standing_queue_seconds(f: Frame, times: float = 2.0) -> float:
    """How long (s) requests waiting stayed at least ``times`` the running batch at every sample, up to the window's
    end; 0 when the last sample does not show it. A request behind two full batches waits two batch turnarounds
    before it starts: latency at least tripled."""
    wait, run = f.engine.get("requests_waiting"), f.engine.get("requests_running")
    if wait is None or run is None or not f.t.size:
        return 0.0
    ok = np.isfinite(wait) & np.isfinite(run) & (run >= 1) & (wait >= times * run)
    if not ok[-1]:
        return 0.0
    bad = np.flatnonzero(~ok)
    start = f.t[bad[-1] + 1] if bad.size else f.t[0]
    return float(f.t[-1] - start)
