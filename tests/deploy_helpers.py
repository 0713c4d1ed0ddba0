"""Shared by tests/test_deploy.py and tests/test_deploy_pod.py: render the Helm chart, read its objects."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy", "helm", "fragscope")
CRDS = os.path.join(ROOT, "tests", "data", "prometheus-operator")


def _render_module():
    spec = importlib.util.spec_from_file_location("fragscope_deploy_render", os.path.join(ROOT, "deploy", "render.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


render_py = _render_module()


def helm_available() -> bool:
    if shutil.which("helm"):
        return True
    try:
        import helm_python  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


needs_helm = pytest.mark.skipif(not helm_available(),
                                reason="no Helm renderer: neither the helm binary nor helm-python-sdk (the test extra)")


def render(values: dict | None = None) -> dict[str, str]:
    return dict(_render(json.dumps(values or {}, sort_keys=True)))


@functools.lru_cache(maxsize=None)
def _render(values_json: str) -> tuple:
    """One Helm render per distinct set of values in a test session (a render takes ~0.3 s)."""
    return tuple(render_py.render(json.loads(values_json)).items())


def objects(values: dict | None = None) -> list[dict]:
    """Every object the chart renders with these values."""
    out = []
    for name, text in render(values).items():
        if name.endswith(".yaml"):  # not NOTES.txt
            out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def one(objs: list[dict], kind: str) -> dict:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


@functools.lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict:
    """The openAPIV3Schema of a vendored prometheus-operator CRD (served version v1)."""
    name = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors",
            "PrometheusRule": "prometheusrules"}[kind]
    with open(os.path.join(CRDS, f"monitoring.coreos.com_{name}.yaml")) as fh:
        crd = yaml.safe_load(fh)
    v = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return v["schema"]["openAPIV3Schema"]
