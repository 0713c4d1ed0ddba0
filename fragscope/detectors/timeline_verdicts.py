"""Verdicts over a kernel-timeline analysis (:func:`fragscope.detectors.timeline.analyse`'s dict). Pure."""
from __future__ import annotations

from ..model import Evidence, Finding, Inconclusive, Severity
from .timeline_config import ALLOCATOR_STALLS, LAUNCH_BOUND, SYNC_BOUND, UNIFIED_MEMORY_THRASHING, Config

WORKLOAD_WORDS = {"training": "a training step", "serving": "a serving engine", "unknown": "workload unknown"}


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
    wl = (a.get("workload") or {}).get("kind", "unknown")
    for d in a["devices"]:
        before, said = len(findings), len(inconclusive)
        _judge_device(d, cfg, win, onset, host, wl, findings, inconclusive)
        if len(findings) == before and len(inconclusive) == said:
            inc = _idle_inconclusive(d, cfg)
            if inc is not None:
                inconclusive.append(inc)
    _judge_allocator(host, cfg, findings, inconclusive)
    um = _judge_unified_memory(a, cfg, win)
    if um is not None:
        findings.append(um)
    return findings, inconclusive


def _idle_inconclusive(d: dict, cfg: Config) -> Inconclusive | None:
    """A device idle most of its span with no finding: never a silent "healthy". Says why nothing was
    concluded (late launches contradicted by a queued launch delay, or no mechanism at all)."""
    idle = d["idle_ratio"]
    if idle is None or idle < cfg.idle_ratio_min or sum(d["ops"].values()) < cfg.min_ops:
        return None
    waits = (f"host wait {_pct(d.get('host_wait_ratio'))}, kernel wait {_pct(d.get('kernel_wait_ratio'))} "
             f"of the idle time; sync gaps {_pct(d.get('sync_gap_ratio'))}")
    ld = d.get("launch_delay_seconds")
    if (d.get("host_wait_ratio") or 0) + (d.get("kernel_wait_ratio") or 0) >= cfg.wait_share_min and ld:
        why = (f"the gaps follow late launches ({waits}), but the median launch delay {_us(ld['p50'])} says "
               "work was queued on the GPU: the evidence disagrees")
    else:
        why = f"neither late launches nor synchronizing calls explain most of it ({waits})"
    return Inconclusive(LAUNCH_BOUND, ["host-side profile of the idle gaps (CPU ops, data loading, other processes)"],
                        f"GPU {d['device']}: idle {_pct(idle)} of {d['span_seconds']:.3g} s; {why}",
                        {"gpu": str(d["device"])})


def _long_gap_share(d: dict, cfg: Config) -> float | None:
    """A lower bound of the share of idle time in gaps >= ``long_gap_s``, when it is at least
    ``wait_share_min`` (else None): the longest gap plus ``long_gap_s`` for each other long gap."""
    n, gq, idle_s = d.get("long_gaps") or 0, d.get("gap_seconds"), d.get("idle_seconds")
    if not n or not gq or gq.get("max") is None or not idle_s or gq["max"] < cfg.long_gap_s:
        return None
    share = min(1.0, (gq["max"] + (n - 1) * cfg.long_gap_s) / idle_s)
    return share if share >= cfg.wait_share_min else None


def _judge_device(d: dict, cfg: Config, win, onset, host: dict, wl: str, findings: list[Finding],
                  inconclusive: list[Inconclusive]) -> None:
    """launch-bound / sync-bound for one device (appends to ``findings`` / ``inconclusive``)."""
    subject = {"gpu": str(d["device"])}
    n_ops = sum(d["ops"].values())
    idle = d["idle_ratio"]
    if n_ops < cfg.min_ops or idle is None:
        for i in (LAUNCH_BOUND, SYNC_BOUND):
            inconclusive.append(Inconclusive(i, ["kernel timeline"], f"GPU {d['device']}: only {n_ops} GPU "
                                             f"op(s) in the trace (need {cfg.min_ops})", subject))
        return
    if idle < cfg.idle_ratio_min:
        return  # GPU busy most of the window: neither launch- nor sync-bound
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
                           note=f"{host['sync_api_calls']} synchronizing calls, {host['sync_api_seconds']:.3g} s"
                           + ("; above 100 %: calls overlap across host threads (a sum, not a share of wall time)"
                              if host["sync_api_ratio"] > 1.0 else ""),
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
        stall = _long_gap_share(d, cfg)
        if stall is not None:
            # Launch-bound means per-launch overhead (µs each) adds up; CUDA graphs remove it. When gaps of
            # 500 ms or more (nsys gpu_gaps' program-level stalls) hold most of the idle time, the host was
            # doing something else for seconds (data loading, host compute, a sleep, a checkpoint):
            # no launch path explains that, and the CUDA-graph fix would not touch it.
            # (hta_alexnet_critical_path: gaps of 10.03, 1.04, 0.82, 0.82 s are 99 % of 12.85 s idle.)
            inconclusive.append(Inconclusive(
                LAUNCH_BOUND, ["host-side profile of the long gaps (CPU ops, data loading, other processes)"],
                f"GPU {d['device']}: idle {_pct(idle)} of {span:.3g} s, but {d['long_gaps']} gap(s) of 500 ms or "
                f"more (the longest {d['gap_seconds']['max']:.3g} s) hold at least {_pct(stall)} of the idle time: "
                "program-level stalls on the host, not kernel-launch overhead", subject))
            return
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
            return
        findings.append(Finding(
            LAUNCH_BOUND, sev, min(conf, 0.95),
            f"GPU {d['device']}: idle {_pct(idle)} of {span:.3g} s between ops; {_pct(hw)} of the idle time is "
            f"the host launching late and {_pct(kw)} launch overhead between back-to-back ops; median launch "
            f"delay {_us(ld['p50'] if ld else None)}, {_pct(d.get('short_kernel_ratio'))} of kernels shorter "
            f"than their launch call ({WORKLOAD_WORDS.get(wl, wl)}).",
            onset=onset, evidence=ev, missing=missing, subject=subject))



def _judge_allocator(host: dict, cfg: Config, findings: list[Finding], inconclusive: list[Inconclusive]) -> None:
    nm, nf = host["steady_malloc_calls"], host["steady_free_calls"]
    flushes = host.get("steady_malloc_after_free_calls", nm)
    stepped = host["steady_state"]["rule"] == "after the first ProfilerStep"
    if nm + nf >= cfg.alloc_min_calls and (nf == 0 or flushes == 0):
        # mallocs with no cudaFree before them: the caching allocator growing its pool (first use of a size),
        # not flushing and re-allocating; with no ProfilerStep there is no steady state to judge at all
        if stepped:
            reason = (f"{nm} cudaMalloc and {nf} cudaFree after the first ProfilerStep, no cudaMalloc after a "
                      "cudaFree: the pool still grew (new shapes), no segment was flushed and re-allocated")
        else:
            reason = (f"{nm} cudaMalloc and {nf} cudaFree in the second half of a trace without two ProfilerSteps "
                      "(a single cold pass), no cudaMalloc after a cudaFree: that is the caching allocator growing its "
                      "pool on first use, not flushing; profile after warm-up (torch.profiler.schedule(wait=1, "
                      "warmup=1, active=3) and prof.step() each iteration)")
        inconclusive.append(Inconclusive(ALLOCATOR_STALLS, ["a steady-state trace (after warm-up) with cudaFree "
                                                            "followed by cudaMalloc"], reason))
        return
    if nm + nf >= cfg.alloc_min_calls:
        share = host["steady_malloc_free_ratio"]
        sev = Severity.WARNING if (share >= cfg.alloc_time_share_warn or nf > 0) else Severity.INFO
        conf = 0.5 + (0.2 if nf > 0 and nm > 0 else 0.0) + (0.2 if share >= cfg.alloc_time_share_warn else 0.0)
        ev = [Evidence("steady_malloc_calls", nm, unit="calls", note=host["steady_state"]["rule"]),
              Evidence("steady_free_calls", nf, unit="calls", note="cudaFree synchronizes the device"),
              Evidence("steady_malloc_after_free_calls", flushes, unit="calls",
                       note="cudaMalloc after a cudaFree: segments released, then allocated again"),
              Evidence("steady_malloc_free_ratio", share, threshold=cfg.alloc_time_share_warn, unit="ratio",
                       note=f"{host['steady_malloc_free_seconds']:.3g} s in malloc/free")]
        findings.append(Finding(
            ALLOCATOR_STALLS, sev, min(conf, 0.95),
            f"{nm} cudaMalloc and {nf} cudaFree calls after warm-up ({host['steady_state']['rule']}) took "
            f"{host['steady_malloc_free_seconds']:.3g} s ({_pct(share)} of the steady window): the caching "
            f"allocator is flushing and re-allocating segments (allocation retries).",
            onset=host["steady_state"]["start"], evidence=ev,
            missing=["torch_alloc_retries_total (probe)"], subject={"source": "trace"}))


def _judge_unified_memory(a: dict, cfg: Config, win) -> Finding | None:
    """unified-memory-thrashing: managed pages migrating on demand (page faults, evictions) between host
    and GPU, the GPU waiting on each fault. Prefetches (cudaMemPrefetchAsync, speculative) do not count."""
    um = a.get("unified_memory")
    if not um or um["demand_migrations"] < cfg.um_min_migrations:
        return None
    n, ratio = um["demand_migrations"], um["time_ratio"]
    both = um["demand_htod"] > 0 and um["demand_dtoh"] > 0
    heavy = ratio is not None and ratio >= cfg.um_time_ratio_warn
    sev = Severity.CRITICAL if both and ratio is not None and ratio >= cfg.um_time_ratio_critical else \
        Severity.WARNING
    conf = 0.6 + (0.15 if both else 0.0) + (0.15 if heavy else 0.0)
    causes = ", ".join(f"{k} {v}" for k, v in sorted(um["by_cause"].items(), key=lambda kv: -kv[1]))
    ev = [Evidence("um_demand_migrations", n, threshold=cfg.um_min_migrations, unit="migrations", window=win,
                   note=f"{um['migrations']} page migrations in all ({causes}); {um['bytes'] / 2**20:.1f} MiB moved"),
          Evidence("um_time_ratio", ratio, threshold=cfg.um_time_ratio_warn, unit="ratio", window=win,
                   note=f"{um['seconds']:.3g} s of migrations in the trace window", agrees=heavy),
          Evidence("um_demand_directions", 2 if both else 1, unit="directions",
                   note=f"{um['demand_htod']} host->device, {um['demand_dtoh']} device->host on demand"
                   + ("" if both else " (one direction: first-touch paging rather than ping-pong)"), agrees=both)]
    gpus = ",".join(str(x) for x in um["devices"])
    return Finding(
        UNIFIED_MEMORY_THRASHING, sev, min(conf, 0.95),
        f"{n} unified-memory page migrations on demand ({um['demand_htod']} host->device, {um['demand_dtoh']} "
        f"device->host, {um['bytes'] / 2**20:.1f} MiB) took {um['seconds']:.3g} s, {_pct(ratio)} of the trace "
        f"window: managed memory is moving back and forth instead of staying where it is used.",
        onset=a["window"]["start"], evidence=ev, missing=["CUDA_UM_GPU_PAGE_FAULT_EVENTS (nsys --cuda-um-gpu-page-faults)"],
        subject={"gpu": gpus} if gpus else {"source": "trace"})


