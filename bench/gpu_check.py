"""One prepared check for a lent GPU: the real NVML collector and the real probe.

    python bench/gpu_check.py            # ~1 minute; exits 0 with a message when no GPU is present

1. NVML: NvmlCollector over the real nvidia-ml-py prints every signal it read and every signal
   it could not read, with the reason (unsupported, no_permission, ...), and the collect time.
2. Probe, in this process: before CUDA is initialised it must publish nothing; then tensors are
   allocated and every other one freed (6 MiB blocks share 20 MiB segments, so freed blocks stay
   inside partly used segments) and the published record must show reserved > allocated and
   inactive_split > 0; the torch collector must read it; per-sample overhead is measured against
   a bare json.dumps + write of the full memory_stats() dict in the same run; a memory snapshot is
   requested through the file protocol (history recording on).
3. Probe through the launcher: a child Python under fragscope-probe allocates on the GPU and its
   record must appear, then disappear at exit.
4. OOM replay on a real trace: with memory history on and the process capped at a small share of
   the GPU, 6 MiB blocks are allocated and every other one freed, an 18 MiB allocation is attempted (a real OutOfMemoryError), then everything is freed and empty_cache() runs
   before the snapshot is taken (so the dump-time state is nothing like the OOM instant). The
   analysis must replay the real trace entries back to the OOM without a problem (state_at "oom"),
   find the freed-every-other-block pattern there (free bytes >= the request, no block large enough),
   and, on torch >= 2.14 with pinned-memory recording, read the host section's layout.
Prints "GPU CHECK: PASS" or "GPU CHECK: FAIL (n)" and exits 0 / 1.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FAILS: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        FAILS.append(what)


def gpu_present() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return None if n > 0 else "NVML reports 0 GPUs"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def nvml_section() -> None:
    from fragscope.collectors.nvml import NvmlCollector
    print("== NVML collector")
    c = NvmlCollector()
    t0 = time.perf_counter()
    r = c.collect(time.time())
    first = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        r = c.collect(time.time())
        times.append(time.perf_counter() - t0)
    print(f"  driver {c.driver}; first collect {first * 1e3:.1f} ms (init), then median "
          f"{statistics.median(times) * 1e3:.2f} ms")
    for s in sorted(r.samples, key=lambda s: (s.name, s.labels)):
        print(f"  {s.name}{dict(s.labels)} = {s.value:g}")
    for m in r.missing:
        print(f"  NOT AVAILABLE {m.name}{dict(m.labels)}: {m.reason} ({m.detail})")
    names = {s.name for s in r.samples}
    check(r.up, f"collector up (error: {r.error})")
    for need in ("fragscope_gpu_memory_used_bytes", "fragscope_gpu_memory_total_bytes",
                 "fragscope_gpu_sm_clock_hertz", "fragscope_gpu_throttle_reason_active"):
        check(need in names or any(m.name == need for m in r.missing), f"{need} read or reasoned")


def probe_section() -> None:
    print("== probe (this process)")
    try:
        import torch
    except ImportError:
        check(False, "torch importable (pip install torch with CUDA)")
        return
    if not torch.cuda.is_available():
        check(False, "torch.cuda.is_available()")
        return
    from fragscope.collectors.torch import TorchProbeCollector
    from fragscope.probe import core
    d = tempfile.mkdtemp(prefix="fragscope-gpucheck-")
    p = core.Probe(d, 0.5)
    check(p.tick() is False and not os.listdir(d), "nothing published before CUDA is initialised")
    check(not torch.cuda.is_initialized(), "the probe did not initialise CUDA")
    dev = torch.device("cuda", 0)
    keep = [torch.empty(6 * 2**20, dtype=torch.uint8, device=dev) for _ in range(300)]
    for i in range(0, len(keep), 2):
        keep[i] = None
    torch.cuda.synchronize()
    check(p.tick() is True, "published after CUDA initialisation")
    rec = core.parse_record(open(core.record_path(d, os.getpid()), "rb").read())
    st = rec["devices"][0]["stats"]
    alloc, res, split = (st["allocated_bytes.all.current"], st["reserved_bytes.all.current"],
                         st["inactive_split_bytes.all.current"])
    print(f"  allocated {alloc / 2**20:.0f} MiB, reserved {res / 2**20:.0f} MiB, inactive split "
          f"{split / 2**20:.0f} MiB, gpu {rec['devices'][0]['gpu']} uuid {rec['devices'][0]['uuid']}")
    check(res > alloc, "reserved > allocated")
    check(split > 0, "inactive_split_bytes > 0")
    r = TorchProbeCollector(d).collect(time.time())
    check(r.up and any(s.name == "fragscope_torch_inactive_split_bytes" and s.value == split for s in r.samples),
          "torch collector reads the record")
    # overhead per sample on the real device, against a bare json.dumps + write in the same run
    full = torch.cuda.memory_stats(0)
    base_path = os.path.join(d, "baseline.json")

    def baseline():
        with open(base_path, "wb") as fh:
            fh.write(json.dumps(full).encode())

    def timed(fn, n=300):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(out)

    pm, bm = timed(p.tick), timed(baseline)
    ms = timed(lambda: torch.cuda.memory_stats(0))
    print(f"  probe sample median {pm:.1f} µs (memory_stats alone {ms:.1f} µs); baseline json.dumps+write "
          f"{bm:.1f} µs; ratio {pm / bm:.2f}x; {len(full)} keys in memory_stats()")
    check(p.errors == 0, f"probe errors 0 (last: {p.last_error})")
    # snapshot on request
    try:
        torch.cuda.memory._record_memory_history(max_entries=10000)
        x = torch.empty(8 * 2**20, dtype=torch.uint8, device=dev)
        del x
        with open(os.path.join(d, "request-snapshot-gpucheck.json"), "w") as fh:
            fh.write("{}")
        p.tick()
        snap = os.path.join(d, f"snapshot-{os.getpid()}-gpucheck.pickle")
        status = json.load(open(os.path.join(d, f"snapshot-{os.getpid()}-gpucheck.json")))
        print(f"  snapshot status: {status}")
        check(os.path.exists(snap) and os.path.getsize(snap) > 0, "snapshot dumped on request")
    finally:
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass
    p.stop()
    check(not os.path.exists(core.record_path(d, os.getpid())), "record removed at stop")


CHILD = r"""
import os, time, torch
x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
path = os.path.join(os.environ["FRAGSCOPE_PROBE_DIR"], "torch-%d.json" % os.getpid())
deadline = time.time() + 20
while not os.path.exists(path) and time.time() < deadline:
    time.sleep(0.05)
print("PUBLISHED", os.path.exists(path))
"""


def launcher_section() -> None:
    print("== probe through fragscope-probe (child process)")
    d = tempfile.mkdtemp(prefix="fragscope-gpucheck-child-")
    cmd = [sys.executable, "-c", "from fragscope.probe import launcher_main; launcher_main()",
           "--dir", d, "--interval", "0.2", sys.executable, "-c", CHILD]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        check(False, "child finished within 90 s")
        return
    print("  " + (r.stdout.strip() or r.stderr.strip()[-300:]))
    check(r.returncode == 0 and "PUBLISHED True" in r.stdout, "child under the launcher published a record")
    check(not [n for n in os.listdir(d) if n.startswith("torch-")], "child removed its record at exit")


def oom_replay_section() -> None:
    print("== OOM replay on a real snapshot (history on, capped process)")
    import torch

    from fragscope.detectors.snapshot import analyse_snapshot_obj

    MiB = 1 << 20
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    record_host = True
    try:  # torch >= 2.14: pinned host memory in the snapshot (unverified layout in fragscope)
        torch.cuda.memory._record_memory_history(max_entries=200_000, record_pinned_host_memory=True)
    except TypeError:
        record_host = False
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    cap = 2 * 1024 * MiB  # this process may use 2 GiB of the GPU
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    pinned = torch.empty(64 * MiB, dtype=torch.uint8).pin_memory() if record_host else None
    blocks = []
    try:
        while True:  # 6 MiB blocks (three share each 20 MiB segment) until the cap refuses
            blocks.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        pass
    held = blocks[1::2]
    # every other block freed: 6-8 MiB holes between live blocks, and no segment entirely free (so
    # the allocator's release-and-retry on OOM cannot help)
    del blocks
    request = 18 * MiB  # > 10 MiB: needs a block of its own size; the cap refuses a new segment
    oom = False
    try:
        torch.empty(request, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        oom = True
    check(oom, "an 18 MiB allocation failed with only 6-8 MiB holes free")
    del held, pinned
    torch.cuda.empty_cache()  # the dump-time state: nearly empty
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    doc, findings = analyse_snapshot_obj(snap, source="gpu_check", device_total_bytes=total)
    dev = next((d for d in doc.get("devices", []) if d.get("ooms")), None)
    check(dev is not None, "the snapshot's trace holds the OOM")
    if dev is None:
        return
    o = dev["ooms"][-1]
    print("  " + json.dumps({k: o.get(k) for k in ("classification", "state_at", "replayed_entries", "replay_problem",
                                                    "reserved_bytes", "allocated_bytes", "size_bytes",
                                                    "same_stream_inactive_bytes",
                                                    "same_stream_largest_free_block_bytes")}, default=str))
    print("  at dump: " + json.dumps(o.get("at_dump"), default=str)[:400])
    check(o.get("state_at") == "oom" and not o.get("replay_problem"),
          "the real trace entries after the OOM replay without a problem")
    check((o.get("same_stream_inactive_bytes") or 0) >= request
          and (o.get("same_stream_largest_free_block_bytes") or 0) < request,
          "at the OOM: free bytes >= the request, no free block as large")
    # the driver had room (the cap refused), so memory-cap is as right as fragmentation here
    check(o.get("classification") in ("fragmentation", "memory-cap"),
          f"classified fragmentation or memory-cap (got {o.get('classification')})")
    if record_host:
        host = doc.get("host") or {}
        print("  host: " + json.dumps(host, default=str)[:400])
        check(host.get("reserved_bytes") is not None, "torch >= 2.14: the pinned host section's layout was read")


def main() -> int:
    why = gpu_present()
    if why is not None:
        print(f"gpu_check: no NVIDIA GPU here ({why}); nothing to check. Run it on a machine with a GPU.")
        return 0
    for section in (nvml_section, probe_section, launcher_section, oom_replay_section):
        try:
            section()
        except Exception as e:
            check(False, f"{section.__name__} raised {type(e).__name__}: {e}")
    print("GPU CHECK: PASS" if not FAILS else f"GPU CHECK: FAIL ({len(FAILS)}): " + "; ".join(FAILS))
    return 0 if not FAILS else 1


if __name__ == "__main__":
    sys.exit(main())
