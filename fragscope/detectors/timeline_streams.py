"""Per-device and per-stream timeline figures: merged busy intervals, gaps, HTA's idle-time categories and
launch statistics, from one device's op columns in start order. Pure (numpy only; threads, no I/O)."""
from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from .. import vec
from ..timeline_model import KERNEL, MEMCPY, MEMCPY_ASYNC, MEMCPY_SYNC, MEMSET, SYNC
from ..vec import xp_of
from .timeline_config import Config

if TYPE_CHECKING:  # (columns are numpy arrays or fragscope.vec.Vec: each function takes the operations from xp_of)
    import numpy as np


def quantiles_of_ns(values_ns: np.ndarray, qs=(50, 90, 99), zeros: int = 0) -> dict | None:
    """Quantiles in seconds of ``zeros`` zeros followed by ``values_ns`` (all > 0 when ``zeros``), with
    np.percentile's arithmetic (its default linear interpolation, operation for operation: the same
    floats). Reorders ``values_ns`` in place (numpy: partitions, the values at the ranks read in their
    sorted places; a list: sorted): callers pass scratch arrays.

    Why not np.percentile: its copy and its partition cost more (28 ms on 2 M values), and its first call
    imports numpy.ma (about 15 ms of the CLI's start). Selecting the few ranks read (exact order
    statistics: the values a full sort puts there; :func:`_place_ranks`) takes 6-16 ms of CPU on 2 M
    values, a sort 110 ms. ``zeros`` lets callers rank only the positive gaps (most gaps between
    overlapping ops are 0)."""
    n = zeros + values_ns.size
    if n == 0:
        return None
    # numpy.lib._function_base_impl._quantile, method "linear" (alpha = beta = 1), one quantile at a time in
    # Python floats: the same IEEE operations on the same operands as numpy's vectorised form
    m = values_ns.size
    ranks = set()  # the ranks read below, counted in values_ns (the zeros come first)
    for q in qs:
        virtual = (n - 1) * (q / 100)
        i = int(math.floor(virtual))
        ranks.update((n - 1,) if virtual >= n - 1 else (i, i + 1))
    ranks = sorted(r - zeros for r in ranks if r >= zeros)
    if hasattr(values_ns, "partition"):
        _place_ranks(values_ns, ranks)
    else:
        values_ns.sort()

    def at(i: int) -> int:  # the value of the whole sorted sample (zeros first) at index i
        if i < 0:
            i += n
        return 0 if m == 0 or i < zeros else int(values_ns[i - zeros])

    out = {}
    for q in qs:
        virtual = (n - 1) * (q / 100)
        prev_i = int(math.floor(virtual))
        next_i = prev_i + 1
        if virtual >= n - 1:
            prev_i = next_i = -1
        gamma = virtual - prev_i
        a, b = at(prev_i), at(next_i)
        diff_b_a = b - a
        v = b - diff_b_a * (1 - gamma) if gamma >= 0.5 else a + diff_b_a * gamma
        out[f"p{q}"] = float(v) / 1e9
    return out


def _place_ranks(values: np.ndarray, ranks: list[int]) -> None:
    """Put the values of the ascending ``ranks`` in their sorted places (numpy), one rank at a time.

    numpy's partition with one kth runs its SIMD selection (AVX2 here: 2-11 ms on 2 M int64), with
    several kth its generic introselect (20-27 ms for the four ranks of p50 and p99 on the same values,
    numpy 2.4): after placing rank r, the next rank is selected in the values after it only (all >= the
    value at r, so its rank there is the rank minus r + 1), and a rank right after the previous one is
    that remainder's minimum, swapped into place (an argmin: 2 ms). Three quantiles of 2 M values: 6-16
    ms against 22-27 ms for one partition at the six ranks.

    The SIMD selection slows down when one value fills a large share of the array around a rank read (2 M
    values, half of them one value: 38-150 ms; a tenth: 17 ms against 24): when one value is a tenth or
    more of an evenly spaced sample of about 1,000, the generic partition at all the ranks at once."""
    n = values.size
    if n <= 4096 or _common_value(values[:: n // 1024]):
        if ranks:
            values.partition(ranks)
        return
    lo = 0
    for r in ranks:
        rest = values[lo:]
        if r == lo:
            j = int(rest.argmin())
            rest[0], rest[j] = rest[j], rest[0]
        else:
            rest.partition(r - lo)
        lo = r + 1


def _common_value(sample: np.ndarray) -> bool:
    """Whether one value is a tenth or more of ``sample`` (numpy)."""
    np = xp_of(sample)
    s = np.sort(sample)
    # where each run of equal values ends, with one end before the first
    ends = np.concatenate(([-1], np.flatnonzero(s[1:] != s[:-1]), [s.size - 1]))
    return int(np.diff(ends).max()) * 10 >= s.size


def ns_bound(t: float, up: bool):
    """``t`` (ns, a float) as the integer that int64 values compare with as they compare with ``t``: rounded
    up for ``>=`` and ``<``, down for ``>`` and ``<=``. numpy compares an int64 array with a float in
    float64, converting each value (5-10 ms on 2 M values here, against 2 for an integer bound); an int64
    below 2**53 converts exactly and the rounding of larger ones keeps their order, so the truth of each
    comparison is the same. ``t`` itself where that does not hold (not finite, or 2**53 and more)."""
    if not abs(t) < 2.0 ** 53:
        return t
    return math.ceil(t) if up else math.floor(t)


def sec(ns) -> float:
    return float(ns) / 1e9


THREAD_MIN_OPS = 200_000  # below this a second thread costs more than it saves


class Device:
    """One device's figures, its own and per stream, from its ops' columns in start order.

    The device's merged intervals and the grouping by (process, stream) need only the ops' times and
    streams; the rest waits for the per-op launch columns (``set_launch``). With ``threaded`` a worker
    thread starts on the former at once; then the worker and the thread calling ``result()`` share the
    remaining tasks: each stream's figures (largest first), an optional ``extra`` task (the host figures),
    and the device's launch figures. Streams come back in grouping order, their idle breakdowns summed
    in that order: the same floats as one thread."""

    def __init__(self, d: int, s, e, kd, comm, pid, sid, c_kind, cfg: Config, threaded: bool) -> None:
        self.d, self.s, self.e, self.kd, self.comm, self.pid, self.sid = d, s, e, kd, comm, pid, sid
        self.c_kind, self.cfg = c_kind, cfg
        self.launch: tuple = ()
        self.sync: tuple = ()
        self.extra = None
        self.launch_set = threading.Event()
        self.grouped = threading.Event()
        self.lock = threading.Lock()
        self.streams_done = threading.Condition(self.lock)  # notified when the last stream is done, or on an error
        self.tasks: list | None = None
        self.next = 0
        self.streams_left = 0
        self.groups: list = []  # per stream: its ops (a slice, or indices in start order)
        self.m: dict = {}
        self.comp_busy = 0
        self.all_kernels = False  # every op of the device is a kernel (then so is every op of each stream)
        self.fields: dict = {}
        self.dev_launch: dict = {}
        self.extra_result = None
        self.out: dict[int, tuple[dict, np.ndarray]] = {}
        self.errors: list[BaseException] = []
        self.thread = None
        if threaded:
            self.thread = threading.Thread(target=self._worker, daemon=True)
            self.thread.start()

    def set_launch(self, ls, flags, dd, sync: tuple, extra=None) -> None:
        """The per-op launch columns (this device's, in its order: launch call starts, :data:`FIRST` /
        :data:`SHORT_OK` / :data:`SHORT` flags, launch delays), the synchronizing calls, and an optional
        extra task to run among the device's."""
        self.launch, self.sync, self.extra = (ls, flags, dd), sync, extra
        self.launch_set.set()

    def abort(self) -> None:
        """The caller failed: let the worker stop (it would otherwise wait for set_launch)."""
        self._fail(RuntimeError("analysis aborted"))
        self.launch_set.set()

    def _fail(self, e: BaseException) -> None:
        with self.lock:
            self.errors.append(e)
            self.streams_done.notify_all()  # (a thread waiting for the streams stops)

    def _worker(self) -> None:
        try:
            self._group()
            self._merged()
            self.launch_set.wait()
            if self.errors:
                return
            self._fields()
            self._take()
        except BaseException as e:  # noqa: BLE001 -- re-raised by result()
            self._fail(e)
            self.grouped.set()

    def _group(self) -> None:
        pmin, pmax = (int(self.pid.min()), int(self.pid.max())) if self.pid.size else (0, 0)
        key = self.sid if pmin == pmax else self.sid + (self.pid << 40)  # one process (or none known): by stream
        self.groups = _group(key)
        self.all_kernels = bool((self.kd == KERNEL).all())
        self.grouped.set()

    def _merged(self) -> None:
        s, e, kd, comm, ck = self.s, self.e, self.kd, self.comm, self.c_kind
        # the gaps' start times are needed only to match them with synchronizing calls
        maybe_sync = bool(((ck == SYNC) | (ck == MEMCPY_SYNC) | (ck == MEMCPY_ASYNC)).any())
        self.m = m = merged_spans(s, e, gap_starts=maybe_sync)
        if not comm.any() and self.all_kernels:
            self.comp_busy = m["busy_ns"]  # the same intervals
        else:
            compm = (kd == KERNEL) & ~comm
            self.comp_busy = merged_spans(s[compm], e[compm])["busy_ns"] if compm.any() else 0

    def _fields(self) -> None:
        """The device's own figures but its launch and wait ones (after set_launch)."""
        m, cfg, np = self.m, self.cfg, xp_of(self.s)
        n_sync, sync_starts, sync_cmend = self.sync
        # Which gaps follow a synchronizing call? (before _interval_fields reorders the gap lengths)
        sync_gap = 0
        if n_sync and m["gap_starts"].size:
            j = np.searchsorted(sync_starts, m["gap_starts"], side="right") - 1
            ok = j >= 0
            cov = np.zeros(j.size, dtype=bool)
            cov[ok] = sync_cmend[j[ok]] + cfg.sync_tolerance_s * 1e9 >= m["gap_starts"][ok]
            sync_gap = int(m["gap_lengths"][cov].sum())
        m.pop("gap_starts", None)
        n = int(self.kd.size)
        f = {"ops": {"kernel": n, "memcpy": 0, "memset": 0} if self.all_kernels else _op_counts(self.kd)}
        f.update(_interval_fields(m, cfg))
        f["compute_seconds"] = sec(self.comp_busy)
        f["non_compute_seconds"] = sec(m["span_ns"] - self.comp_busy - m["idle_ns"])
        f["sync_gap_ratio"] = (sync_gap / m["idle_ns"]) if m["idle_ns"] > 0 else None
        self.fields, self.m = f, {}

    def _take(self) -> None:
        """Run tasks until none is left: the streams, largest first, the extra task, then the device's launch
        figures (quantiles of all its launch delays), which reorder the device's delays in place (no copy of
        them) once every stream has gathered its own."""
        with self.lock:
            if self.tasks is None:
                sizes = [_size(g) for g in self.groups]
                self.tasks = sorted(range(len(sizes)), key=lambda k: -sizes[k]) + ([-2] if self.extra else []) + [-1]
                self.streams_left = len(sizes)
        while not self.errors:
            with self.lock:
                i, self.next = self.next, self.next + 1
            if i >= len(self.tasks):
                return
            k = self.tasks[i]
            if k == -1:
                with self.lock:
                    while self.streams_left and not self.errors:
                        self.streams_done.wait()
                if self.errors:
                    return
                self.dev_launch = _launch_fields(*self.launch[1:], self.cfg, own=True)
            elif k == -2:
                self.extra_result = self.extra()
            else:
                self.out[k] = self._stream(k)
                with self.lock:
                    self.streams_left -= 1
                    if not self.streams_left:
                        self.streams_done.notify_all()

    def _stream(self, k: int) -> tuple[dict, np.ndarray]:
        s, e, kd, pid, sid, cfg = self.s, self.e, self.kd, self.pid, self.sid, self.cfg
        ls, flags, dd = self.launch
        ix = self.groups[k]
        s_, e_ = s[ix], e[ix]
        sm = merged_spans(s_, e_)
        w = _idle_breakdown(s_, e_, ls[ix], cfg.kernel_wait_cutoff_s * 1e9)
        del s_, e_
        a0 = ix.start if type(ix) is slice else int(ix[0])
        n = _size(ix)
        st = {"stream": int(sid[a0]),
              "ops": {"kernel": n, "memcpy": 0, "memset": 0} if self.all_kernels else _op_counts(kd[ix])}
        if pid[a0] >= 0:
            st["pid"] = int(pid[a0])
        st.update(_interval_fields(sm, cfg))
        st.update(_wait_fields(w))
        # (a slice of the delays is a view of the device's: not to be reordered)
        st.update(_launch_fields(flags[ix], dd[ix], cfg, own=type(ix) is not slice))
        return st, w

    def result(self) -> dict:
        """The device's dict (after set_launch); the extra task's result is in ``extra_result``."""
        if self.thread is None:
            self._group()
            self._merged()
            self._fields()
            self._take()
        else:
            self.grouped.wait()
            try:
                self._take()
            except BaseException as e:  # noqa: BLE001 -- re-raised below, after the worker stopped
                self._fail(e)
            self.thread.join()
        if self.errors:
            raise self.errors[0]
        streams, waits = [], xp_of(self.s).zeros(3, dtype="float64")
        for k in range(len(self.groups)):
            st, w = self.out[k]
            waits += w
            streams.append(st)
        dev = {"device": int(self.d), **self.fields}
        dev.update(_wait_fields(waits))
        dev.update(self.dev_launch)
        streams.sort(key=lambda x: -x["busy_seconds"])
        dev["streams"] = streams
        return dev


def _size(g) -> int:
    return g.stop - g.start if type(g) is slice else int(g.size)


GROUP_BY_MASKS = 16  # keys spanning at most this many values: one mask per value instead of a sort


def _group(key: np.ndarray) -> list:
    """Stable grouping by key, groups in ascending key order: each group's positions (a slice when it is
    all of them, else indices in ascending order)."""
    if key.size == 0:
        return []
    np = xp_of(key)
    kmin, kmax = int(key.min()), int(key.max())
    if kmin == kmax:
        return [slice(0, int(key.size))]
    if kmax - kmin < GROUP_BY_MASKS and np is not vec:
        # a few streams: the positions of each code, one comparison of 8-bit codes each (2 M ops in 4
        # streams: 23-27 ms against 37-68 ms for the sort below and its gathers)
        codes = np.subtract(key, kmin, out=np.empty(key.size, dtype=np.uint8), casting="unsafe")
        m = np.empty(key.size, dtype=bool)
        groups = [np.flatnonzero(np.equal(codes, c, out=m)) for c in range(kmax - kmin + 1)]
        return [g for g in groups if g.size]
    if kmax - kmin < 1 << 16 and np is not vec:  # stream ids are small: a radix sort on 16-bit codes
        codes = np.subtract(key, kmin, out=np.empty(key.size, dtype=np.uint16), casting="unsafe")
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        cuts = np.flatnonzero(sc[1:] != sc[:-1]) + 1
        counts = np.diff(np.concatenate(([0], cuts, [key.size])))
    else:
        order = np.argsort(key, kind="stable")
        sk = key[order]
        cuts = np.flatnonzero(sk[1:] != sk[:-1]) + 1
        counts = np.diff(np.concatenate(([0], cuts, [key.size])))
    bounds = [0] + np.cumsum(counts).tolist()
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def merged_spans(s: np.ndarray, e: np.ndarray, gap_starts: bool = False) -> dict:
    """Union of intervals sorted by start: busy time and the gaps between merged runs (nsys pairing:
    a gap exists where the next start is after the running maximum end).

    ``gap_lengths``: the positive gaps in time order (``gap_starts``, when asked, where each begins);
    the other ``gap_zeros`` gaps are 0. (Keeping the zeros in, clipped, would spare gathering the
    positive ones, but a selection among many equal values is slow: :func:`_place_ranks`.)"""
    np = xp_of(s)
    if s.size == 0:
        return {"span_ns": 0, "busy_ns": 0, "idle_ns": 0, "gap_lengths": s, "gap_starts": s, "gap_zeros": 0, "n": 0}
    cm = np.maximum.accumulate(e)
    span = int(cm[-1] - s[0])
    # the gaps, over the running maximum's buffer unless their start times are wanted
    d = s[1:] - cm[:-1] if gap_starts else np.subtract(s[1:], cm[:-1], out=cm[:-1])
    pos = d > 0
    lengths = d[pos]
    idle = int(lengths.sum())
    out = {"span_ns": span, "busy_ns": span - idle, "idle_ns": idle, "gap_lengths": lengths,
           "gap_zeros": int(s.size) - 1 - int(lengths.size), "n": int(s.size)}
    if gap_starts:
        out["gap_starts"] = cm[:-1][pos]
    return out


def _interval_fields(m: dict, cfg: Config) -> dict:
    """Busy/idle figures and the gap distribution of a :func:`merged_spans` result (reorders its
    ``gap_lengths`` in place: use ``gap_starts`` before)."""
    span = m["span_ns"]
    out = {
        "span_seconds": sec(span),
        "busy_seconds": sec(m["busy_ns"]),
        "idle_seconds": sec(m["idle_ns"]),
        "busy_ratio": (m["busy_ns"] / span) if span > 0 else None,
        "idle_ratio": (m["idle_ns"] / span) if span > 0 else None,
    }
    lengths = m["gap_lengths"]
    np = xp_of(lengths)
    long_ns = ns_bound(cfg.long_gap_s * 1e9, up=True)
    long_gaps = int(np.count_nonzero(lengths >= long_ns))
    longest = lengths.max() if lengths.size else 0
    gq = quantiles_of_ns(lengths, zeros=m["gap_zeros"])  # reorders the gaps in place
    if gq is not None:
        gq["max"] = sec(longest)
    out["gap_seconds"] = gq
    out["long_gaps"] = long_gaps
    return out


def _idle_breakdown(s: np.ndarray, e: np.ndarray, ls: np.ndarray, kw_ns: float) -> np.ndarray:
    """HTA's idle-time categories on one stream (ops sorted by start): [host, kernel, other] ns.

    gap = start - previous op's end; host wait if this op's launch call started after the previous op
    ended (the CPU was late); else kernel wait if gap < cutoff; else other. Sums of integer ns, exact
    (the float sums they replace were exact too below 2**53 ns, 104 days)."""
    np = xp_of(s)
    if s.size < 2:
        return np.zeros(3)
    prev_end = e[:-1]
    gap = s[1:] - prev_end
    host = ls[1:] > prev_end
    kern = gap < ns_bound(kw_ns, up=True)
    kern &= ~host
    if np is vec:
        h, k = int(gap[host].sum()), int(gap[kern].sum())
    else:  # int64 dot products with the masks: the same wrapping int64 sums, without copying the gaps out
        h, k = int(np.dot(gap, host)), int(np.dot(gap, kern))
    return np.array([h, k, int(gap.sum()) - h - k], dtype=np.float64)


def _wait_fields(w: np.ndarray) -> dict:
    tot = float(w.sum())
    return {
        "idle_breakdown_seconds": {"host_wait": float(w[0]) / 1e9, "kernel_wait": float(w[1]) / 1e9,
                                   "other": float(w[2]) / 1e9},
        "host_wait_ratio": float(w[0] / tot) if tot > 0 else None,
        "kernel_wait_ratio": float(w[1] / tot) if tot > 0 else None,
        "other_wait_ratio": float(w[2] / tot) if tot > 0 else None,
    }


FIRST, SHORT_OK, SHORT = 1, 2, 4  # per-op launch flags: the first op of its launch; can be a short kernel; is one


def launch_flags(first: np.ndarray, short_ok: np.ndarray, is_short: np.ndarray) -> np.ndarray:
    """The three per-op launch masks as one column of :data:`FIRST` | :data:`SHORT_OK` | :data:`SHORT` bits:
    each stream then gathers one byte per op instead of three."""
    np = xp_of(first)
    if np is vec:
        return first.astype(int) + short_ok.astype(int) * SHORT_OK + is_short.astype(int) * SHORT
    flags = first.astype(np.uint8)
    flags |= np.left_shift(short_ok.view(np.uint8), 1)
    flags |= np.left_shift(is_short.view(np.uint8), 2)
    return flags


def _launch_fields(flags: np.ndarray, delay: np.ndarray, cfg: Config, own: bool) -> dict:
    """Launch figures over one group of ops (``flags`` and ``delay`` aligned; SHORT implies SHORT_OK). ``own``:
    ``delay`` may be reordered (a gathered copy)."""
    np = xp_of(delay)
    first = (flags & FIRST) != 0
    n_first = int(np.count_nonzero(first))
    if n_first == delay.size:  # every op is the first of its launch: no gather
        d = delay if own else delay.copy()
    else:
        d = delay[first]
    del first
    n_out = int(np.count_nonzero(d > ns_bound(cfg.launch_delay_cutoff_s * 1e9, up=False)))
    lq = quantiles_of_ns(d, (50, 99))
    n_ok = int(np.count_nonzero(flags & SHORT_OK))
    return {
        "launches_linked": int(d.size),
        "launch_delay_seconds": lq,
        "launch_delay_outlier_ratio": n_out / d.size if d.size else None,
        "short_kernel_ratio": int(np.count_nonzero(flags & SHORT)) / n_ok if n_ok else None,
    }


def _op_counts(kinds: np.ndarray) -> dict:
    np = xp_of(kinds)
    return {"kernel": int(np.count_nonzero(kinds == KERNEL)), "memcpy": int(np.count_nonzero(kinds == MEMCPY)),
            "memset": int(np.count_nonzero(kinds == MEMSET))}


