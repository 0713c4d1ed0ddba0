"""A warm agent is not slower than a cold one: a preemption storm that begins after a calm stretch is judged
on the latest samples alone (kv_pressure.latest_storm), so the verdict comes at the first window that shows
it, whatever history precedes it. Figures are computed by hand in the comments (numpy's linear quantile).

The series: 5 s steps (the agent's ring), calm at KV 25 %, 4 running, nothing waiting, the preemption
counter flat at 100; from T + 5 s a storm: KV 95 %, 90 %, 70 %, 92 % ... , +40 preemptions a step (480/min),
32 running, 30 waiting.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fragscope.agent.ring import Ring
from fragscope.detectors import kv_pressure
from fragscope.detectors.frame import build_frame
from fragscope.model import Sample, Window, make_labels
from fragscope.pipeline import diagnose, judge_present

T = 1_767_225_600.0  # the last calm sample; the storm's first sample is T + 5
STEP = 5.0
LAB = make_labels({"model_name": "m", "engine": "0"})
STORM_KV = (0.95, 0.90, 0.70, 0.92, 0.88, 0.97)


def samples(calm_s: float, storm_steps: int, storm_kv=STORM_KV, per_step: float = 40.0,
            waiting: float = 30.0) -> list[Sample]:
    out = []
    pre = 100.0
    n_calm = int(calm_s / STEP)
    for i in range(-n_calm, storm_steps + 1):
        t = T + i * STEP
        storm = i >= 1
        if storm:
            pre += per_step
        kv = storm_kv[(i - 1) % len(storm_kv)] if storm else 0.25
        for name, v in (("vllm:kv_cache_usage_perc", kv), ("vllm:num_preemptions_total", pre),
                        ("vllm:num_requests_waiting", waiting if storm else 0.0),
                        ("vllm:num_requests_running", 32.0 if storm else 4.0)):
            out.append(Sample(name, LAB, t, v))
    return out


def window(calm_s: float, storm_steps: int, **kw) -> Window:
    r = Ring(3 * 3600.0, STEP)
    r.add(samples(calm_s, storm_steps, **kw))
    return r.window_at(T + storm_steps * STEP, source="test")


def kv_finding(rep):
    return next((f for f in rep.findings if f.id == "kv-cache-pressure"), None)


@pytest.mark.parametrize("calm_s", [10.0, 360.0, 3600.0])  # cold (agent started 10 s before), 6 min, 1 h
def test_storm_verdict_at_the_first_window_that_shows_it(calm_s):
    # 1 storm step: the latest 15 s hold T-10, T-5, T, T+5: KV sorted [.25 .25 .25 .95], p90 at position 2.7:
    # .25 + .7 x .70 = 0.74 < 0.80; not yet a storm by the pool, whatever the history
    f1 = kv_finding(diagnose(window(calm_s, 1)))
    assert f1 is None or f1.severity.rank < 1, f1.summary
    # 2 storm steps: T-5 .. T+10: KV sorted [.25 .25 .90 .95], p90 = .90 + .7 x .05 = 0.935 >= 0.80;
    # preemptions 100 -> 180 over 15 s = 320/min >= 60; waiting median of [0 0 30 30] = 15 >= 1: critical
    rep = diagnose(window(calm_s, 2))
    f = kv_finding(rep)
    assert f is not None and f.severity.value == "critical", [(x.id, x.summary) for x in rep.findings]
    assert f.basis == "level"
    ev = {e.signal: e for e in f.evidence}
    # the latest samples on their own, cold or warm
    assert ev["kv_cache_usage_ratio"].observed == pytest.approx(0.935)
    assert ev["preemptions_per_minute"].observed == pytest.approx(320.0)
    assert ev["requests_waiting"].observed == pytest.approx(15.0)
    assert "in the last 15 s" in f.summary and "320 preemptions/min" in f.summary
    if calm_s == 10.0:
        # cold: the window is 20 s long and its minute is all of it (T-10 .. T+10): KV sorted
        # [.25 .25 .25 .90 .95], p90 at 3.6: .90 + .6 x .05 = 0.93; 100 -> 180 over 20 s = 240/min; waiting
        # median of [0 0 0 30 30] = 0: a warning, which the latest 15 s (30 waiting in two of four) raise
        m = kv_pressure.present_level(build_frame(window(calm_s, 2)))
        assert m[0].severity.value == "warning"
        mev = {e.signal: e for e in m[0].evidence}
        assert mev["kv_cache_usage_ratio"].observed == pytest.approx(0.93)
        assert mev["preemptions_per_minute"].observed == pytest.approx(240.0)


def test_the_minute_alone_lags_after_calm():
    """What the latest evidence fixes: after 6 calm minutes, the minute's own rule (13 samples, T-50 .. T+10)
    reads KV p90 at position 10.8 of [.25 x 11, .90, .95]: .25 + .8 x .65 = 0.77 < 0.80, so it shows no
    storm two steps in (it says the pool filled between samples: 80 preemptions in the minute)."""
    fr = build_frame(window(360.0, 2))
    res = kv_pressure.present_level(fr)
    assert not isinstance(res, list) or not res
    assert "preemptions/min" in res.reason and "77 %" in res.reason
    assert kv_pressure.latest_storm(fr) is not None


def test_watch_pass_sees_it_on_its_two_minutes():
    """The agent's watch pass judges the last 2 minutes of the ring (agent/loops.py WATCH_SPAN_S): the same
    verdict at the same step."""
    from fragscope.agent.loops import WATCH_SPAN_S

    r = Ring(3 * 3600.0, STEP)
    r.add(samples(360.0, 2))
    w = r.window_at(T + 2 * STEP, source="watch", span=WATCH_SPAN_S)
    found = {(f.id, f.severity.value) for f in judge_present(w)}
    assert ("kv-cache-pressure", "critical") in found


@pytest.mark.parametrize("kw, why", [
    ({"per_step": 4.0}, "48 preemptions/min: below the storm rate (60/min), left to the minute's rule"),
    ({"storm_kv": (0.5, 0.6, 0.55)}, "KV p90 below 80 %: preempting with a pool that is not at the edge"),
])
def test_latest_samples_alone_need_a_storm(kw, why):
    """Weaker latest evidence does not stand alone: the minute's rule (with the calm in it) decides."""
    fr = build_frame(window(360.0, 2, **kw))
    assert kv_pressure.latest_storm(fr) is None, why
    lvl = kv_pressure.level(fr)
    assert not (isinstance(lvl, list) and lvl and "in the last 15 s" in lvl[0].summary)


def test_same_samples_no_second_opinion():
    """Scraped every 20 s, the latest three samples are most of the minute's four: judged once, on the minute."""
    from fragscope.detectors import level as lv

    r = Ring(3 * 3600.0, 20.0)
    r.add([s for s in samples(360.0, 2) if math.isclose((s.ts - T) % 20.0, 0.0)])
    fr = build_frame(r.window_at(T + 10.0, source="test"))
    assert fr.step == 20.0 and not lv.latest_is_shorter(fr)
    assert lv.latest_is_shorter(build_frame(window(360.0, 2)))


# --- the agent: the last 20 s judged on their own, every scrape as it came ----------------------------------
def scrapes_1s(calm_s: float, storm_s: int) -> list[Sample]:
    """1 s scrapes (the agent's default interval): calm, then from T + 1 a storm of 8 preemptions a second
    with the KV values of STORM_KV in turn, 30 waiting."""
    out = []
    pre = 100.0
    for i in range(-int(calm_s), storm_s + 1):
        t = T + i
        storm = i >= 1
        if storm:
            pre += 8.0
        kv = (0.95, 0.90, 0.70, 0.92)[(i - 1) % 4] if storm else 0.25
        for name, v in (("vllm:kv_cache_usage_perc", kv), ("vllm:num_preemptions_total", pre),
                        ("vllm:num_requests_waiting", 30.0 if storm else 0.0),
                        ("vllm:num_requests_running", 32.0 if storm else 4.0)):
            out.append(Sample(name, LAB, float(t), v))
    return out


def test_ring_keeps_every_scrape_of_the_last_seconds():
    from fragscope.agent.ring import RECENT_S

    r = Ring(3 * 3600.0, STEP)
    r.add(scrapes_1s(120.0, 0))
    steps = r.window_at(T, source="t")
    raw = r.recent_window(T, source="t", span=20.0)
    k = next(k for k in raw.series if k.name == "vllm:kv_cache_usage_perc")
    assert list(raw.series[k].ts) == [T - i for i in range(20, -1, -1)]  # 21 scrapes, 1 s apart
    assert len(steps.series[k]) == 25  # one a 5 s step over 2 minutes
    assert r.recent_window(T, source="t", span=3600.0).series[k].ts[0] >= T - RECENT_S  # no more than RECENT_S


def test_agent_names_a_storm_from_the_last_scrapes_after_calm():
    """6 calm minutes, then a storm from T + 1. At T + 4 the ring's 5 s steps hold one storm scrape (T + 4:
    step [T, T + 5)); the full window shows nothing. The last 20 s, every scrape (T - 16 .. T + 4: 17 calm,
    4 storm): KV sorted [.25 x 17, .70, .90, .92, .95], p90 at position 18: 0.90 >= 0.80; preemptions
    100 -> 132 over 20 s = 96/min; waiting median 0 (4 of 21 scrapes): a warning, added with its playbook.
    At T + 2 (2 storm scrapes, p90 .25 + .5 x .65 = 0.575 over the last 15 s), nothing."""
    from fragscope.agent.loops import add_recent_findings, judge_recent
    from fragscope.model import Report

    r = Ring(3 * 3600.0, STEP)
    r.add([s for s in scrapes_1s(360.0, 4) if s.ts <= T + 2])
    assert judge_recent(r, T + 2) == []
    r.add([s for s in scrapes_1s(360.0, 4) if s.ts > T + 2])
    full = diagnose(r.window_at(T + 4, source="t"))
    assert kv_finding(full) is None or kv_finding(full).severity.rank < 1
    rep = Report(window=full.window, source="t", findings=list(full.findings))
    add_recent_findings(rep, r, T + 4)
    f = kv_finding(rep)
    assert f is not None and f.severity.value == "warning" and f.basis == "level"
    ev = {e.signal: e for e in f.evidence}
    assert ev["kv_cache_usage_ratio"].observed == pytest.approx(0.90)
    assert ev["preemptions_per_minute"].observed == pytest.approx(96.0)
    assert f.playbook and f.playbook.get("actions")
    # what the full window reports stands: the recent window adds nothing it already has at that severity
    again = Report(window=rep.window, source="t", findings=list(rep.findings))
    add_recent_findings(again, r, T + 4)
    assert [x.id for x in again.findings] == [x.id for x in rep.findings]
