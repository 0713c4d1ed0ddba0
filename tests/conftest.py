"""Shared test set-up."""
import os

# pytest-xdist's workers (the README's `-n 2`) get COLUMNS=80 from their launcher; the report renders
# 100 columns when COLUMNS is unset (piped output), as it does in a plain `pytest` run. Keep both alike,
# so a test's expected wrapping does not depend on how the suite was started.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
