"""Runs every detector over a window: one frame, findings merged across GPUs, playbooks attached."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..model import Finding, Inconclusive, Report, Severity, Window, rank_findings
from . import block_size, fragmentation, kv_pressure, launch_bound, memory_leak, saturation, throttling
from . import stats
from .frame import Frame, build_frame

DETECTORS: dict[str, Callable[[Frame], list[Finding] | Inconclusive]] = {
    fragmentation.ID: fragmentation.detect,
    kv_pressure.ID: kv_pressure.detect,
    memory_leak.ID: memory_leak.detect,
    throttling.ID: throttling.detect,
    launch_bound.ID: launch_bound.detect,
    saturation.ID: saturation.detect,
    block_size.ID: block_size.detect,
}

# Too short a window cannot separate a baseline from the present.
MIN_SPAN_S = 5 * 60.0
MIN_POINTS = 8
MIN_SEGMENT_S = 30 * 60.0  # a segment between restarts shorter than this has no baseline of its own


def run_detectors(window: Window) -> Report:
    report = Report(window=(window.start, window.end), source=window.source)
    if not len(window) or not math.isfinite(window.start):
        report.inconclusive = [Inconclusive(i, [], "no data") for i in DETECTORS]
        return report
    frame = build_frame(window)
    report.signals = signal_summary(frame, window)
    span = window.end - window.start
    if span < MIN_SPAN_S or frame.t.size < MIN_POINTS:
        # Only the static check can judge a single scrape or a very short recording.
        report.inconclusive = [Inconclusive(i, [], f"window of {span:.0f} s is too short to compare a baseline "
                                            f"with the present (need >= {MIN_SPAN_S:.0f} s)")
                               for i in DETECTORS if i != block_size.ID]
        res = block_size.detect(frame)
        _collect(report, block_size.ID, res, frame)
        return report
    restarts = [t for t in frame.restarts if window.start + MIN_SEGMENT_S <= t]
    if not restarts:
        _run_all(report, frame)
    else:
        # A restart clears allocator state and the KV pool: judge the segments apart. The last
        # one is the present; an earlier one explains what the restart ended.
        last = restarts[-1]
        report.signals.setdefault("notes", []).append(
            f"engine restarted (counters reset) at {', '.join(_iso(t) for t in restarts[:5])}")
        if window.end - last >= MIN_SEGMENT_S:
            _run_all(report, build_frame(window.between(last, window.end)))
            prev_start = restarts[-2] if len(restarts) > 1 else window.start
            before = Report(window=(prev_start, last))
            _run_all(before, build_frame(window.between(prev_start, last - 1e-3)))
            current = {f.id for f in report.findings}
            for f in before.findings:
                if f.id in current:
                    continue
                if f.severity.rank > 0:
                    f.severity = Severity.WARNING if f.severity is Severity.CRITICAL else Severity.INFO
                f.summary = f.summary.rstrip(".") + f" (before the restart at {_iso(last)}, which ended it)."
                f.subject = dict(f.subject, segment="before-restart")
                report.findings.append(f)
        else:
            # restarted at the very end (e.g. after an OOM): the story is before it
            _run_all(report, build_frame(window.between(window.start, last - 1e-3)))
    report.findings = rank_findings(_merge_gpus(report.findings))
    return report


def _run_all(report: Report, frame: Frame) -> None:
    for did, fn in DETECTORS.items():
        try:
            res = fn(frame)
        except Exception as e:  # a detector bug must not hide the other findings
            res = Inconclusive(did, [], f"detector failed: {type(e).__name__}: {e}")
        _collect(report, did, res, frame)


def _collect(report: Report, did: str, res, frame: Frame) -> None:
    # Findings leave here with ``playbook={"context": ...}``; fragscope.playbooks.diagnose turns the
    # context into the full playbook (playbooks sit above detectors in the layering).
    if isinstance(res, Inconclusive):
        report.inconclusive.append(res)
        return
    for f in res:
        ctx = dict((f.playbook or {}).get("context", {}))
        ctx["_config"] = dict(frame.config)
        f.playbook = {"context": ctx}
        report.findings.append(f)


def _merge_gpus(findings: list[Finding]) -> list[Finding]:
    """One finding per diagnosis: several GPUs with the same diagnosis (tensor parallelism) are
    one problem; keep the strongest GPU's evidence and name them all."""
    by_id: dict[str, list[Finding]] = {}
    out = []
    for f in findings:
        if "gpu" in f.subject:
            by_id.setdefault(f.id, []).append(f)
        else:
            out.append(f)
    for did, fs in by_id.items():
        if len(fs) == 1:
            out.append(fs[0])
            continue
        fs.sort(key=lambda f: (-f.severity.rank, -f.confidence))
        top = fs[0]
        gpus = sorted({f.subject["gpu"] for f in fs}, key=lambda g: (len(g), g))
        top.subject = {"gpu": ",".join(gpus)}
        top.summary = top.summary.rstrip(".") + f"; {len(gpus)} GPUs affected ({', '.join(gpus)})."
        onsets = [f.onset for f in fs if f.onset is not None]
        if onsets:
            top.onset = min(onsets)
        out.append(top)
    return out


def _iso(ts: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def signal_summary(f: Frame, window: Window) -> dict:
    """What was seen: per canonical signal the raw source and baseline/recent medians."""
    sp = stats.spans(f) if f.t.size >= 2 else None
    out: dict = {"step_seconds": f.step, "scrape_interval_seconds": f.scrape_interval,
                 "engine_generation": f.engine_generation, "gpus": f.gpus(), "sources": dict(f.sources),
                 "engine": {}, "gpu": {}, "config": dict(f.config),
                 "dropped_points": window.dropped_points, "notes": list(window.notes)}

    def summ(x: np.ndarray) -> dict:
        d = {"points": int(np.isfinite(x).sum())}
        if sp is not None:
            d["baseline"] = _num(stats.nanmedian(x[stats.mask(f, sp.base)]))
            d["recent"] = _num(stats.nanmedian(x[stats.mask(f, sp.recent)]))
        return d

    for k, x in sorted(f.engine.items()):
        out["engine"][k] = summ(x)
    for g in f.gpus():
        out["gpu"][g] = {k: summ(x) for k, x in sorted(f.gpu[g].items())}
        for r, x in sorted(f.throttle.get(g, {}).items()):
            out["gpu"][g][f"throttle_reason_active:{r}"] = summ(x)
    if f.hist_avg:
        out["request_averages"] = {k: _num(v) for k, v in f.hist_avg.items()}
    return out


def _num(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
