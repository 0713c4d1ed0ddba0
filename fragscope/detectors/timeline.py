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


def _q(values_ns: np.ndarray, qs=(50, 90, 99)) -> dict | None:
    if values_ns.size == 0:
        return None
    vals = np.percentile(values_ns, list(qs))  # one partition pass for all quantiles
    return {f"p{q}": float(v) / 1e9 for q, v in zip(qs, vals)}


def _sec(ns) -> float:
    return float(ns) / 1e9


def analyse(tl: Timeline, cfg: Config = Config()) -> dict:
    """Timeline metrics (JSON-ready dict; contract in docs/trace.md). Pure."""
    notes: list[str] = []
    n_total = tl.n_ops
    sel = np.ones(n_total, dtype=bool)
    rule = "all GPU ops"
    if cfg.exclude_last_step and len(tl.steps) >= 2:
        cutoff = max(s for s, _ in tl.steps)
        linked = tl.op_launch >= 0
        ls = np.where(linked, tl.call_start[np.maximum(tl.op_launch, 0)] if tl.call_start.size else 0, 0)
        cand = linked & (ls < cutoff)
        if cand.any():
            sel = cand
            rule = ("GPU ops launched before the last ProfilerStep (HTA's rule: the last step is often cut "
                    "short when the profiler stops)")
        else:
            notes.append("no GPU op was launched before the last ProfilerStep: analysed all ops")
    idx_sel = np.flatnonzero(sel)

    start, end = tl.op_start, tl.op_end
    launch = tl.op_launch
    linked = launch >= 0
    c_start, c_end, c_kind = tl.call_start, tl.call_end, tl.call_kind
    li = np.maximum(launch, 0)
    if c_start.size:
        lstart = np.where(linked, c_start[li], np.iinfo(np.int64).min)
        lend = np.where(linked, c_end[li], 0)
        ldur = np.where(linked, lend - lstart, -1)
        lkind = np.where(linked, c_kind[li], -1)
    else:
        lstart = np.full(n_total, np.iinfo(np.int64).min, dtype=np.int64)
        lend = np.zeros(n_total, dtype=np.int64)
        ldur = np.full(n_total, -1, dtype=np.int64)
        lkind = np.full(n_total, -1, dtype=np.int64)

    # Launch delay (HTA) = queue time (nsys): first op start - launch call end, clipped at 0. For a
    # CUDA-graph launch only its first op counts (the others queue behind it by construction).
    first_of_launch = np.zeros(n_total, dtype=bool)
    lk = idx_sel[linked[idx_sel] & np.isin(lkind[idx_sel], (LAUNCH, GRAPH_LAUNCH, MEMCPY_ASYNC))]
    if lk.size:
        per_call = np.bincount(launch[lk], minlength=c_start.size)
        multi = per_call[launch[lk]] > 1
        first_of_launch[lk[~multi]] = True
        lm = lk[multi]
        if lm.size:
            o = lm[np.lexsort((start[lm], launch[lm]))]
            firsts = np.ones(o.size, dtype=bool)
            firsts[1:] = launch[o][1:] != launch[o][:-1]
            first_of_launch[o[firsts]] = True
    delay = np.maximum(start - lend, 0)
    # HTA short kernels: launch call <= runtime cutoff and GPU time < launch time (plain launches)
    short_ok = (tl.op_kind == KERNEL) & (lkind == LAUNCH)
    is_short = short_ok & (ldur <= cfg.runtime_cutoff_s * 1e9) & ((end - start) < ldur)

    # Synchronizing host calls: sync APIs, synchronous copies/sets (H2D <= 64 KB ignored, as nsys),
    # and async copies from/to pageable memory (they silently become synchronous).
    call_op = np.full(c_start.size, -1, dtype=np.int64)
    linked_ops = np.flatnonzero(launch >= 0)
    call_op[launch[linked_ops]] = linked_ops
    small_h2d = np.zeros(c_start.size, dtype=bool)
    pageable_async = np.zeros(c_start.size, dtype=bool)
    has_op = call_op >= 0
    if has_op.any():
        op_of = call_op[has_op]
        small_h2d[has_op] = (tl.op_copy_kind[op_of] == COPY_HTOD) & (tl.op_bytes[op_of] >= 0) & \
            (tl.op_bytes[op_of] <= cfg.memcpy_sync_min_bytes)
        pageable_async[has_op] = tl.op_pageable[op_of]
    syncing = (c_kind == SYNC) | ((c_kind == MEMCPY_SYNC) & ~small_h2d) | ((c_kind == MEMCPY_ASYNC) & pageable_async)
    s_idx = np.flatnonzero(syncing)
    s_idx = s_idx[np.argsort(c_start[s_idx], kind="stable")]
    sync_starts = c_start[s_idx]
    sync_cmend = np.maximum.accumulate(c_end[s_idx]) if s_idx.size else s_idx

    devices = []
    kw_ns = cfg.kernel_wait_cutoff_s * 1e9
    dev_sel = tl.op_device[idx_sel]
    for d in np.unique(dev_sel).tolist():
        di = idx_sel[dev_sel == d]
        sd = start[di]
        if sd.size > 1 and not (sd[1:] >= sd[:-1]).all():
            di = di[np.argsort(sd, kind="stable")]
        m = _merged(start[di], end[di])
        comp = di[(tl.op_kind[di] == KERNEL) & ~tl.op_comm[di]]
        comp_busy = _merged(start[comp], end[comp])["busy_ns"] if comp.size else 0
        dev = {"device": int(d), "ops": _op_counts(tl.op_kind[di])}
        dev.update(_interval_fields(m, cfg))
        dev["compute_seconds"] = _sec(comp_busy)
        dev["non_compute_seconds"] = _sec(m["span_ns"] - comp_busy - m["idle_ns"])
        # Which gaps follow a synchronizing call?
        sync_gap = 0
        if s_idx.size and m["gap_starts"].size:
            j = np.searchsorted(sync_starts, m["gap_starts"], side="right") - 1
            ok = j >= 0
            cov = np.zeros(j.size, dtype=bool)
            cov[ok] = sync_cmend[j[ok]] + cfg.sync_tolerance_s * 1e9 >= m["gap_starts"][ok]
            sync_gap = int(m["gap_lengths"][cov].sum())
        dev["sync_gap_ratio"] = (sync_gap / m["idle_ns"]) if m["idle_ns"] > 0 else None
        streams = []
        waits = np.zeros(3, dtype=np.float64)
        key = tl.op_stream[di] if (tl.op_pid[di] < 0).all() else tl.op_stream[di] + (tl.op_pid[di] << 40)
        by_stream = di[np.argsort(key, kind="stable")]  # stable: still sorted by start within a stream
        skeys = key[np.argsort(key, kind="stable")]
        cuts = np.flatnonzero(skeys[1:] != skeys[:-1]) + 1
        for si in np.split(by_stream, cuts):
            sm = _merged(start[si], end[si])
            w = _idle_breakdown(start[si], end[si], lstart[si], kw_ns)
            waits += w
            st = {"stream": int(tl.op_stream[si[0]]), "ops": _op_counts(tl.op_kind[si])}
            if tl.op_pid[si[0]] >= 0:
                st["pid"] = int(tl.op_pid[si[0]])
            st.update(_interval_fields(sm, cfg))
            st.update(_wait_fields(w))
            st.update(_launch_fields(si, first_of_launch, delay, short_ok, is_short, cfg))
            streams.append(st)
        dev.update(_wait_fields(waits))
        dev.update(_launch_fields(di, first_of_launch, delay, short_ok, is_short, cfg))
        streams.sort(key=lambda s: -s["busy_seconds"])
        dev["streams"] = streams
        devices.append(dev)

    w0 = int(start[idx_sel].min())
    w1 = int(end[idx_sel].max())
    host = _host_fields(tl, cfg, w0, w1, syncing, small_h2d, pageable_async, sel)
    epoch = tl.epoch_offset_ns
    return {
        "source": tl.source,
        "format": tl.format,
        **{k: tl.meta[k] for k in ("schema_version", "product_version", "reader") if tl.meta.get(k) is not None},
        "window": {"start": (w0 + epoch) / 1e9 if epoch is not None else None,
                   "end": (w1 + epoch) / 1e9 if epoch is not None else None,
                   "span_seconds": _sec(w1 - w0)},
        "selection": {"ops_total": int(n_total), "ops_analysed": int(idx_sel.size), "rule": rule,
                      "profiler_steps": len(tl.steps)},
        "devices": devices,
        "host": host,
        "notes": notes,
    }


def _merged(s: np.ndarray, e: np.ndarray) -> dict:
    """Union of intervals sorted by start: busy time and the gaps between merged runs (nsys pairing:
    a gap exists where the next start is after the running maximum end)."""
    if s.size == 0:
        return {"span_ns": 0, "busy_ns": 0, "idle_ns": 0, "gaps": s, "gap_starts": s, "gap_lengths": s, "n": 0}
    cm = np.maximum.accumulate(e)
    gaps = np.maximum(s[1:] - cm[:-1], 0)
    pos = gaps > 0
    span = int(cm[-1] - s[0])
    idle = int(gaps.sum())
    return {"span_ns": span, "busy_ns": span - idle, "idle_ns": idle, "gaps": gaps,
            "gap_starts": cm[:-1][pos], "gap_lengths": gaps[pos], "n": int(s.size)}


def _interval_fields(m: dict, cfg: Config) -> dict:
    span = m["span_ns"]
    out = {
        "span_seconds": _sec(span),
        "busy_seconds": _sec(m["busy_ns"]),
        "idle_seconds": _sec(m["idle_ns"]),
        "busy_ratio": (m["busy_ns"] / span) if span > 0 else None,
        "idle_ratio": (m["idle_ns"] / span) if span > 0 else None,
    }
    gq = _q(m["gaps"])
    if gq is not None:
        gq["max"] = _sec(m["gaps"].max())
    out["gap_seconds"] = gq
    out["long_gaps"] = int((m["gap_lengths"] >= cfg.long_gap_s * 1e9).sum())
    return out


def _idle_breakdown(s: np.ndarray, e: np.ndarray, ls: np.ndarray, kw_ns: float) -> np.ndarray:
    """HTA's idle-time categories on one stream (ops sorted by start): [host, kernel, other] ns.

    gap = start - previous op's end; host wait if this op's launch call started after the previous op
    ended (the CPU was late); else kernel wait if gap < cutoff; else other."""
    if s.size < 2:
        return np.zeros(3)
    prev_end = e[:-1]
    gap = (s[1:] - prev_end).astype(np.float64)
    host = ls[1:] > prev_end
    kern = ~host & (gap < kw_ns)
    other = ~host & ~kern
    return np.array([gap[host].sum(), gap[kern].sum(), gap[other].sum()])


def _wait_fields(w: np.ndarray) -> dict:
    tot = float(w.sum())
    return {
        "idle_breakdown_seconds": {"host_wait": float(w[0]) / 1e9, "kernel_wait": float(w[1]) / 1e9,
                                   "other": float(w[2]) / 1e9},
        "host_wait_ratio": float(w[0] / tot) if tot > 0 else None,
        "kernel_wait_ratio": float(w[1] / tot) if tot > 0 else None,
        "other_wait_ratio": float(w[2] / tot) if tot > 0 else None,
    }


def _launch_fields(idx: np.ndarray, first: np.ndarray, delay: np.ndarray, short_ok: np.ndarray,
                   is_short: np.ndarray, cfg: Config) -> dict:
    f = idx[first[idx]]
    d = delay[f]
    lq = _q(d, (50, 99))
    so = idx[short_ok[idx]]
    return {
        "launches_linked": int(f.size),
        "launch_delay_seconds": lq,
        "launch_delay_outlier_ratio": float((d > cfg.launch_delay_cutoff_s * 1e9).mean()) if d.size else None,
        "short_kernel_ratio": float(is_short[so].mean()) if so.size else None,
    }


def _op_counts(kinds: np.ndarray) -> dict:
    return {"kernel": int((kinds == KERNEL).sum()), "memcpy": int((kinds == MEMCPY).sum()),
            "memset": int((kinds == MEMSET).sum())}


def _host_fields(tl: Timeline, cfg: Config, w0: int, w1: int, syncing: np.ndarray, small_h2d: np.ndarray,
                 pageable_async: np.ndarray, sel: np.ndarray) -> dict:
    cs, ce, ck = tl.call_start, tl.call_end, tl.call_kind
    # host window: from the first launch of an analysed op (launches precede their ops) to the last op end
    lk = tl.op_launch[sel]
    lk = lk[lk >= 0]
    h0 = min(w0, int(cs[lk].min())) if lk.size else w0
    inwin = (cs >= h0) & (cs <= w1)
    dur = ce - cs
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
    by_name: dict[str, dict] = {}
    for k in np.flatnonzero(sy | ((mal | fre))).tolist():
        nm = tl.call_names[int(tl.call_name[k])] if tl.call_names else "?"
        b = by_name.setdefault(nm, {"calls": 0, "seconds": 0.0})
        b["calls"] += 1
        b["seconds"] += float(dur[k]) / 1e9
    launches = inwin & np.isin(ck, (LAUNCH, GRAPH_LAUNCH))
    names = tl.call_names
    drv = np.zeros(ck.size, dtype=bool)
    if names:
        is_drv = np.array([n.startswith("cu") and not n.startswith("cuda") for n in names], dtype=bool)
        drv = is_drv[tl.call_name] & launches
    graph_calls = inwin & (ck == GRAPH_LAUNCH)
    g_ops = int(np.isin(tl.op_launch[sel], np.flatnonzero(graph_calls)).sum()) if graph_calls.any() else 0
    steady_span = max(w1 - steady0, 1)
    pg = sel & tl.op_pageable
    return {
        "calls_in_window": int(inwin.sum()),
        "launch_calls": int(launches.sum()),
        "driver_launch_calls": int(drv.sum()),
        "graph_launch_calls": int(graph_calls.sum()),
        "kernels_per_graph_launch": (g_ops / int(graph_calls.sum())) if graph_calls.any() else None,
        "sync_api_calls": int(sy.sum()),
        "sync_api_seconds": float(dur[sy].sum()) / 1e9,
        "sync_api_ratio": float(dur[sy].sum()) / span,
        "pageable_copies": int(pg.sum()),
        "pageable_copy_bytes": int(np.maximum(tl.op_bytes[pg], 0).sum()),
        "pageable_async_copy_calls": int((pageable_async & inwin).sum()),
        "steady_state": {"rule": steady_rule, "start": (steady0 + tl.epoch_offset_ns) / 1e9
                         if tl.epoch_offset_ns is not None else None, "span_seconds": steady_span / 1e9},
        "steady_malloc_calls": int(mal.sum()),
        "steady_free_calls": int(fre.sum()),
        "steady_malloc_free_seconds": float(dur[mal | fre].sum()) / 1e9,
        "steady_malloc_free_ratio": float(dur[mal | fre].sum()) / steady_span,
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
