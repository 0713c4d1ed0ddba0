"""nvidia-smi's default table (what ``nvidia-smi`` prints with no option), read: memory used / total and utilization
per GPU, and the processes it lists with their memory. Pure (text in). docs/collectors.md#nvidia-smi-table.

Both layouts are read: the 79-column one (drivers before ~535: ``|  12799MiB / 16280MiB |``, processes as
``GPU PID Type Process name Usage``) and the 89-column one with ``GI``/``CI`` columns. A process whose memory shows
``N/A`` (Windows WDDM) is listed with ``used_bytes`` null, not 0.
"""
from __future__ import annotations

import re

MIB = 1024.0 ** 2

_HEAD = re.compile(r"NVIDIA-SMI (\S{1,40})\s+Driver Version: (\S{1,40})(?:\s+CUDA Version: (\S{1,20}))?")
_GPU = re.compile(r"^\|\s{0,8}(\d{1,3})\s{1,8}(\S.{0,60}?)\s{1,40}(?:On|Off)\s{0,8}\|")
_MEM = re.compile(r"\|\s{0,20}(\d{1,9})MiB\s{0,8}/\s{0,8}(\d{1,9})MiB\s{0,20}\|(?:\s{0,20}(\d{1,3}|N/A)%?\s)?")
_PROC = re.compile(r"^\|\s{0,8}(\d{1,3})\s{1,12}(?:(?:N/A|\d{1,4})\s{1,8}(?:N/A|\d{1,4})\s{1,12})?(\d{1,10})\s{1,12}"
                   r"(C\+G|M\+C|C|G|M)\s{1,12}(.{0,200}?)\s{1,200}(?:(\d{1,9})MiB|N/A)\s{0,8}\|")


def looks_like_table(text: str) -> bool:
    """The sniff: nvidia-smi's banner, or its box-drawn "Processes:" section."""
    head = text[:8192]
    return bool(_HEAD.search(head)) or ("| Processes:" in head and "+-----" in head)


def parse_nvsmi_table(text: str) -> dict:
    """{"driver_version", "cuda_version", "smi_version", "gpus": [{"index", "name", "used_bytes", "total_bytes",
    "used_ratio", "utilization_ratio"}], "processes": [{"gpu", "pid", "type", "name", "used_bytes"}],
    "processes_section": bool}. Raises ValueError when neither a GPU row nor a process row is found."""
    out: dict = {"driver_version": None, "cuda_version": None, "smi_version": None, "gpus": [], "processes": [],
                 "processes_section": False}
    m = _HEAD.search(text[:8192])
    if m:
        out["smi_version"], out["driver_version"], out["cuda_version"] = m.group(1), m.group(2), m.group(3)
    pending: dict | None = None
    in_procs = False
    for raw in text.splitlines()[:20000]:
        line = raw.strip()
        if "Processes:" in line:
            in_procs, out["processes_section"] = True, True
            continue
        if in_procs:
            p = _PROC.match(line)
            if p:
                out["processes"].append({"gpu": int(p.group(1)), "pid": int(p.group(2)), "type": p.group(3),
                                         "name": p.group(4).strip(),
                                         "used_bytes": int(p.group(5)) * MIB if p.group(5) else None})
            continue
        g = _GPU.match(line)
        if g and "MiB" not in line:
            pending = {"index": int(g.group(1)), "name": g.group(2).strip(), "used_bytes": None, "total_bytes": None,
                       "used_ratio": None, "utilization_ratio": None}
            out["gpus"].append(pending)
            continue
        mm = _MEM.search(line)
        if mm and pending is not None and pending["total_bytes"] is None:
            used, total = int(mm.group(1)) * MIB, int(mm.group(2)) * MIB
            pending.update(used_bytes=used, total_bytes=total, used_ratio=(used / total) if total else None)
            if mm.group(3) and mm.group(3) != "N/A":
                pending["utilization_ratio"] = int(mm.group(3)) / 100.0
    if not out["gpus"] and not out["processes"]:
        raise ValueError("an nvidia-smi table without any GPU or process row")
    return out


def judge_table(t: dict, min_unlisted_bytes: float = 1024 * MIB) -> list[str]:
    """Sentences on what one table shows. Memory in use on a GPU that no listed process accounts for (more than 1 GiB,
    beyond a CUDA context's 300-600 MiB) is held by processes nvidia-smi cannot see from where it ran (another
    container's PID namespace) or by a context that outlived its process."""
    out = []
    by_gpu: dict[int, float] = {}
    unknown = {p["gpu"] for p in t["processes"] if p["used_bytes"] is None}
    for p in t["processes"]:
        if p["used_bytes"] is not None:
            by_gpu[p["gpu"]] = by_gpu.get(p["gpu"], 0.0) + p["used_bytes"]
    for g in t["gpus"]:
        if g["used_bytes"] is None:
            continue
        line = (f"GPU {g['index']} {g['name']}: {g['used_bytes'] / MIB:.0f} MiB of {g['total_bytes'] / MIB:.0f} MiB used "
                f"({g['used_ratio'] * 100:.1f} %)" + (f", utilization {g['utilization_ratio'] * 100:.0f} %"
                                                      if g["utilization_ratio"] is not None else ""))
        listed = by_gpu.get(g["index"], 0.0)
        if t["processes_section"] and g["index"] not in unknown:
            line += f"; processes listed hold {listed / MIB:.0f} MiB"
            gap = g["used_bytes"] - listed
            if gap >= min_unlisted_bytes:
                line += (f"; {gap / MIB:.0f} MiB in use by no listed process: a process in another container (PID "
                         "namespace) or a context that outlived its process holds it")
        out.append(line)
    if not t["gpus"]:  # the "Processes:" section alone (a paste of its lower half)
        for gpu in sorted({p["gpu"] for p in t["processes"]}):
            procs = [p for p in t["processes"] if p["gpu"] == gpu]
            held = sum(p["used_bytes"] or 0.0 for p in procs)
            out.append(f"GPU {gpu}: processes listed hold {held / MIB:.0f} MiB ("
                       + ", ".join(f"pid {p['pid']} {p['name']} "
                                   + (f"{p['used_bytes'] / MIB:.0f} MiB" if p["used_bytes"] is not None else "N/A")
                                   for p in procs) + "); the GPU rows (used / total) are not in this text")
    lost = [p for p in t["processes"] if p["name"] == "Unknown Error"]
    if lost:
        out.append(f"{len(lost)} process(es) nvidia-smi could not name ('Unknown Error': "
                   + ", ".join(f"pid {p['pid']} on GPU {p['gpu']}" for p in lost)
                   + "): a process that has exited while its context still holds memory, or one in another PID "
                   "namespace; if it is gone (ps), the memory comes back only when its context is torn down")
    return out
