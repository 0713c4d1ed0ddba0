"""Kernel-timeline pipeline: read a trace file (collectors) -> analyse -> judge (detectors) -> the
playbooks that fit the trace's workload.

The one place that joins file reading to the pure timeline detectors; used by ``diagnose trace`` and the
agent's capture feature. Contract: docs/trace.md.
"""
from __future__ import annotations

from .collectors.trace_format import read_trace
from .collectors.trace_io import DEFAULT_MAX_JSON_BYTES
from .detectors.timeline import Config, analyse, judge
from .model import Finding
from .trace_playbooks import attach_trace_playbooks


def analyse_trace_file(path: str, cfg: Config = Config(),
                       max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> tuple[dict, list[Finding]]:
    """Read a trace (nsys SQLite or Kineto JSON, by content), analyse it and judge it.

    Returns the analysis dict (``inconclusive`` included) and the findings, with workload-specific
    playbooks attached where the standard one does not fit. Raises
    :class:`~fragscope.timeline_model.TraceError` (one line) on bad input."""
    tl = read_trace(path, max_json_bytes=max_json_bytes)
    a = analyse(tl, cfg)
    findings, inconclusive = judge(a, cfg)
    attach_trace_playbooks(findings, a["workload"]["kind"])
    a["inconclusive"] = [i.to_dict() for i in inconclusive]
    return a, findings
