"""The in-process PyTorch allocator probe (docs/probe.md).

Runs in every Python process of the serving engine (started by ``sitecustomize`` under
``fragscope-probe``, or by ``fragscope.probe.start()``). A daemon thread samples
``torch.cuda.memory_stats(d)`` for each device this process uses, every ``interval_s`` seconds,
and publishes it atomically (tmp file + ``os.replace``) as ``<dir>/torch-<pid>.json``.

Rules it keeps, because it lives inside someone else's server:
- standard library only, and no relative imports (sitecustomize may load this file by path);
- never imports torch: uses it only once the engine has (``sys.modules``), so a process that
  never imports torch pays one dict lookup per interval;
- never initialises CUDA: does nothing until ``torch.cuda.is_initialized()``;
- never raises into the engine: every exception in the thread is swallowed and counted.

This module is also the published file format's single definition (the torch collector reads
it with :func:`parse_record`).
"""
from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import time

FORMAT = "fragscope-probe/1"
FILE_PREFIX = "torch-"
FILE_SUFFIX = ".json"
REQUEST_PREFIX = "request-snapshot-"
DEFAULT_DIR = "/tmp/fragscope-probe"
DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.1
MAX_RECORD_BYTES = 1 << 20  # a published record is ~3 kB per device
REQUEST_MAX_AGE_S = 300.0  # snapshot requests older than this are ignored
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# memory_stats() keys published (the rest of its ~150 keys are not used downstream).
# Note: the allocation-count family is ``allocation.*`` in the C++ code although the
# docstring calls it ``allocated.*``.
_FAMILIES = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
             "allocation", "segment", "active", "inactive_split")
STAT_KEYS: tuple[str, ...] = tuple(
    [f"{fam}.all.{m}" for fam in _FAMILIES for m in ("current", "peak")]
    + [f"{fam}.{pool}.current" for fam in ("allocated_bytes", "reserved_bytes", "inactive_split_bytes")
       for pool in ("large_pool", "small_pool")]
    + ["segment.all.allocated", "segment.all.freed",
       "oversize_allocations.current", "oversize_segments.current",
       "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
       "num_oom_rejections", "max_split_size"]
)


def select_stats(stats: dict, keys: tuple[str, ...] = STAT_KEYS) -> dict:
    """Keep the published subset of a ``memory_stats()`` (or ``host_memory_stats()``) dict: ``keys``,
    ints only; absent keys stay absent."""
    out = {}
    for k in keys:
        v = stats.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = int(v)
    return out


def env_interval() -> float:
    try:
        v = float(os.environ.get("FRAGSCOPE_PROBE_INTERVAL", DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    if not (v == v) or v <= 0:  # NaN or non-positive
        return DEFAULT_INTERVAL_S
    return max(MIN_INTERVAL_S, min(v, 3600.0))


def env_dir() -> str:
    return os.environ.get("FRAGSCOPE_PROBE_DIR") or DEFAULT_DIR


def record_path(probe_dir: str, pid: int) -> str:
    return os.path.join(probe_dir, f"{FILE_PREFIX}{pid}{FILE_SUFFIX}")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    No fsync: the directory is a tmpfs/emptyDir shared with the sidecar, and a lost record after
    a host crash is harmless (the next one comes in seconds); fsync would cost milliseconds.
    """
    d, base = os.path.split(path)
    tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    os.replace(tmp, path)


class RecordError(ValueError):
    """A published file that is not a valid probe record (half-written, garbage, other format)."""


def parse_record(raw: bytes) -> dict:
    """Validate a published record; raise RecordError (one line) when it is not one."""
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{len(raw)} bytes, over the {MAX_RECORD_BYTES} byte limit")
    if not raw.strip():
        raise RecordError("empty file")
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"not JSON (half-written or garbage): {str(e)[:80]}") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise RecordError(f"not a {FORMAT} record")
    ts = rec.get("ts")
    pid = rec.get("pid")
    devices = rec.get("devices")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not (ts == ts) or ts in (float("inf"), float("-inf")):
        raise RecordError("missing or bad 'ts'")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise RecordError("missing or bad 'pid'")
    if not isinstance(devices, list):
        raise RecordError("missing 'devices' list")
    for d in devices:
        if not isinstance(d, dict) or not isinstance(d.get("stats"), dict) or "gpu" not in d:
            raise RecordError("bad device entry")
    return rec


def _physical_gpu(index: int) -> str:
    """Map a process-local CUDA index to the index NVML/DCGM use, when CUDA_VISIBLE_DEVICES allows."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        parts = [p.strip() for p in vis.split(",") if p.strip()]
        if 0 <= index < len(parts) and parts[index].isdigit():
            return parts[index]
    return str(index)


class Probe:
    """One per process. ``tick()`` is one sampling round; the thread calls it every interval."""

    def __init__(self, probe_dir: str | None = None, interval_s: float | None = None,
                 modules: dict | None = None, clock=time.time) -> None:
        self.dir = probe_dir or env_dir()
        self.interval_s = interval_s if interval_s is not None else env_interval()
        self.modules = modules if modules is not None else sys.modules  # injectable for tests
        self.clock = clock
        self.pid = os.getpid()
        self.started_ts = clock()
        self.seq = 0  # records published
        self.errors = 0  # exceptions swallowed
        self.last_error: str | None = None
        self.last_sample_us: float | None = None
        self.snapshots = 0
        self._uuid_cache: dict[int, str | None] = {}
        self._handled_requests: set[str] = set()
        self._dir_ready = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._static: dict | None = None

    # -- what torch offers, without importing or initialising anything -----------------------
    def _torch(self):
        """The engine's torch module when it is fully imported and CUDA is initialised, else None."""
        torch = self.modules.get("torch")
        if torch is None:
            return None
        spec = getattr(torch, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return None  # still being imported by the engine: never touch a half-built module
        cuda = getattr(torch, "cuda", None)
        if cuda is None or "torch.cuda" not in self.modules:
            return None
        cspec = getattr(self.modules.get("torch.cuda"), "__spec__", None)
        if cspec is not None and getattr(cspec, "_initializing", False):
            return None
        is_init = getattr(cuda, "is_initialized", None)
        if is_init is None or not is_init():
            return None
        return torch

    def _static_info(self, torch) -> dict:
        if self._static is None:
            info: dict = {"torch_version": str(getattr(torch, "__version__", "")) or None}
            try:
                info["allocator_backend"] = torch.cuda.get_allocator_backend()
            except Exception:
                info["allocator_backend"] = None
            info["alloc_conf"] = (os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                  or os.environ.get("PYTORCH_ALLOC_CONF") or None)
            info["argv"] = [str(a)[:200] for a in sys.argv[:8]]
            self._static = info
        return self._static

    def _uuid(self, torch, index: int) -> str | None:
        if index not in self._uuid_cache:
            u = None
            try:
                raw = str(torch.cuda.get_device_properties(index).uuid)
                if raw:
                    u = raw if raw.startswith(("GPU-", "MIG-")) else "GPU-" + raw
            except Exception:
                u = None
            self._uuid_cache[index] = u
        return self._uuid_cache[index]

    def _history_enabled(self, torch) -> bool | None:
        fn = getattr(getattr(torch, "_C", None), "_cuda_isHistoryEnabled", None)
        if fn is None:
            return None
        try:
            return bool(fn())
        except Exception:
            return None

    def devices(self, torch) -> list[dict]:
        """Stats for each device this process uses (the current one, and any with allocator activity)."""
        cuda = torch.cuda
        n = int(cuda.device_count())
        try:
            current = int(cuda.current_device())
        except Exception:
            current = -1
        out = []
        for i in range(n):
            stats = cuda.memory_stats(i)
            if not stats:
                continue
            if i != current and not stats.get("num_device_alloc") and not stats.get("reserved_bytes.all.peak"):
                continue  # a device this process never used: absent, not zero
            out.append({"index": i, "gpu": _physical_gpu(i), "uuid": self._uuid(torch, i),
                        "stats": select_stats(stats)})
        return out

    HOST_KEYS = ("allocated_bytes.current", "active_bytes.current", "allocations.current", "num_host_alloc",
                 "num_host_free")

    def host(self, torch) -> dict | None:
        """The pinned (host) allocator's counters, where torch has ``cuda.host_memory_stats()``
        (2.13 has it); None where it does not (absent, not zero)."""
        fn = getattr(torch.cuda, "host_memory_stats", None)
        if fn is None:
            return None
        try:
            stats = fn()
        except Exception:
            return None
        return select_stats(stats, self.HOST_KEYS) or None

    # -- one round ---------------------------------------------------------------------------
    def tick(self) -> bool:
        """Sample and publish once. Returns True when a record was published. May raise."""
        torch = self._torch()
        if torch is None:
            return False
        t0 = time.perf_counter()
        now = self.clock()
        devs = self.devices(torch)
        if not devs:
            return False
        rec = {"format": FORMAT, "pid": self.pid, "ts": now, "interval_s": self.interval_s,
               "started_ts": self.started_ts, "seq": self.seq + 1, "errors": self.errors,
               "last_error": self.last_error, "sample_us": self.last_sample_us,
               "history_enabled": self._history_enabled(torch), "snapshots": self.snapshots}
        rec.update(self._static_info(torch))
        rec["devices"] = devs
        host = self.host(torch)
        if host is not None:
            rec["host"] = host
        self.publish(rec)
        self.seq += 1
        self.last_sample_us = round((time.perf_counter() - t0) * 1e6, 1)
        try:
            self.handle_snapshot_requests(torch)
        except Exception as e:  # a bad request must not stop sampling
            self._count(e)
        return True

    def publish(self, rec: dict) -> None:
        if not self._dir_ready:
            os.makedirs(self.dir, exist_ok=True)
            self._dir_ready = True
        data = json.dumps(rec, separators=(",", ":")).encode()
        write_atomic(record_path(self.dir, self.pid), data)

    # -- memory snapshots on request (docs/probe.md#snapshots) ---------------------------------
    def pending_requests(self) -> list[tuple[str, str]]:
        """(id, path) of snapshot requests in the directory this process has not answered yet."""
        out = []
        try:
            names = os.listdir(self.dir)
        except OSError:
            return out
        for name in names:
            if not (name.startswith(REQUEST_PREFIX) and name.endswith(".json")):
                continue
            rid = name[len(REQUEST_PREFIX):-5]
            if rid in self._handled_requests or not _REQUEST_ID_RE.match(rid):
                continue
            out.append((rid, os.path.join(self.dir, name)))
        return out

    def handle_snapshot_requests(self, torch) -> int:
        done = 0
        for rid, path in self.pending_requests():
            self._handled_requests.add(rid)
            try:
                st = os.stat(path)
                if self.clock() - st.st_mtime > REQUEST_MAX_AGE_S:
                    continue
                with open(path, "rb") as fh:
                    raw = fh.read(65536)
                req = json.loads(raw) if raw.strip() else {}
                if not isinstance(req, dict):
                    req = {}
            except (OSError, ValueError):
                req = {}
            want_pid = req.get("pid")
            if want_pid is not None and want_pid != self.pid:
                continue
            self.dump_snapshot(torch, rid, bool(req.get("segments_only_ok")))
            done += 1
        return done

    def dump_snapshot(self, torch, rid: str, segments_only_ok: bool = False) -> bool:
        base = os.path.join(self.dir, f"snapshot-{self.pid}-{rid}")
        status = {"format": FORMAT, "pid": self.pid, "id": rid, "ts": self.clock(),
                  "history_enabled": self._history_enabled(torch), "ok": False, "error": None,
                  "path": None, "bytes": None}
        if status["history_enabled"] is False and not segments_only_ok:
            status["error"] = ("memory history recording is off in this process: start it with "
                               "torch.cuda.memory._record_memory_history(max_entries=100000), or ask with "
                               "segments_only_ok=true")
        else:
            tmp = os.path.join(self.dir, f".snapshot-{self.pid}-{rid}.pickle.tmp")
            try:
                torch.cuda.memory._dump_snapshot(tmp)
                os.replace(tmp, base + ".pickle")
                status.update(ok=True, path=os.path.basename(base + ".pickle"),
                              bytes=os.path.getsize(base + ".pickle"))
                self.snapshots += 1
            except Exception as e:
                status["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        write_atomic(base + ".json", json.dumps(status).encode())
        return bool(status["ok"])

    # -- thread --------------------------------------------------------------------------------
    def _count(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {str(e)[:160]}"

    def safe_tick(self) -> bool:
        try:
            return self.tick()
        except Exception as e:
            self._count(e)
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.safe_tick()

    def start(self) -> bool:
        if self._thread is not None and self._thread.is_alive():
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fragscope-probe", daemon=True)
        self._thread.start()
        return True

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        self._thread = None
        if remove:
            self.remove_record()

    def remove_record(self) -> None:
        try:
            os.unlink(record_path(self.dir, self.pid))
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# Process-wide singleton (one probe per process; a forked child gets its own).
_lock = threading.Lock()
_probe: Probe | None = None
_hooks_installed = False


def _at_exit() -> None:
    p = _probe
    if p is not None and p.pid == os.getpid():
        try:
            p.stop(remove=True)
        except Exception:
            pass


def _after_fork_in_child() -> None:
    global _probe, _lock
    _lock = threading.Lock()
    old = _probe
    _probe = None
    if old is not None:
        try:
            start(old.dir, old.interval_s)
        except Exception:
            pass


def start(probe_dir: str | None = None, interval_s: float | None = None) -> bool:
    """Start this process's probe thread (idempotent). Returns True when a thread was started.

    Never raises; safe to call from code that may run without torch or CUDA.
    """
    global _probe, _hooks_installed
    try:
        with _lock:
            if _probe is not None and _probe.pid == os.getpid() and _probe._thread is not None:
                return False
            _probe = Probe(probe_dir, interval_s)
            if not _hooks_installed:
                atexit.register(_at_exit)
                if hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=_after_fork_in_child)
                _hooks_installed = True
            return _probe.start()
    except Exception:
        return False


def stop() -> None:
    """Stop this process's probe and remove its published file. Never raises."""
    global _probe
    try:
        with _lock:
            p, _probe = _probe, None
        if p is not None:
            p.stop(remove=True)
    except Exception:
        pass


def current() -> Probe | None:
    """This process's probe, if started (for tests and diagnostics)."""
    return _probe


def enabled_by_env() -> bool:
    return os.environ.get("FRAGSCOPE_PROBE", "").strip().lower() in ("1", "true", "yes", "on")
