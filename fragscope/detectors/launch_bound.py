"""launch-bound: the GPU waits on the host. Work is queued or running, yet the GPU idles between
kernels: low utilization / high idle share, wide kernel gaps (hundreds of µs median, ms at p99),
with memory healthy and no preemptions.

Mechanism: each decode step launches many small kernels from Python; without CUDA graphs
(``--enforce-eager``) or with a starved CPU the launch cost (5-20 µs each, HTA) and scheduler
overhead dominate, so kernels arrive late and the GPU sits idle.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..signals import primary
from ..model import Evidence, Finding, Inconclusive, Severity
from . import common, stats
from .frame import Frame
from .host_common import throttled_share

ID = "launch-bound"
CPU_THROTTLED_SHARE = 0.25  # cpu_starved.Config.throttled_share
REQUIRES = ("kernel_gap_seconds|gpu_idle_ratio", "requests_running")
CORROBORATES = ("gpu_utilization_ratio", "preemptions_total", "kv_cache_usage_ratio")


@dataclass(frozen=True)
class Config:
    util_low: float = 0.60  # the GPU runs a kernel < 60 % of the time while work is waiting
    idle_high: float = 0.30  # HTA temporal breakdown: idle >= 30 % of the kernel span
    # HTA launch_delay_cutoff = 100 µs; the issue's launch-bound signature is "hundreds of µs
    # median, milliseconds at p99". Healthy CUDA-graph decode shows gaps of a few µs to ~50 µs.
    gap_p50_s: float = 100e-6
    gap_p99_s: float = 1e-3
    demand_share: float = 0.8  # requests running >= 1 for 80 % of the recent window
    sparse_recent_s: float = 45 * 60.0  # kernel stats come every ~10 min: look back further
    warning_gap_p50_s: float = 200e-6
    host_wait_gap_s: float = 30e-6  # HTA consecutive_kernel_delay: shorter gaps are kernel waits


def _recent_sparse(f: Frame, x: np.ndarray, span_s: float) -> float:
    m = f.t >= f.end - span_s
    return stats.nanmedian(x[m])


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    has_kernel = f.any_gpu_has("kernel_gap_p50_seconds") or f.any_gpu_has("gpu_idle_ratio")
    has_util = f.any_gpu_has("gpu_utilization_ratio")
    if not has_kernel and not has_util:
        return Inconclusive(ID, ["fragscope_kernel_gap_seconds", "fragscope_gpu_idle_ratio",
                                 "gpu utilization"], "no kernel-timeline or utilization signal")
    if not f.has_engine("requests_running"):
        return Inconclusive(ID, [primary("requests_running")],
                            "cannot tell an idle server from a host-bound one without the running batch")
    sp = stats.spans(f)
    run = f.engine["requests_running"]
    demand = stats.share_true(f, np.nan_to_num(run) >= 1, sp.recent, np.isfinite(run))
    if not math.isfinite(demand) or demand < cfg.demand_share:
        return []  # an idle GPU with nothing to do is not launch-bound
    # A CPU quota running out makes the host late too: that is engine-cpu-starved, not a launch pattern that
    # CUDA graphs would fix (its throttling bar: kubernetes-mixin's 25 % of periods)
    thr = throttled_share(f)
    if math.isfinite(thr) and thr >= CPU_THROTTLED_SHARE:
        return []
    pre = common.preemption_fact(f, sp)
    kv = common.kv_fact(f, sp)
    out = []
    suspects = []
    for g in f.gpus():
        sig = f.gpu[g]
        evidence = []
        agree = 0
        util = sig.get("gpu_utilization_ratio")
        u = stats.nanmedian(util[stats.mask(f, sp.recent)]) if util is not None else math.nan
        low_util = math.isfinite(u) and u <= cfg.util_low
        if math.isfinite(u):
            evidence.append(Evidence("gpu_utilization_ratio", u, None, cfg.util_low, "ratio", sp.recent,
                                     "GPU idle while requests run" if low_util else "", low_util))
            agree += low_util
        idle = sig.get("gpu_idle_ratio")
        i = _recent_sparse(f, idle, cfg.sparse_recent_s) if idle is not None else math.nan
        idle_hi = math.isfinite(i) and i >= cfg.idle_high
        if math.isfinite(i):
            evidence.append(Evidence("gpu_idle_ratio", i, None, cfg.idle_high, "ratio",
                                     (f.end - cfg.sparse_recent_s, f.end), "from kernel-timeline captures", idle_hi))
            agree += idle_hi
        p50 = sig.get("kernel_gap_p50_seconds")
        p99 = sig.get("kernel_gap_p99_seconds")
        g50 = _recent_sparse(f, p50, cfg.sparse_recent_s) if p50 is not None else math.nan
        g99 = _recent_sparse(f, p99, cfg.sparse_recent_s) if p99 is not None else math.nan
        wide50 = math.isfinite(g50) and g50 >= cfg.gap_p50_s
        wide99 = math.isfinite(g99) and g99 >= cfg.gap_p99_s
        if math.isfinite(g50):
            evidence.append(Evidence("kernel_gap_p50_seconds", g50, None, cfg.gap_p50_s, "seconds",
                                     (f.end - cfg.sparse_recent_s, f.end), "", wide50))
            agree += wide50
        if math.isfinite(g99):
            evidence.append(Evidence("kernel_gap_p99_seconds", g99, None, cfg.gap_p99_s, "seconds",
                                     (f.end - cfg.sparse_recent_s, f.end), "", wide99))
            agree += wide99
        gpu_waits = low_util or idle_hi
        if not gpu_waits:
            continue
        if not (math.isfinite(g50) or math.isfinite(i)):
            suspects.append(g)  # low utilization with work to do, but no timeline to prove why
            continue
        if math.isfinite(g50) or math.isfinite(g99):
            # with a timeline, the gaps decide: idle time made of short gaps is a GPU without work
            # between steps, not a host that launches late
            # HTA counts a gap >= 30 µs (consecutive_kernel_delay) as the GPU waiting on the host,
            # not on the previous kernel: a large idle share made of such gaps is host-bound too
            host_gaps = math.isfinite(g50) and g50 >= cfg.host_wait_gap_s and idle_hi
            if not (wide50 or wide99 or host_gaps):
                continue
        elif not (idle_hi and (low_util or not math.isfinite(u))):
            continue
        # contrary: memory or KV trouble explains idle gaps differently
        against = 0
        if pre.present:
            evidence.append(Evidence("preemptions_per_minute", pre.value, None, 1.0, "/min", sp.recent,
                                     "preemptions: KV pressure, not the host", False))
            against += 1
        if kv.present:
            against += 1
        if common.any_frag_rising(f, sp):
            evidence.append(Evidence("torch_fragmentation_ratio", None, None, None, "ratio", sp.recent,
                                     "allocator fragmentation rising", False))
            against += 1
        if against >= 2:
            continue
        evidence.append(Evidence("requests_running", stats.nanmedian(run[stats.mask(f, sp.recent)]), None, 1.0,
                                 "requests", sp.recent, f"work present {demand * 100:.0f} % of the time", True))
        agree += 1
        sev = Severity.WARNING if (agree >= 3 and (wide50 or wide99)) else Severity.INFO
        conf = stats.confidence(agree, base=0.35, against=against)
        onset_x = util if util is not None else None
        onset = None
        if onset_x is not None:
            onset = stats.onset_time(f, -onset_x, -cfg.util_low, 1)
        summary = f"GPU {g}: the GPU waits on the host:"
        bits = []
        if math.isfinite(u):
            bits.append(f"utilization {u * 100:.0f} %")
        if math.isfinite(i):
            bits.append(f"idle {i * 100:.0f} % of the kernel span")
        if math.isfinite(g50):
            bits.append(f"kernel gaps p50 {common.fmt_seconds(g50)}" +
                        (f", p99 {common.fmt_seconds(g99)}" if math.isfinite(g99) else ""))
        summary += " " + ", ".join(bits) + " while requests run; no preemptions, memory healthy."
        missing = [m for m, have in (("fragscope_kernel_gap_seconds", math.isfinite(g50)),
                                     ("fragscope_gpu_idle_ratio", math.isfinite(i)),
                                     ("gpu utilization", math.isfinite(u))) if not have]
        ctx = {"gap_p50_s": g50, "gap_p99_s": g99, "util": u, "idle": i}
        out.append(Finding(ID, sev, conf, summary, onset, evidence, missing, {"gpu": g}, context=ctx))
    if not out and suspects:
        return Inconclusive(ID, ["fragscope_kernel_gap_seconds", "fragscope_gpu_idle_ratio"],
                            f"GPU {', '.join(suspects)} utilization is low while requests run; a kernel "
                            "timeline (diagnose trace, or the agent's periodic captures) would say whether "
                            "the host is the bottleneck", {"gpu": ",".join(suspects)})
    return out
