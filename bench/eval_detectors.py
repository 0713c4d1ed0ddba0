"""Independent evaluation of the seven detectors on synthesized incidents they were not built against.

    python bench/eval_detectors.py [--quick] [--seed 7] [--per-family N] [--only FAMILY] [--verbose]
                                   [--no-artefacts]

The incident synthesizer below is written from issue 2 (signals, diagnoses, the seed's reference
figures), docs/signals.md and the field's mechanisms; it deliberately does not import or copy
``fragscope.scenarios`` (the generator the detectors were developed against).

It models a serving pod as a fluid queue per engine (arrivals -> waiting -> running batch -> completions),
with heavy-tailed traffic, a batch cap, a KV-block pool, per-sequence decode speed that depends on batch
size, SM clock and launch overhead, and derives every exported signal from that state (vLLM V0/V1 names,
fragscope NVML or dcgm-exporter GPU metrics, the in-process PyTorch allocator probe per pid and gpu, sparse
kernel-timeline captures). Incidents and confounders perturb the mechanism, not the exported numbers, so
the signals stay consistent with each other (e.g. fragmentation shrinks the batch cap; the queue, TTFT,
throughput and KV usage follow from that).

Prints a confusion table per family (expected id found, at which severity, other ids reported), detection
by timing variant, the early-warning figures for the seed's fragmentation regression (minutes after onset
and throughput drop when first flagged as a warning), and every failing case with its parameters and the
findings' summaries. The baseline it is judged against is the issue's expectation, not another tool.

Then the artefact families (bench/eval_engines.py): ``batching-misconfiguration`` from Triton configs and
scrapes, ``cpu-fallback`` from ONNX Runtime profiles and logs, with a severity sweep. Those cases come from
``fragscope.scenarios.triton`` / ``.ort`` (mechanism models written after those two detectors, not the
window generator above), randomised per case; they run after the window families and do not change them.
"""
from __future__ import annotations

import argparse
import collections
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

import eval_host  # bench/eval_host.py, beside this script
from fragscope.model import SeriesKey, Window, make_labels
from fragscope.pipeline import diagnose
from fragscope.playbooks import REGISTRY

GiB = 1024 ** 3
MiB = 1024 ** 2
T0 = 1767225600.0  # 2026-01-01 00:00 UTC

IDS = REGISTRY.ids("window")  # the registered window diagnoses (fragscope/playbooks)

# vLLM's own bucket boundaries (V1 metrics.py): TTFT, and build_1_2_5 for token-count histograms
TTFT_LE = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOK_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]

GPU_MODELS = [  # name, total MiB (as NVML reports), max SM MHz, TDP W
    ("NVIDIA H100 80GB HBM3", 81559, 1980, 700),
    ("NVIDIA A100-SXM4-80GB", 81920, 1410, 400),
    ("NVIDIA H200", 143771, 1980, 700),
    ("NVIDIA L40S", 46068, 2520, 350),
    ("NVIDIA L4", 23034, 2040, 72),
]
REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
           "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


# ---------------------------------------------------------------------------------------------
# ramps
def ramp(shape: str, t: np.ndarray, onset: float, dur: float, period: float = 900.0,
         duty: float = 0.6) -> np.ndarray:
    """Incident progress 0..1 over absolute time ``t`` (onset may lie before the window)."""
    x = (t - onset) / max(dur, 1.0)
    if shape == "step":
        g = np.clip((t - onset) / 90.0, 0, 1)  # a minute and a half to settle
    elif shape == "linear":
        g = np.clip(x, 0, 1)
    elif shape == "sigmoid":
        s = 1 / (1 + np.exp(-np.clip(x - 0.5, -50, 50) * 10))
        s0 = 1 / (1 + math.exp(5))
        g = np.where(x <= 0, 0.0, np.clip((s - s0) / (1 - s0), 0, 1))
    elif shape == "sawtooth":  # builds up, partially recovers (cache flushes), builds again, trending up
        ph = np.mod(np.maximum(t - onset, 0) / period, 1.0)
        g = np.clip(x, 0, 1) * (0.55 + 0.45 * ph)
    elif shape == "cycle":  # thermal cycling: on/off around a temperature threshold, share = duty
        ph = np.mod(np.maximum(t - onset, 0) / period, 1.0)
        g = np.where(t >= onset, (ph < duty).astype(float), 0.0)
    else:
        raise ValueError(shape)
    return g


# ---------------------------------------------------------------------------------------------
# the pod
@dataclass
class EngineCfg:
    idx: int
    gpus: list[int]
    version: str  # V0 | V1
    model_name: str
    engine_label: str
    block_size: int
    gmu: float
    max_num_seqs: int
    r0: float  # per-sequence decode tok/s at batch 1
    h: float  # batch at which per-seq speed halves
    prompt_mean: float
    gen_mean: float
    prompt_sigma: float
    gen_sigma: float
    rho: float  # baseline running batch / max_num_seqs
    kv_u0: float  # baseline KV usage
    pid_base: int
    uptime_s: float  # engine uptime at window start (counter offsets)
    load: float = 0.0  # if set: baseline demand as a share of full-batch throughput capacity (overrides rho)
    kv_mode: str = "roomy"  # roomy: the pool holds max_num_seqs typical sequences; tight: it may not
    num_gpu_blocks: int = 0


@dataclass
class Case:
    family: str
    expect: str | None  # the diagnosis id that should be found; None: nothing should be
    seed: int
    timing: str = "-"
    group: str = ""  # separate bucket in the table (debatable expectations)
    params: dict = field(default_factory=dict)
    window: object = None  # the exported window, kept for the cold views


class Pod:
    """Latent state on a fine grid, then exported on scrape grids with noise, gaps and resets."""

    def __init__(self, rng: np.random.Generator, *, duration_s: float, step: float, n_gpus: int,
                 n_engines: int, version: str, gpu_src: str | None, torch_probe: bool, kernel: bool,
                 noise: float, burst: float):
        self.rng = rng
        self.start = T0 + float(rng.integers(0, 86400 * 30))
        self.duration = duration_s
        self.step = step
        self.dt = float(min(5.0, step))
        self.t = self.start + np.arange(0.0, duration_s + self.dt, self.dt)
        self.M = self.t.size
        self.gpu_src, self.torch_probe, self.kernel = gpu_src, torch_probe, kernel
        self.noise, self.burst = noise, burst
        gm = GPU_MODELS[int(rng.integers(len(GPU_MODELS)))]
        self.gpu_model, self.total_bytes, self.max_mhz, self.tdp = gm[0], gm[1] * MiB, gm[2], gm[3]
        self.n_gpus = n_gpus
        self.uuids = ["GPU-%08x-%04x-%04x-%04x-%012x" % tuple(int(rng.integers(0, 16 ** k))
                      for k in (8, 4, 4, 4, 12)) for _ in range(n_gpus)]
        tp = n_gpus // n_engines
        models = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
                  "mistralai/Mistral-7B-Instruct-v0.3", "meta-llama/Llama-3.1-70B-Instruct"]
        self.engines: list[EngineCfg] = []
        for e in range(n_engines):
            mn = models[int(rng.integers(len(models)))] if (e == 0 or version == "V1") else models[e % 4] + "-b"
            if e == 1 and version == "V0" and self.engines and mn == self.engines[0].model_name:
                mn = mn + "-b"
            self.engines.append(EngineCfg(
                idx=e, gpus=list(range(e * tp, (e + 1) * tp)), version=version, model_name=mn,
                engine_label=str(e), block_size=16, gmu=float(rng.choice([0.85, 0.9, 0.9, 0.92, 0.95])),
                max_num_seqs=int(rng.choice([64, 128, 128, 256])), r0=float(rng.uniform(15, 55)),
                h=0.0, prompt_mean=float(rng.uniform(250, 1500)),
                gen_mean=float(rng.uniform(120, 600)), prompt_sigma=float(rng.uniform(0.5, 1.1)),
                gen_sigma=float(rng.uniform(0.4, 0.9)), rho=float(rng.uniform(0.3, 0.6)),
                load=float(rng.uniform(0.3, 0.6)), kv_u0=float(rng.uniform(0.25, 0.55)), pid_base=int(rng.integers(100, 60000)),
                uptime_s=float(rng.uniform(3600, 86400 * 5))))
            self.engines[-1].h = self.engines[-1].max_num_seqs * float(rng.uniform(1.5, 4.0))
        # perturbations, filled by the family functions (per engine unless noted)
        ones = np.ones(self.M)
        self.extra_cols: list = []  # callables(cols, types, put, ts_e, ts_g) run at export (eval_host.py)
        self.demand_mult = [ones.copy() for _ in self.engines]
        self.prompt_mult = [ones.copy() for _ in self.engines]
        self.gen_mult = [ones.copy() for _ in self.engines]
        self.bcap_mult = [ones.copy() for _ in self.engines]
        self.speed_mult = [ones.copy() for _ in self.engines]
        self.extra_preempt_pm = [np.zeros(self.M) for _ in self.engines]  # preemptions/min
        self.restarts: list[float] = []  # absolute times; engine down for self.down_s afterwards
        self.down_s = float(rng.uniform(60, 180))
        # per GPU
        self.frag = [None] * n_gpus  # fragmentation ratio over time (None = healthy default)
        self.inactive_share = [None] * n_gpus
        self.retries_pm = [np.zeros(self.M) for _ in range(n_gpus)]
        self.ooms_at: list[list[float]] = [[] for _ in range(n_gpus)]
        self.alloc_extra = [np.zeros(self.M) for _ in range(n_gpus)]  # leaked / load-held bytes
        self.reserved_extra_frac = [np.zeros(self.M) for _ in range(n_gpus)]
        self.clock_mult = [ones.copy() for _ in range(n_gpus)]
        self.throttle_reason: list[tuple[str, np.ndarray] | None] = [None] * n_gpus
        self.temp_add = [np.zeros(self.M) for _ in range(n_gpus)]
        self.power_cap_share = [0.0] * n_gpus
        self.util_mult = [ones.copy() for _ in range(n_gpus)]
        self.gap_mult = [ones.copy() for _ in range(n_gpus)]
        self.idle_add = [np.zeros(self.M) for _ in range(n_gpus)]
        self.spike: tuple | None = None
        self.tput_alpha = float(rng.uniform(0.6, 1.0))  # tok/s ~ clock^alpha (decode is partly memory-bound)
        self.truth_tps: np.ndarray | None = None

    # -- traffic ---------------------------------------------------------------------------
    def traffic(self, wave_amp: float = 0.0, wave_phase: float | None = None) -> np.ndarray:
        """Multiplicative demand: daily wave x AR(1) lognormal noise x Pareto bursts (heavy-tailed)."""
        rng = self.rng
        t = self.t - self.start
        ph = rng.uniform(0, 2 * np.pi) if wave_phase is None else wave_phase
        wave = 1 + wave_amp * np.sin(2 * np.pi * t / 86400 + ph)
        tau = rng.uniform(60, 300)
        a = math.exp(-self.dt / tau)
        sig = 0.03 + 0.12 * self.burst  # minute-scale CV 5-15 %; the heavy tail is in the bursts
        eps = rng.normal(0, sig * math.sqrt(1 - a * a), self.M)
        x = np.empty(self.M)
        x[0] = rng.normal(0, sig)
        for i in range(1, self.M):
            x[i] = a * x[i - 1] + eps[i]
        m = wave * np.exp(x - sig * sig / 2)
        nb = rng.poisson(self.duration / 3600 * 3 * self.burst)
        for _ in range(nb):
            c = rng.uniform(0, self.duration)
            amp = min(2.0, (rng.pareto(2.0) + 1) * 0.3)
            w = rng.uniform(20, 120)
            m = m * (1 + amp * np.exp(-0.5 * ((t - c) / w) ** 2))
        return m

    # -- fluid queue -----------------------------------------------------------------------
    def simulate(self):
        rng = self.rng
        self.eng_state = []
        seg = np.searchsorted(np.array(self.restarts), self.t, side="right") if self.restarts else np.zeros(self.M, int)
        self.seg = seg
        total_tps = np.zeros(self.M)
        for e, cfg in enumerate(self.engines):
            S = cfg.max_num_seqs
            if cfg.load:
                cfg.rho = rho_for_load(cfg, cfg.load)
            Rstar = cfg.rho * S
            rr = cfg.r0 / (1 + Rstar / cfg.h)
            lam0 = Rstar * rr / cfg.gen_mean
            bps0 = (cfg.prompt_mean + cfg.gen_mean / 2) / cfg.block_size + 0.5
            kv_blocks = Rstar * bps0 / cfg.kv_u0
            if cfg.kv_mode == "roomy":  # sized so that max_num_seqs typical sequences fit
                kv_blocks = max(kv_blocks, S * bps0 * float(rng.uniform(1.1, 1.6)))
            elif cfg.kv_mode == "sat":  # full batch of typical sequences fills 82-92 %
                kv_blocks = S * bps0 / float(rng.uniform(0.82, 0.92))
            cfg.num_gpu_blocks = int(kv_blocks)
            lam = lam0 * self.demand_mult[e]
            P = cfg.prompt_mean * self.prompt_mult[e]
            G = cfg.gen_mean * self.gen_mult[e]
            cap = S * self.bcap_mult[e]
            spd = self.speed_mult[e]
            M, dt = self.M, self.dt
            R = np.zeros(M); W = np.zeros(M); kv = np.zeros(M); tps = np.zeros(M)
            comp = np.zeros(M); pre = np.zeros(M); adm = np.zeros(M); up = np.ones(M, bool)
            # fluid model: the running batch follows demand quasi-statically (requests last seconds, far
            # shorter than the grid step); only the waiting backlog carries state from step to step
            Wq = 0.0
            down_until = -1.0
            rs = list(self.restarts)
            for i in range(M):
                ti = self.t[i]
                if rs and ti >= rs[0]:
                    down_until = rs.pop(0) + self.down_s
                    Wq = 0.0
                if ti < down_until:
                    up[i] = False
                    continue
                bps = (P[i] + G[i] / 2) / cfg.block_size + 0.5
                kv_lim = kv_blocks / bps * 0.985
                c = max(1.0, min(cap[i], kv_lim))
                r0 = cfg.r0 * spd[i]
                X = lam[i] * G[i]  # generated tokens/s the traffic asks for
                den = r0 - X / cfg.h
                r_need = X / den if den > 0 else math.inf
                want = min(cap[i], r_need + Wq)  # sequences the scheduler would like to run
                if Wq <= 0 and r_need <= c:
                    r_run = r_need
                else:
                    r_run = c
                per = r0 / (1 + r_run / cfg.h)
                pre_pm = 0.0
                if kv_lim < want:  # the pool binds: running sequences outgrow it -> preemptions
                    over = min(1.0, (want - r_run) / max(r_run, 1.0))
                    # running sequences need a new block every block_size tokens; with none free the
                    # scheduler evicts whole sequences (about bps blocks each)
                    pre_pm = 60.0 * r_run * per / cfg.block_size / bps * (0.3 + 2.0 * over)
                    per *= 1 - min(0.3, 0.1 + 0.4 * over)  # recompute waste
                pre_pm += self.extra_preempt_pm[e][i]
                done = r_run * per / G[i]
                if Wq <= 0 and r_need <= c:
                    done = lam[i] if pre_pm == 0 else done
                Wq = max(0.0, Wq + (lam[i] - done) * dt)
                R[i], W[i] = r_run, Wq
                kv[i] = min(1.0, r_run * bps / kv_blocks)
                tps[i], comp[i], pre[i], adm[i] = r_run * per, done, pre_pm, lam[i]
            total_tps += tps
            self.eng_state.append(dict(R=R, W=W, kv=kv, tps=tps, comp=comp, pre=pre, adm=adm, up=up,
                                       P=P, G=G, lam=lam, kv_blocks=kv_blocks))
        self.truth_tps = total_tps

    # -- export ----------------------------------------------------------------------------
    def _grid(self, step: float, drop: float, gap: tuple[float, float] | None) -> np.ndarray:
        rng = self.rng
        ts = self.start + np.arange(0.0, self.duration, step)
        ts = ts + rng.uniform(-0.02, 0.02, ts.size) * step
        keep = rng.random(ts.size) >= drop
        if gap is not None:
            keep &= ~((ts >= gap[0]) & (ts < gap[1]))
        ts = ts[keep]
        return ts[(ts >= self.start) & (ts <= self.start + self.duration)]

    def export(self) -> Window:
        rng = self.rng
        cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
        types: dict[str, str] = {}
        nz = self.noise
        drop = float(rng.choice([0.0, 0.01, 0.03, 0.08]))
        gap = None
        if rng.random() < 0.3:
            g0 = self.start + rng.uniform(0.1, 0.9) * self.duration
            gap = (g0, g0 + rng.uniform(120, 600))
        ts_e = self._grid(self.step, drop, gap)
        ts_g = self._grid(max(self.step, 30.0) if self.gpu_src == "dcgm" and rng.random() < 0.5 else self.step,
                          drop, gap)
        ts_k = self._grid(float(rng.uniform(300, 900)), 0.0, None)

        def put(name, labels, ts, vals, typ):
            types[name] = typ
            cols[SeriesKey(name, make_labels(labels))] = (np.asarray(ts, float), np.asarray(vals, float))

        def lat(arr, ts):
            return np.interp(ts, self.t, arr)

        def seg_cum(inc, ts, offset):
            """Cumulative counter from per-second increments, reset to 0 at each restart."""
            cum = np.cumsum(inc * self.dt)
            base = np.zeros_like(cum)
            if self.restarts:
                for r in self.restarts:
                    j = int(np.searchsorted(self.t, r))
                    if j < cum.size:
                        base[j:] = cum[j - 1] if j > 0 else 0.0
            c = cum - base
            seg = self.seg
            c = c + np.where(seg == 0, offset, 0.0)
            return lat(c, ts) if ts.size else c[:0]

        spike = self.spike
        # ---- engines
        for e, (cfg, st) in enumerate(zip(self.engines, self.eng_state)):
            up_e = lat(st["up"].astype(float), ts_e) > 0.999
            te = ts_e[up_e]
            lab = {"model_name": cfg.model_name}
            if cfg.version == "V1":
                lab["engine"] = cfg.engine_label
            run = np.maximum(0, np.round(lat(st["R"], te) * (1 + rng.normal(0, nz, te.size))))
            wait = np.maximum(0, np.round(lat(st["W"], te) * (1 + rng.normal(0, nz, te.size))))
            kvv = np.clip(lat(st["kv"], te) * (1 + rng.normal(0, nz / 3, te.size)), 0, 1)
            if spike and spike[0] == e and te.size:
                k = int(spike[2] * (te.size - 1))
                if spike[1] == "waiting":
                    wait[k] += spike[3]
                elif spike[1] == "kv":
                    kvv[k] = 1.0
                elif spike[1] == "running":
                    run[k] = max(0, run[k] * 0.1)
            put("vllm:num_requests_running", lab, te, run, "gauge")
            put("vllm:num_requests_waiting", lab, te, wait, "gauge")
            put("vllm:kv_cache_usage_perc" if cfg.version == "V1" else "vllm:gpu_cache_usage_perc", lab, te,
                kvv, "gauge")
            off = cfg.uptime_s
            pre_inc = rng.poisson(np.maximum(st["pre"], 0) / 60 * self.dt) / self.dt
            pre_c = seg_cum(pre_inc, te, st["pre"][0] / 60 * off * 0.5)
            if spike and spike[0] == e and spike[1] == "preemptions" and te.size:
                k = int(spike[2] * (te.size - 1))
                pre_c[k:] += spike[3]
            put("vllm:num_preemptions_total", lab, te, np.floor(pre_c), "counter")
            put("vllm:generation_tokens_total", lab, te,
                np.floor(seg_cum(st["tps"], te, st["tps"][:50].mean() * off)), "counter")
            put("vllm:prompt_tokens_total", lab, te,
                np.floor(seg_cum(st["comp"] * st["P"], te, (st["comp"] * st["P"])[:50].mean() * off)), "counter")
            for reason, share in (("stop", 0.82), ("length", 0.17), ("abort", 0.01)):
                put("vllm:request_success_total", {**lab, "finished_reason": reason}, te,
                    np.floor(seg_cum(st["comp"] * share, te, st["comp"][:50].mean() * share * off)), "counter")
            # TTFT: most requests are admitted at once (prefill time); a share waits in the queue
            R, W = st["R"], st["W"]
            tpf = 0.02 + st["P"] / float(rng.uniform(6000, 20000)) / np.maximum(self.speed_mult[e], 0.2)
            q = np.where(W > 0.5, np.clip(W / (W + R + 1), 0.01, 0.95), 0.0)
            wq = np.maximum(1.0, W / np.maximum(st["lam"], 1e-3))
            sf, ss = 0.45, 0.7
            le = np.array(TTFT_LE)
            cdf = ((1 - q)[:, None] * ndtr((np.log(le)[None, :] - np.log(tpf)[:, None] + sf * sf / 2) / sf)
                   + q[:, None] * ndtr((np.log(le)[None, :] - np.log(wq)[:, None] + ss * ss / 2) / ss))
            n_arr = st["adm"] * st["up"]
            self._hist(put, "vllm:time_to_first_token_seconds", lab, te, n_arr, cdf, le,
                       n_arr * ((1 - q) * tpf + q * wq), seg_cum, off)
            for hname, mean, sig in (("vllm:request_prompt_tokens", st["P"], cfg.prompt_sigma),
                                     ("vllm:request_generation_tokens", st["G"], cfg.gen_sigma)):
                le_t = np.array(TOK_LE, float)
                cdf = ndtr((np.log(le_t)[None, :] - np.log(mean)[:, None] + sig * sig / 2) / sig)
                self._hist(put, hname, lab, te, st["comp"], cdf, le_t, st["comp"] * mean, seg_cum, off)
            cc = {"block_size": str(cfg.block_size), "gpu_memory_utilization": str(cfg.gmu),
                  "num_gpu_blocks": str(cfg.num_gpu_blocks), "cache_dtype": "auto", "swap_space": "4.0",
                  "enable_prefix_caching": "True" if cfg.version == "V1" else "False"}
            if cfg.version == "V1":
                cc["engine"] = cfg.engine_label
            put("vllm:cache_config_info", cc, te, np.ones(te.size), "gauge")

        # ---- GPUs (busy-ness from the engine that owns each GPU)
        owner = {g: cfg for cfg in self.engines for g in cfg.gpus}
        for g in range(self.n_gpus):
            cfg = owner[g]
            st = self.eng_state[cfg.idx]
            R = st["R"]
            busy = 1 - np.exp(-R / 1.5)
            umax = rng.uniform(0.84, 0.95)
            util = np.clip(umax * busy * self.util_mult[g], 0, 1)
            idle = R < 0.5
            pc = self.power_cap_share[g]
            capdip = np.where(rng.random(self.M) < pc, rng.uniform(0.93, 0.98), 1.0) if pc > 0 else 1.0
            clk_busy = self.max_mhz * rng.uniform(0.97, 1.0) * capdip * self.clock_mult[g]
            clk = np.where(idle, 210.0, clk_busy) * (1 + rng.normal(0, 0.004, self.M))
            temp = (32 + rng.uniform(30, 45) * util + self.temp_add[g]) + rng.normal(0, 0.7, self.M)
            power = 60 + (self.tdp - 60) * util * np.minimum(1, self.clock_mult[g]) * rng.uniform(0.8, 0.95)
            # memory: vLLM pre-allocates; the allocator's reserved sits flat near the budget
            T = self.total_bytes
            ctx, nontorch = rng.uniform(0.45, 0.8) * GiB, rng.uniform(0.2, 1.5) * GiB
            res0 = T * cfg.gmu - ctx - nontorch
            f = self.frag[g]
            if f is None:
                fb = rng.uniform(0.02, 0.07)
                f = fb * (1 + 0.25 * (1 - R / cfg.max_num_seqs))  # activations come and go with the batch
            reserved = res0 * (1 + self.reserved_extra_frac[g]) + self.alloc_extra[g] / (1 - np.minimum(f, 0.9))
            allocated = reserved * (1 - f)
            used = np.minimum(ctx + nontorch + reserved, T - 64 * MiB)
            up_g = st["up"]
            used = np.where(up_g, used, ctx * 0.3)
            util = np.where(up_g, util, 0.0)
            tg = ts_g
            sel = lambda a: lat(a, tg)  # noqa: E731
            u_s = np.clip(sel(util) + rng.normal(0, 0.02 + nz / 2, tg.size), 0, 1)
            c_s = sel(clk)
            t_s = sel(temp)
            m_s = sel(used) + rng.normal(0, 8 * MiB, tg.size)
            if spike and spike[1] in ("clock", "temp", "util", "memused") and g == 0 and tg.size:
                k = int(spike[2] * (tg.size - 1))
                if spike[1] == "clock":
                    c_s[k] *= 0.6
                elif spike[1] == "temp":
                    t_s[k] = 94.0
                elif spike[1] == "util":
                    u_s[k] = 0.05
                else:
                    m_s[k] = T - 100 * MiB
            if self.gpu_src == "fragscope":
                lab = {"gpu": str(g), "gpu_uuid": self.uuids[g]}
                put("fragscope_gpu_memory_used_bytes", lab, tg, np.round(m_s), "gauge")
                put("fragscope_gpu_memory_total_bytes", lab, tg, np.full(tg.size, float(T)), "gauge")
                put("fragscope_gpu_memory_free_bytes", lab, tg, T - np.round(m_s), "gauge")
                put("fragscope_gpu_utilization_ratio", lab, tg, np.round(u_s, 2), "gauge")
                put("fragscope_gpu_sm_clock_hertz", lab, tg, np.round(c_s) * 1e6, "gauge")
                put("fragscope_gpu_sm_clock_max_hertz", lab, tg, np.full(tg.size, self.max_mhz * 1e6), "gauge")
                put("fragscope_gpu_temperature_celsius", lab, tg, np.round(t_s), "gauge")
                put("fragscope_gpu_power_watts", lab, tg, np.round(sel(power), 1), "gauge")
                thr = self.throttle_reason[g]
                for rsn in REASONS:
                    v = np.zeros(tg.size)
                    if rsn == "gpu_idle":
                        v = (sel(idle.astype(float)) > 0.5).astype(float)
                    elif rsn == "sw_power_cap" and pc > 0:
                        v = ((rng.random(tg.size) < pc) & (sel(busy) > 0.5)).astype(float)
                    if thr is not None and thr[0] == rsn:
                        act = sel(thr[1])
                        v = np.maximum(v, (act > 0.3) & (rng.random(tg.size) < 0.9))
                    put("fragscope_gpu_throttle_reason_active", {**lab, "reason": rsn}, tg, v, "gauge")
            elif self.gpu_src == "dcgm":
                lab = {"gpu": str(g), "UUID": self.uuids[g], "pci_bus_id": "00000000:%02X:00.0" % (0x18 + g),
                       "device": f"nvidia{g}", "modelName": self.gpu_model, "Hostname": "serving-7f9c-0"}
                usedm = np.round(m_s / MiB)
                fbres = 512.0
                put("DCGM_FI_DEV_FB_USED", lab, tg, usedm, "gauge")
                put("DCGM_FI_DEV_FB_FREE", lab, tg, np.maximum(0, T / MiB - usedm - fbres), "gauge")
                put("DCGM_FI_DEV_FB_RESERVED", lab, tg, np.full(tg.size, fbres), "gauge")
                put("DCGM_FI_DEV_GPU_UTIL", lab, tg, np.round(u_s * 100), "gauge")
                put("DCGM_FI_DEV_SM_CLOCK", lab, tg, np.round(c_s), "gauge")
                put("DCGM_FI_DEV_GPU_TEMP", lab, tg, np.round(t_s), "gauge")
                put("DCGM_FI_DEV_POWER_USAGE", lab, tg, np.round(sel(power), 3), "gauge")
            # ---- allocator probe, one series per (pid, gpu); new pids after a restart
            if self.torch_probe:
                rank = cfg.gpus.index(g)
                for s in range(len(self.restarts) + 1):
                    seg_mask = (self.seg == s) & up_g
                    tt = ts_e[(lat(seg_mask.astype(float), ts_e) > 0.999)]
                    if tt.size == 0:
                        continue
                    lab = {"pid": str(cfg.pid_base + 1000 * s + rank), "gpu": str(g)}
                    nrel = nz / 4
                    r_s = lat(reserved, tt) * (1 + rng.normal(0, nrel / 10, tt.size))
                    a_s = np.minimum(r_s, lat(allocated, tt) * (1 + rng.normal(0, nrel / 3, tt.size)))
                    if spike and spike[1] == "frag" and g == 0 and s == len(self.restarts):
                        k = int(spike[2] * (tt.size - 1))
                        a_s[k] *= 0.7
                    ish = self.inactive_share[g]
                    ish = lat(ish, tt) if ish is not None else rng.uniform(0.005, 0.02)
                    put("fragscope_torch_reserved_bytes", lab, tt, np.round(r_s), "gauge")
                    put("fragscope_torch_allocated_bytes", lab, tt, np.round(a_s), "gauge")
                    put("fragscope_torch_inactive_split_bytes", lab, tt,
                        np.round(r_s * ish * (1 + rng.normal(0, 0.05, tt.size))).clip(0), "gauge")
                    rinc = rng.poisson(self.retries_pm[g] / 60 * self.dt) / self.dt
                    rc = np.cumsum(rinc * self.dt)
                    j0 = int(np.searchsorted(self.t, tt[0]))
                    rc = rc - (rc[j0 - 1] if j0 > 0 else 0.0)
                    rcs = lat(rc, tt)
                    if spike and spike[1] == "retries" and g == 0 and s == len(self.restarts):
                        k = int(spike[2] * (tt.size - 1))
                        rcs[k:] += spike[3]
                    put("fragscope_torch_alloc_retries_total", lab, tt, np.floor(rcs), "counter")
                    oo = np.array([sum(1 for o in self.ooms_at[g] if o <= x) for x in tt], float)
                    put("fragscope_torch_ooms_total", lab, tt, oo, "counter")
            # ---- sparse kernel-timeline captures (some pods profile rank 0 only)
            if self.kernel and (g == 0 or self.kernel_all):
                tk = ts_k[lat(up_g.astype(float), ts_k) > 0.999]
                if tk.size:
                    gm = lat(self.gap_mult[g], tk)
                    base50 = self.gap_p50
                    p50 = base50 * gm * np.exp(rng.normal(0, 0.15, tk.size))
                    p99 = p50 * self.gap_tail * np.exp(rng.normal(0, 0.2, tk.size))
                    idl = np.clip(1 - lat(util, tk) * 1.02 + lat(self.idle_add[g], tk)
                                  + rng.normal(0, 0.02, tk.size), 0, 1)
                    put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.5"}, tk, p50, "summary")
                    put("fragscope_kernel_gap_seconds", {"gpu": str(g), "quantile": "0.99"}, tk, p99, "summary")
                    put("fragscope_gpu_idle_ratio", {"gpu": str(g)}, tk, np.round(idl, 3), "gauge")
        for add in self.extra_cols:  # bench/eval_host.py: host / hardware series, a stall's frozen counters
            add(cols, types, put, ts_e, ts_g)
        return Window.from_columns(cols, source="eval_detectors", types=types)

    def _hist(self, put, name, lab, te, n_per_s, cdf, le, sum_per_s, seg_cum, off):
        if te.size == 0:
            return
        cnt = seg_cum(n_per_s, te, n_per_s[:50].mean() * off)
        for j, b in enumerate(le):
            cb = seg_cum(n_per_s * cdf[:, j], te, (n_per_s * cdf[:, j])[:50].mean() * off)
            put(name + "_bucket", {**lab, "le": repr(float(b)) if isinstance(b, float) else str(b)}, te,
                np.minimum(np.floor(cb), np.floor(cnt)), "histogram")
        put(name + "_bucket", {**lab, "le": "+Inf"}, te, np.floor(cnt), "histogram")
        put(name + "_count", lab, te, np.floor(cnt), "histogram")
        put(name + "_sum", lab, te, seg_cum(sum_per_s, te, sum_per_s[:50].mean() * off), "histogram")


# ---------------------------------------------------------------------------------------------
# families
def lam_for(cfg: EngineCfg, running: float) -> float:
    """Arrival rate (req/s) that keeps ``running`` sequences busy at steady state (Little's law)."""
    return running * cfg.r0 / (1 + running / cfg.h) / cfg.gen_mean


def rho_for_load(cfg: EngineCfg, load: float) -> float:
    """Running batch (share of max_num_seqs) at which demand is ``load`` x full-batch capacity."""
    X = load * lam_for(cfg, cfg.max_num_seqs) * cfg.gen_mean
    return X / (cfg.r0 - X / cfg.h) / cfg.max_num_seqs


def demand_ratio(cfg: EngineCfg, load_of_cap: float) -> float:
    """Demand multiplier taking the baseline (rho of max_num_seqs) to ``load_of_cap`` x full-batch capacity."""
    return load_of_cap * lam_for(cfg, cfg.max_num_seqs) / lam_for(cfg, cfg.rho * cfg.max_num_seqs)


def timing_window(rng, timing: str, dur_s: float):
    """(onset, ramp duration, restart time or None) relative to the window start."""
    if timing == "mid":
        on = rng.uniform(0.3, 0.6) * dur_s
        return on, rng.uniform(0.25, 1.0) * (dur_s - on) + 600, None
    if timing == "underway":
        on = -rng.uniform(0.05, 0.5) * dur_s
        return on, rng.uniform(1.0, 2.0) * dur_s, None
    if timing == "late":
        on = dur_s - rng.uniform(8, 20) * 60
        return on, rng.uniform(5, 30) * 60, None
    if timing == "restart":
        on = rng.uniform(0.15, 0.35) * dur_s
        d = rng.uniform(0.3, 0.45) * dur_s
        return on, d, on + d + rng.uniform(0, 0.05) * dur_s
    raise ValueError(timing)


PRIMARY = {  # the signal group a family cannot be judged without (never removed for that family)
    "allocator-fragmentation": "torch", "memory-leak": "torch|gpu", "clock-throttling": "gpu",
    "launch-bound": "kernel|gpu", **eval_host.PRIMARY,
}


def make_pod(case: Case, rng: np.random.Generator, *, quick: bool) -> Pod:
    p = case.params
    step = p.setdefault("step", float(rng.choice([1, 5, 10, 15, 15, 30, 60])))
    hours_max = 1.5 if step < 5 else (8.0 if not quick else 4.0)
    dur_h = p.setdefault("hours", round(float(rng.uniform(1.5, hours_max)), 2))
    n_gpus = p.setdefault("gpus", max(int(rng.choice([1, 1, 2, 4, 8])), eval_host.MIN_GPUS.get(case.family, 1)))
    n_eng = p.setdefault("engines", 2 if (n_gpus >= 2 and rng.random() < 0.2) else 1)
    version = p.setdefault("vllm", str(rng.choice(["V0", "V1", "V1"])))
    gsrc = p.setdefault("gpu_src", str(rng.choice(["fragscope", "fragscope", "dcgm", "none"])))
    torch_p = p.setdefault("torch", bool(rng.random() < 0.8))
    kern = p.setdefault("kernel", bool(rng.random() < 0.7))
    prim = PRIMARY.get(case.expect or "", "") if case.group != "missing-primary" else ""
    if "torch" in prim and prim != "torch|gpu":
        torch_p = p["torch"] = True
    if prim == "torch|gpu" and not torch_p and gsrc == "none":
        gsrc = p["gpu_src"] = "fragscope"
    if prim == "gpu" and gsrc == "none":
        gsrc = p["gpu_src"] = "fragscope"
    if prim == "kernel|gpu":
        kern = p["kernel"] = True
    noise = p.setdefault("noise", float(rng.choice([0.01, 0.04, 0.1])))
    burst = p.setdefault("burst", float(rng.choice([0.2, 0.5, 1.0])))
    pod = Pod(rng, duration_s=dur_h * 3600, step=step, n_gpus=n_gpus, n_engines=n_eng, version=version,
              gpu_src=None if gsrc == "none" else gsrc, torch_probe=torch_p, kernel=kern, noise=noise,
              burst=burst)
    pod.kernel_all = bool(rng.random() < 0.6)
    pod.gap_p50 = float(rng.uniform(25e-6, 60e-6))
    pod.gap_tail = float(rng.uniform(5, 15))
    return pod


def apply_family(case: Case, pod: Pod, rng: np.random.Generator):
    fam, p = case.family, case.params
    D = pod.duration
    t = pod.t
    e0 = pod.engines[0]
    g0 = e0.gpus
    for e in range(len(pod.engines)):
        pod.demand_mult[e] = pod.traffic(wave_amp=float(rng.uniform(0.0, 0.15)))
    timing = case.timing
    if timing != "-":
        on, rd, rs = timing_window(rng, timing, D)
        on_abs, rs_abs = pod.start + on, (pod.start + rs if rs is not None else None)
        p.update(onset_min=round(on / 60), ramp_min=round(rd / 60))
        if rs_abs is not None and rs_abs < pod.start + D - 600:
            pod.restarts.append(rs_abs)
            p["restart_min"] = round(rs / 60)
        else:
            rs_abs = None
    shape = p.setdefault("shape", str(rng.choice(["step", "linear", "sigmoid", "sawtooth"]))) \
        if timing != "-" else None

    def G(sh=None, **kw):
        g = ramp(sh or shape, t, on_abs, rd, **kw)
        if rs_abs is not None:
            g = np.where(t >= rs_abs, 0.0, g)
        return g

    m = p.setdefault("mag", round(float(rng.choice([0.3, 0.6, 1.0, 1.0, 1.5])), 2))

    if fam == "allocator-fragmentation":
        g = G(period=float(rng.uniform(600, 2400)))
        e0.rho = float(rng.uniform(0.5, 0.75))  # seed: batch ~128 near the cap at baseline
        e0.load = 0.0
        for gi in g0:
            f0 = float(rng.uniform(0.03, 0.08))
            spread = float(rng.uniform(0.7, 1.1)) if gi != g0[0] else 1.0
            f = f0 + 0.30 * m * spread * g
            pod.frag[gi] = np.clip(f + rng.normal(0, 0.002, pod.M), 0, 0.95)
            pod.inactive_share[gi] = np.clip(0.01 + 0.7 * (f - f0), 0, 0.9)
            pw = float(rng.uniform(1.0, 2.0))
            pod.retries_pm[gi] = float(rng.uniform(1, 30)) * min(m, 1.2) * g ** pw
            pod.reserved_extra_frac[gi] = float(rng.uniform(0, 0.03)) * g
            pod.gap_mult[gi] = 1 + (2e-3 / 50e-6 * min(m, 1.5) - 1) * g ** 1.5
            if m >= 1.5 and timing in ("mid", "underway"):
                pod.ooms_at[gi] = list(pod.start + D - rng.uniform(60, 900, int(rng.integers(1, 4))))
        pod.bcap_mult[0] = np.maximum(0.1, 1 - 0.75 * min(m, 1.2) * g)  # seed: 128 -> 32
        pod.extra_preempt_pm[0] = float(rng.uniform(100, 400)) * min(m, 1.5) * g ** 2
        p["tp"] = len(g0)
    elif fam == "kv-cache-pressure":
        g = G()
        kind = p.setdefault("cause", str(rng.choice(["longer-prompts", "longer-outputs", "more-requests"])))
        e0.kv_u0 = float(rng.uniform(0.45, 0.7))
        e0.rho = float(rng.uniform(0.3, 0.5))
        e0.load = 0.0
        e0.kv_mode = "tight"
        k = 1 + m * float(rng.uniform(1.0, 2.5))
        if kind == "longer-prompts":
            pod.prompt_mult[0] = 1 + (k - 1) * g
        elif kind == "longer-outputs":
            pod.gen_mult[0] = 1 + (k - 1) * g
            pod.demand_mult[0] = pod.demand_mult[0] / (1 + 0.3 * (k - 1) * g)  # same users, longer answers
        else:
            pod.demand_mult[0] = pod.demand_mult[0] * (1 + (k - 0.5) * g)
        p["kv_x"] = round(k, 2)
    elif fam == "memory-leak":
        p["shape"] = "linear"
        g = G("linear")
        # leak per request (follows cumulative completions) or per unit time
        per_req = p.setdefault("per_request", bool(rng.random() < 0.4))
        tot = pod.total_bytes
        head = (1 - e0.gmu) * tot
        amount = float(rng.uniform(0.03, 0.10)) * tot * float(np.clip(m, 0.5, 1.2))
        oom = p.setdefault("oom_end", bool(rng.random() < 0.35) and timing in ("mid", "underway"))
        if oom:
            amount = head * 1.05
        for gi in g0:
            if per_req:
                lin = g * (1 + 0.2 * np.sin(2 * np.pi * (t - t[0]) / 5400))
                lin = np.maximum.accumulate(lin)
            else:
                lin = g
            pod.alloc_extra[gi] = amount * lin
            if oom:
                full = np.argmax(amount * lin >= head * 0.98)
                if amount * lin[-1] >= head * 0.98:
                    pod.ooms_at[gi] = [float(x) for x in np.linspace(t[full], t[-1], int(rng.integers(1, 5)))]
        p["leak_gib"] = round(amount / GiB, 1)
    elif fam == "clock-throttling":
        sh = p.setdefault("shape", str(rng.choice(["step", "sigmoid", "cycle"])))
        g = G(sh, period=float(rng.uniform(300, 1200)), duty=float(rng.uniform(0.5, 0.8)))
        c = float(rng.uniform(0.55, 0.9)) if m >= 0.6 else float(rng.uniform(0.82, 0.9))
        reason = p.setdefault("reason", str(rng.choice(["hw_thermal_slowdown", "sw_thermal_slowdown",
                                                          "hw_slowdown", "hw_power_brake_slowdown"])))
        e0.rho = float(rng.uniform(0.55, 0.8))
        e0.load = 0.0
        hit = g0 if rng.random() < 0.6 else g0[:1]
        for gi in hit:
            pod.clock_mult[gi] = 1 - (1 - c) * g
            pod.throttle_reason[gi] = (reason, g)
            if "thermal" in reason or reason == "hw_slowdown":
                pod.temp_add[gi] = float(rng.uniform(15, 30)) * g
        pod.speed_mult[0] = (1 - (1 - c) * g) ** pod.tput_alpha
        p.update(clock=round(c, 2), gpus_hit=len(hit))
    elif fam == "launch-bound":
        static = p.setdefault("static", bool(rng.random() < 0.5))
        if static:  # deployed that way (e.g. --enforce-eager): the whole window
            g = np.ones(pod.M)
        else:  # redeployed with eager mode: a restart at onset
            on = float(rng.uniform(0.2, 0.5)) * D
            pod.restarts.append(pod.start + on)
            g = (t >= pod.start + on).astype(float)
            p["restart_min"] = round(on / 60)
        ul = float(rng.uniform(0.3, 0.6))
        e0.rho = float(rng.uniform(0.06, 0.2))
        e0.load = 0.0
        e0.kv_u0 = float(rng.uniform(0.08, 0.3))
        for gi in g0:
            pod.util_mult[gi] = 1 - (1 - ul) * g
            pod.gap_mult[gi] = 1 + (float(rng.uniform(150e-6, 1e-3)) / pod.gap_p50 - 1) * g
        pod.speed_mult[0] = 1 - (1 - ul) * 0.8 * g
        p["util"] = round(ul, 2)
    elif fam == "capacity-saturation":
        g = G()
        e0.load = float(rng.uniform(0.4, 0.6))
        e0.rho = rho_for_load(e0, e0.load)
        e0.kv_mode = "sat"
        over = 1 + 0.3 * m + float(rng.uniform(0.1, 0.4))
        pod.demand_mult[0] = pod.demand_mult[0] * (1 + (demand_ratio(e0, over) - 1) * g)
        p["load_x_cap"] = round(over, 2)
    elif fam == "kv-block-size-mismatch":
        # block sizes the rule would change: above the supported size nearest L/2 (log scale),
        # wasting >= 20 %; a block already near L/2 is rightly left alone (docs/diagnoses.md)
        L = float(rng.uniform(16, 70))
        rec = min((8, 16, 32, 64, 128), key=lambda b: (abs(math.log2(b) - math.log2(max(1.0, L / 2))), b))
        B = int(rng.choice([b for b in (32, 64, 128) if b > rec and (b - 1) / (2 * L + b - 1) >= 0.2] or [128]))
        for cfg in pod.engines:
            cfg.block_size = B
            cfg.prompt_mean, cfg.gen_mean = L * 0.55, L * 0.45
            cfg.r0 = float(rng.uniform(40, 90))
        p.update(avg_len=round(L), block=B, waste=round((B - 1) / (2 * L + B - 1), 2))
    # ---- confounders
    elif fam == "healthy-waves":
        for e in range(len(pod.engines)):
            amp = float(rng.uniform(0.25, 0.6))
            pod.engines[e].load = float(rng.uniform(0.3, 0.7)) / (1 + amp)  # peak within capacity
            pod.demand_mult[e] = pod.traffic(wave_amp=amp)
        p["wave"] = round(amp, 2)
    elif fam in ("surge-within", "surge-beyond"):
        g = G()
        e0.rho = float(rng.uniform(0.25, 0.4))
        e0.load = 0.0
        e0.kv_u0 = float(rng.uniform(0.15, 0.3))
        tgt = float(rng.uniform(0.55, 0.75)) if fam == "surge-within" else float(rng.uniform(1.1, 1.6))
        pod.demand_mult[0] = pod.demand_mult[0] * (1 + (demand_ratio(e0, tgt) - 1) * g)
        p["load_x_cap"] = round(tgt, 2)
    elif fam == "traffic-drop":
        g = G()
        k = float(rng.uniform(0.03, 0.5))
        pod.demand_mult[0] = pod.demand_mult[0] * (1 - (1 - k) * g)
        p["to"] = round(k, 2)
    elif fam == "const-slack":
        for gi in g0:
            pod.frag[gi] = float(rng.uniform(0.25, 0.4)) + rng.normal(0, 0.003, pod.M)
            pod.inactive_share[gi] = np.full(pod.M, float(rng.uniform(0.05, 0.2)))
        p["slack"] = round(float(pod.frag[g0[0]].mean()), 2)
    elif fam == "load-tracking-mem":
        # activations / prefix cache held while load is high, released after: a bump, not a trend
        c = pod.start + rng.uniform(0.35, 0.65) * D
        w = rng.uniform(0.08, 0.2) * D
        bump = np.exp(-0.5 * ((t - c) / w) ** 2)
        e0.rho = float(rng.uniform(0.25, 0.4))
        e0.load = 0.0
        pod.demand_mult[0] = pod.demand_mult[0] * (1 + float(rng.uniform(0.6, 1.2)) * bump)
        amt = float(rng.uniform(0.04, 0.08)) * pod.total_bytes
        for gi in g0:
            pod.alloc_extra[gi] = amt * bump
        p["bump_gib"] = round(amt / GiB, 1)
    elif fam == "power-cap":
        e0.rho = float(rng.uniform(0.4, 0.6))
        e0.load = 0.0
        for gi in range(pod.n_gpus):
            pod.power_cap_share[gi] = float(rng.uniform(0.3, 0.9))
        p["gpu_src"] = pod.gpu_src or "none"
    elif fam == "spike":
        what = p.setdefault("what", str(rng.choice(["waiting", "kv", "running", "preemptions", "clock", "temp",
                                                     "util", "memused", "frag", "retries"])))
        pod.spike = (0, what, float(rng.uniform(0.3, 0.97)), float(rng.choice([50, 200, 500])))
    elif fam == "frag-no-probe":  # fragmentation with the allocator probe absent: expect inconclusive
        g = G()
        pod.bcap_mult[0] = np.maximum(0.1, 1 - 0.75 * g)
        pod.extra_preempt_pm[0] = 200.0 * g ** 2
        for gi in g0:
            pod.gap_mult[gi] = 1 + 39 * g ** 1.5
    # every case: the container / host / hardware series, and the families beyond the GPU's memory; a random
    # generator of their own, so the draws (and figures) of the families above are what they were
    eval_host.apply(case, pod, np.random.default_rng([case.seed, 24]), G)


FAMILIES = [  # family, expected id, timings, group
    ("allocator-fragmentation", "allocator-fragmentation", ("mid", "underway", "late", "restart"), ""),
    ("kv-cache-pressure", "kv-cache-pressure", ("mid", "underway", "late", "restart"), ""),
    ("memory-leak", "memory-leak", ("mid", "underway", "late", "restart"), ""),
    ("clock-throttling", "clock-throttling", ("mid", "underway", "late", "restart"), ""),
    ("launch-bound", "launch-bound", ("-",), ""),
    ("capacity-saturation", "capacity-saturation", ("mid", "underway", "late"), ""),
    ("kv-block-size-mismatch", "kv-block-size-mismatch", ("-",), ""),
    ("healthy-waves", None, ("-",), "confounder"),
    ("surge-within", None, ("mid", "underway", "late"), "confounder"),
    ("traffic-drop", None, ("mid", "late"), "confounder"),
    ("const-slack", None, ("-",), "confounder"),
    ("load-tracking-mem", None, ("-",), "confounder"),
    ("power-cap", None, ("-",), "confounder"),
    ("spike", None, ("-",), "confounder"),
    ("surge-beyond", "capacity-saturation", ("mid", "underway"), "debatable"),
    ("frag-no-probe", "allocator-fragmentation", ("mid",), "missing-primary"),
    *eval_host.FAMILIES,  # beyond the GPU's memory (bench/eval_host.py)
]


# A second diagnosis that is right beside the expected one, with its own independent condition.
# kv-pool-undersized (issue 16): the pool runs out of blocks while the GPU keeps memory the utilization
# budget never hands out. The synthesizer's pods keep 1 - gmu of the GPU (5-15 %) outside the budget; the
# detector recommends a change once the headroom exceeds its margin (max(0.5 GiB, 2 %)) plus a 1 % step
# (docs/sizing.md), so the companion is right where the exported peak used memory leaves > 3 % free.
COMPANION_HEADROOM_RATIO = 0.03


def peak_used_ratio(w: Window) -> float | None:
    """The highest used/total over every GPU, from whichever memory series the pod exported
    (fragscope's bytes, or DCGM's MiB where total = used + free + reserved)."""
    per: dict[tuple[str, str], float] = {}
    for k, s in w.series.items():
        if len(s):
            per[(k.name, dict(k.labels).get("gpu", ""))] = float(np.nanmax(s.values))
    ratios = []
    for (name, g), used in per.items():
        if name == "fragscope_gpu_memory_used_bytes" and per.get(("fragscope_gpu_memory_total_bytes", g)):
            ratios.append(used / per[("fragscope_gpu_memory_total_bytes", g)])
        elif name == "DCGM_FI_DEV_FB_USED":
            free = min(w.series[k].values.min() for k in w.series if k.name == "DCGM_FI_DEV_FB_FREE"
                       and dict(k.labels).get("gpu", "") == g and len(w.series[k]))
            res = per.get(("DCGM_FI_DEV_FB_RESERVED", g), 0.0)
            ratios.append(used / (used + free + res))
    return max(ratios) if ratios else None


def companions(case: Case) -> set[str]:
    if case.expect == "rank-straggler":
        out = set()
        if 1 - case.params.get("gap", 0.0) <= 0.82:
            # the slow rank's clock below ~80 % of the product's maximum: clock-throttling's level rule
            out.add("clock-throttling")
        if case.params.get("cause") == "pcie":
            out.add("gpu-hardware-fault")  # its PCIe link below its maximum under load: a hardware fault too
        return out
    if case.expect == "clock-throttling" and case.params.get("gpus", 1) > case.params.get("gpus_hit", 0) >= 1:
        # one rank throttled among busy peers is the slow rank too (rank-straggler names it when no reason or
        # heat is visible: dcgm-exporter exports no clock reason)
        return {"rank-straggler"}
    if case.expect == "kv-cache-pressure" and case.window is not None:
        r = peak_used_ratio(case.window)
        if r is not None and 1 - r > COMPANION_HEADROOM_RATIO:
            return {"kv-pool-undersized"}
    return set()


def run_case(case: Case, quick: bool):
    rng = np.random.default_rng(case.seed)
    if case.family == "frag-no-probe":
        case.params["torch"] = False
    pod = make_pod(case, rng, quick=quick)
    apply_family(case, pod, rng)
    pod.simulate()
    w = pod.export()
    t = time.perf_counter()
    rep = diagnose(w)
    case.window = w
    return rep, time.perf_counter() - t, pod


# Cold cases (issue 10): the last minutes of each incident, and one scrape, judged without history.
# Level-type incidents must be found from the present state; trend-type ones (a leak) must be
# inconclusive with the reason; healthy windows and confounders must stay quiet.
COLD_VIEWS = (("last 5 min", 300.0), ("last 1 min", 60.0), ("one scrape", 0.0), ("steady 1 h", 3600.0))
STEADY = "steady 1 h"  # the last hour, judged only where the incident was at full strength for all of it
LEVEL_TYPE = ("allocator-fragmentation", "kv-cache-pressure", "clock-throttling", "capacity-saturation",
              "launch-bound", "kv-block-size-mismatch")
TREND_TYPE = ("memory-leak",)


def cold_views(w: Window):
    for name, secs in COLD_VIEWS:
        if secs > 0:
            yield name, w.between(w.end - secs, w.end)
        else:
            # the last sample of every series, as one curl of /metrics holds it
            out = {}
            for k, s in w.series.items():
                if len(s):
                    out[k] = s.between(float(s.ts[-1]), float(s.ts[-1]))
            yield name, Window(out, w.end, w.end, source="one scrape")


# ---------------------------------------------------------------------------------------------
# early warning on the seed's regression
def early_warning(seed: int, variant: dict, checkpoints_min: list[int]):
    """Seed regression: 2 h healthy, then 6 h of 5 % -> 35 % fragmentation, batch 128 -> 32.

    Returns (minutes to first warning, tok/s drop then, minutes to first finding at any severity)."""
    rng = np.random.default_rng(seed)
    case = Case("allocator-fragmentation", "allocator-fragmentation", seed, "-",
                params=dict(step=variant["step"], hours=8.0, gpus=variant["gpus"], engines=1,
                            vllm="V1", gpu_src="fragscope", torch=True, kernel=True,
                            noise=variant["noise"], burst=variant["burst"]))
    pod = make_pod(case, rng, quick=False)
    pod.kernel_all = True
    e0 = pod.engines[0]
    e0.max_num_seqs, e0.rho, e0.load = 128, 0.93, 0.0  # the batch fills its cap of 128 at baseline
    e0.r0, e0.h = 9.4 * (1 + 128 / 512), 512.0  # ~1,200 tok/s at batch 128
    for e in range(len(pod.engines)):
        pod.demand_mult[e] = pod.traffic(wave_amp=0.0)
    onset = pod.start + 2 * 3600
    g = ramp(variant["shape"], pod.t, onset, 6 * 3600)
    for gi in e0.gpus:
        pod.frag[gi] = np.clip(0.05 + 0.30 * g + rng.normal(0, 0.002, pod.M), 0, 1)
        pod.inactive_share[gi] = 0.01 + 0.7 * 0.30 * g
        pod.retries_pm[gi] = 20.0 * g ** 1.5
        pod.gap_mult[gi] = 1 + (2e-3 / pod.gap_p50 - 1) * g ** 1.5
    pod.gap_p50 = 50e-6
    pod.bcap_mult[0] = 1 - 0.75 * g  # 128 -> 32
    pod.extra_preempt_pm[0] = 300.0 * g ** 2
    pod.simulate()
    w = pod.export()
    base = float(np.median(pod.truth_tps[(pod.t > onset - 3600) & (pod.t < onset)]))
    first_warn = first_any = None
    drop = None
    for k in checkpoints_min:
        end = onset + k * 60
        rep = diagnose(w.between(w.start, end))
        f = [x for x in rep.findings if x.id == "allocator-fragmentation"]
        if f and first_any is None:
            first_any = k
        if f and f[0].severity.rank >= 1:
            first_warn = k
            now = float(np.median(pod.truth_tps[(pod.t > end - 300) & (pod.t <= end)]))
            drop = 1 - now / base
            frag_now = 0.05 + 0.30 * float(ramp(variant["shape"], np.array([end]), onset, 6 * 3600)[0])
            break
    else:
        frag_now = math.nan
    return first_warn, drop, first_any, base, frag_now


# ---------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter windows (~30 s)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--per-family", type=int, default=None)
    ap.add_argument("--only", default=None, help="run one family")
    ap.add_argument("--verbose", action="store_true", help="print evidence of failing cases")
    ap.add_argument("--no-early", action="store_true")
    ap.add_argument("--cold", action="store_true", help="also judge the last 5 min, 1 min and one scrape of each case")
    ap.add_argument("--no-artefacts", action="store_true", help="skip the Triton / ONNX Runtime artefact families")
    a = ap.parse_args()
    per = a.per_family or (8 if a.quick else 36)
    t_start = time.perf_counter()
    ss = np.random.SeedSequence(a.seed)
    cases: list[Case] = []
    for fi, (fam, exp, timings, grp) in enumerate(FAMILIES):
        if a.only and fam != a.only:
            continue
        seeds = ss.spawn(1)[0].generate_state(per)
        for i in range(per):
            cases.append(Case(fam, exp, int(seeds[i]), timings[i % len(timings)], grp))

    rows: dict[str, dict] = {}
    cold_rows: dict = collections.defaultdict(lambda: collections.Counter())
    cold_fails: list = []
    by_timing: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    fails = []
    diag_times = []
    for c in cases:
        try:
            rep, dt, pod = run_case(c, a.quick)
        except Exception as exc:  # a crash in the detectors is a result too
            fails.append((c, f"CRASH {type(exc).__name__}: {exc}", []))
            r = rows.setdefault(c.family, _row(c))
            r["n"] += 1
            r["crash"] += 1
            continue
        diag_times.append(dt)
        r = rows.setdefault(c.family, _row(c))
        r["n"] += 1
        found = {f.id: f for f in rep.findings}
        hit = c.expect is not None and c.expect in found
        if hit:
            r["hit"] += 1
            r["sev"][found[c.expect].severity.value] += 1
        comp = companions(c)
        for f in rep.findings:
            if f.id in comp:
                r["companion"][f.id] += 1
        others = [f for f in rep.findings if f.id != c.expect and f.id not in comp]
        for f in others:
            r["fp"][f.id] += 1
            if f.severity.rank >= 1:
                r["fp_warn"] += 1
        inc_ok = False
        if c.family == "frag-no-probe":  # a 'suspected' finding or an inconclusive entry are both right
            inc_ok = not hit and any(i.id == "allocator-fragmentation" for i in rep.inconclusive)
            r["inconcl"] += inc_ok
        if c.timing != "-" and c.expect:
            bt = by_timing[(c.family, c.timing)]
            bt[0] += hit
            bt[1] += 1
        if (c.expect and not hit and not inc_ok) or others:
            fails.append((c, "", rep.findings))
        if a.cold:
            _cold_case(c, cold_rows, cold_fails)
        c.window = None

    # ---- table
    print(f"fragscope detector evaluation (independent synthesizer), seed {a.seed}, "
          f"{len(cases)} cases, {'quick' if a.quick else 'full'}")
    print()
    hdr = f"{'family':26s} {'expect':24s} {'n':>3s} {'hit':>4s} {'info':>4s} {'warn':>4s} {'crit':>4s} " \
          f"{'FP':>3s} {'FP>=w':>5s}  other ids reported"
    print(hdr)
    print("-" * len(hdr))
    for fam, exp, _, grp in FAMILIES:
        if fam not in rows:
            continue
        r = rows[fam]
        fp_n = sum(r["fp"].values())
        others = ", ".join(f"{k}:{v}" for k, v in sorted(r["fp"].items(), key=lambda x: (-x[1], x[0]))) or "-"
        tag = f" [{grp}]" if grp else ""
        hit = f"{r['hit']:>4d}" if exp else "   -"
        extra = f" (+ inconclusive: {r['inconcl']})" if fam == "frag-no-probe" else ""
        extra += f" CRASH:{r['crash']}" if r["crash"] else ""
        extra += "".join(f" (+ {k} where the GPU kept headroom: {v})" if k == "kv-pool-undersized" else
                         f" (+ {k} beside it, right by its own rule: {v})" for k, v in r["companion"].items())
        print(f"{fam + tag:26s} {str(exp or '(nothing)'):24s} {r['n']:>3d} {hit} {r['sev']['info']:>4d} "
              f"{r['sev']['warning']:>4d} {r['sev']['critical']:>4d} {fp_n:>3d} {r['fp_warn']:>5d}  {others}{extra}")
    print()
    if by_timing:
        print("detection by timing (hit/n):")
        fams = sorted({k[0] for k in by_timing}, key=lambda x: [f[0] for f in FAMILIES].index(x))
        for fam in fams:
            cells = [f"{tm}={by_timing[(fam, tm)][0]}/{by_timing[(fam, tm)][1]}"
                     for tm in ("mid", "underway", "late", "restart") if (fam, tm) in by_timing]
            print(f"  {fam:26s} " + "  ".join(cells))
        print()

    if not a.no_artefacts:
        from eval_engines import report as artefact_report  # bench/eval_engines.py, beside this script
        artefact_report(per, a.seed, a.only)

    # ---- early warning
    if not a.no_early and (not a.only or a.only == "allocator-fragmentation"):
        cps = [5, 10, 15, 20, 30, 45, 60, 90, 120, 180] if a.quick else \
            [5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 90, 120, 150, 180, 240, 300, 360]
        variants = [dict(shape="linear", step=15.0, gpus=1, noise=0.04, burst=0.5),
                    dict(shape="linear", step=60.0, gpus=4, noise=0.04, burst=0.5)]
        if not a.quick:
            variants += [dict(shape="linear", step=5.0, gpus=1, noise=0.01, burst=0.2),
                         dict(shape="linear", step=15.0, gpus=2, noise=0.1, burst=1.0),
                         dict(shape="sigmoid", step=15.0, gpus=1, noise=0.04, burst=0.5),
                         dict(shape="sigmoid", step=30.0, gpus=8, noise=0.1, burst=1.0)]
        print("early warning, seed regression (2 h healthy, then 6 h: frag 5 % -> 35 %, batch 128 -> 32, "
              "~1,200 -> 300 tok/s); goal: warning <= 15 min, drop < 50 %")
        for i, v in enumerate(variants):
            fw, drop, fa, base, fr = early_warning(a.seed * 1000 + i, v, cps)
            vs = f"{v['shape']:7s} step {v['step']:>4.0f}s gpus {v['gpus']} noise {v['noise']} burst {v['burst']}"
            if fw is None:
                print(f"  {vs}: no warning within {cps[-1]} min (first finding at any severity: {fa})")
            else:
                ok = "OK " if fw <= 15 and drop < 0.5 else "LATE"
                print(f"  {vs}: {ok} warning at +{fw} min, throughput down {drop * 100:.0f} % "
                      f"(baseline {base:.0f} tok/s), fragmentation then {fr * 100:.1f} %; any severity first at +{fa} min")
        print("  (checkpoints, minutes after onset: " + ",".join(map(str, cps)) + ")")
        print()

    if a.cold:
        _print_cold(cold_rows, cold_fails)

    # ---- failing cases
    print(f"failing cases ({len(fails)}):")
    for c, crash, findings in fails:
        ps = " ".join(f"{k}={v}" for k, v in c.params.items())
        print(f"- {c.family} [{c.timing}] seed={c.seed} {ps}")
        if crash:
            print(f"    {crash}")
            continue
        got = ", ".join(f"{f.id}({f.severity.value},{f.confidence:.2f})" for f in findings) or "nothing"
        print(f"    expected {c.expect or 'nothing'}; reported {got}")
        for f in findings:
            if f.id != c.expect:
                print(f"    {f.id}: {f.summary[:260]}")
                if a.verbose:
                    for ev in f.evidence:
                        print(f"       {'+' if ev.agrees else '-'} {ev.signal}: {ev.observed} vs {ev.baseline} "
                              f"(thr {ev.threshold}) {ev.note[:100]}")
    print()
    tot = time.perf_counter() - t_start
    print(f"time: {tot:.1f} s total; diagnose median {np.median(diag_times) * 1000:.0f} ms, "
          f"max {max(diag_times) * 1000:.0f} ms per window" if diag_times else f"time: {tot:.1f} s")
    return 0


def _cold_case(c: Case, rows, fails) -> None:
    """Judge the case's cold views. The expectation: the incident is present at the window's end unless
    a restart ended it (timing 'restart'), or it is a trend-type diagnosis."""
    w = c.window
    present = c.expect is not None and c.timing != "restart"
    p = c.params
    steady_ok = ("onset_min" in p and "ramp_min" in p and "hours" in p
                 and p["onset_min"] + p["ramp_min"] <= p["hours"] * 60 - 60)
    for view, cw in cold_views(w):
        if view == STEADY and (c.expect is not None and not steady_ok):
            continue  # the hour is not wholly inside the incident
        rep = diagnose(cw)
        r = rows[(c.family, view)]
        r["n"] += 1
        ids = {f.id for f in rep.findings}
        if present and c.expect in LEVEL_TYPE:
            r["expect"] += 1
            r["hit"] += c.expect in ids
            if c.expect not in ids:
                fails.append((c, view, rep))
        elif present and c.expect in TREND_TYPE:
            r["expect"] += 1
            inc = [i for i in rep.inconclusive if i.id == c.expect]
            ok = c.expect in ids or bool(inc and inc[0].reason)
            r["inconclusive"] += ok and c.expect not in ids
            r["hit"] += c.expect in ids
            if not ok:
                fails.append((c, view, rep))
        extra = {f.id for f in rep.findings if f.id != c.expect and f.id not in companions(c)
                 and f.severity.rank >= 1}
        if c.expect is None or c.timing == "restart":
            extra = {f.id for f in rep.findings if f.severity.rank >= 1}
        r["fp_warn"] += bool(extra)
        for x in extra:
            r["fp:" + x] += 1


def _print_cold(rows, fails) -> None:
    print("cold views (no history): the last 5 min, the last 1 min, one scrape of every case")
    hdr = f"{'family':26s} {'view':11s} {'n':>3s} {'expected':>8s} {'found':>5s} {'inconcl':>7s} {'FP>=w':>5s}  other ids"
    print(hdr)
    print("-" * len(hdr))
    for (fam, view), r in sorted(rows.items(), key=lambda kv: ([f[0] for f in FAMILIES].index(kv[0][0]),
                                                              [v[0] for v in COLD_VIEWS].index(kv[0][1]))):
        others = ", ".join(f"{k[3:]}:{v}" for k, v in sorted(r.items()) if k.startswith("fp:")) or "-"
        print(f"{fam:26s} {view:11s} {r['n']:>3d} {r['expect']:>8d} {r['hit']:>5d} {r['inconclusive']:>7d} "
              f"{r['fp_warn']:>5d}  {others}")
    print(f"cold misses ({len(fails)}), first 20:")
    for c, view, rep in fails[:20]:
        ps = " ".join(f"{k}={v}" for k, v in c.params.items())
        print(f"- {c.family} [{c.timing}] {view}: seed={c.seed} {ps}")
    print()


def _row(c: Case) -> dict:
    return dict(n=0, hit=0, sev=collections.Counter(), fp=collections.Counter(), fp_warn=0, inconcl=0, crash=0,
                companion=collections.Counter())


if __name__ == "__main__":
    sys.exit(main())
