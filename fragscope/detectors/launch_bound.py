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

from .. import ids
from ..signals import primary
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, KG, PRESENT, RATE_RANGE, AlertRule, num, quote, sig
from . import common, stats
from .frame import Frame

ID = ids.LAUNCH_BOUND
# A CPU quota running out makes the host late too: that is engine-cpu-starved, not a launch pattern that CUDA
# graphs would fix. Where its signature shows (the throttled share at its Config's bar), the pipeline drops this
# diagnosis's findings and the doubts it had about a GPU.
SUPPRESSED_BY = (ids.ENGINE_CPU_STARVED,)
REQUIRES = ("kernel_gap_seconds|gpu_idle_ratio", "requests_running")
CORROBORATES = ("gpu_utilization_ratio", "preemptions_total", "kv_cache_usage_ratio")
CAPTURE = ("profile",)  # what the agent captures when it fires, to show exactly where (docs/captures.md)


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
    host_wait_gap_s: float = 30e-6  # HTA consecutive_kernel_delay: shorter gaps are kernel waits
    # A GPU under 5 % busy while another GPU of the pod is busy runs none of the engine's kernels (a spare,
    # a stage with nothing to do): a launch-bound engine slows every one of its GPUs alike.
    idle_by_design: float = 0.05


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
    pre = common.preemption_fact(f, sp)
    kv = common.kv_fact(f, sp)
    out = []
    suspects = []
    utils = {g: stats.nanmedian(f.gpu[g]["gpu_utilization_ratio"][stats.mask(f, sp.recent)])
             for g in f.gpus() if "gpu_utilization_ratio" in f.gpu[g]}
    for g in f.gpus():
        sig = f.gpu[g]
        evidence = []
        agree = 0
        util = sig.get("gpu_utilization_ratio")
        u = stats.nanmedian(util[stats.mask(f, sp.recent)]) if util is not None else math.nan
        if math.isfinite(u) and u < cfg.idle_by_design and any(
                v >= cfg.util_low for h, v in utils.items() if h != g and math.isfinite(v)):
            continue  # a GPU doing nothing beside busy peers is not the engine's (a spare): not waiting on the host
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


# --- PromQL: the rule over the last captures, for the alert -----------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """Work present (requests running >= 1 for demand_share of the last 15 min), the GPU waiting (idle share
    >= idle_high or utilization <= util_low) and the kernel gaps wide (p50 >= gap_p50_s, p99 >= gap_p99_s,
    or p50 >= host_wait_gap_s with the idle share high); not while the KV pool preempts (KV pressure, not
    the host: kv-cache-pressure's Config)."""
    from .kv_pressure import Config as KvConfig  # noqa: PLC0415  (the suppressing diagnosis's thresholds)
    kv_cfg = KvConfig()
    look = f"{cfg.sparse_recent_s / 60:.0f}m"  # kernel statistics come every ~10 min: look back further

    def gap(q: str) -> str:
        return f"max by ({KG}) {sig('kernel_gap_seconds', 'last_over_time({})', look, extra='quantile=' + quote(q))}"
    idle = f"max by ({KG}) {sig('gpu_idle_ratio', 'last_over_time({})', look)}"
    util = f"max by ({KG}) {sig('gpu_utilization_ratio', 'avg_over_time({})', PRESENT)}"
    g50, g99 = gap("0.5"), gap("0.99")
    waits = f"(({idle}) >= {num(cfg.idle_high)} or ({util}) <= {num(cfg.util_low)})"
    wide = (f"(({g50}) >= {num(cfg.gap_p50_s)} or ({g99}) >= {num(cfg.gap_p99_s)}"
            f" or (({g50}) >= {num(cfg.host_wait_gap_s)} and on ({KG}) ({idle}) >= {num(cfg.idle_high)}))")
    # "running for a share s of the window" is "the (1 - s) quantile of the batch is >= 1": no subquery
    q = num(round(1 - cfg.demand_share, 12))
    demand = f"max by ({K}) {sig('requests_running', f'quantile_over_time({q}, {{}})', '15m')} >= 1"
    kv = f"max by ({K}) {sig('kv_cache_usage_ratio', 'quantile_over_time(0.9, {})', PRESENT)}"
    pre = f"sum by ({K}) {sig('preemptions_total', 'rate({})', RATE_RANGE)} * 60"
    kv_trouble = f"(({pre}) >= {num(kv_cfg.preempt_per_min)} and on ({K}) ({kv}) >= {num(kv_cfg.kv_high)})"
    expr = f"{waits} and on ({KG}) {wide} and on ({K}) ({demand}) unless on ({K}) {kv_trouble}"
    return AlertRule(
        "FragscopeLaunchBound", ID, expr, "15m", "warning",
        "GPU {{ $labels.gpu }}: GPU waits on the host (launch-bound)",
        f"Requests run while the GPU idles at least {cfg.idle_high * 100:g} % of the kernel span (or utilization "
        f"<= {cfg.util_low * 100:g} %) and kernel gaps are wide (p50 >= {cfg.gap_p50_s * 1e6:g} us or p99 >= "
        f"{cfg.gap_p99_s * 1e3:g} ms), without a KV pool preempting.",
        "The GPU waits on the host between kernels while work is present (kernel-timeline captures).",
        {"idle_high": cfg.idle_high, "util_low": cfg.util_low, "gap_p50_s": cfg.gap_p50_s, "gap_p99_s": cfg.gap_p99_s,
         "host_wait_gap_s": cfg.host_wait_gap_s, "demand_share": cfg.demand_share},
        shown={"demand_share": f"quantile_over_time({num(round(1 - cfg.demand_share, 12))},"})


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    if ctx.get("workload") == "training":
        return ["Capture the training step with CUDA graphs (torch.compile mode='reduce-overhead') or fuse "
                "small kernels, and check the data loader / host CPU is not the bottleneck."]
    return ["Remove --enforce-eager if set (CUDA graphs), and check the container's CPU throttling."]


PLAYBOOK = Playbook(
    ID, "Host-bound kernel launches",
    "Requests are running but the GPU waits on the CPU between kernels.",
    ["Check the engine's CPU: is the container throttled (cgroup cpu.stat) or pinned to too few cores?"],
    [Action("Use CUDA graphs: remove --enforce-eager (vLLM captures decode graphs by default).",
            ["the model and its batch sizes are graph-capturable", "a serving engine (vLLM), not a training job"],
            ["graph capture needs extra GPU memory (logged 'Graph capturing finished ... took X GiB'): "
             "check headroom first"]),
     Action("Give the engine more CPU: raise the CPU limit/request, avoid CPU throttling, pin threads.", [], []),
     Action("Increase the batch so each launch does more work (vLLM --max-num-seqs / --max-num-batched-tokens, "
            "SGLang --max-running-requests / --chunked-prefill-size; a training loop: the batch size).",
            ["KV headroom (no preemptions)"], ["latency-sensitive traffic: larger batches raise ITL"]),
     Action("Fuse small kernels (torch.compile, fused ops) to cut launch count.", [], [])],
    ["kernel gap p50 back to tens of µs; GPU idle share < 10 %; utilization up at the same traffic"],
    ["HTA idle time and kernel launch statistics"])


ALSO_FROM = ("trace",)
RUNS_ON_SHORT_WINDOWS = True  # its evidence is level already: work waiting while the GPU idles between kernels
