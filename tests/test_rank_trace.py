"""rank-straggler from several ranks' Kineto traces (`diagnose trace DIR`): real HTA traces, and one real
rank's trace edited to make a known straggler, checked against figures computed here from the raw JSON."""
from __future__ import annotations

import bisect
import gzip
import json
from pathlib import Path

import msgspec
import pytest

from fragscope.detectors.rank_trace import Config
from fragscope.ranks_pipeline import analyse_rank_files
from fragscope.timeline_model import TraceError

DATA = Path(__file__).parent / "data" / "trace"
HTA_R0 = DATA / "hta_timeline_sampled_rank0.json.gz"
HTA_R1 = DATA / "ranks" / "hta_trace_filter_sampled_rank1.json.gz"
NCCL_R0 = DATA / "ranks" / "hta_nccl_data_rank0.json.gz"


def _load(p: Path) -> dict:
    return json.loads(gzip.decompress(p.read_bytes()))


@pytest.fixture(scope="module")
def base() -> dict:
    return _load(NCCL_R0)


@pytest.fixture(scope="module")
def twin(base) -> dict:
    """Rank 0's trace presented as rank 1, made once (read only: the edits below copy what they change)."""
    return _twin(base, 1)


@pytest.fixture(scope="module")
def gz(base, twin) -> dict[str, bytes]:
    """The two unedited documents as written files' bytes, encoded once for the tests that write them."""
    return {"base": _gz(base), "twin": _gz(twin)}


@pytest.fixture(scope="module")
def stretched(base, twin, tmp_path_factory):
    """``make(delay_us)``: (rank 0 waiting ``delay_us`` in each all-reduce, rank 1 reaching each ``delay_us``
    late with its GPU busy, the directory holding both as rank0/rank1.json.gz), built once per delay for
    the figures test and the CLI test, which read the same job."""
    made = {}

    def make(delay_us: float):
        if delay_us not in made:
            r0, r1 = _waiting(base, delay_us), _late(twin, delay_us, busy=True)
            made[delay_us] = r0, r1, _write(tmp_path_factory.mktemp("stretched"),
                                            {"rank0.json.gz": r0, "rank1.json.gz": r1})
        return made[delay_us]

    return make


def _copy(doc: dict) -> dict:
    """A copy of a trace deep enough for the edits below (the document, its distributedInfo, each event and
    its args; nothing else is changed): ~20x faster than a JSON round trip on this 10 MB trace."""
    d = dict(doc)
    d["distributedInfo"] = dict(doc["distributedInfo"])
    d["traceEvents"] = [{**e, "args": dict(e["args"])} if isinstance(e.get("args"), dict) else dict(e)
                        for e in doc["traceEvents"]]
    return d


def _is_nccl(e: dict) -> bool:
    return e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel")


def _allreduces(doc: dict) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if _is_nccl(e)
                   and e.get("args", {}).get("Collective name") == "allreduce"), key=lambda e: e["ts"])


def _twin(doc: dict, rank: int) -> dict:
    """The same rank's trace presented as ``rank`` (its kernels on GPU ``rank``)."""
    d = _copy(doc)
    d["distributedInfo"]["rank"] = rank
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["device"] = rank
    return d


def _late(doc: dict, delay_us: float, busy: bool, which=lambda k: True) -> dict:
    """This rank reaches the selected all-reduces ``delay_us`` later. ``busy``: ``delay_us`` of time is inserted
    at the end of its last compute kernel before each (that kernel, and any kernel running across that instant,
    runs that much longer; everything after moves). Not busy: its GPU sits idle that long just before the
    all-reduce (everything from the all-reduce on moves)."""
    d = _copy(doc)
    ev = d["traceEvents"]
    ends = sorted(e["ts"] + e["dur"] for e in ev if e.get("cat") == "kernel" and not _is_nccl(e))
    cuts = []
    for k, ar in enumerate(_allreduces(d)):
        if which(k):  # busy: the latest compute kernel end at or before the all-reduce's start
            i = bisect.bisect_right(ends, ar["ts"])
            assert not busy or i, "no compute kernel ends before this all-reduce"
            cuts.append(ends[i - 1] if busy else ar["ts"])

    cuts.sort()

    def warp(t: float) -> float:
        return t + delay_us * bisect.bisect_right(cuts, t)  # cuts at or before t

    for e in ev:
        if isinstance(e.get("ts"), (int, float)):
            end = e["ts"] + e.get("dur", 0) if isinstance(e.get("dur"), (int, float)) else None
            e["ts"] = warp(e["ts"])
            if busy and end is not None:
                e["dur"] = warp(end) - e["ts"]
    return d


def _waiting(doc: dict, delay_us: float, which=lambda k: True) -> dict:
    """This rank waits ``delay_us`` longer inside the selected all-reduces (a peer is late)."""
    d = _copy(doc)
    ars = _allreduces(d)
    cuts = [ar["ts"] for k, ar in enumerate(ars) if which(k)]
    for k, ar in enumerate(ars):
        if which(k):
            ar["dur"] += delay_us
    for e in d["traceEvents"]:
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e["ts"] += delay_us * bisect.bisect_left(cuts, e["ts"])  # cuts strictly before ts
    return d


def _gz(doc: dict) -> bytes:
    """The document as a .json.gz file's bytes. msgspec writes the same JSON values as json.dumps (no NaN or
    infinity in these traces; compact separators) in 0.05 s against 0.58 s for this trace."""
    return gzip.compress(msgspec.json.encode(doc), compresslevel=1, mtime=0)


def _write(tmp: Path, docs: dict[str, dict | bytes]) -> Path:
    """Write each document (or a file's bytes from ``_gz``) under its name in ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, d in docs.items():
        (tmp / name).write_bytes(d if isinstance(d, bytes) else _gz(d))
    return tmp


def _raw_waits(docs: list[dict]) -> list[float]:
    """Per rank: total wait inside the all-reduces (duration minus the shortest rank's), seconds."""
    ars = [_allreduces(d) for d in docs]
    n = min(len(a) for a in ars)
    tot = [0.0] * len(docs)
    for k in range(n):
        m = min(a[k]["dur"] for a in ars)
        for r, a in enumerate(ars):
            tot[r] += (a[k]["dur"] - m) / 1e6
    return tot


def test_real_hta_pair_point_to_point_only_is_not_judged():
    """Two real ranks of one 128-rank job: their NCCL kernels are SendRecv without collective metadata
    (point-to-point or all-to-all): nothing to align, said as inconclusive, no finding."""
    a, f = analyse_rank_files([str(HTA_R0), str(HTA_R1)])
    assert f == []
    raw = [sum(1 for e in _load(p)["traceEvents"] if _is_nccl(e) and "SendRecv" in e["name"]) for p in (HTA_R0, HTA_R1)]
    assert raw == [10, 10]
    assert [r["point_to_point_kernels"] for r in a["ranks"]] == raw
    assert [r["rank"] for r in a["ranks"]] == [0, 1] and a["ranks"][0]["world_size"] == 128
    assert a["inconclusive"] and "20 point-to-point kernels" in a["inconclusive"][0]["reason"]


def test_identical_ranks_stay_quiet(tmp_path, gz):
    a, f = analyse_rank_files([str(_write(tmp_path, {"r0.json.gz": gz["base"], "r1.json.gz": gz["twin"]}))])
    assert f == [] and a["inconclusive"] == []
    assert len(a["collectives"]) == 21  # 15 all-reduces + 6 broadcasts in the raw trace
    assert all(r["wait_seconds"] == 0 for r in a["ranks"])


@pytest.mark.parametrize("delay_us", [5000.0, 20000.0])
def test_stretched_rank_is_named_with_its_figure(stretched, delay_us):
    r0, r1, job = stretched(delay_us)
    a, f = analyse_rank_files([str(job)])
    assert len(f) == 1
    fd = f[0]
    assert fd.id == "rank-straggler" and fd.subject == {"rank": "1", "gpu": "1"}
    assert fd.context["wait_per_collective_seconds"] == pytest.approx(delay_us / 1e6, rel=1e-3)
    # the waits against a pass over the raw JSON
    raw = _raw_waits([r0, r1])
    assert [r["wait_seconds"] for r in a["ranks"]] == pytest.approx(raw, rel=1e-6, abs=1e-6)
    assert raw[0] == pytest.approx(15 * delay_us / 1e6, rel=1e-6)
    # extra compute before each all-reduce: the stretch
    ctx = fd.context
    assert ctx["extra_compute_ratio"] == pytest.approx(1.0, abs=0.02)
    assert f"{delay_us / 1e3:.2f} ms for it at each of them" in fd.summary
    lost = raw[0] / a["ranks"][0]["span_seconds"]
    assert ctx["lost_ratio"] == pytest.approx(lost, rel=1e-6)
    assert (fd.severity.value == "critical") == (lost >= Config().critical_lost_share)
    assert fd.playbook and "Rank 1 (GPU 1)" in fd.playbook["actions"][0]
    assert "--enforce-eager" not in json.dumps(fd.playbook)


def test_small_delay_within_noise_stays_quiet(tmp_path, base, twin):
    """200 µs late at each all-reduce: the peer's wait is a small share of its collective time."""
    r0 = _waiting(base, 200.0)
    r1 = _late(twin, 200.0, busy=True)
    a, f = analyse_rank_files([str(_write(tmp_path, {"a.json.gz": r0, "b.json.gz": r1}))])
    assert f == [] and a["inconclusive"] == []
    raw = _raw_waits([r0, r1])
    assert raw[0] / a["ranks"][0]["collective_seconds"] < Config().wait_share


def test_late_rank_changing_each_collective_stays_quiet(tmp_path, base, twin):
    even, odd = (lambda k: k % 2 == 0), (lambda k: k % 2 == 1)
    r0 = _waiting(_late(base, 8000.0, busy=True, which=odd), 8000.0, which=even)
    r1 = _late(_waiting(twin, 8000.0, which=odd), 8000.0, busy=True, which=even)
    a, f = analyse_rank_files([str(_write(tmp_path, {"a.json.gz": r0, "b.json.gz": r1}))])
    assert f == []
    assert {r["rank"]: r["last_arrivals"] for r in a["ranks"]} == {0: 7, 1: 8}


def test_late_rank_with_idle_gpu_is_not_a_gpu_straggler(tmp_path, base, twin):
    """Rank 1 reaches every all-reduce 8 ms late with its GPU idle (its host is late: data loading):
    inconclusive with the reason, no rank-straggler finding."""
    r0 = _waiting(base, 8000.0)
    r1 = _late(twin, 8000.0, busy=False)
    a, f = analyse_rank_files([str(_write(tmp_path, {"a.json.gz": r0, "b.json.gz": r1}))])
    assert f == []
    (inc,) = a["inconclusive"]
    assert inc["subject"] == {"rank": "1"} and "GPU was idle" in inc["reason"]


def test_bad_inputs_one_line(tmp_path, gz):
    d = _write(tmp_path / "dup", {"a.json.gz": gz["base"], "b.json.gz": gz["base"]})
    with pytest.raises(TraceError, match="rank 0 again"):
        analyse_rank_files([str(d)])
    with pytest.raises(TraceError, match="two or more ranks"):
        analyse_rank_files([str(_write(tmp_path / "one", {"a.json.gz": gz["base"]}))])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no .json"):
        analyse_rank_files([str(tmp_path / "empty")])
    (tmp_path / "bad.json").write_text("{\"traceEvents\": [")
    with pytest.raises(TraceError, match="not JSON"):
        analyse_rank_files([str(tmp_path / "bad.json"), str(NCCL_R0)])


def test_mismatched_sizes_inconclusive(tmp_path, gz, twin):
    r1 = _copy(twin)
    for e in _allreduces(r1)[:3]:
        e["args"]["In msg nelems"] += 1
    a, f = analyse_rank_files([str(_write(tmp_path, {"a.json.gz": gz["base"], "b.json.gz": r1}))])
    assert f == [] and "differ in message size" in a["inconclusive"][0]["reason"]


def test_cli_directory_and_files(tmp_path, stretched):
    from cli_helpers import cli

    d = stretched(20000.0)[2]
    r = cli("trace", d, "--format", "json", "--fail-on", "warning")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert [f["subject"] for f in out["findings"]] == [{"rank": "1", "gpu": "1"}]
    assert out["ranks"][1]["last_arrivals"] == 15
    r = cli("trace", d / "rank0.json.gz", d / "rank1.json.gz")
    assert r.returncode in (0, 1) and "rank-straggler" in r.stdout and "rank1.json.gz" in r.stdout
    r = cli("trace", HTA_R0, HTA_R1, "--fail-on", "info")
    assert r.returncode == 0 and "point-to-point" in r.stdout
    for args in ((d, "--html", tmp_path / "x.html"), (d / "rank0.json.gz", tmp_path / "missing.json")):
        r = cli("trace", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
