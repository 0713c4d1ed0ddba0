"""fragscope.npstats gives numpy's median, quantile and distinct values bit for bit (signed zeros,
infinities and NaNs included), so the detectors' figures stay those of np.median / np.quantile / np.unique."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from fragscope import npstats


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))


def _arrays(seed: int, n_arrays: int):
    rng = np.random.default_rng(seed)
    for i in range(n_arrays):
        n = int(rng.integers(1, 40))
        kind = i % 6
        if kind == 0:
            yield rng.normal(size=n)
        elif kind == 1:
            yield rng.integers(-3, 4, size=n).astype(float)  # ties
        elif kind == 2:
            yield rng.choice([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf], size=n)
        elif kind == 3:
            yield rng.choice([0.0, -0.0, np.nan, 2.5, 1e300, -1e300], size=n)
        elif kind == 4:
            yield rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, size=n)
        else:
            yield np.round(rng.normal(size=n), 1)


@pytest.mark.parametrize("seed", [1, 2])
def test_median_quantile_unique_are_numpys(seed):
    qs = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0, 1 / 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns on inf - inf inside its interpolation
        for v in _arrays(seed, 800):
            assert _same(npstats.median(v), float(np.median(v))), v
            assert _same(npstats.median(list(v)), float(np.median(list(v)))), v
            assert _same(npstats.nanmedian(v), float(np.nanmedian(v))), v
            for q in qs:
                assert _same(npstats.quantile(v, q), float(np.quantile(v, q))), (v, q)
            u, ref = npstats.unique(v), np.unique(v)
            assert u.shape == ref.shape and np.array_equal(u, ref, equal_nan=True), v
            assert (np.signbit(u) == np.signbit(ref)).all(), v


def test_other_inputs_are_numpys_own_call():
    ints = np.array([3, 1, 2, 2])
    assert npstats.median(ints) == float(np.median(ints))
    assert npstats.quantile(ints, 0.9) == float(np.quantile(ints, 0.9))
    for arr in (ints, np.array([5, -2, 5, 0, -2], dtype=np.int32), np.array([7], dtype=np.uint8)):
        u, ref = npstats.unique(arr), np.unique(arr)
        assert u.dtype == ref.dtype and u.tolist() == ref.tolist()
    f4 = np.array([0.1, 0.7, 0.3], dtype=np.float32)
    assert npstats.quantile(f4, 0.9) == float(np.quantile(f4, 0.9))
    with pytest.raises(ValueError):
        npstats.quantile(np.array([1.0, 2.0]), 1.5)  # numpy's error for a quantile outside [0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(npstats.median(np.array([], dtype=float)))
        assert math.isnan(npstats.nanmedian(np.array([np.nan, np.nan])))
