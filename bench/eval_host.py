"""Families of bench/eval_detectors.py beyond the GPU's memory: the engine container's CPU quota and memory,
the host, the GPUs' hardware-health fields, and a stalled engine. Written from the kernel's, Kubernetes'
and NVIDIA's documented behaviour, not from fragscope.scenarios: its own names (fragscope's collector or
cAdvisor's and dcgm-exporter's, chosen per case), quotas, limits, scrape grids and fault kinds.

Every case of every family gets the host series (a container that is fine, unless the family says
otherwise), so the families of eval_detectors.py are confounders of these diagnoses too; a launch-bound
pod with CPU to spare is the `launch-bound` family itself.

``apply(case, pod, rng, G)`` sets the pod's knobs and registers ``pod.extra_cols`` hooks that add columns
(and freeze counters, for a stall) when the pod is exported.
"""
from __future__ import annotations

import numpy as np

GiB = 1024.0 ** 3

FAMILIES = [  # family, expected id, timings, group
    ("engine-cpu-starved", "engine-cpu-starved", ("mid", "underway", "late"), ""),
    ("engine-stalled", "engine-stalled", ("late",), ""),
    ("rank-straggler", "rank-straggler", ("mid", "underway", "late"), ""),
    ("gpu-hardware-fault", "gpu-hardware-fault", ("mid", "underway", "late"), ""),
    ("host-memory-pressure", "host-memory-pressure", ("mid", "underway", "late"), ""),
    ("rank-idle-by-design", None, ("-",), "confounder"),
    ("link-idle-downshift", None, ("-",), "confounder"),
    ("old-corrected-ecc", None, ("-",), "confounder"),
    ("page-cache-near-limit", None, ("-",), "confounder"),
]
PRIMARY = {"rank-straggler": "gpu", "gpu-hardware-fault": "gpu", "link-idle-downshift": "gpu",
           "old-corrected-ecc": "gpu"}
MIN_GPUS = {"rank-straggler": 2, "rank-idle-by-design": 2}
HW_XIDS = (48, 79, 95, 74, 119)


def _lat(pod, arr, ts):
    return np.interp(ts, pod.t, arr)


def apply(case, pod, rng: np.random.Generator, G) -> None:
    """Knobs for the family; the host / hardware columns for every case."""
    fam, p = case.family, case.params
    hw: dict = {"fault": None, "gpu": None, "g": None}
    host: dict = {"throttle": None, "ws": None, "kills": None, "cache": False, "stall": None}
    if fam == "engine-cpu-starved":
        g = G()
        share = float(rng.uniform(0.3, 0.85))
        p["throttled_share"] = round(share, 2)
        e0 = pod.engines[0]
        e0.rho = float(rng.uniform(0.1, 0.3))
        e0.load = 0.0
        slow = 1 - share * float(rng.uniform(0.5, 0.8))  # the quota takes that share of every step
        pod.speed_mult[0] = 1 - (1 - slow) * g
        for gi in e0.gpus:
            pod.util_mult[gi] = 1 - (1 - slow) * 0.9 * g
            pod.gap_mult[gi] = 1 + (float(rng.uniform(150e-6, 800e-6)) / pod.gap_p50 - 1) * g
        host["throttle"] = (g, share)
    elif fam == "engine-stalled":
        on = pod.start + pod.duration - float(rng.uniform(60, 1800))  # how long ago it hung
        host["stall"] = (on, str(rng.choice(["collective", "host"])))
        p["stalled_for_s"] = round(pod.start + pod.duration - on)
        e0 = pod.engines[0]
        e0.rho = float(rng.uniform(0.2, 0.6))
        e0.load = 0.0
    elif fam == "rank-straggler":
        g = G()
        gi = int(rng.integers(0, pod.n_gpus))
        gap = float(rng.uniform(0.13, 0.35))
        cause = str(rng.choice(["clocks", "pcie", "power"]))
        p.update(slow_gpu=gi, gap=round(gap, 2), cause=cause)
        pod.clock_mult[gi] = 1 - gap * g
        pod.speed_mult[0] = pod.speed_mult[0] * (1 - gap * g)
        if cause == "pcie":
            hw.update(fault="pcie-straggler", gpu=gi, g=g)
    elif fam == "gpu-hardware-fault":
        g = G()
        kind = str(rng.choice(["xid", "dbe", "remap-pending", "remap-failed", "pcie-gen", "pcie-width", "replays"]))
        hw.update(fault=kind, gpu=int(rng.integers(0, pod.n_gpus)), g=g, xid=int(rng.choice(HW_XIDS)))
        p["fault"] = kind
    elif fam == "host-memory-pressure":
        g = G()
        if rng.random() < 0.3:
            host["kills"] = g
            p["kind"] = "oom-kill"
        else:
            top = float(rng.uniform(0.91, 0.995))
            host["ws"] = (g, top)
            p["kind"] = f"working set {top:.2f} of the limit"
    elif fam == "rank-idle-by-design":
        gi = pod.n_gpus - 1
        pod.util_mult[gi] = np.zeros(pod.M)
        pod.clock_mult[gi] = np.full(pod.M, 0.2)
    elif fam == "link-idle-downshift":
        hw["fault"] = "idle-downshift"
        quiet_until = pod.start + float(rng.uniform(0.2, 0.5)) * pod.duration  # no traffic yet: GPUs idle
        pod.demand_mult[0] = np.where(pod.t < quiet_until, 0.0, pod.demand_mult[0])
    elif fam == "old-corrected-ecc":
        hw["fault"] = "old-ecc"
        hw["gpu"] = int(rng.integers(0, pod.n_gpus))
    elif fam == "page-cache-near-limit":
        host["cache"] = True
    names = str(rng.choice(["fragscope", "fragscope", "cadvisor"]))
    present = rng.random() < 0.85 or fam in ("engine-cpu-starved", "host-memory-pressure", "page-cache-near-limit")
    quota = float(rng.choice([2, 4, 8, 16]))
    limit = float(rng.choice([32, 64, 128, 256])) * GiB
    ws0 = float(rng.uniform(0.2, 0.7))
    seed = int(rng.integers(0, 2**31))

    def add(cols, types, put, ts_e, ts_g):
        r = np.random.default_rng(seed)
        _stall(pod, cols, host["stall"], ts_e)
        if present:
            _host_cols(pod, put, ts_e, r, names, quota, limit, ws0, host)
        if pod.gpu_src is not None:
            _hw_cols(pod, put, ts_g, r, hw, cols)
    pod.extra_cols.append(add)


def _stall(pod, cols, stall, ts_e) -> None:
    """Freeze the progress counters from the stall on; the batch and the queue hold; GPUs spin or idle."""
    if stall is None:
        return
    on, kind = stall
    for key, (ts, vs) in list(cols.items()):
        m = ts >= on
        if not m.any():
            continue
        k0 = int(np.argmax(m))
        if key.name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total",
                        "vllm:num_preemptions_total") or key.name.endswith(("_count", "_sum", "_bucket")):
            base = vs[k0 - 1] if k0 > 0 else vs[0]
            vs = vs.copy()
            vs[m] = base
        elif key.name in ("vllm:num_requests_running",):
            vs = vs.copy()
            vs[m] = max(1.0, vs[k0 - 1] if k0 > 0 else vs[0])
        elif key.name in ("fragscope_gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL"):
            vs = vs.copy()
            full = 100.0 if key.name.startswith("DCGM") else 1.0
            vs[m] = full if kind == "collective" else 0.0
        else:
            continue
        cols[key] = (ts, vs)


def _host_cols(pod, put, te, r, names, quota, limit, ws0, host) -> None:
    n = te.size
    if n == 0:
        return
    share = np.clip(r.uniform(0.0, 0.06) + r.normal(0, 0.01, n), 0, 1)
    if host["throttle"] is not None:
        g, s = host["throttle"]
        share = np.clip(share + s * _lat(pod, g, te), 0, 1)
    period_s = 0.1
    dt = np.diff(te, prepend=te[0])
    periods = np.cumsum(dt / period_s)
    thr = np.round(np.cumsum(share * dt / period_s))
    ws = ws0 * (1 + 0.03 * np.sin((te - te[0]) / 5400.0)) + r.normal(0, 0.002, n)
    if host["ws"] is not None:
        g, top = host["ws"]
        ws = ws + (top - ws0) * _lat(pod, g, te)
    kills = np.zeros(n)
    if host["kills"] is not None:
        gk = _lat(pod, host["kills"], te)
        kills = (gk > 0.01) * float(r.integers(1, 4))  # the kill(s) at the onset: an event, not a ramp
    ws = np.clip(ws, 0.01, 0.999) * limit
    usage = ws + (0.99 * limit - ws) * (0.97 if host["cache"] else r.uniform(0.05, 0.3))
    if names == "fragscope":
        put("fragscope_container_cpu_quota_cores", {}, te, np.full(n, quota), "gauge")
        put("fragscope_container_cpu_periods_total", {}, te, np.round(periods), "counter")
        put("fragscope_container_cpu_throttled_periods_total", {}, te, thr, "counter")
        put("fragscope_container_cpu_throttled_seconds_total", {}, te, np.round(thr * 0.04, 3), "counter")
        put("fragscope_container_memory_working_set_bytes", {}, te, np.round(ws), "gauge")
        put("fragscope_container_memory_usage_bytes", {}, te, np.round(usage), "gauge")
        put("fragscope_container_memory_limit_bytes", {}, te, np.full(n, limit), "gauge")
        put("fragscope_container_oom_kills_total", {}, te, kills, "counter")
    else:  # cAdvisor through the kubelet, the engine's container
        lab = {"container": "vllm", "image": "vllm/vllm-openai"}
        put("container_cpu_cfs_periods_total", lab, te, np.round(periods), "counter")
        put("container_cpu_cfs_throttled_periods_total", lab, te, thr, "counter")
        put("container_cpu_cfs_throttled_seconds_total", lab, te, np.round(thr * 0.04, 3), "counter")
        put("container_memory_working_set_bytes", lab, te, np.round(ws), "gauge")
        put("container_spec_memory_limit_bytes", lab, te, np.full(n, limit), "gauge")
        put("container_oom_events_total", lab, te, kills, "counter")


def _gpu_util(cols, gi: int, tg):
    for key, (ts, vs) in cols.items():
        if key.name in ("fragscope_gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL") and key.label("gpu") == str(gi):
            u = vs / 100.0 if key.name.startswith("DCGM") else vs
            return np.interp(tg, ts, u) if ts.size else None
    return None


def _hw_cols(pod, put, tg, r, hw, cols) -> None:
    n = tg.size
    if n == 0:
        return
    for gi in range(pod.n_gpus):
        xid = np.zeros(n)
        dbe = np.zeros(n)
        dbe_agg = np.zeros(n)
        sbe = np.zeros(n)
        pending = np.zeros(n)
        failed = np.zeros(n)
        gen_max = 5.0
        gen = np.full(n, gen_max)
        width = np.full(n, 16.0)
        replays = np.full(n, float(r.integers(0, 3)))
        hit = hw["gpu"] == gi
        # a fault is an event: present from the onset on (not from half-way up a ramp)
        on = _lat(pod, hw["g"], tg) > 0.01 if hw.get("g") is not None else np.zeros(n, bool)
        f = hw["fault"]
        if f == "xid" and hit:
            xid[on] = hw["xid"]
        elif f == "dbe" and hit:
            dbe = np.where(on, float(r.integers(1, 5)), 0.0)
            dbe_agg = dbe.copy()
        elif f == "remap-pending" and hit:
            pending[on] = 1.0
        elif f == "remap-failed" and hit:
            failed[on] = 1.0
        elif f in ("pcie-gen", "pcie-straggler") and hit:
            gen = np.where(on, gen_max - float(r.integers(1, 3)), gen)
        elif f == "pcie-width" and hit:
            width = np.where(on, float(r.choice([4, 8])), width)
        elif f == "replays" and hit:
            replays = replays + np.cumsum(np.where(on, r.uniform(20, 200) / 60.0 * np.diff(tg, prepend=tg[0]), 0))
        elif f == "idle-downshift":
            u = _gpu_util(cols, gi, tg)
            if u is not None:
                gen = np.where(u >= 0.3, gen_max, 1.0)  # ASPM / dynamic link speed: Gen1 while idle
        elif f == "old-ecc" and hit:
            sbe[:] = float(r.integers(1, 20))
            dbe_agg[:] = 1.0
        if pod.gpu_src == "fragscope":
            lab = {"gpu": str(gi), "gpu_uuid": pod.uuids[gi]}
            names = ("fragscope_gpu_last_xid", "fragscope_gpu_ecc_uncorrected_volatile_total",
                     "fragscope_gpu_ecc_corrected_volatile_total", "fragscope_gpu_ecc_uncorrected_aggregate_total",
                     "fragscope_gpu_row_remap_pending", "fragscope_gpu_row_remap_failed", "fragscope_gpu_pcie_link_gen",
                     "fragscope_gpu_pcie_link_gen_max", "fragscope_gpu_pcie_link_width",
                     "fragscope_gpu_pcie_link_width_max", "fragscope_gpu_pcie_replays_total")
        else:
            lab = {"gpu": str(gi), "UUID": pod.uuids[gi], "device": f"nvidia{gi}", "modelName": pod.gpu_model}
            names = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                     "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                     "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
                     "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
        vals = (xid, dbe, sbe, dbe_agg, pending, failed, gen, np.full(n, gen_max), width, np.full(n, 16.0), replays)
        types = ("gauge", "counter", "counter", "counter", "gauge", "gauge", "gauge", "gauge", "gauge", "gauge",
                 "counter")
        for name, v, typ in zip(names, vals, types):
            put(name, lab, tg, v, typ)
