"""What kind of job produced a log: a serving engine (vLLM, SGLang, TGI, Triton, TensorRT-LLM), a training loop,
a desktop application, or unknown. Pure. docs/logs.md#job-kind.

A PyTorch OOM message reads the same from every program, so advice that names an engine's flag needs the
engine's own lines. Each kind is told by text only its software prints (its logger names, its module paths);
vLLM and SGLang by the parser's own line shapes (events' ``source``). Nothing is guessed from the OOM itself.
"""
from __future__ import annotations

import re

# kind -> substrings only that software prints (logger / module names, its server binary)
MARKERS: dict[str, tuple[str, ...]] = {
    "tgi": ("text_generation_launcher", "text_generation_router", "text_generation_client",
            "text_generation_server", "text-generation-launcher"),
    "triton": ("tritonserver", "TRITONBACKEND_", "triton_python_backend", "model_repository_manager"),
    "trtllm": ("tensorrt_llm", "[TRT-LLM]"),
    "vllm": ("vllm/engine/", "vllm/v1/", "vllm.entrypoints", "vllm/worker/", "RayWorkerVllm"),
    "sglang": ("sglang/srt/", "sglang.launch_server"),
    # a traceback through autograd or an optimizer step: a training loop
    "training": ("torch/autograd/", ".backward(", "optimizer.step(", "training_step", "/trainer.py"),
    "desktop": ("ComfyUI", "comfy/", "stable-diffusion-webui"),
}
# kind -> path fragments of its Python modules, as stack frames name them (a memory snapshot's ``frames``:
# ``filename`` with "/" separators). A training loop by what only training runs: backward, optimizer steps and
# trainers (torch.no_grad / inference_mode wrappers live in torch/autograd/ too, so that folder alone says nothing).
FRAME_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("/vllm/",),
    "sglang": ("/sglang/",),
    "tgi": ("/text_generation_server/",),
    "trtllm": ("/tensorrt_llm/",),
    "triton": ("/tritonserver/", "/triton_python_backend_utils"),
    "training": ("/torch/optim/", "/transformers/trainer.py", "/trl/trainer/", "/lightning/pytorch/trainer/",
                 "/pytorch_lightning/trainer/", "/accelerate/accelerator.py"),
    "desktop": ("/comfy/", "/ComfyUI/", "/stable-diffusion-webui/"),
}
BACKWARD_FRAMES = ("backward", "_engine_run_backward", "run_backward")  # function names under torch/ only training runs
# kind -> the prefix of its own metric names (a metrics window's signal sources: fragscope/signals.py)
METRIC_PREFIXES: dict[str, str] = {"vllm": "vllm:", "sglang": "sglang:", "tgi": "tgi_", "trtllm": "nv_trt_llm_",
                                   "triton": "nv_inference_"}
SERVING = ("vllm", "sglang", "tgi", "triton", "trtllm")
KINDS = SERVING + ("training", "desktop", "unknown")
# Lines looked at: the head of the log (a server's own logger names are on every line it prints) and the
# lines of tracebacks and errors (module paths); the rest (stats lines, progress bars) is not scanned.
HEAD_LINES = 500

_ANY_MARKER = re.compile("|".join(re.escape(m) for marks in MARKERS.values() for m in marks))


def note_markers(line: str, seen: set[str], line_no: int = 0) -> None:
    """Add to ``seen`` every kind whose marker is in ``line`` (only head, traceback and error lines)."""
    if line_no > HEAD_LINES and 'File "' not in line and "rror" not in line:
        return
    if _ANY_MARKER.search(line) is None:  # one C-level scan: most lines name no kind (a log of one repeated
        return                          # error line scanned each kind's markers: ~20 us a line)
    for kind, marks in MARKERS.items():
        if kind not in seen and any(m in line for m in marks):
            seen.add(kind)


def job_kind(markers: set[str] | frozenset[str], sources=()) -> str:
    """One kind: a serving engine seen (its lines or markers) wins, then a training loop, a desktop application;
    else ``unknown``. ``sources``: the events' sources (``vllm-v0``, ``vllm-v1``, ``sglang``, ``torch``)."""
    seen = set(markers)
    for s in sources:
        if s and s.startswith("vllm"):
            seen.add("vllm")
        elif s == "sglang":
            seen.add("sglang")
    for k in SERVING + ("training", "desktop"):
        if k in seen:
            return k
    return "unknown"


def metrics_job_kind(metric_names) -> str | None:
    """The serving engine whose own metric names a window reads, when exactly one engine's appear (Triton serving
    TensorRT-LLM shows both families: not one engine's knobs); None otherwise (DCGM and the probe alone say nothing)."""
    kinds = {k for m in metric_names for k, p in METRIC_PREFIXES.items() if m.startswith(p)}
    return kinds.pop() if len(kinds) == 1 else None


def frame_kind(filename: str, name: str = "") -> tuple[str, str] | None:
    """The kind a stack frame's module belongs to, and the path from its marker on ("/" separators, without the
    user's directories: what to quote); None: no kind's code."""
    f = "/" + filename.replace("\\", "/").lstrip("/")
    for kind, marks in FRAME_MARKERS.items():
        for m in marks:
            i = f.find(m)
            if i >= 0:
                return kind, f[i + 1:]
    if name in BACKWARD_FRAMES and "/torch/" in f:
        return "training", f[f.find("/torch/") + 1:]
    return None


# The knobs of each kind, so that advice names a setting of the program that produced the evidence (flag names are
# each program's own: vLLM and SGLang --help, TGI's launcher arguments, TensorRT-LLM's KvCacheConfig /
# trtllm-serve, Triton's config.pbtxt, ComfyUI's command line); read by advice/jobs.py and sizing. ``graphs``: how
# to capture fewer CUDA graphs (their private pools hold memory; absent where the program has no such setting);
# ``concurrency``: a serving engine's cap on the requests it runs at once.
KNOBS: dict[str, dict] = {
    "vllm": {"name": "vLLM", "memory": "--gpu-memory-utilization", "serving": True, "concurrency": "--max-num-seqs",
             "load": "--max-num-seqs / --max-num-batched-tokens", "length": "--max-model-len",
             "graphs": "--compilation-config cudagraph_capture_sizes (or a lower --max-num-seqs; --enforce-eager to "
                       "confirm)"},
    "sglang": {"name": "SGLang", "memory": "--mem-fraction-static", "serving": True,
               "concurrency": "--max-running-requests",
               "load": "--max-running-requests / --chunked-prefill-size", "length": "--context-length",
               "graphs": "--cuda-graph-max-bs (--disable-cuda-graph to confirm)"},
    "tgi": {"name": "TGI (text-generation-inference)", "memory": "--cuda-memory-fraction", "serving": True,
            "concurrency": "--max-concurrent-requests (or --max-batch-total-tokens)",
            "load": "--max-batch-total-tokens / --max-batch-prefill-tokens / --max-concurrent-requests",
            "length": "--max-total-tokens / --max-input-tokens",
            "graphs": "--cuda-graphs with fewer batch sizes (0 turns them off, to confirm)"},
    "triton": {"name": "Triton Inference Server", "memory": "the backend's memory setting in config.pbtxt (TensorRT-LLM "
               "backend: kv_cache_free_gpu_mem_fraction)", "serving": True,
               "concurrency": "max_batch_size in config.pbtxt",
               "load": "max_batch_size / dynamic_batching in config.pbtxt, instance_group count", "length": None},
    "trtllm": {"name": "TensorRT-LLM", "memory": "KvCacheConfig free_gpu_memory_fraction "
               "(trtllm-serve --kv_cache_free_gpu_memory_fraction)", "serving": True, "concurrency": "max_batch_size",
               "load": "max_batch_size / max_num_tokens", "length": "max_seq_len",
               "graphs": "cuda_graph_config batch_sizes / max_batch_size (LLM API options, PyTorch backend)"},
    "training": {"name": "a training loop", "memory": None, "serving": False,
                 "load": "the per-device batch size (gradient accumulation keeps the effective batch)",
                 "length": "the sequence length / input size",
                 "extra": "activation checkpointing, mixed precision (bf16/fp16), a sharded optimizer",
                 "graphs": "the shapes captured with torch.cuda.graph / torch.compile(mode=\"reduce-overhead\")"},
    "desktop": {"name": "a desktop application (ComfyUI or alike)", "memory": None, "serving": False,
                "load": "the batch size / resolution of the workflow",
                "length": None, "extra": "its low-memory mode (ComfyUI: --lowvram, --reserve-vram)"},
    "unknown": {"name": "an unknown program", "memory": None, "serving": False,
                "load": "the batch size (a serving engine: its concurrency limit, e.g. vLLM --max-num-seqs, "
                        "SGLang --max-running-requests, TGI --max-batch-total-tokens)",
                "length": "the sequence length (a serving engine: its context-length limit)",
                "graphs": "the shapes captured with torch.cuda.graph / torch.compile(mode=\"reduce-overhead\") (a "
                          "serving engine: its CUDA-graph capture sizes, e.g. vLLM --compilation-config "
                          "cudagraph_capture_sizes, SGLang --cuda-graph-max-bs)"},
}
