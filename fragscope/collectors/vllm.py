"""vLLM ``/metrics`` (V0 and V1 engines, renamed metrics, ``ray_vllm:``). docs/collectors.md#vllm.

Fetching (``http_get``) is kept apart from parsing (:func:`parse_vllm_metrics`, pure, tested on
recorded scrapes). Raw metric names are kept as vLLM exposes them (after ``ray_vllm:`` ->
``vllm:``); fragscope/signals.py resolves the aliases between generations. Only the families
the detectors use, plus a few documented extras, are kept, to bound what the agent stores
(a V1 scrape has ~600 series, ~100 of them ``_created`` timestamps).
"""
from __future__ import annotations

import itertools
import logging
import re

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from ..signals import SIGNALS, normalise_name
from .exposition import LineCache, ParseError, scrape_kept
from .endpoint import Endpoint
from .exposition_parse import MAX_KEPT_LINES, keep_line
from .http import DEFAULT_MAX_BYTES, Fetch, FetchError, http_get
from .logonce import LogOnce

log = logging.getLogger(__name__)

_HIST = ("_bucket", "_sum", "_count")
ENGINE_LINE = re.compile(r"^(?:ray_)?vllm:[^\n]*\n?", re.M)
# The same lines for the fast path, found twice as fast: a pattern that starts with a literal "\n" lets the
# regex engine jump from newline to newline (the first line, which has none before it, is matched apart).
FIRST_LINE = re.compile(r"((?:ray_)?vllm:[^\n]*)")
NEXT_LINE = re.compile(r"\n((?:ray_)?vllm:[^\n]*)")


def _signal_sources(prefix: str) -> list[tuple[str, str]]:
    """(metric, kind) for every source in the signal table starting with ``prefix``."""
    out = []
    for sig in SIGNALS.values():
        for src in sig.sources:
            if src.metric.startswith(prefix):
                out.append((src.metric, sig.kind))
    return out


# Families kept beyond the signal table (why each is useful: docs/collectors.md#vllm).
EXTRA_FAMILIES: tuple[tuple[str, str], ...] = (
    ("vllm:num_requests_swapped", "gauge"),  # V0: KV swapped to CPU
    ("vllm:num_requests_waiting_by_reason", "gauge"),  # reason=capacity: KV-starved queue
    ("vllm:cpu_cache_usage_perc", "gauge"),  # V0
    ("vllm:engine_sleep_state", "gauge"),  # sleep mode: KV/weights offloaded
    ("vllm:inter_token_latency_seconds", "histogram"),  # V1 ITL
    ("vllm:time_per_output_token_seconds", "histogram"),  # its pre-0.11 name
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:request_queue_time_seconds", "histogram"),
    ("vllm:iteration_tokens_total", "histogram"),  # tokens per engine step: effective batch
    ("vllm:request_num_preemptions", "histogram"),  # preemptions per finished request (~0.30+)
    ("vllm:prefix_cache_queries_total", "counter"),
    ("vllm:prefix_cache_hits_total", "counter"),
    ("vllm:gpu_prefix_cache_hit_rate", "gauge"),  # V0 (-1 when prefix caching is off)
)


def _keep_names() -> frozenset[str]:
    names: set[str] = set()
    for metric, kind in _signal_sources("vllm:") + list(EXTRA_FAMILIES):
        if kind == "histogram":
            names.update(metric + s for s in _HIST)
        else:
            names.add(metric)
            if kind == "counter" and not metric.endswith("_total"):
                names.add(metric + "_total")
    return frozenset(names)


KEEP = _keep_names()
# The signals a vLLM scrape should carry, each with its accepted raw names (first = current).
EXPECTED: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (sig.id, tuple(s.metric for s in sig.sources if s.metric.startswith("vllm:")))
    for sig in SIGNALS.values()
    if sig.expected and any(s.metric.startswith("vllm:") for s in sig.sources)
)


def _present(names: set[str], metric: str) -> bool:
    return metric in names or any(metric + s in names for s in _HIST)


def parse_vllm_metrics(text: str, ts: float, source: str = "vllm", key_cache: dict | None = None,
                       lines: LineCache | None = None, counts: dict | None = None) -> list[Sample]:
    """A vLLM ``/metrics`` body -> the kept samples, stamped ``ts`` (pure but for the caches).

    ``lines``, kept by the caller between scrapes of one server, reads a page whose series lines were all
    seen before with one dict hit and one float a line (the same samples; ~0.5 ms instead of ~2 ms a scrape
    of a vLLM V1 page, bench/bench_agent.py); anything else takes the full path below, which teaches it.
    At most MAX_KEPT_LINES series lines are parsed (past it, only series ``lines`` knows); the others are
    counted in ``counts["line_limit"]``. Raises exposition.ParseError (one line) when the text is not
    Prometheus/OpenMetrics.
    """
    if lines is not None:
        first = FIRST_LINE.match(text)
        found = NEXT_LINE.finditer(text)
        fast = lines.scrape(itertools.chain((first,), found) if first else found, ts, 1)
        if fast is not None:
            return fast
    # Pre-filter lines by family before parsing: a vLLM scrape has ~600 lines, a third of them
    # kept; parsing only those cut the agent's per-scrape cost 3.5 -> 1.2 ms (bench/bench_agent.py).
    # Lines are found by a regex over the text, never split into a list: a hostile body of 1M short
    # lines would make a 50+ MB list of strings (bench/bench_agent_hostile.py); only kept lines live.
    kept = []
    for m in ENGINE_LINE.finditer(text):
        line = m.group()
        name = normalise_name(line.split("{", 1)[0].split(None, 1)[0])
        if name in KEEP:
            keep_line(kept, line, lines, counts)
        elif lines is not None:
            lines.drop(line)
    if not kept and any(n in text for n in ("sglang:", "tgi_", "nv_inference_", "nv_trt_llm_")):
        # another engine behind the same endpoint flag (SGLang, TGI, Triton / TensorRT-LLM): read it
        # through the signal table like `diagnose URL` does (docs/engines.md)
        from .engines import engine_samples

        return engine_samples(text, ts, source, key_cache)
    if len(kept) >= MAX_KEPT_LINES:  # a page past the line cap (labels churning): nothing of it is memoised
        key_cache = lines = None
    return scrape_kept(kept, text, ts, source, KEEP, key_cache, lines)


class VllmCollector:
    """Scrapes one vLLM server's ``/metrics``. Never raises: failures mark it down with one line.

    ``extra_labels`` (e.g. ``{"instance": "127.0.0.1:8001"}``) are added to every sample, for
    pods that run several vLLM servers with the same model name and engine index.
    """

    name = "vllm"

    def __init__(self, url: str, timeout_s: float = 2.0, max_bytes: int = DEFAULT_MAX_BYTES,
                 fetch: Fetch = http_get, extra_labels: dict[str, str] | None = None, name: str | None = None) -> None:
        self.url = url
        self.endpoint = Endpoint(url)  # the page behind url (/metrics for a base URL): collectors/endpoint.py
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.fetch = fetch
        self.extra = dict(extra_labels or {})
        if name:
            self.name = name
        self._log = LogOnce(log, f"vllm {url}")
        self._said_missing: set[str] = set()
        self._keys: dict = {}  # parsed series lines, reused scrape after scrape
        self._lines = LineCache()  # the page's lines as parsed: the fast path of the next scrapes
        self.dropped: dict[str, int] = {}  # lines past the line cap (agent/budget.py exports it)

    def _down(self, now: float, reason: Reason | str, msg: str) -> CollectResult:
        self._log.problem(msg)
        lab = make_labels(self.extra)
        return CollectResult(missing=[Missing(srcs[0], lab, now, reason, msg) for _, srcs in EXPECTED],
                             up=False, error=msg)

    def collect(self, now: float) -> CollectResult:
        try:
            return self._collect(now)
        except Exception as e:  # never raise into the agent
            return self._down(now, Reason.SOURCE_DOWN, f"{self.url}: vllm collector failed: "
                              f"{type(e).__name__}: {e}"[:200])

    def _collect(self, now: float) -> CollectResult:
        try:
            text = self.endpoint.fetch(self.fetch, timeout_s=self.timeout_s, max_bytes=self.max_bytes)
        except FetchError as e:
            return self._down(now, e.reason, str(e))
        try:
            samples = parse_vllm_metrics(text, now, source=self.url, key_cache=self._keys,
                                         lines=self._lines, counts=self.dropped)
        except ParseError as e:
            return self._down(now, Reason.PARSE_ERROR, str(e))
        if not samples:
            return self._down(now, Reason.PARSE_ERROR,
                              f"{self.url}: no vllm: metrics in the response; is this a vLLM /metrics endpoint?")
        if self.extra:
            samples = [Sample(s.name, make_labels(dict(s.labels) | self.extra), s.ts, s.value) for s in samples]
        names = {s.name for s in samples}
        res = CollectResult(samples=samples)
        lab = make_labels(self.extra)
        for sig_id, sources in EXPECTED:
            if not any(_present(names, m) for m in sources):
                detail = f"{self.url} exposes none of {', '.join(sources)}"
                res.missing.append(Missing(sources[0], lab, now, Reason.NOT_EXPOSED, detail))
                if sig_id not in self._said_missing:
                    self._said_missing.add(sig_id)
                    log.info("vllm %s: %s not exposed by this version (%s)", self.url, sig_id, detail)
        self._log.ok()
        return res
