"""batching-misconfiguration (issue 13): Triton config.pbtxt read for real (files from Triton's own
repository), judged against Triton counters written in Triton's exposition format. Every expected
figure is computed by hand in the test from the counters it writes."""
from __future__ import annotations

import math
import pathlib

import pytest

from fragscope.collectors.exposition import parse_text
from fragscope.collectors.triton_config import ConfigError, TritonModelConfig, read_config
from fragscope.detectors import batching
from fragscope.model import Inconclusive, Window

DATA = pathlib.Path(__file__).resolve().parent / "data" / "engines"
CFG = DATA / "triton_configs"
T0 = 1_767_225_600.0


def test_real_configs_are_read():
    bert = read_config((CFG / "bert_base_trt_gpu.pbtxt").read_text())
    # scalar preferred_batch_size, a message without brackets, a trailing space after 4
    assert (bert.max_batch_size, bert.dynamic_batching, bert.preferred_batch_sizes, bert.max_queue_delay_us,
            bert.instance_count) == (4, True, [4], 200000, 2)
    tr = read_config((CFG / "text_recognition_dynamic.pbtxt").read_text())
    assert (tr.name, tr.max_batch_size, tr.dynamic_batching, tr.max_queue_delay_us, tr.instance_count) == \
        ("text_recognition", 8, True, 0, 2)
    dn = read_config((CFG / "densenet_onnx.pbtxt").read_text())
    assert (dn.max_batch_size, dn.dynamic_batching, dn.instance_count) == (1, False, None)


def test_instance_count_multiplies_by_listed_gpus_and_groups_add():
    cfg = read_config('max_batch_size: 8\ninstance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] },\n'
                      '{ kind: KIND_CPU } ]\nmodel_transaction_policy { decoupled: True }')
    assert cfg.instance_count == 5 and cfg.instance_kinds == ["KIND_GPU", "KIND_CPU"] and cfg.decoupled


@pytest.mark.parametrize("text,msg", [
    ("max_batch_size: 8\ndynamic_batching {", "end of file"),
    ('max_batch_size: "x"', "max_batch_size"),
    ("", "empty"),
    ("foo: 1\nbar: 2", "no Triton model-config fields"),
    ("max_batch_size: 8 }", "expected a field name"),
    ("\x00\x01\x02", "expected a field name"),
    ("name: \"unterminated\nmax_batch_size: 1", "unexpected character"),
])
def test_bad_configs_give_one_line_errors(text, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        read_config(text)
    assert "\n" not in str(e.value)


def triton_window(model: str, scrapes: list[dict[str, float]], step: float = 60.0) -> Window:
    """Scrapes in Triton's own format (names and units as Triton exposes them)."""
    cols: dict = {}
    types: dict = {}
    for i, v in enumerate(scrapes):
        lines = []
        for name, key in (("nv_inference_request_success", "requests"), ("nv_inference_count", "inferences"),
                          ("nv_inference_exec_count", "executions"), ("nv_inference_queue_duration_us", "queue_us"),
                          ("nv_inference_compute_input_duration_us", "input_us"),
                          ("nv_inference_compute_infer_duration_us", "infer_us"),
                          ("nv_inference_compute_output_duration_us", "output_us")):
            lines += [f"# TYPE {name} counter", f'{name}{{model="{model}",version="1"}} {v[key]:.6f}']
        lines += ["# TYPE nv_inference_pending_request_count gauge",
                  f'nv_inference_pending_request_count{{model="{model}",version="1"}} {v.get("pending", 0)}']
        p = parse_text("\n".join(lines) + "\n", default_ts=T0 + i * step)
        types.update(p.types)
        for k, (ts, vs) in p.cols.items():
            a = cols.setdefault(k, ([], []))
            a[0].extend(ts)
            a[1].extend(vs)
    return Window.from_columns(cols, types=types)


def counters(R, I, E, q_us, c_us, pending=0.0) -> dict[str, float]:
    """Totals for R requests: q_us queue and c_us compute per request (split 10/80/10 in/infer/out)."""
    return {"requests": R, "inferences": I, "executions": E, "queue_us": R * q_us, "input_us": R * c_us * 0.1,
            "infer_us": R * c_us * 0.8, "output_us": R * c_us * 0.1, "pending": pending}


ZERO = counters(0, 0, 0, 0, 0)


def judge(cfg: TritonModelConfig, w: Window, model="m"):
    return batching.detect(cfg, batching.model_counters(w, model))


def test_short_delay_with_low_fill_while_busy_raises_the_delay():
    cfg = read_config("max_batch_size: 32\ndynamic_batching { preferred_batch_size: [ 16 ] "
                      "max_queue_delay_microseconds: 100 }\ninstance_group [ { count: 1 } ]")
    R, b, c, q = 120_000, 9.6, 4000.0, 6000.0  # 2000 requests/s over 60 s
    E = R / b
    w = triton_window("m", [ZERO, counters(R, R, E, q, c, pending=12)])
    (f,) = judge(cfg, w)
    assert f.context["problem"] == "delay-too-short"
    assert f.context["fill"] == pytest.approx(9.6 / 32)
    assert f.context["arrival_per_s"] == pytest.approx(2000.0)
    assert f.context["utilization"] == pytest.approx(c * 1e-6 * E / 60)  # 0.833
    # (16 - 1) / 2000 per s = 7.5 ms to gather 16, capped at 4 ms for user-facing traffic
    assert f.context["recommended"] == 4000
    assert "100 → 4000" in batching.actions(f.context, {})[0]
    pend = next(e for e in f.evidence if e.signal == "pending_requests")
    assert pend.baseline == pytest.approx(2000 * q * 1e-6)  # Little: 12 waiting


def test_light_load_with_small_batches_is_healthy():
    cfg = read_config("max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 100 }")
    R = 3000  # 50/s: nothing waits, batches of 1.2 are what the traffic gives
    w = triton_window("m", [ZERO, counters(R, R, R / 1.2, 50.0, 3000.0)])
    assert judge(cfg, w) == []


def test_full_batches_that_queue_need_instances_by_utilisation():
    cfg = read_config("max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 500 }\n"
                      "instance_group [ { count: 1 kind: KIND_GPU } ]")
    E = 11_640.0
    I = E * 31
    w = triton_window("m", [ZERO, counters(I, I, E, 20_000.0, 5000.0)])
    (f,) = judge(cfg, w)
    rho = 5000e-6 * E / 60  # 0.97
    assert f.context["problem"] == "too-few-instances"
    assert f.context["utilization"] == pytest.approx(rho)
    assert f.context["recommended"] == math.ceil(rho / 0.7) == 2


def test_real_long_delay_config_when_the_timer_forms_the_batches():
    cfg = read_config((CFG / "bert_base_trt_gpu.pbtxt").read_text())  # 200 ms delay, max batch 4
    # one scrape: lifetime totals, 1000 requests in 800 executions, 150 ms queue, 8 ms compute
    w = triton_window("bert", [counters(1000, 1000, 800, 150_000.0, 8000.0)])
    (f,) = judge(cfg, w, "bert")
    assert f.context["problem"] == "delay-too-long"
    assert f.context["arrival_per_s"] is None  # one scrape: no rate
    assert f.context["recommended"] == 8000  # about one execution
    assert "200000 → 8000" in batching.actions(f.context, {})[0]


def test_batching_off_with_a_queue():
    cfg = read_config("max_batch_size: 8\ninstance_group [ { count: 1 } ]")
    w = triton_window("m", [ZERO, counters(6000, 6000, 6000, 9000.0, 3000.0)])
    (f,) = judge(cfg, w)
    assert f.context["problem"] == "dynamic-batching-off"
    # target half of 8 = 4; (4 - 1) / 100 per s = 30 ms -> capped at 4 ms
    assert f.context["recommended"] == 4000
    assert "dynamic_batching { max_queue_delay_microseconds: 4000 }" in batching.actions(f.context, {})[0]


def test_a_model_that_cannot_batch_with_a_queue_needs_instances():
    cfg = read_config((CFG / "densenet_onnx.pbtxt").read_text())
    w = triton_window("densenet_onnx", [ZERO, counters(3000, 3000, 3000, 30_000.0, 10_000.0)])
    (f,) = judge(cfg, w, "densenet_onnx")
    assert f.context["problem"] == "cannot-batch" and f.context["knob"] == "instance_group.count"


def test_inconclusive_cases_say_why():
    cfg = read_config("max_batch_size: 8\ndynamic_batching { }")
    few = judge(cfg, triton_window("m", [ZERO, counters(20, 20, 10, 1.0, 1.0)]))
    assert isinstance(few, Inconclusive) and "10 executions" in few.reason
    none = judge(cfg, triton_window("other", [ZERO]))
    assert isinstance(none, Inconclusive) and "nv_inference_exec_count" in none.missing
    dec = read_config("max_batch_size: 8\nmodel_transaction_policy { decoupled: true }")
    assert "decoupled" in judge(dec, triton_window("m", [ZERO])).reason


def test_real_trtllm_readme_scrape_is_inconclusive_not_healthy():
    w = parse_text((DATA / "triton_trtllm_readme_nv_inference.prom").read_text(), default_ts=T0).to_window()
    assert batching.models_in(w) == ["tensorrt_llm"]
    res = judge(read_config("max_batch_size: 64\ndynamic_batching { }"), w, "tensorrt_llm")
    assert isinstance(res, Inconclusive) and "0 executions" in res.reason


def test_real_old_triton_scrape_with_gpu_labels():
    w = parse_text((DATA / "triton_old_aliyun_doc.prom").read_text(), default_ts=T0).to_window()
    c = batching.model_counters(w, "resnet50_trt")
    assert (c.requests, c.inferences, c.executions) == (4.0, 4.0, 4.0)
    assert c.queue_us == 116.0 and c.compute_us == 1874.0 + 5154.0 + 66.0
    assert c.interval_s is None


def test_real_ensemble_scrape_names_the_models_and_what_is_missing():
    """tensorrtllm_backend issue #667: five models; the excerpt lacks inference_count and request counts."""
    w = parse_text((DATA / "triton_trtllm_issue667_excerpt.prom").read_text(), default_ts=T0).to_window()
    assert batching.models_in(w) == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm",
                                     "tensorrt_llm_bls"]
    c = batching.model_counters(w, "postprocessing")
    assert c.executions == 11041.0 and c.queue_us == 20113756.0
    res = batching.detect(read_config("max_batch_size: 64\ndynamic_batching { }"), c)
    assert isinstance(res, Inconclusive)
    assert set(res.missing) >= {"nv_inference_count", "nv_inference_request_success",
                                "nv_inference_compute_infer_duration_us"}
