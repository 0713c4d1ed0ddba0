"""``fragscope kv-budget``: how many KV blocks fit, and how much the block size wastes (docs/kv-budget.md)."""
from __future__ import annotations

import json
import math

import click

from ..kvbudget import GIB, KvBudgetError, kv_budget, read_model_config
from .common import fail


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


def _human(b) -> str:
    i = b.inputs
    lines = [
        f"KV cache: {b.kv_cache_bytes / GIB:.2f} GiB = {i['gpu_memory_bytes'] / GIB:g} GiB × "
        f"{i['gpu_memory_utilization']:g} − weights {i['weights_bytes'] / GIB:g} GiB − overhead "
        f"{i['overhead_bytes'] / GIB:g} GiB",
        f"block: {i['block_size']} tokens × {i['num_layers']} layers × {i['num_kv_heads']} KV heads × head dim "
        f"{i['head_dim']} × {i['dtype_bytes']:g} B × 2 (K and V) = {b.bytes_per_block / 1024**2:g} MiB",
        f"blocks: {_fmt(b.num_blocks)}",
        f"cached tokens: {_fmt(b.cached_tokens)}",
    ]
    if b.max_concurrent_seqs is not None:
        lines.append(f"max concurrent sequences of {_fmt(i['max_seq_len'])} tokens: {_fmt(b.max_concurrent_seqs)}")
    if b.expected_waste_ratio is not None:
        lines.append(f"expected waste at {i['avg_seq_len']:g} tokens per sequence: "
                     f"{b.expected_waste_ratio * 100:.1f} % of allocated KV (block size {i['block_size']})")
        if b.recommended_block_size != i["block_size"]:
            lines.append(f"recommended block size: {b.recommended_block_size} "
                         f"(expected waste {b.recommended_waste_ratio * 100:.1f} %; vLLM --block-size "
                         f"{b.recommended_block_size})")
        else:
            lines.append(f"recommended block size: {b.recommended_block_size} (the current one)")
    return "\n".join(lines)


def _num(flag: str, raw: str | None, integer: bool = False, required: bool = False):
    """Parse one flag's value; a bad one is a one-line error naming the flag."""
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        fail(f"kv-budget: {flag} must be a number, got {raw!r}")
    if not math.isfinite(v) or v < 0 or (v == 0 and flag != "--overhead-gib" and flag != "--weights-gib"):
        fail(f"kv-budget: {flag} must be a positive finite number, got {raw!r}")
    if integer:
        if v != int(v):
            fail(f"kv-budget: {flag} must be a whole number, got {raw!r}")
        return int(v)
    return v


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach ``fragscope kv-budget``."""

    @fragscope_group.command("kv-budget")
    @click.option("--gpu-memory-gib", type=str, default=None, help="GPU memory per GPU, GiB (e.g. 80).")
    @click.option("--gpu-memory-utilization", type=str, default="0.9", show_default=True,
                  help="vLLM --gpu-memory-utilization.")
    @click.option("--weights-gib", type=str, default=None, help="Model weights on this GPU, GiB.")
    @click.option("--overhead-gib", type=str, default="0", show_default=True,
                  help="Activations, CUDA graphs and non-torch memory, GiB.")
    @click.option("--block-size", type=str, default="16", show_default=True, help="KV block size, tokens.")
    @click.option("--num-layers", type=str, default=None, help="Transformer layers (or --model-config).")
    @click.option("--num-kv-heads", type=str, default=None, help="KV heads on this GPU (or --model-config).")
    @click.option("--head-dim", type=str, default=None, help="Head dimension (or --model-config).")
    @click.option("--dtype-bytes", type=str, default=None, help="Bytes per KV element (bf16: 2, fp8: 1).")
    @click.option("--max-seq-len", type=str, default=None, help="Sequence length for max concurrency.")
    @click.option("--avg-seq-len", type=str, default=None, help="Average prompt + output tokens, for waste.")
    @click.option("--model-config", type=str, default=None,
                  help="Hugging Face config.json (or its directory) for layers, KV heads, head dim, dtype.")
    @click.option("--format", "fmt", type=str, default="human", show_default=True, help="human | json")
    def kv_budget_cmd(gpu_memory_gib, gpu_memory_utilization, weights_gib, overhead_gib, block_size, num_layers,
                      num_kv_heads, head_dim, dtype_bytes, max_seq_len, avg_seq_len, model_config, fmt):
        """KV-cache blocks, cached tokens, concurrency and block-size waste (seed 001's maths)."""
        if fmt not in ("human", "json"):
            fail(f"kv-budget: --format must be human or json, got {fmt!r}")
        gpu_memory_gib = _num("--gpu-memory-gib", gpu_memory_gib)
        gpu_memory_utilization = _num("--gpu-memory-utilization", gpu_memory_utilization)
        weights_gib = _num("--weights-gib", weights_gib)
        overhead_gib = _num("--overhead-gib", overhead_gib)
        block_size = _num("--block-size", block_size, integer=True)
        num_layers = _num("--num-layers", num_layers, integer=True)
        num_kv_heads = _num("--num-kv-heads", num_kv_heads, integer=True)
        head_dim = _num("--head-dim", head_dim, integer=True)
        dtype_bytes = _num("--dtype-bytes", dtype_bytes)
        max_seq_len = _num("--max-seq-len", max_seq_len, integer=True)
        avg_seq_len = _num("--avg-seq-len", avg_seq_len)
        try:
            if model_config:
                shape = read_model_config(model_config)
                num_layers = num_layers or shape.num_layers
                num_kv_heads = num_kv_heads or shape.num_kv_heads
                head_dim = head_dim or shape.head_dim
                dtype_bytes = dtype_bytes or shape.dtype_bytes
            missing = [f for f, v in (("--gpu-memory-gib", gpu_memory_gib), ("--weights-gib", weights_gib),
                                      ("--num-layers", num_layers), ("--num-kv-heads", num_kv_heads),
                                      ("--head-dim", head_dim), ("--dtype-bytes", dtype_bytes)) if v is None]
            if missing:
                hint = "" if model_config else " (or --model-config config.json for the model shape)"
                fail(f"kv-budget: missing {', '.join(missing)}{hint}")
            b = kv_budget(gpu_memory_bytes=gpu_memory_gib * GIB, gpu_memory_utilization=gpu_memory_utilization,
                          weights_bytes=weights_gib * GIB, overhead_bytes=overhead_gib * GIB,
                          block_size=block_size, num_layers=num_layers, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, dtype_bytes=dtype_bytes, max_seq_len=max_seq_len,
                          avg_seq_len=avg_seq_len)
        except KvBudgetError as e:
            fail(f"kv-budget: {e}")
            return
        if fmt == "json":
            click.echo(json.dumps(b.to_dict(), indent=2, sort_keys=True))
        else:
            click.echo(_human(b))
