"""LogState: events folded into counters and last values (the agent collector and ``diagnose logs``)."""
from __future__ import annotations

from .events import LogEvent


class LogState:
    """Preemption count (V0 cumulative warnings with restarts folded in, V1 per-interval counts,
    SGLang retractions), OOM count, KV capacity, and the last stats fields per engine."""

    def __init__(self) -> None:
        self.preemptions_total: float | None = None  # None: this log format has not shown it reports them
        self._v0_offset = 0.0
        self._v0_last: float | None = None
        self.preemption_source = ""
        self.ooms_total = 0
        self.oom_unalloc: dict[str, float] = {}  # gpu -> bytes, at the last OOM read
        self.capacity_tokens: float | None = None
        self.capacity_blocks: float | None = None
        self.block_size: int | None = None
        self.stats: dict[str, dict] = {}  # engine label -> last stats fields
        self.saw_v1_stats = False
        self._sum = 0.0  # interval counts (V1 "Preemptions: N") and SGLang retractions

    def apply(self, ev: LogEvent) -> None:
        f = ev.fields
        if ev.kind == "preemption":
            n = float(f["cumulative"])
            if self._v0_last is not None and n < self._v0_last:  # engine restarted: its counter reset
                self._v0_offset += self._v0_last
            self._v0_last = n
            self.preemptions_total = self._v0_offset + n + self._sum
            self.preemption_source = "vllm-v0 warnings"
        elif ev.kind == "retraction":
            self._add_preemptions(f["retracted"], "sglang retractions")
        elif ev.kind == "stats":
            self.stats[ev.engine] = f
            if ev.source == "sglang":
                self._add_preemptions(0, "sglang retractions")
            elif "preemptions" in f:
                self._add_preemptions(f["preemptions"] if ev.engine != "all" or not self._per_engine() else 0,
                                      "vllm-v1 stats lines")
            elif ev.source == "vllm-v0":  # V0 warns on the 1st preemption: no warning yet means none
                self._add_preemptions(0, self.preemption_source or "vllm-v0 warnings")
            else:
                self.saw_v1_stats = True
        elif ev.kind == "oom":
            self.ooms_total += 1
            if "reserved_unallocated_bytes" in f:
                self.oom_unalloc[str(f.get("gpu", ""))] = f["reserved_unallocated_bytes"]
        elif ev.kind == "kv_cache_tokens":
            self.capacity_tokens = float(f["tokens"])
        elif ev.kind == "kv_blocks":
            self.capacity_blocks = float(f["gpu_blocks"])
            if self.block_size:
                self.capacity_tokens = self.capacity_blocks * self.block_size
        elif ev.kind == "config" and f.get("block_size"):
            self.block_size = int(f["block_size"])
            if self.capacity_blocks is not None:
                self.capacity_tokens = self.capacity_blocks * self.block_size

    def _per_engine(self) -> bool:
        return any(k not in ("all", "") for k in self.stats)

    def _add_preemptions(self, n: float, source: str) -> None:
        self._sum += float(n)
        v0 = (self._v0_offset + self._v0_last) if self._v0_last is not None else 0.0
        self.preemptions_total = v0 + self._sum
        self.preemption_source = self.preemption_source or source
