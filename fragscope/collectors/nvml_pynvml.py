"""The real NVML backend, through nvidia-ml-py (imported as ``pynvml`` on first use).

Each pynvml call is wrapped once (``PynvmlBackend._call``) and its errors translated to
:class:`~fragscope.collectors.nvml_backend.NotAvailable`; XID errors come from an NVML event set.
"""
from __future__ import annotations

import ctypes
from typing import Callable

from ..model import Reason
from .nvml_backend import MemInfo, NotAvailable, translate_error

class PynvmlBackend:
    """The real NVML, through nvidia-ml-py. Each pynvml call is wrapped once by ``_call``."""

    _MAX_XID_PER_TICK = 64

    def __init__(self) -> None:
        self._nv = None
        self._events = None
        self._handle_index: dict[int, int] = {}

    def _call(self, fn: Callable, *args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as e:
            raise translate_error(e) from None

    def init(self) -> None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError as e:
            raise NotAvailable(Reason.NO_GPU, f"nvidia-ml-py is not installed ({e})") from None
        self._nv = pynvml
        self._call(pynvml.nvmlInit)
        self._setup_xid()

    def _setup_xid(self) -> None:
        nv = self._nv
        try:
            es = nv.nvmlEventSetCreate()
        except Exception:
            return
        registered = 0
        for i in range(self.device_count()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
                self._handle_index[ctypes.cast(h, ctypes.c_void_p).value or 0] = i
                registered += 1
            except Exception:
                continue
        if registered:
            self._events = es
        else:
            try:
                nv.nvmlEventSetFree(es)
            except Exception:
                pass

    def shutdown(self) -> None:
        if self._nv is None:
            return
        try:
            if self._events is not None:
                self._nv.nvmlEventSetFree(self._events)
            self._nv.nvmlShutdown()
        except Exception:
            pass
        self._events = None

    def driver_version(self) -> str:
        v = self._call(self._nv.nvmlSystemGetDriverVersion)
        return v.decode() if isinstance(v, bytes) else str(v)

    def device_count(self) -> int:
        return int(self._call(self._nv.nvmlDeviceGetCount))

    def handle(self, index: int):
        return self._call(self._nv.nvmlDeviceGetHandleByIndex, index)

    def uuid(self, h) -> str:
        v = self._call(self._nv.nvmlDeviceGetUUID, h)
        return v.decode() if isinstance(v, bytes) else str(v)

    def name(self, h) -> str:
        v = self._call(self._nv.nvmlDeviceGetName, h)
        return v.decode() if isinstance(v, bytes) else str(v)

    def memory_v2(self, h) -> MemInfo:
        m = self._call(self._nv.nvmlDeviceGetMemoryInfo, h, version=self._nv.nvmlMemory_v2)
        return MemInfo(int(m.total), int(m.used), int(m.free), int(m.reserved))

    def memory_v1(self, h) -> MemInfo:
        m = self._call(self._nv.nvmlDeviceGetMemoryInfo, h)
        return MemInfo(int(m.total), int(m.used), int(m.free), None)

    def processes(self, h) -> list[tuple[int, int | None]]:
        procs = self._call(self._nv.nvmlDeviceGetComputeRunningProcesses, h)
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if used is None else int(used)))
        return out

    def utilization(self, h) -> tuple[int, int]:
        u = self._call(self._nv.nvmlDeviceGetUtilizationRates, h)
        return int(u.gpu), int(u.memory)

    def clock_mhz(self, h, kind: str) -> int:
        nv = self._nv
        return int(self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM if kind == "sm" else nv.NVML_CLOCK_MEM))

    def max_clock_mhz(self, h, kind: str) -> int:
        nv = self._nv
        return int(self._call(nv.nvmlDeviceGetMaxClockInfo, h,
                              nv.NVML_CLOCK_SM if kind == "sm" else nv.NVML_CLOCK_MEM))

    def _renamed(self, new: str, old: str, h) -> int:
        """Call NVML's current name, falling back to the pre-535 one ("Throttle" -> "Events")."""
        fn = getattr(self._nv, new, None)
        if fn is not None:
            try:
                return int(self._call(fn, h))
            except NotAvailable as e:
                if e.reason is not Reason.UNSUPPORTED:
                    raise
        return int(self._call(getattr(self._nv, old), h))

    def clock_event_reasons(self, h) -> int:
        return self._renamed("nvmlDeviceGetCurrentClocksEventReasons",
                             "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def supported_clock_event_reasons(self, h) -> int:
        return self._renamed("nvmlDeviceGetSupportedClocksEventReasons",
                             "nvmlDeviceGetSupportedClocksThrottleReasons", h)

    def temperature_c(self, h) -> int:
        return int(self._call(self._nv.nvmlDeviceGetTemperature, h, self._nv.NVML_TEMPERATURE_GPU))

    def power_mw(self, h) -> int:
        return int(self._call(self._nv.nvmlDeviceGetPowerUsage, h))

    def ecc_errors(self, h, uncorrected: bool, volatile: bool) -> int:
        nv = self._nv
        return int(self._call(nv.nvmlDeviceGetTotalEccErrors, h,
                              nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                              nv.NVML_VOLATILE_ECC if volatile else nv.NVML_AGGREGATE_ECC))

    def remapped_rows(self, h) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failed = self._call(self._nv.nvmlDeviceGetRemappedRows, h)
        return int(corr), int(unc), bool(pending), bool(failed)

    def retired_pages_pending(self, h) -> bool:
        return bool(self._call(self._nv.nvmlDeviceGetRetiredPagesPendingStatus, h))

    def pcie_link(self, h) -> tuple[int, int, int, int]:
        nv = self._nv
        return (int(self._call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)),
                int(self._call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)),
                int(self._call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)),
                int(self._call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)))

    def pcie_replays(self, h) -> int:
        return int(self._call(self._nv.nvmlDeviceGetPcieReplayCounter, h))

    def xid_events(self) -> dict[int, list[int]] | None:
        """Drain pending XID events without waiting (timeout 0 ms): costs one ioctl when none."""
        if self._events is None:
            return None
        nv = self._nv
        out: dict[int, list[int]] = {}
        for _ in range(self._MAX_XID_PER_TICK):
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception as e:
                if type(e).__name__ == "NVMLError_Timeout":
                    break
                raise translate_error(e) from None
            idx = self._handle_index.get(ctypes.cast(ev.device, ctypes.c_void_p).value or 0, -1)
            out.setdefault(idx, []).append(int(ev.eventData))
        return out
