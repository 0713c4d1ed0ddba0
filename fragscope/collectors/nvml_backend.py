"""The NVML seam: the backend protocol every NVML source implements, and NVML errors as reasons.

One method per NVML call (:class:`NvmlBackend`); each returns base values or raises
:class:`NotAvailable` with a :class:`~fragscope.model.Reason`, never ``NVMLError``
(:func:`translate_error` maps pynvml's error classes). The real binding lives in nvml_pynvml.py, the
replay of recorded values in nvml_recorded.py, the collector in nvml.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..model import Reason

MIB = 1024 * 1024

# Clock-event (formerly "throttle") reason bits, nvmlClocksEventReason* in nvml.h / pynvml.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

# Signals per GPU that the collector emits (for Missing entries when a device cannot be read).
GPU_SIGNALS = ("fragscope_gpu_memory_used_bytes", "fragscope_gpu_memory_total_bytes",
               "fragscope_gpu_memory_free_bytes", "fragscope_gpu_utilization_ratio",
               "fragscope_gpu_sm_clock_hertz", "fragscope_gpu_temperature_celsius",
               "fragscope_gpu_power_watts", "fragscope_gpu_throttle_reason_active")


class NotAvailable(Exception):
    """An NVML value that could not be read, with a reason (model.Reason) and NVML's words."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(detail or reason.value)
        self.reason = reason
        self.detail = detail


# NVML error class name (pynvml.NVMLError_<Name>) -> reason
_ERROR_REASONS: dict[str, Reason] = {
    "NotSupported": Reason.UNSUPPORTED,
    "FunctionNotFound": Reason.UNSUPPORTED,  # older driver than the binding
    "ArgumentVersionMismatch": Reason.UNSUPPORTED,  # e.g. memory v2 on an old driver
    "Deprecated": Reason.UNSUPPORTED,
    "NoPermission": Reason.NO_PERMISSION,
    "LibraryNotFound": Reason.NO_GPU,
    "DriverNotLoaded": Reason.NO_GPU,
    "GpuNotFound": Reason.NO_GPU,
    "LibRmVersionMismatch": Reason.SOURCE_DOWN,
    "Uninitialized": Reason.SOURCE_DOWN,
    "GpuIsLost": Reason.SOURCE_DOWN,
    "ResetRequired": Reason.SOURCE_DOWN,
    "Timeout": Reason.TIMEOUT,
    "NoData": Reason.NOT_COLLECTED,
    "NotFound": Reason.NOT_COLLECTED,
}


def translate_error(e: BaseException) -> NotAvailable:
    """Any exception from a pynvml call -> NotAvailable with a reason and a short detail."""
    cls = type(e).__name__
    if cls.startswith("NVMLError_"):
        key = cls[len("NVMLError_"):]
        try:
            words = str(e)
        except Exception:
            words = key
        return NotAvailable(_ERROR_REASONS.get(key, Reason.SOURCE_DOWN), f"NVML: {words}")
    if cls == "NVMLError":
        return NotAvailable(Reason.SOURCE_DOWN, f"NVML error {getattr(e, 'value', '?')}")
    if isinstance(e, (AttributeError, NotImplementedError)):
        return NotAvailable(Reason.UNSUPPORTED, f"nvidia-ml-py lacks this call ({e})")
    if isinstance(e, OSError):
        return NotAvailable(Reason.NO_GPU, f"cannot load NVML ({e})")
    return NotAvailable(Reason.SOURCE_DOWN, f"{cls}: {e}")


@dataclass(frozen=True, slots=True)
class MemInfo:
    total: int  # bytes
    used: int
    free: int
    reserved: int | None = None  # v2 only: driver/firmware reservation


class NvmlBackend(Protocol):
    """One method per NVML call. Each returns base values or raises NotAvailable (never NVMLError)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def uuid(self, h: Any) -> str: ...
    def name(self, h: Any) -> str: ...
    def memory_v2(self, h: Any) -> MemInfo: ...
    def memory_v1(self, h: Any) -> MemInfo: ...
    def processes(self, h: Any) -> list[tuple[int, int | None]]: ...  # (pid, used bytes or None)
    def utilization(self, h: Any) -> tuple[int, int]: ...  # (gpu %, memory-copy %)
    def clock_mhz(self, h: Any, kind: str) -> int: ...  # kind: "sm" | "mem"
    def max_clock_mhz(self, h: Any, kind: str) -> int: ...
    def clock_event_reasons(self, h: Any) -> int: ...  # active bitmask
    def supported_clock_event_reasons(self, h: Any) -> int: ...
    def temperature_c(self, h: Any) -> int: ...
    def power_mw(self, h: Any) -> int: ...
    def xid_events(self) -> dict[int, list[int]] | None: ...  # device index -> XIDs since last call
    # hardware health (gpu-hardware-fault): nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRemappedRows,
    # nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width},
    # nvmlDeviceGetPcieReplayCounter
    def ecc_errors(self, h: Any, uncorrected: bool, volatile: bool) -> int: ...
    def remapped_rows(self, h: Any) -> tuple[int, int, bool, bool]: ...  # (corrected, uncorrected, pending, failed)
    def retired_pages_pending(self, h: Any) -> bool: ...
    def pcie_link(self, h: Any) -> tuple[int, int, int, int]: ...  # (gen, max gen, width, max width)
    def pcie_replays(self, h: Any) -> int: ...
