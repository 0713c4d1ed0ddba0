"""The pipeline: a window -> one frame -> every registered window detector -> findings merged across
GPUs -> playbooks attached. :func:`diagnose` is the one entry point for callers (CLI, agent, fleet).
"""
from __future__ import annotations

import math

import numpy as np

from .collectors.engines import name_notes
from .detectors import stats
from .detectors.frame import Frame, build_frame
from .model import Finding, Inconclusive, Report, Severity, Window, rank_findings
from .playbooks import REGISTRY, attach_playbooks
from .playbooks.registry import Diagnosis
from .units import iso as _iso

# Too short a window cannot separate a baseline from the present.
# A window must hold the detectors' baseline (>= 20 min) and recent (>= 10 min) spans apart
# (detectors/stats.py) before a change can be told from noise; shorter ones are judged on the present
# state alone (level evidence: each diagnosis's ``level`` rule).
MIN_SPAN_S = stats.BASELINE_MIN_S + stats.RECENT_MIN_S
MIN_POINTS = 8
MIN_SEGMENT_S = 30 * 60.0  # a segment between restarts shorter than this has no baseline of its own


def run_detectors(window: Window) -> Report:
    report = Report(window=(window.start, window.end), source=window.source)
    if not len(window) or not math.isfinite(window.start):
        report.inconclusive = [Inconclusive(d.id, [], "no data") for d in REGISTRY.window()]
        return report
    frame = build_frame(window)
    report.signals = signal_summary(frame, window)
    span = window.end - window.start
    if span < MIN_SPAN_S or frame.t.size < MIN_POINTS:
        # No baseline fits: judge the present state by itself (level evidence); what only a trend can
        # show stays inconclusive, with how long to wait.
        if window.timestamps != "none":  # scrape files carry the reader's own notes on what they can show
            report.signals.setdefault("notes", []).append(
                "one scrape: lifetime counters are totals since each process started; rates need two scrapes"
                if frame.points <= 1 else
                f"window of {span / 60:.0f} min holds no baseline (need >= {MIN_SPAN_S / 60:.0f} min): findings are "
                "judged on the present state")
        _run_all(report, frame, short=True)
        report.findings = rank_findings(_merge_gpus(report.findings))
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


def load_detectors() -> None:
    """Import what :func:`diagnose` runs (the window diagnoses' modules and what they import, ~45 ms), as
    it would on its first call: ``diagnose FILE`` does it while a child process parses the file
    (cli/diagnose_cmd.py, collectors/prefetch.py)."""
    REGISTRY.window()
    from .detectors import batching  # noqa: F401 - (_triton_batch_shifts)


def diagnose(window: Window) -> Report:
    """Run every registered window detector over ``window`` and attach playbooks."""
    report = run_detectors(window)
    report.findings = rank_findings(report.findings + _triton_batch_shifts(window))
    return attach_playbooks(report)


def _triton_batch_shifts(window: Window) -> list[Finding]:
    """Triton models whose batches shrank while queueing grew at unchanged traffic (counters alone, no config:
    detectors/batching.py detect_shift); nothing for windows without Triton's per-model counters."""
    from .detectors import batching

    if not len(window) or not math.isfinite(window.start) or window.end <= window.start:
        return []
    out: list[Finding] = []
    for model in batching.models_in(window):
        out.extend(batching.detect_shift(window, model))
    return out


def judge_present(window: Window) -> list[Finding]:
    """The findings of the short-window path alone (level evidence, and the detectors that judge short
    windows themselves), merged across GPUs: what :func:`run_detectors` finds in a window shorter than
    ``MIN_SPAN_S``, without the signal summary, notes or playbooks. The agent's watch pass asks this of its
    last 2 minutes every few seconds (agent/loops.py); the summary was a fifth of its cost."""
    if not len(window) or not math.isfinite(window.start):
        return []
    report = Report(window=(window.start, window.end), source=window.source)
    _run_all(report, build_frame(window), short=True)
    return rank_findings(_merge_gpus(report.findings))


def judge_level(window: Window) -> list[Finding]:
    """The level rules alone (each diagnosis's present-state rule, ``level``) over ``window``, merged across
    GPUs, without the detectors that judge short windows themselves: the agent asks this of its last 20 s
    every few seconds (agent/loops.py judge_recent)."""
    if not len(window) or not math.isfinite(window.start):
        return []
    report = Report(window=(window.start, window.end), source=window.source)
    frame = build_frame(window)
    for d in REGISTRY.window():
        if d.level is not None:
            _run_one(report, d, frame, fn=d.level, basis="level")
    return rank_findings(_merge_gpus(report.findings))


def _run_all(report: Report, frame: Frame, short: bool = False) -> None:
    span = frame.end - frame.start
    for d in REGISTRY.window():
        if not short:
            found = _run_one(report, d, frame)
            if not found and span < d.min_trend_span_s and not any(i.id == d.id for i in report.inconclusive):
                report.inconclusive.append(Inconclusive(
                    d.id, [], f"window of {span / 60:.0f} min: {d.short_window_reason or 'too short for a trend'}"))
            if not found and d.level is not None and d.level_on_long_windows:
                # The window may lie wholly inside the incident: no change to see, yet the present is sick.
                res = _call(d, d.level, frame)
                if not isinstance(res, Inconclusive) and res:
                    _add(report, res, frame, basis="level")
        elif d.level is not None:
            _run_one(report, d, frame, fn=d.level, basis="level")
        elif d.runs_on_short_windows:
            _run_one(report, d, frame)
        else:
            report.inconclusive.append(Inconclusive(
                d.id, [], d.short_window_reason or f"window of {span / 60:.0f} min is too short to compare a baseline "
                f"with the present (need >= {MIN_SPAN_S / 60:.0f} min), and the present state alone does not show it"))


def unmet_requirements(d: Diagnosis, frame: Frame) -> list[str]:
    """The registered required signals (``a|b``: either) the frame has no data for."""
    return [req for req in d.requires if not any(has_signal(frame, alt) for alt in req.split("|"))]


def has_signal(f: Frame, sig_id: str) -> bool:
    """Whether the frame holds data read for a canonical signal (signals.py)."""
    if sig_id == "gpu_throttle_reason_active":
        return bool(f.throttle)
    if sig_id == "cache_config_info":
        return bool(f.config)
    return sig_id in f.sources


def _call(d: Diagnosis, fn, frame: Frame):
    try:
        return fn(frame)
    except Exception as e:  # a detector bug must not hide the other findings
        return Inconclusive(d.id, [], f"detector failed: {type(e).__name__}: {e}")


def _add(report: Report, findings: list[Finding], frame: Frame, basis: str | None = None) -> None:
    from .collectors.enginelog.jobkind import metrics_job_kind

    kind = metrics_job_kind(frame.sources.values())  # whose metrics: the playbook names that engine's knobs
    for f in findings:
        f.context["_config"] = dict(frame.config)
        if kind is not None:
            f.context.setdefault("job_kind", kind)
        if basis:
            f.basis = basis
        report.findings.append(f)


def suppressed(d: Diagnosis, frame: Frame) -> str | None:
    """The first diagnosis of ``d.suppressed_by`` whose signature shows in the frame, or None."""
    if not d.suppressed_by or frame.t.size < 2:
        return None
    sp = stats.spans(frame)
    for sid in d.suppressed_by:
        s = REGISTRY.get(sid)
        if s is not None and s.signature is not None and s.signature(frame, sp):
            return sid
    return None


def _run_one(report: Report, d: Diagnosis, frame: Frame, fn=None, basis: str | None = None) -> bool:
    """Run one detector; True when it reported a finding. Where a suppressor of the diagnosis shows its signature
    (``suppressed_by``), the detector's judgement is dropped: its change findings and the doubts it had about a
    subject (an inconclusive naming a GPU); an inconclusive for signals it lacks altogether stays."""
    res = _call(d, fn or d.detect, frame)
    judged = bool(res) and (not isinstance(res, Inconclusive) or bool(res.subject))
    if judged and (fn is None or fn is d.detect):
        try:
            if suppressed(d, frame):
                res = []
        except Exception as e:  # a signature bug must not hide the other findings
            res = Inconclusive(d.id, [], f"suppression check failed: {type(e).__name__}: {e}")
    if isinstance(res, Inconclusive):
        if not res.missing:
            # Name what is missing from the registered requirements, in raw metric names.
            from .playbooks import raw_names

            res.missing = [" or ".join(n for alt in req.split("|") for n in raw_names(alt))
                           for req in unmet_requirements(d, frame)]
        report.inconclusive.append(res)
        return False
    _add(report, res, frame, basis)
    return bool(res)


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


def signal_summary(f: Frame, window: Window) -> dict:
    """What was seen: per canonical signal the raw source and baseline/recent medians."""
    sp = stats.spans(f) if f.t.size >= 2 else None
    out: dict = {"step_seconds": f.step, "scrape_interval_seconds": f.scrape_interval,
                 "engine_generation": f.engine_generation, "gpus": f.gpus(), "sources": dict(f.sources),
                 "engine": {}, "gpu": {}, "config": dict(f.config),
                 "dropped_points": window.dropped_points, "notes": list(window.notes) + name_notes(window),
                 "timestamps": window.timestamps, "scrapes": window.scrapes,
                 "scrape_interval_known": window.scrape_interval_known}

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
