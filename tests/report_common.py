"""Shared by the report tests: example recordings, and an in-process agent serving its page."""
from __future__ import annotations

import os
import time
import urllib.request
from functools import lru_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
HOSTILE = '<script>alert("x")</script>"><img src=x onerror=alert(1)>&amp;'


@lru_cache(maxsize=None)
def example(name: str):
    """(window, report) of examples/<name>.om.gz."""
    from fragscope.collectors.exposition import read_recording
    from fragscope.pipeline import diagnose

    w = read_recording(os.path.join(EXAMPLES, name + ".om.gz"))
    return w, diagnose(w)


def agent_state(name: str | None = "fragmentation-incident", with_report: bool = True):
    """An AgentState whose in-memory ring holds an example recording moved to end now, and (with
    ``with_report``) the report the agent's detectors make of that window."""
    from fragscope.agent.config import AgentConfig
    from fragscope.agent.daemon import AgentState, Ring
    from fragscope.model import Sample
    from fragscope.pipeline import diagnose

    cfg = AgentConfig(listen="127.0.0.1:0", data_dir=None, store_enabled=False, detect_window=9 * 3600.0,
                      detect_step=60.0)
    st = AgentState(cfg)
    st.ring = Ring(cfg.detect_window, cfg.detect_step)
    now = time.time()
    if name:
        w, _ = example(name)
        shift = now - 30.0 - w.end
        st.ring.add(Sample(k.name, k.labels, float(t) + shift, float(v))
                    for k, s in w.series.items() for t, v in zip(s.ts, s.values))
    if with_report:
        st.report, st.report_at = diagnose(st.ring.window_at(now, "fragscope agent (live)")), now
    return st, cfg


def serve_agent(st, cfg):
    from fragscope.agent.api import serve

    srv = serve(st, cfg)
    host, port = srv.server_address[:2]
    return srv, f"http://{host}:{port}"


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=20) as r:  # noqa: S310 - 127.0.0.1 only
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()
