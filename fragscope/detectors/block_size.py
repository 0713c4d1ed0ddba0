"""kv-block-size-mismatch: the KV block size wastes memory for the observed sequence lengths.

Mechanism: vLLM allocates KV memory in blocks of ``block_size`` tokens; a sequence's last block
is on average half empty. Expected waste ≈ (block_size − 1) / (2 × avg_seq_len + block_size − 1)
(seed 001: avg 32 tokens with block 64 wastes half). A block near half the average length keeps
the waste small without multiplying block-table overhead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..signals import primary
from ..model import Evidence, Finding, Inconclusive, Severity
from .frame import Frame

ID = "kv-block-size-mismatch"
REQUIRES = ("cache_config_info", "request_prompt_tokens", "request_generation_tokens")
CORROBORATES = ("kv_cache_usage_ratio",)

# Block sizes vLLM accepts (CacheConfig.block_size: 1, 8, 16, 32, 64, 128; CUDA attention
# backends take 8/16/32 broadly, larger ones only some backends).
SUPPORTED_BLOCK_SIZES = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Config:
    waste_info: float = 0.15  # >= 15 % of KV memory wasted in partial blocks is worth a note
    waste_warning: float = 0.30  # >= 30 %: a third of the pool holds nothing (seed 001: ~50 %)
    min_requests: int = 50  # averages over fewer finished requests are anecdotes


def expected_waste(block_size: float, avg_seq_len: float) -> float:
    if avg_seq_len <= 0 or block_size <= 0:
        return math.nan
    return (block_size - 1) / (2 * avg_seq_len + block_size - 1)


def recommend_block_size(avg_seq_len: float) -> int:
    target = max(1.0, avg_seq_len / 2)
    return min(SUPPORTED_BLOCK_SIZES, key=lambda b: (abs(math.log2(b) - math.log2(target)), b))


def detect(f: Frame, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    missing = []
    bs = f.config.get("block_size")
    if bs is None:
        missing.append(primary("cache_config_info") + "{block_size}")
    for sig in ("request_prompt_tokens", "request_generation_tokens"):
        if sig not in f.hist_avg:
            missing.append(primary(sig))
    if missing:
        return Inconclusive(ID, missing, "block size or sequence lengths not available")
    try:
        block = float(bs)
    except (TypeError, ValueError):
        return Inconclusive(ID, ["vllm:cache_config_info{block_size}"], f"unreadable block_size {bs!r}")
    n = min(f.hist_count.get("request_prompt_tokens", 0), f.hist_count.get("request_generation_tokens", 0))
    if n < cfg.min_requests:
        return Inconclusive(ID, [], f"only {n:.0f} finished requests in the window (need {cfg.min_requests})")
    avg_len = f.hist_avg["request_prompt_tokens"] + f.hist_avg["request_generation_tokens"]
    waste = expected_waste(block, avg_len)
    if not math.isfinite(waste) or waste < cfg.waste_info:
        return []
    rec = recommend_block_size(avg_len)
    rec_waste = expected_waste(rec, avg_len)
    if rec >= block:
        return []  # nothing better to offer
    sev = Severity.WARNING if waste >= cfg.waste_warning else Severity.INFO
    conf = min(0.9, 0.5 + 0.1 * math.log10(max(n, 1)))
    ev = [
        Evidence("kv_block_waste_ratio", waste, None, cfg.waste_info, "ratio", (f.start, f.end),
                 f"(block_size − 1) / (2 × avg_seq_len + block_size − 1), block {block:.0f}", True),
        Evidence("avg_seq_len_tokens", avg_len, None, None, "tokens", (f.start, f.end),
                 f"prompt {f.hist_avg['request_prompt_tokens']:.0f} + output "
                 f"{f.hist_avg['request_generation_tokens']:.0f} over {n:.0f} requests", True),
    ]
    summary = (f"KV block size {block:.0f} wastes ~{waste * 100:.0f} % of KV memory for sequences averaging "
               f"{avg_len:.0f} tokens; block size {rec} would waste ~{rec_waste * 100:.0f} %.")
    ctx = {"block_size": block, "avg_seq_len": avg_len, "waste": waste, "recommended_block_size": rec,
           "recommended_waste": rec_waste, "num_gpu_blocks": f.config.get("num_gpu_blocks")}
    return [Finding(ID, sev, conf, summary, None, ev, [], {}, playbook={"context": ctx})]
