"""rank-straggler from the Kineto traces of several ranks of one job: align the ranks on their collectives,
measure per rank the time it waits inside each collective and the GPU compute before it, and name the rank
the others wait for. Pure: takes :class:`~fragscope.collectors.kineto_ranks.RankTrace` objects, no I/O.
Contract: docs/trace.md ("Several ranks").

Mechanism: a collective (all-reduce, all-gather, reduce-scatter, broadcast, all-to-all) completes on every
rank of its group only once the last rank has joined it. Each rank's NCCL kernel starts when that rank
reaches the collective and ends at about the same time on all ranks, so its duration is the data transfer
plus the time spent waiting for the last rank. Per collective, the shortest duration among the ranks is the
transfer (the last rank waits for nobody); each rank's wait is its duration minus that. This needs no
common clock across hosts: durations are measured on each rank's own clock. NCCL requires every rank to
issue the collectives of a communicator in the same order, so the k-th collective of one kind in one process
group is the same operation on every rank (its message size, where the trace records it, is checked).

What stays quiet: point-to-point transfers (pipeline stages wait for each other by design: the bubble);
a late rank that changes from one collective to the next (noise: nobody to name); a consistent late rank
whose peers' wait is a small share of their collective time or of their traced time (within noise); and a
late rank whose GPU was idle, not computing, before the collectives (its host delays it: data loading, the
CPU, Python; not its GPU): said as an inconclusive entry, not a straggler.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ids
from ..ranks_model import CommKernel, RankTrace
from ..model import Evidence, Finding, Inconclusive, Severity

ID = ids.RANK_STRAGGLER

# Collective names of point-to-point operations (torch.distributed send / recv / batch_isend_irecv).
_P2P = {"send", "recv", "isend", "irecv", "sendrecv", "batch_isend_irecv", "p2p"}
# NCCL kernel operations that are collectives (the others, SendRecv / Send / Recv, carry point-to-point
# transfers, and all-to-all too: without the profiler's collective name they are not judged).
_COLLECTIVE_OPS = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"}


@dataclass(frozen=True)
class Config:
    min_collectives: int = 3  # matched collectives needed to judge
    # Noise moves the last arrival from rank to rank; a straggler is last at most collectives.
    last_share: float = 2 / 3
    # The peers spend most of their collective time waiting for the late rank rather than moving data
    # (wait / NCCL kernel time >= 0.5).
    wait_share: float = 0.5
    # ... and that wait costs the job: >= 5 % of the peers' traced GPU time (critical at 25 %).
    lost_share: float = 0.05
    critical_lost_share: float = 0.25
    # The late rank's extra GPU compute before the collectives explains at least half of its lateness
    # (else its GPU sat idle: a host-side delay, not a slow GPU).
    compute_explains: float = 0.5


def collective_kind(c: CommKernel) -> str | None:
    """The collective a communication kernel carries, or None for point-to-point (not judged)."""
    if c.collective:
        n = c.collective.strip().lower().lstrip("_")
        return None if n in _P2P else n
    return c.kernel_op.lower() if c.kernel_op in _COLLECTIVE_OPS else None


def _label(r: RankTrace, i: int) -> int:
    return r.rank if r.rank is not None else i


class _Busy:
    """Union of a rank's non-communication kernels (or of all its kernels), for 'GPU busy between a and b'."""

    def __init__(self, r: RankTrace, comm_too: bool = False):
        keep = np.ones(r.kernel_comm.shape, dtype=bool) if comm_too else ~r.kernel_comm
        s, e = r.kernel_start[keep], r.kernel_end[keep]
        ms, me = [], []
        for a, b in zip(s.tolist(), e.tolist()):
            if ms and a <= me[-1]:
                if b > me[-1]:
                    me[-1] = b
            else:
                ms.append(a)
                me.append(b)
        self.s = np.asarray(ms, dtype=np.int64)
        self.e = np.asarray(me, dtype=np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.e - self.s)])

    def between(self, a: int, b: int) -> int:
        if b <= a or self.s.size == 0:
            return 0
        i = int(np.searchsorted(self.e, a, side="right"))  # first interval ending after a
        j = int(np.searchsorted(self.s, b, side="left"))  # intervals starting before b
        if j <= i:
            return 0
        tot = int(self.cum[j] - self.cum[i])
        tot -= max(0, a - int(self.s[i]))
        tot -= max(0, int(self.e[j - 1]) - b)
        return max(0, tot)


def analyse(ranks: list[RankTrace]) -> dict:
    """Align the ranks' collectives and measure, per rank, wait and compute before each (no verdict)."""
    labels = [_label(r, i) for i, r in enumerate(ranks)]
    per: list[dict[tuple, list[CommKernel]]] = []
    skipped = []
    for r in ranks:
        d: dict[tuple, list[CommKernel]] = {}
        n_skip = 0
        for c in r.comm:
            k = collective_kind(c)
            if k is None:
                n_skip += 1
                continue
            d.setdefault((c.group or "", k), []).append(c)
        per.append(d)
        skipped.append(n_skip)
    notes: list[str] = []
    keys = sorted({k for d in per for k in d})
    instances: list[dict[int, CommKernel]] = []  # index into ranks -> kernel
    mismatched = 0
    for k in keys:
        who = [i for i, d in enumerate(per) if k in d]
        if len(who) < 2:
            continue
        counts = {i: len(per[i][k]) for i in who}
        n = min(counts.values())
        if len(set(counts.values())) > 1:
            notes.append(f"{k[1]}" + (f" (group {k[0]})" if k[0] else "") + ": "
                         + ", ".join(f"rank {labels[i]} {counts[i]}" for i in who)
                         + f" kernels; the first {n} of each are aligned")
        for j in range(n):
            inst = {i: per[i][k][j] for i in who}
            sizes = {c.nelems for c in inst.values() if c.nelems is not None}
            if len(sizes) > 1:
                mismatched += 1
            instances.append(inst)
    busy = [_Busy(r) for r in ranks]
    rows = []
    for i, r in enumerate(ranks):
        span = int(r.kernel_end.max() - r.kernel_start.min()) if r.kernel_start.size else 0
        rows.append({"rank": labels[i], "source": r.source, "device": r.device, "world_size": r.world_size,
                     "collectives": 0, "waited_collectives": 0, "last_arrivals": 0, "collective_seconds": 0.0, "wait_seconds": 0.0,
                     "wait_ratio": None, "span_seconds": span / 1e9, "lost_ratio": None,
                     "compute_before_seconds": 0.0, "idle_before_seconds": 0.0,
                     "point_to_point_kernels": skipped[i]})
    anything = [_Busy(r, comm_too=True) for r in ranks]
    # "Before a collective": since the start of the rank's previous aligned collective (its first kernel for
    # the first), so that compute overlapping a collective on another stream (DDP's bucketed all-reduces)
    # counts alike on every rank, however long each waited in that collective.
    prev_start: dict[int, dict[int, int]] = {}
    for i in range(len(ranks)):
        mine = sorted((inst[i].start_ns, id(inst[i])) for inst in instances if i in inst)
        d = {}
        last = int(ranks[i].kernel_start.min())
        for s, key in mine:
            d[key] = last
            last = s
        prev_start[i] = d
    coll_out = []
    overlap_known = overlap_yes = 0
    for inst in sorted(instances, key=lambda x: min(c.start_ns for c in x.values())):
        durs = {i: c.end_ns - c.start_ns for i, c in inst.items()}
        m = min(durs.values())
        late = min(durs, key=lambda i: (durs[i], labels[i]))
        waits = {i: durs[i] - m for i in inst}
        before = {}
        for i, c in inst.items():
            a = prev_start[i][id(c)]
            b = busy[i].between(a, c.start_ns)
            before[i] = (b, max(0, c.start_ns - a - anything[i].between(a, c.start_ns)))
            row = rows[i]
            row["collectives"] += 1
            row["collective_seconds"] += durs[i] / 1e9
            row["wait_seconds"] += waits[i] / 1e9
            row["compute_before_seconds"] += b / 1e9
            row["idle_before_seconds"] += before[i][1] / 1e9
        if waits and max(waits.values()) > 0:  # nobody waited: no late rank (identical durations)
            rows[late]["last_arrivals"] += 1
            for i in inst:
                rows[i]["waited_collectives"] += 1
        else:
            late = None
        if all(ranks[i].wall_clock for i in inst):
            overlap_known += 1
            overlap_yes += max(c.start_ns for c in inst.values()) <= min(c.end_ns for c in inst.values())
        c0 = next(iter(inst.values()))
        coll_out.append({"collective": collective_kind(c0), "group": c0.group, "nelems": c0.nelems,
                         "late_rank": labels[late] if late is not None else None, "transfer_seconds": m / 1e9,
                         "wait_seconds": {labels[i]: waits[i] / 1e9 for i in inst},
                         "compute_before_seconds": {labels[i]: before[i][0] / 1e9 for i in inst},
                         "idle_before_seconds": {labels[i]: before[i][1] / 1e9 for i in inst}})
    for row in rows:
        if row["collective_seconds"] > 0:
            row["wait_ratio"] = row["wait_seconds"] / row["collective_seconds"]
        if row["span_seconds"] > 0 and row["collectives"]:
            row["lost_ratio"] = row["wait_seconds"] / row["span_seconds"]
    if overlap_known and overlap_yes < 0.5 * overlap_known:
        notes.append(f"only {overlap_yes} of {overlap_known} aligned collectives overlap in time on the ranks' "
                     "clocks: host clocks apart, or traces of different steps (waits are measured from durations)")
    if sum(skipped):
        notes.append(f"{sum(skipped)} point-to-point kernels (SendRecv / send / recv: pipeline stages wait for "
                     "each other by design, all-to-all without the profiler's collective name) not judged")
    return {"ranks": rows, "collectives": coll_out, "mismatched_sizes": mismatched, "notes": notes,
            "format": "kineto-json"}


def judge(a: dict, cfg: Config = Config()) -> tuple[list[Finding], list[Inconclusive]]:
    rows, colls = a["ranks"], a["collectives"]
    if a["mismatched_sizes"]:
        return [], [Inconclusive(ID, ["aligned collectives"],
                                 f"{a['mismatched_sizes']} collectives at the same position differ in message size "
                                 "across ranks: the traces are not of the same steps (or are sampled); profile the "
                                 "same steps on every rank (torch.profiler schedule)")]
    if len(colls) < cfg.min_collectives:
        skipped = sum(r["point_to_point_kernels"] for r in rows)
        why = (f"{len(colls)} collective(s) common to the ranks (need {cfg.min_collectives})"
               + (f"; {skipped} point-to-point kernels not judged" if skipped else ""))
        return [], [Inconclusive(ID, ["collectives common to the ranks' traces"], why)]
    judged = [r for r in rows if r["collectives"] >= cfg.min_collectives]
    if len(judged) < 2:
        return [], [Inconclusive(ID, ["collectives common to the ranks' traces"], "fewer than two ranks share "
                                 f"{cfg.min_collectives} collectives")]
    s = max(judged, key=lambda r: (r["last_arrivals"] / max(1, r["waited_collectives"]), -r["wait_seconds"]))
    peers = [r for r in judged if r is not s]
    share_last = s["last_arrivals"] / max(1, s["waited_collectives"])
    wait_ratio = float(np.median([r["wait_ratio"] or 0.0 for r in peers]))
    lost = float(np.median([r["lost_ratio"] or 0.0 for r in peers]))
    if share_last < cfg.last_share or wait_ratio < cfg.wait_share or lost < cfg.lost_share:
        return [], []
    # lateness of s at the collectives it was last at: the peers' median wait there; its extra compute
    rk = s["rank"]
    mine = [c for c in colls if c["late_rank"] == rk]
    late_ns = extra = 0.0
    for c in mine:
        pw = [v for k, v in c["wait_seconds"].items() if k != s["rank"]]
        pc = [v for k, v in c["compute_before_seconds"].items() if k != s["rank"]]
        late_ns += float(np.median(pw))
        extra += c["compute_before_seconds"][s["rank"]] - float(np.median(pc))
    explained = extra / late_ns if late_ns > 0 else 0.0
    n = s["collectives"]
    per_wait = late_ns / len(mine)
    where = f"rank {rk}" + (f" (GPU {s['device']})" if s["device"] is not None else "")
    head = (f"{where} is last to reach {s['last_arrivals']} of {s['waited_collectives']} collectives; its "
            f"{len(peers)} peer(s) wait {per_wait * 1e3:.2f} ms for it at each of them inside NCCL ({wait_ratio * 100:.0f} % of their collective "
            f"time, {lost * 100:.0f} % of their traced GPU time)")
    if explained < cfg.compute_explains:
        return [], [Inconclusive(ID, [], head + f", but its GPU was idle, not computing, before them (extra compute "
                                 f"explains {max(0.0, explained) * 100:.0f} % of its lateness): its host delays it (data "
                                 "loading, CPU, Python), not its GPU", {"rank": str(rk)})]
    own = float(np.mean([c["compute_before_seconds"][rk] for c in mine]))
    peer_c = float(np.mean([np.median([v for k, v in c["compute_before_seconds"].items() if k != rk]) for c in mine]))
    sev = Severity.CRITICAL if lost >= cfg.critical_lost_share else Severity.WARNING
    conf = min(0.95, 0.5 + 0.3 * share_last + 0.15 * min(1.0, explained))
    summary = (head + f": its GPU computes {own * 1e3:.2f} ms before each collective against its peers' "
               f"{peer_c * 1e3:.2f} ms, a slower GPU (check its clocks, throttle reasons and PCIe link).")
    ev = [Evidence("collective_wait_ratio", wait_ratio, None, cfg.wait_share, "ratio", None,
                   "peers' wait inside NCCL kernels over their NCCL kernel time (median over peers)"),
          Evidence("collective_wait_lost_ratio", lost, None, cfg.lost_share, "ratio", None,
                   "peers' wait over their traced GPU time"),
          Evidence("last_arrival_ratio", share_last, None, cfg.last_share, "ratio", None,
                   f"rank {rk} last at {s['last_arrivals']} of the {s['waited_collectives']} collectives where a rank waited"),
          Evidence("compute_before_collective_seconds", own, peer_c, None, "seconds", None,
                   f"rank {rk}'s GPU compute before each collective vs its peers' median")]
    ctx = {"rank": rk, "rank_gpu": s["device"], "source": s["source"], "wait_per_collective_seconds": per_wait,
           "wait_ratio": wait_ratio, "lost_ratio": lost, "extra_compute_ratio": explained}
    subject = {"rank": str(rk)}
    if s["device"] is not None:
        subject["gpu"] = str(s["device"])
    f = Finding(ID, sev, conf, summary, None, ev, ["the slow rank's GPU clocks and throttle reasons (nvidia-smi -q -d "
                                                   "PERFORMANCE,CLOCK on its node)"], subject, context=ctx, basis="trace")
    return [f], []
