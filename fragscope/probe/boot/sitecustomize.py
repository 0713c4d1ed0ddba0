"""fragscope probe bootstrap: imported by Python at start-up in every process of the engine.

``fragscope-probe CMD`` puts this directory first on PYTHONPATH and sets FRAGSCOPE_PROBE=1, so
each Python process the command starts (vLLM's API server, engine core, workers) runs this file.
It starts the probe thread (standard library only, no torch import), then runs the
``sitecustomize`` this one shadows, if any. Nothing here may raise.
"""
import os as _os
import sys as _sys


def _fragscope_boot():
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.environ.get("FRAGSCOPE_PROBE", "").strip().lower() in ("1", "true", "yes", "on"):
        try:
            try:
                from fragscope.probe import core as _core
            except ImportError:
                # fragscope is not importable in this environment: load the stdlib-only module by path
                import importlib.util as _u
                path = _os.path.join(_os.path.dirname(here), "core.py")
                spec = _u.spec_from_file_location("_fragscope_probe_core", path)
                _core = _u.module_from_spec(spec)
                _sys.modules["_fragscope_probe_core"] = _core
                spec.loader.exec_module(_core)
            _core.start()
        except Exception:
            pass
    # chain to the sitecustomize we shadow (e.g. a distribution's), as if we were not here
    try:
        import importlib.machinery as _m
        import importlib.util as _u
        rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
        spec = _m.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None and spec.origin != __file__:
            mod = _u.module_from_spec(spec)
            spec.loader.exec_module(mod)
    except Exception:
        pass


_fragscope_boot()
del _fragscope_boot
