"""Which process in a PyTorch >= 2.2 OOM message's list is the one that failed. Pure.

PyTorch >= 2.2 lists every process with memory on the device ("Process P has X GiB memory in use"),
the failing one included; it says "this process has" only when it recognises its own pid. Inside a
container (another PID namespace) it does not, so the failing process appears as an ordinary "Process P"
line. Counting that line as "another process" doubles the engine's own memory (vllm_v1_oom.log:
"Process 4121 has 78.12 GiB" is the EngineCore pid=4121 that failed). Used by the log detector
(detectors/log_oom.py) and the sizing arithmetic (sizing/arith.py), which must agree.
"""
from __future__ import annotations


def split_self(listed: list[dict], pool: float | None, used: float | None,
               in_use_self: float | None) -> tuple[list[dict], int | None]:
    """(the other processes, the pid taken to be this process or None) from an OOM's process list.

    ``pool``: this process's PyTorch pool (reserved bytes; allocated when reserved is cut off), ``used``:
    total - free on the device, ``in_use_self``: "this process has" bytes when printed. When the listed
    processes plus this process's pool exceed what is in use on the device (1 % tolerance for the
    2-decimal rounding of the message), one of them is this process: the smallest entry that holds at
    least the pool."""
    if not listed or in_use_self is not None or pool is None or used is None:
        return listed, None
    if sum(o["bytes"] for o in listed) + pool <= used * 1.01:
        return listed, None
    cands = [o for o in listed if o["bytes"] >= pool * 0.99]
    if not cands:
        return listed, None
    me = min(cands, key=lambda o: o["bytes"])
    return [o for o in listed if o is not me], me["pid"]
