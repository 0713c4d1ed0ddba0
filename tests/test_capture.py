"""Captures triggered by findings: the probe snapshot protocol (a real Probe with a stand-in torch,
and a hand-written probe thread), vLLM's /start_profile and /stop_profile on a real HTTP server on
127.0.0.1, the per-hour and size budgets, and `fragscope capture`."""
from __future__ import annotations

import json
import os
import pickle
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fragscope.agent.capture import CaptureError, CaptureManager, dir_bytes
from fragscope.model import Finding, Severity

from cli_helpers import cli  # in process through the CLI's own entry (fragscope.cli.cli_exit_code)

MiB = 1 << 20


def snapshot_dict() -> dict:
    """A small modern-format snapshot: one 20 MiB segment, 8 MiB allocated, 12 MiB free."""
    blocks = [{"address": 0x7F0000000000, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
               "frames": []},
              {"address": 0x7F0000800000, "size": 12 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": 0x7F0000000000, "total_size": 20 * MiB, "allocated_size": 8 * MiB,
           "active_size": 8 * MiB, "requested_size": 8 * MiB, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [seg], "device_traces": [[]], "allocator_settings": {}, "external_annotations": []}


class HandProbe:
    """The probe side of docs/captures.md, written out by hand: answer each request once per pid."""

    def __init__(self, d: Path, pids=(111, 222), fail_pid=None, delay=0.05):
        self.d, self.pids, self.fail_pid, self.delay = d, pids, fail_pid, delay
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            for name in os.listdir(self.d):
                if name.startswith("request-snapshot-") and name.endswith(".json") and name not in self.seen:
                    self.seen.add(name)
                    rid = name[len("request-snapshot-"):-5]
                    req = json.loads((self.d / name).read_text())
                    assert req["id"] == rid
                    for pid in self.pids:
                        time.sleep(self.delay)
                        status = {"pid": pid, "id": rid, "ok": pid != self.fail_pid, "error": None}
                        if pid == self.fail_pid:
                            status["error"] = "memory history recording is off in this process"
                        else:
                            tmp = self.d / f".snapshot-{pid}-{rid}.pickle.tmp"
                            tmp.write_bytes(pickle.dumps(snapshot_dict()))
                            os.replace(tmp, self.d / f"snapshot-{pid}-{rid}.pickle")
                        tmp = self.d / f".snapshot-{pid}-{rid}.json.tmp"
                        tmp.write_text(json.dumps(status))
                        os.replace(tmp, self.d / f"snapshot-{pid}-{rid}.json")
            time.sleep(0.01)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.t.join(5)


def manager(tmp_path, **kw) -> CaptureManager:
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    kw.setdefault("probe_dir", str(probe))
    kw.setdefault("snapshot_timeout", 3.0)
    kw.setdefault("snapshot_grace", 0.2)
    kw.setdefault("poll_interval", 0.01)
    return CaptureManager(str(tmp_path / "out"), **kw)


# ---------------------------------------------------------------------------------------------
def test_snapshot_through_hand_probe(tmp_path):
    m = manager(tmp_path)
    with HandProbe(tmp_path / "probe", pids=(111, 222), fail_pid=222):
        att = m.capture("snapshot", time.time())
    assert att["ok"] and att["kind"] == "snapshot"
    assert [Path(p).name for p in att["paths"]] == [f"snapshot-111-{att['id']}.pickle"]
    assert all(Path(p).parent == tmp_path / "out" / att["id"] for p in att["paths"])
    assert "pid 222: memory history recording is off" in att["error"]
    files = [f for f in (tmp_path / "out" / att["id"]).iterdir() if f.name != "capture.json"]
    assert att["bytes"] > 0 and att["bytes"] == sum(f.stat().st_size for f in files)  # artefacts, not capture.json
    assert "pid 111:" in att["verdict"]
    # the request is withdrawn and the probe directory left clean
    assert sorted(os.listdir(tmp_path / "probe")) == []
    saved = json.loads((tmp_path / "out" / att["id"] / "capture.json").read_text())
    assert saved["id"] == att["id"] and saved["verdict"] == att["verdict"]


def test_snapshot_analysed_when_detector_present(tmp_path):
    pytest.importorskip("fragscope.detectors.snapshot")
    m = manager(tmp_path)
    with HandProbe(tmp_path / "probe", pids=(111,)):
        att = m.capture("snapshot", time.time())
    assert att["ok"] and "analysis unavailable" not in att["verdict"] and "analysis failed" not in att["verdict"]
    assert isinstance(att["summary"]["111"], dict) and "devices" in att["summary"]["111"]


def test_snapshot_through_real_probe(tmp_path):
    core = pytest.importorskip("fragscope.probe.core")
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()

    def dump(path):
        Path(path).write_bytes(pickle.dumps(snapshot_dict()))

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(_dump_snapshot=dump)),
                                  _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: False))
    p = core.Probe(str(probe_dir), interval_s=1.0, modules={})
    p.pid = 4242
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            p.handle_snapshot_requests(torch)
            time.sleep(0.02)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        m = manager(tmp_path)
        att = m.capture("snapshot", time.time())
    finally:
        stop.set()
        t.join(5)
    # history recording is off, but the request says segments_only_ok: the probe dumps segments anyway
    assert att["ok"], att
    assert Path(att["path"]).name == f"snapshot-4242-{att['id']}.pickle"


def test_snapshot_timeout_when_no_probe_answers(tmp_path):
    m = manager(tmp_path, snapshot_timeout=0.3)
    att = m.capture("snapshot", time.time())
    assert not att["ok"] and "no snapshot from the probe within" in att["error"]
    assert os.listdir(tmp_path / "probe") == []  # request withdrawn


def test_snapshot_probe_dir_missing_is_a_failed_capture(tmp_path):
    m = CaptureManager(str(tmp_path / "out"), probe_dir=str(tmp_path / "absent"))
    att = m.capture("snapshot", time.time())
    assert not att["ok"] and "does not exist" in att["error"]
    with pytest.raises(CaptureError):
        CaptureManager(str(tmp_path / "out")).capture("snapshot", time.time())  # no probe configured
    with pytest.raises(CaptureError):
        m.capture("heap", time.time())


# ---------------------------------------------------------------------------------------------
# vLLM profiler endpoints on a real HTTP server
KINETO = {"schemaVersion": 1, "traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1000.0, "dur": 50.0,
     "args": {"device": 0, "stream": 7, "correlation": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": 990.0, "dur": 5.0,
     "args": {"correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1200.0, "dur": 50.0,
     "args": {"device": 0, "stream": 7, "correlation": 2}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": 1190.0, "dur": 5.0,
     "args": {"correlation": 2}}]}


class FakeVllm:
    """/start_profile and /stop_profile as vLLM serves them; stop writes a trace, in two steps."""

    def __init__(self, trace_dir: Path, status: int = 200):
        self.trace_dir, self.status, self.calls = trace_dir, status, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.calls.append(self.path)
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.end_headers()
                    return
                if self.path == "/stop_profile":
                    outer.write_trace()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.t = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def write_trace(self):
        # torch's tensorboard_trace_handler names: <worker>.<ms>.pt.trace.json[.gz]; written after stop returns
        def later():
            p = self.trace_dir / f"host_123.{int(time.time() * 1000)}.pt.trace.json"
            data = json.dumps(KINETO).encode()
            with open(p, "wb") as fh:
                fh.write(data[:40])
                fh.flush()
                time.sleep(0.3)
                fh.write(data[40:])
        threading.Thread(target=later, daemon=True).start()

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.srv.shutdown()
        self.srv.server_close()


def test_profile_capture(tmp_path):
    tdir = tmp_path / "traces"
    tdir.mkdir()
    old = tdir / "old.pt.trace.json"
    old.write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # an earlier profile: never picked
    with FakeVllm(tdir) as srv:
        m = CaptureManager(str(tmp_path / "out"), vllm_urls=[srv.url + "/"], profiler_dir=str(tdir),
                           profile_seconds=0.1, trace_timeout=5.0, poll_interval=0.05)
        att = m.capture("profile", time.time())
    assert srv.calls == ["/start_profile", "/stop_profile"]
    assert att["ok"], att
    assert Path(att["path"]).name.startswith("host_123.") and Path(att["source_path"]).parent == tdir
    assert json.loads(Path(att["path"]).read_text()) == KINETO  # complete, not the half-written file
    assert Path(att["source_path"]).exists()  # copied, the engine's file left in place
    assert isinstance(att["verdict"], str) and att["verdict"]
    # the profile's kernel gaps become signals the agent records (fragscope_kernel_gap_seconds)
    samples = m.pop_samples()
    names = {s.name for s in samples}
    assert "fragscope_kernel_gap_seconds" in names or "fragscope_gpu_idle_ratio" in names, samples
    assert all(s.ts == att["captured_at"] for s in samples)
    assert m.pop_samples() == []  # drained


def test_profile_not_enabled_and_unreachable(tmp_path):
    with FakeVllm(tmp_path, status=404) as srv:
        m = CaptureManager(str(tmp_path / "out"), vllm_urls=[srv.url], profiler_dir=str(tmp_path),
                           profile_seconds=0.05, http_timeout=2.0)
        att = m.capture("profile", time.time())
    assert not att["ok"] and "profiler is not enabled" in att["error"] and srv.calls == ["/start_profile"]
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    m = CaptureManager(str(tmp_path / "out2"), vllm_urls=[f"http://127.0.0.1:{port}"], http_timeout=1.0)
    att = m.capture("profile", time.time())
    assert not att["ok"] and "cannot reach" in att["error"]


def test_profile_without_profiler_dir_says_where_to_look(tmp_path):
    with FakeVllm(tmp_path) as srv:
        m = CaptureManager(str(tmp_path / "out"), vllm_urls=[srv.url], profile_seconds=0.05)
        att = m.capture("profile", time.time())
    assert not att["ok"] and "--profiler-dir" in att["error"] and srv.calls == ["/start_profile", "/stop_profile"]


# ---------------------------------------------------------------------------------------------
# triggering and budgets
def finding(fid="allocator-fragmentation", gpu="0", sev=Severity.WARNING) -> Finding:
    return Finding(fid, sev, 0.8, "x", subject={"gpu": gpu})


def test_on_findings_once_per_episode_and_hourly_budget(tmp_path):
    m = manager(tmp_path, max_per_hour=2, rearm_seconds=600)
    t0 = time.time()
    with HandProbe(tmp_path / "probe", pids=(111,)):
        a = m.on_findings([finding(gpu="0"), finding("kv-cache-pressure")], t0)
        assert [x["finding"] for x in a] == ["allocator-fragmentation"] and a[0]["subject"] == {"gpu": "0"}
        assert m.on_findings([finding(gpu="0")], t0 + 30) == []  # same ongoing finding: no second capture
        assert m.attachments_for(finding(gpu="0"))[0]["id"] == a[0]["id"]
        assert len(m.on_findings([finding(gpu="1")], t0 + 60)) == 1  # another GPU: a new episode
        assert m.budget_left(t0 + 61) == 0
        assert m.on_findings([finding(gpu="2")], t0 + 90) == [] and m.budget_skips == 1  # budget used
        assert m.on_findings([finding(gpu="0", sev=Severity.INFO)], t0 + 100) == []
        # an hour later the waiting finding (still active) gets its capture
        b = m.on_findings([finding(gpu="2")], t0 + 3700)
        assert len(b) == 1 and b[0]["subject"] == {"gpu": "2"}
        # gpu 0 was absent for > rearm_seconds: when it comes back it is a new episode
        c = m.on_findings([finding(gpu="0")], t0 + 3800)
        assert len(c) == 1 and c[0]["id"] != a[0]["id"]


def test_one_capture_shared_by_findings_of_one_run(tmp_path):
    m = manager(tmp_path, triggers={"allocator-fragmentation": ["snapshot"], "memory-leak": ["snapshot"]})
    with HandProbe(tmp_path / "probe", pids=(111,)):
        a = m.on_findings([finding(), finding("memory-leak")], time.time())
    assert [x["finding"] for x in a] == ["allocator-fragmentation", "memory-leak"]
    assert a[0]["id"] == a[1]["id"] and len(os.listdir(tmp_path / "out")) == 1


def test_size_budget_deletes_oldest(tmp_path):
    m = manager(tmp_path, max_bytes=10**9)
    with HandProbe(tmp_path / "probe", pids=(111,)):
        m.capture("snapshot", time.time() - 120)
        second = m.capture("snapshot", time.time() - 60)
    one = dir_bytes(str(tmp_path / "out" / second["id"]))  # artefacts + capture.json
    m.max_bytes = one + one // 2  # room for one capture only
    with HandProbe(tmp_path / "probe", pids=(111,)):
        third = m.capture("snapshot", time.time())
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == [third["id"]] and "deleted" not in third
    m.max_bytes = 10  # smaller than any capture: even the new one goes, its verdict stays
    with HandProbe(tmp_path / "probe", pids=(111,)):
        fourth = m.capture("snapshot", time.time())
    assert fourth["deleted"] and fourth["path"] is None and "exceed the capture budget" in fourth["verdict"]
    assert os.listdir(tmp_path / "out") == []


def test_budget_survives_restart(tmp_path):
    out = tmp_path / "out"
    now = time.time()
    for i in range(3):
        (out / time.strftime(f"%Y%m%dT%H%M%SZ-snapshot-00000{i}", time.gmtime(now - 100 * i))).mkdir(parents=True)
    (out / time.strftime("%Y%m%dT%H%M%SZ-profile-abcdef", time.gmtime(now - 7200))).mkdir()
    m = CaptureManager(str(out), probe_dir=str(tmp_path), max_per_hour=4)
    assert m.budget_left(now) == 1


# ---------------------------------------------------------------------------------------------
def run_cli(*args):
    """``fragscope ARGS`` in process through the CLI's own entry (fragscope.cli.cli_exit_code)."""
    return cli(*args, prog="fragscope")


def test_cli_capture_snapshot(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    with HandProbe(probe, pids=(7,)):
        p = run_cli("capture", "--kind", "snapshot", "--probe-dir", str(probe), "--out", str(tmp_path / "out"),
                    "--timeout", "10", "--format", "json")
    assert p.returncode == 0, p.stderr
    att = json.loads(p.stdout)
    assert att["ok"] and Path(att["path"]).exists()


@pytest.mark.parametrize("args,expect", [
    (["--kind", "snapshot"], "needs --probe-dir"),
    (["--kind", "profile"], "needs --vllm"),
    (["--kind", "snapshot", "--probe-dir", "PROBE", "--timeout", "0.3"], "no snapshot from the probe"),
])
def test_cli_capture_errors_one_line(tmp_path, args, expect):
    (tmp_path / "probe").mkdir()
    args = [a.replace("PROBE", str(tmp_path / "probe")) for a in args]
    p = run_cli("capture", "--out", str(tmp_path / "out"), *args)
    assert p.returncode == 2 and expect in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_capture_profile_takes_the_metrics_url_or_host_port(tmp_path):
    """`fragscope capture --kind profile --vllm host:port/metrics`: the profiler paths hang off the server's
    base URL, found by the same resolver as every other command."""
    tdir = tmp_path / "traces"
    tdir.mkdir()
    with FakeVllm(tdir) as srv:
        addr = srv.url.split("://", 1)[1] + "/metrics"  # host:port/metrics, no scheme
        run_cli("capture", "--kind", "profile", "--vllm", addr, "--profiler-dir", str(tdir),
                "--seconds", "100ms", "--timeout", "1s", "--out", str(tmp_path / "out"), "--format", "json")
    assert srv.calls[:2] == ["/start_profile", "/stop_profile"]
