"""Advice names only the knobs of the job that produced the evidence (advice/jobtext.py, advice/jobs.py).

A finding whose job is known (a log's ``job_kind``, a memory snapshot's frames) must not tell the user to set another
engine's flags anywhere in its playbook (now, durable fixes with their conditions, verification, computed fixes);
the engine-independent playbook (``diagnose explain``, metrics windows) names an engine's setting only beside the
engine's name. Checked on the real logs of tests/data/logs (tests/data/README.md says where each came from).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import cli

LOGS = Path(__file__).parent / "data" / "logs"

# engine label -> settings only that engine has (the spellings of its --help, launcher arguments or config)
FLAGS = {
    "vLLM": ("gpu_memory_utilization", "gpu-memory-utilization", "max_num_seqs", "max-num-seqs",
             "max_num_batched_tokens", "max-num-batched-tokens", "max_model_len", "max-model-len", "enforce-eager",
             "cudagraph_capture_sizes", "swap-space", "cpu-offload-gb", "kv-cache-memory-bytes", "api-server-count"),
    "SGLang": ("mem-fraction-static", "mem_fraction_static", "max-running-requests", "chunked-prefill-size",
               "--context-length", "cuda-graph-max-bs", "disable-cuda-graph"),
    "TGI": ("cuda-memory-fraction", "max-batch-total-tokens", "max-batch-prefill-tokens", "max-concurrent-requests",
            "--cuda-graphs"),
}
METRIC_PREFIX = {"vLLM": "vllm:", "SGLang": "sglang:", "TGI": "tgi_"}  # an engine's metric names: its own too
OWN = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI"}


def unlabelled(line: str) -> list[str]:
    """Engines whose settings ``line`` names without naming the engine."""
    return [eng for eng, flags in FLAGS.items() if any(f in line for f in flags) and eng not in line]


def foreign(line: str, kind: str) -> list[str]:
    """Engines other than ``kind`` whose name, settings or metrics ``line`` names."""
    return [eng for eng, flags in FLAGS.items() if eng != OWN.get(kind)
            and (eng in line or METRIC_PREFIX[eng] in line or any(f in line for f in flags))]


def playbook_lines(pb: dict) -> list[str]:
    """Every line of a rendered playbook (a finding's JSON ``playbook``) a user reads."""
    out = [pb.get("meaning") or ""] + list(pb.get("immediate") or []) + list(pb.get("verify") or [])
    out += list(pb.get("actions") or []) + list(pb.get("references") or [])
    for a in pb.get("durable") or []:
        out += [a["text"], *a["preconditions"], *a["contraindications"]]
    for o in pb.get("options") or []:
        out += [o["why"], *o["preconditions"], *o["contraindications"]]
    return out


def log_json(name: str) -> dict:
    p = cli("logs", LOGS / name, "--format", "json", "--fail-on", "never")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("name, kind, ids", [
    ("tgi_issue866_shard_oom.log", "tgi", {"oom-capacity"}),
    ("tgi_issue1356_preallocated_oom.log", "tgi", {"oom-capacity"}),
    ("sglang_retractions.log", "sglang", {"kv-cache-pressure"}),
    ("torch_oom_llamacookbook320_training_fragmentation.log", "training", {"allocator-fragmentation"}),
    ("club3090_issue16_enginecore_oom.log", "vllm", {"oom-capacity"}),
    ("vllm_v1_oom.log", "vllm", {"allocator-fragmentation", "kv-cache-pressure"}),
    ("vllm_issue2734_nccl_watchdog_ray_colours.log", "vllm", {"engine-died"}),
    ("vllm_llmscaler391_queue_with_free_pool.log", "vllm", {"admission-capped"}),
    ("vllm_kaito2132_wrapped_kv_insufficient.log", "vllm", {"kv-capacity-gap", "startup-oom"}),
])
def test_a_known_jobs_findings_name_only_its_knobs(name, kind, ids):
    d = log_json(name)
    assert d["log"]["job_kind"] == kind
    assert {f["id"] for f in d["findings"]} == ids
    for f in d["findings"]:
        for line in playbook_lines(f["playbook"]):
            assert foreign(line, kind) == [], (f["id"], line)


def test_a_tgi_oom_names_tgis_memory_share_and_batch_limits():
    pb = log_json("tgi_issue866_shard_oom.log")["findings"][0]["playbook"]
    durable = " ".join(a["text"] for a in pb["durable"])
    assert "--cuda-memory-fraction" in durable and "--max-batch-total-tokens" in durable
    human = cli("logs", LOGS / "tgi_issue866_shard_oom.log", "--fail-on", "never").stdout
    assert "--cuda-memory-fraction" in human and not [e for e in ("vLLM", "SGLang") if e in human]
    assert "gpu_memory_utilization" not in human and "gpu-memory-utilization" not in human


def test_a_vllm_servers_fragmentation_keeps_its_rolling_restart():
    pb = log_json("vllm_v1_oom.log")["findings"][0]["playbook"]
    assert pb["immediate"][0].startswith("Restart the engine (rolling, one replica at a time)")
    assert pb["durable"][0]["text"].startswith("Lower gpu_memory_utilization")


def test_a_training_loops_fragmentation_has_no_serving_advice():
    pb = log_json("torch_oom_llamacookbook320_training_fragmentation.log")["findings"][0]["playbook"]
    lines = playbook_lines(pb)
    assert not [x for x in lines if "replica" in x or "KV pool" in x], lines
    assert any("Restart the program" in x for x in pb["immediate"])
    # expandable_segments stays, without the contraindications about vLLM's all-reduce and sleep mode
    exp = [a for a in pb["durable"] if "expandable_segments" in a["text"]]
    assert exp and not [c for c in exp[0]["contraindications"] if "vLLM" in c]


@pytest.mark.parametrize("name, fid", [
    ("comfyui_issue12360_malloc_async_oom.log", "oom-capacity"),
    ("comfyui_sharp24_malloc_async_oom.log", "oom-outside-pytorch"),
    ("torch_oom_le20_pytorch59778.log", "oom-memory-cap"),
    ("vllm_issue1160_raylet_syslog_wrapped.log", "host-memory-pressure"),
])
def test_an_unknown_jobs_engine_flags_are_labelled(name, fid):
    d = log_json(name)
    assert d["log"]["job_kind"] == "unknown" and [f["id"] for f in d["findings"]] == [fid]
    for line in playbook_lines(d["findings"][0]["playbook"]):
        assert unlabelled(line) == [], line


def test_the_engine_independent_playbooks_label_every_engine_setting():
    from fragscope.playbooks import PLAYBOOKS

    for pid, pb in PLAYBOOKS.items():
        for line in playbook_lines(pb.to_dict()):
            assert unlabelled(line) == [], (pid, line)
    # diagnose explain prints the engine-independent wording, as plain JSON strings
    p = cli("explain", "oom-capacity", "--format", "json")
    durable = json.loads(p.stdout)["durable"][0]["text"]
    assert "a serving engine" in durable and not [e for e in FLAGS if e in durable]


def test_playbook_for_a_kind_keeps_plain_lines_and_drops_other_jobs_lines():
    from fragscope.advice.jobtext import JobText, only, playbook_for
    from fragscope.model import Action, Playbook

    pb = Playbook("x", "t", "m", ["plain", JobText("neutral", vllm="v", sglang=None)],
                  [Action(only("vLLM: --enforce-eager", "vllm"), ["p"], [only("vLLM: sleep mode", "vllm"), "c"]),
                   Action(JobText("n", lambda k: f"for {k}"), [], [])], ["verify"])
    assert playbook_for(pb, None) is pb
    sg = playbook_for(pb, "sglang").to_dict()
    assert sg["immediate"] == ["plain"] and [a["text"] for a in sg["durable"]] == ["for sglang"]
    vl = playbook_for(pb, "vllm").to_dict()
    assert vl["immediate"] == ["plain", "v"] and vl["durable"][0]["contraindications"] == ["vLLM: sleep mode", "c"]
    un = playbook_for(pb, "unknown").to_dict()  # an unknown job keeps the labelled engine lines
    assert un["immediate"] == ["plain", "neutral"] and un["durable"][0]["text"] == "vLLM: --enforce-eager"
    assert all(type(x) is str for x in un["immediate"])
    assert json.loads(json.dumps(pb.to_dict()))["immediate"] == ["plain", "neutral"]


def test_kv_pressure_computed_fixes_in_the_jobs_flags():
    """The computed fixes of a preemption storm: SGLang's cap and memory share for an SGLang log, vLLM's for a vLLM
    log or a metrics window (whose figures come from vLLM's config)."""
    from fragscope.playbooks import computed_actions

    peers = {"ids": frozenset(), "settings": {"--mem-fraction-static": (0.83, "kv-pool-undersized")}}
    sg = computed_actions("kv-cache-pressure", {"job_kind": "sglang", "running": 40, "_peers": peers},
                          {"gpu_memory_utilization": 0.9})
    assert sg[0].startswith("Cap --max-running-requests at ~32") and "--mem-fraction-static 0.83" in sg[1]
    assert not [x for x in sg if foreign(x, "sglang")], sg
    vl = computed_actions("kv-cache-pressure", {"running": 40}, {"gpu_memory_utilization": 0.9})
    assert vl[0].startswith("Cap --max-num-seqs at ~32") and "--gpu-memory-utilization 0.90 → 0.93" in vl[1]


def test_a_metrics_window_of_sglang_gets_sglangs_knobs():
    """A window read from SGLang's own metrics (its docs' production page, tests/data/engines) is SGLang's job: its
    kv-cache-pressure playbook names SGLang's settings, not vLLM's."""
    from test_engines import SGL, _sglang_full, scrape

    from fragscope.pipeline import diagnose

    rep = diagnose(scrape(SGL, _sglang_full(tp_ranks=4, retracted=48.0)))
    kv = next(x for x in rep.findings if x.id == "kv-cache-pressure")
    assert kv.context["job_kind"] == "sglang"
    lines = playbook_lines(kv.playbook)
    assert any("--max-running-requests" in x for x in lines) and any("sglang:token_usage" in x for x in lines)
    for line in lines:
        assert foreign(line, "sglang") == [], line


def test_metrics_of_one_engine_name_it_and_mixed_or_none_name_none():
    from fragscope.collectors.enginelog.jobkind import metrics_job_kind

    assert metrics_job_kind(["vllm:num_requests_running", "DCGM_FI_DEV_FB_USED"]) == "vllm"
    assert metrics_job_kind(["tgi_queue_size"]) == "tgi"
    assert metrics_job_kind(["nv_trt_llm_requests_active", "nv_inference_pending_request_count"]) is None
    assert metrics_job_kind(["DCGM_FI_DEV_FB_USED", "fragscope_torch_reserved_bytes"]) is None
