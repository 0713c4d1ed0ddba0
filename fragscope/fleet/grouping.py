"""Which serving target a series belongs to: the grouping rules of docs/fleet.md#grouping.

1. A series belongs to the Kubernetes pod named by ``exported_pod`` (+ ``exported_namespace``) when
   it has one: Prometheus renames a scraped ``pod`` label that way when the target's own labels
   (dcgm-exporter's pod) clash and ``honor_labels`` is off. Else ``pod`` (+ ``namespace``), else
   ``pod_name`` (+ ``pod_namespace``, old dcgm-exporter releases).
2. Series without any pod label are grouped by the host part of ``instance``; when one host runs
   several engine instances (vLLM on :8000 and :8001), each ``instance`` is its own target, since
   nothing tells which GPU serves which engine.
3. Series with neither (e.g. a backfilled recording) form one target named ``(unlabelled)``.

Labels are kept as they are: the detectors see the same series a recording of the pod would hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..model import SeriesKey

UNLABELLED = "(unlabelled)"
ENGINE_PREFIXES = ("vllm:", "sglang:")


@dataclass(frozen=True, order=True)
class TargetId:
    """Who a series belongs to: a pod (namespace, pod), an instance, or nothing."""

    kind: str  # "pod" | "instance" | "host" | "none"
    namespace: str | None
    name: str

    def __str__(self) -> str:
        if self.kind == "pod":
            return f"{self.namespace}/{self.name}" if self.namespace else self.name
        return self.name


def pod_of(labels: Mapping[str, str] | tuple) -> tuple[str | None, str | None]:
    """(namespace, pod) of a series by rule 1, or (None, None)."""
    d = dict(labels) if not isinstance(labels, Mapping) else labels
    if d.get("exported_pod"):
        return d.get("exported_namespace") or d.get("namespace"), d["exported_pod"]
    if d.get("pod"):
        return d.get("namespace"), d["pod"]
    if d.get("pod_name"):
        return d.get("pod_namespace") or d.get("namespace"), d["pod_name"]
    return None, None


def host_of(instance: str) -> str:
    """The host part of an ``instance`` label (``[::1]:9090`` -> ``[::1]``, ``pod:8000`` -> ``pod``)."""
    if instance.startswith("["):  # [::1]:9090
        return instance.split("]")[0] + "]"
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def group_targets(cols: Mapping[SeriesKey, tuple[np.ndarray, np.ndarray]]) -> dict[TargetId, dict[SeriesKey, tuple]]:
    """Assign every series to a target (rules in the module docstring)."""
    out: dict[TargetId, dict[SeriesKey, tuple]] = {}
    no_pod: list[tuple[SeriesKey, str | None]] = []
    for key, col in cols.items():
        labels = dict(key.labels)
        ns, pod = pod_of(labels)
        if pod:
            out.setdefault(TargetId("pod", ns, pod), {})[key] = col
        else:
            no_pod.append((key, labels.get("instance")))
    if no_pod:
        engines_per_host: dict[str, set[str]] = {}
        for key, inst in no_pod:
            if inst and key.name.startswith(ENGINE_PREFIXES):
                engines_per_host.setdefault(host_of(inst), set()).add(inst)
        for key, inst in no_pod:
            if not inst:
                tid = TargetId("none", None, UNLABELLED)
            elif len(engines_per_host.get(host_of(inst), ())) > 1:
                tid = TargetId("instance", None, inst)
            else:
                tid = TargetId("host", None, host_of(inst))
            out.setdefault(tid, {})[key] = cols[key]
    return out


def triage_target_id(labels: Mapping[str, str]) -> TargetId:
    """The target a triage answer's (namespace, pod, instance) names (grouping rules 1-3)."""
    if labels.get("pod"):
        return TargetId("pod", labels.get("namespace") or None, labels["pod"])
    if labels.get("instance"):
        return TargetId("host", None, host_of(labels["instance"]))
    return TargetId("none", None, UNLABELLED)


def target_matchers(tid: TargetId) -> list[tuple[str, str, str]]:
    """Label matchers that select one target's series (merged with the user's selector)."""
    from .triage import rx_escape  # noqa: PLC0415

    if tid.kind == "pod":
        return ([("namespace", "=", tid.namespace)] if tid.namespace else []) + [("pod", "=", tid.name)]
    if tid.kind == "instance":
        return [("instance", "=", tid.name), ("pod", "=", ""), ("exported_pod", "=", "")]
    if tid.kind == "host":
        return [("instance", "=~", rx_escape(tid.name) + "(:[0-9]+)?"), ("pod", "=", ""), ("exported_pod", "=", "")]
    return [("instance", "=", ""), ("pod", "=", ""), ("exported_pod", "=", "")]
