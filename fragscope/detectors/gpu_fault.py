"""gpu-hardware-fault: the GPU itself reports a fault: an Xid error of a hardware class, uncorrectable
(double-bit) ECC errors, a row remap pending or failed, pages pending retirement, a PCIe link running
below its maximum generation or width under load, PCIe replays or NVLink CRC errors climbing.

The action is a GPU reset, draining the node, or a reseat / RMA, following NVIDIA's published Xid
catalogue (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate Action)"), the A100+ memory
error management guide (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: a pending row remap is applied
at the next GPU reset; a failed remap means the board needs service) and DCGM's health watches (PCIe
replay rate, NVLink error counters). Never a tuning change: no engine setting fixes hardware.

Confounders the rules keep quiet: a PCIe link that trains down at idle to save power and back up under
load (judged only while the GPU is busy); one old corrected (single-bit) ECC count, or a lifetime
(aggregate) count that does not move (history, not a present fault); an Xid of the application class
(a page fault from a program bug: the catalogue says restart the application).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import npstats
from .. import ids
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import KG, PRESENT, RATE_RANGE, AlertRule, TriageCheck, num, sig as psig
from ..signals import any_of
from . import stats
from .host_common import judged_span
from .frame import Frame

ID = ids.GPU_HARDWARE_FAULT
REQUIRES = ("gpu_xid_last|gpu_ecc_dbe_volatile_total|gpu_row_remap_pending|gpu_row_remap_failed|"
            "gpu_remapped_rows_uncorrectable_total|gpu_retired_pages_pending|gpu_pcie_link_gen|"
            "gpu_pcie_replays_total|gpu_nvlink_errors_total",)
CORROBORATES = ("gpu_ecc_sbe_volatile_total", "gpu_ecc_dbe_aggregate_total", "gpu_pcie_link_gen_max",
                "gpu_pcie_link_width", "gpu_pcie_link_width_max", "gpu_retired_pages_dbe_total",
                "gpu_utilization_ratio")
HW_SIGNALS = tuple(REQUIRES[0].split("|"))

# Xid -> (what NVIDIA's catalogue calls it, the immediate action, the severity it gets here).
# Application-class Xids (13, 31, 43, 45, 69 on their own) are program faults: not listed, not a finding.
XID_CATALOGUE: dict[int, tuple[str, str, str]] = {
    48: ("double-bit ECC error", "reset the GPU (drain it first); if it repeats, service (RMA)", "critical"),
    61: ("internal micro-controller breakpoint / warning", "reset the GPU", "critical"),
    62: ("internal micro-controller halt", "reset the GPU", "critical"),
    63: ("ECC page retirement or row remap recorded", "reset the GPU when drained to apply it", "warning"),
    64: ("ECC page retirement or row remapper recording failure", "reset the GPU; if it repeats, service (RMA)",
         "critical"),
    74: ("NVLink error", "reset the GPU; if it repeats, check the NVLink / NVSwitch hardware", "critical"),
    79: ("GPU has fallen off the bus", "drain the node and reboot it; if it repeats, reseat or service (RMA)",
         "critical"),
    92: ("high single-bit ECC error rate", "watch it; drain and service the GPU if it keeps climbing", "warning"),
    94: ("contained ECC error", "restart the application on this GPU (the error was contained)", "warning"),
    95: ("uncontained ECC error", "reset the GPU (drain it first)", "critical"),
    119: ("GSP RPC timeout", "reset the GPU; if it repeats, update the driver or service the GPU", "critical"),
    120: ("GSP error", "reset the GPU", "critical"),
    140: ("unrecovered ECC error", "reset the GPU (drain it first)", "critical"),
}


@dataclass(frozen=True)
class Config:
    # DCGM's PCIe health watch flags more than 8 replays per minute (DCGM_FR_PCI_REPLAY_RATE).
    pcie_replays_per_min: float = 8.0
    nvlink_errors_per_min: float = 1.0  # CRC errors that keep coming (a few per day are line noise)
    util_busy: float = 0.5  # a link trained down at idle is power management: judge it under load
    busy_share: float = 0.5  # of the samples where the link is read


def _last(x: np.ndarray | None) -> float:
    if x is None:
        return math.nan
    v = stats.finite(x)
    return float(v[-1]) if v.size else math.nan


def _increase(f: Frame, g: str, sig: str, span: tuple[float, float] | None = None) -> float:
    c = f.gpu_cum.get(g, {}).get(sig)
    if c is None:
        return math.nan
    v = stats.finite(c if span is None else c[stats.mask(f, span)])
    return float(v[-1] - v[0]) if v.size >= 2 else math.nan


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    gpus = [g for g in f.gpus() if any(f.has_gpu(g, s) for s in HW_SIGNALS)]
    if not gpus:
        return Inconclusive(ID, [any_of(s) for s in ("gpu_xid_last", "gpu_row_remap_failed", "gpu_pcie_replays_total")],
                            "no GPU error or link field collected (Xid, ECC, row remapping, PCIe, NVLink)")
    out = []
    for g in gpus:
        fnd = _gpu(f, g, cfg)
        if fnd is not None:
            out.append(fnd)
    return out


def _gpu(f: Frame, g: str, cfg: Config) -> Finding | None:
    sig = f.gpu[g]
    span = (f.start, f.end)
    ev: list[Evidence] = []
    faults: list[tuple[str, str, str]] = []  # (what, action, severity)
    onset = None
    # Xid: the gauge holds the last Xid's number (sticky until the exporter restarts)
    xid = sig.get("gpu_xid_last")
    if xid is not None and np.isfinite(xid).any():
        v = stats.finite(xid)
        last = int(v[-1])
        if last in XID_CATALOGUE:
            name, action, sev = XID_CATALOGUE[last]
            fin = np.isfinite(xid)
            new = bool((v != last).any())  # it changed to this value inside the window
            if new:
                idx = np.flatnonzero(fin & (np.nan_to_num(xid) == last))
                onset = float(f.t[idx[0]]) if idx.size else None
            held = "" if new else " (held all window: it may predate it; the gauge keeps the last Xid)"
            if not new and sev == "critical":
                sev = "warning"
            faults.append((f"Xid {last} ({name}){held}", action, sev))
            ev.append(Evidence("gpu_xid_last", float(last), None, None, "xid", span,
                               f"Xid {last}: {name}", True))
    dbe = _increase(f, g, "gpu_ecc_dbe_volatile_total")
    dbe_total = f.gpu_total.get(g, {}).get("gpu_ecc_dbe_volatile_total", math.nan)
    if math.isfinite(dbe) and dbe > 0:
        faults.append((f"{dbe:.0f} uncorrectable (double-bit) ECC errors in the window",
                       "drain and reset the GPU; a row remap or page retirement follows", "critical"))
        ev.append(Evidence("gpu_ecc_dbe_volatile_total", dbe, 0.0, 0.0, "errors", span, "new in the window", True))
    elif math.isfinite(dbe_total) and dbe_total > 0:
        faults.append((f"{dbe_total:.0f} uncorrectable ECC errors since the last reset",
                       "drain and reset the GPU", "warning"))
        ev.append(Evidence("gpu_ecc_dbe_volatile_total", dbe_total, None, 0.0, "errors", span,
                           "volatile count (since the driver loaded)", True))
    if _last(sig.get("gpu_row_remap_failed")) >= 1:
        faults.append(("row remapping failed (no spare rows left in a bank)",
                       "drain the node; the GPU needs service (RMA)", "critical"))
        ev.append(Evidence("gpu_row_remap_failed", 1.0, None, None, "bool", span, "", True))
    if _last(sig.get("gpu_row_remap_pending")) >= 1:
        faults.append(("a row remap is pending", "drain and reset the GPU to apply it", "warning"))
        ev.append(Evidence("gpu_row_remap_pending", 1.0, None, None, "bool", span, "applied at the next reset", True))
    unc = _increase(f, g, "gpu_remapped_rows_uncorrectable_total")
    if math.isfinite(unc) and unc > 0:
        faults.append((f"{unc:.0f} rows remapped for uncorrectable errors in the window",
                       "drain and reset the GPU", "warning"))
        ev.append(Evidence("gpu_remapped_rows_uncorrectable_total", unc, 0.0, 0.0, "rows", span, "", True))
    if _last(sig.get("gpu_retired_pages_pending")) >= 1:
        faults.append(("pages are pending retirement", "drain and reset (or reboot) to retire them", "warning"))
        ev.append(Evidence("gpu_retired_pages_pending", 1.0, None, None, "bool", span, "", True))
    # PCIe link below its maximum, judged while busy (links train down at idle to save power)
    link = _pcie_link(f, g, cfg)
    if link is not None:
        faults.append(link[0])
        ev.append(link[1])
    recent = judged_span(f)
    for s, per_min, what in (("gpu_pcie_replays_total", cfg.pcie_replays_per_min, "PCIe replays"),
                             ("gpu_nvlink_errors_total", cfg.nvlink_errors_per_min, "NVLink CRC errors")):
        inc = _increase(f, g, s, recent)  # the rate now, not diluted over a long window
        dur = recent[1] - recent[0]
        if math.isfinite(inc) and inc > 0 and dur > 0:
            rate = inc / dur * 60.0
            hot = rate >= per_min
            ev.append(Evidence(s.replace("_total", "_per_minute"), rate, None, per_min, "/min", span,
                               f"{inc:.0f} in the window", hot))
            if hot:
                faults.append((f"{what} climbing at {rate:.0f}/min",
                               "drain the node and reseat the GPU / check the link; service it if it persists",
                               "warning"))
    if not faults:
        return None
    sev = Severity.CRITICAL if any(s == "critical" for _, _, s in faults) else Severity.WARNING
    conf = stats.confidence(len(faults) + 1, base=0.5)
    summary = f"GPU {g}: " + "; ".join(w for w, _, _ in faults) + ". Not a tuning matter: " + faults[0][1] + "."
    ctx = {"faults": [w for w, _, _ in faults], "actions": [a for _, a, _ in faults]}
    return Finding(ID, sev, conf, summary, onset, ev, [], {"gpu": g}, context=ctx)


def _pcie_link(f: Frame, g: str, cfg: Config):
    """The link below its maximum in most busy samples of the judged span (the recent one of a long window)."""
    sig = f.gpu[g]
    util = sig.get("gpu_utilization_ratio")
    recent = stats.mask(f, judged_span(f))
    for cur_s, max_s, what in (("gpu_pcie_link_gen", "gpu_pcie_link_gen_max", "generation"),
                               ("gpu_pcie_link_width", "gpu_pcie_link_width_max", "width")):
        cur, mx = sig.get(cur_s), sig.get(max_s)
        if cur is None or mx is None:
            continue
        m = np.isfinite(cur) & np.isfinite(mx) & recent
        if util is not None:
            busy = m & (np.nan_to_num(util) >= cfg.util_busy)
        else:
            busy = np.zeros_like(m)  # busy-ness unknown: a link may train down at idle, so no verdict
        if busy.sum() < 2 or busy.sum() < cfg.busy_share * max(1, m.sum()) * 0.2:
            continue
        low = cur[busy] < mx[busy]
        if low.mean() >= cfg.busy_share:
            c, x = float(npstats.median(cur[busy])), float(npstats.median(mx[busy]))
            label = f"Gen{c:.0f} of Gen{x:.0f}" if what == "generation" else f"x{c:.0f} of x{x:.0f}"
            return ((f"PCIe link at {label} while busy", "drain the node and reseat the GPU or its riser; "
                     "service it if it trains down again", "warning"),
                    Evidence(cur_s, c, None, x, "", (f.start, f.end), f"maximum {x:.0f}, under load", True))
    return None


# --- PromQL: the fault rule, for the alert ------------------------------------------------------------
def alert_rule(cfg: Config = Config()) -> AlertRule:
    """A critical Xid of XID_CATALOGUE (NVIDIA's Xid catalogue: reset / drain / RMA), new uncorrectable ECC
    errors, a pending or failed row remap. No threshold: each is a fault by itself."""
    xids = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x, (_, _, sev) in sorted(XID_CATALOGUE.items())
                       if sev == "critical")
    expr = ('max by (namespace, pod, gpu) (label_replace(label_replace('
            f'({xids}) or DCGM_FI_DEV_ROW_REMAP_FAILURE > 0 or DCGM_FI_DEV_ROW_REMAP_PENDING > 0'
            ' or increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0,'
            ' "pod", "$1", "exported_pod", "(.+)"), "namespace", "$1", "exported_namespace", "(.+)"))'
            ' or max by (namespace, pod, gpu) (fragscope_gpu_row_remap_failed > 0 or fragscope_gpu_row_remap_pending > 0'
            ' or increase(fragscope_gpu_ecc_uncorrected_volatile_total[10m]) > 0)')
    return AlertRule(
        "FragscopeGpuHardwareFault", ID, expr, "1m", "critical",
        "GPU {{ $labels.gpu }}: GPU hardware fault",
        "A hardware Xid, uncorrectable ECC errors or a pending / failed row remap: drain the node and reset or "
        "service the GPU (no tuning fixes it).",
        "A hardware-class Xid (NVIDIA's Xid catalogue, the critical entries of XID_CATALOGUE), new uncorrectable "
        "ECC errors, a pending or failed row remap.",
        {})


def triage_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE, cfg: Config = Config()) -> str:
    """A critical Xid, new uncorrectable ECC errors, a pending or failed row remap, PCIe replays or NVLink
    CRC errors at their per-minute rates (value: 1 per faulty GPU).

    The Xid gauge keeps the last Xid until the exporter restarts: a GPU reset before it keeps tripping
    until then (the detector calls such a held Xid a warning)."""
    crit = [x for x, (_, _, sev) in sorted(XID_CATALOGUE.items()) if sev == "critical"]
    xid_fn = "(" + " or ".join(f"last_over_time({{0}}) == {x}" for x in crit) + ")"
    parts = [
        f"max by ({KG}) {psig('gpu_xid_last', xid_fn, present, m)}",
        f"max by ({KG}) {psig('gpu_row_remap_failed', 'max_over_time({})', present, m)} > 0",
        f"max by ({KG}) {psig('gpu_row_remap_pending', 'max_over_time({})', present, m)} > 0",
        f"sum by ({KG}) {psig('gpu_ecc_dbe_volatile_total', 'increase({})', rate, m)} > 0",
        f"sum by ({KG}) {psig('gpu_pcie_replays_total', 'rate({})', rate, m)} * 60 >= {num(cfg.pcie_replays_per_min)}",
        f"sum by ({KG}) {psig('gpu_nvlink_errors_total', 'rate({})', rate, m)} * 60 >= {num(cfg.nvlink_errors_per_min)}",
    ]
    return f"max by ({KG}) (" + " or ".join(f"({p}) * 0 + 1" for p in parts) + ")"


# The fleet triage runs it (fragscope/fleet/triage.py; docs/fleet.md#triage).
TRIAGE = TriageCheck("gpu_fault", "max_over_time", triage_check, "fault")


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    """The action of each fault the finding names (NVIDIA's Xid catalogue, the ECC and link rules above), once."""
    return list(dict.fromkeys(ctx.get("actions") or []))


PLAYBOOK = Playbook(
    ID, "GPU hardware fault",
    "The GPU reports a hardware fault (an Xid of a hardware class, uncorrectable ECC errors, a pending or "
    "failed row remap, retired pages, a degraded or erroring PCIe / NVLink link). No engine setting fixes "
    "it: the GPU needs a reset, the node a drain, or the board service.",
    ["Drain the node (kubectl cordon + drain) so no new work lands on the faulty GPU.",
     "Follow the action named in the finding (NVIDIA's Xid catalogue): reset the GPU (nvidia-smi -r, with no "
     "process on it) or reboot the node; RMA on a failed row remap or a repeating fault."],
    [Action("Reset the GPU to apply a pending row remap or page retirement, then run DCGM diagnostics "
            "(dcgmi diag -r 2) before returning the node to service.",
            ["no process uses the GPU (drained)"],
            ["a failed remap or repeated uncorrectable errors: the board needs service, not a reset"]),
     Action("Reseat the GPU (or its riser / cable) when its PCIe link trains below its maximum under load or "
            "replays keep climbing; service it if the link degrades again.",
            ["the node can be taken down"],
            ["a link that trains down only at idle: power management, not a fault"])],
    ["dcgmi diag -r 2 passes; Xid field back to 0 after the exporter restarts; ECC volatile counts 0 after "
     "the reset", "the PCIe link at its maximum generation and width under load; replays flat"],
    ["NVIDIA Xid catalogue: docs.nvidia.com/deploy/xid-errors (Resolution Bucket)",
     "NVIDIA A100+ GPU memory error management: docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt",
     "DCGM health watches (PCIe replay rate, NVLink errors, memory)"])


RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
