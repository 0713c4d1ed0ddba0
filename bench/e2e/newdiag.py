"""The diagnoses beyond the GPU's memory against a real vLLM on CPU (bench/e2e_newdiag_cpu.sh runs it).

Starts vLLM (the given python, its own process group), `fragscope agent` beside it (this checkout, the
system python), closed-loop load (bench/e2e/load.py), then, each phase bounded in time:

  quiet   the load without a CPU quota: engine-cpu-starved must stay off (seconds watched)
  quota   the vLLM process tree moved into a cgroup with a CPU quota: seconds to engine-cpu-starved, its
          throttled share; then the quota lifted: seconds to clear
  stall   the EngineCore process stopped (SIGSTOP) under load: seconds to engine-stalled; SIGCONT:
          seconds to clear
  memory  the vLLM tree moved into a memory cgroup whose limit is set just above its usage: seconds to
          host-memory-pressure

Prints one JSON object (also written to --out). Needs root and cgroup v1 cpu/memory (or v2 with them).
Every process started is stopped and every cgroup removed on exit.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = "/sys/fs/cgroup"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class Cg:
    def __init__(self, controller: str) -> None:
        name = f"fragscope-bench-{os.getpid()}-{controller}"
        v1 = os.path.join(ROOT, controller)
        if os.path.exists(os.path.join(v1, "cgroup.procs")):
            self.dir, self.version = os.path.join(v1, name), 1
        else:
            self.dir, self.version = os.path.join(ROOT, name), 2
        os.mkdir(self.dir)
        self.parent = os.path.dirname(self.dir)

    def w(self, name: str, value: str) -> None:
        with open(os.path.join(self.dir, name), "w") as fh:
            fh.write(value)

    def r(self, name: str) -> str:
        with open(os.path.join(self.dir, name)) as fh:
            return fh.read()

    def move(self, pids: list[int], where: str | None = None) -> None:
        for p in pids:
            try:
                with open(os.path.join(where or self.dir, "cgroup.procs"), "w") as fh:
                    fh.write(str(p))
            except OSError:
                pass  # a process that exited meanwhile

    def close(self, pids: list[int]) -> None:
        self.move(pids, self.parent)
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--quota-cores", type=float, default=0.2)
    ap.add_argument("--phase-s", type=float, default=60.0, help="longest wait for one detection")
    ap.add_argument("--quiet-s", type=float, default=40.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=("stall",), default=None, help="run one phase after the start-up")
    a = ap.parse_args()
    os.makedirs(a.run, exist_ok=True)
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen] = []
    cgs: list[Cg] = []
    res: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def start(cmd, log, **kw):
        p = subprocess.Popen(cmd, stdout=open(os.path.join(a.run, log), "w"), stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
        procs.append(p)
        return p

    vport, aport = free_port(), free_port()
    vllm_url = f"http://127.0.0.1:{vport}"
    agent_url = f"http://127.0.0.1:{aport}"
    try:
        # vLLM starts inside a memory cgroup with no limit (charges do not follow a process into a new
        # cgroup on cgroup v1); the memory phase sets its limit
        cm = Cg("memory")
        cgs.append(cm)
        t0 = time.monotonic()
        vllm = start(["sh", "-c", f'echo $$ > {cm.dir}/cgroup.procs && exec "$@"', "sh",
                      a.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model,
                      "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(vport), "--dtype", "float32",
                      "--kv-cache-memory-bytes", "64M", "--max-model-len", "1024", "--max-num-seqs", "8",
                      "--enforce-eager"], "vllm.log", env=env)
        while True:
            if vllm.poll() is not None:
                raise SystemExit("vLLM exited: see " + os.path.join(a.run, "vllm.log"))
            try:
                urllib.request.urlopen(vllm_url + "/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() - t0 > 600:
                    raise SystemExit("vLLM not healthy after 10 min")
                time.sleep(2)
        res["vllm_startup_s"] = round(time.monotonic() - t0, 1)
        agent = start([sys.executable, "-c", "from fragscope.cli import main; main()", "agent", "--vllm",
                       vllm_url + "/metrics", "--listen", f"127.0.0.1:{aport}", "--data-dir",
                       os.path.join(a.run, "agent-data"), "--interval", "1s", "--no-nvml"], "agent.log",
                      env=dict(os.environ, PYTHONPATH=a.repo), cwd=a.repo)
        for _ in range(60):
            try:
                urllib.request.urlopen(agent_url + "/healthz", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        start([a.vllm_python, os.path.join(a.repo, "bench", "e2e", "load.py"), "--url", vllm_url, "--model", "tiny",
               "--concurrency", "4", "--max-tokens", "64", "--duration", "900"], "load.log")

        def findings() -> dict:
            try:
                return {f["id"]: f for f in get_json(agent_url + "/api/v1/findings").get("findings", [])}
            except (OSError, ValueError):
                return {}

        def wait(pred, limit):
            t = time.monotonic()
            while time.monotonic() - t < limit:
                f = findings()
                if pred(f):
                    return round(time.monotonic() - t, 1), f
                time.sleep(1.0)
            return None, findings()

        time.sleep(15)  # load running, history in the agent
        pids = tree(vllm.pid)
        core = next((p for p in pids if "EngineCore" in comm(p) or "EngineCore" in cmdline(p)), None)
        res["processes"] = {str(p): comm(p) for p in pids}
        if a.only is None:  # --only stall: the stall alone
            # quiet: the same load, no quota
            t = time.monotonic()
            false = []
            while time.monotonic() - t < a.quiet_s:
                f = findings()
                if "engine-cpu-starved" in f:
                    false.append(f["engine-cpu-starved"]["summary"])
                time.sleep(2)
            res["quiet"] = {"watched_s": a.quiet_s, "engine_cpu_starved_seen": len(false), "examples": false[:2]}
            # quota
            cg = Cg("cpu")
            cgs.append(cg)
            if cg.version == 1:
                cg.w("cpu.cfs_period_us", "100000")
                cg.w("cpu.cfs_quota_us", str(int(a.quota_cores * 100000)))
            else:
                cg.w("cpu.max", f"{int(a.quota_cores * 100000)} 100000")
            cg.move(tree(vllm.pid))
            took, f = wait(lambda f: "engine-cpu-starved" in f, a.phase_s)
            res["quota"] = {"quota_cores": a.quota_cores, "seconds_to_finding": took,
                            "summary": f.get("engine-cpu-starved", {}).get("summary"),
                            "launch_bound_too": "launch-bound" in f}
            if cg.version == 1:
                cg.w("cpu.cfs_quota_us", "-1")
            else:
                cg.w("cpu.max", "max 100000")
            took, _ = wait(lambda f: "engine-cpu-starved" not in f, 2.5 * a.phase_s)  # the present is a minute long
            res["quota"]["seconds_to_clear_after_lifting"] = took
        # stall
        if core is None:
            res["stall"] = {"error": "no EngineCore process found", "processes": res["processes"]}
        else:
            os.kill(core, signal.SIGSTOP)
            try:
                took, f = wait(lambda f: "engine-stalled" in f, a.phase_s)
                res["stall"] = {"core_pid": core, "seconds_to_finding": took,
                                "summary": f.get("engine-stalled", {}).get("summary")}
            finally:
                os.kill(core, signal.SIGCONT)
            took, _ = wait(lambda f: "engine-stalled" not in f, a.phase_s)
            res["stall"]["seconds_to_clear_after_sigcont"] = took
        if a.only is None:
            # memory
            usage = int(cm.r("memory.usage_in_bytes" if cm.version == 1 else "memory.current"))
            limit = int(usage / 0.93) // 4096 * 4096
            cm.w("memory.limit_in_bytes" if cm.version == 1 else "memory.max", str(limit))
            took, f = wait(lambda f: "host-memory-pressure" in f, a.phase_s)
            res["memory"] = {"usage_bytes_at_start": usage, "limit_bytes": limit, "seconds_to_finding": took,
                             "summary": f.get("host-memory-pressure", {}).get("summary")}
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait(timeout=10)
        for c in cgs:
            left = []
            try:
                left = [int(x) for x in c.r("cgroup.procs").split()]
            except OSError:
                pass
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            c.close([])
        text = json.dumps(res, indent=1)
        print(text)
        if a.out:
            with open(a.out, "w") as fh:
                fh.write(text + "\n")
    if a.only == "stall":
        return 0 if res.get("stall", {}).get("seconds_to_finding") is not None else 1
    ok = (res.get("quiet", {}).get("engine_cpu_starved_seen") == 0
          and res.get("quota", {}).get("seconds_to_finding") is not None
          and res.get("stall", {}).get("seconds_to_finding") is not None
          and res.get("memory", {}).get("seconds_to_finding") is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
