"""Several ranks' traces of one job -> rank-straggler: read each rank's Kineto JSON trace (collectors), align
the ranks on their collectives and judge (detectors), attach the playbook for a training job or a
tensor-parallel engine. Used by ``diagnose trace DIR`` / ``diagnose trace FILE FILE ...``. Contract:
docs/trace.md ("Several ranks").
"""
from __future__ import annotations

import os

from .collectors.kineto_ranks import read_rank_trace
from .collectors.trace_format import read_head
from .collectors.trace_io import DEFAULT_MAX_JSON_BYTES
from .detectors.rank_trace import ID, Config, analyse, judge
from .model import Action, Finding, Playbook
from .timeline_model import TraceError

MAX_RANK_FILES = 1024

RANK_STRAGGLER_TRACE = Playbook(
    ID, "One rank slower than its peers (per-rank traces)",
    "Every rank of the job reaches each collective (all-reduce, all-gather, ...) and waits there until the "
    "slowest rank arrives: one rank that computes longer before the collectives sets the pace of the whole "
    "job, while the others idle inside NCCL kernels.",
    ["Find the slow rank's node and GPU (the finding names the rank, its GPU and its trace file) and check its "
     "clocks and throttle reasons: nvidia-smi -q -i <gpu> -d PERFORMANCE,CLOCK,TEMPERATURE,POWER.",
     "Check its PCIe link against its maximum under load: nvidia-smi -q -i <gpu> (GPU Link Info: current vs "
     "max generation and width), and its Xid / ECC state (nvidia-smi -q -d ECC,ROW_REMAPPER)."],
    [Action("Take the node out of the job: drain it (kubectl cordon + drain, or exclude the host from the next "
            "launch) and restart from the last checkpoint, or move the engine's pod to another node.",
            ["a spare node, or the job can run on fewer nodes"],
            ["the same rank number is slow on every node: the work is uneven, not the GPU (see the next action)"]),
     Action("Fix the slow GPU's cause: cooling for a thermal slowdown, reseating for a PCIe link below its "
            "maximum, resetting application clocks and power limits to the peers' values (nvidia-smi -rac, -pl), "
            "a GPU reset or service for hardware faults.",
            ["the GPU's clocks, temperature, link or error counters differ from its peers'"], []),
     Action("If that rank gets more work than the others (uneven pipeline stages or shards, longer sequences "
            "routed to it, an unbalanced mixture-of-experts), rebalance the split.",
            ["the slow rank's GPU is healthy and the same rank is slow on other hardware"], []),
     Action("Run once with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) to see each rank's transport (NVLink, "
            "PCIe, InfiniBand, sockets): a rank on a slower path waits longer inside the collective too.",
            [], ["keep it off in steady state: it logs every communicator"])],
    ["new per-rank traces of the same steps: the peers' wait share inside collectives below 50 %, the last rank "
     "changing from one collective to the next; step time down"],
    ["HTA (Holistic Trace Analysis): straggler and communication-computation overlap analysis across ranks",
     "NCCL documentation: environment variables (NCCL_DEBUG, NCCL_DEBUG_SUBSYS)",
     "NVIDIA nvidia-smi: clocks event reasons, GPU link info"])


def trace_files(paths: list[str]) -> list[str]:
    """The trace files named, a directory standing for its *.json / *.json.gz files (sorted)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            try:
                names = sorted(os.listdir(p))
            except OSError as e:
                raise TraceError(f"cannot read {p}: {e.strerror or e}") from None
            found = [os.path.join(p, n) for n in names if n.endswith((".json", ".json.gz"))
                     and os.path.isfile(os.path.join(p, n))]
            if not found:
                raise TraceError(f"cannot read {p}: no .json or .json.gz traces in this directory")
            out += found
        else:
            out.append(p)
    if len(out) > MAX_RANK_FILES:
        raise TraceError(f"cannot read {paths[0]}: {len(out)} traces, above {MAX_RANK_FILES}")
    return out


def _actions(f: Finding) -> list[str]:
    c = f.context
    gpu = f" (GPU {c['rank_gpu']})" if c.get("rank_gpu") is not None else ""
    return [f"Rank {c['rank']}{gpu}, trace {c['source']}, sets the pace: its peers wait "
            f"{c['wait_per_collective_seconds'] * 1e3:.2f} ms per collective. Check that GPU's clocks, throttle "
            "reasons and PCIe link; drain its node if it stays slower."]


def analyse_rank_files(paths: list[str], cfg: Config = Config(),
                       max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> tuple[dict, list[Finding]]:
    """Read two or more ranks' Kineto traces, align and judge them. Returns the analysis dict (with
    ``inconclusive``) and the findings, playbooks attached. Raises TraceError (one line) on bad input."""
    files = trace_files(paths)
    if len(files) < 2:
        raise TraceError(f"cannot read {files[0] if files else 'traces'}: per-rank analysis needs the traces of two "
                         "or more ranks (a directory of them, or several files)")
    ranks = []
    for p in files:
        head = read_head(p)
        if head.startswith(b"SQLite format 3\x00"):
            raise TraceError(f"cannot read {p}: per-rank analysis reads PyTorch profiler JSON traces, not "
                             "Nsight Systems exports")
        ranks.append(read_rank_trace(p, max_json_bytes))
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank is not None:
            if r.rank in seen:
                raise TraceError(f"cannot read {r.source}: rank {r.rank} again (also {seen[r.rank]}): give each "
                                 "rank's trace once")
            seen[r.rank] = r.source
    if len(seen) not in (0, len(ranks)):
        raise TraceError(f"cannot read {next(r.source for r in ranks if r.rank is None)}: no distributedInfo.rank "
                         "while other traces have one")
    a = analyse(ranks)
    findings, inconclusive = judge(a, cfg)
    for f in findings:
        d = RANK_STRAGGLER_TRACE.to_dict()
        d["actions"] = _actions(f)
        f.playbook = d
    starts = [int(r.kernel_start.min()) for r in ranks if r.wall_clock]
    ends = [int(r.kernel_end.max()) for r in ranks if r.wall_clock]
    a["window"] = ({"start": min(starts) / 1e9, "end": max(ends) / 1e9} if len(starts) == len(ranks)
                   else {"start": None, "end": None})
    a["inconclusive"] = [i.to_dict() for i in inconclusive]
    return a, findings
