"""The committed Grafana dashboard is a fresh build of dashboards/build.py and is importable and
provisioning-ready; the alert rules pass ``promtool check rules`` and their ``promtool test rules``
unit tests, with one alert per diagnosis each tested firing and silent."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess

import pytest

from fragscope.playbooks import REGISTRY

from test_fleet_harness import PROMTOOL, ROOT, needs_prometheus

DASH_DIR = os.path.join(ROOT, "dashboards")
DASHBOARD = os.path.join(DASH_DIR, "fragscope.json")
RULES = os.path.join(DASH_DIR, "rules", "fragscope-alerts.yml")
RULE_TESTS = os.path.join(DASH_DIR, "rules", "tests")
DIAGNOSES = REGISTRY.alerting()  # every alerting diagnosis needs a rule and its promtool test


def _dashboard() -> dict:
    with open(DASHBOARD, encoding="utf-8") as fh:
        return json.load(fh)


def test_committed_json_is_a_fresh_build():
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk not installed (test extra)")
    spec = importlib.util.spec_from_file_location("fragscope_dashboards_build", os.path.join(DASH_DIR, "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(DASHBOARD, encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == mod.render(), "dashboards/fragscope.json is stale: run python dashboards/build.py"


def test_dashboard_is_provisioning_ready():
    d = _dashboard()
    assert d["uid"] and "id" not in d and "__inputs" not in d  # no import-only placeholders
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod", "model", "gpu"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        assert v["includeAll"] and v["allValue"] == ".*"  # "All" also matches series without the label
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in d["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"{p['title']} overlaps another panel"
        cells |= mine


def test_dashboard_has_the_panels_on_call_needs():
    d = _dashboard()
    by_title = {p["title"]: p for p in d["panels"]}
    exprs = {t: " ".join(x["expr"] for x in p["targets"]) for t, p in by_title.items()}
    seeds = exprs["Throughput vs allocator fragmentation"]
    assert "vllm:generation_tokens_total" in seeds and "fragscope_torch_reserved_bytes" in seeds
    mem = exprs["GPU memory: allocated / reserved / NVML used"]
    assert all(n in mem for n in ("fragscope_torch_allocated_bytes", "fragscope_torch_reserved_bytes",
                                  "fragscope_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED"))
    assert "vllm:num_preemptions_total" in exprs["Preemptions per minute"]
    kv = exprs["KV-cache usage"]
    assert "vllm:kv_cache_usage_perc" in kv and "vllm:gpu_cache_usage_perc" in kv  # V1 and V0
    assert "num_requests_running" in exprs["Requests running and waiting"]
    assert "num_requests_waiting" in exprs["Requests running and waiting"]
    ttft = exprs["Time to first token p50 / p99"]
    assert "histogram_quantile(0.5," in ttft and "histogram_quantile(0.99," in ttft
    gaps = exprs["Kernel gaps p50 / p99 and GPU idle share"]
    assert 'quantile="0.5"' in gaps and 'quantile="0.99"' in gaps and "fragscope_gpu_idle_ratio" in gaps
    clk = exprs["SM clock and temperature"]
    assert all(n in clk for n in ("fragscope_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK",
                                  "fragscope_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP"))
    assert by_title["Active diagnoses"]["type"] == "state-timeline"
    assert "fragscope_diagnosis_severity" in exprs["Active diagnoses"]
    assert "severity=" not in exprs["Active diagnoses"]  # a value, not a label (issue 20)


def test_committed_alert_rules_are_generated():
    """dashboards/rules/fragscope-alerts.yml is written from the diagnoses' modules: regenerating changes nothing."""
    from fragscope.fleet.alerts import alerts_yaml

    with open(RULES, encoding="utf-8") as fh:
        assert fh.read() == alerts_yaml(), \
            "stale: run python -m fragscope.fleet.alerts > dashboards/rules/fragscope-alerts.yml"


def test_alert_thresholds_are_the_detectors_config():
    """Each alert names the Config fields it compares against: the values are the detector's Config
    (the one its change and level rules run with) and each appears in the committed expression."""
    from fragscope.promql import num

    committed = {r["alert"]: r for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    seen = set()
    for d in REGISTRY.window():
        if not d.alerting:
            continue
        assert d.alert is not None, f"{d.id}: no alert rule (alert=module.alert_rule in its registration)"
        a = d.alert()
        assert a.diagnosis == d.id, d.id
        cfg = d.config()
        for field, value in a.thresholds.items():
            assert getattr(cfg, field) == value, (d.id, field, value, getattr(cfg, field))
            shown = a.shown.get(field, num(value))
            assert shown in committed[a.name]["expr"] or f"{value:.0f}" in committed[a.name]["expr"], \
                (d.id, field, shown)
        assert committed[a.name]["for"] == a.for_ and committed[a.name]["labels"]["severity"] == a.severity
        seen.add(d.id)
    assert seen == set(DIAGNOSES) - {"fragscope-collector"}
    # the thresholds the hand-written rules used and the detectors never did are gone
    exprs = " ".join(r["expr"] for r in committed.values())
    assert "> 0.2\n" not in exprs and ">= 85" not in exprs and "0.8 * max_over_time" not in exprs
    assert "> 0.25" not in committed["FragscopeKvBlockSizeMismatch"]["expr"]


def test_docs_alert_table_is_generated():
    from fragscope.fleet.alerts import alerts_markdown

    with open(os.path.join(ROOT, "docs", "dashboards.md"), encoding="utf-8") as fh:
        assert alerts_markdown() in fh.read(), "stale: python -m fragscope.fleet.alerts --markdown into docs/dashboards.md"


def test_alert_rule_thresholds_follow_the_config():
    """The rule is generated from the Config it is given: another threshold, another expression."""
    from fragscope.detectors import fragmentation

    base = fragmentation.alert_rule()
    other = fragmentation.alert_rule(fragmentation.Config(frag_high=0.4))
    assert ">= on (" in base.expr and base.expr != other.expr and other.thresholds["frag_high"] == 0.4


def _yaml():
    return pytest.importorskip("yaml", reason="PyYAML not installed (test extra)")


def _rules() -> dict:
    yaml = _yaml()
    with open(RULES, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_one_alert_per_diagnosis_and_agent_alerts():
    alerts = [r for g in _rules()["groups"] for r in g["rules"] if "alert" in r]
    by_diag = {}
    for a in alerts:
        d = a.get("labels", {}).get("diagnosis")
        if d:
            by_diag.setdefault(d, []).append(a["alert"])
        assert a["annotations"]["summary"] and a["annotations"]["runbook"], a["alert"]
    for d in DIAGNOSES:
        assert len(by_diag.get(d, [])) == 1, (d, by_diag.get(d))
    exprs = {a["alert"]: a["expr"] for a in alerts}
    assert "fragscope_diagnosis_active" in exprs["FragscopeDiagnosisActive"]
    # severity is joined as a value: no label of the alert's series changes when the finding's severity does
    assert "fragscope_diagnosis_severity" in exprs["FragscopeDiagnosisActive"]
    assert "severity" not in re.sub(r"fragscope_diagnosis_severity", "", exprs["FragscopeDiagnosisActive"])
    assert "fragscope_collector_up" in exprs["FragscopeCollectorDown"]


def test_every_alert_is_tested_firing_and_silent():
    """Each alert has a promtool test that expects it to fire, and one evaluation expecting silence."""
    alerts = {r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    fires, silent = set(), set()
    yaml = _yaml()
    for name in sorted(os.listdir(RULE_TESTS)):
        if name.startswith("triage-"):
            continue  # the fleet triage's recording rules (fragscope-triage.yml), tested on their own
        with open(os.path.join(RULE_TESTS, name), encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        assert doc["rule_files"] == ["../fragscope-alerts.yml"], name
        for t in doc["tests"]:
            for a in t.get("alert_rule_test", []):
                (fires if a.get("exp_alerts") else silent).add(a["alertname"])
    assert alerts <= fires, f"alerts never tested firing: {alerts - fires}"
    assert alerts <= silent, f"alerts never tested silent: {alerts - silent}"


@needs_prometheus
def test_promtool_check_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_prometheus
@pytest.mark.e2e  # promtool runs every rule test file (~25 s of CPU): run by .ci/run
def test_promtool_test_rules():
    files = sorted(os.path.join(RULE_TESTS, f) for f in os.listdir(RULE_TESTS) if f.endswith(".yml"))
    assert len(files) >= 8
    r = subprocess.run([PROMTOOL, "test", "rules", *files], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("SUCCESS") == len(files)


@needs_prometheus
@pytest.mark.e2e
def test_promtool_test_rules_catches_a_broken_rule(tmp_path):
    """The unit tests can fail: raise the fragmentation threshold and the firing case must break."""
    with open(RULES, encoding="utf-8") as fh:
        text = fh.read()
    from fragscope.detectors import fragmentation

    from fragscope.fleet.alerts import as_recorded

    # the rule generated from a Config asking 60 % unusable, where the firing case holds 30 %
    good = as_recorded(fragmentation.alert_rule).expr
    bad = as_recorded(lambda: fragmentation.alert_rule(fragmentation.Config(frag_high=0.6, frag_sustained=0.6))).expr
    broken = text.replace(good, bad)
    assert broken != text
    (tmp_path / "fragscope-alerts.yml").write_text(broken)
    tests = tmp_path / "tests"
    tests.mkdir()
    with open(os.path.join(RULE_TESTS, "allocator-fragmentation.yml"), encoding="utf-8") as fh:
        (tests / "t.yml").write_text(fh.read())
    r = subprocess.run([PROMTOOL, "test", "rules", str(tests / "t.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "FAILED" in (r.stdout + r.stderr)


def test_repeated_signal_reads_are_recorded_once():
    """The signal reads and shared sub-expressions the alerts repeat are recording rules of the alerts' own
    group, placed before every alert, each the very expression it stands for; the alerts read the recorded
    series and never the raw read."""
    from fragscope.fleet import alerts

    recorded = alerts.signal_recordings()
    assert len(recorded) >= 4 and len(set(recorded.values())) == len(recorded)
    assert {u[0] for u in recorded if len(u) == 2} <= set(alerts.SHARED_DOC)
    groups = _rules()["groups"]
    (group,) = [g for g in groups if g["name"] == "fragscope.diagnoses"]
    kinds = ["record" if "record" in r else "alert" for r in group["rules"]]
    assert kinds == sorted(kinds, reverse=True), "recording rules first"
    records = {r["record"]: r["expr"] for r in group["rules"] if "record" in r}
    assert records == {name: alerts.recording_expr(use) for use, name in recorded.items()}
    other_names = {r.get("record") for g in groups if g is not group for r in g["rules"]}
    assert not other_names & set(records)
    exprs = [r["expr"] for r in group["rules"] if "alert" in r]
    for use, name in recorded.items():
        assert sum(e.count(f"({name})") for e in exprs) >= 2, name
        assert not any(alerts.recording_expr(use) in e for e in exprs), name
    # the rule file's alerts are the modules' alerts with those reads replaced, nothing else
    for d in REGISTRY.window():
        raw, rec = d.alert(), alerts.as_recorded(d.alert)
        back = rec.expr
        for _ in recorded:  # shared sub-expressions hold recorded reads: undo until nothing changes
            for use, name in recorded.items():
                back = back.replace(f"({name})", f"({use[1]})" if len(use) == 2 else alerts.recording_expr(use))
        assert back == raw.expr and (rec.for_, rec.severity, rec.thresholds) == (raw.for_, raw.severity, raw.thresholds)


@needs_prometheus
@pytest.mark.e2e  # promtool over every alert test's series (~20 s of CPU): run by .ci/run
def test_recorded_reads_give_the_same_vectors(tmp_path):
    """On every alert test's input series and evaluation times, each alert expression as the rule file holds
    it (reading the recorded series) yields exactly the vector of the module's raw expression."""
    yaml = _yaml()
    from fragscope.fleet import alerts

    group = {"name": "eq", "rules": [{"record": name, "expr": alerts.recording_expr(use)}
                                     for use, name in alerts.signal_recordings().items()]}
    pairs = []
    for i, d in enumerate(r for r in REGISTRY.window() if r.alerting and r.alert is not None):
        raw, rec = d.alert().expr, alerts.as_recorded(d.alert).expr
        if raw == rec:
            continue
        group["rules"] += [{"record": f"fragscope_eq:raw_{i}", "expr": raw}, {"record": f"fragscope_eq:rec_{i}", "expr": rec}]
        pairs.append(i)
    assert pairs
    (tmp_path / "eq.yml").write_text(yaml.safe_dump({"groups": [group]}))
    tests = []
    for name in sorted(os.listdir(RULE_TESTS)):
        if name.startswith("triage-") or not name.endswith(".yml"):
            continue
        with open(os.path.join(RULE_TESTS, name), encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        for t in doc["tests"]:
            times = sorted({a["eval_time"] for a in t.get("alert_rule_test", [])})
            checks = [{"expr": f"(fragscope_eq:raw_{i} unless fragscope_eq:rec_{i}) or (fragscope_eq:rec_{i} unless "
                               f"fragscope_eq:raw_{i}) or (fragscope_eq:raw_{i} != fragscope_eq:rec_{i})",
                       "eval_time": at, "exp_samples": []} for i in pairs for at in times]
            if checks:
                tests.append({"interval": t.get("interval", "1m"), "input_series": t["input_series"],
                              "promql_expr_test": checks})
    assert len(tests) >= 8
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["eq.yml"], "evaluation_interval":
                                                     "1m", "tests": tests}))
    r = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "t.yml")], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_docs_recorded_signal_table_is_generated():
    from fragscope.fleet.alerts import signals_markdown

    with open(os.path.join(ROOT, "docs", "dashboards.md"), encoding="utf-8") as fh:
        assert signals_markdown() in fh.read(), \
            "stale: python -m fragscope.fleet.alerts --signals into docs/dashboards.md"
