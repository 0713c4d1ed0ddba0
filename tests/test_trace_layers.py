"""The kernel-timeline modules keep their layers (issue 9): detectors import no readers and do no I/O, the
two readers do not import each other, the model imports no other fragscope module, and none is long."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fragscope"
DETECTORS = sorted((PKG / "detectors").glob("timeline*.py"))
IO_MODULES = {"os", "io", "gzip", "zlib", "sqlite3", "json", "shutil", "pathlib", "subprocess", "socket",
              "urllib", "connectorx"}


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module, level) of every import in the file, top level or not (a lazy import counts too)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out += [(a.name, 0) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            out.append((n.module or "", n.level))
    return out


def test_timeline_detectors_do_no_io():
    assert len(DETECTORS) >= 5
    for p in DETECTORS:
        src = p.read_text()
        for mod, level in _imports(p):
            assert mod.split(".")[0] not in IO_MODULES, (p.name, mod)
            assert "collectors" not in mod and "cli" not in mod.split(".") and "agent" not in mod, (p.name, mod)
        assert "open(" not in src, p.name


def test_readers_do_not_import_each_other_and_model_stands_alone():
    kin = {m for m, _ in _imports(PKG / "collectors" / "kineto.py")}
    nsys = {m for m, _ in _imports(PKG / "collectors" / "nsys.py")}
    assert "nsys" not in kin and not any(m.endswith("nsys") for m in kin)
    assert "kineto" not in nsys and not any(m.endswith("kineto") for m in nsys)
    model = _imports(PKG / "timeline_model.py")
    assert all(level == 0 and not m.startswith("fragscope") for m, level in model), model


def test_trace_modules_are_short():
    files = DETECTORS + [PKG / "timeline_model.py", PKG / "trace_pipeline.py", PKG / "trace_playbooks.py",
                         PKG / "cli" / "trace_cmd.py"] + sorted((PKG / "collectors").glob("*.py"))
    trace_files = [p for p in files if p.name in {"kineto.py", "nsys.py", "nsys_join.py", "sqlite_columns.py",
                                                   "trace_format.py", "trace_io.py"} or p.parent.name != "collectors"]
    for p in trace_files:
        assert len(p.read_text().splitlines()) <= 500, p
