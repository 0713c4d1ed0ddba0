"""Fetching metrics text over HTTP, kept apart from parsing (docs/collectors.md#http).

``http_get`` is what the vLLM and DCGM collectors call (and what tests replace): a bounded GET
that returns the body as text or raises :class:`FetchError` with a one-line message. Bounded in
time (a total deadline, not only requests' per-read timeout, so a server that trickles bytes
cannot hold a collector) and in size (the decoded body, so a gzip bomb is cut off too).


"""
from __future__ import annotations

import time
from typing import Callable

import http.client
import socket
import threading
import zlib
from urllib.parse import urljoin, urlsplit

from ..model import Reason

DEFAULT_MAX_BYTES = 16 * 2**20  # a vLLM /metrics is ~50 kB; dcgm-exporter on 8 GPUs ~100 kB
# Lines per body: real scrapes average 80-110 bytes a line (vLLM V1 52 kB / 562 lines, dcgm 7.8 kB /
# 70 lines). A body of bare newlines passes the byte cap yet its split list costs 8 bytes a line (a
# 16 MiB newline bomb: a 134 MB list); at most one line per 4 bytes keeps that list within 2x the cap.
LINE_BYTES_MIN = 4
_CHUNK = 64 * 1024
_INFLATE = 256 * 1024  # decompressed bytes per step
_ACCEPT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_HTML_CT = ("text/html", "application/xhtml")
# Not application/octet-stream: it is the "type unknown" default of static servers (nginx default_type, Python's
# http.server for a file named `metrics` without an extension), so a saved scrape served back arrives with it;
# the body checks below (NUL bytes, UTF-8, an HTML/XML head) tell binary from text instead.
_BINARY_CT = ("application/x-protobuf", "application/vnd.google.protobuf",
              "image/", "application/zip", "application/pdf")


class FetchError(Exception):
    """A metrics endpoint could not be read. ``str(e)`` is one line naming the URL and the problem."""

    def __init__(self, message: str, reason: Reason = Reason.SOURCE_DOWN) -> None:
        super().__init__(message)
        self.reason = reason


Fetch = Callable[..., str]  # (url, timeout_s=..., max_bytes=...) -> text


class _Conns:
    """Keep-alive connections, one per (scheme, host, port), taken out while in use so two
    threads never share one (each collector thread fetches its own URL, so reuse is the rule)."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, key: tuple, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            lst = self._free.get(key)
            if lst:
                c = lst.pop()
                c.timeout = timeout
                if c.sock is not None:
                    c.sock.settimeout(timeout)
                return c, True
        scheme, host, port = key
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return cls(host, port, timeout=timeout), False

    def give(self, key: tuple, c: http.client.HTTPConnection) -> None:
        with self._lock:
            lst = self._free.setdefault(key, [])
            if len(lst) < 2:
                lst.append(c)
                return
        c.close()


_CONNS = _Conns()
_MAX_REDIRECTS = 3


def http_get(url: str, timeout_s: float = 2.0, max_bytes: int = DEFAULT_MAX_BYTES,
             ok_status: tuple[int, ...] = (), max_lines: int | None = None) -> str:
    """GET ``url`` and return its body as text; raise FetchError (one line) on any failure.

    Failures: refused / unreachable, timeout (total, ``timeout_s``), HTTP status >= 400, body over
    ``max_bytes`` (after content decoding), an HTML page or a binary body (not metrics text).
    Follows up to 3 redirects (Starlette answers ``/metrics`` with 307 -> ``/metrics/``).
    ``ok_status``: statuses >= 400 whose body is wanted anyway (the agent's ``/readyz`` answers 503).
    ``max_lines`` (default ``max_bytes // 4``): more lines than this is refused while streaming.

    Plain http.client with keep-alive: neither requests (14.6 MB of RSS on import) nor urllib3
    (~0.5 ms more CPU per fetch than this, measured) fit the sidecar's budget (bench/bench_agent.py).
    """
    deadline = time.monotonic() + timeout_s
    target = url
    if max_lines is None:
        max_lines = max(10_000, max_bytes // LINE_BYTES_MIN)
    for _ in range(_MAX_REDIRECTS + 1):
        status, headers, body, location = _get_once(url, target, timeout_s, deadline, max_bytes, ok_status,
                                                    max_lines)
        if status in (301, 302, 303, 307, 308) and location:
            target = urljoin(target, location)
            continue
        break
    else:
        raise FetchError(f"{url}: too many redirects")
    if status >= 400 and status not in ok_status:
        raise FetchError(f"{url}: HTTP {status} {headers.get('_reason', '')}".rstrip())
    if b"\x00" in body[:4096]:
        raise FetchError(f"{url}: binary body, not metrics text", Reason.PARSE_ERROR)
    try:
        text = body.decode("utf-8")
        del body  # the text is the only copy kept
    except UnicodeDecodeError:
        raise FetchError(f"{url}: body is not UTF-8 text, not metrics text", Reason.PARSE_ERROR) from None
    head = text.lstrip()[:64].lower()
    if head.startswith(("<!doctype", "<html", "<?xml", "<head", "<body")):
        raise FetchError(f"{url}: returned an HTML/XML page, not metrics text; check the path "
                         "(usually /metrics)", Reason.PARSE_ERROR)
    return text


def _get_once(url: str, target: str, timeout_s: float, deadline: float, max_bytes: int,
              ok_status: tuple[int, ...] = (), max_lines: int = 1 << 62):
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{url}: invalid URL (expected http://host:port/metrics)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise FetchError(f"{url}: invalid URL (bad port)") from None
    key = (parts.scheme, parts.hostname, port)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    hdrs = {"Accept": _ACCEPT, "User-Agent": "fragscope", "Accept-Encoding": "gzip, deflate",
            "Host": parts.netloc}
    for attempt in (0, 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"{url}: timed out after {timeout_s:g} s", Reason.TIMEOUT)
        conn, reused = _CONNS.take(key, remaining)
        try:
            conn.request("GET", path, headers=hdrs)
            resp = conn.getresponse()
            break
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
            conn.close()
            if reused and attempt == 0:
                continue  # the server closed an idle keep-alive connection: once more, fresh
            raise FetchError(f"{url}: cannot connect ({_short_conn_error(e)})") from None
        except (socket.timeout, TimeoutError):
            conn.close()
            raise FetchError(f"{url}: timed out after {timeout_s:g} s", Reason.TIMEOUT) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise FetchError(f"{url}: cannot connect ({_short_conn_error(e)})") from None
    reusable = False
    try:
        headers = {k.lower(): v for k, v in resp.getheaders()}
        headers["_reason"] = resp.reason or ""
        status = resp.status
        if status in (301, 302, 303, 307, 308) or (status >= 400 and status not in ok_status):
            _drain(resp, deadline)
            reusable = not resp.will_close and resp.isclosed()
            return status, headers, b"", headers.get("location")
        ctype = (headers.get("content-type") or "").lower()
        if any(ctype.startswith(h) for h in _HTML_CT):
            raise FetchError(f"{url}: returned an HTML page ({ctype.split(';')[0]}), not metrics text; "
                             "check the path (usually /metrics)", Reason.PARSE_ERROR)
        if any(ctype.startswith(b) for b in _BINARY_CT):
            raise FetchError(f"{url}: returned {ctype.split(';')[0]}, not metrics text", Reason.PARSE_ERROR)
        length = headers.get("content-length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url}: body of {int(length)} bytes is over the {max_bytes} byte limit",
                             Reason.PARSE_ERROR)
        enc = (headers.get("content-encoding") or "").lower()
        dec = zlib.decompressobj(16 + zlib.MAX_WBITS) if enc == "gzip" else (
            zlib.decompressobj() if enc == "deflate" else None)
        buf = bytearray()
        lines = 0
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FetchError(f"{url}: timed out after {timeout_s:g} s (body still arriving)",
                                     Reason.TIMEOUT)
                if conn.sock is not None:
                    conn.sock.settimeout(remaining)
                chunk = resp.read1(_CHUNK)
                if not chunk:
                    if dec is not None:  # what zlib still holds (at most its 32 KiB window)
                        buf += dec.flush()
                        if len(buf) > max_bytes:
                            raise FetchError(f"{url}: body is over the {max_bytes} byte limit", Reason.PARSE_ERROR)
                    break
                # inflated in pieces of at most _INFLATE bytes, each counted before the next: a gzip
                # bomb stops at the first cap it reaches, holding at most the cap plus one piece
                data = chunk
                while data:
                    if dec is not None:
                        piece = dec.decompress(data, _INFLATE)
                        data = dec.unconsumed_tail
                    else:
                        piece, data = data, b""
                    buf += piece
                    if len(buf) > max_bytes:
                        raise FetchError(f"{url}: body is over the {max_bytes} byte limit", Reason.PARSE_ERROR)
                    lines += piece.count(b"\n")
                    if lines > max_lines:
                        raise FetchError(f"{url}: body has more than {max_lines} lines, not a metrics page this "
                                         "agent keeps", Reason.PARSE_ERROR)
        except (socket.timeout, TimeoutError):
            raise FetchError(f"{url}: timed out after {timeout_s:g} s (body still arriving)",
                             Reason.TIMEOUT) from None
        except (OSError, http.client.HTTPException, zlib.error) as e:
            kind = Reason.TIMEOUT if "timed out" in str(e).lower() else Reason.SOURCE_DOWN
            raise FetchError(f"{url}: body read failed ({_one_line(str(e))})", kind) from None
        resp.read()  # marks a fully read response closed, so the connection can send again
        reusable = not resp.will_close and resp.isclosed()
        return status, headers, buf, None
    finally:
        if reusable:
            _CONNS.give(key, conn)
        else:
            conn.close()


def _drain(resp, deadline: float, limit: int = 1 << 20) -> None:
    """Read (and discard) a short error/redirect body so the connection can be reused."""
    got = 0
    while got < limit and time.monotonic() < deadline:
        try:
            chunk = resp.read1(_CHUNK)
        except (OSError, http.client.HTTPException):
            return
        if not chunk:
            try:
                resp.read()  # closes the response once its body is consumed
            except (OSError, http.client.HTTPException):
                pass
            return
        got += len(chunk)


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
