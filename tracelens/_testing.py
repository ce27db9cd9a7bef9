"""Build schema-conforming tables from a few dicts: for tests and examples, not for ingest."""

from __future__ import annotations

import pyarrow as pa

from tracelens import schema
from tracelens.schema import table_from_rows

__all__ = ["events_table", "table_from_rows"]


def events_table(rows: list[dict]) -> pa.Table:
    """Events table from dicts such as {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 5}."""
    return table_from_rows(rows, schema.EVENTS)
