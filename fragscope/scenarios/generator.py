"""The scenario simulator: ``generate`` runs its stages in order on one seeded generator — the engine's
fluid queue (engine.py), its GPUs (gpu.py), the exported series (export.py) and the truth (truth.py).
Mechanisms and figures: docs/scenarios.md.
"""
from __future__ import annotations

import numpy as np

from ..model import SeriesKey
from .engine import simulate_engine
from .export import export_columns
from .gpu import simulate_gpus
from .host import stall_engine, stall_gpus
from .spec import Scenario, Truth
from .truth import truth_of


def generate(s: Scenario) -> tuple[dict[SeriesKey, tuple[np.ndarray, np.ndarray]], dict[str, str], Truth]:
    """Simulate ``s``; return columns (sample name + labels -> (ts, values)), sample types, and the truth."""
    rng = np.random.default_rng(s.seed)
    run = simulate_engine(s, rng)
    stall_engine(s, run)
    simulate_gpus(s, rng, run)
    stall_gpus(s, run)
    cols, types = export_columns(s, rng, run)
    return cols, types, truth_of(s, run)
