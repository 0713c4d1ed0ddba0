"""Scrapes without timestamps (``curl /metrics > FILE``, a paste): where one scrape ends and the next
begins, which scrapes come from the same process, and the window they make (docs/collectors.md#scrapes-without-timestamps).

A scrape boundary is a series seen again (the same series line twice), a family's ``# HELP`` or
``# TYPE`` seen again, or ``# EOF``. Successive segments whose series overlap (half of the smaller
one or more) and whose ``process_start_time_seconds`` agree are successive scrapes of one target;
otherwise they are another target (another server, or the same one restarted). Process-level
families that every client library exports (``process_*``, ``python_*``, ``go_*``, ``promhttp_*``,
``http_*``) are left out of that comparison: two exporters concatenated both have them. Targets whose
series collide are kept apart by the label ``scrape_target``; targets with different series (a vLLM
and a DCGM exporter scrape concatenated) are read side by side, only their process-level series
labelled apart.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..model import SeriesKey, Window

GENERIC_PREFIXES = ("process_", "python_", "go_", "promhttp_", "http_")
# Spacing given to successive scrapes when the interval is not known (flagged on the window).
ASSUMED_INTERVAL_S = 15.0
# Label that keeps apart targets whose series collide.
TARGET_LABEL = "scrape_target"
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


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def build_window(cols: Mapping[SeriesKey, tuple[list, list]], types: Mapping[str, str], tr: SegmentTracker,
                 source: str, anchor: float, interval_s: float | None) -> Window:
    """The window of scrapes parsed with segment indices as times: synthetic times (the last scrape at
    ``anchor``, ``interval_s`` apart, or ASSUMED_INTERVAL_S flagged as assumed), targets kept apart,
    and notes saying what the scrapes can and cannot show."""
    tr.finish()
    seg_target = np.asarray(tr.seg_target, dtype=np.int64)
    seg_num = np.asarray(tr.seg_num, dtype=np.int64)
    n_targets = len(tr.targets)
    scrapes = max((t.scrapes for t in tr.targets), default=0)
    known = interval_s is not None
    step = float(interval_s) if known else ASSUMED_INTERVAL_S
    t0 = anchor - (scrapes - 1) * step
    seg_time = t0 + seg_num.astype(np.float64) * step

    idx_cols = {k: np.asarray(c[0], dtype=np.int64) for k, c in cols.items()}
    collide = False  # engine / GPU series of two targets share a key: label every series apart
    split_generic: set = set()  # process-level series shared by targets: label only those apart
    if n_targets > 1:
        for k, idx in idx_cols.items():
            tg = seg_target[idx]
            if tg.size > 1 and (tg != tg[0]).any():
                if k.name.startswith(GENERIC_PREFIXES):
                    split_generic.add(k)
                else:
                    collide = True
                    break
    out: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    for k, idx in idx_cols.items():
        vals = np.asarray(cols[k][1], dtype=np.float64)
        if not collide and k not in split_generic:
            out[k] = (seg_time[idx], vals)
            continue
        tg = seg_target[idx]
        for t in np.unique(tg):
            m = tg == t
            nk = SeriesKey(k.name, tuple(sorted(k.labels + ((TARGET_LABEL, str(int(t) + 1)),))))
            out[nk] = (seg_time[idx[m]], vals[m])
    w = Window.from_columns(out, source=source, types=types)
    w.timestamps = "none"
    w.scrapes = scrapes
    w.scrape_interval_known = known
    w.notes.extend(scrape_notes(scrapes, n_targets, collide, tr, known, step, anchor, len(w)))
    return w


def scrape_notes(scrapes: int, n_targets: int, collide: bool, tr: SegmentTracker, known: bool, step: float,
                 anchor: float, n_series: int) -> list[str]:
    when = _iso(anchor) if math.isfinite(anchor) and 0 <= anchor < 253402300800 else "an arbitrary time"
    notes = []
    if scrapes <= 1:
        notes.append(
            f"one scrape without timestamps ({n_series} series): it shows the present state (gauges such as "
            "KV-cache usage and requests waiting) and lifetime counters, which count since each process started "
            "(a total, not a rate); rates and trends need two scrapes with a known interval (--scrape-interval) "
            f"or a recording with timestamps; its time is synthetic ({when}, the file's modification time)")
    elif known:
        notes.append(
            f"{scrapes} successive scrapes without timestamps, {step:g} s apart (interval given): changes and rates "
            f"between them are real, over {(scrapes - 1) * step:g} s only; times are synthetic (the last scrape at "
            f"{when}, the file's modification time)")
    else:
        notes.append(
            f"{scrapes} successive scrapes without timestamps and no interval given: times are synthetic "
            f"({step:g} s apart, assumed; the last at {when}, the file's modification time); what changed between "
            "scrapes is real, rates per second are not (give --scrape-interval SECONDS)")
    if n_targets > 1:
        restarted = sum(1 for t in tr.targets if t.restarted)
        if collide:
            why = (f"{restarted} told apart by process_start_time_seconds: another server, or a restart"
                   if restarted else "their series do not overlap")
            notes.append(f"{n_targets} scraped processes with the same metrics ({why}); kept apart by the label "
                         f"{TARGET_LABEL}=1..{n_targets}: judge them one at a time")
        else:
            notes.append(f"{n_targets} targets with different series (e.g. an engine and a DCGM exporter "
                         "concatenated): read side by side at the same times")
    return notes
