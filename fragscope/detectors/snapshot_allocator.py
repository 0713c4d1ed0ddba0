"""PyTorch CUDA caching-allocator facts the snapshot analysis needs: size classes and request rounding.

Constants from c10/cuda/CUDACachingAllocator.cpp (notes section 1 "Size classes"); no I/O, no state.
"""
from __future__ import annotations

MiB = 1024 * 1024
GiB = 1024 * MiB

# Caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp; notes section 1 "Size classes")
K_SMALL_SIZE = 1 * MiB  # requests up to this size use the small pool
K_SMALL_BUFFER = 2 * MiB  # small-pool segment size; small-pool expandable mapping granularity
K_MIN_LARGE_ALLOC = 10 * MiB  # requests below this share a kLargeBuffer segment
K_LARGE_BUFFER = 20 * MiB  # large-pool segment for 1-10 MiB requests; large expandable mapping granularity
K_ROUND_LARGE = 2 * MiB  # larger requests round up to this
K_MIN_BLOCK = 512  # kMinBlockSize: every block size is a multiple of this
K_MAX_NON_SPLIT_ROUNDING = 20 * MiB  # max_non_split_rounding_mb default (not recorded in snapshots)


def alloc_segment_size(request: int) -> int:
    """Bytes the allocator asks the driver for when no cached block fits ``request`` (rounded)."""
    if request <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if request < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-request // K_ROUND_LARGE) * K_ROUND_LARGE


def round_request(size: int, divisions: dict | None = None) -> int:
    """The block size the caching allocator gives a ``size``-byte request (``round_size``).

    512-byte multiples, or with ``roundup_power2_divisions`` (``allocator_settings``, keys "1".."32768"
    for the power-of-two intervals from 1 MiB up) the next of N equal steps between two powers of two:
    c10/cuda/CUDACachingAllocator.cpp ``round_size`` / ``roundup_power2_next_division``.
    """
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    div = 0
    if divisions:
        idx = min(max(size.bit_length() - 1 - 20, 0), 15)  # intervals start at 1 MiB (2**20), 16 of them
        v = divisions.get(str(1 << idx), 0)
        div = v if isinstance(v, int) and not isinstance(v, bool) else 0
    if div > 1 and size > K_MIN_BLOCK * div:
        if size & (size - 1) == 0:
            return size
        floor2 = 1 << (size.bit_length() - 1)
        step = floor2 >> (div.bit_length() - 1)
        if step == 0:
            return floor2 << 1
        lo = size & ~(step - 1)
        return size if lo == size else lo + step
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


def fmt_bytes(v: float | None) -> str:
    """Bytes for messages: ``1.50 GiB``, ``512 B``; ``n/a`` for None."""
    if v is None:
        return "n/a"
    for u, s in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(v) >= s:
            return f"{v / s:.2f} {u}"
    return f"{int(v)} B"


__all__ = ["MiB", "GiB", "K_SMALL_SIZE", "K_SMALL_BUFFER", "K_MIN_LARGE_ALLOC", "K_LARGE_BUFFER", "K_ROUND_LARGE",
           "K_MIN_BLOCK", "K_MAX_NON_SPLIT_ROUNDING", "alloc_segment_size", "round_request", "fmt_bytes"]
