"""Prometheus HTTP API client: fetch every raw series the detectors read, for a whole fleet.

Speaks the stable HTTP API (``/api/v1/query``, ``/api/v1/query_range``), so it also works with
Thanos, Mimir, Cortex and VictoriaMetrics (give their Prometheus-compatible prefix as the URL).

Two ways to fetch (docs/fleet.md#fetching):

* **raw** (default, no ``--step``): an instant query of a range-vector selector,
  ``{__name__=~"a|b|c",<selector>}[<chunk>s]`` evaluated at the chunk's end, returns the samples
  exactly as scraped: the same points a recording of the pod would hold, counters untouched (the
  detectors handle resets), sparse series (one kernel-gap capture every 10 minutes) not smeared by
  the 5-minute lookback. Windows are split in chunks of at most ``RAW_CHUNK_SECONDS``.
* **resampled** (``--step S``, or windows longer than ``RAW_MAX_SPAN_SECONDS``): ``query_range``
  with that step, split so that no request asks for more than ``MAX_POINTS_PER_SERIES`` points per
  series (Prometheus refuses more than 11,000). Values are the raw values at each step (no
  server-side ``rate()``: the detectors take raw counters and handle resets themselves, and a rate
  would need to be integrated back into a counter; one request per batch either way).

Names are batched: one request per group of raw metric names (``__name__`` regex), with the user's
label selector merged in. Fetching is kept apart from parsing: :func:`parse_matrix` is pure.
"""
from __future__ import annotations

import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import requests

from ..model import SeriesKey, make_labels
from ..signals import DCGM_BLANK_THRESHOLD, DERIVED, SIGNALS, normalise_name

# Prometheus refuses a range query asking for more than 11,000 points per series
# (web/api/v1/api.go: "exceeded maximum resolution of 11,000 points per timeseries").
MAX_POINTS_PER_SERIES = 11_000
# Raw fetches are split into chunks of this length (6 h: 1,440 points per series at 15 s).
RAW_CHUNK_SECONDS = 6 * 3600
# Longer windows without --step are resampled instead (a week of 1 s scrapes would be 600k points
# per series); the step is chosen to give at most AUTO_POINTS points per series.
RAW_MAX_SPAN_SECONDS = 24 * 3600
AUTO_POINTS = 5_760
# Concurrent requests (Prometheus evaluates queries in parallel; 4 keeps a small server responsive).
PARALLEL_REQUESTS = 4
# Characters of a response body quoted in an error message.
_QUOTE = 120

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SUMMARY_SUFFIXES = ("", "_sum", "_count")
# Raw names read beside the signal table: DCGM's reserved framebuffer (total = used + free + reserved),
# fragscope's derived fragmentation ratio (for fleet peers when the probe's raw bytes are absent).
EXTRA_NAMES: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("fragscope_torch_fragmentation_ratio", "gauge"),
)


class PrometheusError(Exception):
    """A failed request, as one line naming the server and the fix."""


@dataclass(frozen=True)
class PromConfig:
    """How to reach a Prometheus-compatible server."""

    url: str
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    ca_bundle: str | None = None
    insecure: bool = False
    timeout: float = 30.0  # seconds, per request


@dataclass
class Batch:
    """Raw metric names fetched in one request, with their exposition types."""

    names: tuple[str, ...]
    types: dict[str, str]

    def regex(self) -> str:
        alts = []
        for n in self.names:
            esc = re.escape(n).replace("\\:", ":")
            if n.startswith("vllm:"):  # Ray Serve LLM re-exports as ray_vllm:
                esc = "(?:ray_)?" + esc
            alts.append(esc)
        return "|".join(alts)


def signal_batches(signals: Iterable[str] | None = None) -> list[Batch]:
    """The raw names of the signal table grouped into batches (one request each per chunk).

    Histograms get their own batch (their buckets are most of the points); gauges and counters of
    one scope share one.
    """
    groups: dict[str, dict[str, str]] = {}
    wanted = set(signals) if signals is not None else None
    derived = {d.metric: d.family for d in DERIVED}
    for sig in SIGNALS.values():
        if wanted is not None and sig.id not in wanted:
            continue
        for src in sig.sources:
            name = src.metric
            if name in derived:
                # made at ingest from its engine family (collectors/engines.py): fetch the family itself
                groups.setdefault(sig.scope, {})[derived[name]] = "gauge"
                continue
            if sig.kind == "histogram":
                g = groups.setdefault(f"hist:{name}", {})
                for suf in HISTOGRAM_SUFFIXES:
                    g[name + suf] = "histogram"
            elif sig.kind == "summary":
                g = groups.setdefault(f"{sig.scope}:{name}", {})
                for suf in SUMMARY_SUFFIXES:
                    g[name + suf] = "summary"
            else:
                groups.setdefault(sig.scope, {})[name] = sig.kind
    if wanted is None:
        for name, kind in EXTRA_NAMES:
            groups.setdefault("gpu", {})[name] = kind
    return [Batch(tuple(sorted(g)), g) for _, g in sorted(groups.items())]


# ---------------------------------------------------------------------------------------------
# Selector and time parsing
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
    return ",".join(f'{k}{op}"{v}"' for k, op, v in matchers)


_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float:
    """Prometheus durations (``6h``, ``1h30m``, ``90s``, ``2d``) or plain seconds -> seconds."""
    t = str(text).strip()
    try:
        v = float(t)
    except ValueError:
        pos, total = 0, 0.0
        for m in _DUR_RE.finditer(t):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _DUR_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(t) or not t:
            raise ValueError(f"bad duration {text!r}: expected e.g. 6h, 30m, 1h30m, 90s or seconds") from None
        v = total
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"bad duration {text!r}: must be positive")
    return v


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


def _fmt_ts(ts: float) -> str:
    return f"{ts:.3f}"


# ---------------------------------------------------------------------------------------------
# Parsing (pure)
_MATRIX_PREFIX = b'{"status":"success","data":{"resultType":"matrix","result":['
_JSON = json.JSONDecoder()


def decode_matrix(body: bytes) -> dict | None:
    """Decode a successful ``matrix`` answer without building a Python object per point.

    ``json.loads`` builds two objects per point ([ts, "value"]): measured 0.59 s for a 5 MB answer
    of 256k points here, against 0.12 s for this decoder, which reads each series' ``metric`` with the
    JSON decoder and its ``values`` (numbers and quoted numbers only) with one numpy conversion.
    Returns None when the layout is not the one Prometheus writes (the caller falls back to json).
    """
    text = body.decode("utf-8")
    pos = len(_MATRIX_PREFIX)
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


# ---------------------------------------------------------------------------------------------
class PrometheusClient:
    """One server; counts its requests (``queries``) and the seconds spent in them."""

    def __init__(self, cfg: PromConfig, session: requests.Session | None = None) -> None:
        url = cfg.url.strip()
        if not re.match(r"^https?://[^/\s]+", url):
            raise PrometheusError(f"--prometheus {cfg.url!r}: expected an http:// or https:// URL, "
                                  "e.g. http://prometheus:9090")
        self.cfg = cfg
        self.base = url.rstrip("/")
        if self.base.endswith("/api/v1"):
            self.base = self.base[: -len("/api/v1")]
        self.session = session or requests.Session()
        s = self.session
        s.headers.update({"Accept": "application/json", "User-Agent": "fragscope"})
        s.headers.update(dict(cfg.headers))
        if cfg.bearer_token:
            s.headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        if cfg.basic_auth:
            s.auth = cfg.basic_auth
        s.verify = False if cfg.insecure else (cfg.ca_bundle or True)
        if cfg.insecure:
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.queries = 0
        self.seconds = 0.0
        self.warnings: list[str] = []
        self._lock = threading.Lock()

    # -- transport ------------------------------------------------------------------------------
    def get(self, path: str, params: Mapping[str, str]) -> object:
        """GET ``/api/v1/<path>`` and return ``data``; every failure is a PrometheusError."""
        url = f"{self.base}/api/v1/{path}"
        where = f"Prometheus at {self.base}"
        t0 = time.perf_counter()
        try:
            # POST would lift URL-length limits, but some proxies only allow GET for read paths;
            # our queries are a few hundred characters.
            r = self.session.get(url, params=params, timeout=self.cfg.timeout)
        except requests.exceptions.SSLError as e:
            raise PrometheusError(f"{where}: TLS error ({_short(e)}); give --ca-bundle FILE, or --insecure "
                                  "to skip verification") from None
        except requests.exceptions.ConnectTimeout:
            raise PrometheusError(f"{where}: no connection within {self.cfg.timeout:g} s (is the address right?)") from None
        except requests.exceptions.ReadTimeout:
            raise PrometheusError(f"{where}: no answer within {self.cfg.timeout:g} s; raise --timeout, or narrow "
                                  "--since / --selector") from None
        except requests.exceptions.ConnectionError as e:
            raise PrometheusError(f"cannot reach {where}: {_conn_reason(e)}") from None
        except requests.exceptions.RequestException as e:
            raise PrometheusError(f"{where}: request failed ({_short(e)})") from None
        finally:
            with self._lock:
                self.queries += 1
                self.seconds += time.perf_counter() - t0
        return self._decode(r, where, path)

    def _decode(self, r: requests.Response, where: str, path: str) -> object:
        ctype = r.headers.get("Content-Type", "")
        body = r.content
        if r.status_code == 200 and body.startswith(_MATRIX_PREFIX):
            fast = decode_matrix(body)
            if fast is not None:
                self.warnings.extend(str(w) for w in fast.pop("_warnings", []))
                return fast
        head = body[:512].lstrip().lower()
        is_html = "html" in ctype or head.startswith(b"<!doctype html") or head.startswith(b"<html")
        payload = None
        if not is_html:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
        if isinstance(payload, dict) and payload.get("status") == "error":
            etype = payload.get("errorType", "error")
            err = str(payload.get("error", "")).splitlines()[0] if payload.get("error") else ""
            hint = ""
            if "11,000 points" in err or "11000 points" in err:
                hint = "; raise --step or shorten the window"
            elif r.status_code == 422 or "too many samples" in err or etype in ("execution", "timeout"):
                hint = "; shorten the window (--since), raise --step or narrow --selector"
            elif etype == "bad_data":
                hint = "; check --selector"
            raise PrometheusError(f"{where}: query refused ({r.status_code} {etype}): {err[:300]}{hint}")
        if r.status_code in (401, 403):
            raise PrometheusError(f"{where}: {r.status_code} {r.reason or 'unauthorized'}: authentication "
                                  "refused; give --bearer-token/--bearer-token-file, --basic-auth USER:PASS or "
                                  "--header")
        if r.status_code == 404:
            raise PrometheusError(f"{where}: 404 Not Found for /api/v1/{path}: not a Prometheus HTTP API; give "
                                  "the server root (http://host:9090) or the Prometheus-compatible prefix "
                                  "(e.g. Mimir's http://host/prometheus)")
        if r.status_code >= 400:
            raise PrometheusError(f"{where}: HTTP {r.status_code} {r.reason or ''}".rstrip()
                                  + f": {_quote(body)}")
        if is_html:
            raise PrometheusError(f"{where}: answered with an HTML page, not Prometheus JSON (a login page or "
                                  "a proxy? check the URL and the auth flags)")
        if not isinstance(payload, dict) or "data" not in payload:
            raise PrometheusError(f"{where}: answer is not Prometheus API JSON: {_quote(body)}")
        for w in payload.get("warnings") or []:
            self.warnings.append(str(w))
        return payload["data"]

    # -- queries --------------------------------------------------------------------------------
    def query(self, expr: str, at: float) -> tuple[str, list]:
        data = self.get("query", {"query": expr, "time": _fmt_ts(at)})
        return _result(data, self.base)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        """A range query split so no request exceeds MAX_POINTS_PER_SERIES points per series.

        Returns the concatenated ``matrix`` items (one per series per piece).
        """
        out = []
        for s, e in range_pieces(start, end, step):
            rtype, res = _result(self.get("query_range", {"query": expr, "start": _fmt_ts(s), "end": _fmt_ts(e),
                                                          "step": f"{step:g}"}), self.base)
            out.extend(res)
        return out

    def buildinfo(self) -> dict:
        """``/api/v1/status/buildinfo`` (absent on some compatible servers: returns {})."""
        try:
            d = self.get("status/buildinfo", {})
        except PrometheusError as e:
            if "404" in str(e):
                return {}
            raise
        return d if isinstance(d, dict) else {}


def range_pieces(start: float, end: float, step: float,
                 max_points: int = MAX_POINTS_PER_SERIES) -> list[tuple[float, float]]:
    """Split [start, end] so that each piece holds at most ``max_points`` steps (no step twice)."""
    if step <= 0:
        raise ValueError("step must be positive")
    pieces = []
    span = (max_points - 1) * step
    s = start
    while s <= end:
        e = min(end, s + span)
        pieces.append((s, e))
        s = e + step
    return pieces


def _result(data: object, base: str) -> tuple[str, list]:
    if not isinstance(data, dict) or "result" not in data:
        raise PrometheusError(f"Prometheus at {base}: answer has no 'result' field")
    res = data["result"]
    rtype = data.get("resultType", "")
    if rtype in ("scalar", "string"):
        return rtype, []
    if not isinstance(res, list):
        raise PrometheusError(f"Prometheus at {base}: unexpected result type {rtype!r}")
    return rtype, res


def _short(e: Exception) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]


def _conn_reason(e: Exception) -> str:
    s = str(e)
    for pat, why in (("Connection refused", "connection refused (nothing listens there)"),
                     ("Name or service not known", "unknown host name"),
                     ("nodename nor servname", "unknown host name"),
                     ("Temporary failure in name resolution", "host name does not resolve"),
                     ("No route to host", "no route to host"),
                     ("Network is unreachable", "network unreachable"),
                     ("RemoteDisconnected", "the server closed the connection without answering")):
        if pat in s:
            return why
    return _short(e)


def _quote(body: bytes) -> str:
    txt = body[:_QUOTE].decode("utf-8", "replace").replace("\n", " ").strip()
    return repr(txt) if txt else "(empty body)"


# ---------------------------------------------------------------------------------------------
@dataclass
class FetchResult:
    """Raw columns for every series found, plus what the fetch cost and what it noticed."""

    cols: dict[SeriesKey, tuple[np.ndarray, np.ndarray]]
    types: dict[str, str]
    start: float
    end: float
    mode: str  # "raw" | "resampled"
    step: float | None
    queries: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def fetch(client: PrometheusClient, start: float, end: float, selector: str | None = None,
          step: float | None = None, batches: list[Batch] | None = None,
          parallel: int = PARALLEL_REQUESTS) -> FetchResult:
    """Fetch every batch of raw names over [start, end] for the series matching ``selector``.

    DCGM series of Kubernetes pods carry the workload in ``exported_pod``/``exported_namespace``
    when Prometheus scrapes dcgm-exporter without ``honor_labels``: a selector on ``pod`` or
    ``namespace`` is also tried with those names for the DCGM batch.
    """
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PrometheusError(f"empty time window: start {start} is not before end {end}")
    matchers = parse_selector(selector) if isinstance(selector, str) else list(selector or [])
    batches = batches if batches is not None else signal_batches()
    span = end - start
    notes: list[str] = []
    mode = "raw"
    if step is None and span > RAW_MAX_SPAN_SECONDS:
        step = max(1.0, math.ceil(span / AUTO_POINTS))
        notes.append(f"window of {span / 3600:.1f} h is longer than {RAW_MAX_SPAN_SECONDS // 3600} h: "
                     f"resampled at a {step:g} s step (give --step to choose)")
    if step is not None:
        mode = "resampled"

    jobs: list[tuple[str, dict[str, str]]] = []
    for b in batches:
        variants = [matchers]
        if any(n.startswith("DCGM_") for n in b.names) and any(k in ("pod", "namespace") for k, _, _ in matchers):
            variants.append([(("exported_" + k) if k in ("pod", "namespace") else k, op, v)
                             for k, op, v in matchers])
        for m in variants:
            inner = f'__name__=~"{b.regex()}"'
            if m:
                inner += "," + format_matchers(m)
            sel = "{" + inner + "}"
            jobs.append((sel, b.types))

    q0, s0 = client.queries, time.perf_counter()

    def run(job: tuple[str, dict[str, str]]) -> list:
        sel, _ = job
        if mode == "raw":
            items = []
            t = end
            while t > start:
                lo = max(start, t - RAW_CHUNK_SECONDS)
                # range selectors include both ends in Prometheus 2.x, not the left end in 3.x:
                # ask for 1 ms more and trim below, duplicates at the edges are dropped
                dur_ms = int(math.ceil((t - lo) * 1000)) + 1
                _, res = client.query(f"{sel}[{dur_ms}ms]", t)
                items.extend(res)
                t = lo
            return items
        return client.query_range(sel, start, end, step)

    if parallel > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=min(parallel, len(jobs))) as ex:
            results = list(ex.map(run, jobs))
    else:
        results = [run(j) for j in jobs]
    cols: dict[SeriesKey, tuple[list, list]] = {}
    types: dict[str, str] = {}
    for (sel, btypes), items in zip(jobs, results):
        parse_matrix(items, cols=cols)
        types.update(btypes)
    done = finish_columns(cols)
    if mode == "raw":
        for key, (ts, vs) in list(done.items()):
            keep = (ts >= start - 1e-6) & (ts <= end + 1e-6)
            if not keep.all():
                if keep.any():
                    done[key] = (ts[keep], vs[keep])
                else:
                    del done[key]
    if client.warnings:
        notes.extend(f"server warning: {w}" for w in dict.fromkeys(client.warnings))
    return FetchResult(done, types, start, end, mode, step, client.queries - q0,
                       time.perf_counter() - s0, notes)
