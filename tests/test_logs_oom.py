"""OOM verdicts from log messages, one cause per message's own figures (detectors/log_oom.py)."""
from __future__ import annotations

import pytest

from fragscope.collectors.enginelog import GIB, MIB, parse_log
from fragscope.detectors.logs import analyse_log
from fragscope.model import Severity

NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of {tot} of "
       "which {free} is free. {procs}Including non-PyTorch memory, this process has {this} memory in use. Of the "
       "allocated memory {alloc} is allocated by PyTorch, and {un} is reserved by PyTorch but unallocated.")


def one(line: str):
    s, f = analyse_log(parse_log([line]))
    (o,) = s["ooms"]
    return o, f


def test_another_process_listed_is_named_with_its_memory():
    line = NEW.format(req="2.00 GiB", tot="80.00 GiB", free="100.00 MiB", procs="Process 4242 has 30.00 GiB memory in "
                      "use. ", this="49.80 GiB", alloc="49.00 GiB", un="100.00 MiB")
    o, f = one(line)
    # 80 GiB - 100 MiB in use; this process 49.8 GiB; pid 4242 30 GiB >= the 2 GiB + 64 MiB - 100 MiB unmet
    assert o["self_listed_pid"] is None and o["other_processes_bytes"] == 30 * GIB
    assert o["verdict"] == "other-process"
    (x,) = f
    assert x.id == "oom-outside-pytorch" and x.confidence == 0.85 and "pid 4242 30.00 GiB" in x.summary
    assert o["non_pytorch_this_process_bytes"] == pytest.approx(49.8 * GIB - 49 * GIB - 100 * MIB, abs=1)


def test_request_larger_than_the_gpu():
    # wxian3/NeuroLens issue 2 (2.1 wording, "capacty"): 55.57 GiB asked of a 12 GiB GPU
    line = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.57 GiB. GPU 0 has a total capacty of "
            "12.00 GiB of which 9.02 GiB is free. Of the allocated memory 984.52 MiB is allocated by PyTorch, and "
            "463.48 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
    o, f = one(line)
    assert o["wording"] == "2.1" and o["verdict"] == "capacity"
    (x,) = f
    assert x.id == "oom-capacity" and "larger than the GPU" in x.summary


def test_cuda_error_and_missing_figures_are_findings_too():
    _, f = one("RuntimeError: CUDA error: out of memory")
    (x,) = f
    assert x.id == "oom-outside-pytorch" and x.confidence == 0.4 and "oom_figures" in x.missing
    o, f = one("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.")
    assert o["verdict"] == "unknown"
    (x,) = f
    assert x.id == "oom-capacity" and x.confidence == 0.3 and x.severity is Severity.CRITICAL


def test_ooms_alike_are_one_finding_different_causes_are_two():
    cap = ("RuntimeError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 1; 11.17 GiB total capacity; 10.85 GiB "
           "already allocated; 24.81 MiB free; 10.86 GiB reserved in total by PyTorch)")
    lines = ["INFO 03-01 10:00:00 a.py:1] x", cap, "INFO 03-01 10:05:00 a.py:1] x", cap,
             "INFO 03-01 10:09:00 a.py:1] x", cap.replace("24.81 MiB free", "2.00 GiB free")]
    s, f = analyse_log(parse_log(lines, reference=1.8e9))
    assert [o["verdict"] for o in s["ooms"]] == ["capacity", "capacity", "memory-cap"]
    assert sorted(x.id for x in f) == ["oom-capacity", "oom-memory-cap"]
    (c,) = [x for x in f if x.id == "oom-capacity"]
    assert "2 OOM(s) like it" in c.summary and c.subject == {"gpu": "1"}
