"""One resolver for engine URLs: what a user types (``http://host:8000``, ``host:8000``, a full
``/metrics`` URL) -> the metrics page behind it and what serves it (docs/collectors.md#endpoints).

Used by every place that is given an engine's address: ``diagnose URL``, ``diagnose --vllm``,
``fragscope record``, ``diagnose scrape --url`` and the agent's vLLM / dcgm collectors.

* :func:`candidates` -- the URLs to try, in order: with an empty path ``/metrics`` then ``/``
  (vLLM, SGLang, TGI, dcgm-exporter and the agent all serve ``/metrics``; vLLM answers ``/`` with
  404); with a path, the URL then ``URL/metrics``; a full ``.../metrics`` URL alone. For Triton's
  HTTP (8000) or gRPC (8001) port, its metrics port 8002 last (Triton serves ``/metrics`` there only).
* :func:`classify` -- the kinds of page a body is, from its metric names.
* :func:`resolve` -- one pass over the candidates for a command: the first page fragscope reads, or
  :class:`EndpointError` (one line) at once on what cannot go away.
* :class:`Endpoint` -- the same for a collector that runs for days: the page found is kept; an
  engine that is not up yet is tried again on the next tick; a page that disappears (404) is
  looked for again.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

from ..model import Reason
from .address import looks_like_url  # noqa: F401  (re-exported: the resolver's callers use it)
from .http import FetchError, http_get

log = logging.getLogger("fragscope.collectors.endpoint")

KIND_TEXT = {"vllm-v1": "vLLM (V1 engine)", "vllm-v0": "vLLM (V0 engine)", "vllm": "vLLM",
             "sglang": "SGLang", "dcgm": "dcgm-exporter", "agent": "fragscope agent",
             "engine": "TGI / Triton / TensorRT-LLM"}
# Kinds an engine collector (the agent's --vllm) accepts: vLLM of either generation, and the other
# engines its parser reads through the signal table (docs/engines.md).
ENGINE_PAGE_KINDS = frozenset({"vllm-v1", "vllm-v0", "vllm", "sglang", "engine"})
DCGM_PAGE_KINDS = frozenset({"dcgm"})
# Triton Inference Server: HTTP on 8000, gRPC on 8001, Prometheus metrics on 8002 only
# (Triton's docs, "Metrics": "available at http://localhost:8002/metrics"). A user who gives the
# server's address gets its metrics port tried last.
TRITON_METRICS_PORT = {8000: 8002, 8001: 8002}
# host:port, [v6]:port, optionally followed by a path: what people paste from `kubectl get svc`
_FATAL_CONN = ("connection refused", "host name not found", "host unreachable", "invalid URL")
HINT = ("give the server's metrics URL (vLLM, SGLang, TGI: http://host:port/metrics; Triton: "
        "http://host:8002/metrics; dcgm-exporter: http://host:9400/metrics)")


class EndpointError(Exception):
    """No metrics page behind a URL. ``str(e)`` is one line naming each URL tried and the fix;
    ``fatal`` is True when waiting will not help a command (refused, unknown host, a timeout)."""

    def __init__(self, message: str, reason: Reason = Reason.SOURCE_DOWN, fatal: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.fatal = fatal


def normalise(arg: str) -> str:
    """``host:port[/path]`` -> ``http://host:port[/path]``; an http(s) URL is kept. Raises EndpointError."""
    s = str(arg).strip()
    if not re.match(r"^https?://", s, re.I):
        s = "http://" + s
    parts = urlsplit(s)
    try:
        port = parts.port
    except ValueError:
        raise EndpointError(f"{arg}: bad port (expected host:PORT with PORT in 1-65535)", fatal=True) from None
    if not parts.hostname or (port is not None and not 0 < port < 65536):
        raise EndpointError(f"{arg}: expected http://host:port[/metrics] or host:port", fatal=True)
    return s


def candidates(url: str) -> list[str]:
    """URLs to try, in order (see the module docstring)."""
    parts = urlsplit(url)
    path = parts.path or ""
    if path in ("", "/"):
        base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        out = [base + "/metrics", base + "/"]
        try:
            port = parts.port
        except ValueError:
            port = None
        other = TRITON_METRICS_PORT.get(port) if port else None
        if other and parts.hostname:
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            out.append(f"{parts.scheme}://{host}:{other}/metrics")
        return out
    out = [url]
    if not path.rstrip("/").endswith("/metrics") and not parts.query:
        out.append(url.rstrip("/") + "/metrics")
    return out


_NAME_AT_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)", re.M)
_AGENT_ONLY = frozenset({"fragscope_agent_info", "fragscope_collector_up", "fragscope_diagnosis_active"})


def classify(text: str) -> list[str]:
    """The kinds of page ``text`` is, from its metric names (several for a concatenated page). Streams
    the names (no list of lines, no set of every name): a hostile page of a million lines costs no
    more memory than its text."""
    head = text.lstrip()[:2000]
    if head.startswith("{"):
        return ["agent"] if '"fragscope agent"' in head else []
    others = other_engine_names()
    vllm = v1 = v0 = sglang = dcgm = engine = False
    for m in _NAME_AT_LINE.finditer(text):
        n = m.group(1)
        if n in _AGENT_ONLY:
            return ["agent"]  # families only the agent's exporter writes
        if n.startswith("ray_vllm:"):
            n = n[4:]
        if n.startswith("vllm:"):
            vllm = True
            v1 = v1 or n == "vllm:kv_cache_usage_perc" or n.startswith("vllm:inter_token_latency")
            v0 = v0 or n == "vllm:gpu_cache_usage_perc"
        elif n.startswith("sglang:"):
            sglang = True
        elif n.startswith("DCGM_FI_"):
            dcgm = True
        elif not engine and n in others:
            engine = True  # TGI, Triton / TensorRT-LLM: read through the signal table (docs/engines.md)
    kinds = []
    if vllm:
        kinds.append("vllm-v1" if v1 else "vllm-v0" if v0 else "vllm")
    if sglang:
        kinds.append("sglang")
    if dcgm:
        kinds.append("dcgm")
    if engine:
        kinds.append("engine")
    return kinds


def other_engine_names() -> frozenset[str]:
    """TGI / Triton / TensorRT-LLM raw names of the signal table (SGLang has its own kind)."""
    from .engines import other_engine_names as names

    return frozenset(n for n in names() if not n.startswith("sglang:"))


@dataclass
class Resolved:
    """A metrics page found: what was asked, the URL that answered, its base (the URL without
    ``/metrics``: profiler and API paths hang off it), the kinds of page, the first body."""

    asked: str
    url: str
    base: str
    kinds: list[str]
    first_text: str = ""
    tried: list[str] = field(default_factory=list)

    @property
    def is_agent(self) -> bool:
        return "agent" in self.kinds

    def describe(self) -> str:
        return " + ".join(KIND_TEXT.get(k, k) for k in self.kinds)


def base_of(url: str) -> str:
    """``http://h:8000/x/metrics`` -> ``http://h:8000/x`` (a path prefix is kept: a server behind a
    reverse proxy)."""
    p = urlsplit(url)
    path = p.path.rstrip("/")
    if path.endswith("/metrics"):
        path = path[: -len("/metrics")]
    return urlunsplit((p.scheme, p.netloc, path, "", ""))


def _hostport(url: str) -> tuple:
    p = urlsplit(url)
    try:
        return p.hostname, p.port
    except ValueError:
        return p.hostname, None


def _is_conn_error(e: FetchError) -> bool:
    low = str(e).lower()
    return e.reason == Reason.TIMEOUT or any(f in low for f in _FATAL_CONN) or "cannot connect" in low


def _short(msg: str, url: str) -> str:
    return msg if msg.startswith(url) else f"{url}: {msg}"


@dataclass
class _Search:
    """One pass over the candidates: the page found (``url`` None when none), what each other
    candidate did, the first connection-level error, and the first body that was not wanted."""

    url: str | None = None
    text: str = ""
    kinds: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[FetchError] = field(default_factory=list)
    conn: FetchError | None = None
    unwanted: tuple[str, str] | None = None  # (url, body)


def _search(url: str, fetch: Callable[..., str], timeout_s: float, kinds: Iterable[str] | None,
            max_bytes: int | None) -> _Search:
    """Try ``url``'s candidates in order within one deadline. A connection error skips the other
    candidates on the same host:port (they would fail the same way)."""
    want = frozenset(kinds) if kinds is not None else None
    deadline = time.monotonic() + timeout_s
    out = _Search()
    dead: set[tuple] = set()
    for cand in candidates(url):
        hp = _hostport(cand)
        if hp in dead:
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            out.problems.append(f"{cand}: not tried (timed out after {timeout_s:g} s)")
            break
        kw = {"timeout_s": remaining}
        if max_bytes is not None:
            kw["max_bytes"] = max_bytes
        try:
            text = fetch(cand, **kw)
        except FetchError as e:
            if _is_conn_error(e):
                dead.add(hp)
                out.conn = out.conn or e
            out.errors.append(e)
            out.problems.append(_short(str(e), cand))
            continue
        got = classify(text)
        if got and (want is None or want & set(got)):
            out.url, out.text, out.kinds = cand, text, got
            return out
        if out.unwanted is None:
            out.unwanted = (cand, text)
        what = (f"a {' + '.join(KIND_TEXT.get(k, k) for k in got)} page" if got else
                "not a page fragscope reads (no vllm:, sglang:, DCGM_FI_ or fragscope agent metrics)")
        out.problems.append(f"{cand}: {what}")
    return out


def resolve(arg: str, timeout_s: float = 10.0, fetch: Callable[..., str] | None = None,
            kinds: Iterable[str] | None = None) -> Resolved:
    """Find the metrics page behind ``arg`` once, for a command. Raises EndpointError (one line,
    with a hint) at once on what cannot go away: refused, unknown host, a timeout (the server
    accepted but sent no metrics in time), 404 / HTML / another exporter's page on every candidate.
    ``kinds``: the page kinds wanted (None: any page fragscope reads)."""
    fetch = fetch or http_get
    url = normalise(arg)
    tried = candidates(url)
    res = _search(url, fetch, timeout_s, kinds, None)
    if res.url is not None:
        return Resolved(arg, res.url, base_of(res.url), res.kinds, res.text, tried[: tried.index(res.url) + 1])
    conn, problems = res.conn, res.problems
    if conn is not None and all(_is_conn_error_text(p) for p in problems):
        msg = str(conn)
        low = msg.lower()
        if conn.reason == Reason.TIMEOUT:
            raise EndpointError(f"{msg}; the server accepted the connection but sent no metrics in time "
                                "(overloaded, or not an HTTP metrics endpoint)", Reason.TIMEOUT, fatal=True)
        hint = ("is the server running, and is the port right?" if "refused" in low else
                "check the host name" if "host name" in low else "check the address")
        raise EndpointError(f"{msg}; {hint}", conn.reason, fatal=True)
    raise EndpointError("; ".join(problems) + "; " + HINT, Reason.PARSE_ERROR, fatal=True)


def _is_conn_error_text(problem: str) -> bool:
    low = problem.lower()
    return any(f in low for f in _FATAL_CONN) or "cannot connect" in low or "timed out" in low


class Endpoint:
    """The metrics page behind a configured URL, for a collector: found on the first tick that the
    server answers, then kept. Waiting is normal here (a sidecar starts before its engine), so
    nothing is fatal: :meth:`fetch` raises FetchError for this tick and tries again next time.

    ``url`` is the page in use (None until found); ``asked`` the configured URL."""

    def __init__(self, url: str, kinds: Iterable[str] | None = ENGINE_PAGE_KINDS) -> None:
        self.asked = url
        self.kinds = frozenset(kinds) if kinds is not None else None
        try:
            self._norm = normalise(url)
        except EndpointError as e:
            raise ValueError(str(e)) from None
        cands = candidates(self._norm)
        # a URL naming one page (…/metrics) is used as given, from the first tick
        self.url: str | None = cands[0] if len(cands) == 1 else None

    @property
    def base(self) -> str:
        return base_of(self.url or self._norm)

    def fetch(self, fetch: Callable[..., str] = http_get, timeout_s: float = 2.0,
              max_bytes: int | None = None) -> str:
        """The page's body; raises FetchError (one line naming every URL tried)."""
        kw = {} if max_bytes is None else {"max_bytes": max_bytes}
        if self.url is not None:
            try:
                return fetch(self.url, timeout_s=timeout_s, **kw)
            except FetchError as e:
                # the page went away (a restart behind the same address serving elsewhere): look again
                if len(candidates(self._norm)) > 1 and not _is_conn_error(e):
                    log.info("%s: %s; looking for the metrics page again", self.asked, e)
                    self.url = None
                raise
        res = _search(self._norm, fetch, timeout_s, self.kinds, max_bytes)
        if res.url is not None:
            self.url = res.url
            if res.url != self.asked:
                log.info("%s: metrics page found at %s", self.asked, res.url)
            return res.text
        if res.unwanted is not None:
            # a page answered but is not one this collector reads: its parser says exactly why
            return res.unwanted[1]
        if res.conn is not None and all(_is_conn_error_text(p) for p in res.problems):
            raise FetchError(str(res.conn), res.conn.reason)
        first = res.errors[0] if res.errors else None
        raise FetchError(f"{self.asked}: no metrics page found ({'; '.join(res.problems)}); {HINT}"[:600],
                         first.reason if first is not None else Reason.SOURCE_DOWN)
