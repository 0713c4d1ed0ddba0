"""Detectors over generated incidents: each diagnosis found, confounders quiet, evidence honest.

The scenarios come from fragscope.scenarios (mechanism-faithful, seeded); thresholds come from the
mechanisms and the issues' reference figures (docs/diagnoses.md), not from these cases.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from fragscope.pipeline import diagnose
from fragscope.playbooks import REGISTRY
from fragscope.detectors.block_size import expected_waste, recommend_block_size
from fragscope.detectors.frame import build_frame, counter_increases, histogram_quantile
from fragscope.model import SeriesKey, Severity, Window
from fragscope.scenarios import Scenario, to_window

PATHOLOGIES = list(REGISTRY.ids("window"))
CONFOUNDERS = ["healthy", "traffic-surge", "traffic-drop", "stable-slack"]


def ids(report) -> set[str]:
    return {f.id for f in report.findings}


def run(**kw):
    w, truth = to_window(Scenario(**kw))
    return diagnose(w), truth


@pytest.mark.parametrize("kind", PATHOLOGIES)
@pytest.mark.parametrize("variant", [
    {},
    {"engine": "v0"},
    {"gpu_source": "dcgm", "seed": 1},
    {"gpus": 2, "seed": 2},
    {"noise": 2.0, "seed": 3},
    {"ramp": "step", "step_s": 30, "seed": 4},
])
def test_each_diagnosis_found_alone(kind, variant):
    report, truth = run(kind=kind, **variant)
    assert ids(report) == truth.diagnoses, [f.summary for f in report.findings]
    f = next(f for f in report.findings if f.id == kind)
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert 0.3 <= f.confidence <= 0.95
    assert f.summary and any(ch.isdigit() for ch in f.summary)
    assert f.evidence and all(e.signal for e in f.evidence)
    assert f.playbook and f.playbook["durable"] and f.playbook["verify"]
    assert any(a.contraindications for a in _actions(f.playbook)) or kind in (
        "capacity-saturation", "memory-leak", "launch-bound")


def _actions(pb):
    from fragscope.playbooks import Action

    return [Action(**a) for a in pb["durable"]]


@pytest.mark.parametrize("kind", CONFOUNDERS + ["leak-with-traffic", "throttling-with-load"])
@pytest.mark.parametrize("variant", [{}, {"engine": "v0", "gpu_source": "dcgm"}, {"noise": 2.0, "seed": 5},
                                     {"gpus": 4, "seed": 6}])
def test_confounders_stay_quiet(kind, variant):
    report, truth = run(kind=kind, **variant)
    got = ids(report)
    if kind == "traffic-surge":
        # a surge that outgrows the server builds a queue (seen with some seeds): that is plain
        # capacity-saturation, never a pathology
        got -= {"capacity-saturation"}
    assert got == truth.diagnoses, [f.summary for f in report.findings]


def test_fragmentation_reference_case_numbers():
    """The seed's case: 1,200 → 300 tok/s, 5 % → 35 %, util 85–90 %: critical, with the numbers."""
    report, truth = run(kind="allocator-fragmentation")
    f = report.findings[0]
    assert f.id == "allocator-fragmentation" and f.severity is Severity.CRITICAL
    ev = {e.signal: e for e in f.evidence}
    assert ev["torch_fragmentation_ratio"].observed > 0.25
    assert ev["torch_fragmentation_ratio"].baseline < 0.08
    tp = ev["generation_tokens_per_second"]
    assert tp.observed < 0.5 * tp.baseline
    assert ev["torch_alloc_retries_per_minute"].agrees
    assert ev["gpu_utilization_ratio"].observed >= 0.8
    # onset within 30 min of the truth
    assert abs(f.onset - truth.onset_ts) < 1800
    # the computed action uses the engine's gpu_memory_utilization (0.90 -> lower)
    assert any("--gpu-memory-utilization 0.8" in a for a in f.playbook["actions"])


def test_fragmentation_flagged_early():
    """On-call wants a warning within ~15 minutes of onset, before throughput has halved."""
    w, truth = to_window(Scenario(kind="allocator-fragmentation"))
    early = w.between(w.start, truth.onset_ts + 15 * 60)
    report = diagnose(early)
    f = [f for f in report.findings if f.id == "allocator-fragmentation"]
    assert f and f[0].severity.rank >= Severity.WARNING.rank
    tp = {e.signal: e for e in f[0].evidence}.get("generation_tokens_per_second")
    assert tp is None or tp.observed > 0.5 * tp.baseline  # throughput has not halved yet
    # and nothing fires in the healthy hours before the onset
    assert not diagnose(w.between(w.start, truth.onset_ts - 60)).findings


def test_without_probe_fragmentation_is_suspected_not_confirmed():
    report, _ = run(kind="allocator-fragmentation", torch_probe=False)
    f = [f for f in report.findings if f.id == "allocator-fragmentation"]
    assert f and f[0].confidence <= 0.45
    assert "fragscope_torch_reserved_bytes" in f[0].missing
    # on a healthy server without the probe: inconclusive, never "healthy"
    report, _ = run(kind="healthy", torch_probe=False)
    assert not report.findings
    inc = {i.id: i for i in report.inconclusive}
    assert "allocator-fragmentation" in inc and inc["allocator-fragmentation"].missing


def test_kv_pressure_evidence_and_ttft_tail():
    report, _ = run(kind="kv-cache-pressure")
    f = report.findings[0]
    ev = {e.signal: e for e in f.evidence}
    assert ev["kv_cache_usage_ratio"].observed >= 0.9
    assert ev["preemptions_per_minute"].observed >= 1
    assert f.severity is not Severity.INFO


def test_capacity_saturation_never_critical():
    for seed in range(3):
        report, _ = run(kind="capacity-saturation", severity=2.0, seed=seed)
        for f in report.findings:
            if f.id == "capacity-saturation":
                assert f.severity is not Severity.CRITICAL


def test_block_size_formula_and_seed():
    assert expected_waste(64, 32) == pytest.approx(63 / 127)  # seed 001: about half
    assert recommend_block_size(32) == 16
    assert recommend_block_size(2000) == 32  # vLLM supports block sizes up to 32 on CUDA
    report, _ = run(kind="kv-block-size-mismatch")
    f = report.findings[0]
    assert f.id == "kv-block-size-mismatch"
    assert f.playbook["actions"] and "--block-size 16" in f.playbook["actions"][0]


def test_restart_ends_an_incident():
    """A fragmentation that a restart cleared is reported as ended, one severity lower."""
    w, truth = to_window(Scenario(kind="allocator-fragmentation", restart_at_s=6.5 * 3600))
    report = diagnose(w)
    f = [f for f in report.findings if f.id == "allocator-fragmentation"]
    assert f and f[0].subject.get("segment") == "before-restart"
    assert f[0].severity is Severity.WARNING
    assert any("restart" in n for n in report.signals["notes"])


def test_missing_everything_is_inconclusive_not_healthy():
    w, _ = to_window(Scenario(kind="healthy", drop=("vllm:", "fragscope_", "DCGM_")))
    report = diagnose(w)
    assert not report.findings
    assert {i.id for i in report.inconclusive} >= {"allocator-fragmentation", "kv-cache-pressure", "memory-leak",
                                                    "clock-throttling", "launch-bound"}


def test_short_window_judges_the_present_and_names_what_needs_history():
    # a 2-minute run: the onset comes 40 s in and ramps to 30 % unusable with ~36 retries/min by the end;
    # the present state alone shows it, a leak needs a trend
    w, _ = to_window(Scenario(kind="allocator-fragmentation", duration_s=120, step_s=15))
    report = diagnose(w)
    assert [(f.id, f.basis) for f in report.findings] == [("allocator-fragmentation", "level")]
    inc = {i.id: i.reason for i in report.inconclusive}
    assert "30 min" in inc["memory-leak"]
    assert any("no baseline" in n for n in report.signals["notes"])


# --- frame unit tests ------------------------------------------------------------------------
def test_counter_resets_are_increases():
    v = np.array([0, 5, 10, 2, 4, 4, 9], dtype=float)
    cum, reset = counter_increases(v)
    assert cum[-1] == 10 + 2 + 2 + 0 + 5
    assert reset.tolist() == [False, False, False, True, False, False, False]


def test_histogram_quantile_matches_prometheus_interpolation():
    les = np.array([0.1, 0.5, 1.0, math.inf])
    counts = np.array([[10.0], [60.0], [90.0], [100.0]])
    # rank 50 falls in (0.1, 0.5]: 0.1 + 0.4 * (50 - 10) / 50
    assert histogram_quantile(0.5, les, counts)[0] == pytest.approx(0.1 + 0.4 * 40 / 50)
    # rank 99 falls in the +Inf bucket: Prometheus returns the highest finite bound
    assert histogram_quantile(0.99, les, counts)[0] == pytest.approx(1.0)


def test_frame_units_and_aliases():
    t = 1.7e9 + np.arange(0, 3600, 15.0)
    cols = {
        SeriesKey("DCGM_FI_DEV_SM_CLOCK", (("UUID", "GPU-a"), ("gpu", "0"))): (t, np.full(t.size, 1980.0)),
        SeriesKey("DCGM_FI_DEV_GPU_UTIL", (("UUID", "GPU-a"), ("gpu", "0"))): (t, np.full(t.size, 87.0)),
        SeriesKey("DCGM_FI_DEV_FB_USED", (("gpu", "0"),)): (t, np.full(t.size, 70000.0)),
        SeriesKey("DCGM_FI_DEV_FB_FREE", (("gpu", "0"),)): (t, np.full(t.size, 11000.0)),
        SeriesKey("vllm:gpu_cache_usage_perc", (("model_name", "m"),)): (t, np.full(t.size, 0.5)),
        SeriesKey("vllm:generation_tokens_total", (("model_name", "m"),)): (t, 100.0 * (t - t[0])),
    }
    f = build_frame(Window.from_columns(cols))
    g = f.gpu["0"]
    assert np.nanmedian(g["gpu_sm_clock_hertz"]) == pytest.approx(1.98e9)
    assert np.nanmedian(g["gpu_utilization_ratio"]) == pytest.approx(0.87)
    assert np.nanmedian(g["gpu_memory_total_bytes"]) == pytest.approx(81000 * 1024**2)
    assert np.nanmedian(f.engine["kv_cache_usage_ratio"]) == pytest.approx(0.5)
    assert np.nanmedian(f.engine["generation_tokens_total"]) == pytest.approx(100.0)
    assert f.engine_generation == "v0"
    assert f.sources["kv_cache_usage_ratio"] == "vllm:gpu_cache_usage_perc"


def test_gaps_in_a_source_are_not_zero():
    t = 1.7e9 + np.arange(0, 3600, 15.0)
    keep = (t < t[0] + 1200) | (t > t[0] + 2400)  # the exporter was down for 20 minutes
    cols = {SeriesKey("fragscope_gpu_utilization_ratio", (("gpu", "0"),)): (t[keep], np.full(keep.sum(), 0.9))}
    f = build_frame(Window.from_columns(cols))
    u = f.gpu["0"]["gpu_utilization_ratio"]
    assert np.isnan(u).sum() > 60 and np.nanmin(u) == pytest.approx(0.9)


def test_dcgm_clocks_event_bitmask_names_the_reason():
    """dcgm-exporter's DCGM_FI_DEV_CLOCKS_EVENT_REASONS carries NVML's reason bits."""
    from fragscope.model import Series

    w, _ = to_window(Scenario(kind="clock-throttling", gpu_source="dcgm", daily_wave=False))
    clk = w.select("DCGM_FI_DEV_SM_CLOCK")[0]
    mask = np.where(clk.values < 1900, 0x40 | 0x8, 0x0).astype(float)  # hw_thermal + hw_slowdown
    key = SeriesKey("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", clk.key.labels)
    w.series[key] = Series(key, clk.ts, mask, "gauge")
    f = [f for f in diagnose(w).findings if f.id == "clock-throttling"][0]
    assert "hw_thermal_slowdown" in f.summary and not f.missing
    ev = {e.signal: e for e in f.evidence}
    assert ev["gpu_throttle_reason_active{reason=hw_thermal_slowdown}"].agrees
