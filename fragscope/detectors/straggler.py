"""rank-straggler: in a multi-GPU engine one busy rank runs slower than its peers (its SM clock apart from
theirs), and names why: a clock slowdown reason, heat, a PCIe link below its maximum, a lower power draw.

Mechanism: tensor parallelism synchronises every layer with a collective; each step lasts as long as the
slowest rank's compute, while the other ranks wait inside NCCL kernels (which counts as utilization:
their utilization stays high, so utilization does not name the straggler; the clock does). One GPU
12 % slower makes the whole engine 12 % slower. Told apart from clock-throttling: that judges each GPU
against its own baseline or maximum with a slowdown reason; this compares the busy ranks with each other,
for a cause other than a slowdown reason or heat (a rank throttling alone is reported by clock-throttling,
which names its reason). A rank idle by design (a spare GPU, a pipeline
stage with nothing to do) is not compared: it must be busy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import npstats
from .. import ids
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import KG, K, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig as psig
from ..units import finite_or_none as _f
from . import common, stats
from .frame import Frame
from .host_common import judged_span, present_span

ID = ids.RANK_STRAGGLER
REQUIRES = ("gpu_sm_clock_hertz",)
CORROBORATES = ("gpu_utilization_ratio", "gpu_throttle_reason_active", "gpu_temperature_celsius",
                "gpu_pcie_link_gen", "gpu_pcie_link_width", "gpu_power_watts", "generation_tokens_total")


@dataclass(frozen=True)
class Config:
    # Boost clocks of identical busy GPUs agree within a few %; a rank >= 10 % below the median of its
    # peers is the step time of the whole engine (the same bar as clock-throttling's drop).
    clock_gap: float = 0.10
    critical_gap: float = 0.30
    util_busy: float = 0.5  # ranks below this are idle (by design or not): not compared
    temp_gap_c: float = 10.0
    # At a slowdown reason or clock-throttling's temperature bar (83 °C) the GPU is throttling: that
    # diagnosis names it and its reason; a straggler is a rank slow for another cause (link, clocks, power).
    throttle_temp_c: float = 83.0


def _med(f: Frame, g: str, s: str, span) -> float:
    x = f.gpu.get(g, {}).get(s)
    return stats.nanmedian(x[stats.mask(f, span)]) if x is not None else math.nan


def _gaps(f: Frame, gpus: list[str], span, cfg: Config) -> dict[str, float]:
    """Each busy GPU's clock gap to the median of its busy peers over ``span``."""
    clk = {g: _med(f, g, "gpu_sm_clock_hertz", span) for g in gpus}
    util = {g: _med(f, g, "gpu_utilization_ratio", span) for g in gpus}
    busy = [g for g in gpus if math.isfinite(clk[g]) and (not math.isfinite(util[g]) or util[g] >= cfg.util_busy)]
    out = {}
    for g in busy:
        peers = [clk[p] for p in busy if p != g]
        if peers and float(npstats.median(peers)) > 0:
            out[g] = 1 - clk[g] / float(npstats.median(peers))
    return out


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    gpus = [g for g in f.gpus() if f.has_gpu(g, "gpu_sm_clock_hertz")]
    if len(gpus) < 2:
        if len(gpus) == 1 or len(f.gpus()) >= 2:
            return []  # one GPU has no peer: nothing to straggle behind
        return Inconclusive(ID, ["fragscope_gpu_sm_clock_hertz or DCGM_FI_DEV_SM_CLOCK"], "SM clock not collected")
    span = judged_span(f)
    present = present_span(f)
    if present != span:
        # an incident that reached strength in the last minutes of a long window: the present decides
        gaps_now = _gaps(f, gpus, present, cfg)
        if gaps_now and max(gaps_now.values()) > max(_gaps(f, gpus, span, cfg).values() or [0.0]):
            span = present
    clk = {g: _med(f, g, "gpu_sm_clock_hertz", span) for g in gpus}
    util = {g: _med(f, g, "gpu_utilization_ratio", span) for g in gpus}
    busy = [g for g in gpus if math.isfinite(clk[g]) and (not math.isfinite(util[g]) or util[g] >= cfg.util_busy)]
    if not any(math.isfinite(util[g]) for g in gpus):
        return Inconclusive(ID, ["gpu utilization"], "cannot tell a busy rank from an idle one without utilization")
    if len(busy) < 2:
        return []
    out = []
    for g in busy:
        peers = [clk[p] for p in busy if p != g]
        ref = float(npstats.median(peers))
        if not ref > 0:
            continue
        gap = 1 - clk[g] / ref
        if gap < cfg.clock_gap:
            continue
        thr = common.throttle_fact(f, g, stats.Spans(span, span))
        t = _med(f, g, "gpu_temperature_celsius", span)
        if thr.present or (math.isfinite(t) and t >= cfg.throttle_temp_c):
            continue  # a slowdown reason or heat on this GPU: clock-throttling names it (its own finding)
        why: list[str] = []
        ev = [Evidence("gpu_sm_clock_hertz", clk[g], ref, ref * (1 - cfg.clock_gap), "hertz", span,
                       f"-{gap * 100:.0f} % vs the median of {len(peers)} busy peers", True)]
        tp = [_med(f, p, "gpu_temperature_celsius", span) for p in busy if p != g]
        tp = [x for x in tp if math.isfinite(x)]
        if math.isfinite(t) and tp and t - float(npstats.median(tp)) >= cfg.temp_gap_c:
            why.append(f"{t:.0f} °C vs {float(npstats.median(tp)):.0f} °C")
            ev.append(Evidence("gpu_temperature_celsius", t, float(npstats.median(tp)), None, "°C", span, "vs peers", True))
        for cur_s, max_s, lab in (("gpu_pcie_link_gen", "gpu_pcie_link_gen_max", "Gen"),
                                  ("gpu_pcie_link_width", "gpu_pcie_link_width_max", "x")):
            c, m = _med(f, g, cur_s, span), _med(f, g, max_s, span)
            if math.isfinite(c) and math.isfinite(m) and c < m:
                why.append(f"PCIe link {lab}{c:.0f} of {lab}{m:.0f}")
                ev.append(Evidence(cur_s, c, None, m, "", span, "below its maximum", True))
        pw = _med(f, g, "gpu_power_watts", span)
        pp = [x for x in (_med(f, p, "gpu_power_watts", span) for p in busy if p != g) if math.isfinite(x)]
        if math.isfinite(pw) and pp and pw < 0.85 * float(npstats.median(pp)) and not why:
            why.append(f"drawing {pw:.0f} W vs {float(npstats.median(pp)):.0f} W (a lower power limit or applications clocks)")
        sev = Severity.CRITICAL if gap >= cfg.critical_gap else Severity.WARNING
        conf = stats.confidence(1 + min(2, len(why)), base=0.45)
        reason = ", ".join(why) if why else "no slowdown reason, heat or link fault reported (check application " \
                                             "clocks and power limits: nvidia-smi -q -d CLOCK,POWER)"
        summary = (f"GPU {g} is the slow rank: SM clock {clk[g] / 1e6:.0f} MHz, {gap * 100:.0f} % below its "
                   f"{len(peers)} busy peers' {ref / 1e6:.0f} MHz; every tensor-parallel step waits for it "
                   f"({reason}).")
        ctx = {"rank_gpu": g, "clock_gap_ratio": gap, "why": why}
        out.append(Finding(ID, sev, conf, summary, None, ev, [], {"gpu": g}, context=ctx))
    return out


# --- PromQL: the peer rule, for the alert ------------------------------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """One busy GPU of a pod with its SM clock clock_gap or more below the median of the pod's busy GPUs
    (the recording rules fragscope:gpu_sm_clock_hertz / fragscope:gpu_utilization:ratio: fragscope NVML, else
    dcgm-exporter)."""
    busy = f"fragscope:gpu_utilization:ratio >= {num(cfg.util_busy)}"
    expr = (f"(fragscope:gpu_sm_clock_hertz / on (namespace, pod) group_left () quantile by (namespace, pod) "
            f"(0.5, fragscope:gpu_sm_clock_hertz and on (namespace, pod, gpu) {busy})) < {num(round(1 - cfg.clock_gap, 12))}"
            f" and on (namespace, pod, gpu) {busy}"
            f" and on (namespace, pod) count by (namespace, pod) ({busy}) >= 2")
    return AlertRule(
        "FragscopeRankStraggler", ID, expr, "15m", "warning",
        "GPU {{ $labels.gpu }}: slow rank ({{ $value | humanizePercentage }} of its peers' clock)",
        "One busy GPU runs a lower SM clock than the pod's other busy GPUs: every tensor-parallel step waits for it.",
        f"One busy GPU of a pod with its SM clock {cfg.clock_gap * 100:g} % or more below the median of the pod's "
        "busy GPUs (every tensor-parallel step waits for it).",
        {"clock_gap": cfg.clock_gap, "util_busy": cfg.util_busy}, shown={"clock_gap": num(round(1 - cfg.clock_gap, 12))})


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """A busy GPU with its SM clock >= 10 % below the median of its target's busy GPUs (value: clock / median).

    Busy: utilization >= util_busy (idle ranks are not compared). As the alert, the median includes the GPU
    itself: with two busy GPUs the slow one trips at a gap of 1 - (1 - g)/(1 + g) to the other (18 % for
    g = 10 %), not at 10 % as the detector (which compares to the others only)."""
    clk = f"max by ({KG}) {psig('gpu_sm_clock_hertz', 'avg_over_time({})', present, m)}"
    util = f"max by ({KG}) {psig('gpu_utilization_ratio', 'avg_over_time({})', present, m)}"
    busy = f"(({clk}) and on ({KG}) (({util}) >= {num(cfg.util_busy)}))"
    ratio = f"({busy} / on ({K}) group_left () quantile by ({K}) (0.5, {busy}))"
    return (f"({ratio} < {num(round(1 - cfg.clock_gap, 12))})"
            f" and on ({K}) (count by ({K}) ({busy}) >= 2)")


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("sm_clock_of_peer_median_ratio", "min_over_time", triage_check, "clock_of_peer_median_ratio")


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    g = ctx.get("rank_gpu")
    why = ctx.get("why") or []
    gap = _f(ctx.get("clock_gap_ratio")) or 0
    acts = [f"GPU {g} sets the pace of every step ({gap * 100:.0f} % slower clock): check it first "
            f"(nvidia-smi -q -i {g} -d PERFORMANCE,CLOCK,TEMPERATURE,POWER)."]
    if any("PCIe" in w for w in why):
        acts.append(f"GPU {g}'s PCIe link is below its maximum: drain the node and reseat the GPU or its riser.")
    if any("°C" in w or "thermal" in w for w in why):
        acts.append(f"GPU {g} runs hotter than its peers: check its fans / airflow and the slot's cooling.")
    return acts


PLAYBOOK = Playbook(
    ID, "One rank slower than its peers",
    "In a multi-GPU engine one busy GPU runs slower than the others; every collective waits for it, so "
    "the whole engine runs at that GPU's speed while the other ranks idle inside NCCL.",
    ["Find why that GPU is slow (its clock reasons, temperature, PCIe link, power limit) before touching "
     "the engine's settings.",
     "If a spare node exists: move the engine off the node with the slow GPU."],
    [Action("Fix the slow GPU's cause: cooling for a thermal slowdown, reseating for a degraded PCIe link, "
            "resetting application clocks / power limits to the peers' values (nvidia-smi -rac, -pl).",
            ["the cause is named in the finding"],
            ["a power limit set on purpose (a power-capped rack): cap every GPU alike instead"]),
     Action("Replace or service the GPU if it stays slower with the same clocks, temperature and link as its "
            "peers.", ["the gap persists across reboots"], ["a single observation: confirm over hours first"])],
    ["the GPUs' SM clocks within a few % of each other under load", "throughput up at the same traffic"],
    ["HTA (Holistic Trace Analysis): comm/comp overlap and straggler analysis across ranks",
     "NVIDIA nvidia-smi: clocks event reasons"])


RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
