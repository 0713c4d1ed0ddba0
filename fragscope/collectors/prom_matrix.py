"""Prometheus ``matrix`` answers into columns: a fast decoder for the layout Prometheus writes, the
pure parser into per-series (ts, value) arrays, and the join of chunked pieces. No I/O."""
from __future__ import annotations

import json
from typing import Mapping

import numpy as np

from ..model import SeriesKey, make_labels
from ..signals import DCGM_BLANK_THRESHOLD, normalise_name

MATRIX_PREFIX = b'{"status":"success","data":{"resultType":"matrix","result":['
_JSON = json.JSONDecoder()


def decode_matrix(body: bytes) -> dict | None:
    """Decode a successful ``matrix`` answer without building a Python object per point.

    ``json.loads`` builds two objects per point ([ts, "value"]): measured 0.59 s for a 5 MB answer
    of 256k points here, against 0.12 s for this decoder, which reads each series' ``metric`` with the
    JSON decoder and its ``values`` (numbers and quoted numbers only) with one numpy conversion.
    Returns None when the layout is not the one Prometheus writes (the caller falls back to json).
    """
    text = body.decode("utf-8")
    pos = len(MATRIX_PREFIX)
    items = []
    n = len(text)
    while pos < n and text[pos] != "]":
        if not text.startswith('{"metric":', pos):
            return None
        try:
            metric, pos = _JSON.raw_decode(text, pos + 10)
        except ValueError:
            return None
        if not text.startswith(',"values":[', pos):
            return None
        end = text.find("]]", pos)
        if end < 0 or not text.startswith("]]}", end):
            return None
        seg = text[pos + 11: end + 1]
        pos = end + 3
        if seg:
            flat = seg.replace("[", "").replace("]", "").replace('"', "")
            try:
                arr = np.array(flat.split(","), dtype=np.float64)
            except ValueError:
                return None
            if arr.size % 2:
                return None
            items.append({"metric": metric, "ts": arr[0::2], "vs": arr[1::2]})
        if pos < n and text[pos] == ",":
            pos += 1
    if not text.startswith("]", pos):
        return None
    rest = text[pos + 1:]
    if rest.startswith("}}") or rest.startswith("},"):
        if '"warnings"' in rest:
            try:
                tail = json.loads("{" + rest[2:]) if rest.startswith("},") else {}
            except ValueError:
                tail = {}
            return {"resultType": "matrix", "result": items, "_warnings": tail.get("warnings", [])}
        return {"resultType": "matrix", "result": items}
    return None


def parse_matrix(result: list, types: Mapping[str, str] | None = None,
                 cols: dict[SeriesKey, tuple[list, list]] | None = None) -> dict[SeriesKey, tuple[list, list]]:
    """A ``matrix`` result (``[{"metric": {...}, "values": [[ts, "v"], ...]}, ...]``) -> columns.

    Names are normalised (``ray_vllm:`` -> ``vllm:``); DCGM blank sentinels and NaN are dropped
    (absent is not zero). Appends to ``cols`` when given (chunks of one series concatenate).
    """
    out = cols if cols is not None else {}
    for item in result:
        metric = item.get("metric") or {}
        name = normalise_name(metric.get("__name__", ""))
        labels = make_labels((k, v) for k, v in metric.items() if k != "__name__")
        if "ts" in item:  # from decode_matrix
            ts, vs = item["ts"], item["vs"]
        else:
            values = item.get("values")
            if values is None and "value" in item:
                values = [item["value"]]
            if not values:
                continue
            arr = np.array(values, dtype=object)
            ts = arr[:, 0].astype(np.float64)
            vs = arr[:, 1].astype(np.float64)  # "NaN", "+Inf" parse too
        ok = np.isfinite(vs)
        if name.startswith("DCGM_"):
            ok &= vs <= DCGM_BLANK_THRESHOLD
        if not ok.all():
            ts, vs = ts[ok], vs[ok]
        if not ts.size:
            continue
        key = SeriesKey(name, labels)
        c = out.get(key)
        if c is None:
            out[key] = ([ts], [vs])
        else:
            c[0].append(ts)
            c[1].append(vs)
    return out


def finish_columns(cols: Mapping[SeriesKey, tuple[list, list]]) -> dict[SeriesKey, tuple[np.ndarray, np.ndarray]]:
    """Concatenate chunk pieces; drop duplicate timestamps at chunk edges (first kept)."""
    res = {}
    for key, (tl, vl) in cols.items():
        ts = np.concatenate(tl) if len(tl) > 1 else tl[0]
        vs = np.concatenate(vl) if len(vl) > 1 else vl[0]
        if len(tl) > 1:
            order = np.argsort(ts, kind="stable")
            ts, vs = ts[order], vs[order]
            keep = np.ones(ts.size, dtype=bool)
            keep[1:] = ts[1:] != ts[:-1]
            ts, vs = ts[keep], vs[keep]
        if ts.size:
            res[key] = (ts, vs)
    return res
