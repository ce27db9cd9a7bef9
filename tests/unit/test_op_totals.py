"""engine.stage.op_totals (integer keys and one sort) against Arrow's hash group-by over the string columns
(the same groups and totals; Arrow's group order is its own, op_totals' is the order of each group's first
row)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens._testing import events_table
from tracelens.engine.stage import op_totals
from tracelens.store.stages import OPS

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def _reference(events: pa.Table) -> pa.Table:
    """Per (kind, name) of kernels and cpu ops: calls and summed duration (null -> 0), sorted by the order of
    each group's first row."""
    kind = events.column("kind").cast(pa.string())
    keep = pa.compute.is_in(kind, value_set=pa.array(["kernel", "cpu_op"]))
    sel = events.filter(keep)
    t = pa.table(
        {
            "kind": sel.column("kind").cast(pa.string()),
            "name": sel.column("name").cast(pa.string()),
            "dur_ns": sel.column("dur_ns").fill_null(0),
        }
    )
    agg = t.group_by(["kind", "name"], use_threads=False).aggregate([("dur_ns", "count"), ("dur_ns", "sum")])
    out = pa.table(
        {
            "kind": agg.column("kind"),
            "name": agg.column("name"),
            "calls": agg.column("dur_ns_count").cast(pa.int64()),
            "dur_ns": agg.column("dur_ns_sum").cast(pa.int64()),
        },
        schema=OPS,
    )
    keys = list(zip(t.column("kind").to_pylist(), t.column("name").to_pylist()))
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    order = sorted(range(out.num_rows), key=lambda i: first[(out["kind"][i].as_py(), out["name"][i].as_py())])
    return out.take(pa.array(order, pa.int64()))


def test_hand_built_groups_in_first_row_order():
    rows = [
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 0, "dur_ns": 5},
        {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 1, "dur_ns": 7},
        {"rank": 0, "kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": 2, "dur_ns": 1},
        # the same name, another kind
        {"rank": 0, "kind": "kernel", "name": "aten::mm", "ts_ns": 3, "dur_ns": None},
        {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 4, "dur_ns": 3},
        {"rank": 0, "kind": "cpu_op", "name": None, "ts_ns": 5, "dur_ns": 2},
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 6, "dur_ns": 10},
        {"rank": 0, "kind": "cpu_op", "name": None, "ts_ns": 7, "dur_ns": 4},
    ]
    got = op_totals(events_table(rows))
    assert got.to_pylist() == [
        {"kind": "cpu_op", "name": "aten::mm", "calls": 2, "dur_ns": 15},
        {"kind": "kernel", "name": "gemm", "calls": 2, "dur_ns": 10},
        {"kind": "kernel", "name": "aten::mm", "calls": 1, "dur_ns": 0},
        {"kind": "cpu_op", "name": None, "calls": 2, "dur_ns": 6},
    ]
    assert got.equals(_reference(events_table(rows)))


def test_repeated_dictionary_values_are_one_group():
    ev = events_table(
        [{"rank": 0, "kind": "kernel", "name": n, "ts_ns": i, "dur_ns": i + 1} for i, n in enumerate("abab")]
    )
    # the name column with a dictionary that holds each value twice
    names = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()), pa.array(["a", "b", "a", "b"]))
    ev = ev.set_column(ev.schema.get_field_index("name"), schema.EVENTS.field("name"), names)
    assert op_totals(ev).to_pylist() == [
        {"kind": "kernel", "name": "a", "calls": 2, "dur_ns": 4},
        {"kind": "kernel", "name": "b", "calls": 2, "dur_ns": 6},
    ]


def test_random_tables_match_the_group_by():
    rng = np.random.default_rng(7)
    kinds = ["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy"]
    for _ in range(20):
        n = int(rng.integers(0, 60))
        rows = [
            {
                "rank": 0,
                "kind": kinds[int(rng.integers(0, 4))],
                "name": None if rng.random() < 0.1 else f"op{int(rng.integers(0, 6))}",
                "ts_ns": i,
                "dur_ns": None if rng.random() < 0.1 else int(rng.integers(0, 2**40)),
            }
            for i in range(n)
        ]
        ev = events_table(rows)
        assert op_totals(ev).equals(_reference(ev))


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
@pytest.mark.parametrize("folder", ["hta/df_index_resolver", "more/tracelens-mi300-qwen15", "hta/cpu_only"])
def test_real_traces_match_the_group_by(folder):
    from tracelens.ingest import kineto

    f = sorted(p for p in (TRACES / folder).iterdir() if ".json" in p.name)[0]
    ev = kineto.read(f).events
    got = op_totals(ev)
    assert got.num_rows > 0
    assert got.equals(_reference(ev))
