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

Thresholds are the level rules of ``fragscope/detectors/level.py`` (its ``Config``), the leak's the
growth rule of ``fragscope/detectors/memory_leak.py``; metric names come from ``fragscope/signals.py``.
Series are keyed per target the way :func:`fragscope.fleet.pod_of` groups them: ``exported_pod`` /
``exported_namespace`` (dcgm-exporter scraped without ``honor_labels``) become ``pod`` / ``namespace``,
and ``instance`` is dropped from series that have a pod.
"""
from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from ..detectors import level as _level
from ..detectors import memory_leak as _leak
from ..gpus import MAX_SM_CLOCK_MHZ
from ..sizing.arith import SizingConfig
from ..signals import SIGNALS

LEVEL = _level.Config()
LEAK = _leak.Config()
SIZING = SizingConfig()  # kv-pool-undersized's margin and "full" KV usage (docs/sizing.md)
RESOLUTION_S = 60  # subquery step and rule evaluation interval: the level checks judge one minute
PRESENT = "1m"  # the present, as level.PRESENT_S (60 s)
RATE_RANGE = "2m"  # a rate needs two samples: 2 min holds four at a 30 s scrape interval
PEER_RANGE = "30m"  # the fleet's peer comparison (fleet.RECENT_SECONDS)

TARGET_KEYS = ("namespace", "pod", "instance")
K = ", ".join(TARGET_KEYS)
KG = K + ", gpu"
RULE_PREFIX = "fragscope:triage_"
UP_RULE = RULE_PREFIX + "target:up"


# ---------------------------------------------------------------------------------------------
# PromQL building blocks
def _q(v: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rx_escape(s: str) -> str:
    """Escape RE2 metacharacters only (Python's re.escape also escapes spaces, which RE2 refuses)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", s)


def _name_regex(names: Sequence[str]) -> str:
    alts = []
    for n in names:
        esc = rx_escape(n)
        if n.startswith("vllm:"):  # Ray Serve LLM re-exports as ray_vllm:
            esc = "(?:ray_)?" + esc
        alts.append(esc)
    return "|".join(alts)


def _variants(names: Sequence[str], matchers: Sequence[tuple[str, str, str]]) -> list[str]:
    """Selectors for ``names`` with the user's matchers; DCGM names also with the exported_ labels."""
    out = []
    vs = [list(matchers)]
    if any(n.startswith("DCGM_") for n in names) and any(k in ("pod", "namespace") for k, _, _ in matchers):
        vs.append([(("exported_" + k) if k in ("pod", "namespace") else k, op, v) for k, op, v in matchers])
    for m in vs:
        inner = f'__name__=~{_q(_name_regex(names))}'
        if m:
            inner += "," + ",".join(f"{k}{op}{_q(v)}" for k, op, v in m)
        out.append("{" + inner + "}")
    return out


def norm(expr: str) -> str:
    """Relabel so one target's series share (namespace, pod, instance), as fleet.pod_of groups them."""
    e = f'label_replace({expr}, "pod", "$1", "exported_pod", "(.+)")'
    e = f'label_replace({e}, "namespace", "$1", "exported_namespace", "(.+)")'
    return f'label_replace({e}, "instance", "", "pod", ".+")'


def sig(sig_id: str, fn: str, rng: str | None, matchers: Sequence[tuple[str, str, str]] = (),
        extra: str = "") -> str:
    """``fn`` applied to every raw source of a signal, scaled to base units, normalised, or-ed.

    ``fn`` holds ``{}`` where the (range) selector goes; ``extra`` is added inside the braces
    (e.g. ``reason=~"..."``).
    """
    by_scale: dict[float, list[str]] = defaultdict(list)
    for src in SIGNALS[sig_id].sources:
        by_scale[src.scale].append(src.metric)
    terms = []
    for scale, names in by_scale.items():
        for s in _variants(names, matchers):
            if extra:
                s = s[:-1] + "," + extra + "}"
            e = fn.format(s + (f"[{rng}]" if rng else ""))
            if scale != 1:
                e = f"({e}) * {scale:g}"
            terms.append(norm(e))
    return "(" + " or ".join(terms) + ")"


# ---------------------------------------------------------------------------------------------
# The checks: PromQL yielding the primary value where a target (GPU) trips the level rule
def kv_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE) -> str:
    """KV usage p90 of the present >= 95 % while preempting >= 1/min (value: the p90)."""
    kv = f"max by ({K}) {sig('kv_cache_usage_ratio', 'quantile_over_time(0.9, {})', present, m)}"
    pre = f"sum by ({K}) {sig('preemptions_total', 'rate({})', rate, m)} * 60"
    return f"({kv} >= {LEVEL.kv_edge:g}) and on ({K}) ({pre} >= {LEVEL.preempt_per_min:g})"


def kv_pool_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE) -> str:
    """KV usage p90 >= 95 % with kv_full (else unlabelled) preemptions >= 1/min while every GPU keeps >= 1 % spare.

    Preemptions count with reason kv_full where vLLM labels them, unlabelled ones otherwise; spare is what
    stays free at the GPU's peak beyond the sizing margin, max(0.5 GiB, 2 % of the GPU), and must reach one
    utilization step (value: the smallest spare share of the target's GPUs). NVML's total is needed: dcgm-exporter's default
    counters lack FB_TOTAL, so DCGM-only targets are left to the deep fetch."""
    kv = f"max by ({K}) {sig('kv_cache_usage_ratio', 'quantile_over_time(0.9, {})', present, m)}"
    kv_full = (f"sum by ({K}) {sig('preemptions_by_reason_total', 'rate({})', rate, m, extra='reason=' + _q('kv_full'))}"
               " * 60")
    labelled = f"group by ({K}) {sig('preemptions_by_reason_total', '{}', None, m)}"
    unlabelled = f"(sum by ({K}) {sig('preemptions_total', 'rate({})', rate, m)} * 60 unless on ({K}) {labelled})"
    total = f"max by ({KG}) {sig('gpu_memory_total_bytes', 'max_over_time({})', present, m)}"
    used = f"max by ({KG}) {sig('gpu_memory_used_bytes', 'max_over_time({})', present, m)}"
    margin = f"clamp_min(({total}) * {SIZING.margin_ratio:g}, {SIZING.margin_min_bytes:.0f})"
    spare = f"min by ({K}) ((({total}) - ({used}) - {margin}) / (({total}) > 0))"
    return (f"(({spare}) >= {SIZING.min_step:g}) and on ({K}) ({kv} >= {SIZING.full_kv_usage:g})"
            f" and on ({K}) ((({kv_full}) or {unlabelled}) >= {LEVEL.preempt_per_min:g})")


def _frag_ratio(m=(), present: str = PRESENT) -> str:
    res = f"sum by ({KG}) {sig('torch_reserved_bytes', 'avg_over_time({})', present, m)}"
    alloc = f"sum by ({KG}) {sig('torch_allocated_bytes', 'avg_over_time({})', present, m)}"
    return f"(({res}) - ({alloc})) / (({res}) > 0)"


def frag_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE) -> str:
    """(reserved - allocated)/reserved >= 25 % with retries >= 0.1/min, or >= 10 % with >= 1/min."""
    ratio = _frag_ratio(m, present)
    ret = f"sum by ({KG}) {sig('torch_alloc_retries_total', 'rate({})', rate, m)} * 60"
    # one evaluation of the ratio: its threshold is 10 % where retries are sustained, else 25 %
    lo, hi = LEVEL.frag_ratio_sustained, LEVEL.frag_ratio
    thr = f"({lo:g} + {hi - lo:g} * (({ret}) < bool {LEVEL.retries_sustained_per_min:g}))"
    return f"(({ratio}) >= on ({KG}) {thr}) and on ({KG}) (({ret}) >= {LEVEL.retries_per_min:g})"


def _product_max_clock(m=()) -> str:
    """dcgm-exporter's modelName label -> the product's maximum SM clock (fragscope/gpus.py), in Hz.

    The fragment is extracted into a label by one regex (longest fragment first, as a word, as
    gpus.max_sm_clock_hertz matches) and joined with a constant table: two selectors, not one per
    product.
    """
    names = [s.metric for s in SIGNALS["gpu_sm_clock_hertz"].sources if s.metric.startswith("DCGM_")]
    frags = sorted(MAX_SM_CLOCK_MHZ, key=lambda f: -len(f))
    rx = "(?i)(?:.*[^A-Za-z0-9])?(" + "|".join(rx_escape(f) for f in frags) + ")(?:[^A-Za-z0-9].*)?"
    table = " or ".join(f'label_replace(vector({MAX_SM_CLOCK_MHZ[f] * 1e6:g}), "gpu_product", {_q(f)}, "", "")'
                        for f in frags)
    terms = [norm(f'label_replace({s}, "gpu_product", "$1", "modelName", {_q(rx)}) * 0 + on (gpu_product) '
                  f"group_left () ({table})") for s in _variants(names, m)]
    return f"max by ({KG}) (" + " or ".join(terms) + ")"


def throttle_check(m=(), present: str = PRESENT, rate: str = RATE_RANGE) -> str:
    """Busy (utilization >= 50 %) with a slowdown reason active or the SM clock <= 80 % of the
    product's maximum (value: clock / maximum; 1 where only a reason is known)."""
    util = f"max by ({KG}) {sig('gpu_utilization_ratio', 'avg_over_time({})', present, m)}"
    clk = f"max by ({KG}) {sig('gpu_sm_clock_hertz', 'avg_over_time({})', present, m)}"
    mx = (f"(max by ({KG}) {sig('gpu_sm_clock_max_hertz', 'max_over_time({})', present, m)}"
          f" or {_product_max_clock(m)})")
    reasons = "|".join(_level.HW_REASONS)
    active = (f"max by ({KG}) {sig('gpu_throttle_reason_active', 'avg_over_time({})', present, m, extra=f'reason=~{_q(reasons)}')}"
              " >= 0.5")
    ratio = f"(({clk}) / ({mx}))"
    tripped = (f"({ratio} <= {LEVEL.clock_ratio:g}) or on ({KG}) ({ratio} and on ({KG}) ({active}))"
               f" or on ({KG}) (({active}) * 0 + 1)")
    return f"({tripped}) and on ({KG}) (({util}) >= {LEVEL.util_busy:g})"


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


CHECKS: tuple[Check, ...] = (
    Check("kv-cache-pressure", "kv_cache_usage_p90_ratio", "max_over_time", kv_check,
          RULE_PREFIX + "kv_cache_pressure:kv_usage_p90_ratio"),
    Check("allocator-fragmentation", "unusable_reserved_ratio", "max_over_time", frag_check,
          RULE_PREFIX + "allocator_fragmentation:unusable_ratio"),
    Check("clock-throttling", "sm_clock_of_max_ratio", "min_over_time", throttle_check,
          RULE_PREFIX + "clock_throttling:clock_of_max_ratio"),
    Check("kv-pool-undersized", "gpu_memory_spare_beyond_margin_ratio", "max_over_time", kv_pool_check,
          RULE_PREFIX + "kv_pool_undersized:spare_ratio"),
)
LEAK_ID = "memory-leak"
LEAK_RULES = {"torch_allocated_bytes": RULE_PREFIX + "memory:torch_allocated_bytes",
              "gpu_memory_used_bytes": RULE_PREFIX + "memory:gpu_memory_used_bytes"}
# The leak check: growth over the window by a least-squares line (deriv), relative to the window's
# minimum; memory_leak.Config asks >= 10 % of the baseline allocation or >= 1.5 % of the GPU's memory,
# and keeps half of that as its floor: 5 % of allocated, 0.75 % of used memory (used <= total).
LEAK_ALLOC_RATIO = 0.5 * LEAK.growth_of_base
LEAK_USED_RATIO = 0.5 * LEAK.growth_of_total
CHECK_IDS = tuple(c.id for c in CHECKS) + (LEAK_ID,)
# Diagnoses the triage has no level check for: a target that passes the triage is not cleared of them.
UNCHECKED = ("launch-bound", "capacity-saturation", "kv-block-size-mismatch")


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
        "# dashboards/rules/fragscope-triage.yml` from fragscope/fleet/triage.py (thresholds:",
        "# fragscope/detectors/level.py; names: fragscope/signals.py). With these loaded, `diagnose",
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
