"""Kernel-timeline figures -> samples the agent records (conversion only). Pure."""
from __future__ import annotations

from ..model import Sample, make_labels


def trace_samples(a: dict, ts: float) -> list[Sample]:
    """Samples the agent records from a capture: ``fragscope_kernel_gap_seconds{gpu,quantile}`` and
    ``fragscope_gpu_idle_ratio{gpu}`` (absent values are left out, never written as 0)."""
    out: list[Sample] = []
    for d in a["devices"]:
        gpu = str(d["device"])
        g = d.get("gap_seconds")
        if g:
            for q, k in (("0.5", "p50"), ("0.99", "p99")):
                out.append(Sample("fragscope_kernel_gap_seconds", make_labels({"gpu": gpu, "quantile": q}), ts,
                                  float(g[k])))
        if d.get("idle_ratio") is not None:
            out.append(Sample("fragscope_gpu_idle_ratio", make_labels({"gpu": gpu}), ts, float(d["idle_ratio"])))
    return out

