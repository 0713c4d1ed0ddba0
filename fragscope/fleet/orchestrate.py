"""The two fleet paths end to end: triage first then deep-diagnose the flagged targets
(:func:`diagnose_fleet`, the default), or download everything (:func:`diagnose_fleet_full`)."""
from __future__ import annotations

import math
from typing import Callable

from ..model import Report, Window
from .deep import deep_diagnose
from .grouping import TargetId, triage_target_id
from .measures import CORE_SIGNALS
from .outliers import find_outliers
from .results import FleetReport, FleetTarget
from .targets import build_targets, diagnose_targets, gpu_only_note, no_series_error

# Triage first, then deep fetch only for the flagged targets (docs/fleet.md#triage)
PEER_SAMPLE = 3  # healthy targets deep-diagnosed beside the flagged ones, as a check on the triage
DEEP_LIMIT = 100  # at most this many targets deep-fetched (flagged first); the rest keep their triage
TRIAGE_MODES = ("auto", "rules", "queries", "off")


def diagnose_fleet_full(client, start: float, end: float, selector: str | None = None, step: float | None = None,
                        diagnose: Callable[[Window], Report] | None = None) -> FleetReport:
    """The full download (``--triage off``): every series of every target in 7 batched requests, then
    group, diagnose and compare. Raises PrometheusError (one line) when nothing matches."""
    from ..collectors.prometheus import fetch  # noqa: PLC0415

    fr = fetch(client, start, end, selector=selector, step=step)
    if not fr.cols:
        raise no_series_error(client.base, selector, start, end)
    targets = build_targets(fr.cols, fr.types, source=client.base)
    dsec = diagnose_targets(targets, diagnose)
    everywhere = set(CORE_SIGNALS)
    for t in targets:
        everywhere &= set(t.missing_signals)
    notes = list(fr.notes)
    notes += gpu_only_note(targets)
    return FleetReport(client.base, (start, end), selector, fr.mode, fr.step, targets, find_outliers(targets),
                       fr.queries, fr.seconds, dsec, len(fr.cols), [s for s in CORE_SIGNALS if s in everywhere],
                       notes, {"mode": "off"})


def sample_peers(healthy: list[TargetId], n: int) -> list[TargetId]:
    """``n`` targets spread evenly over the sorted healthy ones (deterministic)."""
    healthy = sorted(healthy)
    if n <= 0 or not healthy:
        return []
    if len(healthy) <= n:
        return healthy
    return [healthy[int(i * len(healthy) / n)] for i in range(n)]


def _light_targets(triaged: dict) -> dict[TargetId, FleetTarget]:
    """Triage answers -> targets with their flags and peer figures (several keys can name one host)."""
    light: dict[TargetId, FleetTarget] = {}
    for key, tt in triaged.items():
        tid = triage_target_id(tt.labels)
        t = light.get(tid)
        if t is None:
            t = light[tid] = FleetTarget(tid, None, missing_signals=None, examined=None)
        t.flags.extend(tt.flags)
        t.model = t.model or tt.model
        if tt.throughput is not None:
            t.throughput = (t.throughput or 0.0) + tt.throughput
        if tt.fragmentation is not None:
            t.fragmentation = tt.fragmentation if t.fragmentation is None else max(t.fragmentation, tt.fragmentation)
    return light


def diagnose_fleet(client, start: float, end: float, selector: str | None = None, step: float | None = None,
                   diagnose: Callable[[Window], Report] | None = None, triage: str = "auto",
                   peers: int = PEER_SAMPLE, deep_limit: int = DEEP_LIMIT,
                   progress: Callable[[int, int, str], None] | None = None) -> FleetReport:
    """Triage the fleet in PromQL, then fetch and diagnose the flagged targets one at a time.

    ``triage`` is auto (recorded triage rules when they cover the window, else queries), rules,
    queries, or off (the full download of every series: :func:`diagnose_fleet_full`).
    Memory holds one target's series at a time; the report keeps each target's report, not its data.
    """
    if triage == "off":
        return diagnose_fleet_full(client, start, end, selector=selector, step=step, diagnose=diagnose)
    from ..collectors.prometheus import PrometheusError, parse_selector  # noqa: PLC0415
    from . import triage as tri  # noqa: PLC0415

    if diagnose is None:
        from ..pipeline import diagnose as diagnose  # noqa: PLC0415
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PrometheusError(f"empty time window: start {start} is not before end {end}")
    user = parse_selector(selector) if isinstance(selector, str) else list(selector or [])
    q0 = client.queries
    tr = tri.run_triage(client, start, end, user, mode=triage)
    light = _light_targets(tr.targets)
    if not light:
        raise no_series_error(client.base, selector, start, end)
    targets = list(light.values())
    outliers = find_outliers(targets)
    flagged = sorted(t.id for t in targets if t.flags)
    odd = sorted({light_id for o in outliers for light_id in light if str(light_id) == o.target} - set(flagged))
    healthy = [t.id for t in targets if not t.flags and t.id not in odd]
    sampled = sample_peers(healthy, peers)
    plan = [(tid, "flagged") for tid in flagged] + [(tid, "outlier") for tid in odd] + \
        [(tid, "peer-sample") for tid in sampled]
    if len(targets) <= len(plan) or len(targets) <= peers:
        plan = [(t, "flagged" if light[t].flags else "whole-fleet") for t in sorted(light)]
    skipped = plan[deep_limit:]
    plan = plan[:deep_limit]
    notes = list(tr.notes)
    if skipped:
        notes.append(f"{len(skipped)} flagged or outlying target(s) beyond --deep-limit {deep_limit} were not "
                     f"deep-diagnosed; their triage values are listed (status 'flagged')")

    st = deep_diagnose(client, start, end, user, step, plan, light, targets, notes, diagnose, progress)

    examined = [t for t in targets if t.examined is not None]
    everywhere = set(CORE_SIGNALS)
    for t in examined:
        everywhere &= set(t.missing_signals or ())
    missed = [f"{t.id} ({t.top.id})" for t in examined if t.examined == "peer-sample" and t.top is not None]
    if missed:
        notes.append(f"sampled healthy peer(s) have findings the triage did not flag: {', '.join(missed)}; the "
                     "triage checks levels only (see fleet.triage.unchecked), rerun with --triage off for a full "
                     "diagnosis")
    notes += gpu_only_note([t for t in examined if t.missing_signals is not None])
    info = {"mode": tr.mode, "queries": tr.queries, "seconds": round(tr.seconds, 3),
            "checks": list(tri.CHECK_IDS), "unchecked": list(tri.UNCHECKED),
            "fleet_targets": len(targets), "flagged": len(flagged), "outliers": len(odd),
            "peers_sampled": sum(1 for _, w in plan if w == "peer-sample"),
            "examined": len(examined), "not_examined": len(targets) - len(examined)}
    return FleetReport(client.base, (start, end), selector, st.mode, st.step, targets, outliers,
                       client.queries - q0, st.fetch_seconds, st.diagnose_seconds, st.series,
                       [s for s in CORE_SIGNALS if s in everywhere] if examined else [], notes, info)
