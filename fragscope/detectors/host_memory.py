"""host-memory-pressure: the engine's container near its memory limit (its working set, what the kernel
cannot reclaim), processes in it killed by the kernel's OOM killer, or the host itself short of memory
and swapping.

Mechanism: a cgroup's memory limit is enforced by the kernel: once the working set (usage minus
inactive page cache, which the kernel reclaims first) reaches the limit and nothing can be reclaimed, the
OOM killer ends a process of the cgroup (cgroup-v2.rst "memory.max"; cgroup-v1/memory.rst). For an LLM
server the host memory is held by the weights being loaded, vLLM's CPU swap space for preempted
sequences (``--swap-space``, GiB per GPU), CPU offload (``--cpu-offload-gb``), pinned transfer buffers
and tokenizer / multimodal caches; the engine dies with no CUDA error and restarts (counters reset),
or the host swaps and every step slows. Told apart from a GPU out-of-memory: the GPU pool is not what ran
out, and the kill comes from the kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..advice.jobtext import only
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig as psig
from ..signals import any_of
from ..units import finite_or_none as _f, fmt_bytes
from . import stats
from .frame import Frame
from .host_common import gauge, increase, judged_span

ID = ids.HOST_MEMORY_PRESSURE
REQUIRES = ("container_memory_working_set_bytes|host_memory_available_bytes|container_oom_kills_total",)
CORROBORATES = ("container_memory_limit_bytes", "container_memory_swap_bytes", "host_memory_total_bytes",
                "host_swap_in_bytes_total", "host_swap_out_bytes_total", "process_resident_memory_bytes")


@dataclass(frozen=True)
class Config:
    # The working set at 90 % of the limit leaves the engine one burst (a batch of long prompts, a
    # multimodal cache fill) from the OOM killer; 97 %: the kernel is reclaiming its last page cache.
    limit_ratio: float = 0.90
    critical_ratio: float = 0.97
    # The host: MemAvailable below 5 % of MemTotal (the kernel's own estimate of what can be had
    # without swapping); the kubelet's default eviction threshold is far lower (memory.available<100Mi).
    host_available_ratio: float = 0.05
    # Swap traffic of >= 1 MiB/s sustained: the working set no longer fits in RAM.
    swap_bytes_per_s: float = 1024.0 * 1024.0


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    have = [s for s in ("container_memory_working_set_bytes", "host_memory_available_bytes")
            if f.has_engine(s)] + [s for s in ("container_oom_kills_total",) if s in f.engine_cum]
    if not have:
        return Inconclusive(ID, [any_of("container_memory_working_set_bytes"),
                                 any_of("host_memory_available_bytes")],
                            "neither the engine container's memory nor the host's is collected")
    span = judged_span(f)
    ev: list[Evidence] = []
    parts: list[str] = []
    sev = None
    agree = 0
    # the kernel's OOM killer, in the whole window (a kill is the incident, whenever in the window)
    kills, _ = increase(f, "container_oom_kills_total", (f.start, f.end))
    lifetime = f.engine_total.get("container_oom_kills_total", math.nan)
    if math.isfinite(kills) and kills > 0:
        ev.append(Evidence("container_oom_kills_total", kills, 0.0, 0.0, "kills", (f.start, f.end),
                           "processes killed by the kernel's OOM killer in the engine's cgroup", True))
        parts.append(f"the kernel's OOM killer ended {kills:.0f} process{'es' if kills != 1 else ''} in the "
                     "engine's container")
        sev = Severity.CRITICAL
        agree += 2
    elif math.isfinite(lifetime) and lifetime > 0:
        # killed before this window (or one scrape): the container's count since it started
        ev.append(Evidence("container_oom_kills_total", lifetime, None, 0.0, "kills", (f.start, f.end),
                           "since the container started, none in this window", True))
        parts.append(f"the kernel's OOM killer ended {lifetime:.0f} process{'es' if lifetime != 1 else ''} in the "
                     "engine's container since it started (before this window)")
        sev = Severity.WARNING
        agree += 1
    # per sample: the working set against the limit in force at that moment (a container moved to another
    # cgroup, or a limit changed, must not pair one's working set with the other's limit)
    ws, limit, ratio = math.nan, math.nan, math.nan
    wsx, limx = f.engine.get("container_memory_working_set_bytes"), f.engine.get("container_memory_limit_bytes")
    if wsx is not None and limx is not None:
        m = stats.mask(f, span) & np.isfinite(wsx) & np.isfinite(limx) & (np.nan_to_num(limx) > 0)  # cAdvisor: 0 = none
        if m.any():
            r = wsx[m] / limx[m]
            k = int(np.argmax(r))
            ratio, ws, limit = float(r[k]), float(wsx[m][k]), float(limx[m][k])
    if math.isfinite(ratio):
        near = ratio >= cfg.limit_ratio
        ev.append(Evidence("container_memory_working_set_ratio", ratio, None, cfg.limit_ratio, "ratio", span,
                           f"{fmt_bytes(ws)} of a {fmt_bytes(limit)} limit", near))
        if near:
            agree += 1
            parts.append(f"its working set is {fmt_bytes(ws)}, {ratio * 100:.0f} % of its {fmt_bytes(limit)} limit")
            s = Severity.CRITICAL if ratio >= cfg.critical_ratio else Severity.WARNING
            sev = s if sev is None or s.rank > sev.rank else sev
            if f.end - f.start >= 30 * 60.0:
                x = f.engine["container_memory_working_set_bytes"]
                slope, _ = stats.slope_per_hour(f, x, stats.spans(f).recent)
                if math.isfinite(slope) and slope > 0 and ratio < 1:
                    mins = (limit - ws) / slope * 60.0
                    parts.append(f"growing {fmt_bytes(slope)}/h: the limit in ~{mins:.0f} min")
    avail = gauge(f, "host_memory_available_bytes", span, "min")
    total = gauge(f, "host_memory_total_bytes", span, "max")
    if math.isfinite(avail) and math.isfinite(total) and total > 0:
        share = avail / total
        low = share <= cfg.host_available_ratio
        ev.append(Evidence("host_memory_available_ratio", share, None, cfg.host_available_ratio, "ratio", span,
                           f"{fmt_bytes(avail)} of {fmt_bytes(total)} available", low))
        if low:
            agree += 1
            parts.append(f"the host has {fmt_bytes(avail)} ({share * 100:.1f} %) of its memory available")
            sev = sev or Severity.WARNING
    swap = math.nan
    sin, dt = increase(f, "host_swap_in_bytes_total", span)
    sout, _ = increase(f, "host_swap_out_bytes_total", span)
    if math.isfinite(sin) and math.isfinite(sout) and dt > 0:
        swap = (sin + sout) / dt
        swapping = swap >= cfg.swap_bytes_per_s
        ev.append(Evidence("host_swap_bytes_per_second", swap, None, cfg.swap_bytes_per_s, "bytes/s", span,
                           "pages swapped in and out", swapping))
        if swapping:
            agree += 1
            parts.append(f"the host swaps {fmt_bytes(swap)}/s")
            if sev is not None and sev is Severity.WARNING and (ratio >= cfg.limit_ratio or
                                                               (math.isfinite(avail) and avail / total <= cfg.host_available_ratio)):
                sev = Severity.CRITICAL
    if sev is None:
        return []
    rss = gauge(f, "process_resident_memory_bytes", span, "max")
    if math.isfinite(rss):
        ev.append(Evidence("process_resident_memory_bytes", rss, None, None, "bytes", span,
                           "the engine processes' resident memory", True))
    summary = "Host memory pressure: " + "; ".join(parts) + "."
    missing = []
    if not math.isfinite(ratio) and f.has_engine("container_memory_working_set_bytes"):
        missing.append("container memory limit (none set, or not collected)")
    conf = stats.confidence(agree, base=0.4)
    ctx = {"working_set_bytes": ws, "limit_bytes": limit, "ratio": ratio, "oom_kills": kills,
           "host_available_bytes": avail, "swap_bytes_per_second": swap, "rss_bytes": rss}
    return [Finding(ID, sev, conf, summary, None, ev, missing, {}, context=ctx)]


# --- PromQL: the limit rule, for the alert --------------------------------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """The engine container's working set at limit_ratio of its memory limit, or the kernel's OOM killer
    at work in it."""
    expr = ("max by (namespace, pod) (fragscope_container_memory_working_set_bytes)"
            f" / (max by (namespace, pod) (fragscope_container_memory_limit_bytes) > 0) > {num(cfg.limit_ratio)}"
            " or sum by (namespace, pod) (increase(fragscope_container_oom_kills_total[10m])) > 0")
    return AlertRule(
        "FragscopeHostMemoryPressure", ID, expr, "5m", "warning",
        "engine container near its memory limit or OOM-killed",
        f"The engine's working set is over {cfg.limit_ratio * 100:g} % of its container memory limit, or the kernel "
        "OOM-killed a process in it: lower --swap-space / CPU offload or raise the limit.",
        f"The engine container's working set at {cfg.limit_ratio * 100:g} % of its memory limit, or the kernel's "
        "OOM killer at work in it.",
        {"limit_ratio": cfg.limit_ratio})


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """Working set at >= 90 % of the container's memory limit (value: the share of the limit).

    A limit of 0 (cAdvisor's "no limit") never trips; OOM kills are left to the alert and the deep fetch."""
    ws = f"max by ({K}) {psig('container_memory_working_set_bytes', 'max_over_time({})', present, m)}"
    limit = f"max by ({K}) {psig('container_memory_limit_bytes', 'min_over_time({})', present, m)}"
    return f"(({ws}) / (({limit}) > 0)) >= {num(cfg.limit_ratio)}"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("container_working_set_of_limit_ratio", "max_over_time", triage_check, "working_set_of_limit_ratio")


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    acts = []
    if ctx.get("ray_kill"):  # from an engine log: Ray's memory monitor, not the kernel (detectors/log_crash.py)
        th = _f(ctx.get("threshold_ratio"))
        acts.append("Ray's memory monitor killed the worker" + (f" at {th:g} of the node's memory" if th else "")
                    + " (RAY_memory_usage_threshold): give the node more memory or shrink what the workers hold in "
                      "host memory"
                    + (" (vLLM --swap-space, --cpu-offload-gb)" if ctx.get("job_kind") in (None, "vllm", "unknown")
                       else "")
                    + "; a higher threshold only hands the kill to the kernel's OOM killer.")
    ws, lim = _f(ctx.get("working_set_bytes")), _f(ctx.get("limit_bytes"))
    if ws is not None and lim is not None and lim > 0:
        acts.append(f"Raise the container's memory limit above {fmt_bytes(ws * 1.25)} (working set "
                    f"{fmt_bytes(ws)} of {fmt_bytes(lim)}), or shrink what the engine holds in host memory.")
    kills = _f(ctx.get("oom_kills"))
    if kills:
        acts.append(f"The kernel OOM-killed {kills:.0f} process(es): the restart was the kernel's, not CUDA's "
                    "(kubectl describe pod shows OOMKilled).")
    return acts


PLAYBOOK = Playbook(
    ID, "Host memory pressure",
    "The engine's container is near its memory limit, the kernel's OOM killer ended a process in it, or the "
    "host is short of memory and swapping: the engine dies without a CUDA error, or every step slows.",
    ["If OOM kills happened: raise the container's memory limit and roll the pod; the engine will be killed "
     "again at the same point otherwise."],
    [Action(only("Shrink vLLM's CPU swap space: --swap-space (GiB per GPU of host memory kept for preempted "
                 "sequences; default 4) or 0 where preemption by recompute suffices.", "vllm"),
            ["the engine is vLLM with --swap-space set above what the limit allows"],
            ["workloads with many parallel samples (n > 1, beam search) rely on swapping"]),
     Action(only("Turn off or shrink vLLM's CPU offload (--cpu-offload-gb) and multimodal processor caches "
                 "(--mm-processor-cache-gb).", "vllm"),
            ["those options are set"],
            ["the model fits on the GPU only with offload: give the container memory instead"]),
     Action("Raise the container's memory limit to the measured working set plus 25 %.",
            ["the node has the memory"], ["nodes packed to their allocatable memory"])],
    ["working set below 80 % of the limit at peak; no new OOM kills (container_oom_events_total flat)",
     "no swap traffic on the host"],
    ["Linux kernel docs: admin-guide/cgroup-v2.rst (memory.max, memory.events oom_kill)",
     "Kubernetes docs: node-pressure eviction (working set)", only("vLLM engine arguments: --swap-space, "
                                                                   "--cpu-offload-gb", "vllm")])


ALSO_FROM = ("log",)  # Ray's memory monitor killing a worker, read from an engine log (detectors/log_crash.py)
RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
