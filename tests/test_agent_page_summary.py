"""The agent's page at /: its title names the agent once (it read "fragscope agent: fragscope agent (live)")
and a compact line says which collectors are up, which are down (since when, why) and whether the agent
is ready, from the same state as /api/v1/status and /readyz."""
from __future__ import annotations

import html
import re
import socket
import time

from report_common import agent_state, get, serve_agent

from fragscope.agent.state import CollectorHealth


def _page(st, cfg) -> str:
    srv, url = serve_agent(st, cfg)
    try:
        return get(url + "/?format=html")[2]
    finally:
        srv.shutdown()
        srv.server_close()


def test_title_does_not_repeat_itself():
    st, cfg = agent_state()
    body = _page(st, cfg)
    h1 = html.unescape(re.search(r"<h1>(.*?)</h1>", body).group(1))
    title = html.unescape(re.search(r"<title>(.*?)</title>", body).group(1))
    host = socket.gethostname()
    assert re.fullmatch(rf"fragscope agent: {re.escape(host)} \(last [0-9.]+ (h|min|s)\)", h1), h1
    assert title == h1
    assert h1.lower().count("fragscope") == 1 and h1.count("agent") == 1


def test_collectors_summary_up_down_and_readiness():
    st, cfg = agent_state()
    down_at = time.time() - 90
    st.collectors = {
        "vllm": CollectorHealth("vllm", "vllm", 1.0, 3.0, up=False, runs_total=5, down_since=down_at,
                                last_error="http://127.0.0.1:8000/metrics: cannot connect (connection refused)"),
        "nvml": CollectorHealth("nvml", "nvml", 1.0, 5.0, up=True, runs_total=5),
        "process": CollectorHealth("process", "process", 1.0, 5.0, up=True, runs_total=5),
    }
    st.first_round_done = True
    body = html.unescape(_page(st, cfg))
    line = re.search(r'<p class="collectors">(.*?)</p>', body, re.S).group(1)
    text = re.sub(r"<[^>]+>", "", line)
    assert text.startswith("Collectors 2 of 3 up:")
    assert "nvml up" in text and "process up" in text
    assert "vllm down since" in text and "connection refused" in text
    assert "not ready: engine source vllm collector down since" in text  # the /readyz decision
    assert body.index('class="collectors"') < body.index("<h2>")  # at the top, before the findings


def test_collectors_summary_all_up_and_ready():
    st, cfg = agent_state()
    st.collectors = {"nvml": CollectorHealth("nvml", "nvml", 1.0, 5.0, up=True, runs_total=1)}
    text = re.sub(r"<[^>]+>", "", re.search(r'<p class="collectors">(.*?)</p>', _page(st, cfg), re.S).group(1))
    assert text == "Collectors 1 of 1 up: nvml up · ready"
