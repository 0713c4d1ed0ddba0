"""The per-rank view of a PyTorch profiler (Kineto) JSON trace: its rank, and its GPU kernels with the
collective metadata NCCL kernels carry, for aligning the traces of several ranks of one job
(:mod:`fragscope.detectors.rank_trace`). Contract: docs/trace.md ("Several ranks").

What is read: ``distributedInfo`` (``rank``, ``world_size``: PyTorch writes it when torch.distributed is
initialised), and every ``X`` event of cat ``kernel`` (old traces: ``Kernel``) with its ``args.device``,
``args.stream`` and, on communication kernels, the ``record_param_comms`` metadata PyTorch copies onto
them (``Collective name``, ``In msg nelems``, ``Process Group Name``, ``Group size``; present from
PyTorch 2.1, absent in older traces). The whole-timeline reader (:mod:`.kineto`) keeps no kernel names or
arguments; this one keeps only those of communication kernels.
"""
from __future__ import annotations

import json
import re
import numpy as np

from ..ranks_model import CommKernel, RankTrace
from ..timeline_model import TraceError
from .trace_io import DEFAULT_MAX_JSON_BYTES, read_json_bytes

_KERNEL_CATS = {"kernel", "Kernel"}
# HTA's communication kernels (names ^nccl, ncclKernel, ncclDevKernel; ^hccl on Gaudi)
_COMM = re.compile(r"^(nccl|hccl)|ncclKernel|ncclDevKernel")
# The NCCL operation in a kernel name: ncclKernel_AllReduce_RING_LL_Sum_float(...),
# ncclDevKernel_AllGather_RING_LL(...), ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(...)
_OP = re.compile(r"(?:ncclKernel|ncclDevKernel)_([A-Za-z]+)")


def _int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _ns(v, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) > 2 ** 62 / 1000:
        raise TraceError(f"cannot read {path}: a kernel event with a time that is not a finite number of µs")
    return float(v)


def read_rank_trace(path: str, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> RankTrace:
    """Read one rank's Kineto JSON trace (plain or gzip). Raises TraceError (one line) on bad input."""
    raw = read_json_bytes(path, max_json_bytes)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"cannot read {path}: not JSON ({str(e).splitlines()[0][:80]})") from None
    del raw
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"cannot read {path}: not a PyTorch profiler trace (no traceEvents list)")
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    base = doc.get("baseTimeNanoseconds")
    base_ns = _int(base) or 0
    starts, ends, comm_flags, devices, comm = [], [], [], {}, []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("cat") not in _KERNEL_CATS or e.get("ph", "X") != "X":
            continue
        name = e.get("name") if isinstance(e.get("name"), str) else ""
        ts, dur = _ns(e.get("ts"), path), _ns(e.get("dur", 0), path)
        s = int(round(ts * 1000)) + base_ns
        en = s + max(0, int(round(dur * 1000)))
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        dev = _int(a.get("device"))
        if dev is None:
            dev = _int(e.get("pid"))
        if dev is not None:
            devices[dev] = devices.get(dev, 0) + 1
        is_comm = bool(_COMM.search(name))
        starts.append(s)
        ends.append(en)
        comm_flags.append(is_comm)
        if is_comm:
            m = _OP.search(name)
            coll = a.get("Collective name")
            grp = a.get("Process Group Name")
            comm.append(CommKernel(s, en, _int(a.get("stream")) if _int(a.get("stream")) is not None else -1,
                                   m.group(1) if m else name.split("(")[0][:40],
                                   coll if isinstance(coll, str) else None, _int(a.get("In msg nelems")),
                                   str(grp) if isinstance(grp, (str, int)) and not isinstance(grp, bool) else None,
                                   _int(a.get("Group size"))))
    if not starts:
        raise TraceError(f"cannot read {path}: no GPU kernels in this trace (profile with "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])")
    order = np.argsort(np.asarray(starts, dtype=np.int64), kind="stable")
    comm.sort(key=lambda c: (c.start_ns, c.stream))
    first = starts[int(order[0])]
    wall = base_ns > 0 or first > 10 ** 18  # baseTimeNanoseconds, or ts in epoch µs
    return RankTrace(
        source=path, rank=_int(dist.get("rank")), world_size=_int(dist.get("world_size")),
        device=max(devices, key=devices.get) if devices else None,
        kernel_start=np.asarray(starts, dtype=np.int64)[order], kernel_end=np.asarray(ends, dtype=np.int64)[order],
        kernel_comm=np.asarray(comm_flags, dtype=bool)[order], comm=comm, wall_clock=wall)
