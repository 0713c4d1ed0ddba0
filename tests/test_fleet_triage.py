"""Fleet triage: the PromQL level checks, the recorded triage rules and their promtool unit
tests, parsing of the tagged answers, target keys and peer sampling. The end-to-end checks against a
backfilled Prometheus are in tests/test_fleet_backfill.py.
"""
from __future__ import annotations

import glob
import math
import os
import subprocess

import pytest

from test_fleet_harness import PROMTOOL, ROOT, needs_prometheus

RULES = os.path.join(ROOT, "dashboards", "rules", "fragscope-triage.yml")
RULE_TESTS = sorted(glob.glob(os.path.join(ROOT, "dashboards", "rules", "tests", "triage-*.yml")))


def test_committed_rules_are_generated():
    from fragscope.fleet.triage import rules_yaml

    with open(RULES, encoding="utf-8") as fh:
        assert fh.read() == rules_yaml(), "run: python -m fragscope.fleet.triage > dashboards/rules/fragscope-triage.yml"


def test_names_and_thresholds_come_from_their_sources():
    """No metric name or threshold is spelled twice: every raw source of the signals read appears, and
    the level thresholds are the diagnoses' Configs (the same as their detectors' level rules)."""
    from fragscope.detectors import fragmentation, kv_pressure
    from fragscope.detectors.fragmentation import Config as FragConfig
    from fragscope.detectors.kv_pressure import Config as KvConfig
    from fragscope.fleet import triage
    from fragscope.signals import SIGNALS

    text = " ".join(triage.ad_hoc_queries([], 3600))
    for sig in ("kv_cache_usage_ratio", "preemptions_total", "torch_reserved_bytes", "torch_allocated_bytes",
                "torch_alloc_retries_total", "gpu_sm_clock_hertz", "gpu_utilization_ratio",
                "generation_tokens_total"):
        for src in SIGNALS[sig].sources:
            assert triage.rx_escape(src.metric) in text, (sig, src.metric)
    kv = kv_pressure.triage_check()
    # with preemptions required, the level rule's edge is kv_edge_preempting (kv_pressure.level)
    assert f">= {KvConfig().kv_edge_preempting:g})" in kv and f">= {KvConfig().preempt_per_min:g})" in kv
    fr = fragmentation.triage_check()
    c = FragConfig()
    assert f"({c.frag_sustained:g} + {c.frag_high - c.frag_sustained:g} * (" in fr
    assert f"< bool {c.retries_sustained_per_min:g}))" in fr and f">= {c.retries_per_min:g})" in fr


def test_host_and_gpu_checks_take_their_detectors_thresholds():
    """engine-cpu-starved, engine-stalled, rank-straggler and gpu-hardware-fault: each check reads its
    signals' every raw name and compares against its module's Config; a changed Config changes the check."""
    from fragscope import ids
    from fragscope.detectors import cpu_starved, gpu_fault, stalled, straggler
    from fragscope.fleet import triage
    from fragscope.signals import SIGNALS

    assert not {ids.ENGINE_CPU_STARVED, ids.ENGINE_STALLED, ids.RANK_STRAGGLER, ids.GPU_HARDWARE_FAULT} & set(triage.UNCHECKED)
    assert set(triage.CHECK_IDS).isdisjoint(triage.UNCHECKED)
    cases = [
        (cpu_starved, ("container_cpu_throttled_periods_total", "container_cpu_periods_total", "requests_running"),
         [f">= {cpu_starved.Config().throttled_share:g})"], cpu_starved.Config(throttled_share=0.4)),
        (stalled, ("requests_running", "requests_waiting", "generation_tokens_total"),
         [f"[{2 * stalled.Config().critical_s:.0f}s]"], stalled.Config(critical_s=30)),
        (straggler, ("gpu_sm_clock_hertz", "gpu_utilization_ratio"),
         [f"< {1 - straggler.Config().clock_gap:g})", f">= {straggler.Config().util_busy:g})"],
         straggler.Config(clock_gap=0.2)),
        (gpu_fault, ("gpu_xid_last", "gpu_row_remap_failed", "gpu_row_remap_pending", "gpu_ecc_dbe_volatile_total",
                     "gpu_pcie_replays_total", "gpu_nvlink_errors_total"),
         [f"* 60 >= {gpu_fault.Config().pcie_replays_per_min:g})", f"* 60 >= {gpu_fault.Config().nvlink_errors_per_min:g})"]
         + [f"== {x}" for x, (_, _, sev) in gpu_fault.XID_CATALOGUE.items() if sev == "critical"],
         gpu_fault.Config(pcie_replays_per_min=20)),
    ]
    for mod, sigs, needles, other in cases:
        e = mod.triage_check()
        for sig in sigs:
            for src in SIGNALS[sig].sources:
                assert triage.rx_escape(src.metric) in e, (mod.__name__, src.metric)
        for n in needles:
            assert n in e, (mod.__name__, n)
        assert mod.triage_check(cfg=other) != e, mod.__name__
    # application Xids (a program's fault) are no hardware fault
    assert "== 13 " not in gpu_fault.triage_check() and "== 31 " not in gpu_fault.triage_check()


def test_checks_come_from_the_diagnosis_modules():
    """The triage runs the check each diagnosis module declares (TRIAGE), found through the registry: a new
    diagnosis with a TRIAGE is triaged (and recorded) with no line in fragscope/fleet/."""
    import dataclasses
    import types

    from fragscope.fleet import triage
    from fragscope.playbooks import REGISTRY
    from fragscope.playbooks.registry import Diagnosis, Registry
    from fragscope.promql import TriageCheck

    declared = {d.id: d.triage for d in REGISTRY.window() if d.triage is not None}
    assert [c.id for c in triage.CHECKS] == list(declared)
    for c in triage.CHECKS:
        t = declared[c.id]
        assert (c.value, c.agg, c.expr) == (t.value, t.agg, t.expr)
        assert c.rule == "fragscope:triage_" + c.id.replace("-", "_") + ":" + t.record
    assert len({c.rule for c in triage.CHECKS}) == len(triage.CHECKS)
    assert set(triage.UNCHECKED) == {d.id for d in REGISTRY.window()} - set(triage.CHECK_IDS)

    def check(m=(), present="1m", rate="2m"):
        """Something >= 1."""
        return "vector(1)"

    base = REGISTRY.get("engine-stalled")
    mod = types.SimpleNamespace(ID="made-up-thing", detect=base.detect, Config=None,
                                TRIAGE=TriageCheck("thing_ratio", "max_over_time", check, "thing_ratio"))
    reg = Registry()
    reg.add(Diagnosis.from_module(mod, dataclasses.replace(base.playbook, id="made-up-thing")))
    (c,) = triage.checks_from(reg)
    assert (c.id, c.rule, c.expr()) == ("made-up-thing", "fragscope:triage_made_up_thing:thing_ratio", "vector(1)")
    with pytest.raises(ValueError):
        TriageCheck("x", "avg_over_time", check, "x")


@needs_prometheus
def test_promtool_check_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@needs_prometheus
def test_promtool_test_rules():
    assert RULE_TESTS, "no dashboards/rules/tests/triage-*.yml"
    r = subprocess.run([PROMTOOL, "test", "rules", *RULE_TESTS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@needs_prometheus
def test_promtool_catches_a_broken_threshold(tmp_path):
    """The unit tests can fail: with the KV edge lowered to 0.4 the 'kv-ok' pod (0.5, preempting) trips and the
    test fails."""
    import shutil

    from fragscope.detectors import kv_pressure

    text = open(RULES, encoding="utf-8").read()
    broken = text.replace(kv_pressure.triage_check(), kv_pressure.triage_check(cfg=kv_pressure.Config(kv_edge_preempting=0.4)))
    assert broken != text
    rules = tmp_path / "fragscope-triage.yml"
    rules.write_text(broken)
    tests = tmp_path / "tests"
    tests.mkdir()
    for f in RULE_TESTS:
        shutil.copy(f, tests)
    r = subprocess.run([PROMTOOL, "test", "rules", *sorted(str(p) for p in tests.iterdir())],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "kv-ok" in r.stdout + r.stderr, r.stdout[-2000:]


def test_parse_triage_answers():
    from fragscope.fleet.triage import parse_triage

    res = [[
        {"metric": {"check": "allocator-fragmentation", "stat": "value", "namespace": "llm", "pod": "a", "gpu": "0"},
         "value": [1, "0.31"]},
        {"metric": {"check": "allocator-fragmentation", "stat": "minutes", "namespace": "llm", "pod": "a", "gpu": "0"},
         "value": [1, "42"]},
        {"metric": {"check": "present", "stat": "up", "namespace": "llm", "pod": "a"}, "value": [1, "1"]},
        {"metric": {"check": "present", "stat": "up", "namespace": "llm", "pod": "b"}, "value": [1, "1"]},
        {"metric": {"check": "peer", "stat": "throughput", "namespace": "llm", "pod": "b", "model_name": "m"},
         "value": [1, "120.5"]},
        {"metric": {"check": "peer", "stat": "throughput", "namespace": "llm", "pod": "b", "model_name": "m"},
         "value": [1, "NaN"]},
        {"metric": {"check": "peer", "stat": "fragmentation", "instance": "n1:8000"}, "value": [1, "0.07"]},
    ]]
    out = parse_triage(res)
    a, b, n = out[("llm", "a", "")], out[("llm", "b", "")], out[("", "", "n1:8000")]
    assert a.present and [f.to_dict() for f in a.flags] == [
        {"id": "allocator-fragmentation", "value": 0.31, "minutes": 42, "gpu": "0"}]
    assert b.present and not b.flags and b.model == "m" and b.throughput == 120.5
    assert n.fragmentation == 0.07 and not n.present and n.throughput is None


def test_target_ids_and_matchers():
    from fragscope.fleet import TargetId, target_matchers, triage_target_id

    assert triage_target_id({"namespace": "llm", "pod": "p"}) == TargetId("pod", "llm", "p")
    assert triage_target_id({"instance": "10.0.0.1:8000"}) == TargetId("host", None, "10.0.0.1")
    assert triage_target_id({}).kind == "none"
    assert target_matchers(TargetId("pod", "llm", "p")) == [("namespace", "=", "llm"), ("pod", "=", "p")]
    host = dict((k, (op, v)) for k, op, v in target_matchers(TargetId("host", None, "10.0.0.1")))
    assert host["instance"] == ("=~", r"10\.0\.0\.1(:[0-9]+)?") and host["pod"] == ("=", "")


def test_sample_peers_is_spread_and_deterministic():
    from fragscope.fleet import TargetId, sample_peers

    ids = [TargetId("pod", "llm", f"p{i:02d}") for i in range(10)]
    assert [t.name for t in sample_peers(list(reversed(ids)), 3)] == ["p00", "p03", "p06"]
    assert sample_peers(ids[:2], 3) == ids[:2] and sample_peers(ids, 0) == []


def test_rules_query_selector_and_fallback():
    from fragscope.fleet import triage

    q = triage.rules_query([("namespace", "=", "llm")], 6 * 3600)
    assert 'fragscope:triage_kv_cache_pressure:kv_usage_p90_ratio{namespace="llm"}[21600s]' in q
    assert triage.rules_selector_ok([("namespace", "=", "llm"), ("pod", "=~", "v.*")])
    assert not triage.rules_selector_ok([("job", "=", "vllm")])


def test_flag_json_has_no_nan():
    from fragscope.fleet.triage import Flag

    assert Flag("clock-throttling", math.nan, None, "0").to_dict()["value"] is None


def test_human_output_counts_triage_clear_targets_and_names_flags():
    import io

    from fragscope.cli.fleet_cmds import render_fleet
    from fragscope.fleet import FleetReport, FleetTarget, TargetId
    from fragscope.fleet.triage import Flag

    targets = [FleetTarget(TargetId("pod", "llm", f"p{i:02d}"), None, missing_signals=None, examined=None)
               for i in range(25)]
    targets[7].flags = [Flag("clock-throttling", 0.61, 30, "0")]  # flagged beyond --deep-limit
    tri = {"mode": "rules", "queries": 3, "seconds": 0.2, "flagged": 1, "outliers": 0, "peers_sampled": 0,
           "examined": 0, "fleet_targets": 25}
    rep = FleetReport("http://p:9090", (0.0, 3600.0), None, "raw", None, targets, [], 3, 0.0, 0.0, 0, [], [], tri)
    out = io.StringIO()
    render_fleet(rep, out)
    text = out.getvalue()
    assert "triage (rules, 3 queries, 0.2 s): 1 flagged" in text and "0 of 25 targets deep-diagnosed" in text
    assert "llm/p07" in text and "flagged: clock-throttling" in text
    assert "... and 24 targets that passed every triage check" in text and "llm/p08" not in text
    d = rep.to_dict()
    assert d["targets"][0]["target"] == "llm/p07" and d["targets"][0]["status"] == "flagged"
    assert {t["status"] for t in d["targets"][1:]} == {"triage-clear"}
