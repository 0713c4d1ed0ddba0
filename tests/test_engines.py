"""Engine adapters (issue 13): real scrapes of SGLang, TGI, Triton and the TensorRT-LLM backend read
into the canonical signals, and judged from one scrape. Expected figures are read off the files by
hand (tests/data/README_engines.md says where each file comes from)."""
from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from fragscope.collectors.engines import derive
from fragscope.collectors.exposition import parse_text
from fragscope.detectors.frame import build_frame
from fragscope.model import Series, SeriesKey, Severity, Window, make_labels
from fragscope.pipeline import diagnose
from fragscope.signals import DERIVED, SIGNALS

DATA = pathlib.Path(__file__).resolve().parent / "data" / "engines"
T0 = 1_767_225_600.0


def scrape(name: str, text: str | None = None) -> Window:
    text = (DATA / name).read_text(encoding="utf-8") if text is None else text
    return derive(parse_text(text, default_ts=T0, source=name).to_window(name))


def last(a: np.ndarray) -> float:
    return float(a[-1])


# --- SGLang -----------------------------------------------------------------------------------
SGL = "sglang_docs_production_metrics.prom"


def test_sglang_scrape_maps_onto_canonical_signals():
    f = build_frame(scrape(SGL))
    assert f.sources["requests_running"] == "sglang:num_running_reqs"
    assert last(f.engine["requests_running"]) == 162.0
    assert last(f.engine["requests_waiting"]) == 2826.0
    assert last(f.engine["kv_cache_usage_ratio"]) == 0.28
    assert last(f.engine["kv_cache_used_tokens"]) == 123859.0
    assert f.engine_total["generation_tokens_total"] == 7.557572e+06
    assert f.engine_total["prompt_tokens_total"] == 8.128902e+06
    # lifetime averages from _sum / _count (one scrape)
    assert f.hist_avg["ttft_seconds"] == pytest.approx(2.3518979474117756e+06 / 11008.0)
    assert f.hist_avg["e2e_request_latency_seconds"] == pytest.approx(3.116093850019932e+06 / 11228.0)
    assert f.sources["inter_token_latency_seconds"] == "sglang:time_per_output_token_seconds"
    assert f.hist_avg["inter_token_latency_seconds"] == pytest.approx(866964.5791549598 / 7.400757e+06)
    assert "preemptions_total" not in f.sources  # this SGLang exported no retraction counter: absent, not 0


def test_sglang_real_scrape_is_a_queue_not_kv_pressure():
    rep = diagnose(scrape(SGL))
    ids = {f.id: f for f in rep.findings}
    # 2826 waiting, 162 running, KV 28 %: a standing queue, the pool far from full
    assert "kv-cache-pressure" not in ids
    assert ids["capacity-saturation"].basis == "level"
    assert "2826 requests waiting" in ids["capacity-saturation"].summary


def _sglang_full(tp_ranks: int, retracted: float, usage: str = "0.97") -> str:
    """The real SGLang scrape with the pool full and retractions reported by each TP rank, as
    SGLang >= 0.5 does with --enable-metrics-for-all-schedulers (values changed, names real)."""
    t = (DATA / SGL).read_text(encoding="utf-8")
    t = t.replace('sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28',
                  f'sglang:token_usage{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} {usage}')
    t += "# TYPE sglang:num_retracted_requests_total counter\n"
    t += "".join(f'sglang:num_retracted_requests_total{{model_name="meta-llama/Llama-3.1-8B-Instruct",'
                 f'tp_rank="{i}"}} {retracted}\n' for i in range(tp_ranks))
    return t


def test_sglang_retractions_give_kv_pressure_from_one_scrape():
    w = scrape(SGL, _sglang_full(tp_ranks=4, retracted=48.0))
    f = build_frame(w)
    # four TP ranks repeat one scheduler's counter: 48 retractions, not 192
    assert f.engine_total["preemptions_total"] == 48.0
    assert any("per-rank duplicate" in n for n in w.notes)
    rep = diagnose(w)
    kv = next(x for x in rep.findings if x.id == "kv-cache-pressure")
    assert kv.basis == "level"
    ev = {e.signal: e.observed for e in kv.evidence}
    assert ev["kv_cache_usage_ratio"] == 0.97 and ev["preemptions_total"] == 48.0
    assert "48" in kv.summary


def test_sglang_past_retractions_with_a_roomy_pool_are_only_a_note():
    # retractions since start but the pool 40 % full now: an info that it ran out before, not a warning
    rep = diagnose(scrape(SGL, _sglang_full(tp_ranks=1, retracted=48.0, usage="0.40")))
    kv = [f for f in rep.findings if f.id == "kv-cache-pressure"]
    assert all(f.severity is Severity.INFO for f in kv)
    assert all("40 %" in f.summary and "48" in f.summary for f in kv)
    # no retractions at all with the same pool: nothing about KV
    rep = diagnose(scrape(SGL, _sglang_full(tp_ranks=1, retracted=0.0, usage="0.40")))
    assert "kv-cache-pressure" not in {f.id for f in rep.findings}


def test_sglang_instantaneous_retraction_gauge_is_not_read_as_a_counter():
    # sglang:num_retracted_reqs is the last batch's gauge: never a lifetime count
    srcs = [s.metric for s in SIGNALS["preemptions_total"].sources]
    assert "sglang:num_retracted_requests_total" in srcs and "sglang:num_retracted_reqs" not in srcs


# --- TGI --------------------------------------------------------------------------------------
TGI = "tgi_datadog_payload_head.prom"


def test_tgi_scrape_maps_onto_canonical_signals():
    f = build_frame(scrape(TGI))
    assert f.sources["requests_waiting"] == "tgi_queue_size"
    assert f.sources["requests_running"] == "tgi_batch_current_size"
    assert last(f.engine["requests_waiting"]) == 0.0 and last(f.engine["requests_running"]) == 0.0
    assert last(f.engine["batch_max_tokens"]) == 0.0
    assert f.engine_total["request_success_total"] == 109.0
    assert f.engine_total["request_failure_total"] == 2.0


def test_tgi_idle_scrape_finds_nothing_and_says_kv_is_not_exported():
    rep = diagnose(scrape(TGI))
    assert rep.findings == []
    inc = {i.id: i for i in rep.inconclusive}
    assert "kv-cache-pressure" in inc  # TGI exports no KV usage: inconclusive, never "healthy"


def test_tgi_histograms_read_as_request_averages():
    # TGI histogram names (as in the DataDog fixture's full file), lifetime averages from one scrape
    text = ("# TYPE tgi_request_input_length histogram\n"
            'tgi_request_input_length_bucket{le="100"} 3\ntgi_request_input_length_bucket{le="+Inf"} 4\n'
            "tgi_request_input_length_sum 520\ntgi_request_input_length_count 4\n"
            "# TYPE tgi_request_queue_duration histogram\n"
            'tgi_request_queue_duration_bucket{le="0.1"} 3\ntgi_request_queue_duration_bucket{le="+Inf"} 4\n'
            "tgi_request_queue_duration_sum 0.9\ntgi_request_queue_duration_count 4\n")
    f = build_frame(scrape("inline", text))
    assert f.hist_avg["request_prompt_tokens"] == 130.0
    assert f.hist_avg["request_queue_seconds"] == pytest.approx(0.225)


# --- Triton -----------------------------------------------------------------------------------
def test_triton_old_scrape_maps_counters_and_gpu_signals_with_units():
    f = build_frame(scrape("triton_old_aliyun_doc.prom"))
    assert f.engine_total["request_success_total"] == 4.0
    assert f.engine_total["inference_count_total"] == 4.0
    assert f.engine_total["inference_exec_count_total"] == 4.0
    assert f.engine_total["inference_queue_seconds_total"] == pytest.approx(116e-6)
    assert f.engine_total["inference_compute_infer_seconds_total"] == pytest.approx(5154e-6)
    assert f.engine_total["inference_request_seconds_total"] == pytest.approx(7222e-6)
    g = "GPU-0e9fdafb-5adb-91cd-26a8-308d34357efc"
    assert f.gpus() == [g]
    assert last(f.gpu[g]["gpu_memory_total_bytes"]) == 16945512448.0
    assert last(f.gpu[g]["gpu_memory_used_bytes"]) == 974913536.0
    assert last(f.gpu[g]["gpu_utilization_ratio"]) == 0.0
    assert last(f.gpu[g]["gpu_power_watts"]) == pytest.approx(55.137)
    assert last(f.gpu[g]["gpu_power_limit_watts"]) == 300.0


def test_triton_per_model_scrape_reads_pending_as_waiting():
    f = build_frame(scrape("triton_trtllm_readme_nv_inference.prom"))
    assert f.sources["requests_waiting"] == "nv_inference_pending_request_count"
    assert last(f.engine["requests_waiting"]) == 0.0
    assert f.engine_total["inference_exec_count_total"] == 0.0  # a counter at zero is a value, not missing


# --- TensorRT-LLM backend -----------------------------------------------------------------------
TRT = "triton_trtllm_readme_nv_trt_llm.prom"


def test_trtllm_kv_usage_is_used_over_max_blocks_and_request_types_map():
    f = build_frame(scrape(TRT))
    assert f.sources["kv_cache_usage_ratio"] == "nv_trt_llm_kv_cache_used_ratio"
    assert last(f.engine["kv_cache_usage_ratio"]) == pytest.approx(1 / 6239)  # used 1, max 6239
    assert last(f.engine["requests_waiting"]) == 1.0  # request_type="waiting"
    assert last(f.engine["requests_running"]) == 0.0  # request_type="active"


def test_trtllm_full_pool_with_a_queue_from_one_scrape():
    t = (DATA / TRT).read_text(encoding="utf-8")
    t = t.replace('kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1',
                  'kv_cache_block_type="used",model="tensorrt_llm",version="1"} 6200')
    for old, new in (('request_type="waiting",version="1"} 1', 'request_type="waiting",version="1"} 37'),
                     ('request_type="active",version="1"} 0', 'request_type="active",version="1"} 96')):
        assert old in t  # the file's label order (model, request_type, version)
        t = t.replace(old, new)
    w = scrape(TRT, t)
    f = build_frame(w)
    assert last(f.engine["kv_cache_usage_ratio"]) == pytest.approx(6200 / 6239)
    assert last(f.engine["requests_waiting"]) == 37 and last(f.engine["requests_running"]) == 96
    rep = diagnose(w)
    ids = {x.id for x in rep.findings}
    # no preemption counter in TRT-LLM: a full pool with a queue is capacity, not a preemption storm
    assert "capacity-saturation" in ids and "kv-cache-pressure" not in ids


def test_derived_series_need_their_denominator():
    k = lambda **kw: SeriesKey("nv_trt_llm_kv_cache_block_metrics", make_labels(kw))
    s = {k(kv_cache_block_type="used", model="m"): Series(k(kv_cache_block_type="used", model="m"),
                                                           np.array([T0]), np.array([5.0]), "gauge")}
    w = derive(Window(s, T0, T0))
    assert "nv_trt_llm_kv_cache_used_ratio" not in w.names()  # no max: not available, never a guess
    # matched per model: two models, two ratios
    both = {}
    for m, used, mx in (("a", 10.0, 100.0), ("b", 90.0, 100.0)):
        for typ, v in (("used", used), ("max", mx)):
            key = k(kv_cache_block_type=typ, model=m)
            both[key] = Series(key, np.array([T0, T0 + 15]), np.array([v, v]), "gauge")
    w = derive(Window(both, T0, T0 + 15))
    got = {s.key.label("model"): float(s.values[-1]) for s in w.select("nv_trt_llm_kv_cache_used_ratio")}
    assert got == {"a": 0.1, "b": 0.9}
    assert derive(w) is w  # idempotent


def test_every_derived_name_is_a_listed_source():
    listed = {s.metric for sig in SIGNALS.values() for s in sig.sources}
    assert all(d.metric in listed for d in DERIVED)


def test_two_scrapes_give_triton_rates():
    text = (DATA / "triton_old_aliyun_doc.prom").read_text(encoding="utf-8")
    p = parse_text(text, default_ts=T0)
    later = text.replace("nv_inference_count{gpu_uuid=\"GPU-0e9fdafb-5adb-91cd-26a8-308d34357efc\",model=\"resnet50_trt\","
                         "version=\"1\"} 4.000000",
                         "nv_inference_count{gpu_uuid=\"GPU-0e9fdafb-5adb-91cd-26a8-308d34357efc\",model=\"resnet50_trt\","
                         "version=\"1\"} 64.000000")
    assert later != text
    p2 = parse_text(later, default_ts=T0 + 15)
    cols = dict(p.cols)
    for key, (ts, vs) in p2.cols.items():
        a = cols.setdefault(key, ([], []))
        cols[key] = (list(a[0]) + list(ts), list(a[1]) + list(vs))
    f = build_frame(derive(Window.from_columns(cols, types=p.types)))
    assert last(f.engine["inference_count_total"]) == pytest.approx(60 / 15)
    assert math.isfinite(last(f.engine["inference_exec_count_total"]))
