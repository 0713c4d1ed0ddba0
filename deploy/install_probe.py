#!/usr/bin/env python3
"""Copy fragscope's in-engine probe into a directory shared with a stock engine image.

    fragscope-install-probe DIR      # the chart's init container: DIR is an emptyDir

Writes DIR/core.py (the probe: standard library only) and DIR/boot/sitecustomize.py. An engine
container with PYTHONPATH=DIR/boot and FRAGSCOPE_PROBE=1 (plus FRAGSCOPE_PROBE_DIR) then starts the
probe in every Python process, without fragscope installed in its image: sitecustomize loads
DIR/core.py by path (docs/probe.md). Exit 0 on success, 2 when DIR cannot be written.
"""
from __future__ import annotations

import os
import shutil
import sys


def install(dst: str) -> list[str]:
    import fragscope.probe

    src = os.path.dirname(os.path.abspath(fragscope.probe.__file__))
    pairs = [(os.path.join(src, "core.py"), os.path.join(dst, "core.py")),
             (os.path.join(src, "boot", "sitecustomize.py"), os.path.join(dst, "boot", "sitecustomize.py"))]
    for s, d in pairs:
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copyfile(s, d)
        os.chmod(d, 0o644)
    return [d for _, d in pairs]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: fragscope-install-probe DIR", file=sys.stderr)
        return 2
    try:
        for p in install(args[0]):
            print(f"fragscope-install-probe: wrote {p}")
    except OSError as e:
        print(f"fragscope-install-probe: cannot write {args[0]}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
