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
import itertools
import math
from typing import Mapping

import numpy as np

from .. import npstats
from ..model import Series, SeriesKey, Window
from .segments import GENERIC_PREFIXES, SegmentTracker

# Spacing given to successive scrapes when the interval is not known (flagged on the window).
ASSUMED_INTERVAL_S = 15.0
# Label that keeps apart targets whose series collide.
TARGET_LABEL = "scrape_target"


def bulk_window(cols: Mapping[SeriesKey, tuple], source: str = "", types: Mapping[str, str] | None = None) -> Window:
    """``Window.from_columns`` in bulk: one concatenation and one vectorised check of all points, then
    each clean series is a view of the concatenated arrays; only series with NaN/Inf values, duplicate
    or unsorted times go through ``clean_series``. Same window, without a dozen numpy calls per series:
    100k short-lived series (bench/bench_ingest.py --churn) cost ~1 µs each instead of ~35 µs."""
    types = types or {}
    keys = list(cols)
    n = len(keys)
    lens = np.fromiter((len(c[0]) for c in cols.values()), dtype=np.int64, count=n)
    total = int(lens.sum()) if n else 0
    if total == 0:
        return Window.from_columns({}, source=source, types=types)
    if any(isinstance(c[0], np.ndarray) for c in cols.values()):
        ts = np.concatenate([np.asarray(c[0], dtype=np.float64) for c in cols.values()])
        vs = np.concatenate([np.asarray(c[1], dtype=np.float64) for c in cols.values()])
    else:
        ts = np.fromiter(itertools.chain.from_iterable(c[0] for c in cols.values()), dtype=np.float64, count=total)
        vs = np.fromiter(itertools.chain.from_iterable(c[1] for c in cols.values()), dtype=np.float64, count=total)
    ends = np.cumsum(lens)
    starts = ends - lens
    good = np.isfinite(ts) & np.isfinite(vs)
    good[1:] &= ts[1:] > ts[:-1]
    nonempty = lens > 0
    first_ok = np.isfinite(ts[starts[nonempty]]) & np.isfinite(vs[starts[nonempty]])
    good[starts[nonempty]] = first_ok
    bad_per = np.zeros(n, dtype=np.int64)
    bad_per[nonempty] = np.add.reduceat((~good).astype(np.int64), starts[nonempty])
    out: dict[SeriesKey, Series] = {}
    dropped = 0
    start, end = math.inf, -math.inf
    clean = nonempty & (bad_per == 0)
    if clean.any():
        start = float(ts[starts[clean]].min())
        end = float(ts[ends[clean] - 1].max())
    st_l, en_l, cl_l, ne_l = starts.tolist(), ends.tolist(), clean.tolist(), nonempty.tolist()
    dirty: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    for i, key in enumerate(keys):
        if not ne_l[i]:
            continue
        a, b = st_l[i], en_l[i]
        if cl_l[i]:
            out[key] = Series(key, ts[a:b], vs[a:b], types.get(key.name, "untyped"))
        else:
            dirty[key] = (ts[a:b], vs[a:b])
    if dirty:  # the few series that need cleaning: the per-series path every window takes
        rest = Window.from_columns(dirty, source=source, types=types)
        out.update(rest.series)
        out = {k: out[k] for k in keys if k in out}  # the order the reader met them, as before
        dropped += rest.dropped_points
        if rest.series:
            start, end = min(start, rest.start), max(end, rest.end)
    if not out:
        start = end = math.nan
    return Window(out, start, end, source, dropped)


def split_targets(w: Window) -> list[tuple[str | None, Window]]:
    """One window per scraped process when ``build_window`` kept targets apart with the label
    ``scrape_target`` (two servers of the same model, or a restart, in one file); else ``[(None, w)]``.
    Each part has the label removed, the metadata and notes of ``w``, and its own start/end."""
    groups: dict[str, dict[SeriesKey, Series]] = {}
    for k, s in w.series.items():
        t = k.label(TARGET_LABEL)
        if t is None:
            return [(None, w)]
        nk = SeriesKey(k.name, k.without(TARGET_LABEL))
        groups.setdefault(t, {})[nk] = Series(nk, s.ts, s.values, s.type)
    if len(groups) <= 1:
        return [(None, w)]
    out = []
    for t in sorted(groups, key=lambda x: (len(x), x)):
        series = groups[t]
        start = min(float(s.ts[0]) for s in series.values())
        end = max(float(s.ts[-1]) for s in series.values())
        part = Window(series, start, end, f"{w.source} ({TARGET_LABEL}={t})", 0, list(w.notes),
                      w.timestamps, max((len(s) for s in series.values()), default=0), w.scrape_interval_known)
        out.append((t, part))
    return out


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
    # Engine / GPU series that two targets share: when they are a real share of a target's series (two
    # servers of one model, a restart), every series is labelled apart; when only a few are (a line an
    # exporter printed twice in one scrape), only those are, like the process-level ones.
    collide = False
    split_generic: set = set()
    if n_targets > 1:
        shared: set = set()
        per_target = np.zeros(n_targets, dtype=np.int64)
        for k, idx in idx_cols.items():
            tg = seg_target[idx]
            if k.name.startswith(GENERIC_PREFIXES):
                if tg.size > 1 and (tg != tg[0]).any():
                    split_generic.add(k)
                continue
            for t in npstats.unique(tg):
                per_target[t] += 1
            if tg.size > 1 and (tg != tg[0]).any():
                shared.add(k)
        smallest = int(per_target[per_target > 0].min()) if (per_target > 0).any() else 0
        if shared and len(shared) * 10 > smallest:
            collide = True
        else:
            split_generic |= shared
    out: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    for k, idx in idx_cols.items():
        vals = np.asarray(cols[k][1], dtype=np.float64)
        if not collide and k not in split_generic:
            out[k] = (seg_time[idx], vals)
            continue
        tg = seg_target[idx]
        for t in npstats.unique(tg):
            m = tg == t
            nk = SeriesKey(k.name, tuple(sorted(k.labels + ((TARGET_LABEL, str(int(t) + 1)),))))
            out[nk] = (seg_time[idx[m]], vals[m])
    w = bulk_window(out, source=source, types=types)
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
