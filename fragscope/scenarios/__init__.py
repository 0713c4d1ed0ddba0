"""Synthetic, mechanism-faithful recordings of a vLLM serving pod, and the artefacts of other engines'
diagnoses (a Triton model's config.pbtxt and scrapes, ONNX Runtime profiles) (docs/scenarios.md).

    from fragscope.scenarios import Scenario, generate, to_window, write_openmetrics
    window, truth = to_window(Scenario(ids.ALLOCATOR_FRAGMENTATION, seed=3))
    case = triton_case(TritonScenario("triton-delay-too-short", seed=3))   # config + scrapes + truth
    case = ort_case(OrtScenario("ort-many-islands", seed=3))               # profile events + log + truth

Used by the tests and benchmarks; the detectors never import it (ground thresholds in mechanisms and
the documented reference figures, not in this generator).
"""
from __future__ import annotations

from typing import IO

from .. import ids
from ..model import Window
from .generator import generate
from .ort import ORT_CONFOUNDERS, ORT_KINDS, ORT_PATHOLOGIES, OrtCase, OrtScenario, ort_case
from .spec import CONFOUNDERS, KINDS, PATHOLOGIES, Scenario, Truth
from .triton import TRITON_CONFOUNDERS, TRITON_KINDS, TRITON_PATHOLOGIES, TritonCase, TritonScenario, triton_case
from .writers import write_columns

# Diagnoses judged from artefacts other than a metrics window (registry source "config" / "trace"):
# id -> (pathology kinds, confounder kinds that must stay quiet). Window diagnoses: PATHOLOGIES.
ARTEFACT_FAMILIES = {
    ids.BATCHING_MISCONFIGURATION: (tuple(TRITON_PATHOLOGIES), TRITON_CONFOUNDERS),
    ids.CPU_FALLBACK: (tuple(ORT_PATHOLOGIES), ORT_CONFOUNDERS),
}

__all__ = ["Scenario", "Truth", "KINDS", "PATHOLOGIES", "CONFOUNDERS", "generate", "to_window",
           "write_openmetrics", "write_prometheus_text", "ARTEFACT_FAMILIES",
           "TritonScenario", "TritonCase", "triton_case", "TRITON_KINDS", "TRITON_PATHOLOGIES", "TRITON_CONFOUNDERS",
           "OrtScenario", "OrtCase", "ort_case", "ORT_KINDS", "ORT_PATHOLOGIES", "ORT_CONFOUNDERS"]


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
