"""Verdicts from an engine log: KV capacity, preemption storms, OOM fragmentation. docs/logs.md.

Pure: events in (from :mod:`fragscope.collectors.logs`), a summary dict and findings out. No I/O,
no clock. Thresholds live in :class:`Config` with the reason for each default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from .. import ids
from ..collectors.enginelog.events import GIB, LogEvent
from ..collectors.enginelog.jobkind import job_kind
from ..collectors.enginelog.state import LogState
from ..model import Evidence, Finding, Severity
from .log_crash import crash_findings, crash_summary
from .log_oom import oom_findings
from .log_queue import admission_capped_finding, full_pool_queue_finding
from .log_oom import oom_summary as _oom_summary


@dataclass(frozen=True, slots=True)
class Config:
    # vLLM preempts only when the scheduler finds no free KV block; the saved V0 incident log shows
    # 98.3-99.8 % GPU KV usage on the stats lines around every preemption warning.
    pressure_kv_usage: float = 0.90
    # stats lines come every 5 s (V0) or 10 s (V1): +-30 s sees at least three of them.
    pressure_window_seconds: float = 30.0
    # Each recompute preemption throws away a request's KV and prefills it again. At >= 1/s for a
    # minute the engine re-prefills dozens of prompts a minute; the saved V0 incident ran at ~6/s
    # while generation throughput fell from 4466 to ~1800 tokens/s.
    storm_rate_per_second: float = 1.0  # = 60/min, the critical line of docs/diagnoses.md kv-cache-pressure
    storm_min_seconds: float = 60.0
    # docs/diagnoses.md kv-cache-pressure needs >= 1 preemption/min; a burst shorter than a minute
    # is counted over one minute. Below it the finding is only info.
    min_rate_per_minute: float = 1.0
    # An OOM is caused by fragmentation when free device memory + reserved-but-unallocated bytes
    # would have covered the request but free memory alone did not: the bytes existed inside
    # PyTorch's pool, just not in one block (PyTorch already released every fully free cached
    # segment and retried before raising, so what stays reserved-unallocated is stranded in
    # partly used segments). It "contributed" when the stranded bytes are >= 20 % of what PyTorch
    # reserved (PyTorch's own hint is "reserved >> allocated") and >= 25 % of the shortfall.
    frag_contributing_ratio: float = 0.20
    frag_contributing_shortfall: float = 0.25
    # critical when the stranded bytes are >= 5 % of the GPU: a sizeable share of the device wasted.
    frag_critical_share_of_total: float = 0.05
    # The kv-budget estimate is arithmetic over the same inputs vLLM uses; block rounding and the
    # allocator's own slack stay under a few per cent, so a gap >= 10 % has a cause worth naming.
    kv_gap_ratio: float = 0.10
    # a reason "explains" the gap when it accounts for at least half of the missing bytes
    reason_explains_share: float = 0.5
    timeline_max_points: int = 1000


def _fin(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _last(events: Sequence[LogEvent], kind: str) -> LogEvent | None:
    for ev in reversed(events):
        if ev.kind == kind:
            return ev
    return None


def _median(v: Sequence[float]) -> float:
    s = sorted(v)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / GIB:.2f} GiB"


def _hms(ts: float | None) -> str:
    if ts is None:
        return "?"
    import time as _t

    return _t.strftime("%Y-%m-%d %H:%M:%SZ", _t.gmtime(ts))


# ---------------------------------------------------------------------------------------------
def kv_capacity_summary(events: Sequence[LogEvent]) -> dict | None:
    """The engine's KV pool as logged at (the last) startup."""
    tok = _last(events, "kv_cache_tokens")
    blk = _last(events, "kv_blocks")
    conc = _last(events, "max_concurrency")
    cfg = _last(events, "config")
    if tok is None and blk is None and conc is None:
        return None
    out: dict = {"tokens": None, "tokens_source": None, "blocks": None, "cpu_blocks": None, "block_size": None,
                 "device": None, "max_concurrency": None, "max_concurrency_tokens_per_request": None,
                 "kv_cache_bytes": None, "weights_bytes": None, "cuda_graph_bytes": None,
                 "non_torch_memory_bytes": None, "peak_torch_memory_bytes": None, "activation_peak_bytes": None,
                 "total_gpu_memory_bytes": None, "gpu_memory_utilization": None,
                 "line": None, "time": None, "text": None,
                 "startups": sum(1 for e in events if e.kind in ("kv_cache_tokens", "kv_blocks"))}
    if cfg is not None:
        out["block_size"] = cfg.fields.get("block_size")
        out["gpu_memory_utilization"] = cfg.fields.get("gpu_memory_utilization")
    if conc is not None:
        out["max_concurrency"] = conc.fields["concurrency"]
        out["max_concurrency_tokens_per_request"] = conc.fields["tokens_per_request"]
    src = tok or blk or conc
    if tok is not None:
        out["tokens"], out["tokens_source"] = tok.fields["tokens"], "logged"
        out["device"] = tok.fields.get("device")
    if blk is not None:
        out["blocks"], out["cpu_blocks"] = blk.fields["gpu_blocks"], blk.fields["cpu_blocks"]
        out["device"] = out["device"] or "gpu"
        if out["tokens"] is None and out["block_size"]:
            out["tokens"], out["tokens_source"] = blk.fields["gpu_blocks"] * out["block_size"], "blocks x block_size"
    if out["tokens"] is None and conc is not None:
        out["tokens"] = int(round(conc.fields["concurrency"] * conc.fields["tokens_per_request"]))
        out["tokens_source"] = "max concurrency x tokens per request (rounded to 2 decimals by the engine)"
    out["line"], out["time"], out["text"] = src.line_no, src.ts, src.text
    kvm = _last(events, "kv_memory")
    if kvm is not None:
        out["kv_cache_bytes"] = kvm.fields["kv_cache_bytes"]
    prof = _last(events, "memory_profile")
    if prof is not None:
        f = prof.fields
        for k in ("kv_cache_bytes", "non_torch_memory_bytes", "peak_torch_memory_bytes", "activation_peak_bytes",
                  "total_gpu_memory_bytes", "gpu_memory_utilization"):
            if f.get(k) is not None:
                out[k] = f[k]
        if f.get("weights_bytes") is not None:
            out["weights_bytes"] = f["weights_bytes"]
    w = _last(events, "weights")
    if w is not None:
        out["weights_bytes"] = w.fields["weights_bytes"]
    g = _last(events, "cuda_graph")
    if g is not None and g.fields.get("cuda_graph_bytes") is not None:
        out["cuda_graph_bytes"] = g.fields["cuda_graph_bytes"]
    if out["activation_peak_bytes"] is None and out["peak_torch_memory_bytes"] and out["weights_bytes"]:
        out["activation_peak_bytes"] = max(0.0, out["peak_torch_memory_bytes"] - out["weights_bytes"])
    return out


def preemption_summary(events: Sequence[LogEvent], cfg: Config = Config()) -> dict:
    """Cumulative preemption timeline from V0 warnings, V1 'Preemptions: N' or SGLang retractions."""
    st = LogState()
    points: list[tuple[float | None, float, int]] = []  # (time, cumulative, line) at each change
    base: tuple[float | None, float] | None = None  # the last observation before the first increase
    lines = 0
    for ev in events:
        st.apply(ev)
        if ev.kind in ("preemption", "retraction") or (ev.kind == "stats" and st.preemptions_total is not None):
            if ev.kind in ("preemption", "retraction") or ev.fields.get("preemptions"):
                lines += 1
            if st.preemptions_total is None:
                continue
            if st.preemptions_total == 0:
                base = (ev.ts, 0.0)
            if not points or points[-1][1] != st.preemptions_total:
                points.append((ev.ts, st.preemptions_total, ev.line_no))
    out = {"count": st.preemptions_total, "source": st.preemption_source or None, "lines": lines,
           "first": None, "last": None, "duration_seconds": None, "rate_per_second": None, "timeline": []}
    if st.preemptions_total is None:
        return out
    inc = [i for i in range(len(points)) if i == 0 and points[0][1] > 0 or i > 0 and points[i][1] > points[i - 1][1]]
    if inc:
        first_i, last_i = inc[0], inc[-1]
        # from the last line that still showed no preemption; without one (a V0 log whose stats lines
        # were cut), from the first warning, which is preemption number 1
        t0, c0 = base if base is not None and first_i <= 1 else (points[first_i][0], points[first_i][1])
        t1, c1 = points[last_i][0], points[last_i][1]
        out["first"], out["last"] = points[first_i][0], t1
        if t0 is not None and t1 is not None and t1 > t0:
            out["duration_seconds"] = t1 - t0
            out["rate_per_second"] = round((c1 - c0) / (t1 - t0), 4)
    step = max(1, math.ceil(len(points) / cfg.timeline_max_points))
    out["timeline"] = [{"time": t, "cumulative": c, "line": ln} for t, c, ln in points[::step]]
    return out


def oom_summary(ev: LogEvent, cfg: Config = Config()) -> dict:
    """One OOM event -> its verdict and figures (:func:`fragscope.detectors.log_oom.oom_summary`)."""
    return _oom_summary(ev, cfg)


def stats_summary(events: Sequence[LogEvent]) -> dict:
    keys = ("running", "waiting", "swapped", "kv_usage_ratio", "generation_tps", "prompt_tps", "preemptions")
    vals: dict[str, list[float]] = {k: [] for k in keys}
    n, first, last, engines, sources = 0, None, None, set(), set()
    for ev in events:
        if ev.kind != "stats":
            continue
        n += 1
        first = ev.ts if first is None else first
        last = ev.ts if ev.ts is not None else last
        engines.add(ev.engine or "")
        sources.add(ev.source)
        for k in keys:
            if k in ev.fields:
                vals[k].append(float(ev.fields[k]))
    names = {"kv_usage_ratio": "kv_cache_usage_ratio", "generation_tps": "generation_tokens_per_second",
             "prompt_tps": "prompt_tokens_per_second", "running": "requests_running", "waiting": "requests_waiting",
             "swapped": "requests_swapped", "preemptions": "preemptions_per_line"}
    out: dict = {"count": n, "first": first, "last": last, "engines": sorted(e for e in engines if e),
                 "sources": sorted(sources)}
    for k, v in vals.items():
        out[names[k]] = ({"min": min(v), "max": max(v), "mean": round(sum(v) / len(v), 4), "last": v[-1]}
                         if v else None)
    return out


# ---------------------------------------------------------------------------------------------
def _untimed_pressure_finding(events: Sequence[LogEvent], pre: dict, cfg: Config) -> Finding:
    """Preemptions without any timestamp (a pasted excerpt): the count is evidence, the rate is not known."""
    src = pre["source"] or "log"
    kv = [e.fields["kv_usage_ratio"] for e in events if e.kind == "stats" and "kv_usage_ratio" in e.fields]
    since = " (vLLM V0's cumulative counter: since the engine started)" if src == "vllm-v0 warnings" else ""
    ev = [Evidence("log_preemptions_total", float(pre["count"]), unit="preemptions",
                   note=f"from {src}; {pre['lines']} line(s); no timestamps, no rate")]
    conf = 0.6  # the engine itself says it ran out of KV blocks
    missing = ["log_timestamps"]
    if kv:
        agrees = max(kv) >= cfg.pressure_kv_usage
        ev.append(Evidence("log_kv_cache_usage_ratio", max(kv), threshold=cfg.pressure_kv_usage, unit="ratio",
                           agrees=agrees, note=f"max over the {len(kv)} stats line(s) of the excerpt (not aligned in time)"))
        conf += 0.1 if agrees else -0.1
    else:
        missing.append("kv_cache_usage_ratio")
    summary = (f"{pre['count']:.0f} preemptions counted in this excerpt" + (since or f" ({src})") + ": the engine ran out of KV "
               f"cache blocks and recomputed requests. The excerpt has no timestamps, so there is no rate: a storm "
               f"cannot be told from a slow trickle. Missing for the rest: timestamps (the full log, kubectl logs "
               f"--timestamps) or vllm:num_preemptions_total over time (diagnose --vllm URL).")
    return Finding(ids.KV_CACHE_PRESSURE, Severity.WARNING, max(0.05, min(0.95, conf)), summary, onset=None, evidence=ev,
                   missing=missing, subject={})


def _pressure_finding(events: Sequence[LogEvent], pre: dict, cfg: Config) -> Finding | None:
    if not pre["count"]:
        return None
    if pre["first"] is None:
        return _untimed_pressure_finding(events, pre, cfg)
    lo, hi = pre["first"] - cfg.pressure_window_seconds, (pre["last"] or pre["first"]) + cfg.pressure_window_seconds
    near = [e for e in events if e.kind == "stats" and e.ts is not None and lo <= e.ts <= hi]
    kv = [e.fields["kv_usage_ratio"] for e in near if "kv_usage_ratio" in e.fields]
    waiting = [e.fields["waiting"] for e in near if "waiting" in e.fields]
    t_first, t_last = pre["first"], pre["last"] or pre["first"]
    gen_during = [e.fields["generation_tps"] for e in near
                  if "generation_tps" in e.fields and t_first <= e.ts <= t_last]
    gen_before = [e.fields["generation_tps"] for e in events
                  if e.kind == "stats" and e.ts is not None and e.ts < t_first and e.fields.get("generation_tps")]
    window = (pre["first"], pre["last"] or pre["first"])
    rate = pre["rate_per_second"]
    src = pre["source"] or "log"
    ev = [Evidence("log_preemptions_total", float(pre["count"]), unit="preemptions", window=window,
                   note=f"from {src}" + (f"; {rate:.2f}/s" if rate is not None else ""))]
    conf = 0.6  # the engine itself says it ran out of KV blocks
    missing: list[str] = []
    kv_max = max(kv) if kv else None
    if kv:
        high = sum(1 for x in kv if x >= cfg.pressure_kv_usage) / len(kv)
        agrees = kv_max >= cfg.pressure_kv_usage
        ev.append(Evidence("log_kv_cache_usage_ratio", kv_max, threshold=cfg.pressure_kv_usage, unit="ratio",
                           window=window, agrees=agrees,
                           note=f"{high:.0%} of {len(kv)} stats lines near the preemptions at or above the threshold"))
        conf += 0.2 if agrees else -0.2
    else:
        missing.append("kv_cache_usage_ratio")
    if waiting:
        wmax = max(waiting)
        ev.append(Evidence("log_requests_waiting", float(wmax), unit="requests", window=window, agrees=wmax > 0,
                           note="requests queued while the pool was full"))
        conf += 0.1 if wmax > 0 else 0.0
    else:
        missing.append("requests_waiting")
    if gen_during:
        ev.append(Evidence("log_generation_tokens_per_second", _median(gen_during),
                           baseline=_median(gen_before) if gen_before else None, unit="tokens/s", window=window,
                           note="median while preempting" + ("; baseline: median of busy lines before" if gen_before
                                                              else "; no busy stats line before the first preemption")))
    storm = (rate is not None and rate >= cfg.storm_rate_per_second
             and (pre["duration_seconds"] or 0) >= cfg.storm_min_seconds)
    span = max(pre["duration_seconds"] or 0.0, 60.0)
    per_min = float(pre["count"]) / span * 60.0
    sev = Severity.CRITICAL if storm else (Severity.WARNING if per_min >= cfg.min_rate_per_minute else Severity.INFO)
    dur = pre["duration_seconds"]
    summary = (f"{pre['count']:.0f} preemptions logged ({src}) from {_hms(pre['first'])} to {_hms(pre['last'])}"
               + (f", {rate:.2f}/s over {dur:.0f} s" if rate is not None and dur else
                  "; no rate (no time passes between the first and the last observation)")
               + (f"; KV cache usage up to {kv_max * 100:.1f} %" if kv_max is not None else "")
               + (f"; up to {max(waiting):.0f} requests waiting" if waiting else "") + ".")
    return Finding(ids.KV_CACHE_PRESSURE, sev, max(0.05, min(0.95, conf)), summary, onset=pre["first"], evidence=ev,
                   missing=missing, subject={})


def _first_preemption_then_crash(f: Finding, events: Sequence[LogEvent], pre: dict, crash_lines) -> Finding:
    """One preemption (vLLM V0 warns on the 1st and every 50th) followed by a crash: the crash is the story, not
    a storm; the finding stays as information and points at the crash's line (``crash_lines``: LogParser's)."""
    if pre["count"] != 1:
        return f
    pre_lines = [e.line_no for e in events if e.kind == "preemption"]
    after = [n for n in crash_lines if pre_lines and n > max(pre_lines)]
    if not after:
        return f
    f.severity = Severity.INFO
    f.summary = (f"1 preemption (the engine's first) at line {max(pre_lines)}, followed by a crash at line {after[0]}: "
                 "one preemption is not a storm; the crash is what stopped the run. " + f.summary)
    f.context["crash_line"] = after[0]
    return f


def kv_capacity_check(cap: dict | None, expected_tokens: float | None, inputs: dict | None,
                      events: Sequence[LogEvent], ooms: list[dict], cfg: Config = Config()) -> dict | None:
    """Compare the logged KV capacity with an estimate and rank the likely reasons for a gap."""
    if cap is None or cap.get("tokens") is None or not expected_tokens:
        return None
    inputs = dict(inputs or {})
    logged = float(cap["tokens"])
    gap_ratio = 1.0 - logged / float(expected_tokens)
    out = {"logged_tokens": logged, "expected_tokens": float(expected_tokens), "gap_ratio": round(gap_ratio, 4),
           "gap_bytes": None, "bytes_per_token": None, "reasons": [], "likely_reason": None, "inputs": inputs}
    bpt = inputs.get("bytes_per_token")
    if not bpt and cap.get("kv_cache_bytes"):
        bpt = cap["kv_cache_bytes"] / logged
    if bpt:
        out["bytes_per_token"] = bpt
        out["gap_bytes"] = (float(expected_tokens) - logged) * bpt
    if gap_ratio < cfg.kv_gap_ratio:
        return out
    reasons: list[dict] = []

    def add(reason: str, b: float | None, note: str) -> None:
        if b is not None and b > 0:
            reasons.append({"reason": reason, "bytes": float(b), "note": note})

    add("cuda-graphs", cap.get("cuda_graph_bytes"),
        "CUDA graph capture memory; comes out of the KV budget where the engine profiles graphs before sizing the "
        "KV cache (V1 'Estimated CUDA graph memory'); try --enforce-eager or fewer capture sizes to confirm")
    add("nccl-and-non-torch-memory", cap.get("non_torch_memory_bytes"),
        "memory the engine process holds outside PyTorch: NCCL buffers, custom all-reduce, cuBLAS workspace, "
        "CUDA context")
    add("activation-peak", cap.get("activation_peak_bytes"),
        "peak activation memory of the profiling run (grows with max_num_batched_tokens)")
    short = _last(events, "startup_memory_shortfall")
    if short is not None:
        f = short.fields
        add("other-process", f["requested_bytes"] - f["free_bytes"],
            f"only {_gib(f['free_bytes'])} of {_gib(f['total_bytes'])} was free at startup: another process holds GPU memory")
    others = [p for o in ooms for p in (o.get("other_processes") or [])]
    if others:
        add("other-process", max(p["bytes"] for p in others),
            "OOM messages name other processes holding memory on this GPU: " +
            ", ".join(f"pid {p['pid']} {_gib(p['bytes'])}" for p in others[:3]))
    est_util, log_util = inputs.get("gpu_memory_utilization"), cap.get("gpu_memory_utilization")
    total = inputs.get("gpu_memory_bytes") or cap.get("total_gpu_memory_bytes")
    if est_util and log_util and total and abs(est_util - log_util) > 1e-3:
        add("gpu-memory-utilization-mismatch", (est_util - log_util) * total,
            f"the engine ran with gpu_memory_utilization={log_util}, the estimate assumed {est_util}")
    est_w, log_w = inputs.get("weights_bytes"), cap.get("weights_bytes")
    if est_w and log_w and log_w > est_w * 1.05:
        add("weights-larger-than-assumed", log_w - est_w,
            f"the engine logged {_gib(log_w)} of weights, the estimate assumed {_gib(est_w)}")
    if bpt and inputs.get("bytes_per_token") and cap.get("kv_cache_bytes"):
        logged_bpt = cap["kv_cache_bytes"] / logged
        if logged_bpt > inputs["bytes_per_token"] * 1.10:
            add("kv-bytes-per-token", (logged_bpt - inputs["bytes_per_token"]) * logged,
                f"the engine spends {logged_bpt:.0f} bytes per cached token, the model config gives "
                f"{inputs['bytes_per_token']:.0f} (kv_cache_dtype, padding layers, hybrid or MLA layout)")
    # one entry per reason, largest bytes
    best: dict[str, dict] = {}
    for r in reasons:
        if r["reason"] not in best or r["bytes"] > best[r["reason"]]["bytes"]:
            best[r["reason"]] = r
    ranked = sorted(best.values(), key=lambda r: -r["bytes"])
    gap_b = out["gap_bytes"]
    for r in ranked:
        r["share_of_gap"] = round(r["bytes"] / gap_b, 3) if gap_b else None
    out["reasons"] = ranked
    if ranked and (gap_b is None or ranked[0]["bytes"] >= cfg.reason_explains_share * gap_b):
        out["likely_reason"] = ranked[0]["reason"]
    return out


def _kv_gap_findings(events: Sequence[LogEvent], check: dict | None, cfg: Config) -> list[Finding]:
    out = []
    short = _last(events, "startup_memory_shortfall")
    if short is not None:
        f = short.fields
        held = f["total_bytes"] - f["free_bytes"]
        out.append(Finding(
            ids.KV_CAPACITY_GAP, Severity.CRITICAL, 0.9,
            f"engine could not start{' at ' + _hms(short.ts) if short.ts is not None else ''} (line {short.line_no}): "
            f"{_gib(f['free_bytes'])} of {_gib(f['total_bytes'])} free, "
            f"gpu_memory_utilization {f['gpu_memory_utilization']} wants {_gib(f['requested_bytes'])}; "
            f"{_gib(held)} is held by another process (or a previous engine still exiting).",
            onset=short.ts,
            evidence=[Evidence("log_startup_free_bytes", f["free_bytes"], threshold=f["requested_bytes"], unit="bytes",
                               note=f"line {short.line_no}")],
            missing=["gpu_memory_used_bytes"], subject={}))
    ins = _last(events, "kv_insufficient")
    if ins is not None:
        f = ins.fields
        est = f.get("estimated_max_model_len")
        out.append(Finding(
            ids.KV_CAPACITY_GAP, Severity.CRITICAL, 0.9,
            f"engine refused max_model_len {f['max_model_len']}: one request needs {_gib(f['needed_bytes'])} of KV "
            f"cache, only {_gib(f['available_bytes'])} is available" + (f" (fits {est} tokens)" if est else "") + ".",
            onset=ins.ts,
            evidence=[Evidence("log_kv_cache_available_bytes", f["available_bytes"], threshold=f["needed_bytes"],
                               unit="bytes", note=f"line {ins.line_no}")], subject={}))
    if check is not None and check["gap_ratio"] >= cfg.kv_gap_ratio:
        lr = check["likely_reason"]
        reasons = check["reasons"]
        why = (f"likely {lr} ({_gib(reasons[0]['bytes'])}: {reasons[0]['note']})" if lr
               else ("no logged figure explains it; check "
                     + (", ".join(r["reason"] for r in reasons) if reasons else
                        "other processes on the GPU (nvidia-smi), CUDA graph memory, NCCL buffers, "
                        "gpu_memory_utilization")))
        ev = [Evidence("log_kv_cache_capacity_tokens", check["logged_tokens"], baseline=check["expected_tokens"],
                       unit="tokens", note="baseline = kv-budget estimate")]
        for r in reasons[:4]:
            ev.append(Evidence(f"reason:{r['reason']}", r["bytes"], unit="bytes", note=r["note"]))
        conf = 0.7 if lr else 0.5
        out.append(Finding(
            ids.KV_CAPACITY_GAP, Severity.WARNING if check["gap_ratio"] >= 2 * cfg.kv_gap_ratio else Severity.INFO, conf,
            f"engine logged {check['logged_tokens']:,.0f} KV tokens, {check['gap_ratio'] * 100:.0f} % below the "
            f"kv-budget estimate of {check['expected_tokens']:,.0f}"
            + (f" ({_gib(check['gap_bytes'])})" if check["gap_bytes"] else "") + f"; {why}.",
            evidence=ev, subject={}))
    return out


def analyse_log(events: Iterable[LogEvent], kv_budget_estimate=None, expected_kv_tokens: float | None = None,
                *, estimate_inputs: dict | None = None, cfg: Config = Config(),
                source: str = "", job_markers=(), startup=None, crash_lines=()) -> tuple[dict, list[Finding]]:
    """Summary (JSON contract, docs/logs.md#json) and findings for one engine log.

    ``kv_budget_estimate``: a :class:`fragscope.kvbudget.KvBudget` (its ``cached_tokens`` is used);
    ``expected_kv_tokens``: the same figure given directly. ``estimate_inputs`` (bytes, ratios) lets
    the check name the reason for a gap: gpu_memory_bytes, gpu_memory_utilization, weights_bytes,
    overhead_bytes, bytes_per_token. ``job_markers``: the kinds of job whose own text the parser saw
    (``LogParser.job_markers``); ``startup``: the start-up accounting (sizing), for the pool a queued batch needs;
    with the events' sources they give ``job_kind`` (collectors/enginelog/jobkind.py),
    which each finding carries in its context so its actions name that job's knobs.
    """
    evs = list(events)
    expected = expected_kv_tokens
    if expected is None and kv_budget_estimate is not None:
        expected = getattr(kv_budget_estimate, "cached_tokens", None)
        if expected is None and isinstance(kv_budget_estimate, dict):
            expected = kv_budget_estimate.get("cached_tokens")
    times = [e.ts for e in evs if e.ts is not None]
    cap = kv_capacity_summary(evs)
    pre = preemption_summary(evs, cfg)
    ooms = [oom_summary(e, cfg) for e in evs if e.kind == "oom" and not e.fields.get("duplicate")]
    check = kv_capacity_check(cap, expected, estimate_inputs, evs, ooms, cfg)
    kinds: dict[str, int] = {}
    for e in evs:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    summary = {
        "source": source,
        "events": len(evs),
        "event_kinds": kinds,
        "engines": sorted({e.source for e in evs if e.source}),
        "job_kind": job_kind(set(job_markers), {e.source for e in evs}),
        "time_range": {"start": min(times) if times else None, "end": max(times) if times else None},
        "kv_capacity": cap,
        "preemptions": pre,
        "ooms": ooms,
        "stats": stats_summary(evs),
        "startup_failures": [e.to_dict() for e in evs if e.kind in ("startup_memory_shortfall", "kv_insufficient")],
        "kv_check": check,
        "crash": crash_summary(evs),
        "notes": [],
    }
    if pre["count"] is None and any(e.kind == "stats" and e.source == "vllm-v1" for e in evs):
        summary["notes"].append("this vLLM release logs no preemption count: read vllm:num_preemptions_total "
                                "from /metrics (diagnose --vllm URL)")
    findings: list[Finding] = []
    f = _pressure_finding(evs, pre, cfg)
    if f is not None:
        f = _first_preemption_then_crash(f, evs, pre, crash_lines)
    if f is None:  # no preemption logged (V1 logs no count): a full pool shows as requests queued at ~100 % KV
        f = full_pool_queue_finding(evs, startup, summary["job_kind"])
    if f is not None:
        findings.append(f)
    capped = admission_capped_finding(evs, startup, summary["job_kind"])  # a queue with the pool not full
    if capped is not None:
        findings.append(capped)
    findings += oom_findings(ooms, cfg)
    findings += _kv_gap_findings(evs, check, cfg)
    findings += crash_findings(summary["crash"], summary["job_kind"])
    for x in findings:
        x.context.setdefault("job_kind", summary["job_kind"])
    return summary, findings
