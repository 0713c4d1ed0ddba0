"""The diagnosis registry is the one list: every registered diagnosis has a playbook, a doc row, and
(alerting ones) an alert rule, its promtool test, a scenario family and a place in the evaluation;
the package's layers import downward only and detectors do no I/O."""
from __future__ import annotations

import ast
import os
import pathlib
import re

import pytest
import yaml

from fragscope.model import Finding, Playbook, Report, Severity
from fragscope.playbooks import PLAYBOOKS, REGISTRY, attach_playbooks, build_playbook
from fragscope.playbooks.registry import Diagnosis
from fragscope.scenarios import ARTEFACT_FAMILIES, PATHOLOGIES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "fragscope"


def registry_gaps(d: Diagnosis, registry=REGISTRY) -> list[str]:
    """Everything a registered diagnosis still lacks, all at once (docs/diagnoses.md "Adding a diagnosis")."""
    from fragscope import ids
    from fragscope.fleet.alerts import alerts_yaml

    gaps = []
    if d.id not in ids.ALL:
        gaps.append(f"no constant for {d.id!r} in fragscope/ids.py")
    pb = d.playbook
    if not (pb.title and pb.meaning):
        gaps.append("playbook: a title and its meaning (PLAYBOOK in the diagnosis's module)")
    if not (pb.immediate and pb.durable and pb.verify and all(a.text for a in pb.durable)):
        gaps.append("playbook: what to do now, durable fixes (each with its text), how to verify")
    if PLAYBOOKS.get(d.id) is not pb:
        gaps.append("playbook not in PLAYBOOKS (register it through fragscope.playbooks)")
    from fragscope.playbooks.registry import THRESHOLDS_BEGIN, THRESHOLDS_END

    doc = (ROOT / "docs" / "diagnoses.md").read_text(encoding="utf-8")
    if THRESHOLDS_BEGIN in doc:  # the generated threshold table is no description
        doc = doc[:doc.index(THRESHOLDS_BEGIN)] + doc[doc.index(THRESHOLDS_END):]
    if not any(f"`{d.id}`" in ln for ln in doc.splitlines() if ln.startswith("|")):
        gaps.append(f"no table row for `{d.id}` in docs/diagnoses.md")
    for s in d.suppressed_by:
        if s not in registry:
            gaps.append(f"suppressed_by names {s!r}, which is not registered")
        elif registry[s].signature is None:
            gaps.append(f"suppressed_by names {s!r}, which declares no signature")
    if d.source == "window":
        if not callable(d.detect):
            gaps.append("no detector (detect=module.detect)")
        if d.config is None:
            gaps.append("no Config (config=module.Config: every threshold, with its source)")
        if not d.alerting:
            gaps.append("window diagnoses are exported by the agent: alerting must stay True")
    if d.alerting:
        if d.alert is None:
            gaps.append("no alert rule (alert=module.alert_rule, generated from its Config)")
        else:
            name = d.alert().name
            if f"- alert: {name}\n" not in (ROOT / "dashboards" / "rules" / "fragscope-alerts.yml").read_text(encoding="utf-8"):
                gaps.append(f"{name} is not in dashboards/rules/fragscope-alerts.yml: python -m fragscope.fleet.alerts "
                            "> dashboards/rules/fragscope-alerts.yml")
            test = ROOT / "dashboards" / "rules" / "tests" / f"{d.id}.yml"
            if not test.is_file():
                gaps.append(f"no promtool test dashboards/rules/tests/{d.id}.yml (the alert firing, and silent on "
                            "a confounder)")
            else:
                doc = yaml.safe_load(test.read_text(encoding="utf-8"))
                cases = [a for t in doc.get("tests", []) for a in t.get("alert_rule_test", []) if a.get("alertname") == name]
                if not any(a.get("exp_alerts") for a in cases) or not any(not a.get("exp_alerts") for a in cases):
                    gaps.append(f"dashboards/rules/tests/{d.id}.yml must test {name} firing and silent")
        if d.id not in PATHOLOGIES:
            gaps.append(f"no scenario family for {d.id} (fragscope/scenarios/spec.py PATHOLOGIES, with confounders)")
        if d.alert is not None:
            name = d.alert().name
            if f"| {name} | {d.id} |" not in (ROOT / "docs" / "dashboards.md").read_text(encoding="utf-8"):
                gaps.append(f"{name} is not in the alert table of docs/dashboards.md (python -m fragscope.fleet.alerts "
                            "--markdown, between its markers)")
            if f"alert: {name}\n" not in (ROOT / "deploy" / "kubernetes" / "prometheus-operator.yaml").read_text(encoding="utf-8"):
                gaps.append(f"{name} is not in deploy/kubernetes/prometheus-operator.yaml: python deploy/render.py")
    if d.source == "window" and d.config is not None:
        from fragscope.playbooks.registry import thresholds_markdown

        table = (ROOT / "docs" / "diagnoses.md").read_text(encoding="utf-8")
        if thresholds_markdown(registry) not in table and f"| `{d.id}` | `" not in table:
            gaps.append("its Config is not in the threshold table of docs/diagnoses.md (python -m fragscope.playbooks, "
                        "between its markers)")
    if d.source == "config" and d.id not in ARTEFACT_FAMILIES:
        gaps.append(f"no artefact family for {d.id} (fragscope.scenarios.ARTEFACT_FAMILIES)")
    if d.alerting and d.alert is not None and registry is REGISTRY:
        if f"- alert: {d.alert().name}\n" not in alerts_yaml():
            gaps.append("the generator skips its alert rule")
    return gaps


def test_every_diagnosis_is_complete():
    """Every gap of every registered diagnosis, listed in one run (not one failure per run)."""
    assert len(REGISTRY) >= 15
    gaps = [f"{d.id}: {g}" for d in REGISTRY for g in registry_gaps(d)]
    assert not gaps, "diagnoses incomplete (docs/diagnoses.md, 'Adding a diagnosis'):\n  " + "\n  ".join(gaps)


def test_a_new_diagnosis_gets_every_gap_at_once():
    """A window diagnosis declared with a detector and a playbook only is told everything it still needs."""
    pb = Playbook("x-new-thing", "t", "m", ["now"], [], ["v"])
    d = Diagnosis("x-new-thing", pb, detect=lambda f: [], suppressed_by=("memory-leak",))
    gaps = "\n".join(registry_gaps(d))
    for part in ("fragscope/ids.py", "durable fixes", "PLAYBOOKS", "docs/diagnoses.md", "no signature",
                 "no Config", "no alert rule", "scenario family"):
        assert part in gaps, (part, gaps)
    assert len(registry_gaps(d)) >= 8


def test_a_module_with_a_detector_only_gets_every_gap_at_once():
    """Registered from a module that declares its id and detector only: every gap named, the playbook included."""
    import types

    mod = types.ModuleType("my_thing")
    mod.ID, mod.detect = "x-my-thing", (lambda f: [])
    d = Diagnosis.from_module(mod)
    assert d.playbook.id == "x-my-thing" and d.actions({}, {}) == []
    gaps = "\n".join(registry_gaps(d))
    for part in ("fragscope/ids.py", "PLAYBOOK in the diagnosis's module", "durable fixes", "docs/diagnoses.md",
                 "no Config", "no alert rule", "scenario family"):
        assert part in gaps, (part, gaps)


def test_a_module_declares_everything_the_registry_reads():
    """Each window diagnosis's module holds what its registration carries: from_module copies it unchanged."""
    import importlib

    from fragscope.playbooks import window
    from fragscope.playbooks.registry import MODULE_FIELDS

    assert [d.id for d in REGISTRY.window()] == [importlib.import_module(f"fragscope.detectors.{m}").ID
                                                 for m in window.MODULES]
    for name in window.MODULES:
        mod = importlib.import_module(f"fragscope.detectors.{name}")
        d = REGISTRY[mod.ID]
        assert d.playbook is mod.PLAYBOOK and d.detect is mod.detect and d.config is mod.Config, name
        for attr, key in MODULE_FIELDS:
            if hasattr(mod, attr):
                assert getattr(d, key) == getattr(mod, attr), (name, attr)


def test_config_diagnoses_and_artefact_families_match_the_registry():
    """Diagnoses judged from a config + counters (source "config") have a scenario family too, as does any
    deep-evidence diagnosis that declares one (cpu-fallback: ORT profiles); each family names both sides."""
    for d in REGISTRY:
        if d.source == "config":
            assert d.id in ARTEFACT_FAMILIES, f"the scenario generator has no family for {d.id}"
    for did, (pathologies, confounders) in ARTEFACT_FAMILIES.items():
        assert did in REGISTRY and REGISTRY[did].source != "window", did
        assert pathologies and confounders and not set(pathologies) & set(confounders), did


def test_window_diagnoses_are_alerting_and_have_detectors():
    for d in REGISTRY.window():
        assert d.alerting and callable(d.detect), d.id
    for d in REGISTRY:
        if d.source != "window":
            assert d.detect is None and not d.alerting, d.id


def test_declaration_errors_are_caught():
    pb = Playbook("x-test", "t", "m", ["now"], [], ["v"])
    with pytest.raises(ValueError, match="unknown signal"):
        Diagnosis("x-test", pb, detect=lambda f: [], requires=("no_such_signal",))
    with pytest.raises(ValueError, match="needs a detector"):
        Diagnosis("x-test", pb)
    with pytest.raises(ValueError, match="differs"):
        Diagnosis("y-test", pb, detect=lambda f: [])
    with pytest.raises(ValueError, match="registered twice"):
        REGISTRY.add(REGISTRY["memory-leak"])


def test_unregistered_finding_is_an_error_not_a_missing_playbook():
    r = Report(window=(0.0, 1.0), findings=[Finding("no-such-diagnosis", Severity.INFO, 0.5, "s")])
    with pytest.raises(KeyError, match="not registered"):
        attach_playbooks(r)


def test_computed_actions_come_from_the_registration():
    pb = build_playbook("allocator-fragmentation", {"slack_bytes": 8 * 1024**3, "gpu_memory_total_bytes": 80 * 1024**3},
                        {"gpu_memory_utilization": "0.92"})
    first = pb["actions"][0]
    assert "--gpu-memory-utilization 0.87 (currently 0.92)" in first and "8.0 GiB" in first and "4.0 GiB" in first
    pb = build_playbook("kv-cache-pressure", {"running": 100}, {"gpu_memory_utilization": "0.9"})
    assert any("--max-num-seqs at ~80" in a for a in pb["actions"])
    assert any("0.90 → 0.93" in a for a in pb["actions"])


def test_attach_dedupes_actions_and_reads_context():
    f = Finding("memory-leak", Severity.WARNING, 0.6, "s", context={"hours_to_full": 10.0, "_config": {}})
    attach_playbooks(Report(window=(0.0, 1.0), findings=[f]))
    assert f.playbook["actions"] == ["Restart within 8.0 h (memory exhausted in ~10.0 h at this rate); "
                                     "take a memory snapshot first."]
    assert "context" not in f.to_dict()


# --- layering: model/signals/units -> collectors -> detectors -> playbooks -> pipeline -> agent/cli/fleet
LAYER = {"model": 0, "signals": 0, "units": 0, "ids": 0, "promql": 0, "kvbudget": 1, "advice": 1, "collectors": 1, "probe": 1, "scenarios": 1,
         "sizing": 1, "detectors": 2, "playbooks": 3, "pipeline": 4, "report": 5, "agent": 6, "fleet": 6, "notebook": 6, "cli": 7, "mcp": 7, "gpus": 0,
         "timeline_model": 0, "trace_playbooks": 3, "trace_pipeline": 4, "snapshot_pipeline": 4}


def _modules():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, parts


def _imports(path: pathlib.Path, parts: list[str]):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = base + (node.module.split(".") if node.module else [])
                if not node.module:
                    for a in node.names:
                        yield mod + [a.name]
                    continue
                yield mod
            elif node.module and node.module.startswith("fragscope"):
                yield node.module.split(".")[1:]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fragscope."):
                    yield a.name.split(".")[1:]


def test_layers_import_downward_only():
    bad = []
    for path, parts in _modules():
        if not parts or parts[0] not in LAYER:
            continue
        mine = LAYER[parts[0]]
        for target in _imports(path, parts):
            if not target or target[0] not in LAYER or target[0] == parts[0]:
                continue
            if LAYER[target[0]] > mine:
                bad.append(f"{'/'.join(parts)} imports {'.'.join(target)}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


IO_MODULES = {"os", "io", "gzip", "bz2", "lzma", "sqlite3", "pickle", "socket", "http", "urllib", "requests",
              "pathlib", "subprocess", "shutil", "tempfile", "zipfile"}


def test_detectors_do_no_io():
    bad = []
    for path in (PKG / "detectors").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names if a.name.split(".")[0] in IO_MODULES]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] in IO_MODULES:
                    bad.append(f"{path.name}: from {node.module}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                bad.append(f"{path.name}:{node.lineno}: open()")
    assert not bad, "detectors must be pure:\n" + "\n".join(bad)


def test_every_package_says_what_it_holds():
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 4, f"{init.relative_to(ROOT)} has no docstring saying what it holds"


def test_metric_names_live_in_signals_only():
    """Raw engine metric names are spelled in signals.py (and the collectors that publish fragscope_*)."""
    pat = re.compile(r"[\"'](vllm|sglang|DCGM_FI)[:_][A-Za-z_]+[\"']")
    bad = []
    for sub in ("detectors", "playbooks"):
        for path in (PKG / sub).glob("*.py"):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pat.search(line):
                    bad.append(f"{sub}/{path.name}:{i}: {line.strip()[:100]}")
    assert not bad, "raw metric names outside signals.py:\n" + "\n".join(bad)


def test_docs_signal_table_is_generated():
    """docs/signals.md mirrors fragscope/signals.py: python -m fragscope.signals > docs/signals.md."""
    from fragscope.signals import markdown

    assert (ROOT / "docs" / "signals.md").read_text(encoding="utf-8") == markdown(), \
        "stale: python -m fragscope.signals > docs/signals.md"


def test_a_signal_of_an_unknown_scope_is_an_error_at_import():
    from fragscope.signals import SCOPES, Signal, Source

    assert {"engine", "gpu", "process", "container", "host"} <= set(SCOPES)
    with pytest.raises(ValueError, match="scope 'rack'"):
        Signal("x_test", "gauge", "rack", "", (Source("x_test"),))


def test_docs_state_the_memory_leak_thresholds_of_its_config():
    """The memory-leak row of docs/diagnoses.md quotes its Config (it once said 2 % and R² 0.8)."""
    from fragscope.detectors.memory_leak import Config

    c = Config()
    row = next(ln for ln in (ROOT / "docs" / "diagnoses.md").read_text(encoding="utf-8").splitlines()
               if ln.startswith("| `memory-leak` |"))
    assert f"≥ {c.growth_of_base * 100:g} % of baseline" in row and f"≥ {c.growth_of_total * 100:g} % of the GPU" in row
    assert f"R² ≥ {c.r2_min:g}" in row


def test_docs_threshold_table_is_generated_from_the_configs():
    from fragscope.playbooks.registry import thresholds_markdown

    assert thresholds_markdown(REGISTRY) in (ROOT / "docs" / "diagnoses.md").read_text(encoding="utf-8"), \
        "stale: python -m fragscope.playbooks into docs/diagnoses.md#thresholds"


def test_lazy_registry_lookups_load_one_source_and_listings_keep_the_order():
    """A lookup by id loads the module declaring it (not every window detector); a listing loads them all, in
    declaration order; lookups from several threads at once (the agent's) load each source once."""
    import threading

    from fragscope.playbooks import evidence, window
    from fragscope.playbooks.registry import Registry

    reg = Registry(sources=window.SOURCES + evidence.SOURCES)
    assert reg.get("allocator-stalls").source == "trace" and len(reg._parts) == 1
    assert reg.get("launch-bound").id == "launch-bound" and len(reg._parts) == 2  # launch_bound.py alone
    assert reg.get("no-such-diagnosis") is None and reg._complete
    assert [d.id for d in reg] == [d.id for d in REGISTRY]

    for _ in range(3):
        reg, errors = Registry(sources=window.SOURCES + evidence.SOURCES), []

        def look(ids):
            try:
                for did in ids:
                    assert reg.get(did) is not None
                list(reg)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        ids = [d.id for d in REGISTRY]
        threads = [threading.Thread(target=look, args=(ids[k::4],)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and [d.id for d in reg] == ids


def test_the_window_list_loads_the_window_sources_alone_in_the_full_order():
    """Registry.window() is the window diagnoses in the order of iterating over every diagnosis, without loading
    the deep-evidence sources; a source not marked window that declares a window diagnosis is refused."""
    from fragscope.playbooks import evidence, window
    from fragscope.playbooks.registry import Registry, Source

    fresh = Registry(sources=window.SOURCES + evidence.SOURCES)
    listed = [d.id for d in fresh.window()]
    assert not any(i in fresh._parts for i, s in enumerate(fresh.sources) if not s.window)
    assert listed == [d.id for d in Registry(sources=window.SOURCES + evidence.SOURCES) if d.source == "window"]
    assert listed == [d.id for d in REGISTRY.window()]
    wrong = Registry(sources=(Source("x", window.SOURCES[0].load),))
    with pytest.raises(ValueError, match="not marked window"):
        list(wrong)
