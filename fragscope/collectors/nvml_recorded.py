"""Recorded NVML values and errors replayed as a backend (tests, the agent's demo mode).

Format: docs/collectors.md#recorded-nvml. A recorded error is raised as the real pynvml exception and
translated like a live one.
"""
from __future__ import annotations

import json

from ..model import Reason
from .nvml_backend import MemInfo, NotAvailable, translate_error

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

    def ecc_errors(self, h, uncorrected: bool, volatile: bool) -> int:
        key = ("uncorrected" if uncorrected else "corrected") + ("_volatile" if volatile else "_aggregate")
        return int(self._value(self._field(h, "ecc_errors").get(key)))

    def remapped_rows(self, h) -> tuple[int, int, bool, bool]:
        r = self._field(h, "remapped_rows")
        return int(r["corrected"]), int(r["uncorrected"]), bool(r["pending"]), bool(r["failed"])

    def retired_pages_pending(self, h) -> bool:
        return bool(self._field(h, "retired_pages_pending"))

    def pcie_link(self, h) -> tuple[int, int, int, int]:
        r = self._field(h, "pcie_link")
        return int(r["gen"]), int(r["max_gen"]), int(r["width"]), int(r["max_width"])

    def pcie_replays(self, h) -> int:
        return int(self._field(h, "pcie_replays"))

    def xid_events(self) -> dict[int, list[int]] | None:
        out: dict[int, list[int]] = {}
        any_registered = False
        for i, d in enumerate(self.snap.get("devices") or []):
            if "xid_events" in d:
                any_registered = True
                if d["xid_events"]:
                    out[i] = [int(x) for x in d["xid_events"]]
        return out if any_registered else None
