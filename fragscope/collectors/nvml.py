"""GPU signals from NVML (nvidia-ml-py, imported as ``pynvml``). Signals: docs/collectors.md#nvml.

NVML sits behind one thin backend (:class:`NvmlBackend`) that wraps each pynvml call once and
turns every ``NVMLError`` into :class:`NotAvailable` with a reason (nvitop does the same), so the
collector's logic is tested on recorded real values and errors (:class:`RecordedBackend`) and
the real binding (:class:`PynvmlBackend`) stays a few lines per call.

No GPU or no driver: the collector says so once (one log line) and stays off.
"""
from __future__ import annotations

import ctypes
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from .http import LogOnce

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
class RecordedBackend:
    """Replays recorded NVML values and errors from JSON (tests, the agent's demo mode).

    Format (docs/collectors.md#recorded-nvml): ``{"driver_version", "init_error", "devices": [...]}``
    or ``{"timeline": [snapshot, ...]}`` (one snapshot per collect, the last one repeats). A value
    may be ``{"error": "NVML_ERROR_NOT_SUPPORTED"}``: it is raised as the real pynvml exception
    and translated like a live one.
    """

    def __init__(self, source: str | dict) -> None:
        if isinstance(source, dict):
            data = source
            self.path = "<dict>"
        else:
            self.path = source
            with open(source, encoding="utf-8") as fh:
                data = json.load(fh)
        self.timeline: list[dict] = list(data["timeline"]) if "timeline" in data else [data]
        if not self.timeline:
            raise ValueError(f"{self.path}: empty timeline")
        self.top = data
        self.tick = -1
        self.snap = self.timeline[0]

    def begin_tick(self) -> None:
        self.tick += 1
        self.snap = self.timeline[min(self.tick, len(self.timeline) - 1)]

    def _value(self, v):
        if isinstance(v, dict) and "error" in v:
            import pynvml
            code = getattr(pynvml, str(v["error"]), None)
            err = pynvml.NVMLError(code if isinstance(code, int) else pynvml.NVML_ERROR_UNKNOWN)
            raise translate_error(err)
        if v is None:
            raise NotAvailable(Reason.NOT_COLLECTED, "not in the recording")
        return v

    def _dev(self, h) -> dict:
        return self._value(h)

    def _field(self, h, key):
        return self._value(self._dev(h).get(key))

    def init(self) -> None:
        err = self.top.get("init_error") or self.snap.get("init_error")
        if err:
            self._value({"error": err})

    def shutdown(self) -> None:
        pass

    def driver_version(self) -> str:
        return str(self._value(self.top.get("driver_version") or self.snap.get("driver_version")))

    def device_count(self) -> int:
        return len(self._value(self.snap.get("devices")))

    def handle(self, index: int):
        devs = self.snap["devices"]
        d = devs[index]
        if "handle_error" in d:
            self._value({"error": d["handle_error"]})
        return d

    def uuid(self, h) -> str:
        return str(self._field(h, "uuid"))

    def name(self, h) -> str:
        return str(self._field(h, "name"))

    def memory_v2(self, h) -> MemInfo:
        m = self._field(h, "memory_v2")
        return MemInfo(int(m["total"]), int(m["used"]), int(m["free"]), int(m["reserved"]))

    def memory_v1(self, h) -> MemInfo:
        m = self._field(h, "memory_v1")
        return MemInfo(int(m["total"]), int(m["used"]), int(m["free"]), None)

    def processes(self, h) -> list[tuple[int, int | None]]:
        return [(int(p["pid"]), None if p.get("used_bytes") is None else int(p["used_bytes"]))
                for p in self._field(h, "processes")]

    def utilization(self, h) -> tuple[int, int]:
        u = self._field(h, "utilization")
        return int(u["gpu"]), int(u["memory"])

    def clock_mhz(self, h, kind: str) -> int:
        return int(self._value(self._field(h, "clock_mhz").get(kind)))

    def max_clock_mhz(self, h, kind: str) -> int:
        return int(self._value(self._field(h, "max_clock_mhz").get(kind)))

    def clock_event_reasons(self, h) -> int:
        return int(self._field(h, "clock_event_reasons"))

    def supported_clock_event_reasons(self, h) -> int:
        return int(self._field(h, "supported_clock_event_reasons"))

    def temperature_c(self, h) -> int:
        return int(self._field(h, "temperature_c"))

    def power_mw(self, h) -> int:
        return int(self._field(h, "power_mw"))

    def xid_events(self) -> dict[int, list[int]] | None:
        out: dict[int, list[int]] = {}
        any_registered = False
        for i, d in enumerate(self.snap.get("devices") or []):
            if "xid_events" in d:
                any_registered = True
                if d["xid_events"]:
                    out[i] = [int(x) for x in d["xid_events"]]
        return out if any_registered else None


# ---------------------------------------------------------------------------------------------
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
