"""cpu-fallback (issue 13): ONNX Runtime profiles made for real on this machine's CPU from tiny graphs;
the GPU-provider cases are those real profiles with the provider of chosen nodes rewritten and the
copies ORT inserts at each boundary added, the way a CUDA session's profile shows them."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from fragscope.collectors.ort_profile import ProfileError, parse_events, read_profile  # noqa: E402
from fragscope.detectors import cpu_fallback  # noqa: E402
from fragscope.model import Inconclusive, Severity  # noqa: E402


def _profile(tmp_path, nodes, inputs, outputs, inits, feeds, runs=4) -> list:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the nodes as built
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        s.run(None, feeds)
    return json.loads(open(s.end_profiling(), encoding="utf-8").read())


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """MatMul -> Relu -> Add -> Sigmoid: four float nodes, profiled for real."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    W = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.full(64 * 64, 0.01, np.float32).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Add", ["b", "x"], ["c"], name="add"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sig")]
    return _profile(tmp_path_factory.mktemp("mlp"), nodes, [X], [Y], [W], {"x": np.ones((64, 64), np.float32)})


@pytest.fixture(scope="module")
def reshaper(tmp_path_factory):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape around a MatMul: int64 shape arithmetic."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4, 4])
    W = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], np.full(256, 0.1, np.float32).tolist())
    i0 = helper.make_tensor("i0", TensorProto.INT64, [], [0])
    tail = helper.make_tensor("tail", TensorProto.INT64, [2], [4, 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Shape", ["a"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "i0"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "tail"], ["shp"], name="concat", axis=0),
             helper.make_node("Reshape", ["a", "shp"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    ax = helper.make_tensor("ax", TensorProto.INT64, [1], [0])
    return _profile(tmp_path_factory.mktemp("rs"), nodes, [X], [Y], [W, i0, tail, ax],
                    {"x": np.ones((8, 16), np.float32)})


def as_gpu(events: list, on_cpu: set[str], copy_us: float = 40.0, gpu: str = "CUDAExecutionProvider") -> list:
    """A real CPU profile rewritten as a CUDA session's: nodes not in ``on_cpu`` on ``gpu``, and at each
    provider boundary the copy node ORT inserts (MemcpyToHost to the CPU, MemcpyFromHost back),
    placed in time after the node before it; later events shift by the copy's duration."""
    out = []
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    shift, k = 0.0, 0  # copies push every later event back, across runs too
    for r in sorted(runs, key=lambda e: e["ts"]):
        inside = sorted((e for e in nodes if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]), key=lambda e: e["ts"])
        run_start, before, prev = r["ts"] + shift, shift, None
        for e in inside:
            e = copy.deepcopy(e)
            node = e["name"][: -len("_kernel_time")]
            prov = "CPUExecutionProvider" if node in on_cpu else gpu
            e["args"]["provider"] = prov
            if prev is not None and prov != prev:
                op = "MemcpyToHost" if prov == "CPUExecutionProvider" else "MemcpyFromHost"
                out.append({"cat": "Node", "name": f"Memcpy_{k}_kernel_time", "ts": e["ts"] + shift,
                            "dur": copy_us, "ph": "X", "args": {"op_name": op, "provider": gpu}})
                k += 1
                shift += copy_us
            e["ts"] += shift
            out.append(e)
            prev = prov
        out.append(dict(r, ts=run_start, dur=r["dur"] + shift - before))
    return out


def test_real_cpu_profile_is_read(mlp):
    prof = parse_events(mlp)
    assert len(prof.runs) == 4
    assert [n.op for n in prof.nodes if n.run == 1] == ["MatMul", "Relu", "Add", "Sigmoid"]
    assert prof.providers == ["CPUExecutionProvider"]
    assert all(n.output_types == ("float",) for n in prof.nodes)


def test_cpu_only_profile_is_inconclusive_not_healthy(mlp):
    res = cpu_fallback.detect(parse_events(mlp))
    assert isinstance(res, Inconclusive) and "no GPU partition" in res.reason


def test_all_on_gpu_is_quiet(mlp):
    assert cpu_fallback.detect(parse_events(as_gpu(mlp, set()))) == []


def test_a_cpu_node_between_gpu_partitions(mlp):
    ev = as_gpu(mlp, {"relu"}, copy_us=40.0)
    prof = parse_events(ev)
    a = cpu_fallback.analyse(prof)
    r = a["median_run"]
    assert (r["partitions"], r["boundaries"], r["copies"]) == (3, 2, 2)
    assert [n.name for n in r["cpu_between"]] == ["relu"]
    assert r["copy_us"] == 80.0
    (f,) = cpu_fallback.detect(prof)
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert "Relu" in f.summary and "between GPU partitions" in f.summary
    # the share is checked against the events themselves
    runs = [e for e in ev if e.get("name") == "model_run"]
    med = sorted(runs, key=lambda e: e["dur"])[len(runs) // 2]
    relu = [e for e in ev if e["name"] == "relu_kernel_time" and med["ts"] <= e["ts"] <= med["ts"] + med["dur"]]
    share = (relu[0]["dur"] + 80.0) / med["dur"]
    assert f.evidence[0].observed == pytest.approx(share, rel=1e-3)
    acts = cpu_fallback.actions(f.context, {})
    assert any("relu" in a for a in acts)


def test_cpu_nodes_only_at_the_edge_are_milder(mlp):
    prof = parse_events(as_gpu(mlp, {"sig"}, copy_us=1.0))
    r = cpu_fallback.analyse(prof)["median_run"]
    assert r["cpu_between"] == [] and r["boundaries"] == 1
    (f,) = cpu_fallback.detect(prof)
    assert "only at the graph's edges" in f.summary


def test_shape_arithmetic_on_the_cpu_is_not_a_fallback(reshaper):
    ops = {n.op: n.output_types for n in parse_events(reshaper).nodes}
    assert ops["Shape"] == ("int64",) and ops["Concat"] == ("int64",)  # as ORT reports them
    shape_ops = {"shape", "gather", "unsq", "concat"}
    prof = parse_events(as_gpu(reshaper, shape_ops, copy_us=5.0))
    assert cpu_fallback.detect(prof) == []
    assert sorted(cpu_fallback.analyse(prof)["shape_nodes"]) == sorted(shape_ops)


@pytest.mark.parametrize("payload,msg", [
    ({"a": 1}, "not an ONNX Runtime profile"),
    ([], "no node events"),
    ([{"cat": "Session", "name": "model_run", "ts": 0, "dur": 5}], "no node events"),
    ("text", "not an ONNX Runtime profile"),
])
def test_bad_profiles_are_one_line_errors(payload, msg):
    with pytest.raises(ProfileError, match=msg):
        parse_events(payload)


def test_unreadable_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('[{"cat": "Node"', encoding="utf-8")
    with pytest.raises(ProfileError, match="not JSON"):
        read_profile(str(p))
    with pytest.raises(ProfileError, match="no such file"):
        read_profile(str(tmp_path / "missing.json"))


def test_concurrent_runs_are_told_apart_by_thread(mlp):
    """Two Run() calls overlapping in time from two threads: nodes go to the run of their thread."""
    ev = as_gpu(mlp, {"relu"})
    runs = sorted((e for e in ev if e.get("name") == "model_run"), key=lambda e: e["ts"])[:2]
    a, b = runs
    other = []
    for e in ev:  # move the second run onto another thread, starting inside the first
        if b["ts"] <= e["ts"] <= b["ts"] + b["dur"]:
            e = dict(e, tid=999, ts=e["ts"] - (b["ts"] - a["ts"]) + 1)
        other.append(e)
    prof = parse_events(other)
    by_run: dict = {}
    for n in prof.nodes:
        by_run.setdefault(n.run, []).append(n.op)
    assert all(ops.count("Relu") == 1 for r, ops in by_run.items() if r >= 0)
    assert -1 not in by_run


# --- the verbose placement log ---------------------------------------------------------------------
from fragscope.collectors.ort_profile import parse_verbose_log, read_input  # noqa: E402


@pytest.fixture(scope="module")
def verbose_log(tmp_path_factory):
    """A real VERBOSE session log of a small graph (ORT writes it to the process's stderr)."""
    import subprocess
    import sys
    d = tmp_path_factory.mktemp("vl")
    code = (
        "import numpy as np, onnx, onnxruntime as ort\n"
        "from onnx import helper, TensorProto\n"
        "X = helper.make_tensor_value_info('x', TensorProto.FLOAT, [2, 2])\n"
        "Y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [2, 2])\n"
        "n = [helper.make_node('Relu', ['x'], ['a'], name='relu'), helper.make_node('Neg', ['a'], ['y'], name='neg')]\n"
        "m = helper.make_model(helper.make_graph(n, 'g', [X], [Y]), opset_imports=[helper.make_opsetid('', 17)])\n"
        "m.ir_version = 8\n"
        f"onnx.save(m, {str(d / 'm.onnx')!r})\n"
        "so = ort.SessionOptions(); so.log_severity_level = 0\n"
        f"ort.InferenceSession({str(d / 'm.onnx')!r}, so, providers=['CPUExecutionProvider'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    return r.stderr


def _prefix(log: str) -> str:
    """The real line prefix ORT wrote before its placement lines (time, severity, source location)."""
    line = next(ln for ln in log.splitlines() if "placed on [" in ln)
    return line[: line.index("VerifyEachNodeIsAssignedToAnEp]") + len("VerifyEachNodeIsAssignedToAnEp]")]


def test_real_verbose_log_all_on_cpu(verbose_log, tmp_path):
    pl = parse_verbose_log(verbose_log.splitlines())
    assert pl.all_on == "CPUExecutionProvider" and pl.counts == {"CPUExecutionProvider": 2}
    p = tmp_path / "session.log"
    p.write_text(verbose_log)
    got = read_input(str(p))
    assert isinstance(cpu_fallback.detect_placement(got), Inconclusive)


def test_mixed_placement_log(verbose_log):
    pre = _prefix(verbose_log)
    log = "\n".join([
        pre.replace("[V:", "[I:").split(" VerifyEach")[0] + " GetCapability] CUDA kernel not found in registries "
        "for Op type: NonMaxSuppression node name: /nms/NonMaxSuppression",
        f"{pre} Node placements",
        f"{pre}  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 5",
        f"{pre}   Conv (/conv/Conv)",
        f"{pre}   Relu (/relu/Relu)",
        f"{pre}   MemcpyToHost (Memcpy)",
        f"{pre}   MemcpyFromHost (Memcpy_1)",
        f"{pre}   Add (/add/Add)",
        f"{pre}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 3",
        f"{pre}   NonMaxSuppression (/nms/NonMaxSuppression)",
        f"{pre}   Shape (/Shape), Gather (/Gather)",
    ])
    pl = parse_verbose_log(log.splitlines())
    assert pl.counts == {"CUDAExecutionProvider": 5, "CPUExecutionProvider": 3}
    assert [op for op, _ in pl.nodes["CPUExecutionProvider"]] == ["NonMaxSuppression", "Shape", "Gather"]
    assert pl.not_found == [("NonMaxSuppression", "/nms/NonMaxSuppression")]
    (f,) = cpu_fallback.detect_placement(pl)
    assert f.basis == "log" and f.severity is Severity.WARNING
    assert "NonMaxSuppression ×1" in f.summary and "2 copy nodes" in f.summary
    # shape arithmetic alone on the CPU: quiet
    quiet = parse_verbose_log([ln for ln in log.splitlines() if "NonMaxSuppression" not in ln])
    assert cpu_fallback.detect_placement(quiet) == []


def test_log_without_placement_lines_is_an_error(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("2026-01-01 [I:onnxruntime:, inference_session.cc:1 Init] Session created\n")
    with pytest.raises(ProfileError, match="log_severity_level=0"):
        read_input(str(p))
