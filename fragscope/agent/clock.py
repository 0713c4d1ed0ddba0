"""Noticing wall-clock steps (NTP correcting a paused VM, someone running ``date -s``).

Scheduling never depends on the wall clock (monotonic), and stored history keeps the timestamps it
was written with. The detection ring is shifted by the jump so the recent window stays continuous
(rates and trends are judged on sample spacing, which did not change just because the clock did).
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("fragscope.agent")

CLOCK_JUMP_S = 5.0  # wall - monotonic moving by more than this is a step, not NTP slewing


class ClockWatch:
    """Called by every collector before it stamps samples and by housekeeping; logs once per jump."""

    def __init__(self, state) -> None:
        self.state = state
        self.offset = time.time() - time.monotonic()
        self._lock = threading.Lock()

    def check(self, wall: float, mono: float) -> None:
        off = wall - mono
        delta = off - self.offset
        if abs(delta) <= CLOCK_JUMP_S:
            return
        with self._lock:
            delta = off - self.offset  # another thread may have handled it meanwhile
            if abs(delta) <= CLOCK_JUMP_S:
                return
            self.offset = off
            st = self.state
            st.ring.shift(delta)
            st.clock_jumps += 1
            st.last_clock_jump_seconds = delta
            log.warning("wall clock jumped by %+.1f s; scheduling is unaffected (monotonic clock), new "
                        "samples carry the new time, stored history keeps its timestamps, the detection "
                        "window was shifted to stay continuous", delta)
            st.bump()
