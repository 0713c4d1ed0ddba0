"""gpu-hardware-fault on a real faulty GPU's output: an A100 whose driver logged Xid 63 and whose
`nvidia-smi -q` shows a row remap pending beside 177 corrected DRAM ECC errors, as published in
stas00/ml-engineering (tests/data/newdiag/README.md). The values are read from the text here, replayed
through the recorded-NVML backend (what NVML reports for the same fields) and judged."""
from __future__ import annotations

import re
from pathlib import Path

from fragscope.collectors.nvml import NvmlCollector, RecordedBackend
from fragscope.detectors import gpu_fault
from fragscope.detectors.frame import build_frame
from fragscope.model import SeriesKey, Severity, Window

TEXT = (Path(__file__).parent / "data" / "newdiag" / "mlengineering_a100_xid63_nvsmi_q.txt").read_text()
T0 = 1_700_000_000.0


def _field(section: str, name: str, start: int = 0) -> str:
    """The value of ``name`` in the first ``section`` block of the -q text (after ``start``)."""
    i = TEXT.rfind("\n", 0, TEXT.index(section, start)) + 1
    m = re.compile(rf"^[ \t]*{re.escape(name)}\s+: (.+)$", re.M).search(TEXT, i)
    return m.group(1).strip()


def _ecc(scope: str, kind: str) -> int:
    i = TEXT.index("ECC Errors")
    j = TEXT.index(scope, i)
    return sum(int(_field(scope, f"{mem} {kind}", j)) for mem in ("SRAM", "DRAM"))


def _read() -> dict:
    xid = int(re.search(r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): (\d+),", TEXT).group(1))
    dev = {
        "index": 0, "uuid": "GPU-" + re.search(r"^GPU (\S+)$", TEXT, re.M).group(1),
        "name": _field("Product Name", "Product Name"),
        "ecc_errors": {"corrected_volatile": _ecc("Volatile", "Correctable"),
                       "uncorrected_volatile": _ecc("Volatile", "Uncorrectable"),
                       "corrected_aggregate": _ecc("Aggregate", "Correctable"),
                       "uncorrected_aggregate": _ecc("Aggregate", "Uncorrectable")},
        "remapped_rows": {"corrected": int(_field("Remapped Rows", "Correctable Error")),
                          "uncorrected": int(_field("Remapped Rows", "Uncorrectable Error")),
                          "pending": _field("Remapped Rows", "Pending") == "Yes",
                          "failed": _field("Remapped Rows", "Remapping Failure Occurred") == "Yes"},
    }
    pend = _field("Retired Pages", "Pending Page Blacklist")
    dev["retired_pages_pending"] = {"error": "NVML_ERROR_NOT_SUPPORTED"} if pend == "N/A" else pend == "Yes"
    return {"xid": xid, "device": dev, "driver": _field("Driver Version", "Driver Version")}


def _window(dev: dict, xids: list[int], driver: str) -> Window:
    first = dict(dev, xid_events=xids)
    later = dict(dev, xid_events=[])  # NVML delivers an Xid event once
    c = NvmlCollector(backend=RecordedBackend({"timeline": [{"driver_version": driver, "devices": [first]}]
                                               + [{"driver_version": driver, "devices": [later]}] * 3}))
    cols: dict = {}
    for k in range(4):
        for s in c.collect(T0 + 5.0 * k).samples:
            ts, vs = cols.setdefault(SeriesKey(s.name, s.labels), ([], []))
            ts.append(s.ts)
            vs.append(s.value)
    return Window.from_columns(cols, source="nvml", types={})


def test_values_read_from_the_published_text():
    r = _read()
    assert r["xid"] == 63 and r["driver"] == "510.73.08"
    d = r["device"]
    assert d["name"] == "NVIDIA A100-SXM4-80GB"
    assert d["ecc_errors"] == {"corrected_volatile": 177, "uncorrected_volatile": 0, "corrected_aggregate": 177,
                               "uncorrected_aggregate": 0}
    assert d["remapped_rows"] == {"corrected": 1, "uncorrected": 0, "pending": True, "failed": False}


def test_pending_row_remap_with_xid_63_is_a_hardware_fault_with_a_reset():
    r = _read()
    f = build_frame(_window(r["device"], [r["xid"]], r["driver"]))
    assert f.gpu["0"]["gpu_row_remap_pending"][-1] == 1
    (fnd,) = gpu_fault.detect(f)
    assert fnd.subject.get("gpu") == "0"
    assert "row remap is pending" in fnd.summary and "Xid 63" in fnd.summary, fnd.summary
    assert fnd.severity is Severity.WARNING  # a pending remap (the catalogue: reset when drained), not a failed one
    assert "reset" in " ".join(fnd.context.get("actions") or []).lower()


def test_the_same_gpu_after_its_reset_keeps_only_history_and_stays_quiet():
    """The confounder in the same text: 177 corrected DRAM ECC errors (volatile and lifetime) and one
    remapped row, once the remap is applied (pending No) and no new Xid: history, no finding."""
    r = _read()
    dev = dict(r["device"], remapped_rows=dict(r["device"]["remapped_rows"], pending=False))
    f = build_frame(_window(dev, [], r["driver"]))
    assert f.gpu_total["0"]["gpu_ecc_sbe_volatile_total"] == 177  # the count is read, and judged as history
    assert f.gpu["0"]["gpu_row_remap_pending"][-1] == 0
    assert gpu_fault.detect(f) == []
