"""The vLLM engine model's reference figures and small mechanisms shared by the simulator's stages:
the operating point, vLLM's bucket boundaries, pathology ramps, the batch a token rate needs, and
cumulative counters that restart with the engine."""
from __future__ import annotations

import math

import numpy as np

from ..kvbudget import GIB
from .spec import Scenario


# --- reference operating point (the fragmentation reference case) ---------------------
V0_TOK_S = 11.75  # per-sequence decode speed at batch -> 0 (tokens/s)
K_BATCH = 512.0  # batch at which per-sequence speed halves: v(R) = V0 / (1 + R / K)
REF_GEN_TOK_S = 1203.0  # generation tokens/s at load 1 (batch ~128 at 9.4 tok/s/seq)
PROMPT_LEN, GEN_LEN = 512.0, 256.0  # mean tokens per request by default (avg_seq_len 768)
TIMEOUT_S = 120.0  # clients abandon queued requests after about this long
CTX_BYTES = int(1.1 * GIB)  # CUDA context + NCCL + non-torch memory per GPU
MAX_CLOCK_MHZ = 1980.0  # H100 SXM max SM clock
KERNEL_EVERY_S = 600.0  # one trace capture every 10 minutes
MODEL_LEN = 8192

# vLLM V1 TTFT buckets (vllm/v1/metrics/loggers.py; same as the cncf scrape); V0 stopped at 10 s.
TTFT_BUCKETS_V1 = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TTFT_BUCKETS_V0 = TTFT_BUCKETS_V1[:16]
# build_1_2_5_buckets(max_model_len=8192)
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
FINISHED_REASONS_V1 = ("stop", "length", "abort", "error", "repetition")
FINISHED_REASONS_V0 = ("stop", "length", "abort")
THROTTLE_LABELS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                   "hw_power_brake_slowdown")

_erf = np.frompyfunc(math.erf, 1, 1)


def lognorm_cdf(x: float, median: np.ndarray, sigma: float) -> np.ndarray:
    z = (math.log(x) - np.log(np.maximum(median, 1e-12))) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + _erf(z).astype(np.float64))


def ramp(s: Scenario, rel: np.ndarray, onset: float) -> np.ndarray:
    """Pathology progress 0..1 after onset (linear, exponential or a step)."""
    ramp_s = s.ramp_s if s.ramp_s else min(6 * 3600.0, max(s.duration_s - onset, s.step_s))
    x = np.clip((rel - onset) / ramp_s, 0.0, 1.0)
    if s.ramp == "step":
        p = (rel >= onset).astype(np.float64)
    elif s.ramp == "exp":
        k = 4.0
        p = (np.exp(k * x) - 1.0) / (math.exp(k) - 1.0)
    else:
        p = x
    p[rel < onset] = 0.0
    return p


def solve_batch(gen_tok_s: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """Batch R at which R × v(R) = gen_tok_s (inf when unreachable)."""
    x = gen_tok_s / (V0_TOK_S * np.maximum(eff, 1e-6))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(x < K_BATCH * 0.999, x / (1.0 - x / K_BATCH), np.inf)
    return r


def cum_int(x: np.ndarray, segments: list[slice], prehistory: float = 0.0) -> np.ndarray:
    """Cumulative integer counter from non-negative increments, restarting at 0 in each segment.

    ``prehistory`` (steps): the first segment starts where the counter stood after that many steps
    like the first one (the engine ran before the recording began).
    """
    out = np.empty_like(x, dtype=np.float64)
    for j, sl in enumerate(segments):
        c = np.cumsum(np.maximum(x[sl], 0.0))
        if j == 0 and c.size:
            c = c + max(float(x[sl][0]), 0.0) * prehistory
        out[sl] = np.round(c)
    return out


class Run:
    """The simulated run, stage by stage (engine, then GPUs): arrays over the ``n`` samples (per GPU:
    shape (gpus, n)) and the scenario's derived settings, as attributes named like the mechanism's
    variables (R running, W waiting, FIN/ADM/ABT finished/admitted/aborted, GEN generation tokens per
    step; p the pathology's progress 0..1)."""

    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)
