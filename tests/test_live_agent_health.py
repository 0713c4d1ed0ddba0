"""The agent from its first minute: a down source is named in the verdict and fails /readyz (engine
sources only); the reasons are built from the collectors' state, after the detectors ran."""
from __future__ import annotations

import calendar
import json
import time

import pytest

from fragscope.agent.config import load_config
from fragscope.agent.health import Down, down_collectors, explain_down, kinds_of, readiness_problems
from fragscope.agent.state import AgentState, CollectorHealth
from fragscope.model import CollectResult, Inconclusive, Report, Sample
from net_helpers import free_port, get_json

T_DOWN = calendar.timegm((2026, 12, 1, 12, 3, 5, 0, 0, 0))  # 12:03:05 UTC
REFUSED = "http://10.0.0.7:8000/metrics: cannot connect (connection refused)"


@pytest.mark.parametrize("missing,kinds", [
    ("vllm:num_requests_waiting", {"vllm", "logs"}),  # read from /metrics or from the engine's log lines
    ("vllm:kv_cache_usage_perc (V1) or vllm:gpu_cache_usage_perc (V0)", {"vllm", "logs"}),
    ("fragscope_gpu_memory_used_bytes or DCGM_FI_DEV_FB_USED", {"nvml", "dcgm"}),
    ("fragscope_torch_reserved_bytes", {"torch"}),
    ("kernel timeline", set()),
])
def test_kinds_of_missing_entries(missing, kinds):
    assert kinds_of(missing) == kinds


def _report() -> Report:
    return Report(window=(0.0, 1.0), inconclusive=[
        Inconclusive("kv-cache-pressure", ["vllm:kv_cache_usage_perc (V1) or vllm:gpu_cache_usage_perc (V0)"],
                     "KV cache usage not collected"),
        Inconclusive("allocator-fragmentation", ["fragscope_torch_reserved_bytes"], "no probe data"),
        Inconclusive("capacity-saturation", [], "no data"),
        Inconclusive("launch-bound", [], "window of 12 s is too short"),
    ])


def test_explain_down_names_the_source_and_keeps_the_detector_reason():
    rep = _report()
    n = explain_down(rep, [Down("vllm", "vllm", T_DOWN, REFUSED)], now=T_DOWN + 60)
    by = {i.id: i.reason for i in rep.inconclusive}
    assert n == 2
    assert by["kv-cache-pressure"] == (f"vllm collector down since 12:03:05 UTC: {REFUSED} "
                                       "(detector: KV cache usage not collected)")
    assert by["capacity-saturation"].startswith("vllm collector down since 12:03:05 UTC")  # "no data"
    assert by["allocator-fragmentation"] == "no probe data"  # the probe is not down
    assert by["launch-bound"] == "window of 12 s is too short"
    assert rep.inconclusive[0].missing == ["vllm:kv_cache_usage_perc (V1) or vllm:gpu_cache_usage_perc (V0)"]
    # an older outage carries the date
    rep = _report()
    explain_down(rep, [Down("vllm", "vllm", T_DOWN, REFUSED)], now=T_DOWN + 3 * 86400)
    assert rep.inconclusive[0].reason.startswith("vllm collector down since 2026-12-01 12:03 UTC: ")


def test_explain_down_dcgm_only_touches_gpu_entries():
    rep = Report(window=(0, 1), inconclusive=[
        Inconclusive("clock-throttling", ["fragscope_gpu_sm_clock_hertz or DCGM_FI_DEV_SM_CLOCK"], "SM clock not collected"),
        Inconclusive("kv-cache-pressure", ["vllm:num_requests_waiting"], "x"),
        Inconclusive("capacity-saturation", [], "no data")])  # "no data" is explained by an engine source only
    assert explain_down(rep, [Down("dcgm", "dcgm", None, "http://d:9400/metrics: HTTP 503")]) == 1
    assert rep.inconclusive[0].reason == "dcgm collector down: http://d:9400/metrics: HTTP 503 (detector: SM clock not collected)"
    assert [i.reason for i in rep.inconclusive[1:]] == ["x", "no data"]


def test_down_collectors_from_health_objects_and_status_json():
    h_up = CollectorHealth("process", "process", 1.0, 5.0, up=True)
    h_dn = CollectorHealth("vllm_1", "vllm", 1.0, 3.0, up=False, last_error=REFUSED, down_since=T_DOWN)
    h_new = CollectorHealth("nvml", "nvml", 1.0, 5.0)  # not run yet: not down
    assert down_collectors([h_up, h_dn, h_new]) == [Down("vllm_1", "vllm", T_DOWN, REFUSED)]
    js = [json.loads(json.dumps(h.to_dict())) for h in (h_up, h_dn, h_new)]
    assert down_collectors(js) == [Down("vllm_1", "vllm", T_DOWN, REFUSED)]


def test_readiness_engine_down_fails_dcgm_down_does_not():
    cfg = load_config(None, {}, {"store.enabled": False})
    st = AgentState(cfg)
    st.collectors = {"process": CollectorHealth("process", "process", 1, 5, up=True, runs_total=3),
                     "dcgm": CollectorHealth("dcgm", "dcgm", 1, 3, up=False, runs_total=3, last_error="HTTP 503",
                                             down_since=T_DOWN)}
    assert readiness_problems(st) == []  # a GPU exporter down alone does not make the agent unready
    st.collectors["vllm"] = CollectorHealth("vllm", "vllm", 1, 3, up=False, runs_total=3, last_error=REFUSED,
                                            down_since=T_DOWN)
    why = readiness_problems(st)
    assert len(why) == 1 and why[0].startswith("engine source vllm collector down since") and REFUSED in why[0]




def test_agent_from_its_first_minute_names_the_down_engine(tmp_path):
    """The real scheduler and API: the vLLM source is refused from the start, NVML answers. /readyz is
    503 naming it, and the agent's own findings say the collector is down, not just 'missing'."""
    from fragscope.agent.daemon import Agent
    from fragscope.collectors.vllm import VllmCollector

    class Gpu:
        def collect(self, now):
            return CollectResult(samples=[Sample("fragscope_gpu_memory_used_bytes", (("gpu", "0"),), now, 1e9)])

    port, dead = free_port(), free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "store.enabled": False, "interval": "0.2s",
                                 "detect.interval": "0.3s"})
    t_start = time.time()
    ag = Agent(cfg, collectors=[("vllm", "vllm", VllmCollector(f"http://127.0.0.1:{dead}/metrics", timeout_s=0.5),
                                 0.2, 2.0), ("nvml", "nvml", Gpu(), 0.2, 2.0)])
    ag.start()
    try:
        deadline = time.monotonic() + 15
        while ag.state.report is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code, ready = get_json(f"http://127.0.0.1:{port}/readyz")
        _, findings = get_json(f"http://127.0.0.1:{port}/api/v1/findings")
        _, status = get_json(f"http://127.0.0.1:{port}/api/v1/status")
    finally:
        ag.close()
    assert code == 503 and ready["status"] == "not ready"
    assert any(r.startswith("engine source vllm collector down since") and "connection refused" in r
               for r in ready["reasons"]), ready
    vllm = next(c for c in status["collectors"] if c["name"] == "vllm")
    assert vllm["up"] is False and t_start - 1 <= vllm["down_since"] <= time.time()
    nvml = next(c for c in status["collectors"] if c["name"] == "nvml")
    assert nvml["up"] is True and nvml["down_since"] is None
    reasons = {i["id"]: i["reason"] for i in findings["inconclusive"]}
    named = [r for r in reasons.values() if r.startswith("vllm collector down since")]
    assert named and all("connection refused" in r for r in named), reasons
