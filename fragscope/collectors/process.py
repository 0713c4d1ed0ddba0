"""Engine processes' CPU, RSS and threads (psutil), and the container's CPU quota and throttling
(cgroup v2 ``cpu.max`` / ``cpu.stat``, v1 ``cpu.cfs_*`` fallback). docs/collectors.md#process.

A CPU-starved engine looks like a GPU problem (launch gaps, low utilization), so the detectors
need to see CPU throttling next to the GPU signals.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import psutil

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from .logonce import LogOnce

log = logging.getLogger(__name__)

PROCESS_SIGNALS = ("fragscope_process_cpu_seconds_total", "fragscope_process_resident_memory_bytes",
                   "fragscope_process_threads")
CONTAINER_SIGNALS = ("fragscope_container_cpu_quota_cores", "fragscope_container_cpu_throttled_seconds_total",
                     "fragscope_container_cpu_throttled_periods_total")


EMPTY_RESCAN_S = 5.0  # rescan period while no engine process is found (each scan: every /proc/PID)


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
    """Processes whose name or command line contains one of ``match`` (or the given ``pids``),
    plus the container's cgroup CPU figures. Never raises."""

    name = "process"

    def __init__(self, match: Sequence[str] = ("vllm",), pids: Sequence[int] | None = None,
                 cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup",
                 rescan_s: float = 30.0) -> None:
        self.match = tuple(m for m in match if m)
        self.fixed_pids = tuple(int(p) for p in pids) if pids else None
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
        if _is_fragscope(argv):
            return False
        return any(m.lower() in name or m.lower() in cmd for m in self.match)

    def _scan(self) -> None:
        if self.fixed_pids is not None:
            for pid in self.fixed_pids:
                if pid not in self._procs:
                    try:
                        self._procs[pid] = psutil.Process(pid)
                    except (psutil.Error, OSError):
                        continue
            return
        found = {}
        for p in psutil.process_iter():
            if p.pid == self._me:
                continue
            if p.pid in self._procs:
                found[p.pid] = self._procs[p.pid]  # keep the object: psutil checks pid reuse with it
            elif self._matches(p):
                found[p.pid] = p
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
        for pid, p in self._procs.items():
            lab = make_labels({"pid": str(pid)})
            try:
                with p.oneshot():
                    ct = p.cpu_times()
                    rss = p.memory_info().rss
                    nth = p.num_threads()
                    pname = p.name()
            except psutil.NoSuchProcess:
                gone.append(pid)
                continue
            except psutil.AccessDenied:
                res.missing.extend(Missing(n, lab, now, Reason.NO_PERMISSION, f"pid {pid}: access denied")
                                   for n in PROCESS_SIGNALS)
                continue
            res.samples.append(Sample("fragscope_process_cpu_seconds_total", lab, now, float(ct.user + ct.system)))
            res.samples.append(Sample("fragscope_process_resident_memory_bytes", lab, now, float(rss)))
            res.samples.append(Sample("fragscope_process_threads", lab, now, float(nth)))
            res.samples.append(Sample("fragscope_process_info", make_labels({"pid": str(pid), "name": pname}), now, 1.0))
        for pid in gone:
            self._procs.pop(pid, None)
        if not any(s.name == "fragscope_process_threads" for s in res.samples):
            what = f"pids {', '.join(map(str, self.fixed_pids))}" if self.fixed_pids else \
                f"a process matching {', '.join(self.match) or '(nothing)'}"
            msg = f"no {what} is running (or visible: share the process namespace with the engine)"
            self._log.problem(msg, logging.INFO)
            res.missing.extend(Missing(n, (), now, Reason.NOT_COLLECTED, msg) for n in PROCESS_SIGNALS)
        else:
            self._log.ok()
        cg_ok = self._cgroup(now, res)
        if not cg_ok and not any(s.name.startswith("fragscope_process_") for s in res.samples):
            res.up = False
            res.error = "no engine process found and no cgroup CPU files readable"
        return res

    def _cgroup(self, now: float, res: CollectResult) -> bool:
        # /proc/self/cgroup, the directory lookup and cpu.max every rescan_s; cpu.stat every tick
        mono = time.monotonic()
        static = self._cg_static
        if static is None or static.get("version") is None or mono - self._cg_at >= self.rescan_s:
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


def _is_fragscope(argv) -> bool:
    """fragscope's own processes (agent, record, diagnose), not the engine they watch."""
    for a in list(argv)[:3]:
        base = os.path.basename(str(a))
        if base in ("fragscope", "diagnose") or "fragscope.cli" in str(a):
            return True
    return False

