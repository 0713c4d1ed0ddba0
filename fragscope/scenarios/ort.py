"""ONNX Runtime CPU-fallback scenarios: the profiling JSON ORT writes (``enable_profiling``) and its
VERBOSE placement report, for a model split between a GPU execution provider and the CPU (for
``cpu-fallback``).

    from fragscope.scenarios import OrtScenario, ort_case
    case = ort_case(OrtScenario("ort-many-islands", seed=2))
    json.dumps(case.events), case.verbose_log, case.truth.figures["boundaries"]

The mechanism: ORT assigns each node to the first provider with a kernel for it; nodes the GPU provider
cannot run (an operator, opset or data type without a CUDA kernel) go to the CPU. Every change of
provider along the execution order is a boundary where ORT inserts a copy node: ``MemcpyToHost``
before a CPU island, ``MemcpyFromHost`` after it (both run by the GPU provider; each synchronises the
stream). A copy takes ``10 µs + bytes / 12 GB/s`` (pageable host memory over PCIe 4 x16); a fallen-back
operator takes ``20 µs + bytes / 2 GB/s`` on the host (``/ 20 GB/s`` for a memory-bound element-wise op);
GPU nodes 40-160 µs. Shape arithmetic (Shape,
Gather, Unsqueeze, Concat on int64) is placed on the CPU on purpose (GetCpuPreferredNodes) and is not a
fallback. The events have the fields and order ORT writes (tests/test_engines_ort.py has real profiles):
``model_loading_uri``, ``session_initialization``, then per run the node events (``<node>_kernel_time``,
``args.op_name/provider/node_index/output_type_shape``), ``SequentialExecutor::Execute`` and
``model_run``. The truth's figures come from the generated graph and timings (ops on the CPU, islands,
boundaries, copies, copy and CPU time of the median run, their share of it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ids
from .spec import Truth

ID = ids.CPU_FALLBACK
CPU = "CPUExecutionProvider"
# kind -> what a correct reading reports
ORT_PATHOLOGIES = {
    "ort-one-island": "one CPU island between GPU partitions",
    "ort-many-islands": "several CPU islands: a copy pair and a sync at each",
    "ort-copy-dominant": "one island whose large tensors make the copies most of the run",
}
ORT_CONFOUNDERS = (
    "ort-all-gpu",  # every node on the GPU provider: nothing to report
    "ort-cpu-only",  # a CPU deployment: every node on the CPU, no GPU partition (inconclusive, not a fallback)
    "ort-shape-ops-on-cpu",  # int64 shape arithmetic on the CPU between GPU nodes, 16-byte copies: by design
)
ORT_KINDS = tuple(ORT_PATHOLOGIES) + ORT_CONFOUNDERS

FALLEN_OPS = ("NonMaxSuppression", "RoiAlign", "ScatterND", "GridSample", "Einsum", "Unique")  # float outputs here
GPU_OPS = ("Conv", "Relu", "MatMul", "Add", "Mul", "Sigmoid", "Softmax", "LayerNormalization", "Gemm", "Transpose")
SHAPE_CHAIN = ("Shape", "Gather", "Unsqueeze", "Concat")
PCIE_BYTES_PER_S = 12e9
HOST_BYTES_PER_S = 2e9  # a fallen-back kernel with real work per element (NMS, RoiAlign, GridSample, ...)
ELEMENTWISE_HOST_BYTES_PER_S = 20e9  # a memory-bound element-wise kernel over the host's threads


@dataclass
class OrtScenario:
    """One model profiled for ``runs`` runs on a GPU provider with some nodes on the CPU."""

    kind: str
    seed: int = 0
    severity: float = 1.0  # scales the tensors crossing at each boundary (0.3 mild, 1 reference, 2 extreme; 0 none)
    runs: int = 5
    gpu_nodes: int = 24
    noise: float = 1.0  # duration jitter multiplier
    gpu_provider: str = "CUDAExecutionProvider"

    def __post_init__(self) -> None:
        if self.kind not in ORT_KINDS:
            raise ValueError(f"unknown ORT scenario kind {self.kind!r}; known: {', '.join(ORT_KINDS)}")
        if self.runs < 1 or self.gpu_nodes < 4:
            raise ValueError("need runs >= 1 and gpu_nodes >= 4")
        if self.severity < 0 or self.noise < 0:
            raise ValueError("severity and noise must be >= 0")


@dataclass
class OrtCase:
    events: list[dict]  # the profile: the JSON array ORT writes
    verbose_log: list[str]  # the session's VERBOSE placement report (log_severity_level=0)
    truth: Truth


@dataclass
class _Node:
    name: str
    op: str
    provider: str
    out_type: str  # element type of the output
    out_shape: list[int]
    base_us: float  # duration before jitter


def _graph(s: OrtScenario, rng: np.random.Generator) -> list[_Node]:
    """Nodes in execution order, Memcpy nodes at each provider boundary."""
    k = s.kind
    gpu = CPU if k == "ort-cpu-only" else s.gpu_provider
    sev = s.severity
    islands: list[list[tuple[str, str, list[int]]]] = []  # (op, out type, out shape) per island
    if sev > 0 and k == "ort-one-island":
        islands = [[(FALLEN_OPS[int(rng.integers(len(FALLEN_OPS)))], "float", [1, 256, 28, 28])]]
    elif sev > 0 and k == "ort-many-islands":
        ops = [str(x) for x in rng.choice(FALLEN_OPS, size=5, replace=False)]
        shp = [1, 128, 28, 28]
        islands = [[(op, "float", shp)] for op in ops[:3]] + [[(ops[3], "float", shp), (ops[4], "float", shp)]]
    elif sev > 0 and k == "ort-copy-dominant":
        # an element-wise op left on the CPU (no GPU kernel for its type in the build) on a 32 MiB tensor:
        # memory-bound on the host (~20 GB/s over its threads), so the two PCIe copies cost ~3× its own time
        islands = [[("Mod", "float", [8, 256, 64, 64])]]
    elif k == "ort-shape-ops-on-cpu":
        islands = [[(op, "int64", [2] if op != "Gather" else []) for op in SHAPE_CHAIN]]
    n = s.gpu_nodes
    where = sorted(rng.choice(np.arange(2, n - 2), size=len(islands), replace=False).tolist()) if islands else []
    nodes: list[_Node] = []
    copy_k = 0
    for i in range(n):
        op = GPU_OPS[i % len(GPU_OPS)]
        nodes.append(_Node(f"/backbone/{op}_{i}", op, gpu, "float", [1, 256, 28, 28], float(rng.uniform(40, 160))))
        for j, at in enumerate(where):
            if at != i:
                continue
            isl = islands[j]
            shape_isl = isl[0][1] == "int64"
            cross = 16 if shape_isl else int(np.prod(isl[0][2])) * 4 * (sev if sev > 0 else 1.0)
            copy_k = _add_copy(nodes, "MemcpyToHost", gpu, copy_k, cross)
            for m, (cop, typ, shp) in enumerate(isl):
                nbytes = 8 * max(1, int(np.prod(shp))) if typ == "int64" else cross
                rate = ELEMENTWISE_HOST_BYTES_PER_S if cop == "Mod" else HOST_BYTES_PER_S
                us = 3.0 if typ == "int64" else 20.0 + nbytes / rate * 1e6
                nodes.append(_Node(f"/island{j}/{cop}_{m}", cop, CPU, typ, list(shp), us))
            copy_k = _add_copy(nodes, "MemcpyFromHost", gpu, copy_k, 16 if shape_isl else cross)
    return nodes


def _add_copy(nodes: list[_Node], op: str, gpu: str, k: int, nbytes: float) -> int:
    name = "Memcpy" if k == 0 else f"Memcpy_{k}"  # ORT's generated names
    nodes.append(_Node(name, op, gpu, "float", [int(nbytes // 4)], 10.0 + nbytes / PCIE_BYTES_PER_S * 1e6))
    return k + 1


def ort_case(s: OrtScenario) -> OrtCase:
    """Profile events, the verbose placement report, and the truth with the run's own figures."""
    rng = np.random.default_rng(s.seed)
    nodes = _graph(s, rng)
    pid = tid = 4242
    t = 15.0
    events: list[dict] = [_session("model_loading_uri", t, 4400.0, pid, tid),
                          _session("session_initialization", t + 4600.0, 18300.0, pid, tid)]
    t += 25_000.0
    runs = []
    for _ in range(s.runs):
        run_ts = t
        t += 25.0
        exec_ts = t
        durs = []
        for idx, nd in enumerate(nodes):
            d = max(1.0, round(nd.base_us * float(np.exp(rng.normal(0.0, 0.05 * s.noise)))))
            events.append(_node_event(nd, idx, t, d, pid, tid))
            durs.append(d)
            t += d + 2.0  # the executor's own time between nodes
        exec_dur = t - exec_ts
        events.append(_session("SequentialExecutor::Execute", exec_ts, exec_dur, pid, tid))
        run_dur = t + 10.0 - run_ts
        events.append(_session("model_run", run_ts, run_dur, pid, tid))
        runs.append((run_dur, durs))
        t += 5000.0  # the caller's time between runs
    return OrtCase(events, _verbose_log(s, nodes), _truth(s, nodes, runs))


def _session(name: str, ts: float, dur: float, pid: int, tid: int) -> dict:
    return {"cat": "Session", "pid": pid, "tid": tid, "dur": round(dur), "ts": round(ts), "ph": "X", "name": name,
            "args": {}}


def _node_event(nd: _Node, idx: int, ts: float, dur: float, pid: int, tid: int) -> dict:
    size = 8 * max(1, int(np.prod(nd.out_shape))) if nd.out_type == "int64" else 4 * int(np.prod(nd.out_shape))
    args = {"op_name": nd.op, "provider": nd.provider, "node_index": str(idx), "parameter_size": "0",
            "activation_size": str(size), "output_size": str(size),
            "input_type_shape": [{"float": [1, 256, 28, 28]}], "output_type_shape": [{nd.out_type: nd.out_shape}]}
    return {"cat": "Node", "pid": pid, "tid": tid, "dur": round(dur), "ts": round(ts), "ph": "X",
            "name": f"{nd.name}_kernel_time", "args": args}


def _verbose_log(s: OrtScenario, nodes: list[_Node]) -> list[str]:
    """ORT's placement report (session_state.cc VerifyEachNodeIsAssignedToAnEp; providers in name order)."""
    pre = "2026-01-01 00:00:00.{:06d}000 [V:onnxruntime:, session_state.cc:{} VerifyEachNodeIsAssignedToAnEp]"
    by: dict[str, list[_Node]] = {}
    for nd in nodes:
        by.setdefault(nd.provider, []).append(nd)
    lines = [f"{pre.format(1, 1598)} Node placements"]
    if len(by) == 1:
        ((prov, ns),) = by.items()
        return lines + [f"{pre.format(2, 1601)}  All nodes placed on [{prov}]. Number of nodes: {len(ns)}"]
    i = 2
    for prov in sorted(by):
        lines.append(f"{pre.format(i, 1607)}  Node(s) placed on [{prov}]. Number of nodes: {len(by[prov])}")
        for nd in by[prov]:
            i += 1
            lines.append(f"{pre.format(i, 1609)}   {nd.op} ({nd.name})")
    return lines


def _truth(s: OrtScenario, nodes: list[_Node], runs: list[tuple[float, list[float]]]) -> Truth:
    provs = [nd.provider for nd in nodes if not nd.op.startswith("Memcpy")]
    boundaries = sum(1 for a, b in zip(provs, provs[1:]) if a != b)
    fallen = [nd for nd in nodes if nd.provider == CPU and nd.out_type != "int64"]
    shape = [nd for nd in nodes if nd.provider == CPU and nd.out_type == "int64"]
    copies = [i for i, nd in enumerate(nodes) if nd.op.startswith("Memcpy")]
    # the median run by duration (the first run's warm-up is not modelled: any run stands for the steady state)
    run_dur, durs = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    copy_us = float(sum(durs[i] for i in copies))
    cpu_us = float(sum(durs[i] for i, nd in enumerate(nodes) if nd in fallen))
    gpu_only = all(p != CPU for p in provs)
    cpu_only = all(p == CPU for p in provs)
    figs = {
        "cpu_ops": sorted({nd.op for nd in fallen}),
        "cpu_op_count_per_run": len(fallen),
        "islands": sum(1 for a, b in zip(provs, provs[1:]) if a != CPU and b == CPU),
        "boundaries": 0 if cpu_only else boundaries,
        "partitions": 1 if (cpu_only or gpu_only) else boundaries + 1,
        "copies_per_run": len(copies),
        "copy_us": copy_us,
        "cpu_us": cpu_us,
        "run_us": float(run_dur),
        "cpu_and_copy_share": (cpu_us + copy_us) / run_dur,
        "shape_nodes_on_cpu": sorted(nd.name for nd in shape),
        "cpu_placed_nodes": sum(1 for nd in nodes if nd.provider == CPU),
        "memcpy_nodes": len(copies),
    }
    present = s.kind in ORT_PATHOLOGIES and s.severity > 0 and bool(fallen)
    notes = [ORT_PATHOLOGIES.get(s.kind) or {
        "ort-all-gpu": "every node on the GPU provider",
        "ort-cpu-only": "a CPU deployment: no GPU provider (inconclusive, not a fallback)",
        "ort-shape-ops-on-cpu": "int64 shape arithmetic on the CPU by design, 16-byte copies"}[s.kind]]
    if s.kind in ORT_PATHOLOGIES and not present:
        notes.append("severity 0: no node falls back")
    return Truth(diagnoses={ID} if present else set(), onset_ts=None, notes="; ".join(notes), figures=figs,
                 inconclusive={ID} if s.kind == "ort-cpu-only" else set())
