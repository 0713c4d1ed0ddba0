"""Synthetic sizing scenarios: a start-up log (real vLLM V1 wordings) and a run-time summary per failure mode.

For the scenario generator and the evaluation (one family per failure mode, with confounders that
must stay quiet). Pure: returns lines and a dict. Every figure follows vLLM's own arithmetic
(docs/sizing.md), so the expected recommendation can be computed independently.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..units import GiB as GIB

FAMILIES = ("startup-oom-graphs", "startup-oom-no-kv", "runtime-oom-activations", "pool-too-small",
            "memory-held-elsewhere")
CONFOUNDERS = ("healthy", "priority-preemptions-only", "full-pool-no-headroom", "small-monitoring-process",
               "runtime-oom-not-startup")


@dataclass(frozen=True)
class Shape:
    total_gib: float = 79.19  # H100 80 GB as vLLM reports it
    util: float = 0.90
    weights_gib: float = 14.99
    activation_gib: float = 1.20
    non_torch_gib: float = 0.12
    kv_bytes_per_token: int = 131072  # Llama-3-8B, bf16
    block_size: int = 16
    max_model_len: int = 8192

    @property
    def budget_gib(self) -> float:
        return round(self.total_gib * self.util, 2)

    @property
    def kv_gib(self) -> float:
        return round(self.budget_gib - self.weights_gib - self.activation_gib - self.non_torch_gib, 2)

    @property
    def kv_tokens(self) -> int:
        blocks = int(self.kv_gib * GIB // (self.kv_bytes_per_token * self.block_size))
        return blocks * self.block_size


def startup_lines(s: Shape = Shape(), *, fail: str | None = None, ready: bool = True) -> list[str]:
    """A V1 start-up in the 0.8-0.10 wordings; ``fail``: "graph-oom" | "no-kv" | None."""
    h = "(EngineCore_DP0 pid=42) INFO 05-01 10:00:{:02d} [{}] {}"
    lines = [h.format(0, "core.py:69", f"Initializing a V1 LLM engine (v0.9.2) with config: model='m', "
                                      f"max_seq_len={s.max_model_len}, tensor_parallel_size=1, "
                                      f"gpu_memory_utilization={s.util}"),
             h.format(5, "gpu_model_runner.py:1595", f"Model loading took {s.weights_gib:.4f} GiB and 9.1 seconds")]
    if fail == "no-kv":
        lines.append("(EngineCore_DP0 pid=42) ERROR 05-01 10:00:09 [core.py:515] ValueError: No available memory for "
                     "the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
        return lines
    lines += [h.format(8, "gpu_worker.py:241", f"the current vLLM instance can use total_gpu_memory "
                                               f"({s.total_gib:.2f}GiB) x gpu_memory_utilization ({s.util:.2f}) = "
                                               f"{s.budget_gib:.2f}GiB"),
              h.format(8, "gpu_worker.py:241", f"model weights take {s.weights_gib:.2f}GiB; non_torch_memory takes "
                                               f"{s.non_torch_gib:.2f}GiB; PyTorch activation peak memory takes "
                                               f"{s.activation_gib:.2f}GiB; the rest of the memory reserved for KV "
                                               f"Cache is {s.kv_gib:.2f}GiB."),
              h.format(9, "kv_cache_utils.py:716", f"GPU KV cache size: {s.kv_tokens:,} tokens"),
              h.format(9, "kv_cache_utils.py:720", f"Maximum concurrency for {s.max_model_len:,} tokens per request: "
                                                   f"{s.kv_tokens / s.max_model_len:.2f}x")]
    if fail == "graph-oom":
        free_mib = 20.0
        lines += [h.format(10, "gpu_model_runner.py:2000", "Capturing CUDA graph shapes"),
                  "(EngineCore_DP0 pid=42) ERROR 05-01 10:00:12 [core.py:515]     self.model_runner.capture_model()",
                  f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
                  f"capacity of {s.total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, "
                  f"this process has {s.total_gib - 0.02:.2f} GiB memory in use."]
        return lines
    lines.append(h.format(14, "gpu_model_runner.py:2050", "Graph capturing finished in 5 secs, took 0.52 GiB"))
    if ready:
        lines.append("(APIServer pid=1) INFO:     Application startup complete.")
    return lines


def runtime_oom_line(s: Shape = Shape(), requested_gib: float = 2.0, free_gib: float = 0.6) -> str:
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested_gib:.2f} GiB. GPU 0 has a total "
            f"capacity of {s.total_gib:.2f} GiB of which {free_gib:.2f} GiB is free. Including non-PyTorch memory, "
            f"this process has {s.total_gib - free_gib:.2f} GiB memory in use.")


def runtime(s: Shape = Shape(), *, used_gib: float, kv_peak: float, kv_full_preemptions: float = 0.0,
            priority_preemptions: float = 0.0, waiting: float = 0.0, running: float = 32.0,
            seq_len: float = 2000.0, others_gib: float | None = None) -> dict:
    """A run-time summary (the dict fragscope.sizing.runtime produces)."""
    d = {"device_total_bytes": s.total_gib * GIB, "device_used_peak_bytes": used_gib * GIB,
         "kv_usage_peak_ratio": kv_peak, "preemptions_total": kv_full_preemptions + priority_preemptions,
         "preemptions_by_reason": {"kv_full": kv_full_preemptions, "priority": priority_preemptions},
         "waiting_peak": waiting, "running_peak": running, "concurrent_demand_peak": running + waiting,
         "seq_len_p95_tokens": seq_len}
    if others_gib is not None:
        d["other_processes_peak_bytes"] = others_gib * GIB
    d["device_free_at_peak_bytes"] = d["device_total_bytes"] - d["device_used_peak_bytes"]
    return d


def family(name: str, s: Shape = Shape()) -> tuple[list[str], dict]:
    """(log lines, run-time dict) for a failure family or a confounder."""
    # busy: 72 sequences of 8,000 tokens want 576,000 KV tokens; the default pool holds ~450,000
    busy = dict(kv_peak=1.0, kv_full_preemptions=120.0, waiting=40.0, running=32.0, seq_len=8000.0)
    if name == "startup-oom-graphs":
        return startup_lines(s, fail="graph-oom"), {}
    if name == "startup-oom-no-kv":
        return startup_lines(s, fail="no-kv"), {}
    if name == "runtime-oom-activations":
        return startup_lines(s) + [runtime_oom_line(s)], runtime(s, used_gib=s.total_gib - 0.6, kv_peak=0.8)
    if name == "pool-too-small":
        return startup_lines(s), runtime(s, used_gib=s.budget_gib + 0.6, **busy)
    if name == "memory-held-elsewhere":
        return startup_lines(s), runtime(s, used_gib=s.budget_gib + 6.0, kv_peak=0.7, others_gib=5.5)
    if name == "healthy":
        return startup_lines(s), runtime(s, used_gib=s.budget_gib + 0.6, kv_peak=0.55)
    if name == "priority-preemptions-only":
        return startup_lines(s), runtime(s, used_gib=s.budget_gib + 0.6, kv_peak=0.7, priority_preemptions=80.0)
    if name == "full-pool-no-headroom":
        return startup_lines(s), runtime(s, used_gib=s.total_gib - 0.3, **busy)
    if name == "small-monitoring-process":
        return startup_lines(s), runtime(s, used_gib=s.budget_gib + 0.9, kv_peak=0.6, others_gib=0.3)
    if name == "runtime-oom-not-startup":
        return startup_lines(s) + [runtime_oom_line(s)], {}
    raise ValueError(f"unknown sizing scenario {name!r}; one of {FAMILIES + CONFOUNDERS}")


def metrics_window(name: str, s: Shape = Shape(), points: int = 8, step_s: float = 15.0, labelled: bool = True,
                   start_ts: float = 1_777_629_600.0):
    """The same family as a short metrics recording (what ``diagnose FILE`` / the agent see, no log).

    ``vllm:cache_config_info`` carries the utilization, blocks and block size of :class:`Shape`; KV usage
    ramps to the family's peak, preemption counters reach their totals (labelled by reason when
    ``labelled``, else one unlabelled counter), running/waiting sit at their peaks, NVML used/total as the
    run-time dict says. A start-up failure has no metrics (the engine never served): an empty window.
    """
    import numpy as np

    from ..model import Sample, Window, make_labels
    from ..signals import VLLM_PREEMPTIONS_BY_REASON, primary

    _, rt = family(name, s)
    if not rt:
        return Window.from_samples([], source=f"sizing-scenario:{name}")
    eng = make_labels({"engine": "0", "model_name": "m"})
    gpu = make_labels({"gpu": "0"})
    cc = make_labels({"engine": "0", "block_size": str(s.block_size), "gpu_memory_utilization": str(s.util),
                      "num_gpu_blocks": str(s.kv_tokens // s.block_size)})
    ramp = np.linspace(0.0, 1.0, points)
    out = []
    for i in range(points):
        t = start_ts + i * step_s
        out += [Sample(primary("cache_config_info"), cc, t, 1.0),
                Sample(primary("kv_cache_usage_ratio"), eng, t, 0.3 + (rt["kv_usage_peak_ratio"] - 0.3) * ramp[i]),
                Sample(primary("requests_running"), eng, t, rt["running_peak"]),
                Sample(primary("requests_waiting"), eng, t, rt["waiting_peak"]),
                Sample(primary("gpu_memory_used_bytes"), gpu, t, rt["device_used_peak_bytes"]),
                Sample(primary("gpu_memory_total_bytes"), gpu, t, rt["device_total_bytes"])]
        if labelled:
            for reason, total in sorted(rt["preemptions_by_reason"].items()):
                out.append(Sample(VLLM_PREEMPTIONS_BY_REASON[0], make_labels(dict(eng) | {"reason": reason}), t,
                                  total * ramp[i]))
        else:
            out.append(Sample(primary("preemptions_total"), eng, t, rt["preemptions_total"] * ramp[i]))
    return Window.from_samples(out, source=f"sizing-scenario:{name}")
