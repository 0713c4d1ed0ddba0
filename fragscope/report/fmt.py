"""Number and time formatting shared by the terminal and the HTML report (base units in, text out)."""
from __future__ import annotations

import math
from datetime import datetime, timezone

# count units written in the plural by detectors; the singular for exactly one ("1 request")
_SINGULAR = {"requests": "request", "tokens": "token", "preemptions": "preemption", "retries": "retry",
             "ooms": "OOM", "sequences": "sequence", "blocks": "block", "segments": "segment",
             "kernels": "kernel", "calls": "call", "launches": "launch", "streams": "stream"}


def fmt_ts(ts: float | None) -> str:
    """Unix seconds -> ``2026-01-01 02:43:00Z``; ``?`` when unknown."""
    if ts is None or not math.isfinite(ts):
        return "?"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_clock(ts: float, with_seconds: bool = False) -> str:
    """Unix seconds -> ``02:43`` (UTC), for axes and short labels."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%H:%M:%S" if with_seconds else "%H:%M")


def plural(n: float, noun: str) -> str:
    """``plural(1, "requests")`` -> ``1 request``; the noun is given in the plural."""
    txt = f"{n:.3g}" if abs(n) < 1000 else f"{n:,.0f}"
    return f"{txt} {unit_for(txt, noun)}"


def unit_for(number_text: str, unit: str) -> str:
    return _SINGULAR.get(unit, unit) if number_text in ("1", "-1") else unit


def fmt_value(v: float | None, unit: str = "") -> str:
    """A value in base units for people: bytes in binary units, ratios in %, seconds scaled."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if unit == "bytes":
        for u, s in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if abs(v) >= s:
                return f"{v / s:.2f} {u}"
        return f"{v:.0f} B"
    if unit == "ratio":
        return f"{v * 100:.1f} %"
    if unit == "seconds":
        if abs(v) < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if abs(v) < 1:
            return f"{v * 1e3:.1f} ms"
        return f"{v:.2f} s"
    if unit == "hertz":
        return f"{v / 1e6:.0f} MHz"
    txt = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{txt} {unit_for(txt, unit)}".strip()


def fmt_axis(v: float, unit: str) -> str:
    """Short tick labels: ``24 GiB``, ``35 %``, ``1.5 ms``, ``1.2k``."""
    if not math.isfinite(v):
        return ""
    if unit == "bytes":
        for u, s in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if abs(v) >= s:
                return f"{_short(v / s)} {u}"
        return f"{v:.0f} B"
    if unit == "ratio":
        return f"{_short(v * 100)} %"
    if unit == "seconds":
        if v == 0:
            return "0"
        for u, s in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
            if abs(v) >= s:
                return f"{_short(v / s)} {u}"
        return f"{_short(v * 1e9)} ns"
    if unit == "hertz":
        return f"{_short(v / 1e6)} MHz"
    if abs(v) >= 1e6:
        return f"{_short(v / 1e6)}M"
    if abs(v) >= 1e4:
        return f"{_short(v / 1e3)}k"
    return _short(v)


def _short(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}".rstrip("0").rstrip(".")
    return f"{x:.2f}".rstrip("0").rstrip(".")
