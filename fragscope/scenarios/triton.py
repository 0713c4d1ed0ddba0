"""Triton dynamic-batcher scenarios: a model's ``config.pbtxt`` and the ``/metrics`` scrapes its traffic
produces, from a discrete-event model of Triton's scheduler (for ``batching-misconfiguration``).

    from fragscope.scenarios import TritonScenario, triton_case
    case = triton_case(TritonScenario("triton-delay-too-short", seed=3))
    case.config_pbtxt, case.scrapes, case.step_s, case.truth.figures["fill_ratio"]

The mechanism (Triton's model-configuration guide, "Dynamic Batcher"): requests arrive as a Poisson
process; when a model instance is free, the batcher takes the waiting requests in arrival order. It
sends at once a batch of the largest preferred size it can form (or ``max_batch_size``); otherwise it
holds the oldest request up to ``max_queue_delay_microseconds`` for more to join, then sends the
largest batch it has. Without ``dynamic_batching`` (or with ``max_batch_size`` 0/1) every request runs
alone. A batch of b requests runs ``c0 + c1·b`` µs (a fixed launch/weights cost plus a per-item cost,
with a few % jitter) on one of ``instances`` instances. Triton counts at completion: requests,
inferences, executions, and per request the queue time and the whole batch's compute time
(input/infer/output). The truth's figures come from the simulated batches themselves, not from the
counters a reader derives: average batch over the window, fill, queue and compute per request, the
instances' busy share, the arrival rate and the mean queue length.

Limits: one model, one scheduler thread; requests carry batch 1; no priority levels, timeouts or
response cache; the delay check is made when an instance frees (Triton re-checks on each arrival too,
which dispatches a full batch a little sooner at high rates).
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .. import ids
from ..model import Window
from .spec import Truth

ID = ids.BATCHING_MISCONFIGURATION
# kind -> the problem a correct reading names (context.problem of the finding, docs/engines.md)
TRITON_PATHOLOGIES = {
    "triton-delay-too-short": "delay-too-short",  # low fill, 100 µs delay, moderate traffic keeps the instance busy
    "triton-too-few-instances": "too-few-instances",  # full batches queue behind one instance
    "triton-delay-too-long": "delay-too-long",  # a 50 ms timer forms the batches at a low arrival rate
    "triton-batching-off": "dynamic-batching-off",  # max_batch_size 16, no dynamic_batching, requests queue
    "triton-cannot-batch": "cannot-batch",  # max_batch_size 0, one instance, requests queue
}
TRITON_CONFOUNDERS = (
    "triton-well-tuned",  # 4 ms delay, two instances: queue below compute, instances about half busy
    "triton-light-traffic",  # 20 requests/s: batches of ~1 are all the traffic gives; nothing waits
    "triton-saturated-provisioned",  # heavy traffic, well-filled batches, three instances ~60 % busy
)
TRITON_KINDS = tuple(TRITON_PATHOLOGIES) + TRITON_CONFOUNDERS

_HELP = {  # Triton's HELP texts (core/src/metrics.cc), as in the recorded scrapes in tests/data/engines
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (does not include cached requests)"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds "
                                                    "(includes cached requests)"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds "
                                                  "(includes cached requests)"),
    "nv_inference_compute_input_duration_us": ("counter", "Cumulative compute input duration in microseconds "
                                                          "(does not include cached requests)"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative compute inference duration in microseconds "
                                                          "(does not include cached requests)"),
    "nv_inference_compute_output_duration_us": ("counter", "Cumulative inference compute output duration in "
                                                           "microseconds (does not include cached requests)"),
    "nv_inference_pending_request_count": ("gauge", "Instantaneous number of pending requests awaiting execution "
                                                    "per-model."),
}


@dataclass
class TritonScenario:
    """One Triton model under steady Poisson traffic, scraped every ``step_s`` for ``duration_s``."""

    kind: str
    seed: int = 0
    severity: float = 1.0  # how hard traffic (or the delay) meets the misconfiguration: 0.3 mild, 1 ref., 2 extreme
    duration_s: float = 45.0  # first to last scrape
    step_s: float = 15.0
    uptime_s: float = 10.0  # the server ran this long before the first scrape (counters start non-zero)
    noise: float = 1.0  # service-time jitter multiplier (0: every batch of a size takes the same time)
    model: str = "resnet50"

    def __post_init__(self) -> None:
        if self.kind not in TRITON_KINDS:
            raise ValueError(f"unknown Triton scenario kind {self.kind!r}; known: {', '.join(TRITON_KINDS)}")
        if not (self.step_s > 0 and self.duration_s >= self.step_s and self.uptime_s >= 0):
            raise ValueError("need step_s > 0, duration_s >= step_s and uptime_s >= 0")
        if self.severity <= 0 or self.noise < 0:
            raise ValueError("need severity > 0 (the confounders are the healthy deployments) and noise >= 0")


@dataclass(frozen=True)
class Setup:
    """The deployment and its traffic: the config's knobs, the service model, the arrival rate."""

    max_batch_size: int
    dynamic_batching: bool
    preferred: tuple[int, ...]
    delay_us: int
    instances: int
    c0_us: float  # fixed cost of one execution
    c1_us: float  # cost per item in the batch
    arrival_per_s: float
    in_us: float = 6.0  # compute input per item (copying the request's tensors in)
    out_us: float = 2.0


def setup(s: TritonScenario) -> Setup:
    """Per kind: the configuration and the traffic. ``severity`` scales the traffic (or the delay) against
    the instance's capacity; the capacities quoted are ``1e6 · b / (c0 + c1 b)`` requests/s."""
    sev = s.severity
    k = s.kind
    if k == "triton-delay-too-short":
        # one execution costs 4 ms + 0.25 ms/item: 235/s alone, 2,670/s at 32. At ~200/s the instance is
        # busy most of the time running batches of 1-2 (fill ~5 %): every execution pays the 4 ms again.
        return Setup(32, True, (), 100, 1, 4000.0, 250.0, 300.0 * min(1.3, 0.5 + 0.5 * sev))
    if k == "triton-too-few-instances":
        # max batch 8: 1.5 ms + 0.4 ms/item -> 1,700/s per instance at full batches; traffic at 95 % of it
        cap = 1e6 * 8 / (1500.0 + 0.4e3 * 8)
        return Setup(8, True, (), 500, 1, 1500.0, 400.0, cap * min(1.1, 0.85 + 0.1 * sev))
    if k == "triton-delay-too-long":
        # preferred 32 at ~100 requests/s takes 320 ms to gather; the timer (10 → 50 ms with severity) fires first
        return Setup(32, True, (32,), int(round(10_000 * (1 + 4 * sev), -2)), 1, 3000.0, 150.0, 100.0)
    if k == "triton-batching-off":
        # max_batch_size 16 but no dynamic_batching: one request per execution, 2 ms each -> 500/s capacity
        return Setup(16, False, (), 0, 1, 1800.0, 200.0, 500.0 * min(0.98, 0.7 + 0.2 * sev))
    if k == "triton-cannot-batch":
        return Setup(0, False, (), 0, 1, 9000.0, 1000.0, 100.0 * min(0.98, 0.7 + 0.2 * sev))
    if k == "triton-well-tuned":
        # 4 ms delay, preferred 8/16, two instances of a 5 ms + 0.3 ms/item model at ~600 requests/s:
        # batches of ~3, queue well below compute, instances about half busy
        return Setup(32, True, (8, 16), 4000, 2, 5000.0, 300.0, 600.0)
    if k == "triton-light-traffic":
        return Setup(32, True, (), 100, 1, 4000.0, 250.0, 20.0)
    if k == "triton-saturated-provisioned":
        # max batch 16 filled by ~2,600 requests/s; three instances of 6 ms + 0.4 ms/item (~1,300/s each at 16)
        return Setup(16, True, (16,), 5000, 3, 6000.0, 400.0, 2600.0)
    raise ValueError(k)  # unreachable: the kind was validated


@dataclass
class TritonCase:
    """The artefacts a reader gets, and what a correct reading says."""

    config_pbtxt: str
    scrapes: list[str]  # Triton /metrics text (port 8002), step_s apart, no timestamps (as curl gets them)
    step_s: float
    model: str
    truth: Truth
    setup: Setup = field(repr=False, default=None)  # type: ignore[assignment]

    def to_window(self, start_ts: float = 1_767_225_600.0, last_only: bool = False) -> Window:
        """The scrapes read as ``diagnose triton-batching A B ... --interval STEP`` reads them (Triton's text
        through the exposition parser, ``step_s`` apart from ``start_ts``); ``last_only``: the last scrape
        alone (lifetime totals, no rates)."""
        from ..collectors.exposition import parse_text

        cols: dict = {}
        types: dict = {}
        for i, text in enumerate(self.scrapes):
            if last_only and i < len(self.scrapes) - 1:
                continue
            p = parse_text(text, default_ts=start_ts + i * self.step_s)
            types.update(p.types)
            for k, (ts, vs) in p.cols.items():
                a = cols.setdefault(k, ([], []))
                a[0].extend(ts)
                a[1].extend(vs)
        return Window.from_columns(cols, types=types, source=f"triton-scenario:{self.model}")


def config_text(name: str, st: Setup) -> str:
    """The model's config.pbtxt in protobuf text format (field names of Triton's model_config.proto)."""
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {st.max_batch_size}",
             "input [", "  {", '    name: "input"', "    data_type: TYPE_FP32", "    dims: [ 3, 224, 224 ]", "  }", "]",
             "output [", "  {", '    name: "output"', "    data_type: TYPE_FP32", "    dims: [ 1000 ]", "  }", "]"]
    if st.dynamic_batching:
        lines.append("dynamic_batching {")
        if st.preferred:
            lines.append(f"  preferred_batch_size: [ {', '.join(map(str, st.preferred))} ]")
        lines += [f"  max_queue_delay_microseconds: {st.delay_us}", "}"]
    lines += ["instance_group [", "  {", f"    count: {st.instances}", "    kind: KIND_GPU", "  }", "]"]
    return "\n".join(lines) + "\n"


def _arrivals(rng: np.random.Generator, lam: float, t_end: float) -> np.ndarray:
    out = []
    t = 0.0
    while t < t_end:  # in chunks, so the draws do not depend on a guessed count
        g = np.cumsum(rng.exponential(1.0 / lam, size=max(64, int(lam * t_end * 0.5))))
        out.append(t + g)
        t = float(out[-1][-1])
    a = np.concatenate(out)
    return a[a < t_end]


def _batch_size(count: int, st: Setup) -> int:
    """The batch Triton forms from ``count`` waiting requests: the largest preferred size it can form,
    else the largest up to max_batch_size."""
    top = min(count, max(1, st.max_batch_size))
    fits = [p for p in st.preferred if p <= top]
    return max(fits) if fits else top


def simulate(st: Setup, t_end: float, rng: np.random.Generator, noise: float = 1.0):
    """Batches as arrays (dispatch s, done s, first request index, size, execution µs), the arrivals."""
    arr = _arrivals(rng, st.arrival_per_s, t_end)
    A = arr.tolist()
    n = len(A)
    batching = st.dynamic_batching and st.max_batch_size > 1
    target = max(st.preferred) if st.preferred else st.max_batch_size
    delay = st.delay_us * 1e-6
    jit = np.exp(rng.normal(0.0, 0.03 * noise, size=n + 1)).tolist()  # at most n batches
    per_item = st.in_us + st.out_us
    free = [0.0] * st.instances
    disp, done, first, size, svc = [], [], [], [], []
    pop, push, right = heapq.heappop, heapq.heappush, bisect.bisect_right
    h = 0
    while h < n:
        f = pop(free)
        t0 = f if f > A[h] else A[h]
        if t0 >= t_end:
            break
        b = 1
        td = t0
        if batching:
            if delay > 0 and A[h] + delay > t0 and right(A, t0, h) - h < target:
                j = h + target - 1  # when the target-th waiting request arrives, if before the deadline
                td = min(A[h] + delay, A[j] if j < n else math.inf)
            b = _batch_size(right(A, td, h) - h, st)
        e_us = (st.c0_us + st.c1_us * b) * jit[len(disp)] + per_item * b
        disp.append(td)
        done.append(td + e_us * 1e-6)
        first.append(h)
        size.append(b)
        svc.append(e_us)
        push(free, td + e_us * 1e-6)
        h += b
    return (np.array(disp), np.array(done), np.array(first, dtype=np.int64), np.array(size, dtype=np.int64),
            np.array(svc), arr)


def triton_case(s: TritonScenario) -> TritonCase:
    """Simulate ``s``: its config.pbtxt, the scrapes, and the truth with the run's own figures."""
    rng = np.random.default_rng(s.seed)
    st = setup(s)
    t0 = s.uptime_s
    n_scr = int(round(s.duration_s / s.step_s)) + 1
    t_scr = t0 + s.step_s * np.arange(n_scr)
    t_end = float(t_scr[-1])
    disp, done, first, size, svc, arr = simulate(st, t_end + 1e-9, rng, s.noise)
    A = arr
    cumA = np.concatenate([[0.0], np.cumsum(A)])
    # per batch: queue µs summed over its requests (dispatch - arrival), compute µs charged to each request
    q_us = (size * disp - (cumA[first + size] - cumA[first])) * 1e6
    e2e_us = (size * done - (cumA[first + size] - cumA[first])) * 1e6
    in_us, out_us = st.in_us * size, st.out_us * size
    infer_us = svc - in_us - out_us
    order = np.argsort(done, kind="stable")
    d_sorted = done[order]

    def cum(x: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(x[order])])
        return c[np.searchsorted(d_sorted, t_scr, side="right")]

    req = cum(size.astype(float))
    counters = {
        "nv_inference_request_success": req, "nv_inference_request_failure": np.zeros(n_scr),
        "nv_inference_count": req, "nv_inference_exec_count": cum(np.ones(size.size)),
        "nv_inference_request_duration_us": cum(e2e_us), "nv_inference_queue_duration_us": cum(q_us),
        "nv_inference_compute_input_duration_us": cum(in_us * size),
        "nv_inference_compute_infer_duration_us": cum(infer_us * size),
        "nv_inference_compute_output_duration_us": cum(out_us * size)}
    # pending at a scrape: arrived and not yet dispatched
    d_order = np.argsort(disp, kind="stable")
    started = np.concatenate([[0], np.cumsum(size[d_order])])[np.searchsorted(disp[d_order], t_scr, side="right")]
    pending = np.searchsorted(A, t_scr, side="right") - started
    scrapes = []
    lab = f'{{model="{s.model}",version="1"}}'
    for i in range(n_scr):
        lines = []
        for name, (typ, help_) in _HELP.items():
            v = pending[i] if name == "nv_inference_pending_request_count" else counters[name][i]
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}", f"{name}{lab} {int(round(float(v)))}"]
        scrapes.append("\n".join(lines) + "\n")
    truth = _truth(s, st, disp, done, size, svc, q_us, A, t_scr)
    return TritonCase(config_text(s.model, st), scrapes, s.step_s, s.model, truth, st)


def _truth(s: TritonScenario, st: Setup, disp, done, size, svc, q_us, A, t_scr) -> Truth:
    lo, hi = float(t_scr[0]), float(t_scr[-1])
    span = hi - lo
    w = (done > lo) & (done <= hi)  # executions completed between the first and the last scrape
    reqs = float(size[w].sum())
    execs = int(w.sum())
    avg_b = reqs / execs if execs else math.nan
    mbs = st.max_batch_size
    busy = float(np.sum(np.clip(np.minimum(done, hi) - np.maximum(disp, lo), 0.0, None)))
    # time-average queue length over the window: each request waits from arrival to its dispatch
    arrived = np.searchsorted(A, [lo, hi], side="right")
    starts = np.repeat(disp, size)  # dispatch time of every dispatched request, in arrival order
    wait_lo = np.minimum(np.maximum(A[: starts.size], lo), hi)
    wait_hi = np.minimum(np.maximum(starts, lo), hi)
    queued = float(np.sum(wait_hi - wait_lo))
    if starts.size < A.size:  # never dispatched before the last scrape
        queued += float(np.sum(hi - np.minimum(np.maximum(A[starts.size:], lo), hi)))
    figs = {
        "executions": execs,
        "requests": int(reqs),
        "average_batch": round(avg_b, 6) if execs else None,
        "fill_ratio": round(avg_b / mbs, 6) if execs and mbs > 0 else None,
        "queue_us_per_request": round(float(q_us[w].sum()) / reqs, 3) if reqs else None,
        "compute_us_per_request": round(float((svc[w] * size[w]).sum()) / reqs, 3) if reqs else None,
        "instance_busy_ratio": round(busy / (span * st.instances), 4),
        "arrival_per_s": round(float(arrived[1] - arrived[0]) / span, 3),
        "mean_queue_length": round(queued / span, 3),
        "gpu_us_per_inference": round(float(svc[w].sum()) / reqs, 3) if reqs else None,
        "gpu_us_per_inference_full_batch": round((st.c0_us + (st.c1_us + st.in_us + st.out_us) * max(1, mbs))
                                                 / max(1, mbs), 3),
        "max_batch_size": mbs, "max_queue_delay_us": st.delay_us, "instances": st.instances,
        "problem": TRITON_PATHOLOGIES.get(s.kind),
    }
    present = s.kind in TRITON_PATHOLOGIES
    notes = [_DESC[s.kind]]
    if present and s.severity < 0.5:
        notes.append(f"mild (severity {s.severity}): the model may sit below the point where it matters")
    return Truth(diagnoses={ID} if present else set(), onset_ts=None, notes="; ".join(notes), figures=figs)


_DESC = {
    "triton-delay-too-short": "100 µs delay, batches of 1-2 of 32 while the instance stays busy",
    "triton-too-few-instances": "full batches of 8 queue behind one instance",
    "triton-delay-too-long": "a long batching delay that requests sit out while batches stay small",
    "triton-batching-off": "max_batch_size 16 without dynamic_batching: every request runs alone and queues",
    "triton-cannot-batch": "max_batch_size 0, one instance: requests queue for it",
    "triton-well-tuned": "4 ms delay, preferred 8/16, two instances about half busy: nothing wrong",
    "triton-light-traffic": "20 requests/s: small batches are all the traffic gives, nothing waits",
    "triton-saturated-provisioned": "heavy traffic, well-filled batches, three instances with headroom",
}
