"""Client side of live diagnosis: read a running agent's history, sample a live server, and write
recordings as OpenMetrics (what ``diagnose FILE`` and ``promtool tsdb create-blocks-from openmetrics``
both read). No prometheus_client here: ``diagnose --agent`` stays light.
"""
from __future__ import annotations

import math
import re
import time
from typing import IO, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..model import Sample, SeriesKey, Window, make_labels
from .config import DEFAULT_PORT
from .store import infer_types, series_type

MAX_RESPONSE_BYTES = 512 * 1024 * 1024


class ClientError(RuntimeError):
    """One line naming the URL and the problem."""


# ---------------------------------------------------------------------------------------------
# diagnose --agent URL
def window_from_json(d: Mapping[str, Any], source: str = "") -> Window:
    """The inverse of ``api.window_to_json``."""
    if not isinstance(d, Mapping) or not isinstance(d.get("series"), list):
        raise ClientError(f"{source or 'response'}: not a fragscope window (no 'series' list)")
    cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = {}
    types: dict[str, str] = {}
    for s in d["series"]:
        try:
            key = SeriesKey(str(s["name"]), make_labels(s.get("labels") or {}))
            ts = np.asarray(s["ts"], dtype=np.float64)
            vs = np.asarray(s["values"], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            raise ClientError(f"{source or 'response'}: malformed series entry in the window") from None
        if ts.shape != vs.shape:
            raise ClientError(f"{source or 'response'}: series {key} has {ts.size} timestamps but {vs.size} values")
        cols[key] = (ts, vs)
        types[key.name] = str(s.get("type") or series_type(key.name))
    w = Window.from_columns(cols, source=source or str(d.get("source") or "agent"), types=types)
    return w


BUSY_RETRIES = 5  # the agent runs one history query at a time and answers 503 + Retry-After meanwhile


def _get_json(url: str, timeout_s: float) -> Any:
    import time as _time

    for attempt in range(BUSY_RETRIES + 1):
        try:
            return _get_json_once(url, timeout_s)
        except _Busy as b:
            if attempt == BUSY_RETRIES:
                raise ClientError(f"{url}: the agent stayed busy with other history queries; try again") from None
            _time.sleep(b.wait_s)
    return None


class _Busy(Exception):
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s


def _get_json_once(url: str, timeout_s: float) -> Any:
    import requests

    try:
        resp = requests.get(url, timeout=(min(5.0, timeout_s), timeout_s), stream=True,
                            headers={"Accept": "application/json", "User-Agent": "fragscope"})
    except requests.exceptions.Timeout:
        raise ClientError(f"{url}: timed out after {timeout_s:g} s") from None
    except requests.exceptions.ConnectionError as e:
        why = "connection refused" if "refused" in str(e).lower() else "cannot connect"
        raise ClientError(f"{url}: {why}; is `fragscope agent` running there (default port {DEFAULT_PORT})?") from None
    except requests.exceptions.RequestException as e:
        raise ClientError(f"{url}: {type(e).__name__}: {' '.join(str(e).split())[:160]}") from None
    try:
        buf = bytearray()
        for chunk in resp.iter_content(1 << 16):
            buf += chunk
            if len(buf) > MAX_RESPONSE_BYTES:
                raise ClientError(f"{url}: response over {MAX_RESPONSE_BYTES} bytes; ask for a shorter --since")
    except requests.exceptions.RequestException as e:
        raise ClientError(f"{url}: reading the response failed ({' '.join(str(e).split())[:160]})") from None
    finally:
        resp.close()
    ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
    try:
        import json

        body = json.loads(buf.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ClientError(f"{url}: not a fragscope agent (HTTP {resp.status_code}, {ctype or 'no content type'}, "
                          "not JSON)") from None
    if resp.status_code == 503 and resp.headers.get("Retry-After"):
        try:
            raise _Busy(min(5.0, max(0.2, float(resp.headers["Retry-After"]))))
        except ValueError:
            pass
    if resp.status_code >= 400:
        msg = body.get("error") if isinstance(body, dict) else None
        raise ClientError(f"{url}: HTTP {resp.status_code}: {msg or 'error'}")
    return body


def agent_base(agent_url: str) -> str:
    """An agent's base URL from what was typed (``http://pod:9655``, ``pod:9655``, or its ``/metrics``
    URL), through the one URL resolver's rules (collectors/endpoint.py). Raises ClientError."""
    from ..collectors.endpoint import EndpointError, base_of, looks_like_url, normalise

    hint = f"expected the URL of a fragscope agent (e.g. http://pod:{DEFAULT_PORT})"
    s = str(agent_url).strip()
    if not looks_like_url(s):
        raise ClientError(f"{agent_url}: {hint}")
    try:
        return base_of(normalise(s))
    except EndpointError as e:
        raise ClientError(f"{e}; {hint}") from None


def fetch_window(agent_url: str, since_s: float, step_s: float | None = None, timeout_s: float = 60.0) -> Window:
    """The last ``since_s`` seconds of a running agent's history (at ``step_s``, default the
    agent's detection step). Raises ClientError."""
    base = agent_base(agent_url)
    url = f"{base}/api/v1/window?since={since_s:g}"
    if step_s is not None:
        url += f"&step={step_s:g}"
    d = _get_json(url, timeout_s)
    w = window_from_json(d, source=f"agent {base}")
    if not w.series:
        raise ClientError(f"{base}: the agent has no history for the last {since_s:g} s yet")
    return w


# ---------------------------------------------------------------------------------------------
# diagnose --vllm URL --duration 2m / fragscope record
def live_collectors(vllm_urls: Sequence[str], dcgm_url: str | None, timeout_s: float = 5.0) -> list:
    out = []
    if vllm_urls:
        from ..collectors.vllm import VllmCollector

        for u in vllm_urls:
            out.append(VllmCollector(u, timeout_s=timeout_s))
    if dcgm_url:
        from ..collectors.dcgm import DcgmCollector

        out.append(DcgmCollector(dcgm_url, timeout_s=timeout_s))
    return out


def sample_live(vllm_urls: Sequence[str], dcgm_url: str | None, duration_s: float, interval_s: float,
                on_tick: Callable[[int, int, list[str]], None] | None = None,
                collectors: Sequence[Any] | None = None, keep_all: bool = True,
                should_stop: Callable[[], bool] | None = None) -> Window:
    """Sample live endpoints every ``interval_s`` for ``duration_s`` (bounded: at most
    duration/interval + 1 rounds) and return the window. Raises ClientError when no endpoint
    answered even once. ``on_tick(round, samples, errors)`` reports progress."""
    cols = collectors if collectors is not None else live_collectors(vllm_urls, dcgm_url)
    if not cols:
        raise ClientError("nothing to sample: give --vllm URL and/or --dcgm URL")
    rounds = max(1, int(math.floor(duration_s / interval_s)) + 1)
    samples: list[Sample] = []
    errors: dict[str, str] = {}
    ok_rounds = 0
    t_start = time.monotonic()
    interrupted = False
    for r in range(rounds):
        due = t_start + r * interval_s
        delay = due - time.monotonic()
        try:
            if delay > 0:
                time.sleep(delay)
        except KeyboardInterrupt:  # Ctrl-C: keep what was sampled
            interrupted = True
            break
        if should_stop is not None and should_stop():
            break
        now = time.time()
        round_err = []
        got = 0
        for c in cols:
            try:
                res = c.collect(now)
            except Exception as e:  # noqa: BLE001 - collectors never raise; be safe
                round_err.append(f"{getattr(c, 'name', 'collector')}: {e}")
                continue
            if not res.up:
                round_err.append(res.error or f"{getattr(c, 'name', 'collector')}: down")
                errors[getattr(c, "name", "collector")] = res.error or "down"
            for s in res.samples:
                if keep_all or s.name.startswith("fragscope_") or s.name.startswith("vllm:") or \
                        s.name.startswith("DCGM_"):
                    samples.append(s)
                    got += 1
        if got:
            ok_rounds += 1
        if on_tick is not None:
            on_tick(r + 1, got, round_err)
    if not samples:
        why = "; ".join(sorted(set(errors.values()))) or "no samples"
        raise ClientError(f"no data sampled in {duration_s:g} s: {why}")
    keys = {SeriesKey(s.name, s.labels) for s in samples}
    w = Window.from_samples(samples, source="live: " + ", ".join([*vllm_urls, *([dcgm_url] if dcgm_url else [])]),
                            types=infer_types(keys))
    if interrupted:
        w.notes.append(f"sampling interrupted after {ok_rounds} rounds")
    elif ok_rounds < rounds:
        w.notes.append(f"{rounds - ok_rounds} of {rounds} sampling rounds returned nothing")
    return w


# ---------------------------------------------------------------------------------------------
# OpenMetrics writer
_RESERVED = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")
_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Iterable[tuple[str, str]]) -> str:
    items = [f'{k}="{_esc(v)}"' for k, v in labels]
    return "{" + ",".join(items) + "}" if items else ""


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _le_key(v: str | None) -> float:
    try:
        return float(v) if v not in (None, "+Inf") else math.inf
    except ValueError:
        return math.inf


def _family(name: str, typ: str) -> tuple[str, str, str]:
    """(family name, OpenMetrics type, component) for a sample name and its series type."""
    if typ == "counter" and name.endswith("_total"):
        return name[:-6], "counter", "total"
    if typ in ("histogram", "summary"):
        for suf in ("_bucket", "_count", "_sum"):
            if name.endswith(suf):
                if suf == "_bucket" and typ == "summary":
                    break
                return name[: -len(suf)], typ, suf[1:]
        if typ == "summary":
            return name, "summary", "quantile"
    if typ == "gauge" and not name.endswith(_RESERVED):
        return name, "gauge", ""
    return name, "unknown", ""


def write_openmetrics(src: Window | Iterable[Sample], fh: IO[str]) -> int:
    """Write ``src`` as OpenMetrics text with timestamps (seconds) and ``# EOF``.

    Counter families are typed without ``_total``; a histogram or summary is written one
    MetricPoint at a time (all buckets or quantiles, then ``_count`` and ``_sum``) per timestamp.
    A histogram without its ``+Inf`` bucket, or a counter not named ``_total``, is written as
    ``unknown`` so promtool still accepts the file. Returns the number of sample lines.
    """
    if isinstance(src, Window):
        guess = infer_types(src.series)
        series = [(k, s.ts, s.values, s.type if s.type not in ("untyped", "unknown", "") else guess[k.name])
                  for k, s in src.series.items()]
    else:
        cols: dict[SeriesKey, tuple[list[float], list[float]]] = {}
        for s in src:
            c = cols.setdefault(SeriesKey(s.name, s.labels), ([], []))
            c[0].append(s.ts)
            c[1].append(s.value)
        w = Window.from_columns(cols, types=infer_types(cols))
        series = [(k, s.ts, s.values, s.type) for k, s in w.series.items()]
    # family -> (type, labelset -> component -> list of (extra label, ts, values))
    fams: dict[str, list] = {}
    for key, ts, vs, typ in series:
        if not _NAME_OK.match(key.name) or any(not _LABEL_OK.match(k) for k, _ in key.labels):
            continue
        if key.name.endswith("_created"):
            continue
        fam, omt, comp = _family(key.name, typ)
        entry = fams.setdefault(fam, [omt, {}])
        if entry[0] != omt:
            entry[0] = "unknown" if omt == "unknown" or entry[0] == "unknown" else entry[0]
        extra = None
        lab = key.labels
        if comp == "bucket":
            extra = key.label("le")
            lab = key.without("le")
        elif comp == "quantile":
            extra = key.label("quantile")
            lab = key.without("quantile")
        entry[1].setdefault(lab, []).append((comp, extra, key.name, key.labels, ts, vs))
    # a histogram needs +Inf buckets everywhere; otherwise fall back to unknown, per component
    for fam, entry in list(fams.items()):
        if entry[0] == "histogram":
            ok = all(any(c == "bucket" and _le_key(x) == math.inf for c, x, *_ in comps)
                     for comps in entry[1].values())
            if not ok:
                del fams[fam]
                for lab, comps in entry[1].items():
                    for comp in comps:
                        fams.setdefault(comp[2], ["unknown", {}])[1].setdefault(comp[3], []).append(
                            ("", None, comp[2], comp[3], comp[4], comp[5]))
    order = {"bucket": 0, "quantile": 0, "total": 0, "": 0, "count": 1, "sum": 2}
    n = 0
    write = fh.write
    for fam in sorted(fams):
        omt, metrics = fams[fam]
        write(f"# TYPE {fam} {omt}\n")
        for lab in sorted(metrics):
            comps = sorted(metrics[lab], key=lambda c: (order.get(c[0], 3), _le_key(c[1]) if c[0] in
                                                        ("bucket", "quantile") else 0, c[2]))
            if len(comps) == 1 or omt not in ("histogram", "summary"):
                for _, _, name, labels, ts, vs in comps:
                    lt = f"{name}{_fmt_labels(labels)} "
                    for t, v in zip(ts, vs):
                        write(f"{lt}{_fmt_value(v)} {t:.3f}\n")
                        n += 1
                continue
            # one MetricPoint per timestamp: all components sharing that timestamp
            all_ts = np.unique(np.concatenate([c[4] for c in comps]))
            idx = [0] * len(comps)
            prefixes = [f"{c[2]}{_fmt_labels(c[3])} " for c in comps]
            for t in all_ts:
                tt = f"{t:.3f}"
                for j, c in enumerate(comps):
                    ts_j = c[4]
                    i = idx[j]
                    if i < ts_j.size and ts_j[i] == t:
                        write(f"{prefixes[j]}{_fmt_value(c[5][i])} {tt}\n")
                        idx[j] = i + 1
                        n += 1
    write("# EOF\n")
    return n
