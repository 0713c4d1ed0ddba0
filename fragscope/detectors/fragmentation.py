"""allocator-fragmentation: memory the PyTorch allocator holds but cannot use grows, and the
engine degrades at unchanged traffic while the GPU stays busy.

Mechanism: the caching allocator splits cached segments; long-lived small blocks pin them, so
free bytes exist only as slivers (reserved − allocated, inactive_split_bytes). Requests that
find no large-enough block force a cudaMalloc; when that fails the allocator flushes its cache
and retries (num_alloc_retries: a device sync each). The engine then runs smaller batches,
preempts, and launches kernels late, yet NVML utilization stays high.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..advice.fixes import EXPANDABLE_ONE_LINE, expandable_segments
from ..advice.jobs import kind_of, KNOBS, restart, unknown_note
from ..advice.jobtext import JobText
from ..signals import primary
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import KG, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig
from ..units import finite_or_none as _f, fmt_bytes, fmt_pct, GiB
from . import common, stats
from . import level as lv
from .frame import Frame

ID = ids.ALLOCATOR_FRAGMENTATION
REQUIRES = ("torch_reserved_bytes", "torch_allocated_bytes")
CORROBORATES = ("torch_inactive_split_bytes", "torch_alloc_retries_total", "generation_tokens_total",
                "requests_running", "preemptions_total", "kernel_gap_seconds", "gpu_utilization_ratio")
CAPTURE = ("snapshot",)  # what the agent captures when it fires, to show exactly where (docs/captures.md)


@dataclass(frozen=True)
class Config:
    # The fragmentation reference case: 5 % -> 35 % over 6 h. A rise of 5 points is a sixth of that path and far
    # outside the noise of a steady allocator (< 1 point).
    frag_rise: float = 0.05
    # A quarter of reserved memory free-but-unusable is pathological whatever the baseline
    # (that case ends at 35 %; the OOM message calls it "reserved by PyTorch but unallocated").
    frag_high: float = 0.25
    # Early (minutes after onset: ~+1 point after 15 min in that case): a rise of >= 0.5 points and
    # >= 2 noise scales, confirmed by an allocator-internal signal (retries or inactive split
    # blocks) and >= 3 agreeing signals in all; or >= 3 noise scales and >= 4 agreeing signals.
    frag_early: float = 0.005
    early_sigmas: float = 2.0
    early_recent_s: float = 300.0
    # non-releasable split blocks (what empty_cache() cannot return), share of reserved
    inactive_rise: float = 0.03
    # steady-state serving should never retry a cudaMalloc: any sustained retry rate counts
    retries_per_min: float = 0.1
    # critical when throughput has lost >= 40 % (that case: -75 % at 6 h), or OOMs, or >= 30 % unusable
    critical_tput_drop: float = 0.40
    critical_frag: float = 0.30
    # Level evidence (the present alone, ``level``): frag_high with retries >= retries_per_min; sustained
    # retries (>= 1/min) are a fault by themselves, so a smaller unusable share suffices. One scrape has
    # only the lifetime count: a handful of retries can come from start-up profiling, hundreds cannot.
    frag_sustained: float = 0.10
    retries_sustained_per_min: float = 1.0
    frag_many_retries: float = 0.15
    many_retries: float = 100.0
    inactive_split_level: float = 0.10  # free memory split inside blocks in use, share of reserved


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    gpus = [g for g in f.gpus() if f.has_gpu(g, "torch_reserved_bytes") and f.has_gpu(g, "torch_allocated_bytes")]
    if not gpus:
        suspect = _suspect_without_probe(f, stats.spans(f))
        if suspect is not None:
            return [suspect]
        return Inconclusive(ID, ["fragscope_torch_reserved_bytes", "fragscope_torch_allocated_bytes"],
                            "allocator state not collected (run the engine under fragscope-probe); "
                            "NVML memory cannot show fragmentation in engines that pre-allocate the KV cache")
    sp = stats.spans(f)
    # engine-wide corroboration, computed once
    tput = common.throughput_fact(f, sp)
    demand = common.demand_unchanged_fact(f, sp)
    batch = common.batch_shrink_fact(f, sp)
    pre = common.preemption_fact(f, sp)
    kv = common.kv_fact(f, sp)
    out: list[Finding] = []
    for g in gpus:
        fnd = _detect_gpu(f, g, sp, cfg, tput, demand, batch, pre, kv)
        if fnd is not None:
            out.append(fnd)
    return out


def _detect_gpu(f: Frame, g: str, sp: stats.Spans, cfg: Config, tput, demand, batch, pre, kv) -> Finding | None:
    sig = f.gpu[g]
    fr = sig["torch_fragmentation_ratio"]
    ch = stats.change(f, fr, sp, floor_abs=0.003)
    if not ch.known:
        return None
    res = sig["torch_reserved_bytes"]
    alloc = sig["torch_allocated_bytes"]
    rec = stats.mask(f, sp.recent)
    base = stats.mask(f, sp.base)
    res_r, alloc_r = stats.nanmedian(res[rec]), stats.nanmedian(alloc[rec])
    alloc_b = stats.nanmedian(alloc[base])
    slack_r = res_r - alloc_r

    evidence: list[Evidence] = []
    agree = 0
    strong = ch.delta >= cfg.frag_rise or ch.recent >= cfg.frag_high
    early = ch.delta >= max(cfg.frag_early, cfg.early_sigmas * ch.scale)
    if not early and f.end - sp.recent[0] > cfg.early_recent_s + 2 * f.step:
        # minutes after an onset the last 10 minutes still hold pre-onset points: look at the last 5
        last = stats.Spans(sp.base, (f.end - cfg.early_recent_s, f.end))
        ch5 = stats.change(f, fr, last, floor_abs=0.003)
        if ch5.known and ch5.delta >= max(cfg.frag_early, cfg.early_sigmas * ch5.scale):
            early, ch = True, ch5
    frag_ev = Evidence("torch_fragmentation_ratio", ch.recent, ch.baseline, ch.baseline + cfg.frag_rise,
                       "ratio", sp.recent,
                       f"(reserved − allocated) / reserved; {common.fmt_bytes(slack_r)} unusable", strong or early)
    evidence.append(frag_ev)

    # A leak grows allocated memory and reserved follows: the gap stays small. Not ours.
    alloc_growth = (alloc_r - alloc_b) / alloc_b if alloc_b and alloc_b > 0 else 0.0
    if not strong and alloc_growth > 0.10 and ch.delta < cfg.frag_rise:
        return None

    # corroborating allocator signals
    inactive = sig.get("torch_inactive_split_ratio")
    ich = stats.change(f, inactive, sp, floor_abs=0.003) if inactive is not None else None
    if ich is not None and ich.known:
        ok = ich.delta >= cfg.inactive_rise or (early and ich.delta >= max(0.003, 3 * ich.scale))
        evidence.append(Evidence("torch_inactive_split_ratio", ich.recent, ich.baseline,
                                 ich.baseline + cfg.inactive_rise, "ratio", sp.recent,
                                 "free split blocks empty_cache() cannot return", ok))
        agree += ok
    retries = sig.get("torch_alloc_retries_total")
    retry_onset = None
    if retries is not None and np.isfinite(retries).any():
        cum = f.gpu_cum.get(g, {}).get("torch_alloc_retries_total")
        dur_r = sp.recent[1] - sp.recent[0]
        dur_b = sp.base[1] - sp.base[0]
        inc_r = stats.increase(f, cum, sp.recent)
        inc_b = stats.increase(f, cum, sp.base)
        rr = inc_r / dur_r * 60 if math.isfinite(inc_r) else math.nan
        rb = inc_b / dur_b * 60 if math.isfinite(inc_b) else math.nan
        # absolute: steady serving never retries, so a sustained rate, or retries appearing where the
        # baseline had none, is the allocator failing to find blocks
        ok = math.isfinite(rr) and (rr >= cfg.retries_per_min or
                                    (inc_r >= 1 and (not math.isfinite(inc_b) or inc_b == 0)))
        if ok:
            retry_onset = stats.onset_time(f, retries * 60, cfg.retries_per_min / 2, 1)
        evidence.append(Evidence("torch_alloc_retries_per_minute", rr, rb, cfg.retries_per_min, "/min",
                                 sp.recent, "cache flush + device sync per retry", ok))
        agree += ok
    ooms = stats.increase(f, f.gpu_cum.get(g, {}).get("torch_ooms_total"), (f.start, f.end))
    if math.isfinite(ooms) and ooms > 0:
        evidence.append(Evidence("torch_ooms", ooms, 0.0, 1.0, "OOMs", (f.start, f.end),
                                 "allocator raised out-of-memory", True))
        agree += 1

    # engine degradation at unchanged traffic
    degraded = 0
    for fact in (tput, batch, pre):
        if fact.evidence is not None:
            evidence.append(fact.evidence)
            degraded += fact.present
    if tput.present or batch.present:
        if demand.evidence is not None:
            evidence.append(demand.evidence)
        # throughput that falls with demand is not a symptom
        if not demand.present and demand.evidence is None and not pre.present:
            degraded -= tput.present
    gap = common.gap_fact(f, g, sp)
    if gap.evidence is not None:
        evidence.append(gap.evidence)
        degraded += gap.present
    busy = common.util_busy_fact(f, g, sp)
    if busy.evidence is not None and (tput.present or batch.present):
        evidence.append(busy.evidence)
        degraded += busy.present

    # contrary evidence: the clock, not the allocator, explains a slowdown
    against = 0
    thr = common.throttle_fact(f, g, sp)
    if thr.present and thr.evidence is not None:
        thr.evidence.agrees = False
        thr.evidence.note = "clock throttling also explains a slowdown"
        evidence.append(thr.evidence)
        against += 1

    allocator_agree = 1 + agree  # the ratio itself plus inactive/retries/ooms
    total_agree = allocator_agree + degraded
    early_confirmed = early and ((agree >= 1 and total_agree >= 3) or (ch.z >= 3 and total_agree >= 4))
    rising = ch.delta >= cfg.frag_rise
    # A large but constant gap with nothing else wrong is cache the allocator kept from a peak,
    # not a pathology: a high level alone needs one more agreeing signal.
    if not (rising or (strong and total_agree >= 2) or early_confirmed):
        return None

    tput_drop = tput.value if tput.present else 0.0
    critical = ((tput_drop >= cfg.critical_tput_drop) or (math.isfinite(ooms) and ooms > 0)
                or ch.recent >= cfg.critical_frag) and total_agree >= 3
    if critical:
        sev = Severity.CRITICAL
    elif strong or total_agree >= 3:
        sev = Severity.WARNING
    else:
        sev = Severity.INFO
    conf = stats.confidence(total_agree, base=0.35 if strong else 0.25, against=against)
    onset = common.earliest(ch.onset, retry_onset)
    missing = [m for m, have in (
        ("fragscope_torch_inactive_split_bytes", ich is not None and ich.known),
        ("fragscope_torch_alloc_retries_total", retries is not None),
        (primary("generation_tokens_total"), tput.evidence is not None),
        (primary("preemptions_total"), pre.evidence is not None),
        ("fragscope_kernel_gap_seconds", gap.evidence is not None),
        ("gpu utilization (fragscope_gpu_utilization_ratio or DCGM_FI_DEV_GPU_UTIL)", busy.evidence is not None),
    ) if not have]

    parts = [f"GPU {g}: {common.fmt_pct(ch.recent)} of reserved memory ({common.fmt_bytes(slack_r)}) is free but "
             f"unusable since {common.fmt_time(onset)} (baseline {common.fmt_pct(ch.baseline)})"]
    for e in evidence:
        if not e.agrees:
            continue
        if e.signal == "torch_alloc_retries_per_minute":
            parts.append(f"allocation retries {e.baseline or 0:.1f} → {e.observed:.1f}/min")
        elif e.signal == "generation_tokens_per_second":
            parts.append(f"throughput {e.baseline:.0f} → {e.observed:.0f} tok/s"
                         + (" at unchanged traffic" if demand.present else ""))
        elif e.signal == "requests_running":
            parts.append(f"running batch {e.baseline:.0f} → {e.observed:.0f}")
        elif e.signal == "preemptions_per_minute":
            parts.append(f"preemptions {e.baseline or 0:.1f} → {e.observed:.0f}/min")
        elif e.signal.startswith("kernel_gap_p"):
            q = "p99" if "p99" in e.signal else "p50"
            parts.append(f"kernel gaps ({q}) {common.fmt_seconds(e.baseline)} → {common.fmt_seconds(e.observed)}")
        elif e.signal == "torch_ooms":
            parts.append(f"{e.observed:.0f} OOM(s)")
    if busy.present and (tput.present or batch.present):
        parts.append(f"GPU utilization still {busy.value * 100:.0f} %")
    summary = "; ".join(parts) + "."
    ctx = {"slack_bytes": slack_r, "reserved_bytes": res_r, "fragmentation_ratio": ch.recent,
           "throughput_drop_ratio": tput_drop, "gpu_memory_total_bytes": stats.nanmedian(
               sig.get("gpu_memory_total_bytes", np.full(f.t.size, np.nan)))}
    return Finding(ID, sev, conf, summary, onset, evidence, missing, {"gpu": g}, context=ctx)


def _suspect_without_probe(f: Frame, sp: stats.Spans) -> Finding | None:
    """Without the allocator probe, the engine's own signature can still point here: throughput
    and the running batch fall while requests wait and the KV pool is *not* full, with
    preemptions or widening kernel gaps, the GPU busy and its clocks steady. Nothing else on the
    list explains that; the finding stays low-confidence and names the probe as what is missing."""
    tput = common.throughput_fact(f, sp)
    demand = common.demand_unchanged_fact(f, sp)
    if not (tput.present and demand.present):
        return None
    batch = common.batch_shrink_fact(f, sp)
    pre = common.preemption_fact(f, sp)
    kv = common.kv_fact(f, sp)
    if kv.present:
        return None  # a full KV pool explains preemptions and a queue: kv-cache-pressure
    gap = common.gap_fact(f, None, sp)
    busy = common.util_busy_fact(f, None, sp)
    signs = [x for x in (batch, pre, gap, busy) if x.present]
    if len(signs) < 2:
        return None
    clocks_known = any(f.has_gpu(g, "gpu_sm_clock_hertz") for g in f.gpus())
    for g in f.gpus():
        if common.throttle_fact(f, g, sp).present:
            return None
        clk = f.gpu[g].get("gpu_sm_clock_hertz")
        if clk is not None:
            c = stats.change(f, clk, sp, direction=-1, floor_rel=0.01)
            if c.known and c.baseline > 0 and 1 - c.recent / c.baseline >= 0.05:
                return None  # clocks fell: clock-throttling's business
    evidence = [e for e in (tput.evidence, demand.evidence, batch.evidence, pre.evidence, kv.evidence,
                            gap.evidence, busy.evidence) if e is not None]
    kv.evidence and setattr(kv.evidence, "agrees", True)
    if kv.evidence is not None:
        kv.evidence.note = "KV pool not full: preemptions and the queue are not KV pressure"
    conf = min(0.45, 0.2 + 0.08 * (len(signs) + 1)) - (0.0 if clocks_known else 0.1)
    onset = common.earliest(tput.onset, batch.onset, pre.onset, gap.onset)
    summary = (f"Suspected allocator fragmentation (allocator state not collected): throughput "
               f"{tput.evidence.baseline:.0f} → {tput.evidence.observed:.0f} tok/s since {common.fmt_time(onset)} "
               f"while requests wait and the KV cache is not full")
    if batch.present:
        summary += f"; running batch {batch.evidence.baseline:.0f} → {batch.evidence.observed:.0f}"
    if pre.present:
        summary += f"; preemptions {pre.extra.get('base', 0.0):.1f} → {pre.value:.0f}/min"
    if gap.present:
        summary += f"; kernel gaps ×{gap.value:.1f}"
    if busy.present:
        summary += f"; GPU utilization still {busy.value * 100:.0f} %"
    summary += ". Run the engine under fragscope-probe to confirm."
    missing = ["fragscope_torch_reserved_bytes", "fragscope_torch_allocated_bytes",
               "fragscope_torch_alloc_retries_total"]
    if not clocks_known:
        missing.append("SM clock (clock throttling not ruled out)")
    ctx = {"throughput_drop_ratio": tput.value}
    return Finding(ID, Severity.WARNING, conf, summary, onset, evidence, missing, {}, context=ctx)


# --- allocator: unusable share with retries --------------------------------------------------
def level(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The present by itself: an unusable share with allocation retries (level evidence)."""
    gpus = [g for g in f.gpus() if f.has_gpu(g, "torch_fragmentation_ratio")]
    if not gpus:
        return Inconclusive(ID, [], "PyTorch allocator not observed (run the engine under fragscope-probe)")
    out = []
    sp = lv.present_span(f)
    for g in gpus:
        sig = f.gpu[g]
        ratio = lv.present_value(f, sig["torch_fragmentation_ratio"])
        if not math.isfinite(ratio):
            continue
        ret = lv.gpu_counter(f, g, "torch_alloc_retries_total")
        if not ret.known:
            continue
        if math.isfinite(ret.rate_per_min):
            retrying = (ratio >= cfg.frag_high and ret.rate_per_min >= cfg.retries_per_min) or \
                (ratio >= cfg.frag_sustained and ret.rate_per_min >= cfg.retries_sustained_per_min)
        else:
            retrying = (ratio >= cfg.frag_high and ret.lifetime > 0) or \
                (ratio >= cfg.frag_many_retries and ret.lifetime >= cfg.many_retries)
        if not retrying:
            continue
        reserved = lv.present_value(f, sig.get("torch_reserved_bytes"))
        slack = ratio * reserved if math.isfinite(reserved) else math.nan
        ev = [Evidence("torch_fragmentation_ratio", ratio, None, cfg.frag_high, "ratio", sp,
                       f"{fmt_bytes(slack)} of {fmt_bytes(reserved)} reserved is free but unusable", True),
              Evidence("torch_alloc_retries_per_minute" if math.isfinite(ret.rate_per_min) else "torch_alloc_retries_total",
                       ret.rate_per_min if math.isfinite(ret.rate_per_min) else ret.lifetime, None,
                       cfg.retries_per_min if math.isfinite(ret.rate_per_min) else 0.0,
                       "/min" if math.isfinite(ret.rate_per_min) else "retries", sp,
                       lv.counter_text(ret, "retries", "the process started"), True)]
        agree = 2
        split = lv.present_value(f, sig.get("torch_inactive_split_ratio"))
        if math.isfinite(split) and split >= cfg.inactive_split_level:
            ev.append(Evidence("torch_inactive_split_ratio", split, None, cfg.inactive_split_level, "ratio", sp,
                               "free memory split inside blocks in use", True))
            agree += 1
        ooms = lv.gpu_counter(f, g, "torch_ooms_total")
        oomed = (ooms.rate_per_min > 0) if math.isfinite(ooms.rate_per_min) else (ooms.lifetime > 0)
        if oomed:
            ev.append(Evidence("torch_ooms_total", ooms.lifetime, None, 0.0, "ooms", sp,
                               lv.counter_text(ooms, "OOMs", "the process started"), True))
            agree += 1
        critical = ratio >= cfg.critical_frag and (oomed or (math.isfinite(ret.rate_per_min)
                                                                    and ret.rate_per_min >= cfg.retries_sustained_per_min))
        sev = Severity.CRITICAL if critical else Severity.WARNING
        conf = stats.confidence(agree, base=0.4) * 0.9
        summary = (f"GPU {g}: {fmt_pct(ratio)} of reserved memory ({fmt_bytes(reserved)}) is free but unusable while "
                   f"allocations retry ({lv.counter_text(ret, 'retries', 'the process started')}) ({lv.basis_note(f)}).")
        ctx = {"slack_bytes": slack if math.isfinite(slack) else None, "basis": "level",
               "gpu_memory_total_bytes": lv.present_value(f, sig.get("gpu_memory_total_bytes"))}
        out.append(Finding(ID, sev, conf, summary, None, ev, [], {"gpu": g}, context=ctx))
    return out


# --- PromQL: the level rule, for the fleet triage and the alert ---------------------------------
def unusable_ratio_promql(m=(), present: str = PRESENT) -> str:
    """(reserved - allocated) / reserved per target and GPU, summed over processes."""
    res = f"sum by ({KG}) {sig('torch_reserved_bytes', 'avg_over_time({})', present, m)}"
    alloc = f"sum by ({KG}) {sig('torch_allocated_bytes', 'avg_over_time({})', present, m)}"
    return f"(({res}) - ({alloc})) / (({res}) > 0)"


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """(reserved - allocated)/reserved >= 25 % with retries >= 0.1/min, or >= 10 % with >= 1/min."""
    ratio = unusable_ratio_promql(m, present)
    ret = f"sum by ({KG}) {sig('torch_alloc_retries_total', 'rate({})', rate, m)} * 60"
    # one evaluation of the ratio: its threshold is frag_sustained where retries are sustained, else frag_high
    lo, hi = cfg.frag_sustained, cfg.frag_high
    thr = f"({num(lo)} + {num(round(hi - lo, 12))} * (({ret}) < bool {num(cfg.retries_sustained_per_min)}))"
    return f"(({ratio}) >= on ({KG}) {thr}) and on ({KG}) (({ret}) >= {num(cfg.retries_per_min)})"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("unusable_reserved_ratio", "max_over_time", triage_check, "unusable_ratio")


def alert_rule(cfg: Config = Config()) -> AlertRule:
    return AlertRule(
        "FragscopeAllocatorFragmentation", ID, triage_check(cfg=cfg), "10m", "warning",
        "GPU {{ $labels.gpu }}: allocator fragmentation",
        f"At least {cfg.frag_high * 100:g} % of PyTorch-reserved memory is free but unusable while allocations "
        f"retry (>= {cfg.retries_per_min:g}/min), or {cfg.frag_sustained * 100:g} % with retries sustained at "
        f">= {cfg.retries_sustained_per_min:g}/min.",
        "Unusable share of the allocator's reserved memory with allocation retries (the level rule).",
        {"frag_high": cfg.frag_high, "frag_sustained": cfg.frag_sustained, "retries_per_min": cfg.retries_per_min,
         "retries_sustained_per_min": cfg.retries_sustained_per_min})


# --- signature: what keeps the diagnoses it suppresses quiet (their SUPPRESSED_BY) -----------------------
def signature(f: Frame, sp: stats.Spans) -> bool:
    """The unusable share rising on any GPU."""
    return common.any_frag_rising(f, sp)


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    kind = kind_of(ctx)
    if kind not in (None, "vllm"):
        # a log of another job: its own knobs, no vLLM flag and no rolling restart for a program that is not served
        acts = [unknown_note()] if kind == "unknown" else []
        acts.append(restart(kind))
        mem = KNOBS[kind]["memory"]
        if mem:
            acts.append(f"Leave the allocator headroom outside the engine's pre-allocated memory: lower {mem} by "
                        "about 5 % of the GPU.")
        acts.append(EXPANDABLE_ONE_LINE)
        return acts
    acts: list[str] = []
    gmu = _f(config.get("gpu_memory_utilization"))
    sized = _f(ctx.get("sized_gpu_memory_utilization"))
    slack = _f(ctx.get("slack_bytes"))
    total = _f(ctx.get("gpu_memory_total_bytes"))
    step = 0.05  # 0.9 -> 0.85 (5 % of the GPU) leaves the allocator headroom outside the KV pool
    head = f" (~{step * total / GiB:.1f} GiB of this GPU)" if total else ""
    waste = f"; the allocator now holds {slack / GiB:.1f} GiB it cannot use" if slack else ""
    if sized is not None:
        # the value fragscope size computes from the same log (one question, one answer): docs/sizing.md
        acts.append(f"Restart now, then set --gpu-memory-utilization {sized:.2f}"
                    + (f" (currently {gmu:.2f})" if gmu is not None else "")
                    + ": the value `fragscope size --log` computes from this log's own figures" + f"{waste}.")
    elif gmu is not None:
        acts.append(f"Restart now, then set --gpu-memory-utilization {max(0.5, gmu - step):.2f} "
                    f"(currently {gmu:.2f}) to leave {step:.2f} of the GPU{head} as allocator headroom{waste}.")
    else:
        acts.append(f"Restart now, then lower --gpu-memory-utilization by {step:.2f} (e.g. 0.90 → "
                    f"{0.90 - step:.2f}); the value in force is not in this evidence (vllm:cache_config_info, "
                    "or the engine's args line in its log).")
    acts.append(EXPANDABLE_ONE_LINE)
    acts.append("Schedule rolling restarts every 12–24 h until fragmentation stays flat.")
    return acts


# Lines that depend on the job (advice/jobs.py JobText): the engine-independent wording, and each job's own for a
# finding whose job is known (a log's).
_HEADROOM = ("Lower the engine's memory share to leave the allocator headroom outside the KV pool (vLLM "
             "--gpu-memory-utilization 0.9 → 0.85 typical; SGLang --mem-fraction-static by about 0.05).")


def _headroom(kind: str) -> str | None:
    if kind == "vllm":
        return ("Lower gpu_memory_utilization to leave the allocator headroom outside the KV pool (0.9 → 0.85 "
                "typical).")
    if kind == "unknown":
        return _HEADROOM
    mem = KNOBS[kind]["memory"]
    return f"Lower {mem} by about 5 % of the GPU to leave the allocator headroom outside the KV pool." if mem else None


_RESTART = ("Restart the engine (rolling, one replica at a time): fragmentation only clears when the process releases "
            "its segments.")


def _serving_only(text: str) -> JobText:
    """A line about a served replica: left out for a job that is not served (a training loop, a desktop application)."""
    return JobText(text, lambda kind: text if KNOBS[kind]["serving"] or kind == "unknown" else None)


PLAYBOOK = Playbook(
    ID, "PyTorch allocator fragmentation",
    "Memory the caching allocator holds is split into pieces too small for new requests; the engine "
    "runs smaller batches, preempts and stalls on allocation retries while the GPU looks busy.",
    [JobText(_RESTART, lambda kind: _RESTART if KNOBS[kind]["serving"] or kind == "unknown" else restart(kind)),
     _serving_only("If a restart is impossible right now: drain traffic from this replica to healthy peers.")],
    [Action(JobText(_HEADROOM, _headroom),
            [JobText("the KV pool can shrink by that share without hitting kv-cache-pressure (KV-cache usage peaks "
                     "< 0.9)", vllm="the KV pool can shrink by that share without hitting kv-cache-pressure "
                     "(check vllm:kv_cache_usage_perc peaks < 0.9)")],
            [JobText("the model's context length only just fits: fewer KV blocks can make startup fail",
                     vllm="the model's max_model_len only just fits: fewer KV blocks can make startup fail "
                     "(\"larger than the available KV cache memory\")")]),
     expandable_segments(),
     Action(_serving_only("Schedule restarts every 12–24 h until the durable fix is proven."),
            ["more than one replica behind the load balancer"],
            ["a single replica: each restart is an outage (~1–5 min model load)"]),
     Action("If fragmentation persists: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<size> so large cached "
            "blocks are never split by small requests (start at 512).",
            ["inactive_split_bytes is a large share of reserved"],
            ["it can cost throughput (more cudaMalloc calls); not with expandable_segments",
             "ignored under backend:cudaMallocAsync"])],
    ["fragscope_torch_fragmentation_ratio returns to its baseline (< 10 %) after the restart and stays "
     "flat for 6 h",
     "torch allocation retries stay at 0/min; preemptions back to ~0",
     "tokens/s at the same traffic returns to the baseline; running batch back to its baseline"],
    ["pytorch docs: notes/cuda.rst 'Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF'",
     "pytorch/pytorch#29554 (fragmentation measure), #159564 (expandable segments and inactive_split)"])


ALSO_FROM = ("snapshot", "log")
