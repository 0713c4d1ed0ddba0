"""PyTorch caching-allocator signals, read from what the in-process probe publishes.

The probe (fragscope/probe/, docs/probe.md) writes ``<dir>/torch-<pid>.json`` atomically every
few seconds in each engine process that uses CUDA. This collector reads those files; it never
imports torch. Signals and reasons: docs/collectors.md#torch.
"""
from __future__ import annotations

import logging
import os

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from ..probe.core import FILE_PREFIX, FILE_SUFFIX, MAX_RECORD_BYTES, RecordError, parse_record
from .logonce import LogOnce

log = logging.getLogger(__name__)

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
    """One validated probe record -> samples stamped ``ts`` (pure; tested on recorded stats)."""
    samples: list[Sample] = []
    missing: list[Missing] = []
    pid = str(rec["pid"])
    for dev in rec["devices"]:
        labels = {"pid": pid, "gpu": str(dev["gpu"])}
        if dev.get("uuid"):
            labels["gpu_uuid"] = str(dev["uuid"])
        lab = make_labels(labels)
        stats = dev["stats"]
        for name, key in CORE + EXTRA:
            v = stats.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                samples.append(Sample(name, lab, ts, float(v)))
            elif (name, key) in CORE:
                missing.append(Missing(name, lab, ts, Reason.NOT_EXPOSED,
                                       f"memory_stats() of torch {rec.get('torch_version') or '?'} has no {key}"))
    plab = make_labels({"pid": pid})
    host = rec.get("host")
    if isinstance(host, dict):  # pinned host memory (torch.cuda.host_memory_stats(), per process)
        for name, key in HOST:
            v = host.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                samples.append(Sample(name, plab, ts, float(v)))
    if isinstance(rec.get("errors"), int):
        samples.append(Sample("fragscope_torch_probe_errors_total", plab, ts, float(rec["errors"])))
    su = rec.get("sample_us")
    if isinstance(su, (int, float)) and not isinstance(su, bool):
        samples.append(Sample("fragscope_torch_probe_sample_seconds", plab, ts, float(su) * 1e-6))
    info = {"pid": pid, "torch_version": str(rec.get("torch_version") or ""),
            "allocator_backend": str(rec.get("allocator_backend") or ""),
            "alloc_conf": str(rec.get("alloc_conf") or ""),
            "history_enabled": {True: "true", False: "false"}.get(rec.get("history_enabled"), "")}
    samples.append(Sample("fragscope_torch_probe_info", make_labels(info), ts, 1.0))
    return samples, missing


class TorchProbeCollector:
    """Reads ``<probe_dir>/torch-<pid>.json``. Never raises; problems become Missing, logged once."""

    name = "torch"

    def __init__(self, probe_dir: str, stale_after_s: float = 30.0) -> None:
        self.probe_dir = probe_dir
        self.stale_after_s = float(stale_after_s)
        self._dir_log = LogOnce(log, f"torch probe dir {probe_dir}")
        self._file_logs: dict[str, LogOnce] = {}
        # file name -> [(inode, size, mtime_ns), record, (ts, samples, missing) or None]: the probe
        # publishes every few seconds by an atomic rename (a new inode each time), the agent may read
        # every second; an unchanged file costs one stat instead of open + read + JSON decode, and
        # its samples are reused rather than rebuilt.
        self._records: dict[str, list] = {}

    def _file_log(self, fname: str) -> LogOnce:
        lg = self._file_logs.get(fname)
        if lg is None:
            if len(self._file_logs) > 256:  # pids come and go: keep the memo bounded
                self._file_logs.clear()
            lg = self._file_logs[fname] = LogOnce(log, f"torch probe file {fname}")
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
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            return self._down(now, Reason.NOT_COLLECTED,
                              f"probe directory {d} does not exist: start the engine under "
                              f"'fragscope-probe --dir {d} ...' and share the directory with the agent")
        except NotADirectoryError:
            return self._down(now, Reason.NOT_COLLECTED, f"probe directory {d} is not a directory")
        except PermissionError:
            return self._down(now, Reason.NO_PERMISSION, f"probe directory {d}: permission denied")
        files = [n for n in names if n.startswith(FILE_PREFIX) and n.endswith(FILE_SUFFIX)]
        if not files:
            self._records.clear()
            return self._down(now, Reason.NOT_COLLECTED,
                              f"no {FILE_PREFIX}<pid>{FILE_SUFFIX} in {d}: the engine is not running under "
                              "fragscope-probe, or has not initialised CUDA yet")
        res = CollectResult()
        fresh = 0
        for fname in files:
            flog = self._file_log(fname)
            pid_part = fname[len(FILE_PREFIX):-len(FILE_SUFFIX)]
            plab = make_labels({"pid": pid_part}) if pid_part.isdigit() else ()
            path = os.path.join(d, fname)
            try:
                st = os.stat(path)
                sig = (st.st_ino, st.st_size, st.st_mtime_ns)
                memo = self._records.get(fname)
                if memo is None or memo[0] != sig:
                    with open(path, "rb") as fh:
                        raw = fh.read(MAX_RECORD_BYTES + 1)
                    memo = self._records[fname] = [sig, parse_record(raw), None]
                rec = memo[1]
            except FileNotFoundError:
                continue  # removed between listdir and open: the process exited
            except (OSError, RecordError) as e:
                msg = f"{path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
                flog.problem(msg)
                res.missing.extend(Missing(n, plab, now, Reason.PARSE_ERROR, msg) for n in CORE_NAMES)
                continue
            age = now - float(rec["ts"])
            if age > self.stale_after_s:
                msg = (f"{path}: last sample {age:.0f} s old (> {self.stale_after_s:g} s): "
                       f"process {rec['pid']} exited or its probe stopped")
                flog.problem(msg, logging.INFO)
                res.missing.extend(Missing(n, plab, now, Reason.SOURCE_DOWN, msg) for n in CORE_NAMES)
                continue
            # the probe's sampling time, unless the clocks disagree (clock jump): then now
            ts = float(rec["ts"]) if age >= -5.0 else now
            if memo[2] is None or memo[2][0] != ts:
                memo[2] = (ts, *record_samples(rec, ts))
            _, samples, missing = memo[2]
            res.samples.extend(samples)
            res.missing.extend(missing)
            fresh += 1
            flog.ok()
        for gone in set(self._records) - set(files):
            del self._records[gone]
        if fresh == 0:
            msg = f"no live probe in {d} ({len(files)} stale or unreadable file(s))"
            self._dir_log.problem(msg)
            res.up = False
            res.error = msg
        else:
            self._dir_log.ok()
        return res
