"""The Kineto reader's fast paths (issue 15): the garbage collector is paused only while a trace is read
and left as it was found, errors included; the inline type checks give what the general ones give."""
from __future__ import annotations

import gc
import json

import pytest

from fragscope.collectors.kineto import read_kineto, timeline_from_events
from fragscope.timeline_model import TraceError


def _kernel(i: int, name: str = "k", **args) -> dict:
    a = {"correlation": i, "device": 0, "stream": 7}
    a.update(args)
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 3, "tid": 9, "ts": 100 + 10 * i, "dur": 4, "args": a}


def _launch(i: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 95 + 10 * i,
            "dur": 2, "args": {"correlation": i}}


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_state_restored(tmp_path, enabled):
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"traceEvents": [_launch(1), _kernel(1)]}))
    bad = tmp_path / "b.json"
    bad.write_text('{"traceEvents": [')
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert read_kineto(str(good)).op_start.tolist() == [110_000]
        assert gc.isenabled() is enabled
        with pytest.raises(TraceError):
            read_kineto(str(bad))
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_inline_checks_match_the_general_ones():
    ev = [_launch(1), _launch(2), _launch(3), _launch(4),
          _kernel(1, "ncclKernel_AllReduce"), _kernel(2, "hccl_all_gather"), _kernel(3, "void ncclDevKernel_x"),
          _kernel(4, "my_cclike_gemm"),
          _kernel(5, correlation=True),                 # a bool is no id: -1, not linked
          _kernel(6, correlation="4"),                  # decimal text: the id 4
          _kernel(7, correlation=4.0, device=None),     # integral float; no device: the pid (3)
          _kernel(8, stream=True),                      # stream not an id: -1
          {"ph": "X", "cat": "kernel", "name": "b", "ts": True, "dur": 1, "args": {}},   # bool time: skipped
          {"ph": "X", "cat": "kernel", "name": "n", "ts": 1.5, "dur": float("nan"), "args": {}}]  # NaN: skipped
    tl = timeline_from_events(ev, "x")
    assert tl.op_comm.tolist() == [True, True, True, False, False, False, False, False]
    assert tl.op_launch.tolist() == [0, 1, 2, 3, -1, 3, 3, -1]
    assert tl.op_device.tolist() == [0, 0, 0, 0, 0, 0, 3, 0]
    assert tl.op_stream.tolist() == [7, 7, 7, 7, 7, 7, 7, -1]
    assert tl.op_start.tolist() == [110_000 + 10_000 * i for i in range(8)]
    with pytest.raises(TraceError, match="out of range"):
        timeline_from_events([_launch(1), dict(_kernel(1), ts=1 << 60)], "x")
