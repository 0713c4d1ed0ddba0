"""The agent's memory budget for what the engine exports: caps on series and labels, enforced before
anything is stored, with what was left out counted (docs/agent.md#memory-budget).

An engine page whose label values change every scrape (a request id, an adapter name per request)
is a new set of series each time: without a cap the agent held 600,000 series and 5.7 GB after a few
minutes of 40,000 churning series per scrape. Prometheus guards its own ingestion the same way with
per-scrape limits (scrape_config ``sample_limit``, ``label_limit``, ``label_name_length_limit``,
``label_value_length_limit``), but fails the whole scrape when one is passed; the agent keeps the
series it already follows and drops only the excess, so one hostile label cannot blind the detectors.

:class:`SeriesBudget` is one collector's admission: series with too many or too long labels are left
out, and at most ``max_series`` distinct series are followed, the least recently seen forgotten first
(a series seen in the last GRACE_RUNS scrapes is never displaced by a new one: the new one is dropped).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

from ..model import Sample

# Defaults (raise them in the [limits] table of the config). A vLLM V1 engine exports ~160 kept
# series, dcgm-exporter ~40 per GPU, the torch probe 16 per device: 2,048 per collector is ~10 times
# a large 8-GPU pod. Label limits: Prometheus leaves them unlimited by default; a vLLM label value is
# a model name or a path (under 300 bytes); vLLM 0.32's vllm:cache_config_info carries the most, 37
# labels and 877 bytes (tests/data/agent/vllm_cpu_0.32.0_before.txt): the bounds leave ~10x margin.
MAX_SERIES_PER_COLLECTOR = 2048
MAX_LABELS_PER_SERIES = 128
MAX_LABEL_NAME_BYTES = 128
MAX_LABEL_VALUE_BYTES = 2048
MAX_LABEL_BYTES = 8192  # names and values of one series together
# The ring (agent/ring.py): series held at once across collectors, and points held in all.
MAX_RING_SERIES = 4096
MAX_RING_POINTS = 2_000_000  # 32 MB of float64 times and values at most

REASONS = ("series_limit", "label_limit", "label_length")
GRACE_RUNS = 30


@dataclass(frozen=True)
class Limits:
    max_series_per_collector: int = MAX_SERIES_PER_COLLECTOR
    max_labels_per_series: int = MAX_LABELS_PER_SERIES
    max_label_name_bytes: int = MAX_LABEL_NAME_BYTES
    max_label_value_bytes: int = MAX_LABEL_VALUE_BYTES
    max_label_bytes: int = MAX_LABEL_BYTES
    max_ring_series: int = MAX_RING_SERIES
    max_ring_points: int = MAX_RING_POINTS


class SeriesBudget:
    """Admission of one collector's samples (thread-safe: the collector's thread writes, the exporter
    and the API read ``dropped`` and ``series``)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._seen: OrderedDict[tuple, int] = OrderedDict()  # (name, labels) -> last run it was seen in
        self._run = 0
        # A series must have been missing for this many runs before a new one takes its place: a page whose
        # labels churn then stops costing new long-lived entries (here, in the ring, in the history) every
        # scrape, which fragmented the heap (~1 MB a scrape that malloc_trim could not return); a series
        # that really went away (a restarted pid) is replaced after ~30 s at 1 s sampling.
        self.grace = GRACE_RUNS
        self._lock = threading.Lock()
        self.dropped = dict.fromkeys(REASONS, 0)  # samples left out, by reason
        # what the collector itself left out to stay bounded (its ``dropped`` dict: lines past the line
        # cap, probe files and devices refused or past their caps, log lines skipped), by reason
        self.external: dict[str, int] = {}
        self.forgotten = 0  # series forgotten (least recently seen) to make room for new ones

    @property
    def series(self) -> int:
        return len(self._seen)

    def _labels_ok(self, labels) -> str | None:
        lim = self.limits
        if len(labels) > lim.max_labels_per_series:
            return "label_limit"
        total = 0
        for k, v in labels:
            if len(k) > lim.max_label_name_bytes or len(v) > lim.max_label_value_bytes:
                return "label_length"
            total += len(k) + len(v)
        return "label_length" if total > lim.max_label_bytes else None

    def admit(self, samples: Iterable[Sample]) -> list[Sample]:
        """The samples that fit the budget, in order; the others counted in ``dropped``. Series already
        followed are refreshed first, so new series (wherever they sit on the page) never displace
        one that is still exported."""
        cap = self.limits.max_series_per_collector
        samples = samples if isinstance(samples, list) else list(samples)
        out: list[Sample] = []
        with self._lock:
            self._run += 1
            run = self._run
            seen = self._seen
            dropped = self.dropped
            new = False
            for s in samples:  # pass 1: the series followed so far, seen again
                key = (s.name, s.labels)
                last = seen.get(key)
                if last is None:
                    new = True
                elif last != run:
                    seen[key] = run
                    seen.move_to_end(key)
            if not new:
                return samples
            for s in samples:  # pass 2: the new series, while there is room
                key = (s.name, s.labels)
                if key not in seen:
                    why = self._labels_ok(s.labels)
                    if why is not None:
                        dropped[why] += 1
                        continue
                    if len(seen) >= cap:
                        oldest, when = next(iter(seen.items()))
                        if run - when < self.grace:  # every series held was seen lately: no room
                            dropped["series_limit"] += 1
                            continue
                        del seen[oldest]
                        self.forgotten += 1
                    seen[key] = run
                out.append(s)
        return out

    def note(self, collector_obj) -> None:
        """Take the collector's own counts (its ``dropped`` attribute, cumulative), when it has one."""
        d = getattr(collector_obj, "dropped", None)
        if isinstance(d, dict) and d:
            self.external = {str(k): int(v) for k, v in d.items()}

    def counts(self) -> dict[str, int]:
        """Everything left out, by reason: the budget's own and the collector's."""
        out = dict(self.dropped)
        for k, v in self.external.items():
            out[k] = out.get(k, 0) + v
        return out

    def to_dict(self) -> dict:
        return {"series": self.series, "max_series": self.limits.max_series_per_collector,
                "dropped": self.counts(), "forgotten": self.forgotten}


def limits_status(state) -> dict:
    """What the agent left out to stay within its budget (``/api/v1/status`` ``limits``): per reason
    summed over collectors, the ring's evictions, the history's series evictions."""
    dropped = dict.fromkeys(REASONS, 0)
    per = {}
    for name, h in list(state.collectors.items()):
        b = getattr(h, "budget", None)
        if b is None:
            continue
        d = b.to_dict()
        per[name] = d
        for k, v in d["dropped"].items():
            dropped[k] = dropped.get(k, 0) + v
    ring = state.ring
    if ring is not None:
        dropped["ring_series_evicted"] = ring.evicted
        dropped["ring_samples_dropped"] = ring.dropped
    store = state.store
    if store is not None:
        dropped["store_series_evicted"] = getattr(store, "series_evicted", 0)
    out = {"dropped": dropped, "collectors": per}
    if ring is not None:
        out["ring"] = {"series": len(ring), "max_series": ring.max_series, "points_allocated": ring.allocated,
                       "max_points": ring.max_points}
    return out
