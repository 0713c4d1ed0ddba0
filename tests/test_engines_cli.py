"""diagnose ort-profile and diagnose triton-batching: exit codes, valid JSON, one-line errors."""
from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from fragscope.cli import diagnose_group

DATA = pathlib.Path(__file__).resolve().parent / "data" / "engines"


class _R:
    def __init__(self, exit_code, output):
        self.exit_code, self.output = exit_code, output


def invoke(cmd, args):
    """The exit code the console script gives: the command's return value, or 2 for a usage error."""
    r = CliRunner().invoke(cmd, args, standalone_mode=False)
    if r.exception is not None:
        code = getattr(r.exception, "exit_code", None)
        assert code == 2, f"unexpected {type(r.exception).__name__}: {r.exception}"
        return _R(2, r.output)
    return _R(r.return_value, r.output)


def _triton_scrape(requests, inferences, executions, queue_us, compute_us) -> str:
    m = 'model="resnet",version="1"'
    return "".join([f"nv_inference_request_success{{{m}}} {requests}\n", f"nv_inference_count{{{m}}} {inferences}\n",
                    f"nv_inference_exec_count{{{m}}} {executions}\n", f"nv_inference_queue_duration_us{{{m}}} {queue_us}\n",
                    f"nv_inference_compute_input_duration_us{{{m}}} 0\n",
                    f"nv_inference_compute_infer_duration_us{{{m}}} {compute_us}\n",
                    f"nv_inference_compute_output_duration_us{{{m}}} 0\n"])


def test_triton_batching_two_scrapes_json(tmp_path, capsys):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text('name: "resnet"\nmax_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 100 }\n'
                   "instance_group [ { count: 1 } ]\n")
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(_triton_scrape(0, 0, 0, 0, 0))
    R, E = 120000, 12500  # 2000/s over 60 s, batches of 9.6, queue 6 ms, compute 4 ms per request
    b.write_text(_triton_scrape(R, R, E, R * 6000, R * 4000))
    from fragscope.cli.engines_cmd import triton_batching_cmd
    r = invoke(triton_batching_cmd, [str(a), str(b), "--config", str(cfg), "--interval", "60",
                                                 "--format", "json", "--fail-on", "warning"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    (f,) = out["findings"]
    assert f["id"] == "batching-misconfiguration" and out["model"] == "resnet"
    assert any("100 → 4000" in x for x in f["playbook"]["actions"])


def test_triton_batching_bad_inputs_exit_2(tmp_path):
    from fragscope.cli.engines_cmd import triton_batching_cmd
    cfg = tmp_path / "c.pbtxt"
    cfg.write_text("max_batch_size: 8 {")
    s = tmp_path / "s.prom"
    s.write_text(_triton_scrape(1, 1, 1, 1, 1))
    r = invoke(triton_batching_cmd, [str(s), "--config", str(cfg)])
    assert r.exit_code == 2
    cfg.write_text("max_batch_size: 8")
    r = invoke(triton_batching_cmd, [str(s), str(s), "--config", str(cfg)])
    assert r.exit_code == 2  # two unstamped scrapes without --interval
    r = invoke(triton_batching_cmd, [str(s), "--config", str(cfg), "--model", "nope"])
    assert r.exit_code == 0 and "could not judge" in r.output.lower()


def test_ort_profile_cli_on_a_gpu_profile(tmp_path):
    from fragscope.cli.engines_cmd import ort_profile_cmd
    ev = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 1000, "ph": "X", "args": {}}]
    t = 10
    for name, op, prov, dur in (("mm", "MatMul", "CUDAExecutionProvider", 100),
                                ("Memcpy", "MemcpyToHost", "CUDAExecutionProvider", 150),
                                ("nms", "NonMaxSuppression", "CPUExecutionProvider", 300),
                                ("Memcpy_1", "MemcpyFromHost", "CUDAExecutionProvider", 150),
                                ("add", "Add", "CUDAExecutionProvider", 50)):
        ev.append({"cat": "Node", "name": f"{name}_kernel_time", "ts": t, "dur": dur, "ph": "X",
                   "args": {"op_name": op, "provider": prov, "output_type_shape": [{"float": [1]}]}})
        t += dur
    p = tmp_path / "prof.json"
    p.write_text(json.dumps(ev))
    r = invoke(ort_profile_cmd, [str(p), "--format", "json"])
    assert r.exit_code == 1, r.output  # (300 + 300) / 1000 = 60 % of the run: critical
    out = json.loads(r.output)
    (f,) = out["findings"]
    assert f["id"] == "cpu-fallback" and f["severity"] == "critical"
    assert out["profile"]["median_run"]["copies"] == 2
    assert out["profile"]["median_run"]["copy_seconds"] == pytest.approx(300e-6)
    assert f["evidence"][0]["observed"] == pytest.approx(0.6)


@pytest.mark.parametrize("content", ["", "[1, 2", '{"traceEvents": 3}', "\x00\x01"])
def test_ort_profile_bad_files_exit_2(tmp_path, content):
    from fragscope.cli.engines_cmd import ort_profile_cmd
    p = tmp_path / "x.json"
    p.write_text(content)
    r = invoke(ort_profile_cmd, [str(p)])
    assert r.exit_code == 2


def test_subcommands_registered():
    assert {"ort-profile", "triton-batching"} <= set(diagnose_group.list_commands(None))
    assert all(diagnose_group.get_command(None, n) is not None for n in ("ort-profile", "triton-batching"))


def test_triton_batching_from_a_live_endpoint(tmp_path):
    """Two scrapes of a local Triton-like /metrics 0.3 s apart: rates from the live counters."""
    import http.server
    import threading

    from fragscope.cli.engines_cmd import triton_batching_cmd

    bodies = [_triton_scrape(0, 0, 0, 0, 0), _triton_scrape(600, 600, 600, 600 * 9000, 600 * 3000)]

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (bodies.pop(0) if bodies else "").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = tmp_path / "config.pbtxt"
        cfg.write_text('name: "resnet"\nmax_batch_size: 8\ninstance_group [ { count: 1 } ]\n')
        r = invoke(triton_batching_cmd, ["--url", f"http://127.0.0.1:{srv.server_port}/metrics", "--interval", "0.3",
                                         "--config", str(cfg), "--format", "json", "--fail-on", "never"])
    finally:
        srv.shutdown()
    out = json.loads(r.output)
    (f,) = out["findings"]
    assert f["evidence"][0]["observed"] == 1.0  # 600 inferences in 600 executions
    assert "dynamic_batching" in f["playbook"]["actions"][0]
    r = invoke(triton_batching_cmd, ["--url", "http://127.0.0.1:9/metrics", "--interval", "0.1", "--config", str(cfg)])
    assert r.exit_code == 2


def test_diagnose_scrape_judges_any_engine_from_one_scrape():
    from fragscope.cli.engines_cmd import scrape_cmd
    r = invoke(scrape_cmd, [str(DATA / "sglang_docs_production_metrics.prom"), "--format", "json",
                            "--fail-on", "info"])
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert [f["id"] for f in out["findings"]] == ["capacity-saturation"]
    assert out["signals"]["sources"]["requests_waiting"] == "sglang:num_queue_reqs"
    # TensorRT-LLM: the derived KV ratio reaches the pipeline through `derive`
    r = invoke(scrape_cmd, [str(DATA / "triton_trtllm_readme_nv_trt_llm.prom"), "--format", "json"])
    assert json.loads(r.output)["signals"]["sources"]["kv_cache_usage_ratio"] == "nv_trt_llm_kv_cache_used_ratio"


def test_diagnose_scrape_bad_input(tmp_path):
    from fragscope.cli.engines_cmd import scrape_cmd
    p = tmp_path / "x.prom"
    p.write_bytes(b"\x00\xff garbage\n")
    assert invoke(scrape_cmd, [str(p)]).exit_code == 2
    assert invoke(scrape_cmd, []).exit_code == 2
    assert invoke(scrape_cmd, [str(tmp_path / "none.prom")]).exit_code == 2


def test_ort_profile_cli_reads_a_verbose_log(tmp_path):
    from fragscope.cli.engines_cmd import ort_profile_cmd
    pre = "2026-12-01 15:06:20.693382382 [V:onnxruntime:, session_state.cc:1601 VerifyEachNodeIsAssignedToAnEp]"
    p = tmp_path / "s.log"
    p.write_text("\n".join([f"{pre} Node placements",
                            f"{pre}  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 3",
                            f"{pre}   MatMul (mm), MemcpyToHost (Memcpy), MemcpyFromHost (Memcpy_1)",
                            f"{pre}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1",
                            f"{pre}   TopK (topk)"]) + "\n")
    r = invoke(ort_profile_cmd, [str(p), "--format", "json", "--fail-on", "warning"])
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert out["placement"]["nodes_per_provider"] == {"CUDAExecutionProvider": 3, "CPUExecutionProvider": 1}
    assert out["placement"]["cpu_nodes"] == ["TopK (topk)"]
    assert out["findings"][0]["basis"] == "log"


def test_live_url_reads_a_triton_trtllm_page():
    """diagnose URL on a Triton / TensorRT-LLM /metrics page: recognised and read through the signal table."""
    from fragscope.agent.live import classify as page_kinds, parse_page

    text = (DATA / "triton_trtllm_readme_nv_trt_llm.prom").read_text(encoding="utf-8")
    assert "engine" in page_kinds(text)
    samples = parse_page(text, 1.0, page_kinds(text), "t", {})
    names = {s.name for s in samples}
    assert "nv_trt_llm_kv_cache_block_metrics" in names and "nv_trt_llm_request_metrics" in names


def test_agent_vllm_collector_reads_other_engines():
    """The agent's engine collector (--vllm URL) behind an SGLang or Triton endpoint keeps their signals."""
    from fragscope.collectors.vllm import parse_vllm_metrics

    text = (DATA / "triton_trtllm_readme_nv_trt_llm.prom").read_text(encoding="utf-8")
    names = {s.name for s in parse_vllm_metrics(text, 1.0)}
    assert {"nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"} <= names
