"""kv-budget: the README's command runs as written; weights from a dense model's config.json, or an error
saying exactly what is needed; block sizes recommended only among those vLLM supports on CUDA (up to 32:
vLLM's CacheConfig, "On CUDA devices, only block sizes up to 32 are supported")."""
from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from fragscope.kvbudget import (GIB, VLLM_BLOCK_SIZES, block_waste, model_shape_from_config,
                                recommend_block_size)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "llama-3-8b-config.json")


def _run(capsys, args):
    from fragscope.cli import cli_exit_code, fragscope_group

    capsys.readouterr()
    rc = cli_exit_code(fragscope_group, "fragscope", args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_readme_kv_budget_line_runs_as_written(capsys, monkeypatch):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"`(fragscope kv-budget [^`]+)`", text)
    assert m and "..." not in m.group(1), "the README's kv-budget command must be complete"
    monkeypatch.chdir(ROOT)
    args = shlex.split(m.group(1))[1:]
    rc, out, err = _run(capsys, args)
    assert rc == 0, err
    assert "KV cache:" in out and "weights estimated" in out and "blocks:" in out


def test_weights_from_a_dense_config():
    with open(CONFIG) as fh:
        cfg = json.load(fh)
    s = model_shape_from_config(cfg)
    params = s.weights_bytes / 2
    assert params == pytest.approx(8.03e9, rel=2e-3)  # Meta-Llama-3-8B: 8.03 B parameters
    assert s.weights_bytes / GIB == pytest.approx(14.96, abs=0.01)  # vLLM logs "Model loading took 14.99 GiB"
    tied = model_shape_from_config({**cfg, "tie_word_embeddings": True})
    assert s.weights_bytes - tied.weights_bytes == pytest.approx(128256 * 4096 * 2)  # one embedding matrix fewer


@pytest.mark.parametrize("extra,why", [
    ({"num_local_experts": 8}, "mixture-of-experts"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantized"),
    ({"intermediate_size": None}, "intermediate_size"),
])
def test_no_weights_estimate_says_why(capsys, tmp_path, extra, why):
    with open(CONFIG) as fh:
        cfg = {k: v for k, v in {**json.load(fh), **extra}.items() if v is not None}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, out, err = _run(capsys, ["kv-budget", "--model-config", str(p), "--gpu-memory-gib", "80"])
    assert rc == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "--weights-gib is required" in line and why in line
    assert "Model loading took" in line  # where to read the figure


def test_tensor_parallel_share_of_estimated_weights(capsys):
    rc, out, err = _run(capsys, ["kv-budget", "--model-config", CONFIG, "--gpu-memory-gib", "80",
                                 "--tensor-parallel-size", "2", "--format", "json"])
    d = json.loads(out)
    assert rc == 0 and d["inputs"]["weights_bytes"] / GIB == pytest.approx(14.96 / 2, abs=0.01)
    assert "/ 2 GPUs" in d["weights_note"]


def test_block_sizes_recommended_are_cuda_ones():
    assert max(VLLM_BLOCK_SIZES) == 32
    assert all(recommend_block_size(n) <= 32 for n in (1, 50, 600, 2000, 10_000, 1e6))
    w = block_waste(128, 4000)
    assert w["recommended_block_size"] == 32
    assert "up to 32 on CUDA" in w["reason"]
