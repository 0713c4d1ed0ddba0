"""Kineto times given as JSON text (epoch µs with sub-µs digits), converted in bulk.

A trace whose times are epoch µs with ns digits (``1712195495505583.123``) keeps them as text so their ns
are exact (:mod:`.kineto_events`); converting them one event at a time was the largest part of reading
such a trace. These give the same values as the per-value conversions (``kineto_events.raw_value``,
``kineto.us_to_ns``; tests/test_kineto_text_times.py) for the common shapes and leave every other value
to them.
"""
from __future__ import annotations

import re
from itertools import repeat

from .kineto_events import Dec

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
    if _one_large_shape(texts):  # (every text matches _LARGE_DECIMAL: tested once for all of them)
        return list(map(Dec, texts))
    large = _LARGE_DECIMAL.match
    return [Dec(t) if large(t) else r for t, r in zip(texts, raws)]


def _one_large_shape(texts: list) -> bool:
    """Whether every text is ASCII digits with one dot at the same place, 15+ digits before it and some
    after (what _LARGE_DECIMAL matches, unsigned), all of one length: Kineto's epoch µs with sub-µs digits.
    String operations over the texts joined, instead of one regular-expression match per text."""
    n = len(texts)
    width = len(texts[0])
    dot = texts[0].find(".")
    if dot < 15 or dot >= width - 1 or set(map(len, texts)) != {width}:
        return False
    joined = "".join(texts)
    if joined.count(".") != n or joined[dot::width].count(".") != n:
        return False
    digits = joined.replace(".", "")
    return digits.isascii() and digits.isdigit()


_NS_MAX = 1 << 62  # (us_to_ns's range)


def texts_ns(vals: list, np=None):
    """``kineto.us_to_ns`` of every value at once where all are large numbers' texts of one shape (the same
    length, ASCII digits, one dot at the same place, 1-3 fraction digits: a trace's epoch µs with sub-µs
    digits), as ints; None otherwise (and where a value is out of range: ``us_to_ns`` says which). String
    operations over all of them at once, then one ``int`` per value: the ns are the digits themselves. With
    ``np`` (numpy) and at most 19 digits of ns, the digits are summed by numpy instead, in uint64 (exact:
    below 10**19 < 2**64), and the answer is an int64 array."""
    n = len(vals)
    if n == 0 or type(vals[0]) is not Dec:
        return None
    width = len(vals[0])
    dot = vals[0].find(".")
    frac = width - dot - 1
    if not 0 < dot < 19 or not 1 <= frac <= 3:
        return None
    if set(map(type, vals)) != {Dec} or set(map(len, vals)) != {width}:
        return None
    joined = "".join(vals)
    if joined.count(".") != n or joined[dot::width].count(".") != n:  # one dot each, at the same place
        return None
    digits = joined.replace(".", "")
    if not (digits.isascii() and digits.isdigit()):
        return None
    if np is not None and dot + 3 <= 19:
        return _digits_ns(digits, n, width - 1, 3 - frac, np)
    ns = list(map(int, map(str.replace, vals, repeat(".", n), repeat("", n))))
    if frac < 3:
        scale = 10 ** (3 - frac)
        ns = [v * scale for v in ns]
    if max(ns) > _NS_MAX:
        return None
    return ns


def digit_rows(d, scale_digits: int, np):
    """The numbers written by the rows of ``d`` (an (n, per) uint8 array of ASCII digits), times
    10**scale_digits, as uint64 (exact below 10**19): summed column by column."""
    acc = np.zeros(d.shape[0], dtype=np.uint64)
    ten = np.uint64(10)
    for j in range(d.shape[1]):
        acc *= ten
        acc += d[:, j] - np.uint8(48)
    if scale_digits:
        acc *= np.uint64(10 ** scale_digits)
    return acc


def _digits_ns(digits: str, n: int, per: int, scale_digits: int, np):
    """The ints written by ``n`` runs of ``per`` ASCII digits each, times 10**scale_digits, as int64 (None
    above 2**62, as texts_ns): column by column over an (n, per) array of the digits' values."""
    acc = digit_rows(np.frombuffer(digits.encode("ascii"), dtype=np.uint8).reshape(n, per), scale_digits, np)
    if int(acc.max()) > _NS_MAX:
        return None
    return acc.astype(np.int64)
