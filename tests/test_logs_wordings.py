"""One source for the start-up wordings: the log collector (collectors/enginelog/patterns.py) and the sizing
parser (sizing/wordings.py imports them) read the same lines the same way."""
from __future__ import annotations

import pytest

from fragscope.collectors.enginelog import parse_log_line, patterns
from fragscope.sizing import parse_startup, wordings

GIB = 1024 ** 3
H = "INFO 05-01 10:00:01 [worker.py:1] "


def test_sizing_reads_the_collectors_patterns():
    for name in ("BLOCKS", "KV_TOKENS", "MAX_CONC", "AVAIL_KV", "WEIGHTS", "GRAPH", "SHORTFALL", "KV_INSUFF",
                 "KV_INSUFF_EST"):
        assert getattr(wordings, name) is getattr(patterns, name), name
    assert set(wordings.V0_PROSE.values()) <= {rx for _, rx in patterns.PROFILE_PROSE}
    assert set(wordings.V0_KV.values()) <= {rx for _, rx in patterns.PROFILE_KEYVALUE}


@pytest.mark.parametrize("line,gpu,cpu", [
    ("# GPU blocks: 2627, # CPU blocks: 327", 2627, 327),  # V0 (the saved vLLMBatchingMemoryGap log)
    ("# GPU blocks: 2627", 2627, None),  # no CPU count
    ("# cuda blocks: 1234, # CPU blocks: 512", 1234, 512),  # Ray / older executors
    ("# CUDA blocks: 12,345", 12345, None),
])
def test_block_counts_in_both_readers(line, gpu, cpu):
    ev = parse_log_line(H + line)
    assert ev.kind == "kv_blocks" and ev.fields == {"gpu_blocks": gpu, "cpu_blocks": cpu}
    acc = parse_startup([H + line])
    assert acc.gpu_blocks == gpu and acc.cpu_blocks == cpu


@pytest.mark.parametrize("line,expect", [
    ("Available KV cache memory: -0.52 GiB", -0.52 * GIB),  # nothing left for the pool: the sign counts
    ("Available KV cache memory: 64.69 GiB", 64.69 * GIB),
    ("the rest of the memory reserved for KV Cache is -1.25GiB.", -1.25 * GIB),
])
def test_kv_pool_size_keeps_its_sign_in_both_readers(line, expect):
    ev = parse_log_line(H + line)
    assert ev.fields["kv_cache_bytes"] == pytest.approx(expect)
    assert parse_startup([H + line]).kv_cache_bytes == pytest.approx(expect)


def test_kv_tokens_and_graph_capture_in_both_readers():
    lines = [H + "GPU KV cache size: 5,463,232 tokens", H + "Graph capturing finished in 5 secs, took 0.37 GiB"]
    evs = [parse_log_line(ln) for ln in lines]
    assert evs[0].fields["tokens"] == 5463232 and evs[1].fields["cuda_graph_bytes"] == pytest.approx(0.37 * GIB)
    acc = parse_startup(lines)
    assert acc.kv_cache_tokens == 5463232 and acc.cuda_graph_bytes == pytest.approx(0.37 * GIB)
