"""Tables for notebooks: fragscope's results as pandas DataFrames (the interface people expect there).

    import fragscope.notebook as fs
    res = fs.load("incident.om.gz")        # a recording (or a Window)
    res.frame                               # canonical signals over time, one column per signal (and GPU)
    res.findings                            # one row per finding: id, severity, confidence, onset, basis, ...
    res.evidence                            # one row per evidence item of each finding
    res.inconclusive                        # what could not be judged, and why
    fs.fleet_table(fleet_report)            # one row per serving target of `diagnose --prometheus`

pandas is optional (``pip install 'fragscope[notebook]'``) and imported here only: the agent and the CLI
never import it (tests/test_notebook.py checks a running agent's modules). Times are UTC timestamps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .detectors.frame import Frame, build_frame
from .model import Report, Window
from .pipeline import diagnose

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def _pd():
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("fragscope.notebook needs pandas: pip install 'fragscope[notebook]'") from e
    return pd


@dataclass
class Result:
    window: Window
    report: Report
    _frame: Frame

    @property
    def frame(self) -> "pd.DataFrame":
        return frame_table(self._frame)

    @property
    def findings(self) -> "pd.DataFrame":
        return findings_table(self.report)

    @property
    def evidence(self) -> "pd.DataFrame":
        return evidence_table(self.report)

    @property
    def inconclusive(self) -> "pd.DataFrame":
        pd = _pd()
        return pd.DataFrame([i.to_dict() for i in self.report.inconclusive], columns=["id", "missing", "reason", "subject"])


def load(source: Any) -> Result:
    """Diagnose a recording (path) or a Window and return its tables."""
    if isinstance(source, Window):
        w = source
    else:
        from .collectors.exposition import read_recording

        w = read_recording(str(source))
    return Result(w, diagnose(w), build_frame(w))


def _ts(pd, x):
    return pd.to_datetime(x, unit="s", utc=True)


def frame_table(f: Frame) -> "pd.DataFrame":
    """The detectors' frame: engine signals by name, GPU signals as ``gpu<N>:<signal>``, throttle reasons as
    ``gpu<N>:throttle:<reason>``; counters as per-second rates (docs/signals.md)."""
    pd = _pd()
    cols: dict[str, Any] = {k: v for k, v in sorted(f.engine.items())}
    for g in f.gpus():
        for k, v in sorted(f.gpu.get(g, {}).items()):
            cols[f"gpu{g}:{k}"] = v
        for r, v in sorted(f.throttle.get(g, {}).items()):
            cols[f"gpu{g}:throttle:{r}"] = v
    df = pd.DataFrame(cols, index=_ts(pd, f.t))
    df.index.name = "time"
    return df


def findings_table(report: Report) -> "pd.DataFrame":
    pd = _pd()
    rows = []
    for f in report.findings:
        rows.append({"id": f.id, "severity": f.severity.value, "confidence": f.confidence, "basis": f.basis,
                     "onset": _ts(pd, f.onset) if f.onset is not None else pd.NaT,
                     "threshold_crossed": _ts(pd, f.threshold_crossed) if f.threshold_crossed is not None else pd.NaT,
                     "subject": ",".join(f"{k}={v}" for k, v in f.subject.items()), "summary": f.summary,
                     "actions": list((f.playbook or {}).get("actions", []))})
    return pd.DataFrame(rows, columns=["id", "severity", "confidence", "basis", "onset", "threshold_crossed",
                                       "subject", "summary", "actions"])


def evidence_table(report: Report) -> "pd.DataFrame":
    pd = _pd()
    rows = [{"finding": f.id, "signal": e.signal, "observed": e.observed, "baseline": e.baseline,
             "threshold": e.threshold, "unit": e.unit, "agrees": e.agrees, "note": e.note}
            for f in report.findings for e in f.evidence]
    return pd.DataFrame(rows, columns=["finding", "signal", "observed", "baseline", "threshold", "unit", "agrees",
                                       "note"])


def fleet_table(fleet) -> "pd.DataFrame":
    """One row per target of a FleetReport (fragscope.fleet.diagnose_fleet)."""
    pd = _pd()
    rows = []
    for t in fleet.targets:
        top = t.top
        rows.append({"target": str(t.id), "model": t.model, "throughput_tokens_per_second": t.throughput,
                     "fragmentation_ratio": t.fragmentation, "top_finding": top.id if top else None,
                     "severity": top.severity.value if top else None,
                     "findings": len(t.report.findings) if t.report else 0, "error": t.error})
    return pd.DataFrame(rows, columns=["target", "model", "throughput_tokens_per_second", "fragmentation_ratio",
                                       "top_finding", "severity", "findings", "error"])
