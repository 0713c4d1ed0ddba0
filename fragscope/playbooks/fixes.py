"""Fix texts that several playbooks share: one wording, preconditions and contraindications per fix."""
from __future__ import annotations

from ..model import Action

EXPANDABLE_CONTRA = [
    "tensor parallelism >= 2 with vLLM's custom all-reduce: expandable segments have crashed it "
    "(use --disable-custom-all-reduce or leave the setting off)",
    "vLLM sleep mode (--enable-sleep-mode): its CuMemAllocator conflicts with expandable segments",
    "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: native allocator options are ignored",
    "with it on, inactive_split_bytes stops counting expandable blocks (pytorch#159564): judge "
    "fragmentation from memory snapshots afterwards",
]
# One line for computed actions, the same contraindications as EXPANDABLE_CONTRA in short.
EXPANDABLE_ONE_LINE = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless tensor-parallel >= 2 with custom "
                       "all-reduce or sleep mode is on.")


def expandable_segments(text: str = "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in "
                                    "place instead of leaving slivers.") -> Action:
    return Action(text, ["PyTorch >= 2.1 with the native allocator"], list(EXPANDABLE_CONTRA))
