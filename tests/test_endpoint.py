"""The one engine-URL resolver (fragscope/collectors/endpoint.py), against real HTTP servers on
127.0.0.1 serving recorded pages: a vLLM that answers ``/`` with 404 (as vLLM does), SGLang, TGI,
Triton's separate metrics port, dcgm-exporter, an engine that is not up yet. Used by the agent's
collectors (``fragscope agent --vllm http://host:8000``), ``diagnose URL`` / ``--vllm``,
``fragscope record`` and ``diagnose scrape --url``."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fragscope.collectors import endpoint
from fragscope.collectors.dcgm import DcgmCollector
from fragscope.collectors.endpoint import Endpoint, EndpointError, candidates, resolve
from fragscope.collectors.http import FetchError
from fragscope.collectors.vllm import VllmCollector
from net_helpers import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
ROOT = os.path.dirname(HERE)
VLLM = os.path.join(DATA, "agent", "vllm_cpu_0.32.0_before.txt")
DCGM = os.path.join(DATA, "agent", "dcgm_l4_cncf.txt")
SGLANG = os.path.join(DATA, "live", "sglang_production_metrics_example.txt")
TGI = os.path.join(DATA, "engines", "tgi_datadog_payload_head.prom")
TRITON = os.path.join(DATA, "engines", "triton_trtllm_readme_nv_inference.prom")


def _read(p: str) -> bytes:
    with open(p, "rb") as fh:
        return fh.read()




class _Server:
    """A real HTTP server on 127.0.0.1: ``pages`` maps a path to a body; every other path is 404
    (vLLM's own answer to ``/``: {"detail":"Not Found"})."""

    def __init__(self, pages: dict[str, bytes], port: int = 0) -> None:
        self.pages = pages
        self.hits: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                outer.hits.append(self.path)
                body = outer.pages.get(self.path)
                if body is None:
                    self.send_response(404)
                    body, ctype = b'{"detail":"Not Found"}', "application/json"
                else:
                    self.send_response(200)
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def vllm():
    s = _Server({"/metrics": _read(VLLM)})
    yield s
    s.close()


def test_vllm_base_url_in_the_agent_collector_finds_metrics(vllm):
    """`fragscope agent --vllm http://127.0.0.1:8000`: the collector used to GET `/` (404 from vLLM)
    and collect nothing; it now finds /metrics and keeps it."""
    c = VllmCollector(vllm.base, timeout_s=5.0)
    r = c.collect(1.0)
    assert r.up and r.error is None, r.error
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= {s.name for s in r.samples}
    assert c.endpoint.url == vllm.base + "/metrics"
    r2 = c.collect(2.0)
    assert r2.up
    assert vllm.hits == ["/metrics", "/metrics"]  # found first time, then kept: one GET a tick


def test_agent_config_base_url_collects_through_its_plan(vllm):
    """The agent's own wiring: --vllm flag -> config -> planned collector -> samples."""
    from fragscope.agent.config import load_config
    from fragscope.agent.plan import plan_collectors

    cfg = load_config(None, {}, {"vllm.urls": [vllm.base], "process.enabled": False, "nvml.enabled": "false"})
    (p,) = [p for p in plan_collectors(cfg) if p.kind == "vllm"]
    r = p.make().collect(1.0)
    assert r.up and any(s.name == "vllm:num_preemptions_total" for s in r.samples)


def test_engine_not_up_yet_then_found():
    """A sidecar starts before its engine: refused now is not fatal; the page is found once it answers."""
    port = free_port()
    c = VllmCollector(f"http://127.0.0.1:{port}", timeout_s=2.0)
    r = c.collect(1.0)
    assert not r.up and "connection refused" in r.error and "\n" not in r.error
    assert c.endpoint.url is None
    s = _Server({"/metrics": _read(VLLM)}, port=port)
    try:
        r = c.collect(2.0)
        assert r.up and c.endpoint.url == f"http://127.0.0.1:{port}/metrics"
    finally:
        s.close()


def test_every_candidate_404_names_each_and_the_fix():
    s = _Server({})
    try:
        c = VllmCollector(s.base, timeout_s=2.0)
        r = c.collect(1.0)
        assert not r.up and "\n" not in r.error
        assert f"{s.base}/metrics: HTTP 404" in r.error and f"{s.base}/: HTTP 404" in r.error
        assert "metrics URL" in r.error
    finally:
        s.close()


def test_page_that_moves_is_looked_for_again():
    s = _Server({"/metrics": _read(VLLM)})
    try:
        e = Endpoint(s.base + "/")
        assert "vllm:" in e.fetch(timeout_s=2.0) and e.url == s.base + "/metrics"
        s.pages.clear()
        with pytest.raises(FetchError, match="HTTP 404"):
            e.fetch(timeout_s=2.0)
        assert e.url is None  # the next tick searches again
        s.pages["/metrics"] = _read(VLLM)
        e.fetch(timeout_s=2.0)
        assert e.url == s.base + "/metrics"
    finally:
        s.close()


@pytest.mark.parametrize("page,kind", [(SGLANG, "sglang"), (TGI, "engine"), (VLLM, "vllm-v1")])
def test_base_url_of_each_engine(page, kind):
    s = _Server({"/metrics": _read(page)})
    try:
        t = resolve(s.base)
        assert t.url == s.base + "/metrics" and kind in t.kinds and t.base == s.base
        assert VllmCollector(s.base).collect(1.0).up  # the agent's engine collector reads it too
    finally:
        s.close()


def test_triton_metrics_port_tried_after_the_http_port(monkeypatch):
    """Triton serves /metrics on 8002, not on its HTTP port 8000: the server's address finds it."""
    api = _Server({"/v2/health/ready": b""})  # Triton's HTTP API: /metrics is not there
    metrics = _Server({"/metrics": _read(TRITON)})
    try:
        monkeypatch.setitem(endpoint.TRITON_METRICS_PORT, api.port, metrics.port)
        assert candidates(api.base)[-1] == metrics.base + "/metrics"
        t = resolve(api.base)
        assert t.url == metrics.base + "/metrics" and t.kinds == ["engine"]
        c = VllmCollector(api.base)
        assert c.collect(1.0).up and c.endpoint.url == metrics.base + "/metrics"
    finally:
        api.close()
        metrics.close()


def test_dcgm_base_url_and_engine_page_on_a_dcgm_flag():
    s = _Server({"/metrics": _read(DCGM)})
    try:
        c = DcgmCollector(s.base)
        assert c.collect(1.0).up and c.endpoint.url == s.base + "/metrics"
        # a vLLM page is not what --dcgm wants: its candidates are tried, the answer says what it found
        with pytest.raises(EndpointError, match="dcgm-exporter|not a page"):
            resolve(s.base + "/nothing", timeout_s=2.0, kinds={"vllm-v1"})
    finally:
        s.close()


def test_explicit_metrics_url_is_used_as_given(vllm):
    e = Endpoint(vllm.base + "/metrics")
    assert e.url == vllm.base + "/metrics"
    e.fetch(timeout_s=2.0)
    assert vllm.hits == ["/metrics"]


def test_scrape_url_resolves_a_base_url(vllm):
    """`diagnose scrape --url http://host:port` finds /metrics like every other command."""
    from fragscope.cli import cli_exit_code, diagnose_group

    rc = cli_exit_code(diagnose_group, "diagnose",
                       ["scrape", "--url", vllm.base, "--format", "json", "--fail-on", "never"])
    assert rc == 0
    assert "/metrics" in vllm.hits and "/" not in vllm.hits


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_agent_process_with_a_base_url_collects(vllm, tmp_path):
    """The README's command, as a process: `fragscope agent --vllm http://127.0.0.1:PORT`."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", "from fragscope.cli import main; main()", "agent", "--vllm", vllm.base, "--no-store",
                          "--no-nvml", "--no-process", "--listen", f"127.0.0.1:{port}", "--interval", "0.5s"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        up = None
        for _ in range(100):  # bounded: 100 x 0.1 s
            time.sleep(0.1)
            try:
                st = _get_json(f"http://127.0.0.1:{port}/api/v1/status")
            except OSError:
                continue
            cols = {c["name"]: c for c in st["collectors"]}
            if cols.get("vllm", {}).get("runs_total", 0) >= 1:
                up = cols["vllm"]
                break
        assert up is not None, "agent did not start"
        assert up["up"] is True, up
        assert "/metrics" in vllm.hits
    finally:
        p.terminate()
        p.wait(10)


def test_agent_config_takes_an_address_like_diagnose(vllm):
    """`fragscope agent --vllm 127.0.0.1:PORT` (as `diagnose 127.0.0.1:PORT` takes it) finds the page too."""
    from fragscope.agent.config import ConfigError, load_config
    from fragscope.agent.plan import plan_collectors

    cfg = load_config(None, {}, {"vllm.urls": [f"127.0.0.1:{vllm.port}"], "process.enabled": False,
                                 "nvml.enabled": "false"})
    assert cfg.vllm_urls == [vllm.base]
    (p,) = plan_collectors(cfg)
    assert p.make().collect(1.0).up
    with pytest.raises(ConfigError, match="expected an http"):
        load_config(None, {}, {"vllm.urls": ["ftp://x/metrics"]})


def test_fleet_prometheus_takes_host_port_like_every_url_option(capsys):
    """`diagnose --prometheus 127.0.0.1:PORT` is read as http://127.0.0.1:PORT (it was refused as not a URL)."""
    from fragscope.cli import cli_exit_code, diagnose_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = cli_exit_code(diagnose_group, "diagnose", ["--prometheus", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot reach Prometheus at http://127.0.0.1:{port}" in err
