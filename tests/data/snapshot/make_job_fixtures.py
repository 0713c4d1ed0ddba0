"""Writes the job fixtures of this folder: fragmented_oom.pickle with its stack frames renamed (README_snapshot.md).

Run from this folder: python make_job_fixtures.py. Reads fragmented_oom.pickle (plain data; read with fragscope's
refusing unpickler, never pickle.load), replaces every recorded stack (each non-empty ``frames`` list of a segment,
block and trace entry) by one program's stack, and writes ``<kind>_frames_oom.pickle`` with pickle protocol 4, as
``torch.cuda.memory._dump_snapshot`` does. Everything else (segments, blocks, the trace with its OOM, allocator
settings) is byte-for-byte the same data.

Each stack is innermost frame first, as PyTorch records them, with the module paths of the program's own source
tree (vLLM vllm/v1/worker/gpu_model_runner.py, SGLang python/sglang/srt/model_executor/model_runner.py, TGI
server/text_generation_server/models/flash_causal_lm.py, PyTorch torch/autograd/graph.py and torch/optim/adamw.py)
under an installed site-packages prefix; function names are those files' own, line numbers are illustrative.
"""
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))

from fragscope.collectors.snapshot_load import load_snapshot_bytes  # noqa: E402

SITE = "/usr/local/lib/python3.12/dist-packages/"
TORCH = [(SITE + "torch/nn/modules/linear.py", 125, "forward"), (SITE + "torch/nn/modules/module.py", 1762, "_call_impl")]
STACKS = {
    "vllm": TORCH + [
        (SITE + "vllm/model_executor/layers/linear.py", 510, "forward"),
        (SITE + "vllm/model_executor/models/llama.py", 330, "forward"),
        (SITE + "vllm/v1/worker/gpu_model_runner.py", 1650, "execute_model"),
        (SITE + "vllm/v1/worker/gpu_worker.py", 330, "execute_model"),
        (SITE + "vllm/v1/engine/core.py", 270, "step")],
    "sglang": TORCH + [
        (SITE + "sglang/srt/layers/linear.py", 420, "forward"),
        (SITE + "sglang/srt/models/llama.py", 350, "forward"),
        (SITE + "sglang/srt/model_executor/model_runner.py", 1200, "forward_extend"),
        (SITE + "sglang/srt/managers/tp_worker.py", 220, "forward_batch_generation"),
        (SITE + "sglang/srt/managers/scheduler.py", 1500, "run_batch")],
    "tgi": TORCH + [
        ("/usr/src/server/text_generation_server/layers/linear.py", 40, "forward"),
        ("/usr/src/server/text_generation_server/models/custom_modeling/flash_llama_modeling.py", 600, "forward"),
        ("/usr/src/server/text_generation_server/models/flash_causal_lm.py", 1800, "forward"),
        ("/usr/src/server/text_generation_server/models/flash_causal_lm.py", 1900, "generate_token"),
        ("/usr/src/server/text_generation_server/server.py", 200, "Decode")],
    "training": [
        (SITE + "torch/autograd/graph.py", 823, "_engine_run_backward"),
        (SITE + "torch/autograd/__init__.py", 347, "backward"),
        (SITE + "torch/_tensor.py", 626, "backward"),
        ("/home/user/project/train.py", 88, "train_step"),
        ("/home/user/project/train.py", 130, "main")],
}


def renamed(obj, stack):
    frames = [{"filename": f, "line": line, "name": n} for f, line, n in stack]  # one list shared, as in a dump

    def fix(d):
        if isinstance(d, dict) and d.get("frames"):
            d["frames"] = frames
    for s in obj["segments"]:
        fix(s)
        for b in s["blocks"]:
            fix(b)
    for t in obj["device_traces"]:
        for e in t:
            fix(e)
    return obj


if __name__ == "__main__":
    with open(os.path.join(HERE, "fragmented_oom.pickle"), "rb") as f:
        data = f.read()
    for kind, stack in STACKS.items():
        obj, _ = load_snapshot_bytes(data, "fragmented_oom.pickle", 1 << 20)
        with open(os.path.join(HERE, f"{kind}_frames_oom.pickle"), "wb") as f:
            pickle.dump(renamed(obj, stack), f, protocol=4)
