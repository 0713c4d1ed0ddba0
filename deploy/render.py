#!/usr/bin/env python3
"""Render the Helm chart's plain manifests (deploy/kubernetes/), or any render of it.

    python deploy/render.py            # render deploy/kubernetes/*.yaml from the chart's default values
    python deploy/render.py --check    # exit 1 if a rendered manifest is out of date
    python deploy/render.py --set agent.port=9700 --stdout   # render with values, print, write nothing

Helm reads files only from inside a chart: deploy/helm/fragscope/files/rules and files/fragscope.json are
symbolic links to dashboards/rules and dashboards/fragscope.json (Helm's loader follows them, and `helm package`
stores their contents), so the chart's PrometheusRule and dashboard ConfigMap read the one copy with
.Files. After a change under dashboards/, render again. Rendering uses Helm's own template engine: the
`helm` binary when it is on PATH, else the Helm v4 Go SDK through the `helm-python-sdk` package (pip install helm-python-sdk; the `test`
extra installs it). docs/deploy.md.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy", "helm", "fragscope")
PLAIN = os.path.join(ROOT, "deploy", "kubernetes")
RELEASE = "fragscope"

# template -> plain manifest file (kubectl apply -f each; the second needs the Prometheus Operator CRDs)
PLAIN_FILES = {
    "vllm-with-fragscope.yaml": ("engine-logging-configmap.yaml", "deployment.yaml", "service.yaml"),
    "prometheus-operator.yaml": ("podmonitor.yaml", "servicemonitor.yaml", "prometheusrule.yaml"),
    "grafana-dashboard.yaml": ("dashboard-configmap.yaml",),
}
HEADER = ("# Rendered from deploy/helm/fragscope with its default values by `python deploy/render.py`: do not edit\n"
          "# (change the chart or its values and render again). docs/deploy.md explains every object.\n")


def chart_links_ok() -> list[str]:
    """The chart's files/ links that do not lead to dashboards/ (empty: all do)."""
    bad = []
    for rel, target in (("files/rules", ("dashboards", "rules")), ("files/fragscope.json", ("dashboards", "fragscope.json"))):
        if os.path.realpath(os.path.join(CHART, rel)) != os.path.realpath(os.path.join(ROOT, *target)):
            bad.append(f"deploy/helm/fragscope/{rel}")
    return bad


def _set(values: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    d = values
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def render(values: dict | None = None, chart: str = CHART, release: str = RELEASE,
           namespace: str = "default") -> dict[str, str]:
    """Render the chart: template name (e.g. ``deployment.yaml``) -> its YAML text (may be empty)."""
    helm = shutil.which("helm")
    if helm:
        return _render_binary(helm, values or {}, chart, release, namespace)
    try:
        import helm_python
    except ImportError:
        raise SystemExit("render.py: needs Helm: the `helm` binary on PATH, or `pip install helm-python-sdk`")
    helm_python.disable_logging()  # its INFO lines on following the files/ links
    out = helm_python.Chart.load(chart).render(values=values or {}, name=release, namespace=namespace,
                                               is_install=True)
    return {os.path.basename(k): v for k, v in out.items() if "/templates/" in k and not k.endswith(".tpl")}


def _render_binary(helm: str, values: dict, chart: str, release: str, namespace: str) -> dict[str, str]:
    import yaml

    with tempfile.TemporaryDirectory() as d:
        vf = os.path.join(d, "values.yaml")
        with open(vf, "w") as fh:
            yaml.safe_dump(values, fh)
        subprocess.run([helm, "template", release, chart, "-n", namespace, "-f", vf, "--output-dir", d],
                       check=True, capture_output=True)
        out = {}
        for p in glob.glob(os.path.join(d, "*", "templates", "*.yaml")):
            with open(p) as fh:
                # --output-dir writes '---\n# Source: ...' headers; keep the body only
                out[os.path.basename(p)] = "".join(l for l in fh if not l.startswith("# Source:")).lstrip("-\n")
        return out


def plain_manifests(rendered: dict[str, str]) -> dict[str, str]:
    """deploy/kubernetes file name -> text, from a default render."""
    out = {}
    for name, templates in PLAIN_FILES.items():
        docs = []
        for t in templates:
            body = rendered.get(t, "").strip()
            if body:
                docs.append(f"# Source: deploy/helm/fragscope/templates/{t}\n" + body.lstrip("-\n").rstrip() + "\n")
        out[name] = HEADER + "---\n" + "---\n".join(docs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the manifests are stale")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value (repeatable)")
    ap.add_argument("--stdout", action="store_true", help="print the rendered objects; write nothing")
    a = ap.parse_args(argv)
    values: dict = {}
    for kv in a.set:
        k, _, v = kv.partition("=")
        import yaml

        _set(values, k, yaml.safe_load(v))
    if a.stdout:
        for name, text in sorted(render(values).items()):
            if text.strip():
                print(f"---\n# Source: {name}\n{text.strip()}")
        return 0
    if a.check:
        bad = chart_links_ok()
        if not bad:
            for name, text in plain_manifests(render(values)).items():
                p = os.path.join(PLAIN, name)
                if not os.path.exists(p) or open(p).read() != text:
                    bad.append(os.path.relpath(p, ROOT))
        if bad:
            print("out of date (run python deploy/render.py): " + ", ".join(bad), file=sys.stderr)
            return 1
        return 0
    os.makedirs(PLAIN, exist_ok=True)
    for name, text in plain_manifests(render(values)).items():
        with open(os.path.join(PLAIN, name), "w") as fh:
            fh.write(text)
        print(f"wrote deploy/kubernetes/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
