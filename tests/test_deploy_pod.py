"""The chart's pod on one machine (bench/e2e_pod.py with the recorded storm): the agent with exactly
the rendered arguments, the engine container's command line and environment, a real Prometheus scraping
what the rendered PodMonitor names and evaluating the rendered PrometheusRule. After a preemption storm
(a real vLLM CPU storm, recorded, replayed in a loop): every dashboard panel has data for the pod except
the GPU-only ones (listed in bench/e2e_pod.py with why), the kv-cache-pressure alert fires with its
`for:` held through the finding's severity changes, and `diagnose --prometheus` names the storm.
About 3 minutes (the alert's `for: 2m`); up to 5 when the agent clears the finding once early on."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from deploy_helpers import ROOT, needs_helm

pytestmark = [pytest.mark.e2e, needs_helm,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (Debian package)")]


def _harness():
    spec = importlib.util.spec_from_file_location("fragscope_e2e_pod", os.path.join(ROOT, "bench", "e2e_pod.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def pod_run(tmp_path_factory):
    e2e = _harness()
    res = e2e.run("replay", str(tmp_path_factory.mktemp("pod")), alert_timeout_s=270)
    return e2e, res


def test_agent_runs_the_rendered_arguments(pod_run):
    e2e, res = pod_run
    args = res["agent_argv"]
    assert args[0].startswith("--listen=127.0.0.1:") and "--no-nvml" in args
    assert any(a.startswith("--vllm=http://127.0.0.1:") and a.endswith("/metrics") for a in args)
    assert any(a.startswith("--probe-dir=") and "volumes/fragscope-probe" in a for a in args)
    assert res["probe_files"] == ["boot", "core.py"]  # the init container's copy
    assert res["readyz"] == 200


def test_every_panel_has_data_but_the_gpu_only_ones(pod_run):
    e2e, res = pod_run
    missing = [k for k, has in res["panels"].items() if not has and k not in e2e.GPU_ONLY]
    assert not missing, f"panels without data for {res['pod']}: {missing}"
    unexpected = [k for k, has in res["panels"].items() if has and k in e2e.GPU_ONLY]
    assert not unexpected, f"listed as GPU-only but have data: {unexpected}"
    assert set(e2e.GPU_ONLY) <= set(res["panels"])  # the list names real panels
    v = res["variables"]
    assert v["namespace"] == [e2e.NS] and v["pod"] == [res["pod"].split("/")[1]] and v["model"] == ["tiny"]


def test_alert_fires_with_for_held_through_severity_changes(pod_run):
    """One alert series whatever the severity (a severity label would make a new series, and a new
    `for:`), and the activation that fired spans a change from warning (the storm's slow start) to
    critical (its recorded pace), as Prometheus stored fragscope_diagnosis_severity. An earlier activation
    may end when the agent clears the finding for a while (the loaded machine's first minute): that is
    the alert following the finding, not a flap by severity."""
    e2e, res = pod_run
    assert res["fired_after_s"] is not None, res["timeline"][-8:]
    assert len(res["alert_series"]) == 1, res["alert_series"]
    assert {2.0, 3.0} <= set(res["severities_stored_while_active"]), (res["severities_stored_while_active"],
                                                                       res["timeline"])


def test_diagnose_prometheus_names_the_storm(pod_run):
    e2e, res = pod_run
    t = res["diagnose_target"]
    assert t is not None, res["diagnose_err"]
    assert "kv-cache-pressure" in t["findings"], t
    assert res["diagnose_rc"] == 0, res["diagnose_err"]
