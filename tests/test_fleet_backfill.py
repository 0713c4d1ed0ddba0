"""Recorded incidents backfilled into a real Prometheus with ``promtool tsdb create-blocks-from
openmetrics``: ``diagnose --prometheus`` fetches exactly the recorded samples and reaches the same
diagnosis as ``diagnose FILE`` for every pod; fleet outliers; range splitting; the server's own 422.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from test_fleet_harness import PROMTOOL, Prometheus, needs_prometheus

pytestmark = [needs_prometheus, pytest.mark.e2e]  # a real Prometheus backfilled: heavy, run by .ci/run

NS = "llm"
# Four replicas of one model, 3 h at 15 s: one develops the seeds' fragmentation incident.
PODS = {
    "vllm-0": dict(kind="healthy", seed=11),
    "vllm-1": dict(kind="healthy", seed=12),
    "vllm-2": dict(kind="allocator-fragmentation", seed=13),
    "vllm-3": dict(kind="healthy", seed=14),
}
DURATION = 3 * 3600


def write_pod_recording(path: str, pod: str, **scenario) -> object:
    """A scenario recording (OpenMetrics, seconds, # EOF) whose series carry namespace/pod labels."""
    from fragscope.model import SeriesKey, make_labels
    from fragscope.scenarios import Scenario, generate
    from fragscope.scenarios.writers import write_columns

    cols, types, truth = generate(Scenario(duration_s=DURATION, **scenario))
    labelled = {SeriesKey(k.name, make_labels(dict(k.labels, namespace=NS, pod=pod))): v for k, v in cols.items()}
    write_columns(labelled, types, path, openmetrics=True)
    return truth


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    d = tmp_path_factory.mktemp("backfill")
    data = d / "tsdb"
    files, truths = {}, {}
    for pod, spec in PODS.items():
        files[pod] = str(d / f"{pod}.om")
        truths[pod] = write_pod_recording(files[pod], pod, **spec)
        r = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", files[pod], str(data)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    blocks = str(d / "blocks-copy")
    shutil.copytree(data, blocks)  # for the second server below (a TSDB dir has one owner)
    prom = Prometheus("", data_dir=str(data))
    try:
        yield {"prom": prom, "files": files, "truths": truths, "dir": d, "blocks": blocks}
    finally:
        prom.close()


def _window(files):
    from fragscope.collectors.exposition import read_recording

    w = read_recording(files["vllm-0"])
    return w.start, w.end


def _run(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; sys.argv[0] = 'diagnose'; from fragscope.cli import diagnose_main; diagnose_main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def _key(report: dict) -> tuple:
    return ([(f["id"], f["severity"], f["confidence"], f["onset"], json.dumps(f["subject"], sort_keys=True))
             for f in report["findings"]],
            sorted(i["id"] for i in report["inconclusive"]))


def test_fetch_returns_exactly_the_recorded_samples(backfilled):
    from fragscope.collectors.exposition import read_recording
    from fragscope.collectors.prometheus import PromConfig, PrometheusClient, fetch, signal_batches
    from fragscope.fleet import group_targets

    start, end = _window(backfilled["files"])
    client = PrometheusClient(PromConfig(backfilled["prom"].url))
    fr = fetch(client, start, end)
    assert fr.mode == "raw" and fr.queries == len(signal_batches())
    per_pod = group_targets(fr.cols)
    wanted = {n for b in signal_batches() for n in b.names}
    for pod, path in backfilled["files"].items():
        rec = read_recording(path)
        got = per_pod[next(t for t in per_pod if t.name == pod)]
        exp = {k: s for k, s in rec.series.items() if k.name in wanted}
        assert set(got) == set(exp), (pod, set(exp) ^ set(got))
        for k, s in exp.items():
            ts, vs = got[k]
            assert np.array_equal(ts, s.ts) and np.array_equal(vs, s.values), (pod, str(k))


def test_same_diagnosis_as_diagnose_file_for_every_pod(backfilled):
    start, end = _window(backfilled["files"])
    r = _run("--prometheus", backfilled["prom"].url, "--start", repr(start), "--end", repr(end),
             "--format", "json", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    fleet = {t["target"]: t for t in json.loads(r.stdout)["targets"]}
    assert set(fleet) == {f"{NS}/{p}" for p in PODS}
    found = set()
    for pod, path in backfilled["files"].items():
        f = _run(path, "--format", "json", "--fail-on", "never")
        assert f.returncode == 0, f.stderr
        from_file = json.loads(f.stdout)
        from_prom = fleet[f"{NS}/{pod}"]["report"]
        assert _key(from_prom) == _key(from_file), pod
        found |= {x["id"] for x in from_file["findings"]}
    assert "allocator-fragmentation" in {x["id"] for x in fleet[f"{NS}/vllm-2"]["report"]["findings"]}
    assert found, "no finding at all: the comparison would be vacuous"


def test_fleet_outliers_point_at_the_sick_replica(backfilled):
    start, end = _window(backfilled["files"])
    r = _run("--prometheus", backfilled["prom"].url, "--start", repr(start), "--end", repr(end),
             "--format", "json", "--fail-on", "never", "--selector", f'{{namespace="{NS}"}}')
    d = json.loads(r.stdout)
    outliers = {(o["target"], o["metric"], o["direction"]) for o in d["outliers"]}
    assert (f"{NS}/vllm-2", "fragmentation_ratio", "high") in outliers, d["outliers"]
    assert {o[0] for o in outliers} == {f"{NS}/vllm-2"}, d["outliers"]
    assert d["targets"][0]["target"] == f"{NS}/vllm-2"  # worst first
    human = _run("--prometheus", backfilled["prom"].url, "--start", repr(start), "--end", repr(end),
                 "--fail-on", "never")
    assert "Outliers against peers" in human.stdout and f"{NS}/vllm-2: fragmentation_ratio" in human.stdout


def test_exit_code_follows_fail_on(backfilled):
    start, end = _window(backfilled["files"])
    base = ["--prometheus", backfilled["prom"].url, "--start", repr(start), "--end", repr(end), "--format", "json"]
    worst = json.loads(_run(*base, "--fail-on", "never").stdout)["targets"][0]["top_finding"]
    assert worst is not None
    assert _run(*base, "--fail-on", worst["severity"]).returncode == 1
    assert _run(*base, "--fail-on", "never").returncode == 0


def test_resampled_step_mode(backfilled):
    """--step uses query_range: same series and points at the recording's 15 s grid."""
    from fragscope.collectors.prometheus import PromConfig, PrometheusClient, fetch

    start, end = _window(backfilled["files"])
    client = PrometheusClient(PromConfig(backfilled["prom"].url))
    raw = fetch(client, start, end, selector='{pod="vllm-2"}')
    res = fetch(client, start, end, selector='{pod="vllm-2"}', step=15)
    assert res.mode == "resampled" and set(res.cols) == set(raw.cols)
    k = next(k for k in raw.cols if k.name == "vllm:num_requests_running")
    assert np.array_equal(res.cols[k][1], raw.cols[k][1])


def test_query_range_is_split_below_11000_points(backfilled):
    from fragscope.collectors.prometheus import PromConfig, PrometheusClient, finish_columns, parse_matrix

    start, _ = _window(backfilled["files"])
    client = PrometheusClient(PromConfig(backfilled["prom"].url))
    # 12,001 steps: Prometheus alone refuses this in one request
    items = client.query_range('vllm:num_requests_running{pod="vllm-0"}', start, start + 6000, 0.5)
    assert client.queries == 2
    (ts, vs), = finish_columns(parse_matrix(items)).values()
    assert ts.size == 12001 and np.all(np.diff(ts) == 0.5)


def test_server_refusal_is_one_line(backfilled):
    """A real 422 from Prometheus (query.max-samples) ends as one line and exit code 2."""
    prom = Prometheus("", data_dir=backfilled["blocks"], extra_args=["--query.max-samples=500"])
    try:
        start, end = _window(backfilled["files"])
        r = _run("--prometheus", prom.url, "--start", repr(start), "--end", repr(end))
        assert r.returncode == 2, (r.returncode, r.stderr)
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and "422" in err and "too many samples" in err, err
    finally:
        prom.close()


# ---------------------------------------------------------------------------------------------
# Triage (issue 15): level checks in PromQL, deep fetch only for the flagged pods and a peer sample
def _recorded_ratio(path: str) -> np.ndarray:
    """(reserved - allocated) / reserved per timestamp of a recording, summed over processes."""
    from fragscope.collectors.exposition import read_recording

    w = read_recording(path)
    res = sum(s.values for s in w.select("fragscope_torch_reserved_bytes"))
    alloc = sum(s.values for s in w.select("fragscope_torch_allocated_bytes"))
    return (res - alloc) / res


def _triage_run(url: str, files: dict, *extra: str) -> dict:
    start, end = _window(files)
    r = _run("--prometheus", url, "--start", repr(start), "--end", repr(end), "--format", "json",
             "--fail-on", "never", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_triage_deep_fetches_only_the_flagged_pod_and_one_peer(backfilled):
    d = _triage_run(backfilled["prom"].url, backfilled["files"], "--triage", "queries", "--peers", "1")
    tri = d["fleet"]["triage"]
    assert tri["mode"] == "queries" and tri["fleet_targets"] == 4
    assert tri["flagged"] == 1 and tri["peers_sampled"] == 1 and tri["examined"] == 2 and tri["not_examined"] == 2
    by = {t["target"]: t for t in d["targets"]}
    sick = by[f"{NS}/vllm-2"]
    assert sick["status"] == "finding" and sick["triage"]["examined"] == "flagged"
    (flag,) = sick["triage"]["checks"]
    assert flag["id"] == "allocator-fragmentation" and flag["gpu"] == "0" and flag["minutes"] > 0
    # the triage value is the worst 5-minute mean of the unusable share: at least the 25 % threshold
    # and no more than the worst recorded sample (computed here from the recording itself)
    worst = float(np.nanmax(_recorded_ratio(backfilled["files"]["vllm-2"])))
    assert 0.25 <= flag["value"] <= worst + 1e-3 and flag["value"] > worst - 0.03, (flag, worst)
    clear = [t for t in d["targets"] if t["status"] == "triage-clear"]
    assert len(clear) == 2 and all(t["report"] is None and t["series"] is None and not t["triage"]["flagged"]
                                   for t in clear)
    # the deep diagnosis of the flagged pod equals the full download's
    full = _triage_run(backfilled["prom"].url, backfilled["files"], "--triage", "off")
    assert full["fleet"]["triage"] == {"mode": "off"}
    full_sick = next(t for t in full["targets"] if t["target"] == f"{NS}/vllm-2")
    assert _key(sick["report"]) == _key(full_sick["report"])
    # cost: the triage's requests plus one per examined pod and its exported_ variant
    assert d["fleet"]["queries"] == tri["queries"] + 2 * tri["examined"]
    assert d["fleet"]["series"] < full["fleet"]["series"]
    # outliers still compare every pod (server-side figures), and name the sick one
    assert {(o["target"], o["metric"]) for o in d["outliers"]} >= {(f"{NS}/vllm-2", "fragmentation_ratio")}


def test_triage_rules_mode_is_one_query(backfilled, tmp_path):
    """The triage rules backfilled with promtool: --triage rules answers with one instant query (and
    two that check the recorded series cover the window), flagging the same pod as the queries."""
    from test_fleet_harness import ROOT

    start, end = _window(backfilled["files"])
    rules = f"{ROOT}/dashboards/rules/fragscope-triage.yml"
    out = tmp_path / "rule-blocks"
    r = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "rules", "--start", str(int(start)),
                        "--end", str(int(end) + 60), "--url", backfilled["prom"].url, "--output-dir", str(out),
                        "--quiet", rules], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = tmp_path / "tsdb"
    shutil.copytree(backfilled["blocks"], data)
    for blk in out.iterdir():
        shutil.copytree(blk, data / blk.name)
    prom = Prometheus("", data_dir=str(data))
    try:
        d = _triage_run(prom.url, backfilled["files"], "--triage", "rules", "--peers", "1")
        tri = d["fleet"]["triage"]
        assert tri["mode"] == "rules" and tri["queries"] == 3, tri
        flagged = {t["target"]: [c["id"] for c in t["triage"]["checks"]] for t in d["targets"] if t["triage"]["flagged"]}
        assert flagged == {f"{NS}/vllm-2": ["allocator-fragmentation"]}
        assert _triage_run(prom.url, backfilled["files"], "--peers", "1")["fleet"]["triage"]["mode"] == "rules"  # auto finds them
    finally:
        prom.close()
    # without the recorded series: auto runs the queries, rules is a one-line error
    assert _triage_run(backfilled["prom"].url, backfilled["files"], "--peers", "1")["fleet"]["triage"]["mode"] == "queries"
    e = _run("--prometheus", backfilled["prom"].url, "--start", repr(start), "--end", repr(end), "--triage", "rules")
    assert e.returncode == 2 and len(e.stderr.strip().splitlines()) == 1 and "fragscope-triage.yml" in e.stderr, e.stderr
