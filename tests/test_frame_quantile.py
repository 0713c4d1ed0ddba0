"""histogram_quantile (vectorised over the grid) against a point-by-point reference written from
Prometheus' definition, on random cumulative counts with NaN, zero totals, +Inf buckets and flat buckets."""
from __future__ import annotations

import math

import numpy as np

from fragscope.detectors.frame import histogram_quantile


def _reference(q, les, counts):
    out = []
    for j in range(counts.shape[1]):
        tot = counts[-1, j]
        if not math.isfinite(tot) or tot <= 0:
            out.append(math.nan)
            continue
        col = [0.0 if math.isnan(x) else x for x in counts[:, j]]
        for i in range(1, len(col)):
            col[i] = max(col[i], col[i - 1])
        rank = q * tot
        b = next((i for i, c in enumerate(col) if c >= rank), len(col) - 1)
        if math.isinf(les[b]):
            out.append(les[b - 1] if b > 0 else math.nan)
            continue
        lo, c_lo = (les[b - 1], col[b - 1]) if b > 0 else (0.0, 0.0)
        out.append(les[b] if col[b] == c_lo else lo + (les[b] - lo) * (rank - c_lo) / (col[b] - c_lo))
    return np.array(out)


def test_matches_reference_on_random_histograms():
    rng = np.random.default_rng(3)
    for les in (np.array([0.1, 0.5, 1.0, 5.0, np.inf]), np.array([0.25, 1.0, 4.0]), np.array([np.inf]),
                np.array([2.0])):
        counts = np.cumsum(rng.integers(0, 4, (les.size, 400)).astype(float), axis=0)
        counts[:, rng.random(400) < 0.1] = 0.0  # no observations
        counts[rng.random(counts.shape) < 0.05] = np.nan  # missing buckets
        counts[:, 5] = np.nan  # a column with no data at all
        for q in (0.0, 0.5, 0.9, 0.99, 1.0):
            got, want = histogram_quantile(q, les, counts), _reference(q, les, counts)
            np.testing.assert_array_equal(got, want)  # exact, NaN where NaN
        finite = np.isfinite(histogram_quantile(0.5, les, counts)).sum()
        assert finite > 200 if np.isfinite(les).any() else finite == 0  # only +Inf: no bound to report


def test_hand_checked_figures():
    les = np.array([1.0, 2.0, np.inf])
    counts = np.array([[2.0, 0.0, 4.0], [4.0, 0.0, 4.0], [4.0, 0.0, 8.0]])
    # col 0: rank 2 falls at the first bucket's top -> 1.0; col 1: no observations; col 2: rank 4 in bucket 1
    np.testing.assert_array_equal(histogram_quantile(0.5, les, counts), [1.0, np.nan, 1.0])
    # p75 of col 0: rank 3 halfway through (1, 2] -> 1.5; of col 2: rank 6 in +Inf -> highest finite bound 2.0
    np.testing.assert_array_equal(histogram_quantile(0.75, les, counts), [1.5, np.nan, 2.0])
