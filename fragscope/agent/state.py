"""What the agent's threads share: each collector's health, the detectors' health, the latest report.

The exporter and the API read these without locks: every field is replaced atomically by the one
thread that owns it (a collector's thread, the detector thread, housekeeping).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..model import Missing, Report, Sample
from .budget import SeriesBudget
from .config import AgentConfig
from .ring import Ring
from .store import Store


@dataclass
class CollectorHealth:
    """What the exporter and the API report about one collector (read without locks: each field
    is replaced atomically by the collector's thread)."""

    name: str
    kind: str
    interval: float
    timeout: float
    up: bool | None = None  # None: not run yet
    last_error: str | None = None
    errors_total: int = 0
    runs_total: int = 0
    last_duration: float | None = None
    last_success: float | None = None  # unix seconds
    down_since: float | None = None  # unix seconds: when it last went down (None while up)
    in_flight_since: float | None = None  # monotonic, while a collect() call runs
    backoff: float = 0.0
    cpu_seconds: float = 0.0  # thread CPU spent collecting and storing this collector's samples
    latest: list[Sample] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    budget: SeriesBudget = field(default_factory=SeriesBudget)  # series and labels admitted (agent/budget.py)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "interval_seconds": self.interval, "up": self.up,
                "error": self.last_error, "errors_total": self.errors_total, "runs_total": self.runs_total,
                "duration_seconds": self.last_duration, "last_success": self.last_success,
                "down_since": self.down_since,
                "backoff_seconds": self.backoff, "cpu_seconds": round(self.cpu_seconds, 4),
                "samples": len(self.latest), "limits": self.budget.to_dict(),
                "missing": [{"name": m.name, "labels": dict(m.labels), "reason": str(getattr(m.reason, "value",
                                                                                               m.reason)),
                             "detail": m.detail} for m in self.missing[:50]]}


@dataclass
class DetectorHealth:
    runs: int = 0
    errors: int = 0
    last_run: float | None = None
    last_duration: float | None = None
    last_error: str | None = None
    cpu_seconds: float = 0.0  # full runs and watch passes
    watch_cpu_seconds: float = 0.0  # the watch passes' part of cpu_seconds
    watch_runs: int = 0  # watch passes that judged the present (skipped ones not counted)
    watch_skipped: int = 0  # watch passes skipped: no sample reached the ring since the last one


@dataclass
class AgentState:
    """Everything the exporter and API read. ``version`` grows on every change (exporter cache)."""

    cfg: AgentConfig
    collectors: dict[str, CollectorHealth] = field(default_factory=dict)
    report: Report | None = None
    report_at: float | None = None
    store: Store | None = None
    ring: Ring | None = None
    detector: DetectorHealth = field(default_factory=DetectorHealth)
    started: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    first_round_done: bool = False
    heartbeat: float = field(default_factory=time.monotonic)  # monotonic, by the main loop
    version: int = 0
    notes: list[str] = field(default_factory=list)
    clock_jumps: int = 0
    last_clock_jump_seconds: float | None = None
    housekeeping_cpu_seconds: float = 0.0  # history flushes, retention, watchdog, memory trim

    def bump(self) -> None:
        self.version += 1
