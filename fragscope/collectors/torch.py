"""PyTorch caching-allocator signals, read from what the in-process probe publishes.

The probe (fragscope/probe/, docs/probe.md) writes ``<dir>/torch-<pid>.json`` atomically every
few seconds in each engine process that uses CUDA. This collector reads those files; it never
imports torch. Signals and reasons: docs/collectors.md#torch.
"""
from __future__ import annotations

import logging
import os

import math

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from ..probe.core import FILE_PREFIX, FILE_SUFFIX, MAX_RECORD_BYTES, RecordError, parse_record
from .logonce import LogOnce
from .safefile import printable, read_untrusted

log = logging.getLogger(__name__)

# Bounds on what the probe directory may make the agent hold: a process publishes one record with one
# entry per CUDA device it sees (8 on the largest nodes), so 64 records of 64 devices is far past a real
# node. Past them, files and devices are skipped and counted (``dropped``, exported by the agent).
MAX_PROBE_FILES = 64
MAX_DEVICES = 64
MAX_LABEL = 256  # uuid, torch version, allocator settings: longer values are cut
# A record is ~3 kB per device (probe/core.py): 256 KiB holds ~80 devices. Larger files are refused before
# they are parsed (a 1 MB record is ~10 MB of Python objects while decoded).
MAX_RECORD_READ = 256 * 1024


def _num(v) -> float | None:
    """A statistic as a float: a finite int or float below 2**63 in magnitude; anything else (a bool, a
    string, a 401-digit integer, NaN) is not a value."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return float(v) if -(1 << 63) <= v < (1 << 63) else None
    if isinstance(v, float) and math.isfinite(v):
        return v
    return None


def _text(v) -> str:
    s = str(v) if v is not None else ""
    return s if len(s) <= MAX_LABEL else s[:MAX_LABEL]

# fragscope name -> memory_stats() key. The first five are the signal-table contract.
CORE: tuple[tuple[str, str], ...] = (
    ("fragscope_torch_allocated_bytes", "allocated_bytes.all.current"),
    ("fragscope_torch_reserved_bytes", "reserved_bytes.all.current"),
    ("fragscope_torch_inactive_split_bytes", "inactive_split_bytes.all.current"),
    ("fragscope_torch_alloc_retries_total", "num_alloc_retries"),
    ("fragscope_torch_ooms_total", "num_ooms"),
)
EXTRA: tuple[tuple[str, str], ...] = (
    ("fragscope_torch_active_bytes", "active_bytes.all.current"),
    ("fragscope_torch_requested_bytes", "requested_bytes.all.current"),
    ("fragscope_torch_allocated_peak_bytes", "allocated_bytes.all.peak"),
    ("fragscope_torch_reserved_peak_bytes", "reserved_bytes.all.peak"),
    ("fragscope_torch_inactive_split_blocks", "inactive_split.all.current"),
    ("fragscope_torch_segments", "segment.all.current"),
    ("fragscope_torch_allocations", "allocation.all.current"),
    ("fragscope_torch_device_allocs_total", "num_device_alloc"),
    ("fragscope_torch_device_frees_total", "num_device_free"),
    ("fragscope_torch_sync_all_streams_total", "num_sync_all_streams"),
    ("fragscope_torch_oom_rejections_total", "num_oom_rejections"),
)
CORE_NAMES = tuple(n for n, _ in CORE)
# torch.cuda.host_memory_stats() keys the probe publishes under "host": the pinned (page-locked) host
# allocator, which a snapshot of torch <= 2.13 does not show (docs/snapshot.md#pinned-host-memory).
HOST = (
    ("fragscope_torch_host_pinned_bytes", "allocated_bytes.current"),  # owned: active + cached
    ("fragscope_torch_host_pinned_active_bytes", "active_bytes.current"),  # handed out to callers
    ("fragscope_torch_host_pinned_allocs_total", "num_host_alloc"),  # blocks created to grow the pool
)


def record_samples(rec: dict, ts: float) -> tuple[list[Sample], list[Missing]]:
    """One validated probe record -> samples stamped ``ts`` (pure; tested on recorded stats). At most
    ``MAX_DEVICES`` devices are read; a value that is not a finite number below 2**63 is left out."""
    samples: list[Sample] = []
    missing: list[Missing] = []
    pid = str(rec["pid"])
    for dev in rec["devices"][:MAX_DEVICES]:
        labels = {"pid": pid, "gpu": _text(dev["gpu"])}
        if dev.get("uuid"):
            labels["gpu_uuid"] = _text(dev["uuid"])
        lab = make_labels(labels)
        stats = dev["stats"]
        for name, key in CORE + EXTRA:
            v = _num(stats.get(key))
            if v is not None:
                samples.append(Sample(name, lab, ts, v))
            elif (name, key) in CORE:
                missing.append(Missing(name, lab, ts, Reason.NOT_EXPOSED,
                                       f"memory_stats() of torch {_text(rec.get('torch_version')) or '?'} has no "
                                       f"{key} (or not a number)"))
    plab = make_labels({"pid": pid})
    host = rec.get("host")
    if isinstance(host, dict):  # pinned host memory (torch.cuda.host_memory_stats(), per process)
        for name, key in HOST:
            v = _num(host.get(key))
            if v is not None:
                samples.append(Sample(name, plab, ts, v))
    errs = _num(rec.get("errors")) if isinstance(rec.get("errors"), int) else None
    if errs is not None:
        samples.append(Sample("fragscope_torch_probe_errors_total", plab, ts, errs))
    su = _num(rec.get("sample_us"))
    if su is not None:
        samples.append(Sample("fragscope_torch_probe_sample_seconds", plab, ts, su * 1e-6))
    info = {"pid": pid, "torch_version": _text(rec.get("torch_version") or ""),
            "allocator_backend": _text(rec.get("allocator_backend") or ""),
            "alloc_conf": _text(rec.get("alloc_conf") or ""),
            "history_enabled": {True: "true", False: "false"}.get(rec.get("history_enabled"), "")}
    samples.append(Sample("fragscope_torch_probe_info", make_labels(info), ts, 1.0))
    return samples, missing


class TorchProbeCollector:
    """Reads ``<probe_dir>/torch-<pid>.json``. Never raises; problems become Missing, logged once."""

    name = "torch"

    def __init__(self, probe_dir: str, stale_after_s: float = 30.0, uids: frozenset[int] | None = None,
                 extra_uids: tuple[int, ...] = ()) -> None:
        self.probe_dir = probe_dir
        self.stale_after_s = float(stale_after_s)
        self._uids = uids
        self._extra_uids = tuple(extra_uids)
        self._dir_log = LogOnce(log, f"torch probe dir {printable(probe_dir)}")
        self._file_logs: dict[str, LogOnce] = {}
        self._warned: set[str] = set()  # file names said to hold more than MAX_DEVICES devices
        # file name -> [(inode, size, mtime_ns), (rec ts, rec pid) or None, (ts, samples, missing) or None]: the
        # probe publishes every few seconds by an atomic rename (a new inode each time), the agent may read
        # every second; an unchanged file costs one stat instead of open + read + JSON decode, and its
        # samples are reused rather than rebuilt. The parsed record itself is not kept (a 1 MB record is
        # ~10 MB of Python objects); at most MAX_PROBE_FILES entries.
        self._records: dict[str, list] = {}
        # left out, counted (the agent exports it: fragscope_series_dropped_total{reason="probe_..."})
        self.dropped = {"probe_files": 0, "probe_devices": 0, "probe_unsafe": 0, "probe_unreadable": 0}

    def _trusted(self) -> frozenset[int] | None:
        if self._uids is not None:
            return self._uids
        uids = {os.geteuid(), *self._extra_uids}
        try:
            uids.add(os.stat(self.probe_dir).st_uid)
        except OSError:
            pass
        return frozenset(uids)

    def _file_log(self, fname: str) -> LogOnce:
        lg = self._file_logs.get(fname)
        if lg is None:
            if len(self._file_logs) > 256:  # pids come and go: keep the memo bounded
                self._file_logs.clear()
            lg = self._file_logs[fname] = LogOnce(log, f"torch probe file {printable(fname)}")
        return lg

    def _down(self, now: float, reason: Reason, msg: str) -> CollectResult:
        self._dir_log.problem(msg)
        return CollectResult(samples=[], missing=[Missing(n, (), now, reason, msg) for n in CORE_NAMES],
                             up=False, error=msg)

    def collect(self, now: float) -> CollectResult:
        try:
            return self._collect(now)
        except Exception as e:  # never raise into the agent
            return self._down(now, Reason.SOURCE_DOWN, f"torch collector failed: {type(e).__name__}: {e}"[:200])

    def _collect(self, now: float) -> CollectResult:
        d = self.probe_dir
        try:
            files = []
            seen = 0
            with os.scandir(d) as it:
                for ent in it:
                    n = ent.name
                    if n.startswith(FILE_PREFIX) and n.endswith(FILE_SUFFIX):
                        seen += 1
                        files.append(n)
                        if len(files) > 4 * MAX_PROBE_FILES:  # keep the list bounded while listing
                            files.sort()
                            del files[MAX_PROBE_FILES:]
        except FileNotFoundError:
            return self._down(now, Reason.NOT_COLLECTED,
                              f"probe directory {printable(d)} does not exist: start the engine under "
                              f"'fragscope-probe --dir {printable(d)} ...' and share the directory with the agent")
        except NotADirectoryError:
            return self._down(now, Reason.NOT_COLLECTED, f"probe directory {printable(d)} is not a directory")
        except PermissionError:
            return self._down(now, Reason.NO_PERMISSION, f"probe directory {printable(d)}: permission denied")
        files.sort()
        if len(files) > MAX_PROBE_FILES:
            self._dir_log.problem(f"{seen} probe files, more than {MAX_PROBE_FILES}: only the first "
                                  f"{MAX_PROBE_FILES} by name are read")
            self.dropped["probe_files"] += seen - MAX_PROBE_FILES
            del files[MAX_PROBE_FILES:]
        if not files:
            self._records.clear()
            return self._down(now, Reason.NOT_COLLECTED,
                              f"no {FILE_PREFIX}<pid>{FILE_SUFFIX} in {printable(d)}: the engine is not running "
                              "under fragscope-probe, or has not initialised CUDA yet")
        res = CollectResult()
        fresh = 0
        uids = self._trusted()
        for fname in files:
            try:
                fresh += self._one(fname, now, uids, res)
            except Exception as e:  # noqa: BLE001 - one bad file never takes the collector down
                self.dropped["probe_unreadable"] += 1
                self._file_log(fname).problem(f"{printable(os.path.join(d, fname))}: skipped "
                                              f"({type(e).__name__}: {printable(str(e), 120)})")
        for gone in set(self._records) - set(files):
            del self._records[gone]
        for gone in set(self._file_logs) - set(files):
            del self._file_logs[gone]
        if fresh == 0:
            msg = f"no live probe in {printable(d)} ({len(files)} stale, unreadable or refused file(s))"
            self._dir_log.problem(msg)
            res.up = False
            res.error = msg
        else:
            self._dir_log.ok()
        return res

    def _one(self, fname: str, now: float, uids: frozenset[int] | None, res: CollectResult) -> int:
        """Read one probe file into ``res``; 1 when it held a live record."""
        flog = self._file_log(fname)
        pid_part = fname[len(FILE_PREFIX):-len(FILE_SUFFIX)]
        plab = make_labels({"pid": pid_part}) if pid_part.isdigit() and len(pid_part) <= 10 else ()
        path = os.path.join(self.probe_dir, fname)
        shown = printable(path)
        try:
            st = os.lstat(path)
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            memo = self._records.get(fname)
            if memo is None or memo[0] != sig:
                rec = parse_record(read_untrusted(path, uids, min(MAX_RECORD_BYTES, MAX_RECORD_READ)))
                memo = self._records[fname] = [sig, rec, None]
            rec = memo[1]
        except FileNotFoundError:
            return 0  # removed between listing and open: the process exited
        except (OSError, RecordError) as e:
            self._records.pop(fname, None)
            if isinstance(e, OSError) and e.__class__.__name__ == "UnsafeFile":
                self.dropped["probe_unsafe"] += 1
            msg = f"{shown}: {printable(e.strerror if isinstance(e, OSError) and e.strerror else str(e), 200)}"
            flog.problem(msg)
            res.missing.extend(Missing(n, plab, now, Reason.PARSE_ERROR, msg) for n in CORE_NAMES)
            return 0
        age = now - float(rec["ts"])
        if age > self.stale_after_s:
            msg = (f"{shown}: last sample {age:.0f} s old (> {self.stale_after_s:g} s): "
                   f"process {rec['pid']} exited or its probe stopped")
            flog.problem(msg, logging.INFO)
            res.missing.extend(Missing(n, plab, now, Reason.SOURCE_DOWN, msg) for n in CORE_NAMES)
            return 0
        if memo[2] is None:
            if len(rec["devices"]) > MAX_DEVICES:
                self.dropped["probe_devices"] += len(rec["devices"]) - MAX_DEVICES
                if fname not in self._warned:  # once per file name, not per record it publishes
                    if len(self._warned) >= MAX_PROBE_FILES:
                        self._warned.clear()
                    self._warned.add(fname)
                    log.warning("torch probe file %s: %d devices, more than %d: the first %d are read", shown,
                                len(rec["devices"]), MAX_DEVICES, MAX_DEVICES)
            memo[2] = record_samples(rec, float(rec["ts"]))
            memo[1] = {"ts": rec["ts"], "pid": rec["pid"]}  # the samples are what is kept, not the record
        samples, missing = memo[2]
        if age < -5.0:  # the clocks disagree (a clock jump): stamped now, not at the probe's sampling time
            samples = [Sample(x.name, x.labels, now, x.value) for x in samples]
        res.samples.extend(samples)
        res.missing.extend(missing)
        flog.ok()
        return 1
