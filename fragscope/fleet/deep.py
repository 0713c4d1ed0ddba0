"""The deep fetch of the triaged path: each planned target's series fetched and diagnosed one at a
time (the next fetched while the detectors run on this one), reports kept, data dropped."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from ..model import Report, Window
from .grouping import TargetId, host_of, target_matchers
from .measures import CORE_SIGNALS
from .results import FleetTarget
from .targets import build_targets, diagnose_targets


@dataclass
class DeepStats:
    """What the deep fetch cost and how the server answered (the last target's mode and step)."""

    fetch_seconds: float = 0.0
    diagnose_seconds: float = 0.0
    series: int = 0
    mode: str = "raw"
    step: float | None = None


def deep_diagnose(client, start: float, end: float, user: list, step: float | None,
                  plan: list[tuple[TargetId, str]], light: dict[TargetId, FleetTarget], targets: list[FleetTarget],
                  notes: list[str], diagnose: Callable[[Window], Report],
                  progress: Callable[[int, int, str], None] | None = None) -> DeepStats:
    """Fetch and diagnose each ``(target, why)`` of ``plan`` in order, filling the triage's ``light``
    targets in place (``targets`` gains the engine instances a host target splits into, rule 2);
    server notes are appended to ``notes`` once each. Two targets' series in memory at most."""
    from ..collectors.prometheus import Batch, fetch, signal_batches  # noqa: PLC0415

    st = DeepStats(step=step)
    done: set[TargetId] = set()
    # one request per target (plus the exported_ variant for DCGM): a pod's series are a few MB
    (one_batch,) = [Batch(tuple(sorted(n for b in signal_batches() for n in b.names)),
                          {n: k for b in signal_batches() for n, k in b.types.items()})]

    def deep(tid: TargetId):
        return fetch(client, start, end, selector=user + target_matchers(tid), step=step, batches=[one_batch])

    order = [tid for tid, _ in plan]
    why_of = dict(plan)
    with ThreadPoolExecutor(max_workers=1) as ex:
        nxt = ex.submit(deep, order[0]) if order else None
        for i, tid in enumerate(order):
            if progress is not None:
                progress(i, len(order), str(tid))  # the CLI's bar: targets deep-fetched so far
            fr = nxt.result()
            nxt = ex.submit(deep, order[i + 1]) if i + 1 < len(order) else None
            why = why_of[tid]
            if tid in done:
                continue
            st.fetch_seconds += fr.seconds
            st.mode, st.step = fr.mode, fr.step
            for n in fr.notes:
                if n not in notes:
                    notes.append(n)
            built = build_targets(fr.cols, fr.types, source=client.base)
            st.series += len(fr.cols)
            del fr
            same = [b for b in built if b.id == tid or (tid.kind == "host" and b.id.kind == "instance"
                                                        and host_of(b.id.name) == tid.name)]
            if same and not any(b.id == tid for b in same) and light[tid] in targets:
                # the host runs several engines: each instance is its own target (rule 2)
                for b in same:
                    nt = light.setdefault(b.id, FleetTarget(b.id, None, missing_signals=None, examined=None))
                    nt.flags = nt.flags or list(light[tid].flags)
                targets.remove(light[tid])
            if not same:
                lt = light[tid]
                lt.examined = why
                lt.series_count = 0
                lt.missing_signals = list(CORE_SIGNALS)
                lt.error = "triage named this target but the deep fetch found none of its series"
                done.add(tid)
                continue
            for b in built:
                if b.id in done:
                    continue
                d0 = time.perf_counter()
                diagnose_targets([b], diagnose)
                st.diagnose_seconds += time.perf_counter() - d0
                lt = light.get(b.id)
                if lt is None:  # a target the triage keyed differently (an engine instance of a host)
                    lt = light[b.id] = FleetTarget(b.id, None, missing_signals=None, examined=None)
                    targets.append(lt)
                lt.report, lt.error, lt.examined = b.report, b.error, why
                lt.model = b.model or lt.model
                lt.missing_signals = b.missing_signals
                lt.series_count = len(b.window)
                if lt.throughput is None:
                    lt.throughput = b.throughput
                if lt.fragmentation is None:
                    lt.fragmentation = b.fragmentation
                done.add(b.id)
                b.window = None  # stream: keep the report, not the data
    return st
