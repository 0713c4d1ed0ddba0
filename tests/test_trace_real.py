"""`diagnose trace` on the shapes real files take (issue 11): ROCm traces, GPU-side ProfilerStep copies,
training vs serving workloads, exports without kernels, unified-memory migrations, a mostly idle GPU,
exact epoch-µs timestamps. Each figure is checked against a computation made here from the raw file."""
from __future__ import annotations

import gzip
import json
import sqlite3
import statistics
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from fragscope.cli import diagnose_group
from fragscope.collectors.kineto import read_kineto
from fragscope.collectors.nsys import read_nsys
from fragscope.detectors.timeline import analyse, judge
from fragscope.timeline_model import LAUNCH, TraceError, classify_api
from fragscope.trace_pipeline import analyse_trace_file

DATA = Path(__file__).parent / "data" / "trace"
MI250 = DATA / "hta_mi250_minitoy_train_rocm6_2.json.gz"
STEP_TRAIN = DATA / "hta_step_based_gpu_user_annotation.json.gz"
OLD_CATS = DATA / "hta_inference_rank1_runtime_kernel_cats.json.gz"
WB2 = DATA / "nsys_weatherbench2_no_kernels.sqlite.gz"
HIP_LAUNCHES = {"hipLaunchKernel", "hipExtModuleLaunchKernel"}


def _events(path: Path) -> list[dict]:
    # Decimal: the file's text as written (Kineto prints ns digits), independent of the reader's parsing
    return json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]


def _ns(us) -> int:
    return int(Decimal(us) * 1000)


# --------------------------------------------------------------------------------------------
# ROCm (MI250, PyTorch on ROCm 6.2, from HTA's tests): HIP launches linked, GPU-side step copies not counted
def test_rocm_trace_links_hip_launches_and_counts_cpu_steps_only():
    ev = _events(MI250)
    cpu_steps = [e for e in ev if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")
                 and e.get("cat") == "user_annotation"]
    all_steps = [e for e in ev if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")]
    assert (len(cpu_steps), len(all_steps)) == (2, 3)  # hand-checked: #1, #2 on the CPU; #1 again on the GPU

    tl = read_kineto(str(MI250))
    assert len(tl.steps) == len(cpu_steps)
    a = analyse(tl)
    assert a["selection"]["profiler_steps"] == 2

    # independent: every HIP launch, joined to its GPU op by args.correlation; HTA's rule keeps the ops
    # launched before the last step starts; launch delay = op start - launch end, clipped at 0
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"
                and e.get("name") in HIP_LAUNCHES}
    assert len(launches) == 14  # 12 hipLaunchKernel + 2 hipExtModuleLaunchKernel (hand-checked)
    cutoff = max(_ns(e["ts"]) for e in cpu_steps)
    ops = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")]
    kept = [o for o in ops if o["args"].get("correlation") in launches
            and _ns(launches[o["args"]["correlation"]]["ts"]) < cutoff]
    delays = [max(0, _ns(o["ts"]) - _ns(launches[o["args"]["correlation"]]["ts"])
                  - _ns(launches[o["args"]["correlation"]]["dur"])) for o in kept]
    d = a["devices"][0]
    assert d["device"] == 2
    assert d["launches_linked"] == len(kept) == 14
    assert d["launch_delay_seconds"]["p50"] == pytest.approx(statistics.median(delays) / 1e9, abs=1e-12)
    host = a["host"]
    assert host["launch_calls"] == 14 and host["driver_launch_calls"] == 2  # hipExtModuleLaunchKernel
    # hipDeviceSynchronize + hipMemcpyWithStream (blocking) are synchronizing calls; counted from the first
    # analysed launch to the last analysed op's end
    assert classify_api("hipMemcpyWithStream") != LAUNCH
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    analysed = [o for o in ops if _ns(calls[o["args"]["correlation"]]["ts"]) < cutoff]  # copies too
    h0 = min(min(_ns(calls[o["args"]["correlation"]]["ts"]) for o in analysed), min(_ns(o["ts"]) for o in analysed))
    h1 = max(_ns(o["ts"]) + _ns(o["dur"]) for o in analysed)
    syncs = [e for e in ev if e.get("cat") == "cuda_runtime" and e.get("name") in
             ("hipDeviceSynchronize", "hipMemcpyWithStream")]
    assert len(syncs) == 3
    assert host["sync_api_calls"] == sum(1 for e in syncs if h0 <= _ns(e["ts"]) <= h1) == 2


def test_rocm_training_trace_gets_training_advice():
    a, findings = analyse_trace_file(str(MI250))
    assert a["workload"]["kind"] == "training"
    assert "MseLossBackward0" in a["workload"]["examples"]["backward_ops"]
    assert a["workload"]["markers"]["optimizer_steps"] == 1  # the CPU annotation, not its GPU copy
    lb = [f for f in findings if f.id == "launch-bound"]
    assert lb, "the toy step is 98 % idle with every gap a late launch"
    pb = json.dumps(lb[0].playbook)
    assert "enforce-eager" not in pb and "max_num_seqs" not in pb  # no serving-engine flag for a training job
    assert "torch.compile" in pb and "training step" in lb[0].summary


def test_cli_json_carries_workload_and_training_playbook():
    r = CliRunner().invoke(diagnose_group, ["trace", str(MI250), "--format", "json", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["workload"]["kind"] == "training" and out["unified_memory"] is None  # Kineto cannot record it
    (lb,) = [f for f in out["findings"] if f["id"] == "launch-bound"]
    assert lb["playbook"]["title"].endswith("(training step)")
    assert all("enforce-eager" not in a for a in lb["playbook"]["actions"])


def test_cuda_training_trace_with_gpu_annotations():
    """A CUDA SGD job (HTA): optimizer annotations also copied to the GPU row; only the CPU ones count."""
    ev = _events(STEP_TRAIN)
    cpu_opt = [e for e in ev if e.get("cat") == "user_annotation" and str(e.get("name")).startswith("Optimizer.")]
    gpu_opt = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    assert len(cpu_opt) == len(gpu_opt) == 10  # step + zero_grad, 5 iterations, each copied to the GPU row
    a, findings = analyse_trace_file(str(STEP_TRAIN))
    assert a["workload"]["kind"] == "training"
    assert a["workload"]["markers"]["optimizer_steps"] == len(cpu_opt)
    # GPU copies of annotations are not GPU ops either: ops = kernels + memcpys
    assert a["selection"]["ops_total"] == sum(1 for e in ev if e.get("cat") in ("kernel", "gpu_memcpy"))
    for f in findings:
        assert "enforce-eager" not in json.dumps(f.playbook)


def test_serving_trace_keeps_the_serving_playbook(tmp_path):
    """vLLM's own ops mark a serving engine: the standard launch-bound playbook (CUDA graphs via
    --enforce-eager) stays."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "vllm::unified_attention_with_output", "pid": 1, "tid": 1,
           "ts": 1.0, "dur": 1.0, "args": {}}]
    for i in range(40):
        t = 100.0 + i * 50
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                   "dur": 5.0, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 6, "dur": 2.0,
                   "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    p = tmp_path / "serve.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    a, findings = analyse_trace_file(str(p))
    assert a["workload"]["kind"] == "serving"
    (lb,) = [f for f in findings if f.id == "launch-bound"]
    assert lb.playbook is None  # left to the registry's standard playbook (attach_playbooks)
    r = CliRunner().invoke(diagnose_group, ["trace", str(p), "--format", "json", "--fail-on", "never"])
    (f,) = [f for f in json.loads(r.output)["findings"] if f["id"] == "launch-bound"]
    assert any("enforce-eager" in x for x in f["playbook"]["actions"])


def test_old_runtime_kernel_categories_few_ops_inconclusive():
    """HTA's inference_rank_1 (Runtime / Kernel categories, 4 kernels): read, and judged inconclusive."""
    ev = _events(OLD_CATS)
    a, findings = analyse_trace_file(str(OLD_CATS))
    assert a["selection"]["ops_total"] == sum(1 for e in ev if e.get("cat") == "Kernel") == 4
    assert findings == [] and {i["id"] for i in a["inconclusive"]} == {"launch-bound", "sync-bound"}


# --------------------------------------------------------------------------------------------
def test_epoch_microseconds_parsed_exactly(tmp_path):
    """Values 0.251 µs apart at epoch size: float64 keeps 0.25 µs steps there (1.7e15 + .123 -> .125)."""
    base = 1_700_000_000_000_000
    text = ('{"traceEvents": ['
            f'{{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": {base}.123, "dur": 0.010, '
            '"args": {"device": 0, "stream": 7}},'
            f'{{"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": {base}.374, "dur": 1.001, '
            '"args": {"device": 0, "stream": 7}}]}')
    assert float(f"{base}.374") - float(f"{base}.123") == 0.25  # the rounding this test would catch
    p = tmp_path / "epoch.json"
    p.write_text(text)
    tl = read_kineto(str(p))
    assert tl.op_start.tolist() == [base * 1000 + 123, base * 1000 + 374]
    assert tl.op_end.tolist() == [base * 1000 + 133, base * 1000 + 1375]
    assert tl.epoch_offset_ns == 0


# --------------------------------------------------------------------------------------------
def _nsys_no_kernels(tmp_path: Path) -> Path:
    p = tmp_path / "wb2.sqlite"
    p.write_bytes(gzip.decompress(WB2.read_bytes()))
    return p


def test_nsys_export_without_kernel_table_refused_for_what_it_is(tmp_path):
    """WeatherBench2's report (Nsight Systems 2025.5.1, CUDA API rows and one memset, no kernels)."""
    p = _nsys_no_kernels(tmp_path)
    c = sqlite3.connect(p)
    version = dict(c.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())["EXPORT_PRODUCT_VERSION"]
    n_rt = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    c.close()
    assert version == "2025.5.1.121" and n_rt == 23
    with pytest.raises(TraceError) as ei:
        read_nsys(str(p))
    msg = str(ei.value)
    assert "no CUDA kernel activity in this export" in msg and version in msg and f"{n_rt} runtime rows" in msg
    assert "nsys profile --trace=cuda,nvtx" in msg and "not an Nsight Systems export" not in msg
    r = CliRunner().invoke(diagnose_group, ["trace", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1


def test_plain_sqlite_still_not_an_nsys_export(tmp_path):
    p = tmp_path / "other.sqlite"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE t (x INTEGER)")
    c.commit()
    c.close()
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        read_nsys(str(p))


# --------------------------------------------------------------------------------------------
# Unified memory: synthetic rows in the real schema (no public export with migrations and a licence found)
def _gpid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


def make_um_export(path: Path, n_kernels: int = 40, migrations: list[tuple] = ()) -> Path:
    """Kernels back to back (busy GPU) plus unified-memory rows (start, end, copyKind, bytes, cause)."""
    c = sqlite3.connect(path)
    c.executescript((DATA / "nsys_schema.sql").read_text())
    c.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (7, "gemm")])
    c.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2025.5.2.266')")
    gp = _gpid(4242)
    for i in range(n_kernels):
        t = 1_000_000 + i * 10_000
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                  "nameId, returnValue) VALUES (?,?,1,?,?,1,0)", (t - 3_000, t - 1_000, gp | 1, i + 1))
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
                  "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, "
                  "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
                  "localMemoryTotal, gridId) VALUES (?,?,0,1,7,?,?,7,7,32,1,1,1,1,1,1,0,0,0,0,0)",
                  (t, t + 9_500, i + 1, gp))
    for s, e, kind, nbytes, cause in migrations:
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
                  "correlationId, globalPid, bytes, copyKind, srcKind, dstKind, migrationCause) "
                  "VALUES (?,?,0,1,0,0,?,?,?,4,4,?)", (s, e, gp, nbytes, kind, cause))
    c.commit()
    c.close()
    return path


@pytest.mark.parametrize("reader", ["stdlib", "connectorx"])
def test_unified_memory_migrations_are_not_gpu_work(tmp_path, reader):
    if reader == "connectorx" and __import__("importlib").util.find_spec("connectorx") is None:
        pytest.skip("connectorx not installed")
    # 20 page-fault migrations each way, 4 µs each, 64 KiB, interleaved with the kernels
    mig = []
    for i in range(20):
        t = 1_000_000 + i * 20_000 + 9_600
        mig.append((t, t + 4_000, 11, 65536, 2))
        mig.append((t + 10_000, t + 14_000, 12, 65536, 2))
    mig.append((500_000, 510_000, 11, 1 << 20, 1))  # a user prefetch: not thrashing
    tl = read_nsys(str(make_um_export(tmp_path / "um.sqlite", migrations=mig)), reader=reader)
    assert tl.n_ops == 40 and tl.um_start.size == 41  # migrations kept apart from GPU ops
    a = analyse(tl)
    d = a["devices"][0]
    # independent: 40 kernels of 9.5 µs every 10 µs -> busy 40 * 9.5 µs over 39 * 10 + 9.5 µs
    assert d["busy_seconds"] == pytest.approx(380e-6, abs=1e-12) and d["ops"]["memcpy"] == 0
    assert d["span_seconds"] == pytest.approx(399.5e-6, abs=1e-12)
    um = a["unified_memory"]
    assert (um["migrations"], um["demand_migrations"], um["demand_htod"], um["demand_dtoh"]) == (41, 40, 20, 20)
    assert um["bytes"] == 40 * 65536 + (1 << 20)
    assert um["seconds"] == pytest.approx((40 * 4_000 + 10_000) / 1e9)
    assert um["by_cause"] == {"page_fault": 40, "user_prefetch": 1}
    findings, _ = judge(a)
    (f,) = [f for f in findings if f.id == "unified-memory-thrashing"]
    window = (max(1_000_000 + 39 * 10_000 + 9_500, 1_000_000 + 19 * 20_000 + 9_600 + 14_000) - 500_000) / 1e9
    assert f.evidence[1].observed == pytest.approx(um["seconds"] / window)
    assert window == pytest.approx(903.6e-6) and 0.1 <= um["seconds"] / window < 0.25  # 19 % of the window
    assert f.severity.value == "warning" and f.confidence == pytest.approx(0.9)  # both directions, >= 10 %


def test_unified_memory_only_export_still_judged(tmp_path):
    """Only migrations, no kernels: not 'no GPU activity' -- the thrashing is the finding."""
    mig = [(i * 10_000, i * 10_000 + 8_000, 11 + i % 2, 4096, 2) for i in range(30)]
    p = make_um_export(tmp_path / "um_only.sqlite", n_kernels=0, migrations=mig)
    a, findings = analyse_trace_file(str(p))
    assert a["devices"] == [] and a["unified_memory"]["migrations"] == 30
    (f,) = findings
    assert f.id == "unified-memory-thrashing" and f.severity.value == "critical"  # 80 % of the window, both ways
    assert f.playbook["id"] == "unified-memory-thrashing" and "cudaMemPrefetchAsync" in json.dumps(f.playbook)


def test_few_migrations_no_finding(tmp_path):
    mig = [(2_000_000 + i * 1000, 2_000_000 + i * 1000 + 500, 11, 4096, 2) for i in range(3)]
    a, findings = analyse_trace_file(str(make_um_export(tmp_path / "few.sqlite", migrations=mig)))
    assert a["unified_memory"]["demand_migrations"] == 3
    assert not [f for f in findings if f.id == "unified-memory-thrashing"]
    assert any("unified-memory page migration" in n for n in a["notes"])


# --------------------------------------------------------------------------------------------
def test_mostly_idle_gpu_without_a_mechanism_is_inconclusive(tmp_path):
    """90 % idle, every launch early (kernels queued), no syncs: no finding, but never a silent healthy."""
    ev = []
    for i in range(30):
        t = 1000.0 + i * 100
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": t - 500, "dur": 2.0, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t, "dur": 10.0,
                   "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    p = tmp_path / "idle.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    a, findings = analyse_trace_file(str(p))
    d = a["devices"][0]
    assert d["idle_ratio"] == pytest.approx(29 * 90 / (29 * 100 + 10))
    assert findings == []
    (inc,) = a["inconclusive"]
    assert inc["id"] == "launch-bound" and "idle 90 %" in inc["reason"]
    r = CliRunner().invoke(diagnose_group, ["trace", str(p)])
    assert r.exit_code == 0 and "No finding." in r.output and "not a clean bill of health" in r.output


def test_half_idle_training_rank_is_inconclusive_not_healthy():
    """HTA's sampled rank 0 (HTA 0.5.0: idle 53.56 %, median launch delay 10,246 µs): the gaps follow late
    launches, but a 10 ms launch delay means work was queued -- launch-bound is dropped, and the idle GPU
    gets an inconclusive entry saying why, not a bare "No finding"."""
    a, findings = analyse_trace_file(str(DATA / "hta_timeline_sampled_rank0.json.gz"))
    assert findings == [] and a["workload"]["kind"] == "training"
    assert a["devices"][0]["idle_ratio"] == pytest.approx(0.5356, abs=1e-4)
    (inc,) = a["inconclusive"]
    assert inc["id"] == "launch-bound" and "idle 54 %" in inc["reason"] and "10.2 ms" in inc["reason"]


def test_no_gpu_activity_names_what_the_trace_holds(tmp_path):
    """As in HTA's MTIA and CUPTI-profiler-range traces: no CUDA/ROCm GPU rows -- say what is there."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1}] * 3 + \
        [{"ph": "X", "cat": "mtia_ccp_events", "name": "k", "ts": 2, "dur": 1}] * 2
    p = tmp_path / "mtia.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(TraceError) as ei:
        read_kineto(str(p))
    msg = str(ei.value)
    assert "no GPU activity" in msg and "cpu_op 3, mtia_ccp_events 2" in msg and "MTIA trace" in msg


def test_flow_link_matches_the_instant_not_the_text(tmp_path):
    """An ac2g flow end written "….5" and its kernel written "….500" (epoch µs): the same instant."""
    base = 1_700_000_000_000_000
    text = ('{"traceEvents": ['
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": {base}.25, '
            '"dur": 2.0, "args": {}},'
            f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {base + 3}.500, "dur": 1.0, '
            '"args": {"device": 0, "stream": 7}},'
            f'{{"ph": "s", "cat": "ac2g", "id": 9, "pid": 1, "tid": 2, "ts": {base}.250}},'
            f'{{"ph": "f", "cat": "ac2g", "id": 9, "pid": 0, "tid": 7, "ts": {base + 3}.5, "bp": "e"}}]}}')
    p = tmp_path / "flow.json"
    p.write_text(text)
    tl = read_kineto(str(p))
    assert tl.op_launch.tolist() == [0]
    assert int(tl.op_start[0] - tl.call_end[0]) == 1250  # 3.5 - (0.25 + 2.0) µs, exactly


def test_base_time_gives_the_wall_clock():
    """Newer Kineto writes ts on its own clock and baseTimeNanoseconds beside: unix ns = ts * 1000 + base
    (HTA's trace_event_timestamp_to_unixtime_ns). The MI250 trace: first GPU op at base + its ts."""
    doc = json.loads(gzip.decompress(MI250.read_bytes()), parse_float=Decimal)
    base = doc["baseTimeNanoseconds"]
    first = min(_ns(e["ts"]) for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy"))
    a = analyse(read_kineto(str(MI250)))
    assert a["window"]["start"] == pytest.approx((first + base) / 1e9, abs=1e-6)
    assert a["window"]["start"] > 1.7e9  # 2024-2025, not "?"


def test_gzipped_nsys_export_gets_a_hint():
    line = CliRunner().invoke(diagnose_group, ["trace", str(WB2)]).output.strip()
    assert "compressed SQLite file" in line and "gunzip" in line and len(line.splitlines()) == 1
