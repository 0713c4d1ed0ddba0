"""Collector state in the verdict: readiness, and inconclusive reasons that name a source that is down.

A detector only sees that a signal is missing from its window; the agent knows why (the vLLM
collector has been refused since 12:03). :func:`explain_down` rewrites the reason of each
inconclusive entry whose missing signals come from a collector that is down, so the verdict says
"vllm collector down since 12:03:05 UTC: ... connection refused" instead of "missing
vllm:kv_cache_usage_perc". Pure functions over plain collector records, so the agent (its own
state) and ``diagnose --agent`` (the agent's ``/api/v1/status``) share them. Detectors are not
touched: this runs on their output.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..model import Inconclusive, Report
from .plan import ENGINE_KINDS

# raw metric name prefix -> the collector kind that produces it (docs/agent.md#collectors)
_PREFIX_KIND: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"), ("ray_vllm:", "vllm"), ("sglang:", "vllm"),
    ("DCGM_", "dcgm"),
    ("fragscope_gpu_", "nvml"),
    ("fragscope_torch_", "torch"),
    ("fragscope_process_", "process"),
    ("fragscope_log_", "logs"),
)
_TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


@dataclass(frozen=True)
class Down:
    """A configured collector that is down: its name, kind, since when (unix seconds), and why."""

    name: str
    kind: str
    since: float | None
    error: str


def down_collectors(collectors: Iterable[Any]) -> list[Down]:
    """The down collectors among ``collectors``: CollectorHealth objects or the dicts of
    ``/api/v1/status`` (``name``, ``kind``, ``up``, ``error``, ``down_since``)."""
    out = []
    for c in collectors:
        get = c.get if isinstance(c, Mapping) else (lambda k, c=c: getattr(c, k, None))
        if get("up") is False:
            out.append(Down(str(get("name")), str(get("kind") or get("name")), _num(get("down_since")),
                            str(get("error") or get("last_error") or "down")))
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def kinds_of(missing: str) -> set[str]:
    """Collector kinds that could provide a missing-signal entry (a raw metric name, a signal id,
    or a phrase like ``"A (V1) or B (V0)"``)."""
    from ..signals import SIGNALS

    kinds: set[str] = set()
    for tok in _TOKEN.findall(missing):
        metrics = [tok]
        sig = SIGNALS.get(tok)
        if sig is not None:
            metrics = [s.metric for s in sig.sources]
        else:  # a raw name: every source of the signals that read it counts (vllm: or the engine log)
            for sig in SIGNALS.values():
                if any(s.metric == tok for s in sig.sources):
                    metrics += [s.metric for s in sig.sources]
        for m in metrics:
            for prefix, kind in _PREFIX_KIND:
                if m.startswith(prefix):
                    kinds.add(kind)
    return kinds


def fmt_since(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return ""
    now = time.time() if now is None else now
    fmt = "%H:%M:%S UTC" if abs(now - ts) < 86400 else "%Y-%m-%d %H:%M UTC"
    return " since " + time.strftime(fmt, time.gmtime(ts))


def down_text(d: Down, now: float | None = None) -> str:
    return f"{d.name} collector down{fmt_since(d.since, now)}: {d.error}"


def explain_down(report: Report, down: list[Down], now: float | None = None) -> int:
    """Rewrite, in place, the reason of every inconclusive entry whose missing signals come from a
    down collector (the original reason is kept after it). An entry that names no signal ("no
    data") is explained when an engine collector is down. Returns the number of entries changed."""
    if not down or report is None:
        return 0
    by_kind: dict[str, list[Down]] = {}
    for d in down:
        by_kind.setdefault(d.kind, []).append(d)
    engine = [d for d in down if d.kind in ENGINE_KINDS]
    changed = 0
    for i, inc in enumerate(report.inconclusive):
        hit: list[Down] = []
        for m in inc.missing:
            for k in sorted(kinds_of(str(m))):
                for d in by_kind.get(k, ()):
                    if d not in hit:
                        hit.append(d)
        if not hit and not inc.missing and engine and "no data" in (inc.reason or ""):
            hit = engine
        if not hit:
            continue
        text = "; ".join(down_text(d, now) for d in hit)
        if inc.reason and not inc.reason.startswith(text):
            text = f"{text} (detector: {inc.reason})"
        report.inconclusive[i] = Inconclusive(inc.id, list(inc.missing), text, dict(inc.subject))
        changed += 1
    return changed


def readiness_problems(state: Any) -> list[str]:
    """Why the agent is not ready (empty: ready). The one decision of readiness: ``/readyz`` and
    ``/api/v1/status``'s ``ready`` both read it. docs/agent.md#health."""
    why = []
    cols = list(state.collectors.values())
    if not state.first_round_done:
        state.first_round_done = all(h.runs_total > 0 or h.up is False for h in cols)
    if not state.first_round_done:
        why.append("first round of collection not finished")
    if state.store is not None and state.store.degraded:
        why.append(f"history degraded: {state.store.degraded}")
    if not cols:
        why.append("no collector configured")
    elif not any(h.up for h in cols):
        why.append("every collector is down")
    for d in down_collectors(cols):
        if d.kind in ENGINE_KINDS:
            why.append("engine source " + down_text(d))
    return why


def sources_down(status: Mapping[str, Any] | None, ready: Mapping[str, Any] | None,
                 now: float | None = None) -> list[str]:
    """Why a verdict read from an agent is incomplete, one line each (empty: every source was up and
    the agent ready): each down collector of ``/api/v1/status``, the reasons of a ``/readyz`` that is
    not ready, or that the agent's state could not be read at all. ``diagnose --agent`` puts them in
    ``signals.sources_down``, its first line and its exit code (docs/cli.md#exit-codes)."""
    out: list[str] = []
    cols = status.get("collectors") if isinstance(status, Mapping) else None
    if isinstance(cols, list):
        cols = [c for c in cols if isinstance(c, Mapping)]
        no_gpu = {str(c.get("name")) for c in cols if c.get("missing") and
                  all(isinstance(m, Mapping) and m.get("reason") == "no_gpu" for m in c["missing"])}
        for d in down_collectors(cols):
            # a machine without a GPU is not a source down, but the agent cannot tell it from a GPU it
            # cannot see (no driver in the container): said, with the way to turn it off
            hint = (" (no GPU visible: start the agent with --no-nvml when the engine runs without one)"
                    if d.name in no_gpu else "")
            out.append(down_text(d, now) + hint)
    else:
        out.append("the agent's /api/v1/status could not be read: whether its sources are up is unknown")
    if isinstance(ready, Mapping):
        if ready.get("status") != "ready":
            for r in ready.get("reasons") or ["not ready (no reason given)"]:
                r = str(r)
                core = r[len("engine source "):] if r.startswith("engine source ") else r
                if core not in out and r != "every collector is down":
                    out.append(f"agent not ready: {r}" if core == r else r)
    else:
        out.append("the agent's /readyz could not be read: whether it is ready is unknown")
    return out
