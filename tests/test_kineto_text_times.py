"""The Kineto reader's bulk conversions give what its per-value ones give: ``text_times`` is
``raw_value`` of each time text, ``_exact_ns`` is ``us_to_ns`` of each value (same int64 ns, same
refusals), on random shapes, edge cases and the time texts of a trace written as Kineto writes them."""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from fragscope.collectors import kineto, kineto_events, kineto_loop
from fragscope.collectors.kineto import _exact_ns, read_kineto, us_to_ns
from fragscope.collectors.kineto_times import _one_large_shape, text_times, texts_ns
from fragscope.collectors.kineto_events import Dec, raw_value

msgspec = kineto_events.msgspec


def _reference(ts: list, dur: list):
    try:
        start = np.array([us_to_ns(v) for v in ts], dtype=np.int64)
        return start, start + np.array([us_to_ns(v) for v in dur], dtype=np.int64)
    except Exception as e:  # noqa: BLE001 - the refusal itself is compared
        return type(e)


def _bulk(ts: list, dur: list):
    try:
        return _exact_ns(ts, dur)
    except Exception as e:  # noqa: BLE001
        return type(e)


def _same(a, b) -> bool:
    if isinstance(a, type) or isinstance(b, type):
        return a is b
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))


def _dec(rng: random.Random, int_digits: int, frac_digits: int, sign: str = "") -> Dec:
    i = str(rng.randrange(10 ** int_digits)).zfill(int_digits)
    return Dec(f"{sign}{i}.{str(rng.randrange(10 ** frac_digits)).zfill(frac_digits)}")


def test_exact_ns_bulk_equals_per_value_on_random_shapes():
    rng = random.Random(11)
    hits = 0
    for _ in range(400):
        n = rng.randint(1, 40)
        i, f = rng.choice([(16, 3), (16, 2), (16, 1), (15, 3), (17, 3), (18, 3), (19, 3), (3, 3), (16, 4)])
        ts = [_dec(rng, i, f) for _ in range(n)]
        if rng.random() < 0.15:  # one of another shape, sign or type: the per-value path, same answer
            ts[rng.randrange(n)] = rng.choice([_dec(rng, i + 1, f), _dec(rng, i, f, "-"), 12.5, 7,
                                               Dec("1712195495505583.5e0"), Dec("9" * 19 + ".5")])
        dur = [round(rng.uniform(0, 5000), rng.randint(0, 3)) for _ in range(n)]
        if rng.random() < 0.2:
            dur[rng.randrange(n)] = rng.randint(0, 10 ** 6)  # an int among the floats
        if rng.random() < 0.05:
            dur = [rng.uniform(0, 2.0 ** 40) for _ in range(n)]  # large floats: round(v * 1000) as Python does
        if rng.random() < 0.05:
            dur = [x + 0.0005 for x in range(n)]  # half-ns ties: half to even, both ways
        ref, got = _reference(ts, dur), _bulk(ts, dur)
        assert _same(ref, got), (ts[:3], dur[:3], ref, got)
        hits += texts_ns(ts) is not None
    assert hits > 50  # the bulk path itself was exercised, not only its fallback


@pytest.mark.parametrize("vals", [
    [], [Dec("1712195495505583.123")], [Dec("1712195495505583.12"), Dec("1712195495505583.123")],
    [Dec("9999999999999999.999")] * 3,  # beyond 2**62 ns: us_to_ns refuses it, the bulk path leaves it
    [Dec("4611686018427387.903")], [Dec("4611686018427386.999")], [Dec("0000000000000001.5")],
    [Dec("17121954955055831.2")], [Dec("1712195495505583.1a3")], [Dec("1712195495505583,123")],
    [Dec("１712195495505583.123")],  # a non-ASCII digit
])
def test_exact_ns_edges(vals):
    dur = [1.5] * len(vals)
    assert _same(_reference(vals, dur), _bulk(vals, dur))


@pytest.mark.skipif(msgspec is None, reason="typed decoding needs msgspec (a dependency)")
def test_text_times_equal_raw_value():
    texts = [b"1712195495505583.123", b"-1712195495505583.5", b"17121954955055.5", b"1712195495505583",
             b"1.712195495505583e15", b'"1712195495505583.123"', b"[1]", b'{"a": 1}', b"null", b"12.5",
             b"1712195495505583.123456789", b"\"\\u00e9\""]
    raws = [msgspec.Raw(t) for t in texts]
    got = text_times(raws)
    assert len(got) == len(raws)
    for r, g in zip(raws, got):
        g = raw_value(g) if type(g) is msgspec.Raw else g
        ref = raw_value(r)
        assert type(g) is type(ref) and g == ref, (bytes(r), g, ref)
    assert sum(type(g) is Dec for g in got) == 3  # the large numbers with a fraction converted in bulk


def test_epoch_text_trace_reads_the_same_with_and_without_bulk(tmp_path, monkeypatch):
    """A trace with epoch-µs times with ns digits (as PyTorch writes them): the Timeline with the bulk
    conversions equals the one with the per-value conversions, to the nanosecond (numpy columns: the bulk
    conversion is theirs; a small trace's Python columns convert each value, tests/test_trace_vectors.py)."""
    monkeypatch.setenv("FRAGSCOPE_TRACE_ARRAYS", "numpy")
    rng = random.Random(5)
    t0, ev = 1712195495505583.0, []
    for i in range(300):
        t = t0 + i * 37.125 + rng.randrange(1000) / 1000
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9,
                   "ts": round(t, 3), "dur": round(rng.uniform(2, 9), 3), "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": round(t + 5.5, 3),
                   "dur": round(rng.uniform(1, 30), 3), "args": {"device": 0, "stream": 7, "correlation": i + 1}})
    p = tmp_path / "epoch.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    bulk = read_kineto(str(p))
    monkeypatch.setattr(kineto, "_lean_timeline", lambda raw, path: None)  # (the lean pass: its own bulk reading)
    monkeypatch.setattr(kineto, "texts_ns", lambda vals, np=None: None)
    monkeypatch.setattr(kineto_loop, "text_times", lambda raws: list(raws))
    one_by_one = read_kineto(str(p))
    for f in ("op_start", "op_end", "call_start", "call_end", "op_launch"):
        assert np.array_equal(getattr(bulk, f), getattr(one_by_one, f)), f
    assert bulk.op_start.min() > 10 ** 18 and (bulk.op_start % 1000 != 0).any()  # ns digits kept


@pytest.mark.skipif(msgspec is None, reason="typed decoding needs msgspec (a dependency)")
def test_text_times_one_shape_equals_raw_value_on_random_lists():
    """Texts all of one shape are converted without a match per text: same values as ``raw_value`` of
    each, and any text of another shape (a sign, another width, a letter, a second dot, a short integer
    part, a non-ASCII digit) sends the list through the per-text match, with the same values."""
    rng = random.Random(3)
    odd = [b"-1712195495505583.123", b"1712195495505583.12", b"17121954955055831.12", b"1712195495505583.1a3",
           b"1712195495505583..23", b"171219549550558.3123", b"12345678901234.5678", b"1712195495505583123.",
           "1712195495505583.１23".encode(), b"1712195495505583e+03", b"1712195495505583.1e3", b"null"]
    fast = 0
    for _ in range(300):
        n = rng.randint(1, 30)
        i, f = rng.choice([(16, 3), (15, 1), (17, 2), (18, 3), (14, 3), (16, 0)])
        texts = [(str(rng.randrange(10 ** i)).zfill(i) + ("." + str(rng.randrange(10 ** f)).zfill(f) if f else ""))
                 .encode() for _ in range(n)]
        if rng.random() < 0.4:
            texts[rng.randrange(n)] = rng.choice(odd)
        raws = [msgspec.Raw(t) for t in texts]
        got = text_times(raws)
        for r, g in zip(raws, got):
            g = raw_value(g) if type(g) is msgspec.Raw else g
            ref = raw_value(r)
            assert type(g) is type(ref) and g == ref, (bytes(r), g, ref)
        fast += _one_large_shape([t.decode("latin-1") for t in texts])
    assert fast > 50  # the one-shape path itself was exercised


def test_texts_ns_numpy_digits_equal_python_ints():
    """The digits summed by numpy give the ints Python gives, and refuse what it refuses (above 2**62)."""
    rng = random.Random(8)
    both = 0
    for _ in range(300):
        i, f = rng.choice([(16, 3), (16, 2), (16, 1), (15, 3), (14, 2), (17, 3), (18, 3), (16, 4)])
        vals = [_dec(rng, i, f) for _ in range(rng.randint(1, 50))]
        if rng.random() < 0.1:
            vals[0] = Dec("9" * i + "." + "9" * f)
        ref, got = texts_ns(vals), texts_ns(vals, np)
        if ref is None:
            assert got is None, vals[:2]
            continue
        assert got is not None and got.dtype == np.int64 and got.tolist() == ref, vals[:2]
        both += 1
    assert both > 50
    for vals in ([Dec("4611686018427387.904")], [Dec("4611686018427387.903")], [Dec("0000000000000000.001")]):
        ref, got = texts_ns(vals), texts_ns(vals, np)
        assert (got is None and ref is None) or got.tolist() == ref, vals
