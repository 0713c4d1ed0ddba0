"""Hostile and broken inputs to `diagnose logs` and the log collector (issue 12): one line and exit 2,
or valid output; never a traceback, a hang, NaN in JSON, or unbounded time."""
from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys

import pytest

from fragscope.collectors.enginelog import LogInputError, parse_log, parse_log_line, read_log_file
from fragscope.collectors.logs import LogCollector
from fragscope.detectors.logs import analyse_log
from fragscope.model import Reason

from logs_helpers import DATA, run_diagnose, strict_json, utc


def one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err


# ---------------------------------------------------------------------------------------------
# files that are not engine logs: exit 2, saying what the file looks like
@pytest.mark.parametrize("content,needles", [
    (b"", ("empty file",)),
    (gzip.compress(b"", mtime=0), ("empty file", "after decompression")),
    (b"\n\n   \n", ("only blank lines",)),
    (b"The quick brown fox jumps over the lazy dog.\nIt was the best of times.\n", ("plain text", "The quick brown")),
    (b"# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
     b"vllm:num_requests_running{model_name=\"m\"} 3.0 1700000000000\n", ("Prometheus", "diagnose FILE")),
    (b'{"traceEvents": []}\n', ("JSON", "diagnose trace")),
    (bytes(range(256)) * 4, ("binary file",)),
])
def test_not_an_engine_log(tmp_path, capsys, monkeypatch, content, needles):
    f = tmp_path / "x.log"
    f.write_bytes(content)
    one_line_error(*run_diagnose(capsys, monkeypatch, "logs", str(f)), *needles)


def test_real_metrics_recording_is_refused(capsys, monkeypatch):
    f = DATA.parent / "collectors" / "vllm_cpu_0.32.0_tiny.metrics.txt"
    one_line_error(*run_diagnose(capsys, monkeypatch, "logs", str(f)), "Prometheus")


def test_engine_log_without_readable_lines_is_inconclusive_not_bad_input(tmp_path, capsys, monkeypatch):
    f = tmp_path / "startup.log"
    f.write_text("INFO 05-21 21:08:08 [api_server.py:1] vLLM API server version 0.20.2\n"
                 "INFO 05-21 21:08:09 [api_server.py:2] args: model='m'\n")
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(f), "--format", "json")
    doc = strict_json(out)
    assert code == 0 and not doc["findings"] and doc["inconclusive"][0]["id"] == "logs"
    assert "2 engine log line(s)" in doc["inconclusive"][0]["reason"]


# ---------------------------------------------------------------------------------------------
# compressed input: corrupt, truncated, bombs
def test_corrupt_gzip_is_one_line(tmp_path, capsys, monkeypatch):
    good = gzip.compress(b"INFO 01-01 00:00:00 a.py:1] # GPU blocks: 1, # CPU blocks: 1\n" * 2000)
    bad = bytearray(good)
    bad[30:60] = b"\xff" * 30  # deflate stream garbage: zlib.error inside gzip
    f = tmp_path / "bad.log.gz"
    f.write_bytes(bytes(bad))
    with pytest.raises(LogInputError, match="corrupt or truncated gzip"):
        read_log_file(str(f))
    one_line_error(*run_diagnose(capsys, monkeypatch, "logs", str(f)), "cannot read", "gzip")
    f.write_bytes(good[:-12])  # truncated: EOFError
    one_line_error(*run_diagnose(capsys, monkeypatch, "logs", str(f)), "truncated gzip")


def test_gzip_bomb_stops_at_the_cap_and_names_it(tmp_path, capsys, monkeypatch):
    f = tmp_path / "bomb.log.gz"
    f.write_bytes(gzip.compress(b"x" * 100 + b"\n" + b"\n" * (3 << 20), compresslevel=9))  # 3 MiB from ~3 KiB
    assert f.stat().st_size < 64 << 10
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(f), "--max-bytes", str(1 << 20))
    one_line_error(code, out, err, "--max-bytes 1048576", "decompressed")


@pytest.mark.e2e  # 16 MiB of newlines through the CLI
def test_newline_bomb_under_the_cap_is_linear(tmp_path, capsys, monkeypatch):
    f = tmp_path / "nl.log.gz"
    f.write_bytes(gzip.compress(b"\n" * (16 << 20), compresslevel=9))
    # blank runs are counted, not parsed line by line: the reader yields a count per run of blank
    # lines, so 16 Mi newlines come out as a handful of items (linear in bytes, no per-line work)
    from fragscope.collectors.enginelog.reader import LogRead, iter_lines_bytes

    items = list(iter_lines_bytes(str(f), LogRead()))
    assert sum(x for x in items if isinstance(x, int)) >= (16 << 20) - 1 and len(items) < 1000
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(f))
    one_line_error(code, out, err, "only blank lines")


# ---------------------------------------------------------------------------------------------
# lines: huge, numbers that are not numbers, timestamps out of range
def test_huge_line_is_cut_and_its_head_still_read(tmp_path):
    f = tmp_path / "long.log"
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "8.00 GiB of which 1.00 GiB is free. ")
    f.write_bytes(oom.encode() + b"y" * (3 << 20) + b"\nINFO 01-02 03:04:05 a.py:1] # GPU blocks: 7, # CPU blocks: 1\n")
    info = read_log_file(str(f), reference=utc(2026, 1, 3))
    assert info.truncated_lines == 1 and info.lines == 2
    assert [e.kind for e in info.events] == ["oom", "kv_blocks"] and info.events[1].line_no == 2
    assert info.events[0].fields["requested_bytes"] == 2 * 1024 ** 3


def test_pathological_line_parses_to_nothing():
    # many pattern starts without the closing figure: nothing is read from it (bench/bench_bounds.py times it:
    # bounded lookahead, not quadratic backtracking)
    line = "Sequence group x is preempted by PreemptionMode.RECOMPUTE " * 1100 + "block_size= Namespace(" * 2000
    assert parse_log_line(line[: 64 << 10]) is None


BAD_NUMBERS = [
    "INFO 01-01 00:00:00 a.py:1] # GPU blocks: .000.0, # CPU blocks: 1",
    "INFO 01-01 00:00:00 a.py:1] # GPU blocks: " + "9" * 400 + ", # CPU blocks: 1",
    "INFO 01-01 00:00:00 a.py:1] GPU KV cache size: " + "9" * 400 + " tokens",
    "INFO 01-01 00:00:00 a.py:1] Maximum concurrency for 1,024 tokens per request: " + "9" * 400 + ".5x",
    "INFO 01-01 00:00:00 a.py:1] Avg prompt throughput: 1.000.0 tokens/s, Avg generation throughput: " + "9" * 400
    + ".0 tokens/s, Running: " + "9" * 400 + " reqs, Pending: 0 reqs, GPU KV cache usage: 1e400%",
    "WARNING 01-01 00:00:01 s.py:1] Sequence group a is preempted by PreemptionMode.RECOMPUTE "
    "total_num_cumulative_preemption=" + "9" * 400,
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + "9" * 400 + " GiB. GPU 0 has a total capacity",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
    + "9" * 400 + " GiB of which 1.000.0 GiB is free. Process 1 has " + "9" * 300 + " GiB memory in use.",
    "RuntimeError: CUDA out of memory. Tried to allocate 1.0 GiB (GPU 0; " + "9" * 400 + " GiB total capacity; "
    "1.0.0 GiB already allocated; 0.5 GiB free; 2 GiB reserved in total by PyTorch)",
    "INFO 01-01 00:00:00 a.py:1] Memory profiling results: total_gpu_memory=" + "9" * 400 + "GiB kv_cache_size=1.0.0GiB",
    "ValueError: Free memory on device (" + "9" * 400 + "/4.0 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 3.6 GiB).",
    "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: " + "9" * 400 + ", token usage: .000.0, #queue-req: 1",
    "[2026-01-01 00:00:00] KV cache pool is full. Retract requests. #retracted_reqs: " + "9" * 400,
]


def test_unparsable_numbers_leave_fields_out_and_json_valid():
    evs = parse_log(BAD_NUMBERS, reference=utc(2026, 1, 2))
    for e in evs:
        for k, v in e.fields.items():
            if isinstance(v, float):
                assert v == v and abs(v) < 1e18, (k, v, e.text[:80])
    summary, findings = analyse_log(evs)
    json.dumps(summary, allow_nan=False, default=str)
    json.dumps([f.to_dict() for f in findings], allow_nan=False, default=str)
    # the OOM whose request is a 400-digit figure yields no event; the one with sane figures keeps them
    ooms = [e for e in evs if e.kind == "oom"]
    assert all(o.fields["requested_bytes"] == 1024 ** 3 for o in ooms) and ooms


def test_unparsable_numbers_through_the_cli(tmp_path, capsys, monkeypatch):
    f = tmp_path / "nums.log"
    f.write_text("\n".join(BAD_NUMBERS) + "\n")
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(f), "--format", "json", "--fail-on", "never")
    assert code == 0 and err == ""
    strict_json(out)


@pytest.mark.parametrize("tz", ["0", "14", "-12"])
def test_timestamps_out_of_range_are_dropped_not_crashed(tmp_path, capsys, monkeypatch, tz):
    f = tmp_path / "years.log"
    f.write_text("10000-01-01T00:00:00.000000000Z INFO 01-01 00:00:00 a.py:1] # GPU blocks: 1, # CPU blocks: 1\n"
                 "9999-12-31T23:59:59.999999999 INFO 01-01 00:00:00 a.py:1] # GPU blocks: 2, # CPU blocks: 1\n"
                 "[9999-12-31 23:59:59 TP0] Decode batch, #running-req: 1, token usage: 0.50, #queue-req: 0\n"
                 "0000-01-01T00:00:00Z INFO 13-45 99:99:99 a.py:1] # GPU blocks: 3, # CPU blocks: 1\n"
                 "2026-02-30T00:00:00+25:00 INFO 02-29 10:00:00 a.py:1] # GPU blocks: 4, # CPU blocks: 1\n")
    for fmt in ("json", "human"):
        code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(f), "--tz-offset", tz, "--format", fmt,
                                      "--fail-on", "never")
        assert code == 0 and "Traceback" not in err, err
        if fmt == "json":
            doc = strict_json(out)
            assert doc["log"]["event_kinds"] == {"kv_blocks": 4, "stats": 1}
            tr = doc["log"]["time_range"]
            assert tr["end"] is None or tr["end"] < 253370764800


@pytest.mark.parametrize("value", ["24", "-24", "nan", "NaN", "1e400", "inf", "-inf", "abc"])
def test_tz_offset_is_validated(capsys, monkeypatch, value):
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(DATA / "sglang_retractions.log"),
                                  "--tz-offset", value)
    one_line_error(code, out, err, "--tz-offset")


# ---------------------------------------------------------------------------------------------
# non-regular files: refused at once, never a hang
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)
    code = "from fragscope.cli import diagnose_main; diagnose_main()"
    p = subprocess.run([sys.executable, "-c", code, "logs", str(fifo)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert "FIFO" in p.stderr and "Traceback" not in p.stderr
    c = LogCollector(str(fifo), from_start=True)
    r = c.collect(1000.0)
    assert not r.up and r.missing and r.missing[0].reason is Reason.SOURCE_DOWN and "regular file" in r.error


def test_directory_is_refused(tmp_path, capsys, monkeypatch):
    one_line_error(*run_diagnose(capsys, monkeypatch, "logs", str(tmp_path)), "directory")


# ---------------------------------------------------------------------------------------------
# a small seeded mutator over the real fixtures: the contract holds on every mutant
def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(6)
        i = rng.randrange(max(1, len(b)))
        if op == 0 and b:
            b[i] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice([b"9" * rng.randint(20, 500), b".0.0", b"\n", b"nan", b"1e400", b"\xff\xfe",
                                 b"INFO 13-45 25:61:61 x.py:1] ", b"[99:99:99 TP0] ", b"-", b"%|", b"\r"])
        elif op == 2:
            del b[i:i + rng.randint(1, 50)]
        elif op == 3:
            j = rng.randrange(max(1, len(b)))
            b[i:i] = b[j:j + rng.randint(1, 200)]
        elif op == 4:
            b = b[:i]
        else:
            b[i:i] = b"x" * rng.randint(1000, 70000)
    return bytes(b)


FUZZ_SOURCES = ["vllm_v0_preemption_storm.log", "vllm_v1_oom.log", "sglang_retractions.log",
                "vllm_issue14435_progress_bar_preemption.log", "vllm_issue18115_glued_stats.log",
                "sglang_issue1270_short_prefix.log", "torch_oom_le20_vllm783.log", "torch_oom_ge22_vllm12529.log"]


def test_seeded_mutations_keep_the_contract(tmp_path):
    rng = random.Random(20261201)
    seeds = [(DATA / n).read_bytes()[:20000] for n in FUZZ_SOURCES]
    f = tmp_path / "m.log"
    runs, refused = 0, 0
    for i in range(240):
        data = _mutate(seeds[i % len(seeds)], rng)
        if i % 8 == 7:  # every other compressed mutant is cut in half (a truncated .gz)
            gz = gzip.compress(data)
            data = gz[: len(gz) // 2] if i % 16 == 15 else gz
        f.write_bytes(data)
        try:
            info = read_log_file(str(f), reference=utc(2026, 6, 1))
        except LogInputError as e:
            assert "\n" not in str(e)
            refused += 1
            continue
        summary, findings = analyse_log(info.events)
        json.dumps(summary, allow_nan=False, default=str)
        json.dumps([x.to_dict() for x in findings], allow_nan=False, default=str)
        runs += 1
    assert runs > 150 and refused >= 15  # both paths exercised (bench/bench_bounds.py times the run)


@pytest.mark.parametrize("opt", ["--gpu-memory-gib", "--gpu-memory-utilization", "--weights-gib", "--overhead-gib"])
@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_float_options_must_be_finite(capsys, monkeypatch, opt, value):
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(DATA / "vllm_v0_preemption_storm.log"),
                                  "--num-layers", "32", "--num-kv-heads", "32", "--head-dim", "128", opt, value)
    one_line_error(code, out, err, opt)


@pytest.mark.parametrize("args", [["--expected-kv-tokens", "9" * 400], ["--num-layers", "9" * 50, "--num-kv-heads", "8",
                                  "--head-dim", "128", "--gpu-memory-gib", "80"], ["--max-bytes", "9" * 30]])
def test_huge_integer_options_are_usage_errors(capsys, monkeypatch, args):
    code, out, err = run_diagnose(capsys, monkeypatch, "logs", str(DATA / "vllm_v0_preemption_storm.log"), *args)
    one_line_error(code, out, err, args[0])


def test_blank_runs_keep_line_numbers(tmp_path):
    f = tmp_path / "gaps.log"
    blk = b"INFO 01-02 03:04:05 a.py:1] # GPU blocks: 7, # CPU blocks: 1\n"
    f.write_bytes(b"start\n" + b"\n" * 5 + blk + b"\n" * ((1 << 20) + 3) + blk)  # a run across a 1 MiB chunk edge
    info = read_log_file(str(f), reference=utc(2026, 1, 3))
    assert [e.line_no for e in info.events] == [7, 7 + (1 << 20) + 3 + 1] and info.lines == 7 + (1 << 20) + 4


def test_repeated_message_events_are_fresh_copies():
    """parse_message caches the events of a message seen before (logs repeat lines): a caller changing
    one event's fields, nested lists included, never changes what the next identical line yields."""
    from fragscope.collectors.enginelog.patterns import parse_message

    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 1.06 GiB is free. Process 1234 has 40.00 GiB memory in use. Process 99 has 38.00 GiB "
           "memory in use. Of the allocated memory 36.00 GiB is allocated by PyTorch, and 1.50 GiB is reserved by "
           "PyTorch but unallocated.")
    first = parse_message(msg)
    (kind, fields, _, _), = first
    assert kind == "oom" and [p["pid"] for p in fields["other_processes"]] == [1234, 99]
    fields["other_processes"].append({"pid": 7, "bytes": 1})
    fields["requested_bytes"] = -1
    (_, again, _, _), = parse_message(msg)
    assert [p["pid"] for p in again["other_processes"]] == [1234, 99] and again["requested_bytes"] == 2 * 2**30
