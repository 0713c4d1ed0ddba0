"""The real agent process against a real two-process engine (tests/data/newdiag/mini_engine.py: an API
process serving vLLM-named /metrics, an engine-core child burning CPU per token) placed in a real cgroup:

(a) a CPU quota on the engine's cgroup under load: engine-cpu-starved with the throttled share; the same
    load without a quota stays quiet;
(b) the engine core stopped with SIGSTOP under load: engine-stalled within 30 s, cleared after SIGCONT;
(c) the engine's memory cgroup limit approached: host-memory-pressure.

The agent finds the engine's cgroup from its pid (/proc/PID/cgroup). Needs root and a writable cgroup v1
``cpu`` / ``memory`` controller or cgroup v2 with those controllers; skipped otherwise. Everything started
here is stopped and every cgroup removed in finally blocks.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from net_helpers import free_port

pytestmark = pytest.mark.e2e

HERE = os.path.dirname(__file__)
ENGINE = os.path.join(HERE, "data", "newdiag", "mini_engine.py")
CLI = [sys.executable, "-c", "from fragscope.cli import main; main()"]
ROOT = "/sys/fs/cgroup"




class Cgroup:
    """A fresh cgroup (v1: one directory per controller; v2: one directory) removed on close."""

    def __init__(self, controllers: tuple[str, ...]) -> None:
        self.name = f"fragscope-e2e-{os.getpid()}-{int(time.time() * 1000) % 10**6}"
        self.dirs: dict[str, str] = {}
        if all(os.path.exists(os.path.join(ROOT, c, "cgroup.procs")) for c in controllers):
            for c in controllers:
                d = os.path.join(ROOT, c, self.name)
                os.mkdir(d)
                self.dirs[c] = d
            self.version = 1
        elif os.path.exists(os.path.join(ROOT, "cgroup.controllers")) and set(controllers) <= set(
                open(os.path.join(ROOT, "cgroup.subtree_control")).read().split()):
            d = os.path.join(ROOT, self.name)
            os.mkdir(d)
            self.dirs = {c: d for c in controllers}
            self.version = 2
        else:
            raise OSError("no writable cgroup with " + ", ".join(controllers))

    def write(self, controller: str, name: str, value: str) -> None:
        with open(os.path.join(self.dirs[controller], name), "w") as fh:
            fh.write(value)

    def read(self, controller: str, name: str) -> str:
        with open(os.path.join(self.dirs[controller], name)) as fh:
            return fh.read()

    def cpu_quota(self, cores: float) -> None:
        if self.version == 1:
            self.write("cpu", "cpu.cfs_period_us", "100000")
            self.write("cpu", "cpu.cfs_quota_us", str(int(cores * 100000)))
        else:
            self.write("cpu", "cpu.max", f"{int(cores * 100000)} 100000")

    def cpu_unlimited(self) -> None:
        if self.version == 1:
            self.write("cpu", "cpu.cfs_quota_us", "-1")
        else:
            self.write("cpu", "cpu.max", "max 100000")

    def close(self) -> None:
        for d in set(self.dirs.values()):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)


def _cgroup(controllers):
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    try:
        return Cgroup(controllers)
    except OSError as e:
        pytest.skip(str(e))


class Engine:
    def __init__(self, cgroup: Cgroup | None, *args: str) -> None:
        pre = ""
        if cgroup is not None:
            pre = " ".join(f"echo $$ > {d}/cgroup.procs;" for d in set(cgroup.dirs.values()))
        cmd = f"{pre} exec {sys.executable} {ENGINE} --max-seconds 240 " + " ".join(args)
        self.p = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        assert line[:1] == ["PORT"], line
        self.url = f"http://127.0.0.1:{line[1]}/metrics"
        self.core = int(line[3])

    def close(self) -> None:
        try:
            os.kill(self.core, signal.SIGCONT)
        except OSError:
            pass
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
        try:
            os.kill(self.core, signal.SIGKILL)
        except OSError:
            pass


class Agent:
    def __init__(self, engine: Engine, data_dir: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(data_dir, "agent.log"), "w+")
        self.p = subprocess.Popen([*CLI, "agent", "--listen", f"127.0.0.1:{self.port}", "--data-dir", data_dir,
                                   "--interval", "1s", "--detect-interval", "3s", "--no-nvml", "--no-store",
                                   "--vllm", engine.url],
                                  stdout=self.log, stderr=subprocess.STDOUT)

    def findings(self) -> dict:
        with urllib.request.urlopen(self.url + "/api/v1/findings", timeout=5) as r:
            rep = json.loads(r.read())
        return {f["id"]: f for f in rep.get("findings", [])}

    def wait_for(self, pred, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last: dict = {}
        while time.monotonic() < deadline:
            try:
                last = self.findings()
                if pred(last):
                    return last
            except OSError:
                pass
            time.sleep(1.0)
        self.log.flush()
        raise AssertionError(f"not met in {timeout} s; findings {sorted(last)}; agent log tail:\n"
                             + open(self.log.name).read()[-2000:])

    def close(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
        self.log.close()


def test_cpu_quota_starves_the_engine_and_no_quota_stays_quiet(tmp_path):
    cgq = _cgroup(("cpu",))
    free = eng = agent = None
    try:
        # the same load without a quota: no finding over 25 s of the agent watching
        free = Engine(None, "--running", "4")
        agent = Agent(free, str(tmp_path))
        t0 = time.monotonic()
        seen = agent.wait_for(lambda f: True, 30)
        while time.monotonic() - t0 < 25:
            seen = agent.findings()
            assert "engine-cpu-starved" not in seen, seen.get("engine-cpu-starved", {}).get("summary")
            time.sleep(2.0)
        agent.close()
        agent = None
        free.close()
        free = None
        # a 0.1-core quota: every period of the busy core runs out
        cgq.cpu_quota(0.1)
        eng = Engine(cgq, "--running", "4")
        agent = Agent(eng, str(tmp_path))
        got = agent.wait_for(lambda f: "engine-cpu-starved" in f, 60)
        f = got["engine-cpu-starved"]
        assert "of its CPU periods" in f["summary"] and "quota 0.10 cores" in f["summary"], f["summary"]
        share = float(f["summary"].split("throttled in ")[1].split(" %")[0])
        assert share >= 25
        assert "launch-bound" not in got
        # the quota lifted under the same load: cleared once the newest CFS periods run unthrottled
        t_lift = time.monotonic()
        cgq.cpu_unlimited()
        agent.wait_for(lambda f: "engine-cpu-starved" not in f, 90)
        print(f"engine-cpu-starved cleared {time.monotonic() - t_lift:.1f} s after the quota was lifted")
    finally:
        for x in (agent, eng, free):
            if x is not None:
                x.close()
        cgq.close()


def test_sigstopped_engine_core_is_stalled_then_cleared(tmp_path):
    eng = agent = None
    try:
        eng = Engine(None, "--running", "4", "--waiting", "2")
        agent = Agent(eng, str(tmp_path))
        agent.wait_for(lambda f: True, 30)
        time.sleep(5)  # tokens flowing in the agent's history
        assert "engine-stalled" not in agent.findings()
        os.kill(eng.core, signal.SIGSTOP)
        t_stop = time.monotonic()
        got = agent.wait_for(lambda f: "engine-stalled" in f, 45)
        took = time.monotonic() - t_stop
        f = got["engine-stalled"]
        # the process collector sees the core in state T (5 s bar) before the 15 s without a token do;
        # either way the finding names the frozen requests
        s = f["summary"]
        stopped = f"pid {eng.core} " in s and "state T" in s and "4 running, 2 waiting" in s
        assert stopped or ("No token generated" in s and "4 requests run" in s), s
        assert took <= 35, f"engine-stalled after {took:.0f} s"  # 15 s stall bar + the watch pass (5 s) + scrapes
        os.kill(eng.core, signal.SIGCONT)
        # cleared at the agent's next full judging round (every 30 s) after the core runs again
        agent.wait_for(lambda f: "engine-stalled" not in f, 45)
    finally:
        for x in (agent, eng):
            if x is not None:
                x.close()


def test_memory_cgroup_limit_approached(tmp_path):
    cgm = _cgroup(("memory",))
    eng = agent = None
    try:
        eng = Engine(cgm, "--running", "1", "--work", "200", "--hold-mib", "96")
        time.sleep(3)  # the core touched its pages
        usage = int(cgm.read("memory", "memory.usage_in_bytes" if cgm.version == 1 else "memory.current"))
        limit = int(usage / 0.94) // 4096 * 4096
        cgm.write("memory", "memory.limit_in_bytes" if cgm.version == 1 else "memory.max", str(limit))
        agent = Agent(eng, str(tmp_path))
        got = agent.wait_for(lambda f: "host-memory-pressure" in f, 60)
        f = got["host-memory-pressure"]
        assert "of its" in f["summary"] and "limit" in f["summary"], f["summary"]
    finally:
        for x in (agent, eng):
            if x is not None:
                x.close()
        cgm.close()
