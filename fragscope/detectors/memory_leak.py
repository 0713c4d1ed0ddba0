"""memory-leak: allocated memory grows steadily, reserved follows it (the gap stays small), NVML
used grows, and the process ends in OOM. Not fragmentation: there the gap grows instead.

Mechanism: tensors kept alive by references (caches keyed by request, lists of outputs, graphs)
accumulate; the allocator reserves more to serve them. In a serving engine the KV cache is
pre-allocated, so steady growth of live allocations does not follow traffic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import KG, PRESENT, AlertRule, num, sig
from ..units import finite_or_none as _f
from . import common, stats
from .frame import Frame

ID = ids.MEMORY_LEAK
REQUIRES = ("torch_allocated_bytes|gpu_memory_used_bytes",)
CORROBORATES = ("torch_reserved_bytes", "gpu_memory_used_bytes", "torch_ooms_total")
CAPTURE = ("snapshot",)  # what the agent captures when it fires, to show exactly where (docs/captures.md)


@dataclass(frozen=True)
class Config:
    # Growth that matters: >= 1.5 % of the GPU's memory (or >= 10 % of the baseline allocation)
    # since onset. A serving engine's live allocations are flat once the KV pool exists.
    growth_of_total: float = 0.015
    growth_of_base: float = 0.10
    # "steadily": a line explains >= 75 % of the variance of the trend (medians of 24 time bins,
    # so scrape noise does not hide a leak)
    r2_min: float = 0.75
    follow_min: float = 0.6  # reserved grows by >= 60 % of allocated's growth (the gap stays small)
    gap_rise_max: float = 0.05  # a gap (fragmentation ratio) rising more than this is fragmentation
    traffic_corr: float = 0.8  # growth that tracks running requests this closely is load, not a leak
    critical_hours_to_full: float = 1.0
    critical_used_ratio: float = 0.97


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    gpus = [g for g in f.gpus() if f.has_gpu(g, "torch_allocated_bytes") or f.has_gpu(g, "gpu_memory_used_bytes")]
    if not gpus:
        return Inconclusive(ID, ["fragscope_torch_allocated_bytes", "fragscope_gpu_memory_used_bytes or DCGM_FI_DEV_FB_USED"],
                            "no GPU memory signal")
    sp = stats.spans(f)
    out = []
    for g in gpus:
        fnd = _detect_gpu(f, g, sp, cfg)
        if fnd is not None:
            out.append(fnd)
    return out


def _growth(f: Frame, x: np.ndarray, sp: stats.Spans, start: float | None):
    ch = stats.change(f, x, sp, floor_rel=0.005)
    span = (start if start is not None else sp.base[1], f.end)
    slope, r2 = stats.slope_per_hour(f, x, span)
    return ch, slope, r2, span


def _detect_gpu(f: Frame, g: str, sp: stats.Spans, cfg: Config) -> Finding | None:
    sig = f.gpu[g]
    total = stats.nanmedian(sig.get("gpu_memory_total_bytes", np.full(f.t.size, np.nan)))
    alloc = sig.get("torch_allocated_bytes")
    used = sig.get("gpu_memory_used_bytes")
    primary = alloc if alloc is not None and np.isfinite(alloc).any() else used
    primary_name = "torch_allocated_bytes" if primary is alloc else "gpu_memory_used_bytes"
    ch = stats.change(f, primary, sp, floor_rel=0.005)
    if not ch.known or ch.delta <= 0:
        return None
    need = cfg.growth_of_base * ch.baseline
    if math.isfinite(total) and total > 0:
        need = min(need, cfg.growth_of_total * total) if primary is alloc else cfg.growth_of_total * total
    if ch.delta < 0.5 * need or ch.delta < 3 * ch.scale:
        return None
    # Where did the growth start? The onset band test is late for a slow leak already underway
    # when the window opens: try it and fixed starts, keep the steadiest fit with enough growth.
    # Growth ends where the series reaches its recent level (memory full, an OOM plateau).
    best = None
    starts = [t for t in (ch.onset, f.start, f.start + 0.25 * (f.end - f.start), f.start + 0.5 * (f.end - f.start))
              if t is not None]
    for t0 in starts:
        reached = np.nonzero((f.t >= t0) & (np.nan_to_num(primary, nan=-np.inf) >= ch.recent - 0.05 * ch.delta))[0]
        ends = {f.end, float(f.t[reached[0]]) if reached.size else f.end}
        for t1 in ends:
            if t1 - t0 < 10 * f.step:
                continue
            sl, r2 = stats.binned_slope_per_hour(f, primary, (t0, t1))
            # the fitted growth (not the two medians, which undercount a leak already underway)
            if not (math.isfinite(sl) and sl > 0 and math.isfinite(r2)) or sl * (t1 - t0) / 3600.0 < need:
                continue
            if best is None or r2 > best[1] + 0.02:
                best = (sl, r2, t0, t1)
    if best is None or best[1] < cfg.r2_min:
        return None
    slope, r2, t0, t1 = best
    onset = t0
    span = (t0, t1)
    evidence = [Evidence(primary_name, ch.recent, ch.baseline, ch.baseline + need, "bytes", span,
                         f"+{common.fmt_bytes(slope)}/h, linear fit R² {r2:.2f}", True)]
    agree = 1
    against = 0
    missing = []

    # Load-driven growth is not a leak: memory that follows the running batch is explained by
    # the batch better than by the clock. A leak grows with time whatever the traffic does.
    # Judged over the growth itself, and only when the batch grew too: a leak that starts late
    # under steady load must not be "explained" by load over the whole window.
    run = f.engine.get("requests_running")
    if run is not None and np.isfinite(run).any():
        whole = (f.start, span[1])
        m = stats.mask(f, whole) & np.isfinite(run) & np.isfinite(primary)
        rb = stats.nanmedian(run[stats.mask(f, sp.base)])
        rr = stats.nanmedian(run[stats.mask(f, (span[1] - max(600.0, 3 * f.step), span[1]))])
        load_grew = math.isfinite(rb) and rb > 0 and math.isfinite(rr) and rr / rb >= 1.2
        if load_grew and m.sum() >= 10 and np.std(run[m]) > 0:
            r2_load = float(np.corrcoef(run[m], primary[m])[0, 1]) ** 2
            _, r2_time = stats.slope_per_hour(f, primary, whole)
            if math.isfinite(r2_time) and r2_load >= cfg.traffic_corr ** 2 and r2_load > r2_time:
                return None

    if primary is alloc:
        res = sig.get("torch_reserved_bytes")
        if res is not None and np.isfinite(res).any():
            rch = stats.change(f, res, sp, floor_rel=0.005)
            follows = rch.known and rch.delta >= cfg.follow_min * ch.delta
            evidence.append(Evidence("torch_reserved_bytes", rch.recent, rch.baseline, None, "bytes", span,
                                     "reserved follows allocated", follows))
            agree += follows
            fr = common.frag_rise(f, g, sp)
            if fr is not None and fr.known:
                small = fr.delta < cfg.gap_rise_max and fr.recent < 0.25
                evidence.append(Evidence("torch_fragmentation_ratio", fr.recent, fr.baseline, cfg.gap_rise_max,
                                         "ratio", span, "the reserved−allocated gap stays small" if small
                                         else "the gap grows: fragmentation, not a leak", small))
                if not small:
                    return None
                agree += 1
        else:
            missing.append("fragscope_torch_reserved_bytes")
        if used is not None and np.isfinite(used).any():
            uch = stats.change(f, used, sp, floor_rel=0.002)
            grows = uch.known and uch.delta > 3 * uch.scale and uch.delta > 0.25 * ch.delta
            evidence.append(Evidence("gpu_memory_used_bytes", uch.recent, uch.baseline, None, "bytes", span,
                                     "NVML used grows" if grows else "NVML used flat (inside the pre-allocation)", grows))
            agree += grows
        else:
            missing.append("fragscope_gpu_memory_used_bytes or DCGM_FI_DEV_FB_USED")
    else:
        missing.append("fragscope_torch_allocated_bytes (run the engine under fragscope-probe)")
    ooms = stats.increase(f, f.gpu_cum.get(g, {}).get("torch_ooms_total"), (f.start, f.end))
    if math.isfinite(ooms) and ooms > 0:
        evidence.append(Evidence("torch_ooms", ooms, 0.0, 1.0, "OOMs", (f.start, f.end), "out of memory", True))
        agree += 1

    hours_to_full = math.nan
    used_now = stats.nanmedian(used[stats.mask(f, sp.recent)]) if used is not None else math.nan
    ref_now = used_now if math.isfinite(used_now) else ch.recent
    if math.isfinite(total) and total > 0:
        hours_to_full = max(0.0, (total - ref_now) / slope)
    sev = Severity.WARNING
    if (math.isfinite(ooms) and ooms > 0) or (math.isfinite(hours_to_full) and hours_to_full <= cfg.critical_hours_to_full) \
            or (math.isfinite(used_now) and math.isfinite(total) and used_now / total >= cfg.critical_used_ratio):
        sev = Severity.CRITICAL
    conf = stats.confidence(agree, base=0.4 if primary is alloc else 0.3, against=against)
    summary = (f"GPU {g}: {'allocated' if primary is alloc else 'NVML used'} memory grows steadily by "
               f"{common.fmt_bytes(slope)}/h since {common.fmt_time(onset)} "
               f"({common.fmt_bytes(ch.baseline)} → {common.fmt_bytes(ch.recent)}, R² {r2:.2f})")
    if primary is alloc and agree >= 2:
        summary += " with reserved following and the gap small"
    if math.isfinite(ooms) and ooms > 0:
        summary += f"; {ooms:.0f} OOM(s)"
    elif math.isfinite(hours_to_full):
        summary += f"; at this rate memory is exhausted in ~{hours_to_full:.1f} h"
    summary += "."
    ctx = {"slope_bytes_per_hour": slope, "hours_to_full": hours_to_full, "total_bytes": total}
    return Finding(ID, sev, conf, summary, onset, evidence, missing, {"gpu": g}, context=ctx)


# --- PromQL: the growth rule over the last hour, for the alert ------------------------------------
ALERT_WINDOW = "1h"  # the span the alert fits a line over (the detector needs >= 30 min: min_trend_span_s)


def alert_rule(cfg: Config = Config()) -> AlertRule:
    """Allocated memory (else device memory used, where the probe is absent) grew by a least-squares line
    over the last hour at least growth_of_base of its minimum or growth_of_total of the GPU, while the
    allocator's unusable share did not rise by gap_rise_max (that is fragmentation)."""
    w = ALERT_WINDOW
    # deriv() is linear in the samples: the sum of the processes' slopes is the slope of their sum, so the
    # fit runs on the raw series (no subquery: the rule stays cheap to evaluate every minute)
    alloc = f"sum by ({KG}) {sig('torch_allocated_bytes', 'avg_over_time({})', PRESENT)}"
    total = f"max by ({KG}) {sig('gpu_memory_total_bytes', 'max_over_time({})', PRESENT)}"
    ga = f"(sum by ({KG}) {sig('torch_allocated_bytes', 'deriv({})', w)} * 3600)"
    gu = f"(sum by ({KG}) {sig('gpu_memory_used_bytes', 'deriv({})', w)} * 3600)"
    base = f"(sum by ({KG}) {sig('torch_allocated_bytes', 'min_over_time({})', w)})"
    alloc_grew = (f"(({ga} / on ({KG}) ({base} > 0)) >= {num(cfg.growth_of_base)}"
                  f" or ({ga} / on ({KG}) (({total}) > 0)) >= {num(cfg.growth_of_total)})")
    used_grew = f"(({gu} / on ({KG}) (({total}) > 0)) >= {num(cfg.growth_of_total)} unless on ({KG}) ({alloc}))"

    def gap(offset: str) -> str:
        res = f"sum by ({KG}) {sig('torch_reserved_bytes', 'avg_over_time({}' + offset + ')', PRESENT)}"
        al = f"sum by ({KG}) {sig('torch_allocated_bytes', 'avg_over_time({}' + offset + ')', PRESENT)}"
        return f"((({res}) - ({al})) / (({res}) > 0))"
    gap_rose = f"(({gap('')}) - on ({KG}) ({gap(' offset ' + w)}) > {num(cfg.gap_rise_max)})"
    expr = f"({alloc_grew} or {used_grew}) unless on ({KG}) {gap_rose}"
    return AlertRule(
        "FragscopeMemoryLeak", ID, expr, "15m", "warning",
        "GPU {{ $labels.gpu }}: GPU memory grows steadily",
        f"Allocated GPU memory grew along a line over the last hour by at least {cfg.growth_of_base * 100:g} % of "
        f"its minimum or {cfg.growth_of_total * 100:g} % of the GPU's memory (device memory used where the probe "
        f"is absent), while the allocator's unusable share rose less than {cfg.gap_rise_max * 100:g} points.",
        "Steady growth of live allocations over the last hour, not fragmentation (docs/diagnoses.md#memory-leak).",
        {"growth_of_base": cfg.growth_of_base, "growth_of_total": cfg.growth_of_total, "gap_rise_max": cfg.gap_rise_max})


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    h = _f(ctx.get("hours_to_full"))
    if h is None:
        return []
    return [f"Restart within {max(0.0, h * 0.8):.1f} h (memory exhausted in ~{h:.1f} h at this rate); "
            "take a memory snapshot first."]


PLAYBOOK = Playbook(
    ID, "GPU memory leak",
    "Live allocations grow without bound, independent of traffic; the process will run out of memory.",
    ["Restart the engine before it OOMs (rolling), and capture a memory snapshot first "
     "(fragscope capture --kind snapshot) to find what holds the memory."],
    [Action("Find the owner: record memory history (torch.cuda.memory._record_memory_history) and compare "
            "two snapshots an hour apart (diagnose snapshot); look for growing allocation stacks.",
            ["the engine runs under fragscope-probe or you can set env vars at start"],
            ["memory history recording costs ~2 µs per allocation: keep max_entries bounded"]),
     Action("Check request-scoped caches (LoRA adapters, prefix caches outside vLLM, logits processors, "
            "custom outputs kept in Python lists).", [], []),
     Action("Until fixed: scheduled restarts before the projected exhaustion time.",
            ["more than one replica"], ["a single replica"])],
    ["fragscope_torch_allocated_bytes flat (slope ~0) over hours at steady traffic",
     "no torch OOMs"],
    ["pytorch docs: torch_cuda_memory.html (memory snapshots)"])


# A trend-only diagnosis: what a window too short for it says, and the least span that can show a leak.
SHORT_WINDOW_REASON = ("a leak shows only as growth over time: give it at least 30 min of history "
                       "(e.g. diagnose --agent URL --since 1h, or a recording of that length)")
MIN_TREND_SPAN_S = 30 * 60.0
