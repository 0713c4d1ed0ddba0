"""Fleet outliers: targets whose tokens/s or fragmentation differ from peers serving the same model
(modified z-scores, with a floor on the difference that matters in practice)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .results import Outlier

if TYPE_CHECKING:
    from .results import FleetTarget

# Outliers: modified z-score of Iglewicz & Hoaglin (1993), z = 0.6745 (x - median) / MAD, flagged
# beyond 3.5; when MAD is 0 (most peers identical) the mean absolute deviation stands in, scaled by
# 1.2533 (its ratio to sigma under normality). A difference must also matter in practice:
OUTLIER_Z = 3.5
MIN_PEERS = 3  # including the candidate: fewer cannot tell an outlier from a split
THROUGHPUT_MIN_REL_DIFF = 0.20  # 20 % of the peers' median tokens/s
FRAGMENTATION_MIN_ABS_DIFF = 0.05  # 5 points of reserved memory (5 % in healthy serving -> 35 % in the fragmentation reference case)


def robust_z(values: np.ndarray) -> np.ndarray | None:
    """Modified z-scores (MAD, falling back to mean absolute deviation); None when all are equal."""
    med = float(np.median(values))
    dev = np.abs(values - med)
    mad = float(np.median(dev))
    if mad > 0:
        return 0.6745 * (values - med) / mad
    mean_ad = float(dev.mean())
    if mean_ad > 0:
        return (values - med) / (1.253314 * mean_ad)
    return None


def find_outliers(targets: list["FleetTarget"]) -> list[Outlier]:
    """Targets whose throughput or fragmentation differs from peers serving the same model."""
    by_model: dict[str, list[FleetTarget]] = {}
    for t in targets:
        if t.model:
            by_model.setdefault(t.model, []).append(t)
    out = []
    for model, group in sorted(by_model.items()):
        for metric, attr, low_is_bad in (("throughput_tokens_per_second", "throughput", True),
                                         ("fragmentation_ratio", "fragmentation", False)):
            members = [t for t in group if getattr(t, attr) is not None]
            if len(members) < MIN_PEERS:
                continue
            vals = np.array([getattr(t, attr) for t in members], dtype=float)
            z = robust_z(vals)
            if z is None:
                continue
            med = float(np.median(vals))
            for t, v, zi in zip(members, vals, z):
                if abs(zi) <= OUTLIER_Z:
                    continue
                if metric.startswith("throughput") and abs(v - med) < THROUGHPUT_MIN_REL_DIFF * abs(med):
                    continue
                if metric.startswith("fragmentation") and abs(v - med) < FRAGMENTATION_MIN_ABS_DIFF:
                    continue
                out.append(Outlier(str(t.id), model, metric, float(v), med, float(zi),
                                   "low" if zi < 0 else "high", len(members)))
    return out
