"""Seeded mutations of real scrapes, pastes and a recording through `read_recording` (issue 12's contract
for this reader): a Window with finite times and values, or a one-line ParseError; nothing else.
A few hundred inputs per run; FRAGSCOPE_FUZZ_RUNS=N for more."""
from __future__ import annotations

import gzip
import json
import math
import os
import random

import numpy as np

from fragscope.collectors.exposition import ParseError, read_recording

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")
SEEDS = [os.path.join(DATA, "vllm_v1_cncf_kops.metrics.txt"),
         os.path.join(DATA, "dcgm_l4_cncf_kops.metrics.txt"),
         os.path.join(DATA, "pastes", "sglang_pr1853_prompt_fence.paste.txt"),
         os.path.join(DATA, "pastes", "vllm_issue7782_quoted_no_hash.paste.txt")]
RUNS = int(os.environ.get("FRAGSCOPE_FUZZ_RUNS", "240"))
TOKENS = [b"{", b"}", b'"', b"\\", b"=", b",", b" ", b"\n", b"\r\n", b"#", b"# EOF\n", b"# HELP x y\n",
          b"# TYPE vllm:num_preemptions counter\n", b"NaN", b"+Inf", b"-Inf", b"1e400", b"9" * 400, b"-1",
          b' 1700000000000000000000', b" 1700000000123456", b'le="NaN"', b'le=""', b"&quot;", b"&gt;",
          b"\x00", b"\xff\xfe", b"\xc3\x28", b"```\n", b"> ", b"$ curl x/metrics\n", b"_bucket", b"_total",
          b"vllm:kv_cache_usage_perc", b"process_start_time_seconds 1.7e9\n", b"\t", "\u00a0".encode()]


def _recording() -> bytes:
    rows = ["# TYPE vllm:num_preemptions counter", "# TYPE vllm:time_to_first_token_seconds histogram"]
    for i in range(30):
        t = 1_700_000_000 + 15 * i
        rows.append(f'vllm:num_preemptions_total{{model_name="m"}} {i} {t}')
        rows.append(f'vllm:kv_cache_usage_perc{{model_name="m"}} {i / 30:.3f} {t}')
        for le, c in (("0.1", i), ("+Inf", 2 * i)):
            rows.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {c} {t}')
    return ("\n".join(rows) + "\n# EOF\n").encode()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        pos = rng.randrange(len(b) + 1) if b else 0
        if op < 0.35:
            b[pos:pos] = rng.choice(TOKENS)
        elif op < 0.55 and b:
            del b[pos:pos + rng.randint(1, 40)]
        elif op < 0.7 and b:
            b[pos % len(b)] = rng.randrange(256)
        elif op < 0.8 and b:  # duplicate a slice (repeated series, repeated HELP blocks)
            a = rng.randrange(len(b))
            b[pos:pos] = b[a:a + rng.randint(1, 2000)]
        elif op < 0.9:
            b = b[:pos]  # truncation
        else:
            b = bytearray(b.replace(b"\n", b"\n" + rng.choice(TOKENS), rng.randint(1, 50)))
    return bytes(b)


def test_mutated_inputs_give_a_window_or_one_line_error(tmp_path):
    rng = random.Random(20261201)
    seeds = [open(p, "rb").read() for p in SEEDS] + [_recording()]
    outcomes = {"window": 0, "error": 0}
    for i in range(RUNS):
        data = _mutate(rng, rng.choice(seeds))
        if i % 7 == 0:
            data = gzip.compress(data)
            if i % 14 == 0:
                data = data[: max(1, len(data) - rng.randint(0, 30))]  # sometimes truncated
        p = tmp_path / f"in{i}.txt"
        p.write_bytes(data)
        try:
            w = read_recording(str(p), rng.choice([None, 10.0]), scrape_time=1.8e9,
                               max_series=5000, max_points=50_000, max_decompressed_bytes=1 << 20)
        except ParseError as e:
            msg = str(e)
            assert msg and "\n" not in msg and len(msg) < 600, msg
            outcomes["error"] += 1
            continue
        outcomes["window"] += 1
        assert math.isfinite(w.start) and math.isfinite(w.end) and w.start <= w.end < 1e11
        for s in w:
            assert s.ts.size == s.values.size and np.isfinite(s.values).all() and np.isfinite(s.ts).all()
            assert s.ts.size < 2 or bool(np.all(np.diff(s.ts) > 0))
            if s.name.endswith("_bucket"):
                le = s.key.label("le")
                assert le is not None and not math.isnan(float(le))
        json.dumps(w.notes)
    # both outcomes happen: the mutations are neither all fatal nor all harmless
    assert outcomes["window"] > RUNS // 10 and outcomes["error"] > RUNS // 10, outcomes
