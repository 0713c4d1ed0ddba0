"""Modules talk through public names: no module of fragscope imports another module's underscored name
(``from .x import _y``, ``from fragscope.x import _y``) or reaches into an imported module for one
(``x._y``). A name used only inside its own module may stay private."""
from __future__ import annotations

import ast
from pathlib import Path

import fragscope

ROOT = Path(fragscope.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def crossings(source: str, where: str) -> list[str]:
    """Every use of another fragscope module's private name in ``source`` (a module's text)."""
    tree = ast.parse(source)
    found: list[str] = []
    modules: set[str] = set()  # local names bound to fragscope modules (or anything imported from them)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").split(".")[0] == "fragscope"
            if not ours:
                continue
            for a in node.names:
                if _private(a.name):
                    found.append(f"{where}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}")
                modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fragscope":
                    if any(_private(part) for part in a.name.split(".")):
                        found.append(f"{where}:{node.lineno}: import {a.name}")
                    modules.add(a.asname or "fragscope")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += crossings(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)))
    assert not found, "private names used across modules (give them a public name):\n" + "\n".join(found)


def test_the_check_sees_each_form():
    src = ("from .a import _x, y\nfrom ..b import _z as w\nfrom fragscope.c import _v\nfrom . import d\n"
           "import fragscope.e as e\nfrom os import _exit\nd._p()\ne._q\nd.ok\nimport os as _os\n"
           "from .f import __version__\n")
    got = sorted(crossings(src, "m.py"))
    assert got == ["m.py:1: from .a import _x", "m.py:2: from ..b import _z", "m.py:3: from fragscope.c import _v",
                   "m.py:7: d._p", "m.py:8: e._q"]
