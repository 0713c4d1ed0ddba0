"""Fleet diagnosis over Prometheus: one Window per serving target, diagnosed, summarised, compared.

Data flow: :func:`fragscope.collectors.prometheus.fetch` (a few batched requests for the whole
fleet, or one per target after the triage of :mod:`.triage`) -> :func:`group_targets` (series ->
targets, rules in :mod:`.grouping`) -> ``diagnose`` per target -> :func:`find_outliers` (peers
serving the same model) -> :class:`FleetReport` (``to_dict`` is the contract of
``diagnose --prometheus --format json``, documented in docs/fleet.md).

Modules: ``grouping`` (series -> targets, a target's label matchers), ``measures`` (a target's
tokens/s, fragmentation, model, signals present), ``outliers`` (peer comparison), ``results`` (the
report's data and JSON), ``targets`` (windows built and diagnosed), ``deep`` (the per-target deep
fetch), ``orchestrate`` (the triaged and full paths), ``triage`` (the PromQL checks and rules).
This package's names below are the public surface; import them from ``fragscope.fleet``.
"""
from __future__ import annotations

from .grouping import UNLABELLED, TargetId, group_targets, pod_of, target_matchers, triage_target_id
from .measures import CORE_SIGNALS, RECENT_SECONDS, counter_increase, fragmentation, model_of, present_signals, throughput
from .orchestrate import DEEP_LIMIT, PEER_SAMPLE, TRIAGE_MODES, diagnose_fleet, diagnose_fleet_full, sample_peers
from .outliers import find_outliers, robust_z
from .results import FleetReport, FleetTarget, Outlier
from .targets import build_targets, diagnose_targets

__all__ = [
    "CORE_SIGNALS", "DEEP_LIMIT", "PEER_SAMPLE", "RECENT_SECONDS", "TRIAGE_MODES", "UNLABELLED",
    "FleetReport", "FleetTarget", "Outlier", "TargetId",
    "build_targets", "counter_increase", "diagnose_fleet", "diagnose_fleet_full", "diagnose_targets",
    "find_outliers", "fragmentation", "group_targets", "model_of", "pod_of", "present_signals", "robust_z",
    "sample_peers", "target_matchers", "throughput", "triage_target_id",
]
