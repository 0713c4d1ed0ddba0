"""The diagnosis registry: every diagnosis fragscope can report, declared once.

A :class:`Diagnosis` names its id (a contract, docs/diagnoses.md), where its verdict comes from
(``window``: a detector over metrics; ``snapshot``, ``trace``, ``log``: deep evidence), its detector
and config for window diagnoses, the canonical signals it requires and those that corroborate
(ids from :mod:`fragscope.signals`), its playbook and the function that computes concrete actions
from the detector's context. The pipeline, ``diagnose explain``, the agent's exporter, the docs
and alert-rule checks, the scenario families and the evaluation all read their lists from here.
Adding a diagnosis: docs/diagnoses.md "Adding a diagnosis".
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..model import Finding, Inconclusive, Playbook

SOURCES = ("window", "snapshot", "trace", "log", "config")
CAPTURE_KINDS = ("snapshot", "profile")  # the agent's captures (agent/capture.py KINDS)  # config: a model config + counters (Triton)

ActionsFn = Callable[[dict, dict], list[str]]


def _no_actions(ctx: dict, config: dict) -> list[str]:
    return []


@dataclass(frozen=True)
class Diagnosis:
    id: str
    playbook: Playbook
    source: str = "window"  # window | snapshot | trace | log | config (the first place it is judged)
    detect: Callable[..., "list[Finding] | Inconclusive"] | None = None  # window diagnoses
    config: Any = None  # the detector's Config class (thresholds, documented in docs/diagnoses.md)
    requires: tuple[str, ...] = ()  # canonical signal ids; "a|b" = either
    corroborates: tuple[str, ...] = ()
    actions: ActionsFn = _no_actions  # concrete actions from the finding's context and the engine config
    also_from: tuple[str, ...] = ()  # other evidence kinds that report the same id
    # Window diagnoses are exported by the agent (fragscope_diagnosis_active) and need an alert rule,
    # a promtool rule test and a scenario family; deep-evidence ones are reported by diagnose only.
    alerting: bool = True
    # The alert rule, generated from the detector's Config (its module's ``alert_rule``): the rule file
    # dashboards/rules/fragscope-alerts.yml is written from these (python -m fragscope.fleet.alerts).
    alert: Callable[[], Any] | None = None
    # The fleet triage's level check (its module's ``TRIAGE``, a promql.TriageCheck): run by
    # fragscope/fleet/triage.py and recorded by dashboards/rules/fragscope-triage.yml; None: not triaged.
    triage: Any = None
    # The captures the agent takes when the finding becomes active ("snapshot": a memory snapshot through the
    # probe; "profile": a short engine profile), to show exactly where (docs/captures.md#triggers).
    capture: tuple[str, ...] = ()
    # Diagnoses whose signature in the window keeps this one quiet: the pipeline drops this diagnosis's change
    # findings, and the doubts it had about a GPU, where one of them shows (each suppressor's ``signature``).
    # Read by the pipeline; the look-alike column of docs/diagnoses.md says it in words.
    suppressed_by: tuple[str, ...] = ()
    # This diagnosis's signature, for those it suppresses: (frame, spans) -> whether it shows in the window.
    signature: Callable[..., bool] | None = None
    runs_on_short_windows: bool = False  # the detector itself judges windows too short for a baseline
    # Level evidence (the module's ``level``): the present state judged by itself. Runs on windows too
    # short for a baseline, and on long ones when the change detector found nothing (the window may lie
    # wholly inside the incident) unless ``level_on_long_windows`` is False.
    level: Callable[..., "list[Finding] | Inconclusive"] | None = None
    level_on_long_windows: bool = True
    # Why a short window cannot judge it (a trend-only diagnosis), and how long to wait.
    short_window_reason: str = ""
    # A trend-only diagnosis needs this much window: shorter ones are inconclusive when it finds nothing.
    min_trend_span_s: float = 0.0

    def __post_init__(self) -> None:
        for k in self.capture:
            if k not in CAPTURE_KINDS:
                raise ValueError(f"{self.id}: capture kind {k!r} is not one of {CAPTURE_KINDS}")
        if self.source not in SOURCES:
            raise ValueError(f"{self.id}: source must be one of {SOURCES}")
        if self.playbook.id != self.id:
            raise ValueError(f"{self.id}: playbook id {self.playbook.id!r} differs")
        if self.source == "window" and self.detect is None:
            raise ValueError(f"{self.id}: a window diagnosis needs a detector")
        if self.requires or self.corroborates:
            from ..signals import SIGNALS  # (the signal table only where a diagnosis names signals)
        for req in self.requires + self.corroborates:
            for alt in req.split("|"):
                if alt not in SIGNALS:
                    raise ValueError(f"{self.id}: unknown signal {alt!r} (fragscope/signals.py)")

    @property
    def title(self) -> str:
        return self.playbook.title

    @classmethod
    def from_module(cls, mod: Any, playbook: Playbook | None = None, **kw: Any) -> "Diagnosis":
        """A window diagnosis as its module declares it (docs/diagnoses.md, "Adding a diagnosis"): ``ID``,
        ``detect``, ``Config``, ``REQUIRES``, ``CORROBORATES``, ``PLAYBOOK`` and, where the module has them,
        ``actions``, ``level``, ``alert_rule``, ``TRIAGE``, ``signature``, ``SUPPRESSED_BY``, ``CAPTURE``,
        ``ALSO_FROM``, ``RUNS_ON_SHORT_WINDOWS``, ``LEVEL_ON_LONG_WINDOWS``, ``SHORT_WINDOW_REASON`` and ``MIN_TREND_SPAN_S``.
        ``playbook`` and ``kw`` override. A module without a ``PLAYBOOK`` gets an empty one, which the registry
        test reports with every other gap."""
        fields: dict[str, Any] = {"detect": mod.detect, "config": getattr(mod, "Config", None),
                                  "requires": tuple(getattr(mod, "REQUIRES", ())),
                                  "corroborates": tuple(getattr(mod, "CORROBORATES", ()))}
        for attr, key in MODULE_FIELDS:
            v = getattr(mod, attr, None)
            if v is not None and not isinstance(v, type(mod)):  # a function or value, never a submodule
                fields[key] = v
        fields.update(kw)
        playbook = playbook or getattr(mod, "PLAYBOOK", None) or Playbook(mod.ID, "", "", [], [], [])
        return cls(mod.ID, playbook, **fields)


# What :meth:`Diagnosis.from_module` reads from a diagnosis module beyond its detector: (module name, field).
MODULE_FIELDS = (("actions", "actions"), ("level", "level"), ("alert_rule", "alert"), ("TRIAGE", "triage"),
                 ("signature", "signature"), ("SUPPRESSED_BY", "suppressed_by"), ("CAPTURE", "capture"),
                 ("ALSO_FROM", "also_from"),
                 ("RUNS_ON_SHORT_WINDOWS", "runs_on_short_windows"), ("LEVEL_ON_LONG_WINDOWS", "level_on_long_windows"),
                 ("SHORT_WINDOW_REASON", "short_window_reason"), ("MIN_TREND_SPAN_S", "min_trend_span_s"))


@dataclass(frozen=True)
class Source:
    """Where some diagnoses are declared: ``load()`` returns them (importing their module). ``name`` is the
    module's name (a lookup by id tries the source named like the id first); ``local``: declared in this
    package without importing detectors, so a lookup tries it before the others; ``window``: it declares
    the window diagnoses (the pipeline's run list loads these sources alone; any other that declares one is
    an error when it loads)."""
    name: str
    load: Callable[[], "list[Diagnosis]"]
    local: bool = False
    window: bool = False


@dataclass
class Registry:
    """Every diagnosis, in declaration order: the ``sources`` in order, then those ``add``ed.

    Iterating (and every listing) loads all sources; a lookup by id (``get``, ``in``, ``[]``) loads one
    source at a time until the id is found (the one named like the id first, then the local ones, then
    the rest in order), so ``diagnose trace`` resolves its few verdicts without importing every window
    detector with its dependencies."""
    _items: dict[str, Diagnosis] = field(default_factory=dict)
    sources: tuple[Source, ...] = ()
    _parts: dict[int, list[Diagnosis]] = field(default_factory=dict)  # loaded sources
    _added: dict[str, Diagnosis] = field(default_factory=dict)
    _complete: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # (the agent's threads look up too)

    def add(self, d: Diagnosis) -> Diagnosis:
        with self._lock:
            if d.id in self._items:  # (a source not loaded yet that declares it too: raised when it loads)
                raise ValueError(f"diagnosis {d.id!r} registered twice")
            self._added[d.id] = d
            self._items[d.id] = d
        return d

    def _load(self, i: int) -> None:
        if i in self._parts:
            return
        part = list(self.sources[i].load())
        for d in part:
            if d.id in self._items:
                raise ValueError(f"diagnosis {d.id!r} registered twice")
            if d.source == "window" and not self.sources[i].window:
                raise ValueError(f"diagnosis {d.id!r}: a window diagnosis from source {self.sources[i].name!r}, "
                                 "which is not marked window")
            self._items[d.id] = d
        self._parts[i] = part

    def _all(self) -> "Registry":
        if self._complete:
            return self
        with self._lock:
            if self._complete:
                return self
            for i in range(len(self.sources)):
                self._load(i)
            # declaration order: the sources in order, then the diagnoses added
            items = {d.id: d for i in range(len(self.sources)) for d in self._parts[i]}
            items.update(self._added)
            self._items = items
            self._complete = True
        return self

    def get(self, did: str) -> Diagnosis | None:
        d = self._items.get(did)
        if d is not None or self._complete:
            return d
        key = did.replace("-", "_") if isinstance(did, str) else ""
        with self._lock:
            order = sorted((i for i in range(len(self.sources)) if i not in self._parts),
                           key=lambda i: (self.sources[i].name not in key, not self.sources[i].local, i))
            for i in order:
                self._load(i)
                d = self._items.get(did)
                if d is not None:
                    return d
        self._all()
        return self._items.get(did)

    def __getitem__(self, did: str) -> Diagnosis:
        d = self.get(did)
        if d is None:
            raise KeyError(did)
        return d

    def __contains__(self, did: object) -> bool:
        return isinstance(did, str) and self.get(did) is not None

    def __iter__(self):
        return iter(self._all()._items.values())

    def __len__(self) -> int:
        return len(self._all()._items)

    def ids(self, source: str | None = None) -> tuple[str, ...]:
        return tuple(d.id for d in self if source is None or d.source == source)

    def window(self) -> list[Diagnosis]:
        """Window diagnoses in run order (the order of iterating over all): those of the sources marked
        ``window``, then those added; the deep-evidence sources stay unloaded."""
        marked = [i for i, s in enumerate(self.sources) if s.window]
        with self._lock:
            for i in marked:
                self._load(i)
            return ([d for i in marked for d in self._parts[i] if d.source == "window"]
                    + [d for d in self._added.values() if d.source == "window"])

    def alerting(self) -> tuple[str, ...]:
        return tuple(d.id for d in self if d.alerting)


def raw_names(signal_id: str) -> list[str]:
    """The raw metric names a canonical signal is read from (signals.py), for "missing" lists."""
    from ..signals import SIGNALS

    return [s.metric for s in SIGNALS[signal_id].sources]


def thresholds_markdown(registry: "Registry") -> str:
    """The thresholds of every window diagnosis, from its Config (docs/diagnoses.md#thresholds; a test checks
    the committed table is current): the values the detector, its level rule and its alert rule run with."""
    import dataclasses

    rows = [THRESHOLDS_BEGIN, "", "| diagnosis | Config field | value |", "|---|---|---|"]
    for d in registry.window():
        if d.config is None or not dataclasses.is_dataclass(d.config):
            continue
        cfg = d.config()
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            text = ", ".join(map(str, v)) if isinstance(v, tuple) else (f"{v:g}" if isinstance(v, float) else str(v))
            rows.append(f"| `{d.id}` | `{f.name}` | {text} |")
    rows += ["", THRESHOLDS_END]
    return "\n".join(rows)


THRESHOLDS_BEGIN = "<!-- generated by python -m fragscope.playbooks: do not edit -->"
THRESHOLDS_END = "<!-- end of generated threshold table -->"

