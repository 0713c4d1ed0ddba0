"""The Frame: every signal of a window on one time grid, in base units (what detectors read).

Built by :func:`fragscope.detectors.frame.build_frame`; NaN marks "no data at this time".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap",
                    "hw_power_brake_slowdown")
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")


@dataclass
class Frame:
    t: np.ndarray  # grid timestamps (unix seconds)
    step: float  # seconds between grid points
    scrape_interval: float
    engine: dict[str, np.ndarray] = field(default_factory=dict)
    engine_cum: dict[str, np.ndarray] = field(default_factory=dict)  # cumulative increases (counters)
    gpu: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # gpu -> signal -> values
    gpu_cum: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    throttle: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # gpu -> reason -> 0/1
    config: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels
    sources: dict[str, str] = field(default_factory=dict)  # signal id -> raw metric used
    restarts: list[float] = field(default_factory=list)  # times engine counters reset
    hist_avg: dict[str, float] = field(default_factory=dict)  # e.g. request_prompt_tokens -> mean
    hist_count: dict[str, float] = field(default_factory=dict)  # observations over the window
    engine_generation: str | None = None  # "v1" | "v0" | None
    # Counters' last raw values (summed over series): lifetime totals since each process started,
    # what one scrape can say ("1,234 preemptions since the engine started").
    engine_total: dict[str, float] = field(default_factory=dict)
    gpu_total: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_model: dict[str, str] = field(default_factory=dict)  # gpu -> product name (DCGM modelName label)
    points: int = 0  # samples of the longest series, counted up to 3 (1 = a single scrape)
    hist_lifetime: set[str] = field(default_factory=set)
    # signal id -> the newest raw sample's time: whether a source still answers at the window's end (values
    # in the grid are carried up to three steps past their last sample)
    last_seen: dict[str, float] = field(default_factory=dict)
    last_change: dict[str, float] = field(default_factory=dict)  # counter id -> newest raw sample that moved
    flat_samples: dict[str, int] = field(default_factory=dict)  # counter id -> scrapes since its last move
    # signal id -> pid -> (process name, raw sample times, raw values), for the per-process signals a detector
    # names a process by (frame.PER_PROCESS_RAW): the engine-wide sum in ``engine`` cannot say which
    process_raw: dict[str, dict[str, tuple[str, np.ndarray, np.ndarray]]] = field(default_factory=dict)
    rates_known: bool = True  # False: scrapes without timestamps and no known interval: counts, not rates  # hist_avg taken from lifetime totals (one scrape)

    @property
    def start(self) -> float:
        return float(self.t[0]) if self.t.size else math.nan

    @property
    def end(self) -> float:
        return float(self.t[-1]) if self.t.size else math.nan

    def has_engine(self, sig: str) -> bool:
        a = self.engine.get(sig)
        return a is not None and bool(np.isfinite(a).any())

    def has_gpu(self, gpu: str, sig: str) -> bool:
        a = self.gpu.get(gpu, {}).get(sig)
        return a is not None and bool(np.isfinite(a).any())

    def any_gpu_has(self, sig: str) -> bool:
        return any(self.has_gpu(g, sig) for g in self.gpu)

    def gpus(self) -> list[str]:
        return sorted(self.gpu, key=lambda g: (len(g), g))
