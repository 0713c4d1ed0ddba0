"""Fix texts that several playbooks share: one wording, preconditions and contraindications per fix."""
from __future__ import annotations

from ..model import Action
from .jobtext import only

# One wording per fix: the window playbooks, the snapshot playbooks and the computed actions share these.
EXPANDABLE_PRE = [
    "PyTorch >= 2.1 with the native allocator; restart the process to apply",
    "set it in PYTORCH_CUDA_ALLOC_CONF (PyTorch 2.9.1 silently ignored it under the newer "
    "PYTORCH_ALLOC_CONF name, pytorch/pytorch#183387) and check that the next snapshot shows "
    "allocator_settings.expandable_segments = true (some builds refuse it, pytorch/pytorch#122057)",
]
# (the two about vLLM are left out of a finding whose job is known and is not vLLM: advice/jobs.py only)
EXPANDABLE_CONTRA = [
    only("vLLM custom all-reduce at tensor parallel >= 2: the IPC export rejects VMM memory and the "
         "worker dies with custom_all_reduce.cuh 'invalid argument' (vllm-project/vllm#9046, #42609); "
         "use --disable-custom-all-reduce or leave it off", "vllm"),
    only("vLLM sleep mode (CuMemAllocator memory pool): sleep freed nothing / asserted "
         "(pytorch/pytorch#147851, vllm-project/vllm#14189); newer vLLM toggles it off inside the pool", "vllm"),
    "with it on, the inactive_split_bytes statistic no longer counts expandable-segment blocks "
    "(pytorch/pytorch#159564): watch fragmentation with snapshots, not that gauge",
    "ignored by backend:cudaMallocAsync",
]
# One line for computed actions, the same contraindications as EXPANDABLE_CONTRA in short.
EXPANDABLE_ONE_LINE = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless tensor-parallel >= 2 with custom "
                       "all-reduce or sleep mode is on.")


def expandable_segments(text: str = "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in "
                                    "place instead of leaving slivers.") -> Action:
    return Action(text, list(EXPANDABLE_PRE), list(EXPANDABLE_CONTRA))
