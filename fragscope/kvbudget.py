"""KV-cache budget maths (paged attention, vLLM paper: Kwon et al., SOSP 2023): how many paged-attention blocks fit, and how much they waste.

Pure functions over numbers; no I/O except :func:`read_model_config`, which reads a Hugging Face
``config.json``. Documented in docs/kv-budget.md.

    blocks = floor((gpu_memory × gpu_memory_utilization − weights − overhead)
                   / (2 × block_size × layers × kv_heads × head_dim × dtype_bytes))

The factor 2 is one K and one V tensor per layer (vLLM ``get_cache_block_size``). Per-GPU figures: with
tensor parallelism pass this GPU's share of the weights and of the KV heads.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from .units import GiB as GIB  # one source for byte multiples (fragscope.units)

# Block sizes fragscope recommends: those vLLM supports on CUDA. vLLM's --block-size parser accepts
# 1, 8, 16, 32, 64, 128 and 256 (VLLM_BLOCK_SIZE_CHOICES), but its CacheConfig says "On CUDA devices,
# only block sizes up to 32 are supported" (vllm/config/cache.py, CacheConfig.block_size; the same words
# in `vllm serve --help` and the engine-arguments docs since 0.6). 64-256 are for other platforms (HPU's
# default is 128). 1 is left out: it multiplies block-table overhead.
VLLM_BLOCK_SIZES: tuple[int, ...] = (8, 16, 32)
VLLM_BLOCK_SIZE_CHOICES: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)

# torch_dtype names in config.json -> bytes per element.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}


class KvBudgetError(ValueError):
    """Bad input; the message is one line naming the value and the fix."""


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache size depends on, as read from a model config."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: float | None  # None when the config names no dtype
    source: str = ""
    weights_bytes: float | None = None  # a dense decoder's parameters x dtype bytes; None: not estimable
    weights_note: str = ""  # how weights_bytes was estimated, or why it could not be


@dataclass
class KvBudget:
    num_blocks: int
    bytes_per_block: int
    cached_tokens: int  # num_blocks × block_size
    kv_cache_bytes: int  # bytes available to the KV cache before rounding to whole blocks
    max_concurrent_seqs: int | None  # sequences of max_seq_len that fit at once (None: no max_seq_len)
    expected_waste_ratio: float | None  # internal fragmentation of the last block (None: no avg_seq_len)
    recommended_block_size: int | None  # near avg_seq_len / 2, snapped to VLLM_BLOCK_SIZES
    recommended_waste_ratio: float | None  # expected waste at the recommended block size
    inputs: dict = field(default_factory=dict)
    recommendation_reason: str | None = None  # the arithmetic behind recommended_block_size (None: no avg_seq_len)

    def to_dict(self) -> dict:
        return asdict(self)


def expected_waste_ratio(block_size: int, avg_seq_len: float) -> float:
    """Expected unused share of a sequence's KV blocks: (B − 1) / (2 × L + B − 1).

    The last block of a sequence of L tokens is on average (B − 1) / 2 tokens short (uniform remainder),
    so the waste is that over the allocated L + (B − 1) / 2 tokens. E.g. L = 32, B = 64 → 0.496.
    """
    if block_size <= 0 or avg_seq_len <= 0:
        raise KvBudgetError("block_size and avg_seq_len must be positive")
    return (block_size - 1) / (2.0 * avg_seq_len + block_size - 1)


def recommend_block_size(avg_seq_len: float, choices: tuple[int, ...] = VLLM_BLOCK_SIZES) -> int:
    """The supported block size nearest avg_seq_len / 2 (on a log scale; ties go to the smaller)."""
    if avg_seq_len <= 0:
        raise KvBudgetError("avg_seq_len must be positive")
    target = avg_seq_len / 2.0
    return min(choices, key=lambda b: (abs(math.log2(b) - math.log2(max(target, 1e-9))), b))


def _positive(name: str, value, integer: bool = False) -> None:
    if value is None:
        raise KvBudgetError(f"--{name.replace('_', '-')} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KvBudgetError(f"--{name.replace('_', '-')} must be a finite number, got {value!r}")
    if value <= 0:
        raise KvBudgetError(f"--{name.replace('_', '-')} must be positive, got {value!r}")
    if integer and int(value) != value:
        raise KvBudgetError(f"--{name.replace('_', '-')} must be a whole number, got {value!r}")


def kv_budget(*, gpu_memory_bytes: float, gpu_memory_utilization: float, weights_bytes: float,
              overhead_bytes: float, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
              dtype_bytes: float, max_seq_len: int | None = None, avg_seq_len: float | None = None) -> KvBudget:
    """Blocks, cached tokens, concurrency and waste for one GPU's KV cache (the paged-attention arithmetic of the vLLM paper (Kwon et al., SOSP 2023))."""
    _positive("gpu_memory_bytes", gpu_memory_bytes)
    _positive("gpu_memory_utilization", gpu_memory_utilization)
    if gpu_memory_utilization > 1:
        raise KvBudgetError(f"--gpu-memory-utilization is a fraction in (0, 1], got {gpu_memory_utilization!r}")
    for name, v in (("weights_bytes", weights_bytes), ("overhead_bytes", overhead_bytes)):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise KvBudgetError(f"--{name.replace('_bytes', '').replace('_', '-')} must be a number ≥ 0, got {v!r}")
    for name, v in (("block_size", block_size), ("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                    ("head_dim", head_dim)):
        _positive(name, v, integer=True)
    _positive("dtype_bytes", dtype_bytes)
    if max_seq_len is not None:
        _positive("max_seq_len", max_seq_len, integer=True)
    if avg_seq_len is not None:
        _positive("avg_seq_len", avg_seq_len)

    block_size, num_layers, num_kv_heads, head_dim = int(block_size), int(num_layers), int(num_kv_heads), int(head_dim)
    bytes_per_block = 2 * block_size * num_layers * num_kv_heads * head_dim * dtype_bytes
    available = gpu_memory_bytes * gpu_memory_utilization - weights_bytes - overhead_bytes
    if available <= 0:
        raise KvBudgetError(
            f"no memory left for the KV cache: {gpu_memory_bytes / GIB:.2f} GiB × {gpu_memory_utilization} "
            f"− weights {weights_bytes / GIB:.2f} GiB − overhead {overhead_bytes / GIB:.2f} GiB = "
            f"{available / GIB:.2f} GiB; raise --gpu-memory-utilization or use more GPUs (tensor parallelism)")
    num_blocks = int(math.floor(available / bytes_per_block))
    cached_tokens = num_blocks * block_size
    max_conc = None
    if max_seq_len is not None:
        max_conc = num_blocks // math.ceil(max_seq_len / block_size)
    waste = rec = rec_waste = None
    reason = None
    if avg_seq_len is not None:
        bw = block_waste(block_size, avg_seq_len)
        waste, rec, rec_waste, reason = (bw["expected_waste_ratio"], bw["recommended_block_size"],
                                         bw["recommended_waste_ratio"], bw["reason"])
    inputs = dict(gpu_memory_bytes=gpu_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
                  weights_bytes=weights_bytes, overhead_bytes=overhead_bytes, block_size=block_size,
                  num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes,
                  max_seq_len=max_seq_len, avg_seq_len=avg_seq_len)
    bpb = int(bytes_per_block) if float(bytes_per_block).is_integer() else bytes_per_block
    return KvBudget(num_blocks=num_blocks, bytes_per_block=bpb, cached_tokens=cached_tokens,
                    kv_cache_bytes=int(available), max_concurrent_seqs=max_conc, expected_waste_ratio=waste,
                    recommended_block_size=rec, recommended_waste_ratio=rec_waste, inputs=inputs,
                    recommendation_reason=reason)


def _dtype_bytes(v) -> float | None:
    if v is None:
        return None
    key = str(v).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise KvBudgetError(f"unknown torch_dtype {v!r} in the model config; pass --dtype-bytes")
    return float(DTYPE_BYTES[key])


def model_shape_from_config(cfg: dict, source: str = "config.json") -> ModelShape:
    """Layers, KV heads, head dim and dtype from a Hugging Face config dict (``text_config`` for multimodal)."""
    if not isinstance(cfg, dict):
        raise KvBudgetError(f"{source}: expected a JSON object")
    outer = cfg
    for nested in ("text_config", "llm_config", "language_config"):
        if isinstance(cfg.get(nested), dict) and "num_hidden_layers" not in cfg:
            cfg = cfg[nested]
            break

    def get(*names):
        for n in names:
            v = cfg.get(n)
            if v is not None:
                return v
        return None

    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    kv_heads = get("num_key_value_heads", "num_kv_heads", "n_head_kv")
    if kv_heads is None and cfg.get("multi_query"):
        kv_heads = 1
    kv_heads = kv_heads if kv_heads is not None else heads
    head_dim = get("head_dim")
    hidden = get("hidden_size", "n_embd")
    if head_dim is None and hidden is not None and heads:
        head_dim = hidden / heads
    missing = [n for n, v in (("num_hidden_layers", layers), ("num_key_value_heads/num_attention_heads", kv_heads),
                              ("head_dim/hidden_size", head_dim)) if v is None]
    if missing:
        raise KvBudgetError(f"{source}: missing {', '.join(missing)}; pass --num-layers/--num-kv-heads/--head-dim")
    for n, v in (("num_hidden_layers", layers), ("num_key_value_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or int(v) != v:
            raise KvBudgetError(f"{source}: {n} must be a positive whole number, got {v!r}")
    dtype = cfg.get("torch_dtype", cfg.get("dtype", outer.get("torch_dtype", outer.get("dtype"))))
    dbytes = _dtype_bytes(dtype)
    params, note = dense_parameters(cfg, outer, int(layers), int(heads or 0), int(kv_heads), int(head_dim))
    weights = params * dbytes if params is not None and dbytes else None
    if params is not None and not dbytes:
        weights, note = None, "the config names no dtype"
    elif weights is not None:
        note = (f"{params / 1e9:.2f} B parameters (dense decoder: embeddings, attention, gated MLP, norms) "
                f"x {dbytes:g} bytes = {weights / GIB:.2f} GiB, from {source}")
    return ModelShape(int(layers), int(kv_heads), int(head_dim), dbytes, source, weights, note)


def dense_parameters(cfg: dict, outer: dict, layers: int, heads: int, kv_heads: int,
                     head_dim: int) -> tuple[float | None, str]:
    """Parameters of a dense decoder-only model (Llama, Mistral, Qwen2 shapes: q/k/v/o projections,
    a gated MLP of three matrices, two norms a layer, input embeddings and an LM head unless tied), or
    (None, why) when the config is another kind (mixture of experts, quantized, fields missing).
    Meta-Llama-3-8B: 8.03 B, its model card's figure."""
    if any(k in cfg or k in outer for k in ("quantization_config", "num_local_experts", "n_routed_experts",
                                             "num_experts", "moe_intermediate_size")):
        return None, "a quantized or mixture-of-experts model: parameters x dtype does not give its weights"
    need = {k: cfg.get(k) for k in ("hidden_size", "intermediate_size", "vocab_size")}
    bad = [k for k, v in need.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0]
    if bad or heads <= 0:
        return None, f"the config has no {', '.join(bad) or 'num_attention_heads'}"
    hidden, inter, vocab = float(need["hidden_size"]), float(need["intermediate_size"]), float(need["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", outer.get("tie_word_embeddings", False)))
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    per_layer = attn + 3 * hidden * inter + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden, ""


def read_model_config(path: str) -> ModelShape:
    """Read a Hugging Face ``config.json`` (a file, or a model directory holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    from .collectors.inputs import InputError, read_bytes
    from .units import load_json_checked

    try:
        raw = read_bytes(path, 16 * 1024 * 1024, "model config.json")
    except InputError as e:
        raise KvBudgetError(f"cannot read {e}") from None
    try:
        cfg = load_json_checked(raw.decode("utf-8"))
    except json.JSONDecodeError as e:
        raise KvBudgetError(f"{path}: not JSON ({str(e).splitlines()[0][:120]})") from None
    except (UnicodeDecodeError, ValueError) as e:  # not UTF-8; NaN, 1e400, huge integers, nesting too deep
        raise KvBudgetError(f"{path}: not a usable config.json ({str(e).splitlines()[0][:120]})") from None
    return model_shape_from_config(cfg, source=path)


# ---------------------------------------------------------------------------------------------
# Block-size waste alone (no GPU parameters), with the reason for the recommendation
def block_waste(block_size: int, avg_seq_len: float, choices: tuple[int, ...] = VLLM_BLOCK_SIZES) -> dict:
    """Waste at ``block_size``, the recommended block size, and why, for sequences of ``avg_seq_len`` tokens.

    Needs no GPU figures: the waste is a ratio of tokens. The returned ``reason`` states the arithmetic.
    """
    _positive("block_size", block_size, integer=True)
    _positive("avg_seq_len", avg_seq_len)
    block_size = int(block_size)
    waste = expected_waste_ratio(block_size, avg_seq_len)
    rec = recommend_block_size(avg_seq_len, choices)
    rec_waste = expected_waste_ratio(rec, avg_seq_len)
    empty = (block_size - 1) / 2.0
    reason = (f"each sequence's last block is on average (B - 1) / 2 = {empty:g} tokens empty: at {avg_seq_len:g} "
              f"tokens per sequence block {block_size} wastes {empty:g} / ({avg_seq_len:g} + {empty:g}) = "
              f"{waste * 100:.1f} % of the KV memory it allocates")
    if rec < block_size:
        reason += (f"; block {rec} (of the sizes vLLM supports on CUDA, {', '.join(map(str, choices))}, the one "
                   f"nearest avg / 2 = {avg_seq_len / 2:g} tokens) wastes "
                   f"{rec_waste * 100:.1f} %, so the same pool holds {(1 - rec_waste) / (1 - waste):.2f}x the tokens")
    elif rec > block_size:
        reason += (f"; block {rec} (of the sizes vLLM supports on CUDA, {', '.join(map(str, choices))}, the one "
                   f"nearest avg / 2 = {avg_seq_len / 2:g}) would waste "
                   f"{rec_waste * 100:.1f} % with fewer blocks per sequence (shorter block tables); the gain is "
                   f"bookkeeping, not memory: a change is optional")
    else:
        reason += (f"; it is already the size nearest avg / 2 among those vLLM supports on CUDA "
                   f"({', '.join(map(str, choices))}): keep it")
    if block_size > max(choices):
        reason += (f"; note: vLLM supports block sizes up to {max(choices)} on CUDA (its CacheConfig), so "
                   f"--block-size {block_size} runs only on other platforms")
    return {"block_size": block_size, "avg_seq_len": avg_seq_len, "expected_waste_ratio": waste,
            "recommended_block_size": rec, "recommended_waste_ratio": rec_waste, "reason": reason}


# ---------------------------------------------------------------------------------------------
# The reverse question: N concurrent sequences of L tokens -> which utilization, which GPU memory
@dataclass
class KvRequirement:
    concurrency: int
    seq_len: int
    block_size: int
    tokens_per_seq: int  # whole blocks
    kv_bytes_per_token: float  # per GPU, for the tensor-parallel size below
    kv_cache_bytes: float  # KV the target needs on one GPU
    tensor_parallel_size: int
    weights_bytes: float  # on one GPU
    overhead_bytes: float
    needed_bytes: float  # weights + overhead + KV, one GPU
    gpu_memory_bytes: float | None
    gpu_memory_utilization: float | None  # the utilization that holds the target on that GPU (None: no GPU given)
    fits: bool | None  # the utilization is <= max_utilization
    max_utilization: float
    min_gpu_memory_bytes: float  # smallest GPU that holds it at max_utilization
    per_tp: list[dict] = field(default_factory=list)  # the same for TP 1, 2, 4, 8
    arithmetic: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: float, tp: int = 1) -> float:
    """K and V for one token on one GPU. With TP > KV heads vLLM replicates heads: each GPU keeps at least one."""
    heads = max(1, num_kv_heads // tp) if num_kv_heads >= tp else 1
    return 2.0 * num_layers * heads * head_dim * dtype_bytes


def kv_requirement(*, concurrency: int, seq_len: int, block_size: int, num_layers: int, num_kv_heads: int,
                   head_dim: int, dtype_bytes: float, weights_bytes: float, overhead_bytes: float = 0.0,
                   gpu_memory_bytes: float | None = None, tensor_parallel_size: int = 1,
                   max_utilization: float = 0.95) -> KvRequirement:
    """What it takes to keep ``concurrency`` sequences of ``seq_len`` tokens in the KV cache at once.

    ``weights_bytes`` is the whole model's weights (divided by the TP size per GPU). The utilization is
    rounded *up* to 0.01; ``max_utilization`` (default 0.95) keeps room for CUDA graphs and the allocator
    outside the budget (docs/sizing.md). Block rounding is included: each sequence takes whole blocks.
    """
    for name, v in (("concurrency", concurrency), ("seq_len", seq_len), ("block_size", block_size),
                    ("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                    ("tensor_parallel_size", tensor_parallel_size)):
        _positive(name, v, integer=True)
    _positive("dtype_bytes", dtype_bytes)
    for name, v in (("weights_bytes", weights_bytes), ("overhead_bytes", overhead_bytes)):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise KvBudgetError(f"--{name.replace('_bytes', '').replace('_', '-')} must be a number ≥ 0, got {v!r}")
    if gpu_memory_bytes is not None:
        _positive("gpu_memory_bytes", gpu_memory_bytes)
    if not 0 < max_utilization <= 1:
        raise KvBudgetError(f"max utilization is a fraction in (0, 1], got {max_utilization!r}")

    def one(tp: int) -> dict:
        per_seq = int(math.ceil(seq_len / block_size) * block_size)
        bpt = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes, tp)
        kv = concurrency * per_seq * bpt
        need = weights_bytes / tp + overhead_bytes + kv
        util = None
        if gpu_memory_bytes:
            util = math.ceil(need / gpu_memory_bytes * 100 - 1e-9) / 100
        return {"tensor_parallel_size": tp, "kv_bytes_per_token": bpt, "kv_cache_bytes": kv, "needed_bytes": need,
                "gpu_memory_utilization": util, "fits": None if util is None else util <= max_utilization,
                "min_gpu_memory_bytes": need / max_utilization}

    r = one(int(tensor_parallel_size))
    per_seq = int(math.ceil(seq_len / block_size) * block_size)
    A = [f"tokens per sequence = ceil({seq_len} / {block_size}) x {block_size} = {per_seq:,}",
         f"KV bytes per token = 2 x {num_layers} layers x {max(1, num_kv_heads // tensor_parallel_size)} KV heads"
         f"{' (on this GPU)' if tensor_parallel_size > 1 else ''} x {head_dim} x {dtype_bytes:g} B = "
         f"{r['kv_bytes_per_token']:,.0f} B",
         f"KV = {concurrency:,} x {per_seq:,} x {r['kv_bytes_per_token']:,.0f} B = {r['kv_cache_bytes'] / GIB:.2f} GiB",
         f"needed = weights {weights_bytes / GIB:.2f} GiB / TP {tensor_parallel_size} + overhead "
         f"{overhead_bytes / GIB:.2f} GiB + KV = {r['needed_bytes'] / GIB:.2f} GiB per GPU"]
    if gpu_memory_bytes:
        A.append(f"utilization = {r['needed_bytes'] / GIB:.2f} GiB / {gpu_memory_bytes / GIB:.2f} GiB = "
                 f"{r['needed_bytes'] / gpu_memory_bytes:.4f} -> {r['gpu_memory_utilization']:.2f}"
                 + ("" if r["fits"] else f" > {max_utilization:g}: does not fit this GPU"))
    A.append(f"smallest GPU = needed / {max_utilization:g} = {r['min_gpu_memory_bytes'] / GIB:.2f} GiB")
    return KvRequirement(concurrency=int(concurrency), seq_len=int(seq_len), block_size=int(block_size),
                         tokens_per_seq=per_seq, kv_bytes_per_token=r["kv_bytes_per_token"],
                         kv_cache_bytes=r["kv_cache_bytes"], tensor_parallel_size=int(tensor_parallel_size),
                         weights_bytes=float(weights_bytes), overhead_bytes=float(overhead_bytes),
                         needed_bytes=r["needed_bytes"], gpu_memory_bytes=gpu_memory_bytes,
                         gpu_memory_utilization=r["gpu_memory_utilization"], fits=r["fits"],
                         max_utilization=max_utilization, min_gpu_memory_bytes=r["min_gpu_memory_bytes"],
                         per_tp=[one(tp) for tp in (1, 2, 4, 8)], arithmetic=A)
