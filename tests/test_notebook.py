"""fragscope.notebook: results as DataFrames, checked against the report and frame they come from."""
from __future__ import annotations

import os

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

import fragscope.notebook as fs  # noqa: E402

EX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def test_load_recording_tables_match_the_report():
    res = fs.load(os.path.join(EX, "fragmentation-incident.om.gz"))
    df = res.findings
    assert list(df["id"]) == [f.id for f in res.report.findings]
    top = res.report.findings[0]
    row = df.iloc[0]
    assert row["severity"] == top.severity.value and row["confidence"] == top.confidence
    assert row["onset"] == pd.Timestamp(top.onset, unit="s", tz="UTC")
    assert row["actions"] == top.playbook["actions"]
    ev = res.evidence
    assert len(ev) == sum(len(f.evidence) for f in res.report.findings)


def test_frame_columns_are_the_frames_arrays():
    res = fs.load(os.path.join(EX, "fragmentation-incident.om.gz"))
    fr = res.frame
    f = res._frame
    assert fr.index.is_monotonic_increasing and len(fr) == f.t.size
    np.testing.assert_array_equal(fr["gpu0:torch_fragmentation_ratio"].to_numpy(), f.gpu["0"]["torch_fragmentation_ratio"])
    np.testing.assert_array_equal(fr["kv_cache_usage_ratio"].to_numpy(), f.engine["kv_cache_usage_ratio"])


def test_inconclusive_table():
    res = fs.load(os.path.join(EX, "healthy.om.gz"))
    inc = res.inconclusive
    assert list(inc.columns) == ["id", "missing", "reason", "subject"]
    assert len(inc) == len(res.report.inconclusive)
