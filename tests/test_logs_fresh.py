"""Engine logs of shapes first met in public bug reports (tests/data/README_logs.md, "The engine dying, a queue
paced by prefill"): what a careful reader concludes from each file, worked out by hand in the comments, asserted
on ``diagnose logs``'s report and summary."""
from __future__ import annotations

import pathlib

from fragscope import ids
from fragscope.cli.logs_cmd import analyse_log_file
from fragscope.collectors.enginelog.parser import LogParser
from fragscope.detectors.log_crash import crash_summary
from fragscope.model import Severity

DATA = pathlib.Path(__file__).parent / "data" / "logs"


def _run(name: str):
    report, summary, _ = analyse_log_file(str(DATA / name))
    return report, summary


def _one(report, diag_id):
    found = [f for f in report.findings if f.id == diag_id]
    assert len(found) == 1, [f.id for f in report.findings]
    return found[0]


def test_nccl_timeout_at_the_groups_second_collective_is_a_set_up_failure():
    # vllm#6042: "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, …,
    # Timeout(ms)=600000) ran for 600059 milliseconds", printed twice (the watchdog, then its thread's exit: one
    # timeout); "last completed NCCL work: 1": the group finished one collective and never the second, so the GPUs
    # never exchanged data: set-up (P2P, shm, network), not a straggler. Worker pid 1159 exited with -6 = SIGABRT,
    # the watchdog's abort. Each line carries the paste's "  | " prefix.
    report, summary = _run("vllm_issue6042_nccl_watchdog_pipe_prefix.log")
    crash = summary["crash"]
    assert crash["cause"] == "collective-timeout"
    assert crash["collective_timeouts"] == [{"rank": 0, "seq": 2, "op": "ALLREDUCE", "timeout_seconds": 600.0,
                                             "ran_seconds": 600.059, "time": crash["time"], "line": 3}]
    assert crash["watchdog_aborted"] is True
    assert crash["workers_died"] == [{"pid": 1159, "exit_code": -6, "signal": "SIGABRT", "line": 1}]
    f = _one(report, ids.ENGINE_DIED)
    assert f.severity is Severity.CRITICAL and f.confidence == 0.85
    assert "rank 0 waited 600.1 s on collective #2 (ALLREDUCE) (timeout 600 s)" in f.summary
    assert "never completed their first exchanges" in f.summary and "SIGABRT" in f.summary
    acts = " ".join(f.playbook["actions"])
    assert "Restart vLLM" in acts and "NCCL_DEBUG=INFO" in acts and "/dev/shm" in acts
    assert summary["job_kind"] == "vllm"
    # no memory finding invented from a hang
    assert not [x for x in report.findings if x.id.startswith("oom-") or x.id == ids.ALLOCATOR_FRAGMENTATION]


def test_nccl_timeout_after_twenty_thousand_collectives_points_away_from_the_rank_that_fired():
    # vllm#2734: two V0 stats lines (13:14:04, 13:18:39: 1 running, KV 0.0 %), then Ray's worker line (colour codes
    # without their escape byte, no timestamp): rank 4 waited 1800270 ms on ALLREDUCE #20518 (Timeout(ms)=1800000).
    # 20,517 collectives had completed: the group worked, one rank stopped; rank 4 was left waiting. The time is
    # the previous line's: "after 13:18:39".
    report, summary = _run("vllm_issue2734_nccl_watchdog_ray_colours.log")
    t = summary["crash"]["collective_timeouts"]
    assert [(x["rank"], x["seq"], x["op"], x["timeout_seconds"], x["ran_seconds"]) for x in t] == \
        [(4, 20518, "ALLREDUCE", 1800.0, 1800.27)]
    assert summary["crash"]["timestamped"] is False
    from fragscope.collectors.enginelog import read_log_file

    nccl = [e for e in read_log_file(str(DATA / "vllm_issue2734_nccl_watchdog_ray_colours.log")).events
            if e.kind == "collective_timeout"]
    assert [e.pid for e in nccl] == [5085]  # Ray's "[36m(RayWorkerVllm pid=5085) [0m", escape bytes lost
    assert summary["stats"]["count"] == 2  # the stats lines are still read
    f = _one(report, ids.ENGINE_DIED)
    assert f.summary.startswith("The engine died after ")
    assert "-02-03 13:18:39Z (the last timestamp before line 3, which has none)" in f.summary
    assert "20,517 collectives had completed" in f.summary and "not the cause" in f.summary
    assert "the exit is not in these lines" in f.summary  # no abort line in this excerpt
    assert any("other ranks' logs" in m for m in f.missing)
    assert not any("NCCL_DEBUG" in a for a in f.playbook["actions"])  # set-up advice is for a group that never worked


def test_engine_dead_without_its_cause_says_what_is_missing():
    # club-3090#58: the API server's "EngineDeadError: EngineCore encountered an issue. See stack trace (above)"
    # and the head of the engine core's traceback; the error that killed it is not in the excerpt.
    report, summary = _run("club3090_issue58_engine_dead.log")
    assert summary["crash"]["cause"] == "unknown" and summary["crash"]["engine_dead_count"] == 1
    f = _one(report, ids.ENGINE_DIED)
    assert f.severity is Severity.CRITICAL and f.confidence == 0.6
    assert any("traceback" in m for m in f.missing)
    assert not report.findings[1:]  # nothing else: no OOM, no queue


def test_an_oom_in_the_engine_core_stays_the_story_when_the_engine_then_dies():
    # club-3090#16: the V1 engine core's OOM (50 MiB asked, 21.75 MiB free of 23.56 GiB; 275.38 MiB stranded of
    # 22.88 GiB + 275.38 MiB reserved = 1.2 %: capacity), re-raised through the API server's output handler.
    # Followed here by #58's EngineDeadError line, as a V1 server prints it next: the death's cause is the OOM.
    lines = (DATA / "club3090_issue16_enginecore_oom.log").read_text().splitlines()
    lines.append((DATA / "club3090_issue58_engine_dead.log").read_text().splitlines()[0])
    p = LogParser(reference=1.8e9)
    events = [e for ln in lines for e in p.feed(ln)]
    crash = crash_summary(events)
    assert crash["cause"] == "oom"
    from fragscope.detectors.logs import analyse_log

    _, findings = analyse_log(events, source="x", crash_lines=p.crash_lines)
    assert [f.id for f in findings] == [ids.OOM_CAPACITY]
    report, summary = _run("club3090_issue16_enginecore_oom.log")  # the excerpt alone: no death line at all
    assert summary["crash"] is None and [f.id for f in report.findings] == [ids.OOM_CAPACITY]


def test_pytorch_abort_line_alone_names_no_engine():
    # "To avoid data inconsistency, we are taking the entire process down." is PyTorch's, printed by any job using
    # NCCL (a training loop too): by itself it neither makes a crash summary nor marks the log as vLLM's.
    p = LogParser(reference=1.8e9)
    events = p.feed("[rank0]:[E ProcessGroupNCCL.cpp:583] [Rank 0] To avoid data inconsistency, we are taking the "
                    "entire process down.")
    assert [e.source for e in events] == ["torch"]
    assert crash_summary(events) is None


def test_a_queue_paced_by_prefill_is_named_from_the_stats_lines():
    # vllm#37307 (PR description): five V1 stats lines 10 s apart. Waiting 90, 84, 78, 72, 66 and running 10, 16,
    # 22, 28, 34 (100 requests in all: none arrive or finish), KV usage 19.3 → 65.4 %, prompt throughput 23,998.2,
    # 23,999.9, 23,999.8, 23,998.3, 24,000.7 tokens/s (spread 2.5 tokens/s, 0.01 %). 24 requests admitted in 40 s =
    # 0.6/s; 24,000 / 0.6 = 40,000 prompt tokens per admitted request. The pool has room and the batch grows on every
    # line, so neither memory nor the batch cap holds the queue: the engine admits as fast as it prefills.
    report, summary = _run("vllm_pr37307_prefill_paced_queue.log")
    f = _one(report, ids.ADMISSION_CAPPED)
    assert f.context["cause"] == "prefill-paced"
    assert f.context["admitted_per_second"] == 0.6
    assert abs(f.context["prompt_tokens_per_admitted"] - 40_000) < 10
    assert "admission is paced by prefill" in f.summary and "90 → 66 waiting" in f.summary
    assert "about 40,000 prompt tokens per admitted request" in f.summary
    assert f.missing == ["the configured --max-num-batched-tokens (the engine's args line)"]
    acts = " ".join(f.playbook["actions"])
    assert "vLLM --max-num-batched-tokens" in acts and "SGLang" not in acts  # the engine that wrote the log
    assert "Prefix cache hit rate 0.0 %" in acts


def test_ray_killing_a_vllm_worker_for_host_memory_is_not_a_gpu_oom():
    # vllm#2669: "Memory on the node (IP: 169.254.181.2, …) where the task (actor ID: …, name=RayWorkerVllm.__init__,
    # pid=308, memory used=11.15GB) was running was 12.49GB / 13.15GB (0.950003), which exceeds the memory usage
    # threshold of 0.95. Ray killed this worker". Host RAM (Ray's GB are GiB), not the GPU: the vLLM worker held
    # 11.15 of the node's 13.15 GiB (85 %).
    report, summary = _run("vllm_issue2669_ray_host_oom.log")
    k = summary["crash"]["host_oom_kills"][0]
    assert summary["crash"]["cause"] == "host-oom"
    assert (k["node_used_bytes"], k["node_total_bytes"]) == (round(12.49 * 2 ** 30), round(13.15 * 2 ** 30))
    assert (k["node_used_ratio"], k["threshold_ratio"], k["task_pid"]) == (0.950003, 0.95, 308)
    assert k["task_name"] == "RayWorkerVllm.__init__" and k["task_used_bytes"] == round(11.15 * 2 ** 30)
    f = _one(report, ids.HOST_MEMORY_PRESSURE)
    assert f.severity is Severity.CRITICAL and f.confidence == 0.85
    assert "12.49 of 13.15 GiB (95.0 %, over Ray's threshold 0.95)" in f.summary and "not the GPU's" in f.summary
    assert not [x for x in report.findings if x.id.startswith("oom-") or x.id == ids.ENGINE_DIED]
    assert any("RAY_memory_usage_threshold" in a and "--swap-space" in a for a in f.playbook["actions"])
    assert summary["job_kind"] == "vllm"  # RayWorkerVllm is vLLM's own worker class


def test_raylet_kill_count_behind_syslog_colour_codes():
    # vllm#1160: "#033[2m#033[33m(raylet)#033[0m [DATE] (raylet) node_manager.cc:3007: 2 Workers (tasks /" then, on
    # the next line, " actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons": the
    # kill is on line 2, its count on line 1 (wrapped); rsyslog writes the escape byte as "#033".
    report, summary = _run("vllm_issue1160_raylet_syslog_wrapped.log")
    assert summary["crash"]["cause"] == "host-oom"
    f = _one(report, ids.HOST_MEMORY_PRESSURE)
    assert f.confidence == 0.7 and "line 2" in f.summary and any("raylet" in m for m in f.missing)
    from fragscope.collectors.enginelog.prefixes import Clock, split_line
    from datetime import timezone

    rec = split_line("#033[2m#033[33m(raylet)#033[0m", Clock(1.8e9, timezone.utc), None)
    assert rec[0].msg == "(raylet)"


def test_ci_gutter_keeps_the_iso_time_and_the_engine_core_exception_is_a_death():
    # vllm#14574: Buildkite's web view puts "  | " before each "[2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302]
    # EngineCore hit an exception: Traceback …": the ISO prefix (with its year; the header's 08:07:20 is the engine's
    # local time) dates every line, so the log spans one second of 2025, not a year.
    report, summary = _run("vllm_issue14574_buildkite_gutter.log")
    assert summary["time_range"]["start"] == summary["time_range"]["end"] == 1741619240.0  # 2025-03-10T15:07:20Z
    assert summary["crash"]["cause"] == "unknown" and summary["crash"]["engine_dead_lines"] == [3]
    f = _one(report, ids.ENGINE_DIED)
    assert "2025-03-10 15:07:20Z" in f.summary


def test_a_start_up_memory_failure_is_its_own_story():
    # tests/data/sizing/vllm_v1_shortfall.log: "Free memory on device (31.44/47.38 GiB) on startup is less than desired
    # GPU memory utilization (0.95, 45.01 GiB)", then "EngineCore failed to start.": the shortfall explains the failed
    # start (kv-capacity-gap and startup-oom say so); no engine-died finding saying the cause is missing.
    report, summary = analyse_log_file(str(DATA.parent / "sizing" / "vllm_v1_shortfall.log"))[:2]
    assert summary["crash"]["cause"] == "startup-memory" and summary["crash"]["at_start"] is True
    assert ids.ENGINE_DIED not in {f.id for f in report.findings}
    assert {ids.KV_CAPACITY_GAP, ids.STARTUP_OOM} <= {f.id for f in report.findings}


def test_a_vllm_run_time_oom_names_vllms_headroom_knob():
    # club-3090#16: the OOM came from the V1 engine core while serving (PyTorch held 23.15 of 23.56 GiB). vLLM sized
    # its KV cache from a start-up profile, so the step's extra need came out of the 1 - utilization share: the
    # fix names --gpu-memory-utilization (vLLM's own flag) beside the load knobs, and no other engine's flag.
    report, _ = _run("club3090_issue16_enginecore_oom.log")
    acts = (_one(report, ids.OOM_CAPACITY).playbook or {}).get("actions") or []
    text = " ".join(acts)
    assert "--gpu-memory-utilization" in text and "--max-num-batched-tokens" in text
    assert not any(flag in text for flag in ("--mem-fraction-static", "--cuda-memory-fraction",
                                              "free_gpu_memory_fraction"))
