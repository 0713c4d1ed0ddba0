"""Shared test set-up."""
import os
import sys
import tempfile

# pytest-xdist's workers (the README's `-n 2`) get COLUMNS=80 from their launcher; the report renders
# 100 columns when COLUMNS is unset (piped output), as it does in a plain `pytest` run. Keep both alike,
# so a test's expected wrapping does not depend on how the suite was started.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# Compiled bytecode outside the tree when PYTHONDONTWRITEBYTECODE=1 (the development VM sets it, to keep
# __pycache__ out of the work trees). Without a cache, every run paid, in each xdist worker, pytest's
# assertion rewriting of every test module (8-10 s of CPU per worker here: the rewrite is an AST pass, 14x
# a plain compile) and the compile of fragscope's sources, and every `python -c "from fragscope.cli ..."`
# the tests start (~230 a run) compiled the modules it imports again (0.1-0.2 s each). The cache goes to a
# private prefix in the temp dir (sys.pycache_prefix, PYTHONPYCACHEPREFIX for the child interpreters: the
# source tree is left alone), keyed by each source's mtime and size as Python's and pytest's own caches
# are; pytest's carries its version in the file name. A prefix holds every module's bytecode, installed
# packages' too (they are looked up there, not beside their sources), so the children write to it as well:
# the first run with an empty prefix compiles everything once. Where bytecode is written anyway (no
# PYTHONDONTWRITEBYTECODE), nothing changes here; FRAGSCOPE_TEST_PYCACHE=off keeps the old behaviour.
if sys.dont_write_bytecode and os.environ.get("FRAGSCOPE_TEST_PYCACHE", "") != "off":
    _prefix = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(
        tempfile.gettempdir(), f"fragscope-tests-pycache-{os.getuid() if hasattr(os, 'getuid') else 0}")
    sys.pycache_prefix = _prefix
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = _prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
