"""kv-block-size-mismatch: the KV block size wastes memory for the observed sequence lengths.

Mechanism: vLLM allocates KV memory in blocks of ``block_size`` tokens; a sequence's last block
is on average half empty. The waste formula, the supported block sizes and the recommendation live
in one place, :mod:`fragscope.kvbudget` (``block_waste``); this detector only judges the window.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import ids
from ..kvbudget import VLLM_BLOCK_SIZES, block_waste
from ..kvbudget import expected_waste_ratio as expected_waste  # noqa: F401  (re-export for old importers)
from ..kvbudget import recommend_block_size  # noqa: F401
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity
from ..promql import K, AlertRule, num, quote, shared, sig as psig
from ..signals import primary
from ..units import finite_or_none as _f
from .frame import Frame

ID = ids.KV_BLOCK_SIZE_MISMATCH
REQUIRES = ("cache_config_info", "request_prompt_tokens", "request_generation_tokens")
CORROBORATES = ("kv_cache_usage_ratio",)

SUPPORTED_BLOCK_SIZES = VLLM_BLOCK_SIZES  # kept for importers; the list lives in fragscope.kvbudget


@dataclass(frozen=True)
class Config:
    waste_info: float = 0.15  # >= 15 % of KV memory wasted in partial blocks is worth a note
    waste_warning: float = 0.30  # >= 30 %: a third of the pool holds nothing (block 64 for 32-token sequences: ~50 %)
    min_requests: int = 50  # averages over fewer finished requests are anecdotes


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
    if not (math.isfinite(avg_len) and avg_len > 0 and math.isfinite(block) and block >= 1 and block == int(block)):
        return Inconclusive(ID, [], f"block size {block:g} or average length {avg_len:g} tokens out of range")
    bw = block_waste(int(block), avg_len)
    waste, rec, rec_waste = bw["expected_waste_ratio"], bw["recommended_block_size"], bw["recommended_waste_ratio"]
    if waste < cfg.waste_info:
        return []
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
           "recommended_waste": rec_waste, "num_gpu_blocks": f.config.get("num_gpu_blocks"), "reason": bw["reason"]}
    return [Finding(ID, sev, conf, summary, None, ev, [], {}, playbook={"context": ctx})]


# --- PromQL: the waste rule over the last hour, for the alert ---------------------------------------
ALERT_WINDOW = "1h"
CONFIGURED_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # what vLLM accepted across versions and devices


def alert_rule(cfg: Config = Config()) -> AlertRule:
    """Expected waste (B - 1) / (2 x avg_len + B - 1) >= waste_info over at least min_requests finished requests
    in the last hour, where a smaller supported size is nearer avg_len / 2 on a log scale (avg_len <= sqrt(2) B:
    ``recommend_block_size``), as the detector asks."""
    w = ALERT_WINDOW
    # the configured size, as a value: every size an engine may report, not only those recommended
    # (read four times below: the rule file records it once, promql.shared)
    block = shared("fragscope:kv_block_size_tokens:max", "max by (" + K + ") (" + " or ".join(
        f"{psig('cache_config_info', '{}', None, extra='block_size=' + quote(str(b)))} * {b}"
        for b in CONFIGURED_BLOCK_SIZES) + ")")

    def inc(s: str, suffix: str) -> str:
        return f"sum by ({K}) {psig(s, 'increase({})', w, suffix=suffix)}"
    n = f"({inc('request_prompt_tokens', '_count')})"
    avg = (f"(({inc('request_prompt_tokens', '_sum')}) + on ({K}) ({inc('request_generation_tokens', '_sum')}))"
           f" / on ({K}) ({n} >= {cfg.min_requests:d})")
    waste = f"(({block}) - 1) / on ({K}) (2 * ({avg}) + on ({K}) ({block}) - 1)"
    # a smaller recommended size exists: the block is above the largest recommended size, or half of it is
    # nearer avg / 2 on a log scale (avg <= sqrt(2) x block)
    better = (f"(({avg}) <= on ({K}) 1.41421356 * ({block}) and on ({K}) ({block}) > {min(VLLM_BLOCK_SIZES):d})"
              f" or on ({K}) (({block}) > {max(VLLM_BLOCK_SIZES):d})")
    expr = f"({waste}) >= {num(cfg.waste_info)} and on ({K}) ({better})"
    return AlertRule(
        "FragscopeKvBlockSizeMismatch", ID, expr, "30m", "info",
        "KV block size wastes cache for these sequence lengths",
        f"Expected internal KV waste at or above {cfg.waste_info * 100:g} % (warning from "
        f"{cfg.waste_warning * 100:g} %) over at least {cfg.min_requests} requests; set a block size near half the "
        "average sequence length.",
        "Partial last blocks waste KV memory: (block_size - 1) / (2 x avg_seq_len + block_size - 1).",
        {"waste_info": cfg.waste_info, "min_requests": float(cfg.min_requests)})


# --- playbook: what to do about it; actions computed from a finding's context -------------------------------------
def actions(ctx: dict, config: dict) -> list[str]:
    rec = ctx.get("recommended_block_size")
    if not rec:
        return []
    return [f"Set --block-size {rec} (now {ctx.get('block_size', '?'):.0f}); expected KV waste "
            f"{(_f(ctx.get('waste')) or 0) * 100:.0f} % → {(_f(ctx.get('recommended_waste')) or 0) * 100:.0f} %."]


PLAYBOOK = Playbook(
    ID, "KV block size too large for the sequences",
    "Partial last blocks waste KV memory: the pool holds fewer sequences than it could.",
    ["Nothing urgent: plan a config change."],
    [Action("Set --block-size to about half the average sequence length (a supported size).",
            ["the attention backend supports that block size (FlashAttention needs multiples of 16)"],
            ["prefix caching hit rates depend on block granularity: re-check them after the change"])],
    ["more KV blocks in use per request at the same traffic; fewer preemptions at peaks"],
    ["vLLM paper (Kwon et al., SOSP 2023), internal fragmentation of the last block: waste ≈ (block_size − 1) / (2 × avg_seq_len + block_size − 1)"])


RUNS_ON_SHORT_WINDOWS = True  # judges the present itself: runs on windows of any length
