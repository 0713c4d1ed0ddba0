"""The scenario generator: determinism, each kind's mechanism and truth, file formats, promtool."""
from __future__ import annotations

import gzip
import io
import shutil
import subprocess

import numpy as np
import pytest

from fragscope.collectors.exposition import read_recording
from fragscope.scenarios import KINDS, Scenario, generate, to_window, write_openmetrics, write_prometheus_text

H = 3600.0
SHORT = dict(duration_s=4 * H, step_s=60)  # fast; mechanisms still play out


def series(w, name, **match):
    found = w.select(name, **match)
    assert found, f"{name} {match} missing"
    return found[0]


def rate_per_s(s, t0, t1):
    c = s.between(t0, t1)
    return (c.values[-1] - c.values[0]) / (c.ts[-1] - c.ts[0])


def mean(s, t0, t1):
    return float(np.mean(s.between(t0, t1).values))


def hist_quantile(w, name, q, t0, t1):
    """Bucket upper bound holding quantile q of the observations made in [t0, t1]."""
    buckets = []
    for k, s in w.series.items():
        if k.name == name + "_bucket":
            le = k.label("le")
            c = s.between(t0, t1)
            buckets.append((float("inf") if le == "+Inf" else float(le), c.values[-1] - c.values[0]))
    buckets.sort()
    les = np.array([b[0] for b in buckets])
    d = np.array([b[1] for b in buckets])
    return float(les[np.searchsorted(d, q * d[-1])])


def early_late(w):
    return (w.start, w.start + 1800), (w.end - 1800, w.end)


# --- determinism -----------------------------------------------------------------------------
def test_same_seed_same_columns_and_other_seed_differs():
    a, ta, _ = generate(Scenario("allocator-fragmentation", seed=5, **SHORT))
    b, tb, _ = generate(Scenario("allocator-fragmentation", seed=5, **SHORT))
    c, _, _ = generate(Scenario("allocator-fragmentation", seed=6, **SHORT))
    assert a.keys() == b.keys() and ta == tb
    assert all(np.array_equal(a[k][1], b[k][1]) and np.array_equal(a[k][0], b[k][0]) for k in a)
    running = [k for k in a if k.name == "vllm:num_requests_running"][0]
    assert not np.array_equal(a[running][1], c[running][1])


def test_noise_zero_is_smooth_and_noise_scales():
    w0, _ = to_window(Scenario("healthy", noise=0, daily_wave=False, **SHORT))
    w2, _ = to_window(Scenario("healthy", noise=2, daily_wave=False, **SHORT))
    u0 = series(w0, "fragscope_gpu_utilization_ratio").values
    u2 = series(w2, "fragscope_gpu_utilization_ratio").values
    assert np.std(u0[10:]) < 0.005 < np.std(u2[10:])


# --- each kind: mechanism and truth ------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_generates_all_signal_families(kind):
    w, truth = to_window(Scenario(kind, **SHORT))
    names = w.names()
    for n in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
              "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
              "vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_count", "vllm:cache_config_info",
              "fragscope_gpu_memory_used_bytes", "fragscope_gpu_utilization_ratio", "fragscope_gpu_sm_clock_hertz",
              "fragscope_gpu_throttle_reason_active", "fragscope_torch_allocated_bytes",
              "fragscope_torch_reserved_bytes", "fragscope_torch_inactive_split_bytes",
              "fragscope_torch_alloc_retries_total", "fragscope_torch_ooms_total", "fragscope_kernel_gap_seconds",
              "fragscope_gpu_idle_ratio"):
        assert n in names, n
    for s in w:
        if s.type == "counter" or s.name.endswith(("_bucket", "_count", "_sum")):
            assert np.all(np.diff(s.values) >= 0), f"{s.key} not monotonic"
    assert truth.notes


def test_fragmentation_reference_case():
    w, truth = to_window(Scenario("allocator-fragmentation", daily_wave=False))
    assert truth.diagnoses == {"allocator-fragmentation"}
    on = truth.onset_ts
    assert on == w.start + 8 * H / 3
    (b0, b1), (e0, e1) = (w.start, on), (w.end - 1800, w.end)
    gen = series(w, "vllm:generation_tokens_total")
    assert 1100 < rate_per_s(gen, b0, b1) < 1300 and 250 < rate_per_s(gen, e0, e1) < 400
    run = series(w, "vllm:num_requests_running")
    assert 115 < mean(run, b0, b1) < 140 and mean(run, e0, e1) < 45
    res, alloc = series(w, "fragscope_torch_reserved_bytes"), series(w, "fragscope_torch_allocated_bytes")
    frag = 1 - alloc.values / res.values
    assert frag[: 100].mean() < 0.07 and frag[-60:].mean() > 0.3
    inact = series(w, "fragscope_torch_inactive_split_bytes")
    assert inact.values[-1] > 10 * inact.values[0]
    assert rate_per_s(series(w, "fragscope_torch_alloc_retries_total"), b0, b1) == 0
    assert rate_per_s(series(w, "fragscope_torch_alloc_retries_total"), e0, e1) * 60 > 20
    assert rate_per_s(series(w, "vllm:num_preemptions_total"), e0, e1) * 60 > 100
    assert rate_per_s(series(w, "vllm:num_preemptions_total"), b0, b1) == 0
    util = series(w, "fragscope_gpu_utilization_ratio")
    assert 0.8 < mean(util, b0, b1) < 0.93 and 0.8 < mean(util, e0, e1) < 0.95
    assert mean(series(w, "vllm:num_requests_waiting"), e0, e1) > 50
    gap99 = series(w, "fragscope_kernel_gap_seconds", quantile="0.99")
    assert gap99.values[0] < 100e-6 and gap99.values[-1] > 1e-3
    used = series(w, "fragscope_gpu_memory_used_bytes").values
    assert used.max() - used.min() < 0.01 * used.mean()  # NVML flat: fragmentation is invisible there
    # early: 15 minutes after onset the allocator already shows it while throughput has not halved
    r15 = rate_per_s(series(w, "fragscope_torch_alloc_retries_total"), on, on + 900)
    assert r15 > 0 and rate_per_s(gen, on, on + 900) > 0.8 * rate_per_s(gen, b0, b1)


def test_kv_cache_pressure():
    w, truth = to_window(Scenario("kv-cache-pressure", **SHORT))
    assert truth.diagnoses == {"kv-cache-pressure", "kv-pool-undersized"}  # 0.9 leaves GPU headroom
    (b0, b1), (e0, e1) = early_late(w)
    kv = series(w, "vllm:kv_cache_usage_perc")
    assert mean(kv, b0, b1) < 0.4 and mean(kv, e0, e1) > 0.95
    assert rate_per_s(series(w, "vllm:num_preemptions_total"), e0, e1) * 60 > 10
    assert mean(series(w, "vllm:num_requests_waiting"), e0, e1) > 5
    ttft = "vllm:time_to_first_token_seconds"
    assert hist_quantile(w, ttft, 0.99, e0, e1) >= 5 * hist_quantile(w, ttft, 0.99, b0, b1)
    assert hist_quantile(w, ttft, 0.5, e0, e1) <= 0.5
    frag = 1 - series(w, "fragscope_torch_allocated_bytes").values / series(w, "fragscope_torch_reserved_bytes").values
    assert frag.max() < 0.1
    assert series(w, "fragscope_torch_alloc_retries_total").values[-1] == 0


def test_memory_leak_grows_and_ooms_at_the_end():
    w, truth = to_window(Scenario("memory-leak", **SHORT))
    assert truth.diagnoses == {"memory-leak"}
    alloc = series(w, "fragscope_torch_allocated_bytes").values
    res = series(w, "fragscope_torch_reserved_bytes").values
    used = series(w, "fragscope_gpu_memory_used_bytes").values
    assert alloc[-1] - alloc[0] > 4 * 1024**3 and used[-1] - used[0] > 4 * 1024**3
    assert np.all((res - alloc) / res < 0.1)  # the gap stays small: not fragmentation
    ooms = series(w, "fragscope_torch_ooms_total")
    first_oom = ooms.ts[np.argmax(ooms.values > ooms.values[0])]
    assert ooms.values[-1] > 0 and first_oom > w.start + 0.8 * (w.end - w.start)
    mild, t2 = to_window(Scenario("memory-leak", severity=0.5, **SHORT))
    assert series(mild, "fragscope_torch_ooms_total").values[-1] == 0 and t2.diagnoses == {"memory-leak"}


@pytest.mark.parametrize("reason", ["hw_thermal_slowdown", "sw_power_cap"])
def test_clock_throttling(reason):
    w, truth = to_window(Scenario("clock-throttling", throttle_reason=reason, gpus=2, daily_wave=False,
                                      **SHORT))
    assert truth.diagnoses == {"clock-throttling"}
    (b0, b1), (e0, e1) = early_late(w)
    c0 = series(w, "fragscope_gpu_sm_clock_hertz", gpu="0")
    c1 = series(w, "fragscope_gpu_sm_clock_hertz", gpu="1")
    assert mean(c0, b0, b1) > 1.9e9 and mean(c0, e0, e1) < 1.5e9 and mean(c1, e0, e1) > 1.9e9
    act = series(w, "fragscope_gpu_throttle_reason_active", gpu="0", reason=reason)
    assert act.values[0] == 0 and act.values[-1] == 1
    assert series(w, "fragscope_gpu_throttle_reason_active", gpu="1", reason=reason).values.max() == 0
    temp = series(w, "fragscope_gpu_temperature_celsius", gpu="0")
    if reason == "hw_thermal_slowdown":
        assert mean(temp, e0, e1) > 85
    gen = series(w, "vllm:generation_tokens_total")
    assert rate_per_s(gen, e0, e1) < 0.9 * rate_per_s(gen, b0, b1)
    assert mean(series(w, "fragscope_gpu_utilization_ratio", gpu="0"), e0, e1) > 0.9
    frag = 1 - series(w, "fragscope_torch_allocated_bytes", gpu="0").values / series(
        w, "fragscope_torch_reserved_bytes", gpu="0").values
    assert frag.max() < 0.1


def test_launch_bound():
    w, truth = to_window(Scenario("launch-bound", **SHORT))
    assert truth.diagnoses == {"launch-bound"}
    (_, _), (e0, e1) = early_late(w)
    assert mean(series(w, "fragscope_gpu_utilization_ratio"), e0, e1) < 0.5
    assert series(w, "fragscope_gpu_idle_ratio").values[-1] > 0.4
    assert series(w, "fragscope_kernel_gap_seconds", quantile="0.5").values[-1] > 150e-6
    assert series(w, "fragscope_kernel_gap_seconds", quantile="0.99").values[-1] > 1e-3
    assert series(w, "vllm:num_preemptions_total").values.max() == series(w, "vllm:num_preemptions_total").values[0]
    assert series(w, "fragscope_torch_alloc_retries_total").values[-1] == 0


def test_capacity_saturation_vs_traffic_surge():
    sat, ts_ = to_window(Scenario("capacity-saturation", **SHORT))
    surge, tu = to_window(Scenario("traffic-surge", **SHORT))
    assert ts_.diagnoses == {"capacity-saturation"} and tu.diagnoses == set()
    for w in (sat, surge):
        (b0, b1), (e0, e1) = early_late(w)
        gen = series(w, "vllm:generation_tokens_total")
        assert rate_per_s(gen, e0, e1) > 1.2 * rate_per_s(gen, b0, b1)
        assert rate_per_s(series(w, "vllm:num_preemptions_total"), e0, e1) * 60 < 1
        assert series(w, "fragscope_torch_alloc_retries_total").values[-1] == 0
    (_, _), (e0, e1) = early_late(sat)
    assert mean(series(sat, "vllm:num_requests_waiting"), e0, e1) > 50
    (_, _), (e0, e1) = early_late(surge)
    assert mean(series(surge, "vllm:num_requests_waiting"), e0, e1) < 20


def test_traffic_drop_is_not_a_pathology():
    w, truth = to_window(Scenario("traffic-drop", **SHORT))
    assert truth.diagnoses == set() and truth.onset_ts is None
    (b0, b1), (e0, e1) = early_late(w)
    gen = series(w, "vllm:generation_tokens_total")
    assert rate_per_s(gen, e0, e1) < 0.5 * rate_per_s(gen, b0, b1)
    assert series(w, "vllm:num_requests_waiting").values.max() < 5
    assert series(w, "vllm:num_preemptions_total").values.max() == series(w, "vllm:num_preemptions_total").values[0]


def test_kv_block_size_mismatch():
    w, truth = to_window(Scenario("kv-block-size-mismatch", **SHORT))
    assert truth.diagnoses == {"kv-block-size-mismatch"} and truth.onset_ts == w.start
    cc = w.select("vllm:cache_config_info")[0].key
    assert cc.label("block_size") == "64" and int(cc.label("num_gpu_blocks")) > 1000
    (b0, b1), _ = early_late(w)
    tokens = (rate_per_s(series(w, "vllm:request_prompt_tokens_sum"), b0, w.end)
              + rate_per_s(series(w, "vllm:request_generation_tokens_sum"), b0, w.end))
    reqs = rate_per_s(series(w, "vllm:request_prompt_tokens_count"), b0, w.end)
    assert 28 < tokens / reqs < 36
    assert 0.45 < truth.figures["expected_waste_ratio"] < 0.55
    _, ok = to_window(Scenario("healthy", block_size=16, avg_seq_len=40, **SHORT))
    assert "kv-block-size-mismatch" not in ok.diagnoses
    _, bad = to_window(Scenario("healthy", block_size=128, avg_seq_len=48, **SHORT))
    assert bad.diagnoses == {"kv-block-size-mismatch"}


def test_confounders_truth():
    for kind, want in (("healthy", set()), ("stable-slack", set()), ("leak-with-traffic", {"memory-leak"}),
                       ("throttling-with-load", {"clock-throttling"})):
        assert to_window(Scenario(kind, **SHORT))[1].diagnoses == want, kind
    w, _ = to_window(Scenario("stable-slack", **SHORT))
    frag = 1 - series(w, "fragscope_torch_allocated_bytes").values / series(w, "fragscope_torch_reserved_bytes").values
    assert 0.2 < frag.min() and frag.max() < 0.3
    assert series(w, "fragscope_torch_alloc_retries_total").values[-1] == 0


def test_severity_and_onset_sweep():
    ends = []
    for sev in (0.3, 1.0, 2.0):
        w, t = to_window(Scenario("allocator-fragmentation", severity=sev, **SHORT))
        ends.append(t.figures["fragmentation_ratio"][1])
    assert ends[0] < ends[1] < ends[2]
    w, t = to_window(Scenario("allocator-fragmentation", onset_s=2 * H, ramp="step", **SHORT))
    assert t.onset_ts == w.start + 2 * H
    ret = series(w, "fragscope_torch_alloc_retries_total")
    assert rate_per_s(ret, w.start, w.start + 2 * H - 60) == 0 and rate_per_s(ret, w.start + 2 * H, w.end) > 0.3
    _, none = to_window(Scenario("allocator-fragmentation", severity=0, **SHORT))
    assert none.diagnoses == set()


# --- names, sources, drop, restart -------------------------------------------------------------
def test_v0_names_and_labels():
    w, _ = to_window(Scenario("healthy", engine="v0", **SHORT))
    assert "vllm:gpu_cache_usage_perc" in w.names() and "vllm:kv_cache_usage_perc" not in w.names()
    run = series(w, "vllm:num_requests_running")
    assert run.key.label("engine") is None and run.key.label("model_name")
    ttft_les = {k.label("le") for k in w.series if k.name == "vllm:time_to_first_token_seconds_bucket"}
    assert "10.0" in ttft_les and "2560.0" not in ttft_les
    w1, _ = to_window(Scenario("healthy", **SHORT))
    assert series(w1, "vllm:num_requests_running").key.label("engine") == "0"


def test_dcgm_and_none_gpu_sources():
    w, _ = to_window(Scenario("clock-throttling", gpu_source="dcgm", **SHORT))
    assert not any(n.startswith("fragscope_gpu_") for n in w.names() - {"fragscope_gpu_idle_ratio"})
    used = series(w, "DCGM_FI_DEV_FB_USED")
    free = series(w, "DCGM_FI_DEV_FB_FREE")
    assert 60_000 < used.values[0] < 81_559 and np.all(used.values + free.values < 81_560)
    assert series(w, "DCGM_FI_DEV_GPU_UTIL").values.max() <= 100
    clk = series(w, "DCGM_FI_DEV_SM_CLOCK")
    assert clk.values[0] > 1900 and clk.values[-1] < 1500  # MHz
    assert series(w, "DCGM_FI_DEV_GPU_TEMP").key.label("UUID", "").startswith("GPU-")
    w2, truth = to_window(Scenario("healthy", gpu_source="none", torch_probe=False, kernel_stats=False, **SHORT))
    # engine series, and the process collector's container / host series (no GPU source: no GPU series)
    assert all(n.startswith(("vllm:", "fragscope_container_", "fragscope_process_", "fragscope_host_"))
               for n in w2.names()) and "no torch probe" in truth.notes
    assert any(n.startswith("vllm:") for n in w2.names())


def test_drop_names_and_prefixes():
    w, truth = to_window(Scenario("allocator-fragmentation", drop=("fragscope_torch_", "vllm:num_preemptions_total",
                                                                    "vllm:time_to_first_token_seconds"), **SHORT))
    names = w.names()
    assert not any(n.startswith(("fragscope_torch_", "vllm:time_to_first_token_seconds")) for n in names)
    assert "vllm:num_preemptions_total" not in names and "vllm:num_requests_running" in names
    assert "allocator-fragmentation" in truth.diagnoses and "left out" in truth.notes


def test_restart_resets_counters_and_clears_pathology():
    s = Scenario("allocator-fragmentation", restart_at_s=3 * H, **SHORT)
    w, truth = to_window(s)
    r = w.start + 3 * H
    gen = series(w, "vllm:generation_tokens_total")
    before, after = gen.between(w.start, r - 1), gen.between(r, w.end)
    assert before.values[-1] > 1e6 and after.values[0] < before.values[-1] / 10
    assert after.ts[0] >= r + 90  # engine down ~90 s: no samples, not zeros
    pids = {k.label("pid") for k in w.series if k.name == "fragscope_torch_reserved_bytes"}
    assert len(pids) == 2
    new = [s_ for k, s_ in w.series.items() if k.name == "fragscope_torch_alloc_retries_total" and s_.ts[0] > r][0]
    assert new.values[-1] == 0  # the pathology cleared
    assert "restarted" in truth.notes


def test_counters_start_with_history():
    w, _ = to_window(Scenario("healthy", **SHORT))
    assert series(w, "vllm:generation_tokens_total").values[0] > 1e6
    w0, _ = to_window(Scenario("healthy", uptime_s=0, **SHORT))
    assert series(w0, "vllm:generation_tokens_total").values[0] < 1e5


def test_several_gpus():
    w, _ = to_window(Scenario("allocator-fragmentation", gpus=4, **SHORT))
    gpus = {k.label("gpu") for k in w.series if k.name == "fragscope_torch_reserved_bytes"}
    assert gpus == {"0", "1", "2", "3"}
    for g in gpus:
        a = series(w, "fragscope_torch_allocated_bytes", gpu=g).values
        r = series(w, "fragscope_torch_reserved_bytes", gpu=g).values
        assert (1 - a[-1] / r[-1]) > 0.2


def test_bad_scenarios_raise():
    for kw in (dict(kind="nope"), dict(kind="healthy", engine="v2"), dict(kind="healthy", gpu_source="x"),
               dict(kind="healthy", step_s=0), dict(kind="healthy", gpus=0), dict(kind="healthy", ramp="cubic")):
        with pytest.raises(ValueError):
            Scenario(**kw)


# --- files ---------------------------------------------------------------------------------------
def assert_same(w, r):
    assert set(w.series) == set(r.series)
    for k, s in w.series.items():
        o = r.series[k]
        assert np.array_equal(o.ts, s.ts) and np.array_equal(o.values, s.values), k
        assert o.type == s.type, (k, o.type, s.type)


@pytest.mark.parametrize("engine,src", [("v1", "fragscope"), ("v0", "dcgm")])
def test_openmetrics_round_trip(tmp_path, engine, src):
    s = Scenario("kv-cache-pressure", engine=engine, gpu_source=src, gpus=2, restart_at_s=2 * H, **SHORT)
    path = tmp_path / "rec.om.gz"
    truth = write_openmetrics(s, str(path))
    assert truth.diagnoses == {"kv-cache-pressure", "kv-pool-undersized"}
    with gzip.open(path, "rt") as fh:
        text = fh.read()
    assert text.endswith("# EOF\n")
    assert "# TYPE vllm:num_preemptions counter\n" in text and "vllm:num_preemptions_total{" in text
    assert "# TYPE vllm:time_to_first_token_seconds histogram\n" in text
    assert " 1767225600\n" in text  # seconds
    w, _ = to_window(s)
    assert_same(w, read_recording(str(path)))


def test_prometheus_text_round_trip(tmp_path):
    s = Scenario("memory-leak", **SHORT)
    path = tmp_path / "rec.prom"
    write_prometheus_text(s, str(path))
    text = path.read_text()
    assert "# TYPE vllm:num_preemptions_total counter\n" in text and "# EOF" not in text
    assert " 1767225600000\n" in text  # milliseconds
    w, _ = to_window(s)
    assert_same(w, read_recording(str(path)))


def test_write_to_open_handles():
    s = Scenario("healthy", duration_s=H, step_s=60)
    sio = io.StringIO()
    write_openmetrics(s, sio)
    assert sio.getvalue().endswith("# EOF\n")
    bio = io.BytesIO()
    write_openmetrics(s, bio, gzip=True)
    assert not bio.closed and gzip.decompress(bio.getvalue()).decode() == sio.getvalue()


def test_histogram_metric_points_are_contiguous(tmp_path):
    path = tmp_path / "r.om"
    write_openmetrics(Scenario("healthy", duration_s=H, step_s=60), str(path))
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("vllm:time_to_first_token_seconds")]
    first_ts = lines[0].rsplit(" ", 1)[1]
    block = [ln for ln in lines[:30] if ln.rsplit(" ", 1)[1] == first_ts]
    assert len(block) == 25 and block[-2].startswith("vllm:time_to_first_token_seconds_count")
    assert block[-1].startswith("vllm:time_to_first_token_seconds_sum") and 'le="+Inf"' in block[-3]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_openmetrics(tmp_path):
    path = tmp_path / "rec.om"
    s = Scenario("allocator-fragmentation", gpus=2, restart_at_s=2 * H, **SHORT)
    write_openmetrics(s, str(path))
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "db")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    w, _ = to_window(s)
    total = sum(len(x) for x in w)
    reported = 0
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0][:2].isalnum() and parts[4].isdigit():
            reported += int(parts[4])
    assert reported == total
