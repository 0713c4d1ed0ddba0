"""Regenerate the bundled example incidents (deterministic: same files every run).

    python examples/make_examples.py

Each file is an 8-hour OpenMetrics recording at 60 s steps, gzipped, made by fragscope.scenarios
(docs/scenarios.md). examples/README.md says what each shows.
"""
from __future__ import annotations

import os
import sys

from fragscope.scenarios import Scenario, write_openmetrics

HERE = os.path.dirname(os.path.abspath(__file__))

EXAMPLES = {
    # The seeds' reference case: onset at 02:40, over the next 6 h 1,200 -> 300 tokens/s, fragmentation
    # 5 % -> 35 %, batch 128 -> 32, preemptions 0 -> hundreds/min, utilization 85-90 %, traffic flat.
    "fragmentation-incident.om.gz": Scenario("allocator-fragmentation", step_s=60, daily_wave=False, seed=1),
    # Longer requests fill the KV cache: usage ~1, preemptions, queue, TTFT p99 up while p50 holds.
    "kv-pressure-incident.om.gz": Scenario("kv-cache-pressure", step_s=60, seed=2),
    # Nothing wrong: traffic follows its daily wave.
    "healthy.om.gz": Scenario("healthy", step_s=60, seed=3),
}


def main(out_dir: str = HERE) -> int:
    for name, scenario in EXAMPLES.items():
        path = os.path.join(out_dir, name)
        # gzip's header carries a timestamp: write through a fixed-mtime GzipFile so files are reproducible
        import gzip

        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            truth = write_openmetrics(scenario, gz)
        print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB; truth: {sorted(truth.diagnoses) or 'healthy'}; "
              f"{truth.notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
