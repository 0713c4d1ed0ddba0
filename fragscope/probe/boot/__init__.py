"""Directory that ``fragscope-probe`` prepends to PYTHONPATH: it holds only ``sitecustomize.py``.

(This file exists so the directory is installed with the package; Python never imports it.)
"""
