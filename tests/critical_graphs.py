"""Hand-built inputs of the critical path's graph, shared by its unit tests."""

from __future__ import annotations

import pyarrow as pa


def colls(rows, offsets=None):
    """rows: (rank, start, end, instance) raw; aligned with offsets."""
    off = offsets or {}
    al = [(r, s - off.get(r, 0), e - off.get(r, 0), i) for r, s, e, i in rows]
    latest = {i: max(a[1] for a in al if a[3] == i) for i in {a[3] for a in al}}
    n = {i: sum(1 for a in al if a[3] == i) for i in latest}
    return pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "start_ns": pa.array([r[1] for r in rows], pa.int64()),
            "end_ns": pa.array([r[2] for r in rows], pa.int64()),
            "instance": pa.array([r[3] for r in rows], pa.int64()),
            "op": pa.array(["allreduce"] * len(rows)),
            "group_key": pa.array(["pg:0"] * len(rows)),
            "bytes": pa.array([1000] * len(rows), pa.int64()),
            "n_participants": pa.array([n[r[3]] for r in rows], pa.int32()),
            "latest_start_ns": pa.array([latest[a[3]] for a in al], pa.int64()),
            "end_aligned_ns": pa.array([a[2] for a in al], pa.int64()),
        }
    )
