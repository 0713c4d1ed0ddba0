"""The engine's own cgroup (found from its pid) and the host: CPU quota and throttling, memory usage,
limit and OOM kills, swap, and the engine threads' run-queue delay. Pure file reads over a root that
tests point at recorded files. docs/collectors.md#process.

Files read (kernel docs: Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/cpu.rst ("CFS bandwidth"),
cgroup-v1/memory.rst, scheduler/sched-stats.rst):

- which cgroup: ``/proc/PID/cgroup`` (``hierarchy:controllers:path``; v2 is ``0::path``)
- CPU v2: ``cpu.max`` (``quota period`` or ``max period``), ``cpu.stat`` (``nr_periods``, ``nr_throttled``,
  ``throttled_usec``, ``usage_usec``); v1: ``cpu.cfs_quota_us`` (-1: no limit), ``cpu.cfs_period_us``,
  ``cpu.stat`` (``nr_periods``, ``nr_throttled``, ``throttled_time`` in ns), ``cpuacct.usage`` (ns)
- memory v2: ``memory.current``, ``memory.max`` (``max``: no limit), ``memory.stat`` (``inactive_file``),
  ``memory.events`` (``oom_kill``, ``max``), ``memory.swap.current``; v1: ``memory.usage_in_bytes``,
  ``memory.limit_in_bytes`` (PAGE_COUNTER_MAX, 9223372036854771712 on 4 KiB pages: no limit),
  ``memory.stat`` (``total_inactive_file``), ``memory.oom_control`` (``oom_kill``, kernel >= 4.13),
  ``memory.memsw.usage_in_bytes`` (memory + swap)
- run-queue delay: ``/proc/PID/task/TID/schedstat`` (ns on the CPU, ns waiting on a run queue, timeslices)
- host: ``/proc/meminfo`` (MemTotal, MemAvailable, SwapTotal, SwapFree), ``/proc/vmstat`` (pswpin, pswpout:
  pages)

The working set is usage minus inactive file pages: what the kubelet's eviction and cAdvisor's
``container_memory_working_set_bytes`` count, since the kernel reclaims inactive page cache before it
OOM-kills.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

# v1 memory.limit_in_bytes when unset: PAGE_COUNTER_MAX pages rounded to the page size; anything this
# large is "no limit", not a limit.
UNLIMITED_BYTES = 1 << 60
PAGE_BYTES = 4096  # /proc/vmstat pswpin/pswpout count pages (x86-64, arm64 default)

V1_CPU_DIRS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
V1_CPUACCT_DIRS = ("cpu,cpuacct", "cpuacct", "cpuacct,cpu")
V1_MEMORY_DIRS = ("memory",)
V2_DIRS = ("", "unified")  # pure v2 mounts at the root; hybrid systemd setups at unified/


def read_text(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def kv(text: str | None, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """``key value`` lines (cpu.stat, memory.stat, memory.events, oom_control, vmstat, meminfo). With
    ``keys``, only those lines are looked up (str.find per key): /proc/vmstat has ~190 lines, memory.stat
    ~40, and splitting every line of every file was the process collector's largest cost (0.3 of its
    0.8 ms a tick on the 2-core VM)."""
    if keys is not None:
        return _kv_keys(text or "", keys)
    out: dict[str, float] = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


def _kv_keys(text: str, keys: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in keys:
        i = 0 if text.startswith(key) and text[len(key):len(key) + 1] in (" ", ":", "\t") else -1
        if i < 0:
            j = text.find("\n" + key)
            while j >= 0 and text[j + 1 + len(key):j + 2 + len(key)] not in (" ", ":", "\t"):
                j = text.find("\n" + key, j + 1)
            if j < 0:
                continue
            i = j + 1
        end = text.find("\n", i)
        parts = text[i:end if end >= 0 else len(text)].replace(":", " ").split()
        if len(parts) >= 2:
            try:
                out[key] = float(parts[1])
            except ValueError:
                continue
    return out


def proc_cgroups(pid: int | str, proc_root: str = "/proc") -> dict[str, str]:
    """Controller -> cgroup path of a process (``"2"``: the v2 unified path). Empty when unreadable."""
    text = read_text(os.path.join(proc_root, str(pid), "cgroup"))
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrls, path = parts
        if hier == "0" and ctrls == "":
            out["2"] = path.strip()
            continue
        for c in ctrls.split(","):
            if c:
                out[c] = path.strip()
    return out


@dataclass
class CgroupDirs:
    """Where a process's CPU and memory cgroup files are (None: not found)."""

    cpu: str | None = None
    cpu_version: int | None = None
    cpuacct: str | None = None  # v1 only
    memory: str | None = None
    memory_version: int | None = None
    notes: list[str] = field(default_factory=list)  # why one was not found


def _join(root: str, rel: str) -> str:
    rel = rel.lstrip("/")
    return os.path.join(root, rel) if rel else root


def _resolve(bases: list[str], rel: str, probe: str, notes: list[str], what: str) -> str | None:
    """The directory ``base/rel`` holding ``probe``; outside our cgroup namespace (``..`` in the path,
    or a path this mount does not show) the base itself is the closest we can read: say so."""
    for base in bases:
        if not os.path.isdir(base):
            continue
        if rel and ".." not in rel.split("/"):
            d = _join(base, rel)
            if os.path.exists(os.path.join(d, probe)):
                return d
        if not os.path.exists(os.path.join(base, probe)):
            continue
        if rel.strip("/") and rel != "/":
            notes.append(f"{what}: the engine's cgroup {rel} is not visible under {base} (another cgroup "
                         f"namespace); read {base} instead")
        return base
    return None


def find_dirs(pid: int | str | None, root: str = "/sys/fs/cgroup", proc_root: str = "/proc") -> CgroupDirs:
    """The CPU and memory cgroup directories of ``pid`` (None: this process)."""
    paths = proc_cgroups("self" if pid is None else pid, proc_root)
    out = CgroupDirs()
    # v1 controllers first: a hybrid system's unified hierarchy holds no cpu / memory controller
    # (its cpu.stat has usage but no throttling)
    d = _resolve([os.path.join(root, s) for s in V1_CPU_DIRS], paths.get("cpu", ""), "cpu.cfs_quota_us",
                 out.notes, "cpu")
    if d is not None:
        out.cpu, out.cpu_version = d, 1
        out.cpuacct = _resolve([os.path.join(root, s) for s in V1_CPUACCT_DIRS], paths.get("cpuacct", ""),
                               "cpuacct.usage", [], "cpuacct")
    else:
        d = _resolve([_join(root, s) for s in V2_DIRS], paths.get("2", ""), "cpu.max", out.notes, "cpu")
        if d is None:  # the root cgroup of a v2 system has cpu.stat but no cpu.max
            d = _resolve([_join(root, s) for s in V2_DIRS], paths.get("2", ""), "cpu.stat", out.notes, "cpu")
        if d is not None:
            out.cpu, out.cpu_version = d, 2
    d = _resolve([os.path.join(root, s) for s in V1_MEMORY_DIRS], paths.get("memory", ""),
                 "memory.usage_in_bytes", out.notes, "memory")
    if d is not None:
        out.memory, out.memory_version = d, 1
    else:
        d = _resolve([_join(root, s) for s in V2_DIRS], paths.get("2", ""), "memory.current", out.notes, "memory")
        if d is not None:
            out.memory, out.memory_version = d, 2
    return out


def read_cpu(d: str, version: int, cpuacct: str | None = None, limits: bool = True) -> dict:
    """CPU quota and throttling of one cgroup: quota_cores (None: no limit), period_s, periods,
    throttled_periods, throttled_s, usage_s; absent figures are missing keys. ``limits=False`` reads the
    counters alone (cpu.stat, cpuacct.usage): what changes from tick to tick."""
    out: dict = {}
    if version == 2:
        if not limits:
            return _cpu_stat(d, 2, out)
        cpu_max = read_text(os.path.join(d, "cpu.max"))
        if cpu_max is not None:
            parts = cpu_max.split()
            if parts and parts[0] == "max":
                out["quota_cores"] = None
                if len(parts) == 2 and parts[1].isdigit():
                    out["period_s"] = int(parts[1]) / 1e6
            elif len(parts) == 2:
                try:
                    q, p = float(parts[0]), float(parts[1])
                    if p > 0:
                        out["quota_cores"], out["period_s"] = q / p, p / 1e6
                except ValueError:
                    pass
        return _cpu_stat(d, 2, out)
    if not limits:
        return _cpu_stat(d, 1, out, cpuacct)
    quota = read_text(os.path.join(d, "cpu.cfs_quota_us"))
    period = read_text(os.path.join(d, "cpu.cfs_period_us"))
    try:
        p = float(period.strip()) if period else None
        if p:
            out["period_s"] = p / 1e6
        if quota is not None:
            q = float(quota.strip())
            out["quota_cores"] = None if q < 0 else (q / p if p else None)
    except ValueError:
        pass
    return _cpu_stat(d, 1, out, cpuacct)


_CPU_STAT = {2: (("nr_periods", "periods", 1), ("nr_throttled", "throttled_periods", 1),
                 ("throttled_usec", "throttled_s", 1e6), ("usage_usec", "usage_s", 1e6)),
             1: (("nr_periods", "periods", 1), ("nr_throttled", "throttled_periods", 1),
                 ("throttled_time", "throttled_s", 1e9))}
_CPU_STAT_KEYS = {v: tuple(k for k, _, _ in t) for v, t in _CPU_STAT.items()}


def _cpu_stat(d: str, version: int, out: dict, cpuacct: str | None = None) -> dict:
    st = kv(read_text(os.path.join(d, "cpu.stat")), _CPU_STAT_KEYS[version])
    for key, name, div in _CPU_STAT[version]:
        if key in st:
            out[name] = st[key] / div
    if version == 1:
        usage = read_text(os.path.join(cpuacct or d, "cpuacct.usage"))
        if usage and usage.strip().isdigit():
            out["usage_s"] = int(usage.strip()) / 1e9
    return out


def read_memory(d: str, version: int, slow: bool = True) -> dict:
    """Memory of one cgroup: usage_bytes, working_set_bytes, limit_bytes (None: no limit), swap_bytes,
    oom_kills (lifetime count), oom_events (v2: times the limit was hit and reclaim failed).
    ``slow=False`` reads usage and the working set alone (two files): the limit, swap and the OOM
    counters are the caller's to read less often."""
    out: dict = {}
    mx = events = swap = None
    if version == 2:
        cur = read_text(os.path.join(d, "memory.current"))
        stat = kv(read_text(os.path.join(d, "memory.stat")), ("inactive_file",))
        if slow:
            mx = read_text(os.path.join(d, "memory.max"))
            events = read_text(os.path.join(d, "memory.events"))
            swap = read_text(os.path.join(d, "memory.swap.current"))
        inactive = stat.get("inactive_file")
    else:
        cur = read_text(os.path.join(d, "memory.usage_in_bytes"))
        stat = kv(read_text(os.path.join(d, "memory.stat")), ("total_inactive_file", "inactive_file"))
        inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
        if slow:
            mx = read_text(os.path.join(d, "memory.limit_in_bytes"))
            events = read_text(os.path.join(d, "memory.oom_control"))
            memsw = read_text(os.path.join(d, "memory.memsw.usage_in_bytes"))
            if memsw and cur and memsw.strip().isdigit() and cur.strip().isdigit():
                out["swap_bytes"] = max(0, int(memsw.strip()) - int(cur.strip()))
    if cur and cur.strip().isdigit():
        u = int(cur.strip())
        out["usage_bytes"] = u
        if inactive is not None:
            out["working_set_bytes"] = max(0, u - int(inactive))
    if mx is not None:
        s = mx.strip()
        if s == "max":
            out["limit_bytes"] = None
        elif s.isdigit():
            out["limit_bytes"] = None if int(s) >= UNLIMITED_BYTES else int(s)
    if swap and swap.strip().isdigit():
        out["swap_bytes"] = int(swap.strip())
    if events is None:
        return out
    ev = kv(events, ("oom_kill", "oom"))
    if "oom_kill" in ev:
        out["oom_kills"] = ev["oom_kill"]
    if version == 2 and "oom" in ev:
        out["oom_events"] = ev["oom"]
    return out


def read_schedstat(pid: int | str, proc_root: str = "/proc") -> dict | None:
    """One process's threads summed: run_s (on a CPU), wait_s (runnable, waiting on a run queue),
    threads. None when the process is gone or schedstat is not compiled in (CONFIG_SCHEDSTATS)."""
    task = os.path.join(proc_root, str(pid), "task")
    try:
        tids = os.listdir(task)
    except OSError:
        return None
    run = wait = 0
    n = 0
    for tid in tids:
        text = read_text(os.path.join(task, tid, "schedstat"), 256)
        if not text:
            continue  # the thread exited between listdir and open
        parts = text.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            run += int(parts[0])
            wait += int(parts[1])
            n += 1
    if n == 0:
        return None
    return {"run_s": run / 1e9, "wait_s": wait / 1e9, "threads": n}


_MEMINFO = (("MemTotal", "total_bytes"), ("MemAvailable", "available_bytes"),
            ("SwapTotal", "swap_total_bytes"), ("SwapFree", "swap_free_bytes"))


def read_host_memory(proc_root: str = "/proc", swap_counters: bool = True) -> dict:
    """Host memory: total_bytes, available_bytes, swap_total_bytes, swap_free_bytes, swap_in_bytes and
    swap_out_bytes (lifetime, from page counts; ``swap_counters=False`` leaves /proc/vmstat unread)."""
    out: dict = {}
    mi = kv(read_text(os.path.join(proc_root, "meminfo")), tuple(k for k, _ in _MEMINFO))
    for key, name in _MEMINFO:
        if key in mi:
            out[name] = int(mi[key]) * 1024  # meminfo is in kB (KiB)
    if not swap_counters:
        return out
    vm = kv(read_text(os.path.join(proc_root, "vmstat")), ("pswpin", "pswpout"))
    for key, name in (("pswpin", "swap_in_bytes"), ("pswpout", "swap_out_bytes")):
        if key in vm:
            out[name] = int(vm[key]) * PAGE_BYTES
    return out
