"""From fetched columns to diagnosed targets: one Window per target with its figures, the detectors
run on each (a failure stays on its target), and the notes both fleet paths add."""
from __future__ import annotations

import time
from typing import Callable, Mapping

import numpy as np

from ..model import Report, SeriesKey, Window
from ..units import iso as _iso
from .grouping import group_targets
from .measures import CORE_SIGNALS, fragmentation, model_of, present_signals, throughput
from .results import FleetTarget


def build_targets(cols: Mapping[SeriesKey, tuple[np.ndarray, np.ndarray]], types: Mapping[str, str],
                  source: str = "") -> list[FleetTarget]:
    """Group fetched columns into targets, each with its Window (no diagnosis yet)."""
    res = []
    for tid, tcols in sorted(group_targets(cols).items()):
        w = Window.from_columns(tcols, source=f"{source} {tid}".strip(), types=types)
        if not len(w):
            continue
        have = present_signals(w.names())
        t = FleetTarget(tid, w, model=model_of(w), throughput=throughput(w), fragmentation=fragmentation(w),
                        missing_signals=[s for s in CORE_SIGNALS if s not in have])
        res.append(t)
    return res


def diagnose_targets(targets: list[FleetTarget], diagnose: Callable[[Window], Report] | None = None) -> float:
    """Run the detectors on each target; a failure is kept on its target, never stops the fleet."""
    if diagnose is None:
        from ..pipeline import diagnose as diagnose  # noqa: PLC0415
    t0 = time.perf_counter()
    for t in targets:
        try:
            t.report = diagnose(t.window)
        except Exception as e:  # one pod's odd data must not hide the rest of the fleet
            t.error = f"detectors failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return time.perf_counter() - t0


def no_series_error(base: str, selector, start: float, end: float) -> Exception:
    """The one-line PrometheusError for a window and selector that match nothing fragscope reads."""
    from ..collectors.prometheus import PrometheusError  # noqa: PLC0415

    sel = f" matching {selector}" if selector else ""
    return PrometheusError(
        f"Prometheus at {base}: no vLLM, GPU or fragscope series{sel} between "
        f"{_iso(start)} and {_iso(end)}; check --selector and --since/--start/--end")


def gpu_only_note(targets: list[FleetTarget]) -> list[str]:
    """A note when some targets have GPU or probe series but no engine series (pod mapping off?)."""
    gpu_only = [str(t.id) for t in targets if t.model is None and not t.missing_signals.count("gpu_memory_used_bytes")]
    if gpu_only and any(t.model for t in targets):
        return [f"{len(gpu_only)} target(s) have GPU or probe series but no serving-engine series "
                     f"({', '.join(gpu_only[:5])}{', ...' if len(gpu_only) > 5 else ''}): is dcgm-exporter's "
                     "Kubernetes pod mapping on?"]
    return []
