"""Real-trace conformance: every trace under ../shared/traces (hta/ and more/) through the analysis, with
invariants that hold for any trace (issue 16). A folder that mixes traces of different runs is analysed file
by file (sub-folder by sub-folder). Skips only when the traces folder is absent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.comm.collectives import DTYPE_BYTES, collectives_from_events
from tracelens.analyze.core import intervals as iv
from tracelens.analyze.rank.classify import COMM, COMPUTE, classify
from tracelens.analyze.rank.launch_link import enclosing_ops
from tracelens.analyze.rank.steps import CLIP_REPORT_NS, CLIP_REPORT_SHARE
from tracelens.errors import RankError
from tracelens.ingest.comm_families import family_of_kernel, is_comm_cpu_op
from tracelens.run import load_tables
from tracelens.run_analysis import Options, analyze_run

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
_TRACE = re.compile(r"\.json(\.gz)?$")


def _has_traces(d: Path) -> bool:
    return any(_TRACE.search(f.name) for f in d.iterdir() if f.is_file())


def _units() -> list[Path]:
    """Every folder with traces under hta/ and more/; mixed-run folders split into their files/sub-folders."""
    out = []
    for top in ("hta", "more"):
        base = TRACES / top
        if not base.is_dir():
            continue
        for d in sorted(p for p in base.iterdir() if p.is_dir()):
            subs = sorted(p for p in d.iterdir() if p.is_dir() and _has_traces(p))
            if subs and not _has_traces(d):
                out += subs
            else:
                out.append(d)
    return out


UNITS = _units() if TRACES.is_dir() else []
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found at {TRACES}")


def _analyses(unit: Path):
    """The unit's analyses: the folder, or each trace file when its traces belong to different runs."""
    try:
        load_tables(unit, no_cache=True, workers=1)
    except RankError:
        return [
            analyze_run(f, Options(no_cache=True)) for f in sorted(unit.iterdir()) if _TRACE.search(f.name)
        ]
    return [analyze_run(unit, Options(no_cache=True))]


def _np(t, c, fill=0):
    return t.column(c).fill_null(fill).to_numpy(zero_copy_only=False)


@pytest.mark.parametrize("unit", UNITS, ids=[f"{u.parent.name}/{u.name}" for u in UNITS])
def test_invariants(unit):
    for a in _analyses(unit):
        _check(a)


def _check(a) -> None:
    ev, bd = a.events, a.breakdown
    s = a.summary()
    json.dumps(s, allow_nan=False)  # a valid summary.json
    # the parts of each (rank, step) add up to the step; nothing is negative
    parts = {c: _np(bd, c) for c in ("step_time_ns", "compute_ns", "exposed_comm_ns", "memcpy_ns", "idle_ns",
                                     "overlapped_comm_ns", "comm_ns")}  # fmt: skip
    assert (parts["compute_ns"] + parts["exposed_comm_ns"] + parts["memcpy_ns"] + parts["idle_ns"]
            == parts["step_time_ns"]).all()  # fmt: skip
    for c, v in parts.items():
        assert (v >= 0).all(), c
    assert (parts["overlapped_comm_ns"] <= np.minimum(parts["compute_ns"], parts["comm_ns"])).all()
    for r in s["ranks"]:
        for k, v in r.items():
            assert not (isinstance(v, float) and v < 0), (r["rank"], k, v)
    # windows: disjoint, ordered, inside the rank's extent, none reaching absurdly past its last event
    rank = _np(ev, "rank")
    ts = _np(ev, "ts_ns")
    end = ts + np.maximum(_np(ev, "dur_ns"), 0)
    is_step = np.array([bool(re.match(r"^ProfilerStep#\d+$", n or "")) for n in
                        ev.column("name").cast("string").to_pylist()])  # fmt: skip
    classes = classify(ev)
    for r in np.unique(_np(bd, "rank")):
        w = bd.filter(bd.column("rank").to_numpy() == r)
        lo, hi = _np(w, "window_start_ns"), _np(w, "window_end_ns")
        o = np.argsort(lo, kind="stable")
        lo, hi = lo[o], hi[o]
        assert (lo <= hi).all() and (hi[:-1] <= lo[1:]).all(), f"rank {r}: overlapping windows"
        on = rank == r
        assert lo.min() >= ts[on].min() and hi.max() <= end[on].max()
        last = end[on & ~is_step].max()
        assert (hi - last <= np.maximum(CLIP_REPORT_NS, CLIP_REPORT_SHARE * (hi - lo))).all()
        # per-step compute summed over steps <= the trace's compute-kernel union
        comp = on & (classes == COMPUTE)
        assert _np(w, "compute_ns").sum() <= iv.total(iv.union(ts[comp], end[comp]))
    # every kernel whose name or launching op marks it as communication is communication
    kind = ev.column("kind").cast("string").to_numpy(zero_copy_only=False)
    names = ev.column("name").cast("string").to_pylist()
    kernel = kind == "kernel"
    by_name = kernel & np.array(
        [family_of_kernel(n) is not None or "nccl" in (n or "").lower() for n in names]
    )
    assert (classes[by_name] == COMM).all(), sorted(
        {names[i] for i in np.flatnonzero(by_name & (classes != COMM))}
    )
    comm_op = np.array([is_comm_cpu_op(n) for n in names])
    inner = enclosing_ops(ev, np.ones(ev.num_rows, dtype=bool))
    launched = kernel & (inner >= 0)
    launched[launched] = comm_op[inner[launched]]
    assert (classes[launched] == COMM).all()
    # sizes known wherever the CPU ops' Input Dims give them
    sized = comm_op & (ev.column("in_nelems").is_valid().to_numpy(zero_copy_only=False)
                       | ev.column("out_nelems").is_valid().to_numpy(zero_copy_only=False))  # fmt: skip
    dtypes = ev.column("dtype").cast("string").to_pylist()
    sized &= np.array([isinstance(d, str) and d.lower() in DTYPE_BYTES for d in dtypes])
    under = enclosing_ops(ev, sized)
    want = kernel & (under >= 0)
    if want.any():
        coll = collectives_from_events(ev)
        known = {(int(r), int(t)) for r, t, b in zip(coll.column("rank").to_pylist(), coll.column("start_ns")
                 .to_pylist(), coll.column("bytes").to_pylist()) if b is not None}  # fmt: skip
        for i in np.flatnonzero(want):
            assert (int(rank[i]), int(ts[i])) in known, names[i]
