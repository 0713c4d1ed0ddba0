"""The Kineto reader's lean pass (kineto_pass: a schema per event phase, one loop over what the analysis reads)
gives the Timeline the full schema and per-event loop give, field for field and in the same order, on every
trace here, on generated traces with every kind of row, and on copies altered the ways that send a trace
back to the full schema (another time shape, ops without ids, unknown phases...), or the same error."""
from __future__ import annotations

import dataclasses
import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from fragscope import vec
from fragscope.collectors import kineto, kineto_events, kineto_pass
from fragscope.timeline_model import TraceError

DATA = Path(__file__).parent / "data" / "trace"
TRACES = sorted(p for p in DATA.rglob("*.json*"))
pytestmark = pytest.mark.skipif(kineto_events.msgspec is None, reason="the lean pass needs msgspec")


def _fields(tl) -> list:
    """Every field, dicts as their items in order (the markers' order included)."""
    out = []
    for f in dataclasses.fields(tl):
        v = getattr(tl, f.name)
        if isinstance(v, (np.ndarray, vec.Vec)):
            v = (type(v).__name__, str(getattr(v, "dtype", v.dt if isinstance(v, vec.Vec) else "")), v.tolist())
        elif isinstance(v, dict):
            v = list(v.items())
        out.append((f.name, v))
    return out


def _read(path: Path, lean: bool, monkeypatch) -> tuple:
    """(whether the lean pass gave the Timeline, its fields or the error)."""
    used = []
    real = kineto_pass.lean_columns

    def spy(events, text):
        c = real(events, text)
        used.append(c is not None)
        return c

    monkeypatch.setattr(kineto, "lean_columns", spy)
    if not lean:
        monkeypatch.setattr(kineto, "_lean_timeline", lambda raw, p: None)
    try:
        got = _fields(kineto.read_kineto(str(path)))
    except TraceError as e:
        got = f"error: {e}"
    finally:
        monkeypatch.undo()
    return bool(used) and used[-1], got


def _same(path: Path, monkeypatch, columns: str = "") -> bool:
    """Assert lean and full agree (both column kinds); return whether the lean pass read the trace."""
    took = None
    for side in ("python", "numpy") if not columns else (columns,):
        monkeypatch.setenv(vec.ENV, side)
        took_lean, lean = _read(path, True, monkeypatch)
        monkeypatch.setenv(vec.ENV, side)
        _, full = _read(path, False, monkeypatch)
        assert lean == full, path.name
        took = took_lean
    monkeypatch.delenv(vec.ENV, raising=False)
    return took


# ROCm's trace writes some streams as text ("stream": "7"): msgspec's schemas leave it to the stdlib decoder
STDLIB_READ = {"hta_mi250_minitoy_train_rocm6_2.json.gz"}


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_repository_traces(monkeypatch, path):
    columns = "numpy" if path.stat().st_size > 500_000 else ""  # (both kinds on the smaller ones: time)
    assert _same(path, monkeypatch, columns) is (path.name not in STDLIB_READ)


def _event_texts(rng: random.Random, text_times: bool) -> list[str]:
    """A Kineto-like trace's events as JSON texts (times written as profilers write them)."""
    out, corr = [], 0
    t = 1712195495505583000 if text_times else 1000_000

    def ts() -> str:
        if text_times:
            return f"{t // 1000}.{t % 1000:03d}"
        return str(t // 1000) if rng.random() < 0.3 else f"{t / 1000:.3f}"

    def ev(**kw) -> str:
        return json.dumps(kw)

    out.append(ev(ph="M", name="process_name", pid=1, tid=0, args={"name": "python"}))
    for step in range(rng.randint(1, 4)):
        out.append(ev(ph="X", cat="user_annotation", name=f"ProfilerStep#{step}", pid=1, tid=1, ts="@", dur=900.5)
                   .replace('"@"', ts()))
        out.append(ev(ph="X", cat="gpu_user_annotation", name=f"ProfilerStep#{step}", pid=0, tid=7, ts="@",
                      dur=800.25).replace('"@"', ts()))
        for _ in range(rng.randint(3, 25)):
            t += rng.randint(1000, 30000)
            kind = rng.choice(["kernel", "kernel", "gpu_memcpy", "gpu_memset", "cpu", "flow"])
            if kind == "cpu":
                name = rng.choice(["aten::mm", "MulBackward0", "Optimizer.step#SGD.step", "vllm::attn",
                                   "autograd::engine::evaluate_function: AddBackward0", "aten::add_"])
                out.append(ev(ph="X", cat=rng.choice(["cpu_op", "python_function", "user_annotation"]), name=name,
                              pid=1, tid=1, ts="@", dur=rng.randint(1, 50)).replace('"@"', ts()))
                continue
            if kind == "flow":
                out.append(ev(ph="s", id=rng.randint(1, 99), pid=1, tid=1, ts="@", cat="fwdbwd", name="fwdbwd")
                           .replace('"@"', ts()))
                out.append(ev(ph="f", id=rng.randint(1, 99), pid=1, tid=1, ts="@", cat="fwdbwd", name="fwdbwd",
                              bp="e").replace('"@"', ts()))
                continue
            corr += 1
            api = rng.choice(["cudaLaunchKernel", "cudaMemcpyAsync", "cuLaunchKernel", "cudaStreamSynchronize",
                              "cudaGraphLaunch", "cudaMalloc"])
            out.append(ev(ph="X", cat=rng.choice(["cuda_runtime", "cuda_driver"]), name=api, pid=1, tid=1, ts="@",
                          dur=round(rng.uniform(1, 9), 3), args={"correlation": corr, "cbid": 211})
                       .replace('"@"', ts()))
            out.append(ev(ph="s", id=corr, pid=1, tid=1, ts="@", cat="ac2g", name="ac2g").replace('"@"', ts()))
            t += rng.randint(2000, 9000)
            name = {"kernel": rng.choice(["sgemm_128", "ncclDevKernel_AllReduce", "void at::native::copy"]),
                    "gpu_memcpy": rng.choice(["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pinned)"]),
                    "gpu_memset": "Memset (Device)"}[kind]
            args = {"device": rng.choice([0, 1]), "stream": rng.choice([7, 13]), "correlation": corr}
            if kind != "kernel":
                args["bytes"] = rng.randint(4, 1 << 24)
            out.append(ev(ph="X", cat=kind, name=name, pid=args["device"], tid=args["stream"], ts="@",
                          dur=round(rng.uniform(0.5, 40), 3), args=args).replace('"@"', ts()))
            out.append(ev(ph="f", id=corr, pid=args["device"], tid=args["stream"], ts="@", cat="ac2g", name="ac2g",
                          bp="e").replace('"@"', ts()))
    out.append(ev(ph="i", s="g", name="Iteration Start", pid="Traces", tid="Trace", ts="@").replace('"@"', ts()))
    return out


def _write(tmp_path: Path, name: str, events: list[str], head: str = '"schemaVersion": 1, ') -> Path:
    p = tmp_path / f"{name}.json.gz"
    p.write_bytes(gzip.compress(("{" + head + '"traceEvents": [' + ",\n".join(events) + "]}").encode()))
    return p


@pytest.mark.parametrize("text_times", [True, False])
def test_generated_traces(tmp_path, monkeypatch, text_times):
    rng = random.Random(11 if text_times else 12)
    lean = 0
    for i in range(12):
        lean += _same(_write(tmp_path, f"g{i}", _event_texts(rng, text_times)), monkeypatch,
                      rng.choice(["python", "numpy"]))
    assert lean == 12


# Alterations of one event (the first of its kind matching ``pattern``), each read both ways; whether the lean
# pass still reads the trace (True) or leaves it to the full schema (False), or either (None).
ALTERED = {
    "time_other_width": (r'"ts": (\d{16})\.(\d{3})', r'"ts": \1.\g<2>4', False),
    "time_two_fraction_digits_all": (None, None, True),
    "time_negative": (r'"ts": (\d{16}\.\d{3})', r'"ts": -\1', False),
    "time_null": (r'"ts": (\d{16}\.\d{3})', r'"ts": null', False),
    "time_string": (r'"ts": (\d{16}\.\d{3})', r'"ts": "\1"', False),
    "time_exponent": (r'"ts": (\d{16})\.(\d{3})', r'"ts": \1\2e-3', False),
    "time_beyond_int64_ns": (r'"ts": (\d{16}\.\d{3})', r'"ts": 99999\1', False),
    "duration_bool": (r'"dur": [\d.]+', '"dur": true', None),
    "duration_negative": (r'"dur": ([\d.]+)', r'"dur": -\1', True),
    "duration_huge": (r'"dur": [\d.]+', '"dur": 1e300', None),
    "kernel_without_correlation": (r'("cat": "kernel".*?)"correlation": \d+', r'\1"x": 0', False),
    "kernel_without_device": (r'("cat": "kernel".*?)"device": \d', r'\1"x": 0', False),
    "kernel_correlation_negative": (r'("cat": "kernel".*?)"correlation": (\d+)', r'\1"correlation": -\2', False),
    "call_correlation_huge": (r'("cat": "cuda_\w+".*?)"correlation": \d+', r'\1"correlation": 99999999999999999999',
                              None),
    "call_without_args": (r', "args": \{"correlation": \d+, "cbid": 211\}', '', None),
    "unknown_phase": (r'"ph": "i"', '"ph": "Z"', False),
    "phase_missing": (r'"ph": "M", ', '', False),
    "category_number": (r'"cat": "cpu_op"', '"cat": 5', None),
    "name_number": (r'("cat": "(?:cpu_op|python_function)", "name": )"[^"]*"', r'\g<1>7', None),
    "name_null": (r'("cat": "(?:cpu_op|python_function)", "name": )"[^"]*"', r'\g<1>null', True),
    "pid_object": (r'"pid": 1, "tid": 1', '"pid": {"a": 1}, "tid": [1]', True),
    "event_not_an_object": (r'\{"ph": "M"', '5, {"ph": "M"', False),
    "bytes_string": (r'"bytes": (\d+)', r'"bytes": "\1"', None),
}


@pytest.mark.parametrize("case", sorted(ALTERED))
def test_altered_copies(tmp_path, monkeypatch, case):
    import re

    pattern, repl, lean_expected = ALTERED[case]
    events = _event_texts(random.Random(21), True)
    text = "\n".join(events)
    if pattern is None:  # every time with two fraction digits: another shape, one for all
        altered = re.sub(r'"ts": (\d{16}\.\d\d)\d', r'"ts": \1', text)
    else:
        altered = re.sub(pattern, repl, text, count=1, flags=re.S)
    assert altered != text
    took = _same(_write(tmp_path, case, altered.split("\n")), monkeypatch)
    if lean_expected is not None:
        assert took is lean_expected


def test_markers_keep_the_order_they_are_met_in(tmp_path, monkeypatch):
    """autograd's flows before or after the first backward op: the markers' order is the loop's either way."""
    base = _event_texts(random.Random(5), False)
    flows = [e for e in base if '"fwdbwd"' in e]
    rest = [e for e in base if '"fwdbwd"' not in e]
    for events in (flows + rest, rest + flows):
        assert _same(_write(tmp_path, "order", events), monkeypatch)


@pytest.mark.parametrize("start_us", [2199023255540, 2199023255553, 4458676522690])
def test_thirteen_digit_times_around_2_41_us(tmp_path, monkeypatch, start_us):
    """Times of 13 integer digits are floats below 2**41 µs and exact texts above: times on both sides (the first
    case) are left to the full schema; all above it read by the lean pass, the same to the nanosecond."""
    events = []
    for i in range(40):
        t = f"{start_us + i // 2}.{(i * 37) % 1000:03d}"
        events.append(json.dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": "@", "dur": 1.5,
                                  "args": {"correlation": i}}).replace('"@"', t))
        events.append(json.dumps({"ph": "X", "cat": "kernel", "name": "k", "ts": "@", "dur": 0.25,
                                  "args": {"device": 0, "stream": 7, "correlation": i}}).replace('"@"', t))
    assert _same(_write(tmp_path, "t13", events), monkeypatch) is (start_us > 2199023255552)
