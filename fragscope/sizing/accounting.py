"""What the engine said about its memory at start-up, as one record (:class:`StartupAccounting`), and the
same record from the metrics alone (``vllm:cache_config_info``). The log reader that fills it from a log is
:mod:`.startup`; this module needs no log patterns, so the window detectors that size the KV pool from
metrics do not load them. docs/sizing.md.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StartupAccounting:
    """What the engine said about its memory at (the last) start-up. Bytes throughout; None: not logged."""

    engine: str | None = None  # "vllm-v0" | "vllm-v1" | "vllm" (generation not told) | "sglang"
    version: str | None = None
    # the budget
    total_gpu_memory_bytes: float | None = None  # what the engine counts as the device's memory
    gpu_memory_utilization: float | None = None
    requested_memory_bytes: float | None = None  # total x utilization (vLLM's budget)
    kv_cache_memory_bytes_setting: float | None = None  # --kv-cache-memory-bytes when set
    mem_fraction_static: float | None = None  # SGLang
    # the split
    weights_bytes: float | None = None
    non_torch_memory_bytes: float | None = None
    activation_peak_bytes: float | None = None
    peak_torch_memory_bytes: float | None = None  # older V0 key=value wording (weights + activations)
    consumed_memory_bytes: float | None = None  # V1 >= 0.2x summary: weights + non-torch
    kv_cache_bytes: float | None = None
    kv_cache_tokens: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    block_size: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    # CUDA graphs
    cuda_graph_bytes: float | None = None  # measured at capture ("took X GiB", SGLang "mem usage")
    cuda_graph_seconds: float | None = None
    cuda_graph_estimate_bytes: float | None = None  # V1 >= 0.21 profiles it before sizing the pool
    cuda_graph_in_budget: bool | None = None  # True: the estimate was taken out of the KV budget
    # V1 >= 0.2x one-line summary
    startup_free_bytes: float | None = None
    kv_cache_memory_bytes_fit: int | None = None  # the engine's own "to fit into requested memory"
    kv_cache_memory_bytes_full: int | None = None  # "... to fully utilize gpu memory"
    # SGLang
    sglang_free_at_init_bytes: float | None = None  # "Load weight begin. avail mem" (SGLang's total)
    sglang_free_after_weights_bytes: float | None = None
    sglang_free_after_pool_bytes: float | None = None
    sglang_free_after_graphs_bytes: float | None = None
    sglang_free_at_graph_begin_bytes: float | None = None  # "Capture cuda graph begin ... avail mem=" (after workspaces)
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    page_size: int | None = None
    # outcome
    started: bool = False  # a KV pool was sized and the server went on (ready line or stats lines)
    served: bool = False  # stats lines after start-up: it served traffic
    failure: dict | None = None  # {"kind", "phase", ...figures}; None: no start-up failure in the log
    runtime_ooms: list[dict] = field(default_factory=list)  # PyTorch OOMs after start-up
    startups: int = 0  # start-ups seen (the last one's figures are kept)
    lines: dict[str, int] = field(default_factory=dict)  # field -> 1-based line it came from

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def kv_bytes_per_token(self) -> float | None:
        """KV bytes one token costs, from the engine's own pool size and capacity."""
        tokens = self.pool_tokens
        if self.kv_cache_bytes is not None and self.kv_cache_bytes > 0 and tokens:
            return self.kv_cache_bytes / tokens
        return None

    @property
    def pool_tokens(self) -> int | None:
        """Tokens the KV pool holds: logged tokens, else blocks x block size, else SGLang's count."""
        if self.kv_cache_tokens:
            return self.kv_cache_tokens
        if self.gpu_blocks and self.block_size:
            return self.gpu_blocks * self.block_size
        if self.max_total_num_tokens:
            return self.max_total_num_tokens
        return None

    @property
    def first_line(self) -> int:
        """The first log line of this start-up's accounting (0 when none)."""
        got = [v for v in self.lines.values() if v > 0]
        return min(got) if got else 0

    @property
    def has_accounting(self) -> bool:
        return any(v is not None for v in (self.kv_cache_bytes, self.kv_cache_tokens, self.gpu_blocks,
                                           self.max_total_num_tokens, self.requested_memory_bytes,
                                           self.weights_bytes)) or self.failure is not None


def accounting_from_cache_config(config: dict, generation: str | None = None) -> StartupAccounting:
    """What ``vllm:cache_config_info`` says of the pool, as a :class:`StartupAccounting` (metrics alone).

    Labels are strings; "None", empty or unreadable values stay None. ``kv_cache_memory_bytes`` is the
    --kv-cache-memory-bytes setting (recent vLLM; it sizes the pool instead of the utilization), and with
    it the pool's bytes are known; ``kv_cache_size_tokens`` (recent vLLM) else num_gpu_blocks x block_size.
    """
    def num(key: str, cast=float):
        v = (config or {}).get(key)
        try:
            x = cast(float(v))
        except (TypeError, ValueError, OverflowError):
            return None
        return x if x == x and x not in (float("inf"), float("-inf")) and x > 0 else None

    acc = StartupAccounting(engine={"v1": "vllm-v1", "v0": "vllm-v0"}.get(generation or "", "vllm"))
    u = num("gpu_memory_utilization")
    acc.gpu_memory_utilization = u if u is not None and u <= 1.0 else None
    acc.gpu_blocks = num("num_gpu_blocks", int)
    acc.block_size = num("block_size", int)
    acc.kv_cache_tokens = num("kv_cache_size_tokens", int)
    acc.kv_cache_memory_bytes_setting = num("kv_cache_memory_bytes")
    if acc.kv_cache_memory_bytes_setting is not None:
        acc.kv_cache_bytes = acc.kv_cache_memory_bytes_setting
    acc.started = acc.gpu_blocks is not None
    return acc
