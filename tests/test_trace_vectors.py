"""A Kineto trace read into Python lists (fragscope.vec, small traces) and into numpy arrays (large ones) gives
the same ``diagnose trace`` output, byte for byte, and the same exit code: on every trace in tests/data, on
broken and hostile documents, and on generated traces that exercise every branch of the analysis (several
devices and streams, graph launches, ops without a correlation linked by flows, synchronising calls,
pageable and small copies, allocator calls, ProfilerSteps, epoch times with ns digits). Both sides are
forced with FRAGSCOPE_TRACE_ARRAYS; a change to either that alters a figure fails here."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from fragscope import vec
from fragscope.cli import diagnose_group
from fragscope.collectors.kineto import read_kineto

DATA = Path(__file__).parent / "data"
TRACES = sorted(p for p in (DATA / "trace").rglob("*.json*"))


def _both(monkeypatch, path: Path, fmt: str) -> tuple:
    out = []
    for side in ("python", "numpy"):
        monkeypatch.setenv(vec.ENV, side)
        r = CliRunner().invoke(diagnose_group, ["trace", str(path), "--format", fmt, "--fail-on", "info"])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        out.append((r.exit_code, r.output))
    return tuple(out)


def test_the_switch_picks_the_columns(monkeypatch):
    p = DATA / "trace" / "hta_timeline_sampled_rank0.json.gz"
    monkeypatch.setenv(vec.ENV, "python")
    assert type(read_kineto(str(p)).op_start) is vec.Vec
    monkeypatch.setenv(vec.ENV, "numpy")
    assert type(read_kineto(str(p)).op_start).__name__ == "ndarray"
    monkeypatch.delenv(vec.ENV)
    assert type(read_kineto(str(p)).op_start) is vec.Vec  # 2.4k rows: under the bar
    monkeypatch.setattr(vec, "NUMPY_MIN_ROWS", 100)
    assert type(read_kineto(str(p)).op_start).__name__ == "ndarray"


@pytest.mark.parametrize("fmt", ["json", "human"])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_repository_traces_read_the_same_both_ways(monkeypatch, path, fmt):
    (rc_py, out_py), (rc_np, out_np) = _both(monkeypatch, path, fmt)
    assert out_py == out_np and rc_py == rc_np
    assert rc_py in (0, 1) and out_py.strip()


def _doc(rng: random.Random, epoch_digits: bool = False, int_times: bool = False) -> dict:
    """A random trace using every kind of row the reader and the analysis treat apart."""
    ev: list[dict] = []
    t = 1_700_000_000_000_000.0 if epoch_digits else 1000.0
    corr = 0
    devices = rng.choice([[0], [0, 1], [3, 1]])
    streams = rng.choice([[7], [7, 13], [7, 13, 20]])
    steps = rng.randint(0, 4)
    step_len = rng.uniform(200, 900)
    for s in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                   "ts": t + s * step_len, "dur": step_len})
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{s}", "pid": 0, "tid": 7,
                   "ts": t + s * step_len, "dur": step_len})
    if rng.random() < 0.5:
        ev.append({"ph": "X", "cat": "cpu_op", "name": rng.choice(["aten::mm", "MmBackward0", "vllm::attn",
                                                                   "Optimizer.step#SGD.step"]),
                   "pid": 1, "tid": 1, "ts": t, "dur": 3})
    if rng.random() < 0.3:
        ev.append({"ph": "s", "cat": "fwdbwd", "id": 1, "pid": 1, "tid": 1, "ts": t})

    def ts(x: float):
        if epoch_digits:
            return round(x, 3)
        return int(x) if int_times else round(x, 3)

    for i in range(rng.randint(12, 160)):
        t += rng.choice([0.5, 2, 8, 30, 45, 200, 700])
        api = rng.choices(["cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemcpy",
                           "cudaStreamSynchronize", "cudaMalloc", "cudaFree", "cudaEventRecord"],
                          [40, 4, 4, 6, 4, 4, 3, 3, 3])[0]
        corr += 1
        launch_dur = rng.choice([1.5, 4, 9, 60, 120])
        cat = "cuda_driver" if api == "cuLaunchKernel" else "cuda_runtime"
        ev.append({"ph": "X", "cat": cat, "name": api, "pid": 1, "tid": rng.choice([1, 1, 2]), "ts": ts(t),
                   "dur": launch_dur, "args": {"correlation": corr}})
        n_ops = {"cudaGraphLaunch": rng.randint(2, 5), "cudaStreamSynchronize": 0, "cudaMalloc": 0, "cudaFree": 0,
                 "cudaEventRecord": 0}.get(api, 1)
        g = t + launch_dur + rng.choice([0.2, 3, 15, 150])
        for k in range(n_ops):
            dev, st = rng.choice(devices), rng.choice(streams)
            dur = rng.choice([0.8, 2, 5, 40, 300])
            if api.startswith("cudaMemcpy"):
                name = rng.choice(["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)",
                                   "Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pinned -> Device)"])
                row = {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": dev, "tid": st, "ts": ts(g), "dur": dur,
                       "args": {"device": dev, "stream": st, "correlation": corr,
                                "bytes": rng.choice([512, 65536, 1 << 20])}}
            else:
                name = rng.choice(["gemm", "ncclKernel_AllReduce", "elementwise", "ncclDevKernel_SendRecv"])
                row = {"ph": "X", "cat": rng.choice(["kernel", "kernel", "gpu_memset"]), "name": name, "pid": dev,
                       "tid": st, "ts": ts(g), "dur": dur, "args": {"device": dev, "stream": st,
                                                                     "correlation": corr}}
            if rng.random() < 0.08:  # no correlation: linked (or not) by an ac2g flow
                del row["args"]["correlation"]
                if rng.random() < 0.7:
                    ev.append({"ph": "s", "cat": "ac2g", "id": 10_000 + corr, "pid": 1, "tid": 1, "ts": ts(t)})
                    ev.append({"ph": "f", "cat": "ac2g", "id": 10_000 + corr, "pid": dev, "tid": st, "ts": ts(g),
                               "bp": "e"})
            ev.append(row)
            g += dur + rng.choice([0, 0.5, 4])
    rng.shuffle(ev)
    doc: dict = {"schemaVersion": 1, "traceEvents": ev}
    if rng.random() < 0.3:
        doc["distributedInfo"] = {"rank": 2}
    return doc


@pytest.mark.parametrize("seed", range(40))
def test_generated_traces_read_the_same_both_ways(monkeypatch, tmp_path, seed):
    rng = random.Random(seed)
    doc = _doc(rng, epoch_digits=seed % 5 == 1, int_times=seed % 5 == 2)
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    for fmt in ("json", "human"):
        (rc_py, out_py), (rc_np, out_np) = _both(monkeypatch, p, fmt)
        assert out_py == out_np and rc_py == rc_np, (seed, fmt)
        assert rc_py in (0, 1), out_py


def _base() -> dict:
    ev = []
    for i in range(12):
        t = 1000.0 + i * 50
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                   "dur": 5.0, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 6, "dur": 2.0,
                   "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    return {"traceEvents": ev}


def _patched(patch: dict) -> str:
    doc = _base()
    for e in doc["traceEvents"][:6]:
        e.update(patch)
    return json.dumps(doc)


# Broken and hostile documents (the cases of tests/test_trace_hostile.py and more): refused with the same
# line, or read around with the same figures, both ways.
HOSTILE = {
    "wrong-name": _patched({"name": 12}), "args-list": _patched({"args": [1, 2]}), "cat-list": _patched({"cat": ["k"]}),
    "pid-list": _patched({"pid": [1]}), "tid-object": _patched({"tid": {"a": 1}}),
    "nan": json.dumps(_base()).replace('"dur": 2.0', '"dur": NaN', 1),
    "infinity": json.dumps(_base()).replace('"ts": 1000.0', '"ts": Infinity', 1),
    "corr-65-bits": _patched({"args": {"correlation": 2 ** 64, "device": 0, "stream": 7}}),
    "device-huge": _patched({"args": {"device": -(2 ** 70)}}),
    "ts-huge": json.dumps(_base()).replace('"ts": 1000.0', '"ts": 100000000000000000000000000000', 1),
    "ts-1e300": json.dumps(_base()).replace('"ts": 1000.0', '"ts": 1e300', 1),
    "ts-epoch-float": json.dumps(_base()).replace('"ts": 1000.0', '"ts": 4.7e15', 1),
    "ts-text": _patched({"ts": "1000"}), "dur-negative": _patched({"dur": -3.0}),
    "no-gpu": json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]}),
    "no-x": json.dumps({"traceEvents": [{"ph": "i", "name": "a", "ts": 1}]}),
    "empty": json.dumps({"traceEvents": []}), "array-format": json.dumps(_base()["traceEvents"]),
    "not-a-trace": json.dumps({"a": 1}), "truncated": json.dumps(_base())[:-200], "garbage": "\x00\x01{",
    "deep": "[" * 100_000 + "]" * 100_000, "mtia": json.dumps({"traceEvents": [
        {"ph": "X", "cat": "mtia_ccp_events", "name": "a", "ts": 1, "dur": 1}]}),
    "ns-digits": json.dumps(_base()).replace('"ts": 1000.0', '"ts": 1712195495505583.123', 1),
    "string-corr": _patched({"args": {"correlation": "7", "device": "0", "stream": 7.0}}),
    "bool-fields": _patched({"args": {"correlation": True, "device": False}}),
    "metadata": json.dumps({**_base(), "schemaVersion": [1], "traceName": {"x": 1}, "baseTimeNanoseconds": "x",
                            "distributedInfo": [1]}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_documents_read_the_same_both_ways(monkeypatch, tmp_path, name):
    p = tmp_path / "t.json"
    p.write_text(HOSTILE[name])
    for fmt in ("json", "human"):
        (rc_py, out_py), (rc_np, out_np) = _both(monkeypatch, p, fmt)
        assert out_py == out_np and rc_py == rc_np, (name, fmt)
        assert rc_py in (0, 1, 2), out_py


def test_truncated_gzip_reads_the_same_both_ways(monkeypatch, tmp_path):
    raw = gzip.compress(json.dumps(_base()).encode())
    p = tmp_path / "t.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    (rc_py, out_py), (rc_np, out_np) = _both(monkeypatch, p, "json")
    assert out_py == out_np and rc_py == rc_np == 2
