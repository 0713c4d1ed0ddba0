"""Prometheus text / OpenMetrics syntax: the parse error, name and label grammar, timestamp units.

Pieces the line parser (:mod:`.exposition_parse`) and the paste repair (:mod:`.exposition_paste`)
share: label sets, sample-line validity, histogram bounds, timestamp magnitudes, family types.
"""
from __future__ import annotations

import re

from ..model import Labels


class ParseError(ValueError):
    """Input is not Prometheus/OpenMetrics text; the message is one line naming the problem.

    ``reader``: when the input is another kind fragscope reads (an engine log, a trace, a memory
    snapshot), the ``diagnose`` subcommand that reads it ("logs", "trace", "snapshot"); else None.
    """

    def __init__(self, message: str, reader: str | None = None) -> None:
        super().__init__(message)
        self.reader = reader


# A label's head (name, "=", opening quote) and what may follow its value; the value itself is scanned
# by str.find (parse_labels): a regex alternation repeated per character, (?:[^"\\]|\\.)*, kept ~180
# bytes of backtracking state per byte of value (a 3.9 MB label value: a 717 MB peak).
_LABEL_HEAD = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"')
_LABEL_SEP = re.compile(r'\s*,?')
NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
NAME_START = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{|$)")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gcount", "_gsum")
# Timestamp units by magnitude (now is ~1.8e9 s): above 1e11 (the year 5138 in seconds) milliseconds,
# above 1e14 microseconds, above 1e17 nanoseconds; 1e20 and more is not a timestamp (a bad line).
# Every converted time is then below 1e11 s, so no date printed later is past the year 9999.
MS_THRESHOLD = 1e11
US_THRESHOLD = 1e14
_NS_THRESHOLD = 1e17
_TS_MAX = 1e20
# Caps on what one input may hold (read_recording; raise with the environment variables). A point costs
# ~64 bytes while parsing (two Python floats in lists) and 16 in the window; a series ~1 KB. 10 M points
# is 60 times an 8-hour, 15 s recording of every signal (bench/bench_ingest.py: 165k points... lines).
MAX_SERIES = 1_000_000
MAX_POINTS = 20_000_000
ENV_MAX_SERIES = "FRAGSCOPE_MAX_SERIES"
ENV_MAX_POINTS = "FRAGSCOPE_MAX_POINTS"


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")


def parse_labels(raw: str) -> Labels:
    """``a="1",b="x"`` -> (("a","1"),("b","x")). Raises ValueError on malformed input.

    Linear in the length of ``raw``, with no memory beyond the result: values are found with str.find."""
    raw = raw.strip()
    if not raw:
        return ()
    out = []
    pos = 0
    n = len(raw)
    find = raw.find
    while pos < n:
        m = _LABEL_HEAD.match(raw, pos)
        if not m:
            raise ValueError(f"bad label set {{{raw[:80]}}}")
        start = j = m.end()
        q = find('"', j)
        while True:  # the closing quote: the first one not escaped by a backslash
            if q < 0:
                raise ValueError(f"bad label set {{{raw[:80]}}}: unterminated value")
            b = find("\\", j, q)
            if b < 0:
                break
            if b + 1 >= n or raw[b + 1] == "\n":
                raise ValueError(f"bad label set {{{raw[:80]}}}: bad escape")
            j = b + 2
            if j > q:
                q = find('"', j)
        out.append((m.group(1), _unescape(raw[start:q])))
        pos = _LABEL_SEP.match(raw, q + 1).end()
    return tuple(sorted(out))


def family_type(types: dict[str, str], family_types: dict[str, str], name: str) -> str:
    t = types.get(name)
    if t is not None:
        return t
    t = family_types.get(name)
    if t is None:
        for suf in _SUFFIXES:
            if name.endswith(suf):
                t = family_types.get(name[: -len(suf)])
                if t is not None:
                    break
    t = t or "untyped"
    types[name] = t
    return t


def valid_sample(line: str) -> bool:
    brace = line.find("{")
    try:
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                return False
            name = line[:brace].strip()
            parse_labels(line[brace + 1: close])
            rest = line[close + 1:].split()
        else:
            parts = line.split()
            if not parts:
                return False
            name, rest = parts[0], parts[1:]
        if not rest or len(rest) > 3 or not NAME_RE.match(name):
            return False
        float(rest[0])
        return True
    except ValueError:
        return False


def bad_bound(name: str, labels: Labels) -> bool:
    """A histogram bucket whose ``le`` is missing or not a number (NaN, empty, text), or a summary
    sample whose ``quantile`` is not a number: the series means nothing and would poison sorting by bound."""
    bucket = name.endswith("_bucket")
    bound = "le" if bucket else "quantile"
    for k, v in labels:
        if k == bound:
            try:
                f = float(v)
            except ValueError:
                return True
            return f != f  # NaN
    return bucket  # a bucket without le has no place in its histogram


def big_timestamp(ts: float, units: set) -> float:
    """Microseconds or nanoseconds since 1970, told by magnitude (the unit is added to ``units``);
    beyond that, not a timestamp."""
    if ts < _NS_THRESHOLD:
        units.add("microseconds")
        return ts / 1e6
    if ts < _TS_MAX:
        units.add("nanoseconds")
        return ts / 1e9
    raise ValueError(f"timestamp {ts:.3g} out of range (not seconds, ms, µs or ns since 1970)")
