"""allocator-stalls needs a flush (cudaFree then cudaMalloc) in a steady state: a cold single pass grows the caching
allocator's pool with cudaMalloc alone (synthetic Kineto traces; the real HTA AlexNet and simple_add traces, which
free and re-allocate, keep the finding)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fragscope.trace_pipeline import analyse_trace_file
from test_trace import T0, _kernel, _kineto, _launch

DATA = Path(__file__).resolve().parent / "data" / "trace"


def _pass(n: int = 200, mallocs=(), frees=(), steps=0):
    """Host launches every 10 µs, 50 µs kernels queued back to back (healthy); cudaMalloc / cudaFree calls of 300 µs at
    the given host times (µs); ``steps`` ProfilerStep#N annotations cut the window evenly."""
    ev = []
    for i in range(n):
        ev.append(_launch(i * 10.0, 6.0, i + 1))
        ev.append(_kernel(20.0 + i * 50.0, 50.0, i + 1))
    corr = 10_000
    for name, times in (("cudaMalloc", mallocs), ("cudaFree", frees)):
        for t in times:
            ev.append(_launch(t, 300.0, corr, name=name))
            corr += 1
    span = 20.0 + n * 50.0
    for k in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 42, "tid": 100,
                   "ts": T0 + k * span / steps, "dur": span / steps - 1})
    return ev


def _judge(tmp_path, **kw):
    a, findings = analyse_trace_file(str(_kineto(tmp_path / "t.json", _pass(**kw))))
    return a, [f.id for f in findings], {i["id"]: i["reason"] for i in a["inconclusive"]}


def test_cold_single_pass_growing_the_pool_is_not_allocator_stalls(tmp_path):
    # 12 cudaMalloc at 100, 900, ..., 8900 µs, no cudaFree, no ProfilerStep. The window runs from the first kernel's
    # start (20 µs) to the last one's end (20 + 200 x 50 = 10020 µs); its second half starts at 5020 µs and holds
    # 5700, 6500, 7300, 8100, 8900: 5 mallocs, the pool growing on first use
    a, ids, inc = _judge(tmp_path, mallocs=[i * 800.0 + 100 for i in range(12)])
    assert a["host"]["steady_malloc_calls"] == 5 and a["host"]["steady_free_calls"] == 0
    assert a["host"]["steady_malloc_after_free_calls"] == 0
    assert "allocator-stalls" not in ids
    assert "profile after warm-up" in inc["allocator-stalls"] and "growing its pool" in inc["allocator-stalls"]


def test_free_then_malloc_in_steady_state_is_allocator_stalls(tmp_path):
    # confounder: the same pass with two cudaFree in the second half, each followed by mallocs: a flush
    a, ids, inc = _judge(tmp_path, mallocs=[i * 800.0 + 100 for i in range(12)], frees=[6000.0, 8000.0])
    # mallocs after the first free (6000 µs): 6500, 7300, 8100, 8900
    assert a["host"]["steady_free_calls"] == 2 and a["host"]["steady_malloc_after_free_calls"] == 4
    assert "allocator-stalls" in ids and "allocator-stalls" not in inc


def test_growth_after_warm_up_steps_is_not_a_flush(tmp_path):
    # 4 ProfilerSteps of 2505 µs: steady after the first ends (2504 µs); 3300 ... 8900: 8 mallocs, no free: growth
    a, ids, inc = _judge(tmp_path, mallocs=[i * 800.0 + 100 for i in range(12)], steps=4)
    assert a["host"]["steady_state"]["rule"] == "after the first ProfilerStep"
    assert a["host"]["steady_malloc_calls"] == 8
    assert "allocator-stalls" not in ids and "the pool still grew" in inc["allocator-stalls"]


def test_real_traces_that_free_and_reallocate_keep_the_finding():
    # HTA's AlexNet trace: second half 16 cudaMalloc, 4 cudaFree, mallocs after the first of those frees
    a, findings = analyse_trace_file(str(DATA / "hta_alexnet_critical_path.json.gz"))
    assert a["host"]["steady_malloc_calls"] == 16 and a["host"]["steady_free_calls"] == 4
    assert a["host"]["steady_malloc_after_free_calls"] > 0
    assert "allocator-stalls" in [f.id for f in findings]


def test_share_above_100_percent_is_flagged_not_clipped(tmp_path):
    # synthetic: two host threads each blocked in cudaStreamSynchronize over the same 6 ms of a 10 ms window:
    # 12 ms of synchronizing calls in 10.02 ms = 119.8 %: kept as is, and the note says why it can exceed 100 %
    ev = _pass()
    ev.append(_launch(2000.0, 6000.0, 20_001, name="cudaStreamSynchronize", tid=100))
    ev.append(_launch(2000.0, 6000.0, 20_002, name="cudaStreamSynchronize", tid=101))
    a, _ = analyse_trace_file(str(_kineto(tmp_path / "two.json", ev)))
    assert a["host"]["sync_api_ratio"] == pytest.approx(12000 / 10000, rel=0.01)
    assert any("sync_api_ratio is 1" in n and "overlap" in n for n in a["notes"]), a["notes"]
