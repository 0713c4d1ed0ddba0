"""Shared pieces of the sizing arithmetic: thresholds, the Recommendation record, rounding, formatting,
the GPU total and budget, headroom outside the budget, and pool pressure. docs/sizing.md.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .. import ids
from ..collectors.enginelog.oomproc import judge_oom
from ..units import GiB as GIB, MiB as MIB
from .accounting import StartupAccounting

STARTUP_OOM = ids.STARTUP_OOM
RUNTIME_OOM = "runtime-oom"
POOL_TOO_SMALL = "pool-too-small"
MEMORY_ELSEWHERE = "memory-held-elsewhere"
CASES = (STARTUP_OOM, RUNTIME_OOM, POOL_TOO_SMALL, MEMORY_ELSEWHERE)


@dataclass(frozen=True)
class SizingConfig:
    # Headroom kept free beyond the measured peaks: max(margin_min_bytes, margin_ratio x total).
    # Sources of its size: vLLM's CUDA-graph estimate missed the real capture by 15 MiB (vllm#57475,
    # RTX 5090 24 GB) and 0.03 GiB (25 %) on a 0.11 GiB pool (vllm-windows-build#4 log); a TP=8 run
    # ended 1.37 GiB over its budget (vllm#51590). 0.5 GiB or 2 % covers the single-GPU cases; pass a
    # larger margin (--margin-gib) for tensor parallelism.
    margin_min_bytes: float = 0.5 * GIB
    margin_ratio: float = 0.02
    # "pool too small": the pool ran full while sequences waited or were preempted. vLLM preempts only
    # when no free block is left; 0.95 is the KV usage the saved V0 incident shows around preemptions.
    full_kv_usage: float = 0.95
    # a change below one utilization step (0.01) is not worth a restart
    min_step: float = 0.01
    # other processes holding less than this are noise (the CUDA context of a monitoring tool: ~0.3-0.5 GiB)
    elsewhere_min_bytes: float = 1.0 * GIB

    def margin(self, total: float) -> float:
        return max(self.margin_min_bytes, self.margin_ratio * total)


@dataclass
class Recommendation:
    engine: str | None
    cases: list[dict] = field(default_factory=list)  # {"case", "evidence", "change"}
    settings: dict = field(default_factory=dict)  # flag -> value to set
    alternatives: dict = field(default_factory=dict)  # flag -> value: another way to the same end (not both)
    current: dict = field(default_factory=dict)  # flag -> value in force
    outcome: dict = field(default_factory=dict)  # kv_cache_bytes, kv_cache_tokens, max_concurrency, ...
    arithmetic: list[str] = field(default_factory=list)  # the steps, in order, with figures
    missing: list[str] = field(default_factory=list)  # what to capture to decide
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  # "ok" (nothing to change) | "change" | "inconclusive"

    def to_dict(self) -> dict:
        d = asdict(self)
        return nonfinite_as_none(d)


def nonfinite_as_none(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: nonfinite_as_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [nonfinite_as_none(v) for v in x]
    return x


def g(x: float | None) -> str:
    """GiB with two decimals (the engines' own precision); MiB below 1 GiB so small figures stay visible."""
    if x is None:
        return "n/a"
    if abs(x) < GIB:
        return f"{x / MIB:.2f} MiB"
    return f"{x / GIB:.2f} GiB"


def floor_step(u: float, step: float = 0.01) -> float:
    return math.floor(u / step + 1e-9) * step


def ceil_step(u: float, step: float = 0.01) -> float:
    return math.ceil(u / step - 1e-9) * step


def t4(x: float) -> str:
    """A ratio truncated (not rounded) to 4 decimals, so '0.95998 -> 0.95' never reads '0.9600 -> 0.95'."""
    return f"{math.floor(x * 1e4 + 1e-9) / 1e4:.4f}"


def tokens_per_sequence(length: float, block_size: int | None) -> int:
    """KV tokens one sequence of ``length`` tokens occupies: whole blocks (vLLM allocates by block)."""
    b = block_size or 1
    return int(math.ceil(length / b) * b)


def total_gpu_bytes(acc: StartupAccounting) -> float | None:
    if acc.total_gpu_memory_bytes:
        return acc.total_gpu_memory_bytes
    f = acc.failure or {}
    for k in ("total_bytes",):
        if f.get(k):
            return float(f[k])
    for o in acc.runtime_ooms:
        if o.get("total_bytes"):
            return float(o["total_bytes"])
    return None


def budget_gpu_bytes(acc: StartupAccounting, total: float | None) -> float | None:
    if acc.requested_memory_bytes:
        return acc.requested_memory_bytes
    if total and acc.gpu_memory_utilization:
        return total * acc.gpu_memory_utilization
    return None


def _others_from_oom(o: dict) -> float | None:
    """Bytes the OOM message's process list gives to other processes (this process left out, also when it is
    listed as "Process P" from inside a container): the one judgement diagnose logs uses (oomproc.judge_oom)."""
    if not o.get("other_processes"):
        return None
    return judge_oom(o).get("other_processes_bytes") or 0.0


def oom_cause(o: dict, rec) -> dict:
    """The OOM's cause as ``diagnose logs`` judges it (the same function), stated in the recommendation's notes
    and ``outcome`` so the two commands never give one OOM two causes."""
    j = judge_oom(o)
    rec.outcome["oom_verdict"] = j["verdict"]
    rec.outcome["oom_judged_by"] = j["judged_by"]
    rec.notes.append(f"the OOM's cause (as diagnose logs judges it): {j['verdict']}: {j['judged_by']}")
    return j


def _outside(acc, runtime, total, budget, rec) -> tuple[float | None, str]:
    """Memory held beyond the engine's budget at the observed peak (this engine's extras + others).

    Only a measurement counts (NVML used at peak): the start-up log's CUDA-graph figure alone misses
    other processes and activation growth, so it is shown, never used to grow the pool.
    """
    used = runtime.get("device_used_peak_bytes")
    if used is not None and budget is not None:
        return max(0.0, float(used) - budget), (f"device used at peak {g(used)} (NVML) - budget {g(budget)}")
    if acc.cuda_graph_bytes is not None and not acc.cuda_graph_in_budget:
        rec.notes.append(f"CUDA graphs took {g(acc.cuda_graph_bytes)} outside the budget at start-up (log); the "
                         "headroom also needs what other processes and activation peaks held: not measured")
    return None, ""


def utilization_ceiling(acc, runtime, total, budget, cfg, rec) -> float | None:
    """The highest utilization that keeps the observed outside-budget memory plus the margin free."""
    if total is None or budget is None:
        return None
    out, why = _outside(acc, runtime, total, budget, rec)
    margin = cfg.margin(total)
    if out is None:
        rec.missing.append("peak device memory under load (NVML used vs total over a busy window: a recording "
                           "from the fragscope sidecar or `fragscope record`) to know the headroom outside the "
                           "budget")
        return None
    u_max = floor_step((total - out - margin) / total)
    rec.arithmetic.append(f"outside the budget at peak = {why} = {g(out)}")
    rec.arithmetic.append(f"ceiling = (total {g(total)} - outside {g(out)} - margin {g(margin)}) / total = "
                          f"{t4((total - out - margin) / total)} -> {u_max:.2f}")
    return u_max


def note_memory_elsewhere(acc, runtime, total, cfg, rec) -> None:
    others = runtime.get("other_processes_peak_bytes")
    if others is None:
        for o in ([acc.failure] if acc.failure else []) + acc.runtime_ooms:
            v = _others_from_oom(o) if o else None
            if v is not None:
                others = v
    if others is not None and others >= cfg.elsewhere_min_bytes:
        rec.status = "change"
        rec.cases.append({
            "case": MEMORY_ELSEWHERE,
            "evidence": f"other processes hold {g(others)} of this GPU" + (f" ({others / total * 100:.1f} %)" if total else ""),
            "change": "move them off this GPU (or give this engine a dedicated GPU / MIG slice); until then every "
                      "utilization below is computed with that memory taken"})


def pool_pressure(runtime: dict, cfg: SizingConfig) -> str | None | bool:
    """A sentence when the pool ran full under demand; False when it was watched and never did; None: unknown."""
    if not runtime:
        return None
    kv = runtime.get("kv_usage_peak_ratio")
    pre = runtime.get("preemptions_total")
    by_reason = runtime.get("preemptions_by_reason") or {}
    waiting = runtime.get("waiting_peak")
    if kv is None and pre is None:
        return None
    bits = []
    kv_full_pre = by_reason.get("kv_full")
    if by_reason:
        if kv_full_pre:
            bits.append(f"{kv_full_pre:,.0f} preemptions for lack of KV blocks (reason kv_full)")
        other = {k: v for k, v in by_reason.items() if k != "kv_full" and v}
        if other:
            bits.append("other preemptions: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(other.items())) +
                        " (not a pool-size problem)")
        if not kv_full_pre:
            bits = [b for b in bits if not b.startswith("other")]
    elif pre:
        bits.append(f"{pre:,.0f} preemptions")
    full = kv is not None and kv >= cfg.full_kv_usage
    if full:
        bits.insert(0, f"KV usage peaked at {kv * 100:.1f} %")
        if waiting:
            bits.append(f"{waiting:,.0f} requests waiting at peak")
    kv_full_evidence = bool(kv_full_pre) if by_reason else bool(pre)
    if kv_full_evidence or (full and waiting):
        return "; ".join(bits)
    return False
