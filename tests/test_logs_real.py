"""Engine logs from public bug reports (tests/data/README_logs.md): each class of issue 11, asserted
against figures checked by hand from the pasted text."""
from __future__ import annotations

import pytest

from fragscope.collectors.enginelog import GIB, MIB, read_log_file
from fragscope.detectors.logs import analyse_log
from fragscope.model import Severity

from logs_helpers import DATA, run_diagnose, strict_json, utc

REF = utc(2025, 12, 31, 12)  # the reference "now" for MM-DD years and HH:MM:SS dates


def read(name: str, ref: float = REF):
    return read_log_file(str(DATA / name), reference=ref)


# ---------------------------------------------------------------------------------------------
# vLLM's offline progress bar (tqdm, no newline) with the next log record glued to it
def test_progress_bar_glued_to_a_preemption_warning_keeps_its_timestamp():
    info = read("vllm_issue14435_progress_bar_preemption.log")
    (ev,) = info.events
    assert ev.kind == "preemption" and ev.fields["cumulative"] == 51 and ev.fields["request_id"] == "352"
    assert ev.ts == utc(2025, 3, 6, 17, 12, 30)  # "WARNING 03-06 17:12:30", after two progress-bar states
    s, f = analyse_log(info.events)
    assert s["preemptions"]["count"] == 51 and s["preemptions"]["first"] == ev.ts
    (p,) = f
    assert p.id == "kv-cache-pressure" and "no rate" in p.summary


def test_glued_v1_stats_lines_are_three_records_with_their_own_times():
    info = read("vllm_issue18115_glued_stats.log")
    evs = info.events
    assert info.lines == 2 and [e.line_no for e in evs] == [1, 2, 2]
    assert [e.ts for e in evs] == [utc(2025, 7, 28, 6, 40, 59), utc(2025, 7, 28, 6, 41, 9), utc(2025, 7, 28, 6, 41, 19)]
    assert [e.fields["kv_usage_ratio"] for e in evs] == [0.912, 0.916, 0.919]
    assert [e.fields["generation_tps"] for e in evs] == [239.2, 239.2, 240.0]
    s, _ = analyse_log(evs)
    assert s["stats"]["kv_cache_usage_ratio"]["max"] == 0.919 and s["stats"]["count"] == 3


def test_progress_bar_before_a_v0_stats_line_the_peak_kv_usage_counts():
    # Shape of the log described in issue 11 (a V0 offline run with stats on; the line with the highest
    # KV usage sits behind the progress bar): written here, figures ours. The glued record keeps its
    # time (21:24:15), so the finding reports 99.2 %, not the 76.6 % of the line before.
    v0 = ("INFO 06-16 21:24:{s:02d} metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
          "{g} tokens/s, Running: 64 reqs, Swapped: 0 reqs, Pending: 30 reqs, GPU KV cache usage: {kv}%, CPU KV cache "
          "usage: 0.0%.")
    lines = ["INFO 06-16 21:23:05 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2100.0 "
             "tokens/s, Running: 64 reqs, Swapped: 0 reqs, Pending: 30 reqs, GPU KV cache usage: 40.0%, CPU KV cache "
             "usage: 0.0%.",
             v0.format(s=10, g="1800.0", kv="76.6"),
             "Processed prompts:  41%|████      | 410/1000 [00:52<01:10,  8.40it/s, est. speed input: 900.00 toks/s, "
             "output: 1700.00 toks/s]" + v0.format(s=15, g="1500.0", kv="99.2"),
             "WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 77 is preempted by PreemptionMode.RECOMPUTE mode "
             "because there is not enough KV cache space. total_num_cumulative_preemption=1"]
    from fragscope.collectors.enginelog import parse_log
    evs = parse_log(lines, reference=REF)
    glued = [e for e in evs if e.line_no == 3]
    assert len(glued) == 1 and glued[0].ts == utc(2025, 6, 16, 21, 24, 15)
    _, f = analyse_log(evs)
    (p,) = f
    kv = next(e for e in p.evidence if e.signal == "log_kv_cache_usage_ratio")
    assert kv.observed == pytest.approx(0.992) and "99.2 %" in p.summary and p.confidence == pytest.approx(0.9)


# ---------------------------------------------------------------------------------------------
# SGLang's time-of-day prefix "[HH:MM:SS TP0]"
def test_sglang_short_prefix_every_decode_line_parsed():
    info = read("sglang_issue1270_short_prefix.log")
    assert len(info.events) == 10 and all(e.kind == "stats" for e in info.events)  # 10 of 10
    assert info.undated_lines == 10
    running = [e.fields["running"] for e in info.events]
    assert running == [2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    # the date comes from the reference (12:00 on 12-31: 04:40 is that morning); seconds exact
    assert info.events[0].ts == utc(2025, 12, 31, 4, 40, 55) and info.events[-1].ts == utc(2025, 12, 31, 4, 40, 57)
    s, _ = analyse_log(info.events)
    assert s["stats"]["generation_tokens_per_second"]["min"] == 212.82
    assert s["stats"]["generation_tokens_per_second"]["max"] == 447.31


def test_sglang_short_prefix_prefill_lines_and_other_lines():
    info = read("sglang_issue1612_short_prefix_prefill.log")
    assert [e.line_no for e in info.events] == list(range(6, 13))  # the 7 "Prefill batch" lines
    usage = [e.fields["kv_usage_ratio"] for e in info.events]
    queue = [e.fields["waiting"] for e in info.events]
    assert usage == [0.0, 0.04, 0.18, 0.33, 0.48, 0.62, 0.77] and queue == [0, 38, 34, 30, 26, 22, 18]
    assert info.events[-1].ts - info.events[0].ts == 4.0  # 16:43:29 -> 16:43:33


def test_time_of_day_prefix_crosses_midnight():
    from fragscope.collectors.enginelog import parse_log
    lines = ["[2025-03-01 23:59:58 TP0] Decode batch. #running-req: 1, #token: 5, token usage: 0.10, #queue-req: 0",
             "[23:59:59 TP0] Decode batch. #running-req: 1, #token: 6, token usage: 0.10, #queue-req: 0",
             "[00:00:01 TP0] Decode batch. #running-req: 1, #token: 7, token usage: 0.10, #queue-req: 0"]
    evs = parse_log(lines, reference=REF)
    assert [e.ts for e in evs] == [utc(2025, 3, 1, 23, 59, 58), utc(2025, 3, 1, 23, 59, 59), utc(2025, 3, 2, 0, 0, 1)]


# ---------------------------------------------------------------------------------------------
# a preemption count without any timestamp: a finding that says what is missing
def test_untimed_preemptions_are_a_finding_not_silence(capsys, monkeypatch):
    info = read("vllm_v0_untimed_preemption_LIMO29.log")
    (ev,) = info.events
    assert ev.ts is None and ev.fields["cumulative"] == 101
    s, f = analyse_log(info.events)
    assert s["preemptions"]["count"] == 101 and s["preemptions"]["rate_per_second"] is None
    (p,) = f
    assert p.id == "kv-cache-pressure" and p.severity is Severity.WARNING
    assert "101 preemptions" in p.summary and "no timestamps" in p.summary and "log_timestamps" in p.missing
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(DATA / "vllm_v0_untimed_preemption_LIMO29.log"),
                                  "--fail-on", "warning")
    assert code == 1 and "No finding" not in out and "101 preemptions" in out


# ---------------------------------------------------------------------------------------------
# PyTorch OOM messages: the cause each one's own figures show, as a finding with a playbook
def test_oom_le20_memory_held_outside_pytorch():
    info = read("torch_oom_le20_vllm783.log")
    s, f = analyse_log(info.events)
    (o,) = s["ooms"]
    # 44.56 GiB total - 27.93 GiB reserved - 565.31 MiB free = 16.078 GiB, asked 1.63 GiB
    held = round(44.56 * GIB) - round(27.93 * GIB) - round(565.31 * MIB)
    assert o["held_outside_pytorch_bytes"] == held and held / GIB == pytest.approx(16.078, abs=1e-3)
    assert o["verdict"] == "outside-pytorch" and o["wording"] == "<=2.0"
    (x,) = f
    assert x.id == "oom-outside-pytorch" and x.severity is Severity.CRITICAL
    assert "16.08 GiB" in x.summary and "36 % of the GPU" in x.summary


def test_oom_le20_free_memory_covered_the_request_is_a_cap():
    s, f = analyse_log(read("torch_oom_le20_pytorch59778.log").events)
    (o,) = s["ooms"]
    assert o["free_bytes"] == round(3.03 * GIB) and o["requested_bytes"] == round(2.26 * GIB)
    assert o["verdict"] == "memory-cap" and [x.id for x in f] == ["oom-memory-cap"]


def test_oom_ge22_this_process_listed_by_pid_is_not_another_process():
    # in a container PyTorch lists itself as "Process 1205606 has 18.83 GiB" (no "this process" line);
    # 18.83 GiB + its 17.95 GiB allocated exceed the 18.84 GiB in use: it is this process, not a neighbour.
    # The paste wraps "reserv|ed" across two lines: the message is read across the wrap (collectors/enginelog/
    # rejoin.py, glued), so the 447.05 MiB reserved-but-unallocated is read and the pool is 17.95 GiB + 447.05 MiB.
    s, f = analyse_log(read("torch_oom_ge22_vllm10828_wrapped.log").events)
    (o,) = s["ooms"]
    assert o["other_processes"] == [{"pid": 1205606, "bytes": round(18.83 * GIB)}]
    assert o["self_listed_pid"] == 1205606 and o["other_processes_bytes"] is None
    assert o["reserved_unallocated_bytes"] == pytest.approx(447.05 * 2 ** 20, abs=1) and o["line"] == 2
    assert o["held_outside_pytorch_bytes"] == pytest.approx(
        round(22.16 * GIB) - round(3.32 * GIB) - round(17.95 * GIB) - 447.05 * 2 ** 20, abs=2)
    # 447.05 MiB stranded < the 4.62 GiB + 64 MiB - 3.32 GiB lacked, and 2.4 % of reserved: capacity
    assert o["verdict"] == "capacity" and [x.id for x in f] == ["oom-capacity"]


def test_oom_ge22_this_process_line_and_memory_outside():
    s, f = analyse_log(read("torch_oom_ge22_vllm12529.log").events)
    (o,) = s["ooms"]
    reserved = round(4.81 * GIB) + round(18.97 * MIB)
    assert o["reserved_bytes"] == reserved
    # 7.75 - 1.17 GiB in use; this process 5.02 GiB of it (0.19 GiB outside its PyTorch pool); 1.56 GiB elsewhere
    assert o["held_outside_pytorch_bytes"] == round(7.75 * GIB) - round(1.17 * GIB) - reserved
    assert o["non_pytorch_this_process_bytes"] == round(5.02 * GIB) - reserved
    # free (1.17 GiB) is within the 64 MiB allocation slack of the 1.16 GiB asked: not a cap
    assert o["verdict"] == "outside-pytorch" and o["unmet_bytes"] == round(1.16 * GIB) + 64 * MIB - round(1.17 * GIB)
    (x,) = f
    assert x.id == "oom-outside-pytorch" and x.onset == utc(2025, 3, 13, 9, 0, 43)


def test_oom_findings_carry_their_playbooks(capsys, monkeypatch):
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(DATA / "torch_oom_le20_vllm783.log"),
                                  "--format", "json")
    assert code == 1 and err == ""  # critical
    doc = strict_json(out)
    (f,) = doc["findings"]
    assert f["id"] == "oom-outside-pytorch" and f["playbook"]["id"] == "oom-outside-pytorch"
    assert f["playbook"]["immediate"]  # the registered playbook, not None
    assert doc["log"]["ooms"][0]["held_outside_pytorch_bytes"] == round(44.56 * GIB) - round(27.93 * GIB) - round(
        565.31 * MIB)
    assert doc["log"]["input"] == {"lines": 2, "engine_lines": 0, "undated_lines": 0, "truncated_lines": 0,
                                   "text_bytes": (DATA / "torch_oom_le20_vllm783.log").stat().st_size,
                                   "compressed": False}


# ---------------------------------------------------------------------------------------------
# a paste wrapped at the terminal's width ("Running: 32 r" / "eqs, Swapped: …")
def test_wrapped_v0_stats_lines_are_joined():
    info = read("vllm_v0_tenstorrent246_wrapped.log")
    evs = info.events
    assert [e.line_no for e in evs] == [1, 3, 5, 5, 7, 9]
    kv = [e.fields.get("kv_usage_ratio") for e in evs]
    # 23:23:53 lost its second half to a "$" in the paste: no KV figure, no running count (not invented)
    assert kv == [0.176, 0.202, None, 0.248, 0.273, 0.296]
    assert [e.fields.get("running") for e in evs] == [32, 32, None, 32, 32, 32]
    assert [e.ts - evs[0].ts for e in evs] == [0, 5, 11, 16, 22, 27]
    s, _ = analyse_log(evs)
    assert s["stats"]["kv_cache_usage_ratio"]["max"] == 0.296 and s["stats"]["requests_waiting"]["max"] == 0


def test_worker_prefix_with_rank_keeps_the_pid():
    from fragscope.collectors.enginelog import parse_log_line
    ev = parse_log_line("(VllmWorker rank=0 pid=10672) ERROR 03-16 06:12:38 [multiproc_executor.py:375] "
                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total "
                        "capacity of 15.48 GiB of which 953.94 MiB is free.", reference=REF)
    assert ev.pid == 10672 and ev.ts == utc(2025, 3, 16, 6, 12, 38) and ev.kind == "oom"
