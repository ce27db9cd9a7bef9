"""Damage inside a Kineto trace: telling a file cut mid-write from a local error, and reading on past it.

A decode of a piece of the `traceEvents` array fails either because the data ended (a cut: the error is at
the end of the data) or because of a local error in one event (an invalid UTF-8 byte, a lone surrogate
escape, a bare `NaN`, a flipped separator): the error is followed by more events. A local error costs only
the event it is in: what can be mended in place without changing the byte count is mended (an invalid UTF-8
byte becomes U+FFFD, a lone `\\uD800` escape `\\uFFFD`), anything else is skipped from the event boundary
before the error to the one after it and counted. Each byte is decoded a bounded number of times (the
failed decode stops at the error, the events before it are decoded once more), so salvage is linear in the
file size.

The stream reader (kineto.scan._scan_blocks) owns the buffer; these helpers only inspect and edit it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa

from tracelens.findings import finding

_POS = re.compile(r"\(byte (\d+)\)")
_WS = b" \t\r\n"
#: The end of the events array: an event's closing brace, then `]`.
_ARRAY_END = re.compile(rb"\}[ \t\r\n]*\]")
#: Attempts at an earlier event boundary when the one found was inside a nested value.
MAX_BACKTRACK = 16


@dataclass
class Damage:
    """What a read mended or skipped (counted per file, reported in its metadata and as a warning)."""

    skipped: int = 0  # damaged events left out
    skipped_bytes: int = 0
    mended: int = 0  # invalid UTF-8 sequences and lone surrogate escapes replaced in place
    first_at: int | None = None  # offset of the first damage in the decompressed stream
    header: int = 0  # damaged values in the metadata before `traceEvents` read as null (repair_head)

    def note(self, at: int) -> None:
        if self.first_at is None or at < self.first_at:
            self.first_at = at

    @property
    def any(self) -> bool:
        return bool(self.skipped or self.mended)


def error_at(err: Exception, piece: bytes | bytearray | memoryview) -> int | None:
    """Index in `piece` where msgspec's decode failed, or None when the data ended first (truncated)."""
    msg = str(err)
    m = _POS.search(msg)
    if m:
        return int(m.group(1))
    if "UTF-8" in msg:
        try:
            codecs.utf_8_decode(piece, "strict", True)
        except UnicodeDecodeError as u:
            return u.start
    return None


def mend(buf: bytearray, p: int, err: Exception) -> bool:
    """Mend in place the error at buf[p] when it is an invalid UTF-8 sequence (replaced by U+FFFD, as a
    lenient decoder would) or a lone surrogate escape (replaced by `\\uFFFD`). False when not mendable."""
    msg = str(err)
    if "UTF-8" in msg:
        end = p + 1
        # the rest of an invalid sequence: continuation bytes (10xxxxxx)
        while end < len(buf) and end < p + 4 and 0x80 <= buf[end] < 0xC0:
            end += 1
        bad = bytes(buf[p:end])
        fixed = bad.decode("utf-8", "replace").encode()
        if fixed == bad:
            return False
        buf[p:end] = fixed
        return True
    if "surrogate" in msg or "hex escape" in msg:
        q = buf.rfind(b"\\u", max(0, p - 12), p + 1)
        while q >= 0:
            try:
                v = int(bytes(buf[q + 2 : q + 6]), 16)
            except ValueError:
                v = 0
            if 0xD800 <= v <= 0xDFFF:
                buf[q : q + 6] = b"\\ufffd"
                return True
            q = buf.rfind(b"\\u", max(0, p - 12), q)
    return False


#: Bare tokens JSON does not have that a writer puts for a number it cannot write (Python's json, C++ printf).
_BAD_NUMBERS = (b"-Infinity", b"+Infinity", b"Infinity", b"-inf", b"inf", b"-nan", b"nan", b"NaN")
#: Repairs tried on one file's metadata before it is given up as not a trace.
MAX_HEAD_REPAIRS = 256


def repair_head(head: bytes, decode: Callable[[bytes], object], dmg: Damage, salvage: bool) -> object | None:
    """Decode the metadata before `traceEvents` (`head`, closed by the caller) through `decode`, repairing
    what a damaged event would cost in the events array: an invalid UTF-8 sequence or lone surrogate is
    mended (counted in `dmg.mended`), a bare NaN / Infinity becomes `null`, a control byte a space (counted
    in `dmg.header`; only with `salvage`, as a damaged event is skipped only then). None when the damage is of
    another kind (the caller reports the file as not a trace)."""
    buf = bytearray(head)
    mended = fixed = 0
    for _ in range(MAX_HEAD_REPAIRS):
        try:
            top = decode(bytes(buf))
        except msgspec.DecodeError as err:
            p = error_at(err, buf)
            if p is None or p >= len(buf):
                return None
            if mend(buf, p, err):
                mended += 1
                continue
            tok = next((t for t in _BAD_NUMBERS if buf.startswith(t, p)), None)
            if not salvage:
                return None
            if tok is not None:
                buf[p : p + len(tok)] = b"null"
            elif buf[p] < 0x20:
                buf[p] = 0x20
            else:
                return None
            fixed += 1
            continue
        dmg.mended += mended
        dmg.header += fixed
        return top
    return None


def first_boundary(buf: bytes | bytearray, lo: int) -> tuple[int, int] | None:
    """First `}` , `{` separator whose `}` is at or after buf[lo]: (index after `}`, index of `{`)."""
    n = len(buf)
    p = lo
    while True:
        p = buf.find(b"}", p)
        if p < 0:
            return None
        q = p + 1
        while q < n and buf[q] in _WS:
            q += 1
        if q < n and buf[q] == 44:  # ','
            q += 1
            while q < n and buf[q] in _WS:
                q += 1
            if q < n and buf[q] == 123:  # '{'
                return p + 1, q
        if q >= n:
            return None
        p += 1


def last_boundary(buf: bytes | bytearray, lo: int, hi: int) -> tuple[int, int] | None:
    """Last `}` , `{` separator whose `{` is in buf[lo:hi]: (index after `}`, index of `{`)."""
    p = hi
    while True:
        p = buf.rfind(b"{", lo, p)
        if p <= lo:
            return None
        q = p - 1
        while q > lo and buf[q] in _WS:
            q -= 1
        if buf[q] == 44:
            r = q - 1
            while r > lo and buf[r] in _WS:
                r -= 1
            if buf[r] == 125:
                return r + 1, p


def count_events(buf: bytes | bytearray, lo: int, hi: int) -> int:
    """Events in a damaged region: each Kineto event has one `"ph"` key (at least one)."""
    return max(1, buf.count(b'"ph"', lo, hi))


def keep_before(buf: bytearray, p: int, decode: Callable[[bytearray, int], bool]) -> int:
    """Decode (through `decode(buf, end)`, which keeps the events of buf[:end] and says whether they
    decoded) the whole events before the one holding the error at buf[p]. Returns where the damaged region
    starts (the `{` of the damaged event, 1 when it is the first)."""
    hi = p + 1
    for _ in range(MAX_BACKTRACK):
        b0 = last_boundary(buf, 1, hi)
        if b0 is None:
            return 1
        if decode(buf, b0[0]):
            return b0[1]
        hi = b0[1]  # that boundary was inside a nested value: an earlier one
    return 1


def skip_to_next(buf: bytearray, start: int, p: int, dmg: Damage, base: int) -> int | None:
    """The `{` of the first whole event after the error at buf[p] (the damaged region buf[start:that] is
    counted in `dmg`), or None when no event boundary follows yet."""
    b1 = first_boundary(buf, p)
    if b1 is None:
        return None
    dmg.skipped += count_events(buf, start, b1[0])
    dmg.skipped_bytes += b1[1] - start
    dmg.note(base + start)
    return b1[1]


def drop_last_event(buf: bytearray, start: int, p: int, dmg: Damage, base: int) -> bool:
    """At the end of the data: when the error at buf[p] is in the last event and the events array is
    closed after it, delete the damaged event(s) buf[start:] up to the `]` (the keys after the array stay).
    False when the array is not closed after the error (a cut)."""
    m = _ARRAY_END.search(buf, p)
    if m is None:
        return False
    end = m.end() - 1  # index of `]`
    dmg.skipped += count_events(buf, start, end)
    dmg.skipped_bytes += end - start
    dmg.note(base + start)
    del buf[start:end]
    # a separator left before the `]` (start > 1: the events before were decoded and removed already)
    return True


def is_cut(buf: bytes | bytearray, p: int | None) -> bool:
    """Whether a decode error at buf[p] (None: the data ended) is the end of the data: nothing but
    whitespace or zero bytes (a preallocated file's unwritten rest) follows it."""
    if p is None:
        return True
    return not bytes(buf[p:]).strip(b" \t\r\n\x00")


def decode_error(err: Exception) -> bool:
    return isinstance(err, msgspec.DecodeError) and not isinstance(err, msgspec.ValidationError)


def damaged_findings(metadata: pa.Table) -> list[dict]:
    """PARTIAL_TRACE warnings for the ranks whose trace had damaged events (skipped), mended strings, or
    events dropped for an unusable timestamp (absent, invalid, beyond int64 ns)."""
    names = ("damaged_events", "mended_strings", "dropped_events", "header_repairs")
    cols = [c for c in names if c in metadata.column_names]
    if not cols:
        return []
    out = []
    for row in metadata.select(["rank", "path", "events", *cols]).to_pylist():
        n, m, d, h = (row.get(c) or 0 for c in names)
        if not n and not m and not d and not h:
            continue
        parts = []
        if h:
            parts.append(f"{h:,} damaged value{_s(h)} in its metadata (invalid JSON) read as null")
        if n:
            parts.append(f"{n:,} damaged event{_s(n)} (invalid JSON) skipped")
        if m:
            parts.append(f"{m:,} invalid UTF-8 sequence{_s(m)} or lone surrogate{_s(m)} replaced by U+FFFD")
        if d:
            parts.append(
                f"{d:,} event{_s(d)} without a usable timestamp (absent, invalid or beyond int64 ns) dropped"
            )
        name = row["path"].rsplit("/", 1)[-1]
        out.append(
            finding(
                "PARTIAL_TRACE",
                "warning",
                f"rank {row['rank']}: trace {name}: {'; '.join(parts)}; the other {row['events']:,} events are read",
                ranks=[row["rank"]],
                damaged_events=n,
                mended_strings=m,
                dropped_events=d,
                header_repairs=h,
            )
        )
    return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# ------------------------------------------------------------------------- which steps a cut trace covers
_DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Runtime/driver calls that put work on the device, matched in their names (CUDA, HIP, graphs).
_LAUNCH_RE = r"Launch|Memcpy|Memset"


def uncovered_steps(events: pa.Table, gpu_expected: bool = False) -> tuple[set[int], bool]:
    """Steps of a salvaged trace that the trace demonstrably does not cover: a launch of the step (a
    runtime/driver kernel launch, copy or memset with a correlation id) whose device work is not in the
    trace was lost after the cut, and launches the cut may have taken with it (`_launches_not_shown`). Also
    whether the trace lost all its device work (launches but no device event, or, for a trace that may
    have had device activity (`gpu_expected`, kineto.reader.gpu_expected), neither a launch nor a device
    event: the cut fell among the CPU ops, which Kineto writes first): such a rank is not compared on the
    GPU path. Without any launch, no step of such a trace is shown whole. Works for every step, the only
    one included (the half-of-the-fullest-step rule cannot tell when all steps lost events)."""
    import pyarrow.compute as pc

    need = {"kind", "name", "correlation", "step"}
    if events.num_rows == 0 or not need <= set(events.column_names):
        return set(), False
    kinds = events.column("kind").cast(pa.string())
    corr = events.column("correlation")
    step = events.column("step")
    is_dev = pc.and_(pc.is_in(kinds, pa.array(_DEVICE_KINDS)), pc.is_valid(corr))
    is_launch = pc.and_(
        pc.and_(pc.is_in(kinds, pa.array(["cuda_runtime", "cuda_driver"])), pc.is_valid(corr)),
        pc.match_substring_regex(events.column("name").cast(pa.string()), _LAUNCH_RE),
    )
    n_launch = pc.sum(is_launch).as_py() or 0
    if not n_launch:
        if not gpu_expected:
            return _cpu_cut(events, kinds), False
        # a GPU trace cut before its launches: no step shows all its launches; and when no device event
        # came before the cut either, it lost all its device work
        steps = step.drop_null()
        lost = not (pc.sum(pc.is_in(kinds, pa.array(_DEVICE_KINDS))).as_py() or 0)
        return (set(np.unique(steps.to_numpy()).tolist()) if len(steps) else set()), lost
    dev_corr = pc.unique(corr.filter(is_dev))
    if len(dev_corr) == 0:
        steps = step.filter(is_launch).drop_null()
        return set(np.unique(steps.to_numpy()).tolist()) if len(steps) else set(), True
    missing = pc.and_(is_launch, pc.invert(pc.is_in(corr, dev_corr)))
    steps = step.filter(missing).drop_null()
    bad = set(np.unique(steps.to_numpy()).tolist()) if len(steps) else set()
    bad |= _launch_shortfall(events, kinds, step)
    bad |= _end_not_shown(events, kinds, step, bad)
    bad |= _launches_not_shown(events, kinds)
    return bad, False


#: A step whose launching CPU ops kept fewer of their launches than this share of the best step's share,
#: or than LAUNCH_FLOOR absolutely, lost launches (and their device work) at the cut.
LAUNCH_SHARE = 0.9
LAUNCH_FLOOR = 0.5


def _launch_shortfall(events: pa.Table, kinds: pa.Array, step: pa.ChunkedArray) -> set[int]:
    """Kineto writes all CPU ops first, so a cut keeps them and loses launches: a CPU op whose name launched
    device work elsewhere in this trace (linked by External id) and has no launch of its own lost it. Steps
    whose share of such ops with their launch falls short (relative to the best step, or absolutely) are
    not covered."""
    import pyarrow.compute as pc

    ext = events.column("external_id")
    names = events.column("name").cast(pa.string())
    cpu = pc.and_(pc.equal(kinds, "cpu_op"), pc.is_valid(ext))
    rt = pc.and_(pc.is_in(kinds, pa.array(["cuda_runtime", "cuda_driver"])), pc.is_valid(ext))
    rt = pc.and_(rt, pc.match_substring_regex(names, _LAUNCH_RE))
    launched = pc.unique(ext.filter(rt))
    if len(launched) == 0:
        return set()
    has = pc.is_in(ext, launched)
    expect = pc.and_(cpu, pc.is_in(names, pc.unique(names.filter(pc.and_(cpu, has)))))
    t = pa.table(
        {"step": step, "n": pc.cast(expect, pa.int64()), "h": pc.cast(pc.and_(expect, has), pa.int64())}
    )
    g = t.filter(pc.is_valid(t.column("step"))).group_by("step").aggregate([("n", "sum"), ("h", "sum")])
    share = {s: h / n for s, n, h in zip(*(g.column(c).to_pylist() for c in ("step", "n_sum", "h_sum"))) if n}
    if not share:
        return set()
    best = max(share.values())
    return {s for s, v in share.items() if v < LAUNCH_SHARE * best or v < LAUNCH_FLOOR}


#: Families of events whose coverage of a step's end is checked (_end_not_shown).
_END_FAMILIES = (("cpu_op", "python_function"), ("cuda_runtime", "cuda_driver"), _DEVICE_KINDS)
#: A step's last event of a family may start this much (share of the step's CPU window) later before its
#: end than in the rank's steps whose end later events show, beyond that largest gap itself.
END_GAP_SLACK = 0.01


def _end_not_shown(events: pa.Table, kinds: pa.Array, step: pa.ChunkedArray, bad: set[int]) -> set[int]:
    """Steps whose end the trace does not show. For a family of events (CPU ops, launches, device work), a
    step that no later event of the family follows (it may run into the cut) is covered only if its last
    event of the family starts as close to the step's end as in the rank's steps that later events of the
    family do follow (their ends are shown), up to that gap again or END_GAP_SLACK of the step. A writer that
    writes events in time order (the cut falls at one instant) loses the end of the step it cuts: this rule
    sees that when the launches of the lost work were lost as well (rule 1 cannot)."""
    import pyarrow.compute as pc

    names = events.column("name").cast(pa.string())
    marker = pc.and_(pc.match_substring_regex(names, _STEP_NAME), pc.is_in(kinds, pa.array(_MARKER_KINDS)))
    m = events.filter(pc.and_(marker, pc.is_valid(step)))
    if m.num_rows == 0:
        return set()
    m_end = pc.add(m.column("ts_ns"), pc.fill_null(m.column("dur_ns"), 0))
    w = pa.table({"step": m.column("step"), "a": m.column("ts_ns"), "e": m_end})
    w = w.group_by("step").aggregate([("a", "min"), ("e", "max")])
    win = {s: (a, e) for s, a, e in zip(*(w.column(c).to_pylist() for c in ("step", "a_min", "e_max")))}
    ts = events.column("ts_ns").to_numpy(zero_copy_only=False)
    st = step.fill_null(-1).to_numpy(zero_copy_only=False)
    out: set[int] = set()
    for fam in _END_FAMILIES:
        f = pc.fill_null(pc.and_(pc.is_in(kinds, pa.array(fam)), pc.invert(marker)), False)
        f = f.to_numpy(zero_copy_only=False)
        if not f.any():
            continue
        frontier = int(ts[f].max())  # no event of the family starts later
        g = pa.table({"step": st[f], "ts": ts[f]}).group_by("step").aggregate([("ts", "max")])
        last = dict(zip(g.column("step").to_pylist(), g.column("ts_max").to_pylist()))
        gap = {s: e - last[s] for s, (a, e) in win.items() if s in last}
        shown = [gap[s] for s, (a, e) in win.items() if s in gap and e < frontier and s not in bad]
        if not shown:
            continue
        ref = max(shown)
        for s, (a, e) in win.items():
            if s in gap and e >= frontier and gap[s] > ref + max(abs(ref), END_GAP_SLACK * (e - a)):
                out.add(s)
    return out


#: Correlation ids between two runtime/driver records next in id order that no record in the trace holds,
#: beyond which the records between them were lost (a hole). CUPTI numbers every driver and runtime call
#: from one counter, so ids a trace does not show are the calls Kineto does not record (cudaGetDevice...)
#: and the driver calls a runtime call makes inside: at most 90 between two records in the reference
#: traces (HTA `negative_queue_length_values_check`; 47 on the H200 sample). A lost activity buffer (Kineto
#: asks CUPTI for 4 MB ones: thousands of records) leaves a gap of thousands.
HOLE_IDS = 1000
_RUNTIME_KINDS = ("cuda_runtime", "cuda_driver")
_CPU_KINDS = ("cpu_op", "user_annotation", "python_function")


def _union(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [lo, hi]."""
    if not lo.size:
        return lo, hi
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], np.maximum.accumulate(hi[o])
    new = np.r_[True, lo[1:] > hi[:-1]]
    last = np.r_[np.flatnonzero(new)[1:] - 1, lo.size - 1]
    return lo[new], hi[last]


def _minus(lo: np.ndarray, hi: np.ndarray, hlo: np.ndarray, hhi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint intervals [lo, hi] less the sorted disjoint intervals [hlo, hhi]."""
    if not hlo.size or not lo.size:
        return lo, hi
    cuts = np.r_[hlo, hhi]
    pts = np.unique(np.r_[lo, hi, cuts])
    a, b = pts[:-1], pts[1:]
    mid = a + (b - a) // 2
    j = np.searchsorted(lo, mid, side="right") - 1
    inside = (j >= 0) & (mid <= hi[np.maximum(j, 0)])
    k = np.searchsorted(hlo, mid, side="right") - 1
    inside &= ~((k >= 0) & (mid < hhi[np.maximum(k, 0)]))
    return _union(a[inside], b[inside])


def _contained(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each [a, b] lies inside one of the sorted disjoint intervals [lo, hi]."""
    if not lo.size:
        return np.zeros(a.shape, dtype=bool)
    j = np.searchsorted(lo, a, side="right") - 1
    return (j >= 0) & (b <= hi[np.maximum(j, 0)])


def _cpu_cut(events: pa.Table, kinds: pa.Array) -> set[int]:
    """A CPU-only trace (gloo) cut among its CPU events: Kineto writes them thread by thread, each thread's
    in time order, so the thread the file ends with lost its events after the last one kept, and the threads
    after it all theirs. The steps whose window (its `ProfilerStep#N` marker, written at its start with its
    whole duration) reaches past that time are not shown whole, nor those with fewer `gloo:*` annotations
    than `c10d::` calls (the collectives' work, which an asynchronous collective records on a gloo run-loop
    thread: one per call in every whole step of the reference gloo runs)."""
    import pyarrow.compute as pc

    names = events.column("name").cast(pa.string())
    step = events.column("step").fill_null(-1).to_numpy(zero_copy_only=False)
    ts = events.column("ts_ns").fill_null(0).to_numpy(zero_copy_only=False)
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False), 0)
    cpu = pc.fill_null(pc.is_in(kinds, pa.array(_CPU_KINDS)), False).to_numpy(zero_copy_only=False)
    marker = pc.fill_null(pc.match_substring_regex(names, _STEP_NAME), False).to_numpy(zero_copy_only=False)
    mk = marker & cpu & (step >= 0)
    if not mk.any() or not cpu.any():
        return set()
    c_ts = ts[cpu]
    first = np.r_[0, np.flatnonzero(c_ts[1:] < c_ts[:-1]) + 1]
    t_cut = int(c_ts[first[-1] :].max())
    bad = set(np.unique(step[mk & (end > t_cut)]).tolist())
    # a collective's work runs under a `gloo:*` annotation, on the calling thread or (asynchronous ones) on a
    # gloo run-loop thread written later: a step with fewer of those than `c10d::` calls lost some
    c10d = cpu & pc.fill_null(pc.starts_with(names, "c10d::"), False).to_numpy(zero_copy_only=False)
    gloo = cpu & pc.fill_null(pc.starts_with(names, "gloo:"), False).to_numpy(zero_copy_only=False)
    if c10d.any():
        calls = np.bincount(step[c10d & (step >= 0)], minlength=int(step.max()) + 1)
        work = np.bincount(step[gloo & (step >= 0)], minlength=calls.size)
        bad |= set(np.flatnonzero(work < calls).tolist())
    return bad


def _launches_not_shown(events: pa.Table, kinds: pa.Array) -> set[int]:
    """Steps whose launches the trace does not show all of (a step is complete only when all its device
    work is in the file).

    How Kineto writes a trace: all CPU ops first, then the CUPTI activity buffers, one after the other, in
    the order of their addresses (not of time). Each buffer holds a stretch of time: the records of every
    thread (older CUPTI) or of one thread (per-thread buffers), in time order. A cut keeps the CPU ops, the
    buffers before it and a prefix of the buffer it falls in. So the runtime/driver records of the trace,
    in file order, split where time goes back into runs (buffers, or pieces of them); a thread's launches
    are shown for the times its runs cover (every run when a run holds several threads' records: shared
    buffers), less the holes in the correlation ids (HOLE_IDS). A step is not shown whole when:

    1. the run the file ends with (the buffer being written at the cut) stops inside the step's window, or
       before it, before the next time another run covers (for shared buffers: unless the ids after its
       last record follow on as closely as anywhere inside a run);
    2. its window meets a hole in the correlation ids;
    3. a CPU op of the step lies outside its thread's covered times, has no launch of its thread inside
       it, and its name is one whose every instance inside covered times did launch (so it lost its
       launches: a whole runtime buffer of its thread is missing).
    """
    import pyarrow.compute as pc

    names = events.column("name").cast(pa.string())
    step = events.column("step").fill_null(-1).to_numpy(zero_copy_only=False)
    ts = events.column("ts_ns").fill_null(0).to_numpy(zero_copy_only=False)
    end = ts + np.maximum(events.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False), 0)
    corr = events.column("correlation").fill_null(-1).to_numpy(zero_copy_only=False)
    thread = np.unique(
        np.stack(
            [
                c.fill_null(-1).to_numpy(zero_copy_only=False)
                for c in (events.column("pid"), events.column("tid"))
            ],
            1,
        ),
        axis=0,
        return_inverse=True,
    )[1].ravel()
    marker = pc.fill_null(pc.match_substring_regex(names, _STEP_NAME), False).to_numpy(zero_copy_only=False)
    is_rt = pc.fill_null(pc.is_in(kinds, pa.array(_RUNTIME_KINDS)), False).to_numpy(zero_copy_only=False)
    is_cpu = (
        pc.fill_null(pc.equal(kinds, "cpu_op"), False).to_numpy(zero_copy_only=False) & ~marker & (step >= 0)
    )
    is_mk = marker & pc.fill_null(pc.is_in(kinds, pa.array(_MARKER_KINDS)), False).to_numpy(
        zero_copy_only=False
    )
    is_mk &= step >= 0
    if not is_rt.any() or not is_mk.any():
        return set()
    launch = is_rt & pc.fill_null(pc.match_substring_regex(names, _LAUNCH_RE), False).to_numpy(
        zero_copy_only=False
    )
    # step windows (CPU markers)
    w_step, inv = np.unique(step[is_mk], return_inverse=True)
    w_lo = np.full(w_step.size, np.iinfo(np.int64).max)
    w_hi = np.full(w_step.size, np.iinfo(np.int64).min)
    np.minimum.at(w_lo, inv, ts[is_mk])
    np.maximum.at(w_hi, inv, end[is_mk])

    def meeting(a: int, b: int) -> set[int]:
        return set(w_step[(w_lo < b) & (w_hi > a)].tolist())

    # runs of runtime records in file order (the table keeps the file's order), with the CPU events a
    # writer interleaves with them (one that writes in time order: the cut falls at one instant)
    first_rt = int(np.argmax(is_rt))
    cpu_kind = pc.fill_null(pc.is_in(kinds, pa.array(_CPU_KINDS)), False).to_numpy(zero_copy_only=False)
    ri = np.flatnonzero(is_rt | (cpu_kind & (np.arange(ts.size) > first_rt)))
    r_ts, r_th, r_id = ts[ri], thread[ri], np.where(is_rt[ri], corr[ri], -1)
    first = np.r_[0, np.flatnonzero(r_ts[1:] < r_ts[:-1]) + 1]
    run = np.repeat(np.arange(first.size), np.diff(np.r_[first, ri.size]))
    run_lo, run_hi = np.minimum.reduceat(r_ts, first), np.maximum.reduceat(r_ts, first)
    final = first.size - 1
    t_cut = int(run_hi[final])
    shared = any(np.unique(r_th[run == r]).size > 1 for r in range(first.size))
    # holes in the correlation ids
    has_id = r_id >= 0
    o = np.argsort(r_id[has_id], kind="stable")
    g_id, g_ts = r_id[has_id][o], r_ts[has_id][o]
    gap = np.flatnonzero(np.diff(g_id) > HOLE_IDS)
    h_lo, h_hi = _union(np.minimum(g_ts[gap], g_ts[gap + 1]), np.maximum(g_ts[gap], g_ts[gap + 1]))
    bad: set[int] = set()
    for a, b in zip(h_lo.tolist(), h_hi.tolist()):
        bad |= meeting(a, b)

    def covered(x: int, but: int = -1) -> tuple[np.ndarray, np.ndarray]:
        runs = np.arange(first.size) if shared else np.unique(run[r_th == x])
        runs = runs[runs != but]
        return _minus(*_union(run_lo[runs], run_hi[runs]), h_lo, h_hi)

    # 1. the cut
    active = set(np.unique(thread[is_cpu | launch]).tolist())
    if shared:
        fin = r_id[(run == final) & has_id]
        within = [np.diff(np.sort(r_id[(run == r) & has_id])) for r in range(first.size)]
        usual = max((int(d[d <= HOLE_IDS].max()) for d in within if (d <= HOLE_IDS).any()), default=0)
        after = g_id[g_id > fin.max()] if fin.size else g_id[:0]
        stop = np.iinfo(np.int64).max if not after.size else int(g_ts[np.searchsorted(g_id, after[0])])
        if after.size and after[0] - fin.max() <= usual:
            stop = t_cut
        if stop > t_cut and active:
            bad |= meeting(t_cut, stop)
    else:
        for x in set(np.unique(r_th[run == final]).tolist()) & active:
            lo, hi = covered(x, final)
            later = hi > t_cut
            stop = int(lo[later].min()) if later.any() else np.iinfo(np.int64).max
            if stop > t_cut:
                bad |= meeting(t_cut, stop)
    # 3. CPU ops that lost their launches
    in_cover = np.zeros(ts.size, dtype=bool)
    launched = np.zeros(ts.size, dtype=bool)
    for x in np.unique(thread[is_cpu]).tolist():
        m = is_cpu & (thread == x)
        lo, hi = covered(x)
        in_cover[m] = _contained(lo, hi, ts[m], end[m])
        lt = np.sort(ts[launch & (thread == x)])
        launched[m] = np.searchsorted(lt, end[m], side="right") > np.searchsorted(lt, ts[m], side="left")
    t = pa.table({"n": names.filter(pa.array(in_cover)), "l": pa.array(launched[in_cover])})
    t = t.group_by("n").aggregate([("l", "all")])
    sure = [n for n, a in zip(t.column("n").to_pylist(), t.column("l_all").to_pylist()) if a]
    if sure:
        is_sure = pc.fill_null(pc.is_in(names, pa.array(sure, pa.string())), False).to_numpy(
            zero_copy_only=False
        )
        lost = is_cpu & ~in_cover & ~launched & is_sure
        bad |= set(np.unique(step[lost]).tolist())
    return bad


# ------------------------------------------------------------------------- leaving incomplete steps out
_MARKER_KINDS = ("cpu_op", "user_annotation")
_STEP_NAME = r"^ProfilerStep#[0-9]{1,9}$"  # as classify.STEP


def leave_out_steps(events: pa.Table, bad: list[int]) -> pa.Table:
    """Leave steps `bad` out of the step analysis: their events get `step = null` (they stay in `events`),
    their CPU-side `ProfilerStep#N` markers stay as kind `other` (the marker of a left-out step, which
    analyze.rank.steps uses only to bound the neighbouring steps' windows as they were with it present) and their
    GPU-side `ProfilerStep#N` annotations are removed."""
    import pyarrow.compute as pc

    if not bad or events.num_rows == 0:
        return events

    def markers(t: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
        """(is a ProfilerStep#N of a bad step, ... and a CPU-side one) per row of t."""
        is_bad = pc.fill_null(pc.is_in(t.column("step"), pa.array(bad, pa.int32())), False)
        m = pc.and_(is_bad, pc.match_substring_regex(t.column("name").cast(pa.string()), _STEP_NAME))
        return m, pc.and_(m, pc.is_in(t.column("kind").cast(pa.string()), pa.array(_MARKER_KINDS)))

    marker, cpu_marker = markers(events)
    kept = events.filter(pc.or_(pc.invert(marker), cpu_marker))
    _, demote = markers(kept)
    is_bad = pc.fill_null(pc.is_in(kept.column("step"), pa.array(bad, pa.int32())), False)
    step = pc.if_else(is_bad, pa.scalar(None, pa.int32()), kept.column("step"))
    kind = pc.dictionary_encode(pc.if_else(demote, "other", kept.column("kind").cast(pa.string())))
    for name, col in (("step", step), ("kind", kind)):
        i = kept.schema.get_field_index(name)
        kept = kept.set_column(i, kept.schema.field(i), col.cast(kept.schema.field(i).type))
    return kept
