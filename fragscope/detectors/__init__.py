"""Detectors: pure functions (no I/O) from a Frame built from a Window to findings or an inconclusive
entry. Each module declares ID, REQUIRES, CORROBORATES, Config and detect(); the registry
(fragscope.playbooks) lists them and fragscope.pipeline runs them.
"""
