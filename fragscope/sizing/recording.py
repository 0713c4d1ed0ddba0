"""Run-time evidence from a recording file, for ``fragscope size --recording`` (the only I/O in sizing).

Reads the recording with the collectors' reader, builds the detectors' Frame and summarizes it with
:func:`fragscope.sizing.runtime.runtime_from_frame`. Preemptions by reason come from the labelled
counter recent vLLM exports (PR #58037), read straight from the window because the Frame keeps no labels.
"""
from __future__ import annotations

import numpy as np

from ..collectors.exposition import read_recording
from ..detectors.frame import build_frame
from .runtime import runtime_from_frame

# vLLM >= PR #58037: counter with a `reason` label (kv_full, priority, prefix_cache_reset). Both spellings
# of the family are accepted (text 0.0.4 types counters with `_total`). Belongs in signals.py (issue 9).
PREEMPTIONS_BY_REASON = ("vllm:num_preemptions_by_reason_total", "vllm:num_preemptions_by_reason")


def preemptions_by_reason(window) -> dict[str, np.ndarray]:
    """{reason: cumulative values summed over engines}, from the labelled counter when present."""
    out: dict[str, list] = {}
    for name in PREEMPTIONS_BY_REASON:
        for s in window.select(name):
            reason = s.key.label("reason") or "unknown"
            v = np.asarray(s.values, dtype=float)
            if v.size:
                out.setdefault(reason, []).append(float(v[-1] - v[0]) if np.all(np.diff(v) >= 0) else
                                                  float(np.where(np.diff(v) >= 0, np.diff(v), v[1:]).sum()))
        if out:
            break
    return {k: np.array([0.0, sum(v)]) for k, v in out.items()}


def runtime_from_recording(path: str) -> dict:
    """Peaks over the whole recording (raises collectors.exposition.ParseError on a bad file)."""
    window = read_recording(path)
    frame = build_frame(window)
    rt = runtime_from_frame(frame, preemptions_by_reason=preemptions_by_reason(window) or None)
    if np.isfinite(frame.start):
        rt["window"] = [frame.start, frame.end]
    return rt
