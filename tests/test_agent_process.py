"""The real agent process against real HTTP servers on 127.0.0.1 replaying recorded scrapes.

One replay server (tests/data/agent/replay.py) and one agent per module; the agent samples at
0.5 s. Faults are switched on the replay server while the agent runs.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.e2e  # real agent processes over HTTP: heavy, run by .ci/run

from fragscope.collectors.exposition import parse_text, read_recording

DATA = os.path.join(os.path.dirname(__file__), "data", "agent")
REPLAY = os.path.join(DATA, "replay.py")
CLI = [sys.executable, "-c", "from fragscope.cli import main; main()"]
DIAGNOSE = [sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def _json(url: str) -> tuple[int, dict]:
    code, body, _ = _get(url)
    return code, json.loads(body)


def _wait(pred, timeout: float = 20.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(every)
    raise AssertionError(f"condition not met in {timeout} s (last: {last!r})")


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    d = tmp_path_factory.mktemp("pod")
    p = subprocess.Popen([sys.executable, REPLAY, "--vllm", os.path.join(DATA, "vllm_cpu_0.32.0_before.txt"),
                          "--vllm", os.path.join(DATA, "vllm_cpu_0.32.0_after_preemption.txt"),
                          "--dcgm", os.path.join(DATA, "dcgm_l4_cncf.txt"), "--period", "3",
                          "--probe-dir", str(d / "probe"), "--log-file", str(d / "engine.log"),
                          "--slow", "20", "--max-seconds", "1800"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("PORT "), line
    base = f"http://127.0.0.1:{int(line.split()[1])}"
    yield base, d
    p.terminate()
    p.wait(timeout=10)


class Agent:
    def __init__(self, args: list[str], data_dir: str, port: int | None = None, env: dict | None = None):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.log = open(os.path.join(data_dir, f"agent-{self.port}.log"), "w+")
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen([*CLI, "agent", "--listen", f"127.0.0.1:{self.port}", "--data-dir", data_dir,
                                   "--interval", "0.5s", "--detect-interval", "2s", "--no-process", *args],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=e)
        _wait(lambda: _get(self.url + "/healthz")[0] == 200, 60)

    def logtext(self) -> str:
        self.log.flush()
        with open(self.log.name) as fh:
            return fh.read()

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> int:
        self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
            self.log.flush()
            tail = open(self.log.name, errors="replace").read()[-1500:]
            raise AssertionError(f"agent did not exit within {timeout:g} s of signal {sig}; log tail:\n{tail}")
        self.log.close()
        return rc


@pytest.fixture(scope="module")
def agent(replay, tmp_path_factory):
    base, d = replay
    data = str(tmp_path_factory.mktemp("agentdata"))
    a = Agent(["--vllm", base + "/vllm/metrics", "--dcgm", base + "/dcgm/metrics", "--probe-dir", str(d / "probe"),
               "--log-file", str(d / "engine.log"), "--nvml-recorded", os.path.join(DATA, "nvml_h100_idle_load.json")],
              data)
    _wait(lambda: _json(a.url + "/readyz")[0] == 200, 30)
    yield a
    if a.p.poll() is None:
        a.stop()


def _families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_exports_signals_health_and_derived(agent):
    code, body, ctype = _get(agent.url + "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    text = body.decode()
    fams = _families(text)  # prometheus_client's parser accepts it
    up = {s.labels["collector"]: s.value for s in fams["fragscope_collector_up"].samples}
    assert up == {"vllm": 1.0, "dcgm": 1.0, "nvml": 1.0, "torch": 1.0, "logs": 1.0}
    # the probe's fake process: reserved grows past allocated; the ratio is 1 - allocated/reserved
    fr = [s for s in fams["fragscope_torch_fragmentation_ratio"].samples if s.labels["pid"] == "4242"][0]
    alloc = [s for s in fams["fragscope_torch_allocated_bytes"].samples if s.labels["pid"] == "4242"][0].value
    res = [s for s in fams["fragscope_torch_reserved_bytes"].samples if s.labels["pid"] == "4242"][0].value
    assert fr.value == pytest.approx(1 - alloc / res) and 0 < fr.value < 0.5
    assert fr.labels["gpu"] == "0" and fr.labels["gpu_uuid"].startswith("GPU-")  # joinable with DCGM
    assert "fragscope_gpu_memory_used_bytes" in fams and "fragscope_store_size_bytes" in fams
    # the half-written record of pid 999 is skipped, not exported as zeros
    assert not any(s.labels.get("pid") == "999" for s in fams["fragscope_torch_allocated_bytes"].samples)
    assert "vllm:num_requests_running" not in text  # engine series come from the engine's own exporter
    ours = parse_text(text, time.time())  # our parser reads it too
    assert ours.types["fragscope_collector_errors_total"] == "counter"


def test_api_json_endpoints(agent):
    code, st = _json(agent.url + "/api/v1/status")
    assert code == 200 and st["ready"] is True
    assert st["pandas_loaded"] is False  # the agent's steady state stays out of pandas (RSS)
    assert st["requests_loaded"] is False  # nor requests (14.6 MB): http.client throughout
    assert {c["name"] for c in st["collectors"]} == {"vllm", "dcgm", "nvml", "torch", "logs"}
    code, f = _json(agent.url + "/api/v1/findings")
    assert code == 200 and "findings" in f and "inconclusive" in f
    _wait(lambda: _json(agent.url + "/api/v1/findings")[1]["status"] == "ok", 15)
    code, sig = _json(agent.url + "/api/v1/signals?names=vllm:num_preemptions_total,fragscope_gpu_memory_used_bytes"
                      "&start=-10m&end=now")
    assert code == 200
    names = {s["name"] for s in sig["series"]}
    assert names <= {"vllm:num_preemptions_total", "fragscope_gpu_memory_used_bytes"}
    _wait(lambda: len(_json(agent.url + "/api/v1/signals?names=vllm:num_preemptions_total&since=10m")[1]
                      ["series"]), 15)
    # the replayed scrapes change over time: preemptions 0 -> 68 once the second file is served
    _wait(lambda: max(_json(agent.url + "/api/v1/signals?names=vllm:num_preemptions_total&since=10m&step=0")[1]
                      ["series"][0]["values"]) == 68.0, 20)
    code, w = _json(agent.url + "/api/v1/window?since=10m")
    assert code == 200 and w["points"] > 0
    hist = [s for s in w["series"] if s["name"] == "vllm:time_to_first_token_seconds_bucket"]
    assert hist and hist[0]["type"] == "histogram"


@pytest.mark.parametrize("query,msg", [
    ("/api/v1/signals", "names"),
    ("/api/v1/signals?names=x&start=yesterday", "start"),
    ("/api/v1/signals?names=x&start=200&end=100", "after end"),
    ("/api/v1/window?since=forever", "since"),
    ("/api/v1/window?since=400d", "at most"),
    ("/api/v1/window?step=-5", "step"),
])
def test_api_bad_params_are_400_json(agent, query, msg):
    code, body = _json(agent.url + query)
    assert code == 400 and msg in body["error"]


def test_api_unknown_path_and_methods(agent):
    assert _json(agent.url + "/nope")[0] == 404
    req = urllib.request.Request(agent.url + "/api/v1/findings", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405


def test_faulty_vllm_marks_it_down_others_stay_up_logged_once(agent, replay):
    base, _ = replay

    def up(name):
        fams = _families(_get(agent.url + "/metrics")[1].decode())
        return {s.labels["collector"]: s.value for s in fams["fragscope_collector_up"].samples}.get(name)

    try:
        for mode in ("html", "garbage", "error"):
            _get(base + f"/control?mode={mode}")
            _wait(lambda: up("vllm") == 0.0, 20)
            assert up("dcgm") == 1.0 and up("torch") == 1.0
            _get(base + "/control?mode=ok")
            _wait(lambda: up("vllm") == 1.0, 70)  # backoff is capped at 60 s
    finally:
        _get(base + "/control?mode=ok")
    log = agent.logtext()
    assert "HTML" in log and log.count("collector vllm: down") <= 3  # once per change, not per tick
    assert agent.p.poll() is None


def test_slow_huge_and_down_endpoints_never_stall_the_agent(replay, tmp_path):
    base, d = replay
    dead = f"http://127.0.0.1:{_free_port()}/metrics"
    a = Agent(["--vllm", base + "/slow/metrics", "--vllm", base + "/huge/metrics", "--vllm", dead,
               "--dcgm", base + "/dcgm/metrics", "--probe-dir", str(tmp_path / "no-such-dir")], str(tmp_path),
              env={"FRAGSCOPE_VLLM_MAX_BYTES": "1MiB"})  # the env sets what no flag does
    try:
        def states():
            st = _json(a.url + "/api/v1/status")[1]
            return {c["name"]: c for c in st["collectors"]}
        s = _wait(lambda: (lambda x: x if x["dcgm"]["runs_total"] >= 6 and x["vllm_1"]["up"] is False
                           and x["vllm_2"]["up"] is False and x["torch"]["up"] is False else None)(states()), 30)
        assert "over the" in s["vllm_1"]["error"]  # huge body cut at the size cap
        assert "refused" in s["vllm_2"]["error"] or "connect" in s["vllm_2"]["error"]
        assert "does not exist" in s["torch"]["error"]
        # the slow one (20 s answer, 2 s timeout) is marked down while dcgm keeps its 0.5 s pace
        s = _wait(lambda: (lambda x: x if x["vllm_0"]["up"] is False else None)(states()), 15)
        assert s["dcgm"]["up"] is True
        # a scrape never waits on a collector: the slow one's answer takes 20 s, the scrape's own timeout is 10 s
        code, _, _ = _get(a.url + "/metrics", timeout=10.0)
        assert code == 200
        # every vLLM source down: not ready, whatever dcgm says (docs/agent.md#health)
        code, ready = _json(a.url + "/readyz")
        engine = [r for r in ready["reasons"] if r.startswith("engine source vllm_")]
        assert code == 503 and len(engine) == 3, ready
        assert any("over the" in r for r in engine) and any("connect" in r or "refused" in r for r in engine)
    finally:
        assert a.stop() == 0


@pytest.mark.e2e
def test_kill_9_and_restart_keeps_history(replay, tmp_path):
    base, d = replay
    args = ["--vllm", base + "/vllm/metrics", "--dcgm", base + "/dcgm/metrics"]
    env = {"FRAGSCOPE_STORE_FLUSH_INTERVAL": "0.5s"}  # commits every 0.5 s: the same contract, sooner
    a = Agent(args, str(tmp_path), env=env)
    q = "/api/v1/signals?names=DCGM_FI_DEV_FB_USED&since=1h&step=0"
    # wait past a few flushes so points are committed
    first = _wait(lambda: (lambda s: s if s["points"] >= 4 else None)(_json(a.url + q)[1]), 30)
    t_last = max(max(s["ts"]) for s in first["series"])
    a.p.kill()  # SIGKILL: no clean shutdown
    a.p.wait(timeout=10)
    b = Agent(args, str(tmp_path), port=a.port, env=env)
    try:
        after = _json(b.url + q)[1]
        ts = [t for s in after["series"] for t in s["ts"]]
        assert min(ts) <= first["series"][0]["ts"][0] and t_last in ts  # committed history survived
        _wait(lambda: max(t for s in _json(b.url + q)[1]["series"] for t in s["ts"]) > t_last + 1, 20)
        con_ok = _json(b.url + "/api/v1/status")[1]["store"]["degraded"] is None
        assert con_ok
    finally:
        assert b.stop() == 0
        b_log = b.logtext() if not b.log.closed else open(b.log.name).read()
        assert "Traceback" not in b_log


@pytest.mark.e2e
def test_diagnose_from_agent_and_record(agent, replay, tmp_path):
    base, _ = replay
    r = subprocess.run([*DIAGNOSE, "--agent", agent.url, "--format", "json", "--fail-on", "never"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["window"]["start"] is not None and "findings" in rep
    # unreachable agent: one line, exit 2
    r = subprocess.run([*DIAGNOSE, "--agent", f"http://127.0.0.1:{_free_port()}"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "refused" in r.stderr
    # record from the live replay server; diagnose and promtool read the file
    out = tmp_path / "incident.om"
    r = subprocess.run([*CLI, "record", "--vllm", base + "/vllm/metrics", "--dcgm", base + "/dcgm/metrics",
                        "--duration", "2s", "--interval", "0.5s", "-o", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    w = read_recording(str(out))
    assert len(w.select("vllm:num_requests_running")[0]) >= 4 and "DCGM_FI_DEV_FB_USED" in w.names()
    if shutil.which("promtool"):
        p = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(out), str(tmp_path / "db")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-400:]
    r = subprocess.run([*DIAGNOSE, str(out), "--format", "json", "--fail-on", "never"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["window"]["start"] is not None
    # diagnose a live server directly (no agent)
    r = subprocess.run([*DIAGNOSE, "--vllm", base + "/vllm/metrics", "--duration", "1s", "--interval", "0.5s",
                        "--format", "json", "--fail-on", "never"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"].startswith("live: ")
    # record from the agent's history
    out2 = tmp_path / "from-agent.om.gz"
    r = subprocess.run([*CLI, "record", "--agent", agent.url, "--since", "10m", "-o", str(out2)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "vllm:num_preemptions_total" in read_recording(str(out2)).names()


@pytest.mark.parametrize("args,msg", [
    (["record", "--vllm", "http://127.0.0.1:1/metrics", "--duration", "1s", "--interval", "0.5s", "-o", "x.om"],
     "connection refused"),  # found out before sampling, not after --duration
    (["record", "--duration", "1s", "-o", "x.om"], "nothing to record"),
    (["record", "--vllm", "http://127.0.0.1:1/metrics", "--duration", "soon", "-o", "x.om"], "--duration"),
    (["agent", "--listen", "127.0.0.1:99999"], "port"),
    (["agent", "--config", "/nonexistent.toml"], "no such config file"),
])
def test_cli_bad_input_one_line(tmp_path, args, msg):
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert msg in lines[-1] and "error:" in lines[-1] and "Traceback" not in r.stderr
    assert len(lines) <= 3  # progress ("sampling ...", one line per change of error), then the error
    assert not (tmp_path / "x.om").exists()  # no half-written recording


def test_agent_port_in_use_is_one_line(agent, tmp_path):
    r = subprocess.run([*CLI, "agent", "--listen", f"127.0.0.1:{agent.port}", "--data-dir", str(tmp_path),
                        "--no-process", "--no-nvml"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_print_config_from_env_and_file(tmp_path):
    f = tmp_path / "a.toml"
    f.write_text('[vllm]\nurls = ["http://engine:8000/metrics"]\n[detect]\ninterval = "45s"\n')
    env = dict(os.environ, FRAGSCOPE_LISTEN="127.0.0.1:9555", FRAGSCOPE_CONFIG=str(f))
    r = subprocess.run([*CLI, "agent", "--print-config", "--interval", "3s"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert 'listen = "127.0.0.1:9555"  # env' in r.stdout and "interval = 3  # flag" in r.stdout
    assert 'urls = ["http://engine:8000/metrics"]  # file' in r.stdout and "interval = 45  # file" in r.stdout


_FAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
                              "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
                              "/usr/lib/faketime/libfaketimeMT.so.1") if os.path.exists(p)), None)


@pytest.mark.e2e
@pytest.mark.skipif(_FAKETIME is None, reason="libfaketime not installed (Debian package faketime; .ci/run installs it)")
def test_wall_clock_jumps_keep_history_and_detection(tmp_path):
    """The real agent under libfaketime: its wall clock is stepped back 2 h, then forward again,
    while it runs (the monotonic clock is left alone, as on a real host when NTP steps the time).

    Its only source is the recorded NVML backend (a file), not the module's replay server: that
    server stops after its --max-seconds, and this test, last in the module, used to outlive it on a
    loaded machine, see every collector refused and fail after its waits (~80 s). History is
    flushed every 0.5 s (not 5 s) and sampled every 0.2 s, so each wait below lasts about a second.
    """
    clock = tmp_path / "faketime.rc"
    clock.write_text("+0\n")
    env = {"LD_PRELOAD": _FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FRAGSCOPE_STORE_FLUSH_INTERVAL": "0.5s"}
    a = Agent(["--nvml-recorded", os.path.join(DATA, "nvml_h100_idle_load.json"), "--interval", "0.2s",
               "--detect-interval", "0.5s"], str(tmp_path), env=env)
    t0 = time.time()
    # an absolute range around the real time: after the jump back "now" is 2 h earlier
    q = (f"/api/v1/signals?names=fragscope_gpu_memory_used_bytes&start={t0 - 4 * 3600:.0f}"
         f"&end={t0 + 3600:.0f}&step=0")

    def stored() -> list[float]:
        return sorted(t for s in _json(a.url + q)[1]["series"] for t in s["ts"])

    def status() -> dict:
        return _json(a.url + "/api/v1/status")[1]
    try:
        before = _wait(lambda: (lambda ts: ts if len(ts) >= 6 else None)(stored()), 30)  # committed (0.5 s flush)
        assert status()["clock"]["jumps"] == 0
        clock.write_text("-2h\n")
        _wait(lambda: status()["clock"]["jumps"] == 1, 15)
        st = status()
        assert -7300 < st["clock"]["last_jump_seconds"] < -7100
        # sampling goes on; new points carry the new (earlier) time; nothing stored before is lost
        back = _wait(lambda: (lambda ts: ts if sum(t < before[0] - 3600 for t in ts) >= 6 else None)(stored()), 30)
        assert set(before) <= set(back)
        runs = status()["detector"]["runs"]
        _wait(lambda: status()["detector"]["runs"] >= runs + 2, 15)
        st = status()
        assert st["detector"]["errors"] == 0 and all(c["up"] for c in st["collectors"])
        code, rep = _json(a.url + "/api/v1/findings")
        assert code == 200 and rep["status"] == "ok"
        clock.write_text("+0\n")  # NTP steps it forward again
        _wait(lambda: status()["clock"]["jumps"] == 2, 15)
        assert 7100 < status()["clock"]["last_jump_seconds"] < 7300
        fwd = _wait(lambda: (lambda ts: ts if ts[-1] > before[-1] + 1 else None)(stored()), 30)
        assert set(back) <= set(fwd)
        code, body, _ = _get(a.url + "/metrics")
        assert b"fragscope_agent_clock_jumps_total 2.0" in body
    finally:
        assert a.stop() == 0
    log = a.logtext() if not a.log.closed else open(a.log.name).read()
    assert "Traceback" not in log
    jumps = [ln for ln in log.splitlines() if "wall clock jumped" in ln]
    assert len(jumps) == 2, jumps  # once per jump, not once per collector or tick
    assert "-72" in jumps[0] and "+72" in jumps[1]
