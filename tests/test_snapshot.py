"""diagnose snapshot: safe loading, normalisation, numbers, OOM classes, verdicts, CLI.

Synthetic snapshots are plain dicts shaped like torch.cuda.memory._snapshot() output (keys from
torch/csrc/cuda/Module.cpp, see docs/snapshot.md), pickled with pickle.dumps. Sizes are chosen so that
every expected number can be worked out by hand (comments give the arithmetic).
"""
from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from fragscope.cli import diagnose_group
from fragscope.collectors.snapshot import (
    ALLOCATED,
    INACTIVE,
    PENDING_FREE,
    SnapshotError,
    parse_snapshot,
    read_snapshot,
)
from fragscope.detectors.snapshot import (
    FRAGMENTATION,
    OOM_CAPACITY,
    OOM_CROSS_STREAM,
    OOM_MEMORY_CAP,
    OOM_OUTSIDE_PYTORCH,
    OOM_PRIVATE_POOL,
)
from fragscope.detectors.snapshot_allocator import alloc_segment_size, round_request
from fragscope.detectors.snapshot_map import segment_map_rows
from fragscope.detectors.snapshot_replay import replay_to_oom
from fragscope.model import Finding, Severity

# the pipeline: analysis (pure, fragscope.detectors.snapshot) + playbooks; the file entry point reads first
from fragscope.playbooks.snapshot import diagnose_snapshot as analyse_snapshot  # noqa: E402
from fragscope.snapshot_pipeline import diagnose_snapshot_file as analyse_snapshot_file  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
FRAMES = [{"filename": "/app/model.py", "line": 42, "name": "forward"},
          {"filename": "/app/serve.py", "line": 7, "name": "step"}]


# ---------------------------------------------------------------------------------------------
# builders
def blk(size, state="active_allocated", req=None):
    return {"size": size, "requested_size": size if req is None else req, "state": state,
            "frames": FRAMES if state != "inactive" else []}


_next_addr = [0x7F0000000000]


def seg(blocks, device=0, stream=0, pool=(0, 0), large=True, expandable=False):
    total = sum(b["size"] for b in blocks)
    addr = _next_addr[0]
    _next_addr[0] += total + 64 * MiB
    a = addr
    for b in blocks:
        b["address"] = a
        a += b["size"]
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": addr, "total_size": total, "allocated_size": alloc,
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            "stream": stream, "segment_type": "large" if large else "small", "segment_pool_id": pool,
            "is_expandable": expandable, "frames": FRAMES, "blocks": blocks}


def settings(conf="", expandable=False, max_split=-1, gct=0.0):
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": max_split, "garbage_collection_threshold": gct,
            "expandable_segments": expandable, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}


def oom(size, free, stream=0, t=1_700_000_000_000_000):
    return {"action": "oom", "device_free": free, "size": size, "stream": stream, "time_us": t, "frames": FRAMES}


def ev(action, addr, size, stream=0):
    """A trace entry as Module.cpp writes it (action, addr, size, stream, time_us, frames)."""
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 1_700_000_000_000_001,
            "frames": []}


def freed(addr, size, stream=0):
    """A tensor freed after the OOM: free_requested then free_completed (both carry the requested size)."""
    return [ev("free_requested", addr, size, stream), ev("free_completed", addr, size, stream)]


def dump(segments, traces=None, st=None, ndev=1):
    return {"segments": segments, "device_traces": traces if traces is not None else [[] for _ in range(ndev)],
            "allocator_settings": st if st is not None else settings(), "external_annotations": []}


def write(tmp_path: Path, obj, name="snap.pickle", gz=False) -> str:
    data = pickle.dumps(obj, protocol=4)
    if gz:
        data = gzip.compress(data)
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def fragmented_segments():
    """4 x 512 MiB segments, each [A64 F32]x5 + A32 (MiB), + one empty 20 MiB segment.

    Per big segment: allocated 5*64+32 = 352 MiB, free 5*32 = 160 MiB. Totals: reserved 4*512+20 = 2068 MiB,
    allocated 1408 MiB, inactive 640+20 = 660 MiB, largest free 32 MiB, releasable 20 MiB (empty segment),
    non-releasable 640 MiB. Each allocated block requested 512 B less than its size: 24 blocks -> 12288 B.
    """
    segs = []
    for _ in range(4):
        blocks = []
        for _ in range(5):
            blocks += [blk(64 * MiB, req=64 * MiB - 512), blk(32 * MiB, "inactive", req=0)]
        blocks.append(blk(32 * MiB, req=32 * MiB - 512))
        segs.append(seg(blocks))
    segs.append(seg([blk(20 * MiB, "inactive", req=0)]))
    return segs


def dev0(doc):
    return doc["devices"][0]


# ---------------------------------------------------------------------------------------------
# numbers
def test_fragmented_modern_snapshot_numbers_and_verdict(tmp_path):
    path = write(tmp_path, dump(fragmented_segments()))
    doc, findings = analyse_snapshot_file(path)
    d = dev0(doc)
    assert d["reserved_bytes"] == 2068 * MiB
    assert d["allocated_bytes"] == 1408 * MiB
    assert d["requested_bytes"] == 1408 * MiB - 24 * 512
    assert d["internal_waste_bytes"] == 24 * 512
    assert d["inactive_bytes"] == 660 * MiB
    assert d["largest_free_block_bytes"] == 32 * MiB
    assert d["external_fragmentation"] == round(1 - 32 / 660, 6)
    assert d["releasable_bytes"] == 20 * MiB
    assert d["non_releasable_inactive_bytes"] == 640 * MiB
    assert d["segments"] == 5 and d["blocks"] == 45 and d["free_blocks"] == 21
    assert d["private_pool_bytes"] == 0 and d["sliver_count"] == 0
    assert "default_pool" not in doc  # per device, not per file
    # every segment is in the default pool here, so its numbers are the device's
    assert d["default_pool"]["external_fragmentation"] == round(1 - 32 / 660, 6) == d["external_fragmentation"]
    assert d["default_pool"]["non_releasable_ratio"] == round(640 / 2068, 6)
    assert doc["verdict"] == FRAGMENTATION == d["verdict"]
    [f] = findings
    assert isinstance(f, Finding) and f.id == FRAGMENTATION and f.severity is Severity.WARNING
    assert f.subject == {"gpu": "0"}
    assert f.confidence == pytest.approx(0.6)
    assert "640.00 MiB (30.9 %)" in f.summary and "largest free block is 32.00 MiB" in f.summary
    settings_ = [o["setting"] for o in f.playbook["options"]]
    assert settings_ == ["expandable_segments:True", "max_split_size_mb:32", "garbage_collection_threshold:0.8"]
    exp = f.playbook["options"][0]
    assert exp["applies"] is True
    assert any("#9046" in c for c in exp["contraindications"])
    assert any("sleep mode" in c for c in exp["contraindications"])
    assert any("159564" in c for c in exp["contraindications"])
    gct = f.playbook["options"][2]
    assert any("set_per_process_memory_fraction" in p for p in gct["preconditions"])


def test_healthy_snapshot_is_ok_not_fragmented(tmp_path):
    # 1 GiB segment, 900 MiB allocated then 124 MiB free at the end: one free block -> ext frag 0
    s = seg([blk(900 * MiB), blk(124 * MiB, "inactive", req=0)])
    doc, findings = analyse_snapshot(parse_snapshot(dump([s])))
    d = dev0(doc)
    assert d["external_fragmentation"] == 0.0
    assert d["verdict"] == "ok" and doc["verdict"] == "ok" and findings == []
    assert d["fragmentation_checks"]["external_fragmentation"]["met"] is False


def test_slivers_and_pending_free_and_awaiting_alias():
    s = seg([blk(10 * MiB), blk(1 * MiB, "inactive", req=0), blk(4 * MiB, "active_pending_free"),
             blk(3 * MiB, "active_awaiting_free"), blk(512 * 1024, "inactive", req=0), blk(2 * MiB)])
    snap = parse_snapshot(dump([s]))
    assert list(snap.blk_state) == [ALLOCATED, INACTIVE, PENDING_FREE, PENDING_FREE, INACTIVE, ALLOCATED]
    d = dev0(analyse_snapshot(snap)[0])
    assert d["active_pending_free_bytes"] == 7 * MiB
    assert d["sliver_count"] == 2 and d["sliver_bytes"] == 1 * MiB + 512 * 1024
    assert d["allocated_bytes"] == 12 * MiB
    assert d["releasable_bytes"] == 0


def test_small_pool_free_blocks_are_not_slivers():
    s = seg([blk(1 * MiB), blk(1 * MiB, "inactive", req=0)], large=False)
    d = dev0(analyse_snapshot(parse_snapshot(dump([s])))[0])
    assert d["sliver_count"] == 0 and d["inactive_bytes"] == 1 * MiB


def test_legacy_history_real_size_without_requested_size(tmp_path):
    # PyTorch ~2.0: no requested_size, no block address, no segment_pool_id / is_expandable, no settings
    blocks = [{"size": 40 * MiB, "state": "active_allocated",
               "history": [{"addr": 1, "real_size": 30 * MiB, "frames": FRAMES},
                           {"addr": 2, "real_size": 9 * MiB}]},
              {"size": 20 * MiB, "state": "inactive", "history": []},
              {"size": 4 * MiB, "state": "active_allocated", "history": [{"addr": 3, "real_size": 4 * MiB}]}]
    segment = {"device": 0, "address": 0x7000_0000_0000, "total_size": 64 * MiB, "allocated_size": 44 * MiB,
               "active_size": 44 * MiB, "stream": 0, "segment_type": "large", "blocks": blocks}
    path = write(tmp_path, {"segments": [segment], "device_traces": [[{"action": "snapshot", "addr": 0,
                                                                        "size": 44 * MiB, "stream": 0}]]})
    snap = read_snapshot(path)
    assert snap.legacy and not snap.pool_ids_known and not snap.expandable_known
    assert list(snap.blk_offset) == [0, 40 * MiB, 60 * MiB]
    doc, _ = analyse_snapshot(snap)
    d = dev0(doc)
    assert d["requested_bytes"] == 39 * MiB + 4 * MiB  # history real sizes summed, as _memory_viz does
    assert d["internal_waste_bytes"] == 1 * MiB
    assert d["inactive_bytes"] == 20 * MiB
    assert doc["allocator_settings"]["known"] is False
    assert doc["format"]["legacy"] is True
    assert any("segment_pool_id" in n for n in doc["notes"])
    assert d["trace_actions"] == {"snapshot": 1}


def test_missing_requested_size_is_not_available_not_zero():
    s = seg([blk(8 * MiB), blk(8 * MiB, "inactive", req=0)])
    del s["blocks"][0]["requested_size"]
    d = dev0(analyse_snapshot(parse_snapshot([s]))[0])
    assert d["requested_bytes"] is None and d["internal_waste_bytes"] is None
    assert d["allocated_bytes"] == 8 * MiB


def test_bare_segment_list_memory_snapshot(tmp_path):
    path = write(tmp_path, fragmented_segments())
    snap = read_snapshot(path)
    assert snap.layout == "segment-list" and snap.allocator_settings is None
    doc, findings = analyse_snapshot(snap)
    assert dev0(doc)["reserved_bytes"] == 2068 * MiB
    assert [f.id for f in findings] == [FRAGMENTATION]
    assert doc["allocator_settings"]["known"] is False


def test_json_and_gzip_containers(tmp_path):
    obj = dump(fragmented_segments())
    p_json = tmp_path / "snap.json"
    p_json.write_text(json.dumps(obj))  # tuples become lists: segment_pool_id [0, 0]
    p_gz = write(tmp_path, obj, "snap.pickle.gz", gz=True)
    p_jgz = tmp_path / "snap.json.gz"
    p_jgz.write_bytes(gzip.compress(json.dumps(obj).encode()))
    docs = [analyse_snapshot_file(str(p))[0] for p in (p_json, p_gz, p_jgz)]
    assert [d["format"]["container"] for d in docs] == ["json", "pickle.gz", "json.gz"]
    assert {dev0(d)["inactive_bytes"] for d in docs} == {660 * MiB}


def test_expandable_segment_releasable_pages(tmp_path):
    # one expandable 200 MiB large segment [A50 F70 A80]: the free block spans 50..120 MiB; whole 20 MiB
    # mapping pages inside it: 60..120 -> 3 pages = 60 MiB releasable, 10 MiB not
    s = seg([blk(50 * MiB), blk(70 * MiB, "inactive", req=0), blk(80 * MiB)], expandable=True)
    doc, findings = analyse_snapshot(parse_snapshot(dump([s], st=settings("expandable_segments:True", True))))
    d = dev0(doc)
    assert d["releasable_bytes"] == 60 * MiB
    assert d["non_releasable_inactive_bytes"] == 10 * MiB
    assert d["expandable_segments"] == 1
    assert doc["allocator_settings"]["expandable_segments"] is True


def test_expandable_already_on_is_not_recommended_again():
    segs = fragmented_segments()
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, st=settings("expandable_segments:True", True))))
    opt = findings[0].playbook["options"][0]
    assert opt["setting"] == "expandable_segments:True" and opt["applies"] is False
    assert opt["status"] == "already on"
    assert not any("expandable_segments:True" in a for a in findings[0].playbook["actions"])


def test_cuda_malloc_async_backend_knobs_marked_ignored():
    doc, findings = analyse_snapshot(parse_snapshot(dump(fragmented_segments(),
                                                         st=settings("backend:cudaMallocAsync"))))
    assert doc["allocator_settings"]["backend"] == "cudaMallocAsync"
    pb = findings[0].playbook
    assert all(o["applies"] is False for o in pb["options"])
    assert "cudaMallocAsync" in pb["immediate"][0]


def test_private_pools_per_pool_and_stream():
    segs = [seg([blk(100 * MiB), blk(28 * MiB, "inactive", req=0)]),
            seg([blk(300 * MiB), blk(212 * MiB, "inactive", req=0)], pool=(1, 2)),
            seg([blk(64 * MiB)], stream=93874, pool=(0, 0))]
    doc, _ = analyse_snapshot(parse_snapshot(dump(segs)))
    d = dev0(doc)
    assert d["private_pool_bytes"] == 512 * MiB
    assert d["private_pool_ratio"] == round(512 / (128 + 512 + 64), 6)
    # private-pool free blocks are not releasable by empty_cache()
    assert d["releasable_bytes"] == 0
    pools = {tuple(p["pool_id"]): p for p in d["pools"]}
    assert pools[(0, 0)]["reserved_bytes"] == 192 * MiB and pools[(0, 0)]["private"] is False
    assert pools[(1, 2)]["inactive_bytes"] == 212 * MiB and pools[(1, 2)]["private"] is True
    streams = {(s["stream"], tuple(s["pool_id"])): s for s in d["streams"]}
    assert set(streams) == {(0, (0, 0)), (0, (1, 2)), (93874, (0, 0))}
    assert streams[(93874, (0, 0))]["allocated_bytes"] == 64 * MiB


def test_two_devices_and_device_filter():
    segs = fragmented_segments() + [seg([blk(10 * MiB)], device=1)]
    snap = parse_snapshot(dump(segs, ndev=2))
    doc, findings = analyse_snapshot(snap)
    assert [d["device"] for d in doc["devices"]] == [0, 1]
    assert [d["verdict"] for d in doc["devices"]] == [FRAGMENTATION, "ok"]
    doc1, f1 = analyse_snapshot(snap, device=1)
    assert [d["device"] for d in doc1["devices"]] == [1] and f1 == [] and doc1["verdict"] == "ok"


def test_empty_snapshot_is_inconclusive_not_healthy():
    doc, findings = analyse_snapshot(parse_snapshot(dump([])))
    assert doc["verdict"] == "inconclusive" and findings == []
    assert doc["inconclusive"][0]["missing"] == ["segments"]


# ---------------------------------------------------------------------------------------------
# OOM classification (one scenario per class)
def test_oom_fragmentation():
    # 48 MiB request on stream 0: 660 MiB free on the stream, largest block 32 MiB -> fragmentation
    doc, findings = analyse_snapshot(parse_snapshot(dump(fragmented_segments(), [[oom(48 * MiB, 10 * MiB)]])))
    [o] = dev0(doc)["ooms"]
    assert o["classification"] == "fragmentation"
    assert o["same_stream_inactive_bytes"] == 660 * MiB and o["same_stream_largest_free_block_bytes"] == 32 * MiB
    [f] = findings
    assert f.id == FRAGMENTATION and f.severity is Severity.CRITICAL
    assert f.confidence == pytest.approx(0.9)
    assert f.onset == pytest.approx(1_700_000_000.0)
    assert f.playbook["options"][1]["setting"] == "max_split_size_mb:32"  # 48 MiB -> power of two below
    # the OOM is the last trace entry: the dump-time state is the state at the OOM
    assert (o["state_at"], o["replayed_entries"], o["replay_problem"], o["state_is_stale"]) == ("oom", 0, None, False)
    assert o["at_dump"]["classification"] == "fragmentation"
    assert o["reserved_bytes"] == 2068 * MiB and o["allocated_bytes"] == 1408 * MiB


def test_oom_cross_stream():
    # stream 0 is full; stream 7 holds 300 MiB free beside a live tensor; 100 MiB request on stream 0
    segs = [seg([blk(512 * MiB)]), seg([blk(212 * MiB), blk(300 * MiB, "inactive", req=0)], stream=7)]
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, [[oom(100 * MiB, 2 * MiB)]])))
    o = dev0(doc)["ooms"][0]
    assert o["classification"] == "cross-stream" and o["other_streams_inactive_bytes"] == 300 * MiB
    assert findings[0].id == OOM_CROSS_STREAM and findings[0].severity is Severity.CRITICAL
    assert dev0(doc)["verdict"] == OOM_CROSS_STREAM


def test_oom_private_pool():
    segs = [seg([blk(512 * MiB)]), seg([blk(100 * MiB), blk(412 * MiB, "inactive", req=0)], pool=(3, 1))]
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, [[oom(200 * MiB, 0)]])))
    assert dev0(doc)["ooms"][0]["classification"] == "private-pool"
    assert findings[0].id == OOM_PRIVATE_POOL
    assert "private pools" in findings[0].summary


def test_oom_memory_cap_when_driver_had_room():
    # 30 MiB request -> the allocator would cudaMalloc 30 MiB (rounded to 2 MiB); the driver had 4 GiB
    segs = [seg([blk(1 * GiB)])]
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, [[oom(30 * MiB, 4 * GiB)]])))
    o = dev0(doc)["ooms"][0]
    assert o["segment_request_bytes"] == 30 * MiB and o["classification"] == "memory-cap"
    assert findings[0].id == OOM_MEMORY_CAP


def test_oom_outside_pytorch_needs_device_total():
    segs = [seg([blk(60 * GiB)])]
    snap = parse_snapshot(dump(segs, [[oom(2 * GiB, 512 * MiB)]]))
    # without the GPU size: capacity, with the missing signal named and lower confidence
    doc, findings = analyse_snapshot(snap)
    assert dev0(doc)["ooms"][0]["classification"] == "capacity"
    assert findings[0].id == OOM_CAPACITY and findings[0].missing == ["device_total_bytes"]
    assert findings[0].confidence == pytest.approx(0.5)
    # 80 GiB GPU: 80 - 60 - 0.5 = 19.5 GiB outside PyTorch, minus 1 GiB allowance >= 2 GiB
    doc, findings = analyse_snapshot(snap, device_total_bytes=80 * GiB)
    o = dev0(doc)["ooms"][0]
    assert o["outside_pytorch_bytes"] == int(19.5 * GiB)
    assert o["classification"] == "outside-pytorch" and findings[0].id == OOM_OUTSIDE_PYTORCH
    assert findings[0].confidence == pytest.approx(0.8)


def test_oom_true_capacity():
    # 61 GiB GPU, 60 GiB reserved and allocated, 0.5 GiB free: outside = 0.5 GiB < allowance + request
    segs = [seg([blk(60 * GiB)])]
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, [[oom(2 * GiB, 512 * MiB)]])),
                                     device_total_bytes={0: 61 * GiB})
    assert dev0(doc)["ooms"][0]["classification"] == "capacity"
    [f] = findings
    assert f.id == OOM_CAPACITY and f.missing == [] and f.confidence == pytest.approx(0.8)
    assert any("--max-num-seqs" in a for a in f.playbook["actions"])


def test_oom_small_request_uses_small_pool_and_stale_state():
    # 512 KiB request: only small-pool segments count; large-pool free space does not help it
    segs = [seg([blk(1536 * 1024), blk(512 * 1024 - 4096, "inactive", req=0), blk(4096)], large=False),
            seg([blk(10 * MiB), blk(10 * MiB, "inactive", req=0)])]
    trace = [oom(512 * 1024, 0)] + [{"action": "alloc", "addr": 1, "size": 512, "stream": 0}] * 1500
    doc, findings = analyse_snapshot(parse_snapshot(dump(segs, [trace])))
    o = dev0(doc)["ooms"][0]
    assert o["same_stream_inactive_bytes"] == 512 * 1024 - 4096
    assert o["classification"] == "capacity"
    assert o["entries_after"] == 1500 and o["state_is_stale"] is True
    # the entries after the OOM point at address 1, inside no segment: the replay stops at the newest one
    assert o["state_at"] == "dump" and o["replayed_entries"] == 0
    assert "trace entry #1500 (alloc at 0x1" in o["replay_problem"]
    assert "not inside any known segment" in o["replay_problem"]
    assert findings[0].confidence == pytest.approx(0.35)  # 0.5 * 0.7


def test_alloc_segment_size_classes():
    assert alloc_segment_size(512) == 2 * MiB
    assert alloc_segment_size(5 * MiB) == 20 * MiB
    assert alloc_segment_size(11 * MiB + 1) == 12 * MiB


# ---------------------------------------------------------------------------------------------
# OOM replay: the state at the OOM instant, rebuilt by undoing the trace entries recorded after it
def test_round_request_matches_allocator_rounding():
    assert round_request(1) == 512 and round_request(512) == 512 and round_request(513) == 1024
    assert round_request(100 * MiB) == 100 * MiB
    # roundup_power2_divisions: 4 steps in [1 MiB, 2 MiB) -> 1, 1.25, 1.5, 1.75 MiB; 1,300,000 B -> 1.25 MiB
    div = {str(1 << i): 0 for i in range(16)}
    div["1"] = 4
    assert round_request(1_300_000, div) == 1_310_720  # 1 MiB + 256 KiB
    assert round_request(1_300_000) == 1_300_480  # 2540 * 512 without divisions
    assert round_request(3 * MiB + 1, div) == 3 * MiB + 512  # [2 MiB, 4 MiB) interval has no divisions set


def test_oom_replay_fragmentation_hidden_by_frees_after_the_oom():
    # At the OOM the 1 GiB segment on stream 0 was [A100 F200 B100 F200 C100 F200 D124] (MiB): 600 MiB
    # free in three 200 MiB slivers, so a 300 MiB request failed: fragmentation. After the OOM the
    # exception unwound and B and C were freed; the allocator merged 200+100+200+100+200 into one 800 MiB
    # block, which is all the dump shows: judged there, 800 >= 300 fits, so the dump alone reads capacity.
    s = seg([blk(100 * MiB), blk(800 * MiB, "inactive", req=0), blk(124 * MiB)])
    base = s["address"]
    B, C = base + 300 * MiB, base + 600 * MiB
    trace = [oom(300 * MiB, 100 * MiB)] + freed(B, 100 * MiB) + freed(C, 100 * MiB) + [ev("snapshot", 0, 0)]
    doc, findings = analyse_snapshot(parse_snapshot(dump([s], [trace])))
    d = dev0(doc)
    assert d["inactive_bytes"] == 800 * MiB and d["largest_free_block_bytes"] == 800 * MiB  # dump-time numbers
    [o] = d["ooms"]
    assert (o["state_at"], o["replayed_entries"], o["replay_problem"]) == ("oom", 5, None)
    assert o["entries_after"] == 5 and o["state_is_stale"] is False
    assert o["same_stream_inactive_bytes"] == 600 * MiB  # 3 x 200
    assert o["same_stream_largest_free_block_bytes"] == 200 * MiB
    assert o["reserved_bytes"] == 1024 * MiB
    assert o["allocated_bytes"] == 424 * MiB  # A100 + B100 + C100 + D124
    assert o["classification"] == "fragmentation"
    # each re-created block may have kept an unsplit tail of up to 1 MiB (large pool): 2 x 1 MiB
    assert o["replay_uncertain_bytes"] == 2 * MiB and o["replay_assumptions"] == []
    assert o["at_dump"] == {"same_stream_inactive_bytes": 800 * MiB, "same_stream_largest_free_block_bytes": 800 * MiB,
                            "other_streams_inactive_bytes": 0, "private_pool_bytes": 0, "reserved_bytes": 1024 * MiB,
                            "allocated_bytes": 224 * MiB, "outside_pytorch_bytes": None,
                            "classification": "capacity"}
    # the dump-time per-stream numbers and the at_dump figures agree (two code paths)
    assert d["streams"][0]["inactive_bytes"] == o["at_dump"]["same_stream_inactive_bytes"]
    [f] = findings
    assert f.id == FRAGMENTATION and f.severity is Severity.CRITICAL
    assert "rebuilt by undoing the 5 trace entries" in f.summary and "largest free block was 200.00 MiB" in f.summary
    # fragmentation checks on the OOM-instant default pool: 600/1024 = 0.586 >= 0.2, 1 - 200/600 = 0.667 >= 0.5,
    # 600 MiB >= 256 MiB -> 0.3 + 0.3 + 0.3 (OOM) = 0.9, not lowered: 600 - 2 MiB still covers 300 MiB
    assert f.confidence == pytest.approx(0.9)
    ev_ = {e.signal: e for e in f.evidence}
    assert ev_["external_fragmentation"].observed == pytest.approx(round(1 - 200 / 600, 6))
    assert ev_["trace_entries_undone"].observed == 5 and "reads capacity" in ev_["trace_entries_undone"].note
    assert "replay_uncertain_bytes" not in ev_ and "trace_entries_after_oom" not in ev_


def test_oom_replay_segment_released_by_empty_cache_after_the_oom():
    # At the OOM stream 0 held seg1 [A312 F200] and seg2 [F150 B212 F150] (MiB): 500 MiB free, largest
    # 200, request 300 -> fragmentation. Afterwards B was freed and empty_cache() released the now empty
    # seg2 (segment_free). The dump shows seg1 only: 200 MiB free < 300, and on an 2 GiB GPU with 100 MiB
    # free at the OOM the dump-time reserved 512 MiB leaves 2048 - 512 - 100 = 1436 MiB "outside PyTorch",
    # 1436 - 1024 allowance = 412 >= 300: the dump alone would blame other tenants.
    s1 = seg([blk(312 * MiB), blk(200 * MiB, "inactive", req=0)])
    s2 = seg([blk(150 * MiB, "inactive", req=0), blk(212 * MiB), blk(150 * MiB, "inactive", req=0)])
    B = s2["address"] + 150 * MiB
    trace = [oom(300 * MiB, 100 * MiB)] + freed(B, 212 * MiB) + [ev("segment_free", s2["address"], 512 * MiB)]
    snap = parse_snapshot(dump([s1], [trace]))  # seg2 is gone at dump time
    doc, findings = analyse_snapshot(snap, device_total_bytes=2 * GiB)
    d = dev0(doc)
    assert d["reserved_bytes"] == 512 * MiB and d["segments"] == 1
    [o] = d["ooms"]
    assert o["state_at"] == "oom" and o["replayed_entries"] == 3
    assert o["at_dump"]["classification"] == "outside-pytorch" and o["at_dump"]["outside_pytorch_bytes"] == 1436 * MiB
    assert o["reserved_bytes"] == 1024 * MiB  # seg2 existed at the OOM
    assert o["outside_pytorch_bytes"] == 2048 * MiB - 1024 * MiB - 100 * MiB  # 924 MiB
    assert o["same_stream_inactive_bytes"] == 500 * MiB and o["same_stream_largest_free_block_bytes"] == 200 * MiB
    assert o["classification"] == "fragmentation" and findings[0].id == FRAGMENTATION
    # the segment_free entry names no pool: the re-created segment is counted in the default pool, said so
    assert o["replay_assumptions"] == [("1 re-created segment(s) counted in the default pool: the trace entries "
                                        "carry no pool id")]
    assert o["replay_uncertain_bytes"] == 1 * MiB  # B's possible unsplit tail (the 150 MiB gap follows it)


def test_oom_replay_segment_allocated_after_the_oom_did_not_exist():
    # stream 0 at the OOM: one 512 MiB segment [A400 F112], 200 MiB requested, the driver had 50 MiB: capacity.
    # After the OOM the job retried smaller: a new 200 MiB segment for a 150 MiB + 50 MiB pair; at dump that
    # segment is [X150 Y50]. Undoing alloc Y, alloc X, segment_alloc leaves 512 MiB reserved at the OOM.
    s1 = seg([blk(400 * MiB), blk(112 * MiB, "inactive", req=0)])
    s2 = seg([blk(150 * MiB), blk(50 * MiB)])
    a2 = s2["address"]
    trace = [oom(200 * MiB, 50 * MiB), ev("segment_alloc", a2, 200 * MiB), ev("alloc", a2, 150 * MiB),
             ev("alloc", a2 + 150 * MiB, 50 * MiB)]
    o = dev0(analyse_snapshot(parse_snapshot(dump([s1, s2], [trace])))[0])["ooms"][0]
    assert o["state_at"] == "oom" and o["replayed_entries"] == 3
    assert o["reserved_bytes"] == 512 * MiB and o["allocated_bytes"] == 400 * MiB
    assert o["at_dump"]["reserved_bytes"] == 712 * MiB and o["at_dump"]["allocated_bytes"] == 600 * MiB
    assert o["same_stream_inactive_bytes"] == 112 * MiB and o["classification"] == "capacity"
    assert o["replay_uncertain_bytes"] == 0  # nothing re-created, only removed


def test_oom_replay_expandable_segments_map_and_unmap():
    # expandable_segments:True, one large-pool segment per stream, mapped in 20 MiB pages.
    # At the OOM the mapped range was [A40 F40 B40 F40 C40] (MiB, 200 MiB): 80 MiB free in two 40 MiB holes,
    # a 60 MiB request failed (the driver had 10 MiB, not enough to map 60 MiB more): fragmentation.
    # After the OOM: B freed -> [40, 160) free; empty_cache unmapped those 6 pages (segment_unmap 120 MiB),
    # splitting the range in two; then a 40 MiB tensor D was allocated by mapping 2 pages after C.
    # Dump: [A40] and [C40 D40] (two snapshot segments, nothing free).
    st = settings("expandable_segments:True", True)
    s = seg([blk(40 * MiB), blk(40 * MiB, "inactive", req=0), blk(40 * MiB), blk(40 * MiB, "inactive", req=0),
             blk(40 * MiB)], expandable=True)
    base = s["address"]
    left = seg([blk(40 * MiB)], expandable=True)
    right = seg([blk(40 * MiB), blk(40 * MiB)], expandable=True)
    for g, at in ((left, base), (right, base + 160 * MiB)):  # place the dump segments inside the one range
        g["address"] = at
        for i, b in enumerate(g["blocks"]):
            b["address"] = at + 40 * MiB * i
    trace = ([oom(60 * MiB, 10 * MiB)] + freed(base + 80 * MiB, 40 * MiB)
             + [ev("segment_unmap", base + 40 * MiB, 120 * MiB), ev("segment_map", base + 200 * MiB, 40 * MiB),
                ev("alloc", base + 200 * MiB, 40 * MiB)])
    doc, findings = analyse_snapshot(parse_snapshot(dump([left, right], [trace], st=st)))
    d = dev0(doc)
    assert d["segments"] == 2 and d["reserved_bytes"] == 120 * MiB and d["inactive_bytes"] == 0
    [o] = d["ooms"]
    assert o["state_at"] == "oom" and o["replayed_entries"] == 5, o["replay_problem"]
    assert o["reserved_bytes"] == 200 * MiB and o["allocated_bytes"] == 120 * MiB  # A, B, C
    assert o["same_stream_inactive_bytes"] == 80 * MiB and o["same_stream_largest_free_block_bytes"] == 40 * MiB
    assert o["classification"] == "fragmentation" and o["at_dump"]["classification"] == "capacity"
    assert o["replay_uncertain_bytes"] == 0  # expandable segments always split: re-created sizes are exact
    assert o["replay_assumptions"] == []  # the unmapped range had mapped neighbours: pool and size class known
    assert findings[0].id == FRAGMENTATION


@pytest.mark.parametrize("after,needle", [
    # an address inside no segment of the device (as a dropped or foreign entry would give)
    ([ev("alloc", 0x10, 4096)], "not inside any known segment"),
    # the dump shows the range free, yet the newest entry says it was allocated
    ([ev("alloc", "FREE", 30 * MiB)], "no live block starts there"),
    # a freed block that overlaps a tensor still alive at that point
    ([ev("free_completed", "LIVE+1MiB", 10 * MiB)], "inside a live block"),
    # free_requested for a block that is not waiting to be freed
    ([ev("free_requested", "LIVE", 10 * MiB)], "no block waiting to be freed"),
    # segment_alloc for a segment that still holds a live block
    ([ev("segment_alloc", "SEG", 100 * MiB)], "still holds 1 live block"),
    # a stream that does not own the segment
    ([ev("free_completed", "FREE", 10 * MiB, stream=5)], "belongs to stream 0, the entry to stream 5"),
    # an action the replay does not know
    ([ev("segment_resize", "SEG", 100 * MiB)], "unknown action"),
    ([{"action": "alloc", "addr": None, "size": 512, "stream": 0}], "no integer addr/size"),
])
def test_oom_replay_partial_falls_back_to_dump_state(after, needle):
    s = seg([blk(70 * MiB), blk(30 * MiB, "inactive", req=0)])  # [LIVE70 FREE30], 100 MiB
    names = {"SEG": s["address"], "LIVE": s["address"], "LIVE+1MiB": s["address"] + MiB,
             "FREE": s["address"] + 70 * MiB}
    for e in after:
        if e.get("addr") in names:
            e["addr"] = names[e["addr"]]
    # the bad entry is the oldest after the OOM; two harmless newer entries are undone before it
    trace = [oom(64 * MiB, 0)] + after + [ev("snapshot", 0, 0), ev("snapshot", 0, 0)]
    doc, findings = analyse_snapshot(parse_snapshot(dump([s], [trace])))
    o = dev0(doc)["ooms"][0]
    assert o["state_at"] == "dump" and o["state_is_stale"] is True, o["replay_problem"]
    assert o["replayed_entries"] == 2 and o["entries_after"] == 3
    assert needle in o["replay_problem"] and "device 0 trace entry #1 " in o["replay_problem"]
    assert o["replay_uncertain_bytes"] is None
    # judged on the dump-time state: 30 MiB free < 64 MiB -> capacity, numbers = at_dump
    assert o["classification"] == "capacity" and o["same_stream_inactive_bytes"] == 30 * MiB
    assert o["at_dump"]["same_stream_inactive_bytes"] == 30 * MiB
    [f] = findings
    assert f.confidence == pytest.approx(0.35)  # 0.5 (no GPU size) * 0.7 (stale)
    stale = [e for e in f.evidence if e.signal == "trace_entries_after_oom"]
    assert stale and stale[0].agrees is False and needle in stale[0].note


def test_oom_replay_uncertain_tails_lower_confidence_when_they_matter():
    # At the OOM: [A100 F100.5 B100 F100 C50] (MiB); 200 MiB requested: 200.5 MiB free >= 200 > 100.5 largest.
    # After it B was freed. B is re-created from its requested size (100 MiB) and may really have kept up to
    # 1 MiB of the 100 MiB gap after it, unsplit: then only 199.5 MiB was free and the request fitted in
    # no way -> the fragmentation call rests on the uncertain bytes. Checks at the OOM: non-releasable
    # 200.5/450.5 = 0.45 >= 0.2 (+0.3); external fragmentation 1 - 100.5/200.5 = 0.499 < 0.5 (+0); OOM +0.3
    # -> 0.6, times 0.8 for the uncertain bytes = 0.48.
    half = 512 * 1024
    s = seg([blk(100 * MiB), blk(300 * MiB + half, "inactive", req=0), blk(50 * MiB)])
    B = s["address"] + 200 * MiB + half
    trace = [oom(200 * MiB, 0)] + freed(B, 100 * MiB)
    doc, findings = analyse_snapshot(parse_snapshot(dump([s], [trace])))
    o = dev0(doc)["ooms"][0]
    assert o["same_stream_inactive_bytes"] == 200 * MiB + half
    assert o["same_stream_largest_free_block_bytes"] == 100 * MiB + half
    assert o["replay_uncertain_bytes"] == 1 * MiB and o["classification"] == "fragmentation"
    [f] = findings
    assert f.confidence == pytest.approx(0.48)
    unc = [e for e in f.evidence if e.signal == "replay_uncertain_bytes"]
    assert unc and unc[0].agrees is False and unc[0].observed == 1 * MiB


def test_oom_replay_two_ooms_each_on_its_own_instant():
    # [A100 F100 B100 F100 C100] then: OOM#1 (150 MiB), B freed, OOM#2 (350 MiB), C freed.
    # OOM#1 instant: free 100 + 100 = 200 >= 150 > 100 largest -> fragmentation (4 entries undone).
    # OOM#2 instant: B already free -> [A100 F300 C100]: 300 < 350 -> capacity (2 entries undone).
    s = seg([blk(100 * MiB), blk(400 * MiB, "inactive", req=0)])
    base = s["address"]
    trace = ([oom(150 * MiB, 0)] + freed(base + 200 * MiB, 100 * MiB) + [oom(350 * MiB, 0)]
             + freed(base + 400 * MiB, 100 * MiB))
    s["blocks"][1]["size"] = 400 * MiB  # dump: [A100 F400]
    doc, findings = analyse_snapshot(parse_snapshot(dump([s], [trace])))
    o1, o2 = dev0(doc)["ooms"]
    assert (o1["replayed_entries"], o1["classification"], o1["same_stream_inactive_bytes"]) == \
        (5, "fragmentation", 200 * MiB)  # the later oom entry counts as undone (it changes nothing)
    assert (o2["replayed_entries"], o2["classification"], o2["same_stream_inactive_bytes"]) == \
        (2, "capacity", 300 * MiB)
    assert findings[0].id == OOM_CAPACITY  # the finding follows the last OOM


def test_oom_replay_pending_free_at_the_oom_stays_in_use():
    # A block freed before the OOM but waiting on another stream (record_stream) is active_pending_free at
    # the OOM; its free_completed came after. Re-created as pending: not free space at the OOM.
    s = seg([blk(60 * MiB), blk(40 * MiB, "inactive", req=0)])
    trace = [oom(50 * MiB, 0), ev("free_completed", s["address"] + 60 * MiB, 40 * MiB)]
    o = dev0(analyse_snapshot(parse_snapshot(dump([s], [trace])))[0])["ooms"][0]
    assert o["state_at"] == "oom" and o["same_stream_inactive_bytes"] == 0
    assert o["allocated_bytes"] == 60 * MiB and o["at_dump"]["same_stream_inactive_bytes"] == 40 * MiB


def test_oom_replay_recreated_block_never_overlaps_the_next_live_block():
    # roundup_power2_divisions 4 in [1 MiB, 2 MiB): a 1,300,000 B request rounds to 1,310,720 B (1.25 MiB),
    # but at the OOM the next live block starts 1,300,480 B after it (2540 x 512): the re-created block is
    # clipped to the space there rather than overlapping its neighbour.
    st = settings("roundup_power2_divisions:[1:4]")
    st["roundup_power2_divisions"]["1"] = 4
    s = seg([blk(1_300_480, "inactive", req=0), blk(10 * MiB), blk(10 * MiB, "inactive", req=0)])
    trace = [oom(12 * MiB, 0), ev("free_completed", s["address"], 1_300_000)]
    snap = parse_snapshot(dump([s], [trace], st=st))
    rp = replay_to_oom(snap, snap.ooms[0])
    assert rp.complete and rp.state.aggregate()["active_pending_free_bytes"] == 1_300_480  # not 1,310,720
    o = dev0(analyse_snapshot(snap)[0])["ooms"][0]
    assert o["state_at"] == "oom", o["replay_problem"]
    assert o["same_stream_inactive_bytes"] == 10 * MiB  # only the tail: the first 1,300,480 B were in use
    assert o["allocated_bytes"] == 10 * MiB  # the re-created block is pending (its free_requested came earlier)


class _FirstFit:
    """A tiny independent allocator model: one segment, first-fit, blocks of exactly the requested size
    (multiples of 2 MiB, so the allocator's rounding changes nothing). Free space = gaps between blocks."""

    def __init__(self, base, total):
        self.base, self.total, self.live = base, total, {}

    def free_ranges(self):
        pos, out = self.base, []
        for a in sorted(self.live):
            if a > pos:
                out.append(a - pos)
            pos = a + self.live[a]
        if self.base + self.total > pos:
            out.append(self.base + self.total - pos)
        return out

    def alloc(self, size):
        pos = self.base
        for a in sorted(self.live) + [self.base + self.total]:
            if a - pos >= size:
                self.live[pos] = size
                return pos
            if a < self.base + self.total:
                pos = a + self.live[a]
        return None

    def segment(self):
        blocks, pos = [], self.base
        for a in sorted(self.live):
            if a > pos:
                blocks.append(blk(a - pos, "inactive", req=0))
            blocks.append(blk(self.live[a]))
            pos = a + self.live[a]
        if self.base + self.total > pos:
            blocks.append(blk(self.base + self.total - pos, "inactive", req=0))
        s = seg(blocks)
        s["address"] = self.base
        return s


def test_oom_replay_matches_an_independent_allocator_model():
    """Seeded random histories: allocations and frees run through _FirstFit, an OOM mark, more of both,
    then a dump. The replay must give back the model's free bytes and largest free block at the mark."""
    import random

    rnd = random.Random(7)
    for trial in range(100):
        m = _FirstFit(0x7F00_0000_0000 + trial * 4 * GiB, 512 * MiB)
        for _ in range(rnd.randint(5, 40)):
            m.alloc(rnd.randint(1, 20) * 2 * MiB)
        for a in rnd.sample(sorted(m.live), k=len(m.live) // 3):
            del m.live[a]
        want = m.free_ranges()
        trace = [oom(300 * MiB, 0)]
        for _ in range(rnd.randint(1, 40)):
            if m.live and rnd.random() < 0.5:
                a = rnd.choice(sorted(m.live))
                trace += freed(a, m.live.pop(a))
            else:
                size = rnd.randint(1, 20) * 2 * MiB
                a = m.alloc(size)
                if a is not None:
                    trace.append(ev("alloc", a, size))
        snap = parse_snapshot(dump([m.segment()], [trace]))
        rp = replay_to_oom(snap, snap.ooms[0])
        assert rp.complete, (trial, rp.problem)
        got = rp.state.aggregate()
        assert (got["inactive_bytes"], got["largest_free_block_bytes"], got["free_blocks"]) == \
            (sum(want), max(want, default=0), len(want)), trial


def test_replay_to_oom_api_on_legacy_layout():
    # PyTorch ~2.0 layout: blocks without address, a 'free' entry (the pre-split action name, as
    # MemoryViz.js treats it) after the OOM. [A10 F54] at dump; a 20 MiB tensor at 10 MiB was freed.
    blocks = [{"size": 10 * MiB, "state": "active_allocated", "history": [{"addr": 1, "real_size": 10 * MiB}]},
              {"size": 54 * MiB, "state": "inactive", "history": []}]
    base = 0x7000_0000_0000
    segment = {"device": 0, "address": base, "total_size": 64 * MiB, "stream": 0, "segment_type": "large",
               "blocks": blocks}
    trace = [{"action": "oom", "device_free": 0, "size": 40 * MiB, "stream": 0},
             {"action": "free", "addr": base + 10 * MiB, "size": 20 * MiB, "stream": 0},
             {"action": "snapshot", "addr": 0, "size": 10 * MiB, "stream": 0}]
    snap = parse_snapshot({"segments": [segment], "device_traces": [trace]})
    rp = replay_to_oom(snap, snap.ooms[0])
    assert rp.complete and rp.replayed_entries == 2 and rp.problem is None
    # no allocator settings recorded: the re-created block's rounding is an assumption, said so
    assert rp.assumptions == [("1 re-created block(s) sized with 512-byte rounding: allocator settings "
                               "(roundup_power2_divisions) not recorded")]
    m = rp.state.aggregate()
    assert m["inactive_bytes"] == 34 * MiB and m["largest_free_block_bytes"] == 34 * MiB  # 64 - 10 - 20
    assert m["active_pending_free_bytes"] == 20 * MiB  # no free_requested undone: still pending at the OOM


# ---------------------------------------------------------------------------------------------
# pinned host memory (PyTorch 2.14: host_segments / host_traces, pytorch/pytorch#182407)
def test_host_section_absent_is_not_zero():
    doc, _ = analyse_snapshot(parse_snapshot(dump(fragmented_segments())))
    h = doc["host"]
    assert h["recorded"] is False and h["reserved_bytes"] is None and h["allocated_bytes"] is None
    assert "record_pinned_host_memory=True" in h["reason"] and "host_memory_stats()" in h["reason"]


def test_host_segments_in_device_layout_are_counted_apart_from_the_gpu(tmp_path):
    # pinned blocks are power-of-two sized (CachingHostAllocator rounds up): one 128 MiB segment holding a
    # live 64 MiB block and a cached free 64 MiB one, one 32 MiB segment in use -> reserved 160, allocated 96
    obj = dump(fragmented_segments())
    obj["host_segments"] = [seg([blk(64 * MiB), blk(64 * MiB, "inactive", req=0)], device=-1),
                            seg([blk(32 * MiB)], device=-1)]
    obj["host_traces"] = [ev("alloc", 0x1000, 64 * MiB), ev("alloc", 0x9000, 32 * MiB),
                          ev("free_requested", 0x1000, 64 * MiB)]
    path = write(tmp_path, obj)
    doc, _ = analyse_snapshot_file(path)
    h = doc["host"]
    assert h["recorded"] is True and h["reason"] is None
    assert (h["segments"], h["blocks"]) == (2, 3)
    assert (h["reserved_bytes"], h["allocated_bytes"], h["inactive_bytes"]) == (160 * MiB, 96 * MiB, 64 * MiB)
    assert h["largest_free_block_bytes"] == 64 * MiB and h["active_pending_free_bytes"] == 0
    assert h["trace_entries"] == 3 and h["trace_actions"] == {"alloc": 2, "free_requested": 1}
    d = dev0(doc)  # the GPU numbers are the device segments' alone
    assert d["reserved_bytes"] == 2068 * MiB and doc["segment_count"] == 5 and [x["device"] for x in doc["devices"]] == [0]
    r = _run(["snapshot", path, "--no-map"])
    assert "pinned host memory (CachingHostAllocator): reserved 160.00 MiB" in r.output
    assert "host trace: alloc 2, free_requested 1" in r.output
    assert json.loads(_run(["snapshot", path, "--format", "json"]).output)["host"]["allocated_bytes"] == 96 * MiB


@pytest.mark.parametrize("host_segments,needle", [
    ([{"size": 4096, "ptr": 1}], "not in the device segment layout"),
    ([{"total_size": 4096, "blocks": [{"size": 4096, "state": "pinned"}]}], "state other than"),
    ("abc", "host_segments is str"),
])
def test_host_segments_in_an_unknown_layout_are_not_guessed(host_segments, needle):
    obj = dump(fragmented_segments())
    obj["host_segments"] = host_segments
    obj["host_traces"] = [[ev("alloc", 0x1000, 4096)]]  # per-device lists are accepted too
    doc, findings = analyse_snapshot(parse_snapshot(obj))
    h = doc["host"]
    assert h["recorded"] is True and h["reserved_bytes"] is None and h["allocated_bytes"] is None
    assert needle in h["reason"] and h["trace_actions"] == {"alloc": 1}
    assert dev0(doc)["reserved_bytes"] == 2068 * MiB and [f.id for f in findings] == [FRAGMENTATION]


# ---------------------------------------------------------------------------------------------
# segment map
def test_segment_map_characters():
    # 4 MiB segment, width 4 -> one char per MiB: allocated (requested 1 MiB), waste-only MiB, pending, free
    s = seg([blk(2 * MiB, req=1 * MiB), blk(1 * MiB, "active_pending_free"), blk(1 * MiB, "inactive", req=0)])
    rows, n = segment_map_rows(parse_snapshot([s]), width=4)
    assert n == 1 and rows[0]["map"] == "#+~."
    rows, _ = segment_map_rows(parse_snapshot([s]), width=2)
    assert rows[0]["map"] == "#:"  # second half: 1 MiB pending (used) + 1 MiB free -> mixed


def test_segment_map_limit_orders_by_free_bytes():
    segs = fragmented_segments()
    rows, n = segment_map_rows(parse_snapshot(segs), limit=2)
    assert n == 5 and len(rows) == 2
    assert all(r["inactive_bytes"] == 160 * MiB for r in rows)
    assert rows[0]["address"] < rows[1]["address"]
    assert rows[0]["map"].count(".") > 10


# ---------------------------------------------------------------------------------------------
# safety and bad input
class _Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _assert_refused(path, marker: Path, *needles):
    with pytest.raises(SnapshotError) as ei:
        read_snapshot(str(path))
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg
    for n in needles:
        assert n in msg
    assert not marker.exists(), "the pickle ran code"


def test_global_opcode_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil0.pickle"
    p.write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")  # protocol 0: GLOBAL+REDUCE
    _assert_refused(p, marker, "refusing to load", "os.system")


def test_stack_global_refused_inside_a_snapshot(tmp_path):
    marker = tmp_path / "pwned"
    obj = dump(fragmented_segments())
    obj["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = _Evil(f"touch {marker}")
    p = tmp_path / "evil4.pickle"
    p.write_bytes(pickle.dumps(obj, protocol=4))  # STACK_GLOBAL posix.system + REDUCE
    assert b"\x93" in p.read_bytes()
    _assert_refused(p, marker, "refusing to load", "system")
    pg = tmp_path / "evil4.pickle.gz"
    pg.write_bytes(gzip.compress(p.read_bytes()))
    _assert_refused(pg, marker, "refusing to load", "system")


def test_reduce_without_global_refused(tmp_path):
    # protocol 2: EMPTY_LIST, EMPTY_TUPLE, REDUCE: calls a list -> the loader names the REDUCE opcode
    p = tmp_path / "reduce.pickle"
    p.write_bytes(b"\x80\x02])R.")
    _assert_refused(p, tmp_path / "none", "refusing to load", "REDUCE opcode at byte 4")


def test_persistent_id_refused(tmp_path):
    p = tmp_path / "persid.pickle"
    p.write_bytes(b"\x80\x02X\x01\x00\x00\x00xQ.")  # BINPERSID
    _assert_refused(p, tmp_path / "none", "refusing to load", "persistent id")


def test_truncated_pickle_json_and_gzip(tmp_path):
    data = pickle.dumps(dump(fragmented_segments()), protocol=4)
    p = tmp_path / "trunc.pickle"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="truncated pickle"):
        read_snapshot(str(p))
    pg = tmp_path / "trunc.pickle.gz"
    pg.write_bytes(gzip.compress(data)[:300])
    with pytest.raises(SnapshotError, match="truncated gzip"):
        read_snapshot(str(pg))
    pj = tmp_path / "trunc.json"
    pj.write_text(json.dumps(dump(fragmented_segments()))[:500])
    with pytest.raises(SnapshotError, match="truncated JSON"):
        read_snapshot(str(pj))


@pytest.mark.parametrize("content,needle", [
    (b"", "empty file"),
    (b"hello, not a snapshot\n", "neither a pickle nor JSON"),
    (pickle.dumps([1, 2, 3]), "a segment is int"),
    (pickle.dumps({"traceEvents": []}), "no 'segments' key; top-level keys: traceEvents"),
    (json.dumps({"schemaVersion": 1, "traceEvents": []}).encode(), "no 'segments' key"),
    (pickle.dumps({"segments": [{"blocks": [{"size": 1}]}]}), "segment total_size is missing"),
    (pickle.dumps({"segments": [{"total_size": 1, "blocks": [{"size": 1}]}]}), "missing key 'state'"),
    (pickle.dumps({"segments": [{"total_size": 1, "blocks": [{"size": "x", "state": "inactive"}]}]}),
     "a field has the wrong type"),
    (pickle.dumps({"segments": [{"total_size": "big", "blocks": []}]}), "total_size is str"),
    (pickle.dumps("just a string"), "top level is str"),
    (pickle.dumps({"segments": [{"total_size": 1, "blocks": "abc"}]}), "'blocks' is str, expected a list"),
    (pickle.dumps({"segments": [{"address": 2**70, "total_size": 1, "blocks": []}]}), "does not fit in 64 bits"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_not_a_snapshot(tmp_path, content, needle):
    p = tmp_path / "bad.bin"
    p.write_bytes(content)
    with pytest.raises(SnapshotError) as ei:
        read_snapshot(str(p))
    assert needle in str(ei.value) and str(p) in str(ei.value)


def test_size_caps_and_shared_reference_bomb(tmp_path):
    path = write(tmp_path, dump(fragmented_segments()))
    with pytest.raises(SnapshotError, match="exceeds the 100 byte cap"):
        read_snapshot(path, max_bytes=100)
    pg = tmp_path / "bomb.gz"
    pg.write_bytes(gzip.compress(b"\x00" * 100_000))
    with pytest.raises(SnapshotError, match="decompressed size exceeds"):
        read_snapshot(str(pg), max_bytes=10_000)
    b = blk(1)
    s = {"device": 0, "address": 0, "total_size": 1000, "stream": 0, "segment_type": "large",
         "blocks": [b] * 1000}
    pb = tmp_path / "shared.pickle"
    pb.write_bytes(pickle.dumps({"segments": [s] * 1000}))  # 1M blocks from a few KB
    with pytest.raises(SnapshotError, match="shared references"):
        read_snapshot(str(pb))


# ---------------------------------------------------------------------------------------------
# CLI
def _run(args):
    r = CliRunner().invoke(diagnose_group, args, standalone_mode=False, catch_exceptions=True)
    return r


def test_cli_human_map_and_exit_codes(tmp_path):
    path = write(tmp_path, dump(fragmented_segments()))
    r = _run(["snapshot", path])
    assert r.exception is None and r.return_value == 0  # warning < critical
    assert "verdict: allocator-fragmentation" in r.output
    assert "Segment map (5)" in r.output and "[#" in r.output
    assert "expandable_segments:True" in r.output and "not if:" in r.output
    r = _run(["snapshot", path, "--fail-on", "warning", "--no-map"])
    assert r.return_value == 1 and "Segment map" not in r.output
    pathoom = write(tmp_path, dump(fragmented_segments(), [[oom(48 * MiB, 10 * MiB)]]), "oom.pickle")
    assert _run(["snapshot", pathoom]).return_value == 1
    assert _run(["snapshot", pathoom, "--fail-on", "never"]).return_value == 0
    assert "judged on the state at the OOM (no trace entries after it)" in _run(["snapshot", pathoom]).output


def test_cli_human_says_which_state_an_oom_was_judged_on(tmp_path):
    s = seg([blk(100 * MiB), blk(800 * MiB, "inactive", req=0), blk(124 * MiB)])
    B, C = s["address"] + 300 * MiB, s["address"] + 600 * MiB
    trace = [oom(300 * MiB, 100 * MiB)] + freed(B, 100 * MiB) + freed(C, 100 * MiB)
    out = _run(["snapshot", write(tmp_path, dump([s], [trace])), "--no-map"]).output
    assert "-> fragmentation: 600.00 MiB was free on stream 0" in out
    assert ("judged on the state at the OOM, rebuilt by undoing the 4 trace entries after it; the dump-time "
            "state alone would read capacity; up to 2.00 MiB of the free space may be unsplit block tails") in out
    bad = write(tmp_path, dump([s], [[oom(300 * MiB, 100 * MiB), ev("alloc", 0x10, 512)]]), "bad.pickle")
    out = _run(["snapshot", bad, "--no-map"]).output
    assert "judged on the dump-time state (stale): the replay stopped after undoing 0 of 1 later trace entries: " \
           "device 0 trace entry #1 (alloc at 0x10, 512 B, stream 0): the address is not inside any known segment" in out


def test_cli_json_contract(tmp_path):
    path = write(tmp_path, dump(fragmented_segments(), [[oom(48 * MiB, 10 * MiB)]]))
    r = _run(["snapshot", path, "--format", "json"])
    doc = json.loads(r.output)
    d = doc["devices"][0]
    for k in ("reserved_bytes", "allocated_bytes", "requested_bytes", "inactive_bytes",
              "largest_free_block_bytes", "external_fragmentation", "releasable_bytes", "segments"):
        assert k in d and k in d["pools"][0] and k in d["streams"][0]
    assert doc["verdict"] == FRAGMENTATION and doc["playbook"]["diagnosis"] == FRAGMENTATION
    assert doc["findings"][0]["id"] == FRAGMENTATION and "segment_map" not in doc
    o = d["ooms"][0]
    for k in ("state_at", "replayed_entries", "replay_problem", "replay_uncertain_bytes", "replay_assumptions",
              "reserved_bytes", "allocated_bytes", "at_dump", "state_is_stale", "entries_after"):
        assert k in o, k
    assert doc["host"]["recorded"] is False
    r = _run(["snapshot", path, "--format", "json", "--map", "--map-limit", "1"])
    doc = json.loads(r.output)
    assert doc["segment_map"]["segments_in_scope"] == 5 and len(doc["segment_map"]["rows"]) == 1


def test_cli_device_memory_and_bad_input(tmp_path):
    path = write(tmp_path, dump([seg([blk(60 * GiB)])], [[oom(2 * GiB, 512 * MiB)]]))
    doc = json.loads(_run(["snapshot", path, "--format", "json", "--device-memory", "80GiB"]).output)
    assert doc["verdict"] == OOM_OUTSIDE_PYTORCH
    for args, needle in [(["snapshot", path, "--device-memory", "lots"], "--device-memory 'lots'"),
                         (["snapshot", path, "--device", "5"], "no device 5"),
                         (["snapshot", str(tmp_path / "missing.pickle")], "No such file")]:
        r = _run(args)
        assert getattr(r.exception, "exit_code", None) == 2, args
        assert needle in r.exception.format_message()


def test_cli_script_refuses_malicious_pickle_one_line(tmp_path):
    from cli_helpers import cli

    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pickle"
    p.write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    r = cli("snapshot", p)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "refusing to load" in r.stderr and "os.system" in r.stderr
    assert "Traceback" not in r.stderr and not marker.exists()


# ---------------------------------------------------------------------------------------------
# built samples in the two dump formats (tests/data/README_snapshot.md), pickled and read back as files
X_SIZE = 2_359_296  # 2.25 MiB
SLIVER = 1_352_704  # 1.29 MiB: one free large-pool block under 2 MiB


def modern_sample() -> dict:
    """A small serving process in today's format (requested_size, addresses, segment_pool_id):

    seg 0 large 20 MiB: A 16 MiB, A 2,841,600 B, free 1,352,704 B (a sliver)
    seg 1 large 20 MiB: A 20 MiB
    seg 2 small  2 MiB: A 512 KiB, free 1 MiB, A 512 KiB
    seg 3 large 20 MiB: 8 x A 2.25 MiB, free 2 MiB
    seg 4 large 20 MiB: A 2 MiB, A 2.25 MiB, A 2 MiB, A 2.75 MiB, free 11 MiB
    seg 5 small  2 MiB: A 2 MiB
    6 segments, 22 blocks; reserved 84 MiB; free 1,352,704 + 1 MiB + 2 MiB + 11 MiB = 16,032,768 B."""
    return dump([
        seg([blk(16 * MiB), blk(20 * MiB - 16 * MiB - SLIVER), blk(SLIVER, "inactive", req=0)]),
        seg([blk(20 * MiB)]),
        seg([blk(MiB // 2), blk(MiB, "inactive", req=0), blk(MiB // 2)], large=False),
        seg([blk(X_SIZE) for _ in range(8)] + [blk(2 * MiB, "inactive", req=0)]),
        seg([blk(2 * MiB), blk(X_SIZE), blk(2 * MiB), blk(2 * MiB + 3 * MiB // 4), blk(11 * MiB, "inactive", req=0)]),
        seg([blk(2 * MiB)], large=False),
    ])


def legacy_sample() -> dict:
    """The PyTorch ~2.0 format: blocks carry history/real_size, no requested_size, no block address, no
    segment_pool_id or allocator settings; the trace ends with a 'snapshot' entry. 3 segments, 6 blocks;
    reserved 62 MiB, allocated 54.5 MiB, free 6 MiB + 1.5 MiB."""
    def b(size, real=None):
        hist = [] if real is None else [{"addr": 1, "real_size": real, "frames": FRAMES}]
        return {"size": size, "state": "inactive" if real is None else "active_allocated", "history": hist}

    def sg(addr, blocks, large=True):
        alloc = sum(x["size"] for x in blocks if x["state"] == "active_allocated")
        return {"device": 0, "address": addr, "total_size": sum(x["size"] for x in blocks), "allocated_size": alloc,
                "active_size": alloc, "stream": 0, "segment_type": "large" if large else "small", "blocks": blocks}

    return {"segments": [sg(0x7000_0000_0000, [b(24 * MiB, 23 * MiB), b(6 * MiB), b(10 * MiB, 10 * MiB)]),
                         sg(0x7000_1000_0000, [b(20 * MiB, 19 * MiB + MiB // 2)]),
                         sg(0x7000_2000_0000, [b(MiB // 2, MiB // 2), b(MiB + MiB // 2)], large=False)],
            "device_traces": [[{"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]]}


def _reference_numbers(snapshot: dict) -> dict:
    """Plain-Python sums over the dicts, independent of the numpy code (segsum's definitions)."""
    reserved = allocated = inactive = largest = 0
    for s in snapshot["segments"]:
        reserved += s["total_size"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                allocated += b["size"]
            elif b["state"] == "inactive":
                inactive += b["size"]
                largest = max(largest, b["size"])
    return {"reserved_bytes": reserved, "allocated_bytes": allocated, "inactive_bytes": inactive,
            "largest_free_block_bytes": largest}


@pytest.mark.parametrize("build,nseg,nblocks,legacy", [
    (modern_sample, 6, 22, False),
    (legacy_sample, 3, 6, True),
])
def test_built_samples_read_from_files(tmp_path, build, nseg, nblocks, legacy):
    raw = build()
    path = write(tmp_path, raw)
    snap = read_snapshot(path)
    assert (snap.n_segments, snap.n_blocks, snap.legacy) == (nseg, nblocks, legacy)
    doc, findings = analyse_snapshot(snap)
    d = dev0(doc)
    for k, v in _reference_numbers(raw).items():
        assert d[k] == v, k
    # neither sample is fragmented by the thresholds: small free space (< 256 MiB stranded)
    assert doc["verdict"] == "ok" and findings == []


def test_built_modern_sample_exact_numbers(tmp_path):
    d = dev0(analyse_snapshot_file(write(tmp_path, modern_sample()))[0])
    inactive = SLIVER + MiB + 2 * MiB + 11 * MiB
    assert inactive == 16_032_768
    assert d["reserved_bytes"] == 84 * MiB and d["allocated_bytes"] == 84 * MiB - inactive
    assert d["inactive_bytes"] == inactive and d["largest_free_block_bytes"] == 11 * MiB
    assert d["external_fragmentation"] == round(1 - 11 * MiB / inactive, 6)
    assert d["sliver_count"] == 1 and d["sliver_bytes"] == SLIVER  # the 2 MiB and the small-pool 1 MiB are not


def _large_stream0_free(snapshot: dict) -> tuple[int, int]:
    """Plain-Python (free bytes, largest free run) over large-pool stream-0 segments, merging adjacent
    inactive blocks the way the allocator coalesces them."""
    total = largest = 0
    for s in snapshot["segments"]:
        if s["segment_type"] != "large" or s["stream"] != 0:
            continue
        run = 0
        for b in s["blocks"] + [{"size": 0, "state": "active_allocated"}]:
            if b["state"] == "inactive":
                run += b["size"]
            else:
                total += run
                largest = max(largest, run)
                run = 0
    return total, largest


def test_built_modern_sample_oom_replay_against_a_hand_built_oom_state():
    """The modern sample + a trace written for it: after an 8 MiB OOM the job allocated segment 3 (20 MiB,
    8 x 2.25 MiB tensors), allocated one 2.25 MiB tensor in segment 4, and freed a 4 MiB tensor that sat
    at the start of segment 4's free tail. The replayed state must equal the dump-time analysis of that
    OOM-instant state built by hand from the same dicts."""
    import copy

    raw = modern_sample()
    s3, s4 = raw["segments"][3], raw["segments"][4]
    x = s4["blocks"][1]  # allocated after the OOM -> free at the OOM
    tail = s4["blocks"][4]  # 11 MiB free at dump; its first 4 MiB held a tensor freed after the OOM
    after = ([ev("segment_alloc", s3["address"], s3["total_size"])]
             + [ev("alloc", b["address"], b["requested_size"]) for b in s3["blocks"] if b["state"] != "inactive"]
             + [ev("alloc", x["address"], x["requested_size"])] + freed(tail["address"], 4 * MiB))
    trace = [oom(8 * MiB, 0)] + after + [ev("snapshot", 0, 0)]
    with_trace = copy.deepcopy(raw)
    with_trace["device_traces"] = [trace]
    o = dev0(analyse_snapshot(parse_snapshot(with_trace))[0])["ooms"][0]
    assert o["state_at"] == "oom" and o["replayed_entries"] == len(after) + 1 == 13, o["replay_problem"]  # 1 + 8 + 1 + 2, snapshot

    at_oom = copy.deepcopy(raw)  # the OOM-instant state, by hand
    del at_oom["segments"][3]
    s4o = at_oom["segments"][3]
    s4o["blocks"][1]["state"] = "inactive"
    t = s4o["blocks"].pop(4)
    s4o["blocks"] += [{"address": t["address"], "size": 4 * MiB, "requested_size": 4 * MiB,
                       "state": "active_allocated", "frames": []},
                      {"address": t["address"] + 4 * MiB, "size": t["size"] - 4 * MiB, "requested_size": 0,
                       "state": "inactive", "frames": []}]
    at_oom["device_traces"] = [[oom(8 * MiB, 0)]]
    ref = dev0(analyse_snapshot(parse_snapshot(at_oom))[0])["ooms"][0]
    free, largest = _large_stream0_free(at_oom)
    # 1,352,704 (segment 0 tail) + 2,359,296 (x) + 7,340,032 (11 MiB - 4 MiB) = 11,052,032 B; largest 7 MiB
    assert (free, largest) == (11_052_032, 7 * MiB)
    for k in ("same_stream_inactive_bytes", "same_stream_largest_free_block_bytes", "reserved_bytes",
              "allocated_bytes", "classification"):
        assert o[k] == ref[k], k
    assert (o["same_stream_inactive_bytes"], o["same_stream_largest_free_block_bytes"]) == (free, largest)
    assert o["reserved_bytes"] == 84 * MiB - 20 * MiB  # segment 3 did not exist yet
    # 11,052,032 >= 8 MiB > 7 MiB -> fragmentation at the OOM; the dump shows an 11 MiB free block -> capacity
    assert o["classification"] == "fragmentation" and o["at_dump"]["classification"] == "capacity"
    assert o["replay_uncertain_bytes"] == 1 * MiB  # the re-created 4 MiB block's possible unsplit tail


def test_built_legacy_sample_oom_replay_through_its_snapshot_entry():
    """The legacy (PyTorch ~2.0) format ends its trace with a 'snapshot' entry; an OOM just before it
    replays over that entry (no state change) and is judged at the OOM with the dump numbers."""
    raw = legacy_sample()
    raw["device_traces"][0].insert(0, {"action": "oom", "device_free": 0, "size": 2 * GiB, "stream": 0})
    doc, _ = analyse_snapshot(parse_snapshot(raw))
    d = dev0(doc)
    o = d["ooms"][0]
    assert (o["state_at"], o["replayed_entries"], o["replay_assumptions"]) == ("oom", 1, [])
    assert o["reserved_bytes"] == d["reserved_bytes"] == _reference_numbers(raw)["reserved_bytes"] == 62 * MiB
    assert o["allocated_bytes"] == d["allocated_bytes"] == 54 * MiB + MiB // 2
    assert {k: o[k] for k in o["at_dump"]} == o["at_dump"]


def test_committed_fixture_fragmented_oom():
    """tests/data/snapshot/fragmented_oom.pickle: fragmented_segments() + a 48 MiB OOM, as written by
    pickle protocol 4 (what torch.cuda.memory._dump_snapshot uses); see tests/data/README_snapshot.md."""
    path = Path(__file__).parent / "data" / "snapshot" / "fragmented_oom.pickle"
    doc, findings = analyse_snapshot_file(str(path))
    d = dev0(doc)
    assert (d["reserved_bytes"], d["inactive_bytes"], d["largest_free_block_bytes"]) == \
        (2068 * MiB, 660 * MiB, 32 * MiB)
    assert d["trace_actions"] == {"oom": 1, "segment_alloc": 1}
    assert [f.id for f in findings] == [FRAGMENTATION] and findings[0].severity is Severity.CRITICAL


# ---------------------------------------------------------------------------------------------
# hostile inputs (issue 12): each class the outside fuzzing campaign found, exit 2 or a sound answer
def _strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"{token} in JSON output")
    return json.loads(text, parse_constant=refuse)


def test_nan_and_inf_trace_times_are_absent_not_a_crash(tmp_path):
    t = [oom(48 * MiB, 10 * MiB, t=float("nan")), oom(48 * MiB, 10 * MiB, t=float("inf"))]
    path = write(tmp_path, dump(fragmented_segments(), [t]))
    r = _run(["snapshot", path, "--format", "json"])
    assert r.exception is None, r.exception
    doc = _strict_json(r.output)
    assert [o["time_us"] for o in doc["devices"][0]["ooms"]] == [None, None]
    assert doc["findings"][0]["onset"] is None


@pytest.mark.parametrize("conf,mss,gct", [
    ("max_split_size_mb:inf", None, None),
    ("max_split_size_mb:nan,garbage_collection_threshold:nan", None, None),
    ("max_split_size_mb:-5,garbage_collection_threshold:inf", None, None),
    ("max_split_size_mb:" + "9" * 400, None, None),  # float('9'*400) is 1e400 = inf
    ("max_split_size_mb:64,garbage_collection_threshold:0.6", 64 * MiB, 0.6),
])
def test_alloc_conf_non_finite_values_read_as_unknown(tmp_path, conf, mss, gct):
    st = settings(conf=conf, max_split=None, gct=None)
    path = write(tmp_path, dump(fragmented_segments(), st=st))
    r = _run(["snapshot", path, "--format", "json"])
    assert r.exception is None, r.exception
    s = _strict_json(r.output)["allocator_settings"]
    assert (s["max_split_size_bytes"], s["garbage_collection_threshold"]) == (mss, gct)
    assert _run(["snapshot", path]).exception is None  # the human output too


def test_json_with_a_5000_digit_integer_or_nan_token_is_one_line_error(tmp_path):
    text = json.dumps(dump(fragmented_segments()))
    p1 = tmp_path / "big.json"
    p1.write_text(text.replace('"device": 0', '"device": ' + "9" * 5000, 1))
    with pytest.raises(SnapshotError, match="more digits than Python reads"):
        read_snapshot(str(p1))
    p2 = tmp_path / "nan.json"
    p2.write_text(text.replace('"stream": 0', '"stream": NaN', 1))
    with pytest.raises(SnapshotError, match="NaN is not a JSON number"):
        read_snapshot(str(p2))


def test_huge_integers_in_a_pickle_never_reach_the_output(tmp_path):
    # pickles carry arbitrary-precision ints: str() of a 5,000-digit int raises, float() of 10**400 too
    t = [oom(10**30, 10**400, t=10**5000), {"action": 10**5000, "addr": 2**64, "size": -1}]
    st = settings()
    st["roundup_power2_divisions"] = {"1": 10**5000, "2": 4}
    s = seg([blk(32 * MiB), blk(32 * MiB, "inactive", req=0)], pool=(0, 0))
    s["blocks"][0]["state"] = 10**5000  # unknown state, counted by a label
    path = write(tmp_path, dump([s], [t], st=st))
    r = _run(["snapshot", path, "--format", "json"])
    assert r.exception is None, r.exception
    doc = _strict_json(r.output)
    assert doc["devices"][0]["ooms"] == []  # the OOM's size is not a 64-bit byte count
    assert any("1 oom trace entry without a readable size" in n for n in doc["notes"])
    assert any("<int>" in n for n in doc["notes"])  # the block state, by type
    assert doc["allocator_settings"]["roundup_power2_divisions"] == {"2": 4}


def test_gzip_bomb_is_refused_at_the_cap_naming_the_flag(tmp_path):
    p = tmp_path / "bomb.pickle.gz"
    p.write_bytes(gzip.compress(b"\x80\x04](" + b"]" * (8 * MiB) + b"e."))  # 8 KiB -> 8 MiB
    assert p.stat().st_size < 64 * 1024
    with pytest.raises(SnapshotError, match=r"decompressed size exceeds the 1 MiB cap .*--max-bytes SIZE"):
        read_snapshot(str(p), max_bytes=MiB)
    r = _run(["snapshot", str(p), "--max-bytes", "1MiB"])
    assert getattr(r.exception, "exit_code", None) == 2


def test_container_opcode_bomb_refused_by_its_memory_estimate(tmp_path):
    from fragscope.collectors.snapshot import LOAD_MEMORY_FACTOR, estimate_load_bytes

    data = b"\x80\x04](" + b"]" * MiB + b"e."  # 1 MiB that would take ~74 MiB once loaded
    assert estimate_load_bytes(data, "pickle") == 12 * len(data) + 64 * (MiB + 2)  # `]` x (MiB + 1) and `(`
    p = tmp_path / "bomb.pickle"
    p.write_bytes(data)
    cap = 2 * MiB  # the file is under the cap; its load estimate (~76 MiB) is over 20 x 2 MiB
    assert len(data) < cap < estimate_load_bytes(data, "pickle") / LOAD_MEMORY_FACTOR
    with pytest.raises(SnapshotError, match=r"would take about 76\.\d MiB of memory .* over 20 x the 2 MiB cap"):
        read_snapshot(str(p), max_bytes=cap)
    # a realistic snapshot exactly at the cap is not refused by the estimate
    real = write(tmp_path, dump(fragmented_segments(), [[oom(48 * MiB, 10 * MiB)] + freed(0x10, 512) * 50]))
    size = os.path.getsize(real)
    assert read_snapshot(real, max_bytes=size).n_blocks == 45


def test_max_bytes_flag_and_env(tmp_path, monkeypatch):
    path = write(tmp_path, dump(fragmented_segments()))
    r = _run(["snapshot", path, "--max-bytes", "1KiB"])
    assert getattr(r.exception, "exit_code", None) == 2
    monkeypatch.setenv("FRAGSCOPE_SNAPSHOT_MAX_BYTES", "1KiB")
    assert getattr(_run(["snapshot", path]).exception, "exit_code", None) == 2
    assert _run(["snapshot", path, "--max-bytes", "1MiB"]).exception is None  # the flag wins over the env
    monkeypatch.setenv("FRAGSCOPE_SNAPSHOT_MAX_BYTES", "lots")
    r = _run(["snapshot", path])
    assert getattr(r.exception, "exit_code", None) == 2 and "not a positive size" in str(r.exception)


def test_non_regular_files_refused_without_blocking(tmp_path):
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)  # opening a FIFO for reading blocks until a writer comes: O_NONBLOCK + fstat
    with pytest.raises(SnapshotError, match=r"not a regular file \(a FIFO\)"):
        read_snapshot(str(fifo))
    with pytest.raises(SnapshotError, match="not a regular file|Is a directory"):
        read_snapshot(str(tmp_path))


def test_memo_index_bomb_refused_in_bounded_memory(tmp_path):
    # EMPTY_LIST, LONG_BINPUT 2**31 - 1, STOP: 9 bytes that make the C unpickler allocate and zero a
    # 32 GiB memo (found by tests/fuzz: the process was killed at 23.8 GB RSS)
    import resource
    import struct
    import threading

    p = tmp_path / "memo.pickle"
    p.write_bytes(b"\x80\x02]r" + struct.pack("<I", 2**31 - 1) + b".")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SnapshotError, match="refusing to load .*(load budget|memo index 2147483647)"):
        read_snapshot(str(p))  # single-threaded: under RLIMIT_AS; else the opcode walk
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)  # a threaded host (the agent): the opcode walk, exactly
    t.start()
    try:
        with pytest.raises(SnapshotError, match=r"memo index 2147483647 in a 9-byte file .*32\.0 GiB"):
            read_snapshot(str(p))
    finally:
        stop.set()
        t.join()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB: < 512 MiB more
    r = _run(["snapshot", str(p)])
    assert getattr(r.exception, "exit_code", None) == 2
