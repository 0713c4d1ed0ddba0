"""GPU signals from NVML (nvidia-ml-py, imported as ``pynvml``). Signals: docs/collectors.md#nvml.

NVML sits behind one thin backend (:class:`NvmlBackend`) that wraps each pynvml call once and
turns every ``NVMLError`` into :class:`NotAvailable` with a reason (nvitop does the same), so the
collector's logic is tested on recorded real values and errors (:class:`RecordedBackend`) and
the real binding (:class:`PynvmlBackend`) stays a few lines per call.

No GPU or no driver: the collector says so once (one log line) and stays off.
"""
from __future__ import annotations

import logging

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from .logonce import LogOnce
from .nvml_backend import (GPU_SIGNALS, MIB, THROTTLE_REASONS, MemInfo, NotAvailable, NvmlBackend,  # noqa: F401
                           translate_error)
from .nvml_pynvml import PynvmlBackend
from .nvml_recorded import RecordedBackend  # noqa: F401 - importable from here (agent/plan.py, tests)

log = logging.getLogger(__name__)

__all__ = ["GPU_SIGNALS", "MIB", "THROTTLE_REASONS", "MemInfo", "NotAvailable", "NvmlBackend", "NvmlCollector",
           "PynvmlBackend", "RecordedBackend", "translate_error"]


class NvmlCollector:
    """Per-GPU memory, per-process memory, utilization, clocks, clock-event reasons, temperature,
    power and XID errors. Never raises; unreadable values become Missing with a reason."""

    name = "nvml"

    def __init__(self, backend: NvmlBackend | None = None) -> None:
        self.backend = backend if backend is not None else PynvmlBackend()
        self._ready = False
        self._off: str | None = None  # set when there is no GPU / driver: stay off
        self._trouble = LogOnce(log, "nvml")
        self._said: set[tuple[str, str, str]] = set()  # (gpu, signal, reason) already logged
        self._mem_v1: set[int] = set()  # devices where memory v2 is unsupported
        self._xid_total: dict[int, int] = {}
        self._xid_last: dict[int, int] = {}
        self.driver: str | None = None

    # -- helpers --------------------------------------------------------------------------------
    def _note(self, gpu: str, signal: str, e: NotAvailable) -> None:
        key = (gpu, signal, e.reason.value)
        if key not in self._said and len(self._said) < 1024:
            self._said.add(key)
            log.info("nvml: GPU %s: %s not available: %s (%s)", gpu, signal, e.reason.value, e.detail)

    def _start(self, now: float) -> CollectResult | None:
        if self._ready:
            return None
        try:
            self.backend.init()
            n = self.backend.device_count()
        except NotAvailable as e:
            if e.reason is Reason.NO_GPU:
                self._off = f"no NVIDIA GPU or driver here ({e.detail}); the NVML collector stays off"
                log.warning("nvml: %s", self._off)
                return self._down(now, Reason.NO_GPU, self._off)
            msg = f"NVML init failed: {e.detail} ({e.reason.value})"
            self._trouble.problem(msg)
            return self._down(now, e.reason, msg)
        except Exception as e:  # a backend that broke its contract
            msg = f"NVML init failed: {type(e).__name__}: {e}"
            self._trouble.problem(msg)
            return self._down(now, Reason.SOURCE_DOWN, msg)
        if n == 0:
            self._off = "NVML reports 0 GPUs; the NVML collector stays off"
            log.warning("nvml: %s", self._off)
            return self._down(now, Reason.NO_GPU, self._off)
        try:
            self.driver = self.backend.driver_version()
        except Exception:
            self.driver = None
        self._ready = True
        log.info("nvml: %d GPU(s), driver %s", n, self.driver or "?")
        return None

    @staticmethod
    def _down(now: float, reason: Reason, msg: str) -> CollectResult:
        return CollectResult(missing=[Missing(n, (), now, reason, msg) for n in GPU_SIGNALS], up=False, error=msg)

    # -- collect --------------------------------------------------------------------------------
    def collect(self, now: float) -> CollectResult:
        if self._off is not None:
            return self._down(now, Reason.NO_GPU, self._off)
        try:
            begin = getattr(self.backend, "begin_tick", None)
            if begin is not None:
                begin()
            early = self._start(now)
            if early is not None:
                return early
            return self._collect(now)
        except Exception as e:  # never raise into the agent
            msg = f"NVML collector failed: {type(e).__name__}: {e}"[:200]
            self._trouble.problem(msg)
            return self._down(now, Reason.SOURCE_DOWN, msg)

    def _collect(self, now: float) -> CollectResult:
        b = self.backend
        res = CollectResult()
        try:
            n = b.device_count()
        except NotAvailable as e:
            msg = f"NVML device count failed: {e.detail}"
            self._trouble.problem(msg)
            if e.reason is Reason.SOURCE_DOWN:
                self._ready = False  # e.g. Uninitialized after a driver reload: init again next tick
            return self._down(now, e.reason, msg)
        try:
            xids = b.xid_events()
        except NotAvailable:
            xids = None
        lost = []
        for i in range(n):
            ok = self._device(i, now, res, xids)
            if not ok:
                lost.append(str(i))
        if lost and len(lost) == n:
            res.up = False
            res.error = f"no GPU could be read (GPU {', '.join(lost)})"
            self._trouble.problem(res.error)
        else:
            if lost:
                self._trouble.problem(f"GPU {', '.join(lost)} could not be read")
            else:
                self._trouble.ok()
        return res

    @staticmethod
    def _hardware(b, h, put, miss) -> None:
        """ECC error counts, row remapping, retired pages, the PCIe link and its replays (gpu-hardware-fault).
        A backend without these calls (an older recording) reports them unsupported, never zero."""
        def call(name: str, *args):
            fn = getattr(b, name, None)
            if fn is None:
                raise NotAvailable(Reason.UNSUPPORTED, f"this NVML backend has no {name}")
            return fn(h, *args)

        for unc, vol, name in ((True, True, "fragscope_gpu_ecc_uncorrected_volatile_total"),
                               (False, True, "fragscope_gpu_ecc_corrected_volatile_total"),
                               (True, False, "fragscope_gpu_ecc_uncorrected_aggregate_total")):
            try:
                put(name, call("ecc_errors", unc, vol))
            except NotAvailable as e:
                miss(name, e)
        try:
            _corr, unc_rows, pending, failed = call("remapped_rows")
            put("fragscope_gpu_remapped_rows_uncorrectable_total", unc_rows)
            put("fragscope_gpu_row_remap_pending", 1.0 if pending else 0.0)
            put("fragscope_gpu_row_remap_failed", 1.0 if failed else 0.0)
        except NotAvailable as e:
            miss("fragscope_gpu_row_remap_pending", e)  # pre-Ampere GPUs retire pages instead
        try:
            put("fragscope_gpu_retired_pages_pending", 1.0 if call("retired_pages_pending") else 0.0)
        except NotAvailable as e:
            miss("fragscope_gpu_retired_pages_pending", e)  # Ampere and later remap rows instead
        try:
            gen, max_gen, width, max_width = call("pcie_link")
            put("fragscope_gpu_pcie_link_gen", gen)
            put("fragscope_gpu_pcie_link_gen_max", max_gen)
            put("fragscope_gpu_pcie_link_width", width)
            put("fragscope_gpu_pcie_link_width_max", max_width)
        except NotAvailable as e:
            miss("fragscope_gpu_pcie_link_gen", e)
        try:
            put("fragscope_gpu_pcie_replays_total", call("pcie_replays"))
        except NotAvailable as e:
            miss("fragscope_gpu_pcie_replays_total", e)

    def _device(self, i: int, now: float, res: CollectResult, xids: dict[int, list[int]] | None) -> bool:
        b = self.backend
        gpu = str(i)
        try:
            h = b.handle(i)
        except NotAvailable as e:
            lab = make_labels({"gpu": gpu})
            res.missing.extend(Missing(s, lab, now, e.reason, e.detail) for s in GPU_SIGNALS)
            self._note(gpu, "device", e)
            return False
        try:
            uuid = b.uuid(h)
        except NotAvailable:
            uuid = ""
        base = {"gpu": gpu, "gpu_uuid": uuid} if uuid else {"gpu": gpu}
        lab = make_labels(base)
        samples = res.samples

        def put(name: str, value: float, labels=lab) -> None:
            samples.append(Sample(name, labels, now, float(value)))

        def miss(name: str, e: NotAvailable, labels=lab) -> None:
            res.missing.append(Missing(name, labels, now, e.reason, e.detail))
            self._note(gpu, name, e)

        # memory: v2 (used excludes the driver reservation, as nvidia-smi shows) with v1 fallback
        mem = None
        if i not in self._mem_v1:
            try:
                mem = b.memory_v2(h)
            except NotAvailable as e:
                if e.reason in (Reason.UNSUPPORTED, Reason.NOT_COLLECTED):
                    self._mem_v1.add(i)
                else:
                    for s in ("fragscope_gpu_memory_used_bytes", "fragscope_gpu_memory_total_bytes",
                              "fragscope_gpu_memory_free_bytes"):
                        miss(s, e)
        if mem is None and i in self._mem_v1:
            try:
                mem = b.memory_v1(h)
            except NotAvailable as e:
                for s in ("fragscope_gpu_memory_used_bytes", "fragscope_gpu_memory_total_bytes",
                          "fragscope_gpu_memory_free_bytes"):
                    miss(s, e)
        if mem is not None:
            put("fragscope_gpu_memory_used_bytes", mem.used)
            put("fragscope_gpu_memory_total_bytes", mem.total)
            put("fragscope_gpu_memory_free_bytes", mem.free)
            if mem.reserved is not None:
                put("fragscope_gpu_memory_reserved_bytes", mem.reserved)

        try:
            for pid, used in b.processes(h):
                plab = make_labels({**base, "pid": str(pid)})
                if used is None:
                    miss("fragscope_gpu_process_memory_used_bytes",
                         NotAvailable(Reason.UNSUPPORTED, "NVML gives no per-process memory here"), plab)
                else:
                    put("fragscope_gpu_process_memory_used_bytes", used, plab)
        except NotAvailable as e:
            miss("fragscope_gpu_process_memory_used_bytes", e)

        try:
            g, m = b.utilization(h)
            put("fragscope_gpu_utilization_ratio", g / 100.0)
            put("fragscope_gpu_memory_copy_utilization_ratio", m / 100.0)
        except NotAvailable as e:
            miss("fragscope_gpu_utilization_ratio", e)

        for kind, name in (("sm", "fragscope_gpu_sm_clock_hertz"), ("mem", "fragscope_gpu_memory_clock_hertz")):
            try:
                put(name, b.clock_mhz(h, kind) * 1e6)
            except NotAvailable as e:
                miss(name, e)
        for kind, name in (("sm", "fragscope_gpu_sm_clock_max_hertz"),
                           ("mem", "fragscope_gpu_memory_clock_max_hertz")):
            try:
                put(name, b.max_clock_mhz(h, kind) * 1e6)
            except NotAvailable as e:
                miss(name, e)

        try:
            active = b.clock_event_reasons(h)
            try:
                supported = b.supported_clock_event_reasons(h)
            except NotAvailable:
                supported = None
            for bit, reason in THROTTLE_REASONS:
                if supported is not None and not supported & bit:
                    continue  # this GPU cannot report that reason: absent, not "inactive"
                put("fragscope_gpu_throttle_reason_active", 1.0 if active & bit else 0.0,
                    make_labels({**base, "reason": reason}))
        except NotAvailable as e:
            miss("fragscope_gpu_throttle_reason_active", e)

        try:
            put("fragscope_gpu_temperature_celsius", b.temperature_c(h))
        except NotAvailable as e:
            miss("fragscope_gpu_temperature_celsius", e)
        try:
            put("fragscope_gpu_power_watts", b.power_mw(h) / 1000.0)
        except NotAvailable as e:
            miss("fragscope_gpu_power_watts", e)

        self._hardware(b, h, put, miss)

        if xids is not None:
            got = xids.get(i) or []
            if got:
                self._xid_total[i] = self._xid_total.get(i, 0) + len(got)
                self._xid_last[i] = got[-1]
                log.warning("nvml: GPU %s: XID error(s) %s", gpu, ", ".join(map(str, got)))
            put("fragscope_gpu_xid_errors_total", self._xid_total.get(i, 0))
            if i in self._xid_last:
                put("fragscope_gpu_last_xid", self._xid_last[i])
        return True
