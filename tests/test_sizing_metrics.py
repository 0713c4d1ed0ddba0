"""kv-pool-undersized from metrics alone (detectors/kv_pool.py) through the pipeline, with hand-checked figures.

Figures: an 80 GiB GPU at --gpu-memory-utilization 0.9 has a 72 GiB budget; the sizing margin is
max(0.5 GiB, 2 % x 80 GiB) = 1.6 GiB. NVML used 73 GiB at peak leaves 1 GiB outside the budget, so the
ceiling is (80 - 1 - 1.6) / 80 = 0.9675 -> 0.96 and the pool grows by (0.96 - 0.90) x 80 GiB = 4.8 GiB.
"""
from __future__ import annotations

import json

import pytest

from fragscope.detectors import kv_pool
from fragscope.detectors.frame import build_frame
from fragscope.model import Inconclusive, Sample, Window, make_labels
from fragscope.pipeline import diagnose
from fragscope.playbooks import REGISTRY
from fragscope.sizing import scenarios as S
from fragscope.sizing.accounting import accounting_from_cache_config

GIB = 1024 ** 3
ENG = {"engine": "0", "model_name": "m"}


def window(points=8, util="0.9", kv=1.0, preempt_per_scrape=5.0, used=73 * GIB, total=80 * GIB, cc_extra=None,
           by_reason=None, waiting=4.0, gpus=("0",)):
    cc = {"block_size": "16", "gpu_memory_utilization": util, "num_gpu_blocks": "4096", "engine": "0"}
    cc.update(cc_extra or {})
    out = []
    for i in range(points):
        t = 1_777_629_600.0 + 15 * i
        out += [Sample("vllm:cache_config_info", make_labels(cc), t, 1.0),
                Sample("vllm:kv_cache_usage_perc", make_labels(ENG), t, kv),
                Sample("vllm:num_requests_running", make_labels(ENG), t, 32.0),
                Sample("vllm:num_requests_waiting", make_labels(ENG), t, waiting)]
        for g in gpus:
            out += [Sample("fragscope_gpu_memory_used_bytes", make_labels({"gpu": g}), t, float(used)),
                    Sample("fragscope_gpu_memory_total_bytes", make_labels({"gpu": g}), t, float(total))]
        if by_reason is None:
            out.append(Sample("vllm:num_preemptions_total", make_labels(ENG), t, 100 + preempt_per_scrape * i))
        else:
            for r, step in by_reason.items():
                out.append(Sample("vllm:num_preemptions_by_reason_total", make_labels(dict(ENG, reason=r)), t,
                                  10 + step * i))
    return Window.from_samples(out, source="test")


def found(report, did="kv-pool-undersized"):
    return [f for f in report.findings if f.id == did]


def test_registered_as_a_window_diagnosis_that_the_log_reports_too():
    d = REGISTRY["kv-pool-undersized"]
    assert d.source == "window" and d.detect is kv_pool.detect and d.alerting and "log" in d.also_from
    assert REGISTRY["startup-oom"].source == "log"


def test_pool_too_small_with_headroom_gives_the_value_by_hand():
    rep = diagnose(window())
    (f,) = found(rep)
    assert "--gpu-memory-utilization 0.96 (now 0.9)" in f.summary  # (80 - 1 - 1.6) / 80 = 0.9675 -> 0.96
    assert "grows by 4.80 GiB" in f.summary and "7.0 GiB of the GPU stayed free" in f.summary
    assert f.basis == "level" and f.missing  # the pool's bytes are not in the metrics: said, not guessed
    assert any("--gpu-memory-utilization 0.96" in a for a in f.playbook["actions"])
    rec = json.loads(json.dumps(f.to_dict(), allow_nan=False))
    assert rec["id"] == "kv-pool-undersized"
    # 7 scrapes x 5 preemptions over the window; KV at 100 %; 4 waiting
    assert "35 preemptions" in f.summary and "KV usage peaked at 100.0 %" in f.summary


def test_pinned_kv_cache_memory_bytes_grows_by_the_spare_in_whole_mib():
    # --kv-cache-memory-bytes 8 GiB for 4,096 blocks x 16 = 65,536 tokens: 128 KiB per token. 70 GiB used:
    # spare = 80 - 70 - 1.6 = 8.4 GiB -> 16.4 GiB = 16,793.6 MiB -> 16,793 MiB; / 128 KiB = 134,344 tokens
    rep = diagnose(window(used=70 * GIB, cc_extra={"kv_cache_memory_bytes": str(8 * GIB)}))
    (f,) = found(rep)
    assert f"--kv-cache-memory-bytes {16793 * 1024 ** 2}" in f.summary and f"(now {8 * GIB})" in f.summary
    assert "134,344 KV tokens" in f.summary and not f.missing


def test_full_pool_without_headroom_is_quiet_here():
    rep = diagnose(window(used=79 * GIB))  # 80 - 79 - 1.6 < 0: kv-cache-pressure / capacity, not sizing
    assert not found(rep) and not any(i.id == "kv-pool-undersized" for i in rep.inconclusive)


def test_priority_only_preemptions_are_quiet_and_kv_full_ones_count():
    rep = diagnose(window(by_reason={"kv_full": 0.0, "priority": 5.0}, waiting=0.0))
    assert not found(rep)
    rep = diagnose(window(by_reason={"kv_full": 3.0, "priority": 5.0}))
    (f,) = found(rep)
    assert "21 preemptions for lack of KV blocks (reason kv_full)" in f.summary  # 7 x 3


def test_frame_reads_the_labelled_counter_through_the_signal_table():
    fr = build_frame(window(by_reason={"kv_full": 3.0, "priority": 5.0}))
    assert fr.sources["preemptions_by_reason_total"] == "vllm:num_preemptions_by_reason_total"
    assert fr.engine_total["preemptions_by_reason_total"] == (10 + 21) + (10 + 35)
    assert fr.engine_total["preemptions_kv_full_total"] == 10 + 21


def test_unlabelled_preemptions_without_a_full_sample_are_inconclusive_not_silent():
    res = kv_pool.detect(build_frame(window(kv=0.6, waiting=0.0)))
    assert isinstance(res, Inconclusive) and "60 %" in res.reason and "reason" in res.missing[0]


def test_missing_utilization_or_nvml_is_named():
    res = kv_pool.detect(build_frame(window(util="None")))
    assert isinstance(res, Inconclusive) and res.missing == ["vllm:cache_config_info{gpu_memory_utilization}"]
    fr = build_frame(window())
    fr.gpu.clear()  # no GPU exporter
    res = kv_pool.detect(fr)
    assert isinstance(res, Inconclusive) and any("fragscope_gpu_memory_used_bytes" in m for m in res.missing)


def test_one_scrape_reads_lifetime_preemptions():
    rep = diagnose(window(points=1))
    (f,) = found(rep)
    assert "100 preemptions" in f.summary and "0.96" in f.summary


def test_tensor_parallel_gpus_the_fullest_one_sizes():
    # two GPUs: the fuller one (73 GiB) decides; both carry the same series here
    rep = diagnose(window(gpus=("0", "1")))
    (f,) = found(rep)
    assert "0.96" in f.summary


def test_accounting_from_cache_config_labels():
    a = accounting_from_cache_config({"gpu_memory_utilization": "0.92", "num_gpu_blocks": "16", "block_size": "128",
                                      "kv_cache_memory_bytes": "4194304", "kv_cache_size_tokens": "2048"}, "v1")
    assert a.engine == "vllm-v1" and a.gpu_memory_utilization == 0.92 and a.pool_tokens == 2048
    assert a.kv_bytes_per_token == 2048.0  # 4 MiB / 2,048 tokens (the real vllm 0.32.0 scrape's figures)
    b = accounting_from_cache_config({"gpu_memory_utilization": "nan", "num_gpu_blocks": "None", "block_size": "x"})
    assert b.gpu_memory_utilization is None and b.gpu_blocks is None and not b.has_accounting


# --- the sizing families as metrics recordings (no log) ------------------------------------------
@pytest.mark.parametrize("labelled", [True, False])
def test_family_pool_too_small_from_metrics_matches_the_log_path(labelled):
    # H100 79.19 GiB at 0.90: 0.6 GiB outside the budget; (79.19 - 0.6 - 1.58) / 79.19 = 0.9724 -> 0.97,
    # the value the log path gives (tests/test_sizing_scenarios.py); growth (0.97 - 0.90) x 79.19 = 5.54 GiB
    rep = diagnose(S.metrics_window("pool-too-small", labelled=labelled))
    (f,) = found(rep)
    assert "--gpu-memory-utilization 0.97 (now 0.9)" in f.summary and "grows by 5.54 GiB" in f.summary


@pytest.mark.parametrize("name", ["healthy", "priority-preemptions-only", "full-pool-no-headroom",
                                  "small-monitoring-process", "memory-held-elsewhere", "runtime-oom-activations"])
def test_family_confounders_from_metrics_stay_quiet(name):
    rep = diagnose(S.metrics_window(name))
    assert not found(rep)


@pytest.mark.parametrize("name", ["startup-oom-graphs", "startup-oom-no-kv"])
def test_a_server_that_never_started_has_no_metrics_to_judge(name):
    rep = diagnose(S.metrics_window(name))
    assert not rep.findings and any(i.id == "kv-pool-undersized" for i in rep.inconclusive)


# --- the agent's engine-log collector feeds the start-up accounting ----------------------------------
def test_log_collector_publishes_the_pool_and_its_accounting(tmp_path):
    from fragscope.collectors.logs import LogCollector
    from fragscope.sizing import judge_accounting

    lines, _ = S.family("pool-too-small")
    path = tmp_path / "engine.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    c = LogCollector(str(path), from_start=True)
    r = c.collect(1000.0)
    got = {s.name: s.value for s in r.samples}
    assert got["fragscope_log_kv_cache_bytes"] == pytest.approx(S.Shape().kv_gib * GIB)  # 53.96 GiB, as logged
    acc = c.accounting()
    assert acc.kv_cache_tokens == S.Shape().kv_tokens and acc.gpu_memory_utilization == 0.9
    (inc,) = judge_accounting(acc)  # started; without run-time evidence the pool cannot be judged: said so
    assert isinstance(inc, Inconclusive) and inc.id == "kv-pool-undersized" and any("NVML" in m for m in inc.missing)
    c.close()

    lines, _ = S.family("startup-oom-graphs")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    c = LogCollector(str(path), from_start=True)
    r = c.collect(1000.0)
    assert "fragscope_log_kv_cache_bytes" not in {s.name for s in r.samples}  # it never started
    (f,) = judge_accounting(c.accounting())
    assert f.id == "startup-oom" and "--gpu-memory-utilization 0.87" in f.summary  # test_sizing_scenarios' value
    from fragscope.sizing import startup_findings

    (g,) = startup_findings([object(), c])  # what the agent's judging round would add (docs/sizing.md)
    assert g.summary == f.summary
    c.close()


def test_the_logs_pool_size_turns_the_growth_into_tokens():
    # metrics + the log's 8 GiB pool for 65,536 tokens (128 KiB/token): 72 GiB budget, 73 GiB used -> 0.96;
    # pool 8 GiB + 4.8 GiB = 12.8 GiB / 128 KiB = 104,857 tokens
    w = window()
    extra = [Sample("fragscope_log_kv_cache_bytes", make_labels({}), 1_777_629_600.0 + 15 * i, 8.0 * GIB)
             for i in range(8)]
    w = Window.from_samples([*extra, *(Sample(s.name, s.key.labels, float(t), float(v))
                                       for s in w for t, v in zip(s.ts, s.values))], source="test")
    (f,) = found(diagnose(w))
    assert "--gpu-memory-utilization 0.96 (now 0.9)" in f.summary and "104,857 KV tokens" in f.summary
    assert not f.missing


def test_kv_pressure_quotes_the_sized_value_and_fragmentation_comes_first():
    """Two findings never give two values for one flag: kv-cache-pressure quotes kv-pool-undersized's
    computed utilization; with allocator fragmentation also found, the sizing advice says to fix it first."""
    from fragscope.model import Finding, Report, Severity
    from fragscope.playbooks import attach_playbooks

    def finding(fid, ctx):
        return Finding(id=fid, severity=Severity.WARNING, confidence=0.9, summary="s", evidence=[],
                       context=ctx)

    rec = {"settings": {"--gpu-memory-utilization": 0.96}, "cases": []}
    rep = Report(window=(0.0, 1.0), findings=[
        finding("kv-cache-pressure", {"running": 100.0, "_config": {"gpu_memory_utilization": "0.9"}}),
        finding("kv-pool-undersized", {"recommendation": rec})])
    attach_playbooks(rep)
    kv = next(f for f in rep.findings if f.id == "kv-cache-pressure")
    acts = " | ".join(kv.playbook["actions"])
    assert "--gpu-memory-utilization 0.96 (now 0.90)" in acts and "0.93" not in acts
    rep.findings.append(finding("allocator-fragmentation", {}))
    for f in rep.findings:
        f.playbook = None
    attach_playbooks(rep)
    pool = next(f for f in rep.findings if f.id == "kv-pool-undersized")
    assert pool.playbook["actions"][0].startswith("First fix the allocator fragmentation")


def test_agent_round_adds_startup_oom_from_the_followed_log(tmp_path):
    """The agent's judging round (agent/loops.add_startup_findings): a start-up OOM in the log it follows
    becomes a finding with its playbook beside the metrics findings; a start-up that went through adds none."""
    from fragscope.agent.loops import add_startup_findings
    from fragscope.collectors.logs import LogCollector
    from fragscope.model import Report

    path = tmp_path / "engine.log"
    for family, expect in (("startup-oom-graphs", ["startup-oom"]), ("pool-too-small", [])):
        lines, _ = S.family(family)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        c = LogCollector(str(path), from_start=True)
        c.collect(1000.0)
        rep = Report(window=(0.0, 1.0))
        add_startup_findings(rep, [object(), c])
        assert [f.id for f in rep.findings] == expect, family
        for f in rep.findings:
            assert "--gpu-memory-utilization 0.87" in f.summary
            assert f.playbook and f.playbook["actions"], "attached with its computed actions"
        c.close()


def test_full_pool_with_a_queue_but_no_preemption_is_not_sized_from_metrics():
    """KV near full with requests waiting and not one preemption is how any saturated server looks (the
    batch cap or compute may bind, or one sample spiked): no kv-pool-undersized from metrics; the same
    pod with preemptions gets it."""
    assert not found(diagnose(window(preempt_per_scrape=0.0, waiting=200.0)))
    assert not found(diagnose(window(by_reason={"kv_full": 0.0}, waiting=200.0)))
    assert found(diagnose(window(preempt_per_scrape=1.0, waiting=200.0)))
