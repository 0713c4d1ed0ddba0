"""Never silently healthy: a verdict judged while a source was down says so in its first line and its
exit code (4, docs/cli.md#exit-codes), and the agent's /api/v1/status and /readyz agree on readiness
(one function decides it). A real agent (scheduler and HTTP API) on 127.0.0.1."""
from __future__ import annotations

import json
import re
import time

import pytest

from fragscope.agent.config import load_config
from fragscope.model import CollectResult, Finding, Report, Sample, Severity
from net_helpers import free_port, get_json




class _Gpu:
    name = "nvml"

    def collect(self, now):
        return CollectResult(samples=[Sample("fragscope_gpu_memory_used_bytes", (("gpu", "0"),), now, 1e9)])


@pytest.fixture
def agent_engine_down():
    """An agent whose vLLM source is refused from the start while its GPU collector answers."""
    from fragscope.agent.daemon import Agent
    from fragscope.collectors.vllm import VllmCollector

    port, dead = free_port(), free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "store.enabled": False, "interval": "0.2s",
                                 "detect.interval": "0.3s"})
    ag = Agent(cfg, collectors=[("vllm", "vllm", VllmCollector(f"http://127.0.0.1:{dead}", timeout_s=0.5), 0.2, 2.0),
                                ("nvml", "nvml", _Gpu(), 0.2, 2.0)])
    ag.start()
    deadline = time.monotonic() + 15
    while ag.state.report is None and time.monotonic() < deadline:  # bounded
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    ag.close()


def test_status_and_readyz_agree(agent_engine_down):
    code, ready = get_json(agent_engine_down + "/readyz")
    _, status = get_json(agent_engine_down + "/api/v1/status")
    assert code == 503 and ready["status"] == "not ready"
    assert status["ready"] is False  # it said true while /readyz answered 503
    assert status["ready_reasons"] == ready["reasons"]
    assert status["first_round_done"] is True


def test_status_ready_when_everything_answers():
    from fragscope.agent.daemon import Agent

    port = free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "store.enabled": False, "interval": "0.2s"})
    ag = Agent(cfg, collectors=[("nvml", "nvml", _Gpu(), 0.2, 2.0)])
    ag.start()
    try:
        for _ in range(100):  # bounded: 100 x 0.05 s
            code, ready = get_json(f"http://127.0.0.1:{port}/readyz")
            if code == 200:
                break
            time.sleep(0.05)
        _, status = get_json(f"http://127.0.0.1:{port}/api/v1/status")
    finally:
        ag.close()
    assert code == 200 and status["ready"] is True and status["ready_reasons"] == []


def _diagnose(capsys, *args) -> tuple[int, str, str]:
    from fragscope.cli import cli_exit_code, diagnose_group

    capsys.readouterr()
    rc = cli_exit_code(diagnose_group, "diagnose", list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("fail_on", ["critical", "never"])
def test_diagnose_agent_with_its_engine_down_is_not_exit_0(agent_engine_down, capsys, fail_on):
    rc, out, err = _diagnose(capsys, "--agent", agent_engine_down, "--since", "5m", "--fail-on", fail_on)
    assert rc == 4, (out, err)
    assert out.startswith("SOURCES DOWN: this verdict is incomplete (exit 4): vllm collector down since")
    first = " ".join(out.split("\nfragscope ")[0].split())  # the first line, as wrapped at 100 columns
    assert "connection refused" in first
    assert "No finding." not in out or "not a clean bill of health" in out


def test_diagnose_agent_json_names_the_down_sources(agent_engine_down, capsys):
    rc, out, _ = _diagnose(capsys, "--agent", agent_engine_down, "--since", "5m", "--format", "json")
    d = json.loads(out)
    assert rc == 4 and any("vllm collector down" in s for s in d["signals"]["sources_down"])


def _finding(sev: Severity) -> Finding:
    return Finding(id="kv-cache-pressure", severity=sev, confidence=0.9, summary="s", onset=None, evidence=[])


@pytest.mark.parametrize("findings,down,fail_on,rc", [
    ([], [], "critical", 0),
    ([], ["vllm collector down: refused"], "critical", 4),
    ([], ["vllm collector down: refused"], "never", 4),
    ([_finding(Severity.CRITICAL)], ["vllm collector down: refused"], "critical", 1),  # a finding wins
    ([_finding(Severity.WARNING)], ["vllm collector down: refused"], "critical", 4),
    ([_finding(Severity.WARNING)], [], "critical", 0),
])
def test_exit_code_contract(findings, down, fail_on, rc):
    from fragscope.cli.render import report_exit_code

    rep = Report(window=(0.0, 1.0), findings=findings, signals={"sources_down": down} if down else {})
    assert report_exit_code(rep, fail_on) == rc


def test_live_page_that_never_answered_is_a_source_down():
    from fragscope.cli.agent_cmds import Together

    class Ok:
        name = "http://a/metrics"

        def collect(self, now):
            return CollectResult(samples=[Sample("vllm:num_requests_running", (), now, 1.0)])

    class Down:
        name = "http://b/metrics"

        def collect(self, now):
            return CollectResult(up=False, error="http://b/metrics: HTTP 503")

    t = Together([Ok(), Down()])
    for i in range(3):
        assert t.collect(float(i)).up
    assert t.never_answered() == ["http://b/metrics: no scrape succeeded (last: http://b/metrics: HTTP 503)"]

    class Flaky(Down):
        n = 0

        def collect(self, now):
            self.n += 1
            return Ok().collect(now) if self.n % 3 else super().collect(now)  # fails 1 in 3

    t = Together([Ok(), Flaky()])
    for i in range(6):
        t.collect(float(i))
    assert t.never_answered() == []  # a page failing now and then is in the notes, not a source down


def test_html_report_says_sources_down_first(agent_engine_down, capsys, tmp_path):
    out = tmp_path / "r.html"
    rc, _, _ = _diagnose(capsys, "--agent", agent_engine_down, "--since", "5m", "--html", str(out))
    page = out.read_text()
    assert rc == 4
    i = page.index('class="sources-down"')
    assert i < page.index("<h2>") and "vllm collector down since" in page[i:i + 600]


def test_live_sampling_with_a_page_that_stopped_answering_exits_4(capsys):
    """diagnose --vllm A --dcgm B: B was found (resolved), then answered HTTP 503 at every scrape: the verdict
    was judged without it, so it says so (first line, signals.sources_down, exit 4)."""
    import os
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    data = os.path.join(os.path.dirname(__file__), "data", "agent")
    pages = {"/metrics": open(os.path.join(data, "vllm_cpu_0.32.0_before.txt"), "rb").read(),
             "/dcgm/metrics": open(os.path.join(data, "dcgm_l4_cncf.txt"), "rb").read()}
    state = {"dcgm_hits": 0}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            body = pages.get(self.path)
            if self.path == "/dcgm/metrics":
                state["dcgm_hits"] += 1
                if state["dcgm_hits"] > 1:  # answered the resolver once, then went down
                    body = None
            self.send_response(200 if body is not None else 503)
            body = body if body is not None else b"down"
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        rc, out, err = _diagnose(capsys, "--vllm", base, "--dcgm", base + "/dcgm/metrics", "--duration", "1s",
                                 "--interval", "0.5s", "--format", "json", "--fail-on", "never")
    finally:
        srv.shutdown()
        srv.server_close()
    d = json.loads(out)
    assert rc == 4, err
    (down,) = d["signals"]["sources_down"]
    m = re.fullmatch(rf"{re.escape(base)}/dcgm/metrics: (\d+) of (\d+) scrapes failed \(last: .*HTTP 503.*\)", down)
    assert m and 2 * int(m.group(1)) > int(m.group(2)), down  # read once (the resolver's body), then down


def test_no_gpu_is_said_with_the_way_to_turn_it_off():
    from fragscope.agent.health import sources_down

    status = {"collectors": [
        {"name": "nvml", "kind": "nvml", "up": False, "error": "NVML: no NVIDIA driver or GPU", "down_since": None,
         "missing": [{"name": "fragscope_gpu_memory_used_bytes", "labels": {}, "reason": "no_gpu", "detail": ""}]},
        {"name": "vllm", "kind": "vllm", "up": True, "error": None, "missing": []}]}
    (line,) = sources_down(status, {"status": "ready"})
    assert line.startswith("nvml collector down: NVML: no NVIDIA driver or GPU") and "--no-nvml" in line
    assert sources_down(None, None) == [
        "the agent's /api/v1/status could not be read: whether its sources are up is unknown",
        "the agent's /readyz could not be read: whether it is ready is unknown"]
