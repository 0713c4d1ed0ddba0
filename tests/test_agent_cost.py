"""What the agent's steady-state savings must not change: streamed history queries give the same document
as the full window, the ring's windows are what Window.from_columns makes of the same columns, the watch
pass finds what the short-window pipeline finds (and skips when nothing arrived), and the process
collector still reads fresh cgroup counters every tick. No timings asserted (bench/bench_agent.py)."""
from __future__ import annotations

import json
import math
import os
import time
import tracemalloc
import types

import numpy as np
import pytest

from fragscope.agent import loops
from fragscope.agent.api import iter_scan_json, iter_window_json
from fragscope.agent.ring import Ring
from fragscope.agent.state import DetectorHealth
from fragscope.agent.store import Store, TooManyPoints
from fragscope.collectors.process import ProcessCollector
from fragscope.model import Report, Sample, SeriesKey, Window, make_labels
from fragscope.pipeline import judge_present, run_detectors

T0 = 1_800_000_000.0


def _store(tmp_path, n: int = 300) -> Store:
    st = Store(str(tmp_path / "h.sqlite"))
    lab = make_labels({"model_name": "m", "engine": "0"})
    samples = []
    for i in range(n):
        t = T0 + i + 0.25
        samples += [Sample("vllm:num_requests_running", lab, t, float(i % 7)),
                    Sample("vllm:num_requests_waiting", lab, t, 0.5 * i),
                    Sample("vllm:e2e_request_latency_seconds_bucket", lab + (("le", "1.0"),), t, float(i)),
                    Sample("fragscope_gpu_utilization_ratio", make_labels({"gpu": "1"}), t, i / n)]
    st.append(samples)
    st.flush()
    return st


@pytest.mark.parametrize("names,step,span", [(None, None, (0, 400)), (None, 15.0, (0, 400)),
                                              (["vllm:num_requests_running"], None, (10, 50.5)),
                                              (["vllm:e2e_request_latency_seconds"], 7.0, (0, 400)),
                                              (["no_such_metric"], None, (0, 400))])
def test_streamed_history_is_the_same_document_as_the_window(tmp_path, names, step, span):
    st = _store(tmp_path)
    a, b = T0 + span[0], T0 + span[1]
    full = b"".join(iter_window_json(st.query(names, a, b, step=step, source="src"), a, b))
    scan = st.scan(names, a, b, step=step)
    streamed = b"".join(iter_scan_json(scan, a, b, "src"))
    assert streamed == full
    doc = json.loads(streamed)
    assert doc["points"] == sum(len(s["ts"]) == len(s["values"]) and len(s["ts"]) for s in doc["series"])
    if names is None and step is None:
        assert doc["points"] == 4 * 300  # every point written, each series once


def test_streamed_history_refuses_past_max_points_before_sending(tmp_path):
    st = _store(tmp_path)
    with pytest.raises(TooManyPoints):
        st.scan(None, T0, T0 + 400, max_points=4 * 300 - 1)
    assert st.scan(None, T0, T0 + 400, max_points=4 * 300).total == 1200


@pytest.mark.e2e  # ~10 s: tracemalloc traces every row tuple of 400k fetched
def test_streamed_history_never_holds_the_window(tmp_path):
    """200k points: the window itself is 3.2 MB of numpy (16 bytes a point) before any formatting; the
    stream holds one 8192-row block at a time (Python allocations traced; SQLite's own cache is not).
    Measured: 2.0 MB peak streamed, 9.0 MB through Store.query + iter_window_json."""
    st = Store(str(tmp_path / "big.sqlite"))
    sid = st._sid("vllm:num_requests_running", make_labels({"engine": "0"}))
    n = 200_000
    st._w.execute("BEGIN")
    st._w.executemany("INSERT INTO points VALUES (?, ?, ?)",
                      ((sid, int(T0 * 1000) + 1000 * i, float(i % 13)) for i in range(n)))
    st._w.execute("COMMIT")
    tracemalloc.start()
    try:
        size = sum(len(p) for p in iter_scan_json(st.scan(None, T0, T0 + n, max_points=n), T0, T0 + n, "x"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size > 2_000_000  # the document really was produced
    assert peak < n * 16, f"peak {peak / 1e6:.1f} MB of Python allocations while streaming {n} points"


def test_ring_window_matches_from_columns_and_counts_versions():
    r = Ring(600, 5)
    lab = make_labels({"gpu": "0"})
    cols = {}
    for i in range(200):
        t = T0 + i
        v = math.nan if i % 17 == 0 else float(i)
        r.add([Sample("fragscope_gpu_utilization_ratio", lab, t, v), Sample("vllm:num_preemptions_total", (), t, 2.0 * i)])
    assert r.version == 400
    r.add([Sample("vllm:num_preemptions_total", (), math.nan, 1.0)])  # no time: refused, not raised
    assert r.version == 400
    # independent: the last sample of each 5 s step, from the same inputs
    for name, lab_, f in (("fragscope_gpu_utilization_ratio", lab, lambda i: math.nan if i % 17 == 0 else float(i)),
                          ("vllm:num_preemptions_total", (), lambda i: 2.0 * i)):
        last = {}
        for i in range(200):
            last[math.floor((T0 + i) / 5)] = (T0 + i, f(i))
        ts, vs = zip(*[last[b] for b in sorted(last)])
        cols[SeriesKey(name, lab_)] = (ts, vs)
    now = T0 + 199
    for span in (None, 60.0):
        w = r.window_at(now, "t", span=span)
        lo = now - (600 if span is None else span)
        ref = Window.from_columns({k: ([t for t in ts if t >= lo], [v for t, v in zip(ts, vs) if t >= lo])
                                   for k, (ts, vs) in cols.items()}, source="t",
                                  types={"fragscope_gpu_utilization_ratio": "gauge", "vllm:num_preemptions_total": "counter"})
        assert set(w.series) == set(ref.series)
        for k, s in ref.series.items():
            assert np.array_equal(w.series[k].ts, s.ts) and np.array_equal(w.series[k].values, s.values)
            assert w.series[k].type == s.type
        assert (w.start, w.end, w.dropped_points) == (ref.start, ref.end, ref.dropped_points)


def _storm_ring() -> Ring:
    ring = Ring(3 * 3600.0, 5.0)
    now = time.time()
    lab = make_labels({"model_name": "m", "engine": "0"})
    for i in range(120):
        t = now - 120 + i
        ring.add([Sample("vllm:kv_cache_usage_perc", lab, t, 0.99),
                  Sample("vllm:num_requests_waiting", lab, t, 20.0),
                  Sample("vllm:num_requests_running", lab, t, 30.0),
                  Sample("vllm:num_preemptions_total", lab, t, 1000.0 + 5 * i),
                  Sample("fragscope_gpu_utilization_ratio", make_labels({"gpu": "0"}), t, 0.97)])
    return ring


def test_judge_present_is_the_short_window_pipeline():
    w = _storm_ring().window_at(time.time(), "t", span=loops.WATCH_SPAN_S)
    full = run_detectors(w)
    quick = judge_present(w)
    assert [(f.id, f.severity.value, f.subject) for f in quick] == \
        [(f.id, f.severity.value, f.subject) for f in full.findings]
    assert any(f.id == "kv-cache-pressure" for f in quick)  # the storm is seen at all
    assert judge_present(Window({}, math.nan, math.nan)) == []


def test_watch_window_without_bucket_series_judges_the_same_on_every_scenario():
    """The watch pass leaves out histograms' finite buckets (loops.watch_keeps): the present-state path
    must find the same (id, severity, subject, confidence) with and without them, on every scenario kind
    over the last 2 minutes. If a level detector starts reading quantiles, this fails."""
    from fragscope.scenarios import KINDS, Scenario, to_window

    findings = dropped = 0
    for kind in KINDS:  # 30 min at the ring's 5 s step, the pathology from minute 5 (0.7 s for all kinds)
        w, _ = to_window(Scenario(kind, seed=1, duration_s=1800, step_s=5, onset_s=300))
        for span in (loops.WATCH_SPAN_S,):
            part = w.between(w.end - span, w.end)
            kept = Window({k: s for k, s in part.series.items() if loops.watch_keeps(k)}, part.start, part.end,
                          part.source)
            dropped += len(part.series) - len(kept.series)
            full = [(f.id, f.severity.value, f.subject, f.confidence) for f in judge_present(part)]
            assert [(f.id, f.severity.value, f.subject, f.confidence) for f in judge_present(kept)] == full, kind
            findings += len(full)
    assert findings >= 6 and dropped > 0  # the comparison saw findings, and buckets were left out
    assert loops.watch_keeps(SeriesKey("vllm:time_to_first_token_seconds_bucket", (("le", "+Inf"),)))
    assert not loops.watch_keeps(SeriesKey("vllm:time_to_first_token_seconds_bucket", (("le", "0.5"),)))


def test_watch_pass_skips_when_no_sample_arrived(monkeypatch):
    import fragscope.pipeline as pipeline

    calls = []
    real = pipeline.judge_present
    monkeypatch.setattr(pipeline, "judge_present", lambda w: calls.append(1) or real(w))
    ring = _storm_ring()
    agent = types.SimpleNamespace(state=types.SimpleNamespace(ring=ring, report=Report(window=(0.0, 1.0)),
                                                              detector=DetectorHealth()))
    assert loops.watch_once(agent) is True and len(calls) == 1
    assert loops.watch_once(agent) is True and len(calls) == 1  # nothing new: the last look stands
    ring.add([Sample("vllm:kv_cache_usage_perc", make_labels({"model_name": "m", "engine": "0"}),
                     time.time(), 0.99)])
    assert loops.watch_once(agent) is True and len(calls) == 2


def _cgroup(root, quota: str, throttled_usec: int) -> None:
    (root / "cpu.max").write_text(quota + "\n")
    (root / "cpu.stat").write_text(f"usage_usec 5000000\nnr_periods 10\nnr_throttled 2\n"
                                   f"throttled_usec {throttled_usec}\n")


def _values(res) -> dict:
    return {s.name: s.value for s in res.samples if s.name.startswith("fragscope_container_")}


def test_process_collector_reads_counters_every_tick_and_the_quota_every_rescan(tmp_path):
    _cgroup(tmp_path, "200000 100000", 1_000_000)
    c = ProcessCollector(pids=[os.getpid()], cgroup_root=str(tmp_path), proc_cgroup=str(tmp_path / "none"))
    first = _values(c.collect(1.0))
    assert first["fragscope_container_cpu_quota_cores"] == 2.0
    assert first["fragscope_container_cpu_throttled_seconds_total"] == 1.0
    _cgroup(tmp_path, "100000 100000", 3_000_000)
    second = _values(c.collect(2.0))
    assert second["fragscope_container_cpu_throttled_seconds_total"] == 3.0  # fresh every tick
    assert second["fragscope_container_cpu_quota_cores"] == 2.0  # the quota: until the next rescan
    c._cg_at -= c.rescan_s  # the rescan is due
    assert _values(c.collect(3.0))["fragscope_container_cpu_quota_cores"] == 1.0


def test_process_collector_does_not_scan_every_tick_while_no_engine_runs(tmp_path, monkeypatch):
    c = ProcessCollector(match=("no-such-engine-" + str(os.getpid()),), cgroup_root=str(tmp_path))
    scans = []
    real = c._scan
    monkeypatch.setattr(c, "_scan", lambda: scans.append(1) or real())
    for i in range(5):
        c.collect(float(i))
    assert len(scans) == 1  # then once per EMPTY_RESCAN_S (5 s), not once per tick
    c._last_scan -= 5.0
    c.collect(6.0)
    assert len(scans) == 2


def test_streamed_history_is_cut_off_past_its_deadline(tmp_path):
    from fragscope.agent.api import cut_off_after

    st = _store(tmp_path, n=20)
    scan = st.scan(None, T0, T0 + 400)
    pieces = iter_scan_json(scan, T0, T0 + 400, "src")
    assert b"".join(cut_off_after(pieces, 60.0)).startswith(b'{"start"')
    late = cut_off_after(iter_scan_json(st.scan(None, T0, T0 + 400), T0, T0 + 400, "src"), -1.0)
    with pytest.raises(TimeoutError):
        next(late)
    assert scan._c is None  # exhausted: its snapshot and connection are released
