"""Diagnoses and what to do about them: the registry (one declaration per diagnosis, registry.py),
the window diagnoses (window.py: one line per module of fragscope.detectors, which holds its playbook),
the deep-evidence ones (evidence.py), and attaching a built playbook to each finding.

A playbook says what to do now, what fixes it for good (with values computed from the evidence and
the engine's config), when *not* to apply each fix, and how to verify it worked. Ids are contracts
(docs/diagnoses.md).
"""
from __future__ import annotations

from ..model import Action, Playbook, Report
from . import evidence, window
from ..advice.fixes import EXPANDABLE_CONTRA
from .registry import Diagnosis, Registry, raw_names

# The window diagnoses in run order, then the deep-evidence ones. Declared modules load when a listing needs
# them all, or one by one when a finding's playbook is looked up by its id (Registry.get).
REGISTRY = Registry(sources=window.SOURCES + evidence.SOURCES)


def __getattr__(name: str):
    if name == "PLAYBOOKS":  # id -> Playbook, derived from the registry (diagnose explain, docs checks)
        playbooks = {d.id: d.playbook for d in REGISTRY}
        globals()["PLAYBOOKS"] = playbooks
        return playbooks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(d: Diagnosis) -> Diagnosis:
    """Register a diagnosis declared outside this package (e.g. by an engine adapter)."""
    REGISTRY.add(d)
    if "PLAYBOOKS" in globals():
        globals()["PLAYBOOKS"][d.id] = d.playbook
    return d


def computed_actions(diag_id: str, ctx: dict, config: dict) -> list[str]:
    """Concrete actions with values from the evidence and the engine's config."""
    d = REGISTRY.get(diag_id)
    return d.actions(ctx or {}, config or {}) if d is not None else []


def build_playbook(diag_id: str, ctx: dict, config: dict) -> dict:
    d = REGISTRY.get(diag_id)
    if d is None:
        # Never silent: an unregistered id is a programming error the tests catch (test_registry).
        raise KeyError(f"diagnosis {diag_id!r} is not registered (fragscope/playbooks)")
    kind = (ctx or {}).get("job_kind")  # the job that produced the evidence (a log's, a snapshot's frames)
    pb = d.playbook
    if kind is not None:
        from ..advice.jobs import kind_of
        from ..advice.jobtext import playbook_for

        pb = playbook_for(pb, kind_of(ctx))  # in that job's knobs only
    out = pb.to_dict()
    out["actions"] = d.actions(ctx or {}, config or {})
    return out


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def _peers(report: Report) -> dict:
    """What each finding's actions may need to know of the others in the same report: the ids found,
    and the settings a sizing finding computed (so kv-cache-pressure quotes the value kv-pool-undersized
    worked out instead of a rule of thumb, and no two findings give two values for one flag)."""
    settings: dict = {}
    for f in report.findings:
        rec = f.context.get("recommendation") if isinstance(f.context, dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("settings"), dict):
            for k, v in rec["settings"].items():
                settings.setdefault(k, (v, f.id))
    return {"ids": frozenset(f.id for f in report.findings), "settings": settings}


def attach_playbooks(report: Report) -> Report:
    """Give each finding its built playbook, computed actions from its context included."""
    peers = _peers(report)
    for f in report.findings:
        pb = f.playbook if isinstance(f.playbook, dict) else {}
        if "immediate" in pb or "options" in pb:
            continue  # already built (a snapshot's own playbook)
        ctx = dict(f.context)
        ctx.update(pb.get("context", {}))  # detectors that still pass context through ``playbook``
        ctx["_peers"] = peers
        config = ctx.pop("_config", {})
        f.playbook = build_playbook(f.id, ctx, config)
        f.playbook["actions"] = _dedupe(f.playbook["actions"])
    return report


def render_playbook_text(pb: Playbook) -> str:
    lines = [f"{pb.id}: {pb.title}", "", pb.meaning, "", "Now:"]
    lines += [f"  - {x}" for x in pb.immediate]
    lines += ["", "Durable fixes:"]
    for a in pb.durable:
        lines.append(f"  - {a.text}")
        for p in a.preconditions:
            lines.append(f"      when: {p}")
        for c in a.contraindications:
            lines.append(f"      not when: {c}")
    lines += ["", "Verify:"] + [f"  - {v}" for v in pb.verify]
    if pb.references:
        lines += ["", "References:"] + [f"  - {r}" for r in pb.references]
    return "\n".join(lines)


__all__ = ["Action", "Playbook", "Diagnosis", "REGISTRY", "PLAYBOOKS", "EXPANDABLE_CONTRA", "register",
           "computed_actions", "build_playbook", "attach_playbooks", "render_playbook_text", "raw_names"]
