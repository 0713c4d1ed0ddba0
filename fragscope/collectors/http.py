"""Fetching metrics text over HTTP, kept apart from parsing (docs/collectors.md#http).

``http_get`` is what the vLLM and DCGM collectors call (and what tests replace): a bounded GET
that returns the body as text or raises :class:`FetchError` with a one-line message. Bounded in
time (a total deadline, not only requests' per-read timeout, so a server that trickles bytes
cannot hold a collector) and in size (the decoded body, so a gzip bomb is cut off too).

Also here: :class:`LogOnce`, the "log once, not every tick" helper every collector uses.

urllib3 directly rather than requests: importing requests costs the sidecar 14.6 MB of RSS (urllib3
alone ~9 MB), which broke the agent's 60 MB budget (bench/bench_agent.py); we need none of
requests' conveniences here (no auth, cookies or redirects for a metrics endpoint).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import urllib3

from ..model import Reason

DEFAULT_MAX_BYTES = 16 * 2**20  # a vLLM /metrics is ~50 kB; dcgm-exporter on 8 GPUs ~100 kB
_CHUNK = 64 * 1024
_ACCEPT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_HTML_CT = ("text/html", "application/xhtml")
_BINARY_CT = ("application/octet-stream", "application/x-protobuf", "application/vnd.google.protobuf",
              "image/", "application/zip", "application/pdf")


class FetchError(Exception):
    """A metrics endpoint could not be read. ``str(e)`` is one line naming the URL and the problem."""

    def __init__(self, message: str, reason: Reason = Reason.SOURCE_DOWN) -> None:
        super().__init__(message)
        self.reason = reason


Fetch = Callable[..., str]  # (url, timeout_s=..., max_bytes=...) -> text


_POOL: urllib3.PoolManager | None = None


def _pool() -> urllib3.PoolManager:
    global _POOL
    if _POOL is None:  # keep-alive connections, reused tick after tick
        _POOL = urllib3.PoolManager(num_pools=8, maxsize=2, retries=False)
    return _POOL


def http_get(url: str, timeout_s: float = 2.0, max_bytes: int = DEFAULT_MAX_BYTES, *,
             pool: urllib3.PoolManager | None = None) -> str:
    """GET ``url`` and return its body as text; raise FetchError (one line) on any failure.

    Failures: refused / unreachable, timeout (total, ``timeout_s``), HTTP status >= 400, body over
    ``max_bytes`` (after content decoding), an HTML page or a binary body (not metrics text).
    """
    if not url.lower().startswith(("http://", "https://")):
        raise FetchError(f"{url}: invalid URL (expected http://host:port/metrics)")
    deadline = time.monotonic() + timeout_s
    try:
        resp = (pool or _pool()).request(
            "GET", url, preload_content=False, redirect=True, retries=False,
            timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s),
            headers={"Accept": _ACCEPT, "User-Agent": "fragscope", "Accept-Encoding": "gzip, deflate"})
    except urllib3.exceptions.NewConnectionError as e:  # (a ConnectTimeoutError subclass in urllib3 2)
        raise FetchError(f"{url}: cannot connect ({_short_conn_error(e)})") from None
    except (urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.ReadTimeoutError):
        raise FetchError(f"{url}: timed out after {timeout_s:g} s", Reason.TIMEOUT) from None
    except urllib3.exceptions.LocationParseError:
        raise FetchError(f"{url}: invalid URL (expected http://host:port/metrics)") from None
    except (urllib3.exceptions.ProtocolError, urllib3.exceptions.MaxRetryError, OSError) as e:
        raise FetchError(f"{url}: cannot connect ({_short_conn_error(e)})") from None
    except urllib3.exceptions.HTTPError as e:
        raise FetchError(f"{url}: {type(e).__name__}: {_one_line(str(e))}") from None
    reusable = False
    try:
        if resp.status >= 400:
            raise FetchError(f"{url}: HTTP {resp.status} {resp.reason or ''}".rstrip())
        ctype = (resp.headers.get("Content-Type") or "").lower()
        if any(ctype.startswith(h) for h in _HTML_CT):
            raise FetchError(f"{url}: returned an HTML page ({ctype.split(';')[0]}), not metrics text; "
                             "check the path (usually /metrics)", Reason.PARSE_ERROR)
        if any(ctype.startswith(b) for b in _BINARY_CT):
            raise FetchError(f"{url}: returned {ctype.split(';')[0]}, not metrics text", Reason.PARSE_ERROR)
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url}: body of {int(length)} bytes is over the {max_bytes} byte limit",
                             Reason.PARSE_ERROR)
        buf = bytearray()
        try:
            for chunk in _chunks(resp):
                buf += chunk
                if len(buf) > max_bytes:
                    raise FetchError(f"{url}: body is over the {max_bytes} byte limit", Reason.PARSE_ERROR)
                if time.monotonic() > deadline:
                    raise FetchError(f"{url}: timed out after {timeout_s:g} s (body still arriving)",
                                     Reason.TIMEOUT)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            kind = Reason.TIMEOUT if "timed out" in str(e).lower() else Reason.SOURCE_DOWN
            raise FetchError(f"{url}: body read failed ({_one_line(str(e))})", kind) from None
        reusable = True
    finally:
        if reusable:
            resp.release_conn()  # fully read: back to the pool for the next tick
        else:
            resp.close()
    if b"\x00" in buf[:4096]:
        raise FetchError(f"{url}: binary body, not metrics text", Reason.PARSE_ERROR)
    try:
        text = buf.decode("utf-8")
    except UnicodeDecodeError:
        raise FetchError(f"{url}: body is not UTF-8 text, not metrics text", Reason.PARSE_ERROR) from None
    head = text.lstrip()[:64].lower()
    if head.startswith(("<!doctype", "<html", "<?xml", "<head", "<body")):
        raise FetchError(f"{url}: returned an HTML/XML page, not metrics text; check the path "
                         "(usually /metrics)", Reason.PARSE_ERROR)
    return text


def _chunks(resp: urllib3.BaseHTTPResponse):
    """Body chunks as they arrive. urllib3 >= 2's ``read1`` returns what one socket read gives, so
    the total deadline is checked even when a server trickles bytes (``stream()`` blocks until a
    whole chunk is in: measured 2.3 s for a 0.4 s deadline)."""
    read1 = getattr(resp, "read1", None)
    if read1 is None:  # urllib3 1.x: deadline checked between 64 kB chunks only
        yield from resp.stream(_CHUNK, decode_content=True)
        return
    while True:
        chunk = read1(_CHUNK, decode_content=True)
        if not chunk:
            return
        yield chunk


def _one_line(s: str, limit: int = 160) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _short_conn_error(e: Exception) -> str:
    s = str(e)
    low = s.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low or "failed to resolve" in low:
        return "host name not found"
    if "no route" in low or "unreachable" in low:
        return "host unreachable"
    if "reset" in low:
        return "connection reset"
    if "remote end closed" in low or "remotedisconnected" in low:
        return "server closed the connection"
    return _one_line(s, 100)


class LogOnce:
    """Log a collector's trouble once per state change, not every tick.

    ``problem(msg)`` logs at WARNING when the message (its first ``key_len`` characters) differs
    from the last one; ``ok()`` logs one INFO line when the source recovers.
    """

    def __init__(self, logger: logging.Logger, what: str, key_len: int = 80) -> None:
        self.log = logger
        self.what = what
        self.key_len = key_len
        self._last: str | None = None
        self.count = 0  # problems logged (tests read it)

    def problem(self, msg: str, level: int = logging.WARNING) -> None:
        key = msg[: self.key_len]
        if key != self._last:
            self._last = key
            self.count += 1
            self.log.log(level, "%s: %s", self.what, msg)

    def ok(self) -> None:
        if self._last is not None:
            self._last = None
            self.log.info("%s: recovered", self.what)

    @property
    def in_trouble(self) -> bool:
        return self._last is not None
