"""Every dashboard panel's query returns data through a real Prometheus scraping recorded vLLM V1 and
V0, dcgm-exporter (Kubernetes-mapped, scraped without honor_labels) and fragscope exporter scrapes,
plus the real ``fragscope agent`` process; the alert rules load and evaluate; ``diagnose
--prometheus`` groups that live fleet per pod.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import requests

from test_fleet_harness import (DATA, ROOT, Prometheus, ScrapeServer, free_port, needs_prometheus,
                                read_fixture, scrape_job, ticking, wait_until, with_labels)

pytestmark = [needs_prometheus, pytest.mark.e2e]  # a real Prometheus backfilled: heavy, run by .ci/run

DASHBOARD = os.path.join(ROOT, "dashboards", "fragscope.json")
RULES = os.path.join(ROOT, "dashboards", "rules", "fragscope-alerts.yml")
NS = "llm"
POD_V1, POD_V0, POD_AGENT = "vllm-v1-0", "vllm-v0-0", "vllm-agent-0"


def _entry(fn: str) -> list[str]:
    """A console entry point of this checkout, run with this interpreter (no install needed)."""
    prog = "diagnose" if fn == "diagnose_main" else "fragscope"
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {prog!r}; from fragscope.cli import {fn}; {fn}()"]


def _agent_available() -> bool:
    try:
        import fragscope.agent.daemon  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def fleet():
    v1 = read_fixture("vllm_v1_cncf_kops.metrics.txt")
    v0 = read_fixture("vllm_v0_names.metrics.txt")
    fr = read_fixture("fragscope_exporter.metrics.txt")
    # dcgm-exporter with Kubernetes pod mapping: the workload's pod on every sample
    dcgm = with_labels(read_fixture("dcgm_l4_cncf_kops.metrics.txt"),
                       {"pod": POD_V0, "namespace": NS, "container": "vllm"})
    srv = ScrapeServer({
        "/v1": lambda n: ticking(v1, n),
        "/v0": lambda n: ticking(v0, n),
        "/fragscope": lambda n: ticking(fr, n),
        "/dcgm": lambda n: dcgm,
        "/v1-agent": lambda n: ticking(v1, n),
    })
    tmp = tempfile.mkdtemp(prefix="fragscope-agent-")
    agent = None
    host = srv.url.split("//")[1]
    jobs = [
        scrape_job("vllm", host, "/v1", {"namespace": NS, "pod": POD_V1}),
        scrape_job("fragscope", host, "/fragscope", {"namespace": NS, "pod": POD_V1}),
        scrape_job("vllm-v0", host, "/v0", {"namespace": NS, "pod": POD_V0}),
        scrape_job("dcgm", host, "/dcgm", {"namespace": "gpu-operator", "pod": "dcgm-exporter-x7k2p"}),
        scrape_job("vllm-agent-pod", host, "/v1-agent", {"namespace": NS, "pod": POD_AGENT}),
    ]
    if _agent_available():
        port = free_port()
        agent = subprocess.Popen(
            [*_entry("main"), "agent",
             "--vllm", srv.url + "/v1-agent", "--listen", f"127.0.0.1:{port}", "--data-dir", tmp,
             "--interval", "1s", "--nvml-recorded", os.path.join(DATA, "nvml_h100_idle_load.json"),
             "--no-process", "--detect-interval", "2s"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "agent.log"), "w"), start_new_session=True)
        jobs.append(scrape_job("fragscope-agent", f"127.0.0.1:{port}", "/metrics", {"namespace": NS, "pod": POD_AGENT}))
    prom = Prometheus("scrape_configs:\n" + "".join(jobs), rule_files=[RULES])
    try:
        def ready():
            up = prom.query("up == 1")
            n = prom.query("count_over_time(vllm:num_requests_running[1m])")
            return len(up) == len(jobs) and len(n) >= 3 and all(float(r["value"][1]) >= 4 for r in n)
        wait_until(ready, 40, "all targets up with 4 scrapes each")
        yield {"prom": prom, "srv": srv, "agent": agent, "jobs": len(jobs)}
    finally:
        prom.close()
        if agent is not None and agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
        srv.close()


# ---------------------------------------------------------------------------------------------
def _dashboard() -> dict:
    with open(DASHBOARD, encoding="utf-8") as fh:
        return json.load(fh)


_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable interpolation for the variables this dashboard uses ($1 etc. left alone)."""
    def rep(m):
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))
    return _VAR.sub(rep, expr)


def _range(prom: Prometheus, expr: str) -> list:
    end = time.time()
    r = requests.get(prom.url + "/api/v1/query_range",
                     params={"query": expr, "start": end - 20, "end": end, "step": 1}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    return [s for s in body["data"]["result"]
            if any(math.isfinite(float(v)) for _, v in s["values"])]


def _targets():
    for p in _dashboard()["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]


def _vars(pod: str) -> dict[str, str]:
    return {"namespace": NS, "pod": pod, "model": ".*", "gpu": ".*", "__rate_interval": "15s",
            "__interval": "1s", "__range": "1m"}


def test_every_panel_query_returns_data_for_v1_pod_with_fragscope_exporter(fleet):
    prom = fleet["prom"]
    empty = []
    for title, ref, expr in _targets():
        res = _range(prom, substitute(expr, _vars(POD_V1)))
        if not res:
            empty.append(f"{title} [{ref}]")
        assert all(s["metric"].get("pod") in (POD_V1, None) for s in res), (title, ref, res[:1])
    assert not empty, f"panels without data for {POD_V1}: {empty}"


def test_v0_names_and_dcgm_fallbacks(fleet):
    """The V0 pod has vLLM V0 names and only dcgm-exporter GPU series (exported_pod): every query
    with a vLLM or DCGM branch returns data for it; fragscope-only queries return nothing (the pod
    filter holds, nothing leaks from the other pods)."""
    prom = fleet["prom"]
    wrong = []
    for title, ref, expr in _targets():
        res = _range(prom, substitute(expr, _vars(POD_V0)))
        expect = "vllm:" in expr or "DCGM_" in expr
        if bool(res) != expect:
            wrong.append(f"{title} [{ref}]: {'data' if res else 'no data'}")
        for s in res:
            assert s["metric"].get("pod") == POD_V0, (title, ref, s["metric"])
    assert not wrong, wrong
    # the DCGM fallback really scales MiB -> bytes and MHz -> Hz
    mem = _range(prom, substitute(
        [e for t, r, e in _targets() if t.startswith("GPU memory") and r == "C"][0], _vars(POD_V0)))
    used_mib = float(re.search(r"^DCGM_FI_DEV_FB_USED\{[^}]*\} (\S+)$",
                               read_fixture("dcgm_l4_cncf_kops.metrics.txt"), re.M).group(1))
    assert float(mem[0]["values"][-1][1]) == used_mib * 1048576


@pytest.mark.skipif(not _agent_available(), reason="fragscope.agent.daemon not built yet")
def test_panels_fed_by_the_real_agent(fleet):
    """The real agent process (recorded-NVML backend, no GPU) feeds the GPU, clock, throttle and
    collector panels for its pod."""
    prom = fleet["prom"]
    wait_until(lambda: prom.query(f'fragscope_gpu_sm_clock_hertz{{pod="{POD_AGENT}"}}'), 20, "agent series")
    missing = []
    for title, ref, expr in _targets():
        if not re.search(r"vllm:|fragscope_gpu_(?!idle_ratio)|fragscope_collector_up", expr):
            continue
        if not _range(prom, substitute(expr, _vars(POD_AGENT))):
            missing.append(f"{title} [{ref}]")
    assert not missing, f"panels without data from the real agent: {missing}"


def test_variable_queries(fleet):
    prom = fleet["prom"]
    want = {"namespace": {NS}, "pod": {POD_V1, POD_V0, POD_AGENT},
            "model": {"Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-2-13b-hf"}, "gpu": {"0"}}
    got = {}
    for v in _dashboard()["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
        assert m, v["query"]
        sel = substitute(m.group(1), {"namespace": ".*", "pod": ".*"})
        r = requests.get(f"{prom.url}/api/v1/label/{m.group(2)}/values", params={"match[]": sel}, timeout=10)
        got[v["name"]] = set(r.json()["data"])
    for name, values in want.items():
        assert values <= got[name], (name, got[name])


def test_rules_load_and_evaluate(fleet):
    prom = fleet["prom"]

    def evaluated():
        groups = requests.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None
    rules = wait_until(evaluated, 15, "every rule evaluated once")
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # the recording rules see the live series: fragmentation from the exporter's allocator bytes
    frag = prom.query(f'fragscope:torch_fragmentation:ratio{{pod="{POD_V1}"}}')
    assert frag and abs(float(frag[0]["value"][1]) - (1 - 6.2e10 / 7.1e10)) < 1e-9
    # ... and DCGM series scraped without honor_labels land on the workload's pod
    assert prom.query(f'fragscope:gpu_sm_clock_hertz{{namespace="{NS}",pod="{POD_V0}"}}')


# ---------------------------------------------------------------------------------------------
def _diagnose(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*_entry("diagnose_main"), *args], capture_output=True, text=True, timeout=timeout)


def test_diagnose_prometheus_groups_the_live_fleet(fleet):
    prom = fleet["prom"]
    r = _diagnose("--prometheus", prom.url, "--since", "5m", "--format", "json", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    targets = {t["target"]: t for t in d["targets"]}
    assert {f"{NS}/{POD_V1}", f"{NS}/{POD_V0}", f"{NS}/{POD_AGENT}"} <= set(targets)
    v0 = targets[f"{NS}/{POD_V0}"]
    assert v0["model"] == "meta-llama/Llama-2-13b-hf"
    assert "torch_allocated_bytes" in v0["missing_signals"]
    assert "gpu_memory_used_bytes" not in v0["missing_signals"]  # DCGM via exported_pod
    v1 = targets[f"{NS}/{POD_V1}"]
    assert v1["fragmentation_ratio"] == pytest.approx(1 - 6.2e10 / 7.1e10, abs=1e-4)
    assert v1["throughput_tokens_per_second"] > 0
    assert d["fleet"]["mode"] == "raw" and d["fleet"]["queries"] >= 1
    # no dcgm-exporter pod target: its series belong to the workload
    assert not any("dcgm-exporter" in t for t in targets)


def test_selector_narrows_and_keeps_exported_pod_series(fleet):
    prom = fleet["prom"]
    r = _diagnose("--prometheus", prom.url, "--since", "5m", "--format", "json", "--fail-on", "never",
                  "--selector", f'{{namespace="{NS}",pod="{POD_V0}"}}')
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [t["target"] for t in d["targets"]] == [f"{NS}/{POD_V0}"]
    assert "gpu_sm_clock_hertz" not in d["targets"][0]["missing_signals"]


def test_human_summary(fleet):
    r = _diagnose("--prometheus", fleet["prom"].url, "--since", "5m", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("fragscope fleet diagnosis of " + fleet["prom"].url)
    header = next(i for i, l in enumerate(lines) if l.startswith("TARGET"))
    body = lines[header + 1: header + 1 + 3]
    assert {l.split()[0] for l in body} >= {f"{NS}/{POD_V1}", f"{NS}/{POD_V0}"}


@pytest.mark.parametrize("args, want", [
    (["--selector", '{pod="no-such-pod"}'], "no vLLM, GPU or fragscope series matching"),
    (["--selector", 'pod="x"}'], "--selector"),
    (["--selector", '{__name__="up"}'], "__name__ is chosen by fragscope"),
    (["--since", "-5m"], "--since"),
    (["--start", "yesterday"], "--start: bad time"),
    (["--start", "2026-01-02T00:00:00Z", "--end", "2026-01-01T00:00:00Z"], "empty window"),
    (["--step", "0s"], "--step"),
    (["--header", "no colon"], "--header"),
    (["--basic-auth", "nopass"], "--basic-auth"),
    (["--bearer-token-file", "/nonexistent/token"], "--bearer-token-file"),
])
def test_bad_input_is_one_line_exit_2(fleet, args, want):
    r = _diagnose("--prometheus", fleet["prom"].url, "--since", "5m", *args) if "--since" not in args and \
        "--start" not in args else _diagnose("--prometheus", fleet["prom"].url, *args)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    err = r.stderr.strip()
    assert want in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_unreachable_and_wrong_url():
    port = free_port()
    r = _diagnose("--prometheus", f"http://127.0.0.1:{port}", "--since", "1h")
    assert r.returncode == 2 and "connection refused" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    srv = ScrapeServer({"/": lambda n: (200, "text/html", "<html><body>Grafana</body></html>")})
    try:
        r = _diagnose("--prometheus", srv.url + "/grafana", "--since", "1h")
        assert r.returncode == 2 and "404 Not Found" in r.stderr, r.stderr
    finally:
        srv.close()
