"""The agent under hostile input: bodies capped while they stream (bytes and lines, gzip inflated in
pieces), history queries one at a time and streamed, probe files never read through a planted link."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from fragscope.agent.api import iter_window_json, window_to_json
from fragscope.agent.capture import CaptureManager, UnsafeFile, take_file, trusted_uids
from fragscope.agent.store import Store, TooManyPoints
from fragscope.collectors.http import FetchError, http_get
from fragscope.model import Sample, SeriesKey, Window

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "data", "agent", "vllm_v1_cncf.txt")


# --- bodies --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pages():
    with open(V1, "rb") as fh:
        real = fh.read()
    bodies = {
        "/real.gz": (gzip.compress(real * 40), "gzip"),  # 2.1 MB once inflated, 8x the inflate piece
        "/newlines.gz": (zlib.compress(b"\n" * (8 << 20)), "deflate"),  # 8 MiB of bare newlines
    }

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            body, enc = bodies[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Encoding", enc)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", real
    srv.shutdown()
    srv.server_close()


def test_gzip_body_inflated_in_pieces_is_exact(pages):
    base, real = pages
    text = http_get(base + "/real.gz", timeout_s=10, max_bytes=4 << 20)
    assert text.encode() == real * 40


def test_newline_bomb_stops_at_the_line_cap(pages):
    base, _ = pages
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=r"more than 262144 lines"):
        http_get(base + "/newlines.gz", timeout_s=10, max_bytes=1 << 20)  # default: one line per 4 bytes
    with pytest.raises(FetchError, match=r"more than 1000 lines"):
        http_get(base + "/newlines.gz", timeout_s=10, max_bytes=4 << 20, max_lines=1000)
    assert time.monotonic() - t0 < 5


# --- history queries -----------------------------------------------------------------------------
def _window() -> Window:
    ts = 1.7e9 + np.arange(20_000, dtype=np.float64) * 0.5  # more than two 8192-point blocks
    cols = {SeriesKey("vllm:num_requests_waiting", (("engine", "0"),)): (ts, np.sin(ts) * 10),
            SeriesKey("fragscope_gpu_memory_used_bytes", (("gpu", "0"),)): (ts[:3], np.array([1e9, 2e9, 3e9]))}
    return Window.from_columns(cols, source="test")


def test_streamed_window_json_is_the_same_document():
    w = _window()
    streamed = json.loads(b"".join(iter_window_json(w)))
    assert streamed == json.loads(json.dumps(window_to_json(w)))
    assert streamed["points"] == 20_003 and len(streamed["series"][1]["ts"]) == 20_000
    part = json.loads(b"".join(iter_window_json(w, start=5.0, end=6.0)))
    assert (part["start"], part["end"]) == (5.0, 6.0)


def test_store_query_reads_in_blocks_and_stops_at_the_bound(tmp_path):
    st = Store(str(tmp_path / "h.sqlite"))
    t0 = time.time() - 3600
    st.append(Sample("vllm:num_requests_waiting", (), t0 + i * 0.1, float(i % 13)) for i in range(30_000))
    st.flush()
    w = st.query(None, t0 - 1, t0 + 4000, max_points=30_000)
    s = w.series[SeriesKey("vllm:num_requests_waiting", ())]
    assert len(s) == 30_000 and s.values[12] == 12.0 and s.values[13] == 0.0
    assert np.allclose(s.ts[:3], [t0, t0 + 0.1, t0 + 0.2], atol=1e-3)
    with pytest.raises(TooManyPoints):
        st.query(None, t0 - 1, t0 + 4000, max_points=20_000)
    st.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_history_queries_one_at_a_time_then_503(monkeypatch, tmp_path):
    import fragscope.agent.api as api
    from fragscope.agent.config import load_config
    from fragscope.agent.daemon import Agent

    monkeypatch.setattr(api, "HEAVY_WAIT_S", 0.2)
    port = _free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "data_dir": str(tmp_path), "interval": "1s"})
    ag = Agent(cfg, collectors=[], detect=lambda w: None)
    ag.start()
    try:
        slots = ag.server.RequestHandlerClass.heavy_slots
        assert slots.acquire(timeout=1)  # a query in flight
        try:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/window?since=1h", timeout=5)
                raise AssertionError("expected 503")
            except urllib.error.HTTPError as e:
                assert e.code == 503 and e.headers["Retry-After"] == "1"
                assert "another history query is running" in json.loads(e.read())["error"]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert r.status == 200  # scrapes are not history queries: never held
        finally:
            slots.release()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/window?since=1h", timeout=5) as r:
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            d = json.loads(r.read())
        assert d["points"] == 0 and d["series"] == []
    finally:
        ag.close()


# --- probe files ---------------------------------------------------------------------------------
def test_take_file_refuses_links_fifos_strangers_and_hard_links(tmp_path):
    me = frozenset({os.geteuid()})
    secret = tmp_path / "unrelated.json"
    secret.write_text(json.dumps({"db_password": "x", "api_key": "y"}))
    good = tmp_path / "snapshot-1-a.json"
    good.write_text('{"ok": true}')
    assert take_file(str(good), str(tmp_path / "copy.json"), me, remove=True) == len('{"ok": true}')
    assert not good.exists() and (tmp_path / "copy.json").read_text() == '{"ok": true}'

    link = tmp_path / "snapshot-2-a.json"
    link.symlink_to(secret)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        take_file(str(link), str(tmp_path / "c2"), me)
    fifo = tmp_path / "snapshot-3-a.pickle"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(UnsafeFile, match="not a regular file"):
        take_file(str(fifo), str(tmp_path / "c3"), me)  # no writer: must not block
    assert time.monotonic() - t0 < 1
    with pytest.raises(UnsafeFile, match=r"owned by uid \d+, expected one of \[4242\]"):
        take_file(str(secret), str(tmp_path / "c4"), frozenset({4242}))
    hard = tmp_path / "snapshot-5-a.json"
    os.link(secret, hard)
    with pytest.raises(UnsafeFile, match="2 hard links"):
        take_file(str(hard), str(tmp_path / "c5"), me)
    with pytest.raises(UnsafeFile, match="over the 10 byte limit"):
        take_file(str(tmp_path / "copy.json"), str(tmp_path / "c6"), me, max_bytes=10)
    assert not any((tmp_path / f"c{i}").exists() for i in range(2, 7))
    assert trusted_uids(str(tmp_path)) == me | {os.stat(tmp_path).st_uid}


def test_snapshot_capture_never_reads_through_planted_links(tmp_path):
    """Someone who can write to the probe directory answers the request with links to an unrelated
    JSON file: the capture fails naming the link; nothing of that file reaches the verdict."""
    probe = tmp_path / "probe"
    probe.mkdir()
    secret = tmp_path / "unrelated.json"
    secret.write_text(json.dumps({"db_password": "hunter2", "ok": True}))
    stop = threading.Event()

    def planter():
        while not stop.is_set():
            for name in os.listdir(probe):
                if name.startswith("request-snapshot-") and name.endswith(".json"):
                    rid = name[len("request-snapshot-"):-5]
                    for ext in ("pickle", "json"):
                        p = probe / f"snapshot-777-{rid}.{ext}"
                        if not os.path.lexists(p):
                            p.symlink_to(secret)
            time.sleep(0.01)
    t = threading.Thread(target=planter, daemon=True)
    t.start()
    try:
        cm = CaptureManager(str(tmp_path / "out"), probe_dir=str(probe), snapshot_timeout=3.0, snapshot_grace=0.2,
                            poll_interval=0.01)
        att = cm.capture("snapshot", time.time())
    finally:
        stop.set()
        t.join(5)
    text = json.dumps(att)
    assert att["ok"] is False and "symbolic link; refused" in att["error"]
    assert "hunter2" not in text and "db_password" not in text
    assert secret.read_text().startswith('{"db_password"')  # the target is untouched


def test_snapshot_capture_still_takes_the_probes_real_files(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            for name in os.listdir(probe):
                if name.startswith("request-snapshot-") and name.endswith(".json"):
                    rid = name[len("request-snapshot-"):-5]
                    if not (probe / f"snapshot-5-{rid}.json").exists():
                        (probe / f"snapshot-5-{rid}.pickle").write_bytes(pickle.dumps({"segments": []}))
                        (probe / f"snapshot-5-{rid}.json").write_text(json.dumps({"pid": 5, "ok": True}))
            time.sleep(0.01)
    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        cm = CaptureManager(str(tmp_path / "out"), probe_dir=str(probe), snapshot_timeout=3.0, snapshot_grace=0.2,
                            poll_interval=0.01)
        att = cm.capture("snapshot", time.time())
    finally:
        stop.set()
        t.join(5)
    assert att["ok"] is True, att
    assert os.path.basename(att["path"]).startswith("snapshot-5-") and os.path.isfile(att["path"])
    assert not os.path.islink(att["path"]) and os.stat(att["path"]).st_mode & 0o777 == 0o600
    assert [n for n in os.listdir(probe) if n.startswith("snapshot-")] == []  # handed over


def test_trim_gives_freed_heap_memory_back():
    """Freed memory in the middle of the heap (a pinned object every 50) stays resident until
    malloc_trim; the agent trims after large bodies and history queries (agent/memory.py)."""
    from fragscope.agent import memory

    if memory._glibc() is None or memory.rss_bytes() is None:
        pytest.skip("glibc malloc and /proc needed")
    memory.trim()
    base = memory.rss_bytes()
    objs = [bytearray(2048) for _ in range(40_000)]  # ~80 MB of 2 KiB blocks (malloc, under the mmap threshold)
    for i, o in enumerate(objs):
        o[::512] = b"\x01" * len(o[::512])  # touch every page
    pinned = objs[::50]
    grown = memory.rss_bytes()
    del objs
    held = memory.rss_bytes()
    assert memory.trim() is True
    after = memory.rss_bytes()
    assert grown - base > 60e6
    assert held - after > 40e6, (base, grown, held, after)  # trim returned most of what was freed
    assert len(pinned) == 800


@pytest.mark.e2e  # waits out the agent's Retry-After
def test_diagnose_agent_client_retries_while_the_agent_is_busy(monkeypatch):
    import fragscope.agent.api as api
    from fragscope.agent.client import fetch_window
    from fragscope.agent.config import load_config
    from fragscope.agent.daemon import Agent
    from fragscope.model import CollectResult

    class Gpu:
        def collect(self, now):
            return CollectResult(samples=[Sample("fragscope_gpu_memory_used_bytes", (("gpu", "0"),), now, 1e9)])

    monkeypatch.setattr(api, "HEAVY_WAIT_S", 0.2)
    port = _free_port()
    cfg = load_config(None, {}, {"listen": f"127.0.0.1:{port}", "store.enabled": False, "interval": "0.2s",
                                 "detect.step": "1s"})
    ag = Agent(cfg, collectors=[("nvml", "nvml", Gpu(), 0.2, 2.0)], detect=lambda w: None)
    ag.start()
    try:
        deadline = time.monotonic() + 10
        while ag.state.ring.points() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        slots = ag.server.RequestHandlerClass.heavy_slots
        assert slots.acquire(timeout=1)
        threading.Timer(0.6, slots.release).start()  # busy for 0.6 s: the first answer is a 503
        t0 = time.monotonic()
        w = fetch_window(f"http://127.0.0.1:{port}", 600)
        waited = time.monotonic() - t0
    finally:
        ag.close()
    assert 0.6 <= waited < 8 and len(w.series[SeriesKey("fragscope_gpu_memory_used_bytes", (("gpu", "0"),))]) >= 3


def test_capture_probe_uids_setting():
    from fragscope.agent.config import ConfigError, load_config

    cfg = load_config(None, {"FRAGSCOPE_CAPTURE_PROBE_UIDS": "1000, 1001"}, {})
    assert cfg.capture_probe_uids == [1000, 1001] and "probe_uids = [1000, 1001]" in cfg.to_toml()
    assert load_config(None, {}, {}).capture_probe_uids == []
    with pytest.raises(ConfigError, match="capture.probe_uids .*expected user ids"):
        load_config(None, {"FRAGSCOPE_CAPTURE_PROBE_UIDS": "root"}, {})
