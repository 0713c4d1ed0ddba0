"""``batching-misconfiguration``: Triton's dynamic batcher set up against the traffic it serves.

Pure: judges one model's configuration (``collectors/triton_config.py``) against its Triton counters
over an interval (two scrapes or more) or since the server started (one scrape). Figures:

- average batch ``b = Δnv_inference_count / Δnv_inference_exec_count``, fill = b / max_batch_size;
- per request, queue time ``q = Δqueue_us / Δrequests`` and compute time ``c = Δcompute_{input,infer,
  output}_us / Δrequests``. Triton adds a batch's whole execution time to each request in it, so ``c``
  is about one execution's duration and busy instance-time is ``c × executions``;
- with an interval: arrival rate ``λ = Δrequests / Δt`` and instance utilisation
  ``ρ = c × executions / (Δt × instances)``; Little's law (requests in queue = λ × q) is checked
  against ``nv_inference_pending_request_count`` where it is exported.

Rules (each names the knob and a value):
1. ``max_batch_size > 1`` without ``dynamic_batching``, batches ~1 (b ≤ 1.1) while requests queue
   (q ≥ c): turn the dynamic batcher on.
2. dynamic batching with fill < 50 % and a short delay (≤ 1 ms) while the model is busy (q ≥ c or
   ρ ≥ 0.7): raise ``max_queue_delay_microseconds`` — to the time the arrival rate needs to gather
   the target batch, capped at 4 ms for user-facing traffic (Triton's guide suggests starting at
   a few hundred µs and raising until latency budget; 2–4 ms is the usual interactive ceiling).
3. a long delay (≥ 10 ms) that requests mostly sit out (q ≥ 50 % of the delay) with batches still
   below half: the timer, not the traffic, forms the batches (queue ≈ batch / arrival rate): lower the
   delay to about one execution time.
4. full batches (fill ≥ 80 %) with queue ≥ 2 × compute, or instances busy ≥ 85 %: too few instances
   (or too small a batch): add instances — as many as keep ρ ≤ 70 % where ρ is known.
5. ``max_batch_size`` 0 or 1 with queue ≥ 2 × compute: the model cannot batch; add instances.
Light load (small batches, q < c, ρ < 0.7) is healthy: batching does not matter when nothing waits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import npstats
from .. import ids
from ..collectors.triton_config import TritonModelConfig
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity, Window
from ..signals import SIGNALS
from .frame import counter_increases

ID = ids.BATCHING_MISCONFIGURATION


@dataclass(frozen=True)
class Config:
    min_executions: int = 50  # fewer executions say nothing about batch sizes
    low_fill: float = 0.5  # batches below half the maximum leave GPU throughput unused
    short_delay_us: float = 1000.0  # a delay this short cannot gather a batch at moderate rates
    interactive_max_delay_us: float = 4000.0  # 2-4 ms: the usual ceiling for user-facing latency
    long_delay_us: float = 10_000.0  # 10 ms and more is noticeable added latency per request
    full_fill: float = 0.8
    busy_rho: float = 0.7  # M/M/c queues grow steeply above ~70-80 % utilisation
    saturated_rho: float = 0.85
    queue_dominates: float = 2.0  # queue ≥ 2 × compute: latency at least tripled by waiting


def _metric(sig: str) -> str:
    """The Triton source of a canonical signal (signals.py notes say which engine exposes a name)."""
    return next(s.metric for s in SIGNALS[sig].sources if "Triton" in s.note)


@dataclass
class ModelCounters:
    model: str
    requests: float = math.nan
    inferences: float = math.nan
    executions: float = math.nan
    queue_us: float = math.nan
    compute_us: float = math.nan
    pending: float = math.nan  # last value of the pending gauge
    interval_s: float | None = None  # None: lifetime totals from one scrape
    notes: list[str] = field(default_factory=list)


_COUNTERS = {"requests": "request_success_total", "inferences": "inference_count_total",
             "executions": "inference_exec_count_total"}
_US = {"queue_us": ("inference_queue_seconds_total",),
       "compute_us": ("inference_compute_input_seconds_total", "inference_compute_infer_seconds_total",
                      "inference_compute_output_seconds_total")}


def models_in(window: Window) -> list[str]:
    name = _metric("inference_exec_count_total")
    return sorted({s.key.label("model") or "" for s in window if s.name == name})


def model_counters(window: Window, model: str) -> ModelCounters:
    """One model's counters from a window: increases over it (reset-aware), or lifetime totals."""
    out = ModelCounters(model)
    spans = []

    def total(sig: str) -> float:
        ss = [s for s in window if s.name == _metric(sig) and (s.key.label("model") or "") == model]
        if not ss:
            return math.nan
        vals = []
        for s in ss:
            if len(s) >= 2:
                cum, _ = counter_increases(s.values)
                vals.append(float(cum[-1]))
                spans.append(float(s.ts[-1] - s.ts[0]))
            else:
                vals.append(float(s.values[-1]))
        return float(sum(vals))

    for attr, sig in _COUNTERS.items():
        setattr(out, attr, total(sig))
    for attr, sigs in _US.items():
        parts = [total(s) for s in sigs]
        ok = [p for p in parts if math.isfinite(p)]
        setattr(out, attr, sum(ok) if ok else math.nan)
    pending_names = {x.metric for x in SIGNALS["requests_waiting"].sources if "Triton" in x.note}
    pend = [s for s in window if s.name in pending_names and (s.key.label("model") or "") == model]
    if pend:
        out.pending = float(np.nansum([s.values[-1] for s in pend]))
    if spans and min(spans) > 0:
        out.interval_s = float(npstats.median(spans))
    elif window.start < window.end and spans:
        out.notes.append("series of different lengths: rates not computed")
    return out


def _us(x: float) -> str:
    return f"{x / 1000:.1f} ms" if x >= 1000 else f"{x:.0f} µs"


def detect(cfg: TritonModelConfig, c: ModelCounters, conf: Config = Config()) -> list[Finding] | Inconclusive:
    subject = {"model": c.model or cfg.name or "?"}
    if cfg.decoupled:
        return Inconclusive(ID, [], "decoupled model (in-flight batching, e.g. TensorRT-LLM): Triton's dynamic "
                            "batcher is not what batches it", subject)
    missing = [_metric(s) for a, s in _COUNTERS.items() if not math.isfinite(getattr(c, a))]
    if not math.isfinite(c.queue_us):
        missing.append(_metric("inference_queue_seconds_total"))
    if not math.isfinite(c.compute_us):
        missing.append(_metric("inference_compute_infer_seconds_total"))
    if (missing and not math.isfinite(c.executions)) or \
            (math.isfinite(c.executions) and c.executions >= conf.min_executions and missing):
        return Inconclusive(ID, missing, f"model {subject['model']}: counters not in the scrape", subject)
    if c.executions < conf.min_executions or not c.requests > 0:
        return Inconclusive(ID, [], f"model {subject['model']}: {c.executions:.0f} executions "
                            f"{'in the window' if c.interval_s else 'since the server started'}; need "
                            f">= {conf.min_executions} to judge batch sizes", subject)
    b = c.inferences / c.executions
    q = c.queue_us / c.requests
    comp = c.compute_us / c.requests
    mbs = cfg.max_batch_size
    fill = b / mbs if mbs > 0 else math.nan
    inst = cfg.instance_count
    lam = c.requests / c.interval_s if c.interval_s else None  # requests/s
    lam_inf = c.inferences / c.interval_s if c.interval_s else None
    rho = (comp * 1e-6 * c.executions / (c.interval_s * inst)) if (c.interval_s and inst) else None
    busy = q >= comp or (rho is not None and rho >= conf.busy_rho)
    span = "over the window" if c.interval_s else "since the server started (one scrape: no rates)"

    ev = [Evidence("average_batch_size", round(b, 3), threshold=mbs * conf.low_fill if mbs > 1 else None,
                   unit="inferences/execution", note=f"{c.inferences:.0f} inferences in {c.executions:.0f} "
                   f"executions {span}; max_batch_size {mbs}"),
          Evidence("queue_time_per_request_seconds", q * 1e-6, baseline=comp * 1e-6, unit="seconds",
                   note=f"queue {_us(q)} vs compute {_us(comp)} per request")]
    if rho is not None:
        ev.append(Evidence("instance_utilization_ratio", round(rho, 3), threshold=conf.busy_rho, unit="ratio",
                           note=f"{inst} instances busy {rho * 100:.0f} % (compute × executions / time)"))
    if lam is not None and math.isfinite(c.pending):
        little = lam * q * 1e-6
        ev.append(Evidence("pending_requests", c.pending, baseline=round(little, 2), unit="requests",
                           note=f"Little's law: arrival {lam:.1f}/s × queue {_us(q)} = {little:.1f} waiting on "
                           "average; the gauge is the last instant"))
    ctx: dict = {"model": subject["model"], "avg_batch": b, "fill": fill, "queue_us": q, "compute_us": comp,
                 "max_batch_size": mbs, "max_queue_delay_us": cfg.max_queue_delay_us, "instances": inst,
                 "arrival_per_s": lam, "utilization": rho, "dynamic_batching": cfg.dynamic_batching}

    def finding(problem: str, sev: Severity, conf_: float, summary: str, knob: str, now, to) -> list[Finding]:
        ctx.update(problem=problem, knob=knob, current=now, recommended=to)
        return [Finding(ID, sev, conf_, summary, evidence=ev, subject=subject, context=ctx, basis="level")]

    # warning when waiting dominates latency, or the instances are busy (small batches then cost throughput)
    qsev = Severity.WARNING if (q >= conf.queue_dominates * comp or (rho is not None and rho >= conf.busy_rho)) \
        else Severity.INFO
    name = subject["model"]
    if mbs <= 1:
        if q >= conf.queue_dominates * comp:
            need = _instances_for(rho, inst, conf) if rho is not None else ((inst or 1) + 1)
            return finding("cannot-batch", Severity.WARNING, 0.6,
                           f"{name}: max_batch_size {mbs} — every request runs alone and waits {_us(q)} in the queue "
                           f"for {_us(comp)} of compute; more instances are the only lever.",
                           "instance_group.count", inst, need)
        return []
    if not cfg.dynamic_batching and b <= 1.1 and q >= comp:
        delay = _gather_delay(lam_inf, mbs, conf, cfg)
        return finding("dynamic-batching-off", qsev, 0.7,
                       f"{name}: no dynamic_batching although max_batch_size is {mbs}: batches of {b:.2f} while "
                       f"requests wait {_us(q)} for {_us(comp)} of compute.",
                       "dynamic_batching.max_queue_delay_microseconds", None, delay)
    if cfg.dynamic_batching and cfg.max_queue_delay_us >= conf.long_delay_us and \
            q >= 0.5 * cfg.max_queue_delay_us and fill < conf.low_fill:
        to = int(max(100.0, round(comp, -2)))
        rate = f" at {lam:.1f} requests/s" if lam else ""
        return finding("delay-too-long", Severity.WARNING, 0.65,
                       f"{name}: requests wait {_us(q)} of a {_us(cfg.max_queue_delay_us)} batching delay and "
                       f"batches still average {b:.2f} of {mbs}{rate}: the timer, not traffic, forms the batches.",
                       "dynamic_batching.max_queue_delay_microseconds", cfg.max_queue_delay_us, to)
    if cfg.dynamic_batching and fill < conf.low_fill and cfg.max_queue_delay_us <= conf.short_delay_us and busy:
        to = _gather_delay(lam_inf, mbs, conf, cfg)
        return finding("delay-too-short", qsev, 0.6,
                       f"{name}: batches fill {fill * 100:.0f} % of max_batch_size {mbs} with a "
                       f"{_us(cfg.max_queue_delay_us)} delay while the model is busy (queue {_us(q)}, compute "
                       f"{_us(comp)} per request).",
                       "dynamic_batching.max_queue_delay_microseconds", cfg.max_queue_delay_us, to)
    if (fill >= conf.full_fill and q >= conf.queue_dominates * comp) or \
            (rho is not None and rho >= conf.saturated_rho):
        need = _instances_for(rho, inst, conf) if rho is not None else ((inst or 1) + 1)
        return finding("too-few-instances", Severity.WARNING, 0.65,
                       f"{name}: batches are full ({b:.1f} of {mbs}) and requests wait {_us(q)} for {_us(comp)} of "
                       f"compute" + (f"; {inst} instances busy {rho * 100:.0f} %" if rho is not None else "") + ".",
                       "instance_group.count", inst, need)
    return []


def _instances_for(rho: float | None, inst: int | None, conf: Config) -> int:
    if rho is None or not inst:
        return (inst or 1) + 1
    return max(inst + 1, math.ceil(rho * inst / conf.busy_rho))


def _gather_delay(lam_inf: float | None, mbs: int, conf: Config, cfg: TritonModelConfig) -> int:
    """µs to gather the target batch (the largest preferred size, else half the maximum) at the
    observed arrival rate, capped for user-facing traffic; 2 ms (mid of 2-4 ms) without a rate."""
    target = max(cfg.preferred_batch_sizes) if cfg.preferred_batch_sizes else max(2, mbs // 2)
    if not lam_inf:
        return 2000
    d = (target - 1) / lam_inf * 1e6
    return int(min(conf.interactive_max_delay_us, max(100.0, round(d, -2))))


def actions(ctx: dict, config: dict) -> list[str]:
    """The knob and its value, from the finding's context."""
    p, knob, to, now = ctx.get("problem"), ctx.get("knob"), ctx.get("recommended"), ctx.get("current")
    if p == "dynamic-batching-off":
        return [f"Add `dynamic_batching {{ max_queue_delay_microseconds: {to} }}` to {ctx.get('model')}'s "
                "config.pbtxt (preferred_batch_size only if the backend runs some sizes faster)."]
    if p in ("delay-too-short", "delay-too-long"):
        return [f"Set {knob} {now} → {to} ({'more' if p == 'delay-too-short' else 'less'} time to gather a batch); "
                "check the p99 latency budget: each request may wait up to this long."]
    if p == "batches-shrank":
        return [f"Compare {ctx.get('model')}'s config.pbtxt in force with the one before the change (dynamic_batching "
                "dropped, a shorter max_queue_delay_microseconds, fewer preferred_batch_size) and judge it with: "
                "diagnose triton-batching --config config.pbtxt SCRAPES."]
    if p in ("too-few-instances", "cannot-batch"):
        extra = "" if p == "cannot-batch" else " or raise max_batch_size if the model and memory allow"
        return [f"Set {knob} {now if now is not None else 'default (one per GPU)'} → {to}{extra}; "
                "each instance holds its own copy of the weights: check GPU memory first."]
    return []


PLAYBOOK = Playbook(
    ID, "Dynamic batcher set up against the traffic",
    "Triton's batching settings do not fit the traffic: batches stay small while requests wait, the "
    "timer makes requests wait for batches that never fill, or full batches queue for too few instances.",
    ["Read the model's queue vs compute time per request (nv_inference_queue_duration_us / "
     "nv_inference_compute_infer_duration_us): queueing is the latency batching can win back."],
    [Action("Turn on / tune the dynamic batcher: max_queue_delay_microseconds of a few hundred µs to "
            "2-4 ms for user-facing traffic; longer for offline batch jobs.",
            ["max_batch_size > 1", "requests queue while batches stay small"],
            ["strict per-request latency budgets below the delay", "sequence (stateful) models use the sequence batcher"]),
     Action("Lower a long max_queue_delay_microseconds to about one execution time when requests "
            "mostly wait out the timer.", ["batches stay below half full at the observed arrival rate"], []),
     Action("Add model instances (instance_group count) when full batches still queue.",
            ["GPU memory for another copy of the weights", "GPU not already saturated (utilisation < ~80 %)"],
            ["a GPU already at full utilisation: instances then share it; add GPUs/replicas instead"]),
     Action("Raise max_batch_size (re-build the TensorRT engine's optimisation profile if needed).",
            ["the engine/profile supports larger batches", "memory headroom"], [])],
    ["average batch (rate(nv_inference_count) / rate(nv_inference_exec_count)) rises toward the target",
     "queue time per request falls below compute time; p99 latency within budget"],
    ["Triton docs: user_guide/model_configuration.md 'Dynamic Batcher', 'Instance Groups'",
     "Triton docs: user_guide/metrics.md (cumulative durations per request)"])


# --- counters alone: the batches shrank while queueing grew at unchanged traffic --------------------------------
@dataclass(frozen=True)
class ShiftConfig:
    min_executions: int = 50  # per half: fewer say nothing about batch sizes (Config.min_executions)
    # batches at most half what they were (from >= 2): the batcher forms far smaller batches than before
    batch_fall: float = 0.5
    min_batch_before: float = 2.0
    # queue time per request at least 3x what it was: waiting, not computing, grew
    queue_rise: float = 3.0
    # traffic unchanged: arrival rate within 25 % of the first half's
    traffic_band: float = 0.25


def _halves(window: Window, model: str) -> tuple[ModelCounters, ModelCounters] | None:
    mid = window.start + (window.end - window.start) / 2
    if not (math.isfinite(mid) and window.end > window.start):
        return None
    first, second = window.between(window.start, mid), window.between(mid, window.end)
    a, b = model_counters(first, model), model_counters(second, model)
    if a.interval_s is None or b.interval_s is None:
        return None
    return a, b


def detect_shift(window: Window, model: str, cfg: ShiftConfig = ShiftConfig()) -> list[Finding]:
    """Without config.pbtxt: the model's average batch in the window's second half fell to at most half of the
    first half's while the queue time per request rose 3x or more at unchanged traffic: the batcher stopped
    forming batches (a reload with another config: dynamic_batching dropped, a shorter delay, fewer preferred
    sizes) and requests now wait for single executions. Pure."""
    h = _halves(window, model)
    if h is None:
        return []
    a, b = h
    vals = (a.executions, b.executions, a.inferences, b.inferences, a.requests, b.requests, a.queue_us, b.queue_us)
    if not all(math.isfinite(x) for x in vals) or min(a.executions, b.executions) < cfg.min_executions \
            or a.requests <= 0 or b.requests <= 0:
        return []
    b1, b2 = a.inferences / a.executions, b.inferences / b.executions
    q1, q2 = a.queue_us / a.requests, b.queue_us / b.requests
    l1, l2 = a.requests / a.interval_s, b.requests / b.interval_s
    if not (b1 >= cfg.min_batch_before and b2 <= cfg.batch_fall * b1 and q1 > 0 and q2 >= cfg.queue_rise * q1
            and l1 > 0 and abs(l2 / l1 - 1) <= cfg.traffic_band):
        return []
    subject = {"model": model or "?"}
    ev = [Evidence("average_batch_size", round(b2, 3), baseline=round(b1, 3), threshold=round(cfg.batch_fall * b1, 3),
                   unit="inferences/execution", note=f"{b.inferences:.0f} inferences in {b.executions:.0f} executions "
                   f"(before: {a.inferences:.0f} in {a.executions:.0f})"),
          Evidence("queue_time_per_request_seconds", q2 * 1e-6, baseline=q1 * 1e-6, threshold=cfg.queue_rise * q1 * 1e-6,
                   unit="seconds", note=f"queue {_us(q1)} -> {_us(q2)} per request"),
          Evidence("requests_per_second", round(l2, 3), baseline=round(l1, 3), unit="requests/s", agrees=True,
                   note=f"traffic within {cfg.traffic_band * 100:.0f} % of the first half: unchanged")]
    summary = (f"{model}: average batch {b1:.1f} -> {b2:.1f} while queue time per request rose {_us(q1)} -> "
               f"{_us(q2)} ({q2 / q1:.0f}x) at unchanged traffic ({l1:.1f} -> {l2:.1f} requests/s): the dynamic batcher "
               "stopped forming batches (a reload with another config.pbtxt?), so requests now wait for single "
               "executions.")
    ctx = {"model": model, "problem": "batches-shrank", "avg_batch_before": b1, "avg_batch": b2,
           "queue_us_before": q1, "queue_us": q2, "arrival_per_s": l2}
    return [Finding(ID, Severity.WARNING, 0.6, summary, evidence=ev, subject=subject, context=ctx, basis="change",
                    missing=["the model's config.pbtxt (diagnose triton-batching --config FILE SCRAPES)"])]
