"""The parsed-line record (:class:`LogEvent`), its kinds, and safe number parsing. docs/logs.md#events."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

GIB = 1024.0 ** 3
MIB = 1024.0 ** 2
KIB = 1024.0
# PyTorch's c10 format_size prints "bytes", "KiB", "MiB", "GiB". vLLM V0 prints "GB" but divides by
# 2**30 (model_runner: "Loading model weights took %.4f GB", bytes / float(2**30)): binary too.
UNITS = {"b": 1.0, "byte": 1.0, "bytes": 1.0, "kib": KIB, "kb": KIB, "mib": MIB, "mb": MIB,
         "gib": GIB, "gb": GIB, "tib": GIB * 1024, "tb": GIB * 1024}

# Number shapes, bounded: a real figure in an engine log has at most 15 integer digits (a byte count
# of a 1 PiB device has 16; token counts ~7) and 12 decimals. A longer run of digits ("400 digits",
# "1.000.0") is not a figure: the bounded patterns below do not match it, so the field is left out
# instead of turning into inf/NaN (float("9" * 400) is inf) or raising.
NUM = r"(?<![\d.])(\d{1,16}(?:\.\d{1,12})?)(?!\d|\.\d)"
INT = r"(?<![\d,.])(\d{1,3}(?:,\d{3}){1,5}|\d{1,16})(?![\d,]\d|\.\d)"
SIZE = r"(?<![\d.,])(\d{1,3}(?:,\d{3}){1,5}(?:\.\d{1,12})?|\d{1,16}(?:\.\d{1,12})?)(?!\d|\.\d)\s*" \
       r"(bytes|byte|B|KiB|KB|MiB|MB|GiB|GB|TiB|TB)\b"

# Event kinds (LogEvent.kind), a contract: docs/logs.md#events
KINDS = ("preemption", "retraction", "stats", "kv_cache_tokens", "kv_blocks", "max_concurrency",
         "memory_profile", "kv_memory", "weights", "cuda_graph", "config", "oom",
         "startup_memory_shortfall", "kv_insufficient", "collective_timeout", "engine_dead", "host_oom_kill")


@dataclass(slots=True)
class LogEvent:
    """One parsed log record. ``ts`` is unix seconds (None until a timestamped line was seen)."""

    kind: str
    ts: float | None
    line_no: int  # 1-based line number in the input
    fields: dict = field(default_factory=dict)  # numbers in base units (bytes, ratios, tokens/s)
    engine: str = ""  # vLLM V1 engine index ("0"), "all" for "N Engines Aggregated"
    source: str = ""  # vllm-v0 | vllm-v1 | sglang | torch
    text: str = ""  # the message with prefixes stripped (first 400 characters)
    pid: int | None = None  # "(EngineCore pid=199)" prefix

    def to_dict(self) -> dict:
        return {"kind": self.kind, "time": self.ts, "line": self.line_no, "engine": self.engine,
                "source": self.source, "pid": self.pid, "fields": dict(self.fields), "text": self.text}


from ...units import checked_number  # noqa: E402


class BadNumber(ValueError):
    """A figure that matched a pattern but is not a finite number of a sane size."""


def to_float(s: str) -> float:
    """'5,463,232' / '98.3' -> float through the one checked conversion (fragscope.units.checked_number):
    raises BadNumber for anything non-finite, longer than a number can be (a 400-digit figure in a logged
    prompt) or not one number (``1.2.3``)."""
    try:
        return checked_number(s, "figure")
    except (ValueError, TypeError) as e:
        raise BadNumber(str(e)[:120]) from None


def to_int(s: str) -> int:
    v = to_float(s)
    if v != int(v):
        raise BadNumber(s)
    return int(v)


Fields = dict  # a parsed line's figures and names, by key (LogEvent.fields)


def opt_field(fields: Fields, key: str, rx: re.Pattern, msg: str, conv) -> None:
    """An optional figure: ``fields[key] = conv(first group)`` where ``rx`` finds one in ``msg``; a missing or bad
    figure (BadNumber) leaves the key out."""
    g = rx.search(msg)
    if g:
        try:
            fields[key] = conv(g.group(1))
        except BadNumber:
            pass


def parse_size(num: str, unit: str) -> float:
    """'24.2840', 'GB' -> bytes (binary units throughout, see UNITS)."""
    v = to_float(num) * UNITS[unit.lower()]
    if not math.isfinite(v):
        raise BadNumber(num)
    return float(round(v))
