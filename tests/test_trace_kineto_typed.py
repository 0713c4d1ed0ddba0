"""The Kineto reader's two decoders (msgspec's typed one, a dependency, and the stdlib one, the fallback) give the
same timeline, to the nanosecond, on every trace here and on hostile ones, or the same one-line error."""
from __future__ import annotations

import dataclasses
import decimal
import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from fragscope.collectors import kineto_events
from fragscope.collectors.kineto import us_to_ns, read_kineto
from fragscope.collectors.kineto_events import Dec
from fragscope.timeline_model import TraceError

DATA = Path(__file__).parent / "data" / "trace"
TYPED = kineto_events.msgspec is not None


def _fields(tl) -> dict:
    return {f.name: (v.tolist() if isinstance(v, np.ndarray) else v)
            for f in dataclasses.fields(tl) for v in [getattr(tl, f.name)]}


def _both(monkeypatch, path: str):
    """(typed, stdlib) results: the Timeline's fields, or the error text."""
    out = []
    for decoder in ("", "stdlib"):
        monkeypatch.setenv("FRAGSCOPE_JSON_DECODER", decoder)
        try:
            out.append(_fields(read_kineto(path)))
        except TraceError as e:
            out.append(f"error: {e}")
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json.gz")))
def test_real_traces_same_both_ways(monkeypatch, name):
    typed, stdlib = _both(monkeypatch, str(DATA / name))
    assert isinstance(typed, dict) and typed == stdlib


def _ev(**kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1712195495505583.25, "dur": 4.5,
         "args": {"device": 0, "stream": 7, "correlation": 1}}
    e.update(kw)
    return e


_LAUNCH = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9,
           "ts": 1712195495505580.125, "dur": 2.5, "args": {"correlation": 1}}

# Hostile or unusual shapes: each goes one way or the other (typed, or the stdlib fallback), never apart.
CASES = {
    "epoch µs with ns digits": [_LAUNCH, _ev()],
    "ints": [dict(_LAUNCH, ts=100, dur=3), _ev(ts=110, dur=4)],
    "small floats first, epoch floats later": [dict(_LAUNCH, ts=100.5), _ev(ts=1712195495505583.25)],
    "epoch floats first, a small float later": [_LAUNCH, _ev(), _ev(ts=3.5, args={"correlation": 1})],
    "a large float dur": [_LAUNCH, _ev(dur=3e12)],
    "more than 3 decimals": [_LAUNCH, _ev(ts="@1712195495505583.1235")],
    "exponent": [_LAUNCH, _ev(ts="@1.7121954955055832e15")],
    "event not an object": [_LAUNCH, 5, "x", None, _ev()],
    "float correlation": [_LAUNCH, _ev(args={"correlation": 1.0, "device": 0})],
    "string correlation": [_LAUNCH, _ev(args={"correlation": "1"})],
    "bool device": [_LAUNCH, _ev(args={"correlation": 1, "device": True})],
    "args a list": [_LAUNCH, _ev(args=[1, 2])],
    "name a number": [_LAUNCH, _ev(name=5)],
    "ts text": [_LAUNCH, _ev(ts="12"), _ev(ts=13.5)],
    "ts null, dur missing": [_LAUNCH, _ev(ts=None), {k: v for k, v in _ev().items() if k != "dur"}],
    "huge digits": [_LAUNCH, _ev(ts="@" + "9" * 5000)],
    "id beyond 64 bits": [_LAUNCH, _ev(args={"correlation": 2 ** 64})],
    "time out of range": [_LAUNCH, _ev(ts="@1e300")],
    "no correlation: ac2g flows": [
        dict(_LAUNCH, args={}), _ev(args={"device": 0, "stream": 7}),
        {"ph": "s", "cat": "ac2g", "id": 1, "pid": 9, "tid": 9, "ts": 1712195495505580.125},
        {"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 1712195495505583.25, "bp": "e"}],
    "flow id an object": [dict(_LAUNCH, args={}), _ev(args={}),
                          {"ph": "s", "cat": "ac2g", "id": {"a": 1}, "pid": 9, "tid": 9, "ts": 1}],
    "unused fields of any shape": [_LAUNCH, _ev(extra={"deep": [[[["@1.5e400"]]]], "s": "\u00e9"}, bp=[None])],
    "training marks": [_LAUNCH, _ev(), {"ph": "s", "cat": "fwdbwd", "id": 3, "ts": 1},
                       {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MulBackward0",
                        "ts": 1712195495505570.5, "dur": 1}],
    "profiler steps": [_LAUNCH, _ev(), {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3",
                                       "ts": 1712195495505500.001, "dur": 200.999}],
}


def _raw_numbers(text: str) -> str:
    out, i = [], 0
    while True:
        j = text.find('"@', i)
        if j < 0:
            return "".join(out) + text[i:]
        k = text.index('"', j + 2)
        out.append(text[i:j] + text[j + 2:k])
        i = k + 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_and_unusual_same_both_ways(tmp_path, monkeypatch, case):
    p = tmp_path / "t.json"
    p.write_text(_raw_numbers(json.dumps({"schemaVersion": 1, "traceEvents": CASES[case]})))
    typed, stdlib = _both(monkeypatch, str(p))
    assert typed == stdlib


def test_lone_surrogate_and_array_format_same_both_ways(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    p.write_text(json.dumps([_LAUNCH, _ev(name="\ud800x")]))  # Chrome's array format, a lone surrogate
    typed, stdlib = _both(monkeypatch, str(p))
    assert isinstance(typed, dict) and typed == stdlib


def test_exact_nanoseconds(tmp_path, monkeypatch):
    p = tmp_path / "ns.json.gz"
    text = _raw_numbers(json.dumps({"traceEvents": [
        dict(_LAUNCH, ts="@1712195495505580.125"), _ev(ts="@1712195495505583.251", dur="@4.928")]}))
    p.write_bytes(gzip.compress(text.encode()))
    typed, stdlib = _both(monkeypatch, str(p))
    assert typed["op_start"] == [1712195495505583251] and typed["op_end"] == [1712195495505588179]
    assert typed["call_start"] == [1712195495505580125]
    assert typed == stdlib


def test_short_decimal_path_equals_decimal():
    rng = random.Random(7)
    for _ in range(3000):
        i = str(rng.choice([0, 1, 17, 1712195495505583, 2 ** 41, 4 * 10 ** 15]) + rng.randrange(1000))
        text = ("-" if rng.random() < 0.2 else "") + i + "." + "".join(rng.choice("0123456789")
                                                                      for _ in range(rng.randint(1, 3)))
        want = int((decimal.Decimal(text) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN))
        assert us_to_ns(Dec(text)) == want, text


@pytest.mark.skipif(not TYPED, reason="msgspec (a dependency) not importable here")
def test_typed_schemas_used():
    """Times as numbers where they are ints or small floats; as text where they are epoch µs with sub-µs
    digits (both tried in either order, the result the same: the mixed cases above)."""
    events, meta = kineto_events.decode_trace(json.dumps({"traceEvents": [_LAUNCH, _ev()]}).encode(), "t.json")
    assert type(events[0]) is kineto_events.EventTextTime and meta["schemaVersion"] is None
    events, _ = kineto_events.decode_trace(json.dumps({"traceEvents": [dict(_LAUNCH, ts=5), _ev(ts=9)]}).encode(),
                                           "t.json")
    assert type(events[0]) is kineto_events.Event


def test_msgspec_unimportable_same_output(tmp_path):
    """Where msgspec cannot be imported (a broken install, an interpreter it has no build for), `diagnose trace`
    reads with the stdlib decoder and prints the same, byte for byte (each run in a fresh interpreter)."""
    import subprocess
    import sys

    small = DATA / "hta_inference_rank1_runtime_kernel_cats.json.gz"
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1')
    code = ("import sys\nif sys.argv[1] == 'off': sys.modules['msgspec'] = None  # (import msgspec: ImportError)\n"
            "from fragscope.collectors import kineto_events as k; "
            "assert (k.msgspec is None) == (sys.argv[1] == 'off'); "
            "from fragscope.cli import diagnose_main; sys.argv[1:2] = []; diagnose_main()")
    for path in (small, bad):
        runs = [subprocess.run([sys.executable, "-c", code, side, "trace", str(path), "--format", "json"],
                               capture_output=True, timeout=120, cwd=Path(__file__).parent.parent)
                for side in ("on", "off")]
        on, off = ((r.returncode, r.stdout, r.stderr) for r in runs)
        assert on == off and on[0] == (0 if path is small else 2)
