"""One answer per OOM, advice that fits the job: real OOM messages from public bug reports (tests/data/README_logs.md,
"Judgement on real evidence") read by `diagnose logs` and `fragscope size --log`, checked against figures worked out
here from the messages' own text."""
from __future__ import annotations

import json
import pathlib

import pytest

from cli_helpers import cli

DATA = pathlib.Path(__file__).resolve().parent / "data" / "logs"
MIB = 1024 ** 2
GIB = 1024 ** 3


def _logs(path) -> dict:
    r = cli("logs", path, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def _size(path) -> dict:
    r = cli("size", "--log", path, "--format", "json", prog="fragscope")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["recommendation"]


def _actions(d: dict) -> list[str]:
    return [a for f in d["findings"] for a in (f.get("playbook") or {}).get("actions", [])] + \
        [a for f in d["findings"] for a in (f.get("playbook") or {}).get("immediate", [])]


# --- a tiny slack is not fragmentation, whatever the arithmetic ---------------------------------------------
@pytest.mark.parametrize("name, asked_mib, free_mib, alloc_gib, unalloc_mib, kind", [
    # bcmi/libcom#54: 256 MiB asked, 185.50 MiB free; 142.12 MiB stranded of 9.04 GiB + 142.12 MiB reserved
    ("torch_oom_libcom54_small_slack.log", 256.00, 185.50, 9.04, 142.12, "unknown"),
    # huggingface/text-generation-inference#1356: TGI pre-allocates the GPU; 131.85 MiB of 78.24 GiB reserved
    ("tgi_issue1356_preallocated_oom.log", 18.00, 14.62, 78.11, 131.85, "tgi"),
])
def test_small_slack_share_is_capacity_not_fragmentation(name, asked_mib, free_mib, alloc_gib, unalloc_mib, kind):
    unmet_mib = asked_mib + 64 - free_mib  # what the allocation lacked, PyTorch's 2 MiB pages and rounding included
    share = unalloc_mib / (alloc_gib * 1024 + unalloc_mib)
    assert unalloc_mib >= unmet_mib  # the old arithmetic: "the slack covered it" -> fragmentation
    assert share < 0.02  # 1.5 % and 0.16 % of reserved: the allocator's ordinary rounding
    d = _logs(DATA / name)
    (o,) = d["log"]["ooms"]
    assert o["verdict"] == "capacity" and o["fragmentation_ratio"] == pytest.approx(share, abs=1e-4)
    assert o["unmet_bytes"] == pytest.approx(unmet_mib * MIB, abs=0.01 * MIB)
    assert f"{share * 100:.1f} % of reserved" in o["judged_by"] and "not fragmentation" in o["judged_by"]
    assert [f["id"] for f in d["findings"]] == ["oom-capacity"]
    assert d["log"]["job_kind"] == kind
    # fragscope size gives the same cause, from the same function
    rec = _size(DATA / name)
    assert rec["outcome"]["oom_verdict"] == "capacity"
    assert any(n.startswith("the OOM's cause (as diagnose logs judges it): capacity") for n in rec["notes"])


def test_tgi_oom_gets_tgi_knobs_not_vllm_flags():
    # TGI#1356 holds text_generation_client (TGI's router) on its second line: the job is a TGI server
    d = _logs(DATA / "tgi_issue1356_preallocated_oom.log")
    acts = " ".join(_actions(d))
    assert "--max-batch-total-tokens" in acts and "--cuda-memory-fraction" in acts
    assert "--gpu-memory-utilization" not in acts and "max_num_seqs" not in acts
    # the self-listed pid 124797 (78.24 GiB reserved, the whole in-use 79.11 GiB - 14.62 MiB) is this process
    assert d["log"]["ooms"][0]["self_listed_pid"] == 124797 and d["log"]["ooms"][0]["repeats"] == 2


def test_tgi_shard_oom_le20_wording_with_allowed_figure():
    # TGI#866 (PyTorch <= 2.0 wording with "15.77 GiB allowed"): 15.40 - 15.37 = 0.03 GiB stranded of 15.40 reserved
    d = _logs(DATA / "tgi_issue866_shard_oom.log")
    (o,) = d["log"]["ooms"]
    assert o["verdict"] == "capacity" and o["fragmentation_ratio"] == pytest.approx(0.03 / 15.40, abs=1e-3)
    assert d["log"]["job_kind"] == "tgi"  # text_generation_launcher on the lines after the OOM


def test_other_ranks_on_gpu0_named_with_the_knobs_of_an_unknown_job():
    # awslabs/keys_values#92: four other processes of 414.00 MiB each on GPU 0 (the other ranks' contexts):
    # 4 x 414 = 1656 MiB = 1.62 GiB >= the 572 + 64 - 321.31 = 314.69 MiB lacked; stranded 321.37 MiB is only
    # 321.37 / (36.04 GiB + 321.37 MiB) = 0.86 % of reserved
    d = _logs(DATA / "torch_oom_keys_values92_ranks_on_gpu0.log")
    (o,) = d["log"]["ooms"]
    assert o["verdict"] == "other-process" and o["other_processes_bytes"] == 4 * 414 * MIB
    assert o["fragmentation_ratio"] == pytest.approx(321.37 / (36.04 * 1024 + 321.37), abs=1e-4)
    assert o["unmet_bytes"] == pytest.approx((572 + 64 - 321.31) * MIB, abs=0.01 * MIB)
    acts = " ".join(_actions(d))
    # no engine's lines: the job is unknown, said so; no serving flag recommended, no rolling restart
    assert d["log"]["job_kind"] == "unknown" and "what produced it is unknown" in acts
    assert "--gpu-memory-utilization" not in acts and "rolling" not in acts.lower()
    rec = _size(DATA / "torch_oom_keys_values92_ranks_on_gpu0.log")
    assert rec["outcome"]["oom_verdict"] == "other-process" and not rec["settings"]
    assert not any("--gpu-memory-utilization in force" in m for m in rec["missing"]), rec["missing"]
    (case,) = [c for c in rec["cases"] if c["case"] == "memory-held-elsewhere"]
    assert "1.62 GiB" in case["evidence"]


# --- what dominates decides (synthetic figures: the shape of a shared-GPU OOM) ------------------------------------
def test_another_process_holding_most_of_the_gpu_wins_over_a_real_slack(tmp_path):
    # synthetic: 16.00 GiB GPU, pid 777 holds 13.00 GiB (81 %); this process reserves 1.50 + 0.20 = 1.70 GiB, of
    # which 0.20 GiB (11.8 % of reserved) is stranded; 600 MiB asked with 500 MiB free -> 164 MiB lacked. The slack
    # covers the lack and is no rounding, but the other process holds 7.6x this process's whole pool: it dominates
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of "
            "16.00 GiB of which 500.00 MiB is free. Process 777 has 13.00 GiB memory in use. Including non-PyTorch "
            "memory, this process has 2.00 GiB memory in use. Of the allocated memory 1.50 GiB is allocated by PyTorch, "
            "and 204.80 MiB is reserved by PyTorch but unallocated.")
    p = tmp_path / "shared.log"
    p.write_text(line + "\n")
    d = _logs(p)
    (o,) = d["log"]["ooms"]
    assert o["unmet_bytes"] == pytest.approx((600 + 64 - 500) * MIB)
    assert o["reserved_unallocated_bytes"] >= o["unmet_bytes"] and o["fragmentation_ratio"] > 0.10
    assert o["verdict"] == "other-process" and "more than this process's PyTorch pool" in o["judged_by"]
    assert o["other_processes_share_of_total"] == pytest.approx(13 / 16, abs=1e-4)
    assert [f["id"] for f in d["findings"]] == ["oom-outside-pytorch"]
    assert _size(p)["outcome"]["oom_verdict"] == "other-process"
    # confounder: the same slack with the other process at 0.50 GiB (less than the pool): fragmentation stays
    q = tmp_path / "alone.log"
    q.write_text(line.replace("Process 777 has 13.00 GiB", "Process 777 has 500.00 MiB")
                 .replace("of which 500.00 MiB is free", "of which 500.00 MiB is free") + "\n")
    (o2,) = _logs(q)["log"]["ooms"]
    assert o2["verdict"] == "fragmentation" and _size(q)["outcome"]["oom_verdict"] == "fragmentation"


# --- PyTorch's cudaMallocAsync OOM wording, on several lines ----------------------------------------------------
def test_malloc_async_oom_read_across_its_lines():
    # PozzettiAndrea/ComfyUI-Sharp#24: 5.79 GiB allocated + 576 MiB asked on an 8.00 GiB device, 0 bytes free:
    # 8.00 - 0 - 5.79 = 2.21 GiB in use outside what PyTorch allocated >= the 576 + 64 MiB lacked and >= 1 GiB
    # (max(1 GiB, 10 % of 8 GiB)); PyTorch's limit 17179869184.00 GiB (2^64 bytes: no memory fraction set)
    d = _logs(DATA / "comfyui_sharp24_malloc_async_oom.log")
    (o,) = d["log"]["ooms"]
    assert o["wording"] == "cuda-malloc-async" and o["gpu"] == "0"
    assert o["allocated_bytes"] == pytest.approx(5.79 * GIB, abs=1) and o["requested_bytes"] == 576 * MIB
    assert o["total_bytes"] == 8 * GIB and o["free_bytes"] == 0 and o["memory_limit_bytes"] == 2.0 ** 64
    assert o["held_outside_pytorch_bytes"] == pytest.approx(8 * GIB - 5.79 * GIB, abs=1)
    assert o["verdict"] == "outside-pytorch" and "cudaMallocAsync" in o["judged_by"]
    assert _size(DATA / "comfyui_sharp24_malloc_async_oom.log")["outcome"]["oom_verdict"] == "outside-pytorch"


def test_malloc_async_oom_small_remainder_is_capacity():
    # Comfy-Org/ComfyUI#12360 (RTX 5080): 14.81 GiB allocated + 320 MiB asked on 15.92 GiB, 0 free: 1.11 GiB in use
    # outside PyTorch's allocations, under max(1 GiB, 1.59 GiB): a CUDA context and a desktop, not the cause
    d = _logs(DATA / "comfyui_issue12360_malloc_async_oom.log")
    (o,) = d["log"]["ooms"]
    assert o["held_outside_pytorch_bytes"] == pytest.approx((15.92 - 14.81) * GIB, abs=1)
    assert o["verdict"] == "capacity" and [f["id"] for f in d["findings"]] == ["oom-capacity"]
    assert _size(DATA / "comfyui_issue12360_malloc_async_oom.log")["outcome"]["oom_verdict"] == "capacity"


def test_malloc_async_cap_and_repeat(tmp_path):
    # synthetic: a memory fraction of 8.00 GiB on a 16.00 GiB device: 7.90 GiB + 200 MiB > 8.00 GiB -> memory-cap;
    # printed twice (the exception and the traceback's last line) -> one OOM, repeats 2
    block = ["torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
             "Currently allocated     : 7.90 GiB", "Requested               : 200.00 MiB",
             "Device limit            : 16.00 GiB", "Free (according to CUDA): 7.50 GiB",
             "PyTorch limit (set by user-supplied memory fraction)", "                        : 8.00 GiB"]
    p = tmp_path / "cap.log"
    p.write_text("\n".join(block + ["Traceback (most recent call last):"] + block) + "\n")
    (o,) = _logs(p)["log"]["ooms"]
    assert o["verdict"] == "memory-cap" and o["repeats"] == 2 and o["memory_limit_bytes"] == 8 * GIB


def test_json_error_body_with_an_oom_is_forwarded_by_diagnose_file():
    # gladiaio/gladia#802: {"detail": "... CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 31.75 GiB total
    # capacity; 13.38 GiB already allocated; 15.96 GiB free; 14.63 GiB reserved in total by PyTorch) ..."}
    # unmet 20 GiB + 64 MiB - 15.96 GiB = 4.10 GiB; stranded 14.63 - 13.38 = 1.25 GiB (8.5 % of reserved) < unmet;
    # outside 31.75 - 15.96 - 14.63 = 1.16 GiB < max(1 GiB, 3.18 GiB): capacity (20 GiB asked at once)
    p = DATA / "gladia802_json_error_body.json"
    r = cli(p)
    assert r.returncode in (0, 1), r.stderr
    assert "read as: diagnose logs" in r.stderr and "oom-capacity" in r.stdout
    (o,) = _logs(p)["log"]["ooms"]
    assert o["verdict"] == "capacity" and o["unmet_bytes"] == pytest.approx(20 * GIB + 64 * MIB - 15.96 * GIB, abs=1)


# --- messages wrapped over several lines ------------------------------------------------------------------------
def test_wrapped_startup_failure_reads_as_its_one_line_form(tmp_path):
    # kaito-project/kaito#2132: the ValueError over three lines; one line 1048576 tokens need 22.5 GiB, 17.39 GiB
    # available, vLLM's own estimate 810208
    wrapped = DATA / "vllm_kaito2132_wrapped_kv_insufficient.log"
    one = tmp_path / "one.log"
    one.write_text(" ".join(x.strip() for x in wrapped.read_text().splitlines()) + "\n")
    got = []
    for p in (wrapped, one):
        d = _logs(p)
        (f,) = d["log"]["startup_failures"]
        assert f["fields"] == {"max_model_len": 1048576, "needed_bytes": 22.5 * GIB,
                               "available_bytes": pytest.approx(17.39 * GIB), "estimated_max_model_len": 810208}
        assert f["line"] == 1
        rec = _size(p)
        assert rec["settings"] == {"--max-model-len": 810208}
        got.append(sorted((x["id"], x["severity"]) for x in d["findings"]))
    assert got[0] == got[1] and ("startup-oom", "critical") in got[0]


def test_midword_wrap_is_glued():
    # SergiioB/intel-arc-pro-b70-inference-cookbook#4: "(4.26 GiB KV cach" / "e is needed, ...": a hard wrap inside
    # a word; 100000 tokens need 4.26 GiB, 4.25 GiB available
    d = _logs(DATA / "vllm_intelarc4_midword_wrap.log")
    (f,) = d["log"]["startup_failures"]
    assert f["fields"]["max_model_len"] == 100000 and f["pid"] == 316 and f["line"] == 2
    assert f["fields"]["needed_bytes"] == pytest.approx(4.26 * GIB) and f["fields"]["available_bytes"] == 4.25 * GIB
    assert "startup-oom" in [x["id"] for x in d["findings"]]
    assert _size(DATA / "vllm_intelarc4_midword_wrap.log")["engine"] == "vllm"


def test_wrap_join_never_eats_a_record_of_its_own(tmp_path):
    # confounder: a complete one-line OOM followed by a prefix-less line that adds nothing is parsed on its own
    p = tmp_path / "two.log"
    p.write_text((DATA / "torch_oom_libcom54_small_slack.log").read_text() +
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
                 "9.77 GiB of which 1.00 GiB is free. Of the allocated memory 8.00 GiB is allocated by PyTorch, and 10.00 "
                 "MiB is reserved by PyTorch but unallocated.\n")
    ooms = _logs(p)["log"]["ooms"]
    assert [o["gpu"] for o in ooms] == ["0", "1"] and [o["line"] for o in ooms] == [1, 2]


# --- SGLang prefixes without a time ---------------------------------------------------------------------------
def test_sglang_rank_tag_without_time_is_read(tmp_path):
    # sgl-project/sglang#3909's decode lines with the "[2025-02-27 04:46:39 " part cut, as pastes and logging
    # formats without asctime leave them: "[TP0] Decode batch. ..." is an SGLang line, not JSON
    p = tmp_path / "tp0.log"
    p.write_text("[TP0] Decode batch. #running-req: 8, #token: 62531, token usage: 0.12, gen throughput (token/s): "
                 "186.64, #queue-req: 0\n[TP0] Decode batch. #running-req: 8, #token: 62851, token usage: 0.13, gen "
                 "throughput (token/s): 185.93, #queue-req: 0\n")
    d = _logs(p)
    assert d["log"]["stats"]["count"] == 2 and d["log"]["engines"] == ["sglang"]
    assert d["log"]["stats"]["kv_cache_usage_ratio"]["max"] == 0.13
    r = cli(p)
    assert "read as: diagnose logs" in r.stderr and "JSON" not in r.stderr


def test_sglang_python_logging_prefix_is_read():
    # sgl-project/sglang-omni#712: "2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: Decode
    # batch, ..." -- 3 stats lines (2 decode, 1 prefill), running 1, 0, 1; throughput 126.29 then 83.17 tok/s
    d = _logs(DATA / "sglang_omni712_logging_prefix.log")
    st = d["log"]["stats"]
    assert st["count"] == 3 and st["requests_running"]["max"] == 1 and st["requests_running"]["min"] == 0
    assert st["generation_tokens_per_second"]["max"] == 126.29 and d["log"]["time_range"]["start"] is not None


# --- a full KV pool with requests queued, from the log alone ------------------------------------------------------
def test_full_pool_with_a_queue_is_a_finding_from_the_log():
    # vllm-project/vllm#43295: V1 stats lines (no preemption count), KV 95.9 / 95.5 / 87.7 / 95.9 / 98.4 % with 43 /
    # 42 / 33 / 23 / 23 waiting: 4 lines >= 95 % over 10:13:11-10:13:51 = 40 s; peak 43 waiting behind 18 running at
    # 95.9 %: each running sequence holds 95.9 / 18 = 5.3 % of the pool; the 61 in the system need 61 / 18 = 3.39x
    d = _logs(DATA / "vllm_issue43295_full_pool_queue.log")
    (f,) = [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]
    assert f["severity"] == "warning" and "4 stats lines over 40 s" in f["summary"]
    assert "43 waiting behind 18 running at 95.9 %" in f["summary"] and "5.3 % of the pool" in f["summary"]
    assert "3.39x" in f["summary"]
    assert not [i for i in d["inconclusive"] if i["id"] == "kv-cache-pressure"]  # not also "could not judge"


def _startup(tmp_path, max_num_seqs: int):
    # synthetic V1 start-up (the shapes of tests/data/sizing/vllm_v1_kv_memory_summary.log): 80 GiB, 0.9, a 50 GiB
    # pool of 409,600 tokens (128 KiB a token), then #43295's stats lines
    p = tmp_path / f"v1_{max_num_seqs}.log"
    p.write_text(
        f"(APIServer pid=1) INFO 06-02 10:00:00 [utils.py:326] non-default args: {{'model': 'x', "
        f"'gpu_memory_utilization': 0.9, 'max_num_seqs': {max_num_seqs}}}\n"
        "(EngineCore_DP0 pid=7) INFO 06-02 10:00:10 [gpu_worker.py:1] Free memory on device (79.00/80.00 GiB) on "
        "startup. Desired GPU memory utilization is (0.9, 72.00 GiB). Actual usage is 16.00 GiB for weight, 4.00 GiB "
        "for peak activation, 0.50 GiB for non-torch memory, and 1.50 GiB for CUDAGraph memory.\n"
        "(EngineCore_DP0 pid=7) INFO 06-02 10:00:11 [gpu_worker.py:1] Available KV cache memory: 50.00 GiB\n"
        "(EngineCore_DP0 pid=7) INFO 06-02 10:00:11 [kv_cache_utils.py:1] GPU KV cache size: 409,600 tokens\n"
        + (DATA / "vllm_issue43295_full_pool_queue.log").read_text().replace("(APIServer pid=3646) INFO 05-19",
                                                                              "(APIServer pid=1) INFO 06-02"))
    return p


def test_full_pool_needs_for_the_configured_batch(tmp_path):
    # per sequence 0.959 x 409,600 / 18 = 21,822.6 tokens; the pool holds floor(409,600 / 21,822.6) = 18 of them.
    # --max-num-seqs 64: 64 x 21,822.6 = 1,396,645 tokens x 128 KiB = 170.49 GiB -> 0.9 + (170.49 - 50) / 80 = 2.41
    # > 1 - max(0.5, 1.6) / 80 = 0.98: does not fit, cap at 18
    d = _logs(_startup(tmp_path, 64))
    (f,) = [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]
    assert "~1,396,645 tokens" in f["summary"] and "170.49 GiB" in f["summary"] and "does not fit" in f["summary"]
    acts = " ".join(f["playbook"]["actions"])
    assert "Cap --max-num-seqs at 18" in acts and "--gpu-memory-utilization" not in acts
    # --max-num-seqs 20: 20 x 21,822.6 = 436,452 tokens = 53.28 GiB -> 0.9 + 3.28 / 80 = 0.941 -> 0.95 <= 0.98: it
    # fits only if NVML shows 3.28 GiB more free at peak, which the log does not hold: said, and asked for
    d = _logs(_startup(tmp_path, 20))
    (f,) = [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]
    assert "--gpu-memory-utilization 0.95 (now 0.9)" in f["summary"] and "3.28 GiB more free" in f["summary"]
    assert any("NVML" in m for m in f["missing"])
    acts = " ".join(f["playbook"]["actions"])
    assert "--gpu-memory-utilization 0.95" in acts and "Cap --max-num-seqs at 18" in acts


def test_full_pool_confounders_stay_quiet(tmp_path):
    # one line at 98 % with a queue (a moment), and a full pool with nobody waiting: no finding
    line = ("INFO 06-02 10:00:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
            "throughput: 900.0 tokens/s, Running: 18 reqs, Waiting: {w} reqs, GPU KV cache usage: {kv}%, Prefix cache "
            "hit rate: 0.0%\n")
    p = tmp_path / "blip.log"
    p.write_text(line.format(s=0, w=5, kv=98.0) + line.format(s=10, w=0, kv=60.0) + line.format(s=20, w=0, kv=61.0))
    assert not [x for x in _logs(p)["findings"] if x["id"] == "kv-cache-pressure"]
    q = tmp_path / "full_no_queue.log"
    q.write_text("".join(line.format(s=s, w=0, kv=99.0) for s in (0, 10, 20, 30)))
    assert not [x for x in _logs(q)["findings"] if x["id"] == "kv-cache-pressure"]


def test_one_gpu_memory_utilization_answer_for_one_log(tmp_path):
    # the synthetic V1 OOM log with its args line (0.9 in force): diagnose logs quotes fragscope size's value
    p = tmp_path / "v1args.log"
    p.write_text("(APIServer pid=1) INFO 06-02 09:59:50 [utils.py:326] non-default args: {'model': 'm', "
                 "'gpu_memory_utilization': 0.9, 'max_num_seqs': 64}\n" + (DATA / "vllm_v1_oom.log").read_text())
    rec = _size(p)
    u = rec["settings"]["--gpu-memory-utilization"]
    # (79.19 x 0.9 - (2.00 - 1.06) - 1.58) / 79.19 = 0.868 -> 0.86 (docs/sizing.md runtime-oom)
    assert u == 0.86
    d = _logs(p)
    acts = " ".join(a for f in d["findings"] for a in f["playbook"]["actions"])
    assert f"--gpu-memory-utilization {u:.2f} (currently 0.90)" in acts
    assert "not exposed" not in acts and "0.85" not in acts


# --- one preemption, then a crash -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, crash", [("vllm_pr6102_first_preemption_then_crash.log", 2),
                                         ("vllm_issue8219_first_preemption_engine_died.log", 2)])
def test_first_preemption_then_crash_is_not_a_storm(name, crash):
    d = _logs(DATA / name)
    (f,) = [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]
    assert d["log"]["preemptions"]["count"] == 1
    assert f["severity"] == "info" and f"followed by a crash at line {crash}" in f["summary"]
    acts = " ".join(f["playbook"]["actions"])
    assert f"Read the crash at line {crash}" in acts and "replica" not in acts.lower()


def test_preemptions_without_a_crash_keep_their_severity(tmp_path):
    # confounder: the same first preemption with no crash after it stays as it was (a warning in its first minute)
    p = tmp_path / "alone.log"
    p.write_text((DATA / "vllm_pr6102_first_preemption_then_crash.log").read_text().splitlines()[0] + "\n")
    (f,) = [x for x in _logs(p)["findings"] if x["id"] == "kv-cache-pressure"]
    assert f["severity"] == "warning" and "crash" not in f["summary"]


# --- figures that cannot be -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, pool_gib, total_gib", [
    ("torch_oom_ipassr9_allocated_over_total.log", 19.15, 8.00),            # YingqianWang/iPASSR#9
    ("torch_oom_replacer74_allocated_over_total.log", 16.16 + 144.59 / 1024, 11.99)])  # sd-webui-replacer#74
def test_pool_larger_than_the_gpu_is_flagged_not_clipped(name, pool_gib, total_gib):
    d = _logs(DATA / name)
    (o,) = d["log"]["ooms"]
    assert o["figures_inconsistent"] and o["held_outside_pytorch_bytes"] is None  # not "0 held elsewhere"
    over = f"{pool_gib - total_gib:.2f} GiB more than the device has"
    assert over in o["inconsistency"] and "system memory" in o["inconsistency"]
    (f,) = d["findings"]
    assert f["id"] == "oom-capacity" and "cannot all be true" in f["summary"] and over in f["summary"]
    assert _size(DATA / name)["outcome"]["oom_verdict"] == "capacity"


def test_sglang_headroom_is_the_lowest_free_figure_after_the_pool():
    # tests/data/sizing/sglang_gemma3_startup.log: "Memory pool end. avail mem=14.61 GB", then "Capture cuda graph
    # begin ... avail mem=13.95 GB" (workspaces taken in between): the headroom is 13.95, not 14.61
    r = cli("size", "--log", DATA.parent / "sizing" / "sglang_gemma3_startup.log", "--format", "json", prog="fragscope")
    rec = json.loads(r.stdout)["recommendation"]
    assert rec["outcome"]["activation_headroom_bytes"] == pytest.approx(13.95 * GIB)
    assert any("13.95 GiB (free when graph capture began); 14.61 GiB at pool end" in a for a in rec["arithmetic"])


# --- an unfilled config.pbtxt template ----------------------------------------------------------------------------
def test_unfilled_triton_template_says_fill_it_first():
    # tensorrtllm_backend's all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt: 51 distinct ${...}
    # placeholders (max_batch_size: ${triton_max_batch_size}, decoupled: ${decoupled_mode}, ...)
    cfg = DATA.parent / "engines" / "triton_configs" / "tensorrtllm_backend_template_unfilled.pbtxt"
    import re as _re
    holes = list(dict.fromkeys(_re.findall(r"\$\{[A-Za-z0-9_]+\}", cfg.read_text())))
    assert len(holes) == 51 and holes[:3] == ["${triton_backend}", "${triton_max_batch_size}", "${decoupled_mode}"]
    scrape = DATA.parent / "engines" / "triton_trtllm_readme_nv_inference.prom"
    r = cli("triton-batching", scrape, "--config", cfg)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unfilled template (51 placeholder(s): ${triton_backend}" in r.stderr and "fill the template first" in r.stderr
    assert "line " not in r.stderr  # not a parser error
    r = cli(cfg)
    assert r.returncode == 2 and "fill the template first" in r.stderr


# --- metric names: SGLang's underscore form, and families nothing maps -------------------------------------------
def test_sglang_underscore_names_read_and_unmapped_families_named():
    # SGLang's documented scrape (sgl-project/sglang docs/references/production_metrics.md) rewritten in memory with
    # "sglang_" for "sglang:" (the form exporters that rewrite colons produce; real consumers read both names):
    # the same figures as the colon form (162 running, 2826 waiting, token usage 0.28)
    from fragscope.collectors.engines import name_notes
    from fragscope.detectors.frame import build_frame
    from test_engines import SGL, scrape

    text = (DATA.parent / "engines" / SGL).read_text().replace("sglang:", "sglang_")
    w = scrape(SGL, text)
    f = build_frame(w)
    assert f.sources["requests_running"] == "sglang:num_running_reqs"
    assert f.engine["requests_running"][-1] == 162.0 and f.engine["requests_waiting"][-1] == 2826.0
    assert f.engine["kv_cache_usage_ratio"][-1] == 0.28
    from fragscope.collectors.exposition import parse_text

    notes = name_notes(parse_text(text, default_ts=1.7e9, source=SGL).to_window(SGL))  # the window as read
    assert any("read as their sglang:* names" in n for n in notes)
    (unm,) = [n for n in notes if "not mapped" in n]
    # the families the table has no signal for, named with the engine they look like
    assert "look like SGLang" in unm and "sglang_gen_throughput" in unm and "sglang_cache_hit_rate" in unm
    assert "sglang_num_running_reqs" not in unm


def test_unmapped_families_are_named_in_the_report():
    # the project's real vLLM 0.32.0 CPU scrape: families the table does not read are listed, not silently dropped
    r = cli(DATA.parent / "collectors" / "vllm_cpu_0.32.0_tiny.metrics.txt", "--format", "json")
    notes = json.loads(r.stdout)["signals"]["notes"]
    assert any("look like vLLM" in n and "not read" in n for n in notes), notes


# --- nvidia-smi's table -------------------------------------------------------------------------------------------
COL = DATA.parent / "collectors"


def test_nvidia_smi_table_is_read_not_refused():
    # wencolani/CrossE#2: "12799MiB / 16280MiB" on a P100 and an empty "Processes:" section: 12799 / 16280 = 78.6 %
    # used by no listed process
    p = COL / "nvidia_smi_table_crosse2_unlisted.txt"
    r = cli(p)
    assert r.returncode == 0 and "read as: diagnose nvidia-smi" in r.stderr
    assert "12799 MiB of 16280 MiB used (78.6 %)" in r.stdout and "12799 MiB in use by no listed process" in r.stdout
    d = json.loads(cli("nvidia-smi", p, "--format", "json").stdout)
    (g,) = d["nvidia_smi"]["gpus"]
    assert g["used_bytes"] == 12799 * MIB and g["total_bytes"] == 16280 * MIB and d["nvidia_smi"]["driver_version"] == "410.48"
    assert d["findings"] == [] and d["inconclusive"]  # one snapshot: said, never "healthy"


def test_nvidia_smi_process_section_and_new_layout():
    # apache/mxnet#4242: GPU 1 holds 5369 + 1205 + 1011 = 7585 MiB in three processes, two named "Unknown Error"
    d = json.loads(cli("nvidia-smi", COL / "nvidia_smi_processes_mxnet4242.txt", "--format", "json").stdout)
    procs = d["nvidia_smi"]["processes"]
    assert len(procs) == 6 and sum(p["used_bytes"] for p in procs if p["gpu"] == 1) == 7585 * MIB
    assert any("GPU 1: processes listed hold 7585 MiB" in s for s in d["summary"])
    assert any("'Unknown Error': pid 31794 on GPU 0, pid 27707 on GPU 1" in s for s in d["summary"])
    # vllm-project/vllm#55169: the 89-column layout, two H100 at 0 of 81559 MiB
    d = json.loads(cli("nvidia-smi", COL / "nvidia_smi_table_vllm55169_h100.txt", "--format", "json").stdout)
    assert [(g["index"], g["name"], g["used_bytes"], g["total_bytes"]) for g in d["nvidia_smi"]["gpus"]] == \
        [(0, "NVIDIA H100 80GB HBM3", 0, 81559 * MIB), (1, "NVIDIA H100 80GB HBM3", 0, 81559 * MIB)]
    assert d["nvidia_smi"]["cuda_version"] == "13.0"


def test_not_a_table_is_refused_in_one_line(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello\n")
    r = cli("nvidia-smi", p)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not nvidia-smi's table" in r.stderr


# --- queues the KV pool does not explain (from a log) ----------------------------------------------------------------
def test_queue_with_a_quarter_of_the_pool_free_is_admission_capped():
    # intel/llm-scaler#391: Running 1, Waiting 14, KV 76.5 / 76.7 / 76.8 % on all 3 stats lines (22:54:32-22:54:52):
    # 23 % of the pool free, 14 waiting, 5.4-5.5 tokens/s generated (not stuck), no args line
    d = _logs(DATA / "vllm_llmscaler391_queue_with_free_pool.log")
    (f,) = [x for x in d["findings"] if x["id"] == "admission-capped"]
    assert f["severity"] == "warning" and "14 requests waiting behind at most 1 running on 3 stats lines over 20 s " \
        "(the whole log)" in f["summary"]
    assert "76.8 % (23 % or more free)" in f["summary"] and "--max-num-seqs is not in this log" in f["summary"]
    assert not [x for x in d["findings"] if x["id"] == "kv-cache-pressure"]


def _stats_log(tmp_path, rows, args=None):
    line = ("(APIServer pid=1) INFO 06-02 10:{m:02d}:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: {g} tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache "
            "usage: {kv}%, Prefix cache hit rate: 0.0%\n")
    text = (f"(APIServer pid=1) INFO 06-02 09:59:00 [utils.py:1] non-default args: {args}\n" if args else "")
    text += "".join(line.format(m=i * 10 // 60, s=i * 10 % 60, **row) for i, row in enumerate(rows))
    p = tmp_path / f"s{len(list(tmp_path.iterdir()))}.log"
    p.write_text(text)
    return _logs(p)


def test_admission_capped_names_the_batch_cap_and_its_confounders_stay_quiet(tmp_path):
    # synthetic: --max-num-seqs 4, 4 running, 9 waiting, KV 40 % on 4 lines over 30 s: the cap holds them
    d = _stats_log(tmp_path, [dict(g=300.0, r=4, w=9, kv=40.0)] * 4, "{'model': 'm', 'max_num_seqs': 4}")
    (f,) = [x for x in d["findings"] if x["id"] == "admission-capped"]
    assert "at the configured --max-num-seqs 4" in f["summary"] and "Raise --max-num-seqs above 4" in \
        " ".join(f["playbook"]["actions"])
    # confounders: a full pool with a queue (the pool explains it), a queue on two lines only, one request waiting
    for rows in ([dict(g=300.0, r=4, w=9, kv=99.0)] * 4, [dict(g=300.0, r=4, w=9, kv=40.0)] * 2
                 + [dict(g=300.0, r=4, w=0, kv=40.0)] * 2, [dict(g=300.0, r=4, w=1, kv=40.0)] * 4):
        assert not [x for x in _stats_log(tmp_path, rows)["findings"] if x["id"] == "admission-capped"]


# --- Triton: batches shrank while the queue grew, from the counters alone -------------------------------------------
def _triton_recording(tmp_path, batch2: float, queue2_us: float, rate2: float = 60.0):
    # synthetic recording in Triton's own family names and labels (tests/data/engines/
    # triton_trtllm_readme_nv_inference.prom), 15 s apart for 20 min: first 10 min 60 requests/s in batches of 6 with
    # 1 ms queue and 5 ms compute per request; then batch2, queue2_us and rate2
    names = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
             "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us")
    cum = dict.fromkeys(names, 0.0)
    lines = [f"# TYPE {n} counter" for n in names]
    t0 = 1_767_225_600
    for i in range(81):
        if i:
            late = i > 40
            rate, batch, q = (rate2, batch2, queue2_us) if late else (60.0, 6.0, 1000.0)
            req = rate * 15
            cum["nv_inference_request_success"] += req
            cum["nv_inference_count"] += req
            cum["nv_inference_exec_count"] += req / batch
            cum["nv_inference_queue_duration_us"] += req * q
            cum["nv_inference_compute_infer_duration_us"] += req * 5000.0
        for n in names:
            lines.append(f'{n}{{model="resnet",version="1"}} {cum[n]:.0f} {(t0 + 15 * i) * 1000}')
    p = tmp_path / f"triton_{batch2}_{rate2}.prom"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_triton_batches_shrank_at_unchanged_traffic_from_counters_alone(tmp_path):
    # first half 6.0 inferences per execution, queue 1 ms; second half 1.0 and 10 ms (10x) at 60 requests/s both
    p = _triton_recording(tmp_path, batch2=1.0, queue2_us=10_000.0)
    d = json.loads(cli(p, "--format", "json", "--fail-on", "never").stdout)
    (f,) = [x for x in d["findings"] if x["id"] == "batching-misconfiguration"]
    assert f["severity"] == "warning" and "average batch 6.0 -> 1.0" in f["summary"]
    assert "1.0 ms -> 10.0 ms (10x)" in f["summary"] and "60.0 -> 60.0 requests/s" in f["summary"]
    assert "diagnose triton-batching --config" in " ".join(f["playbook"]["actions"])


def test_triton_shift_confounders_stay_quiet(tmp_path):
    # the same shrink while traffic halved (the batches shrink because fewer requests arrive), and a steady model
    for kw in (dict(batch2=1.0, queue2_us=10_000.0, rate2=30.0), dict(batch2=6.0, queue2_us=1000.0)):
        d = json.loads(cli(_triton_recording(tmp_path, **kw), "--format", "json", "--fail-on", "never").stdout)
        assert not [x for x in d["findings"] if x["id"] == "batching-misconfiguration"], kw


# --- "at its peak throughput" only where the window shows it ---------------------------------------------------------
def test_saturation_action_claims_peak_throughput_only_when_measured():
    from fragscope.playbooks import computed_actions

    level = " ".join(computed_actions("capacity-saturation", {"basis": "level"}, {}))
    assert "peak throughput" not in level and "not whether throughput holds" in level
    change = " ".join(computed_actions("capacity-saturation", {"tokens_per_s": 1372.0, "running": 87.0}, {}))
    assert "holds its peak throughput (1372 tok/s" in change
    # the SGLang docs scrape (one scrape: 162 running, 2826 waiting): judged on the level, no "peak" claim
    from test_engines import SGL, scrape
    from fragscope.pipeline import diagnose

    (f,) = [x for x in diagnose(scrape(SGL)).findings if x.id == "capacity-saturation"]
    assert "peak throughput" not in " ".join(f.playbook["actions"])


def _recording(tmp_path, name, rows, minutes=16, step=30):
    """A synthetic recording: rows(i, t) -> {metric: value} each ``step`` s over ``minutes``; counters as given."""
    t0 = 1_767_225_600
    lines = []
    types = {}
    for i in range(minutes * 60 // step + 1):
        for m, (kind, v) in rows(i).items():
            if m not in types:
                types[m] = kind
                lines.append(f"# TYPE {m} {kind}")
            lines.append(f"{m} {v} {(t0 + i * step) * 1000}")
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_tgi_standing_queue_twice_the_batch_for_15_min_is_a_warning(tmp_path):
    # synthetic, TGI's router families (tests/data/engines/tgi_datadog_payload_head.prom): batch 8, queue 16-20 for
    # 16 min: the queue stays >= 2x the running batch at every sample: a warning, said so
    p = _recording(tmp_path, "tgi.prom", lambda i: {"tgi_batch_current_size": ("gauge", 8),
                                                    "tgi_queue_size": ("gauge", 16 + i % 5)})
    d = json.loads(cli(p, "--format", "json", "--fail-on", "never").stdout)
    (f,) = [x for x in d["findings"] if x["id"] == "capacity-saturation"]
    assert f["severity"] == "warning" and "at least twice the running batch for 16 min" in f["summary"]
    # confounder: the same queue for the last 5 min only stays information
    p = _recording(tmp_path, "tgi2.prom", lambda i: {"tgi_batch_current_size": ("gauge", 8),
                                                     "tgi_queue_size": ("gauge", 16 if i >= 22 else 4)})
    d = json.loads(cli(p, "--format", "json", "--fail-on", "never").stdout)
    (f,) = [x for x in d["findings"] if x["id"] == "capacity-saturation"]
    assert f["severity"] == "info"


def test_throughput_falling_under_load_is_not_at_capacity(tmp_path):
    # synthetic SGLang recording over 16 min: KV 100 %, 40 waiting; generation 1000 tok/s and 64 running in the first
    # third, 600 tok/s (-40 %) and 40 running in the last: not "at capacity" (capacity-saturation stays quiet)
    def rows(i):
        late = i >= 22
        return {"sglang:num_running_reqs": ("gauge", 40 if late else 64), "sglang:num_queue_reqs": ("gauge", 40),
                "sglang:token_usage": ("gauge", 1.0),
                "sglang:generation_tokens_total": ("counter", 30_000 * i if i <= 21 else 630_000 + 18_000 * (i - 21))}
    d = json.loads(cli(_recording(tmp_path, "sgl.prom", rows), "--format", "json", "--fail-on", "never").stdout)
    assert not [x for x in d["findings"] if x["id"] == "capacity-saturation"], d["findings"]
    # confounder: throughput holding at 1000 tok/s with the same queue is capacity
    def steady(i):
        r = rows(i)
        r["sglang:num_running_reqs"] = ("gauge", 64)
        r["sglang:generation_tokens_total"] = ("counter", 30_000 * i)
        return r
    d = json.loads(cli(_recording(tmp_path, "sgl2.prom", steady), "--format", "json", "--fail-on", "never").stdout)
    assert [x for x in d["findings"] if x["id"] == "capacity-saturation"]


def test_training_loop_fragmentation_gets_a_training_jobs_knobs():
    # meta-llama/llama-cookbook#320: 10.08 GiB asked, 687.12 MiB free of 22.20 GiB; 9.71 GiB allocated + 10.61 GiB
    # stranded = 20.32 GiB reserved (52 % stranded): 10.08 GiB + 64 MiB - 687.12 MiB = 9.47 GiB lacked, the stranded
    # bytes cover it; "Process 40666 has 21.53 GiB" is this process (in a container). The traceback runs through
    # loss.backward() and torch/autograd/: a training loop
    d = _logs(DATA / "torch_oom_llamacookbook320_training_fragmentation.log")
    (o,) = d["log"]["ooms"]
    assert o["verdict"] == "fragmentation" and o["self_listed_pid"] == 40666
    assert o["fragmentation_ratio"] == pytest.approx(10.61 / (9.71 + 10.61), abs=1e-3)
    assert o["unmet_bytes"] == pytest.approx(10.08 * GIB + 64 * MIB - 687.12 * MIB, abs=1)
    assert d["log"]["job_kind"] == "training"
    acts = " ".join(d["findings"][0]["playbook"]["actions"])
    assert "Restart the program" in acts and "expandable_segments" in acts
    assert "--gpu-memory-utilization" not in acts and "rolling" not in acts.lower() and "replica" not in acts.lower()
    assert _size(DATA / "torch_oom_llamacookbook320_training_fragmentation.log")["outcome"]["oom_verdict"] == \
        "fragmentation"


def test_size_names_the_jobs_knobs_when_the_log_is_not_vllm_or_sglang():
    rec = _size(DATA / "tgi_issue866_shard_oom.log")  # text_generation_launcher lines: TGI
    note = next(n for n in rec["notes"] if n.startswith("this log is TGI"))
    assert "--cuda-memory-fraction" in note and "--max-batch-total-tokens" in note and not rec["settings"]
    rec = _size(DATA / "torch_oom_llamacookbook320_training_fragmentation.log")  # loss.backward(): a training loop
    assert any(n.startswith("this log is a training loop's") and "gradient accumulation" in n for n in rec["notes"])
    assert not any("--gpu-memory-utilization in force" in m for m in rec["missing"])


def test_diagnose_logs_points_an_nvidia_smi_table_to_its_reader():
    r = cli("logs", COL / "nvidia_smi_table_crosse2_unlisted.txt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "diagnose nvidia-smi FILE" in r.stderr


def test_agent_log_collector_counts_a_repeated_malloc_async_oom_once(tmp_path):
    # ComfyUI-Sharp#24's block printed twice (the exception and the traceback's last line): one OOM for the agent too
    from fragscope.collectors.logs import LogCollector

    block = (DATA / "comfyui_sharp24_malloc_async_oom.log").read_text()
    p = tmp_path / "app.log"
    p.write_text(block + "Traceback (most recent call last):\n" + block)
    r = LogCollector(str(p), from_start=True).collect(1.0)
    (ooms,) = [s.value for s in r.samples if s.name == "fragscope_log_ooms_total"]
    assert ooms == 1.0
