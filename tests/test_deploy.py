"""The deployment as written: the Helm chart renders (Helm's own engine), every object validates against
the Kubernetes schemas and the prometheus-operator CRDs, the port is one value everywhere, the rules pass
promtool, the plain manifests are the chart's default render, the probe reaches a stock engine through
the init container's copy, the image's HEALTHCHECK follows the configured port, and the README's
commands are accepted. docs/deploy.md.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from deploy_helpers import CHART, ROOT, container, crd_schema, needs_helm, objects, one, render, render_py

PROMTOOL = shutil.which("promtool")
KUBECTL = shutil.which("kubectl")
K8S_VERSION = "1.30.0"  # the oldest Kubernetes minor still supported upstream when this chart was written
CLI = [sys.executable, "-c", "import sys; sys.argv[0] = 'fragscope'; from fragscope.cli import main; main()"]
DEFAULT_PORT = 9655

VARIANTS = {
    "default": {},
    "sglang": {"engine": {"kind": "sglang"}},
    "servicemonitor-nvml-dcgm": {"monitoring": {"serviceMonitor": {"enabled": True}, "labels": {"release": "kps"}},
                                 "agent": {"nvidiaVisibleDevices": "all", "dcgmUrl": "http://dcgm:9400/metrics",
                                           "extraArgs": ["--log-level=debug"]},
                                 "runtimeClassName": "nvidia"},
    "no-probe-no-log": {"probe": {"enabled": False}, "engine": {"logFile": {"enabled": False}},
                        "agent": {"processCollector": False}},
    "inject": {"engine": {"enabled": False, "portName": "http"}, "inject": {"podLabels": {"app": "my-vllm"}}},
}


def _strict(schema):
    """A CRD schema as the API server applies it: fields it does not declare are dropped there (pruning),
    so here they are errors (a misspelt field would silently do nothing in a cluster)."""
    if isinstance(schema, dict):
        s = {k: _strict(v) for k, v in schema.items()}
        if "properties" in s and not s.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in s:
            s["additionalProperties"] = False
        return s
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def validate(obj: dict) -> None:
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        import jsonschema

        # no meta-check of the schema: its patterns are Go regexps ('^(?i)...' is not Python's)
        jsonschema.Draft7Validator(_strict(crd_schema(obj["kind"]))).validate(obj)
    else:
        import kubernetes_validate

        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------------------------
@needs_helm
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_validates(variant):
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the test extra)")
    objs = objects(VARIANTS[variant])
    kinds = sorted(o["kind"] for o in objs)
    assert "Service" in kinds and "PodMonitor" in kinds and "PrometheusRule" in kinds, kinds
    assert ("Deployment" in kinds) == (variant != "inject")
    for o in objs:
        try:
            validate(o)
        except Exception as e:  # name the object: the schema error alone does not
            raise AssertionError(f"{variant}: {o['kind']} {o['metadata']['name']}: {str(e)[:600]}") from None


def test_helm_package_stores_the_linked_files(tmp_path):
    """`helm package` follows the chart's links to dashboards/: the archive carries the files themselves
    (and not the rules' unit tests, .helmignore)."""
    import tarfile

    helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra)")
    archive = helm_python.package(CHART, destination=str(tmp_path))
    with tarfile.open(archive) as tf:
        names = tf.getnames()
        got = tf.extractfile("fragscope/files/fragscope.json").read()
    with open(os.path.join(ROOT, "dashboards", "fragscope.json"), "rb") as fh:
        assert got == fh.read()
    assert "fragscope/files/rules/fragscope-alerts.yml" in names
    assert not [n for n in names if "/rules/tests/" in n]


def test_helm_lint_strict():
    helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (the test extra)")
    for values in VARIANTS.values():
        report = helm_python.lint(CHART, values, strict=True)
        assert not report["errors"], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@needs_helm
def test_a_misspelt_monitor_field_is_caught():
    """The CRD check can fail: a PodMonitor with a field the operator does not know is refused."""
    pm = copy.deepcopy(one(objects(), "PodMonitor"))
    pm["spec"]["podMetricEndpoints"] = pm["spec"].pop("podMetricsEndpoints")
    with pytest.raises(Exception, match="podMetricEndpoints"):
        validate(pm)


@needs_helm
def test_plain_manifests_are_the_charts_default_render():
    want = render_py.plain_manifests(render())
    for name, text in want.items():
        with open(os.path.join(ROOT, "deploy", "kubernetes", name)) as fh:
            assert fh.read() == text, f"deploy/kubernetes/{name} is stale: run python deploy/render.py"
    assert sorted(os.listdir(os.path.join(ROOT, "deploy", "kubernetes"))) == sorted(want)
    # no object pins a namespace: `kubectl apply -n NS -f` puts each where it is told
    for text in want.values():
        for o in yaml.safe_load_all(text):
            if o:
                assert "namespace" not in o["metadata"], (o["kind"], o["metadata"])


def test_chart_reads_dashboards_own_files():
    """The chart's files/ are links to dashboards/ (one copy of the rules and the dashboard)."""
    assert render_py.chart_links_ok() == []


# ---------------------------------------------------------------------------------------------
def _port_refs(objs: list[dict]) -> dict[str, object]:
    dep = one(objs, "Deployment")["spec"]["template"]["spec"]
    agent = container(dep, "fragscope")
    svc = one(objs, "Service")["spec"]["ports"]
    return {
        "containerPort": next(p["containerPort"] for p in agent["ports"] if p["name"] == "fragscope"),
        "--listen": next(a for a in agent["args"] if a.startswith("--listen=")).rsplit(":", 1)[1],
        "service": next(p["port"] for p in svc if p["name"] == "fragscope"),
        "readiness": agent["readinessProbe"]["httpGet"]["port"],
        "liveness": agent["livenessProbe"]["httpGet"]["port"],
        "podmonitor": [e["port"] for e in one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"]],
    }


@needs_helm
@pytest.mark.parametrize("port", [DEFAULT_PORT, 9711])
def test_the_agent_port_is_one_value_everywhere(port):
    values = {} if port == DEFAULT_PORT else {"agent": {"port": port}}
    objs = objects({**values, "monitoring": {"serviceMonitor": {"enabled": True}}})
    refs = _port_refs(objs)
    assert refs["containerPort"] == port and int(refs["--listen"]) == port and refs["service"] == port
    # probes and monitors name the port, so they follow it
    assert refs["readiness"] == refs["liveness"] == "fragscope"
    assert "fragscope" in refs["podmonitor"]
    assert "fragscope" in [e["port"] for e in one(objs, "ServiceMonitor")["spec"]["endpoints"]]
    text = "\n".join(render({**values, "monitoring": {"serviceMonitor": {"enabled": True}}}).values())
    others = {9400, 9655, 9711} - {port}
    pod_text = "\n".join(t for n, t in render(values).items() if n not in ("prometheusrule.yaml",
                                                                             "dashboard-configmap.yaml"))
    for other in others:
        assert str(other) not in pod_text, f"{other} appears in the render for port {port}"
    assert str(port) in text


def test_default_port_matches_chart_dockerfile_and_docs():
    with open(os.path.join(CHART, "values.yaml")) as fh:
        assert yaml.safe_load(fh)["agent"]["port"] == DEFAULT_PORT
    assert f"ARG FRAGSCOPE_PORT={DEFAULT_PORT}" in _dockerfile()
    with open(os.path.join(ROOT, "docs", "deploy.md")) as fh:
        assert f"`{DEFAULT_PORT}`" in fh.read()


# ---------------------------------------------------------------------------------------------
@needs_helm
def test_pod_shape_security_probes_and_resources():
    objs = objects()
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    agent, engine = container(pod, "fragscope"), container(pod, "vllm")
    init = pod["initContainers"][0]
    for c in (agent, init):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] and c["resources"]["limits"]
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the sidecar asks for no GPU: the scheduler gives the engine's GPU to the engine only
    assert "nvidia.com/gpu" not in json.dumps(agent["resources"])
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    # requests sized from the measured footprint (docs/agent.md: RSS 49-63 MB, peak under hostile load)
    mem = agent["resources"]
    assert mem["requests"]["memory"] == "96Mi" and mem["limits"]["memory"] == "256Mi"
    # every mount names a volume of the pod; every volume is used
    vols = {v["name"] for v in pod["volumes"]}
    used = {m["name"] for c in [*pod["containers"], init] for m in c.get("volumeMounts", [])}
    assert used == vols, (used ^ vols)
    # the engine and the sidecar share the probe directory and the engine log
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in pod["containers"]}
    assert mounts["vllm"]["fragscope-probe"] == mounts["fragscope"]["fragscope-probe"]
    assert mounts["vllm"]["engine-log"] == mounts["fragscope"]["engine-log"]
    assert pod["shareProcessNamespace"] is True


@needs_helm
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_engine_launch_keeps_exit_status_and_signals(kind):
    """The engine runs its own command directly: no shell, no pipe, no tee (its exit status and
    SIGTERM reach Kubernetes); the probe reaches it through the environment only."""
    pod = one(objects({"engine": {"kind": kind}}), "Deployment")["spec"]["template"]["spec"]
    engine = container(pod, kind)
    line = engine["command"] + engine["args"]
    assert line[0] not in ("sh", "bash", "/bin/sh", "/bin/bash"), line
    assert not any(t in a for a in line for t in ("|", "tee", "&&", ";")), line
    assert line[:2] == (["vllm", "serve"] if kind == "vllm" else ["python3", "-m"])
    env = {e["name"]: e.get("value") for e in engine["env"]}
    probe_lib = next(m["mountPath"] for m in engine["volumeMounts"] if m["name"] == "fragscope-probe-lib")
    assert env["PYTHONPATH"] == probe_lib + "/boot" and env["FRAGSCOPE_PROBE"] == "1"
    assert pod["initContainers"][0]["command"] == ["fragscope-install-probe", probe_lib]
    port = next(p["containerPort"] for p in engine["ports"])
    assert port == (8000 if kind == "vllm" else 30000)
    agent = container(pod, "fragscope")
    assert f"--vllm=http://127.0.0.1:{port}/metrics" in agent["args"]
    # the engine log: a file vLLM's logging config writes (no pipe); SGLang has no such hook
    assert ("--log-file=/var/log/engine/engine.log" in agent["args"]) == (kind == "vllm")
    assert ("VLLM_LOGGING_CONFIG_PATH" in env) == (kind == "vllm")


@needs_helm
def test_podmonitor_scrapes_agent_and_engine():
    objs = objects()
    pm = one(objs, "PodMonitor")["spec"]
    eps = {e["port"]: e["path"] for e in pm["podMetricsEndpoints"]}
    assert eps == {"fragscope": "/metrics", "engine": "/metrics"}
    pod = one(objs, "Deployment")["spec"]["template"]
    assert pm["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    names = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert set(eps) <= names
    # kube-prometheus-stack selects monitors and rules by its release label: settable
    objs = objects({"monitoring": {"labels": {"release": "kps"}}})
    for k in ("PodMonitor", "PrometheusRule"):
        assert one(objs, k)["metadata"]["labels"]["release"] == "kps"


@needs_helm
def test_prometheusrule_carries_dashboards_rules_and_passes_promtool(tmp_path):
    rule = one(objects(), "PrometheusRule")
    want = []
    for name in sorted(os.listdir(os.path.join(ROOT, "dashboards", "rules"))):
        if name.endswith(".yml"):
            with open(os.path.join(ROOT, "dashboards", "rules", name)) as fh:
                want.extend(yaml.safe_load(fh)["groups"])
    assert rule["spec"]["groups"] == want
    assert any(r.get("alert") == "FragscopeKvCachePressure" for g in want for r in g["rules"])
    if PROMTOOL is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    p = tmp_path / "rules.yml"
    p.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # promtool can fail: a broken expression is refused
    bad = copy.deepcopy(rule["spec"]["groups"])
    bad[0]["rules"][0]["expr"] = "sum by (pod (x)"
    p.write_text(yaml.safe_dump({"groups": bad}))
    assert subprocess.run([PROMTOOL, "check", "rules", str(p)], capture_output=True, timeout=60).returncode != 0


@needs_helm
def test_dashboard_configmap_for_grafana_sidecar():
    cm = one([o for o in objects() if o["metadata"]["name"].endswith("-dashboard")], "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    with open(os.path.join(ROOT, "dashboards", "fragscope.json")) as fh:
        assert json.loads(cm["data"]["fragscope.json"]) == json.load(fh)
    assert "namespace" not in cm["metadata"]  # the release's, unless monitoring.grafanaDashboard.namespace
    cm = one([o for o in objects({"monitoring": {"grafanaDashboard": {"namespace": "monitoring"}}})
              if o["metadata"]["name"].endswith("-dashboard")], "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"


@needs_helm
def test_rendered_agent_arguments_are_accepted(tmp_path):
    """The sidecar's rendered command line is one the agent accepts (--print-config), port included."""
    for values in ({}, VARIANTS["servicemonitor-nvml-dcgm"], VARIANTS["no-probe-no-log"]):
        pod = one(objects(values), "Deployment")["spec"]["template"]["spec"]
        args = container(pod, "fragscope")["args"]
        r = subprocess.run([*CLI, "agent", *args, "--print-config"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert re.search(r'^listen = "0\.0\.0\.0:9655"', r.stdout, re.M), r.stdout[:400]


# ---------------------------------------------------------------------------------------------
@needs_helm
@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_inject_patch_turns_a_stock_vllm_deployment_into_the_charts_pod(tmp_path):
    values = {"engine": {"enabled": False}, "inject": {"podLabels": {"app": "my-vllm"}, "deployment": "my-vllm",
                                                        "renderPatch": True}}
    patch = render(values)["inject-patch.yaml"]
    stock = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "my-vllm"},
        "spec": {"selector": {"matchLabels": {"app": "my-vllm"}}, "template": {
            "metadata": {"labels": {"app": "my-vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "args": ["Qwen/Qwen2.5-1.5B-Instruct"], "ports": [{"name": "engine", "containerPort": 8000}],
                                     "env": [{"name": "HF_HOME", "value": "/models"}],
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(stock))
    (tmp_path / "p.yaml").write_text(patch)
    r = subprocess.run([KUBECTL, "patch", "-f", str(tmp_path / "d.yaml"), "--local", "--type", "strategic",
                        "--patch-file", str(tmp_path / "p.yaml"), "-o", "yaml"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = yaml.safe_load(r.stdout)
    pytest.importorskip("kubernetes_validate")
    validate(got)
    pod = got["spec"]["template"]["spec"]
    mine = one(objects(), "Deployment")["spec"]["template"]["spec"]
    assert container(pod, "fragscope") == container(mine, "fragscope")
    assert pod["initContainers"] == mine["initContainers"]
    engine = container(pod, "vllm")
    assert engine["image"] == "vllm/vllm-openai:v0.11.0"  # the user's engine, kept
    env = {e["name"] for e in engine["env"]}
    assert {"HF_HOME", "PYTHONPATH", "FRAGSCOPE_PROBE", "VLLM_LOGGING_CONFIG_PATH"} <= env
    assert {v["name"] for v in pod["volumes"]} >= {m["name"] for c in pod["containers"] for m in c["volumeMounts"]}


# ---------------------------------------------------------------------------------------------
def test_probe_reaches_an_engine_without_fragscope(tmp_path):
    """The init container's copy is self-contained: a Python without fragscope (a bare venv, as in a
    stock vllm/vllm-openai image) given the chart's environment starts the probe thread."""
    lib, pdir = tmp_path / "lib", tmp_path / "probe"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "install_probe.py"), str(lib)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(lib / "boot"), "FRAGSCOPE_PROBE": "1",
           "FRAGSCOPE_PROBE_DIR": str(pdir), "FRAGSCOPE_PROBE_INTERVAL": "0.2"}
    code = textwrap.dedent("""
        import sys, threading
        try:
            import fragscope
            print("fragscope importable"); sys.exit(3)
        except ImportError:
            pass
        core = sys.modules.get("_fragscope_probe_core")
        names = [t.name for t in threading.enumerate()]
        print(core is not None, "fragscope-probe" in names)
    """)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["True", "True"], r.stdout + r.stderr
    # without FRAGSCOPE_PROBE the copy stays inert
    env.pop("FRAGSCOPE_PROBE")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr
    assert subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "install_probe.py")],
                          capture_output=True, timeout=60).returncode == 2


@needs_helm
def test_engine_logging_config_writes_lines_the_log_collector_reads(tmp_path):
    """The chart's vLLM logging config (VLLM_LOGGING_CONFIG_PATH), applied with logging.config as vLLM
    does, writes lines fragscope's engine-log parser reads (a vLLM V1 preemption warning)."""
    cm = next(o for o in objects() if o["metadata"]["name"].endswith("-engine-logging"))
    cfg = json.loads(cm["data"]["logging.json"])
    log = tmp_path / "engine.log"
    cfg["handlers"]["file"]["filename"] = str(log)
    code = textwrap.dedent(f"""
        import json, logging.config
        logging.config.dictConfig(json.loads({json.dumps(json.dumps(cfg))}))
        logging.getLogger("vllm.v1.core.sched.scheduler").warning(
            "Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=51")
        logging.getLogger("other").warning("not vLLM")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and r.stdout.splitlines() == lines  # stdout (kubectl logs) and the file alike
    assert re.match(r"^WARNING \d\d-\d\d \d\d:\d\d:\d\d \[<string>:\d+\] Sequence group", lines[0]), lines[0]
    from fragscope.collectors.logs import parse_log

    events = parse_log(lines)
    assert [e.kind for e in events if e.kind == "preemption"], events


# ---------------------------------------------------------------------------------------------
def _dockerfile() -> str:
    with open(os.path.join(ROOT, "deploy", "Dockerfile")) as fh:
        return fh.read()


def _instructions(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_non_root_port_from_config_healthcheck_follows_it():
    """No Docker daemon here: the Dockerfile is checked as text (docs/deploy.md says so)."""
    ins = _instructions(_dockerfile())
    words = [w for w, _ in ins]
    assert words[0] == "FROM" and words[-1] == "ENTRYPOINT"
    user = [r for w, r in ins if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert int(user[-1].split(":")[0]) >= 1000
    assert not [r for _, r in ins if "9400" in r]  # dcgm-exporter's port, named in a comment only
    args = dict(r.split("=", 1) for w, r in ins if w == "ARG")
    assert args["FRAGSCOPE_PORT"] == str(DEFAULT_PORT)
    envs = " ".join(r for w, r in ins if w == "ENV")
    assert "FRAGSCOPE_LISTEN=0.0.0.0:${FRAGSCOPE_PORT}" in envs
    assert [r for w, r in ins if w == "EXPOSE"] == ["${FRAGSCOPE_PORT}"]
    hc = [r for w, r in ins if w == "HEALTHCHECK"]
    assert len(hc) == 1 and "fragscope-healthcheck" in hc[0] and not re.search(r":\d{2,5}", hc[0])
    # the CMD does not pin --listen (the port comes from FRAGSCOPE_LISTEN / --config / a flag)
    assert not [r for w, r in ins if w == "CMD" and "--listen" in r]
    # everything it copies exists in the build context (the repository root)
    for w, r in ins:
        if w == "COPY":
            for src in shlex.split(r)[:-1]:
                assert os.path.exists(os.path.join(ROOT, src)), src
    assert "RUN pip install ." in _dockerfile()


def _healthcheck():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fragscope_healthcheck", os.path.join(ROOT, "deploy", "healthcheck.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_healthcheck_reads_the_configured_port(tmp_path):
    hc = _healthcheck()
    agent = ["fragscope", "agent", "--vllm", "http://127.0.0.1:8000"]
    assert hc.probe_url(agent, {"FRAGSCOPE_LISTEN": "0.0.0.0:9655"}) == "http://127.0.0.1:9655/healthz"
    # a flag beats the environment, as in the agent
    assert hc.probe_url([*agent, "--listen", "0.0.0.0:9700"], {"FRAGSCOPE_LISTEN": "0.0.0.0:9655"}).endswith(":9700/healthz")
    assert hc.probe_url([*agent, "--listen=127.0.0.1:9701"], {}) == "http://127.0.0.1:9701/healthz"
    cfg = tmp_path / "agent.toml"
    cfg.write_text('listen = "[::]:9702"\n')
    assert hc.probe_url([*agent, "--config", str(cfg)], {}) == "http://[::1]:9702/healthz"
    assert hc.probe_url(agent, {"FRAGSCOPE_CONFIG": str(cfg)}) == "http://[::1]:9702/healthz"


def test_healthcheck_against_a_running_agent(tmp_path):
    """The HEALTHCHECK script as the image runs it, against a real agent moved to another port via
    FRAGSCOPE_LISTEN: healthy; the same script told another port: unhealthy, with the reason."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FRAGSCOPE_LISTEN": f"127.0.0.1:{port}", "FRAGSCOPE_DATA_DIR": str(tmp_path)}
    p = subprocess.Popen([*CLI, "agent", "--no-process", "--no-nvml", "--no-store"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        script = [sys.executable, os.path.join(ROOT, "deploy", "healthcheck.py")]
        r = subprocess.run(script, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(script, env={**env, "FRAGSCOPE_LISTEN": "127.0.0.1:1"}, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1 and "127.0.0.1:1/healthz" in r.stderr
    finally:
        p.terminate()
        p.wait(timeout=20)


# ---------------------------------------------------------------------------------------------
def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as fh:
        return fh.read()


def test_readme_installs_from_the_checkout():
    """fragscope is not on the package index: every pip install in the README is of the checkout."""
    installs = re.findall(r"pip install ([^\n`&|]+)", _readme())
    assert installs
    for spec in installs:
        target = shlex.split(spec)[-1]
        assert target.startswith(".") or target.startswith("'.") or target.startswith("-e"), spec
        assert not target.startswith("fragscope"), spec


def test_readme_agent_command_is_accepted(tmp_path):
    """The README's "In the pod" agent command line parses, and listens on the documented port."""
    cmds = re.findall(r"^(fragscope agent [^#\n]+)", _readme(), re.M) + re.findall(r"`(fragscope agent [^`]+)`", _readme())
    assert cmds, "no `fragscope agent ...` command in the README"
    for cmd in cmds:
        argv = shlex.split(cmd)[2:]
        r = subprocess.run([*CLI, "agent", *argv, "--print-config"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
        assert r.returncode == 0, (cmd, r.stderr)
    assert f":{DEFAULT_PORT}/metrics" in _readme()
