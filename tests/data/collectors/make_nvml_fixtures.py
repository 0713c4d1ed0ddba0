"""Build the recorded-NVML fixtures (nvml_*.json) from real nvidia-smi captures.

Source: utkuozdemir/nvidia_gpu_exporter internal/captures/*.txt (MIT), copied verbatim in
nvidia-smi-captures/ beside this file (SOURCES.md there). Each capture has an "idle" and a "load" section; each becomes one
snapshot of a RecordedBackend timeline. Mapping (nvidia-smi field -> NVML call it reports):
  memory.total/reserved/used/free [MiB]       -> nvmlDeviceGetMemoryInfo_v2 (bytes)
  v1 view: used + reserved, free, total       -> nvmlDeviceGetMemoryInfo (v1 folds the reservation into used)
  utilization.gpu / utilization.memory [%]    -> nvmlDeviceGetUtilizationRates ("[N/A]" -> NOT_SUPPORTED)
  clocks.current.sm / .memory [MHz]           -> nvmlDeviceGetClockInfo
  clocks.max.sm / .memory [MHz]               -> nvmlDeviceGetMaxClockInfo
  clocks_event_reasons.active / .supported    -> nvmlDeviceGetCurrentClocksEventReasons / Supported...
  temperature.gpu [C]                          -> nvmlDeviceGetTemperature
  power.draw [W]                               -> nvmlDeviceGetPowerUsage (mW)
  --query-compute-apps used_gpu_memory [MiB]  -> nvmlDeviceGetComputeRunningProcesses
  ecc.errors.{un,}corrected.{volatile,aggregate}.total -> nvmlDeviceGetTotalEccErrors
  remapped_rows.correctable/uncorrectable/pending/failure -> nvmlDeviceGetRemappedRows ("[N/A]" -> NOT_SUPPORTED)
  retired_pages.pending                        -> nvmlDeviceGetRetiredPagesPendingStatus ("[N/A]" -> NOT_SUPPORTED)
  pcie.link.gen.gpucurrent (or .current), pcie.link.gen.max, pcie.link.width.current/.max
                                               -> nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}
  (no PCIe replay counter in the captures: nvmlDeviceGetPcieReplayCounter stays "not in the recording")
Run: python tests/data/collectors/make_nvml_fixtures.py [SHARED_NVIDIA_SMI_DIR]
"""
import json
import os
import sys

MIB = 1024 * 1024
CAPTURES = {
    "nvml_h100_idle_load.json": "nvidia_gpu_exporter__captures__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
    "nvml_h200_mig_idle_load.json": "nvidia_gpu_exporter__captures__linux-x86_64__nvidia-h200-mig__590.48.01.txt",
    "nvml_l40s_idle_load.json": "nvidia_gpu_exporter__captures__linux-x86_64__nvidia-l40s__595.80.txt",
}
NA = {"error": "NVML_ERROR_NOT_SUPPORTED"}


def num(v, unit=""):
    v = v.strip()
    if v.startswith("[") or v in ("N/A", ""):
        return None
    if unit and v.endswith(unit):
        v = v[: -len(unit)].strip()
    return float(v)


def section(lines, title):
    for i, line in enumerate(lines):
        if line.startswith("# ") and title in line:
            j = i + 1
            while lines[j].startswith("#"):
                j += 1
            out = []
            while j < len(lines) and lines[j].strip():
                out.append(lines[j])
                j += 1
            return out
    raise KeyError(title)


def snapshot(lines, phase, driver):
    rows = section(lines, f"{phase} :: query-gpu (csv")
    hdr = [h.strip() for h in rows[0].split(",")]
    vals = [v.strip() for v in rows[1].split(", ")]
    d = dict(zip(hdr, vals))
    apps = section(lines, f"{phase} :: query-compute-apps")
    procs = []
    for row in apps[1:]:
        f = [v.strip() for v in row.split(", ")]
        procs.append({"pid": int(f[5]), "process_name": f[6], "used_bytes": int(num(f[7], "MiB") * MIB)})
    total, reserved = num(d["memory.total [MiB]"], "MiB"), num(d["memory.reserved [MiB]"], "MiB")
    used, free = num(d["memory.used [MiB]"], "MiB"), num(d["memory.free [MiB]"], "MiB")
    ug, um = num(d["utilization.gpu [%]"], "%"), num(d["utilization.memory [%]"], "%")
    dev = {
        "index": int(d["index"]), "uuid": d["uuid"], "name": d["name"],
        "memory_v2": {"total": int(total * MIB), "reserved": int(reserved * MIB), "used": int(used * MIB),
                      "free": int(free * MIB)},
        "memory_v1": {"total": int(total * MIB), "used": int((used + reserved) * MIB), "free": int(free * MIB)},
        "processes": procs,
        "utilization": NA if ug is None else {"gpu": int(ug), "memory": int(um or 0)},
        "clock_mhz": {"sm": int(num(d["clocks.current.sm [MHz]"], "MHz")),
                      "mem": int(num(d["clocks.current.memory [MHz]"], "MHz"))},
        "max_clock_mhz": {"sm": int(num(d["clocks.max.sm [MHz]"], "MHz")),
                          "mem": int(num(d["clocks.max.memory [MHz]"], "MHz"))},
        "clock_event_reasons": int(d["clocks_event_reasons.active"], 16),
        "supported_clock_event_reasons": int(d["clocks_event_reasons.supported"], 16),
        "temperature_c": int(num(d["temperature.gpu"])),
        "power_mw": int(round(num(d["power.draw [W]"], "W") * 1000)),
        "xid_events": [],
        "mig_mode": d.get("mig.mode.current"),
    }
    # hardware health, where the capture has it (older drivers' query lists lack some fields)
    def opt(key):
        v = d.get(key)
        return None if v is None or v.startswith("[") or v in ("N/A", "") else v
    ecc = {k: int(opt(f)) for k, f in (("uncorrected_volatile", "ecc.errors.uncorrected.volatile.total"),
                                       ("corrected_volatile", "ecc.errors.corrected.volatile.total"),
                                       ("uncorrected_aggregate", "ecc.errors.uncorrected.aggregate.total"),
                                       ("corrected_aggregate", "ecc.errors.corrected.aggregate.total")) if opt(f)}
    if ecc:
        dev["ecc_errors"] = ecc
    if opt("remapped_rows.pending") is not None:
        dev["remapped_rows"] = {"corrected": int(opt("remapped_rows.correctable")),
                                "uncorrected": int(opt("remapped_rows.uncorrectable")),
                                "pending": opt("remapped_rows.pending") == "Yes",
                                "failed": opt("remapped_rows.failure") == "Yes"}
    else:
        dev["remapped_rows"] = NA
    gen = opt("pcie.link.gen.gpucurrent") or opt("pcie.link.gen.current")
    if gen and opt("pcie.link.gen.max") and opt("pcie.link.width.current") and opt("pcie.link.width.max"):
        dev["pcie_link"] = {"gen": int(gen), "max_gen": int(opt("pcie.link.gen.max")),
                            "width": int(opt("pcie.link.width.current")), "max_width": int(opt("pcie.link.width.max"))}
    dev["retired_pages_pending"] = NA if opt("retired_pages.pending") is None else opt("retired_pages.pending") == "Yes"
    return {"driver_version": driver, "devices": [dev]}


def build(src: str) -> dict[str, dict]:
    """Fixture file name -> its content, from the captures in ``src``."""
    out_files = {}
    for out, name in CAPTURES.items():
        with open(os.path.join(src, name), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        driver = name.rsplit("__", 1)[1][: -len(".txt")]
        out_files[out] = {"source": f"utkuozdemir/nvidia_gpu_exporter internal/captures/{name.split('__captures__')[1]} (MIT)",
                          "driver_version": driver,
                          "timeline": [snapshot(lines, "idle", driver), snapshot(lines, "load", driver)]}
    return out_files


def render(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


CAPTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvidia-smi-captures")


def main(src: str = CAPTURES_DIR) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for out, data in build(src).items():
        with open(os.path.join(here, out), "w", encoding="utf-8") as fh:
            fh.write(render(data))
        print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else CAPTURES_DIR)
