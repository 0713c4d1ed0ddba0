"""Playbook lines that name a setting of one kind of job, and a playbook as a finding of one kind of job shows it.

A PyTorch OOM, a fragmented pool or a full KV pool reads the same from every program, but its fixes are each
program's own flags (the table: collectors/enginelog/jobkind.py KNOBS, read through advice/jobs.py). A playbook
keeps one engine-independent wording per line (``diagnose explain``, and findings whose job is not known: a
metrics window); a finding whose context names its job (``job_kind``: a log's, a memory snapshot's frames) shows
each line in that job's knobs and leaves out the lines about other jobs. Imports nothing beyond the data model, so
the trace path can build playbooks without the log tables.
"""
from __future__ import annotations

from ..model import Action, Playbook


class JobText(str):
    """A playbook line that names a setting of one kind of job.

    Its value is the engine-independent wording: what ``diagnose explain`` prints and what a finding shows when the
    job that produced its evidence is not known (a metrics window). :func:`playbook_for` gives a finding whose job is
    known (its context's ``job_kind``) the wording for that job only: ``by_kind[kind]``, else ``pick(kind)``, else the
    engine-independent wording; None where the line does not apply to that job (it is left out).
    """

    def __new__(cls, text: str, pick=None, /, **by_kind):
        self = super().__new__(cls, text)
        self.pick = pick
        self.by_kind = by_kind
        return self

    def for_kind(self, kind: str | None) -> str | None:
        if kind is None:
            return str(self)
        if kind in self.by_kind:
            return self.by_kind[kind]
        if self.pick is not None:
            return self.pick(kind)
        return str(self)


def only(text: str, *kinds: str) -> JobText:
    """A line that names one engine's setting, labelled with the engine's name in ``text``: kept for ``kinds``, for an
    unknown job and in the engine-independent playbook; left out for every other known kind of job."""
    return JobText(text, lambda k: text if k in kinds or k == "unknown" else None)


def line_for(text, kind: str | None) -> str | None:
    """One playbook line for the job ``kind`` (plain text is the same for every job)."""
    return text.for_kind(kind) if isinstance(text, JobText) else text


def lines_for(texts, kind: str | None) -> list[str]:
    out = []
    for t in texts:
        x = line_for(t, kind)
        if x:
            out.append(str(x))
    return out


def playbook_for(pb: Playbook, kind: str | None) -> Playbook:
    """The playbook ``pb`` (model.Playbook) as a finding of job ``kind`` shows it: each line in that job's knobs,
    lines about other jobs left out. ``kind`` None: unchanged (the engine-independent wording)."""
    if kind is None:
        return pb
    durable = []
    for a in pb.durable:
        text = line_for(a.text, kind)
        if text:
            durable.append(Action(str(text), lines_for(a.preconditions, kind), lines_for(a.contraindications, kind)))
    return Playbook(pb.id, pb.title, str(line_for(pb.meaning, kind) or pb.meaning), lines_for(pb.immediate, kind),
                    durable, lines_for(pb.verify, kind), lines_for(pb.references, kind))


__all__ = ["JobText", "only", "line_for", "lines_for", "playbook_for"]
