"""Kineto times given as JSON text (epoch µs with sub-µs digits), converted in bulk.

A trace whose times are epoch µs with ns digits (``1712195495505583.123``) keeps them as text so their ns
are exact (:mod:`.kineto_events`); converting them one event at a time was the largest part of reading
such a trace. These give the same values as the per-value conversions (``kineto_events.raw_value``,
``kineto.us_to_ns``; tests/test_kineto_text_times.py) for the common shapes and leave every other value
to them.
"""
from __future__ import annotations

import re

from .kineto_events import Dec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["text_times", "texts_ns"]

_LARGE_DECIMAL = re.compile(r"-?[0-9]{15,}\.[0-9]+\Z")


def text_times(raws: list) -> list:
    """``raw_value`` of each of ``raws`` (the JSON texts of times) where it is a large number's text with a
    fraction (epoch µs with sub-µs digits: ``Dec``, what ``raw_value`` gives it), the Raw itself for
    the caller's ``raw_value`` otherwise. One decode of the texts joined instead of one conversion per
    event: 45k times of HTA's ns-resolution trace in about 0.6x the time."""
    if not raws:
        return []
    # NUL never occurs in a JSON value's text, so the split gives the texts back one for one
    texts = b"\x00".join(raws).decode("latin-1").split("\x00")
    if len(texts) != len(raws):  # (cannot happen with valid JSON; the caller converts one by one)
        return raws
    large = _LARGE_DECIMAL.match
    return [Dec(t) if large(t) else r for t, r in zip(texts, raws)]


_NS_HI_MAX = ((1 << 62) - 999) // 1000  # integer µs whose ns (plus any fraction) stay within 2**62


def texts_ns(vals: list) -> np.ndarray | None:
    """``kineto.us_to_ns`` of every value at once where all are large numbers' texts of one shape (the same
    length, digits, one dot, 1-3 fraction digits: a trace's epoch µs with sub-µs digits), by arithmetic on
    the digits; None otherwise (and where a value is out of range: ``us_to_ns`` says which)."""
    n = len(vals)
    if n == 0 or type(vals[0]) is not Dec:
        return None
    import numpy as np

    width = len(vals[0])
    dot = vals[0].find(".")
    frac = width - dot - 1
    if not 0 < dot < 19 or not 1 <= frac <= 3:
        return None
    if set(map(type, vals)) != {Dec} or set(map(len, vals)) != {width}:
        return None
    try:
        rows = np.frombuffer("".join(vals).encode("ascii"), dtype=np.uint8).reshape(n, width)
    except UnicodeEncodeError:
        return None
    digits = np.delete(rows, dot, axis=1)
    if not (rows[:, dot] == ord(".")).all() or not np.isin(digits, np.arange(ord("0"), ord("9") + 1, dtype=np.uint8)).all():
        return None
    d = (digits - ord("0")).astype(np.int64)
    hi = np.zeros(n, dtype=np.int64)
    for k in range(dot):  # the integer µs, digit by digit (at most 18 digits: within int64)
        hi = hi * 10 + d[:, k]
    if (hi > _NS_HI_MAX).any():
        return None
    lo = np.zeros(n, dtype=np.int64)
    for k in range(dot, dot + frac):
        lo = lo * 10 + d[:, k]
    return hi * 1000 + lo * 10 ** (3 - frac)
