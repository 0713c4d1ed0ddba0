"""The engine-log code keeps one job per module (issue 9): the pattern table is data, the detectors
do no I/O, the old import surface still works."""
from __future__ import annotations

import ast
from pathlib import Path

import fragscope

PKG = Path(fragscope.__file__).parent
IO_MODULES = {"os", "io", "gzip", "zlib", "socket", "subprocess", "shutil", "pathlib", "open", "sqlite3", "urllib",
              "http", "requests", "time"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(("." * node.level) + (node.module or ""))
    return out


def test_log_detectors_import_no_io_and_no_reader():
    for name in ("logs.py", "log_oom.py"):
        imps = _imports(PKG / "detectors" / name)
        assert not {i.split(".")[0] for i in imps} & (IO_MODULES - {"time"}), (name, imps)
        assert not any(i.endswith(("reader", "tail", "collectors.logs")) or i == "..collectors.enginelog"
                       for i in imps), (name, imps)
        # no open() calls either
        tree = ast.parse((PKG / "detectors" / name).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "open"]


def test_pure_parsing_modules_do_no_io():
    for name in ("events.py", "prefixes.py", "patterns.py", "parser.py", "state.py"):
        imps = {i.split(".")[0] for i in _imports(PKG / "collectors" / "enginelog" / name)}
        assert not imps & (IO_MODULES - {"time"}), (name, imps)


def test_pattern_table_covers_every_event_kind():
    from fragscope.collectors.enginelog.events import KINDS
    from fragscope.collectors.enginelog.patterns import RULES

    assert {r.kind for r in RULES} == set(KINDS)
    for r in RULES:
        assert r.gates and all(g for g in r.gates)


def test_old_import_surface():
    from fragscope.collectors import logs

    for name in ("GIB", "MIB", "LogCollector", "LogEvent", "LogParser", "LogState", "iter_file_lines", "parse_log",
                 "parse_log_line", "SIGNAL_NAMES", "KINDS"):
        assert hasattr(logs, name), name


def test_modules_stay_small():
    for p in [*(PKG / "collectors" / "enginelog").glob("*.py"), PKG / "collectors" / "logs.py",
              PKG / "collectors" / "tail.py", PKG / "detectors" / "logs.py", PKG / "detectors" / "log_oom.py"]:
        assert len(p.read_text().splitlines()) < 500, p
