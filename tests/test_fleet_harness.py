"""Harness for the fleet tests: a real Prometheus on 127.0.0.1, a scrape server replaying recorded
scrapes, free ports, bounded waits. Imported by tests/test_fleet_*.py and tests/test_dashboards.py;
its own tests check the harness and the HTTP error paths of the Prometheus client.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "fleet")
ROOT = os.path.dirname(HERE)
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="prometheus/promtool not installed (Debian package 'prometheus')")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(fn: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """Call ``fn`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_exc = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_exc})")


def read_fixture(name: str) -> str:
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return fh.read()


# ---------------------------------------------------------------------------------------------
_COUNTER_LIKE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*?)(_total|_bucket|_count|_sum)(\{[^}]*\})?\s+(\S+)\s*$")


def ticking(text: str, n: int) -> str:
    """A scrape whose counters and histograms grow by ``n`` (buckets, counts and totals alike, so
    histograms stay consistent), so rate() and histogram_quantile() have something to show."""
    out = []
    for line in text.splitlines():
        m = None if line.startswith("#") else _COUNTER_LIKE.match(line)
        if m and not m.group(1).endswith("_created"):
            inc = n * (0.05 if m.group(2) == "_sum" else 1.0)
            try:
                v = float(m.group(4)) + inc
            except ValueError:
                out.append(line)
                continue
            line = f"{m.group(1)}{m.group(2)}{m.group(3) or ''} {v!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def with_labels(text: str, extra: dict[str, str]) -> str:
    """Add labels to every sample line (as dcgm-exporter's Kubernetes pod mapping does)."""
    add = ",".join(f'{k}="{v}"' for k, v in extra.items())
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            if "{" in line:
                line = line.replace("{", "{" + add + ",", 1)
            else:
                name, rest = line.split(None, 1)
                line = f"{name}{{{add}}} {rest}"
        out.append(line)
    return "\n".join(out) + "\n"


class ScrapeServer:
    """Serves ``routes`` (path -> callable(n) -> text, n = times that path was scraped) on 127.0.0.1."""

    def __init__(self, routes: dict[str, Callable[[int], str | tuple[int, str, str]]]) -> None:
        self.routes = routes
        self.hits: dict[str, int] = {}
        server = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                fn = server.routes.get(path)
                if fn is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                n = server.hits[path] = server.hits.get(path, 0) + 1
                res = fn(n)
                status, ctype, body = res if isinstance(res, tuple) else (200, "text/plain; version=0.0.4", res)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------------------------------
class Prometheus:
    """A real Prometheus server in its own temp dir, on a free 127.0.0.1 port; killed by close()."""

    def __init__(self, config: str = "", data_dir: str | None = None, rule_files: list[str] = (),
                 extra_args: list[str] = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="fragscope-prom-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = os.path.join(self.dir, "prometheus.yml")
        rules = "".join(f"\n  - {r}" for r in rule_files)
        with open(cfg, "w") as fh:
            fh.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n")
            if rules:
                fh.write(f"rule_files:{rules}\n")
            fh.write(config)
        self.data = data_dir or os.path.join(self.dir, "data")
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={self.data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
             *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True)
        try:
            wait_until(self._ready, 30, f"Prometheus ready on {self.url}")
        except AssertionError:
            self.close()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.tail()}")
        return requests.get(self.url + "/-/ready", timeout=1).status_code == 200

    def tail(self) -> str:
        try:
            with open(self.log.name) as fh:
                return fh.read()[-2000:]
        except OSError:
            return ""

    def query(self, expr: str, at: float | None = None) -> list:
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        r = requests.get(self.url + "/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def scrape_job(name: str, target: str, path: str, labels: dict[str, str], honor_labels: bool = False) -> str:
    lab = ", ".join(f'{k}: "{v}"' for k, v in labels.items())
    return (f"  - job_name: {name}\n    metrics_path: {path}\n    honor_labels: {str(honor_labels).lower()}\n"
            f"    static_configs:\n      - targets: ['{target}']\n        labels: {{{lab}}}\n")


# ---------------------------------------------------------------------------------------------
# The harness's own checks, and the client's handling of bad servers (no Prometheus needed).
def test_ticking_keeps_histograms_consistent():
    text = ("# TYPE x histogram\nx_bucket{le=\"1\"} 1\nx_bucket{le=\"+Inf\"} 2\nx_count 2\nx_sum 0.5\n"
            "x_created 17\ng 3\nc_total 10\n")
    t = ticking(text, 4)
    assert 'x_bucket{le="1"} 5.0' in t and 'x_bucket{le="+Inf"} 6.0' in t and "x_count 6.0" in t
    assert "x_sum 0.7" in t and "x_created 17" in t and "g 3" in t and "c_total 14.0" in t


def test_with_labels():
    t = with_labels('# HELP a b\na{gpu="0"} 1\nb 2\n', {"pod": "p"})
    assert 'a{pod="p",gpu="0"} 1' in t and 'b{pod="p"} 2' in t


def _client(url: str, **kw):
    from fragscope.collectors.prometheus import PromConfig, PrometheusClient

    return PrometheusClient(PromConfig(url, timeout=kw.pop("timeout", 15), **kw))  # generous unless under test


def test_client_errors_are_one_line():
    from fragscope.collectors.prometheus import PrometheusError

    html = "<!DOCTYPE html><html><body>Sign in</body></html>"
    srv = ScrapeServer({
        "/html/api/v1/query": lambda n: (200, "text/html", html),
        "/e422/api/v1/query": lambda n: (422, "application/json",
                                         '{"status":"error","errorType":"execution","error":"query processing '
                                         'would load too many samples into memory in query execution"}'),
        "/e400/api/v1/query_range": lambda n: (400, "application/json",
                                               '{"status":"error","errorType":"bad_data","error":"exceeded maximum '
                                               'resolution of 11,000 points per timeseries. Try decreasing the query '
                                               'resolution (?step=XX)"}'),
        "/e503/api/v1/query": lambda n: (503, "text/plain", "upstream connect error\n"),
        "/e401/api/v1/query": lambda n: (401, "text/plain", "Unauthorized"),
        "/junk/api/v1/query": lambda n: (200, "application/json", "{not json"),
        "/slow/api/v1/query": lambda n: (time.sleep(2), (200, "application/json", "{}"))[1],
    })
    try:
        cases = [
            ("/html", "HTML page", None),
            ("/e422", "422 execution", "too many samples"),
            ("/e503", "HTTP 503", "upstream connect error"),
            ("/e401", "authentication refused", "--bearer-token"),
            ("/junk", "not Prometheus API JSON", None),
            ("/missing", "404 Not Found", "not a Prometheus HTTP API"),
        ]
        for path, want, also in cases:
            with pytest.raises(PrometheusError) as ei:
                _client(srv.url + path).query("up", 1.0)
            msg = str(ei.value)
            assert want in msg and "\n" not in msg, msg
            if also:
                assert also in msg, msg
        with pytest.raises(PrometheusError) as ei:
            _client(srv.url + "/e400").query_range("up", 0, 100, 1)
        assert "11,000 points" in str(ei.value) and "--step" in str(ei.value)
        with pytest.raises(PrometheusError) as ei:
            _client(srv.url + "/slow", timeout=0.5).query("up", 1.0)
        assert "no answer within 0.5 s" in str(ei.value)
    finally:
        srv.close()


def test_client_sends_auth_and_headers():
    import base64

    from fragscope.collectors.prometheus import PromConfig, PrometheusClient

    seen = {}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.update({k.lower(): v for k, v in self.headers.items()})
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        PrometheusClient(PromConfig(url, bearer_token="tok", headers={"X-Scope-OrgID": "team-a"})).query("up", 1)
        assert seen["authorization"] == "Bearer tok" and seen["x-scope-orgid"] == "team-a"
        PrometheusClient(PromConfig(url, basic_auth=("u", "p:w"))).query("up", 1)
        assert seen["authorization"] == "Basic " + base64.b64encode(b"u:p:w").decode()
    finally:
        httpd.shutdown()
        httpd.server_close()
