"""The knobs of each kind of job, so that an action names a setting of the program that produced the evidence.

The table lives with the kinds (collectors/enginelog/jobkind.py: sizing reads it too). Flag names are each program's own (vLLM and
SGLang `--help`, TGI's launcher arguments, TensorRT-LLM's KvCacheConfig / trtllm-serve, Triton's
config.pbtxt, ComfyUI's command line). ``unknown`` says that it is unknown and names both families.
"""
from __future__ import annotations

from ..collectors.enginelog.jobkind import KNOBS


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

