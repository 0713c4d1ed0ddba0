"""PromQL text in and out: label-selector parsing and formatting, Prometheus durations and times
(``--selector``, ``--since``, ``--step``, ``--start``/``--end``). Pure; errors are one-line ValueErrors."""
from __future__ import annotations

import math
import re
from typing import Sequence

_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_selector(selector: str | None) -> list[tuple[str, str, str]]:
    """``{a="x",b=~"y.*"}`` -> [(a, =, x), (b, =~, y.*)]. Raises ValueError with a one-line reason."""
    if selector is None:
        return []
    s = selector.strip()
    if not s:
        return []
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    elif "{" in s or "}" in s:
        raise ValueError(f"selector {selector!r}: give label matchers only, e.g. "
                         "'{namespace=\"llm\",pod=~\"vllm-.*\"}' (no metric name)")
    out = []
    pos = 0
    s = s.strip()
    while pos < len(s):
        m = _MATCHER_RE.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"selector {selector!r}: cannot parse near {s[pos:pos + 30]!r}; expected "
                             "label=\"value\", label=~\"regex\", label!=\"value\" or label!~\"regex\"")
        if m.group(1) == "__name__":
            raise ValueError(f"selector {selector!r}: __name__ is chosen by fragscope; select by labels only")
        out.append((m.group(1), m.group(2), m.group(3)))
        pos = m.end()
        if m.group(4) == "" and pos < len(s):
            raise ValueError(f"selector {selector!r}: missing comma near {s[pos:pos + 30]!r}")
    return out


def format_matchers(matchers: Sequence[tuple[str, str, str]]) -> str:
    """[(a, =, x)] -> ``a="x"`` (the inside of a selector's braces)."""
    return ",".join(f'{k}{op}"{v}"' for k, op, v in matchers)




def parse_duration(text: str) -> float:
    """Prometheus durations (``6h``, ``1h30m``, ``90s``, ``2d``) or plain seconds -> seconds: the one
    duration parser (:func:`fragscope.units.parse_duration`)."""
    from ..units import parse_duration as parse

    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"bad duration {text!r}: {e}") from None


def parse_time(text: str) -> float:
    """RFC 3339 (``2024-05-01T12:00:00Z``, offsets allowed) or unix seconds -> unix seconds."""
    from datetime import datetime, timezone

    t = str(text).strip()
    try:
        v = float(t)
        if not math.isfinite(v):
            raise ValueError
        return v / 1000.0 if v > 1e11 else v
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {text!r}: expected RFC 3339 (2024-05-01T12:00:00Z) or unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def fmt_ts(ts: float) -> str:
    """Unix seconds as Prometheus API parameters take them (milliseconds kept)."""
    return f"{ts:.3f}"
