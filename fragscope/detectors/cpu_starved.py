"""engine-cpu-starved: the engine's container runs out of its CPU quota (CFS throttling), or its threads
wait for a CPU as long as they run, while requests are being served; the serving symptoms (a queue,
inter-token latency or TTFT up, throughput down, the GPU idle between kernels) say it costs tokens.

Mechanism: with a CPU limit the kernel's CFS bandwidth control gives the cgroup ``quota`` µs of CPU per
``period`` (100 ms); once spent, every thread of the container waits for the next period (kernel docs
scheduler/sched-bwc.rst). An LLM server's scheduler, tokenizer, detokenizer and kernel-launch loop are
CPU work on the critical path of every step: throttled, each step waits tens of ms and the GPU idles,
which from the GPU side looks like a launch-bound engine. Told apart by the throttling counters: a
launch-bound engine with CPU to spare is not CPU-starved, and a starved one is not reported launch-bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig as psig
from ..signals import any_of, primary
from ..units import finite_or_none as _f
from . import common, stats
from .frame import Frame
from .host_common import gauge, increase, judged_span, runqueue_share, throttled_share

ID = ids.ENGINE_CPU_STARVED
REQUIRES = ("container_cpu_throttled_periods_total|process_runqueue_wait_seconds_total", "requests_running")
CORROBORATES = ("container_cpu_periods_total", "container_cpu_quota_cores", "container_cpu_throttled_seconds_total",
                "requests_waiting", "inter_token_latency_seconds", "ttft_seconds", "generation_tokens_total",
                "gpu_utilization_ratio", "process_cpu_seconds_total")


@dataclass(frozen=True)
class Config:
    # kubernetes-mixin's CPUThrottlingHigh alert: more than 25 % of a container's CFS periods throttled
    # (increase(container_cpu_cfs_throttled_periods_total) / increase(container_cpu_cfs_periods_total) > 0.25)
    throttled_share: float = 0.25
    # Half or more of the periods throttled: the container needs about twice its quota.
    critical_share: float = 0.50
    # Run-queue delay (schedstat): the engine's threads wait for a CPU as long as they run. Alone (no quota,
    # a crowded node) it needs a serving symptom too: a busy shared host shows some wait by design.
    runqueue_share: float = 0.50
    work_share: float = 0.5  # requests running (or waiting) for most of the judged span
    latency_rise: float = 1.3  # inter-token latency / TTFT >= 1.3x its baseline
    util_low: float = 0.60  # the GPU idles while work waits (launch-bound's bar)
    # A quota lifted shows at once in the newest CFS periods: when the latest clear_window_s (150 periods
    # of 100 ms; at least two scrape steps) were throttled in under cleared_share of their periods, or
    # counted no period (bandwidth control off), the present is not starved, whatever the minute says.
    clear_window_s: float = 15.0
    cleared_share: float = 0.05


def _work(f: Frame, span) -> float:
    run = f.engine.get("requests_running")
    wait = f.engine.get("requests_waiting")
    if run is None:
        return math.nan
    tot = np.nan_to_num(run) + (np.nan_to_num(wait) if wait is not None else 0.0)
    return stats.share_true(f, tot >= 1, span, np.isfinite(run))


def latest_unthrottled(f: Frame, span, cfg: Config = Config()) -> bool:
    """The quota no longer bites now: in the newest clear_window_s of ``span`` (at least two scrape steps)
    under cleared_share of the CFS periods were throttled, or no period elapsed at all (the kernel counts
    periods only while bandwidth control is on: a quota lifted to -1 / "max" stops the count)."""
    w = max(cfg.clear_window_s, 2 * f.step)
    if span[1] - span[0] <= w:
        return False
    latest = (span[1] - w, span[1])
    per, _ = increase(f, "container_cpu_periods_total", latest)
    if not math.isfinite(per):
        return False
    if per <= 0:  # the raw counter, not the grid, must confirm it: two scrapes without a new period
        return f.flat_samples.get("container_cpu_periods_total", 0) >= 2
    now = throttled_share(f, latest)
    return math.isfinite(now) and now < cfg.cleared_share


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    have_thr = "container_cpu_throttled_periods_total" in f.engine_cum
    have_rq = "process_runqueue_wait_seconds_total" in f.engine_cum
    if not (have_thr or have_rq):
        return Inconclusive(ID, [any_of("container_cpu_throttled_periods_total"),
                                 primary("process_runqueue_wait_seconds_total")],
                            "neither the engine container's CPU throttling nor its threads' run-queue delay is collected")
    if not f.has_engine("requests_running"):
        return Inconclusive(ID, [any_of("requests_running")], "cannot tell whether the engine was serving")
    span = judged_span(f)
    share = throttled_share(f, span)
    rq = runqueue_share(f, span)
    if not math.isfinite(share) and not math.isfinite(rq):
        return Inconclusive(ID, [], "CPU counters have fewer than two samples in the judged span (rates need two)")
    work = _work(f, span)
    if not math.isfinite(work) or work < cfg.work_share:
        return []  # an idle engine throttled (model loading, warm-up) does not starve serving
    throttled = math.isfinite(share) and share >= cfg.throttled_share
    if throttled and latest_unthrottled(f, span, cfg):
        throttled = False
    queued_cpu = math.isfinite(rq) and rq >= cfg.runqueue_share
    if not throttled and not queued_cpu:
        return []
    ev: list[Evidence] = []
    agree = 0
    thr_s, dt = increase(f, "container_cpu_throttled_seconds_total", span)
    quota = gauge(f, "container_cpu_quota_cores", span)
    if math.isfinite(share):
        note = f"{share * 100:.0f} % of CFS periods throttled"
        if math.isfinite(thr_s) and dt > 0:
            note += f"; {thr_s / dt:.2f} s of CPU time lost per second"
        ev.append(Evidence("container_cpu_throttled_ratio", share, None, cfg.throttled_share, "ratio", span, note,
                           throttled))
        agree += throttled
    if math.isfinite(rq):
        ev.append(Evidence("process_runqueue_wait_ratio", rq, None, cfg.runqueue_share, "ratio", span,
                           "engine threads' runnable time spent waiting for a CPU (schedstat)", queued_cpu))
        agree += queued_cpu
    # serving symptoms
    symptoms = []
    wait = gauge(f, "requests_waiting", span)
    if math.isfinite(wait):
        q = wait >= 1
        ev.append(Evidence("requests_waiting", wait, None, 1.0, "requests", span, "queued", q))
        if q:
            symptoms.append(f"{wait:.0f} requests waiting")
    long = f.end - f.start >= 30 * 60.0
    if long:
        sp = stats.spans(f)
        for sig, what in (("inter_token_latency_seconds_mean", "mean inter-token latency"),
                          ("ttft_p50_seconds", "TTFT p50")):
            x = f.engine.get(sig)
            if x is None or not np.isfinite(x).any():
                continue
            ch = stats.change(f, x, sp, floor_rel=0.05)
            if ch.known and ch.baseline > 0:
                up = ch.recent >= cfg.latency_rise * ch.baseline
                ev.append(Evidence(sig, ch.recent, ch.baseline, cfg.latency_rise * ch.baseline, "seconds", sp.recent,
                                   f"×{ch.recent / ch.baseline:.1f} vs baseline", up))
                if up:
                    symptoms.append(f"{what} {common.fmt_seconds(ch.baseline)} → {common.fmt_seconds(ch.recent)}")
        tput = common.throughput_fact(f, sp)
        if tput.evidence is not None:
            ev.append(tput.evidence)
            if tput.present:
                symptoms.append(f"throughput {tput.evidence.baseline:.0f} → {tput.evidence.observed:.0f} tok/s")
    util = [stats.nanmedian(f.gpu[g]["gpu_utilization_ratio"][stats.mask(f, span)])
            for g in f.gpus() if "gpu_utilization_ratio" in f.gpu[g]]
    util = [u for u in util if math.isfinite(u)]
    if util:
        u = float(np.mean(util))
        low = u <= cfg.util_low
        ev.append(Evidence("gpu_utilization_ratio", u, None, cfg.util_low, "ratio", span,
                           "the GPU waits for the host" if low else "", low))
        if low:
            symptoms.append(f"GPU utilization {u * 100:.0f} %")
    if not throttled and not symptoms:
        return []  # run-queue delay alone on a shared host, with serving unharmed: not a diagnosis
    agree += min(2, len(symptoms))
    if throttled and math.isfinite(share) and share >= cfg.critical_share and symptoms:
        sev = Severity.CRITICAL
    else:
        sev = Severity.WARNING
    conf = stats.confidence(agree, base=0.4)
    if throttled:
        head = f"The engine's container was throttled in {share * 100:.0f} % of its CPU periods"
        if math.isfinite(quota):
            head += f" (quota {quota:.2f} cores)"
        if math.isfinite(thr_s) and dt > 0:
            head += f", losing {thr_s / dt:.2f} s of CPU per second"
    else:
        head = (f"The engine's threads waited for a CPU {rq * 100:.0f} % of their runnable time "
                "(no CPU quota throttling: the node's CPUs are contended)")
    summary = head + (" while requests ran" if not symptoms else "; " + ", ".join(symptoms)) + "."
    missing = []
    if not math.isfinite(share):
        missing.append(any_of("container_cpu_throttled_periods_total"))
    if not util:
        missing.append("gpu utilization")
    ctx = {"throttled_ratio": share, "runqueue_ratio": rq, "quota_cores": quota,
           "throttled_seconds_per_second": thr_s / dt if math.isfinite(thr_s) and dt > 0 else math.nan,
           "symptoms": symptoms}
    return [Finding(ID, sev, conf, summary, None, ev, missing, {}, context=ctx)]


# --- PromQL: the throttling rule, for the alert -------------------------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """The engine container throttled in more than throttled_share of its CFS periods (fragscope's process
    collector, else cAdvisor's counters of the pod's containers) while requests are in flight."""
    running = f"sum by ({K}) {psig('requests_running', '{}', None)}"
    expr = (f"""(
  sum by (namespace, pod) (rate(fragscope_container_cpu_throttled_periods_total[5m]))
  / (sum by (namespace, pod) (rate(fragscope_container_cpu_periods_total[5m])) > 0)
  or
  sum by (namespace, pod) (rate(container_cpu_cfs_throttled_periods_total{{container!=""}}[5m]))
  / (sum by (namespace, pod) (rate(container_cpu_cfs_periods_total{{container!=""}}[5m])) > 0)
) > {num(cfg.throttled_share)}
and on (namespace, pod) ({running}) >= 1""").replace("\n", " ")
    return AlertRule(
        "FragscopeEngineCpuStarved", ID, expr, "10m", "warning",
        "engine CPU-throttled in {{ $value | humanizePercentage }} of periods",
        "The engine's container runs out of its CPU quota while serving: raise or remove the CPU limit "
        "(requests = limits, whole cores).",
        f"The engine container throttled in more than {cfg.throttled_share * 100:g} % of its CFS periods "
        "(kubernetes-mixin CPUThrottlingHigh) while requests are in flight; fragscope's process collector, "
        "else cAdvisor's container_cpu_cfs_* counters of the pod.",
        {"throttled_share": cfg.throttled_share})


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """A container of the target throttled in >= 25 % of its CFS periods while requests run (value: the share).

    Each container's throttled periods over its periods (fragscope's collector, else cAdvisor's
    container_cpu_cfs_* counters; the pause container left out), the most throttled one of the target;
    a container without a CPU limit has no CFS periods and never trips."""
    thr = psig("container_cpu_throttled_periods_total", "rate({})", rate, m, extra='container!="POD"')
    per = psig("container_cpu_periods_total", "rate({})", rate, m, extra='container!="POD"')
    running = f"max by ({K}) {psig('requests_running', 'max_over_time({})', present, m)}"
    return (f"(max by ({K}) ({thr} / ({per} > 0)) >= {num(cfg.throttled_share)})"
            f" and on ({K}) (({running}) >= 1)")


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("cpu_throttled_periods_ratio", "max_over_time", triage_check, "throttled_periods_ratio")



# --- signature: what keeps the diagnoses it suppresses quiet (their SUPPRESSED_BY) -----------------------
def signature(f: Frame, sp: stats.Spans, cfg: Config = Config()) -> bool:
    """The container ran out of its CPU quota in at least ``throttled_share`` of its CFS periods over the judged
    span: the host is late for want of CPU, whatever the GPU shows."""
    thr = throttled_share(f)
    return math.isfinite(thr) and thr >= cfg.throttled_share

# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    acts = []
    share, quota = _f(ctx.get("throttled_ratio")), _f(ctx.get("quota_cores"))
    lost = _f(ctx.get("throttled_seconds_per_second"))
    if share is not None and share > 0 and quota is not None:
        # each throttled period ran the quota out: at least the quota plus what the throttling took
        need = quota + (lost or 0.0)
        whole = max(1, math.ceil(need * 1.25))
        acts.append(f"Raise the engine container's CPU limit from {quota:.2f} to at least {whole} cores "
                    f"({share * 100:.0f} % of periods throttled, {lost or 0:.2f} s of CPU lost per second), or "
                    "remove the limit and keep the request.")
    elif share is not None and share > 0:
        acts.append(f"Raise or remove the engine container's CPU limit ({share * 100:.0f} % of periods throttled).")
    rq = _f(ctx.get("runqueue_ratio"))
    if (share is None or share == 0) and rq is not None:
        acts.append(f"The engine's threads wait for a CPU {rq * 100:.0f} % of their runnable time without a quota: "
                    "give the pod dedicated cores (requests = limits, whole cores, static CPU manager) or move "
                    "CPU-heavy neighbours off the node.")
    return acts


PLAYBOOK = Playbook(
    ID, "Engine starved of CPU",
    "The engine's container runs out of its CPU quota (or waits for a CPU): its scheduler, tokenizer and "
    "kernel-launch loop stall every step, so requests queue, inter-token latency and TTFT rise and the "
    "GPU idles between kernels, though nothing on the GPU is wrong.",
    ["Raise or remove the container's CPU limit (kubectl edit / the chart's resources.limits.cpu) and "
     "roll the pod; the throttled share should fall to ~0 at once.",
     "If the limit cannot change now: route traffic away from this replica until it can."],
    [Action("Give the engine whole cores: resources.requests.cpu = resources.limits.cpu as an integer, so "
            "the kubelet's static CPU manager pins exclusive cores (Guaranteed QoS).",
            ["the node's kubelet runs --cpu-manager-policy=static",
             "the node has that many whole cores to spare"],
            ["a best-effort or burstable pod shared with other workloads: pinning takes cores from them"]),
     Action("Remove the CPU limit and keep a CPU request sized to the measured usage (CFS quota throttles "
            "bursts even when the average is under the limit).",
            ["the namespace has no LimitRange forcing a limit", "the node is not oversubscribed"],
            ["multi-tenant nodes where a limit is a contract"]),
     Action("Fewer CPU-hungry threads in the engine: set OMP_NUM_THREADS / torch threads to the cores the "
            "container has (PyTorch sizes its pools from the host's CPU count, not the quota), and run "
            "fewer API-server processes (vLLM --api-server-count, SGLang --tokenizer-worker-num) than cores.",
            ["the threads counted by fragscope_process_threads far exceed the quota"],
            ["tokenization-bound traffic (long prompts, high request rates) needs its tokenizer workers: "
             "give it cores instead"])],
    ["fragscope_container_cpu_throttled_periods_total rises by < 5 % of fragscope_container_cpu_periods_total",
     "inter-token latency and TTFT back to their baseline; requests waiting back to ~0",
     "GPU utilization back up at the same traffic"],
    ["Linux kernel docs: scheduler/sched-bwc.rst (CFS bandwidth control)",
     "Kubernetes docs: Control CPU Management Policies on the Node (static policy)",
     "kubernetes-mixin CPUThrottlingHigh alert (> 25 % of periods throttled)"])


RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
