"""fragscope's data model: samples, series, windows, findings.

Everything above this module (collectors, detectors, playbooks, agent, CLI) speaks these types.
Units are SI base units (seconds, bytes, hertz, ratios 0-1). A value that could not be read is
never 0: collectors emit a :class:`Missing` with a reason, series simply have no point there.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


def make_labels(labels: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> Labels:
    """Canonical, hashable label set (sorted by name)."""
    if not labels:
        return ()
    items = labels.items() if isinstance(labels, Mapping) else labels
    return tuple(sorted((str(k), str(v)) for k, v in items))


# ---------------------------------------------------------------------------------------------
# "not available" reasons (STYLE.md: absent is not zero)
class Reason(str, enum.Enum):
    UNSUPPORTED = "unsupported"
    NO_PERMISSION = "no_permission"
    SOURCE_DOWN = "source_down"
    NOT_EXPOSED = "not_exposed_by_this_version"
    NOT_COLLECTED = "not_collected"
    NO_GPU = "no_gpu"
    PARSE_ERROR = "parse_error"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of one series. ``value`` is a float in base units (NaN never stored)."""

    name: str
    labels: Labels
    ts: float  # unix seconds
    value: float


@dataclass(frozen=True, slots=True)
class Missing:
    """A signal a collector could not read this tick, and why."""

    name: str
    labels: Labels
    ts: float
    reason: Reason | str
    detail: str = ""


class Collector(Protocol):
    """What the agent schedules. ``collect`` never raises: failures become Missing entries."""

    name: str

    def collect(self, now: float) -> "CollectResult": ...


@dataclass(slots=True)
class CollectResult:
    samples: list[Sample] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    up: bool = True
    error: str | None = None  # one line, when up is False


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SeriesKey:
    name: str
    labels: Labels = ()

    def label(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == name:
                return v
        return default

    def without(self, *names: str) -> Labels:
        return tuple((k, v) for k, v in self.labels if k not in names)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}"


@dataclass(slots=True)
class Series:
    """A time series: strictly increasing ``ts`` (unix seconds) and finite ``values``."""

    key: SeriesKey
    ts: np.ndarray
    values: np.ndarray
    type: str = "untyped"  # gauge | counter | histogram | summary | info | untyped

    @property
    def name(self) -> str:
        return self.key.name

    def __len__(self) -> int:
        return int(self.ts.size)

    def between(self, start: float, end: float) -> "Series":
        import numpy as np  # (not at module level: the data model is imported where numpy is not, diagnose trace)

        lo, hi = np.searchsorted(self.ts, [start, end], side="left")
        hi = np.searchsorted(self.ts, end, side="right")
        return Series(self.key, self.ts[lo:hi], self.values[lo:hi], self.type)


def clean_series(key: SeriesKey, ts: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
                 type: str = "untyped") -> tuple[Series, int]:
    """Sort by time, drop non-finite values and duplicate timestamps (last one wins).

    Returns the series and the number of points dropped (reported, never silent).
    """
    import numpy as np

    t = np.asarray(ts, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    n0 = t.size
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    if t.size > 1 and not np.all(t[1:] > t[:-1]):
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        # keep the last sample of each timestamp
        last = np.ones(t.size, dtype=bool)
        last[:-1] = t[1:] != t[:-1]
        t, v = t[last], v[last]
    return Series(key, t, v, type), int(n0 - t.size)


@dataclass(slots=True)
class Window:
    """All series observed over [start, end] for one target (a pod, a recording, a live server)."""

    series: dict[SeriesKey, Series]
    start: float
    end: float
    source: str = ""
    dropped_points: int = 0  # non-finite values and duplicate timestamps removed at ingest
    notes: list[str] = field(default_factory=list)
    # How the times were obtained (docs/collectors.md#scrapes-without-timestamps), set by the readers:
    # "recorded": every sample carries its own time (a recording, a live scrape); "none": scrape text
    # without timestamps (a `curl /metrics` file, a paste): the times are synthetic.
    timestamps: str = "recorded"
    # Successive scrapes of one target in a file without timestamps (1: a single scrape, only the
    # present state and lifetime counters); None when the samples carry their own times.
    scrapes: int | None = None
    # False: the spacing between scrapes is assumed, not known: no per-second rate from it.
    scrape_interval_known: bool = True

    @classmethod
    def from_samples(cls, samples: Iterable[Sample], source: str = "",
                     types: Mapping[str, str] | None = None) -> "Window":
        cols: dict[SeriesKey, tuple[list[float], list[float]]] = {}
        for s in samples:
            key = SeriesKey(s.name, s.labels)
            c = cols.get(key)
            if c is None:
                c = cols[key] = ([], [])
            c[0].append(s.ts)
            c[1].append(s.value)
        return cls.from_columns(cols, source=source, types=types)

    @classmethod
    def from_columns(cls, cols: Mapping[SeriesKey, tuple[Sequence[float], Sequence[float]]],
                     source: str = "", types: Mapping[str, str] | None = None) -> "Window":
        types = types or {}
        out: dict[SeriesKey, Series] = {}
        dropped = 0
        start, end = math.inf, -math.inf
        for key, (ts, vs) in cols.items():
            s, d = clean_series(key, ts, vs, types.get(key.name, "untyped"))
            dropped += d
            if len(s):
                out[key] = s
                start = min(start, float(s.ts[0]))
                end = max(end, float(s.ts[-1]))
        if not out:
            start = end = math.nan
        return cls(out, start, end, source, dropped)

    def names(self) -> set[str]:
        return {k.name for k in self.series}

    def select(self, name: str, **match: str) -> list[Series]:
        """Series named ``name`` whose labels include every ``match`` pair."""
        res = []
        for k, s in self.series.items():
            if k.name != name:
                continue
            if match and any(k.label(m) != v for m, v in match.items()):
                continue
            res.append(s)
        return res

    def between(self, start: float, end: float) -> "Window":
        out = {}
        for k, s in self.series.items():
            c = s.between(start, end)
            if len(c):
                out[k] = c
        return Window(out, start, end, self.source, self.dropped_points, list(self.notes),
                      self.timestamps, self.scrapes, self.scrape_interval_known)

    def __iter__(self) -> Iterator[Series]:
        return iter(self.series.values())

    def __len__(self) -> int:
        return len(self.series)


# ---------------------------------------------------------------------------------------------
# Findings
class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "critical": 2}[self.value]

    @property
    def level(self) -> int:
        """The exported number (``fragscope_diagnosis_severity``): 1 info, 2 warning, 3 critical."""
        return self.rank + 1


@dataclass(slots=True)
class Evidence:
    """One signal's contribution: what it did, against what, over which window."""

    signal: str
    observed: float | None
    baseline: float | None = None
    threshold: float | None = None
    unit: str = ""
    window: tuple[float, float] | None = None  # (start, end) unix seconds of the observation
    note: str = ""
    agrees: bool = True  # False: evidence that was checked and speaks against the diagnosis

    def to_dict(self) -> dict:
        d = asdict(self)
        d["window"] = {"start": self.window[0], "end": self.window[1]} if self.window else None
        return d


@dataclass(slots=True)
class Finding:
    id: str  # diagnosis id, a contract: docs/diagnoses.md
    severity: Severity
    confidence: float  # 0-1, grows with each independent agreeing signal
    summary: str  # one factual sentence with numbers
    onset: float | None = None  # unix seconds
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # signals that would confirm it
    subject: dict[str, str] = field(default_factory=dict)  # e.g. {"gpu": "0"}, {"pod": ...}
    playbook: dict | None = None  # the built playbook (Playbook.to_dict() + "actions"), attached by fragscope.playbooks
    attachments: list[dict] = field(default_factory=list)  # deep-evidence verdicts (snapshots, traces)
    # What the detector measured for the playbook's computed actions (never serialised): e.g.
    # {"slack_bytes": ..., "_config": {...}}. fragscope.playbooks.attach_playbooks reads it.
    context: dict = field(default_factory=dict)
    # What the verdict rests on: "change" (the present against a baseline in the window), "level" (the
    # present state by itself, against physical or documented limits: works from one scrape), or
    # "snapshot" / "trace" / "log" for deep evidence.
    basis: str = "change"
    # When the primary signal crossed its threshold, where that differs from the onset (the onset is when
    # the cause began, e.g. traffic rising hours before the KV pool filled).
    threshold_crossed: float | None = None

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "confidence": round(float(self.confidence), 3),
            "onset": self.onset,
            "threshold_crossed": self.threshold_crossed,
            "summary": self.summary,
            "basis": self.basis,
            "subject": dict(self.subject),
            "evidence": [e.to_dict() for e in self.evidence],
            "missing": list(self.missing),
            "playbook": self.playbook,
            "attachments": list(self.attachments),
        }


@dataclass(slots=True)
class Inconclusive:
    """A detector that could not judge: which signals it lacked (never reported as healthy)."""

    id: str
    missing: list[str]
    reason: str = ""
    subject: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"id": self.id, "missing": list(self.missing), "reason": self.reason,
                "subject": dict(self.subject)}


@dataclass
class Action:
    """One durable fix, with when it applies and when it must not be applied."""

    text: str
    preconditions: list[str] = field(default_factory=list)
    contraindications: list[str] = field(default_factory=list)


@dataclass
class Playbook:
    """What to do about a diagnosis: now, for good (with preconditions), and how to verify it worked."""

    id: str
    title: str
    meaning: str
    immediate: list[str]
    durable: list[Action]
    verify: list[str]
    references: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def rank_findings(findings: Iterable[Finding]) -> list[Finding]:
    """critical -> warning -> info, then by confidence (descending)."""
    return sorted(findings, key=lambda f: (-f.severity.rank, -f.confidence, f.id))


@dataclass(slots=True)
class Report:
    """What ``diagnose`` prints: the contract of ``--format json`` (docs/cli.md)."""

    window: tuple[float, float]
    findings: list[Finding] = field(default_factory=list)
    inconclusive: list[Inconclusive] = field(default_factory=list)
    signals: dict = field(default_factory=dict)
    source: str = ""

    def to_dict(self) -> dict:
        return {
            "window": {"start": _finite_or_none(self.window[0]), "end": _finite_or_none(self.window[1])},
            "source": self.source,
            "findings": [f.to_dict() for f in rank_findings(self.findings)],
            "inconclusive": [i.to_dict() for i in self.inconclusive],
            "signals": self.signals,
        }


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(x)
