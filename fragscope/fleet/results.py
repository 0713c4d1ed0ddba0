"""The fleet report's data and its JSON contract: Outlier, FleetTarget, FleetReport (``to_dict`` is the
output of ``diagnose --prometheus --format json``, documented in docs/fleet.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..model import Report, Window, rank_findings
from .grouping import TargetId


def _r(x: float | None, nd: int = 4) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


@dataclass
class Outlier:
    """A target whose figure differs from its peers serving the same model (fleet.outliers)."""

    target: str
    model: str
    metric: str  # "throughput_tokens_per_second" | "fragmentation_ratio"
    value: float
    peer_median: float
    robust_z: float
    direction: str  # "low" | "high"
    peers: int

    def to_dict(self) -> dict:
        return {"target": self.target, "model": self.model, "metric": self.metric,
                "value": _r(self.value), "peer_median": _r(self.peer_median),
                "robust_z": round(self.robust_z, 2), "direction": self.direction, "peers": self.peers}


@dataclass
class FleetTarget:
    """One serving target: its triage flags, its figures and (when deep-diagnosed) its report."""

    id: TargetId
    window: Window | None  # dropped after diagnosis when streaming (triage mode); None if not examined
    report: Report | None = None
    error: str | None = None  # the detectors failed on this target (one line)
    model: str | None = None
    throughput: float | None = None
    fragmentation: float | None = None
    missing_signals: list[str] | None = field(default_factory=list)  # None: not examined
    series_count: int | None = None  # series deep-fetched (None: not examined)
    flags: list = field(default_factory=list)  # triage.Flag, the level checks this target tripped
    examined: str | None = "deep"  # why deep-fetched: flagged | outlier | peer-sample | whole-fleet | deep; None: not

    @property
    def top(self):
        if self.report is None or not self.report.findings:
            return None
        return rank_findings(self.report.findings)[0]

    @property
    def status(self) -> str:
        if self.error:
            return "error"
        if self.examined is None:
            return "flagged" if self.flags else "triage-clear"
        if self.top is not None:
            return "finding"
        if self.report is not None and self.report.inconclusive:
            return "inconclusive"
        return "no-finding"

    def to_dict(self) -> dict:
        top = self.top
        return {
            "target": str(self.id),
            "kind": self.id.kind,
            "namespace": self.id.namespace,
            "pod": self.id.name if self.id.kind == "pod" else None,
            "instance": self.id.name if self.id.kind in ("instance", "host") else None,
            "model": self.model,
            "status": self.status,
            "top_finding": None if top is None else {
                "id": top.id, "severity": top.severity.value, "confidence": round(float(top.confidence), 3),
                "onset": top.onset, "summary": top.summary},
            "throughput_tokens_per_second": _r(self.throughput),
            "fragmentation_ratio": _r(self.fragmentation),
            "series": self.series_count if self.series_count is not None else (
                len(self.window) if self.window is not None else None),
            "missing_signals": None if self.missing_signals is None else list(self.missing_signals),
            "error": self.error,
            "triage": {"flagged": bool(self.flags), "checks": [f.to_dict() for f in self.flags],
                       "examined": self.examined},
            "report": self.report.to_dict() if self.report is not None else None,
        }


@dataclass
class FleetReport:
    """The whole fleet: every target, the outliers, what the fetch cost and what was missing everywhere."""

    source: str
    window: tuple[float, float]
    selector: str | None
    mode: str
    step: float | None
    targets: list[FleetTarget]
    outliers: list[Outlier]
    queries: int
    fetch_seconds: float
    diagnose_seconds: float
    series: int
    missing_everywhere: list[str]
    notes: list[str] = field(default_factory=list)
    triage: dict | None = None  # fleet.triage (docs/fleet.md#triage); {"mode": "off"} on the full download

    def ordered(self) -> list[FleetTarget]:
        """Worst first: top severity, then flagged by the triage, then confidence, then name."""
        def key(t: FleetTarget):
            top = t.top
            return (-(top.severity.rank if top else -1), not t.flags, -(top.confidence if top else 0), str(t.id))
        return sorted(self.targets, key=key)

    def to_dict(self) -> dict:
        return {
            "fleet": {
                "source": self.source,
                "window": {"start": self.window[0], "end": self.window[1]},
                "selector": self.selector,
                "mode": self.mode,
                "step": self.step,
                "queries": self.queries,
                "fetch_seconds": round(self.fetch_seconds, 3),
                "diagnose_seconds": round(self.diagnose_seconds, 3),
                "series": self.series,
                "targets": len(self.targets),
                "missing_everywhere": list(self.missing_everywhere),
                "notes": list(self.notes),
                "triage": self.triage if self.triage is not None else {"mode": "off"},
            },
            "targets": [t.to_dict() for t in self.ordered()],
            "outliers": [o.to_dict() for o in self.outliers],
        }
