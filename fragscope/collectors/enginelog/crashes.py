"""Message patterns of the engine dying (the rows of patterns.RULES that read them): PyTorch's NCCL watchdog, vLLM's
EngineDeadError and dead workers, Ray's memory monitor killing a worker. docs/logs.md#events."""
from __future__ import annotations

import re

from .events import GIB, NUM, Fields, opt_field as _opt, to_float, to_int


# --- the engine dying ---------------------------------------------------------------------------
# PyTorch ProcessGroupNCCL's watchdog: "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2,
# OpType=ALLREDUCE, NumelIn=…, NumelOut=…, Timeout(ms)=600000) ran for 600059 milliseconds before timing out." It then
# takes the process down (SIGABRT). Printed twice per rank (the watchdog and its thread's exit): folded by the detector.
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d{1,16}), OpType=(\w{1,40})")
_NCCL_RANK = re.compile(r"\[(?:PG [^\]]{0,60} )?Rank (\d{1,6})\]")
_NCCL_LIMIT = re.compile(r"Timeout\(ms\)=(\d{1,12})\)")
_NCCL_RAN = re.compile(r"ran for (\d{1,12}) milliseconds")


def nccl_timeout(m, msg):
    f: Fields = {"seq": to_int(m.group(1)), "op": m.group(2)}
    r = _NCCL_RANK.search(msg, 0, m.start())
    if r is not None:
        f["rank"] = to_int(r.group(1))
    _opt(f, "timeout_seconds", _NCCL_LIMIT, msg, lambda x: to_int(x) / 1000.0)
    _opt(f, "ran_seconds", _NCCL_RAN, msg, lambda x: to_int(x) / 1000.0)
    return f, ""


# vLLM: the API server's "EngineDeadError: EngineCore encountered an issue" (V1), "Engine background task failed"
# (V0 AsyncLLMEngine), the V1 engine core's own "EngineCore hit an exception" / "EngineCore encountered a fatal error"
# (running) and "EngineCore failed to start" / "Engine core initialization failed" (start-up), and the multiprocessing
# executor's "Worker VllmWorkerProcess pid 1159 died, exit code: -6" (a negative code is the signal that ended it);
# and PyTorch's watchdog saying it aborts the process after a collective's timeout
ENGINE_DEAD = re.compile(r"EngineDeadError|Engine background task failed|taking the entire process down|"
                         r"EngineCore (?:hit an exception|failed to start|encountered a fatal error)|"
                         r"Engine core initialization failed|"
                         r"Worker (\S{1,80}) pid (\d{1,10}) died, exit code: (-?\d{1,4})")
_DEAD_WHAT = {"EngineDeadError": "engine-dead", "Engine background task failed": "background-task-failed",
              "taking the entire process down": "watchdog-abort", "EngineCore hit an exception": "engine-core-error",
              "EngineCore encountered a fatal error": "engine-core-error",
              "EngineCore failed to start": "start-failed", "Engine core initialization failed": "start-failed"}


def engine_dead(m, msg):
    if m.group(3) is not None:
        return {"what": "worker-died", "worker_pid": to_int(m.group(2)), "exit_code": int(m.group(3))}, ""
    return {"what": _DEAD_WHAT[m.group(0)]}, ""


# Ray's memory monitor (raylet node_manager) killing a worker when the node's memory crosses its threshold: "Memory on the
# node (IP: …, ID: …) where the task (task ID: …, name=RayWorkerVllm.__init__, pid=308, memory used=11.15GB) was running
# was 12.49GB / 13.15GB (0.950003), which exceeds the memory usage threshold of 0.95. Ray killed this worker …" (also
# "where the lease (…)", "where the task was running", or neither). Ray's "GB" is 2**30 bytes: a 1,081 GB host
# (decimal) prints as 1006.84GB. The raylet's summary "N Workers (tasks / actors) killed due to memory pressure (OOM)"
# is read too (count only).
RAY_OOM = re.compile(r"Memory on the node \(IP: ([^,)\s]{1,64})(?:, ID: \w{1,80})?\)(?: where the \w{1,10}"
                      r"(?: \(([^)]{0,400})\))? was running)? was " + NUM + r"GB / " + NUM + r"GB \(" + NUM +
                      r"\), which exceeds the memory usage threshold of " + NUM)
_RAY_TASK_NAME = re.compile(r"name=([^,)\s]{1,120})")
_RAY_TASK_PID = re.compile(r"pid=(\d{1,10})")
_RAY_TASK_MEM = re.compile(r"memory used=" + NUM + "GB")
RAY_KILLED = re.compile(r"(?:(\d{1,6}) Workers \(tasks / actors\) )?killed due to memory pressure \(OOM\)")


def ray_oom(m, msg):
    if m.re is RAY_KILLED:
        return ({"workers_killed": to_int(m.group(1))} if m.group(1) else {}), ""
    f: Fields = {"node": m.group(1), "node_used_bytes": float(round(to_float(m.group(3)) * GIB)),
                 "node_total_bytes": float(round(to_float(m.group(4)) * GIB)), "node_used_ratio": to_float(m.group(5)),
                 "threshold_ratio": to_float(m.group(6)), "workers_killed": 1}
    task = m.group(2) or ""
    g = _RAY_TASK_NAME.search(task)
    if g:
        f["task_name"] = g.group(1)
    _opt(f, "task_pid", _RAY_TASK_PID, task, to_int)
    _opt(f, "task_used_bytes", _RAY_TASK_MEM, task, lambda x: float(round(to_float(x) * GIB)))
    return f, ""
