"""The scenario simulator: a fluid model of one vLLM engine and its GPUs, sampled every ``step_s``.

Traffic (requests/s, with a daily wave and AR(1) noise) arrives into a queue; the engine admits
requests up to the tightest of three caps (``max_num_seqs``, the KV blocks that fit, and, under
allocator fragmentation, the batch the allocator can still serve); running requests finish at the
per-sequence decode speed, which falls with batch size, clock throttling and host-bound launches.
Clients give up after ``TIMEOUT_S`` in the queue (aborts). Everything else (KV usage, tokens,
preemptions, TTFT, utilization, allocator state, kernel gaps) is derived from that state with
seeded noise. Mechanisms and figures: docs/scenarios.md.
"""
from __future__ import annotations

import numpy as np

from ..model import SeriesKey
from .engine import simulate_engine
from .export import export_columns
from .gpu import simulate_gpus
from .spec import Scenario, Truth
from .truth import truth_of


def generate(s: Scenario) -> tuple[dict[SeriesKey, tuple[np.ndarray, np.ndarray]], dict[str, str], Truth]:
    """Simulate ``s``; return columns (sample name + labels -> (ts, values)), sample types, and the truth."""
    rng = np.random.default_rng(s.seed)
    run = simulate_engine(s, rng)
    simulate_gpus(s, rng, run)
    cols, types = export_columns(s, rng, run)
    return cols, types, truth_of(s, run)
