"""`fragscope mcp` against real components (heavy: run by .ci/run after the fast suite): diagnose_fleet against a
real Prometheus backfilled with scenario recordings (promtool tsdb create-blocks-from openmetrics), the same
targets, triage and per-pod verdicts as `diagnose --prometheus URL --format json`; diagnose_url on a real
fragscope agent whose engine source is down; the server over streamable HTTP (--listen)."""
from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("mcp")

from test_fleet_backfill import NS, write_pod_recording  # noqa: E402
from test_fleet_harness import PROMTOOL, Prometheus, needs_prometheus  # noqa: E402
from test_mcp import Served, _cli_json, _quoted  # noqa: E402

from fragscope.mcp.policy import Policy  # noqa: E402

pytestmark = pytest.mark.e2e

PODS = {"vllm-0": dict(kind="healthy", seed=21), "vllm-1": dict(kind="allocator-fragmentation", seed=22)}


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp-fleet")
    files = {}
    for pod, spec in PODS.items():
        files[pod] = str(d / f"{pod}.om")
        write_pod_recording(files[pod], pod, **spec)
        r = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", files[pod], str(d / "tsdb")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    from fragscope.collectors.exposition import read_recording

    w = read_recording(files["vllm-0"])
    p = Prometheus("", data_dir=str(d / "tsdb"))
    try:
        yield p, w.start, w.end
    finally:
        p.close()


def _key(doc: dict) -> list:
    return [(t["target"], t["status"], (t["top_finding"] or {}).get("id"), t["triage"]["flagged"],
             [(f["id"], f["severity"], f["confidence"], f["onset"]) for f in (t["report"] or {}).get("findings", [])],
             sorted(i["id"] for i in (t["report"] or {}).get("inconclusive", [])))
            for t in doc["targets"]]


@needs_prometheus
def test_diagnose_fleet_matches_the_cli(prom):
    p, start, end = prom
    with Served(Policy.build(allow_urls=[p.url])) as s:
        r = s.call("diagnose_fleet", {"prometheus_url": p.url, "start": repr(start), "end": repr(end)})
    assert not r.is_error, r.content[0].text
    want = _cli_json("--prometheus", p.url, "--start", repr(start), "--end", repr(end), "--fail-on", "never")
    got = r.structured_content
    assert _key(got) == _key(want)
    assert {t["target"] for t in got["targets"]} == {f"{NS}/{pod}" for pod in PODS}
    sick = next(t for t in got["targets"] if t["target"] == f"{NS}/vllm-1")
    assert sick["top_finding"]["id"] == "allocator-fragmentation"
    inside = _quoted(r.content[0].text)[1]
    assert "allocator-fragmentation" in inside and f"target={NS}/vllm-1" in inside
    assert json.dumps(got["mcp"]["could_not_judge"])  # always there, possibly empty


@needs_prometheus
def test_prometheus_host_refused_unless_allowed(prom):
    p, _, _ = prom
    with Served(Policy.build(allow_urls=["http://127.0.0.1:1"])) as s:
        r = s.call("diagnose_fleet", {"prometheus_url": p.url})
    assert r.is_error and "not an allowed address" in r.content[0].text


@pytest.mark.e2e
def test_streamable_http_listen(tmp_path):
    """`fragscope mcp --listen 127.0.0.1:PORT`: the SDK's client over streamable HTTP, the policy enforced in
    that server process too."""
    import os
    import sys
    import time

    import anyio
    from mcp import Client

    from test_fleet_harness import free_port
    from test_mcp import EX, ROOT, TOOLS

    port = free_port()
    code = "import sys; sys.argv[0] = 'fragscope'; from fragscope.cli import main; main()"
    proc = subprocess.Popen([sys.executable, "-c", code, "mcp", "--listen", f"127.0.0.1:{port}", "--allow-dir", EX],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT},
                            cwd=str(tmp_path))
    try:
        async def session():
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                return (await c.list_tools(), await c.call_tool("diagnose_file", {"path": "healthy.om.gz"}),
                        await c.call_tool("diagnose_url", {"url": "http://169.254.169.254/"}))

        deadline = time.monotonic() + 60
        while True:
            try:
                tools, ok, meta = anyio.run(session)
                break
            except Exception:  # noqa: BLE001 - not listening yet: retried until the deadline
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        assert {t.name for t in tools.tools} == TOOLS
        assert not ok.is_error and ok.structured_content["findings"] == []
        assert meta.is_error and "link-local" in meta.content[0].text
    finally:
        proc.terminate()
        proc.wait(10)


def test_diagnose_url_on_a_real_agent_with_its_engine_down():
    """A real agent (scheduler, HTTP API) on 127.0.0.1 whose vLLM source is refused: diagnose_url recognises the
    agent, reads its history and leads with SOURCES DOWN, as `diagnose URL` does (exit 4)."""
    import time

    from test_fleet_harness import free_port

    from fragscope.agent.config import load_config
    from fragscope.agent.daemon import Agent
    from fragscope.collectors.vllm import VllmCollector
    from fragscope.model import CollectResult, Sample

    class _Gpu:  # a GPU collector that answers (NVML cannot run here)
        name = "nvml"

        def collect(self, now):
            return CollectResult(samples=[Sample("fragscope_gpu_memory_used_bytes", (("gpu", "0"),), now, 1e9)])

    port, dead = free_port(), free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "store.enabled": False, "interval": "0.2s",
                                 "detect.interval": "0.3s"})
    ag = Agent(cfg, collectors=[("vllm", "vllm", VllmCollector(f"http://127.0.0.1:{dead}", timeout_s=0.5), 0.2, 2.0),
                                ("nvml", "nvml", _Gpu(), 0.2, 2.0)])
    ag.start()
    try:
        deadline = time.monotonic() + 15
        while ag.state.report is None and time.monotonic() < deadline:  # bounded
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        with Served(Policy.build(allow_urls=[url])) as s:
            r = s.call("diagnose_url", {"url": url, "since": "10m"})
        want = _cli_json(url, "--since", "10m")
    finally:
        ag.close()
    assert not r.is_error, r.content[0].text
    got = r.structured_content
    assert got["source"] == want["source"] == f"agent {url}"
    assert got["signals"]["sources_down"] and len(got["signals"]["sources_down"]) == len(want["signals"]["sources_down"])
    assert [f["id"] for f in got["findings"]] == [f["id"] for f in want["findings"]]
    before = _quoted(r.content[0].text)[0]
    assert before.startswith("SOURCES DOWN:")
    assert got["mcp"]["could_not_judge"][0]["id"] == "source-down"
