"""Which signals the report draws, read from the detectors' canonical Frame (detectors/frame.py).

The Frame already resolves vLLM V0/V1 and DCGM/NVML names, counter resets, rates and TTFT quantiles:
the report draws exactly what the detectors judged, never a second derivation of it.
"""
from __future__ import annotations

import math

import numpy as np

from ..detectors.frame import SLOWDOWN_REASONS, Frame, build_frame
from ..model import Window
from .svg import PALETTE, Chart, Line, Mark, spans_where

MAX_GPU_PANELS = 8  # one memory / clock panel per GPU up to this many (a node has at most 8-16)

# evidence signal names that are not Frame keys: (scope, frame key, factor)
_EVIDENCE_ALIASES = {
    "generation_tokens_per_second": ("engine", "generation_tokens_total", 1.0),
    "preemptions_per_minute": ("engine", "preemptions_total", 60.0),
    "torch_alloc_retries_per_minute": ("gpu", "torch_alloc_retries_total", 60.0),
}


_last: list = [None, None]  # (window, frame): the terminal's sparklines and --html share one build


def frame_of(window: Window | None) -> Frame | None:
    """The detectors' Frame of ``window`` (None for an empty window). The last one is kept, so the
    terminal and the HTML report of one diagnosis build it once (1-2 s for a 160 h, 830 k-point
    window on the 2-core VM)."""
    if window is None or not len(window) or not math.isfinite(window.start):
        return None
    if _last[0] is not window:
        _last[0], _last[1] = window, build_frame(window)
    return _last[1]


def evidence_series(frame: Frame, signal: str, subject: dict | None = None) -> np.ndarray | None:
    """The Frame array behind an evidence row (same units as the evidence), or None."""
    scope, key, factor = _EVIDENCE_ALIASES.get(signal, (None, signal, 1.0))
    gpus = frame.gpus()
    g = (subject or {}).get("gpu")
    if g not in frame.gpu:
        g = gpus[0] if gpus else None
    arr = None
    if scope in (None, "engine"):
        arr = frame.engine.get(key)
    if arr is None and scope in (None, "gpu") and g is not None:
        arr = frame.gpu.get(g, {}).get(key)
    if arr is None or not np.isfinite(arr).any():
        return None
    return arr * factor


def _have(a: np.ndarray | None) -> bool:
    return a is not None and bool(np.isfinite(a).any())


def onset_marks(findings: list[dict]) -> list[Mark]:
    """Each finding's onset (red) and, where the detector gives it apart, when the signal crossed its
    threshold (``threshold_crossed``, dark red, dotted): the cause often starts well before."""
    marks = []
    for f in findings:
        on = f.get("onset")
        if isinstance(on, (int, float)) and math.isfinite(on):
            marks.append(Mark(float(on), f"onset {f.get('id', '')}"))
        tc = f.get("threshold_crossed")
        if isinstance(tc, (int, float)) and math.isfinite(tc) and tc != on:
            marks.append(Mark(float(tc), f"threshold crossed {f.get('id', '')}", "#7b1fa2"))
    return marks


def panels(frame: Frame, findings: list[dict]) -> tuple[list[Chart], list[str]]:
    """The aligned panels, and one line per panel that could not be drawn (and why)."""
    t = frame.t
    e = frame.engine
    gpus = frame.gpus()
    shown = gpus[:MAX_GPU_PANELS]
    marks = onset_marks(findings)
    marks += [Mark(r, "restart", "#7f7f7f") for r in frame.restarts]
    charts: list[Chart] = []
    absent: list[str] = []

    def add(chart: Chart, missing_why: str) -> None:
        if any(_have(ln.v) for ln in chart.lines):
            chart.lines = [ln for ln in chart.lines if _have(ln.v)]
            chart.marks = list(marks)
            charts.append(chart)
        else:
            absent.append(f"{chart.title}: {missing_why}")

    # 1. throughput vs fragmentation
    lines = [Line("generation throughput (tokens/s)", t, e.get("generation_tokens_total"), PALETTE[0])]
    for i, g in enumerate(shown):
        lines.append(Line(f"GPU {g} allocator fragmentation (right axis)", t,
                          frame.gpu[g].get("torch_fragmentation_ratio"), PALETTE[(i + 1) % len(PALETTE)], right=True))
    top = Chart("Throughput vs allocator fragmentation", lines, "tokens/s", "ratio", height=240,
                chart_id="chart-timeline", label_marks=True)
    add(top, "no engine token counter and no allocator gauges in this window")
    # 2. memory per GPU
    for g in shown:
        s = frame.gpu[g]
        add(Chart(f"GPU {g} memory: allocated / reserved (PyTorch) / used (NVML)", [
            Line("allocated (PyTorch)", t, s.get("torch_allocated_bytes"), PALETTE[2]),
            Line("reserved (PyTorch)", t, s.get("torch_reserved_bytes"), PALETTE[1]),
            Line("used (NVML)", t, s.get("gpu_memory_used_bytes"), PALETTE[0]),
            Line("total", t, s.get("gpu_memory_total_bytes"), PALETTE[7], dashed=True),
        ], "bytes", chart_id=f"chart-memory-gpu{g}"), "no NVML or PyTorch allocator memory for this GPU")
    if not gpus:
        absent.append("GPU memory: no GPU signals in this window (NVML, DCGM or the probe)")
    # 3. preemptions and KV usage
    pre = e.get("preemptions_total")
    add(Chart("Preemption rate and KV-cache usage", [
        Line("preemptions (/min)", t, pre * 60.0 if pre is not None else None, PALETTE[1]),
        Line("KV-cache usage (right axis)", t, e.get("kv_cache_usage_ratio"), PALETTE[0], right=True),
    ], "/min", "ratio", chart_id="chart-kv"), "no vLLM preemption counter or KV-cache gauge")
    # 4. queue
    add(Chart("Requests running / waiting", [
        Line("running", t, e.get("requests_running"), PALETTE[2]),
        Line("waiting", t, e.get("requests_waiting"), PALETTE[1]),
    ], "requests", chart_id="chart-requests"), "no vLLM request gauges")
    # 5. TTFT
    add(Chart("Time to first token (5-min windows)", [
        Line("TTFT p50", t, e.get("ttft_p50_seconds"), PALETTE[0]),
        Line("TTFT p99", t, e.get("ttft_p99_seconds"), PALETTE[1]),
    ], "seconds", chart_id="chart-ttft"),
        "the TTFT histogram is there, but quantiles need 5 minutes of it" if "ttft_seconds" in frame.sources
        else "no TTFT histogram (vllm:time_to_first_token_seconds)")
    # 6. kernel gaps
    gap_lines = []
    for i, g in enumerate(shown):
        s = frame.gpu[g]
        gap_lines.append(Line(f"GPU {g} gap p50", t, s.get("kernel_gap_p50_seconds"), PALETTE[(2 * i) % 8]))
        gap_lines.append(Line(f"GPU {g} gap p99", t, s.get("kernel_gap_p99_seconds"), PALETTE[(2 * i + 1) % 8],
                              dashed=True))
    add(Chart("Kernel gaps (trace captures)", gap_lines, "seconds", chart_id="chart-gaps"),
        "no kernel-gap summaries (fragscope_kernel_gap_seconds from trace captures)")
    # 7. clocks, shaded where a slowdown reason was active
    for i, g in enumerate(shown):
        s = frame.gpu[g]
        reasons = frame.throttle.get(g, {})
        bands: list[tuple[float, float]] = []
        active = [r for r in SLOWDOWN_REASONS if r in reasons]
        if active:
            m = np.zeros(t.size, dtype=bool)
            for r in active:
                m |= np.nan_to_num(reasons[r], nan=0.0) > 0.5
            bands = spans_where(t, m)
        add(Chart(f"GPU {g} SM clock", [
            Line("SM clock", t, s.get("gpu_sm_clock_hertz"), PALETTE[0]),
            Line("max SM clock", t, s.get("gpu_sm_clock_max_hertz"), PALETTE[7], dashed=True),
        ], "hertz", bands=bands, band_label="clock slowdown reason active (" + ", ".join(active) + ")",
            chart_id=f"chart-clock-gpu{g}"), "no SM clock for this GPU")
    if len(gpus) > len(shown):
        absent.append(f"{len(gpus) - len(shown)} more GPUs not drawn (first {MAX_GPU_PANELS} shown)")
    return charts, absent
