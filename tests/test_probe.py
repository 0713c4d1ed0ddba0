"""The in-process probe: publish/atomicity and stats mapping on recorded memory_stats, the
real CPU torch (no CUDA: does nothing, never raises), the launcher with child Pythons."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types

import pytest

import fragscope
from fragscope.collectors.torch import TorchProbeCollector
from fragscope.probe import core
from fragscope.probe.launcher import BOOT_DIR, probe_env

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")
STATS = json.load(open(os.path.join(DATA, "torch_memory_stats_pytorch35901.json")))
MIB = 1024 * 1024


def fake_torch(stats_by_device: dict[int, dict], initialized=True, history=None, current=0, dump=None,
               raise_in_stats: Exception | None = None, host: dict | Exception | None = None) -> dict:
    """A stand-in for the engine's imported torch (CUDA cannot run here), shaped like the real API."""
    def memory_stats(i):
        if raise_in_stats is not None:
            raise raise_in_stats
        return dict(stats_by_device.get(i, {}))

    def dump_snapshot(path):
        if dump is None:
            raise RuntimeError("no snapshot")
        with open(path, "wb") as fh:
            fh.write(dump)

    cuda = types.SimpleNamespace(
        is_initialized=lambda: initialized, device_count=lambda: max(stats_by_device, default=-1) + 1,
        current_device=lambda: current, memory_stats=memory_stats, get_allocator_backend=lambda: "native",
        get_device_properties=lambda i: types.SimpleNamespace(uuid=f"0000000{i}-1111-2222-3333-444444444444"),
        memory=types.SimpleNamespace(_dump_snapshot=dump_snapshot))
    if host is not None:
        def host_memory_stats():
            if isinstance(host, Exception):
                raise host
            return dict(host)
        cuda.host_memory_stats = host_memory_stats
    C = types.SimpleNamespace()
    if history is not None:
        C._cuda_isHistoryEnabled = lambda: history
    torch = types.ModuleType("torch")
    torch.__version__ = "2.4.0+cu121"
    torch.cuda = cuda
    torch._C = C
    cmod = types.ModuleType("torch.cuda")
    return {"torch": torch, "torch.cuda": cmod}


ZERO = {k: 0 for k in STATS}


def test_pinned_host_stats_published_and_read(tmp_path):
    # keys as torch 2.13's host_memory_stats() names them (its docstring); 3 blocks of 2 MiB pinned,
    # 1 handed out
    host = {"allocated_bytes.current": 6 * MIB, "active_bytes.current": 2 * MIB, "allocations.current": 3,
            "num_host_alloc": 3, "num_host_free": 0, "host_alloc_time.avg": 12.5}
    p = core.Probe(str(tmp_path / "d"), 5.0, modules=fake_torch({0: STATS}, host=host), clock=lambda: 100.0)
    assert p.tick() is True
    rec = core.parse_record((tmp_path / "d" / f"torch-{os.getpid()}.json").read_bytes())
    assert rec["host"] == {k: host[k] for k in core.Probe.HOST_KEYS}
    r = TorchProbeCollector(str(tmp_path / "d")).collect(101.0)
    got = {s.name: s.value for s in r.samples if "host" in s.name}
    assert got == {"fragscope_torch_host_pinned_bytes": 6 * MIB, "fragscope_torch_host_pinned_active_bytes": 2 * MIB,
                   "fragscope_torch_host_pinned_allocs_total": 3}
    # an older torch without the call, or one whose call fails: no host section, no host samples
    for modules in (fake_torch({0: STATS}), fake_torch({0: STATS}, host=RuntimeError("no pinned allocator"))):
        d = tmp_path / f"d{id(modules)}"
        assert core.Probe(str(d), 5.0, modules=modules, clock=lambda: 100.0).tick() is True
        assert "host" not in core.parse_record((d / f"torch-{os.getpid()}.json").read_bytes())
        assert not [s for s in TorchProbeCollector(str(d)).collect(101.0).samples if "host" in s.name]


def test_select_stats_uses_real_key_names():
    sel = core.select_stats(STATS)
    assert sel["allocation.all.current"] == STATS["allocation.all.current"]
    assert "allocated.all.current" not in sel  # the docstring's name, not the real one
    assert sel["reserved_bytes.all.current"] == 12420 * MIB
    # exactly the published keys the fixture has, all of them numbers
    assert set(sel) == {k for k in core.STAT_KEYS if isinstance(STATS.get(k), (int, float))}


def test_publish_and_collector_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    p = core.Probe(str(tmp_path / "d"), 5.0, modules=fake_torch({0: STATS, 1: ZERO}), clock=lambda: 100.0)
    assert p.tick() is True
    files = os.listdir(tmp_path / "d")
    assert files == [f"torch-{os.getpid()}.json"]  # no tmp file left, unused device 1 not published
    rec = core.parse_record((tmp_path / "d" / files[0]).read_bytes())
    (dev,) = rec["devices"]
    assert dev["gpu"] == "3" and dev["uuid"] == "GPU-00000000-1111-2222-3333-444444444444"
    assert rec["torch_version"] == "2.4.0+cu121" and rec["seq"] == 1
    r = TorchProbeCollector(str(tmp_path / "d")).collect(101.0)
    assert r.up
    vals = {s.name: s.value for s in r.samples if dict(s.labels).get("gpu") == "3"}
    assert vals["fragscope_torch_reserved_bytes"] - vals["fragscope_torch_allocated_bytes"] == (12420 - 1062) * MIB
    assert vals["fragscope_torch_inactive_split_bytes"] == STATS["inactive_split_bytes.all.current"]
    assert vals["fragscope_torch_alloc_retries_total"] == 1 and vals["fragscope_torch_ooms_total"] == 1


def test_atomic_publish_under_concurrent_reads(tmp_path):
    """A reader never sees a partial file while the probe republishes (tmp + os.replace)."""
    p = core.Probe(str(tmp_path), 5.0, modules=fake_torch({0: STATS}))
    p.tick()
    path = core.record_path(str(tmp_path), os.getpid())
    stop = threading.Event()
    bad, reads = [], [0]

    def reader():
        while not stop.is_set():
            try:
                core.parse_record(open(path, "rb").read())
                reads[0] += 1
            except core.RecordError as e:
                bad.append(str(e))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(300):
        p.tick()
    stop.set()
    t.join(5)
    assert not bad and reads[0] > 0 and p.seq == 301


def test_does_nothing_without_torch_or_cuda(tmp_path):
    assert core.Probe(str(tmp_path), modules={}).tick() is False
    assert core.Probe(str(tmp_path), modules=fake_torch({0: STATS}, initialized=False)).tick() is False
    half = fake_torch({0: STATS})
    half["torch"].__spec__ = types.SimpleNamespace(_initializing=True)  # engine still importing torch
    assert core.Probe(str(tmp_path), modules=half).tick() is False
    assert os.listdir(tmp_path) == []


def test_real_cpu_torch_never_initialises_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: covered by bench/gpu_check.py")
    torch.zeros(4)
    p = core.Probe(str(tmp_path), 0.1)  # the real sys.modules, with the real torch imported
    for _ in range(3):
        assert p.safe_tick() is False
    assert p.errors == 0 and os.listdir(tmp_path) == [] and not torch.cuda.is_initialized()


def test_exceptions_are_swallowed_and_counted(tmp_path):
    p = core.Probe(str(tmp_path), modules=fake_torch({0: STATS}, raise_in_stats=RuntimeError("CUDA error: busy")))
    assert p.safe_tick() is False and p.safe_tick() is False
    assert p.errors == 2 and "CUDA error: busy" in p.last_error
    ro = tmp_path / "file-not-dir"
    ro.write_text("x")
    p = core.Probe(str(ro / "sub"), modules=fake_torch({0: STATS}))
    assert p.safe_tick() is False and p.errors == 1  # cannot create the directory: counted


def test_snapshot_on_request(tmp_path):
    d = str(tmp_path)
    mods = fake_torch({0: STATS}, history=True, dump=b"\x80\x04pickle-bytes")
    p = core.Probe(d, modules=mods)
    pid = os.getpid()
    (tmp_path / "request-snapshot-inc42.json").write_text("{}")
    (tmp_path / "request-snapshot-other.json").write_text(json.dumps({"pid": pid + 1}))  # another process's
    (tmp_path / "request-snapshot-..bad.json").write_text("{}")
    p.tick()
    assert (tmp_path / f"snapshot-{pid}-inc42.pickle").read_bytes() == b"\x80\x04pickle-bytes"
    st = json.loads((tmp_path / f"snapshot-{pid}-inc42.json").read_text())
    assert st["ok"] and st["history_enabled"] is True and st["bytes"] == 14
    assert not (tmp_path / f"snapshot-{pid}-other.pickle").exists()
    assert not any(n.endswith(".tmp") for n in os.listdir(d))
    os.unlink(tmp_path / f"snapshot-{pid}-inc42.pickle")
    p.tick()  # answered once only
    assert not (tmp_path / f"snapshot-{pid}-inc42.pickle").exists()
    # history off: a status saying why, no pickle, unless segments-only is acceptable
    p2 = core.Probe(d, modules=fake_torch({0: STATS}, history=False, dump=b"seg"))
    (tmp_path / "request-snapshot-off.json").write_text("{}")
    (tmp_path / "request-snapshot-segs.json").write_text('{"segments_only_ok": true}')
    p2.tick()
    off = json.loads((tmp_path / f"snapshot-{pid}-off.json").read_text())
    assert not off["ok"] and "memory history recording is off" in off["error"]
    assert (tmp_path / f"snapshot-{pid}-segs.pickle").read_bytes() == b"seg"


def test_launcher_env():
    env = probe_env({"PYTHONPATH": "/a:/b"}, "/x/dir", 2.0)
    assert env["PYTHONPATH"].split(os.pathsep) == [BOOT_DIR, "/a", "/b"]
    assert env["FRAGSCOPE_PROBE"] == "1" and env["FRAGSCOPE_PROBE_DIR"] == "/x/dir"
    assert float(env["FRAGSCOPE_PROBE_INTERVAL"]) == 2.0
    assert probe_env(env, None, None)["PYTHONPATH"].count(BOOT_DIR) == 1  # not added twice
    assert os.path.isfile(os.path.join(BOOT_DIR, "sitecustomize.py"))


def _env(env_extra=None) -> dict:
    env = dict(os.environ)
    env.pop("FRAGSCOPE_PROBE", None)
    env.update(env_extra or {})
    return env


def _run(args, tmp_path, env_extra=None, timeout=60):
    """The real ``fragscope-probe`` launcher in a subprocess (it execs the command)."""
    cmd = [sys.executable, "-c", "from fragscope.probe import launcher_main; launcher_main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(env_extra), timeout=timeout, cwd=str(tmp_path))


def _probed(code: str, tmp_path, probe_dir, interval: float | None = 0.05, env_extra=None, timeout=60):
    """A child Python started with the environment the launcher execs it with (probe_env): the
    probe in a real process, without a second interpreter start for the launcher itself."""
    env = probe_env(_env(env_extra), str(probe_dir), interval)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=str(tmp_path))


def _launcher(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """``fragscope-probe ARGS`` in process through its console entry (its error paths exit before any
    exec): (code, stdout, stderr)."""
    from fragscope.probe import launcher_main

    monkeypatch.setattr(sys, "argv", ["fragscope-probe", *args])
    with pytest.raises(SystemExit) as ex:
        launcher_main()
    out, err = capsys.readouterr()
    return ex.value.code, out, err


CHILD_FAKE_TORCH = r"""
import os, sys, time, threading, types
names = [t.name for t in threading.enumerate()]
print("THREAD", "fragscope-probe" in names)
print("DIR", os.environ["FRAGSCOPE_PROBE_DIR"])
stats = {"allocated_bytes.all.current": 1, "reserved_bytes.all.current": 2, "num_alloc_retries": 0,
         "num_ooms": 0, "inactive_split_bytes.all.current": 1, "num_device_alloc": 1}
cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
                             memory_stats=lambda i: stats, get_allocator_backend=lambda: "native",
                             get_device_properties=lambda i: types.SimpleNamespace(uuid="u"))
torch = types.ModuleType("torch"); torch.cuda = cuda; torch.__version__ = "fake"
sys.modules["torch"] = torch; sys.modules["torch.cuda"] = types.ModuleType("torch.cuda")
path = os.path.join(os.environ["FRAGSCOPE_PROBE_DIR"], "torch-%d.json" % os.getpid())
deadline = time.time() + 10
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.02)
print("PUBLISHED", os.path.exists(path))
"""


def test_launcher_child_python_starts_probe_and_cleans_up(tmp_path):
    d = tmp_path / "probe"
    r = _probed(CHILD_FAKE_TORCH, tmp_path, d)
    assert r.returncode == 0, r.stderr
    assert "THREAD True" in r.stdout and f"DIR {d}" in r.stdout and "PUBLISHED True" in r.stdout
    assert os.listdir(d) == []  # removed its own file at exit


def test_launcher_with_real_cpu_torch_does_nothing(tmp_path):
    pytest.importorskip("torch")
    d = tmp_path / "probe"
    code = ("import time, torch, fragscope.probe as fp; torch.ones(3) * 2; time.sleep(0.5); "
            "p = fp.current(); print('ALIVE', p._thread.is_alive(), 'ERR', p.errors, 'CUDA', torch.cuda.is_initialized())")
    r = _probed(code, tmp_path, d)
    assert r.returncode == 0, r.stderr
    assert "ALIVE True ERR 0 CUDA False" in r.stdout
    assert os.listdir(d) == []


def test_probe_never_imports_torch(tmp_path):
    code = "import time, sys; time.sleep(0.3); print('TORCH', 'torch' in sys.modules, 'numpy' in sys.modules)"
    r = _probed(code, tmp_path, tmp_path / "p")
    assert "TORCH False False" in r.stdout, r.stderr


def test_launcher_smoke_execs_the_command_with_the_probe(tmp_path):
    """The one real run of the ``fragscope-probe`` entry point: it execs the command, whose exit status
    is its own, with the probe running inside it and the directory from the environment."""
    code = ("import os, sys, threading; print('PROBE', any(t.name == 'fragscope-probe' for t in threading.enumerate()), "
            "'DIR', os.environ['FRAGSCOPE_PROBE_DIR']); sys.exit(3)")
    r = _run([sys.executable, "-c", code], tmp_path, {"FRAGSCOPE_PROBE_DIR": str(tmp_path)})
    assert r.returncode == 3 and f"PROBE True DIR {tmp_path}" in r.stdout, r.stderr


def test_launcher_errors_are_one_line(tmp_path, capsys, monkeypatch):
    code, out, err = _launcher(["--dir", str(tmp_path), "no-such-command-xyz"], capsys, monkeypatch)
    assert code == 127 and err == "fragscope-probe: no-such-command-xyz: command not found\n"
    code, out, err = _launcher([], capsys, monkeypatch)
    assert code == 2 and "no command given" in err and len(err.splitlines()) == 1
    code, out, err = _launcher(["--dir", "/proc/forbidden/x", "true"], capsys, monkeypatch)
    assert code == 2 and "cannot create /proc/forbidden/x" in err and len(err.splitlines()) == 1
    code, out, err = _launcher(["--interval", "0", "true"], capsys, monkeypatch)
    assert code == 2 and "--interval: must be a positive duration" in err and len(err.splitlines()) == 1
    code, out, err = _launcher(["--print-env", "--interval", "500ms"], capsys, monkeypatch)
    assert code == 0 and "FRAGSCOPE_PROBE_INTERVAL=0.5" in out
    code, out, err = _launcher(["--print-env", "--dir", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and "export FRAGSCOPE_PROBE=1" in out and f"export FRAGSCOPE_PROBE_DIR={tmp_path}" in out
    assert out.splitlines()[0].startswith(f"export PYTHONPATH={BOOT_DIR}")


def test_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os, threading; print('OTHER', os.environ.get('OTHER_SITECUSTOMIZE'), " \
           "'PROBE', any(t.name == 'fragscope-probe' for t in threading.enumerate()))"
    # the other sitecustomize first, then the fragscope under test (wherever it is imported from here)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fragscope.__file__)))
    r = _probed(code, tmp_path, tmp_path / "p", None, {"PYTHONPATH": os.pathsep.join([str(other), pkg_parent])})
    assert "OTHER ran PROBE True" in r.stdout, r.stderr


def test_env_interval_parsing(monkeypatch):
    for raw, want in (("2", 2.0), ("0.01", core.MIN_INTERVAL_S), ("-1", 5.0), ("abc", 5.0), ("nan", 5.0)):
        monkeypatch.setenv("FRAGSCOPE_PROBE_INTERVAL", raw)
        assert core.env_interval() == want, raw
