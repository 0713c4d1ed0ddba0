"""Kernel-timeline pipeline: read a trace file (collectors) -> analyse -> judge (detectors).

The one place that joins file reading to the pure timeline detectors; used by ``diagnose trace`` and the
agent's capture feature. Contract: docs/trace.md.
"""
from __future__ import annotations

from .collectors.trace_format import read_trace
from .detectors.timeline import Config, analyse, judge
from .model import Finding


def analyse_trace_file(path: str, cfg: Config = Config()) -> tuple[dict, list[Finding]]:
    """Read a trace (nsys SQLite or Kineto JSON, by content), analyse it and judge it.

    Returns the analysis dict (``inconclusive`` included) and the findings. Raises
    :class:`~fragscope.timeline_model.TraceError` (one line) on bad input."""
    tl = read_trace(path)
    a = analyse(tl, cfg)
    findings, inconclusive = judge(a, cfg)
    a["inconclusive"] = [i.to_dict() for i in inconclusive]
    return a, findings
