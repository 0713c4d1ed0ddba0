"""The process collector reads what changes every tick (CPU and memory usage, throttling counters, each
engine process's CPU, RSS and threads) and what changes slowly (the CPU quota, the memory limit, swap and
OOM counters, the host's swap counters) every SLOW_EVERY_S, sending the last value of those every tick:
the same series each tick, the same values as psutil and a full read."""
from __future__ import annotations

import glob
import os

import psutil
import pytest

from fragscope.collectors import cgroup as cg
from fragscope.collectors.process import SLOW_EVERY_S, ProcessCollector, read_pid_stat

DATA = os.path.join(os.path.dirname(__file__), "data", "cgroup")


def _write(root, quota: str, usage: int, limit: str, oom_kills: int, throttled_usec: int) -> None:
    (root / "cpu.max").write_text(quota + "\n")
    (root / "cpu.stat").write_text(f"usage_usec 5000000\nnr_periods 10\nnr_throttled 2\nthrottled_usec {throttled_usec}\n")
    (root / "memory.current").write_text(f"{usage}\n")
    (root / "memory.max").write_text(limit + "\n")
    (root / "memory.stat").write_text("anon 1000\nactive_file 7\ninactive_file 4096\nfile 9000\n")
    (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kills}\noom_group_kill 0\n")


def _values(res) -> dict:
    return {s.name: s.value for s in res.samples if s.name.startswith("fragscope_container_")}


def test_slow_files_every_slow_interval_fast_ones_every_tick(tmp_path):
    _write(tmp_path, "200000 100000", 1 << 30, str(2 << 30), 0, 1_000_000)
    c = ProcessCollector(pids=[os.getpid()], cgroup_root=str(tmp_path), proc_cgroup=str(tmp_path / "none"))
    first = _values(c.collect(1.0))
    assert first["fragscope_container_memory_limit_bytes"] == 2 << 30
    assert first["fragscope_container_memory_working_set_bytes"] == (1 << 30) - 4096
    assert first["fragscope_container_oom_kills_total"] == 0
    assert first["fragscope_container_cpu_quota_cores"] == 2.0
    _write(tmp_path, "100000 100000", 3 << 29, str(1 << 30), 1, 3_000_000)
    second = _values(c.collect(2.0))
    assert set(second) == set(first)  # every series every tick
    assert second["fragscope_container_memory_usage_bytes"] == 3 << 29  # fresh
    assert second["fragscope_container_memory_working_set_bytes"] == (3 << 29) - 4096
    assert second["fragscope_container_cpu_throttled_seconds_total"] == 3.0
    assert second["fragscope_container_memory_limit_bytes"] == 2 << 30  # the last read, until SLOW_EVERY_S
    assert second["fragscope_container_oom_kills_total"] == 0
    assert second["fragscope_container_cpu_quota_cores"] == 2.0
    c._slow_at -= SLOW_EVERY_S  # due
    third = _values(c.collect(3.0))
    assert third["fragscope_container_memory_limit_bytes"] == 1 << 30
    assert third["fragscope_container_oom_kills_total"] == 1
    assert third["fragscope_container_cpu_quota_cores"] == 1.0


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "**", "*"), recursive=True)))
def test_key_lookup_reads_what_the_full_parse_reads(path):
    """cgroup.kv(text, keys) on every recorded cgroup and /proc file: the same figures as parsing every
    line, for every key the file holds (prefixes of one another included: oom / oom_kill)."""
    if not os.path.isfile(path):
        return
    text = cg.read_text(path)
    full = cg.kv(text)
    if not full:
        return
    keys = tuple(full) + ("no_such_key",)
    assert cg.kv(text, keys) == full


def test_pid_stat_is_what_psutil_reads():
    p = psutil.Process()
    with p.oneshot():
        ct, th, rss = p.cpu_times(), p.num_threads(), p.memory_info().rss
    cpu, th2, rss2 = read_pid_stat(os.getpid())
    assert th2 == th
    assert abs(cpu - (ct.user + ct.system)) <= 0.05  # this process runs between the two reads
    assert abs(rss2 - rss) <= 1 << 20
    odd = psutil.Process(os.getppid())  # any process: a name with spaces or ")" is counted from the last ")"
    assert read_pid_stat(odd.pid)[1] == odd.num_threads()


LISTENER = ("import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "time.sleep(60)\n")


def _listen(port: int):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())


def test_socket_owner_kept_while_it_runs_a_restarted_engine_found_at_once(tmp_path, monkeypatch):
    """The full listening-socket lookup (every process's fds) runs once; later rescans keep the owner while
    the same process runs; an engine restarted on the same port is a new process, looked up at the next
    rescan."""
    from fragscope.collectors import process as proc

    calls = []
    real = proc.listening_owners
    monkeypatch.setattr(proc, "listening_owners", lambda ports: calls.append(1) or real(ports))
    eng, port = _listen(0)
    eng2 = None
    try:
        c = ProcessCollector(endpoints=[f"http://127.0.0.1:{port}"], cgroup_root=str(tmp_path))
        pids = lambda r: {dict(s.labels)["pid"] for s in r.samples if s.name == "fragscope_process_threads"}  # noqa: E731
        assert str(eng.pid) in pids(c.collect(1.0)) and len(calls) == 1
        c._last_scan -= c.rescan_s
        assert str(eng.pid) in pids(c.collect(2.0)) and len(calls) == 1  # kept: no second full lookup
        eng.kill()
        eng.wait()
        eng2, _ = _listen(port)
        c._last_scan -= c.rescan_s
        got = pids(c.collect(3.0))
        assert str(eng2.pid) in got and str(eng.pid) not in got and len(calls) == 2
        c._full_at -= proc.FULL_RESCAN_S  # and a full lookup every FULL_RESCAN_S all the same
        c._last_scan -= c.rescan_s
        c.collect(4.0)
        assert len(calls) == 3
    finally:
        for p in (eng, eng2):
            if p is not None:
                p.kill()
                p.wait()
