"""The recording / scrape parser on real scrapes and on every kind of bad input."""
from __future__ import annotations

import gzip
import os

import pytest

from fragscope.collectors.exposition import ParseError, parse_text, read_recording

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")


def test_real_v1_scrape_types_and_aliases():
    text = open(os.path.join(DATA, "vllm_v1_cncf_kops.metrics.txt")).read()
    p = parse_text(text, 1000.0)
    names = {k.name for k in p.cols}
    assert "vllm:kv_cache_usage_perc" in names
    assert "vllm:num_preemptions_total" in names
    assert p.types["vllm:num_preemptions_total"] == "counter"
    assert p.types["vllm:time_to_first_token_seconds_bucket"] == "histogram"
    # V1's *_created companions of counters and histograms are dropped
    assert not any(n.endswith("_created") and p.types.get(n) in ("counter", "histogram") for n in names)
    running = [k for k in p.cols if k.name == "vllm:num_requests_running"]
    assert running and running[0].label("engine") == "0" and running[0].label("model_name")
    info = [k for k in p.cols if k.name == "vllm:cache_config_info"][0]
    assert info.label("num_gpu_blocks") == "101625"


def test_openmetrics_recording_with_histograms_and_eof(tmp_path):
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        "vllm:num_preemptions_total{model_name=\"m\"} 0 1700000000\n"
        "vllm:num_preemptions_total{model_name=\"m\"} 5 1700000015\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 1 1700000000\n"
        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 2 1700000000\n"
        "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 2 1700000000\n"
        "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.3 1700000000\n"
        "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 3 1700000015\n"
        "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4 1700000015\n"
        "# EOF\n")
    f = tmp_path / "r.om.gz"
    with gzip.open(f, "wt") as fh:
        fh.write(text)
    w = read_recording(str(f))
    s = w.select("vllm:num_preemptions_total")[0]
    assert s.ts.tolist() == [1700000000, 1700000015] and s.values.tolist() == [0, 5]
    assert s.type == "counter"
    b = w.select("vllm:time_to_first_token_seconds_bucket", le="+Inf")[0]
    assert b.values.tolist() == [2, 4]
    assert not w.notes


def test_prometheus_text_millisecond_timestamps(tmp_path):
    f = tmp_path / "r.prom"
    f.write_text('up{job="a"} 1 1700000000000\nup{job="a"} 1 1700000015000\n')
    w = read_recording(str(f))
    assert w.start == 1700000000 and w.end == 1700000015


def test_nan_inf_and_duplicates_dropped_and_counted(tmp_path):
    f = tmp_path / "r.om"
    f.write_text("g 1 100\ng NaN 115\ng +Inf 130\ng 2 145\ng 3 145\n# EOF\n")
    w = read_recording(str(f))
    s = w.select("g")[0]
    assert s.ts.tolist() == [100, 145] and s.values.tolist() == [1, 3]  # last duplicate wins
    assert w.dropped_points == 3 and any("dropped" in n for n in w.notes)


def test_missing_eof_is_noted_and_data_kept(tmp_path):
    f = tmp_path / "r.om"
    f.write_text("g 1 100.5\ng 2 115.5\n")
    w = read_recording(str(f))
    assert len(w.select("g")[0]) == 2
    assert any("truncated" in n for n in w.notes)


def test_label_values_with_escapes_and_braces():
    p = parse_text('m{a="x}y",b="q\\"uote",c="back\\\\slash"} 1\n', 5.0)
    (key,) = p.cols
    assert key.label("a") == "x}y" and key.label("b") == 'q"uote' and key.label("c") == "back\\slash"


def test_ray_prefix_normalised():
    p = parse_text("ray_vllm:num_requests_running{WorkerId=\"1\"} 3\n", 1.0)
    assert {k.name for k in p.cols} == {"vllm:num_requests_running"}


def test_dcgm_blank_sentinel_dropped():
    p = parse_text('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 40\n', 1.0)
    assert {k.name for k in p.cols if p.cols[k][0]} == {"DCGM_FI_DEV_GPU_TEMP"}


@pytest.mark.parametrize("content,needle", [
    (b"", "empty file"),
    (b"<html><body>" + b"<p>oops</p>\n" * 40 + b"</body></html>\n", "not Prometheus/OpenMetrics text"),
    (bytes(range(256)) * 10, "not text"),
    (b"# just a comment\n", "no samples"),
    (b"m 1\n", "sample without a timestamp"),
])
def test_bad_input_one_line(tmp_path, content, needle):
    f = tmp_path / "bad"
    f.write_bytes(content)
    with pytest.raises(ParseError) as e:
        read_recording(str(f))
    assert needle in str(e.value) and "\n" not in str(e.value) and str(f) in str(e.value)


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(b"g 1 100\n" * 5000)
    f = tmp_path / "t.om.gz"
    f.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ParseError, match="truncated gzip"):
        read_recording(str(f))


def test_mostly_garbage_rejected_but_rare_bad_lines_skipped(tmp_path):
    good = "".join(f"g {i} {100 + i}\n" for i in range(200))
    f = tmp_path / "few.om"
    f.write_text(good + "this is not a metric line\n")
    w = read_recording(str(f))
    assert len(w.select("g")[0]) == 200 and any("unparsable" in n for n in w.notes)
    f2 = tmp_path / "many.om"
    f2.write_text(good + "garbage here\n" * 100)
    with pytest.raises(ParseError, match="unparsable"):
        read_recording(str(f2))


def test_key_cache_gives_the_same_samples_scrape_after_scrape():
    from fragscope.collectors.exposition import scrape_samples

    text = open(os.path.join(DATA, "vllm_v1_cncf_kops.metrics.txt")).read()
    cache: dict = {}
    first = scrape_samples(text, 1.0, key_cache=cache)
    assert cache  # filled on the first scrape
    again = scrape_samples(text.replace(" 0.0\n", " 7.0\n"), 2.0, key_cache=cache)
    plain = scrape_samples(text.replace(" 0.0\n", " 7.0\n"), 2.0)
    assert again == plain and len(first) == len(plain)
