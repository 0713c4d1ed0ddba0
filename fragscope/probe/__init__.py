"""In-process PyTorch allocator probe (docs/probe.md).

Enable it in the engine's processes with the wrapper (``fragscope-probe vllm serve ...``), with
the environment it prints (``fragscope-probe --print-env``), or from code::

    import fragscope.probe
    fragscope.probe.start()          # FRAGSCOPE_PROBE_DIR / FRAGSCOPE_PROBE_INTERVAL, or arguments

Importing this package is cheap (standard library only) and never imports torch.
"""
from __future__ import annotations

from .core import Probe, current, enabled_by_env, start, stop

__all__ = ["Probe", "current", "enabled_by_env", "launcher_main", "start", "stop"]


def launcher_main() -> None:
    """Entry point of the ``fragscope-probe`` console script."""
    from .launcher import launcher_main as _main
    _main()
