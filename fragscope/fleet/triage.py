"""Fleet triage in PromQL: the level checks of the window diagnoses, evaluated by the server over the
whole selector, answering only with the targets that trip them (docs/fleet.md#triage).

Every check is one PromQL expression that yields, at each evaluation, the check's primary value for
the targets (and GPUs) that trip it and nothing for the others. Two ways to run them:

* **queries**: each check as a subquery over the window, ``max_over_time((CHECK)[W:1m])`` (and the
  minutes it tripped), one request per check, plus a census of the targets and the peer figures:
  ``len(CHECKS) + 3`` requests (with the memory-leak check) whatever the fleet size.
* **rules**: the same expressions recorded every minute by ``dashboards/rules/fragscope-triage.yml``
  (generated here: :func:`rules_yaml`); the triage is then one instant query over the recorded series
  (plus one that checks they cover the window).

Each check is its diagnosis's level rule, declared once in the diagnosis's module
(``fragscope/detectors/<diagnosis>.py``: ``TRIAGE``, a :class:`fragscope.promql.TriageCheck` over its
``triage_check``) from the same ``Config`` as its detector and its alert rule, and collected here from the
registry; the leak's is the growth rule of ``fragscope/detectors/memory_leak.py``; metric names come
from ``fragscope/signals.py``.
Series are keyed per target the way :func:`fragscope.fleet.pod_of` groups them: ``exported_pod`` /
``exported_namespace`` (dcgm-exporter scraped without ``honor_labels``) become ``pod`` / ``namespace``,
and ``instance`` is dropped from series that have a pod.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from .. import ids
from ..detectors import memory_leak as _leak
from ..playbooks import REGISTRY
from ..promql import KG, PRESENT, RATE_RANGE, TARGET_KEYS, K, norm, quote, sig, variants
from ..promql import rx_escape  # noqa: F401  (fleet.grouping's import)

LEAK = _leak.Config()
RESOLUTION_S = 60  # subquery step and rule evaluation interval: the level checks judge one minute
PEER_RANGE = "30m"  # the fleet's peer comparison (fleet.RECENT_SECONDS)

RULE_PREFIX = "fragscope:triage_"
UP_RULE = RULE_PREFIX + "target:up"


# PromQL building blocks: fragscope/promql.py (shared with the alert rules)
_q = quote
_variants = variants


def memory_bytes(m=(), which: str = "torch_allocated_bytes", present: str = PRESENT) -> str:
    return f"sum by ({KG}) {sig(which, 'avg_over_time({})', present, m)}"


CENSUS_SIGNALS = ("requests_running", "kv_cache_usage_ratio", "gpu_utilization_ratio", "gpu_memory_used_bytes",
                  "torch_reserved_bytes")


def census(m=()) -> str:
    """One series per target that has engine, GPU or allocator series (value 1)."""
    parts = [f"group by ({K}) {sig(s, '{}', None, m)}"
             for s in CENSUS_SIGNALS]
    return " or ".join(parts)


@dataclass(frozen=True)
class Check:
    id: str  # the diagnosis id it triages
    value: str  # what the value is (a name with its unit)
    agg: str  # how the window's worst value is taken: max_over_time | min_over_time
    expr: object  # matchers -> PromQL
    rule: str  # the recording rule's name


def check_rule(diagnosis: str, record: str) -> str:
    """The recorded series of a diagnosis's check: fragscope:triage_<id with _>:<record>."""
    return RULE_PREFIX + diagnosis.replace("-", "_") + ":" + record


def checks_from(registry) -> tuple[Check, ...]:
    """Every window diagnosis of ``registry`` that declares a triage check (its module's TRIAGE), in run order."""
    return tuple(Check(d.id, d.triage.value, d.triage.agg, d.triage.expr, check_rule(d.id, d.triage.record))
                 for d in registry.window() if d.triage is not None)


CHECKS: tuple[Check, ...] = checks_from(REGISTRY)
LEAK_ID = ids.MEMORY_LEAK
LEAK_RULES = {"torch_allocated_bytes": RULE_PREFIX + "memory:torch_allocated_bytes",
              "gpu_memory_used_bytes": RULE_PREFIX + "memory:gpu_memory_used_bytes"}
# The leak check: growth over the window by a least-squares line (deriv), relative to the window's
# minimum; memory_leak.Config asks >= 10 % of the baseline allocation or >= 1.5 % of the GPU's memory,
# and keeps half of that as its floor: 5 % of allocated, 0.75 % of used memory (used <= total).
LEAK_ALLOC_RATIO = 0.5 * LEAK.growth_of_base
LEAK_USED_RATIO = 0.5 * LEAK.growth_of_total
CHECK_IDS = tuple(c.id for c in CHECKS) + (LEAK_ID,)
# Window diagnoses the triage has no level check for: a target that passes the triage is not cleared of them.
UNCHECKED = tuple(d.id for d in REGISTRY.window() if d.id not in CHECK_IDS)


def _tag(expr: str, **labels: str) -> str:
    for k, v in labels.items():
        expr = f'label_replace({expr}, {_q(k)}, {_q(v)}, "", "")'
    return expr


def _leak_expr(series_alloc: str, series_used: str, rng: str, span_s: float) -> str:
    def growth(s: str) -> str:
        return f"(deriv(({s})[{rng}]) * {span_s:.0f}) / (min_over_time(({s})[{rng}]) > 0)"
    ga, gu = growth(series_alloc), growth(series_used)
    return (f"(({ga}) >= {LEAK_ALLOC_RATIO:g}) or ((({gu}) >= {LEAK_USED_RATIO:g}) unless on ({KG}) ({ga}))")


# Without the rules, the checks run as subqueries; their step grows with the window so a query evaluates
# at most AD_HOC_STEPS times (6 h: every 5 min), and the present and rate ranges widen to the step so
# every sample is still judged once (a 5-minute p90 instead of a 1-minute one).
AD_HOC_STEPS = 72


def ad_hoc_step(span_s: float) -> int:
    return max(RESOLUTION_S, int(math.ceil(span_s / AD_HOC_STEPS / 60.0)) * 60)


def window_range(span_s: float, subquery: bool, step_s: int = RESOLUTION_S) -> str:
    return f"{int(math.ceil(span_s))}s:{step_s}s" if subquery else f"{int(math.ceil(span_s))}s"


def peer_queries(m=()) -> str:
    """Throughput (tokens/s) by target and model, fragmentation by target, over the last 30 min."""
    tput = f"sum by ({K}, model_name) {sig('generation_tokens_total', 'rate({})', PEER_RANGE, m)}"
    res = f"sum by ({KG}) {sig('torch_reserved_bytes', 'avg_over_time({})', PEER_RANGE, m)}"
    alloc = f"sum by ({KG}) {sig('torch_allocated_bytes', 'avg_over_time({})', PEER_RANGE, m)}"
    frag = (f"max by ({K}) (clamp_min(1 - ({alloc}) / (({res}) > 0), 0))"
            f" or max by ({K}) {sig_raw('fragscope_torch_fragmentation_ratio', 'avg_over_time({})', PEER_RANGE, m)}")
    return _tag(tput, check="peer", stat="throughput") + " or " + _tag(frag, check="peer", stat="fragmentation")


def sig_raw(name: str, fn: str, rng: str, m=()) -> str:
    (s,) = _variants([name], m)
    return "(" + norm(fn.format(s + f"[{rng}]")) + ")"


def ad_hoc_queries(matchers: Sequence[tuple[str, str, str]], span_s: float) -> list[str]:
    """The triage as separate requests (no rules): one per check, the census, the peer figures."""
    step = ad_hoc_step(span_s)
    sub = window_range(span_s, True, step)
    present = PRESENT if step == RESOLUTION_S else f"{step}s"
    rate = RATE_RANGE if step == RESOLUTION_S else f"{max(step, 120)}s"
    qs = []
    for c in CHECKS:
        e = c.expr(matchers, present, rate)
        minutes = f"count_over_time(({e})[{sub}])" + (f" * {step / 60:g}" if step != 60 else "")
        qs.append(_tag(f"{c.agg}(({e})[{sub}])", check=c.id, stat="value")
                  + " or " + _tag(minutes, check=c.id, stat="minutes"))
    leak = _leak_expr(memory_bytes(matchers, present=present),
                      memory_bytes(matchers, "gpu_memory_used_bytes", present=present), sub, span_s)
    qs.append(_tag(leak, check=LEAK_ID, stat="value"))
    qs.append(_tag(f"max_over_time(({census(matchers)})[{sub}])", check="present", stat="up"))
    qs.append(peer_queries(matchers))
    return qs


def rules_query(matchers: Sequence[tuple[str, str, str]], span_s: float) -> str:
    """The whole triage as one instant query over the recorded series (docs/fleet.md#triage)."""
    rng = window_range(span_s, False)
    sel = "{" + ",".join(f"{k}{op}{_q(v)}" for k, op, v in matchers) + "}"
    parts = []
    for c in CHECKS:
        parts.append(_tag(f"{c.agg}({c.rule}{sel}[{rng}])", check=c.id, stat="value"))
        parts.append(_tag(f"count_over_time({c.rule}{sel}[{rng}])", check=c.id, stat="minutes"))
    alloc, used = LEAK_RULES["torch_allocated_bytes"] + sel, LEAK_RULES["gpu_memory_used_bytes"] + sel
    ga = f"(deriv({alloc}[{rng}]) * {span_s:.0f}) / (min_over_time({alloc}[{rng}]) > 0)"
    gu = f"(deriv({used}[{rng}]) * {span_s:.0f}) / (min_over_time({used}[{rng}]) > 0)"
    parts.append(_tag(f"(({ga}) >= {LEAK_ALLOC_RATIO:g}) or ((({gu}) >= {LEAK_USED_RATIO:g}) unless on ({KG}) ({ga}))",
                      check=LEAK_ID, stat="value"))
    parts.append(_tag(f"max_over_time({UP_RULE}{sel}[{rng}])", check="present", stat="up"))
    parts.append(peer_queries(matchers))
    return " or ".join(parts)


def rules_yaml() -> str:
    """dashboards/rules/fragscope-triage.yml (tests check the committed file equals this)."""
    lines = [
        "# fragscope fleet triage: the level checks of the window diagnoses, recorded every minute per target",
        "# (and GPU), only where a target trips them. Generated by `python -m fragscope.fleet.triage >",
        "# dashboards/rules/fragscope-triage.yml` from fragscope/fleet/triage.py (thresholds: each",
        "# diagnosis's Config, fragscope/detectors/<diagnosis>.py; names: fragscope/signals.py). With these loaded, `diagnose",
        "# --prometheus` triages a fleet with one instant query (docs/fleet.md#triage).",
        "# Do not edit by hand. Unit tests: dashboards/rules/tests/triage-*.yml.",
        "groups:",
        "  - name: fragscope.triage",
        f"    interval: {RESOLUTION_S}s",
        "    rules:",
    ]

    def rule(name: str, expr: str, doc: str) -> None:
        lines.append(f"      # {doc}")
        lines.append(f"      - record: {name}")
        lines.append("        expr: >-")
        lines.append(f"          {expr}")

    rule(UP_RULE, census(), "every target with engine, GPU or allocator series (value 1): the fleet's census")
    for c in CHECKS:
        rule(c.rule, c.expr(), f"{c.id}: {c.value} where the level rule trips ({c.expr.__doc__.split(chr(10))[0].strip()})")
    rule(LEAK_RULES["torch_allocated_bytes"], memory_bytes(), "memory-leak input: PyTorch allocated bytes per GPU "
         "(the leak check fits deriv() over the window)")
    rule(LEAK_RULES["gpu_memory_used_bytes"], memory_bytes(m=(), which="gpu_memory_used_bytes"),
         "memory-leak input where the probe is absent: device memory used per GPU")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
@dataclass
class Flag:
    check: str
    value: float | None
    minutes: int | None
    gpu: str | None

    def to_dict(self) -> dict:
        v = self.value if self.value is not None and math.isfinite(self.value) else None
        return {"id": self.check, "value": None if v is None else round(v, 4), "minutes": self.minutes,
                "gpu": self.gpu}


@dataclass
class TriageTarget:
    labels: dict[str, str]  # namespace / pod / instance as the server keyed them
    present: bool = False
    model: str | None = None
    throughput: float | None = None
    fragmentation: float | None = None
    flags: list[Flag] = field(default_factory=list)


@dataclass
class TriageResult:
    mode: str  # "rules" | "queries"
    targets: dict[tuple, TriageTarget]
    queries: int
    seconds: float
    notes: list[str] = field(default_factory=list)


def _key(metric: dict) -> tuple:
    return tuple(metric.get(k, "") for k in TARGET_KEYS)


def parse_triage(results: list[list]) -> dict[tuple, TriageTarget]:
    """Vector results (tagged with check/stat) -> per-target triage state."""
    out: dict[tuple, TriageTarget] = {}
    flags: dict[tuple, dict[tuple, Flag]] = defaultdict(dict)
    for res in results:
        for item in res:
            mt = item.get("metric") or {}
            try:
                v = float((item.get("value") or [0, "NaN"])[1])
            except (TypeError, ValueError):
                v = math.nan
            key = _key(mt)
            t = out.get(key)
            if t is None:
                t = out[key] = TriageTarget({k: mt[k] for k in TARGET_KEYS if mt.get(k)})
            check, stat = mt.get("check"), mt.get("stat")
            if check == "present":
                t.present = True
            elif check == "peer":
                if stat == "throughput" and math.isfinite(v):
                    t.throughput = (t.throughput or 0.0) + v
                    if mt.get("model_name") and not t.model:
                        t.model = mt["model_name"]
                elif stat == "fragmentation" and math.isfinite(v):
                    t.fragmentation = v if t.fragmentation is None else max(t.fragmentation, v)
            elif check in CHECK_IDS:
                gpu = mt.get("gpu") or None
                f = flags[key].setdefault((check, gpu), Flag(check, None, None, gpu))
                if stat == "minutes":
                    f.minutes = int(v) if math.isfinite(v) else None
                else:
                    f.value = v
    for key, fl in flags.items():
        out[key].flags = sorted(fl.values(), key=lambda f: (CHECK_IDS.index(f.check), f.gpu or ""))
    return out


def rules_cover(client, matchers, start: float, end: float) -> bool:
    """Whether the triage rules' census is recorded from the window's start (within 5 min) to its end."""
    sel = "{" + ",".join(f"{k}{op}{_q(v)}" for k, op, v in matchers) + "}"
    probe_at = min(end, start + 300)
    for at in sorted({probe_at, end}):
        _, res = client.query(f"count({UP_RULE}{sel})", at)
        if not res:
            return False
    return True


def rules_selector_ok(matchers) -> bool:
    """Recorded series keep only the target labels: other matchers cannot apply to them."""
    return all(k in TARGET_KEYS + ("gpu",) for k, _, _ in matchers)


def run_triage(client, start: float, end: float, matchers, mode: str = "auto",
               parallel: int = 4) -> TriageResult:
    """Run the triage; ``mode`` auto (rules when recorded over the window, else queries), rules, queries."""
    q0, t0 = client.queries, time.perf_counter()
    notes: list[str] = []
    span = end - start
    use_rules = False
    if mode in ("auto", "rules"):
        if not rules_selector_ok(matchers):
            if mode == "rules":
                from ..collectors.prometheus import PrometheusError
                raise PrometheusError("--triage rules: the recorded triage series carry only namespace, pod, "
                                      "instance and gpu; narrow --selector by those, or use --triage queries")
            notes.append("triage: --selector uses labels the recorded triage series do not carry; ran the "
                         "triage as queries")
        elif rules_cover(client, matchers, start, end):
            use_rules = True
        elif mode == "rules":
            from ..collectors.prometheus import PrometheusError
            raise PrometheusError(f"Prometheus at {client.base}: no {UP_RULE} series over the window: load "
                                  "dashboards/rules/fragscope-triage.yml (or backfill it with promtool tsdb "
                                  "create-blocks-from rules), or use --triage queries")
    if use_rules:
        _, res = client.query(rules_query(matchers, span), end)
        results = [res]
    else:
        qs = ad_hoc_queries(matchers, span)
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(qs)))) as ex:
            results = [r for _, r in ex.map(lambda q: client.query(q, end), qs)]
    targets = parse_triage(results)
    return TriageResult("rules" if use_rules else "queries", targets, client.queries - q0,
                        time.perf_counter() - t0, notes)


if __name__ == "__main__":
    print(rules_yaml(), end="")
