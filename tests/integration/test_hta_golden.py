"""HTA-compatible numbers against HolisticTraceAnalysis 0.5 itself (golden JSON in tests/golden/hta_*.json).

The goldens were produced by HTA (scripts/hta_golden.py, run in a separate venv); nothing here runs HTA.
Two event tables are checked: one built directly from the Kineto JSON in this file (a small reference
reader that keeps only what HTA reads: args.stream, args.correlation, name, ts, dur), and tracelens' own
ingest once `tracelens.ingest.kineto` exists.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from tracelens.analyze.rank import hta_compat
from tracelens.schema import EVENTS, KINDS

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces" / "hta"
GOLDEN = REPO / "tests" / "golden"
TOL_PP = 0.1

GOLDENS = sorted(GOLDEN.glob("hta_*.json"))
OK_GOLDENS = [p for p in GOLDENS if "ranks" in json.loads(p.read_text())]


def _events_from_json(folder: Path) -> tuple[pa.Table, dict[int, int]]:
    """Reference events table (schema.EVENTS) from the Kineto JSON files of one folder."""
    cols: dict[str, list] = {f.name: [] for f in EVENTS}
    bases: dict[int, int] = {}
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    for i, path in enumerate(files):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            doc = json.loads(fh.read(), parse_float=Decimal)
        rank = int((doc.get("distributedInfo") or {}).get("rank", i))
        base = int(doc.get("baseTimeNanoseconds") or 0)
        bases[rank] = base
        for e in doc.get("traceEvents", []):
            if e.get("ph") != "X" or e.get("dur") is None or e.get("cat") is None:
                continue
            args = e.get("args") or {}
            stream = args.get("stream")
            try:
                stream = min(int(stream), 2**31 - 1) if stream is not None else None
            except ValueError:
                stream = None
            corr = args.get("correlation")
            cat = str(e["cat"])
            cols["rank"].append(rank)
            cols["kind"].append(cat if cat in KINDS else "other")
            cols["name"].append(str(e.get("name", "")))
            cols["stream"].append(stream)
            cols["correlation"].append(int(corr) if corr is not None else None)
            cols["ts_ns"].append(base + int(Decimal(e["ts"]) * 1000))
            cols["dur_ns"].append(int(Decimal(e["dur"]) * 1000))
    n = len(cols["rank"])
    for f in EVENTS:
        if not cols[f.name]:
            cols[f.name] = [None] * n
    return pa.Table.from_pydict(cols, schema=EVENTS), bases


def _check(events: pa.Table, bases: dict[int, int], golden: dict, exact: bool) -> None:
    tb = {r["rank"]: r for r in hta_compat.temporal_breakdown(events, bases).to_pylist()}
    ov = {r["rank"]: r for r in hta_compat.comm_comp_overlap(events, bases).to_pylist()}
    for rank_s, want in golden["ranks"].items():
        got, got_ov = tb[int(rank_s)], ov[int(rank_s)]
        for key in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            assert got[key] == pytest.approx(want[key], abs=TOL_PP), (rank_s, key)
        if want["comp_comm_overlap_pctg"] is None:
            assert got_ov["comp_comm_overlap_pctg"] is None
        else:
            assert got_ov["comp_comm_overlap_pctg"] == pytest.approx(
                want["comp_comm_overlap_pctg"], abs=TOL_PP
            )
        if exact:
            for key in ("idle_time", "compute_time", "non_compute_time", "kernel_time"):
                assert got[f"{key}_ns"] == round(want[f"{key}_us"] * 1000), (rank_s, key)


@pytest.fixture(scope="module")
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not present at {TRACES}")
    return TRACES


@pytest.mark.parametrize("golden_path", OK_GOLDENS, ids=lambda p: p.stem)
def test_reference_table_matches_hta_exactly(traces: Path, golden_path: Path) -> None:
    golden = json.loads(golden_path.read_text())
    events, bases = _events_from_json(traces / golden["folder"])
    _check(events, bases, golden, exact=True)


def _events_from_tracelens(folder: Path) -> tuple[pa.Table, dict[int, int]]:
    """Events and base times of one folder through tracelens' own Kineto ingest."""
    from tracelens.ingest import kineto

    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    traces = [kineto.read(p) for p in files]
    events = pa.concat_tables([t.events for t in traces]).unify_dictionaries()
    return events, {int(t.metadata["rank"]): int(t.metadata.get("base_time_ns") or 0) for t in traces}


@pytest.mark.parametrize("golden_path", OK_GOLDENS, ids=lambda p: p.stem)
def test_tracelens_ingest_matches_hta_within_tolerance(traces: Path, golden_path: Path) -> None:
    golden = json.loads(golden_path.read_text())
    events, bases = _events_from_tracelens(traces / golden["folder"])
    _check(events, bases, golden, exact=False)


def test_trace_filter_through_load_tables(traces: Path) -> None:
    """The acceptance run: trace_filter's two ranks via the loader the CLI uses, within 0.1 pp of HTA."""
    from tracelens.run import load_tables

    golden = json.loads((GOLDEN / "hta_trace_filter.json").read_text())
    tables = load_tables(traces / "trace_filter", no_cache=True, workers=1)
    assert sorted(golden["ranks"]) == ["0", "1"]
    _check(tables.events, hta_compat.base_times(tables.metadata), golden, exact=False)
