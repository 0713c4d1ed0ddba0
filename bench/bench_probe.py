"""Probe overhead per sample, in µs, against a bare json.dumps + file write in the same run.

One probe sample = memory_stats() for the process's device(s) + selecting the published keys +
json.dumps + atomic write (tmp + os.replace) + the snapshot-request directory check. Here
memory_stats() is replayed from a recorded dict (tests/data/collectors/), since CUDA cannot run
on this machine; bench/gpu_check.py measures the same on a real device.

Baseline: json.dumps of the full recorded stats dict and a plain write of it to one file (what
a naive "dump the stats" hook costs), in the same process and directory.

    python bench/bench_probe.py [--n 2000] [--devices 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from fragscope.probe import core  # noqa: E402

STATS = json.load(open(os.path.join(HERE, "..", "tests", "data", "collectors", "torch_memory_stats_pytorch35901.json")))


def fake_modules(n_dev: int) -> dict:
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: n_dev, current_device=lambda: 0,
        memory_stats=lambda i: dict(STATS),  # a fresh dict per call, as the real one builds
        get_allocator_backend=lambda: "native",
        get_device_properties=lambda i: types.SimpleNamespace(uuid=f"{i:08d}-0000-0000-0000-000000000000"))
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    torch.__version__ = "bench"
    torch._C = types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: False)
    return {"torch": torch, "torch.cuda": types.ModuleType("torch.cuda")}


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--devices", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        probe = core.Probe(d, 5.0, modules=fake_modules(a.devices))
        probe.tick()  # warm: directory, caches
        base_path = os.path.join(d, "baseline.json")

        def baseline():
            data = json.dumps(STATS).encode()
            with open(base_path, "wb") as fh:
                fh.write(data)

        for _ in range(200):
            baseline()
        b = timed(baseline, a.n)
        j = timed(lambda: json.dumps(STATS), a.n)
        p = timed(probe.tick, a.n)
        size = os.path.getsize(core.record_path(d, os.getpid()))
    bm, pm = statistics.median(b), statistics.median(p)
    b99, p99 = sorted(b)[int(0.99 * len(b))], sorted(p)[int(0.99 * len(p))]
    print(f"probe sample ({a.devices} device(s), record {size} bytes): median {pm:.1f} µs, p99 {p99:.1f} µs")
    print(f"baseline json.dumps+write of the full stats dict:   median {bm:.1f} µs, p99 {b99:.1f} µs")
    print(f"json.dumps of the full stats dict alone (no I/O):   median {statistics.median(j):.1f} µs")
    print(f"ratio probe/baseline (median): {pm / bm:.2f}x")
    interval = core.DEFAULT_INTERVAL_S
    print(f"engine CPU share at the default {interval:g} s interval: {pm / (interval * 1e6) * 100:.4f} % of one core")


if __name__ == "__main__":
    main()
