"""Scenario families of the artefact diagnoses (fragscope.scenarios.triton / .ort): each generated
artefact is read by the real reader (config.pbtxt, /metrics text, ORT profile JSON and verbose log,
and once each through the CLI), each pathology is found and each confounder stays quiet at the
default severity, and the detector's figures equal the generator's own (computed from the simulated
batches / the generated graph, not from the counters or events a reader derives them from)."""
from __future__ import annotations

import json
import math

import pytest
from cli_helpers import cli

from fragscope.collectors.ort_profile import parse_verbose_log, read_input, read_profile
from fragscope.collectors.triton_config import read_config
from fragscope.detectors import batching, cpu_fallback
from fragscope.model import Inconclusive, Severity
from fragscope.scenarios import (ARTEFACT_FAMILIES, ORT_CONFOUNDERS, ORT_PATHOLOGIES, TRITON_CONFOUNDERS,
                                 TRITON_PATHOLOGIES, OrtScenario, TritonScenario, ort_case, triton_case)


def judge_triton(case):
    return batching.detect(read_config(case.config_pbtxt), batching.model_counters(case.to_window(), case.model))


@pytest.fixture(scope="module")
def triton_cases():
    return {k: triton_case(TritonScenario(k, seed=11)) for k in (*TRITON_PATHOLOGIES, *TRITON_CONFOUNDERS)}


@pytest.fixture(scope="module")
def ort_cases():
    return {k: ort_case(OrtScenario(k, seed=5)) for k in (*ORT_PATHOLOGIES, *ORT_CONFOUNDERS)}


def test_families_are_declared_for_registered_artefact_diagnoses():
    assert set(ARTEFACT_FAMILIES) == {"batching-misconfiguration", "cpu-fallback"}
    assert ARTEFACT_FAMILIES["batching-misconfiguration"] == (tuple(TRITON_PATHOLOGIES), TRITON_CONFOUNDERS)
    with pytest.raises(ValueError, match="unknown Triton scenario kind"):
        TritonScenario("healthy")
    with pytest.raises(ValueError, match="severity > 0"):
        TritonScenario("triton-batching-off", severity=0)
    with pytest.raises(ValueError, match="unknown ORT scenario kind"):
        OrtScenario("triton-well-tuned")


# --- Triton -------------------------------------------------------------------------------------
def test_triton_config_is_read_back_as_generated(triton_cases):
    for kind, case in triton_cases.items():
        cfg, st = read_config(case.config_pbtxt), case.setup
        assert (cfg.name, cfg.max_batch_size, cfg.dynamic_batching, cfg.instance_count, cfg.instance_kinds) == \
            (case.model, st.max_batch_size, st.dynamic_batching, st.instances, ["KIND_GPU"]), kind
        if st.dynamic_batching:
            assert (tuple(cfg.preferred_batch_sizes), cfg.max_queue_delay_us) == (st.preferred, st.delay_us), kind


def test_triton_scrapes_are_cumulative_and_consistent(triton_cases):
    case = triton_cases["triton-delay-too-short"]
    w = case.to_window()
    assert batching.models_in(w) == [case.model]
    for name in ("nv_inference_request_success", "nv_inference_exec_count", "nv_inference_queue_duration_us"):
        (s,) = w.select(name)
        assert len(s) == len(case.scrapes) == 4 and s.values[0] > 0  # the server ran before the first scrape
        assert all(b >= a for a, b in zip(s.values, s.values[1:]))
    req, inf = w.select("nv_inference_request_success")[0], w.select("nv_inference_count")[0]
    assert list(req.values) == list(inf.values)  # every request carries one inference


@pytest.mark.parametrize("kind", list(TRITON_PATHOLOGIES))
def test_triton_pathology_is_found_with_the_generators_figures(triton_cases, kind):
    case = triton_cases[kind]
    fig = case.truth.figures
    assert case.truth.diagnoses == {"batching-misconfiguration"}
    res = judge_triton(case)
    assert not isinstance(res, Inconclusive), res.reason
    (f,) = res
    ctx = f.context
    assert ctx["problem"] == fig["problem"] == TRITON_PATHOLOGIES[kind]
    assert f.severity is Severity.WARNING  # every variant here makes requests wait or keeps instances busy
    # counters -> figures, against the figures of the simulated batches themselves
    assert ctx["avg_batch"] == pytest.approx(fig["average_batch"], rel=1e-5)
    if fig["fill_ratio"] is None:
        assert fig["max_batch_size"] == 0 and math.isnan(ctx["fill"])
    else:
        assert ctx["fill"] == pytest.approx(fig["fill_ratio"], rel=1e-5)
    assert ctx["queue_us"] == pytest.approx(fig["queue_us_per_request"], rel=1e-4)
    assert ctx["compute_us"] == pytest.approx(fig["compute_us_per_request"], rel=1e-4)
    # completed requests per second track the Poisson arrival rate the generator drew
    assert ctx["arrival_per_s"] == pytest.approx(fig["arrival_per_s"], rel=0.05)


@pytest.mark.parametrize("kind", list(TRITON_CONFOUNDERS))
def test_triton_confounder_stays_quiet(triton_cases, kind):
    case = triton_cases[kind]
    assert case.truth.diagnoses == set()
    assert judge_triton(case) == []


def test_triton_mechanism_figures():
    """The generator's own figures obey the queueing mechanism, computed two ways."""
    c = triton_case(TritonScenario("triton-delay-too-short", seed=2))
    f = c.truth.figures
    # Little's law: the time-average queue (from arrival/dispatch times) = arrival rate × queue time per request
    assert f["mean_queue_length"] == pytest.approx(f["arrival_per_s"] * f["queue_us_per_request"] * 1e-6, rel=0.1)
    # busy and running batches of ~1.6 of 32: the GPU spends ~8× the time per inference a full batch would
    assert f["instance_busy_ratio"] > 0.7 and f["fill_ratio"] < 0.1
    assert f["gpu_us_per_inference"] > 5 * f["gpu_us_per_inference_full_batch"]
    # a long delay: requests sit out most of the timer (queue ≈ delay - gather time)
    g = triton_case(TritonScenario("triton-delay-too-long", seed=2)).truth.figures
    assert 0.5 * g["max_queue_delay_us"] < g["queue_us_per_request"] < \
        g["max_queue_delay_us"] + g["compute_us_per_request"]


def test_triton_severity_raises_the_load():
    a, b = (triton_case(TritonScenario("triton-batching-off", seed=4, severity=s)).truth.figures for s in (0.3, 2.0))
    assert a["arrival_per_s"] < b["arrival_per_s"] and a["queue_us_per_request"] < b["queue_us_per_request"]


def test_triton_same_seed_same_artefacts():
    a, b, c = (triton_case(TritonScenario("triton-well-tuned", seed=s)) for s in (1, 1, 2))
    assert a.scrapes == b.scrapes and a.config_pbtxt == b.config_pbtxt and a.truth == b.truth
    assert a.scrapes != c.scrapes


def test_triton_case_through_the_cli(tmp_path, triton_cases):
    case = triton_cases["triton-too-few-instances"]
    (tmp_path / "config.pbtxt").write_text(case.config_pbtxt)
    files = []
    for i, text in enumerate(case.scrapes):
        files.append(tmp_path / f"s{i}.prom")
        files[-1].write_text(text)
    r = cli("triton-batching", *files, "--config", tmp_path / "config.pbtxt", "--interval", case.step_s,
            "--format", "json", "--fail-on", "warning")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    (f,) = out["findings"]
    assert f["id"] == "batching-misconfiguration" and out["model"] == case.model
    assert out["triton_config"]["instance_count"] == 1
    assert any("instance_group.count 1 →" in a for a in f["playbook"]["actions"])


# --- ONNX Runtime -------------------------------------------------------------------------------
def _read(case, tmp_path):
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(case.events))
    return read_profile(str(p))


@pytest.mark.parametrize("kind", list(ORT_PATHOLOGIES))
def test_ort_pathology_is_found_with_the_generators_figures(ort_cases, kind, tmp_path):
    case = ort_cases[kind]
    fig = case.truth.figures
    assert case.truth.diagnoses == {"cpu-fallback"}
    prof = _read(case, tmp_path)
    assert len(prof.runs) == 5 and prof.providers == ["CPUExecutionProvider", "CUDAExecutionProvider"]
    r = cpu_fallback.analyse(prof)["median_run"]
    assert (r["boundaries"], r["partitions"], r["copies"]) == (fig["boundaries"], fig["partitions"],
                                                              fig["copies_per_run"])
    assert r["copy_us"] == fig["copy_us"] and r["run_us"] == fig["run_us"]
    assert fig["boundaries"] == 2 * fig["islands"]  # an island in the middle costs two boundaries, two copies
    (f,) = cpu_fallback.detect(prof)
    assert sorted(f.context["ops"]) == fig["cpu_ops"]
    assert f.context["boundaries"] == fig["boundaries"]
    assert f.context["share"] == pytest.approx(fig["cpu_and_copy_share"], rel=1e-9)
    ev = {e.signal: e.observed for e in f.evidence}
    assert ev["memcpy_seconds_per_run"] == pytest.approx(fig["copy_us"] * 1e-6)
    # the documented grading (docs/engines.md), applied to the generator's share
    want = Severity.CRITICAL if fig["cpu_and_copy_share"] >= 0.30 else Severity.WARNING
    assert f.severity is want


def test_ort_copy_dominant_case_is_critical_and_copies_dominate(ort_cases):
    fig = ort_cases["ort-copy-dominant"].truth.figures
    # 2 × 32 MiB over PCIe (~2.8 ms each) around a memory-bound op (~1.7 ms) and ~2.4 ms of GPU nodes
    assert fig["copy_us"] > 2 * fig["cpu_us"] and fig["copy_us"] > 0.5 * fig["run_us"]


@pytest.mark.parametrize("kind", list(ORT_PATHOLOGIES))
def test_ort_pathology_from_the_verbose_log(ort_cases, kind, tmp_path):
    case = ort_cases[kind]
    fig = case.truth.figures
    p = tmp_path / "session.log"
    p.write_text("\n".join(case.verbose_log) + "\n")
    pl = read_input(str(p))  # told apart from a profile by content
    (f,) = cpu_fallback.detect_placement(pl)
    assert f.basis == "log" and f.severity is Severity.WARNING
    assert sorted(f.context["ops"]) == fig["cpu_ops"]
    ev = {e.signal: e.observed for e in f.evidence}
    assert ev["cpu_placed_nodes"] == fig["cpu_placed_nodes"] and ev["memcpy_nodes"] == fig["memcpy_nodes"]


def test_ort_confounders(ort_cases, tmp_path):
    gpu = ort_cases["ort-all-gpu"]
    assert gpu.truth.diagnoses == set() and gpu.truth.figures["copies_per_run"] == 0
    assert cpu_fallback.detect(_read(gpu, tmp_path)) == []
    assert cpu_fallback.detect_placement(parse_verbose_log(gpu.verbose_log)) == []
    shape = ort_cases["ort-shape-ops-on-cpu"]
    prof = _read(shape, tmp_path)
    assert cpu_fallback.detect(prof) == []
    a = cpu_fallback.analyse(prof)
    assert a["shape_nodes"] == shape.truth.figures["shape_nodes_on_cpu"] and len(a["shape_nodes"]) == 4
    assert a["median_run"]["boundaries"] == shape.truth.figures["boundaries"] == 2  # real boundaries, by design
    assert cpu_fallback.detect_placement(parse_verbose_log(shape.verbose_log)) == []
    cpu = ort_cases["ort-cpu-only"]
    assert cpu.truth.diagnoses == set() and cpu.truth.inconclusive == {"cpu-fallback"}
    res = cpu_fallback.detect(_read(cpu, tmp_path))
    assert isinstance(res, Inconclusive) and "no GPU partition" in res.reason
    assert isinstance(cpu_fallback.detect_placement(parse_verbose_log(cpu.verbose_log)), Inconclusive)


def test_ort_severity_scales_the_copies_and_zero_is_none():
    small, big = (ort_case(OrtScenario("ort-one-island", seed=3, severity=s)).truth.figures for s in (0.3, 2.0))
    assert small["cpu_ops"] == big["cpu_ops"] and small["copy_us"] < big["copy_us"]
    none = ort_case(OrtScenario("ort-one-island", seed=3, severity=0))
    assert none.truth.diagnoses == set() and none.truth.figures["copies_per_run"] == 0


def test_ort_case_through_the_cli(ort_cases, tmp_path):
    case = ort_cases["ort-many-islands"]
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(case.events))
    r = cli("ort-profile", p, "--format", "json", "--fail-on", "warning")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["findings"][0]["id"] == "cpu-fallback"
    assert sorted(out["profile"]["cpu_ops"]) == case.truth.figures["cpu_ops"]
    assert out["profile"]["median_run"]["boundaries"] == case.truth.figures["boundaries"]


def test_ort_events_have_the_shape_onnxruntime_writes(ort_cases, tmp_path):
    """Field names and event order against a profile onnxruntime writes for real on this machine's CPU."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    s = ort.InferenceSession(str(tmp_path / "m.onnx"), so, providers=["CPUExecutionProvider"])
    s.run(None, {"x": np.ones((2, 2), np.float32)})
    real = json.loads(open(s.end_profiling(), encoding="utf-8").read())
    ours = ort_cases["ort-one-island"].events

    def kinds(evs):
        return [e["name"] if e["cat"] == "Session" else "node" for e in evs]

    assert kinds(real)[:2] == kinds(ours)[:2] == ["model_loading_uri", "session_initialization"]
    assert kinds(real)[-2:] == kinds(ours)[-2:] == ["SequentialExecutor::Execute", "model_run"]
    real_node = next(e for e in real if e["cat"] == "Node")
    our_node = next(e for e in ours if e["cat"] == "Node")
    assert set(our_node) == set(real_node)
    assert set(our_node["args"]) <= set(real_node["args"])
    for key in ("node_index", "output_size", "activation_size", "parameter_size"):
        assert type(our_node["args"][key]) is type(real_node["args"][key]), key  # ORT writes these as strings
