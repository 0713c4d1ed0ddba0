"""Hostile inputs for every CLI entry point that reads a file: one generator per class of input that broke
a reader (a FIFO, /dev/zero, a gzip bomb, numbers outside the contract, deep nesting, quadratic
tokenizers), each writing its files into a directory and giving the command line that reads them.

Used by tests/fuzz/test_entrypoints.py (each case under the CLI contract of docs/fuzzing.md, in process) and
bench/fuzz.py ``--entrypoints`` (the same cases as subprocesses, with a scaling check: time and peak memory
at 1x, 4x and 16x the input). ``scale`` multiplies the size of the inputs whose size matters.
"""
from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
VLLM_PAGE = DATA / "agent" / "vllm_cpu_0.32.0_before.txt"
TRITON_PAGE = DATA / "engines" / "triton_trtllm_readme_nv_inference.prom"
TRITON_CONFIG = DATA / "engines" / "triton_configs" / "densenet_onnx.pbtxt"
V0_LOG = DATA / "sizing" / "vllm_v0_prose_cuda_blocks.log"
N400 = "9" * 400


@dataclass
class Case:
    name: str  # entry--class, e.g. "scrape--fifo"
    make: Callable[[Path, int], list[str]]  # (dir, scale) -> argv (without the program name)
    scales: bool = False  # the input's size grows with ``scale`` (the scaling check runs it)
    prog: str = "diagnose"


def _fifo(d: Path, name: str) -> str:
    p = d / name
    if not p.exists():
        os.mkfifo(p)
    return str(p)


def _write(d: Path, name: str, data: bytes | str) -> str:
    p = d / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def _gzip_newlines(n_bytes: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\n" * (1 << 20)
    out = [c.compress(block) for _ in range(max(1, n_bytes >> 20))]
    out.append(c.flush())
    return b"".join(out)


# --- engine pages -------------------------------------------------------------------------------
def _page() -> str:
    return VLLM_PAGE.read_text()


def _long_label(d: Path, k: int) -> list[str]:
    return ["scrape", _write(d, "long_label.prom", _page() + 'vllm:num_requests_waiting{model_name="'
                             + "x" * (200_000 * k) + '"} 1\n')]


def _long_line(d: Path, k: int) -> list[str]:
    return ["scrape", _write(d, "long_line.prom", _page() + "vllm:num_requests_waiting " + "9" * (1_500_000 * k) + "\n")]


def _churn(d: Path, k: int) -> list[str]:
    lines = "".join(f'vllm:num_requests_waiting{{model_name="m",request_id="r{i}"}} 1\n' for i in range(10_000 * k))
    return ["scrape", _write(d, "churn.prom", _page() + lines)]


def _denormal(d: Path, k: int) -> list[str]:
    t = 1_700_000_000
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:num_requests_waiting gauge"]
    for i in range(20):
        lines.append(f'vllm:kv_cache_usage_perc{{engine="0"}} {"5e-324" if i % 2 else "0"} {t + 15 * i}')
        lines.append(f'vllm:num_requests_waiting{{engine="0"}} {"5e-324" if i % 3 else "1.7e308"} {t + 15 * i}')
    _write(d, "denormal.om", "\n".join(lines) + "\n# EOF\n")
    return [str(d / "denormal.om"), "--html", str(d / "denormal.html")]


# --- config.pbtxt -------------------------------------------------------------------------------
def _pbtxt(d: Path, name: str, text: str) -> list[str]:
    return ["triton-batching", "--config", _write(d, name, text), str(TRITON_PAGE), "--model", "tensorrt_llm"]


def _delay(value: str) -> Callable[[Path, int], list[str]]:
    return lambda d, k: _pbtxt(d, f"delay_{value[:8]}.pbtxt", TRITON_CONFIG.read_text() + "\ndynamic_batching {\n"
                               f"  max_queue_delay_microseconds: {value}\n  preferred_batch_size: [ 4, 8 ]\n}}\n")


def _nested(d: Path, k: int) -> list[str]:
    n = 1100
    return _pbtxt(d, "nested.pbtxt", 'name: "m"\n' + "a {" * n + "}" * n + "\n")


def _big_pbtxt(d: Path, k: int) -> list[str]:
    body = "".join(f'parameters {{ key: "k{i}" value {{ string_value: "v{i}" }} }}\n' for i in range(2_000 * k))
    return _pbtxt(d, "big.pbtxt", TRITON_CONFIG.read_text() + body)


# --- ONNX Runtime profiles ----------------------------------------------------------------------
def _ort_events(runs: int, nodes: int = 2) -> list[dict]:
    ev = []
    for r in range(runs):
        t0 = r * 10.0
        ev.append({"cat": "Session", "name": "model_run", "ts": t0, "dur": 9.0, "pid": 1, "tid": 1})
        for n in range(nodes):
            ev.append({"cat": "Node", "name": f"n{n}_kernel_time", "ts": t0 + 1 + n, "dur": 1.0, "pid": 1, "tid": 1,
                       "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider" if n else
                                "CPUExecutionProvider", "node_index": n}})
    return ev


def _ort(d: Path, name: str, text: str | bytes) -> list[str]:
    return ["ort-profile", _write(d, name, text)]


def _ort_number(literal: str) -> Callable[[Path, int], list[str]]:
    def make(d: Path, k: int) -> list[str]:
        text = json.dumps(_ort_events(3)).replace('"dur": 1.0', f'"dur": {literal}', 1)
        return _ort(d, f"ort_{len(literal)}.json", text)
    return make


def _ort_runs(d: Path, k: int) -> list[str]:
    ev = _ort_events(4_000 * k, nodes=1)
    for e in ev:  # overlapping runs on other threads: the search for a node's run must not walk them all
        if e["cat"] == "Session":
            e["dur"] = 1e9
            e["tid"] = 2
    return _ort(d, "ort_runs.json", json.dumps(ev))


def _ort_bomb(d: Path, k: int) -> list[str]:
    return _ort(d, "ort_bomb.json.gz", _gzip_newlines((16 << 20) * k))


# --- engine logs (diagnose logs, fragscope size) ----------------------------------------------------
_PROMPT = ("INFO 03-21 20:16:02 [logger.py:39] Received request cmpl-1: prompt: 'the current vLLM instance can use "
           "total_gpu_memory ({x} GiB) x gpu_memory_utilization (0.90) = 71.27GiB # GPU blocks: {x}, "
           "# CPU blocks: {x} Avg prompt throughput: {x} tokens/s, Running: {x} reqs'\n")


def _log_with(figure: str, in_prompt: bool) -> str:
    base = V0_LOG.read_text()
    if in_prompt:
        return base + _PROMPT.format(x=figure)
    return base.replace("79.19GiB", figure + "GiB", 1).replace("12.55GiB", figure + "GiB", 1) + \
        f"INFO 03-21 20:16:10 [metrics.py:1] Avg prompt throughput: {figure} tokens/s, Running: {figure} reqs, " \
        f"Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: {figure}%, CPU KV cache usage: 0.0%.\n"


def _log_case(cmd: str, figure: str, in_prompt: bool) -> Callable[[Path, int], list[str]]:
    def make(d: Path, k: int) -> list[str]:
        p = _write(d, f"log_{abs(hash((figure, in_prompt)))}.log", _log_with(figure, in_prompt))
        return ["logs", p] if cmd == "logs" else ["size", "--log", p]
    return make


def _zero_gpu(cmd: str) -> Callable[[Path, int], list[str]]:
    def make(d: Path, k: int) -> list[str]:
        text = V0_LOG.read_text().replace("79.19GiB", "0GiB").replace("71.27GiB", "0GiB") + \
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0 bytes. GPU 0 has a total capacity of 0 " \
            "bytes of which 0 bytes is free. Of the allocated memory 0/0 GiB is allocated by PyTorch\n"
        p = _write(d, "zero_gpu.log", text)
        return ["logs", p] if cmd == "logs" else ["size", "--log", p]
    return make


def _log_newlines(d: Path, k: int) -> list[str]:
    return ["logs", _write(d, "newlines.log.gz", _gzip_newlines((25 << 20) * k))]


# --- kv-budget --model-config --------------------------------------------------------------------------
_LLAMA = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
          "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}


def _kv(d: Path, name: str, text: str | bytes) -> list[str]:
    return ["kv-budget", "--model-config", _write(d, name, text), "--gpu-memory-gib", "80", "--weights-gib", "16",
            "--max-seq-len", "8192"]


def _kv_number(literal: str) -> Callable[[Path, int], list[str]]:
    def make(d: Path, k: int) -> list[str]:
        text = json.dumps(_LLAMA).replace('"num_hidden_layers": 32', f'"num_hidden_layers": {literal}')
        return _kv(d, f"kv_{len(literal)}.json", text)
    return make


def _kv_deep(d: Path, k: int) -> list[str]:
    n = 100_000
    return _kv(d, "kv_deep.json", '{"text_config": ' + "[" * n + "]" * n + "}")


def _kv_deep_dicts(d: Path, k: int) -> list[str]:
    cfg: dict = dict(_LLAMA)
    inner = cfg
    for _ in range(900):  # below the JSON decoder's recursion limit: the reader must not recurse past it
        inner["text_config"] = {}
        inner = inner["text_config"]
    return _kv(d, "kv_deep_dicts.json", json.dumps(cfg))


def _special(cmd: str, kind: str) -> Callable[[Path, int], list[str]]:
    def make(d: Path, k: int) -> list[str]:
        path = "/dev/zero" if kind == "devzero" else _fifo(d, f"{cmd}_{kind}")
        return {"scrape": ["scrape", path],
                "triton-batching": ["triton-batching", "--config", path, str(TRITON_PAGE)],
                "triton-scrape": ["triton-batching", "--config", str(TRITON_CONFIG), path],
                "ort-profile": ["ort-profile", path],
                "logs": ["logs", path],
                "size": ["size", "--log", path],
                "kv-budget": ["kv-budget", "--model-config", path, "--gpu-memory-gib", "80", "--weights-gib", "16"],
                }[cmd]
    return make


CASES: list[Case] = [
    Case("scrape--long-label-value", _long_label, scales=True),
    Case("scrape--line-longer-than-the-line-cap", _long_line, scales=True),
    Case("scrape--churning-label-values", _churn, scales=True),
    Case("html--denormal-and-huge-gauges", _denormal),
    Case("triton-batching--queue-delay-inf", _delay("inf")),
    Case("triton-batching--queue-delay-nan", _delay("nan")),
    Case("triton-batching--queue-delay-400-digits", _delay(N400)),
    Case("triton-batching--1100-nested-messages", _nested),
    Case("triton-batching--large-config-tokenizer", _big_pbtxt, scales=True),
    Case("ort-profile--1e400", _ort_number("1e400")),
    Case("ort-profile--NaN", _ort_number("NaN")),
    Case("ort-profile--4300-digit-integer", _ort_number("9" * 4300)),
    Case("ort-profile--overlapping-runs-node-search", _ort_runs, scales=True),
    Case("ort-profile--gzip-bomb", _ort_bomb, scales=True),
    Case("kv-budget--1e400", _kv_number("1e400"), prog="fragscope"),
    Case("kv-budget--NaN", _kv_number("NaN"), prog="fragscope"),
    Case("kv-budget--huge-integer", _kv_number("9" * 400), prog="fragscope"),
    Case("kv-budget--deep-nesting", _kv_deep, prog="fragscope"),
    Case("kv-budget--deep-dicts", _kv_deep_dicts, prog="fragscope"),
    Case("logs--newlines-gzip", _log_newlines, scales=True),
]
for _cmd in ("logs", "size"):
    for _fig, _tag in ((N400, "400-digits"), ("1.2.3", "dotted"), ("1e400", "1e400")):
        for _inp in (False, True):
            CASES.append(Case(f"{_cmd}--{_tag}{'-in-a-prompt' if _inp else ''}", _log_case(_cmd, _fig, _inp),
                              prog="fragscope" if _cmd == "size" else "diagnose"))
    CASES.append(Case(f"{_cmd}--zero-gpu", _zero_gpu(_cmd), prog="fragscope" if _cmd == "size" else "diagnose"))
for _cmd in ("scrape", "triton-batching", "triton-scrape", "ort-profile", "logs", "size", "kv-budget"):
    for _kind in ("fifo", "devzero"):
        CASES.append(Case(f"{_cmd}--{_kind}", _special(_cmd, _kind),
                          prog="fragscope" if _cmd in ("size", "kv-budget") else "diagnose"))
