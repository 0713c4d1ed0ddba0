"""Per-rank kernel data for aligning the traces of several ranks of one job: filled by
:mod:`fragscope.collectors.kineto_ranks`, judged by :mod:`fragscope.detectors.rank_trace`. Pure data."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class CommKernel:
    start_ns: int
    end_ns: int
    stream: int
    kernel_op: str  # from the name: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, SendRecv, ...
    collective: str | None  # args "Collective name" (allreduce, _allgather_base, send, recv, all_to_all, ...)
    nelems: int | None  # args "In msg nelems"
    group: str | None  # args "Process Group Name"
    group_size: int | None  # args "Group size"


@dataclass(slots=True)
class RankTrace:
    """One rank's kernels. Times: integer ns on the trace's clock (``wall_clock``: unix epoch ns)."""

    source: str
    rank: int | None  # distributedInfo.rank (None when the trace does not say)
    world_size: int | None
    device: int | None  # the device most kernels ran on
    kernel_start: np.ndarray  # int64 ns, all kernels (communication ones included), sorted by start
    kernel_end: np.ndarray
    kernel_comm: np.ndarray  # bool
    comm: list[CommKernel] = field(default_factory=list)  # sorted by start
    wall_clock: bool = False
