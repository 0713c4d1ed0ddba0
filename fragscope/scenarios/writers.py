"""Write generated columns as OpenMetrics (seconds, ``# EOF``) or Prometheus text 0.0.4 (milliseconds).

OpenMetrics layout (what ``promtool tsdb create-blocks-from openmetrics`` reads): one family at a time,
typed once; counter families typed without ``_total`` while their samples carry it; each series'
points in time order; a histogram or summary written one MetricPoint at a time (every bucket or
quantile, then ``_count`` and ``_sum`` for one timestamp, then the next timestamp).
"""
from __future__ import annotations

import gzip as _gzip
import io
from collections import defaultdict
from typing import IO, Callable

import numpy as np

from ..model import SeriesKey

_HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
    "fragscope_kernel_gap_seconds": "Gap between consecutive kernels in the last trace capture.",
    "fragscope_gpu_idle_ratio": "Share of the last trace capture with no kernel running.",
}


def _family(name: str, typ: str) -> str:
    if typ == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    if typ in ("histogram", "summary"):
        for suf in ("_bucket", "_count", "_sum"):
            if name.endswith(suf):
                return name[: -len(suf)]
    return name


def _fmt_value(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _label_str(labels, extra_last: str | None = None) -> str:
    """Label set as text; ``le``/``quantile`` go last (as client libraries write them)."""
    items = [(k, v) for k, v in labels if k != extra_last]
    items += [(k, v) for k, v in labels if k == extra_last]
    if not items:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _ts_formatter(ts_all: list[np.ndarray], millis: bool) -> Callable[[np.ndarray], list[str]]:
    if millis:
        return lambda t: [str(int(x)) for x in np.round(t * 1000.0).astype(np.int64)]
    integral = all(bool(np.all(t == np.floor(t))) for t in ts_all)
    if integral:
        return lambda t: [str(int(x)) for x in t.astype(np.int64)]
    return lambda t: [repr(float(x)) for x in t]


def _values(v: np.ndarray) -> list[str]:
    if np.all(v == np.floor(v)) and np.all(np.abs(v) < 1e15):
        return [str(x) for x in v.astype(np.int64).tolist()]
    return [_fmt_value(x) for x in v.tolist()]


def _group(cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]], types: dict[str, str]):
    """family -> (type, {labels without le/quantile: [(sample name, labels, ts, values)]})."""
    fams: dict[str, tuple[str, dict]] = {}
    for key, (t, v) in cols.items():
        typ = types.get(key.name, "untyped")
        fam = _family(key.name, typ)
        if fam not in fams:
            fams[fam] = (typ, defaultdict(list))
        point_labels = tuple((k, x) for k, x in key.labels if k not in ("le", "quantile"))
        fams[fam][1][point_labels].append((key.name, key.labels, t, v))
    return fams


def _write(cols, types, out: IO[str], openmetrics: bool) -> None:
    fams = _group(cols, types)
    fmt_ts = _ts_formatter([t for t, _ in cols.values()], millis=not openmetrics)
    buf: list[str] = []
    w = buf.append
    for fam, (typ, metrics) in fams.items():
        ftyp = typ if typ in ("counter", "gauge", "histogram", "summary") else "unknown"
        if openmetrics:
            tname = fam
        else:
            ftyp = "untyped" if ftyp == "unknown" else ftyp
            tname = fam + "_total" if typ == "counter" else fam
        help_ = _HELP.get(fam)
        if help_:
            w(f"# HELP {tname} {help_}\n")
        w(f"# TYPE {tname} {ftyp}\n")
        for point_labels, parts in metrics.items():
            if typ in ("histogram", "summary"):
                order = {"_bucket": 0, "_count": 2, "_sum": 3}

                def sort_key(p):
                    name, labels, _, _ = p
                    suf = name[len(fam):]
                    le = dict(labels).get("le", dict(labels).get("quantile"))
                    lev = float("inf") if le in (None, "+Inf") else float(le)
                    return (order.get(suf, 1), lev)

                parts = sorted(parts, key=sort_key)
                t0 = parts[0][2]
                if any(p[2].shape != t0.shape or not np.array_equal(p[2], t0) for p in parts):
                    raise ValueError(f"{fam}: histogram/summary samples are not aligned in time")
                heads = [f"{name}{_label_str(labels, 'le' if typ == 'histogram' else 'quantile')} "
                         for name, labels, _, _ in parts]
                vals = [_values(p[3]) for p in parts]
                tss = fmt_ts(t0)
                for j, tstr in enumerate(tss):
                    for h, vs in zip(heads, vals):
                        w(f"{h}{vs[j]} {tstr}\n")
            else:
                for name, labels, t, v in parts:
                    head = f"{name}{_label_str(labels)} "
                    w("".join(f"{head}{a} {b}\n" for a, b in zip(_values(v), fmt_ts(t))))
        if len(buf) > 2000:
            out.write("".join(buf))
            buf.clear()
    if openmetrics:
        w("# EOF\n")
    out.write("".join(buf))


def _open(fh_or_path, gzip: bool | None):
    if isinstance(fh_or_path, (str, bytes)) or hasattr(fh_or_path, "__fspath__"):
        path = str(fh_or_path)
        use_gz = path.endswith(".gz") if gzip is None else gzip
        if use_gz:
            raw = _gzip.open(path, "wb", compresslevel=6)
            return io.TextIOWrapper(raw, encoding="utf-8", newline="\n"), True
        return open(path, "w", encoding="utf-8", newline="\n"), True
    if gzip:  # the caller's binary handle: compress into it, leave it open
        raw = _gzip.GzipFile(fileobj=fh_or_path, mode="wb", compresslevel=6)
        return io.TextIOWrapper(raw, encoding="utf-8", newline="\n"), "gzip"
    if isinstance(fh_or_path, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(fh_or_path, "mode", ""):
        return io.TextIOWrapper(fh_or_path, encoding="utf-8", newline="\n"), "detach"
    return fh_or_path, False


def write_columns(cols, types, fh_or_path, *, openmetrics: bool = True, gzip: bool | None = None) -> None:
    """Write columns to a path (``.gz``: gzipped unless ``gzip`` says otherwise) or an open file."""
    out, how = _open(fh_or_path, gzip)
    try:
        _write(cols, types, out, openmetrics)
    finally:
        if how is True:
            out.close()
        elif how == "gzip":
            out.flush()
            gz = out.detach()
            gz.close()  # writes the gzip trailer; the caller's file stays open
        elif how == "detach":
            out.flush()
            out.detach()
        else:
            out.flush()
