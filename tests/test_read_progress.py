"""Progress while reading large inputs: readers pass opened files through safefile.observe, the CLI
installs rich's bar on a terminal. The observer sees the whole file and the readers' output is unchanged."""
from __future__ import annotations

import gzip
import os

from fragscope.collectors import safefile
from fragscope.collectors.exposition import read_recording

EX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def test_observer_sees_large_inputs_and_output_is_unchanged(tmp_path, monkeypatch):
    src = os.path.join(EX, "fragmentation-incident.om.gz")
    plain = tmp_path / "rec.om"
    plain.write_bytes(gzip.decompress(open(src, "rb").read()))
    seen = []

    read = []

    def obs(size, path):
        seen.append((size, path))
        return read.append, lambda: seen.append("done")

    before = read_recording(str(plain))
    monkeypatch.setattr(safefile, "OBSERVE_MIN_BYTES", 1)
    tok = safefile.set_observer(obs)
    try:
        after = read_recording(str(plain))
    finally:
        safefile._OBSERVER.reset(tok)
    assert seen == [(plain.stat().st_size, str(plain)), "done"]  # opened once, closed once
    assert sum(read) == plain.stat().st_size  # the bar would have reached 100 %
    assert set(before.series) == set(after.series) and before.start == after.start and before.end == after.end


def test_small_inputs_are_not_observed(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"a 1\n")
    calls = []
    tok = safefile.set_observer(lambda size, path: calls.append(path))
    try:
        with safefile.open_regular(str(p)) as f:
            assert f.read() == b"a 1\n"
    finally:
        safefile._OBSERVER.reset(tok)
    assert calls == []
