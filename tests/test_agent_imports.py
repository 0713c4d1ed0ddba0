"""The sidecar stays light: a running agent (collectors, store, detectors, exporter, API) imports neither
pandas nor requests (issue 9: pandas is for notebooks, the sidecar's HTTP is http.client)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e  # a real agent in a subprocess

CODE = textwrap.dedent('''
    import json, sys, tempfile, time, urllib.request
    from fragscope.agent.config import AgentConfig
    from fragscope.agent.daemon import Agent

    d = tempfile.mkdtemp()
    cfg = AgentConfig(listen="127.0.0.1:0", data_dir=d, interval=0.2, detect_interval=0.5,
                      nvml_enabled="off", vllm_urls=["http://127.0.0.1:9/metrics"])
    a = Agent(cfg)
    a.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and a.state.detector.runs < 2:
            time.sleep(0.1)
        port = a.server.server_address[1]
        for path in ("/metrics", "/api/v1/status", "/api/v1/findings"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read()
    finally:
        a.stop()
    print(json.dumps({"runs": a.state.detector.runs,
                      "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("pandas", "requests"))}))
''')


def test_running_agent_imports_neither_pandas_nor_requests(tmp_path):
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["runs"] >= 2  # the detectors ran (pipeline, playbooks, registry all imported)
    assert out["heavy"] == []
