"""``fragscope kv-budget``: KV blocks that fit, block-size waste, and the reverse question (docs/kv-budget.md).

Three questions, chosen by the flags given:
- block-size waste alone: ``--block-size B --avg-seq-len L`` (no GPU figures needed);
- forward: GPU memory, utilization, weights and model shape -> blocks, tokens, concurrency;
- reverse: ``--target-concurrency N --target-len L`` -> the utilization (with ``--gpu-memory-gib``) and the
  smallest GPU, per tensor-parallel size.
"""
from __future__ import annotations

import json

import click

from ..kvbudget import GIB, KvBudgetError, block_waste, kv_budget, kv_requirement, read_model_config
from .common import GibSize, fail


SIZE = GibSize()  # one size type for every memory flag (cli/common.py): a bare number is GiB
POS_INT = click.IntRange(min=1)
FORMATS = click.Choice(["human", "json"])


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
        lines.extend(_waste_lines({"block_size": i["block_size"], "avg_seq_len": i["avg_seq_len"],
                                   "expected_waste_ratio": b.expected_waste_ratio,
                                   "recommended_block_size": b.recommended_block_size,
                                   "recommended_waste_ratio": b.recommended_waste_ratio,
                                   "reason": b.recommendation_reason}))
    return "\n".join(lines)


def _waste_lines(w: dict) -> list[str]:
    lines = [f"expected waste at {w['avg_seq_len']:g} tokens per sequence: {w['expected_waste_ratio'] * 100:.1f} % "
             f"of allocated KV (block size {w['block_size']})"]
    if w["recommended_block_size"] != w["block_size"]:
        lines.append(f"recommended block size: {w['recommended_block_size']} (expected waste "
                     f"{w['recommended_waste_ratio'] * 100:.1f} %; vLLM --block-size {w['recommended_block_size']})")
    else:
        lines.append(f"recommended block size: {w['recommended_block_size']} (the current one)")
    lines.append(f"why: {w['reason']}")
    return lines


def _reverse_human(r) -> str:
    lines = [f"target: {r.concurrency:,} sequences of {r.seq_len:,} tokens at once "
             f"(TP {r.tensor_parallel_size}, block {r.block_size})"]
    if r.gpu_memory_utilization is not None:
        verdict = "fits" if r.fits else f"does NOT fit (above {r.max_utilization:g})"
        lines.append(f"--gpu-memory-utilization {r.gpu_memory_utilization:.2f} on a {r.gpu_memory_bytes / GIB:g} GiB GPU: "
                     f"{verdict}")
    lines.append(f"smallest GPU: {r.min_gpu_memory_bytes / GIB:.2f} GiB per GPU at utilization {r.max_utilization:g}")
    lines.append("arithmetic:")
    lines.extend(f"  {n}. {s}" for n, s in enumerate(r.arithmetic, 1))
    lines.append("per tensor-parallel size (per GPU):")
    for t in r.per_tp:
        u = "" if t["gpu_memory_utilization"] is None else \
            f", utilization {t['gpu_memory_utilization']:.2f}{'' if t['fits'] else ' (does not fit)'}"
        lines.append(f"  TP {t['tensor_parallel_size']}: needs {t['needed_bytes'] / GIB:.2f} GiB (KV "
                     f"{t['kv_cache_bytes'] / GIB:.2f} GiB), smallest GPU {t['min_gpu_memory_bytes'] / GIB:.2f} GiB{u}")
    lines.append("limits: activations, CUDA graphs and non-torch memory are the --overhead-gib you give; prefix "
                 "sharing is not counted (it only lowers the need)")
    return "\n".join(lines)


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach ``fragscope kv-budget``."""

    @fragscope_group.command("kv-budget")
    @click.option("--gpu-memory-gib", type=SIZE, default=None, help="Memory of one GPU: GiB, or a size like 80GiB.")
    @click.option("--gpu-memory-utilization", type=click.FloatRange(min=0, max=1, min_open=True), default=0.9,
                  show_default=True, help="vLLM --gpu-memory-utilization.")
    @click.option("--weights-gib", type=SIZE, default=None,
                  help="Model weights: on this GPU (forward), or the whole model (reverse, split by TP).")
    @click.option("--overhead-gib", type=SIZE, default="0", show_default=True,
                  help="Activations, CUDA graphs and non-torch memory per GPU.")
    @click.option("--block-size", type=POS_INT, default=16, show_default=True, help="KV block size, tokens.")
    @click.option("--num-layers", type=POS_INT, default=None, help="Transformer layers (or --model-config).")
    @click.option("--num-kv-heads", type=POS_INT, default=None,
                  help="KV heads: on this GPU (forward), of the model (reverse) (or --model-config).")
    @click.option("--head-dim", type=POS_INT, default=None, help="Head dimension (or --model-config).")
    @click.option("--dtype-bytes", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="Bytes per KV element (bf16: 2, fp8: 1).")
    @click.option("--max-seq-len", type=POS_INT, default=None, help="Sequence length for max concurrency.")
    @click.option("--avg-seq-len", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="Average prompt + output tokens: block-size waste (needs no GPU figures).")
    @click.option("--target-concurrency", type=POS_INT, default=None, metavar="N",
                  help="Reverse question: N sequences at once ...")
    @click.option("--target-len", type=POS_INT, default=None, metavar="TOKENS",
                  help="... of this many tokens each: which utilization, which GPU.")
    @click.option("--tensor-parallel-size", type=POS_INT, default=1, show_default=True,
                  help="Reverse question: GPUs the model is split over.")
    @click.option("--model-config", type=click.Path(), default=None,
                  help="Hugging Face config.json (or its directory) for layers, KV heads, head dim, dtype.")
    @click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
    def kv_budget_cmd(gpu_memory_gib, gpu_memory_utilization, weights_gib, overhead_gib, block_size, num_layers,
                      num_kv_heads, head_dim, dtype_bytes, max_seq_len, avg_seq_len, target_concurrency, target_len,
                      tensor_parallel_size, model_config, fmt):
        """KV-cache blocks, concurrency, block-size waste, and the GPU a target needs (the paged-attention arithmetic of the vLLM paper (Kwon et al., SOSP 2023))."""
        doc, text = kv_budget_answer(gpu_memory_gib, gpu_memory_utilization, weights_gib, overhead_gib, block_size,
                                     num_layers, num_kv_heads, head_dim, dtype_bytes, max_seq_len, avg_seq_len,
                                     target_concurrency, target_len, tensor_parallel_size, model_config)
        click.echo(json.dumps(doc, indent=2, sort_keys=True) if fmt == "json" else text)


def kv_budget_answer(gpu_memory_gib=None, gpu_memory_utilization=0.9, weights_gib=None, overhead_gib=0.0,
                     block_size=16, num_layers=None, num_kv_heads=None, head_dim=None, dtype_bytes=None,
                     max_seq_len=None, avg_seq_len=None, target_concurrency=None, target_len=None,
                     tensor_parallel_size=1, model_config=None) -> tuple[dict, str]:
    """(JSON document, human text) of ``fragscope kv-budget``; sizes in bytes (the flags' SIZE type converts)."""
    gpu_bytes, weights_bytes, overhead_bytes = gpu_memory_gib, weights_gib, overhead_gib
    reverse = target_concurrency is not None or target_len is not None
    try:
        if reverse and (target_concurrency is None or target_len is None):
            fail("kv-budget: the reverse question needs both --target-concurrency and --target-len")
        if (not reverse and avg_seq_len is not None and gpu_bytes is None and weights_bytes is None
                and model_config is None and num_layers is None):
            w = block_waste(block_size, avg_seq_len)
            return {"mode": "block-waste", **w}, "\n".join(_waste_lines(w))
        weights_note = None
        shape = None
        if model_config:
            shape = read_model_config(model_config)
            num_layers = num_layers or shape.num_layers
            num_kv_heads = num_kv_heads or shape.num_kv_heads
            head_dim = head_dim or shape.head_dim
            dtype_bytes = dtype_bytes or shape.dtype_bytes
            if weights_bytes is None and shape.weights_bytes is not None:
                # forward: this GPU's share; reverse: the whole model (kv_requirement divides by the TP size)
                weights_bytes = shape.weights_bytes / (1 if reverse else tensor_parallel_size)
                weights_note = (f"weights estimated: {shape.weights_note}"
                                + (f", / {tensor_parallel_size} GPUs" if tensor_parallel_size > 1 and not reverse else "")
                                + "; give --weights-gib with vLLM's 'Model loading took N GiB' for the real figure")
        need = [("--weights-gib", weights_bytes), ("--num-layers", num_layers), ("--num-kv-heads", num_kv_heads),
                ("--head-dim", head_dim), ("--dtype-bytes", dtype_bytes)]
        if not reverse:
            need.insert(0, ("--gpu-memory-gib", gpu_bytes))
        missing = [f for f, v in need if v is None]
        if missing == ["--weights-gib"]:
            why = (f" ({shape.weights_note}, so {shape.source} cannot give it)" if shape is not None
                   and shape.weights_note else "")
            fail("kv-budget: --weights-gib is required: the model's weights on one GPU, in GiB (vLLM logs it at "
                 "start-up: 'Model loading took 14.99 GiB'; about parameters x bytes per parameter / tensor-parallel "
                 f"size){why}; e.g. --weights-gib 15")
        if missing:
            hint = "" if model_config else " (or --model-config config.json for the model shape)"
            if not reverse and avg_seq_len is None:
                hint += "; --block-size with --avg-seq-len alone gives the block-size waste"
            fail(f"kv-budget: missing {', '.join(missing)}{hint}")
        if reverse:
            r = kv_requirement(concurrency=target_concurrency, seq_len=target_len, block_size=block_size,
                               num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                               dtype_bytes=dtype_bytes, weights_bytes=weights_bytes, overhead_bytes=overhead_bytes,
                               gpu_memory_bytes=gpu_bytes, tensor_parallel_size=tensor_parallel_size)
            doc, text = {"mode": "reverse", **r.to_dict()}, _reverse_human(r)
            if weights_note:
                doc["weights_note"], text = weights_note, f"{text}\nnote: {weights_note}"
            return doc, text
        b = kv_budget(gpu_memory_bytes=gpu_bytes, gpu_memory_utilization=gpu_memory_utilization,
                      weights_bytes=weights_bytes, overhead_bytes=overhead_bytes, block_size=block_size,
                      num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      dtype_bytes=dtype_bytes, max_seq_len=max_seq_len, avg_seq_len=avg_seq_len)
    except KvBudgetError as e:
        fail(f"kv-budget: {e}")
    doc, text = b.to_dict(), _human(b)
    if weights_note:
        doc["weights_note"], text = weights_note, f"{text}\nnote: {weights_note}"
    return doc, text
