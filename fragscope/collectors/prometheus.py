"""Fetch every raw series the detectors read from a Prometheus-compatible server, for a whole fleet.

Two ways to fetch (docs/fleet.md#fetching):

* **raw** (default, no ``--step``): an instant query of a range-vector selector,
  ``{__name__=~"a|b|c",<selector>}[<chunk>s]`` evaluated at the chunk's end, returns the samples
  exactly as scraped: the same points a recording of the pod would hold, counters untouched (the
  detectors handle resets), sparse series (one kernel-gap capture every 10 minutes) not smeared by
  the 5-minute lookback. Windows are split in chunks of at most ``RAW_CHUNK_SECONDS``.
* **resampled** (``--step S``, or windows longer than ``RAW_MAX_SPAN_SECONDS``): ``query_range``
  with that step, split so that no request asks for more than ``MAX_POINTS_PER_SERIES`` points per
  series (Prometheus refuses more than 11,000). Values are the raw values at each step (no
  server-side ``rate()``: the detectors take raw counters and handle resets themselves, and a rate
  would need to be integrated back into a counter; one request per batch either way).

Names are batched: one request per group of raw metric names (``__name__`` regex), with the user's
label selector merged in. Fetching is kept apart from parsing. The parts live beside this module:
``prom_client`` (HTTP client, errors), ``prom_query`` (selectors, durations, times), ``prom_matrix``
(answers into columns); their names used elsewhere are re-exported here.
"""
from __future__ import annotations

import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..model import SeriesKey
from ..signals import DERIVED, SIGNALS
from .prom_client import MAX_POINTS_PER_SERIES, PromConfig, PrometheusClient, PrometheusError, range_pieces
from .prom_matrix import decode_matrix, finish_columns, parse_matrix
from .prom_query import format_matchers, parse_duration, parse_selector, parse_time

__all__ = [  # the names other modules import from here
    "MAX_POINTS_PER_SERIES", "Batch", "FetchResult", "PromConfig", "PrometheusClient", "PrometheusError",
    "decode_matrix", "fetch", "finish_columns", "parse_duration", "parse_matrix", "parse_selector", "parse_time",
    "range_pieces", "signal_batches",
]

# Raw fetches are split into chunks of this length (6 h: 1,440 points per series at 15 s).
RAW_CHUNK_SECONDS = 6 * 3600
# Longer windows without --step are resampled instead (a week of 1 s scrapes would be 600k points
# per series); the step is chosen to give at most AUTO_POINTS points per series.
RAW_MAX_SPAN_SECONDS = 24 * 3600
AUTO_POINTS = 5_760
# Concurrent requests (Prometheus evaluates queries in parallel; 4 keeps a small server responsive).
PARALLEL_REQUESTS = 4

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SUMMARY_SUFFIXES = ("", "_sum", "_count")
# Raw names read beside the signal table: DCGM's reserved framebuffer (total = used + free + reserved),
# fragscope's derived fragmentation ratio (for fleet peers when the probe's raw bytes are absent).
EXTRA_NAMES: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("fragscope_torch_fragmentation_ratio", "gauge"),
)


@dataclass
class Batch:
    """Raw metric names fetched in one request, with their exposition types."""

    names: tuple[str, ...]
    types: dict[str, str]

    def regex(self) -> str:
        alts = []
        for n in self.names:
            esc = re.escape(n).replace("\\:", ":")
            if n.startswith("vllm:"):  # Ray Serve LLM re-exports as ray_vllm:
                esc = "(?:ray_)?" + esc
            alts.append(esc)
        return "|".join(alts)


def signal_batches(signals: Iterable[str] | None = None) -> list[Batch]:
    """The raw names of the signal table grouped into batches (one request each per chunk).

    Histograms get their own batch (their buckets are most of the points); gauges and counters of
    one scope share one.
    """
    groups: dict[str, dict[str, str]] = {}
    wanted = set(signals) if signals is not None else None
    derived = {d.metric: d.family for d in DERIVED}
    for sig in SIGNALS.values():
        if wanted is not None and sig.id not in wanted:
            continue
        for src in sig.sources:
            name = src.metric
            if name in derived:
                # made at ingest from its engine family (collectors/engines.py): fetch the family itself
                groups.setdefault(sig.scope, {})[derived[name]] = "gauge"
                continue
            if sig.kind == "histogram":
                g = groups.setdefault(f"hist:{name}", {})
                for suf in HISTOGRAM_SUFFIXES:
                    g[name + suf] = "histogram"
            elif sig.kind == "summary":
                g = groups.setdefault(f"{sig.scope}:{name}", {})
                for suf in SUMMARY_SUFFIXES:
                    g[name + suf] = "summary"
            else:
                groups.setdefault(sig.scope, {})[name] = sig.kind
    if wanted is None:
        for name, kind in EXTRA_NAMES:
            groups.setdefault("gpu", {})[name] = kind
    return [Batch(tuple(sorted(g)), g) for _, g in sorted(groups.items())]


@dataclass
class FetchResult:
    """Raw columns for every series found, plus what the fetch cost and what it noticed."""

    cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]]
    types: dict[str, str]
    start: float
    end: float
    mode: str  # "raw" | "resampled"
    step: float | None
    queries: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def fetch(client: PrometheusClient, start: float, end: float, selector: str | None = None,
          step: float | None = None, batches: list[Batch] | None = None,
          parallel: int = PARALLEL_REQUESTS) -> FetchResult:
    """Fetch every batch of raw names over [start, end] for the series matching ``selector``.

    DCGM series of Kubernetes pods carry the workload in ``exported_pod``/``exported_namespace``
    when Prometheus scrapes dcgm-exporter without ``honor_labels``: a selector on ``pod`` or
    ``namespace`` is also tried with those names for the DCGM batch.
    """
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PrometheusError(f"empty time window: start {start} is not before end {end}")
    matchers = parse_selector(selector) if isinstance(selector, str) else list(selector or [])
    batches = batches if batches is not None else signal_batches()
    span = end - start
    notes: list[str] = []
    mode = "raw"
    if step is None and span > RAW_MAX_SPAN_SECONDS:
        step = max(1.0, math.ceil(span / AUTO_POINTS))
        notes.append(f"window of {span / 3600:.1f} h is longer than {RAW_MAX_SPAN_SECONDS // 3600} h: "
                     f"resampled at a {step:g} s step (give --step to choose)")
    if step is not None:
        mode = "resampled"

    jobs: list[tuple[str, dict[str, str]]] = []
    for b in batches:
        variants = [matchers]
        if any(n.startswith("DCGM_") for n in b.names) and any(k in ("pod", "namespace") for k, _, _ in matchers):
            variants.append([(("exported_" + k) if k in ("pod", "namespace") else k, op, v)
                             for k, op, v in matchers])
        for m in variants:
            inner = f'__name__=~"{b.regex()}"'
            if m:
                inner += "," + format_matchers(m)
            sel = "{" + inner + "}"
            jobs.append((sel, b.types))

    q0, s0 = client.queries, time.perf_counter()

    def run(job: tuple[str, dict[str, str]]) -> list:
        sel, _ = job
        if mode == "raw":
            items = []
            t = end
            while t > start:
                lo = max(start, t - RAW_CHUNK_SECONDS)
                # range selectors include both ends in Prometheus 2.x, not the left end in 3.x:
                # ask for 1 ms more and trim below, duplicates at the edges are dropped
                dur_ms = int(math.ceil((t - lo) * 1000)) + 1
                _, res = client.query(f"{sel}[{dur_ms}ms]", t)
                items.extend(res)
                t = lo
            return items
        return client.query_range(sel, start, end, step)

    if parallel > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=min(parallel, len(jobs))) as ex:
            results = list(ex.map(run, jobs))
    else:
        results = [run(j) for j in jobs]
    cols: dict[SeriesKey, tuple[list, list]] = {}
    types: dict[str, str] = {}
    for (sel, btypes), items in zip(jobs, results):
        parse_matrix(items, cols=cols)
        types.update(btypes)
    done = finish_columns(cols)
    if mode == "raw":
        for key, (ts, vs) in list(done.items()):
            keep = (ts >= start - 1e-6) & (ts <= end + 1e-6)
            if not keep.all():
                if keep.any():
                    done[key] = (ts[keep], vs[keep])
                else:
                    del done[key]
    if client.warnings:
        notes.extend(f"server warning: {w}" for w in dict.fromkeys(client.warnings))
    return FetchResult(done, types, start, end, mode, step, client.queries - q0,
                       time.perf_counter() - s0, notes)
