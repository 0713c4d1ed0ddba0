"""A memory snapshot's job, told by its stack frames, and advice in that job's knobs (collectors/snapshot_job.py,
playbooks/snapshot.py; docs/snapshot.md#job).

Fixtures: tests/data/snapshot/<kind>_frames_oom.pickle, the committed fragmented_oom.pickle with its stacks renamed
to each program's module paths (make_job_fixtures.py; tests/data/README_snapshot.md).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_helpers import cli
from test_job_advice import OWN, foreign, playbook_lines, unlabelled

from fragscope.collectors.snapshot import parse_snapshot
from fragscope.collectors.snapshot_load import load_snapshot_bytes
from fragscope.playbooks.snapshot import UNKNOWN_JOB_NOTE, diagnose_snapshot

SNAP = Path(__file__).parent / "data" / "snapshot"
MiB, GiB = 1 << 20, 1 << 30
KINDS = ("vllm", "sglang", "tgi", "training")


def fixture(kind: str) -> Path:
    return SNAP / f"{kind}_frames_oom.pickle"


def stack_of(kind: str) -> list:
    """The stack the fixture of ``kind`` records (every recorded stack in it is this one)."""
    obj, _ = load_snapshot_bytes(fixture(kind).read_bytes(), "x", 1 << 20)
    return obj["device_traces"][0][-1]["frames"]


def snapshot_json(path, *args) -> dict:
    p = cli("snapshot", path, "--format", "json", "--fail-on", "never", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("kind", KINDS)
def test_the_frames_name_the_job_and_the_advice_names_only_its_knobs(kind):
    d = snapshot_json(fixture(kind))
    job = d["job"]
    assert job["kind"] == kind and job["note"] is None
    assert job["stacks_with_frames"] == 32  # 24 allocated blocks, 5 segments, 2 trace entries, the OOM's stack
    [ev] = job["evidence"]
    assert "in 32 of the 32 recorded stacks read, the failing allocation's among them" in ev
    assert ev.split(": ")[1].split(":")[0] == {
        "vllm": "vllm/model_executor/layers/linear.py", "sglang": "sglang/srt/layers/linear.py",
        "tgi": "text_generation_server/layers/linear.py", "training": "torch/autograd/graph.py"}[kind]
    assert [f["id"] for f in d["findings"]] == ["allocator-fragmentation"]
    for f in d["findings"]:
        for line in playbook_lines(f["playbook"]):
            assert foreign(line, kind) == [], line
    human = cli("snapshot", fixture(kind), "--fail-on", "never", "--no-map").stdout
    assert f"job: {kind} (" in human
    vllm_contra = [c for o in d["findings"][0]["playbook"]["options"] for c in o["contraindications"] if "vLLM" in c]
    assert bool(vllm_contra) == (kind == "vllm")  # expandable_segments' vLLM all-reduce / sleep-mode cases


def oom_snapshot(kind: str | None, cls: str) -> dict:
    """A snapshot whose one OOM is of class ``cls``, every stack ``kind``'s (None: recorded without frames), as
    tests/test_snapshot.py builds them (the same figures)."""
    frames = stack_of(kind) if kind else []
    addr = [0x7F0000000000]

    def seg(sizes, pool=(0, 0)):
        blocks, a = [], addr[0]
        for size, state in sizes:
            blocks.append({"size": size, "requested_size": size if state == "active_allocated" else 0,
                           "state": state, "address": a, "frames": frames if state == "active_allocated" else []})
            a += size
        total = sum(s for s, _ in sizes)
        s = {"device": 0, "address": addr[0], "total_size": total, "allocated_size": 0, "active_size": 0,
             "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": pool,
             "is_expandable": False, "frames": frames, "blocks": blocks}
        addr[0] += total + 64 * MiB
        return s

    def oom(size, free):
        return {"action": "oom", "device_free": free, "size": size, "stream": 0, "time_us": 1, "frames": frames}

    if cls in ("capacity", "outside"):
        segs, trace = [seg([(60 * GiB, "active_allocated")])], [oom(2 * GiB, 512 * MiB)]
    elif cls == "cap":
        segs, trace = [seg([(1 * GiB, "active_allocated")])], [oom(30 * MiB, 4 * GiB)]
    else:  # a private pool holding the free memory
        segs = [seg([(512 * MiB, "active_allocated")]),
                seg([(100 * MiB, "active_allocated"), (412 * MiB, "inactive")], pool=(3, 1))]
        trace = [oom(200 * MiB, 0)]
    return {"segments": segs, "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


CLASSES = {"capacity": ("oom-capacity", 61 * GiB), "outside": ("oom-outside-pytorch", 80 * GiB),
           "cap": ("oom-memory-cap", None), "pool": ("oom-private-pool", None)}
# what each job's fix names (its KNOBS setting), per OOM class
OWN_KNOB = {
    ("vllm", "capacity"): "--max-num-seqs", ("sglang", "capacity"): "--max-running-requests",
    ("tgi", "capacity"): "--max-batch-total-tokens", ("training", "capacity"): "activation checkpointing",
    ("vllm", "outside"): "--gpu-memory-utilization", ("sglang", "outside"): "--mem-fraction-static",
    ("tgi", "outside"): "--cuda-memory-fraction", ("training", "outside"): "GPU (or MIG slice) of its own",
    ("vllm", "cap"): "--gpu-memory-utilization", ("sglang", "cap"): "--mem-fraction-static",
    ("tgi", "cap"): "--cuda-memory-fraction", ("training", "cap"): "set_per_process_memory_fraction",
    ("vllm", "pool"): "cudagraph_capture_sizes", ("sglang", "pool"): "--cuda-graph-max-bs",
    ("tgi", "pool"): "--cuda-graphs", ("training", "pool"): "torch.cuda.graph",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cls", CLASSES)
def test_each_oom_class_names_the_jobs_own_knob(kind, cls):
    fid, total = CLASSES[cls]
    doc, findings = diagnose_snapshot(parse_snapshot(oom_snapshot(kind, cls)), device_total_bytes=total)
    assert doc["job"]["kind"] == kind and [f.id for f in findings] == [fid]
    lines = playbook_lines(findings[0].playbook)
    assert any(OWN_KNOB[kind, cls] in x for x in lines), lines
    for line in lines:
        assert foreign(line, kind) == [], line
    assert UNKNOWN_JOB_NOTE not in lines


@pytest.mark.parametrize("cls", CLASSES)
def test_without_frames_the_job_is_unknown_and_engine_flags_are_labelled(cls):
    fid, total = CLASSES[cls]
    doc, findings = diagnose_snapshot(parse_snapshot(oom_snapshot(None, cls)), device_total_bytes=total)
    assert doc["job"]["kind"] == "unknown" and doc["job"]["stacks_with_frames"] == 0
    assert "records no stack frames" in doc["job"]["note"]
    acts = findings[0].playbook["actions"]
    assert acts[0] == UNKNOWN_JOB_NOTE
    for line in playbook_lines(findings[0].playbook):
        assert unlabelled(line) == [], line


def test_the_html_report_says_the_job_and_its_frames(tmp_path):
    out = tmp_path / "snap.html"
    p = cli("snapshot", fixture("tgi"), "--fail-on", "never", "--html", out)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert "Job: <b>tgi</b> (TGI (text-generation-inference): text_generation_server/layers/linear.py:40" in html
    assert "vLLM" not in html


def test_frames_of_no_known_program_leave_the_job_unknown():
    # the committed fixture's own stacks: /app/model.py, /app/serve.py
    d = snapshot_json(SNAP / "fragmented_oom.pickle")
    assert d["job"]["kind"] == "unknown" and d["job"]["evidence"] == []
    assert d["job"]["note"].startswith("none of the 32 stacks read goes through")
    assert "job: unknown: none of the 32 stacks" in cli("snapshot", SNAP / "fragmented_oom.pickle", "--no-map",
                                                       "--fail-on", "never").stdout


def test_a_no_grad_frame_is_not_a_training_loop_but_a_backward_is():
    from fragscope.collectors.enginelog.jobkind import frame_kind

    assert frame_kind("/x/site-packages/torch/autograd/grad_mode.py", "__exit__") is None
    assert frame_kind("/x/site-packages/torch/utils/_contextlib.py", "decorate_context") is None
    assert frame_kind("/x/site-packages/torch/_tensor.py", "backward")[0] == "training"
    assert frame_kind("C:\\py\\Lib\\site-packages\\vllm\\v1\\worker\\gpu_model_runner.py")[0] == "vllm"
    assert frame_kind("/srv/myvllmfork.py") is None  # a path component, not a substring of a name


def test_a_serving_engine_wins_over_a_training_marker_in_the_same_snapshot():
    obj, _ = load_snapshot_bytes(fixture("sglang").read_bytes(), "x", 1 << 20)
    obj["segments"][0]["blocks"][0]["frames"] = stack_of("training")
    job = parse_snapshot(obj).job
    assert job["kind"] == "sglang" and [e.split(":")[0] for e in job["evidence"]] == ["SGLang", "a training loop"]


def test_every_kind_with_an_own_label_is_checked():
    assert set(OWN) <= set(KINDS)
    assert os.path.exists(fixture("vllm"))


def test_hostile_frames_and_rings_are_read_not_crashed_on():
    """A frame's line beyond what an int converts to text (Python's 4,300-digit limit), and more device rings
    than stacks to sample: the job is still told (fuzzing found both)."""
    obj, _ = load_snapshot_bytes(fixture("vllm").read_bytes(), "x", 1 << 20)
    stack = [dict(f) for f in stack_of("vllm")]
    stack[0]["line"] = 10 ** 5000
    obj["segments"][0]["blocks"][0]["frames"] = stack
    obj["device_traces"] = [[{"frames": stack}] for _ in range(3000)]
    job = parse_snapshot(obj).job
    assert job["kind"] == "vllm" and not any("0000000000" in e for e in job["evidence"])
