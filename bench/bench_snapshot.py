"""Benchmark: analyse a 100k-block PyTorch memory snapshot (target: under 1 s, whole process).

Builds a synthetic ``_dump_snapshot``-shaped pickle (100,000 blocks in 2,000 segments, each block with
a stack of frames, plus a 100,000-entry trace ring as ``_record_memory_history(max_entries=100000)``
keeps; its last ``--after`` entries follow an ``oom`` entry and agree with the segment state, so the
OOM replay undoes all of them), then times, in this one script:

- baseline A: plain ``pickle.load`` of the same file (what torch's _memory_viz does, unsafely);
- baseline B: ``torch.cuda._memory_viz.segsum`` on the loaded dict, when torch is importable;
- fragscope in-process: safe load, normalise, analyse, segment map;
- fragscope whole process: ``diagnose snapshot FILE --format json`` and the human output with the map,
  as subprocesses (interpreter start and imports included).

Usage: python bench/bench_snapshot.py [--blocks N] [--trace N] [--after N] [--repeat R]
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def build_snapshot(n_blocks: int, n_trace: int, seed: int = 1, after: int = 20_000) -> dict:
    rnd = random.Random(seed)
    frame_pool = [{"filename": f"/srv/app/module_{i % 40}.py", "line": 10 + i, "name": f"fn_{i}"}
                  for i in range(400)]
    per_seg = 50
    segments = []
    addr = 0x7F00_0000_0000
    made = 0
    while made < n_blocks:
        k = min(per_seg, n_blocks - made)
        blocks = []
        total = 0
        for j in range(k):
            size = rnd.choice((512, 4096, 65536, 2 * MiB, 6 * MiB, 20 * MiB))
            state = "inactive" if rnd.random() < 0.3 else ("active_pending_free" if rnd.random() < 0.02
                                                          else "active_allocated")
            req = 0 if state == "inactive" else size - rnd.choice((0, 0, 256, 511))
            frames = [] if state == "inactive" else [frame_pool[rnd.randrange(400)] for _ in range(8)]
            blocks.append({"address": addr + total, "size": size, "requested_size": req, "state": state,
                           "frames": frames})
            total += size
        segments.append({
            "device": 0, "address": addr, "total_size": total,
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            "stream": rnd.choice((0, 0, 0, 94_000_000)), "segment_type": "large",
            "segment_pool_id": (0, 0) if rnd.random() < 0.9 else (1, 2),
            "is_expandable": False, "frames": [], "blocks": blocks})
        addr += total + 64 * MiB
        made += k
    # entries older than the OOM (their addresses lie past the segments: the replay never reads them)
    after = min(after, n_trace)
    actions = ("alloc", "free_requested", "free_completed")
    trace = [{"action": actions[i % 3], "addr": addr + i * 512, "size": 512 * (1 + i % 7),
              "stream": 0, "time_us": 1_700_000_000_000_000 + i,
              "frames": [frame_pool[i % 400], frame_pool[(i * 7) % 400]]} for i in range(n_trace - after)]
    if n_trace:
        trace.append({"action": "oom", "device_free": 10 * MiB, "size": 40 * MiB, "stream": 0,
                      "time_us": 1_700_000_000_100_000, "frames": []})
    # entries after the OOM, consistent with the dump: live blocks were allocated after it (alloc),
    # free blocks held tensors freed after it (free_requested + free_completed)
    tail: list[dict] = []
    t = 1_700_000_000_200_000
    for sg in segments:
        for b in sg["blocks"]:
            if len(tail) >= after:
                break
            if b["state"] == "active_allocated":
                acts = ("alloc",)
            elif b["state"] == "inactive":
                acts = ("free_requested", "free_completed")
            else:
                continue
            if len(tail) + len(acts) > after:
                continue  # a lone free_requested would contradict the free block in the dump
            for a in acts:
                t += 1
                tail.append({"action": a, "addr": b["address"], "size": b["size"], "stream": sg["stream"],
                             "time_us": t, "frames": [frame_pool[t % 400]]})
    trace += tail
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    return {"segments": segments, "device_traces": [trace], "allocator_settings": settings,
            "external_annotations": []}


def _fmt1(n: float) -> str:
    """Bytes with one decimal in binary units, the way segsum prints its totals (e.g. 12.3GiB)."""
    for unit in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024.0:
            return f"{n:.1f}{unit}B"
        n /= 1024.0
    return f"{n:.1f}PiB"


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--trace", type=int, default=100_000)
    ap.add_argument("--after", type=int, default=20_000, help="trace entries after the OOM (replayed)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from fragscope.collectors.snapshot import read_snapshot
    from fragscope.detectors.snapshot import analyse_snapshot, replay_to_oom, segment_map_rows

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(build_snapshot(args.blocks, args.trace, after=args.after), f, protocol=4)
        size_mb = os.path.getsize(path) / 1e6
        print(f"snapshot: {args.blocks} blocks, {args.trace} trace entries ({min(args.after, args.trace)} after "
              f"the OOM), {size_mb:.1f} MB pickle")

        data = open(path, "rb").read()
        t_pickle = best(lambda: pickle.load(io.BytesIO(data)), args.repeat)
        print(f"baseline A  plain pickle.load (unsafe, no analysis):      {t_pickle * 1e3:8.1f} ms")

        t_segsum = None
        try:
            from torch.cuda import _memory_viz  # type: ignore

            raw = pickle.load(io.BytesIO(data))
            t_segsum = best(lambda: _memory_viz.segsum(raw), args.repeat)
            print(f"baseline B  torch _memory_viz.segsum (after the load):     {t_segsum * 1e3:8.1f} ms")
            text = _memory_viz.segsum(raw)
            raw = None  # free the dict before the timed fragscope runs
        except ImportError:
            text = None
            print("baseline B  torch _memory_viz.segsum: torch not importable, skipped")
        if text is not None:
            # parity: segsum's totals against ours, both printed with one decimal in binary units
            d = analyse_snapshot(read_snapshot(path))[0]["devices"][0]
            ours = {"total_reserved": d["reserved_bytes"], "total_allocated": d["requested_bytes"],
                    "total_free": d["inactive_bytes"] + d["active_pending_free_bytes"]
                    + d["internal_waste_bytes"]}
            theirs = {ln.split(":")[0]: ln.split(":", 1)[1].split()[0] for ln in text.splitlines()
                      if ln.startswith("total_")}
            same = all(_fmt1(v) == theirs.get(k) for k, v in ours.items())
            print(f"parity      segsum totals {theirs} vs ours "
                  f"{ {k: _fmt1(v) for k, v in ours.items()} }: {'same' if same else 'DIFFERENT'}")

        t_load = best(lambda: read_snapshot(path), args.repeat)
        snap = read_snapshot(path)
        t_an = best(lambda: analyse_snapshot(snap), args.repeat)
        t_map = best(lambda: segment_map_rows(snap, limit=40), args.repeat)
        t_map_all = best(lambda: segment_map_rows(snap, limit=None), 1)
        print(f"fragscope   safe load + normalise:                         {t_load * 1e3:8.1f} ms "
              f"({t_load / t_pickle:.2f}x plain pickle.load)")
        print(f"fragscope   analyse (all metrics, OOM class, playbook):    {t_an * 1e3:8.1f} ms")
        if snap.ooms:
            o = analyse_snapshot(snap)[0]["devices"][0]["ooms"][-1]
            t_rp = best(lambda: replay_to_oom(snap, snap.ooms[-1]), args.repeat)
            print(f"            of which OOM replay ({o['replayed_entries']} entries undone, state_at "
                  f"{o['state_at']}):  {t_rp * 1e3:8.1f} ms ({t_rp / t_an:.0%} of analyse)")
        print(f"fragscope   segment map, 40 segments / all {snap.n_segments}:        "
              f"{t_map * 1e3:8.1f} ms / {t_map_all * 1e3:.1f} ms")
        in_proc = t_load + t_an
        if t_segsum is not None:
            print(f"ratio       (fragscope load+analyse) / (pickle.load + segsum): "
                  f"{in_proc / (t_pickle + t_segsum):.2f}x")

        cmd = [sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()",
               "snapshot", path]
        for label, extra in (("json, no map", ["--format", "json", "--no-map"]),
                             ("human + map ", [])):
            walls = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = subprocess.run(cmd + extra + ["--fail-on", "never"], capture_output=True, cwd=ROOT)
                walls.append(time.perf_counter() - t0)
                if r.returncode != 0:
                    sys.exit(f"diagnose failed: {r.stderr.decode()[:300]}")
            w = min(walls)
            print(f"whole process diagnose snapshot ({label}):            {w * 1e3:8.1f} ms "
                  f"(median {statistics.median(walls) * 1e3:.1f} ms; target < 1000 ms: "
                  f"{'met' if w < 1.0 else 'MISSED'})")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fragscope.cli"], check=True, cwd=ROOT)
        print(f"            of which interpreter start + CLI imports:       "
              f"{(time.perf_counter() - t0) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
