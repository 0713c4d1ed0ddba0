"""Sizing from the engine's own evidence: start-up accounting, run-time peaks, the value to set. docs/sizing.md."""
from .accounting import StartupAccounting
from .detect import detect_kv_pool_undersized, detect_startup_oom, judge_accounting, judge_log, startup_findings
from .playbooks import KV_POOL_UNDERSIZED, KV_POOL_UNDERSIZED_ID, STARTUP_OOM, STARTUP_OOM_ID
from .recommend import CASES, Recommendation, SizingConfig, recommend
from .runtime import runtime_from_frame, summarize_runtime

__all__ = ["CASES", "KV_POOL_UNDERSIZED", "KV_POOL_UNDERSIZED_ID", "Recommendation", "STARTUP_OOM", "STARTUP_OOM_ID",
           "SizingConfig", "StartupAccounting", "detect_kv_pool_undersized", "detect_startup_oom", "judge_accounting", "judge_log", "startup_findings", "parse_startup",
           "recommend", "runtime_from_frame", "summarize_runtime"]


def __getattr__(name: str):
    # The start-up log reader (and the log patterns it compiles) on first use: the window detector that
    # sizes the KV pool from metrics (detectors/kv_pool.py) needs the rest of this package, not it.
    if name == "parse_startup":
        from .startup import parse_startup

        return parse_startup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
