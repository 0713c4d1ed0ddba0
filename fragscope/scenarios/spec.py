"""Scenario and ground truth: what the generator is asked for, and what a detector should conclude."""
from __future__ import annotations

from dataclasses import dataclass, field
from .. import ids

# Pathologies (diagnosis ids, docs/diagnoses.md) and confounders (healthy-but-changing servers).
PATHOLOGIES = (ids.ALLOCATOR_FRAGMENTATION, ids.KV_CACHE_PRESSURE, ids.MEMORY_LEAK, ids.CLOCK_THROTTLING,
               ids.LAUNCH_BOUND, ids.CAPACITY_SATURATION, ids.KV_BLOCK_SIZE_MISMATCH,
               ids.KV_POOL_UNDERSIZED,  # kv-cache-pressure's mechanism; the GPU keeps headroom (docs/sizing.md)
               # beyond the GPU's memory (scenarios/host.py)
               ids.ENGINE_CPU_STARVED, ids.ENGINE_STALLED, ids.RANK_STRAGGLER, ids.GPU_HARDWARE_FAULT, ids.HOST_MEMORY_PRESSURE)
CONFOUNDERS = (
    "healthy",             # daily-wave traffic, nothing wrong
    "traffic-surge",       # demand rises within capacity: throughput, batch and KV usage rise; no queue
    "traffic-drop",        # demand falls 4x: throughput and batch fall like fragmentation, but nothing waits
    "stable-slack",        # the allocator holds a large but constant reserved-allocated gap; no retries, no decline
    "leak-with-traffic",   # a memory leak while traffic rises (throughput up: still a leak)
    "throttling-with-load",  # clocks throttle during a traffic peak (the queue is not only load)
    # look-alikes of the diagnoses beyond the GPU's memory (scenarios/host.py)
    "rank-idle-by-design",   # one GPU of a multi-GPU pod idles at idle clocks: not a straggler
    "link-idle-downshift",   # PCIe links train down at idle and back up under load: not a fault
    "old-corrected-ecc",     # a few corrected ECC errors and one old uncorrectable in the lifetime count: history
    "page-cache-near-limit",  # container usage at its limit in page cache, working set well below
)
KINDS = PATHOLOGIES + CONFOUNDERS

ENGINES = ("v1", "v0")
GPU_SOURCES = ("fragscope", "dcgm", "none")
RAMPS = ("linear", "exp", "step")
THROTTLE_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap", "hw_power_brake_slowdown")


@dataclass
class Scenario:
    """One synthetic recording of a serving pod (one vLLM engine, tensor-parallel over ``gpus`` GPUs)."""

    kind: str
    duration_s: float = 8 * 3600
    step_s: float = 15
    onset_s: float | None = None  # when the pathology starts (default: a third into the run)
    start_ts: float = 1_767_225_600  # 2026-01-01T00:00:00Z
    gpus: int = 1
    engine: str = "v1"  # "v1": kv_cache_usage_perc, labels model_name+engine | "v0": gpu_cache_usage_perc, model_name
    gpu_source: str = "fragscope"  # "fragscope" (bytes/ratio/hertz) | "dcgm" (MiB/%/MHz) | "none"
    torch_probe: bool = True  # fragscope_torch_* (labels pid, gpu)
    kernel_stats: bool = True  # sparse fragscope_kernel_gap_seconds / fragscope_gpu_idle_ratio
    severity: float = 1.0  # magnitude of the pathology (0.3 mild, 1 the documented reference, 2 extreme; 0 none)
    noise: float = 1.0  # noise multiplier (0: smooth expected values)
    daily_wave: bool = True  # traffic follows a smooth daily wave
    restart_at_s: float | None = None  # engine restart: counters reset to 0, the pathology clears
    drop: tuple[str, ...] = ()  # raw metric names or prefixes to leave out
    block_size: int = 16
    avg_seq_len: int | None = None  # prompt + generation tokens per request (default 768; 32 for block mismatch)
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None  # default: computed with fragscope.kvbudget for Llama-3-8B on 80 GB
    seed: int = 0
    # --- extras (all optional) -------------------------------------------------------------------
    ramp: str = "linear"  # how the pathology grows after onset: linear | exp | step
    ramp_s: float | None = None  # time to full magnitude (default: min(6 h, the rest of the run))
    load: float = 1.0  # traffic multiplier on the reference load (~4.7 req/s, ~1,200 generation tokens/s)
    affected_gpus: tuple[int, ...] | None = None  # GPUs the pathology hits (default: all; throttling: GPU 0)
    throttle_reason: str = "hw_thermal_slowdown"
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    gpu_memory_total_bytes: int = 81559 * 1024 * 1024  # H100 80GB as NVML reports it
    max_num_seqs: int = 256
    uptime_s: float = 6 * 3600  # how long the engine ran before the recording: counters start non-zero

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown scenario kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.gpu_source not in GPU_SOURCES:
            raise ValueError(f"gpu_source must be one of {GPU_SOURCES}, got {self.gpu_source!r}")
        if self.ramp not in RAMPS:
            raise ValueError(f"ramp must be one of {RAMPS}, got {self.ramp!r}")
        if self.throttle_reason not in THROTTLE_REASONS:
            raise ValueError(f"throttle_reason must be one of {THROTTLE_REASONS}")
        if not (self.step_s > 0 and self.duration_s >= self.step_s):
            raise ValueError("need step_s > 0 and duration_s >= step_s")
        if self.gpus < 1:
            raise ValueError("gpus must be >= 1")
        if self.severity < 0 or self.noise < 0:
            raise ValueError("severity and noise must be >= 0")
        if isinstance(self.drop, str):
            self.drop = (self.drop,)
        self.drop = tuple(self.drop)


@dataclass
class Truth:
    """What a correct diagnosis of the scenario says."""

    diagnoses: set[str]  # diagnosis ids that must be reported
    onset_ts: float | None  # when the pathology started (unix seconds); None when there is none
    notes: str
    tolerated: set[str] = field(default_factory=set)  # ids that are defensible extras (never required)
    figures: dict = field(default_factory=dict)  # reference numbers of the generated run (before/after)
    inconclusive: set[str] = field(default_factory=set)  # ids a correct reading reports as inconclusive
