"""Sizing scenario families fire with the right value; their confounders stay quiet (fragscope.sizing.scenarios)."""
from __future__ import annotations

import math

import pytest

from fragscope.model import Finding
from fragscope.sizing import detect_kv_pool_undersized, detect_startup_oom, parse_startup, recommend
from fragscope.sizing import scenarios as S

GIB = 1024 ** 3
SHAPE = S.Shape()


def run(name):
    lines, rt = S.family(name, SHAPE)
    acc = parse_startup(lines)
    return acc, rt, recommend(acc, rt)


def floor2(x):
    return math.floor(x * 100 + 1e-9) / 100


def test_startup_oom_from_graph_capture():
    acc, _, r = run("startup-oom-graphs")
    total = round(SHAPE.total_gib * GIB)
    short = 512 * 1024 ** 2 - round(20 * 1024 ** 2)
    expect = floor2((round(SHAPE.budget_gib * GIB) - short - 0.02 * total) / total)  # (71.27-0.48-1.58)/79.19
    assert r.settings == {"--gpu-memory-utilization": expect} and expect == 0.87
    f = detect_startup_oom(acc)
    assert len(f) == 1 and f"--gpu-memory-utilization {expect}" in f[0].summary


def test_startup_without_kv_memory_is_found_and_says_what_is_missing():
    acc, _, r = run("startup-oom-no-kv")
    f = detect_startup_oom(acc)
    assert f[0].id == "startup-oom" and "cannot be computed" in f[0].summary and f[0].missing


def test_runtime_oom_from_activations():
    acc, rt, r = run("runtime-oom-activations")
    total, budget = round(SHAPE.total_gib * GIB), round(SHAPE.budget_gib * GIB)
    expect = floor2((budget - (2.0 - 0.6) * GIB - 0.02 * total) / total)  # 0.8622 -> 0.86
    assert [c["case"] for c in r.cases] == ["runtime-oom"] and r.settings["--gpu-memory-utilization"] == expect
    assert detect_startup_oom(acc) == []  # it had started: not a start-up OOM


def test_pool_too_small_with_headroom():
    acc, rt, r = run("pool-too-small")
    total, budget = round(SHAPE.total_gib * GIB), round(SHAPE.budget_gib * GIB)
    ceiling = floor2((total - 0.6 * GIB - 0.02 * total) / total)  # 0.97
    assert r.settings["--gpu-memory-utilization"] == ceiling == 0.97
    f = detect_kv_pool_undersized(acc, rt)
    assert len(f) == 1 and isinstance(f[0], Finding) and "0.97" in f[0].summary


def test_memory_held_elsewhere():
    acc, rt, r = run("memory-held-elsewhere")
    assert [c["case"] for c in r.cases] == ["memory-held-elsewhere"] and "5.50 GiB" in r.cases[0]["evidence"]
    assert detect_kv_pool_undersized(acc, rt) == []


@pytest.mark.parametrize("name", ["healthy", "priority-preemptions-only", "small-monitoring-process"])
def test_confounders_stay_quiet(name):
    acc, rt, r = run(name)
    assert r.cases == [] and r.settings == {} and r.status == "ok"
    assert detect_kv_pool_undersized(acc, rt) == [] and detect_startup_oom(acc) == []


def test_full_pool_without_headroom_caps_concurrency_but_is_not_kv_pool_undersized():
    acc, rt, r = run("full-pool-no-headroom")
    assert set(r.settings) == {"--max-num-seqs"} and r.settings["--max-num-seqs"] == SHAPE.kv_tokens // 8000
    assert detect_kv_pool_undersized(acc, rt) == []  # nothing to raise: kv-cache-pressure's job


def test_runtime_oom_is_not_a_startup_oom():
    acc, _, r = run("runtime-oom-not-startup")
    assert acc.failure is None and len(acc.runtime_ooms) == 1 and detect_startup_oom(acc) == []


def test_unknown_scenario_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown sizing scenario"):
        S.family("nope")


def test_stated_target_without_runtime():
    lines, _ = S.family("pool-too-small", SHAPE)
    acc = parse_startup(lines)
    now = SHAPE.kv_tokens // 8000  # 450,224 // 8,000 = 56
    r = recommend(acc, {}, target_concurrency=now - 6, target_len=8000)
    assert not r.cases and any("already holds" in n for n in r.notes)
    r = recommend(acc, {}, target_concurrency=64, target_len=8000)  # 62.5 GiB of KV + 16.31 GiB: above 0.98
    assert r.status == "inconclusive" and "more than this GPU can hold" in r.cases[0]["change"] and not r.settings
    r = recommend(acc, {}, target_concurrency=60, target_len=8000)
    need = math.ceil((71.27 - SHAPE.kv_gib + 60 * 8000 * 131072 / GIB) / SHAPE.total_gib * 100 - 1e-9) / 100
    assert f"--gpu-memory-utilization {need:.2f}" in r.cases[0]["change"] and not r.settings  # not set without NVML
