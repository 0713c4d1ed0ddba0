"""KV budget maths (seed 001) and the ``fragscope kv-budget`` command."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fragscope.cli import fragscope_group
from fragscope.kvbudget import (GIB, KvBudgetError, expected_waste_ratio, kv_budget, model_shape_from_config,
                                read_model_config, recommend_block_size)

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
    assert expected_waste_ratio(64, 32) == pytest.approx(63 / 127)
    assert 0.45 < expected_waste_ratio(64, 32) < 0.55
    assert expected_waste_ratio(16, 2048) < 0.004
    assert recommend_block_size(32) == 16
    assert recommend_block_size(20) == 8
    assert recommend_block_size(100) == 64  # target 50: nearer 64 than 32 on a log scale
    assert recommend_block_size(10_000) == 128
    b = kv_budget(**{**WORKED, "block_size": 64}, avg_seq_len=32)
    assert b.recommended_block_size == 16 and b.recommended_waste_ratio < b.expected_waste_ratio / 2


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


def run_cli(*args):
    code = "from fragscope.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("args,needle", [
    (FLAGS[:3], "missing --weights-gib"),
    (FLAGS + SHAPE[:-2], "missing --dtype-bytes"),
    (FLAGS[:-1] + ["abc"] + SHAPE, "--block-size must be a number"),
    (FLAGS[:-1] + ["16.5"] + SHAPE, "whole number"),
    (FLAGS + SHAPE + ["--format", "xml"], "--format"),
    (["kv-budget", "--gpu-memory-gib", "8", "--weights-gib", "16"] + SHAPE, "no memory left"),
    (FLAGS + ["--model-config", "/nonexistent/config.json"], "cannot read"),
])
def test_cli_errors_are_one_line_exit_2(args, needle):
    p = run_cli(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr
