"""Join helpers of the Nsight Systems reader: process ids from nsys global ids, (PID, correlationId) join
keys, and the op -> launch-call join itself, in numpy, in place where possible (each new 16 MB array is
page faults: 7 ms and more on the development VM). Pure (numpy and two threads; no I/O)."""
from __future__ import annotations

import threading

import numpy as np


def pid_from_global_id(global_id: np.ndarray) -> np.ndarray:
    """PID = (globalPid >> 24) & 0xFFFFFF, in ``global_id``'s buffer (overwritten)."""
    np.right_shift(global_id, 24, out=global_id)
    return np.bitwise_and(global_id, 0xFFFFFF, out=global_id)


SCRATCH_ROWS = 1 << 16  # rows per step where a full-length temporary would otherwise be needed
_DENSE_SPAN = 4  # link: direct table when a block's call keys span at most this times their count


def join_key(pid: np.ndarray, corr: np.ndarray, pid_reusable: bool) -> np.ndarray:
    """(PID << 32) | correlationId, one int64 join key; -1 where there is no correlation (corr < 0).
    Written over ``pid`` when ``pid_reusable``, else over ``corr`` (in steps, through a small scratch
    buffer: no new full-length array either way)."""
    none = corr < 0
    np.bitwise_and(corr, 0xFFFFFFFF, out=corr)
    if pid_reusable:
        key = np.left_shift(pid, 32, out=pid)
        np.bitwise_or(key, corr, out=key)
    else:
        key = corr
        scratch = np.empty(min(SCRATCH_ROWS, pid.size), dtype=np.int64)
        for a in range(0, pid.size, SCRATCH_ROWS):
            b = min(a + SCRATCH_ROWS, pid.size)
            sc = scratch[: b - a]
            np.left_shift(pid[a:b], 32, out=sc)
            np.bitwise_or(key[a:b], sc, out=key[a:b])
    if none.any():
        key[none] = -1
    return key


def link(op_key: np.ndarray, call_key: np.ndarray) -> np.ndarray:
    """Index of the call with the same key for each op (-1: none; keys < 0 never match; among calls with
    equal keys the first). Same result as kineto.link_by_key; runtime rows usually come in correlation
    order, so the sort is skipped when the keys are already sorted. One new array (the result), filled
    in blocks of SCRATCH_ROWS ops by two threads (numpy releases the GIL on each block's operations).

    A block looks only at the calls between its smallest and largest key (ops come roughly in
    correlation order, so that window is about a block long). Correlation ids are dense counters: when
    the window's keys span at most _DENSE_SPAN times its length, a direct table from key to first call
    replaces the binary search (2 M ops against 2 M calls: 39 ms of CPU against 60 ms here)."""
    if not call_key.size or not op_key.size:
        return np.full(op_key.size, -1, dtype=np.int64)
    if call_key.size < 2 or bool((call_key[1:] >= call_key[:-1]).all()):
        order, sk = None, call_key
    else:
        order = np.argsort(call_key, kind="stable")
        sk = call_key[order]
    # Written here first: new memory is paged in by one thread. Two threads paging in their halves at once
    # took three times the CPU on the development VM (2 M ops: 70 ms against 28 ms with this fill).
    pos = np.full(op_key.size, -1, dtype=np.int64)
    last = sk.size - 1
    first_valid = int(np.searchsorted(sk, 0))  # keys < 0 (no correlation) come first and never match

    def part(lo: int, hi: int) -> None:
        # every temporary is this thread's and reused block after block: allocating them anew each
        # block makes glibc map and unmap them (page faults), which doubled this function's time
        scratch = np.empty(min(SCRATCH_ROWS, hi - lo), dtype=np.int64)
        miss = np.empty(scratch.size, dtype=bool)
        table = keys = iota = np.empty(0, dtype=np.int64)
        first = np.empty(0, dtype=bool)
        for a in range(lo, hi, SCRATCH_ROWS):
            b = min(a + SCRATCH_ROWS, hi)
            p, ok, m, sc = pos[a:b], op_key[a:b], miss[: b - a], scratch[: b - a]
            w0 = max(int(np.searchsorted(sk, ok.min())), first_valid)
            w1 = int(np.searchsorted(sk, ok.max(), side="right"))
            win = sk[w0:w1]
            nw = win.size
            span = int(win[-1] - win[0]) + 1 if nw else 0
            dense = 0 < span <= _DENSE_SPAN * max(nw, b - a)
            if dense:
                if keys.size < nw:
                    keys, iota, first = np.empty(nw, dtype=np.int64), np.arange(nw, dtype=np.int64), np.empty(nw, bool)
                np.not_equal(win[1:], win[:-1], out=first[1:nw])
                dense = bool(first[1:nw].all())  # no repeated key (else the binary search below)
            if dense:
                if table.size < span:
                    table = np.empty(span, dtype=np.int64)
                t = table[:span]
                t.fill(-1)
                t[np.subtract(win, win[0], out=keys[:nw])] = iota[:nw]  # key -> position in the window
                idx = np.subtract(ok, win[0], out=sc)
                np.less(idx, 0, out=m)
                m |= idx >= span
                np.clip(idx, 0, span - 1, out=idx)
                np.take(t, idx, out=p)
                p[m] = -1
                np.less(p, 0, out=m)
                p += w0
            else:
                np.add(np.searchsorted(win, ok), w0, out=p)
                np.minimum(p, last, out=p)
                np.not_equal(np.take(sk, p, out=sc), ok, out=m)
                m |= ok < 0
            if order is not None:
                np.take(order, np.maximum(p, 0), out=sc)
                p[:] = sc
            p[m] = -1

    _in_two(op_key.size, part)
    return pos


def _in_two(n: int, fn) -> None:
    """fn(0, half) in a second thread and fn(half, n) here when n is large enough to gain from it."""
    if n < 2 * SCRATCH_ROWS:
        fn(0, n)
        return
    half = n // 2
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(0, half)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        fn(half, n)
    finally:
        t.join()
    if errors:
        raise errors[0]

