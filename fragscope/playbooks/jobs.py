"""The knobs of each kind of job, so that an action names a setting of the program that produced the evidence.

One table; the kinds are collectors/enginelog/jobkind.py's. Flag names are each program's own (vLLM and
SGLang `--help`, TGI's launcher arguments, TensorRT-LLM's KvCacheConfig / trtllm-serve, Triton's
config.pbtxt, ComfyUI's command line). ``unknown`` says that it is unknown and names both families.
"""
from __future__ import annotations

KNOBS: dict[str, dict] = {
    "vllm": {"name": "vLLM", "memory": "--gpu-memory-utilization", "serving": True,
             "load": "--max-num-seqs / --max-num-batched-tokens", "length": "--max-model-len"},
    "sglang": {"name": "SGLang", "memory": "--mem-fraction-static", "serving": True,
               "load": "--max-running-requests / --chunked-prefill-size", "length": "--context-length"},
    "tgi": {"name": "TGI (text-generation-inference)", "memory": "--cuda-memory-fraction", "serving": True,
            "load": "--max-batch-total-tokens / --max-batch-prefill-tokens / --max-concurrent-requests",
            "length": "--max-total-tokens / --max-input-tokens"},
    "triton": {"name": "Triton Inference Server", "memory": "the backend's memory setting in config.pbtxt (TensorRT-LLM "
               "backend: kv_cache_free_gpu_mem_fraction)", "serving": True,
               "load": "max_batch_size / dynamic_batching in config.pbtxt, instance_group count", "length": None},
    "trtllm": {"name": "TensorRT-LLM", "memory": "KvCacheConfig free_gpu_memory_fraction "
               "(trtllm-serve --kv_cache_free_gpu_memory_fraction)", "serving": True,
               "load": "max_batch_size / max_num_tokens", "length": "max_seq_len"},
    "training": {"name": "a training loop", "memory": None, "serving": False,
                 "load": "the per-device batch size (gradient accumulation keeps the effective batch)",
                 "length": "the sequence length / input size",
                 "extra": "activation checkpointing, mixed precision (bf16/fp16), a sharded optimizer"},
    "desktop": {"name": "a desktop application (ComfyUI or alike)", "memory": None, "serving": False,
                "load": "the batch size / resolution of the workflow",
                "length": None, "extra": "its low-memory mode (ComfyUI: --lowvram, --reserve-vram)"},
    "unknown": {"name": "an unknown program", "memory": None, "serving": False,
                "load": "the batch size (a serving engine: its concurrency limit, e.g. vLLM --max-num-seqs, "
                        "SGLang --max-running-requests, TGI --max-batch-total-tokens)",
                "length": "the sequence length (a serving engine: its context-length limit)"},
}


def kind_of(ctx: dict) -> str | None:
    """The job kind a finding's context names (None: not told, e.g. a metrics window)."""
    k = (ctx or {}).get("job_kind")
    return k if k in KNOBS else None


def unknown_note() -> str:
    return ("This log shows no serving engine's own lines, so what produced it is unknown (a training loop, a "
            "notebook or a desktop application print the same PyTorch message): the knobs below are the program's "
            "own; engine flags apply only if a serving engine produced it.")


def reduce_need(kind: str) -> str:
    """'Need less memory at the failing step', in the knobs of ``kind``."""
    k = KNOBS[kind]
    parts = [f"lower {k['load']}"]
    if k.get("length"):
        parts.append(f"shorten {k['length']}")
    if k.get("extra"):
        parts.append(k["extra"])
    return f"{k['name']}: " + "; ".join(parts) + "."


def restart(kind: str) -> str:
    """How to clear a fragmented pool for ``kind``: serving engines restart one replica at a time; other programs
    restart the run (or the process between jobs)."""
    if KNOBS[kind]["serving"]:
        return f"Restart the {KNOBS[kind]['name']} server one replica at a time: fragmentation clears only when the process releases its segments."
    return ("Restart the program (or, in a long run, free cached blocks between phases with torch.cuda.empty_cache()): "
            "fragmentation clears only when the process releases its segments.")
