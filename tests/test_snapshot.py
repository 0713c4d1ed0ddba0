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
from fragscope.collectors.snapshot import (ALLOCATED, INACTIVE, PENDING_FREE, SnapshotError, parse_snapshot,
                                           read_snapshot)
from fragscope.detectors.snapshot import (FRAGMENTATION, OOM_CAPACITY, OOM_CROSS_STREAM, OOM_MEMORY_CAP,
                                          OOM_OUTSIDE_PYTORCH, OOM_PRIVATE_POOL, alloc_segment_size,
                                          analyse_snapshot, analyse_snapshot_file, segment_map_rows)
from fragscope.model import Finding, Severity

MiB = 1024 * 1024
GiB = 1024 * MiB
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "torch-snapshot"
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
    assert doc["default_pool"] if "default_pool" in doc else True
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
    assert findings[0].confidence == pytest.approx(0.35)  # 0.5 * 0.7


def test_alloc_segment_size_classes():
    assert alloc_segment_size(512) == 2 * MiB
    assert alloc_segment_size(5 * MiB) == 20 * MiB
    assert alloc_segment_size(11 * MiB + 1) == 12 * MiB


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
    import subprocess
    import sys

    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pickle"
    p.write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    r = subprocess.run([sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()",
                        "snapshot", str(p)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "refusing to load" in r.stderr and "os.system" in r.stderr
    assert "Traceback" not in r.stderr and not marker.exists()


# ---------------------------------------------------------------------------------------------
# real samples (reference only, not in the repo): skip when ../shared is absent
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


@pytest.mark.parametrize("name,nseg,nblocks,legacy", [
    ("docubox_dump_snapshot.pickle", 12, 116, False),
    ("llm-inference_oom_snapshot.pickle", 176, 463, True),
])
def test_real_samples(name, nseg, nblocks, legacy):
    path = SHARED / name
    if not path.exists():
        pytest.skip("../shared/data/torch-snapshot not present")
    from fragscope.collectors.snapshot import load_snapshot_bytes

    raw, _ = load_snapshot_bytes(path.read_bytes(), name)
    snap = read_snapshot(str(path))
    assert (snap.n_segments, snap.n_blocks, snap.legacy) == (nseg, nblocks, legacy)
    doc, findings = analyse_snapshot(snap)
    d = dev0(doc)
    for k, v in _reference_numbers(raw).items():
        assert d[k] == v, k
    # neither sample is fragmented by the thresholds: small free space (< 256 MiB stranded)
    assert doc["verdict"] == "ok" and findings == []


def test_real_modern_sample_exact_numbers():
    path = SHARED / "docubox_dump_snapshot.pickle"
    if not path.exists():
        pytest.skip("../shared/data/torch-snapshot not present")
    d = dev0(analyse_snapshot_file(str(path))[0])
    assert d["reserved_bytes"] == 109051904 and d["allocated_bytes"] == 90861056
    assert d["inactive_bytes"] == 18190848 and d["largest_free_block_bytes"] == 11534336
    assert d["external_fragmentation"] == round(1 - 11534336 / 18190848, 6)
    assert d["sliver_count"] == 1 and d["sliver_bytes"] == 1352704


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
