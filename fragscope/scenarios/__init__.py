"""Synthetic, mechanism-faithful recordings of a vLLM serving pod (docs/scenarios.md).

    from fragscope.scenarios import Scenario, generate, to_window, write_openmetrics
    window, truth = to_window(Scenario("allocator-fragmentation", seed=3))

Used by the tests and benchmarks; the detectors never import it (ground thresholds in mechanisms and
the seeds' figures, not in this generator).
"""
from __future__ import annotations

from typing import IO

from ..model import Window
from .generator import generate
from .spec import CONFOUNDERS, KINDS, PATHOLOGIES, Scenario, Truth
from .writers import write_columns

__all__ = ["Scenario", "Truth", "KINDS", "PATHOLOGIES", "CONFOUNDERS", "generate", "to_window",
           "write_openmetrics", "write_prometheus_text"]


def _scenario(s: Scenario | str) -> Scenario:
    return Scenario(s) if isinstance(s, str) else s


def to_window(s: Scenario | str) -> tuple[Window, Truth]:
    """The scenario as a Window (what read_recording would return for its file) and its truth."""
    s = _scenario(s)
    cols, types, truth = generate(s)
    w = Window.from_columns(cols, source=f"scenario:{s.kind}:seed={s.seed}", types=types)
    return w, truth


def write_openmetrics(s: Scenario | str, fh_or_path: str | IO, gzip: bool | None = None) -> Truth:
    """OpenMetrics with timestamps in seconds, ending with ``# EOF`` (promtool backfill input)."""
    s = _scenario(s)
    cols, types, truth = generate(s)
    write_columns(cols, types, fh_or_path, openmetrics=True, gzip=gzip)
    return truth


def write_prometheus_text(s: Scenario | str, fh_or_path: str | IO, gzip: bool | None = None) -> Truth:
    """Prometheus text format 0.0.4 with millisecond timestamps (counters typed with ``_total``)."""
    s = _scenario(s)
    cols, types, truth = generate(s)
    write_columns(cols, types, fh_or_path, openmetrics=False, gzip=gzip)
    return truth
