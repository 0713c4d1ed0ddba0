"""``cpu-fallback``: ONNX Runtime nodes placed on the CPU between GPU partitions.

Pure: judges a parsed profile (``collectors/ort_profile.py``). Per run, nodes in execution order;
the provider sequence (Memcpy nodes aside) splits into partitions, and every change of provider is
a boundary where ORT inserts a copy (``MemcpyToHost`` / ``MemcpyFromHost``). Reported: the operators
that ran on the CPU (by op type, with their time), CPU nodes sitting *between* GPU partitions (each
forces a device→host and a host→device copy and a synchronisation), the number of boundaries, and
the share of run time spent in CPU nodes and copies.

ORT places shape arithmetic on the CPU on purpose (``GetCpuPreferredNodes``: small int64 tensors such as
Shape → Gather → Unsqueeze → Concat feeding a Reshape): CPU nodes whose outputs are all int64 or bool
are counted as *shape nodes*, not as a fallback. A profile with no GPU provider at all is inconclusive
(a CPU deployment, or the CUDA provider failed to load: ORT then runs everything on the CPU).

Severity: warning when CPU compute nodes sit between GPU partitions or CPU + copy time is >= 10 % of
the run; critical at >= 30 %; info for CPU nodes only at the graph's edges below 10 %.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from .. import ids
from ..collectors.ort_profile import OrtProfile, Placement
from ..model import Action, Evidence, Finding, Inconclusive, Playbook, Severity

ID = ids.CPU_FALLBACK
CPU = "CPUExecutionProvider"
COPY_OPS = ("MemcpyToHost", "MemcpyFromHost")
SHAPE_TYPES = {"int64", "int32", "bool"}


@dataclass(frozen=True)
class Config:
    warn_share: float = 0.10  # CPU + copy time share of a run that is worth a config change
    critical_share: float = 0.30  # a third of every run lost to the host


def _is_shape(n) -> bool:
    return bool(n.output_types) and all(t in SHAPE_TYPES for t in n.output_types)


def analyse(prof: OrtProfile) -> dict:
    runs: dict[int, list] = defaultdict(list)
    for n in prof.nodes:
        runs[n.run].append(n)
    keys = [k for k in runs if k >= 0] or list(runs)
    per_run = []
    for k in keys:
        seq = runs[k]
        compute = [n for n in seq if n.op not in COPY_OPS]
        parts: list[list] = []
        for n in compute:
            if parts and parts[-1][0].provider == n.provider:
                parts[-1].append(n)
            else:
                parts.append([n])
        between = []
        for i, p in enumerate(parts):
            if p[0].provider == CPU and 0 < i < len(parts) - 1:
                between += [n for n in p if not _is_shape(n)]
        run_us = prof.runs[k][1] if 0 <= k < len(prof.runs) else sum(n.dur_us for n in seq)
        per_run.append({
            "boundaries": max(0, len(parts) - 1),
            "partitions": len(parts),
            "cpu_between": between,
            "cpu_us": sum(n.dur_us for n in compute if n.provider == CPU and not _is_shape(n)),
            "copy_us": sum(n.dur_us for n in seq if n.op in COPY_OPS),
            "copies": sum(1 for n in seq if n.op in COPY_OPS),
            "run_us": run_us,
        })
    cpu_ops: Counter = Counter()
    cpu_op_us: Counter = Counter()
    shape_nodes = set()
    for n in prof.nodes:
        if n.provider == CPU and n.op not in COPY_OPS:
            if _is_shape(n):
                shape_nodes.add(n.name)
            else:
                cpu_ops[n.op] += 1
                cpu_op_us[n.op] += n.dur_us
    nruns = max(1, len(per_run))
    # the median run describes the steady state (the first run includes warm-up allocations)
    mid = sorted(per_run, key=lambda r: r["run_us"])[len(per_run) // 2] if per_run else None
    return {"runs": len(per_run), "providers": prof.providers, "median_run": mid,
            "cpu_ops": dict(cpu_ops), "cpu_op_us_per_run": {k: v / nruns for k, v in cpu_op_us.items()},
            "shape_nodes": sorted(shape_nodes)}


def detect(prof: OrtProfile, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    a = analyse(prof)
    gpu_providers = [p for p in a["providers"] if p != CPU and p != "?"]
    if not gpu_providers:
        return Inconclusive(ID, [], f"every node ran on {CPU}: no GPU partition in this profile (a CPU "
                            "deployment, or the GPU provider failed to load: check the session's providers and "
                            "onnxruntime.get_available_providers())")
    r = a["median_run"]
    if r is None or r["run_us"] <= 0:
        return Inconclusive(ID, [], "no complete model_run in the profile")
    between = r["cpu_between"]
    share = (r["cpu_us"] + r["copy_us"]) / r["run_us"]
    if not a["cpu_ops"] and r["copies"] <= 2:
        return []  # all compute on the GPU; the copies in and out of the graph are expected
    if not a["cpu_ops"]:
        return []  # only shape arithmetic on the CPU (by design)
    if share >= cfg.critical_share:
        sev = Severity.CRITICAL
    elif between or share >= cfg.warn_share:
        sev = Severity.WARNING
    else:
        sev = Severity.INFO
    ops = sorted(a["cpu_op_us_per_run"].items(), key=lambda kv: -kv[1])
    op_txt = ", ".join(f"{op} ×{a['cpu_ops'][op] // max(1, a['runs'])}" for op, _ in ops[:6])
    where = (f"{len(between)} of them between GPU partitions ({', '.join(sorted({n.op for n in between}))})"
             if between else "only at the graph's edges")
    summary = (f"{len(ops)} operator type(s) ran on the CPU ({op_txt}), {where}; {r['boundaries']} provider "
               f"boundaries and {r['copies']} copies per run; CPU nodes and copies take {share * 100:.0f} % of a "
               f"{r['run_us'] / 1000:.2f} ms run.")
    ev = [Evidence("cpu_and_copy_time_ratio", round(share, 4), threshold=cfg.warn_share, unit="ratio",
                   note=f"CPU nodes {r['cpu_us']:.0f} µs + copies {r['copy_us']:.0f} µs of {r['run_us']:.0f} µs "
                        f"(median of {a['runs']} runs)"),
          Evidence("provider_boundaries", float(r["boundaries"]), unit="boundaries",
                   note=f"{r['partitions']} partitions over {', '.join(a['providers'])}"),
          Evidence("memcpy_seconds_per_run", r["copy_us"] * 1e-6, unit="seconds",
                   note=f"{r['copies']} MemcpyToHost/MemcpyFromHost nodes per run")]
    if a["shape_nodes"]:
        ev.append(Evidence("cpu_shape_nodes", float(len(a["shape_nodes"])), unit="nodes", agrees=False,
                           note="int64/bool shape arithmetic placed on the CPU by design; not counted"))
    ctx = {"ops": [op for op, _ in ops], "between": sorted({n.name for n in between}), "share": share,
           "boundaries": r["boundaries"], "gpu_provider": gpu_providers[0]}
    return [Finding(ID, sev, 0.8 if between else 0.6, summary, evidence=ev, subject={"providers": ",".join(
        a["providers"])}, context=ctx, basis="trace")]


# Op types ORT places on the CPU for shape arithmetic (GetCpuPreferredNodes) when their inputs are
# shapes; a placement log does not say the dtype, so these alone are not called a fallback.
SHAPE_OPS = {"Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Slice", "Cast",
             "ConstantOfShape", "Range", "Equal", "Where", "Expand", "ReduceProd", "Mul", "Add", "Sub", "Div"}


def detect_placement(pl: Placement, cfg: Config = Config()) -> list[Finding] | Inconclusive:
    """The same diagnosis from ORT's verbose placement report: which ops, how many copies; no timing."""
    gpu = [p for p in pl.providers if p != CPU]
    if not gpu:
        return Inconclusive(ID, [], f"every node was placed on {CPU}: no GPU provider in this session (a CPU "
                            "deployment, or the GPU provider failed to load)")
    cpu_nodes = [(op, name) for op, name in pl.nodes.get(CPU, []) if op not in COPY_OPS]
    n_cpu = pl.counts.get(CPU, 0)
    if n_cpu == 0:
        return []
    copies = sum(1 for p in gpu for op, _ in pl.nodes.get(p, []) if op in COPY_OPS) or len(pl.copies_added)
    ops = Counter(op for op, _ in cpu_nodes)
    heavy = {op: k for op, k in ops.items() if op not in SHAPE_OPS}
    if cpu_nodes and not heavy:
        return []  # shape arithmetic only (by design)
    total = sum(pl.counts.values())
    no_kernel = sorted({op for op, _ in pl.not_found})
    listed = ", ".join(f"{op} ×{k}" for op, k in sorted(heavy.items(), key=lambda kv: -kv[1])[:6]) or \
        f"{n_cpu} nodes (not listed in the log)"
    summary = (f"{n_cpu} of {total} nodes placed on the CPU beside {', '.join(gpu)} ({listed}); "
               f"{copies} copy nodes" + (f"; no GPU kernel for {', '.join(no_kernel)}" if no_kernel else "") +
               " (placement log: no timings; a profile with enable_profiling gives the time).")
    ev = [Evidence("cpu_placed_nodes", float(n_cpu), unit="nodes", note=f"of {total}; "
                   + ", ".join(f"{p}: {n}" for p, n in sorted(pl.counts.items()))),
          Evidence("memcpy_nodes", float(copies), unit="nodes", note="MemcpyToHost/MemcpyFromHost at boundaries")]
    ctx = {"ops": sorted(heavy, key=lambda op: -heavy[op]) or no_kernel,
           "between": sorted(name or op for op, name in cpu_nodes if op in heavy)[:20], "gpu_provider": gpu[0]}
    sev = Severity.WARNING if (heavy and copies >= 2) else Severity.INFO
    return [Finding(ID, sev, 0.5, summary, evidence=ev, subject={"providers": ",".join(pl.providers)},
                    context=ctx, basis="log")]


def actions(ctx: dict, config: dict) -> list[str]:
    ops = ctx.get("ops") or []
    if not ops:
        return []
    gpu = ctx.get("gpu_provider", "the GPU provider")
    acts = [f"Check {', '.join(ops[:6])} against {gpu}'s operator coverage for your opset and input types "
            "(onnxruntime docs/OperatorKernels.md); a verbose session log (log_severity_level=0) names each "
            "node's placement."]
    if ctx.get("between"):
        acts.append(f"Replace or move {', '.join(ctx['between'][:6])}: re-export at an opset the GPU provider "
                    "covers, rewrite the op with supported ones, or move it to pre/post-processing so the graph "
                    "is one GPU partition.")
    return acts


PLAYBOOK = Playbook(
    ID, "ONNX Runtime nodes falling back to the CPU",
    "Some operators have no kernel on the GPU execution provider for this opset or data type, so ONNX "
    "Runtime runs them on the CPU and copies tensors across PCIe at each partition boundary, "
    "synchronising the stream each time.",
    ["List the CPU-placed nodes (diagnose ort-profile FILE) and the time their copies take per run."],
    [Action("Re-export the model at an opset whose operators the GPU provider covers (or cast inputs to "
            "a supported type, e.g. int64 → int32 where the kernel exists only for int32).",
            ["the fallen operator has a GPU kernel at another opset / type"], []),
     Action("Replace the operator with supported ones in the exporter (e.g. a custom op or a Python-side "
            "step such as NonMaxSuppression moved to post-processing).", [], ["changes numerics: re-validate"]),
     Action("Split the graph: run the CPU part as a separate session / Triton ensemble step so the GPU "
            "part stays one partition.", ["the CPU part sits at the graph's edge"], []),
     Action("With TensorRT EP: let unsupported subgraphs run on the CUDA EP (list CUDA after TensorRT in "
            "providers) rather than the CPU.", ["TensorrtExecutionProvider in use"], [])],
    ["a new profile shows one GPU partition (no CPU compute nodes between GPU nodes)",
     "MemcpyToHost/MemcpyFromHost only at the graph's inputs and outputs; run time down by the copy time"],
    ["onnxruntime docs: performance/tune-performance (profiling, 'Which operators ran on which EP')",
     "onnxruntime docs/OperatorKernels.md (per-provider operator coverage)"])
