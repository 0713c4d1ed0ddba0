"""Diagnoses beyond the GPU's memory: the cgroup / host readers on real files recorded on a Linux host,
the detectors on hand-built windows (each told apart from its look-alike both ways), and the scenario
families' confounders.

tests/data/cgroup/ holds real files (README_cgroup.md); the windows below are built from the mechanism
(a CFS quota's periods, a stall's frozen counters), with the thresholds' sources in the detectors.
"""
from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

from fragscope.collectors import cgroup as cg
from fragscope.collectors.exposition import read_recording
from fragscope.collectors.process import ProcessCollector
from fragscope.detectors import cpu_starved, gpu_fault, host_memory, launch_bound, stalled, stats, straggler
from fragscope.detectors.frame import build_frame
from fragscope.model import SeriesKey, Severity, Window, make_labels
from fragscope.pipeline import diagnose
from fragscope.scenarios import Scenario, to_window

DATA = os.path.join(os.path.dirname(__file__), "data", "cgroup")
AGENT_DATA = os.path.join(os.path.dirname(__file__), "data", "agent")
REC_CG = "fragscope-newdiag-rec-10569"
REC_PID = "3860"


# --- readers on real files ------------------------------------------------------------------------
def test_v1_cpu_and_memory_of_a_quota_cgroup_recorded_under_load():
    """A CPU burner in a v1 cgroup with cfs_quota_us 20000 / period 100000 (0.2 cores), recorded 2.5 s in."""
    d = cg.find_dirs(REC_PID, root=os.path.join(DATA, "v1"), proc_root=os.path.join(DATA, "proc"))
    assert d.cpu == os.path.join(DATA, "v1", "cpu", REC_CG) and d.cpu_version == 1
    assert d.memory == os.path.join(DATA, "v1", "memory", REC_CG) and d.memory_version == 1
    cpu = cg.read_cpu(d.cpu, 1)
    assert cpu["quota_cores"] == pytest.approx(0.2) and cpu["period_s"] == pytest.approx(0.1)
    assert cpu["periods"] == 27 and cpu["throttled_periods"] == 27  # every period ran out of quota
    assert cpu["throttled_s"] == pytest.approx(1.211488768)
    mem = cg.read_memory(d.memory, 1)
    assert mem["usage_bytes"] == 133521408 and mem["limit_bytes"] == 256 * 1024 * 1024
    assert 0 < mem["working_set_bytes"] <= mem["usage_bytes"] and mem["oom_kills"] == 0
    ss = cg.read_schedstat(REC_PID, os.path.join(DATA, "proc"))
    assert ss["threads"] == 1 and ss["run_s"] > 0 and ss["wait_s"] >= 0


def test_v1_oom_kill_counter_recorded_after_a_real_kill():
    """A 200 MiB allocation in a 64 MiB v1 memory cgroup: the kernel killed it (exit 137), oom_kill 1."""
    d = os.path.join(DATA, "v1oom", "memory", "fragscope-newdiag-oom-10569")
    mem = cg.read_memory(d, 1)
    assert mem["oom_kills"] == 1 and mem["limit_bytes"] == 64 * 1024 * 1024


def test_unlimited_and_v2_files(tmp_path):
    # v1 "no limit" is PAGE_COUNTER_MAX, not a limit
    m = tmp_path / "memory"
    m.mkdir()
    (m / "memory.usage_in_bytes").write_text("6365323264\n")  # the host root of this machine
    (m / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cg.read_memory(str(m), 1)["limit_bytes"] is None
    # v2 (file formats of Documentation/admin-guide/cgroup-v2.rst)
    v2 = tmp_path / "v2" / "kubepods" / "pod1"
    v2.mkdir(parents=True)
    (v2 / "cpu.max").write_text("150000 100000\n")
    (v2 / "cpu.stat").write_text("usage_usec 9000000\nnr_periods 500\nnr_throttled 120\nthrottled_usec 4500000\n")
    (v2 / "memory.current").write_text("2147483648\n")
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.stat").write_text("anon 1073741824\ninactive_file 536870912\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\n")
    proc = tmp_path / "proc" / "77"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/kubepods/pod1\n")
    d = cg.find_dirs(77, root=str(tmp_path / "v2"), proc_root=str(tmp_path / "proc"))
    assert d.cpu == str(v2) and d.cpu_version == 2 and d.memory_version == 2
    assert cg.read_cpu(d.cpu, 2) == {"quota_cores": 1.5, "period_s": 0.1, "periods": 500, "throttled_periods": 120,
                                     "throttled_s": 4.5, "usage_s": 9.0}
    mem = cg.read_memory(d.memory, 2)
    assert mem == {"usage_bytes": 2147483648, "working_set_bytes": 1610612736, "limit_bytes": None,
                   "oom_kills": 1, "oom_events": 2}


def test_engine_cgroup_outside_our_namespace_falls_back_and_says_so(tmp_path):
    base = tmp_path / "cpu"
    base.mkdir()
    (base / "cpu.cfs_quota_us").write_text("-1\n")
    proc = tmp_path / "proc" / "9"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("1:cpu:/../engine-container\n")
    d = cg.find_dirs(9, root=str(tmp_path), proc_root=str(tmp_path / "proc"))
    assert d.cpu == str(base) and any("not visible" in n for n in d.notes)
    assert cg.read_cpu(d.cpu, 1)["quota_cores"] is None  # -1: no limit


def test_v2_root_without_cpu_max_has_usage_but_no_throttling():
    """This host's unified hierarchy (hybrid mode) at its root: usage counters, no quota, no throttling."""
    cpu = cg.read_cpu(os.path.join(DATA, "v2root"), 2)
    assert cpu["usage_s"] > 0 and "throttled_periods" not in cpu and "quota_cores" not in cpu


def test_host_memory_from_recorded_proc_files():
    h = cg.read_host_memory(os.path.join(DATA, "proc"))
    assert h["total_bytes"] > h["available_bytes"] > 0
    assert h["swap_in_bytes"] >= 0 and h["swap_out_bytes"] >= 0


def test_process_collector_reads_the_engine_pids_cgroup(tmp_path):
    """The collector follows the engine's pid to its cgroup (here: this test process, in the cgroup root
    of a copied v1 tree), and reports memory, host memory and run-queue delay."""
    root = tmp_path / "cg"
    shutil.copytree(os.path.join(DATA, "v1", "cpu", REC_CG), root / "cpu")
    shutil.copytree(os.path.join(DATA, "v1", "memory", REC_CG), root / "memory")
    c = ProcessCollector(pids=[os.getpid()], cgroup_root=str(root))
    r = c.collect(1.0)
    vals = {s.name: s.value for s in r.samples if not s.labels}
    assert vals["fragscope_container_cpu_quota_cores"] == pytest.approx(0.2)
    assert vals["fragscope_container_cpu_throttled_periods_total"] == 27
    assert vals["fragscope_container_memory_limit_bytes"] == 256 * 1024 * 1024
    assert vals["fragscope_container_oom_kills_total"] == 0
    assert vals["fragscope_host_memory_total_bytes"] > 0
    rq = [s for s in r.samples if s.name == "fragscope_process_runqueue_wait_seconds_total"]
    assert rq and dict(rq[0].labels)["pid"] == str(os.getpid())


# --- hand-built windows ------------------------------------------------------------------------------
T0 = 1_767_225_600.0


def _window(series: dict, step: float = 5.0, n: int = 25) -> Window:
    """series: name -> (labels, values per step) or a callable(i) -> value."""
    ts = T0 + step * np.arange(n)
    cols, types = {}, {}
    for name, spec in series.items():
        labels, vals = spec
        v = np.array([vals(i) for i in range(n)] if callable(vals) else vals, dtype=float)
        cols[SeriesKey(name, make_labels(labels))] = (ts, v)
        types[name] = "counter" if name.endswith("_total") else "gauge"
    return Window.from_columns(cols, source="test", types=types)


ENG = {"model_name": "m", "engine": "0"}


def _serving(running=8, waiting=0, tok_per_step=500.0, util=0.4, stop_at=None, n=25):
    s = {"vllm:num_requests_running": (ENG, [running] * n),
         "vllm:num_requests_waiting": (ENG, [waiting] * n),
         "vllm:generation_tokens_total": (ENG, lambda i: tok_per_step * min(i, stop_at if stop_at is not None else i)),
         "vllm:prompt_tokens_total": (ENG, lambda i: 300.0 * min(i, stop_at if stop_at is not None else i)),
         "fragscope_gpu_utilization_ratio": ({"gpu": "0"}, [util] * n)}
    return s


def _cpu(throttled_share: float, n=25, step=5.0):
    per = 10.0 * step
    return {"fragscope_container_cpu_periods_total": ({}, lambda i: per * i),
            "fragscope_container_cpu_throttled_periods_total": ({}, lambda i: round(per * i * throttled_share)),
            "fragscope_container_cpu_throttled_seconds_total": ({}, lambda i: per * i * throttled_share * 0.05),
            "fragscope_container_cpu_quota_cores": ({}, [2.0] * n)}


def test_cpu_starved_fires_with_the_throttled_share_and_is_not_launch_bound():
    w = _window({**_serving(waiting=3), **_cpu(0.6),
                 "fragscope_kernel_gap_seconds": ({"gpu": "0", "quantile": "0.5"}, [400e-6] * 25),
                 "fragscope_gpu_idle_ratio": ({"gpu": "0"}, [0.55] * 25)})
    f = build_frame(w)
    (fnd,) = cpu_starved.detect(f)
    assert fnd.severity is Severity.CRITICAL and "60 % of its CPU periods" in fnd.summary
    assert "quota 2.00 cores" in fnd.summary and "3 requests waiting" in fnd.summary
    # the host is late because its quota ran out, not a launch pattern: launch-bound declares that it yields to
    # engine-cpu-starved, whose signature shows here, and the pipeline drops the finding its detector makes
    assert launch_bound.SUPPRESSED_BY == ("engine-cpu-starved",) and cpu_starved.signature(f, stats.spans(f))
    assert [x.id for x in launch_bound.detect(f)] == ["launch-bound"]
    ids = {x.id for x in diagnose(w).findings}
    assert "engine-cpu-starved" in ids and "launch-bound" not in ids


def test_a_throttled_engine_leaves_no_launch_bound_doubt_about_its_gpu():
    """Utilization low while requests run and no kernel timeline: launch-bound doubts GPU 0 (an inconclusive naming
    it). With the quota running out that doubt is answered (engine-cpu-starved) and dropped with the rest of the
    judgement; with CPU to spare it stays, and so does an inconclusive for signals missing altogether."""
    def launch(rep):
        return [i for i in rep.inconclusive if i.id == "launch-bound"]
    spare = diagnose(_window({**_serving(util=0.3), **_cpu(0.01)}))
    (doubt,) = launch(spare)
    assert doubt.subject == {"gpu": "0"} and "utilization is low" in doubt.reason
    assert launch(diagnose(_window({**_serving(util=0.3), **_cpu(0.6)}))) == []
    no_gpu = {k: v for k, v in _serving().items() if not k.startswith("fragscope_gpu")}
    (lacking,) = launch(diagnose(_window({**no_gpu, **_cpu(0.6)})))
    assert not lacking.subject and "fragscope_kernel_gap_seconds" in lacking.missing


def _cpu_lifted(lifted_at: int, n=25, step=5.0, periods_stop=False):
    """Every CFS period throttled until step ``lifted_at``, none after (the quota lifted); with
    ``periods_stop`` no period is counted after it either (cgroup v1 with cfs_quota_us -1)."""
    per = 10.0 * step
    return {"fragscope_container_cpu_periods_total": ({}, lambda i: per * (min(i, lifted_at) if periods_stop else i)),
            "fragscope_container_cpu_throttled_periods_total": ({}, lambda i: per * min(i, lifted_at)),
            "fragscope_container_cpu_quota_cores": ({}, [0.2] * n)}


@pytest.mark.parametrize("periods_stop", [False, True])
@pytest.mark.parametrize("lifted_s, fires", [(5, True), (10, True), (15, False), (20, False), (40, False)])
def test_cpu_starved_clears_once_the_newest_periods_are_unthrottled(lifted_s, fires, periods_stop):
    """Quota lifted ``lifted_s`` before the end of the window: the minute still reads >= 25 % throttled
    (until 45 s; with the period count stopped, until the lift leaves the minute), but once the newest
    15 s ran unthrottled (or counted no period) the present is not starved."""
    w = _window({**_serving(waiting=2), **_cpu_lifted(24 - lifted_s // 5, periods_stop=periods_stop)})
    f = build_frame(w)
    from fragscope.detectors.host_common import judged_span, throttled_share

    assert throttled_share(f, judged_span(f)) >= cpu_starved.Config().throttled_share or lifted_s >= 45
    assert (cpu_starved.detect(f) != []) is fires


def test_launch_bound_with_cpu_to_spare_is_not_cpu_starved():
    w = _window({**_serving(), **_cpu(0.01),
                 "fragscope_kernel_gap_seconds": ({"gpu": "0", "quantile": "0.5"}, [400e-6] * 25),
                 "fragscope_gpu_idle_ratio": ({"gpu": "0"}, [0.55] * 25)})
    f = build_frame(w)
    assert cpu_starved.detect(f) == []
    assert [x.id for x in launch_bound.detect(f)] == ["launch-bound"]


def test_cpu_starved_quiet_when_idle_and_inconclusive_without_counters():
    assert cpu_starved.detect(build_frame(_window({**_serving(running=0), **_cpu(0.8)}))) == []
    res = cpu_starved.detect(build_frame(_window(_serving())))
    assert not isinstance(res, list) and res.missing


def test_runqueue_delay_alone_needs_a_serving_symptom():
    rq = {"fragscope_process_cpu_seconds_total": ({"pid": "1"}, lambda i: 2.0 * 5 * i),
          "fragscope_process_runqueue_wait_seconds_total": ({"pid": "1"}, lambda i: 3.0 * 5 * i)}
    # threads wait 60 % of their runnable time, the GPU busy, nothing queued: a busy node, not a diagnosis
    assert cpu_starved.detect(build_frame(_window({**_serving(util=0.9), **rq}))) == []
    (fnd,) = cpu_starved.detect(build_frame(_window({**_serving(util=0.9, waiting=5), **rq})))
    assert "waited for a CPU 60 %" in fnd.summary and fnd.severity is Severity.WARNING


def test_stalled_engine_found_with_its_duration_and_kind():
    # tokens stop at step 18 of 25 (5 s steps): the last sample that moved is step 18, 30 s before the end
    w = _window({**_serving(util=1.0, stop_at=18)})
    (fnd,) = stalled.detect(build_frame(w))
    assert fnd.context["stalled_seconds"] == pytest.approx(30.0) and fnd.context["kind"] == "collective"
    assert "for 30 s" in fnd.summary and "NCCL" in fnd.summary and fnd.severity is Severity.WARNING
    w = _window({**_serving(util=0.0, stop_at=5)})
    (fnd,) = stalled.detect(build_frame(w))
    assert fnd.context["kind"] == "host" and fnd.severity is Severity.CRITICAL  # 95 s
    # the saturated look-alike: a queue and the GPU pegged, but tokens flow
    assert stalled.detect(build_frame(_window({**_serving(waiting=40, util=1.0)}))) == []
    # nothing in flight: an idle engine makes no tokens
    assert stalled.detect(build_frame(_window({**_serving(running=0, stop_at=2)}))) == []
    # 10-15 s: a long prefill step, not a stall
    assert stalled.detect(build_frame(_window({**_serving(stop_at=23)}))) == []


def test_stall_measured_on_raw_samples_not_the_grid():
    """A scrape gap before the last sample, which lands just after the last grid point: the grid reads two
    flat steps at the end, the raw samples show the tokens moved (a false stall before, the eval's surge case)."""
    n = 25
    ts = T0 + 60.0 * np.arange(n)
    keep = np.ones(n, bool)
    keep[-3:-1] = False  # two scrapes lost
    ts = ts[keep].copy()
    ts[-1] += 0.5  # the last scrape half a second late
    tok = 1000.0 * np.arange(n)[keep]
    cols = {SeriesKey("vllm:num_requests_running", make_labels(ENG)): (ts, np.full(ts.size, 30.0)),
            SeriesKey("vllm:generation_tokens_total", make_labels(ENG)): (ts, tok)}
    w = Window.from_columns(cols, source="test", types={"vllm:generation_tokens_total": "counter"})
    assert stalled.detect(build_frame(w)) == []


def test_stalled_not_reported_as_saturation():
    w = _window({**_serving(waiting=30, util=1.0, stop_at=10)})
    ids = {x.id for x in diagnose(w).findings}
    assert "engine-stalled" in ids and "capacity-saturation" not in ids


def _mem(ws_ratio, kills=lambda i: 0.0, limit=64 * 2**30):
    return {"fragscope_container_memory_working_set_bytes": ({}, [ws_ratio * limit] * 25),
            "fragscope_container_memory_limit_bytes": ({}, [float(limit)] * 25),
            "fragscope_container_oom_kills_total": ({}, kills)}


def test_host_memory_pressure_levels():
    (fnd,) = host_memory.detect(build_frame(_window(_mem(0.93))))
    assert fnd.severity is Severity.WARNING and "93 % of its 64.0 GiB limit" in fnd.summary
    (fnd,) = host_memory.detect(build_frame(_window(_mem(0.6, kills=lambda i: 1.0 if i > 20 else 0.0))))
    assert fnd.severity is Severity.CRITICAL and "OOM killer ended 1 process" in fnd.summary
    assert host_memory.detect(build_frame(_window(_mem(0.5)))) == []
    # no limit (cAdvisor writes 0): the working set alone says nothing
    assert host_memory.detect(build_frame(_window(_mem(0.99, limit=0)))) == []


# --- GPU hardware fields: a real dcgm-exporter scrape, and faults written into a copy of it --------
def _dcgm(tmp_path, edits: dict[str, str] | None = None) -> Window:
    src = os.path.join(AGENT_DATA, "dcgm_l4_cncf.txt")
    text = open(src, encoding="utf-8").read()
    for k, v in (edits or {}).items():
        lines = [ln if not ln.startswith(k + "{") else ln.rsplit(" ", 1)[0] + " " + v for ln in text.splitlines()]
        text = "\n".join(lines) + "\n"
    p = tmp_path / "scrape.txt"
    p.write_text(text)
    return read_recording(str(p))


def test_real_healthy_l4_scrape_parses_and_stays_quiet(tmp_path):
    f = build_frame(_dcgm(tmp_path))
    assert f.has_gpu("0", "gpu_row_remap_failed") and f.gpu_total["0"]["gpu_pcie_replays_total"] == 0
    assert gpu_fault.detect(f) == []  # fields read, nothing wrong: no finding, not "inconclusive"


def test_failed_row_remap_is_critical_and_names_the_action(tmp_path):
    f = build_frame(_dcgm(tmp_path, {"DCGM_FI_DEV_ROW_REMAP_FAILURE": "1"}))
    (fnd,) = gpu_fault.detect(f)
    assert fnd.severity is Severity.CRITICAL and "row remapping failed" in fnd.summary
    assert "RMA" in fnd.summary and "Not a tuning matter" in fnd.summary


def _xid_window(values, util=0.9):
    return _window({"DCGM_FI_DEV_XID_ERRORS": ({"gpu": "0", "UUID": "GPU-a"}, values),
                    "DCGM_FI_DEV_GPU_UTIL": ({"gpu": "0", "UUID": "GPU-a"}, [util * 100] * 25)})


def test_xid_catalogue_classes():
    (fnd,) = gpu_fault.detect(build_frame(_xid_window([0] * 10 + [79] * 15)))
    assert fnd.severity is Severity.CRITICAL and "Xid 79 (GPU has fallen off the bus)" in fnd.summary
    assert fnd.onset == T0 + 50.0
    # an application-class Xid (31: a program's page fault) is not a hardware fault
    assert gpu_fault.detect(build_frame(_xid_window([0] * 10 + [31] * 15))) == []
    # the gauge held one value all window: it may predate it (warning, said so)
    (fnd,) = gpu_fault.detect(build_frame(_xid_window([79] * 25)))
    assert fnd.severity is Severity.WARNING and "may predate" in fnd.summary


def test_pcie_link_judged_under_load_only():
    def w(util):
        lab = {"gpu": "0", "gpu_uuid": "GPU-a"}
        return _window({"fragscope_gpu_pcie_link_gen": (lab, [5.0 if u >= 0.5 else 1.0 for u in util]),
                        "fragscope_gpu_pcie_link_gen_max": (lab, [5.0] * 25),
                        "fragscope_gpu_utilization_ratio": (lab, util)})
    # a link that trains down at idle and back up under load: power management
    assert gpu_fault.detect(build_frame(w([0.0] * 12 + [0.9] * 13))) == []
    lab = {"gpu": "0", "gpu_uuid": "GPU-a"}
    down = _window({"fragscope_gpu_pcie_link_gen": (lab, [3.0] * 25), "fragscope_gpu_pcie_link_gen_max": (lab, [5.0] * 25),
                    "fragscope_gpu_utilization_ratio": (lab, [0.9] * 25)})
    (fnd,) = gpu_fault.detect(build_frame(down))
    assert "PCIe link at Gen3 of Gen5 while busy" in fnd.summary and fnd.severity is Severity.WARNING


def test_straggler_names_the_rank_and_skips_an_idle_one():
    def gpu(g, clock, util):
        lab = {"gpu": str(g), "gpu_uuid": f"GPU-{g}"}
        return {f"fragscope_gpu_sm_clock_hertz#{g}": (lab, [clock] * 25),
                f"fragscope_gpu_utilization_ratio#{g}": (lab, [util] * 25)}
    def win(*gs):
        series = {}
        for d in gs:
            series.update(d)
        ts = T0 + 5.0 * np.arange(25)
        cols = {SeriesKey(k.split("#")[0], make_labels(lab)): (ts, np.array(v, dtype=float))
                for k, (lab, v) in series.items()}
        return Window.from_columns(cols, source="test", types={})
    f = build_frame(win(gpu(0, 1.98e9, 0.95), gpu(1, 1.98e9, 0.96), gpu(2, 1.965e9, 0.95), gpu(3, 1.62e9, 0.97)))
    (fnd,) = straggler.detect(f)
    assert fnd.subject == {"gpu": "3"} and "GPU 3 is the slow rank" in fnd.summary and "18 %" in fnd.summary
    # a spare GPU idling at 345 MHz beside busy peers: not a straggler
    assert straggler.detect(build_frame(win(gpu(0, 1.98e9, 0.95), gpu(1, 1.98e9, 0.95), gpu(2, 3.45e8, 0.0)))) == []


# --- scenario families: the confounders stay quiet, the families found ------------------------------
@pytest.mark.parametrize("kind", ["rank-idle-by-design", "link-idle-downshift", "old-corrected-ecc",
                                  "page-cache-near-limit", "launch-bound"])
@pytest.mark.parametrize("variant", [{}, {"gpu_source": "dcgm", "seed": 1}])
def test_look_alikes_stay_quiet(kind, variant):
    w, truth = to_window(Scenario(kind=kind, **variant))
    got = {f.id for f in diagnose(w).findings}
    assert got == truth.diagnoses, [f.summary for f in diagnose(w).findings]
    assert not got & {"engine-cpu-starved", "engine-stalled", "rank-straggler", "gpu-hardware-fault",
                      "host-memory-pressure"}


@pytest.mark.parametrize("seed", range(5))
def test_every_fault_kind_of_the_family_is_found(seed):
    w, truth = to_window(Scenario(kind="gpu-hardware-fault", seed=seed, gpu_source="dcgm" if seed % 2 else "fragscope"))
    fnd = [f for f in diagnose(w).findings if f.id == "gpu-hardware-fault"]
    assert fnd and fnd[0].subject == {"gpu": "0"}
    assert fnd[0].playbook and fnd[0].playbook["actions"]


def test_stalled_family_kinds():
    for seed, kind in ((0, "collective"), (1, "host")):
        w, _ = to_window(Scenario(kind="engine-stalled", seed=seed))
        (fnd,) = [f for f in diagnose(w).findings if f.id == "engine-stalled"]
        assert fnd.context["kind"] == kind and fnd.severity is Severity.CRITICAL
        assert math.isclose(fnd.onset, T0 + 8 * 3600 - 20 * 60, abs_tol=60)


# --- NVML: the hardware fields from recorded real nvidia-smi captures --------------------------------
def _nvml_window(data: dict) -> Window:
    from fragscope.collectors.nvml import NvmlCollector, RecordedBackend
    c = NvmlCollector(backend=RecordedBackend(data))
    cols: dict = {}
    for k in range(4):
        r = c.collect(T0 + 5.0 * k)
        for s in r.samples:
            ts, vs = cols.setdefault(SeriesKey(s.name, s.labels), ([], []))
            ts.append(s.ts)
            vs.append(s.value)
    return Window.from_columns(cols, source="nvml", types={})


def test_nvml_hardware_fields_from_a_real_h100_capture():
    import json
    with open(os.path.join(os.path.dirname(__file__), "data", "collectors", "nvml_h100_idle_load.json")) as fh:
        data = json.load(fh)
    w = _nvml_window(data)
    f = build_frame(w)
    assert f.gpu["0"]["gpu_pcie_link_gen"][-1] == 5 and f.gpu["0"]["gpu_pcie_link_gen_max"][-1] == 5
    assert f.gpu["0"]["gpu_row_remap_pending"][-1] == 0 and f.gpu["0"]["gpu_row_remap_failed"][-1] == 0
    assert gpu_fault.detect(f) == []  # a healthy H100, idle then under gpu-burn
    # the same capture with a pending row remap written in (as NVML reports one after a DBE on A100+)
    for snap in data["timeline"]:
        snap["devices"][0]["remapped_rows"] = {"corrected": 0, "uncorrected": 1, "pending": True, "failed": False}
    (fnd,) = gpu_fault.detect(build_frame(_nvml_window(data)))
    assert "row remap is pending" in fnd.summary and fnd.severity is Severity.WARNING


def test_nvml_backend_without_hardware_calls_reports_them_unsupported():
    from fragscope.collectors.nvml import NvmlCollector, RecordedBackend
    from fragscope.model import Reason

    class Old(RecordedBackend):
        pcie_link = None  # an older backend without the call
    data = {"devices": [{"uuid": "GPU-x", "name": "NVIDIA A100", "utilization": {"gpu": 50, "memory": 10}}]}
    r = NvmlCollector(backend=Old(data)).collect(T0)
    miss = {m.name: m.reason for m in r.missing}
    assert miss["fragscope_gpu_pcie_link_gen"] is Reason.UNSUPPORTED
    assert miss["fragscope_gpu_row_remap_pending"] is Reason.NOT_COLLECTED  # not in the recording
    assert not any(s.name.startswith("fragscope_gpu_pcie_link") for s in r.samples)


def test_xid_45_line_from_a_real_bug_report_is_not_a_hardware_fault(tmp_path):
    """The one Xid line NVIDIA/DCGM#235 reports from dcgm-exporter 3.3.7-3.5.0 (driver 550.127.08): newer
    exporters label the gauge with err_code / err_msg; its value is the Xid's number (45 here, the issue
    shows the labels only). Xid 45, preemptive cleanup after earlier errors, is in the catalogue's
    application class: no hardware finding from it."""
    line = ('DCGM_FI_DEV_XID_ERRORS{err_code="45", err_msg="Preemptive cleanup, due to previous errors -- Most '
            'likely to see when running multiple cuda", job="dcgm-exporter"} 45\n')
    p = tmp_path / "scrape.txt"
    p.write_text("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" + line)
    f = build_frame(read_recording(str(p)))
    assert f.has_gpu("0", "gpu_xid_last")
    assert gpu_fault.detect(f) == []
    p.write_text("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" + line.replace('"45"', '"79"').replace("} 45", "} 79"))
    (fnd,) = gpu_fault.detect(build_frame(read_recording(str(p))))
    assert "Xid 79" in fnd.summary
