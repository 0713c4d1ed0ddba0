"""Messages wrapped over several lines (a terminal's width, a bug report's paste, a logger's own line breaks)
joined back into one before they are read. Pure. docs/logs.md#wrapped-messages.

Only the messages whose figures decide a verdict are rejoined: vLLM's start-up failures ("To serve at least one
request with the model's max seq len …", "Free memory on device (…) on startup is less than desired …", "The
model's max seq len … is larger than the maximum number of tokens …") and PyTorch's OOM text ("… out of memory.
Tried to allocate …"). A line holding the start of one is joined with the lines after it that carry no prefix of
their own (no timestamp, no engine header, no process tag) and do not start such a message themselves, at most ``MAX_LINES`` of them and ``MAX_CHARS`` in
all, as long as each join makes the message read more figures. Each break is tried glued ("KV cach" + "e is
needed") and with a space ("(1048576)," + "22.5 GiB"); the reading with more figures wins.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from .patterns import parse_message

HEADS = ("To serve at least one request with the model", "Free memory on device (", "out of memory. Tried to allocate",
         "is larger than the maximum number of tokens that can be stored")
MAX_LINES = 6
MAX_CHARS = 4096


def has_head(msg: str) -> bool:
    return any(h in msg for h in HEADS)


def score(msg: str) -> int:
    """How much the log reader reads in ``msg``: events plus their fields."""
    return sum(1 + len(f) for _, f, _, _ in parse_message(msg))


def best_join(head: str, cont: str) -> tuple[str, int] | None:
    """The better of ``head + cont`` and ``head + " " + cont`` when it reads more than ``head`` alone, with its
    score; None when neither does."""
    cont = cont.strip()
    if not cont or len(head) + len(cont) > MAX_CHARS or has_head(cont):  # a new message is not a continuation
        return None
    base = score(head)
    best = None
    for joined in (head + cont, head.rstrip() + " " + cont):
        s = score(joined)
        if s > base and (best is None or s > best[1]):
            best = (joined, s)
    return best


def unwrap_lines(lines: Iterable[str], has_prefix) -> Iterator[str]:
    """``lines`` with each wrapped message joined onto its first line; every consumed line is yielded as ""
    so that line numbers stay those of the file. ``has_prefix(line)``: the line opens with a prefix of its own
    (a timestamp, an engine header, a process tag): it starts a new record, never a continuation."""
    held: str | None = None
    n = 0
    consumed = 0
    for line in lines:
        if held is not None:
            if n < MAX_LINES and line.strip() and not has_prefix(line):
                j = best_join(held.rstrip("\r\n"), line.rstrip("\r\n"))
                if j is not None:
                    held, n, consumed = j[0], n + 1, consumed + 1
                    continue
            yield held + "\n"
            yield from ("" for _ in range(consumed))
            held, n, consumed = None, 0, 0
        if has_head(line):
            held = line.rstrip("\r\n")
            continue
        yield line
    if held is not None:
        yield held + "\n"
        yield from ("" for _ in range(consumed))
