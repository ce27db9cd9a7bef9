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
    cols = [c for c in ("damaged_events", "mended_strings", "dropped_events") if c in metadata.column_names]
    if not cols:
        return []
    out = []
    for row in metadata.select(["rank", "path", "events", *cols]).to_pylist():
        n, m, d = (row.get(c) or 0 for c in ("damaged_events", "mended_strings", "dropped_events"))
        if not n and not m and not d:
            continue
        parts = []
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
            )
        )
    return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# ------------------------------------------------------------------------- which steps a cut trace covers
_DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Runtime/driver calls that put work on the device, matched in their names (CUDA, HIP, graphs).
_LAUNCH_RE = r"Launch|Memcpy|Memset"


def uncovered_steps(events: pa.Table) -> tuple[set[int], bool]:
    """Steps of a salvaged trace that the trace demonstrably does not cover: a launch of the step (a
    runtime/driver kernel launch, copy or memset with a correlation id) whose device work is not in the
    trace was lost after the cut. Also whether the trace lost all its device work (launches, but no device
    event at all): such a rank is not compared on the GPU path. Works for every step, the only one included
    (the half-of-the-fullest-step rule cannot tell when all steps lost events)."""
    import numpy as np
    import pyarrow.compute as pc

    need = {"kind", "name", "correlation", "step"}
    if events.num_rows == 0 or not need <= set(events.column_names):
        return set(), False
    kinds = events.column("kind").cast(pa.string())
    corr = events.column("correlation")
    is_dev = pc.and_(pc.is_in(kinds, pa.array(_DEVICE_KINDS)), pc.is_valid(corr))
    is_launch = pc.and_(
        pc.and_(pc.is_in(kinds, pa.array(["cuda_runtime", "cuda_driver"])), pc.is_valid(corr)),
        pc.match_substring_regex(events.column("name").cast(pa.string()), _LAUNCH_RE),
    )
    n_launch = pc.sum(is_launch).as_py() or 0
    if not n_launch:
        return set(), False
    step = events.column("step")
    dev_corr = pc.unique(corr.filter(is_dev))
    if len(dev_corr) == 0:
        steps = step.filter(is_launch).drop_null()
        return set(np.unique(steps.to_numpy()).tolist()) if len(steps) else set(), True
    missing = pc.and_(is_launch, pc.invert(pc.is_in(corr, dev_corr)))
    steps = step.filter(missing).drop_null()
    bad = set(np.unique(steps.to_numpy()).tolist()) if len(steps) else set()
    bad |= _launch_shortfall(events, kinds, step)
    bad |= _end_not_shown(events, kinds, step, bad)
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


# ------------------------------------------------------------------------- leaving incomplete steps out
_MARKER_KINDS = ("cpu_op", "user_annotation")
_STEP_NAME = r"^ProfilerStep#[0-9]{1,9}$"  # as classify.STEP


def leave_out_steps(events: pa.Table, bad: list[int]) -> pa.Table:
    """Leave steps `bad` out of the step analysis: their events get `step = null` (they stay in `events`),
    their CPU-side `ProfilerStep#N` markers stay as kind `other` (the marker of a left-out step, which
    analyze.steps uses only to bound the neighbouring steps' windows as they were with it present) and their
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
