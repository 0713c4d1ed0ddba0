"""Kernel-timeline analysis and verdicts (``diagnose trace FILE``): launch-bound, sync-bound, allocator stalls.

Input: a columnar :class:`~fragscope.collectors.kineto.Timeline` (Kineto JSON or nsys SQLite).
Per device and stream: busy / idle share over first op start -> last op end (HTA's temporal
breakdown), the gap distribution, HTA's idle-time categories (host wait / kernel wait / other),
launch delay (HTA) = queue time (nsys), the share of short kernels, synchronous API time, pageable
copies, and cudaMalloc/cudaFree in steady state. Contract (JSON fields, ids): docs/trace.md.

:func:`analyse` and :func:`judge` are pure; :func:`analyse_trace_file` reads a file (for the agent's
capture feature and the CLI).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..collectors.kineto import (FREE, GRAPH_LAUNCH, KERNEL, LAUNCH, MALLOC, MEMCPY, MEMCPY_ASYNC,
                                 MEMCPY_SYNC, MEMSET, SYNC, COPY_HTOD, Timeline, read_trace)
from ..model import Evidence, Finding, Inconclusive, Sample, Severity, make_labels

LAUNCH_BOUND = "launch-bound"  # same id as the time-series detector
SYNC_BOUND = "sync-bound"
ALLOCATOR_STALLS = "allocator-stalls"


@dataclass(frozen=True, slots=True)
class Config:
    # HTA get_idle_time_breakdown consecutive_kernel_delay = 30 (trace µs): a shorter gap between
    # back-to-back ops whose launch came in time is launch overhead ("kernel wait").
    kernel_wait_cutoff_s: float = 30e-6
    # HTA cuda_kernel_launch_stats runtime_cutoff = 50 µs: launch calls up to this long can make
    # "short kernels" (GPU time < launch time); longer calls are runtime outliers.
    runtime_cutoff_s: float = 50e-6
    # HTA cuda_kernel_launch_stats launch_delay_cutoff = 100 µs: a longer launch delay means work was
    # queued on the GPU, i.e. the host was ahead -- evidence against launch-bound.
    launch_delay_cutoff_s: float = 100e-6
    # nsys analyze gpu_gaps: gaps of 500 ms or more are reported as program-level stalls.
    long_gap_s: float = 0.5
    # nsys analyze gpu_time_util: windows below 50 % GPU time are reported as under-used.
    idle_ratio_min: float = 0.5
    idle_ratio_critical: float = 0.8  # project-chosen: the GPU waits 4/5 of the time
    # project-chosen: the mechanism explains the majority of the idle time
    wait_share_min: float = 0.5
    sync_gap_share_min: float = 0.5
    # A gap "follows a sync" when a synchronizing call was in progress when the GPU went idle
    # (it returns as the GPU drains); tolerance for host/GPU clock skew = HTA's kernel-wait cutoff.
    sync_tolerance_s: float = 30e-6
    # nsys analyze cuda_memcpy_sync: host->device synchronous copies of 64 KB or less are ignored.
    memcpy_sync_min_bytes: int = 64 * 1024
    min_ops: int = 10  # project-chosen: fewer GPU ops on a device cannot support a verdict
    # project-chosen: one lone cudaMalloc after warm-up can be a lazy init; two or more are churn.
    alloc_min_calls: int = 2
    alloc_time_share_warn: float = 0.01  # project-chosen: 1 % of the steady window in malloc/free
    exclude_last_step: bool = True  # as HTA: the last ProfilerStep is often cut short by the stop


def _q(values_ns: np.ndarray, qs=(50, 90, 99), zeros: int = 0) -> dict | None:
    """Quantiles in seconds of ``zeros`` zeros followed by ``values_ns`` (all > 0 when ``zeros``), with
    np.percentile's arithmetic (its default linear interpolation, operation for operation: the same
    floats). Sorts ``values_ns`` in place: callers pass scratch arrays.

    Why not np.percentile: sorting and then indexing is faster than its copy and partition (15 ms vs 28 ms
    on 2 M values), its partition of already sorted data still costs 2-4 ms a call, and its first call
    imports numpy.ma (about 15 ms of the CLI's start). ``zeros`` lets callers sort only the positive gaps
    (most gaps between overlapping ops are 0)."""
    n = zeros + values_ns.size
    if n == 0:
        return None
    values_ns.sort()
    # numpy.lib._function_base_impl._quantile, method "linear" (alpha = beta = 1)
    virtual = (n - 1) * np.true_divide(list(qs), 100)
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = -1
    nxt[above] = -1
    prev_i, next_i = prev.astype(np.intp), nxt.astype(np.intp)
    gamma = np.asarray(virtual - prev_i, dtype=virtual.dtype)

    def at(i: np.ndarray) -> np.ndarray:  # values of the whole sorted sample (zeros first) at indices i
        i = np.where(i < 0, i + n, i)
        if values_ns.size == 0:
            return np.zeros(i.size, dtype=np.int64)
        return np.where(i < zeros, 0, values_ns[np.maximum(i - zeros, 0)])

    a, b = at(prev_i), at(next_i)
    diff_b_a = b - a
    vals = np.add(a, diff_b_a * gamma)
    np.subtract(b, diff_b_a * (1 - gamma), out=vals, where=gamma >= 0.5, casting="unsafe", dtype=np.float64)
    return {f"p{q}": float(v) / 1e9 for q, v in zip(qs, vals)}


def _sec(ns) -> float:
    return float(ns) / 1e9


def analyse(tl: Timeline, cfg: Config = Config()) -> dict:
    """Timeline metrics (JSON-ready dict; contract in docs/trace.md). Pure.

    Vectorised over ops and calls (no Python loop over rows). Each device's columns are taken in start
    order (no copy when the ops already are), and each stream's are gathered from them when its turn
    comes. Full-length temporaries are few and short-lived: on a fresh process every new megabyte is
    page faults, which cost more than the arithmetic (bench/bench_trace.py)."""
    notes: list[str] = []
    n_total = tl.n_ops
    sel: np.ndarray | None = None  # None: every op is analysed
    rule = "all GPU ops"
    start, end = tl.op_start, tl.op_end
    launch = tl.op_launch
    linked = launch >= 0
    all_linked = bool(linked.all())
    c_start, c_end, c_kind = tl.call_start, tl.call_end, tl.call_kind
    if cfg.exclude_last_step and len(tl.steps) >= 2:
        cutoff = max(s for s, _ in tl.steps)
        ls = np.where(linked, tl.call_start[np.maximum(launch, 0)] if c_start.size else 0, 0)
        cand = linked & (ls < cutoff)
        if cand.any():
            sel = cand
            rule = ("GPU ops launched before the last ProfilerStep (HTA's rule: the last step is often cut "
                    "short when the profiler stops)")
        else:
            notes.append("no GPU op was launched before the last ProfilerStep: analysed all ops")
    n_sel = n_total if sel is None else int(sel.sum())

    # Each device's ops in start order, and what needs only their times and streams (the device's merged
    # intervals, the grouping by stream): on a large device a worker thread starts on it now, while this
    # thread computes the per-op launch columns below.
    dev_all = tl.op_device if sel is None else tl.op_device[sel]
    dmin, dmax = (int(dev_all.min()), int(dev_all.max())) if dev_all.size else (0, -1)
    dev_ids = [dmin] if dmin == dmax else np.unique(dev_all).tolist()
    idx_sel = None if sel is None else np.flatnonzero(sel)
    work: list[tuple[int, np.ndarray | None, _Device]] = []
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
        cols = [s] + [a if di is None else a[di] for a in (end, tl.op_kind, tl.op_comm, tl.op_pid, tl.op_stream)]
        work.append((d, di, _Device(d, *cols, c_kind=c_kind, cfg=cfg, threaded=s.size >= _THREAD_MIN_OPS)))

    try:
        # Per op: its launch call's start (lstart; int64 min when not linked), end, duration (-1) and kind (-1).
        if c_start.size and all_linked:
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
        if launch.size < 2 or bool((launch[1:] > launch[:-1]).all()):
            first_of_launch = is_lk  # every call launched one op at most (then so did the launch calls)
        else:
            first_of_launch = np.zeros(n_total, dtype=bool)
            lk = np.flatnonzero(is_lk)
            lc = launch[lk]
            if lc.size < 2 or bool((lc[1:] > lc[:-1]).all()):  # strictly increasing: one op per call
                multi = np.zeros(lk.size, dtype=bool)
            else:
                multi = np.bincount(lc, minlength=c_start.size)[lc] > 1
            if not multi.any():
                first_of_launch[lk] = True
            else:
                first_of_launch[lk[~multi]] = True
                lm = lk[multi]
                o = lm[np.lexsort((start[lm], launch[lm]))]
                firsts = np.ones(o.size, dtype=bool)
                firsts[1:] = launch[o][1:] != launch[o][:-1]
                first_of_launch[o[firsts]] = True
            del lk, lc, multi
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
        del lend

        # Synchronizing host calls: sync APIs, synchronous copies/sets (H2D <= 64 KB ignored, as nsys),
        # and async copies from/to pageable memory (they silently become synchronous).
        small_h2d = np.zeros(c_start.size, dtype=bool)
        pageable_async = np.zeros(c_start.size, dtype=bool)
        # Only copies can be small host-to-device or pageable (kernels carry COPY_UNKNOWN, -1 bytes, not pageable).
        copies = bool(c_start.size) and bool((tl.op_kind != KERNEL).any())
        if copies:
            call_op = np.full(c_start.size, -1, dtype=np.int64)
            if all_linked:
                call_op[launch] = np.arange(n_total)
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
        sync_starts = c_start[s_idx]
        sync_cmend = np.maximum.accumulate(c_end[s_idx]) if s_idx.size else s_idx

        w0 = int(start.min() if sel is None else start[sel].min())
        w1 = int(end.max() if sel is None else end[sel].max())
        # host window start: the first launch call of an analysed op (lstart of linked analysed ops)
        if sel is None:
            first_call = int(lstart.min()) if all_linked and lstart.size else \
                (int(lstart[linked].min()) if linked.any() else None)
        else:
            lsel = sel & linked
            first_call = int(lstart[lsel].min()) if lsel.any() else None

        def host_job() -> dict:
            return _host_fields(tl, cfg, w0, w1, first_call, syncing, small_h2d, pageable_async, sel)

        host = None
        devices = []
        sync = (s_idx.size, sync_starts, sync_cmend)
        for d, di, dw in work:
            def take(a: np.ndarray) -> np.ndarray:
                return a if di is None else a[di]  # noqa: B023 -- used within this iteration

            fd, dd, sk, ss = take(first_of_launch), take(delay), take(short_ok), take(is_short)
            last = d == dev_ids[-1]
            dw.set_launch(take(lstart), fd, dd, sk, ss, sync, extra=host_job if last else None)
            devices.append(dw.result())
            if last:
                host = dw.extra_result
            del fd, dd, sk, ss
    except BaseException:
        for _, _, dw in work:
            dw.abort()  # no worker thread is left waiting for launch columns
        raise

    if host is None:
        host = host_job()
    epoch = tl.epoch_offset_ns
    return {
        "source": tl.source,
        "format": tl.format,
        **{k: tl.meta[k] for k in ("schema_version", "product_version", "reader") if tl.meta.get(k) is not None},
        "window": {"start": (w0 + epoch) / 1e9 if epoch is not None else None,
                   "end": (w1 + epoch) / 1e9 if epoch is not None else None,
                   "span_seconds": _sec(w1 - w0)},
        "selection": {"ops_total": int(n_total), "ops_analysed": int(n_sel), "rule": rule,
                      "profiler_steps": len(tl.steps)},
        "devices": devices,
        "host": host,
        "notes": notes,
    }


_THREAD_MIN_OPS = 200_000  # below this a second thread costs more than it saves


class _Device:
    """One device's figures, its own and per stream, from its ops' columns in start order.

    The device's merged intervals and the grouping by (process, stream) need only the ops' times and
    streams; the rest waits for the per-op launch columns (``set_launch``). With ``threaded`` a worker
    thread starts on the former at once; then the worker and the thread calling ``result()`` share the
    remaining tasks, largest first: the device's launch figures, each stream's figures, and an optional
    ``extra`` task (the host figures). Streams come back in grouping order, their idle breakdowns summed
    in that order: the same floats as one thread."""

    def __init__(self, d: int, s, e, kd, comm, pid, sid, c_kind, cfg: Config, threaded: bool) -> None:
        self.d, self.s, self.e, self.kd, self.comm, self.pid, self.sid = d, s, e, kd, comm, pid, sid
        self.c_kind, self.cfg = c_kind, cfg
        self.launch: tuple = ()
        self.sync: tuple = ()
        self.extra = None
        self.launch_set = threading.Event()
        self.grouped = threading.Event()
        self.lock = threading.Lock()
        self.tasks: list | None = None
        self.next = 0
        self.order: np.ndarray | None = None
        self.bounds: list[int] = [0]
        self.m: dict = {}
        self.comp_busy = 0
        self.fields: dict = {}
        self.dev_launch: dict = {}
        self.extra_result = None
        self.out: dict[int, tuple[dict, np.ndarray]] = {}
        self.errors: list[BaseException] = []
        self.thread = None
        if threaded:
            self.thread = threading.Thread(target=self._worker, daemon=True)
            self.thread.start()

    def set_launch(self, ls, fd, dd, sk, ss, sync: tuple, extra=None) -> None:
        """The per-op launch columns (this device's, in its order), the synchronizing calls, and an
        optional extra task to run among the device's."""
        self.launch, self.sync, self.extra = (ls, fd, dd, sk, ss), sync, extra
        self.launch_set.set()

    def abort(self) -> None:
        """The caller failed: let the worker stop (it would otherwise wait for set_launch)."""
        self.errors.append(RuntimeError("analysis aborted"))
        self.launch_set.set()

    def _worker(self) -> None:
        try:
            self._group()
            self._merged()
            self.launch_set.wait()
            if self.errors:
                return
            self._fields()
            self._take()
        except BaseException as e:  # noqa: BLE001 -- re-raised by result()
            self.errors.append(e)
            self.grouped.set()

    def _group(self) -> None:
        pmin, pmax = (int(self.pid.min()), int(self.pid.max())) if self.pid.size else (0, 0)
        key = self.sid if pmin == pmax else self.sid + (self.pid << 40)  # one process (or none known): by stream
        self.order, self.bounds = _group(key)
        self.grouped.set()

    def _merged(self) -> None:
        s, e, kd, comm, ck = self.s, self.e, self.kd, self.comm, self.c_kind
        # the gaps' start times are needed only to match them with synchronizing calls
        maybe_sync = bool(((ck == SYNC) | (ck == MEMCPY_SYNC) | (ck == MEMCPY_ASYNC)).any())
        self.m = m = _merged(s, e, gap_starts=maybe_sync)
        if not comm.any() and bool((kd == KERNEL).all()):
            self.comp_busy = m["busy_ns"]  # the same intervals
        else:
            compm = (kd == KERNEL) & ~comm
            self.comp_busy = _merged(s[compm], e[compm])["busy_ns"] if compm.any() else 0

    def _fields(self) -> None:
        """The device's own figures but its launch and wait ones (after set_launch)."""
        m, cfg = self.m, self.cfg
        n_sync, sync_starts, sync_cmend = self.sync
        # Which gaps follow a synchronizing call? (before _interval_fields sorts the gap lengths)
        sync_gap = 0
        if n_sync and m["gap_starts"].size:
            j = np.searchsorted(sync_starts, m["gap_starts"], side="right") - 1
            ok = j >= 0
            cov = np.zeros(j.size, dtype=bool)
            cov[ok] = sync_cmend[j[ok]] + cfg.sync_tolerance_s * 1e9 >= m["gap_starts"][ok]
            sync_gap = int(m["gap_lengths"][cov].sum())
        m.pop("gap_starts", None)
        f = {"ops": _op_counts(self.kd)}
        f.update(_interval_fields(m, cfg))
        f["compute_seconds"] = _sec(self.comp_busy)
        f["non_compute_seconds"] = _sec(m["span_ns"] - self.comp_busy - m["idle_ns"])
        f["sync_gap_ratio"] = (sync_gap / m["idle_ns"]) if m["idle_ns"] > 0 else None
        self.fields, self.m = f, {}

    def _take(self) -> None:
        """Run tasks until none is left: the device's launch figures (a sort of all its launch delays),
        the streams, largest first, then the extra task."""
        with self.lock:
            if self.tasks is None:
                sizes = np.diff(self.bounds)
                self.tasks = [-1] + np.argsort(-sizes, kind="stable").tolist() + ([-2] if self.extra else [])
        while not self.errors:
            with self.lock:
                i, self.next = self.next, self.next + 1
            if i >= len(self.tasks):
                return
            k = self.tasks[i]
            if k == -1:
                self.dev_launch = _launch_fields(*self.launch[1:], self.cfg)
            elif k == -2:
                self.extra_result = self.extra()
            else:
                self.out[k] = self._stream(k)

    def _stream(self, k: int) -> tuple[dict, np.ndarray]:
        s, e, kd, pid, sid, cfg = self.s, self.e, self.kd, self.pid, self.sid, self.cfg
        ls, fd, dd, sk, ss = self.launch
        a, b = self.bounds[k], self.bounds[k + 1]
        ix = slice(a, b) if self.order is None else self.order[a:b]
        s_, e_ = s[ix], e[ix]
        sm = _merged(s_, e_)
        w = _idle_breakdown(s_, e_, ls[ix], cfg.kernel_wait_cutoff_s * 1e9)
        del s_, e_
        a0 = a if self.order is None else int(self.order[a])
        st = {"stream": int(sid[a0]), "ops": _op_counts(kd[ix])}
        if pid[a0] >= 0:
            st["pid"] = int(pid[a0])
        st.update(_interval_fields(sm, cfg))
        st.update(_wait_fields(w))
        st.update(_launch_fields(fd[ix], dd[ix], sk[ix], ss[ix], cfg))
        return st, w

    def result(self) -> dict:
        """The device's dict (after set_launch); the extra task's result is in ``extra_result``."""
        if self.thread is None:
            self._group()
            self._merged()
            self._fields()
            self._take()
        else:
            self.grouped.wait()
            try:
                self._take()
            except BaseException as e:  # noqa: BLE001 -- re-raised below, after the worker stopped
                self.errors.append(e)
            self.thread.join()
        if self.errors:
            raise self.errors[0]
        streams, waits = [], np.zeros(3, dtype=np.float64)
        for k in range(len(self.bounds) - 1):
            st, w = self.out[k]
            waits += w
            streams.append(st)
        dev = {"device": int(self.d), **self.fields}
        dev.update(_wait_fields(waits))
        dev.update(self.dev_launch)
        streams.sort(key=lambda x: -x["busy_seconds"])
        dev["streams"] = streams
        return dev


def _group(key: np.ndarray) -> tuple[np.ndarray | None, list[int]]:
    """Stable grouping by key, groups in ascending key order: (order or None for identity, bounds)."""
    if key.size == 0:
        return None, [0]
    kmin, kmax = int(key.min()), int(key.max())
    if kmin == kmax:
        return None, [0, int(key.size)]
    if kmax - kmin < 1 << 16:  # stream ids are small: a radix sort on 16-bit codes
        codes = np.subtract(key, kmin, out=np.empty(key.size, dtype=np.uint16), casting="unsafe")
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        cuts = np.flatnonzero(sc[1:] != sc[:-1]) + 1
        counts = np.diff(np.concatenate(([0], cuts, [key.size])))
    else:
        order = np.argsort(key, kind="stable")
        sk = key[order]
        cuts = np.flatnonzero(sk[1:] != sk[:-1]) + 1
        counts = np.diff(np.concatenate(([0], cuts, [key.size])))
    return order, [0] + np.cumsum(counts).tolist()


def _merged(s: np.ndarray, e: np.ndarray, gap_starts: bool = False) -> dict:
    """Union of intervals sorted by start: busy time and the gaps between merged runs (nsys pairing:
    a gap exists where the next start is after the running maximum end).

    ``gap_lengths``: the positive gaps in time order (``gap_starts``, when asked, where each begins);
    the other ``n_gaps - gap_lengths.size`` gaps are 0."""
    if s.size == 0:
        return {"span_ns": 0, "busy_ns": 0, "idle_ns": 0, "gap_lengths": s, "gap_starts": s, "n_gaps": 0, "n": 0}
    cm = np.maximum.accumulate(e)
    span = int(cm[-1] - s[0])
    # the gaps, over the running maximum's buffer unless their start times are wanted
    d = s[1:] - cm[:-1] if gap_starts else np.subtract(s[1:], cm[:-1], out=cm[:-1])
    pos = d > 0
    lengths = d[pos]
    idle = int(lengths.sum())
    out = {"span_ns": span, "busy_ns": span - idle, "idle_ns": idle, "gap_lengths": lengths,
           "n_gaps": int(s.size) - 1, "n": int(s.size)}
    if gap_starts:
        out["gap_starts"] = cm[:-1][pos]
    return out


def _interval_fields(m: dict, cfg: Config) -> dict:
    """Busy/idle figures and the gap distribution of a :func:`_merged` result (sorts its ``gap_lengths``
    in place: use ``gap_starts`` before)."""
    span = m["span_ns"]
    out = {
        "span_seconds": _sec(span),
        "busy_seconds": _sec(m["busy_ns"]),
        "idle_seconds": _sec(m["idle_ns"]),
        "busy_ratio": (m["busy_ns"] / span) if span > 0 else None,
        "idle_ratio": (m["idle_ns"] / span) if span > 0 else None,
    }
    lengths = m["gap_lengths"]
    long_gaps = int(np.count_nonzero(lengths >= cfg.long_gap_s * 1e9))
    gq = _q(lengths, zeros=m["n_gaps"] - lengths.size)  # sorts the positive gaps in place
    if gq is not None:
        gq["max"] = _sec(lengths[-1] if lengths.size else 0)
    out["gap_seconds"] = gq
    out["long_gaps"] = long_gaps
    return out


def _idle_breakdown(s: np.ndarray, e: np.ndarray, ls: np.ndarray, kw_ns: float) -> np.ndarray:
    """HTA's idle-time categories on one stream (ops sorted by start): [host, kernel, other] ns.

    gap = start - previous op's end; host wait if this op's launch call started after the previous op
    ended (the CPU was late); else kernel wait if gap < cutoff; else other. Sums of integer ns, exact
    (the float sums they replace were exact too below 2**53 ns, 104 days)."""
    if s.size < 2:
        return np.zeros(3)
    prev_end = e[:-1]
    gap = s[1:] - prev_end
    host = ls[1:] > prev_end
    kern = gap < kw_ns
    kern &= ~host
    h, k = int(gap[host].sum()), int(gap[kern].sum())
    return np.array([h, k, int(gap.sum()) - h - k], dtype=np.float64)


def _wait_fields(w: np.ndarray) -> dict:
    tot = float(w.sum())
    return {
        "idle_breakdown_seconds": {"host_wait": float(w[0]) / 1e9, "kernel_wait": float(w[1]) / 1e9,
                                   "other": float(w[2]) / 1e9},
        "host_wait_ratio": float(w[0] / tot) if tot > 0 else None,
        "kernel_wait_ratio": float(w[1] / tot) if tot > 0 else None,
        "other_wait_ratio": float(w[2] / tot) if tot > 0 else None,
    }


def _launch_fields(first: np.ndarray, delay: np.ndarray, short_ok: np.ndarray, is_short: np.ndarray,
                   cfg: Config) -> dict:
    """Launch figures over one group of ops (arrays aligned with each other; ``is_short`` implies
    ``short_ok``)."""
    d = delay[first]
    n_out = int(np.count_nonzero(d > cfg.launch_delay_cutoff_s * 1e9))
    lq = _q(d, (50, 99))
    n_ok = int(np.count_nonzero(short_ok))
    return {
        "launches_linked": int(d.size),
        "launch_delay_seconds": lq,
        "launch_delay_outlier_ratio": n_out / d.size if d.size else None,
        "short_kernel_ratio": int(np.count_nonzero(is_short)) / n_ok if n_ok else None,
    }


def _op_counts(kinds: np.ndarray) -> dict:
    return {"kernel": int(np.count_nonzero(kinds == KERNEL)), "memcpy": int(np.count_nonzero(kinds == MEMCPY)),
            "memset": int(np.count_nonzero(kinds == MEMSET))}


def _host_fields(tl: Timeline, cfg: Config, w0: int, w1: int, first_call: int | None, syncing: np.ndarray,
                 small_h2d: np.ndarray, pageable_async: np.ndarray, sel: np.ndarray | None) -> dict:
    cs, ce, ck = tl.call_start, tl.call_end, tl.call_kind
    # host window: from the first launch of an analysed op (launches precede their ops) to the last op end
    h0 = min(w0, first_call) if first_call is not None else w0
    inwin = cs >= h0
    inwin &= cs <= w1
    span = max(w1 - w0, 1)
    sy = syncing & inwin
    # steady state: after the first ProfilerStep when there are two or more, else the second half
    # of the window (project-chosen: warm-up allocations happen early).
    steps_used = [st for st in tl.steps if st[0] < w1]
    if len(steps_used) >= 2:
        steady0, steady_rule = steps_used[0][1], "after the first ProfilerStep"
    else:
        steady0, steady_rule = w0 + (w1 - w0) // 2, "second half of the window"
    steady = (cs >= steady0) & (cs <= w1)
    mal = steady & (ck == MALLOC)
    fre = steady & (ck == FREE)
    mf = mal | fre
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
        is_drv = np.array([n.startswith("cu") and not n.startswith("cuda") for n in names], dtype=bool)
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
        "steady_malloc_free_seconds": mf_sec / 1e9,
        "steady_malloc_free_ratio": mf_sec / steady_span,
        "api": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["seconds"])),
    }


# ---------------------------------------------------------------------------------------------
# Verdicts
def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def _us(x: float | None) -> str:
    return "n/a" if x is None else (f"{x * 1e6:.0f} µs" if x < 1e-3 else f"{x * 1e3:.1f} ms")


def judge(a: dict, cfg: Config = Config()) -> tuple[list[Finding], list[Inconclusive]]:
    """Verdicts over an :func:`analyse` result. Pure."""
    findings: list[Finding] = []
    inconclusive: list[Inconclusive] = []
    win = (a["window"]["start"], a["window"]["end"]) if a["window"]["start"] is not None else None
    onset = a["window"]["start"]
    host = a["host"]
    for d in a["devices"]:
        subject = {"gpu": str(d["device"])}
        n_ops = sum(d["ops"].values())
        idle = d["idle_ratio"]
        if n_ops < cfg.min_ops or idle is None:
            for i in (LAUNCH_BOUND, SYNC_BOUND):
                inconclusive.append(Inconclusive(i, ["kernel timeline"], f"GPU {d['device']}: only {n_ops} GPU "
                                                 f"op(s) in the trace (need {cfg.min_ops})", subject))
            continue
        if idle < cfg.idle_ratio_min:
            continue  # GPU busy most of the window: neither launch- nor sync-bound
        sev = Severity.CRITICAL if idle >= cfg.idle_ratio_critical else Severity.WARNING
        span = d["span_seconds"]
        ev_idle = Evidence("gpu_idle_ratio", idle, threshold=cfg.idle_ratio_min, unit="ratio", window=win,
                           note=f"{d['idle_seconds']:.3g} s idle of {span:.3g} s (first op -> last op)")
        sgr = d.get("sync_gap_ratio") or 0.0
        hw = d.get("host_wait_ratio")
        kw = d.get("kernel_wait_ratio")
        starved = (hw or 0.0) + (kw or 0.0)
        ld = d.get("launch_delay_seconds")
        if sgr >= cfg.sync_gap_share_min:
            conf = 0.6
            ev = [ev_idle, Evidence("sync_gap_ratio", sgr, threshold=cfg.sync_gap_share_min, unit="ratio",
                                    window=win, note="share of idle time in gaps that begin while the host "
                                    "is blocked in a synchronizing call")]
            if host["sync_api_ratio"] >= 0.1:
                conf += 0.15
            ev.append(Evidence("sync_api_ratio", host["sync_api_ratio"], unit="ratio", window=win,
                               note=f"{host['sync_api_calls']} synchronizing calls, {host['sync_api_seconds']:.3g} s",
                               agrees=host["sync_api_ratio"] >= 0.1))
            if host["pageable_async_copy_calls"]:
                conf += 0.1
                ev.append(Evidence("pageable_async_copy_calls", host["pageable_async_copy_calls"], unit="calls",
                                   note="cudaMemcpyAsync on pageable memory runs synchronously"))
            top = ", ".join(k for k in list(host["api"])[:3])
            findings.append(Finding(
                SYNC_BOUND, sev, min(conf, 0.95),
                f"GPU {d['device']}: idle {_pct(idle)} of {span:.3g} s; {_pct(sgr)} of the idle time follows "
                f"synchronizing calls ({host['sync_api_calls']} calls, {host['sync_api_seconds']:.3g} s"
                f"{'; ' + top if top else ''}).",
                onset=onset, evidence=ev, subject=subject))
        elif starved >= cfg.wait_share_min:
            conf = 0.55
            ev = [ev_idle, Evidence("host_wait_ratio", hw, threshold=cfg.wait_share_min, unit="ratio", window=win,
                                    note="HTA: idle time where the next op's launch started after the previous "
                                    "op ended"),
                  Evidence("kernel_wait_ratio", kw, unit="ratio", window=win,
                           note=f"HTA: gaps under {cfg.kernel_wait_cutoff_s * 1e6:.0f} µs between launched ops")]
            missing = []
            if ld is not None:
                ok = ld["p50"] <= cfg.launch_delay_cutoff_s
                conf += 0.15 if ok else -0.2
                ev.append(Evidence("launch_delay_seconds", ld["p50"], threshold=cfg.launch_delay_cutoff_s,
                                   unit="seconds", note="median launch->start delay; near zero = nothing queued",
                                   agrees=ok))
            else:
                missing.append("launch correlation (runtime/driver API rows)")
            if d.get("short_kernel_ratio") is not None:
                ok = d["short_kernel_ratio"] >= 0.5
                conf += 0.1 if ok else 0.0
                ev.append(Evidence("short_kernel_ratio", d["short_kernel_ratio"], threshold=0.5, unit="ratio",
                                   note="kernels shorter than their launch call (HTA)", agrees=ok))
            if (hw or 0) >= 0.8:
                conf += 0.1
            if conf < 0.5:
                continue
            findings.append(Finding(
                LAUNCH_BOUND, sev, min(conf, 0.95),
                f"GPU {d['device']}: idle {_pct(idle)} of {span:.3g} s between ops; {_pct(hw)} of the idle time is "
                f"the host launching late and {_pct(kw)} launch overhead between back-to-back ops; median launch "
                f"delay {_us(ld['p50'] if ld else None)}, {_pct(d.get('short_kernel_ratio'))} of kernels shorter "
                f"than their launch call.",
                onset=onset, evidence=ev, missing=missing, subject=subject))

    nm, nf = host["steady_malloc_calls"], host["steady_free_calls"]
    if nm + nf >= cfg.alloc_min_calls:
        share = host["steady_malloc_free_ratio"]
        sev = Severity.WARNING if (share >= cfg.alloc_time_share_warn or nf > 0) else Severity.INFO
        conf = 0.5 + (0.2 if nf > 0 and nm > 0 else 0.0) + (0.2 if share >= cfg.alloc_time_share_warn else 0.0)
        ev = [Evidence("steady_malloc_calls", nm, unit="calls", note=host["steady_state"]["rule"]),
              Evidence("steady_free_calls", nf, unit="calls", note="cudaFree synchronizes the device"),
              Evidence("steady_malloc_free_ratio", share, threshold=cfg.alloc_time_share_warn, unit="ratio",
                       note=f"{host['steady_malloc_free_seconds']:.3g} s in malloc/free")]
        findings.append(Finding(
            ALLOCATOR_STALLS, sev, min(conf, 0.95),
            f"{nm} cudaMalloc and {nf} cudaFree calls after warm-up ({host['steady_state']['rule']}) took "
            f"{host['steady_malloc_free_seconds']:.3g} s ({_pct(share)} of the steady window): the caching "
            f"allocator is flushing and re-allocating segments (allocation retries).",
            onset=host["steady_state"]["start"], evidence=ev,
            missing=["torch_alloc_retries_total (probe)"], subject={"source": "trace"}))
    return findings, inconclusive


# ---------------------------------------------------------------------------------------------
def trace_samples(a: dict, ts: float) -> list[Sample]:
    """Samples the agent records from a capture: ``fragscope_kernel_gap_seconds{gpu,quantile}`` and
    ``fragscope_gpu_idle_ratio{gpu}`` (absent values are left out, never written as 0)."""
    out: list[Sample] = []
    for d in a["devices"]:
        gpu = str(d["device"])
        g = d.get("gap_seconds")
        if g:
            for q, k in (("0.5", "p50"), ("0.99", "p99")):
                out.append(Sample("fragscope_kernel_gap_seconds", make_labels({"gpu": gpu, "quantile": q}), ts,
                                  float(g[k])))
        if d.get("idle_ratio") is not None:
            out.append(Sample("fragscope_gpu_idle_ratio", make_labels({"gpu": gpu}), ts, float(d["idle_ratio"])))
    return out


def analyse_trace_file(path: str, cfg: Config = Config()) -> tuple[dict, list[Finding]]:
    """Read a trace (nsys SQLite or Kineto JSON, by content), analyse it and judge it.

    Returns the analysis dict (``inconclusive`` included) and the findings. Raises
    :class:`~fragscope.collectors.kineto.TraceError` (one line) on bad input."""
    tl = read_trace(path)
    a = analyse(tl, cfg)
    findings, inconclusive = judge(a, cfg)
    a["inconclusive"] = [i.to_dict() for i in inconclusive]
    return a, findings
