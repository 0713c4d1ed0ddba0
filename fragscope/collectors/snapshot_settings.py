"""The allocator settings a snapshot recorded, normalised: ``allocator_settings`` and the
``PYTORCH_CUDA_ALLOC_CONF`` string (``key:value,...``). Non-finite or out-of-range values read as unset.
"""
from __future__ import annotations

import math

from ..units import finite_or_none
from .snapshot_load import i64, label


def allocator_settings_summary(snap) -> dict:
    """The allocator settings in effect, normalised (None where the snapshot does not say).

    ``PYTORCH_ALLOC_CONF`` is the newer name of ``PYTORCH_CUDA_ALLOC_CONF`` (PyTorch 2.10+).
    """
    raw = snap.allocator_settings or {}
    conf = raw.get("PYTORCH_CUDA_ALLOC_CONF", raw.get("PYTORCH_ALLOC_CONF"))
    if isinstance(conf, str) and len(conf) > _MAX_CONF_CHARS:
        conf = conf[:_MAX_CONF_CHARS]  # a real setting is a few hundred characters; the parser is a char loop
    parsed = parse_alloc_conf(conf) if isinstance(conf, str) else {}
    exp = raw.get("expandable_segments")
    if exp is None and "expandable_segments" in parsed:
        exp = parsed["expandable_segments"].lower() == "true"
    if exp is None and snap.expandable_known and snap.n_segments:
        exp = bool(snap.seg_expandable.any())
    mss = raw.get("max_split_size")
    if isinstance(mss, bool):
        mss = None
    if isinstance(mss, int) and mss < 0:
        mss_bytes = None  # -1 / SIZE_MAX: unlimited (the default)
    elif isinstance(mss, int):
        mss_bytes = mss if mss < (1 << 62) else None
    elif "max_split_size_mb" in parsed:
        mss_bytes = _mb(parsed["max_split_size_mb"])
    else:
        mss_bytes = None
    gct = raw.get("garbage_collection_threshold")
    if gct is None and "garbage_collection_threshold" in parsed:
        try:
            gct = float(parsed["garbage_collection_threshold"])
        except ValueError:
            gct = None
    if isinstance(gct, bool) or not isinstance(gct, (int, float)) or not math.isfinite(gct):
        gct = None  # NaN / inf / an int too large for a float are not thresholds
    return {
        "known": bool(snap.allocator_settings) or bool(parsed),
        "alloc_conf": conf if isinstance(conf, str) else None,
        "backend": parsed.get("backend", "native") if isinstance(conf, str) else None,
        "expandable_segments": None if exp is None else bool(exp),
        "max_split_size_bytes": mss_bytes,  # None: unlimited or unknown (see "known")
        "garbage_collection_threshold": finite_or_none(gct),
        "roundup_power2_divisions": _divisions(raw.get("roundup_power2_divisions")),
    }


_MAX_CONF_CHARS = 4096



def _divisions(v):
    """``roundup_power2_divisions`` as recorded ({"1": 0, ...} or a list), with only 64-bit ints kept."""
    if isinstance(v, dict):
        return {label(k)[:32]: x for k, x in v.items() if i64(x) is not None}
    if isinstance(v, (list, tuple)):
        return [x if i64(x) is not None else None for x in v]
    return None


def _mb(v: str) -> int | None:
    """``max_split_size_mb`` value -> bytes; None for unlimited/unreadable (inf, nan, negative, > 2**62)."""
    f = finite_or_none(v)
    if f is None or f < 0 or f * 1024 * 1024 >= 2.0**62:
        return None
    return int(f * 1024 * 1024)


def parse_alloc_conf(conf: str) -> dict[str, str]:
    """``key:value,key:value`` (values may hold ``[a:b,c:d]`` lists) -> dict of strings."""
    out: dict[str, str] = {}
    depth, cur = 0, ""
    parts = []
    for ch in conf:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        if ":" in p:
            k, v = p.split(":", 1)
            out[k.strip()] = v.strip()
    return out



__all__ = ["allocator_settings_summary", "parse_alloc_conf"]
