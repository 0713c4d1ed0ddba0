"""Advice the diagnoses share, below the detectors so each diagnosis module can hold its own playbook:
the knobs of each kind of job (jobs.py: which flag of which program an action names) and the fix texts
several playbooks quote (fixes.py: one wording, preconditions and contraindications per fix)."""
