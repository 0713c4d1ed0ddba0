#!/usr/bin/env python3
"""Rewrite every file generated from the code, in place (or, with --check, say which are stale and exit 1).

    python .ci/regenerate.py [--check]

After adding or changing a diagnosis (docs/diagnoses.md, "Adding a diagnosis") or a signal:
  dashboards/rules/fragscope-alerts.yml    python -m fragscope.fleet.alerts
  dashboards/rules/fragscope-triage.yml    python -m fragscope.fleet.triage
  docs/signals.md                          python -m fragscope.signals
  docs/diagnoses.md (threshold table)      python -m fragscope.playbooks, between its markers
  docs/dashboards.md (two tables)          python -m fragscope.fleet.alerts --signals / --markdown, between markers
  deploy/kubernetes/*.yaml                 python deploy/render.py (they carry the rules)
The tests that compare each file with its generator stay the judge; this only saves doing it by hand.
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def between(text: str, begin: str, end: str, new: str) -> str:
    """``text`` with the block from the ``begin`` marker to the ``end`` marker (both included) replaced by ``new``,
    which carries both markers itself."""
    i, j = text.index(begin), text.index(end, text.index(begin)) + len(end)
    return text[:i] + new.rstrip("\n") + text[j:]


def wanted() -> dict[str, str]:
    from fragscope import signals
    from fragscope.fleet import alerts, triage
    from fragscope.playbooks import REGISTRY
    from fragscope.playbooks.registry import THRESHOLDS_BEGIN, THRESHOLDS_END, thresholds_markdown

    def read(rel: str) -> str:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
            return fh.read()

    dash = between(read("docs/dashboards.md"), alerts.SIGNALS_DOC_BEGIN, alerts.SIGNALS_DOC_END,
                   alerts.signals_markdown())
    dash = between(dash, alerts.DOC_BEGIN, alerts.DOC_END, alerts.alerts_markdown())
    return {
        "dashboards/rules/fragscope-alerts.yml": alerts.alerts_yaml(),
        "dashboards/rules/fragscope-triage.yml": triage.rules_yaml(),
        "docs/signals.md": signals.markdown(),
        "docs/diagnoses.md": between(read("docs/diagnoses.md"), THRESHOLDS_BEGIN, THRESHOLDS_END,
                                     thresholds_markdown(REGISTRY)),
        "docs/dashboards.md": dash,
    }


def main() -> int:
    check = sys.argv[1:] == ["--check"]
    stale = []
    for rel, text in wanted().items():
        path = os.path.join(ROOT, rel)
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                continue
        stale.append(rel)
        if not check:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    render = [sys.executable, os.path.join(ROOT, "deploy", "render.py")]
    r = subprocess.run(render + ["--check"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:  # after the rule files above: the manifests carry them
        if check:
            stale.append("deploy/kubernetes/ (" + (r.stdout + r.stderr).strip().splitlines()[-1] + ")")
        else:
            w = subprocess.run(render, cwd=ROOT, capture_output=True, text=True, check=True)
            stale += [ln.split()[-1] for ln in w.stdout.splitlines() if ln.startswith("wrote")]
    for rel in stale:
        print(("stale: " if check else "wrote ") + rel)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
