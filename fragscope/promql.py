"""PromQL from the signal table: selectors that read every engine's and exporter's name for a canonical
signal (fragscope/signals.py), scaled to base units and keyed per target, and the alert-rule record the
diagnoses generate from their Configs.

Used by the window diagnoses (their alert rules and fleet-triage checks, generated from the same Config
as their detectors: docs/dashboards.md#alerts), by the fleet triage (fragscope/fleet/triage.py) and by
the rule-file generator (fragscope/fleet/alerts.py). Depends on the data model only.

Series are keyed per target the way the fleet groups them: ``exported_pod`` / ``exported_namespace``
(dcgm-exporter scraped without ``honor_labels``) become ``pod`` / ``namespace``, and ``instance`` is
dropped from series that have a pod.
"""
from __future__ import annotations

import contextvars
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .signals import SIGNALS

TARGET_KEYS = ("namespace", "pod", "instance")
K = ", ".join(TARGET_KEYS)  # per target
KG = K + ", gpu"  # per target and GPU
PRESENT = "1m"  # the present, as the level rules judge it (their last minute)
RATE_RANGE = "2m"  # a rate needs two samples: 2 min holds four at a 30 s scrape interval

Matchers = Sequence[tuple[str, str, str]]


def quote(v: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rx_escape(s: str) -> str:
    """Escape RE2 metacharacters only (Python's re.escape also escapes spaces, which RE2 refuses)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", s)


def name_regex(names: Sequence[str]) -> str:
    """An alternation of the exact names (vLLM's also as Ray Serve LLM re-exports them, ``ray_vllm:``).

    Only literals joined by ``|``: Prometheus then looks each name up in its index instead of matching the
    regular expression against every metric name it holds (its "set matches" fast path, see
    ``FastRegexMatcher`` in prometheus/model/labels/regexp.go), which is most of a rule's cost where the
    server holds many names.
    """
    alts = []
    for n in names:
        esc = rx_escape(n)
        alts.append(esc)
        if n.startswith("vllm:"):  # Ray Serve LLM re-exports as ray_vllm:
            alts.append("ray_" + esc)
    return "|".join(alts)


def variants(names: Sequence[str], matchers: Matchers) -> list[str]:
    """Selectors for ``names`` with the user's matchers; DCGM names also with the exported_ labels."""
    out = []
    vs = [list(matchers)]
    if any(n.startswith("DCGM_") for n in names) and any(k in ("pod", "namespace") for k, _, _ in matchers):
        vs.append([(("exported_" + k) if k in ("pod", "namespace") else k, op, v) for k, op, v in matchers])
    for m in vs:
        inner = f'__name__=~{quote(name_regex(names))}'
        if m:
            inner += "," + ",".join(f"{k}{op}{quote(v)}" for k, op, v in m)
        out.append("{" + inner + "}")
    return out


def norm(expr: str) -> str:
    """Relabel so one target's series share (namespace, pod, instance), as fleet.pod_of groups them."""
    e = f'label_replace({expr}, "pod", "$1", "exported_pod", "(.+)")'
    e = f'label_replace({e}, "namespace", "$1", "exported_namespace", "(.+)")'
    return f'label_replace({e}, "instance", "", "pod", ".+")'


# A signal as a rule reads it: (signal id, fn, range, extra matchers, name suffix), the arguments of sig().
SignalUse = tuple[str, str, "str | None", str, str]
# While a rule file is generated: the signal reads seen (to find those several rules repeat), and the
# recorded series that stand for them (sig() then answers with the recorded name).
_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("fragscope_promql_seen", default=None)
_RECORDED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fragscope_promql_recorded", default=None)

# fn -> the operation's part of a recorded series' name; only functions that drop the metric name (a recorded
# series must not merge two raw names into one label set) and read no offset.
_RECORDABLE_FN = {"avg_over_time({})": "avg", "max_over_time({})": "max", "min_over_time({})": "min",
                  "rate({})": "rate", "increase({})": "increase", "deriv({})": "deriv"}


def shared(name: str, expr: str) -> str:
    """A sub-expression one rule reads several times (or several rules read), aggregated so that it carries
    no metric name: a rule file may record it once as ``name`` (inside :func:`reading_recorded` this answers
    with the recorded series); elsewhere it is ``expr`` itself."""
    use = (name, expr)
    seen, recorded = _SEEN.get(), _RECORDED.get()
    if seen is not None:
        seen.append(use)
    if recorded and use in recorded:
        return f"({recorded[use]})"
    return f"({expr})"


def recorded_name(use) -> str | None:
    """The recording rule's name for a signal read (``fragscope:<signal>:<op>_<range>``, with the extra matchers
    and suffix) or a :func:`shared` sub-expression (its own name), None where the read cannot be recorded as
    it is (an instant selector, an offset, ...)."""
    if len(use) == 2:
        return use[0]
    sig_id, fn, rng, extra, suffix = use
    m = re.fullmatch(r"quantile_over_time\((0\.\d+), \{\}\)", fn)
    op = f"p{round(float(m.group(1)) * 100):d}" if m else _RECORDABLE_FN.get(fn)
    if op is None or not rng:
        return None
    name = f"fragscope:{sig_id}{suffix}:{op}_{rng}"
    if extra:
        name += "_" + re.sub(r"[^a-zA-Z0-9]+", "_", extra).strip("_")
    return name


@contextmanager
def noting_signal_reads():
    """Collect every sig() call without matchers made inside (each a SignalUse, in call order)."""
    seen: list = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


@contextmanager
def reading_recorded(names: dict):
    """Inside, sig() without matchers answers with the recorded series ``names[use]`` where there is one."""
    token = _RECORDED.set(names)
    try:
        yield
    finally:
        _RECORDED.reset(token)


def sig(sig_id: str, fn: str, rng: str | None, matchers: Matchers = (), extra: str = "", suffix: str = "") -> str:
    """``fn`` applied to every raw source of a signal, scaled to base units, normalised, or-ed.

    ``fn`` holds ``{}`` where the (range) selector goes; ``extra`` is added inside the braces
    (e.g. ``reason=~"..."``); ``suffix`` is appended to each raw name (``_sum``, ``_count`` of a histogram).
    Inside :func:`reading_recorded`, a read the rule file records is its recorded series instead (the same
    vector: the recording rule is this very expression, evaluated before the rules that read it).
    """
    if not matchers:
        use = (sig_id, fn, rng, extra, suffix)
        seen, recorded = _SEEN.get(), _RECORDED.get()
        if seen is not None:
            seen.append(use)
        if recorded and use in recorded:
            return f"({recorded[use]})"
    by_scale: dict[float, list[str]] = defaultdict(list)
    for src in SIGNALS[sig_id].sources:
        by_scale[src.scale].append(src.metric + suffix)
    terms = []
    for scale, names in by_scale.items():
        for s in variants(names, matchers):
            if extra:
                s = s[:-1] + "," + extra + "}"
            e = fn.format(s + (f"[{rng}]" if rng else ""))
            if scale != 1:
                e = f"({e}) * {scale:g}"
            terms.append(norm(e))
    return "(" + " or ".join(terms) + ")"


# The target an alert is about: namespace/pod where Kubernetes discovery labels it, else the instance.
TARGET_TEMPLATE = "{{ with $labels.pod }}{{ $labels.namespace }}/{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"


def num(x: float) -> str:
    """A threshold as it appears in generated PromQL (``%g``); tests find Config values by this text."""
    return f"{x:g}"


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alert, generated from a diagnosis's Config (dashboards/rules/fragscope-alerts.yml).

    ``thresholds`` names each Config field the expression compares against, with the value used: the
    tests check each equals the detector's Config and appears in ``expr`` (docs/dashboards.md#alerts).
    """

    name: str  # FragscopeSomething
    diagnosis: str
    expr: str
    for_: str  # Prometheus duration
    severity: str  # info | warning | critical: the alert's fixed label
    summary: str  # after the target (TARGET_TEMPLATE): Go template over $labels
    description: str
    comment: str = ""  # the YAML comment above the rule: what it judges, in words
    thresholds: dict[str, float] = field(default_factory=dict)
    # how a threshold appears in ``expr`` where not as ``num(value)`` (e.g. a range of twice it)
    shown: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TriageCheck:
    """A window diagnosis's fleet-triage check, declared in its module (``TRIAGE``): the level rule in
    PromQL, yielding the primary value where a target (GPU) trips it and nothing elsewhere.

    The fleet triage (fragscope/fleet/triage.py) runs every registered diagnosis's check, as subqueries or
    as the recording rule ``fragscope:triage_<diagnosis id with _>:<record>`` (dashboards/rules/fragscope-triage.yml).
    """

    value: str  # what the value is: a name with its unit (kv_cache_usage_p90_ratio)
    agg: str  # how the window's worst value is taken: max_over_time | min_over_time
    expr: Callable[..., str]  # (matchers, present, rate) -> PromQL, thresholds from the module's Config
    record: str  # the recorded series' last name part

    def __post_init__(self) -> None:
        if self.agg not in ("max_over_time", "min_over_time"):
            raise ValueError(f"triage check {self.value}: agg must be max_over_time or min_over_time")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.record):
            raise ValueError(f"triage check {self.value}: record {self.record!r} is not a metric name part")
