"""Fetching metrics text over HTTP, kept apart from parsing (docs/collectors.md#http).

``http_get`` is what the vLLM and DCGM collectors call (and what tests replace): a bounded GET
that returns the body as text or raises :class:`FetchError` with a one-line message. Bounded in
time (a total deadline, not only requests' per-read timeout, so a server that trickles bytes
cannot hold a collector) and in size (the decoded body, so a gzip bomb is cut off too).

Also here: :class:`LogOnce`, the "log once, not every tick" helper every collector uses.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import requests
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


def http_get(url: str, timeout_s: float = 2.0, max_bytes: int = DEFAULT_MAX_BYTES, *,
             session: requests.Session | None = None) -> str:
    """GET ``url`` and return its body as text; raise FetchError (one line) on any failure.

    Failures: refused / unreachable, timeout (total, ``timeout_s``), HTTP status >= 400, body over
    ``max_bytes`` (after content decoding), an HTML page or a binary body (not metrics text).
    """
    deadline = time.monotonic() + timeout_s
    getter = session.get if session is not None else requests.get
    try:
        resp = getter(url, stream=True, timeout=(timeout_s, timeout_s),
                      headers={"Accept": _ACCEPT, "User-Agent": "fragscope"})
    except requests.exceptions.Timeout:
        raise FetchError(f"{url}: timed out after {timeout_s:g} s", Reason.TIMEOUT) from None
    except requests.exceptions.ConnectionError as e:
        raise FetchError(f"{url}: cannot connect ({_short_conn_error(e)})") from None
    except requests.exceptions.InvalidURL:
        raise FetchError(f"{url}: invalid URL (expected http://host:port/metrics)") from None
    except requests.exceptions.RequestException as e:
        raise FetchError(f"{url}: {type(e).__name__}: {_one_line(str(e))}") from None
    try:
        if resp.status_code >= 400:
            raise FetchError(f"{url}: HTTP {resp.status_code} {resp.reason or ''}".rstrip())
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
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            kind = Reason.TIMEOUT if "timed out" in str(e).lower() else Reason.SOURCE_DOWN
            raise FetchError(f"{url}: body read failed ({_one_line(str(e))})", kind) from None
    finally:
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


def _chunks(resp: requests.Response):
    """Body chunks as they arrive. urllib3 >= 2's ``read1`` returns what one socket read gives, so
    the total deadline is checked even when a server trickles bytes (``iter_content`` blocks
    until a whole chunk is in: measured 2.3 s for a 0.4 s deadline)."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 1.x: deadline checked between 64 kB chunks only
        yield from resp.iter_content(chunk_size=_CHUNK)
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
