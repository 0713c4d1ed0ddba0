"""Kernel-timeline analysis (``diagnose trace FILE``): the figures behind launch-bound, sync-bound and
allocator-stall verdicts.

Input: a columnar :class:`~fragscope.timeline_model.Timeline` (Kineto JSON or nsys SQLite, read by
:mod:`fragscope.collectors.trace_format`). Per device and stream: busy / idle share over first op start ->
last op end (HTA's temporal breakdown), the gap distribution, HTA's idle-time categories (host wait /
kernel wait / other), launch delay (HTA) = queue time (nsys), the share of short kernels, synchronous API
time, pageable copies, and cudaMalloc/cudaFree in steady state. Contract (JSON fields, ids): docs/trace.md.

:func:`analyse` is pure (no I/O); verdicts are in :mod:`.timeline_verdicts`, the agent's samples in
:mod:`.timeline_samples`, per-device figures in :mod:`.timeline_streams`. Reading a file and running all
three: :func:`fragscope.trace_pipeline.analyse_trace_file`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..timeline_model import (COPY_HTOD, COPY_UVM_DTOD, COPY_UVM_DTOH, COPY_UVM_HTOD, FREE, GRAPH_LAUNCH, KERNEL,
                              LAUNCH, MALLOC, MARK_BACKWARD, MARK_OPTIMIZER, MARK_SERVING, MEMCPY_ASYNC, MEMCPY_SYNC,
                              SYNC, UM_CAUSES, Timeline, is_driver_launch_name)
from .timeline_config import ALLOCATOR_STALLS, LAUNCH_BOUND, SYNC_BOUND, Config
from .timeline_samples import trace_samples
from .timeline_streams import (FIRST, THREAD_MIN_OPS, Device, launch_flags, merged_spans, ns_bound, quantiles_of_ns,
                               sec)
from .timeline_verdicts import judge
from .. import vec
from ..vec import xp_of

if TYPE_CHECKING:  # (columns are numpy arrays or fragscope.vec.Vec: each function takes the operations from xp_of)
    import numpy as np

__all__ = ["analyse", "judge", "trace_samples", "Config", "LAUNCH_BOUND", "SYNC_BOUND", "ALLOCATOR_STALLS",
           "merged_spans", "quantiles_of_ns"]


def analyse(tl: Timeline, cfg: Config = Config()) -> dict:
    """Timeline metrics (JSON-ready dict; contract in docs/trace.md). Pure.

    Vectorised over ops and calls (no Python loop over rows). Each device's columns are taken in start
    order (no copy when the ops already are), and each stream's are gathered from them when its turn
    comes. Full-length temporaries are few and short-lived: on a fresh process every new megabyte is
    page faults, which cost more than the arithmetic (bench/bench_trace.py)."""
    notes: list[str] = []
    sel, rule = _selection(tl, cfg, notes)
    n_sel = tl.n_ops if sel is None else int(sel.sum())
    # Each device's ops in start order, and what needs only their times and streams (the device's merged
    # intervals, the grouping by stream): on a large device a worker thread starts on it now, while this
    # thread computes the per-op launch columns below.
    work = _device_work(tl, sel, cfg)
    try:
        # first_call: the host window's start, the first launch call of an analysed op (None: none linked)
        lstart, flags, delay, first_call = _launch_columns(tl, sel, cfg)
        syncing, small_h2d, pageable_async, sync = _syncing_calls(tl, cfg)
        start, end = tl.op_start, tl.op_end
        if tl.n_ops:
            w0 = int(start.min() if sel is None else start[sel].min())
            w1 = int(end.max() if sel is None else end[sel].max())
        else:  # only unified-memory migrations: their span
            w0, w1 = int(tl.um_start.min()), int(tl.um_end.max())

        def host_job() -> dict:
            return _host_fields(tl, cfg, w0, w1, first_call, syncing, small_h2d, pageable_async, sel)

        host = None
        devices = []
        for d, di, dw in work:
            def take(a: np.ndarray) -> np.ndarray:
                return a if di is None else a[di]  # noqa: B023 -- used within this iteration

            last = d == work[-1][0]
            dw.set_launch(take(lstart), take(flags), take(delay), sync, extra=host_job if last else None)
            devices.append(dw.result())
            if last:
                host = dw.extra_result
    except BaseException:
        for _, _, dw in work:
            dw.abort()  # no worker thread is left waiting for launch columns
        raise

    if host is None:
        host = host_job()
    epoch = tl.epoch_offset_ns
    for name in ("sync_api_ratio", "steady_malloc_free_ratio"):
        share = host.get(name)
        if share is not None and share > 1.0:
            # calls summed over several host threads, or running past the window's ends: flagged, never clipped
            notes.append(f"{name} is {share * 100:.1f} % of its window: host calls overlap (several threads) or run "
                         "past the window's ends, so it is a sum of call time, not a share of wall time")
    return {
        "source": tl.source,
        "format": tl.format,
        **{k: tl.meta[k] for k in ("schema_version", "product_version", "reader") if tl.meta.get(k) is not None},
        "window": {"start": (w0 + epoch) / 1e9 if epoch is not None else None,
                   "end": (w1 + epoch) / 1e9 if epoch is not None else None,
                   "span_seconds": sec(w1 - w0)},
        "selection": {"ops_total": int(tl.n_ops), "ops_analysed": int(n_sel), "rule": rule,
                      "profiler_steps": len(tl.steps)},
        "devices": devices,
        "host": host,
        "workload": workload(tl),
        "unified_memory": _unified_memory(tl, w0, w1, notes),
        "notes": notes,
    }


def workload(tl: Timeline) -> dict:
    """What the trace ran: ``training`` (backward ops, autograd's forward->backward links, optimizer
    steps), ``serving`` (a serving engine's own ops: vLLM, SGLang), or ``unknown`` (neither, or both)."""
    m = tl.markers
    train = {k: m[k] for k in (MARK_BACKWARD, MARK_OPTIMIZER, "backward_links") if m.get(k)}
    serve = {k: m[k] for k in (MARK_SERVING,) if m.get(k)}
    if train and not serve:
        kind = "training"
    elif serve and not train:
        kind = "serving"
    else:
        kind = "unknown"
    return {"kind": kind, "markers": {**train, **serve},
            "examples": {k: list(v) for k, v in tl.marker_examples.items() if k in train or k in serve}}


def _unified_memory(tl: Timeline, w0: int, w1: int, notes: list[str]) -> dict | None:
    """Unified-memory page migrations (None: the format cannot record them, e.g. Kineto)."""
    if tl.um_start is None:
        return None
    np = xp_of(tl.um_start)
    n = int(tl.um_start.size)
    dur = tl.um_end - tl.um_start
    t0 = min(w0, int(tl.um_start.min())) if n else w0
    t1 = max(w1, int(tl.um_end.max())) if n else w1
    ck, cause = tl.um_copy_kind, tl.um_cause
    demand = (cause != 1) & (cause != 3)  # not prefetches (user / speculative): faults, evictions, unknown
    by_cause: dict[str, int] = {}
    for c in sorted(set(cause.tolist())):  # (few rows; numpy's unique imports numpy.ma: 15 ms and more)
        by_cause[UM_CAUSES.get(c, "unknown")] = by_cause.get(UM_CAUSES.get(c, "unknown"), 0) + int(
            np.count_nonzero(cause == c))
    secs = sec(int(dur.sum()))
    out = {
        "migrations": n,
        "demand_migrations": int(np.count_nonzero(demand)),
        "htod": int(np.count_nonzero(ck == COPY_UVM_HTOD)),
        "dtoh": int(np.count_nonzero(ck == COPY_UVM_DTOH)),
        "dtod": int(np.count_nonzero(ck == COPY_UVM_DTOD)),
        "demand_htod": int(np.count_nonzero(demand & (ck == COPY_UVM_HTOD))),
        "demand_dtoh": int(np.count_nonzero(demand & (ck == COPY_UVM_DTOH))),
        "bytes": int(np.maximum(tl.um_bytes, 0).sum()),
        "seconds": secs,
        "time_ratio": secs / sec(t1 - t0) if t1 > t0 else None,
        "by_cause": by_cause,
        "devices": sorted(set(tl.um_device.tolist())),
    }
    if n:
        notes.append(f"{n} unified-memory page migration(s) left out of GPU busy time (driver work, not kernels)")
    return out


def _selection(tl: Timeline, cfg: Config, notes: list[str]) -> tuple[np.ndarray | None, str]:
    """Which ops are analysed (None: all) and the rule in words. With two or more ProfilerSteps, HTA's
    rule: ops launched before the last step (often cut short when the profiler stops)."""
    if not (cfg.exclude_last_step and len(tl.steps) >= 2):
        return None, "all GPU ops"
    np = xp_of(tl.op_start)
    launch = tl.op_launch
    linked = launch >= 0
    cutoff = max(s for s, _ in tl.steps)
    ls = np.where(linked, tl.call_start[np.maximum(launch, 0)] if tl.call_start.size else 0, 0)
    cand = linked & (ls < cutoff)
    if cand.any():
        return cand, ("GPU ops launched before the last ProfilerStep (HTA's rule: the last step is often cut "
                      "short when the profiler stops)")
    notes.append("no GPU op was launched before the last ProfilerStep: analysed all ops")
    return None, "all GPU ops"


def _device_work(tl: Timeline, sel: np.ndarray | None, cfg: Config) -> list[tuple[int, np.ndarray | None, Device]]:
    """One (device, its op indices in start order or None for all ops in order, Device) per device."""
    np = xp_of(tl.op_start)
    start = tl.op_start
    dev_all = tl.op_device if sel is None else tl.op_device[sel]
    dmin, dmax = (int(dev_all.min()), int(dev_all.max())) if dev_all.size else (0, -1)
    if dmin == dmax:
        dev_ids = [dmin]
    elif hasattr(dev_all, "partition") and dmax - dmin < 1 << 16:  # numpy (its unique imports numpy.ma: 15 ms+)
        dev_ids = (np.flatnonzero(np.bincount(dev_all - dmin)) + dmin).tolist()
    else:
        dev_ids = np.unique(dev_all).tolist()
    idx_sel = None if sel is None else np.flatnonzero(sel)
    work: list[tuple[int, np.ndarray | None, Device]] = []
    for d in dev_ids:
        # di: this device's op indices in start order (None: every op, already in start order)
        if len(dev_ids) == 1:
            di = idx_sel
        else:
            di = np.flatnonzero(tl.op_device == d) if sel is None else idx_sel[dev_all == d]
        s = start if di is None else start[di]
        if s.size > 1 and not (s[1:] >= s[:-1]).all():
            o = np.argsort(s, kind="stable")
            di = o if di is None else di[o]
            s = s[o]
            del o
        cols = [s] + [a if di is None else a[di] for a in (tl.op_end, tl.op_kind, tl.op_comm, tl.op_pid,
                                                              tl.op_stream)]
        work.append((d, di, Device(d, *cols, c_kind=tl.call_kind, cfg=cfg, threaded=s.size >= THREAD_MIN_OPS)))
    return work


LAUNCH_BLOCK = 1 << 16  # ops per step of _launch_blocks


def _launch_columns(tl: Timeline, sel: np.ndarray | None, cfg: Config) -> tuple:
    """Per op: its launch call's start (int64 min when not linked), its launch flags (FIRST: the first
    op of its launch; SHORT_OK: can be a short kernel; SHORT: is one) and its launch delay (ns, clipped at
    0); and the first launch call of an analysed op (None: no analysed op is linked)."""
    np = xp_of(tl.op_start)
    if np is not vec:
        lstart, flags, delay, first_call = _launch_blocks(tl, sel, cfg, np)
        launch = tl.op_launch
        if not (launch.size < 2 or bool((launch[1:] > launch[:-1]).all())):  # (else FIRST is already right)
            first = _first_of_launch((flags & FIRST).view(bool), launch, tl.op_start, tl.call_start.size)
            flags &= ~np.uint8(FIRST)
            flags |= first.view(np.uint8)
        return lstart, flags, delay, first_call
    start, end, launch = tl.op_start, tl.op_end, tl.op_launch
    c_start, c_end, c_kind = tl.call_start, tl.call_end, tl.call_kind
    n_total = tl.n_ops
    linked = launch >= 0
    # Per op: its launch call's start (lstart; int64 min when not linked), end, duration (-1) and kind (-1).
    if c_start.size and bool(linked.all()):
        lstart, lend, lkind = c_start[launch], c_end[launch], c_kind[launch]
        ldur = lend - lstart
    elif c_start.size:
        li = np.maximum(launch, 0)
        lstart = np.where(linked, c_start[li], np.iinfo(np.int64).min)
        lend = np.where(linked, c_end[li], 0)
        ldur = np.where(linked, lend - lstart, -1)
        lkind = np.where(linked, c_kind[li], -1)
        del li
    else:
        lstart = np.full(n_total, np.iinfo(np.int64).min, dtype=np.int64)
        lend = np.zeros(n_total, dtype=np.int64)
        ldur = np.full(n_total, -1, dtype=np.int64)
        lkind = np.full(n_total, -1, dtype=np.int64)

    # Launch delay (HTA) = queue time (nsys): first op start - launch call end, clipped at 0. For a
    # CUDA-graph launch only its first op counts (the others queue behind it by construction).
    is_lk = lkind == LAUNCH  # lkind is -1 when not linked
    is_lk |= lkind == GRAPH_LAUNCH
    is_lk |= lkind == MEMCPY_ASYNC
    if sel is not None:
        is_lk &= sel
    first_of_launch = _first_of_launch(is_lk, launch, start, c_start.size)
    # HTA short kernels: launch call <= runtime cutoff and GPU time < launch time (plain launches)
    short_ok = tl.op_kind == KERNEL
    short_ok &= lkind == LAUNCH
    del lkind
    is_short = ldur <= cfg.runtime_cutoff_s * 1e9
    is_short &= short_ok
    # GPU time < launch time <=> ldur - (end - start) > 0, computed in ldur's buffer (no new array)
    np.subtract(ldur, end, out=ldur)
    np.add(ldur, start, out=ldur)
    is_short &= ldur > 0
    del ldur
    delay = np.subtract(start, lend, out=lend)
    np.maximum(delay, 0, out=delay)
    lsel = linked if sel is None else sel & linked
    first_call = int(lstart[lsel].min()) if lsel.any() else None
    return lstart, launch_flags(first_of_launch, short_ok, is_short), delay, first_call


def _launch_blocks(tl: Timeline, sel: np.ndarray | None, cfg: Config, np) -> tuple:
    """:func:`_launch_columns`' figures with numpy, LAUNCH_BLOCK ops at a time, FIRST set on every op
    launched by a launch, a graph launch or an async copy (the first of each launch is picked after). The
    same operations on the same values as the whole-array form (which the pure-Python columns take), but
    only the three result columns are full length: each step's gathered launch ends, kinds, durations and
    masks are reused scratch, still in cache for the arithmetic that follows."""
    start, end, launch, op_kind = tl.op_start, tl.op_end, tl.op_launch, tl.op_kind
    c_start, c_end, c_kind = tl.call_start, tl.call_end, tl.call_kind
    n = tl.n_ops
    cutoff = ns_bound(cfg.runtime_cutoff_s * 1e9, up=False)  # (ldur <= cutoff)
    lmin = np.iinfo(np.int64).min
    lstart, delay, flags = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.uint8)
    k = max(min(n, LAUNCH_BLOCK), 1)
    lend, ldur, li = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    lkind, unl, m = np.empty(k, dtype=np.int8), np.empty(k, dtype=bool), np.empty(k, dtype=bool)
    is_lk, short_ok, is_short, bits = (np.empty(k, dtype=bool) for _ in range(4))
    first_call = None
    for a in range(0, n, k):
        b = min(a + k, n)
        j = b - a
        L, ls, le, ld, lk, un, mm = launch[a:b], lstart[a:b], lend[:j], ldur[:j], lkind[:j], unl[:j], m[:j]
        np.less(L, 0, out=un)
        some_unlinked = bool(un.any())
        if c_start.size:
            idx = np.maximum(L, 0, out=li[:j]) if some_unlinked else L
            np.take(c_start, idx, out=ls)
            np.take(c_end, idx, out=le)
            np.take(c_kind, idx, out=lk)
            np.subtract(le, ls, out=ld)
            if some_unlinked:
                ls[un] = lmin
                le[un] = 0
                ld[un] = -1
                lk[un] = -1
        else:
            ls.fill(lmin)
            le.fill(0)
            ld.fill(-1)
            lk.fill(-1)
        # first launch call of an analysed linked op
        np.logical_not(un, out=mm)
        if sel is not None:
            mm &= sel[a:b]
        if some_unlinked or sel is not None:
            if mm.any():
                v = int(ls[mm].min())
                first_call = v if first_call is None else min(first_call, v)
        elif j:
            v = int(ls.min())
            first_call = v if first_call is None else min(first_call, v)
        # launched by a launch, a graph launch or an async copy (see _launch_columns)
        lk_, so, ss = is_lk[:j], short_ok[:j], is_short[:j]
        np.equal(lk, LAUNCH, out=lk_)
        lk_ |= np.equal(lk, GRAPH_LAUNCH, out=mm)
        lk_ |= np.equal(lk, MEMCPY_ASYNC, out=mm)
        if sel is not None:
            lk_ &= sel[a:b]
        np.equal(op_kind[a:b], KERNEL, out=so)
        so &= np.equal(lk, LAUNCH, out=mm)
        np.less_equal(ld, cutoff, out=ss)
        ss &= so
        np.subtract(ld, end[a:b], out=ld)
        np.add(ld, start[a:b], out=ld)
        ss &= np.greater(ld, 0, out=mm)
        dl = np.subtract(start[a:b], le, out=delay[a:b])
        np.maximum(dl, 0, out=dl)
        fl, bt = flags[a:b], bits[:j].view(np.uint8)
        np.left_shift(so.view(np.uint8), 1, out=fl)
        fl |= lk_.view(np.uint8)
        fl |= np.left_shift(ss.view(np.uint8), 2, out=bt)
    return lstart, flags, delay, first_call


def _first_of_launch(is_lk: np.ndarray, launch: np.ndarray, start: np.ndarray, n_calls: int) -> np.ndarray:
    """Among the launched ops ``is_lk``, the first (by start) of each launch call."""
    np = xp_of(launch)
    if launch.size < 2 or bool((launch[1:] > launch[:-1]).all()):
        return is_lk  # every call launched one op at most (then so did the launch calls)
    first_of_launch = np.zeros(launch.size, dtype=bool)
    lk = np.flatnonzero(is_lk)
    lc = launch[lk]
    if lc.size < 2 or bool((lc[1:] > lc[:-1]).all()):  # strictly increasing: one op per call
        multi = np.zeros(lk.size, dtype=bool)
    else:
        multi = np.bincount(lc, minlength=n_calls)[lc] > 1
    if not multi.any():
        first_of_launch[lk] = True
    else:
        first_of_launch[lk[~multi]] = True
        lm = lk[multi]
        o = lm[np.lexsort((start[lm], launch[lm]))]
        firsts = np.ones(o.size, dtype=bool)
        firsts[1:] = launch[o][1:] != launch[o][:-1]
        first_of_launch[o[firsts]] = True
    return first_of_launch


def _syncing_calls(tl: Timeline, cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """Synchronizing host calls: sync APIs, synchronous copies/sets (H2D <= 64 KB ignored, as nsys), and
    async copies from/to pageable memory (they silently become synchronous). Returns the mask, the small
    H2D and pageable-async masks, and (count, starts, running max end) of the syncing calls by start."""
    np = xp_of(tl.op_start)
    c_start, c_end, c_kind, launch = tl.call_start, tl.call_end, tl.call_kind, tl.op_launch
    small_h2d = np.zeros(c_start.size, dtype=bool)
    pageable_async = np.zeros(c_start.size, dtype=bool)
    # Only copies can be small host-to-device or pageable (kernels carry COPY_UNKNOWN, -1 bytes, not pageable).
    copies = bool(c_start.size) and bool((tl.op_kind != KERNEL).any())
    if copies:
        call_op = np.full(c_start.size, -1, dtype=np.int64)
        linked = launch >= 0
        if bool(linked.all()):
            call_op[launch] = np.arange(tl.n_ops)
        else:
            linked_ops = np.flatnonzero(linked)
            call_op[launch[linked_ops]] = linked_ops
        has_op = np.flatnonzero(call_op >= 0)
        op_of = call_op[has_op]
        cp = tl.op_kind[op_of] != KERNEL
        has_op, op_of = has_op[cp], op_of[cp]
        small_h2d[has_op] = (tl.op_copy_kind[op_of] == COPY_HTOD) & (tl.op_bytes[op_of] >= 0) & \
            (tl.op_bytes[op_of] <= cfg.memcpy_sync_min_bytes)
        pageable_async[has_op] = tl.op_pageable[op_of]
        del call_op, has_op, op_of, cp
    syncing = c_kind == SYNC
    if copies:
        syncing |= (c_kind == MEMCPY_SYNC) & ~small_h2d
        syncing |= (c_kind == MEMCPY_ASYNC) & pageable_async
    else:  # (no small H2D copy to ignore, no pageable copy)
        syncing |= c_kind == MEMCPY_SYNC
    s_idx = np.flatnonzero(syncing)
    s_idx = s_idx[np.argsort(c_start[s_idx], kind="stable")]
    sync_cmend = np.maximum.accumulate(c_end[s_idx]) if s_idx.size else s_idx
    return syncing, small_h2d, pageable_async, (s_idx.size, c_start[s_idx], sync_cmend)


def _between(np, cs: np.ndarray, lo, hi, ordered: bool) -> np.ndarray:
    """The mask of lo <= cs <= hi; ``ordered``: cs is in ascending order (numpy), then by two binary
    searches (2 M calls: 1 ms against 6-8 ms for the two comparisons of every value)."""
    if ordered and type(lo) is int and type(hi) is int:
        m = np.zeros(cs.size, dtype=bool)
        m[int(np.searchsorted(cs, lo, side="left")):int(np.searchsorted(cs, hi, side="right"))] = True
        return m
    m = cs >= lo
    m &= cs <= hi
    return m


def _host_fields(tl: Timeline, cfg: Config, w0: int, w1: int, first_call: int | None, syncing: np.ndarray,
                 small_h2d: np.ndarray, pageable_async: np.ndarray, sel: np.ndarray | None) -> dict:
    np = xp_of(tl.op_start)
    cs, ce, ck = tl.call_start, tl.call_end, tl.call_kind
    # host window: from the first launch of an analysed op (launches precede their ops) to the last op end
    h0 = min(w0, first_call) if first_call is not None else w0
    # calls in start order (as an export stores them): each window's mask from two binary searches
    ordered = np is not vec and cs.size > 1 and bool((cs[1:] >= cs[:-1]).all())
    inwin = _between(np, cs, h0, w1, ordered)
    span = max(w1 - w0, 1)
    sy = syncing & inwin
    # steady state: after the first ProfilerStep when there are two or more, else the second half
    # of the window (project-chosen: warm-up allocations happen early).
    steps_used = [st for st in tl.steps if st[0] < w1]
    if len(steps_used) >= 2:
        steady0, steady_rule = steps_used[0][1], "after the first ProfilerStep"
    else:
        steady0, steady_rule = w0 + (w1 - w0) // 2, "second half of the window"
    steady = _between(np, cs, steady0, w1, ordered)
    mal = steady & (ck == MALLOC)
    fre = steady & (ck == FREE)
    mf = mal | fre
    # a flush shows as a cudaFree followed by cudaMalloc (the allocator releasing cached segments, then growing
    # again); mallocs with no free before them are the pool growing (first use of a size)
    fre_i = np.flatnonzero(fre)
    n_after_free = int(np.count_nonzero(mal & (cs > cs[fre_i].min()))) if fre_i.size else 0
    by_name: dict[str, dict] = {}
    listed = np.flatnonzero(sy | mf)
    if listed.size:
        # per API name, in order of first appearance: calls and seconds (summed in call order)
        nm_idx = np.zeros(listed.size, dtype=np.int64)
        if tl.call_names:  # one entry per name string (the first index that carries it)
            canon: dict[str, int] = {}
            lut = np.array([canon.setdefault(n, i) for i, n in enumerate(tl.call_names)], dtype=np.int64)
            nm_idx = lut[tl.call_name[listed]]
        secs = (ce[listed] - cs[listed]) / 1e9
        uniq, first = np.unique(nm_idx, return_index=True)
        tot = np.bincount(nm_idx, weights=secs)
        cnt = np.bincount(nm_idx)
        for u in uniq[np.argsort(first, kind="stable")].tolist():
            nm = tl.call_names[u] if tl.call_names else "?"
            by_name[nm] = {"calls": int(cnt[u]), "seconds": float(tot[u])}
    launches = inwin & ((ck == LAUNCH) | (ck == GRAPH_LAUNCH))
    names = tl.call_names
    n_drv = 0
    if names:
        is_drv = np.array([is_driver_launch_name(n) for n in names], dtype=bool)
        if is_drv.any():
            n_drv = int((is_drv[tl.call_name] & launches).sum())
    graph_calls = inwin & (ck == GRAPH_LAUNCH)
    n_graph = int(graph_calls.sum())
    if n_graph:
        olk = tl.op_launch if sel is None else tl.op_launch[sel]
        g_ops = int(graph_calls[olk[olk >= 0]].sum())
    else:
        g_ops = 0
    steady_span = max(w1 - steady0, 1)
    pg = tl.op_pageable if sel is None else sel & tl.op_pageable
    sy_i, mf_i = np.flatnonzero(sy), np.flatnonzero(mf)
    sy_sec = float((ce[sy_i] - cs[sy_i]).sum())
    mf_sec = float((ce[mf_i] - cs[mf_i]).sum())
    return {
        "calls_in_window": int(np.count_nonzero(inwin)),
        "launch_calls": int(np.count_nonzero(launches)),
        "driver_launch_calls": n_drv,
        "graph_launch_calls": n_graph,
        "kernels_per_graph_launch": (g_ops / n_graph) if n_graph else None,
        "sync_api_calls": int(sy_i.size),
        "sync_api_seconds": sy_sec / 1e9,
        "sync_api_ratio": sy_sec / span,
        "pageable_copies": int(pg.sum()),
        "pageable_copy_bytes": int(np.maximum(tl.op_bytes[pg], 0).sum()),
        "pageable_async_copy_calls": int((pageable_async & inwin).sum()),
        "steady_state": {"rule": steady_rule, "start": (steady0 + tl.epoch_offset_ns) / 1e9
                         if tl.epoch_offset_ns is not None else None, "span_seconds": steady_span / 1e9},
        "steady_malloc_calls": int(np.count_nonzero(mal)),
        "steady_free_calls": int(np.count_nonzero(fre)),
        "steady_malloc_after_free_calls": n_after_free,
        "steady_malloc_free_seconds": mf_sec / 1e9,
        "steady_malloc_free_ratio": mf_sec / steady_span,
        "api": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["seconds"])),
    }
