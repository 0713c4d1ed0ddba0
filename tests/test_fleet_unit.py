"""Fleet logic without a server: grouping rules, outliers, counters, selectors, times, batching."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fragscope.collectors.prometheus import (MAX_POINTS_PER_SERIES, decode_matrix, fetch, parse_duration,
                                             parse_matrix, parse_selector, parse_time, range_pieces,
                                             signal_batches)
from fragscope.fleet import (FleetTarget, TargetId, counter_increase, find_outliers, fragmentation,
                             group_targets, robust_z, throughput)
from fragscope.model import SeriesKey, Window, make_labels
from fragscope.signals import SIGNALS


def _k(name: str, **labels) -> SeriesKey:
    return SeriesKey(name, make_labels(labels))


COL = (np.array([0.0, 15.0]), np.array([1.0, 2.0]))


def test_grouping_rules():
    cols = {
        _k("vllm:num_requests_running", namespace="llm", pod="a", instance="10.0.0.1:8000"): COL,
        # dcgm-exporter scraped without honor_labels: the workload is exported_pod
        _k("DCGM_FI_DEV_SM_CLOCK", namespace="gpu-operator", pod="dcgm-exporter-x", exported_namespace="llm",
           exported_pod="a", gpu="0"): COL,
        # old dcgm-exporter label names
        _k("DCGM_FI_DEV_GPU_TEMP", pod_name="b", pod_namespace="llm", gpu="0"): COL,
        # no pod labels: one engine per host -> the host's GPU series join it
        _k("vllm:num_requests_running", instance="node1:8000"): COL,
        _k("DCGM_FI_DEV_GPU_TEMP", instance="node1:9400", gpu="0"): COL,
        # two engines on one host -> each instance is its own target
        _k("vllm:num_requests_running", instance="node2:8000"): COL,
        _k("vllm:num_requests_running", instance="node2:8001"): COL,
        _k("DCGM_FI_DEV_GPU_TEMP", instance="node2:9400", gpu="0"): COL,
        # nothing at all (a backfilled recording)
        _k("vllm:num_requests_waiting"): COL,
    }
    g = group_targets(cols)
    names = {str(t): sorted(k.name for k in v) for t, v in g.items()}
    assert names == {
        "llm/a": ["DCGM_FI_DEV_SM_CLOCK", "vllm:num_requests_running"],
        "llm/b": ["DCGM_FI_DEV_GPU_TEMP"],
        "node1": ["DCGM_FI_DEV_GPU_TEMP", "vllm:num_requests_running"],
        "node2:8000": ["vllm:num_requests_running"],
        "node2:8001": ["vllm:num_requests_running"],
        "node2:9400": ["DCGM_FI_DEV_GPU_TEMP"],
        "(unlabelled)": ["vllm:num_requests_waiting"],
    }
    # labels are kept as they are
    a = g[TargetId("pod", "llm", "a")]
    assert any(k.label("exported_pod") == "a" for k in a)


def test_counter_increase_handles_resets():
    ts = np.arange(6.0)
    assert counter_increase(ts, np.array([10, 12, 15, 3, 5, 9.0])) == 2 + 3 + 3 + 2 + 4
    assert counter_increase(ts[:1], np.array([5.0])) == 0.0


def _window(cols) -> Window:
    return Window.from_columns(cols)


def test_throughput_and_fragmentation_recent_window():
    t = np.arange(0, 3600 + 1, 15.0)
    gen = np.cumsum(np.where(t < 1800, 1000 * 15, 300 * 15)).astype(float)
    gen[t >= 3000] -= gen[t >= 3000][0]  # a restart at 3000 s: counter resets
    w = _window({
        _k("vllm:generation_tokens_total", model_name="m"): (t, gen),
        _k("fragscope_torch_reserved_bytes", gpu="0", pid="1"): (t, np.full(t.size, 100.0)),
        _k("fragscope_torch_allocated_bytes", gpu="0", pid="1"): (t, np.where(t < 1800, 95.0, 65.0)),
        _k("fragscope_torch_reserved_bytes", gpu="1", pid="2"): (t, np.full(t.size, 100.0)),
        _k("fragscope_torch_allocated_bytes", gpu="1", pid="2"): (t, np.full(t.size, 95.0)),
    })
    assert throughput(w) == pytest.approx(300, rel=0.02)
    assert fragmentation(w) == pytest.approx(0.35)
    assert throughput(_window({_k("vllm:num_requests_running"): (t, t)})) is None
    ratio_only = _window({_k("fragscope_torch_fragmentation_ratio", gpu="0"): (t, np.full(t.size, 0.2))})
    assert fragmentation(ratio_only) == pytest.approx(0.2)


def _target(name: str, model: str | None, tput: float | None, frag: float | None) -> FleetTarget:
    return FleetTarget(TargetId("pod", "llm", name), Window({}, 0, 1), model=model, throughput=tput,
                       fragmentation=frag)


def test_outliers_robust_z():
    peers = [_target(f"p{i}", "m", 1200 + d, 0.05 + f) for i, (d, f) in
             enumerate([(0, 0), (20, 0.004), (-15, -0.003), (35, 0.002), (-30, 0.001)])]
    sick = _target("sick", "m", 300, 0.35)
    other_model = [_target(f"q{i}", "other", 50, 0.5) for i in range(2)]  # too few peers to judge
    out = find_outliers(peers + [sick] + other_model)
    got = {(o.target, o.metric, o.direction) for o in out}
    assert got == {("llm/sick", "throughput_tokens_per_second", "low"), ("llm/sick", "fragmentation_ratio", "high")}
    o = next(o for o in out if o.metric == "fragmentation_ratio")
    assert o.peers == 6 and o.robust_z > 3.5 and o.peer_median == pytest.approx(0.0515, abs=1e-3)
    # identical peers: no MAD, no mean deviation -> nobody is an outlier
    assert find_outliers([_target(f"p{i}", "m", 1000, 0.05) for i in range(4)]) == []
    # a small relative difference is not an outlier even with a tiny spread
    tight = [_target(f"p{i}", "m", 1000 + 0.1 * i, None) for i in range(5)] + [_target("x", "m", 1050, None)]
    assert find_outliers(tight) == []


def test_robust_z_falls_back_to_mean_absolute_deviation():
    z = robust_z(np.array([1.0, 1.0, 1.0, 1.0, 5.0]))
    assert z is not None and z[-1] > 3.5 and abs(z[0]) < 1e-12
    assert robust_z(np.array([2.0, 2.0, 2.0])) is None


@pytest.mark.parametrize("text, want", [
    ('{namespace="llm",pod=~"vllm-.*"}', [("namespace", "=", "llm"), ("pod", "=~", "vllm-.*")]),
    ('namespace!="kube-system"', [("namespace", "!=", "kube-system")]),
    ('{ a = "x\\"y" , b!~"z" }', [("a", "=", 'x\\"y'), ("b", "!~", "z")]),
    ("", []),
])
def test_parse_selector(text, want):
    assert parse_selector(text) == want


@pytest.mark.parametrize("text", ['up{job="x"}', '{pod="a" job="b"}', '{pod=a}', '{__name__="up"}', "{pod="])
def test_parse_selector_rejects(text):
    with pytest.raises(ValueError):
        parse_selector(text)


def test_durations_and_times():
    assert parse_duration("6h") == 21600 and parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    assert parse_duration("1d") == 86400 and parse_duration("500ms") == 0.5
    for bad in ("", "6x", "-5m", "0", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_time("2026-01-01T00:00:00Z") == 1767225600
    assert parse_time("2026-01-01T01:00:00+01:00") == 1767225600
    assert parse_time("1767225600") == 1767225600 and parse_time("1767225600000") == 1767225600
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_range_pieces_respect_the_point_limit():
    pieces = range_pieces(0, 30000, 1)
    assert all(round((e - s) / 1) + 1 <= MAX_POINTS_PER_SERIES for s, e in pieces)
    steps = sum(round(e - s) + 1 for s, e in pieces)
    assert steps == 30001 and pieces[0][0] == 0 and pieces[-1][1] == 30000
    assert range_pieces(0, 10, 15) == [(0, 10)]


def test_batches_cover_every_raw_signal_name():
    from fragscope.signals import DERIVED

    names = {n for b in signal_batches() for n in b.names}
    derived = {d.metric: d.family for d in DERIVED}
    for sig in SIGNALS.values():
        for src in sig.sources:
            if src.metric in derived:  # made at ingest: Prometheus has the engine's family, not the name
                assert derived[src.metric] in names and src.metric not in names, src.metric
            elif sig.kind == "histogram":
                assert {src.metric + s for s in ("_bucket", "_sum", "_count")} <= names
            else:
                assert src.metric in names, src.metric
    # ray_vllm: re-exports are matched and normalised
    engine = next(b for b in signal_batches() if "vllm:num_requests_running" in b.names)
    assert "(?:ray_)?vllm:num_requests_running" in engine.regex()


def test_parse_matrix_drops_what_is_not_a_value():
    res = [{"metric": {"__name__": "ray_vllm:num_requests_running", "pod": "a"},
            "values": [[1, "3"], [2, "NaN"], [3, "4"]]},
           {"metric": {"__name__": "DCGM_FI_DEV_MEMORY_TEMP"}, "values": [[1, "9223372036854775794"]]}]
    cols = parse_matrix(res)
    assert list(map(str, cols)) == ['vllm:num_requests_running{pod="a"}']


def test_decode_matrix_matches_json():
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "x", "l": 'a"]]}'}, "values": [[1767225600.5, "1.5"], [1767225615, "2e-05"]]},
        {"metric": {"__name__": "y"}, "values": [[1, "7"]]}]}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    fast = decode_matrix(raw)
    slow = parse_matrix(body["data"]["result"])
    got = parse_matrix(fast["result"])
    assert set(got) == set(slow)
    for k in slow:
        assert np.array_equal(np.concatenate(got[k][0]), np.concatenate(slow[k][0]))
        assert np.array_equal(np.concatenate(got[k][1]), np.concatenate(slow[k][1]))
    assert decode_matrix(raw.replace(b'"values"', b'"valuez"')) is None  # unknown layout: json fallback


def test_fetch_rejects_an_empty_window():
    from fragscope.collectors.prometheus import PrometheusError

    with pytest.raises(PrometheusError):
        fetch(None, 10.0, 10.0)
