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
    """{reason: [0, increase]} summed over engines, from the labelled counter when present (else {})."""
    out: dict[str, float] = {}
    for name in PREEMPTIONS_BY_REASON:
        for s in window.select(name):
            v = np.asarray(s.values, dtype=float)
            if v.size < 2:
                continue
            d = np.diff(v)
            inc = float(np.where(d >= 0, d, v[1:]).sum())  # a drop is a restart: count from 0 again
            reason = s.key.label("reason") or "unknown"
            out[reason] = out.get(reason, 0.0) + inc
        if out:
            break
    return {k: np.array([0.0, v]) for k, v in out.items()}


def runtime_from_recording(path: str) -> dict:
    """Peaks over the whole recording (raises collectors.exposition.ParseError on a bad file)."""
    window = read_recording(path)
    frame = build_frame(window)
    rt = runtime_from_frame(frame, preemptions_by_reason=preemptions_by_reason(window) or None)
    if np.isfinite(frame.start):
        rt["window"] = [frame.start, frame.end]
    return rt
