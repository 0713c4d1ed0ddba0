"""Read-only HTTP API of the agent: ``/metrics`` and JSON under ``/api/v1/`` (docs/agent.md#http-api).

Standard library ``ThreadingHTTPServer``: a handful of requests a minute (Prometheus, an on-call
``diagnose --agent``) need no framework, and each request gets its own thread so a slow history
query never delays a scrape. Responses are bounded (``api.max_points``); bad parameters get a 400
with a JSON ``{"error": ...}`` naming the parameter.
"""
from __future__ import annotations

import json
import logging
import math
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from .. import __version__
from ..units import json_safe
from ..model import Window
from .config import AgentConfig, ConfigError, parse_duration
from .budget import limits_status
from .exporter import Exporter
from .health import readiness_problems
from . import memory
from .store import TooManyPoints

log = logging.getLogger("fragscope.agent.api")

MAX_SINCE_S = 31 * 86400.0
HEARTBEAT_STALE_S = 15.0
# History queries (window, signals, series) run one at a time; others wait up to HEAVY_WAIT_S, then get
# 503 with Retry-After (diagnose --agent retries). Each holds at most api.max_points points (16 bytes each in numpy, streamed out in
# blocks): 20 concurrent unbounded ones took the agent from 49 to 323 MB (bench/bench_agent_hostile.py).
HEAVY_CONCURRENCY = 1
HEAVY_WAIT_S = 3.0


# A streamed history response holds a read snapshot of the history (the WAL cannot be checkpointed past it):
# a client that reads it slower than this is cut off (200k points stream in well under a second locally).
STREAM_MAX_S = 120.0


def cut_off_after(pieces, seconds: float):
    """The pieces, cut off with TimeoutError once ``seconds`` have passed since the first."""
    deadline = time.monotonic() + seconds
    for p in pieces:
        if time.monotonic() > deadline:
            raise TimeoutError(f"history response not read within {seconds:g} s; cut off")
        yield p


class BadRequest(ValueError):
    pass


def window_to_json(w: Window, max_points: int | None = None) -> dict:
    """The wire form of a Window (``client.window_from_json`` reads it back)."""
    out = []
    total = 0
    for key, s in sorted(w.series.items(), key=lambda kv: (kv[0].name, kv[0].labels)):
        total += len(s)
        if max_points is not None and total > max_points:
            raise TooManyPoints(f"more than {max_points} points: narrow the range, name fewer signals "
                                "or give a larger step")
        out.append({"name": key.name, "labels": dict(key.labels), "type": s.type,
                    "ts": [round(float(t), 3) for t in s.ts], "values": [float(v) for v in s.values]})
    return {"start": _num(w.start), "end": _num(w.end), "source": w.source, "points": total, "series": out}


_BLOCK = 8192  # points formatted at a time: bounded memory per response, whatever its size


def iter_window_json(w: Window, start: float | None = None, end: float | None = None):
    """``window_to_json`` as a stream of bytes pieces (same document): a response never holds more
    than one block of formatted points (~0.3 MB), instead of ~100 bytes per point at once."""
    series = sorted(w.series.items(), key=lambda kv: (kv[0].name, kv[0].labels))
    total = sum(len(s) for _, s in series)
    head = {"start": _num(w.start if start is None else start), "end": _num(w.end if end is None else end),
            "source": w.source, "points": total}

    def blocks(arr: np.ndarray):
        for j in range(0, arr.size, _BLOCK):
            yield arr[j:j + _BLOCK]

    return _iter_json(head, ((key, s.type, lambda s=s: blocks(s.ts), lambda s=s: blocks(s.values))
                             for key, s in series))


def iter_scan_json(scan: Any, start: float, end: float, source: str):
    """A history scan (``Store.scan``) streamed as the same document as :func:`iter_window_json` of the
    same query, without ever holding the window: one block of rows at a time. Closes the scan."""
    head = {"start": _num(start), "end": _num(end), "source": source, "points": scan.total}
    try:
        yield from _iter_json(head, ((key, typ, lambda sid=sid: scan.column(sid, "t"),
                                      lambda sid=sid: scan.column(sid, "v"))
                                     for sid, key, typ, _ in scan.series))
    finally:
        scan.close()


def _iter_json(head: dict, series):
    """The window document from a header and (key, type, ts blocks, value blocks) per series."""
    dumps = json.dumps
    yield (dumps(head, allow_nan=False)[:-1] + ',"series":[').encode()
    for i, (key, typ, ts_blocks, value_blocks) in enumerate(series):
        meta = dumps({"name": key.name, "labels": dict(key.labels), "type": typ}, allow_nan=False)
        yield (("," if i else "") + meta[:-1]).encode()
        for field, pieces, rnd in (("ts", ts_blocks, True), ("values", value_blocks, False)):
            yield f',"{field}":['.encode()
            first = True
            for block in pieces():
                if rnd:
                    block = np.round(block, 3)
                vals = block.tolist() if np.isfinite(block).all() else \
                    [x if math.isfinite(x) else None for x in block.tolist()]
                if vals:
                    yield (("" if first else ",") + dumps(vals)[1:-1]).encode()
                    first = False
            yield b"]"
        yield b"}"
    yield b"]}"


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


MAX_PARAM_CHARS = 64  # a time, a duration or a step is a few characters; longer is refused, never echoed
MAX_SPAN_S = 366 * 86400.0  # times from 1970 to a year from now; durations and steps up to a year


def _shown(v: str) -> str:
    return repr(v if len(v) <= 40 else v[:40] + "...")


def _param_time(q: dict, name: str, default: float, now: float) -> float:
    v = q.get(name)
    if v is None:
        return default
    s = v.strip()
    if s == "now":
        return now
    if len(s) > MAX_PARAM_CHARS:
        raise BadRequest(f"{name}: {len(s)} characters, not a time (unix seconds, 'now' or -DURATION)")
    try:
        if s.startswith("-"):  # relative: start=-1h
            t = now - parse_duration(s[1:], name)
        else:
            t = float(s)
            t = t / 1000.0 if t > 1e11 else t  # milliseconds are accepted too
    except (ConfigError, ValueError, OverflowError):
        raise BadRequest(f"{name}: expected unix seconds, 'now' or -DURATION (e.g. -1h), got {_shown(v)}") from None
    if not math.isfinite(t) or t < 0 or t > now + MAX_SPAN_S:
        raise BadRequest(f"{name}: {_shown(v)} is not a time between 1970 and a year from now")
    return t


def _param_duration(q: dict, name: str, default: float | None) -> float | None:
    v = q.get(name)
    if v is None or v == "":
        return default
    if v.strip() in ("0", "raw"):
        return 0.0
    if len(v) > MAX_PARAM_CHARS:
        raise BadRequest(f"{name}: {len(v)} characters, not a duration")
    try:
        d = parse_duration(v, name)
    except (ConfigError, ValueError, OverflowError):
        raise BadRequest(f"{name}: expected a duration like 30s, 5m, 1h, got {_shown(v)}") from None
    if not (math.isfinite(d) and d <= MAX_SPAN_S):
        raise BadRequest(f"{name}: at most 366d (a year), got {_shown(v)}")
    return d


class _Handler(BaseHTTPRequestHandler):
    server_version = f"fragscope/{__version__}"
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds a client may take to send its request
    # headers and body in one send: with two, Nagle + delayed ACK add ~40 ms to every keep-alive scrape
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    # set by serve()
    state: Any = None
    cfg: AgentConfig = None  # type: ignore[assignment]
    exporter: Exporter = None  # type: ignore[assignment]
    heavy_slots: threading.Semaphore = None  # type: ignore[assignment]

    def log_message(self, fmt: str, *args: Any) -> None:  # access log at debug only
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

    def _send_stream(self, code: int, pieces, ctype: str) -> None:
        """A body of unknown length, chunked (HTTP/1.1): written as it is formatted."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            buf = bytearray()
            for p in pieces:
                buf += p
                if len(buf) >= 1 << 16:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(buf), bytes(buf)))
                    buf.clear()
            if buf:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(buf), bytes(buf)))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - headers are out: no second response, cut the connection
            log.error("api: %s failed while streaming (%s: %s)", self.path[:100], type(e).__name__, e)
            self.close_connection = True

    def _heavy(self, fn, q: dict) -> None:
        """Run a history query under the concurrency limit; trim memory after a large one."""
        sem = self.heavy_slots
        if not sem.acquire(timeout=HEAVY_WAIT_S):
            self.send_response(503)
            body = json.dumps({"error": "busy: another history query is running; retry in a second",
                               "status": 503}).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Retry-After", "1")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        try:
            fn(q)
        finally:
            sem.release()
            memory.trim()  # ~1 ms, at most once per history query: RSS back to where it was

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(json_safe(obj), separators=(",", ":"), allow_nan=False).encode()
        self._send(code, body, "application/json")

    def _error(self, code: int, msg: str) -> None:
        self._json(code, {"error": msg, "status": code})

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        self._error(405, "read-only API: only GET")

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def do_GET(self) -> None:  # noqa: N802
        try:
            parts = urlsplit(self.path)
            raw = parse_qs(parts.query, keep_blank_values=True, max_num_fields=50)
            q = {k: v[-1] for k, v in raw.items()}
            route = {
                "/metrics": self._metrics,
                "/healthz": self._healthz,
                "/readyz": self._readyz,
                "/api/v1/findings": self._findings,
                "/api/v1/signals": lambda q: self._heavy(self._signals, q),
                "/api/v1/window": lambda q: self._heavy(self._window, q),
                "/api/v1/series": lambda q: self._heavy(self._series, q),
                "/api/v1/status": self._status,
                "/": self._index,
            }.get(parts.path.rstrip("/") or "/")
            if route is None:
                self._error(404, f"no such endpoint {parts.path!r}; see /")
                return
            route(q)
        except BadRequest as e:
            self._error(400, str(e))
        except TooManyPoints as e:
            self._error(400, str(e))
        except ValueError as e:  # e.g. parse_qs: too many fields
            self._error(400, f"bad request: {str(e)[:200]}")
        except OverflowError:  # a parameter that passed the checks and still overflowed on the way
            self._error(400, "bad request: a parameter out of range")
        except Exception as e:  # noqa: BLE001 - answer 500, keep serving
            log.error("api: %s failed (%s: %s)", self.path[:100], type(e).__name__, e)
            self._error(500, f"internal error: {type(e).__name__}")

    # --- endpoints ----------------------------------------------------------------------------
    def _index(self, q: dict) -> None:
        fmt = q.get("format")
        if fmt == "html" or (fmt is None and "text/html" in (self.headers.get("Accept") or "")):
            from ..report import agent_page  # the report page for browsers: docs/report.md

            now, st = time.time(), self.state
            w = st.ring.window_at(now, "fragscope agent (live)") if st.ring is not None else None
            page = agent_page(st.report, st.report_at, w, now, collectors=[h.to_dict() for h in st.collectors.values()],
                              ready_reasons=readiness_problems(st))
            self._send(200, page.encode(), "text/html; charset=utf-8")
            return
        self._json(200, {"service": "fragscope agent", "version": __version__, "endpoints": [
            "/metrics", "/healthz", "/readyz", "/api/v1/findings", "/api/v1/signals?names=&start=&end=&step=",
            "/api/v1/window?since=&step=", "/api/v1/series", "/api/v1/status"]})

    def _metrics(self, q: dict) -> None:
        body, ctype = self.exporter.render(self.headers.get("Accept"))
        self._send(200, body, ctype)

    def _healthz(self, q: dict) -> None:
        age = time.monotonic() - self.state.heartbeat
        if age > HEARTBEAT_STALE_S:
            self._json(503, {"status": "stalled", "heartbeat_age_seconds": round(age, 1)})
        else:
            self._json(200, {"status": "ok"})

    def _readyz(self, q: dict) -> None:
        """503 with the reasons while the agent cannot judge: first round not done, history
        degraded, every collector down, or an engine source (vLLM) down (docs/agent.md#health)."""
        why = readiness_problems(self.state)
        if why:
            self._json(503, {"status": "not ready", "reasons": why})
        else:
            self._json(200, {"status": "ready"})

    def _findings(self, q: dict) -> None:
        st = self.state
        if st.report is None:
            self._json(200, {"status": "pending", "at": None, "findings": [], "inconclusive": [],
                             "note": "the detectors have not run yet"})
            return
        d = st.report.to_dict()
        d["at"] = st.report_at
        d["status"] = "ok"
        self._json(200, d)

    def _range(self, q: dict, default_span: float) -> tuple[float, float]:
        now = time.time()
        if "since" in q:
            since = _param_duration(q, "since", None) or default_span
            if since > MAX_SINCE_S:
                raise BadRequest(f"since: at most {MAX_SINCE_S / 86400:.0f}d")
            return now - since, now
        end = _param_time(q, "end", now, now)
        start = _param_time(q, "start", end - default_span, now)
        if start > end:
            raise BadRequest("start is after end")
        return start, end

    def _query(self, names: list[str] | None, start: float, end: float, step: float | None) -> Window:
        st = self.state
        mp = self.cfg.api_max_points
        if st.store is not None:
            return st.store.query(names, start, end, step=step or None, max_points=mp,
                                  source="fragscope agent history")
        w = st.ring.window_at(time.time(), source="fragscope agent (memory, no history)").between(start, end)
        if names:
            fam = set(names)
            w.series = {k: s for k, s in w.series.items()
                        if k.name in fam or any(k.name.startswith(n + "_") for n in fam)}
        return w

    def _stream_history(self, names: list[str] | None, start: float, end: float, step: float | None) -> int:
        """A history query straight from SQLite to the client (``Store.scan``): the agent never holds
        the window (a 200k-point query peaked at 63 MB RSS when it did); without history, the ring."""
        st = self.state
        if st.store is None:
            return self._send_window(self._query(names, start, end, step), start, end)
        scan = st.store.scan(names, start, end, step=step or None, max_points=self.cfg.api_max_points)
        try:
            self._send_stream(200, cut_off_after(iter_scan_json(scan, start, end, "fragscope agent history"),
                                           STREAM_MAX_S), "application/json")
        finally:
            scan.close()  # also when the body was never formatted (HEAD)
        return scan.total

    def _signals(self, q: dict) -> int:
        names = [n.strip() for n in (q.get("names") or "").split(",") if n.strip()]
        if not names:
            raise BadRequest("names: give one or more metric names, comma-separated "
                             "(e.g. names=vllm:num_requests_waiting,fragscope_gpu_memory_used_bytes)")
        if len(names) > 100:
            raise BadRequest("names: at most 100 names")
        start, end = self._range(q, 3600.0)
        step = _param_duration(q, "step", None)
        return self._stream_history(names, start, end, step)

    def _window(self, q: dict) -> int:
        start, end = self._range(q, self.cfg.detect_window)
        step = _param_duration(q, "step", self.cfg.detect_step)
        return self._stream_history(None, start, end, step)

    def _send_window(self, w: Window, start: float, end: float) -> int:
        points = sum(len(s) for s in w.series.values())
        if points > self.cfg.api_max_points:
            raise TooManyPoints(f"more than {self.cfg.api_max_points} points: narrow the range, name fewer "
                                "signals or give a larger step")
        self._send_stream(200, iter_window_json(w, start, end), "application/json")
        return points

    def _series(self, q: dict) -> int:
        st = self.state
        if st.store is not None:
            rows = [{"name": n, "labels": dict(lab), "type": t} for _, n, lab, t in st.store.series_list()]
        else:
            w = st.ring.window_at(time.time(), "")
            rows = [{"name": k.name, "labels": dict(k.labels), "type": s.type} for k, s in w.series.items()]
        rows.sort(key=lambda r: (r["name"], sorted(r["labels"].items())))
        self._json(200, {"series": rows[:20000], "truncated": len(rows) > 20000})
        return len(rows)

    def _status(self, q: dict) -> None:
        st = self.state
        rss = None
        try:
            import resource

            with open("/proc/self/statm") as fh:
                rss = int(fh.read().split()[1]) * resource.getpagesize()
        except (OSError, ImportError, ValueError, IndexError):
            pass
        ready_why = readiness_problems(st)
        self._json(200, {
            "version": __version__, "started": st.started, "uptime_seconds": time.monotonic() - st.started_mono,
            # the same decision as /readyz (agent/health.py): never ready here while /readyz says 503
            "ready": not ready_why, "ready_reasons": ready_why, "first_round_done": _first_round_done(st),
            "rss_bytes": rss, "pandas_loaded": "pandas" in sys.modules,
            "requests_loaded": "requests" in sys.modules,
            "collectors": [h.to_dict() for h in st.collectors.values()],
            "store": st.store.stats() if st.store is not None else None,
            "ring": {"series": len(st.ring), "points": st.ring.points(), "step_seconds": st.ring.step,
                     "out_of_order_samples": st.ring.out_of_order},
            "clock": {"jumps": st.clock_jumps, "last_jump_seconds": st.last_clock_jump_seconds},
            "detector": {"runs": st.detector.runs, "errors": st.detector.errors, "last_run": st.detector.last_run,
                         "duration_seconds": st.detector.last_duration, "error": st.detector.last_error,
                         "cpu_seconds": round(st.detector.cpu_seconds, 4),
                         "watch_cpu_seconds": round(st.detector.watch_cpu_seconds, 4),
                         "watch_runs": st.detector.watch_runs, "watch_skipped": st.detector.watch_skipped},
            "housekeeping": {"cpu_seconds": round(st.housekeeping_cpu_seconds, 4)},
            "limits": dict(limits_status(st), api_connections_refused=getattr(self.server, "refused", 0),
                           api_max_connections=getattr(self.server, "max_connections", None)),
            "notes": st.notes})


def _first_round_done(st: Any) -> bool:
    """Every collector has answered once (or was marked down): computed now, not on a timer."""
    if not st.first_round_done:
        st.first_round_done = all(h.runs_total > 0 or h.up is False for h in list(st.collectors.values()))
    return st.first_round_done


# Connections served at once (a thread each; keep-alive ones hold theirs up to the handler's timeout).
# Prometheus, a dashboard and an on-call diagnose need a handful; past the cap a connection is answered 503
# and closed at once, without a thread (refused ones are counted: /api/v1/status limits).
MAX_CONNECTIONS = 32
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
         b"Connection: close\r\nContent-Length: 63\r\n\r\n"
         b'{"error": "too many connections; retry shortly", "status": 503}')


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64
    max_connections = MAX_CONNECTIONS
    refused = 0  # connections answered 503 at the cap

    def process_request(self, request, client_address) -> None:
        slots = getattr(self, "_slots", None)
        if slots is None:
            slots = self._slots = threading.BoundedSemaphore(self.max_connections)
        if not slots.acquire(blocking=False):
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("api: %d connections open, the cap: connection from %s answered 503 (%d so far)",
                            self.max_connections, client_address[0], self.refused)
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:  # a client hanging up is not an error
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("api: %s: %s", client_address, exc)
        else:
            log.error("api: request from %s failed (%s: %s)", client_address, type(exc).__name__, exc)

    # serve_forever() wakes every poll interval just to look at its shutdown flag: at the usual 0.5 s
    # that is two wake-ups a second of an idle thread, each costing about a millisecond of CPU on a
    # VM whose idle vCPUs lose their caches (bench/bench_agent.py's cold-tick factor, ~8-14x). Poll
    # rarely instead, and let shutdown() wake the loop with a connection of its own.
    POLL_S = 30.0

    def shutdown(self) -> None:
        t = threading.Thread(target=ThreadingHTTPServer.shutdown, args=(self,), name="api-shutdown", daemon=True)
        t.start()
        host, port = self.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        for _ in range(50):  # bounded: 50 pokes x 0.2 s
            try:
                socket.create_connection((host, port), timeout=0.5).close()
            except OSError:
                pass
            t.join(0.2)
            if not t.is_alive():
                return


def serve(state: Any, cfg: AgentConfig) -> _Server:
    """Bind ``cfg.listen`` and serve in a background thread. Raises OSError when it cannot bind."""
    host, port = cfg.listen_addr
    handler = type("Handler", (_Handler,), {"state": state, "cfg": cfg, "exporter": Exporter(state),
                                            "heavy_slots": threading.BoundedSemaphore(HEAVY_CONCURRENCY)})
    cls = _Server
    if ":" in host:
        cls = type("Server6", (_Server,), {"address_family": socket.AF_INET6})
    srv = cls((host, port), handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": srv.POLL_S}, name="api",
                         daemon=True)
    t.start()
    return srv
