"""GPU facts the detectors need when the exporter does not say them: the maximum SM clock by product.

NVML reports the maximum SM clock itself (fragscope exports ``fragscope_gpu_sm_clock_max_hertz``);
dcgm-exporter does not by default, but labels every series with ``modelName``. These are the boost
("Max Clocks: SM") values of NVIDIA's product specifications as ``nvidia-smi -q`` prints them.
Matching is by the longest name fragment contained in the model name, case-insensitive.
"""
from __future__ import annotations

# name fragment -> max SM clock (MHz)
MAX_SM_CLOCK_MHZ: dict[str, float] = {
    "H100 80GB HBM3": 1980,  # H100 SXM5
    "H100 PCIe": 1755,
    "H100 NVL": 1785,
    "H100": 1980,
    "H200": 1980,
    "GH200": 1980,
    "H20": 1980,
    "A100": 1410,  # SXM4 and PCIe, 40 and 80 GB
    "A800": 1410,
    "A30": 1440,
    "A40": 1740,
    "A10G": 1710,
    "A10": 1695,
    "L40S": 2520,
    "L40": 2490,
    "L4": 2040,
    "T4": 1590,
    "V100": 1530,
}


def max_sm_clock_hertz(model_name: str | None) -> float | None:
    """The product's maximum SM clock in Hz, or None when the model is unknown."""
    if not model_name:
        return None
    name = model_name.upper()
    best = None
    for frag, mhz in MAX_SM_CLOCK_MHZ.items():
        f = frag.upper()
        # a fragment matches as a word: "L4" must not match "L40S", "A10" not "A100"
        i = name.find(f)
        while i >= 0:
            end = i + len(f)
            if (i == 0 or not name[i - 1].isalnum()) and (end == len(name) or not name[end].isalnum()):
                if best is None or len(f) > len(best[0]):
                    best = (f, mhz)
                break
            i = name.find(f, i + 1)
    return best[1] * 1e6 if best else None
