"""Where one scrape ends and the next begins while a file of scrapes without timestamps is parsed
(``SegmentTracker``; the window the scrapes make is built in :mod:`.scrapes`, docs/collectors.md#scrapes-without-timestamps).

Apart from :mod:`.scrapes` so that the line parser (:mod:`.exposition_parse`) imports no numpy: ``diagnose FILE``
parses in a child process while the parent imports numpy and the detectors (:mod:`.prefetch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..model import SeriesKey

# Process-level families that every client library exports: left out when scrapes are told apart by their series.
GENERIC_PREFIXES = ("process_", "python_", "go_", "promhttp_", "http_")

# Earlier targets a new segment is compared with (bounds the cost on hostile input).
_MAX_TARGETS_COMPARED = 16
# process_start_time_seconds values further apart than this are different processes.
_PST_TOLERANCE_S = 1.0


@dataclass(slots=True)
class _Target:
    keys: set
    pst: float | None
    scrapes: int = 0
    restarted: bool = False  # told apart from an earlier target by process_start_time_seconds only


@dataclass(slots=True)
class SegmentTracker:
    """Online scrape-boundary detection while parsing (one instance per file)."""

    seg: int = 0
    n: int = 0  # samples kept in the current segment
    seen: dict = field(default_factory=dict)  # series line head -> segment
    keys: set = field(default_factory=set)  # non-generic series keys of the current segment
    pst: list = field(default_factory=list)  # process_start_time_seconds values in the segment
    meta_seen: dict = field(default_factory=dict)  # (HELP|TYPE, family) -> segment
    targets: list = field(default_factory=list)
    seg_target: list = field(default_factory=list)  # per closed segment: target index
    seg_num: list = field(default_factory=list)  # per closed segment: scrape number within its target

    def sample(self, head: str, key: SeriesKey, generic: bool, value: float) -> float:
        """The time slot (segment index) of a sample; a series seen again starts the next scrape."""
        if self.seen.get(head) == self.seg:
            self.close()
        self.seen[head] = self.seg
        if generic:
            if key.name == "process_start_time_seconds":
                self.pst.append(value)
        else:
            self.keys.add(key)
        self.n += 1
        return float(self.seg)

    def meta(self, kind: str, family: str) -> None:
        k = (kind, family)
        if self.meta_seen.get(k) == self.seg and self.n:
            self.close()
        self.meta_seen[k] = self.seg

    def eof(self) -> None:
        if self.n:
            self.close()

    def close(self) -> None:
        keys = self.keys
        pst = self.pst[0] if len(self.pst) == 1 else None
        chosen = None
        restarted = False
        for ti in range(len(self.targets) - 1, max(-1, len(self.targets) - 1 - _MAX_TARGETS_COMPARED), -1):
            t = self.targets[ti]
            if keys or t.keys:
                small, big = (keys, t.keys) if len(keys) <= len(t.keys) else (t.keys, keys)
                inter = sum(1 for k in small if k in big)
                if inter == 0 or inter * 2 < len(small):
                    continue
            if pst is not None and t.pst is not None and abs(pst - t.pst) > _PST_TOLERANCE_S:
                restarted = True
                continue
            chosen = ti
            break
        if chosen is None:
            chosen = len(self.targets)
            self.targets.append(_Target(set(), pst, restarted=restarted))
        t = self.targets[chosen]
        self.seg_target.append(chosen)
        self.seg_num.append(t.scrapes)
        t.scrapes += 1
        t.keys = keys
        if pst is not None:
            t.pst = pst
        self.seg += 1
        self.n = 0
        self.keys = set()
        self.pst = []

    def finish(self) -> None:
        if self.n:
            self.close()
