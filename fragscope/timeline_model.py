"""The columnar kernel-timeline model both trace readers fill (Kineto JSON: :mod:`fragscope.collectors.kineto`,
Nsight Systems SQLite: :mod:`fragscope.collectors.nsys`), and the facts about GPU API names they share.

Pure data and name rules: no I/O. Contract of the analysis built on it: docs/trace.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# GPU op kinds (Timeline.op_kind)
KERNEL, MEMCPY, MEMSET = 0, 1, 2
OP_KINDS = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset"}

# Host API call kinds (Timeline.call_kind)
OTHER, LAUNCH, GRAPH_LAUNCH, SYNC, MEMCPY_SYNC, MEMCPY_ASYNC, MALLOC, FREE = range(8)
CALL_KINDS = {OTHER: "other", LAUNCH: "launch", GRAPH_LAUNCH: "graph_launch", SYNC: "sync",
              MEMCPY_SYNC: "memcpy_sync", MEMCPY_ASYNC: "memcpy_async", MALLOC: "malloc", FREE: "free"}

# Copy directions (Timeline.op_copy_kind): the values of nsys ENUM_CUDA_MEMCPY_OPER.
COPY_UNKNOWN, COPY_HTOD, COPY_DTOH, COPY_DTOD, COPY_PTOP = 0, 1, 2, 8, 10
# Unified-memory page migrations (ENUM_CUDA_MEMCPY_OPER 11-13, correlationId 0: no API call launched them):
# the driver moving managed pages, not the program's GPU work (Timeline.um_*).
COPY_UVM_HTOD, COPY_UVM_DTOH, COPY_UVM_DTOD = 11, 12, 13
# Migration causes (nsys ENUM_CUDA_UNIF_MEM_MIGRATION; -1 when the export has no migrationCause column).
UM_CAUSES = {0: "unknown", 1: "user_prefetch", 2: "page_fault", 3: "speculative_prefetch", 4: "eviction",
             5: "access_counters"}

# Workload markers (Timeline.markers): names that only a training step runs, or only a serving engine.
MARK_BACKWARD, MARK_OPTIMIZER, MARK_SERVING = "backward_ops", "optimizer_steps", "serving_engine_ops"


def _empty() -> list:
    return []  # (no unified-memory rows: read only where um_start is not None, which a reader sets with them)


class TraceError(ValueError):
    """Unreadable or unsuitable trace: the message is one line naming the file and the problem."""


@dataclass(slots=True)
class Timeline:
    """Columnar kernel timeline. Times are integer nanoseconds on the trace's own clock.

    Columns are numpy arrays, or :class:`fragscope.vec.Vec` for a small Kineto trace (all of one kind:
    ``fragscope.vec.xp_of`` gives the operations for them).

    ``op_*`` arrays describe GPU operations (kernels, copies, sets), ``call_*`` arrays host API calls;
    ``op_launch[i]`` is the index of the call that launched op ``i`` (-1: unknown).
    ``epoch_offset_ns`` + a trace time = unix time in ns (None when the clock is not wall time).
    """

    source: str
    format: str  # "kineto-json" | "nsys-sqlite"
    op_device: np.ndarray  # int64
    op_stream: np.ndarray  # int64
    op_pid: np.ndarray  # int64, -1 unknown (Kineto GPU rows carry the device, not the process)
    op_kind: np.ndarray  # int8, KERNEL | MEMCPY | MEMSET
    op_start: np.ndarray  # int64 ns
    op_end: np.ndarray  # int64 ns
    op_bytes: np.ndarray  # int64, -1 for kernels / unknown
    op_copy_kind: np.ndarray  # int8, COPY_*
    op_pageable: np.ndarray  # bool: a copy from or to pageable host memory
    op_launch: np.ndarray  # int64 index into call_*, -1 when not linked
    op_comm: np.ndarray  # bool: a communication kernel (HTA's COMM type: names ^nccl, ncclKernel, ^hccl)
    call_start: np.ndarray  # int64 ns
    call_end: np.ndarray  # int64 ns
    call_kind: np.ndarray  # int8, see CALL_KINDS
    call_name: np.ndarray  # int32 index into call_names
    call_names: list[str] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)  # ProfilerStep#N ranges (ns)
    epoch_offset_ns: int | None = None
    meta: dict = field(default_factory=dict)
    # Unified-memory page migrations (not GPU ops): None when the format cannot record them (Kineto),
    # else one row per migration (possibly none).
    um_start: np.ndarray | None = None  # int64 ns
    um_end: np.ndarray | None = None  # int64 ns
    um_device: np.ndarray = field(default_factory=_empty)  # int64
    um_bytes: np.ndarray = field(default_factory=_empty)  # int64, -1 unknown
    um_copy_kind: np.ndarray = field(default_factory=_empty)  # int8, COPY_UVM_*
    um_cause: np.ndarray = field(default_factory=_empty)  # int8, UM_CAUSES key, -1 unknown
    # Workload markers: {MARK_*: count} and up to three example names per marker (what was seen).
    markers: dict = field(default_factory=dict)
    marker_examples: dict = field(default_factory=dict)

    @property
    def n_ops(self) -> int:
        return int(self.op_start.size)


_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?(_v\d+)?$")
# CUDA runtime (cuda*), driver (cu*) and ROCm HIP (hip*: PyTorch on AMD GPUs; Kineto's roctracer rows
# use the same cuda_runtime category). HIP names: ROCm's hip_runtime_api.h / hip_ext.h, and the launch ids
# roctracer and rocprofiler-sdk group as kernel launches.
_LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
           "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx",
           "cuLaunchCooperativeKernel", "cuLaunchGrid", "cuLaunchGridAsync",
           "hipLaunchKernel", "hipLaunchKernelExC", "hipExtLaunchKernel", "hipModuleLaunchKernel",
           "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipModuleLaunchCooperativeKernel",
           "hipLaunchCooperativeKernel", "hipLaunchCooperativeKernelMultiDevice",
           "hipExtLaunchMultiKernelMultiDevice", "hipLaunchByPtr", "hipDrvLaunchKernelEx"}
_GRAPH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
_SYNC = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
         "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
         "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipCtxSynchronize"}
_MALLOC = {"cudaMalloc", "cudaMallocPitch", "cudaMalloc3D", "cuMemAlloc", "cuMemAllocPitch", "cuMemCreate",
           "hipMalloc", "hipMallocPitch", "hipMalloc3D", "hipExtMallocWithFlags", "hipMemCreate"}
_FREE = {"cudaFree", "cuMemFree", "cuMemRelease", "hipFree", "hipMemRelease"}
# Launches below the runtime API (driver / module level: Triton, torch.compile, hand-loaded code objects)
_DRIVER_PREFIXES = ("hipModule", "hipExtModule", "hipHccModule", "hipDrv")


def base_api_name(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``; ``cuMemcpyHtoD_v2`` -> ``cuMemcpyHtoD``."""
    return _SUFFIX.sub("", name) or name


def classify_api(name: str) -> int:
    """Kind of a CUDA runtime / driver API call, from its (possibly version-suffixed) name."""
    b = base_api_name(name)
    if b in _LAUNCH:
        return LAUNCH
    if b in _GRAPH:
        return GRAPH_LAUNCH
    if b in _SYNC:
        return SYNC
    if b in _MALLOC:
        return MALLOC
    if b in _FREE:
        return FREE
    if b.startswith(("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset", "hipMemcpy", "hipMemset")):
        return MEMCPY_ASYNC if "Async" in b else MEMCPY_SYNC
    return OTHER


def is_driver_launch_name(name: str) -> bool:
    """A launch API below the runtime: CUDA driver ``cu*`` (not ``cuda*``), HIP module launches."""
    return (name.startswith("cu") and not name.startswith("cuda")) or name.startswith(_DRIVER_PREFIXES)


def workload_marker(name: str) -> str | None:
    """Which workload a host-side op / annotation / kernel name marks, if any: a backward op (autograd
    nodes ``*Backward0``, ``autograd::engine::evaluate_function``, ``aten::*_backward``), an optimizer step
    (PyTorch's ``Optimizer.step#SGD.step`` annotations), or a serving engine's own ops (vLLM / SGLang
    custom ops and annotations)."""
    if "ackward" in name:  # Backward / backward
        return MARK_BACKWARD
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return MARK_OPTIMIZER
    low = name.lower()
    if "vllm" in low or "sglang" in low:
        return MARK_SERVING
    return None


def copy_kind_from_name(name: str) -> int:
    """Kineto copy rows are named like ``Memcpy HtoD (Pageable -> Device)``."""
    if "HtoD" in name:
        return COPY_HTOD
    if "DtoH" in name:
        return COPY_DTOH
    if "DtoD" in name:
        return COPY_DTOD
    if "PtoP" in name:
        return COPY_PTOP
    return COPY_UNKNOWN


