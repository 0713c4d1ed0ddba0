"""NVIDIA dcgm-exporter ``/metrics``, for clusters that already run it. docs/collectors.md#dcgm.

Keeps the ``DCGM_FI_*`` fields the signal table reads (memory in MiB, utilization in %, clocks in
MHz: fragscope/signals.py scales them), the clock-throttle violation counters and a few extras;
drops DCGM's "blank" sentinels (not available, not a value) and the per-host labels that only
add series (Hostname, driver version, PCI id, device node).
"""
from __future__ import annotations

import logging
import re

from ..model import CollectResult, Missing, Reason, Sample
from ..signals import SIGNALS
from .exposition import LineCache, ParseError, scrape_kept
from .endpoint import DCGM_PAGE_KINDS, Endpoint
from .exposition_parse import MAX_KEPT_LINES, keep_line
from .http import DEFAULT_MAX_BYTES, Fetch, FetchError, http_get
from .logonce import LogOnce

log = logging.getLogger(__name__)

EXTRA_FIELDS = (
    "DCGM_FI_DEV_FB_RESERVED",  # total = used + free + reserved when FB_TOTAL is not exported
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",  # value of the last XID
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",  # bitmask, NVML bits (older name)
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",  # same bitmask, newer name
    # throttle violation counters (ns), besides POWER/THERMAL in the signal table
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION",
    "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",  # ratio: better than GPU_UTIL for "is it busy"
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
)
KEEP = frozenset([s.metric for sig in SIGNALS.values() for s in sig.sources if s.metric.startswith("DCGM_")]
                 + list(EXTRA_FIELDS))
FIELD_LINE = re.compile(r"^(DCGM_[A-Za-z0-9_]*)[{\s][^\n]*\n?", re.M)
DROP_LABELS = frozenset({"Hostname", "DCGM_FI_DRIVER_VERSION", "pci_bus_id", "device"})
CORE = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP")

# DCGM blank values (dcgm_structs.h): int32 from 0x7ffffff0, int64 from 0x7ffffffffffffff0 (the
# exposition parser drops those), fp64 from 2**47; +1..+3 mean not found / not supported / no permission.
_INT32_BLANK = 0x7FFFFFF0
_FP64_BLANK = float(2**47)


def is_blank(value: float, name: str = "") -> bool:
    """True for a DCGM blank sentinel. The int32 range is not checked on int64 counters (the
    violation counters in ns pass through 2**31 legitimately)."""
    if value > 9.0e18 or (_FP64_BLANK <= value < _FP64_BLANK + 16):
        return True
    return _INT32_BLANK <= value <= 0x7FFFFFFF and not name.endswith(("_VIOLATION", "_COUNT"))


def parse_dcgm_metrics(text: str, ts: float, source: str = "dcgm", key_cache: dict | None = None,
                       lines: LineCache | None = None, counts: dict | None = None) -> list[Sample]:
    """A dcgm-exporter body -> kept samples stamped ``ts`` (pure but for the caches). Raises ParseError.

    ``lines`` (kept by the caller between scrapes): a page whose lines were all seen before is read with
    one dict hit and one float a line, as in collectors/vllm.py."""
    scraped = lines.scrape(FIELD_LINE.finditer(text), ts) if lines is not None else None
    if scraped is None:
        scraped = _parse(text, ts, source, key_cache, lines, counts)
    out = []
    for s in scraped:
        if s.name not in KEEP or is_blank(s.value, s.name):
            continue
        labels = s.labels
        if any(k in DROP_LABELS for k, _ in labels):
            labels = tuple((k, v) for k, v in labels if k not in DROP_LABELS)
        out.append(Sample(s.name, labels, s.ts, s.value))
    return out


def _parse(text: str, ts: float, source: str, key_cache: dict | None, lines: LineCache | None,
           counts: dict | None = None) -> list[Sample]:
    # only the kept fields' lines are parsed, found by a regex (no list of every line): bounded work
    # and memory on a hostile body (collectors/vllm.py does the same)
    kept = []
    for m in FIELD_LINE.finditer(text):
        if m.group(1) in KEEP:
            keep_line(kept, m.group(), lines, counts)
        elif lines is not None:
            lines.drop(m.group())
    if len(kept) >= MAX_KEPT_LINES:  # a page past the line cap (labels churning): nothing of it is memoised
        key_cache = lines = None
    return scrape_kept(kept, text, ts, source, KEEP, key_cache, lines)


class DcgmCollector:
    """Scrapes a dcgm-exporter. Never raises: failures mark it down with one line."""

    name = "dcgm"

    def __init__(self, url: str, timeout_s: float = 2.0, max_bytes: int = DEFAULT_MAX_BYTES,
                 fetch: Fetch = http_get) -> None:
        self.url = url
        self.endpoint = Endpoint(url, DCGM_PAGE_KINDS)  # the page behind url: collectors/endpoint.py
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.fetch = fetch
        self._log = LogOnce(log, f"dcgm {url}")
        self._keys: dict = {}  # parsed series lines, reused scrape after scrape
        self.dropped: dict[str, int] = {}  # lines past the line cap (agent/budget.py exports it)
        self._lines = LineCache()  # the page's lines as parsed: the fast path of the next scrapes

    def _down(self, now: float, reason: Reason | str, msg: str) -> CollectResult:
        self._log.problem(msg)
        return CollectResult(missing=[Missing(n, (), now, reason, msg) for n in CORE], up=False, error=msg)

    def collect(self, now: float) -> CollectResult:
        try:
            try:
                text = self.endpoint.fetch(self.fetch, timeout_s=self.timeout_s, max_bytes=self.max_bytes)
            except FetchError as e:
                return self._down(now, e.reason, str(e))
            try:
                samples = parse_dcgm_metrics(text, now, source=self.url, key_cache=self._keys, lines=self._lines,
                                             counts=self.dropped)
            except ParseError as e:
                return self._down(now, Reason.PARSE_ERROR, str(e))
            if not samples:
                return self._down(now, Reason.PARSE_ERROR,
                                  f"{self.url}: no DCGM_FI_* fields in the response; is this dcgm-exporter?")
            names = {s.name for s in samples}
            res = CollectResult(samples=samples)
            for n in CORE:
                if n not in names:
                    res.missing.append(Missing(n, (), now, Reason.NOT_COLLECTED,
                                               f"{self.url} does not export {n} (blank or not in its counters CSV)"))
            self._log.ok()
            return res
        except Exception as e:  # never raise into the agent
            return self._down(now, Reason.SOURCE_DOWN, f"{self.url}: dcgm collector failed: {type(e).__name__}: {e}"[:200])
