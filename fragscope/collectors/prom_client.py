"""Prometheus HTTP API client: one server's transport (auth, TLS, timeouts), its answers decoded
and every failure turned into a one-line PrometheusError naming the server and the fix.

Speaks the stable HTTP API (``/api/v1/query``, ``/api/v1/query_range``), so it also works with
Thanos, Mimir, Cortex and VictoriaMetrics (give their Prometheus-compatible prefix as the URL).
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

import requests

from .prom_matrix import MATRIX_PREFIX, decode_matrix
from .prom_query import fmt_ts

# Prometheus refuses a range query asking for more than 11,000 points per series
# (web/api/v1/api.go: "exceeded maximum resolution of 11,000 points per timeseries").
MAX_POINTS_PER_SERIES = 11_000
# Characters of a response body quoted in an error message.
_QUOTE = 120


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
        if r.status_code == 200 and body.startswith(MATRIX_PREFIX):
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
        data = self.get("query", {"query": expr, "time": fmt_ts(at)})
        return _result(data, self.base)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        """A range query split so no request exceeds MAX_POINTS_PER_SERIES points per series.

        Returns the concatenated ``matrix`` items (one per series per piece).
        """
        out = []
        for s, e in range_pieces(start, end, step):
            rtype, res = _result(self.get("query_range", {"query": expr, "start": fmt_ts(s), "end": fmt_ts(e),
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
