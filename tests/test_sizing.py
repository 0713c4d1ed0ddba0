"""Sizing from the engine's own evidence: start-up parsing of real logs, the arithmetic, the diagnoses, the CLI.

Every expected figure is written out from the log text by hand (the engines print GiB with 2 decimals;
"GB" is GiB) and recomputed here with plain arithmetic, not with the module under test.
Fixtures and their sources: tests/data/README_sizing.md.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from fragscope.cli import sizing_cmd
from fragscope.model import Finding, Inconclusive
from fragscope.playbooks import Playbook
from fragscope.sizing import (KV_POOL_UNDERSIZED, STARTUP_OOM, StartupAccounting, detect_kv_pool_undersized,
                              detect_startup_oom, parse_startup, recommend, summarize_runtime)
from fragscope.sizing.playbooks import computed_actions
from fragscope.sizing.recommend import SizingConfig

DATA = os.path.join(os.path.dirname(__file__), "data", "sizing")
GIB = 1024 ** 3
MIB = 1024 ** 2


def load(name: str) -> StartupAccounting:
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return parse_startup(fh)


def floor2(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def ceil2(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


# ---------------------------------------------------------------------------------------------
# parsing: every wording, figures exact
def test_v0_prose_with_cuda_blocks():
    a = load("vllm_v0_prose_cuda_blocks.log")
    assert a.total_gpu_memory_bytes == round(79.19 * GIB)
    assert a.gpu_memory_utilization == 0.90
    assert a.requested_memory_bytes == round(71.27 * GIB)
    assert (a.weights_bytes, a.non_torch_memory_bytes, a.activation_peak_bytes, a.kv_cache_bytes) == (
        round(12.55 * GIB), round(0.16 * GIB), round(2.38 * GIB), round(56.18 * GIB))
    assert (a.gpu_blocks, a.cpu_blocks) == (7191, 512)  # "# cuda blocks" (lower case) wording
    assert a.failure is None and a.lines["kv_cache_bytes"] == 4


def test_v0_table_wording():
    a = load("vllm_v0_profile_table.log")
    assert a.engine == "vllm-v0"
    assert a.total_gpu_memory_bytes == round(79.22 * GIB) and a.gpu_memory_utilization == 0.90
    assert a.requested_memory_bytes == round(71.29 * GIB)
    assert a.weights_bytes == round(14.96 * GIB) and a.non_torch_memory_bytes == round(1.79 * GIB)
    assert a.activation_peak_bytes == round(1.26 * GIB) and a.kv_cache_bytes == round(53.29 * GIB)


def test_v0_blocks_concurrency_and_derived_block_size():
    a = load("vllm_v0_tp_prose_blocks.log")
    assert (a.gpu_blocks, a.cpu_blocks) == (3852, 4096)
    assert (a.max_concurrency, a.max_concurrency_tokens_per_request) == (1.54, 40000)
    # 1.54 x 40000 / 3852 = 15.99 -> block 16, derived (the log does not print it)
    assert a.block_size == 16 and a.lines["block_size"] == -1
    assert a.pool_tokens == 3852 * 16
    assert a.kv_bytes_per_token == pytest.approx(round(3.76 * GIB) / (3852 * 16))


def test_v1_07_blocks_without_cpu_blocks():
    a = load("vllm_v1_0.7_gpu_blocks.log")
    assert a.gpu_blocks == 1381 and a.cpu_blocks is None
    assert a.weights_bytes == round(67.7229 * GIB)  # "GB" printed, bytes / 2**30 computed
    assert a.block_size == 16  # 10.79 x 2048 / 1381 = 16.0


def test_v1_graph_estimate_wording():
    a = load("vllm_v1_graph_estimate.log")
    assert a.engine == "vllm-v1"
    assert a.kv_cache_bytes == round(6.87 * GIB)
    assert a.cuda_graph_estimate_bytes == round(0.36 * GIB) and a.cuda_graph_in_budget is True
    assert a.gpu_memory_utilization == 0.82


def test_v1_kv_memory_summary_line():
    a = load("vllm_v1_kv_memory_summary.log")
    assert a.startup_free_bytes == pytest.approx(177.66 * GIB) and a.total_gpu_memory_bytes == pytest.approx(178.36 * GIB)
    assert a.gpu_memory_utilization == 0.9 and a.requested_memory_bytes == pytest.approx(160.53 * GIB)
    assert a.weights_bytes == pytest.approx(8.58 * GIB) and a.activation_peak_bytes == pytest.approx(9.96 * GIB)
    assert a.non_torch_memory_bytes == pytest.approx(0.07 * GIB) and a.cuda_graph_bytes == pytest.approx(0.65 * GIB)
    assert a.kv_cache_memory_bytes_fit == 151519866880
    assert a.kv_cache_memory_bytes_full is None  # the line is cut off in the source: not invented


def test_sglang_wordings():
    a = load("sglang_gemma3_startup.log")
    assert a.engine == "sglang"
    assert a.weights_bytes == round(8.13 * GIB) and a.sglang_free_after_weights_bytes == round(131.08 * GIB)
    assert a.kv_cache_tokens == 834615 and a.kv_cache_bytes == 2 * round(54.12 * GIB)
    assert a.sglang_free_after_pool_bytes == round(14.61 * GIB)
    b = load("sglang_graph_end.log")
    assert b.cuda_graph_bytes == round(1.00 * GIB) and b.cuda_graph_seconds == 11.39  # last TP worker's line
    assert b.sglang_free_after_graphs_bytes == round(11.17 * GIB)
    c = load("sglang_max_total.log")
    assert (c.max_total_num_tokens, c.max_running_requests, c.context_len) == (2086558, 33, 256000)
    assert c.sglang_free_after_graphs_bytes == round(17.22 * GIB) and c.started


def test_failures_and_their_phase():
    a = load("vllm_v0_graph_capture_oom.log")
    f = a.failure
    assert f["kind"] == "oom" and f["phase"] == "graph-capture"
    assert f["requested_bytes"] == 2 * MIB and f["free_bytes"] == 448 * 1024
    assert f["total_bytes"] == round(44.53 * GIB)
    b = load("vllm_v1_shortfall.log")
    assert b.failure["kind"] == "startup-shortfall"
    assert b.failure["free_bytes"] == pytest.approx(31.44 * GIB) and b.failure["requested_bytes"] == pytest.approx(45.01 * GIB)
    c = load("vllm_v0_no_cache_blocks.log")
    assert c.failure["kind"] == "no-kv-memory" and c.max_model_len == 4096 and c.gpu_blocks == 0


def test_tolerates_prefixes_ansi_and_restarts():
    lines = [
        "\x1b[32mINFO\x1b[0m 01-01 00:00:00 [worker.py:1] the current vLLM instance can use total_gpu_memory "
        "(10.00GiB) x gpu_memory_utilization (0.50) = 5.00GiB",
        "vllm-1  | INFO 01-01 00:00:01 [worker.py:1] model weights take 1.00GiB; non_torch_memory takes 0.10GiB; "
        "PyTorch activation peak memory takes 0.40GiB; the rest of the memory reserved for KV Cache is 3.50GiB.",
        "INFO 01-01 00:01:00 [api_server.py:1] vLLM API server version 0.6.6",
        "(VllmWorkerProcess pid=7) INFO 01-01 00:01:05 [worker.py:1] the current vLLM instance can use "
        "total_gpu_memory (10.00GiB) x gpu_memory_utilization (0.80) = 8.00GiB",
        "2026-01-01T00:01:06.123Z INFO 01-01 00:01:06 [worker.py:1] model weights take 1.00GiB; non_torch_memory "
        "takes 0.10GiB; PyTorch activation peak memory takes 0.40GiB; the rest of the memory reserved for KV Cache "
        "is 6.50GiB.",
    ]
    a = parse_startup(lines)
    assert a.startups == 2 and a.version == "0.6.6"
    assert a.gpu_memory_utilization == 0.80 and a.kv_cache_bytes == round(6.5 * GIB)  # the last start-up wins


def test_no_startup_lines_is_inconclusive_not_healthy():
    a = parse_startup(["hello", "GET /v1/models 200", ""])
    assert not a.has_accounting
    r = recommend(a)
    assert r.status == "inconclusive" and r.missing and not r.settings


# ---------------------------------------------------------------------------------------------
# recommendations, checked by hand
def test_graph_capture_oom_value_that_would_have_started():
    # vllm#15598: 44.53 GiB, utilization 0.98, OOM capturing CUDA graphs: tried 2.00 MiB with 448 KiB free.
    r = recommend(load("vllm_v0_graph_capture_oom.log"))
    total, budget = round(44.53 * GIB), round(43.64 * GIB)
    short = 2 * MIB - 448 * 1024
    margin = max(0.5 * GIB, 0.02 * total)  # 0.89 GiB
    expect = floor2((budget - short - margin) / total)  # 0.9599... -> 0.95
    assert expect == 0.95
    assert r.settings == {"--gpu-memory-utilization": expect}
    assert [c["case"] for c in r.cases] == ["startup-oom"] and r.status == "change"
    assert r.outcome["kv_cache_bytes"] == int(round(21.20 * GIB) - short - margin)
    assert any("lower bound" in n for n in r.notes)  # graph capture: says the value is a floor of the change


def test_shortfall_is_memory_held_elsewhere():
    # vllm#20305 / dockerode#811: free 31.44 of 47.38 GiB at start, 0.95 requested.
    r = recommend(load("vllm_v1_shortfall.log"))
    total, free = 47.38 * GIB, 31.44 * GIB
    expect = floor2((free - max(0.5 * GIB, 0.02 * total)) / total)
    assert expect == 0.64
    assert r.settings["--gpu-memory-utilization"] == expect
    assert {c["case"] for c in r.cases} == {"memory-held-elsewhere", "startup-oom"}
    assert "15.94 GiB" in " ".join(r.arithmetic)  # 47.38 - 31.44 held by someone else


def test_no_cache_blocks_without_split_says_what_to_capture():
    r = recommend(load("vllm_v0_no_cache_blocks.log"))
    assert r.status == "inconclusive" and not r.settings
    assert r.cases[0]["case"] == "startup-oom" and "raise --gpu-memory-utilization" in r.cases[0]["change"]
    assert any("profile split" in m for m in r.missing)


def test_no_cache_blocks_with_split_gives_the_floor():
    a = StartupAccounting(engine="vllm-v0", total_gpu_memory_bytes=24 * GIB, gpu_memory_utilization=0.3,
                          weights_bytes=7 * GIB, activation_peak_bytes=1 * GIB, non_torch_memory_bytes=0.5 * GIB,
                          failure={"kind": "no-kv-memory", "phase": "kv-allocation", "line": 9})
    r = recommend(a)
    assert r.settings["--gpu-memory-utilization"] == ceil2(8.5 / 24 + 0.01)  # 0.3642 -> 0.37
    assert any("per-token size" in n for n in r.notes)


RUNTIME_FULL = dict(device_total_bytes=15.77 * GIB, device_used_peak_bytes=14.60 * GIB, kv_usage_peak_ratio=1.0,
                    preemptions_total=50.0, preemptions_by_reason={"kv_full": 50.0, "priority": 3.0},
                    waiting_peak=12.0, running_peak=8.0, concurrent_demand_peak=20.0, seq_len_p95_tokens=4000.0)


def test_pool_too_small_with_headroom():
    a = load("vllm_v0_tp_prose_blocks.log")  # 15.77 GiB x 0.90 = 14.20 GiB; KV 3.76 GiB = 3852 blocks of 16
    r = recommend(a, RUNTIME_FULL)
    total, budget, kv0 = round(15.77 * GIB), round(14.20 * GIB), round(3.76 * GIB)
    outside = 14.60 * GIB - budget
    ceiling = floor2((total - outside - max(0.5 * GIB, 0.02 * total)) / total)
    assert ceiling == 0.94
    bpt = kv0 / (3852 * 16)
    need_u = ceil2((budget - kv0 + 20 * 4000 * bpt) / total)
    assert need_u == 0.98 and need_u > ceiling  # demand does not fit even at the ceiling
    kv_new = kv0 + (ceiling - 0.90) * total
    tokens = int(kv_new / bpt)
    assert r.settings["--gpu-memory-utilization"] == ceiling
    assert r.outcome["kv_cache_tokens"] == tokens and r.outcome["max_concurrency"] == tokens // 4000 == 17
    assert r.settings["--max-num-seqs"] == 17  # what fits; the rest queues instead of preempting
    case = r.cases[0]
    assert case["case"] == "pool-too-small" and "kv_full" in case["evidence"] and "priority 3" in case["evidence"]


def test_pool_never_full_needs_no_change():
    rt = dict(RUNTIME_FULL, kv_usage_peak_ratio=0.62, preemptions_total=0.0, preemptions_by_reason={"kv_full": 0.0},
              waiting_peak=0.0)
    r = recommend(load("vllm_v0_tp_prose_blocks.log"), rt)
    assert not r.settings and not r.cases and r.status == "ok"
    assert any("never ran full" in n for n in r.notes)


def test_priority_preemptions_alone_are_not_pool_pressure():
    rt = dict(RUNTIME_FULL, kv_usage_peak_ratio=0.7, preemptions_by_reason={"kv_full": 0.0, "priority": 40.0},
              waiting_peak=0.0)
    r = recommend(load("vllm_v0_tp_prose_blocks.log"), rt)
    assert not any(c["case"] == "pool-too-small" for c in r.cases)


def test_no_headroom_caps_max_num_seqs():
    rt = dict(RUNTIME_FULL, device_used_peak_bytes=15.60 * GIB)  # 0.17 GiB free at peak: below the margin
    r = recommend(load("vllm_v0_tp_prose_blocks.log"), rt)
    per_seq = 4000
    assert r.settings == {"--max-num-seqs": (3852 * 16) // per_seq}  # 61,632 tokens / 4,000 = 15
    assert "no headroom" in r.cases[0]["evidence"]


def test_runtime_oom_lowers_utilization():
    a = load("vllm_v0_prose_cuda_blocks.log")
    a.started = True
    a.runtime_ooms = [{"kind": "oom", "phase": "runtime", "requested_bytes": 2.0 * GIB, "free_bytes": 0.5 * GIB,
                       "total_bytes": a.total_gpu_memory_bytes}]
    r = recommend(a)
    total, budget = round(79.19 * GIB), round(71.27 * GIB)
    expect = floor2((budget - 1.5 * GIB - 0.02 * total) / total)  # (71.27 - 1.5 - 1.58) / 79.19 = 0.8611
    assert r.settings["--gpu-memory-utilization"] == expect == 0.86
    assert r.cases[0]["case"] == "runtime-oom"


def test_sglang_pool_too_small_raises_mem_fraction():
    a = load("sglang_gemma3_startup.log")
    a.mem_fraction_static = 0.83
    rt = dict(device_total_bytes=140.0 * GIB, device_used_peak_bytes=130.0 * GIB, kv_usage_peak_ratio=0.99,
              preemptions_total=25.0, waiting_peak=9.0)
    r = recommend(a, rt)
    init = round(131.08 * GIB) + round(8.13 * GIB)
    spare = 140 * GIB - 130 * GIB - 0.02 * 140 * GIB
    expect = floor2(0.83 + spare / init)  # 0.83 + 7.2 / 139.21 = 0.8817 -> 0.88
    assert r.settings == {"--mem-fraction-static": expect} and expect == 0.88
    kv = 2 * round(54.12 * GIB) + (expect - 0.83) * init
    assert r.outcome["kv_cache_tokens"] == int(kv / (2 * round(54.12 * GIB) / 834615))


def test_json_of_a_recommendation_is_valid():
    r = recommend(load("vllm_v0_graph_capture_oom.log"))
    json.dumps(r.to_dict(), allow_nan=False)


# ---------------------------------------------------------------------------------------------
# run-time summary
def test_summarize_runtime_peaks_resets_and_gaps():
    nan = float("nan")
    rt = summarize_runtime(device_total_bytes=[80.0, 80.0], device_used_bytes=[70.0, nan, 75.0],
                           kv_usage_ratio=[0.5, 0.97, nan], preemptions_total=[0, 5, 9, 2, 4],
                           preemptions_by_reason={"kv_full": [0, 3, 6], "priority": [1, 1, 1]},
                           running=[3, 8, 5], waiting=[0, 4, nan], seq_lens=[100, 200, 300, 400])
    assert rt["device_used_peak_bytes"] == 75.0 and rt["device_free_at_peak_bytes"] == 5.0
    assert rt["kv_usage_peak_ratio"] == 0.97
    assert rt["preemptions_total"] == 9 + 4  # 0->9, reset, 2->4 counts the 2 since the reset: 9 + 2 + 2
    assert rt["preemptions_by_reason"] == {"kv_full": 6.0, "priority": 0.0}
    assert rt["concurrent_demand_peak"] == 12.0  # 8 + 4; the NaN pair is skipped
    assert rt["seq_len_mean_tokens"] == 250.0
    assert "other_processes_peak_bytes" not in rt  # absent, not zero


# ---------------------------------------------------------------------------------------------
# diagnoses
def test_detect_kv_pool_undersized():
    res = detect_kv_pool_undersized(load("vllm_v0_tp_prose_blocks.log"), RUNTIME_FULL)
    assert isinstance(res, list) and len(res) == 1
    f = res[0]
    assert isinstance(f, Finding) and f.id == "kv-pool-undersized"
    assert "--gpu-memory-utilization 0.94" in f.summary and "now 0.9" in f.summary
    acts = computed_actions(f.id, f.context)
    assert f.playbook is None and "context" not in f.to_dict()  # the registry builds the playbook from context
    assert any("--gpu-memory-utilization 0.94" in a for a in acts)
    # accounting as a dict (what a registry passes around) gives the same answer
    again = detect_kv_pool_undersized(load("vllm_v0_tp_prose_blocks.log").to_dict(), RUNTIME_FULL)
    assert again[0].summary == f.summary


def test_detect_kv_pool_undersized_inconclusive_and_quiet():
    inc = detect_kv_pool_undersized(load("vllm_v0_tp_prose_blocks.log"), {"kv_usage_peak_ratio": 1.0})
    assert isinstance(inc, Inconclusive) and any("NVML" in m for m in inc.missing)
    inc2 = detect_kv_pool_undersized(parse_startup([]), RUNTIME_FULL)
    assert isinstance(inc2, Inconclusive)
    quiet = dict(RUNTIME_FULL, kv_usage_peak_ratio=0.5, preemptions_total=0.0, preemptions_by_reason={"kv_full": 0.0})
    assert detect_kv_pool_undersized(load("vllm_v0_tp_prose_blocks.log"), quiet) == []


def test_detect_startup_oom():
    res = detect_startup_oom(load("vllm_v0_graph_capture_oom.log"))
    assert len(res) == 1 and res[0].id == "startup-oom" and res[0].severity.value == "critical"
    assert "--gpu-memory-utilization 0.95" in res[0].summary
    assert detect_startup_oom(load("vllm_v0_prose_cuda_blocks.log")) == []  # it started
    assert isinstance(detect_startup_oom(parse_startup(["nothing"])), Inconclusive)
    inc = detect_startup_oom(load("vllm_v0_no_cache_blocks.log"))
    assert inc[0].missing  # a finding (it failed) that says what would give the value


def test_playbooks_are_the_project_type():
    for pb in (KV_POOL_UNDERSIZED, STARTUP_OOM):
        assert isinstance(pb, Playbook) and pb.durable and pb.verify and pb.id in ("kv-pool-undersized", "startup-oom")
        json.dumps(pb.to_dict())


# ---------------------------------------------------------------------------------------------
# CLI
def _group() -> click.Group:
    g = click.Group()
    sizing_cmd.register(g, click.Group())
    return g


def test_cli_human_and_json():
    path = os.path.join(DATA, "vllm_v0_graph_capture_oom.log")
    r = CliRunner().invoke(_group(), ["size", "--log", path])
    assert r.exit_code == 0, r.output
    assert "startup-oom" in r.output and "set: --gpu-memory-utilization 0.95" in r.output and "arithmetic:" in r.output
    r = CliRunner().invoke(_group(), ["size", "--log", path, "--format", "json"])
    d = json.loads(r.output)
    assert d["recommendation"]["settings"] == {"--gpu-memory-utilization": 0.95}
    assert d["accounting"]["failure"]["phase"] == "graph-capture"
    r = CliRunner().invoke(_group(), ["size", "--log", path, "--margin-gib", "2"])
    assert "set: --gpu-memory-utilization 0.93" in r.output  # (43.64 - 0.0015 - 2) / 44.53 = 0.9350 -> 0.93


def test_cli_recording(tmp_path):
    rec = tmp_path / "r.om"
    rows = ["# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:num_preemptions counter",
            "# TYPE fragscope_gpu_memory_used_bytes gauge", "# TYPE fragscope_gpu_memory_total_bytes gauge",
            "# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_waiting gauge",
            "# TYPE vllm:num_preemptions_by_reason counter"]
    for i in range(6):
        t = 1_700_000_000 + 15 * i
        rows += [f"vllm:kv_cache_usage_perc 1.0 {t}", f"vllm:num_preemptions_total {10 * i} {t}",
                 f'fragscope_gpu_memory_used_bytes{{gpu="0"}} {14.6 * GIB:.0f} {t}',
                 f'fragscope_gpu_memory_total_bytes{{gpu="0"}} {15.77 * GIB:.0f} {t}',
                 f"vllm:num_requests_running 8 {t}", f"vllm:num_requests_waiting {i} {t}",
                 f'vllm:num_preemptions_by_reason_total{{reason="kv_full"}} {8 * i} {t}',
                 f'vllm:num_preemptions_by_reason_total{{reason="priority"}} {2 * i} {t}',
                 f'fragscope_gpu_memory_used_bytes{{gpu="1"}} {3.0 * GIB:.0f} {t}',
                 f'fragscope_gpu_memory_total_bytes{{gpu="1"}} {15.77 * GIB:.0f} {t}']
    rec.write_text("\n".join(rows + ["# EOF", ""]))
    r = CliRunner().invoke(_group(), ["size", "--log", os.path.join(DATA, "vllm_v0_tp_prose_blocks.log"),
                                      "--recording", str(rec), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["runtime"]["preemptions_total"] == 50.0 and d["runtime"]["concurrent_demand_peak"] == 13.0
    assert d["runtime"]["preemptions_by_reason"] == {"kv_full": 40.0, "priority": 10.0}
    assert d["runtime"]["device_used_peak_bytes"] == pytest.approx(14.6 * GIB, abs=1)  # the busiest GPU, not gpu 1
    assert d["recommendation"]["settings"]["--gpu-memory-utilization"] == 0.94
    assert d["recommendation"]["cases"][0]["case"] == "pool-too-small"


def run_cli(*args):
    code = ("import click\nfrom fragscope.cli import fragscope_group, diagnose_group, run_and_exit, sizing_cmd\n"
            "'size' in fragscope_group.commands or sizing_cmd.register(fragscope_group, diagnose_group)\n"
            "run_and_exit(fragscope_group, 'fragscope')")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def run_inprocess(args, monkeypatch, capsys):
    """The real entry path (fragscope.cli.run_and_exit: one-line errors, exit codes) without a subprocess."""
    from fragscope.cli import run_and_exit

    monkeypatch.setattr(sys, "argv", ["fragscope", *args])
    with pytest.raises(SystemExit) as ex:
        run_and_exit(_group(), "fragscope")
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def test_cli_bad_inputs_one_line_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "bin.log").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "bad.om").write_text("not a recording at all {{{\n")
    cases = [(["size", "--log", str(tmp_path / "absent.log")], "no such file"),
             (["size", "--log", str(tmp_path / "empty.log")], "empty file"),
             (["size", "--log", str(tmp_path / "bin.log")], "binary file"),
             (["size", "--log", str(tmp_path)], "a directory"),
             (["size", "--log", os.path.join(DATA, "vllm_v1_shortfall.log"), "--recording", str(tmp_path / "bad.om")], "size:"),
             (["size", "--log", os.path.join(DATA, "vllm_v1_shortfall.log"), "--margin-gib", "-1"], "--margin-gib"),
             (["size", "--log", os.path.join(DATA, "vllm_v1_shortfall.log"), "--gpu-memory", "lots"], "not a size"),
             (["size"], "--log")]
    for args, needle in cases:
        code, out, err = run_inprocess(args, monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, (args, err)


def test_cli_bad_input_subprocess_smoke(tmp_path):
    p = run_cli("size", "--log", str(tmp_path / "absent.log"))
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no such file" in p.stderr


def test_cli_subprocess_json_smoke():
    p = run_cli("size", "--log", os.path.join(DATA, "sglang_gemma3_startup.log"), "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["accounting"]["engine"] == "sglang" and d["recommendation"]["status"] == "inconclusive"
    assert any("mem_fraction_static" in m for m in d["recommendation"]["missing"])


V0_STORM = os.path.join(os.path.dirname(__file__), "data", "logs", "vllm_v0_preemption_storm.log")


def test_full_v0_log_judges_the_pool_from_its_own_stats_lines():
    # a whole V0 log (built fixture, tests/data/README_logs.md): profile with peak_torch_memory, then 5-s
    # stats lines near 100 % KV usage and preemption warnings every 50th; figures read from its text here
    import re

    from fragscope.collectors.enginelog import parse_log
    from fragscope.sizing.runtime import runtime_from_log_events

    with open(V0_STORM, encoding="utf-8") as fh:
        text = fh.read()
    gib = {k: float(re.search(k + r"=([0-9.]+)GiB", text).group(1)) for k in ("total_gpu_memory", "kv_cache_size",
                                                                               "peak_torch_memory")}
    weights_gib = float(re.search(r"Loading model weights took ([0-9.]+) GB", text).group(1))  # vLLM's GB are GiB
    blocks = int(re.search(r"# GPU blocks: (\d+)", text).group(1))
    usage = max(float(x) for x in re.findall(r"GPU KV cache usage: ([0-9.]+)%", text)) / 100
    preempted = max(int(x) for x in re.findall(r"total_num_cumulative_preemption=(\d+)", text))
    with open(V0_STORM, encoding="utf-8") as fh:
        acc = parse_startup(fh)
    assert acc.total_gpu_memory_bytes == round(gib["total_gpu_memory"] * GIB)
    assert acc.kv_cache_bytes == round(gib["kv_cache_size"] * GIB)
    assert acc.weights_bytes == round(weights_gib * GIB)
    assert acc.activation_peak_bytes == round(gib["peak_torch_memory"] * GIB) - acc.weights_bytes  # peak torch - weights
    assert acc.pool_tokens == blocks * 16  # block_size=16 in its args line
    with open(V0_STORM, encoding="utf-8") as fh:
        rt = runtime_from_log_events(parse_log(fh), since_line=acc.first_line)
    assert rt["kv_usage_peak_ratio"] == pytest.approx(usage) and rt["preemptions_total"] == preempted
    r = recommend(acc, rt)
    assert r.cases[0]["case"] == "pool-too-small" and r.status == "inconclusive" and not r.settings
    assert any("NVML" in m for m in r.missing)  # the value needs the GPU's headroom: says what to capture


def test_every_marker_passes_the_line_gate():
    from fragscope.sizing import wordings as W

    markers = [x for _, subs in W.PHASES for x in subs] + list(W.READY) + list(W.NEW_STARTUP)
    assert all(W.may_be_startup_line(m) for m in markers), [m for m in markers if not W.may_be_startup_line(m)]
    for name in os.listdir(DATA):  # every fixture line that carries a figure passes it
        with open(os.path.join(DATA, name), encoding="utf-8") as fh:
            for line in fh:
                if any(u in line for u in ("GiB", "GB", "blocks", "tokens")):
                    assert W.may_be_startup_line(line), (name, line)
    assert not W.may_be_startup_line('INFO:     127.0.0.1:5555 - "POST /v1/completions HTTP/1.1" 200 OK')


def test_pool_sized_to_the_demand_when_it_fits_under_the_ceiling():
    rt = dict(RUNTIME_FULL, device_used_peak_bytes=14.30 * GIB, concurrent_demand_peak=16.0)
    r = recommend(load("vllm_v0_tp_prose_blocks.log"), rt)
    total, budget, kv0 = round(15.77 * GIB), round(14.20 * GIB), round(3.76 * GIB)
    bpt = kv0 / (3852 * 16)
    need_u = ceil2((budget - kv0 + 16 * 4000 * bpt) / total)  # (10.44 + 3.90) / 15.77 = 0.9096 -> 0.91
    ceiling = floor2((total - (14.30 * GIB - budget) - 0.5 * GIB) / total)  # 0.96
    assert (need_u, ceiling) == (0.91, 0.96)
    assert r.settings == {"--gpu-memory-utilization": need_u}  # just enough, not the whole headroom
    assert r.outcome["max_concurrency"] == int((kv0 + 0.01 * total) / bpt) // 4000 == 16
    # demand that already fits the current pool although it ran full: the ceiling, with a note saying why
    r2 = recommend(load("vllm_v0_tp_prose_blocks.log"), dict(rt, concurrent_demand_peak=12.0))
    assert r2.settings == {"--gpu-memory-utilization": ceiling} and any("p95" in n for n in r2.notes)


def test_startup_log_alone_never_grows_the_pool():
    a = load("vllm_v1_kv_memory_summary.log")  # CUDA graphs 0.65 GiB outside the budget, no NVML
    r = recommend(a, {"kv_usage_peak_ratio": 1.0, "preemptions_total": 30.0, "waiting_peak": 5.0})
    assert not r.settings and r.status == "inconclusive"
    assert any("NVML" in m for m in r.missing) and any("CUDA graphs took 665.60 MiB" in n for n in r.notes)


def test_sglang_server_args_and_draft_model_loads():
    a = load("sglang_server_args.log")  # sglang#1100, the line cut where the source excerpt ends
    assert a.engine == "sglang" and a.mem_fraction_static == 0.87 and a.tensor_parallel_size == 2
    assert a.block_size is None  # no page_size in that release's args: not invented
    # target + MTP draft in one start-up (wording of a 2026 SGLang boot): weights add up, init free is the first
    b = parse_startup([
        "[2026-08-28 21:19:30] Load weight begin. avail mem=111.97 GB",
        "[2026-08-28 21:32:38] Load weight end. elapsed=787.55 s, type=X, avail mem=29.01 GB, mem usage=82.97 GB.",
        "[2026-08-28 21:32:39] Load weight begin. avail mem=28.81 GB",
        "[2026-08-28 21:34:13] Load weight end. elapsed=94.49 s, type=Y, avail mem=30.67 GB, mem usage=-1.86 GB.",
        "[2026-08-28 21:34:15] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 159552, K size: 1.83 GB, V size: 1.83 GB",
    ])
    assert b.startups == 1 and b.sglang_free_at_init_bytes == round(111.97 * GIB)
    assert b.weights_bytes == round(82.97 * GIB) - round(1.86 * GIB)
    assert b.sglang_free_after_weights_bytes == round(30.67 * GIB) and b.kv_cache_tokens == 159552


def test_sglang_tensor_parallel_target_and_draft():
    tp = lambda r, text: f"[2026-01-01 00:00:0{r} TP{r}] {text}"  # noqa: E731
    lines = [tp(r, "Load weight begin. avail mem=70.00 GB") for r in range(2)]
    lines += [tp(r, "Load weight end. type=X, avail mem=50.00 GB, mem usage=20.00 GB.") for r in range(2)]
    lines += [tp(r, "Load weight begin. avail mem=50.00 GB") for r in range(2)]
    lines += [tp(r, "Load weight end. type=Y, avail mem=49.00 GB, mem usage=1.00 GB.") for r in range(2)]
    a = parse_startup(lines)
    assert a.startups == 1 and a.weights_bytes == round(21.0 * GIB) and a.sglang_free_at_init_bytes == round(70 * GIB)


def test_max_model_len_too_long_both_wordings():
    a = load("vllm_v0_maxlen_too_long.log")  # vllm#2418: 229 blocks x 16 = 3664 tokens < 4096
    assert a.failure["kind"] == "kv-insufficient" and a.failure["available_tokens"] == 3664 == 229 * 16
    r = recommend(a)
    assert r.settings == {"--max-model-len": 3664} and r.cases[0]["case"] == "startup-oom"
    assert any("per token" in n for n in r.notes)  # no GPU total in that log: the utilization is not computed
    b = load("vllm_v1_maxlen_too_long.log")  # vllm#34076: 24.0 GiB needed, 3.18 GiB available
    assert b.failure["needed_bytes"] == pytest.approx(24.0 * GIB) and b.failure["available_bytes"] == pytest.approx(3.18 * GIB)
    rb = recommend(b)
    assert rb.settings == {"--max-model-len": 34736}
    # with the GPU total and utilization known, the utilization that holds one full sequence is computed
    b.total_gpu_memory_bytes, b.gpu_memory_utilization = 80 * GIB, 0.5
    rb2 = recommend(b)
    assert rb2.settings == {"--gpu-memory-utilization": math.ceil((0.5 + (24.0 - 3.18) / 80) * 100 - 1e-9) / 100}
    assert rb2.settings["--gpu-memory-utilization"] == 0.77 and rb2.alternatives == {"--max-model-len": 34736}
    b.total_gpu_memory_bytes = 32 * GIB  # 0.5 + 20.82 / 32 = 1.15: above 1 - margin, not offered
    rb3 = recommend(b)
    assert "--gpu-memory-utilization" not in rb3.settings and rb3.settings["--max-model-len"] == 34736


def test_cli_fills_what_the_log_does_not_print():
    path = os.path.join(DATA, "vllm_v1_maxlen_too_long.log")
    r = CliRunner().invoke(_group(), ["size", "--log", path, "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.5",
                                      "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["recommendation"]["settings"] == {"--gpu-memory-utilization": 0.77}
    assert d["recommendation"]["alternatives"] == {"--max-model-len": 34736}
    assert d["accounting"]["lines"]["total_gpu_memory_bytes"] == -2  # marked as given on the command line
    # the log's own figure wins over the flag
    r = CliRunner().invoke(_group(), ["size", "--log", os.path.join(DATA, "vllm_v0_graph_capture_oom.log"),
                                      "--gpu-memory", "10GiB", "--format", "json"])
    assert json.loads(r.output)["accounting"]["total_gpu_memory_bytes"] == round(44.53 * GIB)


def test_declarations_fit_the_registry():
    """The registered declarations (playbooks/window.py, playbooks/evidence.py): actions that run on the findings."""
    from fragscope.playbooks import REGISTRY

    pool, oom = REGISTRY["kv-pool-undersized"], REGISTRY["startup-oom"]
    assert pool.source == "window" and pool.also_from == ("log",) and oom.source == "log"
    f = detect_kv_pool_undersized(load("vllm_v0_tp_prose_blocks.log"), RUNTIME_FULL)[0]
    assert any("--gpu-memory-utilization 0.94" in a for a in pool.actions(f.context, {}))
    g = detect_startup_oom(load("vllm_v0_graph_capture_oom.log"))[0]
    assert any("--gpu-memory-utilization 0.95" in a for a in oom.actions(g.context, {}))


def test_judge_log_for_diagnose_logs_and_the_agent():
    from fragscope.sizing import judge_log

    with open(os.path.join(DATA, "vllm_v0_graph_capture_oom.log"), encoding="utf-8") as fh:
        acc, res = judge_log(fh)
    ids = [(type(r).__name__, r.id) for r in res]
    assert ids == [("Finding", "startup-oom")]  # it never started: no pool to judge
    with open(os.path.join(DATA, "vllm_v0_tp_prose_blocks.log"), encoding="utf-8") as fh:
        acc, res = judge_log(fh)  # started, no run-time evidence in this excerpt: says what is missing
    assert [(type(r).__name__, r.id) for r in res] == [("Inconclusive", "kv-pool-undersized")]
    lines, rt = __import__("fragscope.sizing.scenarios", fromlist=["family"]).family("pool-too-small")
    acc, res = judge_log(lines, rt)
    assert [r.id for r in res if isinstance(r, Finding)] == ["kv-pool-undersized"]


def test_hostile_and_odd_lines():
    a = parse_startup([
        "INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: -1.25 GiB",
        "INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 0 tokens",
        "ERROR 01-01 00:00:01 [core.py:1] ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.",
        "x" * 100_000 + " GiB",  # a very long line with a unit in it
        "Available KV cache memory: 99999999999999999999999999999999999999 GiB bogus",
    ])
    assert a.failure["kind"] == "no-kv-memory" and a.kv_bytes_per_token is None
    r = recommend(a)
    json.dumps(r.to_dict(), allow_nan=False)
    assert r.status == "inconclusive" and not r.settings
