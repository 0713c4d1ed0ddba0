"""The sizing diagnoses as pure detectors (for the registry): ``kv-pool-undersized`` and ``startup-oom``.

Input: the start-up accounting (a :class:`StartupAccounting` or its ``to_dict()``) and, for the pool,
the run-time summary of :mod:`fragscope.sizing.runtime`. Output: findings or an Inconclusive naming
what is missing. No I/O, no clock. docs/sizing.md#diagnoses.
"""
from __future__ import annotations

from dataclasses import fields

from ..model import Evidence, Finding, Inconclusive, Severity
from ..signals import any_of
from ..units import GiB, MiB
from .playbooks import KV_POOL_UNDERSIZED_ID, STARTUP_OOM_ID
from .recommend import POOL_TOO_SMALL, SizingConfig, recommend
from .accounting import StartupAccounting

REQUIRES_POOL = ("startup_accounting", "kv_cache_usage_ratio", "preemptions_total", "gpu_memory_used_bytes",
                 "gpu_memory_total_bytes")
CORROBORATES_POOL = ("requests_waiting", "request_prompt_tokens", "request_generation_tokens")
REQUIRES_STARTUP = ("startup_accounting",)


def _acc(a) -> StartupAccounting:
    if isinstance(a, StartupAccounting):
        return a
    if isinstance(a, dict):
        names = {f.name for f in fields(StartupAccounting)}
        return StartupAccounting(**{k: v for k, v in a.items() if k in names})
    raise TypeError("startup accounting must be a StartupAccounting or its dict")


def _window(runtime: dict | None, window: tuple[float, float] | None):
    if window:
        return window
    if runtime and runtime.get("window"):
        w = runtime["window"]
        return (float(w[0]), float(w[1]))
    return None


def detect_kv_pool_undersized(accounting, runtime: dict | None, cfg: SizingConfig = SizingConfig(),
                              window: tuple[float, float] | None = None, basis: str = "log"
                              ) -> list[Finding] | Inconclusive:
    """The pool ran full under demand while the GPU had headroom: the value to set.

    ``basis``: "log" (the start-up log's accounting) or "level" (metrics alone: vllm:cache_config_info
    and NVML, detectors/kv_pool.py)."""
    acc = _acc(accounting)
    if not acc.has_accounting:
        return Inconclusive(KV_POOL_UNDERSIZED_ID, ["engine start-up log (KV cache size lines)"],
                            "the pool's size and the memory split come from the start-up log")
    names = {"kv_usage_peak_ratio": any_of("kv_cache_usage_ratio"),
             "device_used_peak_bytes": any_of("gpu_memory_used_bytes", engine_only=False) + " (NVML, DCGM)",
             "device_total_bytes": any_of("gpu_memory_total_bytes", engine_only=False) + " (NVML, DCGM)"}
    missing = [name for key, name in names.items() if not runtime or runtime.get(key) is None]
    if missing:
        return Inconclusive(KV_POOL_UNDERSIZED_ID, missing, "pool pressure and the GPU's headroom are both needed")
    rec = recommend(acc, runtime, cfg)
    pool = [c for c in rec.cases if c["case"] == POOL_TOO_SMALL]
    if not pool:
        if rec.status == "inconclusive":
            return Inconclusive(KV_POOL_UNDERSIZED_ID, rec.missing, "could not judge the pool against the traffic")
        return []
    flag = next((k for k in ("--gpu-memory-utilization", "--mem-fraction-static", "--kv-cache-memory-bytes")
                 if k in rec.settings), None)
    if flag is None:
        return []  # no headroom: kv-cache-pressure says what to do; this diagnosis needs a value to set
    w = _window(runtime, window)
    new_u = rec.settings[flag]
    cur = rec.current.get(flag)
    headroom = runtime["device_total_bytes"] - runtime["device_used_peak_bytes"]
    ev = [Evidence("kv_cache_usage_peak_ratio", runtime["kv_usage_peak_ratio"], None, cfg.full_kv_usage, "ratio", w,
                   "peak KV usage over the window", runtime["kv_usage_peak_ratio"] >= cfg.full_kv_usage),
          Evidence("gpu_memory_free_at_peak_bytes", headroom, None, cfg.margin(runtime["device_total_bytes"]), "bytes", w,
                   "NVML total - peak used", True)]
    if runtime.get("preemptions_total") is not None:
        kvf = (runtime.get("preemptions_by_reason") or {}).get("kv_full")
        ev.append(Evidence("preemptions_total", runtime["preemptions_total"], None, 0.0, "preemptions", w,
                           f"kv_full: {kvf:,.0f}" if kvf is not None else "reason not exported", True))
    out = rec.outcome
    tail = ""
    if out.get("kv_cache_tokens"):
        tail = f" -> {out['kv_cache_tokens']:,} KV tokens"
        if out.get("max_concurrency"):
            tail += f", {out['max_concurrency']:,} sequences of {out['seq_len_tokens']:,.0f} tokens"
    elif out.get("kv_cache_growth_bytes"):
        tail = f" -> the KV pool grows by {out['kv_cache_growth_bytes'] / GiB:.2f} GiB"
    value = f"{new_u:.2f}" if isinstance(new_u, float) else f"{new_u}"
    if flag == "--kv-cache-memory-bytes":
        cur = "unset" if cur is None else f"{cur:.0f}"
    summary = (f"KV pool too small for the traffic ({pool[0]['evidence']}) while {headroom / GiB:.1f} GiB of the GPU "
               f"stayed free at peak: set {flag} {value} (now {cur}){tail}.")
    # the log's own accounting is firmer than metrics alone (the pool's split inferred from the config's labels)
    conf = (0.6 if basis == "log" else 0.5) + 0.1 * sum(1 for e in ev if e.agrees) - (0.1 if rec.missing else 0.0)
    ctx = {"recommendation": rec.to_dict()}
    return [Finding(KV_POOL_UNDERSIZED_ID, Severity.WARNING, min(0.9, conf), summary, None, ev, list(rec.missing), {},
                    context=ctx, basis=basis)]


def detect_startup_oom(accounting, cfg: SizingConfig = SizingConfig()) -> list[Finding] | Inconclusive:
    """The engine failed to start for memory: the value that would have started."""
    acc = _acc(accounting)
    if not acc.has_accounting:
        return Inconclusive(STARTUP_OOM_ID, ["engine start-up log"], "no start-up lines in the log")
    if acc.failure is None:
        return []
    if acc.failure.get("kind") == "oom" and not acc.failure.get("phase"):
        # an OOM message without the start-up lines around it (a pasted traceback): it may as well come
        # from serving; the OOM itself is judged by the log detector (oom-*)
        return Inconclusive(STARTUP_OOM_ID, ["engine start-up log around the OOM"],
                            "an OOM without start-up lines: start-up or run time cannot be told")
    rec = recommend(acc, None, cfg)
    f = acc.failure
    what = {"oom": f"out of memory during {f.get('phase') or 'start-up'}",
            "no-kv-memory": "no memory left for the KV cache blocks",
            "kv-insufficient": "KV pool smaller than one max-length sequence",
            "startup-shortfall": "less free memory than requested"}.get(f["kind"], f["kind"])
    setting = " ".join(f"{k} {v}" for k, v in rec.settings.items())
    summary = f"The engine did not start: {what}" + (f"; {setting} would have started by its own figures." if setting
                                                     else "; the value cannot be computed from this log.")
    ev = []
    if f.get("requested_bytes") is not None and f.get("free_bytes") is not None:
        ev.append(Evidence("oom_shortfall_bytes", max(0.0, f["requested_bytes"] - f["free_bytes"]), None, 0.0, "bytes",
                           None, f"tried {f['requested_bytes'] / MiB:.1f} MiB with {f['free_bytes'] / MiB:.1f} "
                           "MiB free", True))
    if acc.gpu_memory_utilization is not None:
        ev.append(Evidence("gpu_memory_utilization", acc.gpu_memory_utilization, None, None, "ratio", None,
                           "in force at start-up", True))
    conf = 0.9 if setting else 0.6
    ctx = {"recommendation": rec.to_dict(), "failure": dict(f)}
    return [Finding(STARTUP_OOM_ID, Severity.CRITICAL, conf, summary, None, ev,
                    rec.missing if not setting else [], {}, context=ctx, basis="log")]


def judge_log(lines, runtime: dict | None = None, cfg: SizingConfig = SizingConfig()):
    """Both diagnoses from an engine log (a list of lines), for ``diagnose logs`` and the agent.

    The log's own stats lines give the run-time evidence; ``runtime`` (NVML peaks from a recording or
    the sidecar) is merged over it. Returns (accounting, [Finding | Inconclusive, ...]); a diagnosis that
    found nothing adds nothing.
    """
    from ..collectors.enginelog import parse_log
    from .runtime import runtime_from_log_events
    from .startup import parse_startup

    lines = list(lines)
    acc = parse_startup(lines)
    rt = runtime_from_log_events(parse_log(lines), since_line=acc.first_line)
    rt.update(runtime or {})
    return acc, judge_accounting(acc, rt, cfg)


def judge_accounting(acc, runtime: dict | None = None, cfg: SizingConfig = SizingConfig()) -> list:
    """Both diagnoses from a start-up accounting already parsed (``judge_log``, the agent's followed log):
    [Finding | Inconclusive, ...]; a diagnosis that found nothing adds nothing."""
    acc = _acc(acc)
    out: list = []
    judged = [detect_startup_oom(acc, cfg)]
    if acc.failure is None:  # a server that never started has no pool to judge
        judged.append(detect_kv_pool_undersized(acc, runtime or {}, cfg))
    for res in judged:
        out.extend(res if isinstance(res, list) else [res])
    return out


def startup_findings(sources, cfg: SizingConfig = SizingConfig()) -> list[Finding]:
    """``startup-oom`` findings from every source that follows an engine log (objects with ``accounting()``,
    e.g. the agent's :class:`fragscope.collectors.logs.LogCollector`); others are skipped. For the agent's
    judging round: a server that never started exports no metrics, so only its log can say why."""
    out: list[Finding] = []
    for src in sources:
        get = getattr(src, "accounting", None)
        if get is None:
            continue
        res = detect_startup_oom(get(), cfg)
        if isinstance(res, list):
            out.extend(res)
    return out
