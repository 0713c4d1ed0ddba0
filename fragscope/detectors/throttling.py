"""clock-throttling: the SM clock drops with a thermal or power reason (or, from DCGM, with the
temperature high), throughput falls while the GPU stays busy, and memory is healthy.

Mechanism: the driver lowers clocks when the GPU reaches its power cap or slowdown temperature
(or the board signals HW slowdown / power brake). Kernels run longer; the engine does the same
work more slowly. NVML reports why (clocks-event reasons); DCGM's default counters do not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ids
from ..gpus import MAX_SM_CLOCK_MHZ, max_sm_clock_hertz
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import KG, PRESENT, RATE_RANGE, AlertRule, TriageCheck, norm, num, quote, rx_escape, sig, variants
from ..signals import SIGNALS
from ..units import finite_or_none as _f, fmt_pct
from . import common, stats
from . import level as lv
from .frame import Frame

ID = ids.CLOCK_THROTTLING
REQUIRES = ("gpu_sm_clock_hertz",)
CORROBORATES = ("gpu_throttle_reason_active", "gpu_temperature_celsius", "generation_tokens_total",
                "gpu_utilization_ratio")


# The reasons the level rule counts as a slowdown: NVML's hardware and thermal slowdowns. sw_power_cap
# alone at full load is normal boost behaviour.
LEVEL_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@dataclass(frozen=True)
class Config:
    # >= 10 % below its own baseline (or below the max clock): boost clocks wobble by a few %,
    # a thermal or power slowdown takes 20-40 % (H100 1980 -> ~1400 MHz).
    clock_drop: float = 0.10
    # With NVML naming a slowdown reason, a sustained 5 % drop is already the driver at work.
    clock_drop_with_reason: float = 0.05
    # Slowdown temperatures: H100/A100 slow down near 85-90 °C (nvidia-smi -q "GPU Slowdown Temp");
    # a GPU at >= 83 °C under load is at the edge. A rise of >= 10 °C corroborates too.
    temp_high_c: float = 83.0
    temp_rise_c: float = 10.0
    util_busy: float = 0.5  # clocks fall at idle by design (gpu_idle reason): require real load
    critical_clock_ratio: float = 0.70
    # Level evidence (the present alone, ``level``): the SM clock <= 80 % of the product's maximum while
    # busy (power capping at full load costs ~5-12 %; thermal and hardware slowdowns 20-40 %: H100 1980
    # -> ~1400 MHz), or a slowdown reason of SLOWDOWN_REASONS active.
    clock_of_max: float = 0.80
    # The board's external power-brake signal (PSU / chassis) is a hardware incident, whatever the drop.
    hardware_reasons: tuple[str, ...] = ("hw_power_brake_slowdown",)


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    gpus = [g for g in f.gpus() if f.has_gpu(g, "gpu_sm_clock_hertz")]
    if not gpus:
        return Inconclusive(ID, ["fragscope_gpu_sm_clock_hertz or DCGM_FI_DEV_SM_CLOCK"], "SM clock not collected")
    sp = stats.spans(f)
    tput = common.throughput_fact(f, sp, drop=0.08)
    out = []
    for g in gpus:
        fnd = _detect_gpu(f, g, sp, cfg, tput)
        if fnd is not None:
            out.append(fnd)
    return out


def _detect_gpu(f: Frame, g: str, sp: stats.Spans, cfg: Config, tput) -> Finding | None:
    sig = f.gpu[g]
    clk = sig["gpu_sm_clock_hertz"]
    util = sig.get("gpu_utilization_ratio")
    # compare clocks only while busy: idle clock drops are power management
    busy_mask = np.ones(f.t.size, dtype=bool)
    if util is not None and np.isfinite(util).any():
        busy_mask = np.nan_to_num(util, nan=1.0) >= cfg.util_busy
    clk_busy = np.where(busy_mask, clk, np.nan)
    ch = stats.change(f, clk_busy, sp, direction=-1, floor_rel=0.01)
    if not ch.known:
        return None
    ref = ch.baseline
    ref_name = "baseline"
    mx = stats.nanmedian(sig.get("gpu_sm_clock_max_hertz", np.full(f.t.size, np.nan)))
    drop = 1 - ch.recent / ref if ref > 0 else 0.0
    if math.isfinite(mx) and mx > 0 and 1 - ch.recent / mx > drop and 1 - ref / mx >= cfg.clock_drop:
        # throttled from the start of the window: judge against the max clock
        drop, ref, ref_name = 1 - ch.recent / mx, mx, "max clock"
    thr = common.throttle_fact(f, g, sp)
    need = cfg.clock_drop_with_reason if thr.present else cfg.clock_drop
    if drop < need:
        return None
    evidence = [Evidence("gpu_sm_clock_hertz", ch.recent, ref, ref * (1 - cfg.clock_drop), "hertz", sp.recent,
                         f"-{drop * 100:.0f} % vs {ref_name} while busy", True)]
    agree = 1
    missing = []
    reason = None
    if thr.evidence is not None:
        evidence.append(thr.evidence)
        agree += thr.present
        if thr.present:
            reason = thr.extra["reason"]
        elif ref_name == "max clock" and thr.value >= 0.5:
            agree += 1
            reason = thr.extra["reason"]
            thr.evidence.agrees = True
    else:
        missing.append("fragscope_gpu_throttle_reason_active (NVML clocks-event reasons; DCGM lacks them)")
    temp = sig.get("gpu_temperature_celsius")
    hot = False
    if temp is not None and np.isfinite(temp).any():
        tch = stats.change(f, temp, sp, floor_abs=1.0)
        hot = tch.known and (tch.recent >= cfg.temp_high_c or tch.delta >= cfg.temp_rise_c)
        evidence.append(Evidence("gpu_temperature_celsius", tch.recent, tch.baseline, cfg.temp_high_c, "°C",
                                 sp.recent, "", hot))
        agree += hot
    else:
        missing.append("fragscope_gpu_temperature_celsius or DCGM_FI_DEV_GPU_TEMP")
    if reason is None and not hot:
        return None  # a clock drop with no reason and a cool GPU: applications clocks, not throttling
    if tput.evidence is not None:
        evidence.append(tput.evidence)
        agree += tput.present
    busy = common.util_busy_fact(f, g, sp, busy=0.7)
    if busy.evidence is not None:
        evidence.append(busy.evidence)
        agree += busy.present
    # memory healthy: fragmentation is not what slows this server
    against = 0
    fr = common.frag_rise(f, g, sp)
    if fr is not None and fr.known and (fr.delta >= 0.05 or fr.recent >= 0.25):
        evidence.append(Evidence("torch_fragmentation_ratio", fr.recent, fr.baseline, 0.05, "ratio", sp.recent,
                                 "allocator fragmentation also present", False))
        against += 1
    sev = Severity.WARNING
    if reason in cfg.hardware_reasons or (ch.recent / ref <= cfg.critical_clock_ratio and tput.present):
        sev = Severity.CRITICAL
    conf = stats.confidence(agree, base=0.4, against=against)
    onset = common.earliest(ch.onset, thr.onset)
    why = reason or ("high temperature" if hot else "unknown")
    summary = (f"GPU {g}: SM clock {ch.recent / 1e6:.0f} MHz, {drop * 100:.0f} % below {ref_name} "
               f"({ref / 1e6:.0f} MHz) since {common.fmt_time(onset)}, reason {why}")
    if temp is not None and np.isfinite(temp).any():
        summary += f", {stats.nanmedian(temp[stats.mask(f, sp.recent)]):.0f} °C"
    if tput.present:
        summary += f"; throughput {tput.evidence.baseline:.0f} → {tput.evidence.observed:.0f} tok/s"
    if busy.present:
        summary += f" at {busy.value * 100:.0f} % utilization"
    summary += "."
    ctx = {"reason": why, "clock_drop_ratio": drop}
    return Finding(ID, sev, conf, summary, onset, evidence, missing, {"gpu": g}, context=ctx)


# --- clocks: slowdown reasons, or far below the product's maximum ----------------------------
def level(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The present by itself: a slowdown reason, or far below the product's maximum, while busy."""
    gpus = [g for g in f.gpus() if f.has_gpu(g, "gpu_sm_clock_hertz") or g in f.throttle]
    if not gpus:
        return Inconclusive(ID, [], "SM clock not collected")
    out = []
    sp = lv.present_span(f)
    for g in gpus:
        sig = f.gpu.get(g, {})
        util = lv.present_value(f, sig.get("gpu_utilization_ratio"))
        running = lv.present_value(f, f.engine.get("requests_running"))
        busy = (math.isfinite(util) and util >= cfg.util_busy) or (not math.isfinite(util) and math.isfinite(running)
                                                                    and running >= 1)
        if not busy:
            continue
        active = []
        for r, x in f.throttle.get(g, {}).items():
            if r in LEVEL_REASONS:
                v = stats.finite(x[stats.mask(f, sp)])
                if not v.size:
                    v = stats.finite(x[-1:])
                if v.size and float((v >= 0.5).mean()) >= 0.5:
                    active.append(r)
        clk = lv.present_value(f, sig.get("gpu_sm_clock_hertz"))
        mx = lv.present_value(f, sig.get("gpu_sm_clock_max_hertz"), "max")
        src = "NVML max clock"
        if not math.isfinite(mx):
            mx = max_sm_clock_hertz(f.gpu_model.get(g)) or math.nan
            src = f"{f.gpu_model.get(g)} max clock" if math.isfinite(mx) else ""
        ratio = clk / mx if math.isfinite(clk) and math.isfinite(mx) and mx > 0 else math.nan
        low = math.isfinite(ratio) and ratio <= cfg.clock_of_max
        if not active and not low:
            continue
        ev = []
        if math.isfinite(ratio):
            ev.append(Evidence("gpu_sm_clock_hertz", clk, mx, mx * cfg.clock_of_max, "hertz", sp,
                               f"{clk / 1e6:.0f} MHz of {mx / 1e6:.0f} MHz ({src}, {fmt_pct(ratio)}) while busy", low))
        for r in active:
            ev.append(Evidence(f"throttle_reason_active:{r}", 1.0, None, 0.5, "bool", sp, f"{r} active now", True))
        temp = lv.present_value(f, sig.get("gpu_temperature_celsius"))
        hot = math.isfinite(temp) and temp >= cfg.temp_high_c
        if math.isfinite(temp):
            ev.append(Evidence("gpu_temperature_celsius", temp, None, cfg.temp_high_c, "celsius", sp,
                               "at the slowdown edge" if hot else "", hot))
        agree = bool(active) + low + hot + (math.isfinite(util) and util >= cfg.util_busy)
        hardware = any(r in ("hw_slowdown", "hw_power_brake_slowdown") for r in active)
        sev = Severity.CRITICAL if hardware or (math.isfinite(ratio) and ratio <= cfg.critical_clock_ratio) \
            else Severity.WARNING
        conf = stats.confidence(agree, base=0.4) * 0.9
        reason = active[0] if active else "none reported"
        clock_txt = (f"SM clock {clk / 1e6:.0f} MHz, {fmt_pct(ratio)} of the {mx / 1e6:.0f} MHz maximum"
                     if math.isfinite(ratio) else "SM clock vs maximum unknown")
        summary = (f"GPU {g}: {clock_txt} while busy"
                   + (f"; slowdown reason {', '.join(active)} active" if active else "")
                   + (f"; {temp:.0f} °C" if math.isfinite(temp) else "") + f" ({lv.basis_note(f)}).")
        ctx = {"reason": reason, "basis": "level",
               "clock_drop_ratio": (1 - ratio) if math.isfinite(ratio) else None}
        out.append(Finding(ID, sev, conf, summary, None, ev, [], {"gpu": g}, context=ctx))
    return out


# --- PromQL: the level rule, for the fleet triage and the alert ---------------------------------
def product_max_clock_promql(m=()) -> str:
    """dcgm-exporter's modelName label -> the product's maximum SM clock (fragscope/gpus.py), in Hz.

    The fragment is extracted into a label by one regex (longest fragment first, as a word, as
    gpus.max_sm_clock_hertz matches) and joined with a constant table: two selectors, not one per
    product.
    """
    names = [s.metric for s in SIGNALS["gpu_sm_clock_hertz"].sources if s.metric.startswith("DCGM_")]
    frags = sorted(MAX_SM_CLOCK_MHZ, key=lambda f: -len(f))
    rx = "(?i)(?:.*[^A-Za-z0-9])?(" + "|".join(rx_escape(f) for f in frags) + ")(?:[^A-Za-z0-9].*)?"
    table = " or ".join(f'label_replace(vector({MAX_SM_CLOCK_MHZ[f] * 1e6:g}), "gpu_product", {quote(f)}, "", "")'
                        for f in frags)
    terms = [norm(f'label_replace({s}, "gpu_product", "$1", "modelName", {quote(rx)}) * 0 + on (gpu_product) '
                  f"group_left () ({table})") for s in variants(names, m)]
    return f"max by ({KG}) (" + " or ".join(terms) + ")"


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """Busy (utilization >= 50 %) with a slowdown reason active or the SM clock <= 80 % of the
    product's maximum (value: clock / maximum; 1 where only a reason is known)."""
    util = f"max by ({KG}) {sig('gpu_utilization_ratio', 'avg_over_time({})', present, m)}"
    clk = f"max by ({KG}) {sig('gpu_sm_clock_hertz', 'avg_over_time({})', present, m)}"
    mx = (f"(max by ({KG}) {sig('gpu_sm_clock_max_hertz', 'max_over_time({})', present, m)}"
          f" or {product_max_clock_promql(m)})")
    reasons = "|".join(LEVEL_REASONS)
    active = (f"max by ({KG}) {sig('gpu_throttle_reason_active', 'avg_over_time({})', present, m, extra=f'reason=~{quote(reasons)}')}"
              " >= 0.5")
    ratio = f"(({clk}) / ({mx}))"
    tripped = (f"({ratio} <= {num(cfg.clock_of_max)}) or on ({KG}) ({ratio} and on ({KG}) ({active}))"
               f" or on ({KG}) (({active}) * 0 + 1)")
    return f"({tripped}) and on ({KG}) (({util}) >= {num(cfg.util_busy)})"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("sm_clock_of_max_ratio", "min_over_time", triage_check, "clock_of_max_ratio")


def alert_rule(cfg: Config = Config()) -> AlertRule:
    return AlertRule(
        "FragscopeClockThrottling", ID, triage_check(cfg=cfg), "10m", "warning",
        "GPU {{ $labels.gpu }}: SM clock throttled",
        f"Busy GPU (utilization >= {cfg.util_busy * 100:g} %) with the SM clock at or below "
        f"{cfg.clock_of_max * 100:g} % of the product's maximum, or a hardware or thermal slowdown reason "
        f"active (critical at {cfg.critical_clock_ratio * 100:g} %).",
        "Slowdown reason or SM clock far below the product's maximum while busy (the level rule; fragscope "
        "NVML or dcgm-exporter). Temperature (>= 83 C) is evidence in diagnose, not a trigger.",
        {"clock_of_max": cfg.clock_of_max, "util_busy": cfg.util_busy})


# --- signature: what keeps the diagnoses it suppresses quiet (their SUPPRESSED_BY) -----------------------
def signature(f: Frame, sp: stats.Spans, cfg: Config = Config()) -> bool:
    """A slowdown reason active, or the SM clock down by clock_drop from its baseline, on any GPU (reasons
    or not: clocks that fell are not plain load)."""
    for g in f.gpus():
        if common.throttle_fact(f, g, sp).present:
            return True
        clk = f.gpu[g].get("gpu_sm_clock_hertz")
        if clk is not None and np.isfinite(clk).any():
            c = stats.change(f, clk, sp, direction=-1, floor_rel=0.01)
            if c.known and c.baseline > 0 and 1 - c.recent / c.baseline >= cfg.clock_drop:
                return True
    return False


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    return [f"Reason {ctx.get('reason', 'unknown')}: see the matching durable fix; clocks are "
            f"{(_f(ctx.get('clock_drop_ratio')) or 0) * 100:.0f} % down."]


PLAYBOOK = Playbook(
    ID, "GPU clock throttling",
    "The GPU lowered its clocks for power or temperature; the same work runs slower.",
    ["Check the node: fans, inlet temperature, power capping (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER).",
     "Move traffic away from this GPU/node if throughput matters more than capacity."],
    [Action("Thermal: fix cooling (airflow, blanking panels, fan policy, datacenter inlet temperature).",
            ["reason hw_thermal_slowdown / sw_thermal_slowdown or temperature >= ~83 °C"], []),
     Action("Power: check the power limit (nvidia-smi -q -d POWER) against the board's default; raise it "
            "if it was capped below default.",
            ["reason sw_power_cap with a limit below the default TDP"],
            ["facility power budget: the cap may be deliberate"]),
     Action("hw_slowdown / hw_power_brake_slowdown: a hardware or PSU signal — drain the node and open a "
            "hardware ticket.", ["reason hw_slowdown or hw_power_brake_slowdown"], [])],
    ["SM clock back near its max under load; throttle reasons inactive; tokens/s back to baseline"],
    ["NVML nvmlDeviceGetCurrentClocksEventReasons"])
