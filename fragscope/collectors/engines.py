"""Engine adapters at ingest: the few mappings a metric-name table cannot express.

Most engines map onto fragscope's canonical signals by name alone (``fragscope/signals.py``). Two
things need the series themselves, both declared as data in ``signals.py`` and applied here:

- ``DERIVED``: one label value of a family (TensorRT-LLM's ``request_type="waiting"``), or the ratio
  of two (``kv_cache_block_type`` used / max), written as a new series the table reads;
- ``RANK_DUPLICATE_LABELS``: series repeated per rank of one scheduler (SGLang ``tp_rank``) are one
  series, so summing engines does not count one retraction eight times.

:func:`derive` is pure and idempotent: a window that already holds a derived name is left as it is.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..model import Series, SeriesKey, Window
from ..signals import DERIVED, RANK_DUPLICATE_LABELS, Derived


def _matches(key: SeriesKey, sel: tuple[tuple[str, str], ...]) -> bool:
    return all(key.label(k) == v for k, v in sel)


def _derive_one(window: Window, d: Derived) -> dict[SeriesKey, Series]:
    fam = [s for s in window if s.name == d.family]
    sel_labels = {k for k, _ in d.select} | {k for k, _ in d.per}
    num = {s.key.without(*sel_labels): s for s in fam if _matches(s.key, d.select)}
    out: dict[SeriesKey, Series] = {}
    if not d.per:
        for rest, s in num.items():
            key = SeriesKey(d.metric, rest)
            out[key] = Series(key, s.ts.copy(), s.values.copy(), "gauge")
        return out
    den = {s.key.without(*sel_labels): s for s in fam if _matches(s.key, d.per)}
    for rest, s in num.items():
        q = den.get(rest)
        if q is None:
            continue  # no denominator: not available, never a guess
        ts, i_n, i_d = np.intersect1d(s.ts, q.ts, return_indices=True)
        dv = q.values[i_d]
        ok = dv > 0  # an empty pool has no usage ratio
        if not ok.any():
            continue
        key = SeriesKey(d.metric, rest)
        out[key] = Series(key, ts[ok], s.values[i_n][ok] / dv[ok], "gauge")
    return out


def _collapse_ranks(window: Window) -> tuple[dict[SeriesKey, Series], int]:
    """Series that differ only in a rank label of one scheduler -> one series (pointwise maximum)."""
    groups: dict[SeriesKey, list[Series]] = {}
    keep: dict[SeriesKey, Series] = {}
    for key, s in window.series.items():
        labels = next((ls for pre, ls in RANK_DUPLICATE_LABELS.items() if key.name.startswith(pre)), None)
        if labels is None or not any(key.label(x) is not None for x in labels):
            keep[key] = s
            continue
        groups.setdefault(SeriesKey(key.name, key.without(*labels)), []).append(s)
    merged = 0
    for key, ss in groups.items():
        if len(ss) == 1:
            keep[ss[0].key] = ss[0]
            continue
        ts = np.unique(np.concatenate([s.ts for s in ss]))
        vals = np.full(ts.size, -np.inf)
        for s in ss:
            idx = np.searchsorted(ts, s.ts)
            vals[idx] = np.maximum(vals[idx], s.values)
        keep[key] = Series(key, ts, vals, ss[0].type)
        merged += len(ss) - 1
    return keep, merged


# Engines' metric-name prefixes, to name the families the signal table does not map (never silently nothing)
ENGINE_PREFIXES = (("vllm:", "vLLM"), ("sglang:", "SGLang"), ("sglang_", "SGLang"), ("tgi_", "TGI"),
                   ("nv_trt_llm_", "TensorRT-LLM (Triton backend)"), ("trtllm_", "TensorRT-LLM"),
                   ("nv_inference_", "Triton"), ("lmdeploy_", "LMDeploy"))
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _underscore_aliases(window: Window) -> tuple[dict[SeriesKey, Series], int]:
    """SGLang's names with ``_`` for ``:`` (``sglang_num_running_reqs``: exporters and gateways that rewrite colons,
    several SGLang deployments) read as the table's ``sglang:`` names, unless the colon name is there too."""
    names = window.names()
    known = known_names()
    out: dict[SeriesKey, Series] = {}
    n = 0
    for key, ser in window.series.items():
        if key.name.startswith("sglang_"):
            alias = "sglang:" + key.name[len("sglang_"):]
            if alias in known and alias not in names:
                nk = SeriesKey(alias, key.labels)
                out[nk] = Series(nk, ser.ts, ser.values, ser.type)
                n += 1
                continue
        out[key] = ser
    return out, n


def unmapped_families(window: Window) -> dict[str, list[str]]:
    """Engine-looking families (by prefix) that no signal reads: {engine: [family, ...]} (a name drift between
    releases shows here instead of reading as nothing)."""
    known = known_names()
    out: dict[str, set[str]] = {}
    for name in window.names():
        if name in known or (name.startswith("sglang_") and "sglang:" + name[7:] in known):
            continue
        eng = next((e for pre, e in ENGINE_PREFIXES if name.startswith(pre)), None)
        if eng is None:
            continue
        fam = next((name[: -len(x)] for x in _SUFFIXES if name.endswith(x) and name[: -len(x)] in known), None)
        if fam is not None:
            continue
        base = next((name[: -len(x)] for x in _SUFFIXES if name.endswith(x)), name)
        out.setdefault(eng, set()).add(base)
    return {e: sorted(v) for e, v in sorted(out.items())}


def name_notes(window: Window) -> list[str]:
    """What the names alone say about reading this window: SGLang underscore names read as their colon names, and
    the engine-looking families no signal maps (named, with the engine they look like)."""
    names = window.names()
    known = known_names()
    notes = []
    aliased = sorted(n for n in names if n.startswith("sglang_") and "sglang:" + n[7:] in known
                     and "sglang:" + n[7:] not in names)
    if aliased:
        notes.append(f"{len(aliased)} SGLang families named sglang_* (underscore) read as their sglang:* names")
    for eng, fams in unmapped_families(window).items():
        if fams:
            notes.append(f"families not mapped to any signal (they look like {eng}; not read): " + ", ".join(fams[:12])
                         + (f" and {len(fams) - 12} more" if len(fams) > 12 else ""))
    return notes


def derive(window: Window) -> Window:
    """The window with the engine adapters' derived series added (see the module docstring)."""
    if any(n.startswith("sglang_") for n in window.names()):
        series, aliased = _underscore_aliases(window)
        if aliased:
            window = dataclasses.replace(window, series=series)
    names = window.names()
    todo = [d for d in DERIVED if d.family in names and d.metric not in names]
    has_ranks = any(s.key.name.startswith(pre) and any(s.key.label(x) is not None for x in ls)
                    for s in window for pre, ls in RANK_DUPLICATE_LABELS.items())
    if not todo and not has_ranks:
        return window
    series, merged = _collapse_ranks(window) if has_ranks else (dict(window.series), 0)
    for d in todo:
        series.update(_derive_one(window, d))
    out = dataclasses.replace(window, series=series, notes=list(window.notes))  # keeps the scrape metadata
    if merged:
        out.notes.append(f"{merged} per-rank duplicate series merged (one scheduler reported by each TP rank)")
    return out


_OTHER: frozenset[str] | None = None
_KNOWN: frozenset[str] | None = None


def known_names() -> frozenset[str]:
    """Every raw name the signal table reads (vLLM's included), with histogram and counter suffixes."""
    global _KNOWN
    if _KNOWN is None:
        from ..signals import DERIVED, SIGNALS

        out: set[str] = set()
        for sig in SIGNALS.values():
            for src in sig.sources:
                m = src.metric
                out.update((m, m + "_bucket", m + "_sum", m + "_count", m + "_total", m + "_created"))
                if m.endswith("_total"):
                    out.add(m[: -len("_total")])
        out.update(d.family for d in DERIVED)
        out.update(d.metric for d in DERIVED)
        _KNOWN = frozenset(out)
    return _KNOWN


def other_engine_names() -> frozenset[str]:
    """Raw names of the engines other than vLLM that the signal table maps (SGLang, TGI, Triton,
    TensorRT-LLM), with their histogram parts and the derived families' sources."""
    global _OTHER
    if _OTHER is None:
        from ..signals import DERIVED, SIGNALS

        out: set[str] = set()
        for sig in SIGNALS.values():
            for src in sig.sources:
                m = src.metric
                if m.startswith(("vllm:", "DCGM_FI_", "fragscope_")):
                    continue
                out.update((m, m + "_bucket", m + "_sum", m + "_count", m + "_total"))
        out.update(d.family for d in DERIVED)
        _OTHER = frozenset(out)
    return _OTHER


def engine_samples(text: str, ts: float, source: str, key_cache: dict | None = None) -> list:
    """The samples of a non-vLLM engine page that the signal table reads, stamped ``ts``."""
    from .exposition import scrape_samples

    keep = other_engine_names()
    return [x for x in scrape_samples(text, ts, source, key_cache)
            if x.name in keep or (x.name.startswith("sglang_") and "sglang:" + x.name[7:] in keep)]
