"""Units and their formatting: the one place for byte multiples, percentages, durations and times.

Values inside fragscope are SI base units (bytes, seconds, hertz, ratios 0-1); these helpers turn
them into the short texts findings and reports print. A value that is not available prints "n/a",
never 0.
"""
from __future__ import annotations

import datetime as _dt
import math
import re

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * 1024 * 1024


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.I)
_BINARY = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": GiB * 1024}


def parse_size(v, *, decimal_si: bool = True, allow_zero: bool = False) -> int:
    """``1073741824`` / ``"512MB"`` / ``"1GiB"`` / ``" 80 GiB "`` -> bytes (int). Raises ValueError.

    ``KiB``/``MiB``/``GiB``/``TiB`` (and ``Ki``...) are binary. ``kB``/``MB``/``GB``/``TB`` (and bare
    ``k``/``M``/``G``) are decimal when ``decimal_si`` (the agent's configuration, as Kubernetes reads
    them), binary otherwise (the CLI's ``--device-memory 80GB``: GPU memory is quoted in GiB and called
    GB, as the engines and nvidia-smi print it). Not finite, negative, zero (unless ``allow_zero``)
    or 2**63 bytes and more: refused. A bool is not a size.
    """
    if isinstance(v, bool):
        raise ValueError(f"expected a size like 512MB or 1GiB, got {v!r}")
    if isinstance(v, (int, float)):
        n = float(v)
    else:
        m = _SIZE_RE.match(str(v))
        if not m:
            raise ValueError(f"expected a size like 512MB or 1GiB, got {v!r}")
        unit = (m.group(2) or "").lower()
        scale = _BINARY[unit[:1]]
        if decimal_si and unit[:1] in "kmgt" and unit and "i" not in unit:
            scale = 1000 ** ("kmgt".index(unit[0]) + 1)
        n = float(m.group(1)) * scale  # 400 digits read as inf: refused below
    if not math.isfinite(n) or n < 0 or (n == 0 and not allow_zero) or n >= 2.0**63:
        raise ValueError(f"must be a positive size below 8 EiB, got {v!r}")
    return int(n)


_DUR_PART = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d|w|y)", re.I)
_DUR_SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
DURATION_HINT = "a duration like 30s, 5m, 1h30m, 250ms, 7d, or seconds"


def parse_duration(v) -> float:
    """``90`` / ``"90s"`` / ``"2m"`` / ``"1h30m"`` (Prometheus' form) / ``"250ms"`` / ``"7d"`` -> seconds
    (float, > 0). The one duration parser of every option, config key and API parameter. Raises
    ValueError. A bool is not a duration; a bare number is seconds."""
    if isinstance(v, bool):
        raise ValueError(f"expected {DURATION_HINT}, got {v!r}")
    if isinstance(v, (int, float)):
        secs = float(v)
    else:
        t = str(v).strip()
        try:
            secs = float(t)
        except ValueError:
            pos, secs = 0, 0.0
            for m in _DUR_PART.finditer(t):
                if m.start() != pos:
                    break
                secs += float(m.group(1)) * _DUR_SECONDS[m.group(2).lower()]
                pos = m.end()
            if not t or pos != len(t):
                raise ValueError(f"expected {DURATION_HINT}, got {v!r}") from None
    if not math.isfinite(secs) or secs <= 0:
        raise ValueError(f"must be a positive duration, got {v!r}")
    return secs


def _finite(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def finite_or_none(x) -> float | None:
    """``x`` as a float when it is a finite number, else None (absent or unusable, never 0)."""
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def fmt_bytes(x: float | None) -> str:
    """1.5 GiB, 300 MiB, 12 KiB, 10 B (binary multiples, as nvidia-smi and PyTorch print them)."""
    if not _finite(x):
        return "n/a"
    x = float(x)
    a = abs(x)
    if a >= GiB:
        return f"{x / GiB:.1f} GiB"
    if a >= MiB:
        return f"{x / MiB:.0f} MiB"
    if a >= KiB:
        return f"{x / KiB:.0f} KiB"
    return f"{x:.0f} B"


def fmt_pct(x: float | None) -> str:
    """A ratio 0-1 as a whole percentage."""
    return f"{float(x) * 100:.0f} %" if _finite(x) else "n/a"


def fmt_seconds(x: float | None) -> str:
    if not _finite(x):
        return "n/a"
    x = float(x)
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.1f} s"


def fmt_count(n: float, singular: str, plural: str | None = None) -> str:
    """'1 request', '3 requests', '1,234 preemptions'."""
    word = singular if n == 1 else (plural or singular + "s")
    v = float(n)
    return f"{int(v):,} {word}" if v.is_integer() else f"{v:,.1f} {word}"


def _dt_utc(ts: float | None) -> _dt.datetime | None:
    if not _finite(ts):
        return None
    try:
        return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond year 9999 or the platform's range
        return None


def fmt_clock(ts: float | None) -> str:
    """HH:MM (UTC) of a unix time; '?' when unknown or out of range."""
    d = _dt_utc(ts)
    return d.strftime("%H:%M") if d else "?"


def iso(ts: float | None) -> str:
    """RFC 3339 UTC to the second; '?' when unknown or out of range."""
    d = _dt_utc(ts)
    return d.strftime("%Y-%m-%dT%H:%M:%SZ") if d else "?"


def one_line(e: BaseException | str, limit: int = 200) -> str:
    """An error or text as one line of at most ``limit`` characters."""
    s = f"{type(e).__name__}: {e}" if isinstance(e, BaseException) and not str(e) else str(e)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def json_safe(obj):
    """``obj`` with what strict JSON cannot hold replaced: NaN/±inf -> None, numpy scalars -> Python,
    ints outside ±2**63 -> strings (a reader's 64-bit parser would lose them; 5,000-digit ints cannot
    even be formatted), tuples/sets -> lists, other objects -> their ``str()``."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj if -(1 << 63) <= obj < (1 << 63) else f"<integer of {obj.bit_length()} bits>"
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(json_safe(k))): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        try:
            return json_safe(obj.item())
        except (TypeError, ValueError):
            pass
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return json_safe(obj.to_dict())
    return str(obj)


# --- numbers from outside: the one checked conversion ------------------------------------------
# A figure in a log, a profile, a config or a probe record is at most this many characters: a float64 has
# 17 significant digits and an exponent of 3, an int64 19 digits; 40 leaves room for signs, separators and
# leading zeros. Longer is not a measurement (a 400-digit number in a logged prompt, a 4,300-digit JSON
# integer) and is refused before any conversion runs.
MAX_NUMBER_CHARS = 40


def checked_number(v, what: str = "number", *, lo: float | None = None, hi: float | None = None,
                   integer: bool = False) -> float:
    """``v`` (a str, int or float from outside) as a finite float within [lo, hi]; with ``integer``, a
    whole number. Raises ValueError naming ``what`` for: a bool, NaN or infinity (``1e400`` included), more
    than MAX_NUMBER_CHARS characters (400-digit text or a huge int), text that is not one decimal number
    (``1.2.3``, ``0x10``), or a value out of range. Thousands separators (``1,234``) are read."""
    if isinstance(v, bool) or v is None:
        raise ValueError(f"{what}: not a number ({v!r})")
    if isinstance(v, int):
        if v.bit_length() > 64:
            raise ValueError(f"{what}: an integer of {v.bit_length()} bits, not a measurement")
        x = float(v)
    elif isinstance(v, float):
        x = v
    else:
        s = str(v)
        if len(s) > MAX_NUMBER_CHARS:
            raise ValueError(f"{what}: {len(s)} characters, not a number ({s[:20]}…)")
        try:  # float() reads one decimal number (or nan/inf, refused below); "1.2.3" and "0x10" it refuses
            x = float(s)
        except ValueError:
            try:
                x = float(s.replace(",", ""))  # thousands separators, as engines print counts
            except ValueError:
                raise ValueError(f"{what}: {s.strip()[:40]!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{what}: {v!r} is not a finite number"[:120])
    if integer and not x.is_integer():
        raise ValueError(f"{what}: {x:g} is not a whole number")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise ValueError(f"{what}: {x:g} is out of range [{lo if lo is not None else '-inf'}, "
                         f"{hi if hi is not None else 'inf'}]")
    return x


def maybe_number(v, **kw) -> float | None:
    """:func:`checked_number`, or None when it refuses (absent, not zero)."""
    try:
        return checked_number(v, **kw)
    except (ValueError, TypeError):
        return None


def _json_int(s: str) -> int:
    if len(s) > MAX_NUMBER_CHARS:
        raise ValueError(f"a JSON integer of {len(s)} digits")
    return int(s)


def _json_float(s: str) -> float:
    if len(s) > MAX_NUMBER_CHARS * 2:
        raise ValueError(f"a JSON number of {len(s)} characters")
    x = float(s)
    if not math.isfinite(x):
        raise ValueError(f"JSON number {s[:40]} is not finite")
    return x


def _json_const(token: str):
    raise ValueError(f"JSON token {token} is not a number")


def load_json_checked(text: str | bytes):
    """``json.loads`` under the number contract: NaN/Infinity tokens, numbers that overflow a float
    (``1e400``) and integers of more than MAX_NUMBER_CHARS digits are refused; nesting past the
    interpreter's recursion limit is refused too. Raises ValueError (RecursionError turned into it)."""
    import json

    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_const)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
