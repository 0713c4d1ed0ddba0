"""KV budget maths (seed 001) and the ``fragscope kv-budget`` command."""
from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from fragscope.cli import fragscope_group
from fragscope.kvbudget import (GIB, KvBudgetError, block_waste, expected_waste_ratio, kv_budget, kv_requirement,
                                model_shape_from_config, read_model_config, recommend_block_size)

LLAMA3_8B = dict(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)
WORKED = dict(gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9, weights_bytes=16 * GIB,
              overhead_bytes=2 * GIB, block_size=16, **LLAMA3_8B)
# The head of meta-llama/Meta-Llama-3-8B's config.json (public model card values).
LLAMA3_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
                 "max_position_embeddings": 8192, "model_type": "llama"}


def test_worked_example():
    b = kv_budget(**WORKED, max_seq_len=2048)
    assert b.num_blocks == 27_648
    assert b.cached_tokens == 442_368
    assert b.max_concurrent_seqs == 216
    assert b.bytes_per_block == 2 * 1024 * 1024  # 2 MiB per 16-token block


def test_blocks_floor_and_scale():
    b = kv_budget(**{**WORKED, "gpu_memory_bytes": 80 * GIB + 1.5 * 1024**2})  # 1.35 MiB more: not a block
    assert b.num_blocks == 27_648
    b32 = kv_budget(**{**WORKED, "block_size": 32})
    assert b32.num_blocks == 13_824 and b32.cached_tokens == 442_368
    fp8 = kv_budget(**{**WORKED, "dtype_bytes": 1})
    assert fp8.num_blocks == 2 * 27_648


def test_seed_001_waste_and_recommendation():
    # the last block is (B - 1) / 2 tokens short on average: 31.5 of 32 + 31.5, 7.5 of 2048 + 7.5
    assert expected_waste_ratio(64, 32) == pytest.approx(31.5 / 63.5) == pytest.approx(63 / 127)
    assert expected_waste_ratio(16, 2048) == pytest.approx(7.5 / 2055.5)
    assert recommend_block_size(32) == 16
    assert recommend_block_size(20) == 8
    assert recommend_block_size(100) == 32  # target 50: 64 is nearer, but vLLM supports at most 32 on CUDA
    assert recommend_block_size(10_000) == 32
    b = kv_budget(**{**WORKED, "block_size": 64}, avg_seq_len=32)
    assert b.recommended_block_size == 16 and b.recommended_waste_ratio == pytest.approx(7.5 / 39.5)
    assert b.expected_waste_ratio == pytest.approx(31.5 / 63.5)


@pytest.mark.parametrize("bad", [dict(gpu_memory_utilization=1.5), dict(gpu_memory_utilization=0),
                                 dict(block_size=0), dict(num_layers=2.5), dict(weights_bytes=-1),
                                 dict(dtype_bytes=float("nan")), dict(gpu_memory_bytes=10 * GIB)])
def test_bad_inputs(bad):
    with pytest.raises(KvBudgetError):
        kv_budget(**{**WORKED, **bad})


def test_model_config_shapes(tmp_path):
    s = model_shape_from_config(LLAMA3_CONFIG)
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.dtype_bytes) == (32, 8, 128, 2)
    mha = model_shape_from_config({"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
                                   "torch_dtype": "float32"})
    assert (mha.num_kv_heads, mha.head_dim, mha.dtype_bytes) == (12, 64, 4)
    mm = model_shape_from_config({"architectures": ["X"], "torch_dtype": "float16",
                                  "text_config": {"num_hidden_layers": 40, "num_attention_heads": 16,
                                                  "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3840}})
    assert (mm.num_layers, mm.num_kv_heads, mm.head_dim, mm.dtype_bytes) == (40, 8, 256, 2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_CONFIG))
    assert read_model_config(str(tmp_path)).num_layers == 32
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(KvBudgetError, match="not JSON"):
        read_model_config(str(tmp_path / "bad.json"))
    with pytest.raises(KvBudgetError, match="missing"):
        model_shape_from_config({"hidden_size": 10})
    with pytest.raises(KvBudgetError, match="cannot read"):
        read_model_config(str(tmp_path / "absent.json"))


FLAGS = ["kv-budget", "--gpu-memory-gib", "80", "--gpu-memory-utilization", "0.9", "--weights-gib", "16",
         "--overhead-gib", "2", "--block-size", "16"]
SHAPE = ["--num-layers", "32", "--num-kv-heads", "8", "--head-dim", "128", "--dtype-bytes", "2"]


def test_cli_human_and_json(tmp_path):
    r = CliRunner().invoke(fragscope_group, FLAGS + SHAPE + ["--max-seq-len", "2048"])
    assert r.exit_code == 0, r.output
    assert "27,648" in r.output and "442,368" in r.output and "216" in r.output
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3_CONFIG))
    r = CliRunner().invoke(fragscope_group, FLAGS + ["--model-config", str(cfg), "--max-seq-len", "2048",
                                                     "--avg-seq-len", "32", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["num_blocks"] == 27_648 and d["cached_tokens"] == 442_368 and d["max_concurrent_seqs"] == 216
    assert d["recommended_block_size"] == 16 and d["inputs"]["num_kv_heads"] == 8


@pytest.mark.parametrize("args,needle", [
    (FLAGS[:3], "missing --weights-gib"),
    (FLAGS + SHAPE[:-2], "missing --dtype-bytes"),
    (FLAGS[:-1] + ["abc"] + SHAPE, "'--block-size': 'abc' is not a valid integer"),
    (FLAGS[:-1] + ["16.5"] + SHAPE, "'--block-size': '16.5' is not a valid integer"),
    (["kv-budget", "--gpu-memory-gib", "eighty"], "'eighty' is not a size"),
    (["kv-budget", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["kv-budget", "--target-concurrency", "8"] + SHAPE, "needs both --target-concurrency and --target-len"),
    (["kv-budget", "--target-concurrency", "8", "--target-len", "100"] + SHAPE, "--weights-gib is required"),
    (FLAGS + SHAPE + ["--format", "xml"], "--format"),
    (["kv-budget", "--gpu-memory-gib", "8", "--weights-gib", "16"] + SHAPE, "no memory left"),
    (FLAGS + ["--model-config", "/nonexistent/config.json"], "cannot read"),
])
def test_cli_errors_are_one_line_exit_2(args, needle, monkeypatch, capsys):
    from fragscope.cli import run_and_exit

    monkeypatch.setattr(sys, "argv", ["fragscope", *args])
    with pytest.raises(SystemExit) as ex:
        run_and_exit(fragscope_group, "fragscope")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert ex.value.code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def test_block_waste_needs_no_gpu_and_explains():
    w = block_waste(64, 32)
    assert w["expected_waste_ratio"] == pytest.approx(63 / 127) and w["recommended_block_size"] == 16
    assert w["recommended_waste_ratio"] == pytest.approx(15 / 79)
    # the reason carries the arithmetic: (B - 1) / 2 = 31.5 empty tokens, 49.6 %, and the gain
    assert "31.5" in w["reason"] and "49.6 %" in w["reason"] and "19.0 %" in w["reason"]
    assert f"{(1 - 15 / 79) / (1 - 63 / 127):.2f}x" in w["reason"]
    assert "keep it" in block_waste(16, 32)["reason"]
    assert "optional" in block_waste(8, 1000)["reason"]  # bigger block suggested: bookkeeping, not memory
    b = kv_budget(**{**WORKED, "block_size": 64}, avg_seq_len=32)
    assert b.recommendation_reason == w["reason"]


def test_reverse_question_inverts_the_worked_example():
    r = kv_requirement(concurrency=216, seq_len=2048, block_size=16, weights_bytes=16 * GIB, overhead_bytes=2 * GIB,
                       gpu_memory_bytes=80 * GIB, **LLAMA3_8B)
    assert r.kv_cache_bytes == 54 * GIB and r.needed_bytes == 72 * GIB
    assert r.gpu_memory_utilization == 0.90 and r.fits  # exactly the forward example's 216 sequences at 0.9
    assert r.min_gpu_memory_bytes == pytest.approx(72 * GIB / 0.95)
    tp = {t["tensor_parallel_size"]: t for t in r.per_tp}
    assert tp[2]["needed_bytes"] == 8 * GIB + 2 * GIB + 27 * GIB  # weights and KV heads split in two
    assert tp[8]["kv_bytes_per_token"] == 2 * 32 * 1 * 128 * 2  # 8 KV heads over 8 GPUs: one each
    # block rounding: 2,049 tokens take 129 blocks of 16
    r2 = kv_requirement(concurrency=1, seq_len=2049, block_size=16, weights_bytes=0, **LLAMA3_8B)
    assert r2.tokens_per_seq == 2064 and r2.gpu_memory_utilization is None and r2.fits is None
    too_big = kv_requirement(concurrency=1000, seq_len=8192, block_size=16, weights_bytes=16 * GIB,
                             gpu_memory_bytes=80 * GIB, **LLAMA3_8B)
    # 1000 x 8192 tokens x 128 KiB = 1000 GiB of KV + 16 GiB of weights on 80 GiB: 12.70 of the GPU
    assert too_big.fits is False and too_big.gpu_memory_utilization == pytest.approx(1016 / 80)


def test_cli_sizes_waste_only_and_reverse():
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--gpu-memory-gib", "80GiB", "--weights-gib", "16384MiB",
                                             "--overhead-gib", "2GiB", "--block-size", "16", *SHAPE,
                                             "--max-seq-len", "2048"])
    assert r.exit_code == 0, r.output
    assert "27,648" in r.output and "216" in r.output
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--block-size", "64", "--avg-seq-len", "32"])
    assert r.exit_code == 0, r.output
    assert "49.6 %" in r.output and "recommended block size: 16" in r.output and "why:" in r.output
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--block-size", "64", "--avg-seq-len", "32",
                                             "--format", "json"])
    d = json.loads(r.output)
    assert d["mode"] == "block-waste" and d["recommended_block_size"] == 16
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--target-concurrency", "216", "--target-len", "2048",
                                             "--weights-gib", "16", "--overhead-gib", "2", "--gpu-memory-gib", "80",
                                             *SHAPE, "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["mode"] == "reverse" and d["gpu_memory_utilization"] == 0.9 and d["fits"] is True
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--target-concurrency", "216", "--target-len", "2048",
                                             "--weights-gib", "16", "--overhead-gib", "2", *SHAPE])
    assert "smallest GPU: 75.79 GiB" in r.output and "TP 2:" in r.output


def test_help_shows_option_types():
    r = CliRunner().invoke(fragscope_group, ["kv-budget", "--help"], terminal_width=200)
    assert r.exit_code == 0
    out = r.output
    assert "--gpu-memory-gib SIZE" in out and "--block-size INTEGER RANGE" in out
    assert "--format [human|json]" in out and " TEXT" not in out
